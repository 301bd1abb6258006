#!/bin/sh
# ONNX's backend node tests (Debian libonnx-testdata) through fl.load_onnx:
# fails on a wrong answer, an error other than "unsupported", a crash, a
# pass count below doc/ONNX.md's or a doc/ONNX.md that is out of date.
# TAP skip where the test data is not installed.  The sanitized build runs
# the cases eagerly only (compiling every case there takes minutes).
: "${FUSELAB:=./fuselab}" "${FUSELAB_SRC:=..}"
DATA=${ONNX_TESTDATA:-/usr/share/libonnx-testdata/data/node}
if [ ! -f "$DATA/test_abs/model.onnx" ]; then
  echo "1..0 # SKIP libonnx-testdata is not installed ($DATA)"
  exit 0
fi
if [ "${FUSELAB_ASAN:-0}" = 1 ]; then EXTRA=--eager-only; else EXTRA=; fi
# ~530 small programs compile in chunks of 64, one compiler run each: a
# busy machine is slow, never wrong
FUSELAB_COMPILE_TIMEOUT=${FUSELAB_COMPILE_TIMEOUT:-900}
export FUSELAB_COMPILE_TIMEOUT
exec "$FUSELAB" "$FUSELAB_SRC/tests/onnx/runner.lua" --data "$DATA" \
  --check "$FUSELAB_SRC/doc/ONNX.md" $EXTRA
