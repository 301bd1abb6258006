#!/bin/sh
# onnx.sh -- on the CUDA emulator: ONNX's current node cases of the ops
# fl.load_onnx gained last (signal, spatial, training, random, math,
# FlexAttention...), each that passes eagerly compiled for the cuda
# backend and run with its inputs on the device (tests/onnx/runner.lua
# --cuda): a wrong answer or an error other than "unsupported" fails.  The
# cases come from the test venv's onnx as tests/onnx/current.sh makes them
# (a TAP skip without it); the sanitized build skips (minutes there).
: "${FUSELAB:?FUSELAB must name the fuselab binary}"
SRC=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../../.." && pwd)}
. "$SRC/tests/onnx/test_python.sh"
if [ "${FUSELAB_ASAN:-0}" = 1 ]; then
  echo "1..0 # SKIP the sanitized build (the emulator's threads under ASan take minutes here)"
  exit 0
fi
test_python "import onnx" "onnx"
run="$(dirname "$FUSELAB")/tests/gpu/emu/run"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-emu-onnx.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
"$PY" "$SRC/tests/onnx/gen_node.py" "$tmp/node" >"$tmp/gen.log" 2>&1 || {
  echo "1..1"; echo "not ok 1 - gen_node.py wrote the cases"; sed 's/^/# /' "$tmp/gen.log"; exit 1; }
set --
for p in acos asin atan 'cast.*BFLOAT16' div_uint64 mod_uint64 range_int32 'reduce_m[ai][xn]_bool' \
    wrap_pad 'scatter.*mul' gathernd det bitcast tensorscatter onehot resize upsample averagepool \
    lppool maxpool_with_argmax maxunpool convtranspose col2im roialign deform_conv gridsample dft \
    stft melweightmatrix linear_attention causal_conv scan 'batchnorm.*training' training_dropout \
    bernoulli adagrad adam momentum nesterov tfidf flexattention image_decoder matmulinteger \
    qlinearmatmul; do
  set -- "$@" --only "^test_$p"
done
"$run" "$FUSELAB" "$SRC/tests/onnx/runner.lua" --data "$tmp/node" --cuda "$@" 2>"$tmp/err.log"
rc=$?
[ $rc -eq 0 ] || sed 's/^/# /' "$tmp/err.log" | tail -20
exit $rc
