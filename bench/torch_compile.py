#!/usr/bin/env python3
"""fuselab's compiled code against PyTorch 2's torch.compile (Inductor) on
the CPU, both on 2 threads, on the same weights and inputs.

    $VENV/bin/python bench/torch_compile.py [--rounds N] [--fuselab build/fuselab]
           [--only name,name] [--coretype Prescott]

The driver writes every weight and input once as .npy files (numpy, from
fixed formulas), then, round after round, runs each workload in a fresh
PyTorch process and a fresh fuselab process (bench/torch_compile.lua),
alternating which goes first.  Each child loads the same files, compiles,
warms up, times its best of several batches and prints the sum of its
output, so the table shows both computed the same thing.  --coretype sets
OPENBLAS_CORETYPE for both sides (Prescott: a CPU OpenBLAS does not know).

Ratios are torch.compile time / fuselab time (> 1: fuselab faster), of
the medians and of the best times over the rounds; the
cold-compile row is the first call in a process with empty compile caches
(Inductor's and fuselab's in fresh temporary directories).  Needs PyTorch 2
and numpy (a venv; the repository does not depend on them).
"""
import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# workload: (description, unit of the timing)
WORKLOADS = [
    ("chain", "9-op elementwise chain, 16M float32"),
    ("softmax", "softmax 4096x1024"),
    ("layer_norm", "layer_norm 4096x1024"),
    ("mlp", "MLP 512-2048-512, batch 256"),
    ("block", "transformer block 8x128x256, 4 heads, causal"),
    ("gpt", "2-layer GPT d 256 (vocab 512, 8x128 tokens)"),
    ("dispatch", "dispatch of a tiny graph (x*2+1, 64 floats)"),
    ("cold", "cold compile of the block (first call, empty caches)"),
]

B, T, D, H, V, LAYERS = 8, 128, 256, 4, 512, 2


def param(shape, scale, shift, salt):
    """shift + scale * ((i * 7919 + 13 + salt) % 2003 - 1001) / 1001 in float32"""
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    v = shift + scale * (((i * 7919 + 13 + salt) % 2003) - 1001) / 1001.0
    return v.astype(np.float32).reshape(shape)


def data(shape):
    """((i * 7919) % 2001) / 1000 - 1 in float32"""
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    return (((i * 7919) % 2001).astype(np.float32) / np.float32(1000.0) - np.float32(1.0)).reshape(shape)


def block_params(prefix, salt):
    """a pre-LN block's weights, named prefix + name"""
    p = {}
    p[prefix + "ln1_w"] = param((D,), 0.2, 1.0, salt + 1)
    p[prefix + "ln1_b"] = param((D,), 0.1, 0.0, salt + 2)
    for j, n in enumerate(["q", "k", "v", "o"]):
        p[prefix + n + "_w"] = param((D, D), 0.5 / 16, 0.0, salt + 10 + j)
        p[prefix + n + "_b"] = param((D,), 0.1, 0.0, salt + 20 + j)
    p[prefix + "ln2_w"] = param((D,), 0.2, 1.0, salt + 3)
    p[prefix + "ln2_b"] = param((D,), 0.1, 0.0, salt + 4)
    p[prefix + "fc1_w"] = param((4 * D, D), 0.5 / 16, 0.0, salt + 30)
    p[prefix + "fc1_b"] = param((4 * D,), 0.1, 0.0, salt + 31)
    p[prefix + "fc2_w"] = param((D, 4 * D), 0.5 / 32, 0.0, salt + 32)
    p[prefix + "fc2_b"] = param((D,), 0.1, 0.0, salt + 33)
    return p


