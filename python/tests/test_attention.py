"""numattn.attention / reference / error against an independent NumPy float64 oracle, strided and
BNHD inputs, out=, LSE, and the errors bad input gets."""

import numpy as np
import pytest

import numattn
from conftest import exact_tolerance, qkv, softmax_attention_f64


@pytest.mark.parametrize(
    "shape,causal",
    [
        (dict(b=1, hq=4, hkv=2, nq=37, nk=37, d=16), "top-left"),
        (dict(b=2, hq=3, hkv=1, nq=5, nk=17, d=3, dv=7), "bottom-right"),
        (dict(b=1, hq=2, hkv=2, nq=1, nk=64, d=59), "none"),
        (dict(b=1, hq=1, hkv=1, nq=17, nk=2, d=1), "top-left"),
    ],
)
def test_reference_and_flash_match_numpy_oracle(shape, causal):
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, **shape)
    want, want_lse = softmax_attention_f64(q, k, v, causal=causal)
    ref, ref_lse = numattn.reference(q, k, v, causal=causal, return_lse=True)
    assert ref.dtype == np.float64 and ref.shape == want.shape
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ref_lse, want_lse, rtol=1e-12, atol=1e-13)

    out, lse = numattn.attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == np.float32 and out.shape == want.shape and lse.shape == want_lse.shape
    m = numattn.error(out, ref, approx_lse=lse, exact_lse=ref_lse)
    tol = exact_tolerance(q, k)
    assert m["finite"] and m["rows_checked"] == np.prod(want.shape[:-1])
    assert m["rel_fro_error"] <= tol["rel_fro_error"]
    assert m["max_scaled_error"] <= tol["max_scaled_error"]
    assert m["lse_max_abs_error"] <= tol["max_scaled_error"]
    # the metrics are the documented formulas
    np.testing.assert_allclose(
        m["rel_fro_error"], np.linalg.norm(out - ref) / np.linalg.norm(ref), rtol=1e-12)
    np.testing.assert_allclose(m["max_abs_error"], np.abs(out - ref).max(), rtol=1e-12)


def test_masks_window_scale_and_empty_rows():
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng, hq=2, hkv=2, nq=9, nk=9, d=8)
    bmask = rng.random((9, 9)) < 0.6
    bmask[3, :] = False  # a row with no visible key: output 0, LSE -inf
    out, lse = numattn.attention(q, k, v, mask=bmask, return_lse=True)
    want, want_lse = softmax_attention_f64(q, k, v, mask=bmask)
    np.testing.assert_allclose(out, want, atol=2e-6)
    assert np.all(out[:, :, 3] == 0) and np.all(np.isneginf(lse[:, :, 3]))
    assert np.isneginf(want_lse[0, 0, 3])
    # integer masks are boolean (nonzero = visible)
    np.testing.assert_array_equal(numattn.attention(q, k, v, mask=bmask.astype(np.int64)), out)
    add = np.where(bmask, rng.standard_normal((9, 9)), -np.inf).astype(np.float32)
    out_add = numattn.attention(q, k, v, mask=add, scale=0.3)
    np.testing.assert_allclose(out_add, softmax_attention_f64(q, k, v, mask=add, scale=0.3)[0], atol=2e-6)
    # window (2, 0) on a causal diagonal == a banded boolean mask
    band = np.tril(np.ones((9, 9), bool)) & ~np.tril(np.ones((9, 9), bool), k=-3)
    np.testing.assert_allclose(numattn.attention(q, k, v, causal=True, window=(2, 0)),
                               softmax_attention_f64(q, k, v, mask=band)[0], atol=2e-6)


