#!/usr/bin/python3
"""The models of bench/fusion in PyTorch eager, on the same weights and
inputs (bench only; Debian's python3-torch and python3-numpy).

bench/fusion runs this itself when PyTorch loads and prints the ratio in
its own table.  Standalone:

    /usr/bin/python3 bench/torch_models.py [reps]

prints, per model, "name best_ms checksum" where checksum is the sum of
the output, so the caller can see both computed the same thing.  Weights
and inputs follow tests/unit/fuse_graphs.h (fg_param) and bench/fusion.c
(make) value for value.
"""
import sys
import time

import numpy as np
import torch


def param(shape, scale, shift):
    """fg_param: shift + scale * ((i * 7919 + 13) % 2003 - 1001) / 1001"""
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    v = shift + scale * (((i * 7919 + 13) % 2003) - 1001) / 1001.0
    return torch.from_numpy(v.astype(np.float32).reshape(shape))


def data(shape):
    """bench/fusion's make(): (float)((i * 7919) % 2001) / 1000 - 1 in float32"""
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    v = ((i * 7919) % 2001).astype(np.float32) / np.float32(1000.0) - np.float32(1.0)
    return torch.from_numpy(v.reshape(shape))


def linear_params(n_in, n_out):
    """fg_linear: w [out, in] scaled 0.5 / 8, bias scaled 0.1"""
    return param((n_out, n_in), 0.5 / 8, 0.0), param((n_out,), 0.1, 0.0)


def ln_params(d):
    """fg_ln: weight around 1, bias around 0"""
    return param((d,), 0.2, 1.0), param((d,), 0.1, 0.0)


def mlp(batch, d, hidden):
    """fg_mlp: linear -> gelu -> linear"""
    w1, b1 = linear_params(d, hidden)
    w2, b2 = linear_params(hidden, d)
    F = torch.nn.functional

    def run(x):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    return run, data((batch, d))


def block(batch, seq, d, heads):
    """fg_block_heads: x + attn(ln1(x)), then + mlp(ln2(.))"""
    F = torch.nn.functional
    ln1 = ln_params(d)
    q, k, v = linear_params(d, d), linear_params(d, d), linear_params(d, d)
    o = linear_params(d, d)
    ln2 = ln_params(d)
    fc1, fc2 = linear_params(d, 4 * d), linear_params(4 * d, d)
    hd = d // heads

    def split(t):
        return t.reshape(batch, seq, heads, hd).transpose(1, 2) if heads > 1 else t

    def run(x):
        h = F.layer_norm(x, (d,), *ln1, eps=1e-5)
        qq, kk, vv = split(F.linear(h, *q)), split(F.linear(h, *k)), split(F.linear(h, *v))
        s = torch.matmul(qq, kk.transpose(-2, -1)) * (1.0 / hd ** 0.5)
        a = torch.matmul(torch.softmax(s, dim=-1), vv)
        if heads > 1:
            a = a.transpose(1, 2).reshape(batch, seq, d)
        x2 = x + F.linear(a, *o)
        f = F.gelu(F.linear(F.layer_norm(x2, (d,), *ln2, eps=1e-5), *fc1))
        return x2 + F.linear(f, *fc2)
    return run, data((batch, seq, d))


def best_ms(run, x, reps):
    run(x)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        run(x)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    torch.set_num_threads(2)
    models = [("mlp", mlp(1024, 256, 1024)),
              ("block", block(8, 128, 256, 1)),
              ("block4", block(8, 128, 256, 4))]
    with torch.no_grad():
        for name, (run, x) in models:
            print(name, "%.3f" % best_ms(run, x, reps), "%.6g" % float(run(x).double().sum()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