def write_files(d):
    """every workload's inputs and weights as d/<name>.npy"""
    f = {}
    f["chain_x"] = data((16 * 1024 * 1024,))
    f["rows_x"] = data((4096, 1024))
    f["ln_w"] = param((1024,), 0.2, 1.0, 5)
    f["ln_b"] = param((1024,), 0.1, 0.0, 6)
    f["mlp_x"] = data((256, 512))
    f["mlp_w1"] = param((2048, 512), 0.5 / 8, 0.0, 7)
    f["mlp_b1"] = param((2048,), 0.1, 0.0, 8)
    f["mlp_w2"] = param((512, 2048), 0.5 / 16, 0.0, 9)
    f["mlp_b2"] = param((512,), 0.1, 0.0, 10)
    f["block_x"] = data((B, T, D))
    f.update(block_params("b0_", 100))
    f["gpt_idx"] = ((np.arange(B * T, dtype=np.int64) * 7919 + 3) % V).reshape(B, T)
    f["gpt_tok"] = param((V, D), 0.5, 0.0, 40)
    f["gpt_pos"] = param((T, D), 0.1, 0.0, 41)
    for layer in range(LAYERS):
        f.update(block_params("g%d_" % layer, 200 + 100 * layer))
    f["gpt_lnf_w"] = param((D,), 0.2, 1.0, 42)
    f["gpt_lnf_b"] = param((D,), 0.1, 0.0, 43)
    f["gpt_head"] = param((V, D), 0.5 / 16, 0.0, 44)
    f["tiny_x"] = data((64,))
    for k, v in f.items():
        np.save(os.path.join(d, k + ".npy"), v)


# ---- the PyTorch child -----------------------------------------------------

def torch_child(name, d):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(2)

    def load(k):
        return torch.from_numpy(np.load(os.path.join(d, k + ".npy")))

    def block_fn(P, prefix):
        hd = D // H

        def split(t, b):
            return t.reshape(b, T, H, hd).transpose(1, 2)

        def run(x):
            b = x.shape[0]
            h = F.layer_norm(x, (D,), P[prefix + "ln1_w"], P[prefix + "ln1_b"], eps=1e-5)
            q = split(F.linear(h, P[prefix + "q_w"], P[prefix + "q_b"]), b)
            k = split(F.linear(h, P[prefix + "k_w"], P[prefix + "k_b"]), b)
            v = split(F.linear(h, P[prefix + "v_w"], P[prefix + "v_b"]), b)
            i = torch.arange(T).reshape(T, 1)
            j = torch.arange(T).reshape(1, T)
            mask = torch.where(j > i, -math.inf, 0.0)
            s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + mask
            a = torch.matmul(torch.softmax(s, dim=-1), v)
            a = a.transpose(1, 2).reshape(b, T, D)
            x2 = x + F.linear(a, P[prefix + "o_w"], P[prefix + "o_b"])
            g = F.layer_norm(x2, (D,), P[prefix + "ln2_w"], P[prefix + "ln2_b"], eps=1e-5)
            f = F.gelu(F.linear(g, P[prefix + "fc1_w"], P[prefix + "fc1_b"]))
            return x2 + F.linear(f, P[prefix + "fc2_w"], P[prefix + "fc2_b"])
        return run

    names = [f[:-4] for f in os.listdir(d) if f.endswith(".npy")]
    P = {k: load(k) for k in names if k.startswith(("b0_", "g0_", "g1_"))}
    if name == "chain":
        args = (load("chain_x"),)

        def fn(x):
            y = x * 1.5 + 0.25
            y = (y - 0.5) * x + 1.0
            y = y.abs() * 0.5 - 0.125
            return torch.relu(y)
    elif name == "softmax":
        args = (load("rows_x"),)

        def fn(x):
            return torch.softmax(x, dim=-1)
    elif name == "layer_norm":
        args = (load("rows_x"), load("ln_w"), load("ln_b"))

        def fn(x, w, b):
            return F.layer_norm(x, (1024,), w, b, eps=1e-5)
    elif name == "mlp":
        args = (load("mlp_x"),)
        w1, b1, w2, b2 = load("mlp_w1"), load("mlp_b1"), load("mlp_w2"), load("mlp_b2")

        def fn(x):
            return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    elif name in ("block", "cold"):
        args = (load("block_x"),)
        fn = block_fn(P, "b0_")
    elif name == "gpt":
        args = (load("gpt_idx"),)
        tok, pos = load("gpt_tok"), load("gpt_pos")
        lnf_w, lnf_b, head = load("gpt_lnf_w"), load("gpt_lnf_b"), load("gpt_head")
        blocks = [block_fn(P, "g%d_" % layer) for layer in range(LAYERS)]

        def fn(idx):
            x = F.embedding(idx, tok) + F.embedding(torch.arange(T), pos)
            for blk in blocks:
                x = blk(x)
            return F.linear(F.layer_norm(x, (D,), lnf_w, lnf_b, eps=1e-5), head)
    elif name == "dispatch":
        args = (load("tiny_x"),)

        def fn(x):
            return x * 2.0 + 1.0
    else:
        raise SystemExit("unknown workload " + name)
    cf = torch.compile(fn)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = cf(*args)
        first = time.perf_counter() - t0
        if name == "cold":
            print("ms %.6f sum %.6e" % (first * 1e3, out.double().sum().item()))
            return
        reps = 2000 if name == "dispatch" else 10
        for _ in range(3):
            cf(*args)
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                out = cf(*args)
            best = min(best, (time.perf_counter() - t0) / reps)
    print("ms %.6f sum %.6e" % (best * 1e3, out.double().sum().item()))


