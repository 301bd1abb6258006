#!/usr/bin/env python3
"""onnx_models.py -- real networks for fuselab's ONNX loader, checked by onnxruntime.

  python3 bench/onnx_models.py OUTDIR [NAME ...]
  python3 bench/onnx_models.py --retime OUTDIR [NAME ...]

Needs the PyPI packages onnx, onnxruntime, numpy (and torch + onnxscript for
the two exported models); run it from a venv outside the repository.  For
every network it writes OUTDIR/NAME/{model.onnx, input_0.npy, output_K.npy,
ort.json}: the model, a seeded random input, onnxruntime's outputs and its
load and steady times (2 threads, median and spread of 20 runs).  With
--retime it only times onnxruntime again on the files already there and
rewrites ort.json: on a shared machine, times taken in another hour say
little about this one's (ShuffleNet's steady time here: 3.5 ms one hour,
7-9 ms another).

The ImageNet networks come from the onnx package's "light" test models.
Their weights are ConstantOfShape nodes filling every tensor with 0.02, so
their stored outputs test little: each such node becomes an initializer of
seeded random values, scaled by fan-in (He) so activations stay near 1
through fifty layers, and 1-D tensors (biases, batch-norm statistics and
scales) drawn from U(0.5, 1.5), which keeps variances positive.
"""
import json, os, sys, time
import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2",
         "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"]
EXPORTED = ["torch_mlp", "torch_transformer"]


def light_dir():
    import onnx.backend.test
    return os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "light")


def randomize(model, rng):
    """Replace each weight-making ConstantOfShape by a random initializer."""
    g = model.graph
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t)
              for n in g.node if n.op_type == "Constant"}
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    keep = []
    for n in g.node:
        if n.op_type != "ConstantOfShape":
            keep.append(n)
            continue
        src = n.input[0]
        shape = consts.get(src, inits.get(src))
        if shape is None:
            keep.append(n)
            continue
        shape = [int(d) for d in shape]
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        else:
            w = rng.uniform(0.5, 1.5, shape)
        g.initializer.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    # Inputs that the constants fed and nothing else reads any more.
    used = {i for n in g.node for i in n.input}
    live = [i for i in g.initializer if i.name in used or i.name in
            {o.name for o in g.output}]
    del g.initializer[:]
    g.initializer.extend(live)
    # Before IR version 4 every initializer is also a graph input: drop
    # the inputs that named the removed shape tensors.
    ins = [i for i in g.input if i.name in used]
    del g.input[:]
    g.input.extend(ins)
    return model


def logits(model):
    """A softmax of random-weight logits is nearly one-hot and says little:
    add the final softmax's input as a second output."""
    g = model.graph
    outs = {o.name for o in g.output}
    for n in g.node:
        if n.op_type == "Softmax" and n.output[0] in outs:
            g.output.append(onnx.helper.make_tensor_value_info(
                n.input[0], onnx.TensorProto.FLOAT, None))


def exported(name, path):
    import torch
    torch.manual_seed(0)
    if name == "torch_mlp":
        m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
        x = torch.randn(8, 64)
    else:
        m = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0,
                                             batch_first=True)
        x = torch.randn(2, 16, 64)
    m.eval()
    torch.onnx.export(m, (x,), path, dynamo=True, input_names=["x"],
                      output_names=["y"])
    return x.numpy()


def timed(sess, feeds, n=20):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        out = sess.run(None, feeds)
        ts.append(time.perf_counter() - t)
    ts.sort()
    return out, ts[n // 2], ts[n // 4], ts[(3 * n) // 4]


def session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    t = time.perf_counter()
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return sess, time.perf_counter() - t


def write_times(d, load, med, q1, q3):
    with open(os.path.join(d, "ort.json"), "w") as f:
        json.dump({"load_s": load, "steady_s": med, "steady_q1_s": q1,
                   "steady_q3_s": q3, "onnxruntime": ort.__version__}, f)


def retime(out, names):
    for name in names:
        d = os.path.join(out, name)
        if not os.path.exists(os.path.join(d, "model.onnx")):
            print("%-18s missing" % name)
            continue
        sess, load = session(os.path.join(d, "model.onnx"))
        feeds = {sess.get_inputs()[0].name: np.load(os.path.join(d, "input_0.npy"))}
        timed(sess, feeds, 3)
        _, med, q1, q3 = timed(sess, feeds)
        write_times(d, load, med, q1, q3)
        print("%-18s onnxruntime: load %.3f s, steady %.2f ms (IQR %.2f-%.2f)"
              % (name, load, med * 1e3, q1 * 1e3, q3 * 1e3))


def main():
    args = sys.argv[1:]
    again = bool(args) and args[0] == "--retime"
    if again:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    out = args[0]
    names = args[1:] or LIGHT + EXPORTED
    if again:
        return retime(out, names)
    rng = np.random.default_rng(20261201)
    for name in names:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.onnx")
        if name in EXPORTED:
            x = exported(name, path)
        else:
            m = onnx.load(os.path.join(light_dir(), "light_%s.onnx" % name))
            m = randomize(m, rng)
            logits(m)
            onnx.save(m, path)
            inits = {i.name for i in m.graph.initializer}
            inp = [i for i in m.graph.input if i.name not in inits][0]
            shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
            x = rng.standard_normal(shape).astype(np.float32)
        sess, load = session(path)
        feeds = {sess.get_inputs()[0].name: x}
        ys, med, q1, q3 = timed(sess, feeds)
        y = ys[0]
        np.save(os.path.join(d, "input_0.npy"), x)
        for i, yi in enumerate(ys):
            np.save(os.path.join(d, "output_%d.npy" % i), yi)
        write_times(d, load, med, q1, q3)
        print("%-18s onnxruntime: load %.3f s, steady %.2f ms (IQR %.2f-%.2f), output %s sum %.6g"
              % (name, load, med * 1e3, q1 * 1e3, q3 * 1e3, list(y.shape), float(y.sum())))


if __name__ == "__main__":
    main()
