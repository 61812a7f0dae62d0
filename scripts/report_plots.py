#!/usr/bin/python3
"""Draws `numattn report`'s plots and writes its report.md and index.html.

    /usr/bin/python3 scripts/report_plots.py --dir DIR

Reads only what `numattn report` wrote under DIR/data/ (steps.json: the commands, their status
and outputs; the JSON of bench, ppl, bd-study, capture; analyze/ when `numattn analyze` ran) and
writes DIR/plots/*.png and *.svg, DIR/report.md (plots as files) and DIR/index.html (plots inline
as PNG data URIs, so the page is one self-contained file). Plots are matplotlib (Debian's
python3-matplotlib) with the Agg backend: no display is needed.
"""
import argparse
import base64
import csv
import html
import json
import math
import os
import re
import statistics
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # the report checks this first; a direct call says the same
    sys.exit(f"report_plots.py: matplotlib is missing ({e}): install Debian's python3-matplotlib "
             "(scripts/setup.sh) and run it with /usr/bin/python3")

FAMILY_COLORS = {"exact": "#222222", "lowrank": "#1f77b4", "kernel": "#2ca02c", "sparse": "#d62728",
                 "tensor": "#9467bd", "dist": "#8c564b", "latent": "#ff7f0e"}
ERROR_FLOOR = 1e-9  # log axes: an error of 0 (the float64 reference) is drawn at the floor


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_csv(path):
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError:
        return None


def num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt(x, spec="{:.3g}"):
    v = num(x)
    return "" if v is None else spec.format(v)


class Report:
    """Collects sections (heading, text, tables, plots with the commands behind them) and writes
    them as Markdown and as HTML."""

    def __init__(self, root):
        self.root = root
        self.blocks = []  # (kind, payload)
        self.plots = []

    def heading(self, text, level=2):
        self.blocks.append(("h", (level, text)))

    def para(self, text):
        self.blocks.append(("p", text))

    def table(self, header, rows):
        if rows:
            self.blocks.append(("table", (header, rows)))

    def commands(self, cmds):
        cmds = [c for c in cmds if c]
        if cmds:
            self.blocks.append(("cmd", cmds))

    def plot(self, fig, name, caption):
        png = os.path.join(self.root, "plots", name + ".png")
        fig.savefig(png, dpi=110, bbox_inches="tight")
        fig.savefig(os.path.join(self.root, "plots", name + ".svg"), bbox_inches="tight")
        plt.close(fig)
        self.plots.append(name)
        self.blocks.append(("plot", (name, caption)))

    def markdown(self):
        out = []
        for kind, p in self.blocks:
            if kind == "h":
                out.append("#" * p[0] + " " + p[1] + "\n")
            elif kind == "p":
                out.append(p + "\n")
            elif kind == "table":
                header, rows = p
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "---|" * len(header))
                out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
                out.append("")
            elif kind == "cmd":
                out.append("```\n" + "\n".join(p) + "\n```\n")
            elif kind == "plot":
                out.append(f"![{p[1]}](plots/{p[0]}.png)\n\n*{p[1]}* ([SVG](plots/{p[0]}.svg))\n")
        return "\n".join(out)

    def html(self, title):
        e = html.escape
        body = []
        for kind, p in self.blocks:
            if kind == "h":
                body.append(f"<h{p[0]}>{e(p[1])}</h{p[0]}>")
            elif kind == "p":
                body.append(f"<p>{e(p)}</p>")
            elif kind == "table":
                header, rows = p
                body.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) +
                            "</tr></thead><tbody>" +
                            "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows) +
                            "</tbody></table>")
            elif kind == "cmd":
                body.append("<pre class=\"cmd\">" + e("\n".join(p)) + "</pre>")
            elif kind == "plot":
                with open(os.path.join(self.root, "plots", p[0] + ".png"), "rb") as f:
                    data = base64.b64encode(f.read()).decode("ascii")
                body.append(f"<figure><img class=\"plot\" data-plot=\"{e(p[0])}\" alt=\"{e(p[1])}\" "
                            f"src=\"data:image/png;base64,{data}\"><figcaption>{e(p[1])} "
                            f"(<a href=\"plots/{e(p[0])}.svg\">SVG</a>)</figcaption></figure>")
        style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
                 "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.85em}"
                 "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f0f0f0}"
                 "pre.cmd{background:#f6f6f6;padding:0.5em;white-space:pre-wrap;word-break:break-all;font-size:0.8em}"
                 "img.plot{max-width:100%;border:1px solid #ddd}figure{margin:1em 0}")
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<meta name=\"numattn-plots\" content=\"{len(self.plots)}\">"
                f"<title>{e(title)}</title><style>{style}</style></head><body>\n" +
                "\n".join(body) + "\n</body></html>\n")


