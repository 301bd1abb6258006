#!/usr/bin/env python3
"""onnx_models.py -- real networks for fuselab's ONNX loader, checked by onnxruntime.

  python3 bench/onnx_models.py [--small] OUTDIR [NAME ... | --exports]
  python3 bench/onnx_models.py --retime OUTDIR [NAME ...]

Needs the PyPI packages onnx, onnxruntime, numpy (and torch + onnxscript for
the exported models, torchvision and transformers for the --exports set);
run it from a venv outside the repository.  For every network it writes
OUTDIR/NAME/{model.onnx, input_K.npy, output_K.npy, ort.json}: the model,
seeded random inputs (one file per graph input), onnxruntime's outputs and
its load and steady times (2 threads, median and spread of 20 runs).

--exports names the networks people export today (REAL below: torchvision
classifiers, HF GPT-2 and BERT, a U-Net, an LSTM and a GRU), each by the
dynamo exporter as NAME and by the classic one as NAME_classic, batch (and
sequence) axes dynamic.  For these it also writes input2_K.npy and
output2_K.npy: inputs of another batch (and sequence) size and
onnxruntime's outputs for them, which bench/onnx_real.lua uses to check
that one compile serves both sizes.  --small makes the images smaller
(tests/onnx/exports.sh).  With
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
# Networks people export today, seeded random weights, each written by
# torch.onnx's current exporter (dynamo) and, as NAME_classic, by the
# TorchScript one.  Batch (and sequence) axes are dynamic.
REAL = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny",
        "vit_b_16", "gpt2", "bert", "unet", "lstm", "gru"]
EXPORTS = [n + s for n in REAL for s in ("", "_classic")]
# --small: the reduced shapes tests/onnx/exports.sh uses (CNN images 32x32;
# ViT keeps its 224x224, the size its position table is made for).
SMALL = False


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


def unet():
    """A small U-Net: two conv stages down (max pool), a ConvTranspose and a
    bilinear upsample back up, skip connections by concat, and a nearest
    upsample of the bottleneck added to the head."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.e1, self.e2, self.mid = block(3, 8), block(8, 16), block(16, 32)
            self.up1 = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.d1 = block(32, 16)
            self.d2 = block(24, 8)
            self.side = nn.Conv2d(32, 2, 1)
            self.head = nn.Conv2d(8, 2, 1)

        def forward(self, x):
            a = self.e1(x)
            b = self.e2(F.max_pool2d(a, 2))
            c = self.mid(F.max_pool2d(b, 2))
            u = self.d1(torch.cat([self.up1(c), b], 1))
            u = F.interpolate(u, scale_factor=2.0, mode="bilinear", align_corners=False)
            u = self.d2(torch.cat([u, a], 1))
            return self.head(u) + F.interpolate(self.side(c), scale_factor=4.0, mode="nearest")

    return UNet()


