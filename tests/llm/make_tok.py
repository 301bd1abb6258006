#!/usr/bin/env python3
"""make_tok.py -- the tokenizers tests/lua/tokenizer.lua reads, and their ids.

  python3 tests/llm/make_tok.py OUTDIR [--check-only]

Needs PyPI `tokenizers` (and `transformers` for GPT-2's vocab.json +
merges.txt pair).  Trains four small BPE tokenizers on a fixed corpus, in
the four layouts language models ship:
  gpt2/      vocab.json + merges.txt (byte-level, GPT-2's regex)
  llama/     tokenizer.json, Llama 2's: Prepend + Replace normalizer, byte
             fallback, the Replace/ByteFallback/Fuse/Strip decoder, <s> first
  llama3/    tokenizer.json, Llama 3's and Qwen2's: NFC, a Split regex then
             ByteLevel without its own regex, ignore_merges, a BOS template
  metaspace/ tokenizer.json with the Metaspace pre-tokenizer and decoder
and writes cases.lua: for each, the ids and the decoded text `tokenizers`
gives for every text of TEXTS (special tokens on and off).  The trainer
may break ties differently from run to run: the committed files and their
cases are the reference the tests read (make_models.py copies them).
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

TEXTS = [
    "", "Hello world", "Hello, world! How are you?", "  leading and trailing  ",
    "I'll don't we've they're she's I'm you'd", "naïve café façade résumé Ångström",
    "e\u0301 composed vs \u00e9", "数据加载是训练的瓶颈吗？", "算子融合能显著降低显存占用。",
    "emoji 🎉🚀 and 👩‍👩‍👧 family", "tabs\tand\nnewlines\n\n\nthree", "numbers 12345 3.14159 1,000,000",
    "spaces      runs\u3000ideographic", "<|endoftext|>after special", "before<|endoftext|>",
    "<s> in text </s>", "a<|begin_of_text|>b", "mixed: x = fl.randn(3, 4); y = x:relu()",
    "URL https://example.com/path?q=1&r=2#frag", "ÀÉÎÕÜ àéîõü ñÑ ß", "Ελληνικά кириллица עברית العربية",
    "\u200bzero\u200dwidth", "x" * 300, "torch.compile(model, mode=\"reduce-overhead\")",
]

CORPUS_EXTRA = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "算子融合、图捕获、动态形状、缓存命中率、冷启动时间。训练与推理。",
    "naïve café résumé déjà vu — “quotes” and ‘single’ … ellipsis",
    "emoji 🎉 🚀 😀 and numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "def forward(self, x):\n    return self.linear(x).relu()\n",
]

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus(src):
    lines = list(CORPUS_EXTRA)
    for name in ("README.md", "doc/DESIGN.md"):
        with open(os.path.join(src, name), encoding="utf-8") as f:
            lines += [l for l in f.read().splitlines() if l.strip()]
    return lines


def gpt2(lines, out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    d = os.path.join(out, "gpt2")
    os.makedirs(d, exist_ok=True)
    tok.model.save(d)
    # the reference for the pair of files is what transformers reads from them
    from transformers import GPT2Tokenizer
    return GPT2Tokenizer.from_pretrained(d)


def llama(lines, out):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=900, special_tokens=specials,
                                                       show_progress=False, limit_alphabet=120))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return save(tok, out, "llama")


def llama3(lines, out):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=800, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    return save(tok, out, "llama3")


def metaspace(lines, out):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=800, special_tokens=specials,
                                                       show_progress=False, limit_alphabet=150))
    return save(tok, out, "metaspace")


def save(tok, out, name):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    # the byte tokens were given to the trainer as special tokens to put them
    # in the vocabulary; Llama 2's files have them in the vocabulary only
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["added_tokens"] = [a for a in j["added_tokens"] if not a["content"].startswith("<0x")]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return Tokenizer.from_file(path)


def cases(ref, texts, hf_fast=False):
    res = []
    for t in texts:
        row = {"text": t}
        for special in (True, False):
            if hf_fast:
                ids = ref.encode(t, add_special_tokens=special)
                dec = ref.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            else:
                ids = ref.encode(t, add_special_tokens=special).ids
                dec = ref.decode(ids, skip_special_tokens=False)
            row["ids" if special else "ids_plain"] = ids
            row["decoded" if special else "decoded_plain"] = dec
        res.append(row)
    return res


def lua_str(s):
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        out.append(c if 32 <= b < 127 and c not in '"\\' else "\\%03d" % b)
    return '"' + "".join(out) + '"'


def lua_val(v):
    if isinstance(v, str):
        return lua_str(v)
    if isinstance(v, list):
        return "{" + ", ".join(lua_val(x) for x in v) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join("[%s] = %s" % (lua_str(k), lua_val(x)) for k, x in v.items()) + "}"
    return repr(v)


def main(out, src):
    lines = corpus(src)
    refs = {"gpt2": (gpt2(lines, out), True), "llama": (llama(lines, out), False),
            "llama3": (llama3(lines, out), False), "metaspace": (metaspace(lines, out), False)}
    allc = {name: cases(ref, TEXTS, fast) for name, (ref, fast) in refs.items()}
    with open(os.path.join(out, "cases.lua"), "w") as f:
        f.write("-- written by tests/llm/make_tok.py: what `tokenizers` gives (do not edit)\n")
        f.write("return {\n")
        for name, rows in allc.items():
            f.write("  [%s] = {\n" % lua_str(name))
            for r in rows:
                f.write("    %s,\n" % lua_val(r))
            f.write("  },\n")
        f.write("}\n")
    print("wrote", out, {k: len(v) for k, v in allc.items()})


if __name__ == "__main__":
    main(sys.argv[1], os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
