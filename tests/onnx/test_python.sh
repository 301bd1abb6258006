# test_python.sh -- sourced by the tests that run PyPI packages in the test
# venv (setup.sh --test makes it; FUSELAB_ONNX_NODE_PYTHON names its
# Python): `test_python CODE WHAT` sets PY when that Python runs CODE,
# else prints a TAP skip naming WHAT and exits.
test_python() {
  PY=${FUSELAB_ONNX_NODE_PYTHON:-}
  if [ -z "$PY" ] || ! "$PY" -c "$1" 2>/dev/null; then
    echo "1..0 # SKIP no Python with $2 (FUSELAB_ONNX_NODE_PYTHON; setup.sh --test makes one)"
    exit 0
  fi
}
