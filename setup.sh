#!/bin/sh
# setup.sh -- one command from a fresh Debian machine to a working fuselab.
#   ./setup.sh          install missing packages, build, run the guided tour
#   ./setup.sh --test   the same set-up, then the whole test suite
#                       (plain build and an address/UB-sanitizer build)
# Builds live in build/ and build-asan/ (out of tree); the source tree
# stays clean.
set -eu

cd "$(dirname "$0")"
top=$(pwd)
mode=tour
case "${1:-}" in
  --test|test) mode=test ;;
  ""|--tour|tour) mode=tour ;;
  -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
  *) echo "setup.sh: unknown argument '$1' (expected --test or nothing)" >&2; exit 2 ;;
esac

# Debian packages the build and the tests need (README lists why each).
pkgs="build-essential autoconf automake libtool pkg-config lua5.4 liblua5.4-dev
libreadline-dev libgraphviz-dev graphviz libopenblas-openmp-dev libxxhash-dev
libcjson-dev libhiredis-dev libssl-dev libprotobuf-c-dev protobuf-c-compiler
libdnnl-dev libigraph-dev libpcre2-dev libunistring-dev libjpeg62-turbo-dev
libpng-dev libtiff-dev libwebp-dev libopenjp2-7-dev"
[ "$mode" = test ] && pkgs="$pkgs python3-numpy python3-pexpect clang
libclang-rt-14-dev chromium redis-server libonnx-testdata"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing$missing"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
fi

jobs=$(nproc 2>/dev/null || echo 2)
[ -x configure ] && [ configure -nt configure.ac ] && [ configure -nt m4/fl_cuda.m4 ] \
  && [ -f build-aux/tap-driver.sh ] || ./autogen.sh >/dev/null

build() { # build DIR [configure args...]
  dir=$1; shift
  mkdir -p "$dir"
  ( cd "$dir"
    [ -f Makefile ] || "$top/configure" -q "$@"
    make -s -j"$jobs" )
}

build build
if [ "$mode" = tour ]; then
  exec ./build/fuselab examples/tour.lua
fi

# PyPI's onnx for tests/onnx/current.sh (ONNX's current node tests, opsets
# up to 28), in a virtual environment outside the tree; without PyPI that
# test is a skip that says so.
venv=${FUSELAB_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fuselab-test-venv}
onnx_ver=$(sed -n 's/^ONNX_VERSION=//p' tests/onnx/current.sh)
if ! "$venv/bin/python" -c "import onnx, sys; sys.exit(onnx.__version__ != '$onnx_ver')" 2>/dev/null; then
  echo "setup: installing onnx $onnx_ver from PyPI into $venv (for tests/onnx/current.sh)"
  { python3 -m venv "$venv" && "$venv/bin/pip" install -q "onnx==$onnx_ver"; } >/dev/null 2>&1 ||
    echo "setup: could not install onnx $onnx_ver: tests/onnx/current.sh will skip"
fi
# and Hugging Face's tokenizers (and transformers, which reads GPT-2's
# vocab.json + merges.txt) for tests/llm/tokenizer_live.sh; no torch
tok_ver=0.23.3 tf_ver=5.25.0
if [ -x "$venv/bin/pip" ] && ! "$venv/bin/python" -c "import tokenizers, transformers, sys; sys.exit(tokenizers.__version__ != '$tok_ver' or transformers.__version__ != '$tf_ver')" 2>/dev/null; then
  echo "setup: installing tokenizers $tok_ver and transformers $tf_ver from PyPI into $venv (for tests/llm/tokenizer_live.sh)"
  "$venv/bin/pip" install -q "tokenizers==$tok_ver" "transformers==$tf_ver" >/dev/null 2>&1 ||
    echo "setup: could not install tokenizers: tests/llm/tokenizer_live.sh will skip"
fi
FUSELAB_ONNX_NODE_PYTHON=$venv/bin/python
export FUSELAB_ONNX_NODE_PYTHON

# The whole suite: plain, then sanitized.  Keep going after a failure so
# the summary counts everything.
status=0
( cd build && make -s -j"$jobs" check ) || status=1
build build-asan --enable-asan
( cd build-asan && make -s -j"$jobs" check ) || status=1

# Assertion counts from both runs' TAP summaries.
pass=0; fail=0
for log in build/test-suite.log build-asan/test-suite.log; do
  [ -f "$log" ] || { fail=$((fail + 1)); continue; }
  p=$(sed -n 's/^# PASS: *//p' "$log" | head -1)
  f=$(sed -n 's/^# FAIL: *//p' "$log" | head -1)
  x=$(sed -n 's/^# ERROR: *//p' "$log" | head -1)
  u=$(sed -n 's/^# XPASS: *//p' "$log" | head -1)
  pass=$((pass + ${p:-0}))
  fail=$((fail + ${f:-0} + ${x:-0} + ${u:-0}))
done
for log in build/test-suite.log build-asan/test-suite.log; do
  [ -f "$log" ] && grep -E '^(FAIL|ERROR|XPASS):' "$log" | head -40 || true
done
[ "$fail" -eq 0 ] || status=1
echo "$pass passed, $fail failed"
exit $status
