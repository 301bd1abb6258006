#!/usr/bin/env python3
"""make_resnet50.py -- writes examples/models/resnet50.onnx.

  python3 examples/models/make_resnet50.py [OUT.onnx]

Needs the PyPI package onnx (only to regenerate the file; nothing in the
build or the tests runs this).  It starts from the ResNet-50 that the onnx
package ships for its backend tests (light_resnet50.onnx: the real
architecture, whose weights are ConstantOfShape nodes filling every tensor
with 0.02, so its output is the same for every input) and replaces each of
those nodes by a small deterministic generator, so the network's output
depends on its input while the file stays small:

    w = lo + (hi - lo) * ((((i * A + B) mod P)^2 mod P) / P),  i = 0 .. n-1

in int64 (every product below 2^63, so every ONNX runtime computes the same
integers), one (A, B) per tensor.  Convolution and Gemm weights are uniform
with He's variance 2 / fan_in (lo = -hi = -sqrt(6 / fan_in)); batch-norm
scales are uniform in [0.5, 1.5], shifts and the classifier's bias in
[-0.5, 0.5].  The batch norms' running statistics are calibrated instead:
one layer after the other, each is set to the mean and variance its input
has for one seeded random image (through onnxruntime), as training would
have left them, so activations stay near 1 through fifty layers and the
logits are neither one-hot nor constant.  They are stored as initializers
(26 560 channels, about 200 KB).  fuselab folds the input-free generator
subgraphs once at load (onnxruntime folds them too), so they become the
model's weights.

The logits (the final Softmax's input) are a second output: a softmax of
random-weight logits is nearly one-hot and compares too little.
"""
import math, os, sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

P = 2147483647          # 2^31 - 1, prime


def light_resnet50():
    import onnx.backend.test
    d = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "light")
    return onnx.load(os.path.join(d, "light_resnet50.onnx"))


def calibrate(m, bns):
    """Each batch norm's running mean and variance: its input's, for one
    seeded image, given the layers before it already calibrated."""
    import onnxruntime as ort
    g = m.graph
    x = np.random.default_rng(50).standard_normal((1, 3, 224, 224)).astype(np.float32)
    init = {i.name: i for i in g.initializer}
    for bn in bns:
        for name in bn.input[3:5]:
            if name in init:
                g.initializer.remove(init[name])
    for bn in bns:      # placeholders: 0 and 1, replaced in order
        for name, v in ((bn.input[3], 0.0), (bn.input[4], 1.0)):
            g.initializer.append(numpy_helper.from_array(np.full(channels(m, bn), v, np.float32), name))
        init = {i.name: i for i in g.initializer}
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    for bn in bns:
        probe.graph.output.append(helper.make_tensor_value_info(bn.input[0], TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    for j, bn in enumerate(bns):
        for i in probe.graph.initializer:
            if i.name in init:
                i.CopyFrom(init[i.name])
        s = ort.InferenceSession(probe.SerializeToString(), opts)
        a = s.run([bn.input[0]], {s.get_inputs()[0].name: x})[0].astype(np.float64)
        mean, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3))
        for name, v in ((bn.input[3], mean), (bn.input[4], np.maximum(var, 1e-3))):
            init[name].CopyFrom(numpy_helper.from_array(v.astype(np.float32), name))


def channels(m, bn):
    for i in m.graph.initializer:
        if i.name == bn.input[1]:
            return int(i.dims[0])
    for n in m.graph.node:
        if n.op_type == "Reshape" and n.output[0] == bn.input[1]:
            for c in m.graph.node:
                if c.output[0] == n.input[1]:
                    return int(numpy_helper.to_array(c.attribute[0].t)[0])
    raise ValueError("channels of " + bn.name)


def main(out):
    m = light_resnet50()
    g = m.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    nodes, made = [], []
    bns = [n for n in g.node if n.op_type == "BatchNormalization"]
    stats = {name for n in bns for name in n.input[3:5]}

    def const(name, value, dtype=np.int64):
        nodes.append(helper.make_node("Constant", [], [name], name=name,
                                      value=numpy_helper.from_array(np.array(value, dtype=dtype), name)))
        return name

    zero, one, p = const("gen/zero", 0), const("gen/one", 1), const("gen/P", P)
    k = 0
    for n in g.node:
        if n.op_type != "ConstantOfShape":
            nodes.append(n)
            continue
        shape = [int(d) for d in inits[n.input[0]]]
        size = int(np.prod(shape))
        if len(shape) >= 2:
            hi = math.sqrt(6.0 / int(np.prod(shape[1:])))
            lo = -hi
        elif n.output[0] in stats:
            continue                    # calibrated below
        elif n.output[0].endswith("_s_0"):
            lo, hi = 0.5, 1.5
        else:
            lo, hi = -0.5, 0.5
        k += 1
        a, b = 48271 * k % P + 7 * k + 1, 1000003 * k % P + 12345   # A, B < P
        w = n.output[0]
        t = "gen/%d/" % k
        op = lambda typ, ins, name, **kw: nodes.append(
            helper.make_node(typ, ins, [t + name], name=t + name, **kw)) or t + name
        i = op("Range", [zero, const(t + "n", size), one], "i")
        x = op("Mod", [op("Add", [op("Mul", [i, const(t + "A", a)], "iA"), const(t + "B", b)], "iAB"), p], "x", fmod=1)
        z = op("Mod", [op("Mul", [x, x], "xx"), p], "z", fmod=1)
        f = op("Cast", [z], "f", to=TensorProto.FLOAT)
        u = op("Add", [op("Mul", [f, const(t + "scale", (hi - lo) / P, np.float32)], "fs"),
                       const(t + "lo", lo, np.float32)], "u")
        nodes.append(helper.make_node("Reshape", [u, const(t + "shape", shape)], [w], name=t + "w"))
        made.append(w)
    del g.node[:]
    g.node.extend(nodes)
    # the shape initializers fed only the replaced nodes; before IR version
    # 4 every initializer is also a graph input
    used = {i for nd in g.node for i in nd.input}
    live = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(live)
    ins = [i for i in g.input if i.name in used]
    del g.input[:]
    g.input.extend(ins)
    # Range is opset 11, Mod 10; nothing else in the network changed
    # meaning between 9 and 11 (Softmax still flattens to 2-D)
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("", 11))
    m.ir_version = 6
    # graph inputs are the image only (initializers are not inputs)
    inames = {i.name for i in g.initializer}
    ins = [i for i in g.input if i.name not in inames]
    del g.input[:]
    g.input.extend(ins)
    calibrate(m, bns)
    for nd in g.node:
        if nd.op_type == "Softmax" and nd.output[0] in {o.name for o in g.output}:
            g.output.append(helper.make_tensor_value_info(nd.input[0], TensorProto.FLOAT, [1, 1000]))
    onnx.checker.check_model(m)
    onnx.save(m, out)
    print("%s: %d generated weight tensors, %d nodes, %d bytes" % (out, len(made), len(g.node), os.path.getsize(out)))


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "resnet50.onnx"))
