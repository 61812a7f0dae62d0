"""numattn.hf: numattn's attention methods as a Hugging Face transformers attention backend.

``backend = numattn.hf.register(name="numattn", method=SPEC)`` registers an attention function
with ``transformers.AttentionInterface`` and a mask function with
``transformers.masking_utils.AttentionMaskInterface`` under ``name``; then
``model.set_attn_implementation("numattn")`` (or ``from_pretrained(...,
attn_implementation="numattn")``) runs every attention layer through numattn, in prefill and in
cached decode. Importable only where torch and transformers are installed.

- ``method``: the spec every layer runs; ``layers``: None (every layer), a list of layer indices
  (those run ``method``, the others ``exact.flash``), or a dict layer index -> spec (the layers
  it names run their spec, the others ``method``). ``threads``: None follows
  ``torch.get_num_threads()``.
- Masks: the mask function is transformers' SDPA mask (boolean, [B, 1, Nq, Nk], True = attend,
  broadcast over heads: read in place); it is left out (None) only where the causal rule says
  everything (no padding, and Nq = 1 or Nq = Nk). The attention function gives a causal layer
  ``causal="bottom-right"``: query i sees keys j <= i + Nk - Nq, which is the KV-cache rule (the
  cache holds the Nk - Nq earlier tokens first), so a decode step (Nq = 1) sees the whole cache
  and a window method's window ends at the query's own position. Where a mask is given it is
  applied as well. With a static (pre-allocated) cache Nk counts unused slots: the mask still
  hides them, but a window method's window would be placed against the end of the cache, so use
  a dynamic cache (transformers' default) with window methods.
- Inspection: ``backend.calls`` counts calls per layer; ``backend.last[layer]`` is the info of
  that layer's latest call (``method``: the spec that ran — for ``auto(tol=E)`` the method it
  chose —, Nq, Nk, and with ``estimate_rows`` set the a-posteriori error estimate
  ``est_rel_error`` / ``est_rel_error_hi`` of that call against float64 attention); ``records``
  keeps every call's info while ``record=True``.

Forward-only: training (dropout > 0), a forward pass in grad mode on tensors that require grad
(unless ``allow_no_grad=True``) and attention-weight outputs are refused.
"""

from transformers import AttentionInterface as _AttentionInterface
from transformers.masking_utils import AttentionMaskInterface as _AttentionMaskInterface
from transformers.masking_utils import sdpa_mask as _sdpa_mask

from . import torch as _nt

__all__ = ["register", "Backend"]


class Backend:
    """A registered numattn attention backend: its configuration and what its calls reported."""

    def __init__(self, name, method, layers, threads, estimate_rows, record, allow_no_grad):
        self.name = name
        self.allow_no_grad = allow_no_grad
        self.method = method
        self.layers = layers
        self.threads = threads
        self.estimate_rows = estimate_rows
        self.record = record
        self.calls = {}
        self.last = {}
        self.records = []

    def spec_for(self, layer):
        """The spec layer `layer` runs."""
        if self.layers is None:
            return self.method
        if isinstance(self.layers, dict):
            return self.layers.get(layer, self.method)
        return self.method if layer in self.layers else "exact.flash"

    def reset(self):
        """Forgets what earlier calls reported."""
        self.calls.clear()
        self.last.clear()
        self.records.clear()

    def __repr__(self):
        return (f"numattn.hf.Backend(name={self.name!r}, method={self.method!r}, layers={self.layers!r}, "
                f"calls={sum(self.calls.values())})")

    # The transformers attention function: query [B, Hq, Nq, D], key/value [B, Hkv, Nk, D];
    # returns ([B, Nq, Hq, Dv], None).
    def attention_forward(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                          is_causal=None, **kwargs):
        if dropout and dropout > 0.0:
            raise ValueError(f"numattn backend {self.name!r}: dropout={dropout}: numattn is forward-only "
                             f"and has no dropout (use model.eval())")
        if kwargs.get("softcap") is not None:
            raise ValueError(f"numattn backend {self.name!r}: attention logit soft-capping is not supported")
        if kwargs.get("output_attentions", False):
            raise ValueError(f"numattn backend {self.name!r}: output_attentions=True: numattn does not form "
                             f"the attention weights; use attn_implementation='eager'")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        layer = getattr(module, "layer_idx", None)
        spec = self.spec_for(layer)
        out, info = _nt.attention(
            query, key, value, spec, attn_mask=attention_mask, scale=scaling, enable_gqa=True,
            causal="bottom-right" if is_causal else "none", out_layout="bnhd", threads=self.threads,
            allow_no_grad=self.allow_no_grad, return_info=True, estimate_rows=self.estimate_rows)
        info = dict(info, layer=layer, n_q=query.shape[2], n_kv=key.shape[2])
        self.calls[layer] = self.calls.get(layer, 0) + 1
        self.last[layer] = info
        if self.record:
            self.records.append(info)
        return out, None


def _mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, allow_is_causal_skip=True, **kwargs):
    # Leave the mask out only where the attention function's bottom-right causal rule is the
    # whole of it: no padding (sdpa_mask checks that) and Nq = 1 or Nq = Nk. SDPA also skips it
    # for a prefill into a static cache (Nk > Nq, top-left), which bottom-right is not.
    if not (q_length == 1 or q_length == kv_length):
        allow_is_causal_skip = False
    return _sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                      kv_offset=kv_offset, allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def register(name="numattn", method="exact.flash", layers=None, threads=None, *, estimate_rows=None,
             record=False, allow_no_grad=False):
    """Registers numattn as the transformers attention implementation `name` and returns its Backend.

    method: spec of every layer (numattn.methods()); layers: None, a list of layer indices (they
    run `method`, the rest exact.flash) or a dict {layer: spec} (the rest run `method`); threads:
    None = torch.get_num_threads(); estimate_rows: None (no estimate) or rows per call for the
    a-posteriori error estimate (0 = automatic; costs O(rows·Nk·D) per call); record: keep every
    call's info in Backend.records; allow_no_grad: run a forward pass in grad mode on weights
    that require grad, without gradients through attention (by default that is refused: run the
    model under torch.no_grad() or torch.inference_mode()). Registering the same name again
    replaces it.
    """
    import numattn as _na

    if not isinstance(name, str) or not name:
        raise TypeError("numattn.hf.register: name: expected a non-empty str")
    specs = [method] + (list(layers.values()) if isinstance(layers, dict) else [])
    for s in specs:
        _na.canonical_spec(s)  # a bad spec fails here, not inside the first forward pass
    if layers is not None and not isinstance(layers, (list, tuple, set, dict)):
        raise TypeError("numattn.hf.register: layers: expected None, a list of layer indices or a dict {layer: spec}")
    b = Backend(name, method, layers if isinstance(layers, (dict, type(None))) else set(layers),
                threads, estimate_rows, record, allow_no_grad)
    _AttentionInterface.register(name, b.attention_forward)
    _AttentionMaskInterface.register(name, _mask)
    return b
