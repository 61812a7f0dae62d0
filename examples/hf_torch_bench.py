"""numattn.torch.attention on the tensors transformers hands an attention function, measured.

    python examples/hf_torch_bench.py speed [--n 8192 --heads 8 --d 64 --threads 2 --reps 5]
    python examples/hf_torch_bench.py bf16  [--n 4096 --heads 8 --d 64 --threads 2]

speed: q, k, v in [B, N, H, D] memory (as a transformers layer computes them) and passed as
their [B, H, N, D] views (`transpose(1, 2)`, stride H·D between rows), against the same call on
`.contiguous()` copies and against torch's own `scaled_dot_product_attention` on the views, causal
and not; rounds interleave the three so all see the same machine load; medians over `--reps`.

bf16: bfloat16 inputs, the error of the result against float64 attention on the same (rounded)
inputs, next to the float32 path's error on those inputs; and the peak resident memory
(/proc/self/status VmHWM) that the call adds, measured in a fresh subprocess around the one call,
as a fraction of the K + V bytes. Prints JSON.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

import numattn.torch as nt

F = torch.nn.functional


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def speed(a):
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    mk = lambda: torch.randn(1, a.n, a.heads, a.d, generator=g)  # noqa: E731
    qm, km, vm = mk(), mk(), mk()
    q, k, v = (x.transpose(1, 2) for x in (qm, km, vm))
    rows = []
    for causal in (True, False):
        runs = {"strided": [], "contiguous": [], "sdpa": []}
        for _ in range(a.reps):
            runs["strided"].append(timed(lambda: nt.attention(q, k, v, a.method, is_causal=causal)))
            runs["contiguous"].append(timed(lambda: nt.attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                                 a.method, is_causal=causal)))
            runs["sdpa"].append(timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
        med = {key: statistics.median(t) * 1e3 for key, t in runs.items()}
        rows.append(dict(causal=causal, n=a.n, heads=a.heads, d=a.d, threads=a.threads, method=a.method,
                         **{f"{key}_ms": round(t, 1) for key, t in med.items()},
                         strided_over_contiguous=round(med["strided"] / med["contiguous"], 3),
                         strided_over_sdpa=round(med["strided"] / med["sdpa"], 3)))
    print(json.dumps(rows, indent=1))


CHILD = r"""
import sys, torch, numattn.torch as nt
n, h, d, threads, dtype = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dt = getattr(torch, dtype)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, h, n, d, generator=g).to(dt) for _ in range(3))
nt.attention(q[..., :8, :], k[..., :8, :], v[..., :8, :], threads=threads)  # loads everything once
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
before = hwm()
out = torch.empty(1, h, n, d, dtype=dt)  # the result itself is not growth
rss_out = hwm()
nt.attention(q, k, v, is_causal=True, threads=threads, out=out)
print(before, rss_out, hwm(), k.numel() * k.element_size() * 2)
"""


def bf16(a):
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(1)
    rows = {}
    for name, dt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        q, k, v = (torch.randn(1, a.heads, a.n // 4, a.d, generator=g).to(dt) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        o16 = nt.attention(q, k, v, is_causal=True)
        o32 = nt.attention(q.float(), k.float(), v.float(), is_causal=True)
        rel = lambda o: ((o.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        # The half result is the float32 result rounded once: its error is the rounding's.
        row = dict(n=a.n // 4, rel_error_half_path=rel(o16), rel_error_f32_path=rel(o32),
                   rel_error_f32_rounded=rel(o32.to(dt)))
        p = subprocess.run([sys.executable, "-c", CHILD, str(a.n), str(a.heads), str(a.d), str(a.threads), name],
                           capture_output=True, text=True, check=True)
        before, with_out, after, kv_bytes = map(int, p.stdout.split())
        row.update(n_mem=a.n, kv_bytes=kv_bytes, peak_growth_bytes=after - with_out,
                   peak_growth_over_kv=round((after - with_out) / kv_bytes, 4))
        rows[name] = row
    print(json.dumps(rows, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["speed", "bf16"])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--method", default="exact.flash")
    a = ap.parse_args()
    speed(a) if a.what == "speed" else bf16(a)


if __name__ == "__main__":
    main()
