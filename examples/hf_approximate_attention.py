# %% [markdown]
# # numattn's approximate attention inside a Hugging Face transformers model
#
# Loads the default GGUF (SmolLM2-135M-Instruct, Q4_1) in transformers, which dequantizes it to
# float32, registers numattn as an attention backend (`numattn.hf.register`), and measures the
# perplexity of several attention methods on the default text with numattn's protocol
# (llama.cpp's: chunks of `--ctx` tokens from an empty cache, BOS first in each chunk when the
# vocabulary adds one, the second half of each chunk scored), next to `Model.ppl` — the same
# computation as `numattn ppl --attn SPEC` — so that the two columns can be compared digit for
# digit. Needs torch, transformers, gguf and accelerate (`pip install torch transformers gguf
# accelerate`); run `python examples/hf_approximate_attention.py --help`.

# %%
import argparse
import math
import os
import time

import torch
import transformers

import numattn
import numattn.hf

DEFAULT_METHODS = ["exact.flash", "sparse.window(left=64,right=0,sinks=4)", "sparse.topk(k=32)"]


def ppl_chunks(model, tokens, ctx, chunks):
    """The chunks `numattn ppl` scores: min(chunks, n // ctx) windows of ctx tokens, the first
    token of each replaced by BOS when the vocabulary adds BOS."""
    n = len(tokens) // ctx if chunks < 0 else min(chunks, len(tokens) // ctx)
    out = []
    for c in range(n):
        ids = list(tokens[c * ctx:(c + 1) * ctx])
        if model.add_bos:
            ids[0] = model.bos_id
        out.append(ids)
    return out


@torch.no_grad()
def hf_ppl(hf, chunks, ctx):
    """exp(mean NLL) of the second half of each chunk (positions ctx/2 .. ctx-2 predict the next
    token), accumulated in float64 as numattn's evaluator does."""
    first = ctx // 2
    total, count = 0.0, 0
    for ids in chunks:
        x = torch.tensor([ids])
        logits = hf(x, use_cache=False).logits[0, first:ctx - 1].double()
        nll = -torch.log_softmax(logits, dim=-1).gather(1, x[0, first + 1:ctx, None]).squeeze(1)
        total += float(nll.sum())
        count += nll.numel()
    return math.exp(total / count)


def load_hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default", help="GGUF file ('default': SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--text", default="default", help="text file ('default': the Jane Austen novels)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="default: torch.get_num_threads()")
    ap.add_argument("--method", action="append", help=f"attention spec (repeatable; default {DEFAULT_METHODS})")
    ap.add_argument("--estimate-rows", type=int, default=0,
                    help="rows per call of the a-posteriori error estimate (0: automatic)")
    args = ap.parse_args()
    methods = args.method or DEFAULT_METHODS
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    path = numattn.default_model_path() if args.model == "default" else args.model
    text_path = numattn.default_text_path() if args.text == "default" else args.text
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    model = numattn.Model.load(path, threads=threads)
    # Tokenized as `numattn ppl` tokenizes a text: BOS first when the vocabulary adds it, chat
    # markers read as plain text.
    tokens = model.tokenize(text, add_bos=model.add_bos, parse_special=False)
    chunks = ppl_chunks(model, tokens, args.ctx, args.chunks)

    t = time.perf_counter()
    hf = load_hf(path)
    print(f"loaded {os.path.basename(path)} in transformers ({hf.dtype}) in {time.perf_counter() - t:.1f} s; "
          f"{len(chunks)} chunks of {args.ctx} tokens, {threads} threads")

    hf.set_attn_implementation("sdpa")
    sdpa = hf_ppl(hf, chunks, args.ctx)
    print(f"{'method':<44} {'HF + numattn':>14} {'numattn ppl':>14} {'rel. diff':>10} {'est_rel_err_hi':>15}")
    print(f"{'(transformers sdpa)':<44} {sdpa:>14.8f}")
    for spec in methods:
        backend = numattn.hf.register("numattn", method=spec, threads=threads, estimate_rows=args.estimate_rows)
        hf.set_attn_implementation("numattn")
        p_hf = hf_ppl(hf, chunks, args.ctx)
        p_na = model.ppl(tokens, ctx=args.ctx, chunks=len(chunks), attn=spec, threads=threads)["ppl"]
        worst = max((i.get("est_rel_error_hi", float("nan")) for i in backend.last.values()), default=float("nan"))
        print(f"{spec:<44} {p_hf:>14.8f} {p_na:>14.8f} {abs(p_hf - p_na) / p_na:>10.2e} {worst:>15.3e}")
    print("est_rel_err_hi: the largest over layers of the last call's upper bound (level 0.95) on the relative "
          "Frobenius error of the layer's attention output")


if __name__ == "__main__":
    main()