def step_by_id(meta, sid):
    for s in meta["steps"]:
        if s["id"] == sid:
            return s
    return None


def steps_in(meta, section):
    return [s for s in meta["steps"] if s["section"] == section]


def ok_output(root, step):
    if step is None or step["status"] != "ok" or not step.get("output"):
        return None
    return load_json(os.path.join(root, step["output"]))


def failed_note(rep, steps):
    bad = [s for s in steps if s["status"] != "ok"]
    if bad:
        rep.para("Steps that did not succeed: " + "; ".join(
            f"{s['id']} ({s['status']}{': ' + s['stderr'].strip().splitlines()[-1] if s.get('stderr') else ''})"
            for s in bad))


# ---------------------------------------------------------------- error against time / memory

def bench_points(rows, families, skipped=None):
    """Method rows that ran, as dicts of the fields plotted; medians over layers/heads inputs
    that share (method, n). Rows that did not run go to `skipped[(method, n)]` (their status)."""
    groups = {}
    for r in rows or []:
        if r.get("method") == "blas.sgemm":
            continue
        if not str(r.get("status", "")).startswith("ok"):
            if skipped is not None:
                skipped[(r.get("method"), int(r.get("n") or 0))] = str(r.get("status", "")).split(":")[0]
            continue
        err, t = num(r.get("rel_fro_error")), num(r.get("time_ms"))
        if err is None or t is None:
            continue
        key = (r["method"], int(r.get("n") or 0))
        groups.setdefault(key, []).append((max(err, ERROR_FLOOR), t, num(r.get("workspace_bytes")) or 0.0,
                                           num(r.get("speedup_vs_exact"))))
    pts = []
    for (m, n), v in sorted(groups.items()):
        pts.append({"method": m, "n": n, "family": families.get(m.split("(")[0], m.split(".")[0]),
                    "err": statistics.median(x[0] for x in v), "ms": statistics.median(x[1] for x in v),
                    "bytes": statistics.median(x[2] for x in v),
                    "speedup": statistics.median([x[3] for x in v if x[3] is not None] or [float("nan")]),
                    "inputs": len(v)})
    return pts


def pareto_front(pts, xkey):
    """Points not beaten on both x and error, in increasing x."""
    front, best = [], float("inf")
    for p in sorted(pts, key=lambda p: (p[xkey], p["err"])):
        if p["err"] < best:
            front.append(p)
            best = p["err"]
    return front


