#!/usr/bin/env python3
"""Writes tests/data/tokenizer_fixtures.json: token ids of varied texts under the default
model's tokenizer, computed by an independent implementation (Hugging Face `tokenizers`, the
Rust library, built from the vocabulary and merges stored in the GGUF, which are read with the
`gguf` PyPI package). numattn's C++ tokenizer must reproduce them exactly
(tests/model/tokenizer_test.cpp).

    pip install gguf tokenizers
    python3 scripts/gen_tokenizer_fixtures.py [--model PATH] [--text PATH] [--out PATH]

The HF pipeline mirrors SmolLM2's own tokenizer.json: pre-tokenizer Sequence[Digits(individual),
ByteLevel(add_prefix_space=False, use_regex=True)], BPE without unknown token, ByteLevel
decoder, and the control tokens (token_type 3) registered as special added tokens.
If the default text is given, a hash of the ids of the whole text is stored too.
"""
import argparse
import hashlib
import json
import os
import struct
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CACHE = os.environ.get("NUMATTN_CACHE", os.path.expanduser("~/.cache/numattn"))

AUSTEN = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife.\n\nHowever little known the feelings or views of "
    "such a man may be on his first entering a neighbourhood, this truth is so well fixed in "
    "the minds of the surrounding families, that he is considered the rightful property of "
    "some one or other of their daughters.\n\n\"My dear Mr. Bennet,\" said his lady to him "
    "one day, \"have you heard that Netherfield Park is let at last?\"\n\nMr. Bennet replied "
    "that he had not.")

TEXTS = [
    "Hello world",
    " Hello world",
    "The capital of France is",
    AUSTEN,
    "I'm sure you've heard: they'll say it's the CAT'S fault, I'd think. We're 'quoted'.",
    "Numbers: 0 1 12 123 1234 12345 3.14159 1,000,000 -42 +7 1e-5 0x1F 2026-11-29",
    "Unicode: café naïve façade Ångström Straße Ελληνικά русский 中文 日本語 한국어 עברית العربية",
    "Superscripts and fractions: x² + y³ = z½ Ⅻ ٣ ৪ ①",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷",
    "Whitespace:  two   three    four\ttab\t\ttabs\nnewline\n\n\nthree newlines\r\nCRLF  \n  ",
    "   leading spaces and trailing   ",
    "\u00a0non-breaking\u2003em\u3000ideographic space",
    "def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n    print(f'{i}: {f(i)}')\n",
    "int main() { std::vector<int> v{1, 2, 3}; return v[0] != 0 ? -1 : 0; } // C++",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "special inside<|endoftext|>text<|im_end|><|im_end|>end",
    "Punctuation!!! ... ??? --- ((( ))) \"\"\" ''' ``` ~~~ @@@ ### $$$ %%% ^^^ &&& *** ;;; :::",
    "URLs: https://example.com/path?query=1&x=y#frag user@example.org",
    "MiXeD CaSe WoRdS aNd ALLCAPS lowercase",
    "",
    " ",
    "\n",
    "a",
    "'s 't 're 've 'm 'll 'd",
]


def load_vocab(path):
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields[key]
        return [int(f.parts[i][0]) for i in f.data]

    def scalar(key):
        f = r.fields[key]
        return f.contents()

    assert scalar("tokenizer.ggml.model") == "gpt2"
    assert scalar("tokenizer.ggml.pre") == "smollm", scalar("tokenizer.ggml.pre")
    return strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges"), ints(
        "tokenizer.ggml.token_type")


def build_hf(tokens, merges, types):
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
                if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def fnv1a64(ids):
    h = 0xcbf29ce484222325
    for b in b"".join(struct.pack("<i", i) for i in ids):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(CACHE, "janeausten.txt"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "data", "tokenizer_fixtures.json"))
    a = ap.parse_args()
    tokens, merges, types = load_vocab(a.model)
    tok = build_hf(tokens, merges, types)
    cases = []
    texts = list(TEXTS)
    if os.path.exists(a.text):
        with open(a.text, encoding="utf-8") as f:
            full = f.read()
        texts.append(full[200000:206000])  # a real excerpt, mid-novel
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        cases.append({"text": t, "ids": ids})
        if not any(types[i] == 3 for i in ids):
            assert tok.decode(ids, skip_special_tokens=False) == t, t
    out = {
        "generator": "scripts/gen_tokenizer_fixtures.py (HF tokenizers %s)" %
                     __import__("tokenizers").__version__,
        "model_sha256": hashlib.sha256(open(a.model, "rb").read()).hexdigest(),
        "cases": cases,
    }
    if os.path.exists(a.text):
        data = open(a.text, "rb").read()
        ids = tok.encode(data.decode("utf-8"), add_special_tokens=False).ids
        out["default_text"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                               "n_tokens": len(ids), "fnv1a64_ids": "%016x" % fnv1a64(ids)}
    # One case per line keeps the file small and its diffs readable.
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("{\n")
        for k in ("generator", "model_sha256"):
            f.write(f" {json.dumps(k)}: {json.dumps(out[k])},\n")
        if "default_text" in out:
            f.write(f' "default_text": {json.dumps(out["default_text"])},\n')
        f.write(' "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")
    print(f"wrote {len(cases)} cases to {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