def test_layouts_strides_dtypes_are_the_same_computation():
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, b=2, hq=4, hkv=2, nq=33, nk=40, d=24)
    base = numattn.attention(q, k, v, causal="bottom-right")
    # BNHD memory order, read in place through permuted strides
    qb, kb, vb = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    out_b = numattn.attention(qb, kb, vb, causal="bottom-right", layout="bnhd")
    assert out_b.shape == (2, 33, 4, 24)
    np.testing.assert_array_equal(out_b.transpose(0, 2, 1, 3), base)
    # a transposed view (no copy) in bhnd is the same as its contiguous copy
    np.testing.assert_array_equal(
        numattn.attention(qb.transpose(0, 2, 1, 3), kb.transpose(0, 2, 1, 3), vb.transpose(0, 2, 1, 3),
                          causal="bottom-right"), base)
    # strided along N and D-rows: every other token of a larger buffer
    big = rng.standard_normal((2, 4, 66, 24)).astype(np.float32)
    qs = big[:, :, ::2, :]
    assert not qs.flags.c_contiguous
    np.testing.assert_array_equal(numattn.attention(qs, k, v), numattn.attention(np.ascontiguousarray(qs), k, v))
    # float64 inputs are converted once to float32: same bits as converting first
    q64, k64, v64 = (x.astype(np.float64) + 1e-9 for x in (q, k, v))
    np.testing.assert_array_equal(
        numattn.attention(q64, k64, v64),
        numattn.attention(q64.astype(np.float32), k64.astype(np.float32), v64.astype(np.float32)))
    # 2-d and 3-d arrays get leading 1s
    out3 = numattn.attention(q[0], k[0], v[0])
    np.testing.assert_array_equal(out3, base_nc := numattn.attention(q[:1], k[:1], v[:1])[0])
    out2 = numattn.attention(q[0, 0], k[0, 0], v[0, 0])
    assert out2.shape == (33, 24)
    del base_nc


def test_strided_kv_pack_into_a_kept_scratch_block():
    # [B, N, H, D] memory read as [B, H, N, D]: exact.flash packs the strided K/V rows into one
    # block (kept for the next call) and runs the contiguous kernels on it: the same bits.
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, b=1, hq=4, hkv=2, nq=300, nk=300, d=32)
    qb, kb, vb = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    numattn.release_scratch_memory()
    got = numattn.attention(qb.transpose(0, 2, 1, 3), kb.transpose(0, 2, 1, 3), vb.transpose(0, 2, 1, 3),
                            causal="top-left", threads=2)
    np.testing.assert_array_equal(got, numattn.attention(q, k, v, causal="top-left", threads=2))
    kept = numattn.release_scratch_memory()
    assert kept >= 2 * 300 * 2 * 32 * 4  # K and V of both kv heads in float32
    assert numattn.release_scratch_memory() == 0


def test_out_argument_and_threads():
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng, hq=2, hkv=2, nq=20, nk=20, d=8)
    want = numattn.attention(q, k, v, threads=1)
    buf = np.full((1, 2, 20, 16), np.nan, dtype=np.float32)
    view = buf[..., :8]  # strided output
    ret = numattn.attention(q, k, v, out=view, threads=3)
    assert ret is view or np.shares_memory(ret, buf)
    np.testing.assert_array_equal(view, want)
    assert np.all(np.isnan(buf[..., 8:]))
    with pytest.raises(numattn.OptionError, match="shape") as e:
        numattn.attention(q, k, v, out=np.zeros((1, 2, 20, 7), np.float32))
    assert e.value.option == "out"
    with pytest.raises(numattn.OptionError, match="overlap"):
        numattn.attention(q, k, v, out=q)
    with pytest.raises(TypeError):
        numattn.attention(q, k, v, out=np.zeros((1, 2, 20, 8), np.float64))
    with pytest.raises(numattn.Error, match="thread"):
        numattn.attention(q, k, v, threads=-1)


def test_bad_input_raises_clear_errors():
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, hq=2, hkv=2, nq=8, nk=8, d=4)
    with pytest.raises(TypeError, match="int32"):
        numattn.attention(q.astype(np.int32), k, v)
    with pytest.raises(TypeError, match="float16"):
        numattn.reference(q.astype(np.float16), k, v)
    with pytest.raises(TypeError, match="int64"):
        numattn.attention(q, k.astype(np.int64), v)
    with pytest.raises(ValueError, match="2-, 3- or 4-d"):
        numattn.attention(q[None], k, v)
    with pytest.raises(ValueError, match="contiguous"):
        numattn.attention(np.asfortranarray(q), k, v)
    with pytest.raises(ValueError, match="contiguous"):
        numattn.attention(q, k, v[..., ::2])
    with pytest.raises(numattn.Error, match="Dk"):
        numattn.attention(q, k[..., :3], v)
    with pytest.raises(numattn.Error, match="multiple of kv heads"):
        numattn.attention(np.concatenate([q, q[:, :1]], axis=1), k, v)
    with pytest.raises(numattn.OptionError, match="exact.nope") as e:
        numattn.attention(q, k, v, method="exact.nope")
    assert e.value.option == "method" and isinstance(e.value, ValueError)
    with pytest.raises(numattn.OptionError, match="causal"):
        numattn.attention(q, k, v, causal="diagonal")
    with pytest.raises(numattn.OptionError, match="layout"):
        numattn.attention(q, k, v, layout="nhd")
    with pytest.raises(numattn.OptionError, match="mask"):
        numattn.attention(q, k, v, mask=np.ones((8, 7), bool))
    with pytest.raises(numattn.OptionError, match="broadcast"):
        numattn.attention(q, k, v, mask=np.ones((3, 8, 8), bool))
    with pytest.raises(TypeError):
        numattn.attention([[1.0]], k, v)


