#!/bin/sh
# run.sh -- THE check to run on a machine with an NVIDIA GPU (sized for
# under 6 minutes on an H200): configure and build out of tree, make sure
# a device is really there (fails loudly if not), run the NVRTC compile
# test, the GPU differential test (compiled on the GPU vs the reference
# interpreter: float32 2e-3, float16 1e-2, bfloat16 3e-2 relative; int64
# and bool exact), the Lua CUDA tests, then bench/gpu's ratios.
#   sh tests/gpu/run.sh [build-dir]          (default /tmp/fuselab-gpu-build)
# Environment: FUSELAB_GPU_GRAPHS (random graphs on the GPU, default 300),
# JOBS (make -j, default the CPU count).
set -eu

here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-/tmp/fuselab-gpu-build}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
start=$(date +%s)

step() { printf '\n==== %s (%ss)\n' "$1" "$(( $(date +%s) - start ))"; }
fail() { printf '\nrun.sh: FAILED: %s\n' "$1" >&2; exit 1; }

step "device"
command -v nvidia-smi >/dev/null 2>&1 || fail "nvidia-smi not found: this is not a GPU machine"
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader \
  || fail "nvidia-smi cannot talk to a GPU"

step "configure and build in $build"
mkdir -p "$build"
cd "$build"
[ -f Makefile ] || "$here/configure" -q --with-cuda || fail "configure --with-cuda"
grep -q '^#define HAVE_CUDA 1' config.h || fail "configure did not enable CUDA"
make -j"$jobs" >/dev/null || fail "build"
make -j"$jobs" tests/unit/test_nvrtc tests/gpu/test_gpu bench/gpu >/dev/null || fail "build of the GPU tests"

export FUSELAB_CACHE_DIR="$build/tests/gpu-cache"
mkdir -p "$FUSELAB_CACHE_DIR"

step "the runtime sees the device"
./fuselab -e 'local ok, why = fl.cuda_available(); print(ok, why or ""); if not ok then os.exit(1) end' \
  || fail "fl.cuda_available() is false on a GPU machine"

step "NVRTC: every op and 300 random graphs compile (tests/unit/test_nvrtc)"
./tests/unit/test_nvrtc > test_nvrtc.log 2>&1 || { tail -40 test_nvrtc.log; fail "test_nvrtc"; }
grep -E '^not ok|^1\.\.|random graphs' test_nvrtc.log

step "GPU differential test (tests/gpu/test_gpu)"
set +e
timeout 240 ./tests/gpu/test_gpu > test_gpu.log 2>&1
rc=$?
set -e
grep -E '^not ok|^# device|^1\.\.|random graphs|memory' test_gpu.log || true
[ "$rc" -eq 77 ] && { cat test_gpu.log; fail "test_gpu skipped: no usable device"; }
[ "$rc" -eq 0 ] || { grep -A12 '^not ok' test_gpu.log | head -80; fail "test_gpu (exit $rc)"; }

step "Lua: tests/lua/cuda.lua"
LUA_PATH="$here/tests/lua/?.lua;;" ./fuselab "$here/tests/lua/cuda.lua" > cuda_lua.log 2>&1 \
  || { cat cuda_lua.log; fail "tests/lua/cuda.lua"; }
grep -E '^not ok|^1\.\.' cuda_lua.log

step "Lua: tests/lua/cuda_run.lua (models, resident weights, graphs, fallback)"
LUA_PATH="$here/tests/lua/?.lua;;" ./fuselab "$here/tests/lua/cuda_run.lua" > cuda_run.log 2>&1 \
  || { cat cuda_run.log; fail "tests/lua/cuda_run.lua"; }
grep -E '^not ok|^1\.\.' cuda_run.log

step "Lua: tests/lua/cuda_train.lua (compiled training's forward and backward)"
LUA_PATH="$here/tests/lua/?.lua;;" ./fuselab "$here/tests/lua/cuda_train.lua" > cuda_train.log 2>&1 \
  || { cat cuda_train.log; fail "tests/lua/cuda_train.lua"; }
grep -E '^not ok|^1\.\.' cuda_train.log

step "bench/gpu"
timeout 150 ./bench/gpu | tee bench_gpu.log || fail "bench/gpu"

step "done"
echo "run.sh: all GPU checks passed in $(( $(date +%s) - start )) s; logs in $build"