def pareto_plot(rep, pts, xkey, xlabel, name, caption):
    ns = sorted({p["n"] for p in pts})
    fig, axes = plt.subplots(1, len(ns), figsize=(5.2 * len(ns), 4.4), squeeze=False)
    for ax, n in zip(axes[0], ns):
        sub = [p for p in pts if p["n"] == n]
        for fam in sorted({p["family"] for p in sub}):
            fp = [p for p in sub if p["family"] == fam]
            ax.scatter([max(p[xkey], 1.0) if xkey == "bytes" else p[xkey] for p in fp], [p["err"] for p in fp],
                       s=22, color=FAMILY_COLORS.get(fam, "#7f7f7f"), label=fam, zorder=3)
        for p in sub:
            ax.annotate(p["method"].split("(")[0], (max(p[xkey], 1.0) if xkey == "bytes" else p[xkey], p["err"]),
                        fontsize=6, xytext=(3, 2), textcoords="offset points")
        front = pareto_front(sub, xkey)
        ax.step([max(p[xkey], 1.0) if xkey == "bytes" else p[xkey] for p in front], [p["err"] for p in front],
                where="post", color="#999999", lw=1, zorder=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("relative Frobenius error vs softmax")
        ax.set_title(f"N = {n}")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    rep.plot(fig, name, caption)


def section_pareto(rep, root, meta, families):
    rep.heading("Error against time and memory")
    rep.para("Every registered method at its default parameters, timed (median of the repetitions) and "
             "checked on sampled rows against the float64 reference (rel_fro_error against softmax). "
             "The grey step line is the Pareto front. Memory is the method's workspace_bytes (extra memory "
             "beyond Q, K, V and the output; 0 drawn at 1 byte). Captured inputs: the model's own Q/K/V "
             "(causal, bottom-right), medians over the captured layers.")
    inputs = [("gaussian", "Gaussian inputs", [step_by_id(meta, "bench_gaussian")]),
              ("spiky", "spiky inputs", [step_by_id(meta, "bench_spiky")]),
              ("captured", "captured Q/K/V", [s for s in meta["steps"] if s["id"].startswith("bench_captured_")])]
    summary, not_run = {}, {}
    for key, label, steps in inputs:
        steps = [s for s in steps if s is not None]
        rows = []
        for s in steps:
            rows += ok_output(root, s) or []
        skipped = {}
        pts = bench_points(rows, families, skipped)
        for (m, n), why in skipped.items():
            not_run.setdefault(m, {})[(key, n)] = why
        failed_note(rep, steps)
        if not pts:
            continue
        rep.heading(label.capitalize(), 3)
        pareto_plot(rep, pts, "ms", "time (ms, median)", f"pareto_time_{key}", f"Error against time: {label}")
        pareto_plot(rep, pts, "bytes", "workspace (bytes)", f"pareto_memory_{key}",
                    f"Error against memory: {label}")
        rep.commands([s["command"] for s in steps])
        for p in pts:
            summary.setdefault(p["method"], {})[(key, p["n"])] = p
    if summary:
        cols = sorted({k for v in summary.values() for k in v})
        for m, v in not_run.items():  # a method that never ran still gets its row
            summary.setdefault(m, {})
        rep.heading("Table: error and speed-up over exact.flash", 3)
        rep.para("Relative Frobenius error against softmax / time of exact.flash on the same problem over the "
                 "method's (medians); 'skipped' where the method refuses the problem (e.g. causal masking).")
        header = ["method", "family"] + [f"{k} N={n} err / speedup" for k, n in cols]
        rows = []
        for m in sorted(summary):
            fam = families.get(m.split("(")[0], "")
            rows.append([m.split("(")[0], fam] + [f"{fmt(summary[m][c]['err'], '{:.2e}')} / {fmt(summary[m][c]['speedup'], '{:.3g}')}"
                                    if c in summary[m] else not_run.get(m, {}).get(c, "") for c in cols])
        rep.table(header, rows)
    tensor = [m for m in summary if families.get(m.split("(")[0]) == "tensor"]
    if tensor:
        rep.heading("Tensor methods", 3)
        rep.para("Methods of the tensor family compute their own mechanism (docs/tensor.md); the error "
                 "above is against softmax attention.")
        rep.table(["method"] + [f"{k} N={n} err" for k, n in cols],
                  [[m.split("(")[0]] + [fmt(summary[m][c]["err"], "{:.2e}") if c in summary[m] else "" for c in cols]
                   for m in tensor])


# ---------------------------------------------------------------- perplexity

def section_ppl(rep, root, meta):
    steps = steps_in(meta, "ppl")
    if not steps:
        return
    rep.heading("Perplexity and KL divergence per causal method")
    st = meta["settings"]
    hybrid = any("global layers" in s.get("title", "") for s in steps)
    where = ("in every global layer (the sliding-window layers keep their exact windowed attention)"
             if hybrid else "in every layer")
    rep.para(f"The model with the method {where}, ctx {st['ctx']}, {st['chunks']} chunk(s) "
             "(llama.cpp protocol); KL divergence, its 99th percentile and top-1 agreement of the next-token "
             "distributions against exact.flash in the same run.")
    rows, pts = [], []
    for s in steps:
        d = ok_output(root, s)
        if d is None:
            why = s["status"]
            if s.get("stderr"):
                why += ": " + s["stderr"].strip().splitlines()[-1]
            rows.append([s["title"].split(": ", 1)[-1], "", "", "", "", "", why])
            continue
        rows.append([d.get("attn", ""), f"{fmt(d.get('ppl'), '{:.4f}')} ± {fmt(d.get('ppl_stderr'), '{:.4f}')}",
                     fmt(d.get("kld_mean")), fmt(d.get("kld_p99")), fmt(d.get("top1_agreement"), "{:.4f}"),
                     fmt(d.get("tokens_per_s"), "{:.0f}"), "ok"])
        if num(d.get("kld_mean")) is not None and num(d.get("tokens_per_s")) is not None:
            pts.append((d["attn"].split("(")[0], max(num(d["kld_mean"]), ERROR_FLOOR), num(d["tokens_per_s"])))
    rep.table(["attention", "PPL", "KL mean", "KL p99", "top-1 agreement", "tokens/s", "status"], rows)
    if pts:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, kl, tps in pts:
            ax.scatter([tps], [kl], color=FAMILY_COLORS.get(name.split(".")[0], "#7f7f7f"), zorder=3)
            ax.annotate(name, (tps, kl), fontsize=7, xytext=(3, 2), textcoords="offset points")
        ax.set_yscale("log")
        ax.set_xlabel("tokens/s (whole forward pass)")
        ax.set_ylabel("mean KL vs exact.flash (nats)")
        ax.grid(True, alpha=0.3)
        rep.plot(fig, "ppl_kl", "Mean KL divergence against throughput per causal method")
    rep.commands([s["command"] for s in steps])


# ---------------------------------------------------------------- long context

LONG_TOL = 0.10  # error level at which each family's best configuration is chosen


def crossover_n(series):
    """Smallest N at which a configuration is at least as fast as exact.flash, interpolated
    log-linearly in N between the two measured lengths around speed-up 1 (None: never within the
    measured lengths; the first N when it is faster everywhere)."""
    pts = sorted((n, sp) for n, sp in series if sp is not None and sp == sp and sp > 0)
    for i, (n, sp) in enumerate(pts):
        if sp >= 1.0:
            if i == 0:
                return ("≤", n)
            n0, s0 = pts[i - 1]
            t = math.log(s0) / (math.log(s0) - math.log(sp))
            return ("", math.exp(math.log(n0) + t * (math.log(n) - math.log(n0))))
    return None


def long_choices(root, step):
    """Per-layer choices of auto(tol=E) from the step's stderr, in the order they were made."""
    path = os.path.join(root, "logs", step["id"] + ".stderr")
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f.read().replace("\r", "\n").splitlines():
                m = re.match(r"auto: selection (\d+) \(([^)]*)\): (\S+) \((.*)\)$", line.strip())
                if m:
                    out.append((int(m.group(1)), m.group(3), m.group(4)))
    except OSError:
        pass
    return out


def section_long(rep, root, meta, families):
    steps = steps_in(meta, "long")
    if not steps:
        return
    st = meta["settings"]
    rep.heading("Long context")
    rep.para(f"Each family's budget swept, on the model's own Q/K/V of layer {st.get('long_layer')} (causal, "
             f"bottom-right) at N = {st.get('long_n')}, timed against exact.flash in the same run, errors on "
             f"sampled rows against the float64 reference; then in the model at ctx {st.get('long_ctx')} (one "
             "chunk), where perplexity, KL and throughput show what each budget buys.")
    bench_steps = [s for s in steps if s["id"].startswith("long_bench_")]
    rows = []
    for s in bench_steps:
        rows += ok_output(root, s) or []
    failed_note(rep, [s for s in steps if s["id"].startswith(("long_bench_", "long_capture_"))])
    skipped = {}
    pts = bench_points(rows, families, skipped)
    if pts:
        ns = sorted({p["n"] for p in pts})
        exact = {p["n"]: p for p in pts if p["method"].startswith("exact.flash")}
        by_fam = {}
        for p in pts:
            if p["method"].startswith("exact."):
                continue
            by_fam.setdefault(p["method"].split("(")[0], []).append(p)
        # The best configuration of each family at each N: the fastest within LONG_TOL, else the
        # most accurate (marked).
        best = {}
        for fam, fp in by_fam.items():
            for n in ns:
                cand = [p for p in fp if p["n"] == n]
                if not cand:
                    continue
                ok = [p for p in cand if p["err"] <= LONG_TOL]
                best[(fam, n)] = (min(ok, key=lambda p: p["ms"]), True) if ok else (min(cand, key=lambda p: p["err"]), False)
        rep.heading("Time and error against N", 3)
        rep.para(f"Per family, at each N, the fastest configuration whose error is at most {LONG_TOL:g} "
                 "(marked * where none is: then the most accurate): speed-up over exact.flash / relative "
                 "Frobenius error, and the configuration.")
        trows = []
        for fam in sorted(by_fam):
            cells = []
            for n in ns:
                b = best.get((fam, n))
                if b is None:
                    cells.append(skipped.get(next((m for (m, nn) in skipped if m.split("(")[0] == fam and nn == n), None), ""))
                    continue
                p, ok = b
                cells.append(f"{fmt(p['speedup'], '{:.2f}')}× / {fmt(p['err'], '{:.2e}')}{'' if ok else ' *'} "
                             f"{p['method'][len(fam):]}")
            trows.append([fam] + cells)
        if exact:
            trows.insert(0, ["exact.flash (ms)"] + [fmt(exact[n]["ms"], "{:.1f}") if n in exact else "" for n in ns])
        rep.table(["family"] + [f"N = {n}" for n in ns], trows)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
        for fam in sorted(by_fam):
            xs = [n for n in ns if (fam, n) in best]
            if not xs:
                continue
            col = FAMILY_COLORS.get(fam.split(".")[0], "#7f7f7f")
            axes[0].plot(xs, [best[(fam, n)][0]["ms"] for n in xs], "o-", color=col, label=fam, ms=4)
            axes[1].plot(xs, [best[(fam, n)][0]["err"] for n in xs], "o-", color=col, label=fam, ms=4)
        if exact:
            xs = sorted(exact)
            axes[0].plot(xs, [exact[n]["ms"] for n in xs], "k--", label="exact.flash")
        for ax, yl in zip(axes, ["time (ms, median)", "relative Frobenius error vs softmax"]):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("N (tokens)")
            ax.set_ylabel(yl)
            ax.grid(True, which="major", alpha=0.3)
        axes[0].legend(fontsize=7)
        rep.plot(fig, "long_time_error", f"Time and error against N of each family's best configuration (error ≤ {LONG_TOL:g})")
        rep.heading("Crossover against exact.flash", 3)
        rep.para("The length from which each configuration is at least as fast as exact.flash (interpolated "
                 "in log N between the measured lengths), and its error at the largest N.")
        crows = []
        for m in sorted({p["method"] for p in pts if not p["method"].startswith("exact.")}):
            ser = [(p["n"], p["speedup"]) for p in pts if p["method"] == m]
            c = crossover_n(ser)
            last = max((p for p in pts if p["method"] == m), key=lambda p: p["n"])
            crows.append([m, "not within the measured N" if c is None else f"{c[0]}{c[1]:.0f}",
                          f"{fmt(last['speedup'], '{:.2f}')}×", fmt(last["err"], "{:.2e}"), last["n"]])
        for (m, n), why in sorted(skipped.items()):
            if not any(r[0] == m for r in crows):
                crows.append([m, why, "", "", n])
        rep.table(["configuration", "crossover N", "speed-up at largest N", "error at largest N", "largest N"], crows)
        rep.commands([s["command"] for s in bench_steps])
    # In the model.
    ppl_steps = [s for s in steps if s["id"].startswith("long_ppl_")]
    base = ok_output(root, step_by_id(meta, "long_ppl_exact.flash"))
    base_att = num(((base or {}).get("profile_s") or {}).get("attention"))
    mrows, mpts = [], []
    for s in ppl_steps + [s for s in steps if s["id"].startswith("long_auto_")]:
        d = ok_output(root, s)
        if d is None:
            why = s["status"]
            if s.get("stderr"):
                why += ": " + s["stderr"].strip().splitlines()[-1]
            mrows.append([s["title"].split(": ", 1)[-1], "", "", "", "", "", "", why])
            continue
        att = num((d.get("profile_s") or {}).get("attention"))
        mrows.append([d.get("attn", ""), f"{fmt(d.get('ppl'), '{:.4f}')}", fmt(d.get("kld_mean")),
                      fmt(d.get("top1_agreement"), "{:.4f}"), fmt(d.get("tokens_per_s"), "{:.0f}"),
                      fmt(att, "{:.2f}"), fmt(att / base_att if att is not None and base_att else None, "{:.2f}"), "ok"])
        if num(d.get("kld_mean")) is not None and num(d.get("tokens_per_s")) is not None:
            fam = d["attn"].split("(")[0].removeprefix("global:")
            mpts.append((fam, d["attn"], max(num(d["kld_mean"]), ERROR_FLOOR), num(d["tokens_per_s"])))
    if mrows:
        rep.heading(f"In the model at ctx {st.get('long_ctx')}", 3)
        rep.para("Perplexity, mean KL and top-1 agreement against exact.flash in the same run, whole-forward "
                 "tokens/s, the attention's seconds (profile) and their ratio to exact.flash's.")
        rep.table(["attention", "PPL", "KL mean", "top-1", "tokens/s", "attention s", "attention / exact", "status"],
                  mrows)
    if mpts:
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        for fam in sorted({p[0] for p in mpts}):
            fp = sorted([p for p in mpts if p[0] == fam], key=lambda p: p[3])
            col = FAMILY_COLORS.get(fam.split(".")[0], "#7f7f7f")
            ax.plot([p[3] for p in fp], [p[2] for p in fp], "o-", color=col, label=fam, ms=4)
            for p in fp:
                ax.annotate(p[1].split("(", 1)[-1].rstrip(")")[:28], (p[3], p[2]), fontsize=6, xytext=(3, 2),
                            textcoords="offset points")
        if base and num(base.get("tokens_per_s")):
            ax.axvline(num(base["tokens_per_s"]), color="k", ls="--", lw=1, label="exact.flash")
        ax.set_yscale("log")
        ax.set_xlabel("tokens/s (whole forward pass)")
        ax.set_ylabel("mean KL vs exact.flash (nats)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        rep.plot(fig, "long_ppl_pareto", f"KL against throughput in the model at ctx {st.get('long_ctx')}: each family's budgets")
    for s in [s for s in steps if s["id"].startswith("long_auto_")]:
        ch = long_choices(root, s)
        if ch:
            rep.heading(f"Per-layer choice of {s['title'].split('per-layer ', 1)[-1]}", 3)
            rep.table(["selection", "choice", "why"], [[i, c, w] for i, c, w in ch])
    rep.commands([s["command"] for s in ppl_steps + [s for s in steps if s["id"].startswith("long_auto_")]])


# ---------------------------------------------------------------- BDA, MLA

def section_bda(rep, root, meta):
    steps = steps_in(meta, "bda")
    if not steps:
        return
    rep.heading("Basis-Decomposition Attention")
    d = ok_output(root, step_by_id(meta, "bda_ppl_vo"))
    if d:
        rep.para("BD Attention (VO pair) applied at load; KL against the dense model (docs/bd.md).")
        rep.table(["BDA", "PPL", "PPL dense", "PPL rel. change", "KL mean", "top-1", "params saved", "κ max",
                   "fallback heads"],
                  [[d.get("bda", ""), fmt(d.get("ppl"), "{:.4f}"), fmt(d.get("ppl_baseline"), "{:.4f}"),
                    fmt(d.get("ppl_rel_change"), "{:.2e}"), fmt(d.get("kld_mean")), fmt(d.get("top1_agreement"), "{:.4f}"),
                    fmt(d.get("bda_params_saved"), "{:.0f}"), fmt(d.get("bda_kappa_max")),
                    fmt(d.get("bda_fallback_heads"), "{:.0f}")]])
    study = ok_output(root, step_by_id(meta, "bd_study"))
    if study:
        rep.para("Basis rules on random weights (MHA-768, MLA-512, MHA-4096): worst-head κ and float32 error against "
                 "float64, medians over seeds.")
        rep.table(["setup", "strategy", "κ QK max", "κ VO max", "logit err BDA", "logit err plain", "out err BDA",
                   "out err plain"],
                  [[r.get("setup"), r.get("strategy"), fmt(r.get("kappa_qk_max")), fmt(r.get("kappa_vo_max")),
                    fmt(r.get("logit_err_bda"), "{:.2e}"), fmt(r.get("logit_err_plain"), "{:.2e}"),
                    fmt(r.get("out_err_bda"), "{:.2e}"), fmt(r.get("out_err_plain"), "{:.2e}")] for r in study])
    failed_note(rep, steps)
    rep.commands([s["command"] for s in steps])


def section_mla(rep, root, meta):
    steps = steps_in(meta, "mla")
    if not steps:
        return
    rep.heading("Multi-head latent attention (MLA)")
    keys, rows = ["ppl", "ppl_stderr", "kld_mean", "kld_p99", "top1_agreement", "tokens_per_s"], []
    for s in steps:
        d = ok_output(root, s)
        extra = {k: v for k, v in (d or {}).items() if k.startswith("mla") and not isinstance(v, (dict, list))}
        rows.append([s["title"], s["status"]] + ([fmt(d.get(k)) for k in keys] if d else [""] * len(keys)) +
                    ["; ".join(f"{k}={v}" for k, v in extra.items())])
    rep.table(["run", "status"] + keys + ["MLA fields"], rows)
    rep.commands([s["command"] for s in steps])


def section_transform(rep, root, meta):
    steps = steps_in(meta, "transform")
    if not steps:
        return
    rep.heading("Model transforms")
    rep.para("Each pipeline of `numattn report --transform` applied at load (`numattn transforms`); KL against the "
             "model before its last stage.")
    keys, rows = ["ppl", "ppl_baseline", "kld_mean", "kld_p99", "top1_agreement", "tokens_per_s"], []
    for s in steps:
        d = ok_output(root, s)
        rows.append([(d or {}).get("transform") or s["title"], s["status"]] +
                    ([fmt(d.get(k)) for k in keys] if d else [""] * len(keys)))
    rep.table(["transform", "status"] + keys, rows)
    failed_note(rep, steps)
    rep.commands([s["command"] for s in steps])


# ---------------------------------------------------------------- analyze (spectra, panels, findings)

def section_analyze(rep, root, meta):
    s = step_by_id(meta, "analyze")
    if s is None:
        rep.heading("Spectra and sparsity")
        rep.para("Not in this report: this numattn has no `analyze` subcommand.")
        return
    rep.heading("Spectra and sparsity (survey §9)")
    adir = os.path.join(root, "data", "analyze")
    if s["status"] != "ok":
        failed_note(rep, [s])
        rep.commands([s["command"]])
        return
    spectra = load_csv(os.path.join(adir, "spectra.csv"))
    if spectra:
        curves = {}
        for r in spectra:
            key = (int(r["layer"]), r["matrix"])
            curves.setdefault(key, {}).setdefault(int(r["head"]), []).append((int(r["index"]), float(r["sigma"])))
        mats = [m for m in ["q_post", "k_post", "v", "qk", "a", "p"] if any(k[1] == m for k in curves)]
        layers = sorted({k[0] for k in curves})
        cmap = plt.get_cmap("viridis")
        fig, axes = plt.subplots(1, len(mats), figsize=(3.6 * len(mats), 3.6), squeeze=False)
        for ax, m in zip(axes[0], mats):
            for li, layer in enumerate(layers):
                heads = curves.get((layer, m))
                if not heads:
                    continue
                # Median over heads of σ_i/σ_1, as a function of i.
                norm = [[sv / h[0][1] for _, sv in sorted(h)] for h in heads.values() if h and h[0][1] > 0]
                if not norm:
                    continue
                length = min(len(x) for x in norm)
                med = [statistics.median(x[i] for x in norm) for i in range(length)]
                ax.semilogy(range(1, length + 1), [max(v, 1e-16) for v in med],
                            color=cmap(li / max(1, len(layers) - 1)), lw=1, label=f"layer {layer}")
            ax.set_title(m)
            ax.set_xlabel("index i")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("σ_i / σ_1 (median over heads)")
        if len(layers) <= 8:
            axes[0][0].legend(fontsize=6)
        rep.plot(fig, "spectra", "Singular values (normalised) of Q, K (post-RoPE), V, QKᵀ, A and P per layer")
    stats = load_csv(os.path.join(adir, "stats.csv"))
    if stats:
        agg = {}
        for r in stats:
            agg.setdefault((int(r["layer"]), r["matrix"]), []).append(r)
        rows = []
        for (layer, m), rs in sorted(agg.items()):
            if m not in ("qk", "a", "p", "v"):
                continue
            rows.append([layer, m, len(rs), fmt(statistics.median(float(r["rank_rel_1e-2"]) for r in rs), "{:.1f}"),
                         fmt(statistics.median(float(r["rank_energy_90"]) for r in rs), "{:.1f}"),
                         fmt(statistics.median(float(r["stable_rank"]) for r in rs), "{:.2f}"), rs[0].get("n", "")])
        rep.table(["layer", "matrix", "heads", "rank at 1e-2·σ₁ (median)", "rank at 90% energy", "stable rank", "n"],
                  rows)
    rows_csv = load_csv(os.path.join(adir, "rows.csv"))
    if rows_csv:
        agg = {}
        for r in rows_csv:
            agg.setdefault(int(r["layer"]), []).append(r)
        rep.table(["layer", "heads", "row entropy (mean)", "top-8 mass", "top-32 mass", "top-0.1n mass"],
                  [[layer, len(rs), fmt(statistics.mean(float(r["entropy_mean"]) for r in rs)),
                    fmt(statistics.mean(float(r["topk_mass_k8"]) for r in rs)),
                    fmt(statistics.mean(float(r["topk_mass_k32"]) for r in rs)),
                    fmt(statistics.mean(float(r["topk_mass_k_0.1n"]) for r in rs))] for layer, rs in sorted(agg.items())])
    panels = load_json(os.path.join(adir, "panels.json"))
    if panels and panels.get("panels"):
        ps = panels["panels"][:24]
        cols = min(6, len(ps))
        nrows = (len(ps) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(2.1 * cols, 2.2 * nrows), squeeze=False)
        im = None
        for ax, p in zip(axes.flat, ps):
            # The survey's Fig. 5: the top-left 20×20 block of P, each row over its largest entry.
            im = ax.imshow(p["grid"], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"L{p['layer']} H{p['head']}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        for ax in list(axes.flat)[len(ps):]:
            ax.axis("off")
        if im is not None:
            fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.7)
        rep.plot(fig, "panels", f"§9 sparsity panels: the top-left 20×20 block of P, each row divided by its largest "
                                f"entry ({panels.get('tokens', '?')} tokens; layer L, query head H)")
    info = load_json(os.path.join(adir, "analysis.json"))
    if info and info.get("findings"):
        rep.heading("The survey's §9 findings on this model", 3)
        rep.table(["finding", "statement", "holds", "evidence"],
                  [[f.get("id", ""), f.get("statement", ""), str(f.get("holds")),
                    "; ".join(f"{k}={fmt(v) if num(v) is not None else v}" for k, v in (f.get("evidence") or {}).items())]
                   for f in info["findings"]])
    predict = load_csv(os.path.join(adir, "predict.csv"))
    if predict:
        # Per (layer, method): medians over the heads (predict.csv has every head).
        agg = {}
        for r in predict:
            agg.setdefault((int(r["layer"]), r["method"]), []).append(r)
        rep.para("Error predicted from the spectrum / top-k mass of P (a lower bound for any method of that budget) "
                 "against the error measured, medians over heads (all heads in data/analyze/predict.csv).")
        rep.table(["layer", "method", "heads", "predicted error (median)", "measured error (median)"],
                  [[layer, m, len(rs), fmt(statistics.median(num(r["predicted_error"]) or 0.0 for r in rs)),
                    fmt(statistics.median(num(r["measured_error"]) or 0.0 for r in rs))]
                   for (layer, m), rs in sorted(agg.items())])
    rep.commands([s["command"]])


# ---------------------------------------------------------------- the whole report

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="the report directory of `numattn report --out`")
    args = ap.parse_args()
    root = args.dir
    meta = load_json(os.path.join(root, "data", "steps.json"))
    if meta is None:
        sys.exit(f"report_plots.py: {os.path.join(root, 'data', 'steps.json')} is missing or not JSON "
                 "(run `numattn report --out DIR`)")
    os.makedirs(os.path.join(root, "plots"), exist_ok=True)
    for f in os.listdir(os.path.join(root, "plots")):  # plots of an earlier run with other sections
        if f.endswith((".png", ".svg")):
            os.remove(os.path.join(root, "plots", f))
    methods = ok_output(root, step_by_id(meta, "methods")) or []
    families = {m["name"]: m["family"] for m in methods}

    rep = Report(root)
    title = "numattn report"
    rep.heading(title, 1)
    model = os.path.basename(meta.get("model") or "") or "(random inputs only)"
    text = os.path.basename(meta.get("text") or "")
    rep.para(f"Mode {meta['mode']}; model {model}; text {text}; {meta['threads']} threads of "
             f"{meta['hardware_threads']}; load average at the end: {meta.get('loadavg', '').strip()}.")
    section_pareto(rep, root, meta, families)
    section_ppl(rep, root, meta)
    section_long(rep, root, meta, families)
    section_bda(rep, root, meta)
    section_mla(rep, root, meta)
    section_transform(rep, root, meta)
    if meta.get("model"):
        section_analyze(rep, root, meta)
    rep.heading("Steps")
    rep.para("Wall and CPU seconds of each step (CPU above wall × threads means other work shared the machine).")
    rep.table(["step", "status", "seconds", "CPU seconds", "command"],
              [[s["id"], s["status"], fmt(s["seconds"], "{:.1f}"), fmt(s.get("cpu_seconds"), "{:.1f}"), s["command"]]
               for s in meta["steps"]])
    with open(os.path.join(root, "report.md"), "w", encoding="utf-8") as f:
        f.write(rep.markdown())
    with open(os.path.join(root, "index.html"), "w", encoding="utf-8") as f:
        f.write(rep.html(title))
    print(json.dumps({"plots": rep.plots, "report": os.path.join(root, "report.md"),
                      "html": os.path.join(root, "index.html")}))


if __name__ == "__main__":
    main()
