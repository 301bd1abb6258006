#!/bin/sh
# Networks people export today, against onnxruntime: torchvision's
# ResNet-18, MobileNetV3, EfficientNet and ConvNeXt, a GPT-2 and a BERT
# encoder (transformers), a U-Net, an LSTM and a GRU, each written by
# torch.onnx's dynamo exporter and (NAME_classic) its classic one, with
# seeded random weights and a dynamic batch (and sequence) axis.
# bench/onnx_models.py --small makes them (images 32x32; ViT-B/16, which
# needs 224x224, is left to the bench) into a temporary folder and
# bench/onnx_real.lua checks each: loads, eager and compiled outputs within
# 1e-4 (normwise) of onnxruntime's, and a second batch size that compiles
# nothing new.  The Python comes from FUSELAB_REAL_PYTHON (or
# FUSELAB_ONNX_PYTHON): one with torch, torchvision, transformers, onnx,
# onnxscript and onnxruntime (PyPI packages, not a CI dependency: CI skips).
: "${FUSELAB:=./fuselab}" "${FUSELAB_SRC:=..}"
PY=${FUSELAB_REAL_PYTHON:-${FUSELAB_ONNX_PYTHON:-}}
NEED="torch, torchvision, transformers, onnx, onnxscript, onnxruntime"
if [ -z "$PY" ] || ! "$PY" -c "import $NEED" 2>/dev/null; then
  echo "1..0 # SKIP no Python with $NEED (FUSELAB_REAL_PYTHON; CI has no torch)"
  exit 0
fi
NETS=
for n in resnet18 mobilenet_v3_small efficientnet_b0 convnext_tiny gpt2 bert unet lstm gru; do
  NETS="$NETS $n ${n}_classic"
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-onnx-exports.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
set -- $NETS
echo "1..$#"
# one Python for all (torch imports in seconds); a network it could not
# export is missing below and fails there
"$PY" "$FUSELAB_SRC/bench/onnx_models.py" --small "$tmp" $NETS >"$tmp/gen.log" 2>&1 ||
  tail -n 5 "$tmp/gen.log" | sed 's/^/# /'
FUSELAB_COMPILE_TIMEOUT=${FUSELAB_COMPILE_TIMEOUT:-900}
export FUSELAB_COMPILE_TIMEOUT
n=0
for net in $NETS; do
  n=$((n + 1))
  out=$("$FUSELAB" "$FUSELAB_SRC/bench/onnx_real.lua" "$tmp" "$net" 2>&1)
  if [ $? -eq 0 ]; then
    echo "ok $n - $net matches onnxruntime eagerly and compiled, one compile for two sizes"
  else
    echo "not ok $n - $net"
  fi
  printf '%s\n' "$out" | sed 's/^/# /'
done
