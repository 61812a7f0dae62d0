"""No copies of float32 inputs (peak RSS of a fresh process), DLPack in and out."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numattn
from conftest import qkv

# A fresh interpreter, whose VmHWM (peak resident memory of its own address space; ru_maxrss
# would carry the forking parent's peak across exec) starts below what the call could add. K and V
# are 64 MiB each, strided (one head of a BNHD buffer of two); the output is tiny. A copy of
# either input would raise the peak by >= 64 MiB.
PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    import numattn
    dtype = np.dtype(sys.argv[1])
    nk, d = 1 << 18, 64
    buf_k = np.ones((1, nk, 2, d), dtype)
    buf_v = np.ones((1, nk, 2, d), dtype)
    k, v = buf_k[:, :, :1, :], buf_v[:, :, :1, :]       # [B, N, H=1, D] views, not contiguous
    q = np.ones((1, 4, 1, d), dtype)
    assert not k.flags.c_contiguous
    def hwm_kib():
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])
    before = hwm_kib()
    out = numattn.attention(q, k, v, layout="bnhd", threads=2)
    after = hwm_kib()
    assert np.allclose(out, 1.0)
    print((after - before) / 1024.0)   # MiB
""")


@pytest.fixture(autouse=True)
def _linux_only():
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc/self/status (Linux)")


def peak_growth_mib(dtype):
    p = subprocess.run([sys.executable, "-c", PROBE, dtype], capture_output=True, text=True,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return float(p.stdout.strip())


def test_float32_inputs_are_not_copied():
    assert peak_growth_mib("float32") < 16.0
    # the probe sees copies: float64 inputs are converted (K and V: 2 × 64 MiB of float32)
    assert peak_growth_mib("float64") > 100.0


class DLPackOnly:
    """An object that offers only the DLPack protocol (like a tensor of another framework)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_round_trip_with_numpy():
    rng = np.random.default_rng(30)
    q, k, v = qkv(rng, hq=2, hkv=2, nq=16, nk=16, d=8)
    want = numattn.attention(q, k, v)
    got = numattn.attention(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v))
    np.testing.assert_array_equal(got, want)
    back = np.from_dlpack(got)  # the result exports DLPack without a copy
    assert np.shares_memory(back, got)


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(31)
    q, k, v = qkv(rng, hq=2, hkv=2, nq=16, nk=16, d=8)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    out = numattn.attention(tq, tk, tv, causal=True)
    t = torch.from_dlpack(out)
    assert t.data_ptr() == out.__array_interface__["data"][0]
    ref = torch.nn.functional.scaled_dot_product_attention(
        tq.double(), tk.double(), tv.double(), is_causal=True)
    np.testing.assert_allclose(out, ref.numpy(), atol=2e-6)
    # a transposed torch view (BNHD memory seen as BHND) is read in place too
    tb = torch.from_numpy(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).transpose(1, 2)
    np.testing.assert_array_equal(numattn.attention(tb, tk, tv, causal=True), out)