# ---- the driver --------------------------------------------------------------

def verdict(tt, ff):
    """a side is faster only when all its rounds beat all the other's:
    overlapping ranges are noise on a shared machine"""
    if max(ff) < min(tt):
        return "fuselab faster"
    if max(tt) < min(ff):
        return "torch.compile faster"
    return "no clear difference here"


def run_child(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ms":
            return float(parts[1]), float(parts[3])
    sys.stderr.write("%s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout[-2000:], p.stderr[-4000:]))
    return None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fuselab", default=os.path.join(HERE, "..", "build", "fuselab"))
    ap.add_argument("--only", default="")
    ap.add_argument("--coretype", default="")
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "DIR"))
    a = ap.parse_args()
    if a.child:
        torch_child(*a.child)
        return
    only = [w for w in a.only.split(",") if w]
    todo = [w for w in WORKLOADS if not only or w[0] in only]
    with tempfile.TemporaryDirectory(prefix="fl_torch_bench_") as d:
        write_files(d)
        env = dict(os.environ, OMP_NUM_THREADS="2")
        if a.coretype:
            env["OPENBLAS_CORETYPE"] = a.coretype
        times = {w[0]: {"torch": [], "fuselab": []} for w in todo}
        sums = {}
        for r in range(a.rounds):
            for name, _ in todo:
                sides = ["torch", "fuselab"] if r % 2 == 0 else ["fuselab", "torch"]
                for side in sides:
                    e = dict(env)
                    # warm runs share one cache dir per side; the cold row gets fresh ones
                    cache = tempfile.mkdtemp(prefix="fl_cache_", dir=d) if name == "cold" else os.path.join(d, "cache_" + side)
                    os.makedirs(cache, exist_ok=True)
                    if side == "torch":
                        e["TORCHINDUCTOR_CACHE_DIR"] = cache
                        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, d]
                    else:
                        e["FUSELAB_CACHE_DIR"] = cache
                        cmd = [a.fuselab, os.path.join(HERE, "torch_compile.lua"), name, d]
                    ms, s = run_child(cmd, e)
                    if ms is not None:
                        times[name][side].append(ms)
                        sums.setdefault(name, {})[side] = s
        cpu = "?"
        try:
            for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
                if line.startswith("Model name:"):
                    cpu = line.split(":", 1)[1].strip()
        except OSError:
            pass
        print("CPU: %s; 2 threads; %d alternating rounds, fresh processes; OPENBLAS_CORETYPE=%s" %
              (cpu, a.rounds, a.coretype or "(unset)"))
        print("%-52s %22s %22s %7s %7s  %-27s %s" % ("workload", "torch.compile ms", "fuselab ms", "ratio",
                                                     "best", "verdict", "output sums (torch / fuselab)"))
        for name, desc in todo:
            tt, ff = times[name]["torch"], times[name]["fuselab"]
            if not tt or not ff:
                print("%-52s %s" % (desc, "failed (see stderr)"))
                continue
            mt, mf = statistics.median(tt), statistics.median(ff)
            s = sums.get(name, {})
            # ratio of the medians, and of the best times (the least
            # disturbed run of each side, where the machine is shared)
            print("%-52s %22s %22s %7.2f %7.2f  %-27s %.6e / %.6e" %
                  (desc, "%.4g (%.4g-%.4g)" % (mt, min(tt), max(tt)),
                   "%.4g (%.4g-%.4g)" % (mf, min(ff), max(ff)), mt / mf, min(tt) / min(ff),
                   verdict(tt, ff), s.get("torch", float("nan")), s.get("fuselab", float("nan"))))


if __name__ == "__main__":
    main()
