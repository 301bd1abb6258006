#!/usr/bin/python3
"""make_ref.py -- PyTorch reference outputs for fuselab's ready models.

Builds, in PyTorch and with a fixed seed, the same three models that
fl.models.mlp, fl.models.transformer and fl.models.cnn build (same layers,
same parameter names), writes for each:

    <name>.safetensors   the state_dict (parameters and buffers)
    <name>_x.npy         an input
    <name>_y.npy         PyTorch's eager output for that input (eval mode)

tests/lua/ref.lua loads the weights into fuselab models with
fl.load_weights and compares outputs.  The files are small and committed;
PyTorch is needed only to regenerate them:

    apt-get install -y python3-torch        # Debian: PyTorch 1.13
    /usr/bin/python3 tests/ref/make_ref.py  # writes next to this script

The safetensors files are written here with struct and json (the format
is an 8-byte little-endian header length, a JSON header, then the raw
little-endian data), so the `safetensors` package is not needed.
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

OUT = os.path.dirname(os.path.abspath(__file__))
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.bool: "BOOL"}


def save_safetensors(state, path):
    """The state_dict as safetensors: names sorted, header padded with
    spaces so the data starts 8-byte aligned, as fuselab writes it."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, at = [], 0
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        raw = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


# ---- the models, named as fuselab names them ------------------------------

def mlp(sizes, act):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


class MultiheadAttention(nn.Module):
    """nn.MultiheadAttention(d, heads, {causal=true}) of fuselab: separate
    q/k/v/out projections, an additive causal mask."""

    def __init__(self, d, heads):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape

        def heads(t):
            return t.reshape(B, T, self.h, self.hd).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(self.hd))
        i = torch.arange(T).reshape(T, 1)
        j = torch.arange(T).reshape(1, T)
        scores = scores + torch.where(j > i, float("-inf"), 0.0)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
        return self.out_proj(out)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = MultiheadAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[-1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T))
        return self.head(self.ln_f(self.blocks(x)))


def cnn(channels, classes, size):
    layers = []
    for ci, co in zip(channels, channels[1:]):
        layers += [nn.Conv2d(ci, co, 3, padding=1), nn.BatchNorm2d(co), nn.ReLU(),
                   nn.MaxPool2d(2)]
        size //= 2
    layers += [nn.Flatten(), nn.Linear(channels[-1] * size * size, classes)]
    return nn.Sequential(*layers)


def perturb_norms(model):
    """Norm layers start as the identity (ones, zeros); give them random
    values so loading them is actually tested."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(7)


def check_attention(block, x):
    """The reference attention against PyTorch's own nn.MultiheadAttention
    with the same weights: the proof rests on the real thing."""
    a = block.attn
    d = x.shape[-1]
    ref = nn.MultiheadAttention(d, a.h, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        ref.out_proj.weight.copy_(a.out_proj.weight)
        ref.out_proj.bias.copy_(a.out_proj.bias)
        T = x.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        want, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
        got = a(x)
    err = (got - want).abs().max().item()
    assert err < 1e-5, f"reference attention differs from torch.nn.MultiheadAttention by {err}"
    return err


def write(name, model, x):
    model.eval()
    with torch.no_grad():
        y = model(x)
    save_safetensors(model.state_dict(), os.path.join(OUT, name + ".safetensors"))
    np.save(os.path.join(OUT, name + "_x.npy"), x.numpy())
    np.save(os.path.join(OUT, name + "_y.npy"), y.numpy())
    nparams = sum(p.numel() for p in model.parameters())
    print(f"{name}: {nparams} parameters, input {list(x.shape)}, output {list(y.shape)}")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)

    # fl.models.mlp{sizes={16, 32, 32, 4}, act="gelu"}
    write("mlp", mlp([16, 32, 32, 4], nn.GELU), torch.randn(8, 16))

    # fl.models.transformer{vocab=50, d=32, heads=4, layers=2, seq=8}
    gpt = Transformer(vocab=50, d=32, heads=4, layers=2, seq=8)
    perturb_norms(gpt)
    err = check_attention(gpt.blocks[0], torch.randn(2, 8, 32))
    print(f"attention vs torch.nn.MultiheadAttention: max abs diff {err:.2e}")
    write("transformer", gpt, torch.randint(0, 50, (2, 8), dtype=torch.int64))

    # fl.models.cnn{channels={3, 4, 8}, classes=5, input=8}
    net = cnn([3, 4, 8], 5, 8)
    perturb_norms(net)
    write("cnn", net, torch.randn(2, 3, 8, 8))

    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT)
                if f.endswith((".safetensors", ".npy")))
    print(f"{total} bytes written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
