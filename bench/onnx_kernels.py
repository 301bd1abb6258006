#!/usr/bin/env python3
"""onnx_kernels.py -- where one network's time goes: fuselab's kernels beside onnxruntime's nodes.

  FUSELAB=build/fuselab python3 bench/onnx_kernels.py DIR NAME [CALLS]

DIR/NAME/{model.onnx, input_K.npy} as bench/onnx_models.py writes them.
Both sides are timed kernel by kernel over CALLS calls (default 30), two
threads, and each kernel's fastest call is kept:
  - fuselab's compiled call under FUSELAB_DEBUG=2 (bench/onnx_steady.lua;
    with OMP_WAIT_POLICY=ACTIVE, so that a kernel's time is not its
    threads' wake-up), grouped by kernel name less its shape;
  - onnxruntime's profiler, grouped by operator, a convolution by its kind
    (depthwise, 1x1 over a 1x1 map, 1x1, or wider), read from its shapes.
Then each side's whole call, untimed inside, in the same process order.

Both profilers add a few microseconds to every kernel they time (the sums
exceed the whole calls by that), and onnxruntime runs two to three nodes
for each of fuselab's kernels (its reorders, activations and products are
nodes of their own), so compare groups of the same work, not the totals.
Take the fastest calls of a quiet moment: on a shared machine one noisy
second moves a group by a fifth.  Needs numpy and onnxruntime from a venv.
"""
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort


def inputs(d, name):
    xs = []
    while os.path.exists(f"{d}/{name}/input_{len(xs)}.npy"):
        xs.append(np.load(f"{d}/{name}/input_{len(xs)}.npy"))
    return xs


def conv_kind(shapes):
    """A Conv node's kind from its input shapes [x, w] and output's."""
    ins, outs = shapes
    if len(ins) < 2 or len(ins[1]) != 4 or not outs or len(outs[0]) != 4:
        return "Conv"
    x, w, y = ins[0], ins[1], outs[0]
    if w[1] == 1 and x[1] == y[1] and x[1] > 1:
        return "Conv depthwise"
    if w[2] == 1 and w[3] == 1:
        return "Conv 1x1 over 1x1" if y[2] == 1 and y[3] == 1 else "Conv 1x1"
    return "Conv %dx%d" % (w[2], w[3])


def ort_profile(d, name, calls):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "onnx_kernels_" + name)
    s = ort.InferenceSession(f"{d}/{name}/model.onnx", so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(s.get_inputs(), inputs(d, name))}
    for _ in range(calls):
        s.run(None, feeds)
    path = s.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    per, kind = collections.defaultdict(list), {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        node, a = e["name"][:-len("_kernel_time")], e["args"]
        per[node].append(e["dur"] / 1000.0)
        op = a.get("op_name", "?")
        if op == "Conv":
            shapes = [[list(t.values())[0] for t in a.get(k, [])] for k in ("input_type_shape", "output_type_shape")]
            op = conv_kind(shapes)
        kind[node] = op
    return {node: (kind[node], min(ts)) for node, ts in per.items()}


def ort_call(d, name, calls):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(f"{d}/{name}/model.onnx", so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(s.get_inputs(), inputs(d, name))}
    for _ in range(10):
        s.run(None, feeds)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        s.run(None, feeds)
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts)), min(ts)


def fuselab_run(d, name, calls, debug):
    exe = os.environ.get("FUSELAB", "build/fuselab")
    steady = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_steady.lua")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    if debug:
        env.update(FUSELAB_DEBUG="2", OMP_WAIT_POLICY="ACTIVE")
    p = subprocess.run([exe, steady, d, name, str(calls)], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{exe} failed:\n{p.stderr[-2000:]}")
    return p


def fuselab_profile(d, name, calls):
    per = collections.defaultdict(list)
    for line in fuselab_run(d, name, calls, True).stderr.splitlines():
        m = re.match(r"fuselab:\s+k(\d+)\s+(\S+)\s+([\d.]+) ms", line)
        if m:
            per[(int(m.group(1)), m.group(2))].append(float(m.group(3)))
    # the name less its shape (_s0x96x28x28, _2x96x28x28, _(576*s0)//...)
    return {k: (re.sub(r"_(s\d|\d|\().*$", "", k[1]), min(ts)) for k, ts in per.items()}


def fuselab_call(d, name, calls):
    out = fuselab_run(d, name, calls, False).stdout.split()
    return float(out[1]), float(out[2])


def table(title, prof):
    groups = collections.defaultdict(lambda: [0, 0.0])
    for kind, t in prof.values():
        groups[kind][0] += 1
        groups[kind][1] += t
    print(f"\n{title}: {len(prof)} kernels, {sum(t for _, t in prof.values()):.3f} ms summed")
    for kind, (n, t) in sorted(groups.items(), key=lambda g: -g[1][1]):
        print(f"  {kind:40s} {n:4d}  {t:8.3f} ms")


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    d, name = sys.argv[1], sys.argv[2]
    calls = int(sys.argv[3]) if len(sys.argv) == 4 else 30
    table("fuselab, each kernel's fastest call (FUSELAB_DEBUG=2)", fuselab_profile(d, name, calls))
    table("onnxruntime, each node's fastest call (its profiler)", ort_profile(d, name, calls))
    fm, fl = fuselab_call(d, name, calls)
    om, ol = ort_call(d, name, calls)
    print(f"\nwhole calls, untimed inside: fuselab median {fm:.3f} ms (fastest {fl:.3f}), "
          f"onnxruntime {om:.3f} ms (fastest {ol:.3f}); ratio of fastest {ol / fl:.2f}")


if __name__ == "__main__":
    main()
