"""torch_train.py DIR -- the PyTorch half of torch_train.sh.

fl_train.lua wrote into DIR what fuselab computed (see its header);
this builds the same models in PyTorch (same architecture, same parameter
names, the same starting weights loaded from fuselab's files), runs the
same steps with torch.optim's single-tensor implementations, and compares:

  * the first loss and the gradient of every parameter,
  * every parameter and buffer (BatchNorm's running statistics) after 5
    steps of each optimizer, and the 5 losses,
  * cross_entropy with ignore_index, label_smoothing, weight, the three
    reductions, [N, C, d] inputs and probability targets (loss and the
    logits' gradient),
  * the lr sequences of StepLR and CosineAnnealingLR (exactly: both sides
    compute them in double with the same operations).

A tensor passes when every element satisfies
    |fuselab - torch| <= rtol * |torch| + atol * max|torch|
with rtol 1e-4 and atol 1e-6 (the absolute part scaled to the tensor's
magnitude).  Each TAP line gives the worst max|d| / max|torch| over the
tensors it checks.  Prints TAP, the plan last.  Needs only torch: the
safetensors files are read here (the format is 8 bytes, JSON, data).
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# the GPT as fl.models.transformer builds it, shared with tests/ref
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from make_ref import Transformer  # noqa: E402

RTOL, ATOL = 1e-4, 1e-6
DTYPES = {"F32": torch.float32, "I64": torch.int64, "BOOL": torch.bool,
          "F16": torch.float16, "BF16": torch.bfloat16}

out = None          # DIR, set by main()
count = 0
failed = 0


def tap(ok, name, diag=None):
    global count, failed
    count += 1
    if not ok:
        failed += 1
    print(("ok " if ok else "not ok ") + str(count) + " - " + name)
    if not ok and diag:
        for line in str(diag).splitlines():
            print("#   " + line)
    sys.stdout.flush()


def load(name):
    """The tensors and the metadata of DIR/name.safetensors."""
    with open(f"{out}/{name}.safetensors", "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for key, ent in header.items():
        b, e = ent["data_offsets"]
        dt = DTYPES[ent["dtype"]]
        if e > b:
            t = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=dt)
        else:
            t = torch.zeros(0, dtype=dt)
        tensors[key] = t.reshape(ent["shape"]).clone()
    return tensors, meta


def compare(got, want, scale_all=False):
    """(ok, worst max|d|/max|want|, what was worst) over the tensors of want.
    The absolute tolerance scales with each tensor's largest element, or
    with scale_all with the largest of all of them (a gradient: a
    parameter whose gradient is 0 in exact arithmetic holds only rounding
    noise, on both sides)."""
    ok, worst, where = True, 0.0, ""
    top = max((w.abs().max().item() for w in want.values() if w.is_floating_point() and w.numel()),
              default=0.0)
    for k, w in want.items():
        g = got[k]
        if g.shape != w.shape:
            return False, math.inf, f"{k}: shape {list(g.shape)} vs {list(w.shape)}"
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return False, math.inf, f"{k}: {g.tolist()} vs {w.tolist()}"
            continue
        g, w = g.double(), w.double()
        scale = top if scale_all else (w.abs().max().item() if w.numel() else 0.0)
        d = (g - w).abs()
        if not bool((d <= RTOL * w.abs() + ATOL * scale).all()):
            ok = False
            where = f"{k}: max |d| {d.max().item():.3g} at {int(d.argmax())}, max |torch| {scale:.3g}"
        r = d.max().item() / scale if scale > 0 else d.max().item()
        if r > worst:
            worst = r
            if ok:
                where = k
    return ok, worst, where


# ---- the models, as fuselab builds them ----------------------------------

def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 5))


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(6 * 2 * 2, 5))


def GPT(vocab=13, d=16, heads=2, layers=2, seq=8):
    """fl.models.transformer{vocab = 13, d = 16, heads = 2, layers = 2, seq = 8}"""
    return Transformer(vocab, d, heads, layers, seq)


def ce_loss(m, d):
    return F.cross_entropy(m(d["x"]), d["y"])


def gpt_loss(m, d):
    logits = m(d["idx"])
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), d["tgt"].reshape(-1))


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
    "sgd_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                 weight_decay=0.01, foreach=False),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, foreach=False),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=False),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.99), amsgrad=True,
                                                 foreach=False),
}


def check_model(name, make, loss_fn):
    init, _ = load(f"{name}_init")
    data, _ = load(f"{name}_data")
    m = make()
    m.load_state_dict(init)
    m.train()
    loss = loss_fn(m, data)
    loss.backward()
    fl_grad, meta = load(f"{name}_grad")
    fl_loss = float(meta["loss"])
    lr = abs(fl_loss - loss.item()) / abs(loss.item())
    tap(lr <= RTOL, f"{name}: the first loss, relative difference {lr:.2g}",
        f"fuselab {fl_loss}, torch {loss.item()}")
    grads = {k: p.grad for k, p in m.named_parameters()}
    ok, worst, where = compare(fl_grad, grads, scale_all=True)
    tap(ok and set(fl_grad) == set(grads),
        f"{name}: the gradient of each of {len(grads)} parameters, max |d| / max|g| {worst:.2g} ({where})",
        where)
    # Parameters whose gradient is 0 in exact arithmetic (float64 shows
    # it): the bias of attention's keys (softmax ignores a shift common to
    # all keys).  Under Adam their float32 noise becomes steps of lr and
    # arbitrary sign, on both sides, so they are compared only under SGD.
    m64 = make().double()
    m64.load_state_dict(init)
    m64.train()
    d64 = {k: v.double() if v.is_floating_point() else v for k, v in data.items()}
    loss_fn(m64, d64).backward()
    g64 = {k: p.grad.abs().max().item() for k, p in m64.named_parameters()}
    top = max(g64.values())
    zero = sorted(k for k, v in g64.items() if v <= 1e-12 * top)
    for opt_name, make_opt in OPTIMIZERS.items():
        m = make()
        m.load_state_dict(init)
        m.train()
        opt = make_opt(m.parameters())
        losses = []
        for _ in range(5):
            opt.zero_grad()
            ls = loss_fn(m, data)
            ls.backward()
            opt.step()
            losses.append(ls.item())
        fl_state, meta = load(f"{name}_{opt_name}")
        want = {k: v.detach() for k, v in m.state_dict().items()}
        left = [k for k in zero if opt_name.startswith("adam")]
        names_ok = set(fl_state) == set(want)
        for k in left:
            del want[k]
        ok, worst, where = compare(fl_state, want)
        fl_losses = [float(v) for v in meta["losses"].split(",")]
        lworst = max(abs(a - b) / abs(b) for a, b in zip(fl_losses, losses))
        what = "parameters and buffers" if any("running" in k for k in want) else "parameters"
        note = f" ({len(left)} with a zero gradient left out: {', '.join(left)})" if left else ""
        tap(ok and names_ok and lworst <= RTOL,
            f"{name} {opt_name}: the {what} after 5 steps, max |d|/max|p| {worst:.2g} ({where}); "
            f"losses within {lworst:.2g}{note}", f"{where}; losses {fl_losses} vs {losses}")


def main():
    global out
    out = sys.argv[1]
    torch.set_default_dtype(torch.float32)
    check_model("mlp", mlp, ce_loss)
    check_model("cnn", cnn, ce_loss)
    check_model("gpt", GPT, gpt_loss)

    # ---- cross_entropy's options ----------------------------------------------
    for case in ["ignore", "ignore_smooth", "weight_smooth_ignore2", "sum_smooth", "none_weight", "nd",
                 "probs_smooth"]:
        ts, meta = load(f"ce_{case}")
        x = ts["x"].clone().requires_grad_()
        kw = {}
        if "label_smoothing" in meta:
            kw["label_smoothing"] = float(meta["label_smoothing"])
        if "ignore_index" in meta:
            kw["ignore_index"] = int(meta["ignore_index"])
        if "reduction" in meta:
            kw["reduction"] = meta["reduction"]
        if "weight" in ts:
            kw["weight"] = ts["weight"]
        loss = F.cross_entropy(x, ts["y"], **kw)
        if "seed" in ts:
            loss.backward(ts["seed"])
        else:
            loss.backward()
        ok1, w1, where1 = compare({"loss": ts["loss"]}, {"loss": loss.detach()})
        ok2, w2, where2 = compare({"grad": ts["grad"]}, {"grad": x.grad})
        opts = ", ".join(f"{k}={v if not torch.is_tensor(v) else 'tensor'}" for k, v in kw.items())
        tap(ok1 and ok2, f"cross_entropy {case} ({opts or 'defaults'}): loss within {w1:.2g}, "
            f"the logits' gradient {w2:.2g}", f"{where1} {where2}")

    # ---- schedulers -----------------------------------------------------------
    _, meta = load("sched")
    for key, make in [("step", lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)),
                      ("cosine", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5,
                                                                                      eta_min=0.01))]:
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
        s = make(opt)
        seq = []
        for _ in range(12):
            seq.append(s.get_last_lr()[0])
            opt.step()
            s.step()
        got = [float(v) for v in meta[key].split(",")]
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, seq))
        tap(got == seq or worst <= 1e-15,
            f"{'StepLR' if key == 'step' else 'CosineAnnealingLR'}: 12 learning rates, "
            f"{'bit for bit' if got == seq else f'within {worst:.2g}'}", f"{got}\n{seq}")

    print(f"1..{count}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":   # bench/train_eager.py imports the models
    main()
