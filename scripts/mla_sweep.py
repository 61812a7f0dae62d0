#!/usr/bin/env python3
"""Sweeps the GQA -> MLA conversion (TransMLA, transform/mla.h) of a model through `numattn ppl`.

    scripts/mla_sweep.py [--numattn build/bin/numattn] [--model default] [--text default]
                         [--ctx 512] [--chunks 4] [--ranks exact,256,192,128,96,64,56,32]
                         [--freqfold 1,2,4] [--rope-heads 1] [--calib default]
                         [--csv out.csv] [--md out.md] [--threads T]
                         [--decode-ctx 4096 --decode-ranks full,256,...,32 [--decode-only]]

One `numattn ppl --mla-rank r --freqfold M --rope-heads h --calib C --format json` per
configuration; the CLI converts at load and measures PPL, KL and top-1 against the GQA model in
the same run. `full` is rank 0 (no truncation: only RoPE removal and FreqFold cost anything);
`exact` is the exact merge (rank 0 with rope_heads = Hkv, freqfold 1): it must
match the GQA model. KV bytes per token are the float32 cache of every layer, r + d_rope floats
(d_rope = rope_heads * n_rot) against GQA's 2 * Hkv * D; when the CLI prints its own figure
(`mla_latent` + `mla_d_rope`) that one is used and a mismatch is noted. Rows are printed as
they finish (stderr) and the tables written at the end; a failing configuration is recorded
with its error and the sweep goes on.

With --decode-ctx L: one `numattn bench-model --ctx L --weights f32 --mla-rank r` per rank of
--decode-ranks, which times the GQA model and the converted one in the same process (prefill of
L tokens, then --decode-tokens tokens one at a time, --decode-reps interleaved repetitions,
median): decode tokens/s of both and their ratio. A decode step's cost depends on r (and
d_rope), not on FreqFold, so one FreqFold (the first of --freqfold) is timed per rank. Float32
weights on both sides, so that the latent cache, not the weight encoding, is what differs.
Only the standard library is used.
"""
import argparse
import concurrent.futures
import csv
import json
import subprocess
import sys


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def model_shape(numattn, model):
    """(n_layer, n_head_kv, head_dim, n_rot) from `numattn gguf-info`."""
    out = subprocess.run([numattn, "gguf-info", "--model", model, "--format", "json", "--no-tensors"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"gguf-info failed: {out.stderr.strip()}")
    meta = json.loads(out.stdout)["metadata"]  # key -> {"type": ..., "value": ...}

    def find(key):
        v = meta.get(key)
        return int(v["value"]) if isinstance(v, dict) and "value" in v else None

    n_layer = find("llama.block_count")
    hkv = find("llama.attention.head_count_kv")
    d = find("llama.attention.key_length")
    if d is None:
        e, hq = find("llama.embedding_length"), find("llama.attention.head_count")
        d = e // hq if e and hq else None
    n_rot = find("llama.rope.dimension_count") or d
    if None in (n_layer, hkv, d):
        sys.exit("could not read the model's shape (llama.* keys) from gguf-info")
    return n_layer, hkv, d, n_rot


def run_one(args, rank, freqfold, rope_heads):
    cmd = [args.numattn, "ppl", "--model", args.model, "--text", args.text, "--ctx", str(args.ctx),
           "--chunks", str(args.chunks), "--mla-rank", str(rank), "--freqfold", str(freqfold),
           "--rope-heads", str(rope_heads), "--calib", args.calib, "--format", "json"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.calib_tokens:
        cmd += ["--calib-tokens", str(args.calib_tokens)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        err = out.stderr.strip().splitlines()
        return {"error": err[-1] if err else f"exit {out.returncode}", "cmd": " ".join(cmd)}
    row = json.loads(out.stdout)
    if isinstance(row, list):
        row = row[0]
    row["cmd"] = " ".join(cmd)
    return row


def decode_table(args, n_layer, hkv, d, n_rot):
    """Markdown lines: GQA vs MLA decode tokens/s at --decode-ctx, one bench-model run per rank."""
    m = int(args.freqfold.split(",")[0])
    h = int(args.rope_heads.split(",")[0])
    out = ["", f"Decode at context {args.decode_ctx} (`bench-model --weights f32`, FreqFold {m}, "
               f"rope heads {h}, {args.decode_tokens} tokens, median of {args.decode_reps} "
               "interleaved repetitions; GQA and MLA timed in the same process):", "",
           "| r | KV bytes/token | % of GQA | GQA tok/s | MLA tok/s | MLA / GQA | bytes/token GQA | bytes/token MLA |",
           "|---|---|---|---|---|---|---|---|"]
    for label in filter(None, args.decode_ranks.split(",")):
        rank = 0 if label == "full" else int(label)
        cmd = [args.numattn, "bench-model", "--model", args.model, "--ctx", str(args.decode_ctx),
               "--decode", str(args.decode_tokens), "--reps", str(args.decode_reps), "--weights", "f32",
               "--mla-rank", str(rank), "--freqfold", str(m), "--rope-heads", str(h),
               "--calib", args.calib, "--format", "json"]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if args.calib_tokens:
            cmd += ["--calib-tokens", str(args.calib_tokens)]
        log(f"mla_sweep: decode r={label} ...")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            err = res.stderr.strip().splitlines()
            out.append(f"| {label} | error: {err[-1] if err else res.returncode} |||||||")
            continue
        rows = json.loads(res.stdout)
        gqa = next(r for r in rows if not str(r["attention"]).startswith("mla"))
        mla = next(r for r in rows if str(r["attention"]).startswith("mla"))
        log("  " + json.dumps({"rank": label, "gqa": gqa, "mla": mla}))
        mla_kv = n_layer * mla["kv_cache_bytes_per_token_layer"]
        gqa_kv = n_layer * gqa["kv_cache_bytes_per_token_layer"]
        g, t = gqa["decode_tokens_per_s"], mla["decode_tokens_per_s"]
        out.append(f"| {label} | {mla_kv:.0f} | {100.0 * mla_kv / gqa_kv:.2f}% | {g:.2f} | {t:.2f} | {t / g:.2f}× | "
                   f"{gqa['bytes_per_token'] / 1e6:.1f} MB | {mla['bytes_per_token'] / 1e6:.1f} MB |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numattn", default="build/bin/numattn")
    ap.add_argument("--model", default="default")
    ap.add_argument("--text", default="default")
    ap.add_argument("--calib", default="default")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--ranks", default="exact,full,256,192,128,96,64,56,32",
                    help="latent ranks; 'exact' = the exact merge, 'full' = no truncation (RoPE "
                         "removal and FreqFold only)")
    ap.add_argument("--freqfold", default="1,2,4")
    ap.add_argument("--configs", default="",
                    help="explicit configurations r:M:h (comma-separated), run before the grid; "
                         "give --ranks '' to run only these")
    ap.add_argument("--rope-heads", default="1")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="configurations run at once")
    ap.add_argument("--rows-from", default="",
                    help="do not run: build the tables from the rows a sweep logged on stderr "
                         "(lines '  {...}'), e.g. of a sweep stopped early")
    ap.add_argument("--calib-tokens", type=int, default=0, help="0: the CLI's default")
    ap.add_argument("--decode-ctx", type=int, default=0, help="context of the decode timing (0 = none)")
    ap.add_argument("--decode-ranks", default="full,256,192,128,96,64,32")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--decode-reps", type=int, default=3)
    ap.add_argument("--decode-only", action="store_true", help="skip the PPL sweep")
    ap.add_argument("--csv", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args()

    n_layer, hkv, d, n_rot = model_shape(args.numattn, args.model)
    gqa_floats = 2 * hkv * d
    configs = []
    for c in filter(None, args.configs.split(",")):  # explicit r:M:h triples run first
        r, m, h = c.split(":")
        configs.append((r, 0 if r == "full" else int(r), int(m), int(h)))
    for r in filter(None, args.ranks.split(",")):
        if r == "exact":
            configs.append(("exact", 0, 1, hkv))
            continue
        for m in args.freqfold.split(","):
            for h in args.rope_heads.split(","):
                configs.append((r, 0 if r == "full" else int(r), int(m), int(h)))

    def one(cfg):
        label, rank, m, h = cfg
        log(f"mla_sweep: r={label} freqfold={m} rope_heads={h} ...")
        res = run_one(args, rank, m, h)
        d_rope = h * n_rot
        full = hkv * d - d_rope + hkv * d
        width = (full if rank == 0 or rank > full else rank) + d_rope
        row = {"rank": label, "freqfold": m, "rope_heads": h, "cache_floats_per_layer": width,
               "kv_bytes_per_token": 4 * n_layer * width, "kv_pct_of_gqa": 100.0 * width / gqa_floats}
        if "error" in res:
            row["error"] = res["error"]
        else:
            # The CLI's own latent and RoPE widths are the truth; a mismatch with the formula
            # is noted (and the CLI's figure used).
            if res.get("mla_latent") is not None and res.get("mla_d_rope") is not None:
                cli_width = int(res["mla_latent"]) + int(res["mla_d_rope"])
                if cli_width != width:
                    row["note"] = f"CLI cache width {cli_width} != formula {width}"
                    row.update({"cache_floats_per_layer": cli_width,
                                "kv_bytes_per_token": 4 * n_layer * cli_width,
                                "kv_pct_of_gqa": 100.0 * cli_width / gqa_floats})
            ppl, base = res.get("ppl"), res.get("ppl_baseline")
            row.update({"ppl": ppl, "ppl_gqa": base,
                        "ppl_rel_change": (ppl - base) / base if ppl is not None and base else None,
                        "kld_mean": res.get("kld_mean"), "kld_p99": res.get("kld_p99"),
                        "top1_agreement": res.get("top1_agreement"),
                        "tokens_per_s": res.get("tokens_per_s"), "load_s": res.get("load_s")})
        log("  " + json.dumps(row))
        return row

    if args.decode_only:
        rows = []
    elif args.rows_from:
        with open(args.rows_from) as f:
            rows = [json.loads(line) for line in f if line.startswith("  {")]
    else:
        # --jobs J runs J configurations at once (give each --threads T so J*T fits the machine).
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(one, configs))

    # Largest cache first, then FreqFold: the order of the table whatever order runs finished in.
    rows.sort(key=lambda r: (-r["kv_bytes_per_token"], r["rank"] != "exact", r["freqfold"], r["rope_heads"]))
    keys = ["rank", "freqfold", "rope_heads", "cache_floats_per_layer", "kv_bytes_per_token",
            "kv_pct_of_gqa", "ppl", "ppl_gqa", "ppl_rel_change", "kld_mean", "kld_p99",
            "top1_agreement", "tokens_per_s", "load_s", "note", "error"]
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for row in rows:
                w.writerow({k: row.get(k, "") for k in keys})

    def fmt(v, spec):
        return "" if v is None else format(v, spec)

    lines = [f"GQA cache: {gqa_floats} floats per layer, {4 * n_layer * gqa_floats} bytes per token "
             f"(float32, {n_layer} layers); ctx {args.ctx}, {args.chunks} chunks.", "",
             "| r | FreqFold | rope heads | KV bytes/token | % of GQA | PPL | ΔPPL | KL mean | KL p99 | top-1 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['rank']} | {row['freqfold']} | {row['rope_heads']} | "
                         f"{row['kv_bytes_per_token']} | {row['kv_pct_of_gqa']:.2f}% | error: {row['error']} |||||")
            continue
        lines.append(f"| {row['rank']} | {row['freqfold']} | {row['rope_heads']} | {row['kv_bytes_per_token']} | "
                     f"{row['kv_pct_of_gqa']:.2f}% | {fmt(row['ppl'], '.4f')} | "
                     f"{fmt(None if row['ppl_rel_change'] is None else 100 * row['ppl_rel_change'], '+.2f')}% | "
                     f"{fmt(row['kld_mean'], '.4f')} | {fmt(row['kld_p99'], '.3f')} | "
                     f"{fmt(row['top1_agreement'], '.4f')} |")
    # Frontier: for each cache size, the configuration of least KL; kept when no smaller cache
    # has a lower KL.
    ok = [r for r in rows if "error" not in r and r.get("kld_mean") is not None]
    best = {}
    for r in ok:
        k = r["kv_bytes_per_token"]
        if k not in best or r["kld_mean"] < best[k]["kld_mean"]:
            best[k] = r
    frontier, lowest = [], float("inf")
    for k in sorted(best):
        if best[k]["kld_mean"] < lowest:
            frontier.append(best[k])
            lowest = best[k]["kld_mean"]
    lines += ["", "Frontier (KV bytes per token vs KL; each row beats every smaller cache):", "",
              "| KV bytes/token | % of GQA | r | FreqFold | KL mean | ΔPPL |", "|---|---|---|---|---|---|"]
    for r in frontier:
        lines.append(f"| {r['kv_bytes_per_token']} | {r['kv_pct_of_gqa']:.2f}% | {r['rank']} | {r['freqfold']} | "
                     f"{r['kld_mean']:.4f} | "
                     f"{fmt(None if r['ppl_rel_change'] is None else 100 * r['ppl_rel_change'], '+.2f')}% |")
    if args.decode_only:
        lines = []
    if args.decode_ctx > 0:
        lines += decode_table(args, n_layer, hkv, d, n_rot)
    md = "\n".join(lines) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)


if __name__ == "__main__":
    main()
