#!/bin/sh
# ONNX's current backend node tests (PyPI onnx, the version below: opsets up
# to 28), written as data by tests/onnx/gen_node.py into a temporary folder
# and run by tests/onnx/runner.lua as conformance.sh runs Debian's older
# copy: fails on a wrong answer, an error other than "unsupported", a crash,
# a pass count below doc/ONNX-current.md's or a table that differs from it.
# The Python comes from FUSELAB_ONNX_NODE_PYTHON (setup.sh --test makes a
# virtual environment with onnx==ONNX_VERSION outside the tree); without
# one the test is a TAP skip that says why.  The sanitized build runs the
# cases eagerly only.
ONNX_VERSION=1.23.2
: "${FUSELAB:=./fuselab}" "${FUSELAB_SRC:=..}"
. "$FUSELAB_SRC/tests/onnx/test_python.sh"
test_python "import onnx, sys; sys.exit(onnx.__version__ != '$ONNX_VERSION')" "onnx $ONNX_VERSION"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-onnx-node.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
"$PY" "$FUSELAB_SRC/tests/onnx/gen_node.py" "$tmp/node" >"$tmp/gen.log" 2>&1 || {
  echo "1..1"; echo "not ok 1 - gen_node.py wrote the cases"; sed 's/^/# /' "$tmp/gen.log"; exit 1; }
if [ "${FUSELAB_ASAN:-0}" = 1 ]; then EXTRA=--eager-only; else EXTRA=; fi
FUSELAB_COMPILE_TIMEOUT=${FUSELAB_COMPILE_TIMEOUT:-900}
export FUSELAB_COMPILE_TIMEOUT
"$FUSELAB" "$FUSELAB_SRC/tests/onnx/runner.lua" --data "$tmp/node" \
  --check "$FUSELAB_SRC/doc/ONNX-current.md" --test tests/onnx/current.sh \
  --source "ONNX $ONNX_VERSION's backend node tests (PyPI onnx, opsets up to 28), written as data by
tests/onnx/gen_node.py" $EXTRA
