"""llm_decode.py -- decoding a language model: fuselab against transformers
eager and against torch.compile with a static cache (gpt-fast's recipe).

  python bench/llm_decode.py [--fuselab build/fuselab] [--model gpt2|llama]
                             [--rounds 3] [--prompt 128] [--new 64]

Needs PyPI torch and transformers.  The model is made once with seeded
random weights (float32) from its config and saved with save_pretrained;
every side loads that directory:
  gpt2   GPT-2 small's shape: 124 M parameters (d 768, 12 layers, 12 heads,
         vocab 50257, 1024 positions)
  llama  a Llama-shaped ~100 M: d 768, 12 layers, 12 heads of which 4
         key/value, SwiGLU 2048, vocab 32000
Sides, each in a fresh process, the order alternating over rounds, 2 threads:
  hf-eager        model.generate (greedy, its dynamic cache)
  torch.compile   a StaticCache, the prefill torch.compile(prefill,
                  fullgraph=True, dynamic=True), the decode step
                  torch.compile(step, mode="reduce-overhead", fullgraph=True)
  fuselab         m:generate, eager
  fuselab-compiled m:generate{compile = true}
Each side runs one warm-up generation (compiling what it compiles;
torch.compile two, its static cache is set up on the first call, which the
second call's guards see as a change), then a timed one: prefill_ms is the prompt's forward to the first token, decode
tokens/s the steady steps after the first.  first_ms is the cold first
call's prefill (compiles included).  Prints medians over rounds, their
spread, and torch.compile / fuselab-compiled as ratios (> 1: fuselab
faster); the greedy tokens of every side must agree (the same model ran).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIGS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024, bos_token_id=0,
                  eos_token_id=0)),
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                   intermediate_size=2048, vocab_size=32000, max_position_embeddings=2048, bos_token_id=0,
                   eos_token_id=1, tie_word_embeddings=False)),
}


def prompt_ids(n, vocab):
    return [(i * 7919 + 13) % vocab for i in range(n)]


def make(name, d):
    import torch
    import transformers
    cfg_cls, model_cls, kw = CONFIGS[name]
    torch.manual_seed(0)
    m = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).eval()
    m.save_pretrained(d)
    return sum(p.numel() for p in m.parameters())


def torch_side(side, d, n_prompt, n_new):
    import torch
    import transformers
    torch.set_num_threads(2)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    vocab = m.config.vocab_size
    ids = torch.tensor([prompt_ids(n_prompt, vocab)])
    res = {}
    with torch.no_grad():
        if side == "hf-eager":
            def run():
                t0 = time.perf_counter()
                out = m(ids, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                t1 = time.perf_counter()
                past, toks = out.past_key_values, [int(nxt)]
                t2 = None
                for i in range(n_new - 1):
                    out = m(nxt, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                    toks.append(int(nxt))
                    if t2 is None:
                        t2 = time.perf_counter()
                return t1 - t0, (n_new - 2) / (time.perf_counter() - t2), toks
        else:
            L = n_prompt + n_new
            cache = transformers.StaticCache(config=m.config, max_cache_len=L)

            def step(x, pos):
                return m(x, cache_position=pos, cache=cache, use_cache=True).logits

            def prefill(x, pos):
                return m(x, cache_position=pos, cache=cache, use_cache=True).logits

            cstep = torch.compile(step, mode="reduce-overhead", fullgraph=True)
            cprefill = torch.compile(prefill, fullgraph=True, dynamic=True)

            def run():
                cache.reset()
                t0 = time.perf_counter()
                lg = cprefill(ids, torch.arange(n_prompt))
                nxt = lg[:, -1].argmax(-1, keepdim=True)
                t1 = time.perf_counter()
                toks, t2 = [int(nxt)], None
                for i in range(n_new - 1):
                    lg = cstep(nxt, torch.tensor([n_prompt + i]))
                    nxt = lg[:, -1].argmax(-1, keepdim=True)
                    toks.append(int(nxt))
                    if t2 is None:
                        t2 = time.perf_counter()
                return t1 - t0, (n_new - 2) / (time.perf_counter() - t2), toks
        t0 = time.perf_counter()
        run()
        if side == "torch.compile":
            run()          # the cache is set up lazily on the first call: the second recompiles once
        res["warmup_s"] = time.perf_counter() - t0
        pre, tps, toks = run()
    res.update(prefill_ms=pre * 1e3, tps=tps, tokens=toks)
    return res


def fuselab_side(side, d, n_prompt, n_new, fuselab):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([fuselab, os.path.join(HERE, "llm_decode.lua"), d, side, str(n_prompt), str(n_new)],
                         capture_output=True, text=True, env=env, check=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(out.stdout + out.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fuselab", default=os.path.join(ROOT, "build", "fuselab"))
    ap.add_argument("--model", default="gpt2", choices=sorted(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--side")
    ap.add_argument("--dir")
    a = ap.parse_args()
    if a.side:                                   # a child process
        print("RESULT " + json.dumps(torch_side(a.side, a.dir, a.prompt, a.new)))
        return
    sides = ["hf-eager", "torch.compile", "fuselab", "fuselab-compiled"]
    with tempfile.TemporaryDirectory() as d:
        n = make(a.model, d)
        print(f"{a.model}: {n / 1e6:.1f} M parameters, prompt {a.prompt}, {a.new} new tokens, {a.rounds} rounds")
        runs = {s: [] for s in sides}
        for r in range(a.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for s in order:
                if s.startswith("fuselab"):
                    res = fuselab_side("compiled" if s.endswith("compiled") else "eager", d, a.prompt, a.new, a.fuselab)
                else:
                    out = subprocess.run([sys.executable, __file__, "--side", s, "--dir", d, "--prompt", str(a.prompt),
                                          "--new", str(a.new)], capture_output=True, text=True, check=True)
                    res = json.loads([l for l in out.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
                runs[s].append(res)
                print(f"  round {r + 1} {s:17s} prefill {res['prefill_ms']:8.1f} ms  decode {res['tps']:7.2f} tok/s",
                      flush=True)
    ref = runs["hf-eager"][0]["tokens"]
    for s in sides:
        same = all(x["tokens"] == ref for x in runs[s])
        print(f"{s:17s} greedy tokens {'equal' if same else 'DIFFER from'} hf-eager's")

    def med(s, k):
        v = [x[k] for x in runs[s]]
        return statistics.median(v), min(v), max(v)
    print(f"\n{'side':17s} {'prefill ms (min-max)':>24s} {'decode tok/s (min-max)':>26s}")
    for s in sides:
        p, t = med(s, "prefill_ms"), med(s, "tps")
        print(f"{s:17s} {p[0]:8.1f} ({p[1]:6.1f}-{p[2]:6.1f}) {t[0]:10.2f} ({t[1]:6.2f}-{t[2]:6.2f})")
    for peer in ("torch.compile", "hf-eager"):
        print(f"fuselab-compiled vs {peer}: decode {med('fuselab-compiled', 'tps')[0] / med(peer, 'tps')[0]:.2f}x, "
              f"prefill {med(peer, 'prefill_ms')[0] / med('fuselab-compiled', 'prefill_ms')[0]:.2f}x (> 1: fuselab faster)")


if __name__ == "__main__":
    main()
