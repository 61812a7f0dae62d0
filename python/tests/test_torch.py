"""numattn.torch.attention against torch.nn.functional.scaled_dot_product_attention (skipped without
torch): masks (bool, additive, broadcast over batch and heads), GQA, both causal alignments,
dtypes, layouts, and the forward-only rule. The oracle is SDPA in float64 on the same (rounded)
inputs; tolerances are docs/numerics.md's for exact float32 methods, plus one rounding of the
output for float16/bfloat16 results."""

import subprocess
import sys

import numpy as np
import pytest

import numattn

torch = pytest.importorskip("torch")
nt = pytest.importorskip("numattn.torch")
F = torch.nn.functional

from conftest import exact_tolerance  # noqa: E402


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def sdpa64(q, k, v, **kw):
    m = kw.pop("attn_mask", None)
    if m is not None and m.dtype != torch.bool:
        m = m.double()
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, **kw)


# Output rounding of a half-precision result: half an ulp at 1, relative.
ROUND = {torch.float32: 0.0, torch.float64: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def check(out, ref, q, k, scale=None):
    assert out.dtype == q.dtype
    assert out.shape == ref.shape
    tol = exact_tolerance(q.float().numpy(), k.float().numpy(), scale)
    o, r = out.double(), ref.double()
    bound = tol["max_scaled_error"] + ROUND[out.dtype] * 1.01
    err = ((o - r).abs() / r.abs().clamp(min=1.0)).max().item()
    assert err <= bound, (err, bound)
    if ROUND[out.dtype] == 0.0:
        rel = ((o - r).norm() / r.norm()).item()
        assert rel <= tol["rel_fro_error"], (rel, tol["rel_fro_error"])


def test_import_numattn_does_not_import_torch():
    code = "import sys, numattn; assert 'torch' not in sys.modules, 'torch imported'"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa_dtypes(dtype, causal):
    q, k, v = rand(2, 4, 37, 16, dtype=dtype, seed=1), rand(2, 4, 37, 16, dtype=dtype, seed=2), \
        rand(2, 4, 37, 16, dtype=dtype, seed=3)
    out = nt.attention(q, k, v, is_causal=causal)
    check(out, sdpa64(q, k, v, is_causal=causal), q, k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nq", [1, 45])
def test_half_result_is_the_float32_result_rounded_once(dtype, nq):
    # Half-precision values are float32 values: the half path computes what the float32 path
    # computes on the same (rounded) inputs, and rounds its output once.
    q, k, v = rand(2, 4, nq, 32, dtype=dtype, seed=30), rand(2, 2, 45, 32, dtype=dtype, seed=31), \
        rand(2, 2, 45, 32, dtype=dtype, seed=32)
    o16 = nt.attention(q, k, v, causal="bottom-right", enable_gqa=True)
    o32 = nt.attention(q.float(), k.float(), v.float(), causal="bottom-right", enable_gqa=True)
    assert o16.dtype == dtype and torch.equal(o16, o32.to(dtype))


@pytest.mark.parametrize("nq,nk", [(5, 40), (40, 23), (1, 17)])
def test_is_causal_is_top_left_as_sdpa(nq, nk):
    q, k, v = rand(1, 3, nq, 8, seed=4), rand(1, 3, nk, 8, seed=5), rand(1, 3, nk, 8, seed=6)
    check(nt.attention(q, k, v, is_causal=True), sdpa64(q, k, v, is_causal=True), q, k)


@pytest.mark.parametrize("nq,nk", [(5, 40), (1, 17), (23, 23)])
def test_bottom_right_is_the_kv_cache_rule(nq, nk):
    q, k, v = rand(1, 3, nq, 8, seed=7), rand(1, 3, nk, 8, seed=8), rand(1, 3, nk, 8, seed=9)
    visible = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    check(nt.attention(q, k, v, causal="bottom-right"), sdpa64(q, k, v, attn_mask=visible), q, k)
    # ... and combined with a mask.
    m = torch.rand(nq, nk, generator=torch.Generator().manual_seed(1)) > 0.3
    m[:, 0] = True
    check(nt.attention(q, k, v, attn_mask=m, causal="bottom-right"), sdpa64(q, k, v, attn_mask=m & visible), q, k)


MASK_SHAPES = [(9, 30), (1, 9, 30), (3, 1, 9, 30), (1, 4, 9, 30), (3, 4, 9, 30), (3, 1, 1, 30), (4, 1, 30)]


@pytest.mark.parametrize("shape", MASK_SHAPES)
@pytest.mark.parametrize("kind", ["bool", "additive", "int"])
def test_broadcast_masks(shape, kind):
    q, k, v = rand(3, 4, 9, 16, seed=10), rand(3, 4, 30, 16, seed=11), rand(3, 4, 30, 16, seed=12)
    g = torch.Generator().manual_seed(sum(shape))
    if kind == "additive":  # an ALiBi-like bias with -inf holes
        m = torch.randn(*shape, generator=g) * 2
        m = m.masked_fill(torch.rand(*shape, generator=g) < 0.2, float("-inf"))
        m[..., 0] = 0.0
        ref_mask = m
    else:
        m = torch.rand(*shape, generator=g) > 0.4
        m[..., 0] = True
        ref_mask = m
        if kind == "int":
            m = m.to(torch.int32)
    check(nt.attention(q, k, v, attn_mask=m), sdpa64(q, k, v, attn_mask=ref_mask), q, k)


def test_expanded_mask_is_read_in_place_and_per_head_masks_with_gqa():
    # transformers' padding mask: [B, 1, Nq, Nk] expanded from [B, 1, 1, Nk] (strides 0).
    q, k, v = rand(2, 6, 7, 16, seed=13), rand(2, 2, 19, 16, seed=14), rand(2, 2, 19, 16, seed=15)
    pad = torch.ones(2, 19, dtype=torch.bool)
    pad[1, :5] = False
    m = pad[:, None, None, :].expand(2, 1, 7, 19)
    ref = sdpa64(q, k, v, attn_mask=m, enable_gqa=True)
    check(nt.attention(q, k, v, attn_mask=m, enable_gqa=True), ref, q, k)
    # A different mask per query head (h reads kv head h // 3).
    ph = torch.rand(1, 6, 7, 19, generator=torch.Generator().manual_seed(3)) > 0.5
    ph[..., 3] = True
    check(nt.attention(q, k, v, attn_mask=ph, enable_gqa=True),
          sdpa64(q, k, v, attn_mask=ph, enable_gqa=True), q, k)


def test_fully_masked_row_gives_zero():
    q, k, v = rand(1, 2, 4, 8, seed=16), rand(1, 2, 6, 8, seed=17), rand(1, 2, 6, 8, seed=18)
    m = torch.ones(2, 4, 6, dtype=torch.bool)
    m[1, 2] = False  # head 1, row 2 sees nothing
    out, lse = nt.attention(q, k, v, attn_mask=m, return_lse=True)
    assert torch.all(out[0, 1, 2] == 0) and lse[0, 1, 2] == float("-inf")
    keep = m.clone()
    keep[1, 2] = True
    ref = sdpa64(q, k, v, attn_mask=keep)
    ref[0, 1, 2] = 0
    check(out, ref, q, k)


def test_gqa_needs_enable_gqa():
    q, k, v = rand(1, 8, 5, 16), rand(1, 2, 5, 16), rand(1, 2, 5, 16)
    with pytest.raises(ValueError, match="enable_gqa"):
        nt.attention(q, k, v)
    check(nt.attention(q, k, v, enable_gqa=True), sdpa64(q, k, v, enable_gqa=True), q, k)


def test_layouts_views_and_out_layout():
    # [B, N, H, D] memory, as transformers holds activations.
    qm, km, vm = rand(2, 33, 4, 16, seed=19), rand(2, 33, 2, 16, seed=20), rand(2, 33, 2, 24, seed=21)
    q, k, v = (x.transpose(1, 2) for x in (qm, km, vm))  # [B, H, N, D] views, not contiguous
    ref = sdpa64(q, k, v, is_causal=True, enable_gqa=True)
    check(nt.attention(q, k, v, is_causal=True, enable_gqa=True), ref, q, k)
    out = nt.attention(qm, km, vm, is_causal=True, enable_gqa=True, layout="bnhd")
    assert out.shape == (2, 33, 4, 24)
    check(out.transpose(1, 2), ref, q, k)
    out = nt.attention(q, k, v, is_causal=True, enable_gqa=True, out_layout="bnhd")
    assert out.shape == (2, 33, 4, 24) and out.is_contiguous()
    check(out.transpose(1, 2), ref, q, k)
    out = nt.attention(qm, km, vm, is_causal=True, enable_gqa=True, layout="bnhd", out_layout="bhnd")
    assert out.shape == (2, 4, 33, 24)
    check(out, ref, q, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_is_written_in_place(dtype):
    q, k, v = rand(1, 2, 9, 8, dtype=dtype), rand(1, 2, 9, 8, dtype=dtype), rand(1, 2, 9, 8, dtype=dtype)
    buf = torch.empty(1, 9, 2, 8, dtype=dtype)
    out = nt.attention(q, k, v, out=buf, out_layout="bnhd")
    assert out is buf
    check(buf.transpose(1, 2), sdpa64(q, k, v), q, k)


def test_lse_and_scale():
    q, k, v = rand(1, 2, 9, 8), rand(1, 2, 11, 8), rand(1, 2, 11, 8)
    out, lse = nt.attention(q, k, v, scale=0.3, return_lse=True)
    check(out, sdpa64(q, k, v, scale=0.3), q, k, scale=0.3)
    ref = torch.logsumexp(0.3 * q.double() @ k.double().transpose(-1, -2), dim=-1)
    assert torch.allclose(lse.double(), ref, atol=1e-5)


def test_forward_only_is_enforced():
    q = rand(1, 2, 5, 8).requires_grad_()
    k, v = rand(1, 2, 5, 8), rand(1, 2, 5, 8)
    with pytest.raises(RuntimeError, match=r"allow_no_grad=True.*\.detach\(\)"):
        nt.attention(q, k, v)
    out = nt.attention(q, k, v, allow_no_grad=True)
    assert not out.requires_grad
    with torch.no_grad():
        nt.attention(q, k, v)


def test_refusals():
    q = rand(1, 2, 5, 8)
    with pytest.raises(ValueError, match="dropout"):
        nt.attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="is_causal"):
        nt.attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(TypeError, match="one dtype"):
        nt.attention(q, q.double(), q)
    with pytest.raises(ValueError, match="broadcast"):
        nt.attention(q, q, q, attn_mask=torch.ones(3, 5, dtype=torch.bool))


def test_threads_follow_torch(monkeypatch):
    seen = []
    real = numattn.attention

    def spy(*a, **kw):
        seen.append(kw["threads"])
        return real(*a, **kw)

    monkeypatch.setattr(numattn, "attention", spy)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        q = rand(1, 2, 5, 8)
        nt.attention(q, q, q)
        nt.attention(q, q, q, threads=2)
    finally:
        torch.set_num_threads(old)
    assert seen == [1, 2]


def test_info_reports_the_method_and_an_error_estimate():
    q, k, v = rand(1, 4, 256, 32, seed=22), rand(1, 4, 256, 32, seed=23), rand(1, 4, 256, 32, seed=24)
    out, info = nt.attention(q, k, v, "sparse.window(left=16,right=0,sinks=2)", causal="bottom-right",
                             return_info=True, estimate_rows=0)
    assert info["method"] == numattn.canonical_spec("sparse.window(left=16,right=0,sinks=2)")
    ref = sdpa64(q, k, v, is_causal=True)
    true = ((out.double() - ref).norm() / ref.norm()).item()
    assert 0 < info["est_rel_error"] <= info["est_rel_error_hi"]
    assert true <= 3 * info["est_rel_error_hi"]
    _, info = nt.attention(q, k, v, "exact.flash", return_info=True)
    assert info["method"] == numattn.canonical_spec("exact.flash") and "est_rel_error" not in info


def test_reference_and_estimate_read_half_precision():
    q, k, v = rand(1, 2, 64, 16, dtype=torch.bfloat16, seed=40), rand(1, 2, 64, 16, dtype=torch.bfloat16, seed=41), \
        rand(1, 2, 64, 16, dtype=torch.bfloat16, seed=42)
    ref = torch.from_numpy(numattn.reference(q, k, v, causal=True))
    assert torch.allclose(ref, sdpa64(q, k, v, is_causal=True), atol=1e-12)
    out, info = nt.attention(q, k, v, is_causal=True, return_info=True, estimate_rows=0)
    # The estimate measures the float32 result before its rounding to bfloat16.
    assert info["est_rel_error_hi"] < 1e-5


def test_numpy_binding_takes_float16_and_out_layout():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 7, 8)).astype(np.float16) for _ in range(3))
    out = numattn.attention(q, k, v, out_layout="bnhd")
    ref = softmax64(q, k, v)
    assert out.dtype == np.float32 and out.shape == (1, 7, 2, 8)
    assert np.abs(out.transpose(0, 2, 1, 3) - ref).max() < 1e-5


def softmax64(q, k, v):
    from conftest import softmax_attention_f64

    return softmax_attention_f64(q, k, v)[0]
