"""Fixtures of the numattn pytest suite.

Run from ctest (python_pytest: PYTHONPATH points at the build tree's package, NUMATTN_CLI at the
CLI) or by hand after `pip install .` (then set NUMATTN_CLI=build/bin/numattn for the CLI
comparisons, which skip without it).
"""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import numattn


@pytest.fixture(scope="session")
def cli():
    """Path of the numattn CLI, or skip."""
    path = os.environ.get("NUMATTN_CLI") or shutil.which("numattn")
    if not path or not os.path.exists(path):
        pytest.skip("the numattn CLI is not available (set NUMATTN_CLI)")
    return path


@pytest.fixture(scope="session")
def run_cli(cli):
    """Runs `numattn ARGS...`; returns parsed JSON stdout when --format json is given."""

    def run(*args):
        # The CLI re-executes itself with OPENBLAS_CORETYPE when OpenBLAS fell back to generic
        # kernels; this process cannot (blas_info): keep the CLI on the same kernels as us.
        env = dict(os.environ, NUMATTN_KEEP_BLAS_CORE="1")
        p = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise AssertionError(f"numattn {' '.join(map(str, args))} failed:\n{p.stderr}")
        return json.loads(p.stdout) if "json" in args else p.stdout

    return run


def _default_model_or_none():
    try:
        return numattn.default_model_path()
    except numattn.Error:
        return None


@pytest.fixture(scope="session")
def model():
    """The default model (SmolLM2-135M), loaded once; skips when it is not cached."""
    if _default_model_or_none() is None:
        pytest.skip("default model not cached (scripts/fetch_data.sh)")
    return numattn.Model.load("default", threads=2)


@pytest.fixture(scope="session")
def short_text(tmp_path_factory):
    """The first ~12 kB of the default text, as a string and as a file (for the CLI)."""
    try:
        path = numattn.default_text_path()
    except numattn.Error:
        pytest.skip("default text not cached (scripts/fetch_data.sh)")
    with open(path, encoding="utf-8") as f:
        text = f.read(12000)
    p = tmp_path_factory.mktemp("text") / "short.txt"
    p.write_text(text, encoding="utf-8")
    return text, str(p)


def qkv(rng, b=1, hq=4, hkv=2, nq=37, nk=37, d=16, dv=None, dtype=np.float32, scale=1.0):
    """Random Gaussian q [b,hq,nq,d], k [b,hkv,nk,d], v [b,hkv,nk,dv]."""
    dv = d if dv is None else dv
    q = (rng.standard_normal((b, hq, nq, d)) * scale).astype(dtype)
    k = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, nk, dv)).astype(dtype)
    return q, k, v


def softmax_attention_f64(q, k, v, causal=None, mask=None, scale=None):
    """Independent NumPy float64 softmax attention of [B,H,N,D] arrays (the oracle's oracle)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = (1.0 / np.sqrt(d) if scale is None else scale) * np.einsum("bhid,bhjd->bhij", q, k)
    visible = np.ones((nq, nk), dtype=bool)
    if causal == "top-left":
        visible = np.tril(visible)
    elif causal == "bottom-right":
        visible = np.tril(visible, k=nk - nq)
    if mask is not None:
        if mask.dtype == bool:
            visible &= mask
        else:
            s = s + mask.astype(np.float64)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(s - m)
    den = w.sum(axis=-1, keepdims=True)
    out = np.einsum("bhij,bhjd->bhid", w / np.where(den > 0, den, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = (np.log(den) + m)[..., 0]
    return out, lse


def exact_tolerance(q, k, scale=None):
    """docs/numerics.md's bounds for an exact float32 method, with L bounded from above by the
    largest |scale|·Σ_d|q_d k_d| over all query-key pairs."""
    q64 = np.abs(np.asarray(q, dtype=np.float64))
    k64 = np.abs(np.asarray(k, dtype=np.float64))
    d = q64.shape[-1]
    s = 1.0 / np.sqrt(d) if scale is None else abs(scale)
    L = s * (q64.reshape(-1, d) @ k64.reshape(-1, d).T).max()
    eps = 2.0 ** -23
    return {"rel_fro_error": 1e-5 * (1 + L / 10), "max_scaled_error": 64 * eps * (1 + L)}
