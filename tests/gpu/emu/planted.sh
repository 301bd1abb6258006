#!/bin/sh
# planted.sh -- bugs planted in fuselab's real generated CUDA code
# (FUSELAB_EMU_MUTATE rewrites each source before the emulator compiles
# it) are caught: the launch fails, fuselab raises a Lua error naming the
# kernel and the check (exit status 1, not a crash), and the same
# programs unchanged print true.  TAP.

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
run="$(dirname "$FUSELAB")/tests/gpu/emu/run"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-planted.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
# mutated kernels are cached under their unmutated sources' keys
FUSELAB_CACHE_DIR=$tmp/cache
export FUSELAB_CACHE_DIR

# a row softmax (block reductions: shuffles, shared memory, barriers) and
# a pointwise chain on 1024 floats (4-wide loads and stores; 4096 bytes,
# exactly a device allocation)
cat > "$tmp/softmax.lua" <<'LUA'
local x = fl.randn(8, 4096)
local f = function(a) return (a * 2):softmax(2) end
print(fl.allclose(fl.compile(f, {backend = "cuda"})(x):cpu(), f(x), 1e-4, 1e-5))
LUA
cat > "$tmp/pointwise.lua" <<'LUA'
local x = fl.randn(1024)
local f = function(a) return (a * 2 + 1):relu() end
print(fl.allclose(fl.compile(f, {backend = "cuda"})(x):cpu(), f(x), 1e-5, 1e-6))
LUA

n=0
# case_ NAME SCRIPT MUTATION EXPECTED: the mutated run must fail saying EXPECTED
case_() {
  n=$((n + 1))
  rm -rf "$FUSELAB_CACHE_DIR"
  (cd "$tmp" && FUSELAB_EMU_MUTATE="$3" "$run" "$FUSELAB" "$2.lua") > "$tmp/log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ] && grep -q "$4" "$tmp/log" && { [ "${FUSELAB_ASAN:-0}" = 1 ] || [ "$rc" -eq 1 ]; }; then
    echo "ok $n - $1: caught ($4)"
  else
    echo "not ok $n - $1: not caught as \"$4\" (exit $rc)"
    sed -e 's/^/# /' "$tmp/log" | tail -15
  fi
}

for s in softmax pointwise; do
  n=$((n + 1))
  rm -rf "$FUSELAB_CACHE_DIR"
  out=$(cd "$tmp" && "$run" "$FUSELAB" "$s.lua" 2>&1)
  if [ "$out" = true ]; then echo "ok $n - $s unchanged passes"; else echo "not ok $n - $s unchanged"; printf '%s\n' "$out" | sed 's/^/# /'; fi
done

case_ "fl_block_reduce without the barrier after the warp results" softmax \
  '  if (lane == 0) sh[w] = v;\n  __syncthreads();\n=>  if (lane == 0) sh[w] = v;\n' \
  'results depend on thread order'
case_ "a barrier inside fl_block_reduce's warp-0 branch" softmax \
  '  if (w == 0) {\n    v = lane < nw=>  if (w == 0) {\n    __syncthreads();\n    v = lane < nw' \
  '__syncthreads divergence'
case_ "a shuffle only half the warp reaches" softmax \
  'v = op(v, __shfl_down_sync(0xffffffffu, v, o));\n  __syncthreads();=>if (lane < 16) v = op(v, __shfl_down_sync(0xffffffffu, v, o));\n  __syncthreads();' \
  'diverges at a shuffle'
# shared memory never written reads NaN (the fill before each block), in
# every order alike: no launch error, but a result that cannot pass
n=$((n + 1))
rm -rf "$FUSELAB_CACHE_DIR"
out=$(cd "$tmp" && FUSELAB_EMU_MUTATE='  if (lane == 0) sh[w] = v;\n  __syncthreads();\n=>  __syncthreads();\n' \
      "$run" "$FUSELAB" softmax.lua 2>&1)
if [ "$out" = false ]; then echo "ok $n - shared memory read but never written: NaN, the result is wrong"
else echo "not ok $n - shared memory read but never written gave: $out"; fi
if [ "${FUSELAB_ASAN:-0}" = 1 ]; then oob=AddressSanitizer; else oob='out of bounds of a 4096-byte allocation'; fi
case_ "4-wide stores one quad too far" pointwise 'fl_st4(p=>fl_st4(4 + p' "$oob"
case_ "a float4 load one element off" pointwise \
  'const float4 v = *(const float4 *)p;=>const float4 v = *(const float4 *)(p + 1);' \
  'misaligned access'
echo "1..$n"
