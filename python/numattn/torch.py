"""numattn.torch: numattn's attention methods on PyTorch tensors, with SDPA's arguments.

Importable only where PyTorch is installed (``import numattn`` never imports torch).
``attention(query, key, value, method=SPEC, attn_mask=None, dropout_p=0.0, is_causal=False,
scale=None, enable_gqa=False)`` computes what ``torch.nn.functional.scaled_dot_product_attention``
computes, through any numattn method (``numattn.methods()``), and returns a torch tensor:

- tensors reach the C++ kernels through DLPack without a copy (float32 read in place, strided
  views included; float16/bfloat16 K and V read in place by the flash-based methods);
- the result is a torch tensor of the input dtype, in the input's layout or ``out_layout``,
  written in place when float32 (a torch tensor allocated here, or ``out=``, is handed to the
  kernels as their output);
- numattn is forward-only: no autograd graph is recorded. A tensor that requires grad (while grad
  mode is on) is refused unless ``allow_no_grad=True`` says that a result without gradient is
  what the caller wants;
- the thread count follows ``torch.get_num_threads()`` unless ``threads`` is given.

Cost and error: the method's (``numattn.methods()``; docs/numerics.md); the exact methods equal
SDPA's float32 math to float32 rounding.
"""

import torch as _torch

import numattn as _na

__all__ = ["attention"]

_CAUSAL = {"none": "none", "top-left": "top-left", "top_left": "top-left", "bottom-right": "bottom-right",
           "bottom_right": "bottom-right"}


def _check_grad(fn, allow_no_grad, tensors):
    if allow_no_grad or not _torch.is_grad_enabled():
        return
    for name, t in tensors:
        if t is not None and t.requires_grad:
            raise RuntimeError(
                f"{fn}: {name} requires grad, but numattn is forward-only: its result carries no "
                f"gradient. Pass allow_no_grad=True to accept that, call it under torch.no_grad(), or "
                f"pass {name}.detach()")


def _swap_middle(shape):
    """[.., H, N, D] <-> [.., N, H, D]: the two axes before the last."""
    s = list(shape)
    if len(s) >= 3:
        s[-3], s[-2] = s[-2], s[-3]
    return s


