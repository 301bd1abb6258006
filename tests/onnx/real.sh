#!/bin/sh
# Real networks against onnxruntime: the nine ImageNet networks of the onnx
# package with seeded random weights and two torch.onnx.export models
# (bench/onnx_models.py makes them), each loaded by fl.load_onnx, run
# eagerly and compiled, and compared with onnxruntime's outputs (normwise
# error at most 1e-4: bench/onnx_real.lua).  Runs only where
# FUSELAB_ONNX_PYTHON names a Python with onnx, onnxruntime, torch and
# onnxscript (a venv outside the repository: these are PyPI packages, not
# a CI dependency); TAP skip otherwise.  The models (1.3 GB) are made once
# into FUSELAB_ONNX_MODELS (default tests/onnx/real-models in the build).
: "${FUSELAB:=./fuselab}" "${FUSELAB_SRC:=..}"
PY=${FUSELAB_ONNX_PYTHON:-}
if [ -z "$PY" ] || ! "$PY" -c 'import onnx, onnxruntime' 2>/dev/null; then
  echo "1..0 # SKIP FUSELAB_ONNX_PYTHON (a Python with onnx and onnxruntime) is not set"
  exit 0
fi
DIR=${FUSELAB_ONNX_MODELS:-tests/onnx/real-models}
NETS="bvlc_alexnet densenet121 inception_v1 inception_v2 resnet50 shufflenet squeezenet vgg19 zfnet512 torch_mlp torch_transformer"
set -- $NETS
echo "1..$#"
n=0
for net in $NETS; do
  n=$((n + 1))
  if [ ! -s "$DIR/$net/ort.json" ] &&
     ! "$PY" "$FUSELAB_SRC/bench/onnx_models.py" "$DIR" "$net" >"$DIR.$net.log" 2>&1; then
    echo "not ok $n - $net: bench/onnx_models.py failed"
    tail -n 5 "$DIR.$net.log" | sed 's/^/# /'
    continue
  fi
  out=$(FUSELAB_COMPILE_TIMEOUT=900 "$FUSELAB" "$FUSELAB_SRC/bench/onnx_real.lua" "$DIR" "$net" 2>&1)
  if [ $? -eq 0 ]; then
    echo "ok $n - $net matches onnxruntime eagerly and compiled"
  else
    echo "not ok $n - $net"
  fi
  printf '%s\n' "$out" | sed 's/^/# /'
done
