#!/bin/sh
# The memory promise (doc/DESIGN.md: fusion never costs memory) on the nine
# ImageNet networks of ONNX's light test models, by tests/onnx/memory_nets.lua.
# The models come with PyPI onnx (FUSELAB_ONNX_NODE_PYTHON, which setup.sh
# --test makes); without it the test is a TAP skip that says why.  The
# sanitized build plans the four smaller networks only: loading VGG-19's
# 550 MB of weights there takes minutes.
: "${FUSELAB:=./fuselab}" "${FUSELAB_SRC:=..}"
. "$FUSELAB_SRC/tests/onnx/test_python.sh"
light="import os, onnx.backend.test as t; print(os.path.join(os.path.dirname(t.__file__), 'data', 'light'))"
test_python "$light" "onnx's light models"
dir=$("$PY" -c "$light")
if [ ! -f "$dir/light_resnet50.onnx" ]; then
  echo "1..0 # SKIP onnx's light models are not in $dir"
  exit 0
fi
if [ "${FUSELAB_ASAN:-0}" = 1 ]; then
  set -- squeezenet shufflenet inception_v1 resnet50
else
  set -- bvlc_alexnet densenet121 inception_v1 inception_v2 resnet50 shufflenet squeezenet vgg19 zfnet512
fi
exec "$FUSELAB" "$FUSELAB_SRC/tests/onnx/memory_nets.lua" "$dir" "$@"