def attention(query, key, value, method="exact.flash", attn_mask=None, dropout_p=0.0, is_causal=False,
              scale=None, enable_gqa=False, *, causal=None, layout="bhnd", out_layout=None, out=None,
              threads=None, return_lse=False, allow_no_grad=False, return_info=False, estimate_rows=None):
    """Scaled dot-product attention through a numattn method, on torch tensors.

    query [B, Hq, Nq, Dk], key [B, Hkv, Nk, Dk], value [B, Hkv, Nk, Dv] (``layout="bnhd"``:
    [B, N, H, D], as Hugging Face and FlashAttention hold activations; 2- and 3-d tensors get
    leading 1s), CPU tensors of one dtype: float32, float64 (computed in float32), float16 or
    bfloat16 (computed in float32, the output rounded once).

    As SDPA: ``attn_mask`` is bool (True = attend) or additive float, broadcastable to
    [B, Hq, Nq, Nk]; ``is_causal=True`` is SDPA's top-left alignment (query i sees keys j <= i,
    also when Nq != Nk) and may not be combined with ``attn_mask``; ``scale`` defaults to
    1/sqrt(Dk); Hq != Hkv needs ``enable_gqa=True`` (query head h reads kv head h // (Hq // Hkv));
    ``dropout_p`` must be 0 (numattn has no dropout). Unlike SDPA, a row with no visible key gives
    0 (and LSE -inf), not NaN.

    Beyond SDPA: ``causal="bottom-right"`` (query i sees keys j <= i + Nk - Nq: a decode step or
    a chunk of prefill against a KV cache; ``"top-left"`` is ``is_causal=True``) may be combined
    with a mask; ``method`` any numattn spec; ``out_layout`` ("bhnd"/"bnhd", default ``layout``)
    the output's memory order; ``out=`` a tensor to write (shape of the result, any dtype numattn
    writes: float32/float16/bfloat16); ``threads`` (default ``torch.get_num_threads()``);
    ``return_lse=True`` also returns the log-sum-exp [B, Hq, Nq] (float32); ``return_info=True``
    also returns a dict with the method that ran (``auto(tol=E)``: the one it chose) and, with
    ``estimate_rows`` (0 = automatic), the a-posteriori error estimate ``est_rel_error`` /
    ``est_rel_error_hi`` (see ``numattn.attention``).

    Returns the output tensor, then the LSE and the info dict when asked for, as a tuple.
    """
    fn = "numattn.torch.attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, _torch.Tensor):
            raise TypeError(f"{fn}: {name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise TypeError(f"{fn}: {name}: is on {t.device}; numattn computes on the CPU: pass {name}.cpu()")
    if attn_mask is not None and not isinstance(attn_mask, _torch.Tensor):
        raise TypeError(f"{fn}: attn_mask: expected a torch.Tensor or None, got {type(attn_mask).__name__}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"{fn}: query, key and value must have one dtype (as SDPA), got {query.dtype}, "
                        f"{key.dtype}, {value.dtype}")
    if query.dtype not in (_torch.float32, _torch.float64, _torch.float16, _torch.bfloat16):
        raise TypeError(f"{fn}: dtype {query.dtype} is not supported: float32, float64, float16 or bfloat16")
    if dropout_p != 0.0:
        raise _na.OptionError(f"{fn}: dropout_p: numattn has no dropout; pass 0.0 (got {dropout_p})")
    _check_grad(fn, allow_no_grad, (("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask)))
    if causal is None:
        causal = "top-left" if is_causal else "none"
        if is_causal and attn_mask is not None:
            raise _na.OptionError(f"{fn}: is_causal=True and attn_mask both given (SDPA refuses them too): put "
                                  f"the causal rule in the mask, or pass causal='top-left'/'bottom-right' with it")
    else:
        if is_causal:
            raise _na.OptionError(f"{fn}: causal={causal!r} and is_causal=True both given: pass one")
        if causal is True or causal is False:
            causal = "top-left" if causal else "none"
        if causal not in _CAUSAL:
            raise _na.OptionError(f"{fn}: causal: expected 'none', 'top-left' or 'bottom-right', got {causal!r}")
        causal = _CAUSAL[causal]
    if query.dim() < 2 or query.dim() > 4:
        raise _na.OptionError(f"{fn}: query: expected 2 to 4 dims, got shape {tuple(query.shape)}")
    lay = layout.lower() if isinstance(layout, str) else layout
    olay = lay if out_layout is None else (out_layout.lower() if isinstance(out_layout, str) else out_layout)
    if lay not in ("bhnd", "bnhd") or olay not in ("bhnd", "bnhd"):
        raise _na.OptionError(f"{fn}: layout and out_layout: 'bhnd' or 'bnhd', got {layout!r}, {out_layout!r}")
    if query.dim() >= 3 and key.dim() >= 3:
        hq = query.shape[-3] if lay == "bhnd" else query.shape[-2]
        hkv = key.shape[-3] if lay == "bhnd" else key.shape[-2]
        if hq != hkv and not enable_gqa:
            raise _na.OptionError(f"{fn}: query has {hq} heads and key {hkv}: grouped-query attention needs "
                                  f"enable_gqa=True (as SDPA)")
    if threads is None:
        threads = _torch.get_num_threads()

    # The result: shaped like query with Dv last, in out_layout; float32/f16/bf16 results are
    # written by the kernels in place, float64 (computed in float32) is converted after.
    oshape = list(query.shape[:-1]) + [value.shape[-1]]
    if olay != lay:
        oshape = _swap_middle(oshape)
    result_dtype = query.dtype
    if out is not None:
        if not isinstance(out, _torch.Tensor) or out.device.type != "cpu":
            raise TypeError(f"{fn}: out: expected a CPU torch.Tensor")
        if list(out.shape) != oshape:
            raise _na.OptionError(f"{fn}: out: must have shape {oshape}, got {list(out.shape)}")
        target = out
    else:
        target = None
    kernel_out = target
    if kernel_out is None or kernel_out.dtype == _torch.float64:
        kdtype = _torch.float32 if result_dtype == _torch.float64 else result_dtype
        kernel_out = _torch.empty(oshape, dtype=kdtype)
    d = lambda t: None if t is None else t.detach()  # noqa: E731  (DLPack refuses tensors that require grad)
    r = _na.attention(d(query), d(key), d(value), method, causal=causal, mask=d(attn_mask),
                      scale=None if scale is None else float(scale), layout=lay, out_layout=olay,
                      return_lse=return_lse, threads=threads, out=kernel_out, return_info=return_info,
                      estimate_rows=estimate_rows)
    extra = list(r[1:]) if isinstance(r, tuple) else []
    res = kernel_out
    if target is not None and target is not kernel_out:
        target.copy_(kernel_out)
        res = target
    elif target is None and res.dtype != result_dtype:
        res = res.to(result_dtype)
    if return_lse:
        extra[0] = _torch.from_dlpack(extra[0])
    return tuple([res] + extra) if extra else res
