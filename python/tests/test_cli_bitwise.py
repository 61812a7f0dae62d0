"""The same .npy inputs through `numattn run --q/--k/--v ... --out` and numattn.attention give
the same bits (same kernels, same thread count)."""

import numpy as np
import pytest

import numattn
from conftest import qkv


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def run_both(run_cli, tmp_path, q, k, v, method="exact.flash", causal="none", layout="bhnd",
             mask=None, extra=(), lse=True, threads=2):
    paths = {}
    for name, arr in (("q", q), ("k", k), ("v", v), ("mask", mask)):
        if arr is not None:
            paths[name] = tmp_path / f"{name}.npy"
            np.save(paths[name], arr)
    out_p, lse_p = tmp_path / "out.npy", tmp_path / "lse.npy"
    args = ["run", "--method", method, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
            "--causal", causal, "--layout", layout, "--out", out_p, "--threads", threads,
            "--check-rows", 0, "--format", "json", *extra]
    if mask is not None:
        args += ["--mask", paths["mask"]]
    if lse:
        args += ["--lse-out", lse_p]
    else:
        args += ["--no-lse"]
    row = run_cli(*args)
    row = row[0] if isinstance(row, list) else row
    assert row["status"] == "ok"
    kw = dict(method=method, causal=causal, layout=layout, threads=threads, return_lse=lse,
              mask=mask)
    got = numattn.attention(q, k, v, **kw)
    cli_out = np.load(out_p)
    if lse:
        got, got_lse = got
        np.testing.assert_array_equal(bits(got_lse).reshape(-1), bits(np.load(lse_p)).reshape(-1))
    assert got.size == cli_out.size
    np.testing.assert_array_equal(bits(got).reshape(-1), bits(cli_out).reshape(-1))
    return got


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_exact_flash_bit_for_bit(run_cli, tmp_path, layout):
    rng = np.random.default_rng(10)
    q, k, v = qkv(rng, b=2, hq=6, hkv=2, nq=131, nk=131, d=64)
    if layout == "bnhd":
        q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    run_both(run_cli, tmp_path, q, k, v, causal="top-left", layout=layout)


def test_decode_shape_mask_and_no_lse(run_cli, tmp_path):
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, b=1, hq=4, hkv=1, nq=3, nk=300, d=32)
    run_both(run_cli, tmp_path, q, k, v, causal="bottom-right", lse=False)
    add = rng.standard_normal((3, 300)).astype(np.float32)
    run_both(run_cli, tmp_path, q, k, v, mask=add)


def test_approximate_methods_bit_for_bit(run_cli, tmp_path):
    """Deterministic and seeded approximate methods: same spec, same inputs, same bits."""
    rng = np.random.default_rng(12)
    q, k, v = qkv(rng, b=1, hq=2, hkv=2, nq=96, nk=96, d=16)
    names = {m["name"]: m for m in numattn.methods()}
    tried = 0
    for name in ("exact.naive", "lowrank.nystrom", "kernel.performer", "sparse.window"):
        if name not in names:
            continue
        run_both(run_cli, tmp_path, q, k, v, method=names[name]["spec"],
                 lse=names[name]["capabilities"]["lse"])
        tried += 1
    assert tried >= 2
