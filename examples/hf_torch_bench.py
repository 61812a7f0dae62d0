"""numattn.torch.attention on the tensors transformers hands an attention function, measured.

    python examples/hf_torch_bench.py speed [--n 8192 --heads 8 --d 64 --threads 2 --reps 5]
    python examples/hf_torch_bench.py bf16  [--n 4096 --heads 8 --d 64 --threads 2]

speed: q, k, v in [B, N, H, D] memory (as a transformers layer computes them) and passed as
their [B, H, N, D] views (`transpose(1, 2)`, stride H·D between rows), against the same call on
contiguous copies made beforehand, on copies made in the call (`.contiguous()` + call), and
against torch's own `scaled_dot_product_attention` on the views, causal and not; rounds
interleave the four (in an order that rotates every round) so all see the same machine load;
one warm-up call of each first; medians over `--reps`.

bf16: bfloat16 (and float16) inputs, the error of the result against float64 attention on the
same (rounded) inputs, next to the float32 path's error on those inputs and that of the float32
result rounded to the input dtype; and the peak resident memory (/proc/self/status VmHWM) that one
causal call adds, in a fresh subprocess, as a fraction of the K + V bytes, for a prefill
(Nq = Nk = --n) and a decode step (Nq = 1 against Nk = --n). Prints JSON.
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
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    rows = []
    for causal in (True, False):
        runs = {"strided": [], "contiguous": [], "copy_then_call": [], "sdpa": []}
        calls = {
            "strided": lambda: nt.attention(q, k, v, a.method, is_causal=causal),
            "contiguous": lambda: nt.attention(qc, kc, vc, a.method, is_causal=causal),
            "copy_then_call": lambda: nt.attention(q.contiguous(), k.contiguous(), v.contiguous(), a.method,
                                                   is_causal=causal),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        }
        names = list(calls)
        for key in names:  # warm-up: thread pools, the kept scratch block, torch's buffers
            calls[key]()
        for r in range(a.reps):
            # The order rotates every round: a call right after torch's own (whose OpenMP threads
            # keep spinning a while after it returns) would otherwise always pay for that.
            for key in names[r % 4:] + names[:r % 4]:
                runs[key].append(timed(calls[key]))
        med = {key: statistics.median(t) * 1e3 for key, t in runs.items()}
        rows.append(dict(causal=causal, n=a.n, heads=a.heads, d=a.d, threads=a.threads, method=a.method,
                         **{f"{key}_ms": round(t, 1) for key, t in med.items()},
                         strided_over_contiguous=round(med["strided"] / med["contiguous"], 3),
                         strided_over_copy_then_call=round(med["strided"] / med["copy_then_call"], 3),
                         strided_over_sdpa=round(med["strided"] / med["sdpa"], 3)))
    print(json.dumps(rows, indent=1))


CHILD = r"""
import sys, torch, numattn.torch as nt
n, nq, h, d, threads = (int(x) for x in sys.argv[1:6])
dtype = sys.argv[6]
dt = getattr(torch, dtype)
# Made in their own dtype (no float32 temporaries whose freed pages the call could reuse).
q = torch.empty(1, h, nq, d, dtype=dt).normal_()
k, v = (torch.empty(1, h, n, d, dtype=dt).normal_() for _ in range(2))
out = torch.zeros(1, h, nq, d, dtype=dt)  # the result itself (touched) is not growth
# One call of the same kind on a slice first: libraries, thread pools and BLAS buffers load once.
s = min(nq, 512)
nt.attention(q[..., :s, :], k[..., :512, :], v[..., :512, :], causal="bottom-right", threads=threads,
             out=out[..., :s, :])
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
before = hwm()
nt.attention(q, k, v, causal="bottom-right", threads=threads, out=out)
print(before, hwm(), k.numel() * k.element_size() * 2)
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
        for label, nq in (("prefill", a.n), ("decode", 1)):
            p = subprocess.run([sys.executable, "-c", CHILD, str(a.n), str(nq), str(a.heads), str(a.d),
                                str(a.threads), name], capture_output=True, text=True, check=True)
            before, after, kv_bytes = map(int, p.stdout.split())
            row[label] = dict(nq=nq, nk=a.n, kv_bytes=kv_bytes, peak_growth_bytes=after - before,
                              peak_growth_over_kv=round((after - before) / kv_bytes, 4))
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
