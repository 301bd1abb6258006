#!/usr/bin/env python3
"""onnx_segments.py -- a torchvision network cut into its stages, each an ONNX model of its own.

  python3 bench/onnx_segments.py DIR NAME OUTDIR

DIR/NAME/{model.onnx, input_0.npy} as bench/onnx_models.py writes them
(torchvision's EfficientNet or MobileNetV3: the weights named features.S...).
The cuts are the inputs of each stage's first convolution (features.S's)
and the network's output; for each stage it writes OUTDIR/NAME_sK/
{model.onnx, input_0.npy}, the input being onnxruntime's value at that cut,
so that bench/onnx_turns.sh can set fuselab against onnxruntime stage by
stage and say where a whole network's difference lies.

A stage returns a map of several hundred KiB: give bench/onnx_turns.sh
CALLS=100, as the first collection of a process's garbage comes after its
first 16 MiB of results, and until then every result is fresh memory
(scripting/lfl_tensor.c).  Needs onnx, onnxruntime and numpy from a venv.
"""
import os
import sys

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, name, out = sys.argv[1:]
    path = os.path.join(src, name, "model.onnx")
    model = onnx.load(path)
    reads = {n.input[1]: n.input[0] for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 1}
    cuts = [model.graph.input[0].name]
    for s in range(1, 32):
        for w in (f"features.{s}.0.block.0.0.weight", f"features.{s}.block.0.0.weight", f"features.{s}.0.weight"):
            if w in reads and reads[w] not in cuts:
                cuts.append(reads[w])
                break
    cuts.append(model.graph.output[0].name)
    # every cut's value, from one onnxruntime run with the cuts as outputs
    probe = onnx.load(path)
    for c in cuts[1:-1]:
        probe.graph.output.append(onnx.ValueInfoProto(name=c))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.load(os.path.join(src, name, "input_0.npy"))
    values = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {cuts[0]: x})))
    values[cuts[0]] = x
    for i in range(len(cuts) - 1):
        d = os.path.join(out, f"{name}_s{i}")
        os.makedirs(d, exist_ok=True)
        onnx.utils.extract_model(path, os.path.join(d, "model.onnx"), [cuts[i]], [cuts[i + 1]])
        np.save(os.path.join(d, "input_0.npy"), values[cuts[i]])
        print(f"{d}: {cuts[i]} {list(values[cuts[i]].shape)} -> {cuts[i + 1]}")


if __name__ == "__main__":
    main()