def test_non_finite_input_is_named_in_callers_coordinates():
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, b=1, hq=2, hkv=2, nq=6, nk=6, d=4)
    kb = np.ascontiguousarray(k.transpose(0, 2, 1, 3))  # [B, N, H, D]
    kb[0, 4, 1, 2] = np.nan
    qb, vb = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, v))
    with pytest.raises(numattn.NonFiniteInputError) as e:
        numattn.attention(qb, kb, vb, layout="bnhd")
    assert e.value.tensor == "k" and e.value.index == (0, 4, 1, 2)
    assert "element [0, 4, 1, 2]" in str(e.value)
    k3 = k[0].copy()
    k3[1, 2, 3] = np.inf
    with pytest.raises(numattn.NonFiniteInputError) as e:
        numattn.reference(q[0], k3, v[0])
    assert e.value.tensor == "k" and e.value.index == (1, 2, 3)


def test_error_metric_arguments():
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="float32"):
        numattn.error(a.astype(np.float64), a)
    with pytest.raises(numattn.Error, match="differs"):
        numattn.error(a, np.zeros((3, 5)))
    m = numattn.error(a, np.zeros((3, 4)))
    assert m["rel_fro_error"] == 0 and m["lse_max_abs_error"] is None


def test_catalogue_and_every_method_runs_or_refuses():
    cat = numattn.methods()
    names = [m["name"] for m in cat]
    assert "exact.flash" in names and "exact.reference" in names and len(set(names)) == len(names)
    for m in cat:
        assert m["spec"].startswith(m["name"]) and m["citation"] and m["time_complexity"]
        assert numattn.canonical_spec(m["spec"]) == m["spec"]
        assert set(m["capabilities"]) >= {"exact", "causal", "lse", "randomized"}
    rng = np.random.default_rng(7)
    q, k, v = qkv(rng, hq=2, hkv=2, nq=64, nk=64, d=16)
    ref = numattn.reference(q, k, v)
    for m in cat:
        try:
            out = numattn.attention(q, k, v, method=m["spec"])
        except numattn.Error as e:  # a method may refuse a problem, with its reason
            assert str(e)
            continue
        assert out.shape == ref.shape and np.all(np.isfinite(out)), m["name"]
        if m["capabilities"]["exact"]:
            assert numattn.error(out, ref)["rel_fro_error"] <= exact_tolerance(q, k)["rel_fro_error"], m["name"]


def test_reference_is_interruptible():
    """Ctrl-C (simulated by _thread.interrupt_main) stops a long float64 reference between row
    chunks with KeyboardInterrupt. Were it not honoured, the call would run to its end (many
    seconds) and then fail the test, since it returned instead of raising."""
    import _thread
    import threading

    rng = np.random.default_rng(8)
    q, k, v = qkv(rng, hq=8, hkv=8, nq=2048, nk=4096, d=64)
    timer = threading.Timer(0.05, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            numattn.reference(q, k, v, threads=2)
    finally:
        timer.cancel()


def test_error_metrics_of_bnhd_results():
    rng = np.random.default_rng(9)
    q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in qkv(rng, hq=3, hkv=3, nq=7, nk=7, d=4))
    out, lse = numattn.attention(q, k, v, layout="bnhd", return_lse=True)
    ref, ref_lse = numattn.reference(q, k, v, layout="bnhd", return_lse=True)
    assert out.shape == (1, 7, 3, 4) and lse.shape == (1, 3, 7)
    # metrics are elementwise (rows of Dv) and LSEs pairwise, so the layout does not matter
    m = numattn.error(out, ref, approx_lse=lse, exact_lse=ref_lse)
    assert m["lse_max_abs_error"] < 1e-5 and m["rel_fro_error"] < 1e-5
    shifted = ref_lse.copy()
    shifted[0, 1, 2] += 1.0
    assert abs(numattn.error(out, ref, approx_lse=lse, exact_lse=shifted)["lse_max_abs_error"] - 1.0) < 1e-5
