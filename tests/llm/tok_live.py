#!/usr/bin/env python3
"""tok_live.py -- random texts and the ids Hugging Face's tokenizers gives them.

  python3 tests/llm/tok_live.py OUT.lua [N] [SEED]

For each tokenizer of tests/llm/data/tok (GPT-2's pair read by
transformers when it is installed, else skipped; the tokenizer.json ones
by `tokenizers`), N texts drawn from a seeded generator out of ASCII words
and punctuation, whitespace runs, Latin accents (composed and combining),
Greek, Cyrillic, CJK, emoji with joiners and variation selectors, digits
and the special tokens, with the ids (specials added and not) and the
decoded text.  Written as a Lua table for tests/llm/tokenizer_live.sh.
"""
import os
import random
import sys

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "data", "tok")

PIECES = ["the", "compiler", "fuses", "kernels", " ", "  ", "\t", "\n", "\n\n", "   ", ".", ",", "!", "?", "'s",
          "'ll", "n't", "I'm", "12", "345", "3.14", "1,000", "café", "naïve", "e\u0301", "ñ", "Ångström", "ß",
          "Ελληνικά", "кириллица", "数据", "融合", "显存", "。", "！", "🎉", "🚀", "👩\u200d👩\u200d👧", "❤\ufe0f",
          "<|endoftext|>", "<s>", "</s>", "<|begin_of_text|>", "x", "=", "fl.compile(m)", "\u3000", "\u200b",
          "😀", "Ω", "𝔘", "\u00a0", "—", "“", "”"]


def lua_str(s):
    return '"' + "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\' else "\\%03d" % b
                         for b in s.encode("utf-8")) + '"'


def main(out, n, seed):
    rng = random.Random(seed)
    texts = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))) for _ in range(n)]
    refs = {}
    for name in ("llama", "llama3", "metaspace"):
        refs[name] = ("fast", Tokenizer.from_file(os.path.join(TOK, name, "tokenizer.json")))
    try:
        from transformers import GPT2Tokenizer
        refs["gpt2"] = ("hf", GPT2Tokenizer.from_pretrained(os.path.join(TOK, "gpt2")))
    except Exception as e:                       # no transformers: the pair is checked by the fixtures only
        print("gpt2 skipped:", type(e).__name__, str(e)[:80])
    with open(out, "w") as f:
        f.write("return {\n")
        for name, (kind, ref) in refs.items():
            f.write("  [%s] = {\n" % lua_str(name))
            for t in texts:
                if kind == "hf":
                    ids = ref.encode(t)
                    dec = ref.decode(ids, clean_up_tokenization_spaces=False)
                else:
                    ids = ref.encode(t).ids
                    dec = ref.decode(ids, skip_special_tokens=False)
                f.write("    {text = %s, ids = {%s}, decoded = %s},\n" % (lua_str(t), ", ".join(map(str, ids)),
                                                                        lua_str(dec)))
            f.write("  },\n")
        f.write("}\n")
    print("tokenizers", sorted(refs), n, "texts")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300, int(sys.argv[3]) if len(sys.argv) > 3 else 1)