def recurrent(kind):
    """An LSTM (two layers, bidirectional) or a GRU (two layers) over
    [batch, time, 16] with a linear head on every step."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "lstm":
                self.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)
                self.head = nn.Linear(64, 10)
            else:
                self.rnn = nn.GRU(16, 32, num_layers=2, batch_first=True)
                self.head = nn.Linear(32, 10)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.head(y)

    return Net()


def hf(kind):
    """GPT-2 (LM head) or a BERT encoder from small random configs, called
    with input ids and an attention mask; returns the tensors only."""
    import torch
    import transformers as tr

    if kind == "gpt2":
        cfg = tr.GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2,
                            n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = tr.GPT2LMHeadModel(cfg)
    else:
        cfg = tr.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=256,
                            max_position_embeddings=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        model = tr.BertModel(cfg)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask):
            out = self.m(input_ids=ids, attention_mask=mask, use_cache=False,
                         return_dict=False) if kind == "gpt2" else \
                self.m(input_ids=ids, attention_mask=mask, return_dict=False)
            return tuple(out)

    return Wrap()


def calibrate(m, make):
    """torchvision's initial weights give outputs that test little (ViT's
    head is zeros; MobileNetV3's and EfficientNet's logits come out near
    1e-9 and 1e-14 through their squeeze-excitation gates): a zero Linear
    gets He-normal weights, and each batch norm's statistics are those of
    three random batches, so activations stay near 1 to the logits."""
    import torch
    for mod in m.modules():
        if isinstance(mod, torch.nn.Linear) and not mod.weight.any():
            torch.nn.init.kaiming_normal_(mod.weight)
            torch.nn.init.uniform_(mod.bias, -0.1, 0.1)
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.reset_running_stats()
            mod.momentum = None          # a plain average of the batches
    m.train()
    with torch.no_grad():
        for _ in range(3):
            m(*make(4, 0))
    m.eval()


def text_inputs(batch, seq, gen):
    import torch
    ids = torch.randint(0, 1000, (batch, seq), generator=gen, dtype=torch.int64)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, seq - 3:] = 0          # the last row padded: the mask is read
    return (ids, mask)


def real_model(base):
    """The module, a function making its inputs for (batch, seq), the
    dynamic axes of each input and the two sizes to call it with."""
    import torch
    import torchvision.models as tv
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    side = 32 if SMALL else 112
    if base in ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_b_16"):
        m = getattr(tv, base)(weights=None)
        if base == "vit_b_16":
            side = 224
        make = lambda b, t: (torch.randn(b, 3, side, side, generator=gen),)
        calibrate(m, make)
        return m, make, [{0: "batch"}], [(2, 0), (3, 0)]
    if base in ("gpt2", "bert"):
        seq = 8 if SMALL else 16
        make = lambda b, t: text_inputs(b, t, gen)
        return hf(base), make, [{0: "batch", 1: "seq"}] * 2, [(2, seq), (3, seq + 5)]
    if base == "unet":
        make = lambda b, t: (torch.randn(b, 3, side // 2, side // 2, generator=gen),)
        return unet(), make, [{0: "batch"}], [(2, 0), (3, 0)]
    if base in ("lstm", "gru"):
        make = lambda b, t: (torch.randn(b, t, 16, generator=gen),)
        # the second size changes the batch and the sequence length: the
        # loader runs RNN, GRU and LSTM as one rnn op whose sequence length
        # stays symbolic, so one compile serves both
        return recurrent(base), make, [{0: "batch", 1: "seq"}], [(2, 12), (3, 17)]
    raise SystemExit("unknown network " + base)


def export_real(name, path):
    """Export NAME (REAL, or REAL + "_classic") to path; returns the inputs
    at the first size and, for the dynamic-axes check, at the second."""
    import torch
    classic = name.endswith("_classic")
    base = name[:-len("_classic")] if classic else name
    m, make, axes, sizes = real_model(base)
    m.eval()
    xs = make(*sizes[0])
    xs2 = make(*sizes[1])
    names = ["input_%d" % i for i in range(len(xs))]
    with torch.no_grad():
        ys = m(*xs)
    ys = ys if isinstance(ys, tuple) else (ys,)
    outs = ["output_%d" % i for i in range(len(ys))]
    if classic:
        dyn = dict(zip(names, axes))
        for o, y in zip(outs, ys):
            dyn[o] = {0: "batch"}
        torch.onnx.export(m, xs, path, dynamo=False, input_names=names, output_names=outs,
                          dynamic_axes=dyn, opset_version=17)
    else:
        D = torch.export.Dim
        dims = {}
        shapes = tuple({k: dims.setdefault(v, D(v, max=64 if v == "seq" else 512))
                        for k, v in a.items()} for a in axes)
        torch.onnx.export(m, xs, path, dynamo=True, input_names=names, output_names=outs,
                          dynamic_shapes=shapes, external_data=False)
    return [x.numpy() for x in xs], [x.numpy() for x in xs2]


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


def feed(sess, xs):
    return {i.name: x for i, x in zip(sess.get_inputs(), xs)}


def save_all(d, prefix, arrays):
    for i, a in enumerate(arrays):
        np.save(os.path.join(d, "%s_%d.npy" % (prefix, i)), a)


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
        feeds = feed(sess, [np.load(os.path.join(d, "input_%d.npy" % i))
                            for i in range(len(sess.get_inputs()))])
        timed(sess, feeds, 3)
        _, med, q1, q3 = timed(sess, feeds)
        write_times(d, load, med, q1, q3)
        print("%-18s onnxruntime: load %.3f s, steady %.2f ms (IQR %.2f-%.2f)"
              % (name, load, med * 1e3, q1 * 1e3, q3 * 1e3))


def main():
    global SMALL
    args = sys.argv[1:]
    again = bool(args) and args[0] == "--retime"
    if again:
        args = args[1:]
    if args and args[0] == "--small":
        SMALL, args = True, args[1:]
    if not args:
        sys.exit(__doc__)
    out = args[0]
    names = args[1:] or LIGHT + EXPORTED
    if names == ["--exports"]:
        names = EXPORTS
    if again:
        return retime(out, names)
    rng = np.random.default_rng(20261201)
    failed = []
    for name in names:
        try:
            make(out, name, rng)
        except Exception as e:       # the others are still made
            print("%-18s failed: %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            failed.append(name)
    if failed:
        sys.exit("not made: " + " ".join(failed))


def make(out, name, rng):
    """OUTDIR/NAME: the model, its inputs, onnxruntime's outputs and times."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    xs2 = None
    if name in EXPORTS:
        xs, xs2 = export_real(name, path)
    elif name in EXPORTED:
        xs = [exported(name, path)]
    else:
        m = onnx.load(os.path.join(light_dir(), "light_%s.onnx" % name))
        m = randomize(m, rng)
        logits(m)
        onnx.save(m, path)
        inits = {i.name for i in m.graph.initializer}
        inp = [i for i in m.graph.input if i.name not in inits][0]
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        xs = [rng.standard_normal(shape).astype(np.float32)]
    sess, load = session(path)
    ys, med, q1, q3 = timed(sess, feed(sess, xs))
    y = ys[0]
    save_all(d, "input", xs)
    save_all(d, "output", ys)
    if xs2 is not None:
        # the other batch (and sequence) size: one compile must serve both
        save_all(d, "input2", xs2)
        save_all(d, "output2", sess.run(None, feed(sess, xs2)))
    write_times(d, load, med, q1, q3)
    print("%-18s onnxruntime: load %.3f s, steady %.2f ms (IQR %.2f-%.2f), output %s sum %.6g"
          % (name, load, med * 1e3, q1 * 1e3, q3 * 1e3, list(y.shape), float(y.sum())))


if __name__ == "__main__":
    main()
