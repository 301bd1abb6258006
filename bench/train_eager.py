"""train_eager.py -- eager training against PyTorch's eager training, and
compiled training against torch.compile's.

  python bench/train_eager.py [--fuselab build/fuselab] [--rounds 5] [--steps 10]
                              [--compiled]

With --compiled each side compiles: fuselab's whole step through
fl.compile (the loss's forward and backward a pair compiled from its
joint graph, the optimizer's step its compiled update), PyTorch's model
and its optimizer's step through torch.compile (AOTAutograd, Inductor); the first
step (capture and compile) is reported beside the steady step.

One training step is forward, cross-entropy, backward and AdamW (lr 1e-3,
PyTorch's single-tensor update: foreach=False, as fuselab's), on three
models, each side starting from the same weights and data (fuselab writes
them, PyTorch loads them):
  mlp  Linear(512, 2048) - ReLU - Linear(2048, 512), batch 256
  cnn  fl.models.cnn{channels = {3, 16, 32}}: two blocks of conv 3x3 -
       BatchNorm2d (training) - ReLU - MaxPool2d(2), then Linear, batch 32
       of 3x32x32
  gpt  fl.models.transformer{vocab = 512, d = 128, heads = 4, layers = 2,
       seq = 64}, batch 16 of 64 tokens
Each round runs each side in a fresh process, alternating which goes
first (this machine is shared and noisy); a run reports the median of
`steps` steps after two warm-up steps.  Both sides use 2 threads.  Prints,
per model, the medians over rounds, their spread, the ratio PyTorch /
fuselab (> 1: fuselab faster) and the last losses (they must agree: the
same work was done).
"""
import argparse
import resource
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def torch_side(name, d, steps, compiled=False):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "numpy"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    import torch_train as tt                      # its safetensors reader
    import make_ref                               # the models as fuselab builds them
    torch.set_num_threads(2)
    tt.out = d
    init, _ = tt.load(f"{name}_init")
    data, _ = tt.load(f"{name}_data")
    if name == "mlp":
        m = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512))
    elif name == "cnn":
        m = make_ref.cnn([3, 16, 32], 10, 32)
    else:
        m = make_ref.Transformer(512, 128, 4, 2, 64)
    m.load_state_dict(init)
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)
    fwd = torch.compile(m) if compiled else m
    step = opt.step
    if compiled:
        # the optimizer compiled too, as PyTorch's tutorial on compiling
        # the optimizer does it: one generated kernel per parameter
        @torch.compile(fullgraph=False)
        def step():
            opt.step()
    x, y = data["x"], data["y"]
    times, loss, first = [], None, None
    for i in range(steps + 2):
        t0 = time.perf_counter()
        opt.zero_grad()
        out = fwd(x)
        if name == "gpt":
            out, yy = out.reshape(-1, 512), y.reshape(-1)
        else:
            yy = y
        l = F.cross_entropy(out, yy)
        l.backward()
        step()
        loss = l.item()
        if i == 0:
            first = (time.perf_counter() - t0) * 1e3
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    # what one forward keeps for the backward: the saved tensors' storages
    # (through the saved-tensors hooks), not counting the parameters and the
    # input, which exist anyway
    skip = {p.untyped_storage().data_ptr() for p in m.parameters()}
    skip.add(x.untyped_storage().data_ptr())
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fwd(x)
        if name == "gpt":
            out, yy = out.reshape(-1, 512), y.reshape(-1)
        else:
            yy = y
        F.cross_entropy(out, yy).backward()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ms {statistics.median(times):.3f} loss {loss:.6f} first {first:.1f} rss {rss:.1f} "
          f"saved {sum(seen.values())}")


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"train_eager: {' '.join(cmd)} failed:\n{r.stderr}")
    parts = r.stdout.split()
    return {parts[i]: float(parts[i + 1]) for i in range(0, len(parts) - 1, 2)}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch":
        torch_side(sys.argv[2], sys.argv[3], int(sys.argv[4]), len(sys.argv) > 5)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--fuselab", default=os.path.join(ROOT, "build", "fuselab"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--compiled", action="store_true")
    a = ap.parse_args()
    extra = ["compiled"] if a.compiled else []
    env = dict(os.environ, OMP_NUM_THREADS="2")
    lua = os.path.join(HERE, "train_eager.lua")
    print(f"{'model':5} {'fuselab ms':>18} {'PyTorch ms':>18} {'PyTorch/fuselab':>16}  last losses")
    with tempfile.TemporaryDirectory() as d:
        for name in a.models.split(","):
            subprocess.run([a.fuselab, lua, name, d, "0", "init"], check=True, env=env)
            fl, pt = [], []
            for r in range(a.rounds):
                sides = [("fl", [a.fuselab, lua, name, d, str(a.steps)] + extra),
                         ("pt", [sys.executable, __file__, "--torch", name, d, str(a.steps)] + extra)]
                if r % 2:
                    sides.reverse()
                for who, cmd in sides:
                    v = run(cmd, env)
                    (fl if who == "fl" else pt).append((v["ms"], v["loss"], v["first"], v))
            fms, pms = [t[0] for t in fl], [t[0] for t in pt]
            ratios = sorted(p / f for f, p in zip(fms, pms))
            firsts = ""
            if a.compiled:
                firsts = (f"  first step: fuselab {statistics.median(t[2] for t in fl):.0f} ms, "
                          f"PyTorch {statistics.median(t[2] for t in pt):.0f} ms")
            print(f"{name:5} {statistics.median(fms):8.2f} ({min(fms):.2f}-{max(fms):.2f}) "
                  f"{statistics.median(pms):8.2f} ({min(pms):.2f}-{max(pms):.2f}) "
                  f"{statistics.median(ratios):7.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})  "
                  f"{fl[-1][1]:.5f} {pt[-1][1]:.5f}{firsts}")
            mem = (f"      peak RSS: fuselab {statistics.median(t[3]['rss'] for t in fl):.0f} MiB, "
                   f"PyTorch {statistics.median(t[3]['rss'] for t in pt):.0f} MiB; the forward keeps "
                   f"(not counting parameters and data) "
                   f"PyTorch {pt[-1][3]['saved'] / 2**20:.2f} MiB")
            if a.compiled:
                mem += (f", fuselab {fl[-1][3]['saved'] / 2**20:.2f} MiB "
                        f"(eager autograd {fl[-1][3]['eager_saved'] / 2**20:.2f} MiB)")
            print(mem)


if __name__ == "__main__":
    main()
