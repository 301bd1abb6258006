#!/usr/bin/env python3
"""make_models.py -- tiny random checkpoints and what transformers computes with them.

  python3 tests/llm/make_models.py OUTDIR

Needs PyPI torch and transformers, and the tokenizers make_tok.py wrote
into tests/llm/data/tok.  Writes, with seeded random weights:
  gpt2/   a GPT2LMHeadModel (2 layers, d 32, 4 heads, 128 positions), saved
          in shards of 100 kB (model.safetensors.index.json), with GPT-2's
          vocab.json + merges.txt;
  llama/  a LlamaForCausalLM (2 layers, d 32, 4 heads of which 2 key/value
          heads, SwiGLU 64, untied head), saved as bfloat16, with a
          Llama 3 tokenizer.json;
  qwen2/  a Qwen2ForCausalLM (biases on q, k, v; tied embeddings) in float16;
  mistral/ a MistralForCausalLM with a sliding window of 6 positions and one
          key/value head, float32, with a Llama 2 tokenizer.json;
  llama31/ a LlamaForCausalLM with Llama 3.1's rope scaling ("llama3": factor
          4 over an original context of 16 positions, so prompts of 17 and 40
          tokens reach the scaled frequencies), head_dim 16, tied head;
and ref.lua: for each model and prompt length, HF's logits (float32, from
the weights as saved) of the last position and their sum over all, and the
64 tokens greedy decoding gives (generate with a cache).
"""
import os
import shutil
import sys

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "data", "tok")
PROMPTS = [[5], [40, 280, 322, 12, 281], list(range(3, 20)), list(range(100, 140))]


def spread(m, conv1d=False):
    """Weights of unit scale (HF's init of std 0.02 makes every logit ~0 and
    greedy decoding a constant): norms near 1, products 1/sqrt(fan-in)."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            elif "wte" in name or "wpe" in name or "embed" in name:
                p.copy_(torch.randn_like(p))
            else:
                fan_in = p.shape[0] if conv1d else p.shape[1]
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
    return m


def save(models, out, name, m, tok_files, **kw):
    """m saved as out/name with save_pretrained(**kw), beside the tokenizer files."""
    d = os.path.join(out, name)
    m.save_pretrained(d, **kw)
    for f in tok_files:
        shutil.copy(os.path.join(TOK, f), d)
    models[name] = (type(m), d)


def build(out):
    torch.manual_seed(0)
    models = {}
    cfg = GPT2Config(vocab_size=700, n_positions=128, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                     eos_token_id=0)
    m = spread(GPT2LMHeadModel(cfg).eval(), conv1d=True)
    save(models, out, "gpt2", m, ("gpt2/vocab.json", "gpt2/merges.txt"), max_shard_size="100KB")

    cfg = LlamaConfig(vocab_size=800, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=0,
                      eos_token_id=1)
    m = spread(LlamaForCausalLM(cfg).eval()).to(torch.bfloat16)
    save(models, out, "llama", m, ("llama3/tokenizer.json",))

    cfg = Qwen2Config(vocab_size=800, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=0,
                      eos_token_id=1, use_sliding_window=False)
    m = spread(Qwen2ForCausalLM(cfg).eval()).to(torch.float16)
    save(models, out, "qwen2", m, ("llama3/tokenizer.json",))

    cfg = MistralConfig(vocab_size=800, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128,
                        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=6, tie_word_embeddings=False,
                        bos_token_id=0, eos_token_id=1)
    m = spread(MistralForCausalLM(cfg).eval())
    save(models, out, "mistral", m, ("llama/tokenizer.json",))

    cfg = LlamaConfig(vocab_size=800, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16})
    m = spread(LlamaForCausalLM(cfg).eval())
    save(models, out, "llama31", m, ("llama3/tokenizer.json",))
    return models


def lua_list(v):
    return "{" + ", ".join(lua_list(x) if isinstance(x, list) else ("%.9g" % x if isinstance(x, float) else repr(x))
                           for x in v) + "}"


def main(out):
    models = build(out)
    lines = ["-- written by tests/llm/make_models.py: what transformers computes (do not edit)", "return {"]
    for name, (cls, d) in models.items():
        m = cls.from_pretrained(d, dtype=torch.float32).eval()   # the saved weights, computed in float32
        lines.append("  %s = {" % name)
        for p in PROMPTS:
            with torch.no_grad():
                logits = m(torch.tensor([p])).logits[0]
            lines.append("    {prompt = %s, last = %s, sum = %r, absmax = %r}," % (
                lua_list(p), lua_list([float(x) for x in logits[-1].tolist()]), float(logits.sum()),
                float(logits.abs().max())))
        with torch.no_grad():
            g = m.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=64, do_sample=False, min_new_tokens=64,
                           pad_token_id=0)
        lines.append("    greedy = {prompt = %s, tokens = %s}," % (lua_list(PROMPTS[1]),
                                                                    lua_list(g[0, len(PROMPTS[1]):].tolist())))
        lines.append("  },")
    lines.append("}")
    with open(os.path.join(out, "ref.lua"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1])
