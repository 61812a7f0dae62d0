"""numattn: attention computed, approximated and studied the way a numerical analyst would.

Every method states its cost, its error against an exact float64 reference and the assumption it
exploits. This package is the Python face of the C++ library (``numattn._numattn``, nanobind):

- ``methods()`` — the catalogue; ``canonical_spec(spec)``; ``transforms()`` — the model transforms;
- ``attention(q, k, v, method="exact.flash", ...)`` — any NumPy array or DLPack producer, read in
  place when it is float32 (strided views included);
- ``reference(q, k, v, ...)`` — the float64 oracle; ``error(approx, exact)`` — the metrics;
- ``BasisDecomposition(W, rank, strategy=...)`` — Basis Decomposition (arXiv 2510.01718);
- ``Model.load("default" | path)`` — a GGUF Llama model: ``ppl``, ``capture``, ``generate``.

Errors are ``numattn.Error`` (a ``ValueError``) with numattn's message; an argument of the wrong
kind is a ``TypeError`` and one of the wrong value a ``numattn.OptionError``, both naming it
(``_checks``); a request that does not fit in memory is ``numattn.OutOfMemoryError`` (a
``MemoryError``). Long calls release the GIL and stop on Ctrl-C between chunks, layers or tokens.
"""

import os as _os
import warnings as _warnings

from . import _checks as _c
from . import _numattn as _ext
from ._numattn import *  # noqa: F401,F403
from ._numattn import (  # noqa: F401
    Error,
    NonFiniteInputError,
    OptionError,
    OutOfMemoryError,
)

# The public functions and classes below check every argument by name (_checks) and then call
# the extension's function of the same name, whose docstring they carry.


def methods():
    return _ext.methods()


def transforms():
    return _ext.transforms()


def blas_info():
    return _ext.blas_info()


def default_model_path():
    return _ext.default_model_path()


def default_text_path():
    return _ext.default_text_path()


def canonical_spec(spec):
    return _ext.canonical_spec(_c.text("numattn.canonical_spec", "spec", spec))


def _problem(fn, q, k, v, causal, mask, scale, window, layout, return_lse, threads, dtypes=_c.FLOAT):
    return dict(
        q=_c.array(fn, "q", q, dtypes), k=_c.array(fn, "k", k, dtypes), v=_c.array(fn, "v", v, dtypes),
        causal=_c.causal(fn, causal), mask=_c.array(fn, "mask", mask, _c.MASK, none=True),
        scale=_c.real(fn, "scale", scale, none=True), window=_c.window(fn, window),
        layout=_c.text(fn, "layout", layout), return_lse=_c.boolean(fn, "return_lse", return_lse),
        threads=_c.threads(fn, threads))


def attention(q, k, v, method="exact.flash", *, causal=False, mask=None, scale=None, window=None,
              layout="bhnd", return_lse=False, threads=None, out=None, out_layout=None, return_info=False,
              estimate_rows=None):
    fn = "numattn.attention"
    a = _problem(fn, q, k, v, causal, mask, scale, window, layout, return_lse, threads, _c.QKV)
    return _ext.attention(method=_c.text(fn, "method", method),
                          out=_c.array(fn, "out", out, _c.OUT_ANY, writable=True, none=True),
                          out_layout=_c.text(fn, "out_layout", out_layout, none=True),
                          return_info=_c.boolean(fn, "return_info", return_info),
                          estimate_rows=_c.integer(fn, "estimate_rows", estimate_rows, 0, none=True,
                                                   what=f"expected a row count >= 0 (0: automatic), got {estimate_rows}"),
                          **a)


def reference(q, k, v, *, causal=False, mask=None, scale=None, window=None, layout="bhnd",
              return_lse=False, threads=None):
    return _ext.reference(**_problem("numattn.reference", q, k, v, causal, mask, scale, window,
                                     layout, return_lse, threads))


def error(approx, exact, *, approx_lse=None, exact_lse=None):
    fn = "numattn.error"
    return _ext.error(_c.array(fn, "approx", approx, _c.OUT), _c.array(fn, "exact", exact),
                      approx_lse=_c.array(fn, "approx_lse", approx_lse, none=True),
                      exact_lse=_c.array(fn, "exact_lse", exact_lse, none=True))


class BasisDecomposition(_ext.BasisDecomposition):
    def __init__(self, W, rank=None, *, strategy="auto", form="rows", tolerance=None, basis=None, V=None):
        fn = "numattn.BasisDecomposition"
        super().__init__(
            _c.arrays(fn, "U" if V is not None else "W", W), _c.integer(fn, "rank", rank, none=True),
            strategy=_c.text(fn, "strategy", strategy), form=_c.text(fn, "form", form),
            tolerance=_c.real(fn, "tolerance", tolerance, none=True),
            basis=_c.int_list(fn, "basis", basis, none=True),
            V=None if V is None else _c.arrays(fn, "V", V))

    def basis_block_of(self, k):
        return super().basis_block_of(_c.integer("BasisDecomposition.basis_block_of", "k", k))

    def coefficients_of(self, k):
        return super().coefficients_of(_c.integer("BasisDecomposition.coefficients_of", "k", k))

    def reconstruct(self, k=0):
        return super().reconstruct(_c.integer("BasisDecomposition.reconstruct", "k", k))

    def apply(self, x, k=0):
        fn = "BasisDecomposition.apply"
        return super().apply(_c.array(fn, "x", x), _c.integer(fn, "k", k))


class Model(_ext.Model):
    def __init__(self, path="default", *, threads=None, transform=""):
        fn = "numattn.Model"
        super().__init__(_c.path(fn, "path", path), threads=_c.threads(fn, threads),
                         transform=_c.text(fn, "transform", transform))

    @classmethod
    def load(cls, path="default", *, threads=None, transform=""):
        fn = "numattn.Model.load"
        return cls(_c.path(fn, "path", path), threads=_c.threads(fn, threads),
                   transform=_c.text(fn, "transform", transform))

    def tokenize(self, text, *, add_bos=False, parse_special=True):
        fn = "Model.tokenize"
        return super().tokenize(_c.text(fn, "text", text, nul=True), add_bos=_c.boolean(fn, "add_bos", add_bos),
                                parse_special=_c.boolean(fn, "parse_special", parse_special))

    def detokenize(self, ids, *, render_special=True):
        fn = "Model.detokenize"
        return super().detokenize(_c.int_list(fn, "ids", ids, *_c.INT32),
                                  render_special=_c.boolean(fn, "render_special", render_special))

    def ppl(self, text, ctx=512, chunks=-1, *, attn="exact.flash", baseline=None, bos="auto",
            allow_long_ctx=False, threads=None):
        fn = "Model.ppl"
        return super().ppl(
            _c.tokens_or_text(fn, "text", text), _c.integer(fn, "ctx", ctx), _c.integer(fn, "chunks", chunks),
            attn=_c.text(fn, "attn", attn), baseline=_c.text(fn, "baseline", baseline, none=True),
            bos=_c.text(fn, "bos", bos), allow_long_ctx=_c.boolean(fn, "allow_long_ctx", allow_long_ctx),
            threads=_c.threads(fn, threads))

    def capture(self, text, tokens=2048, layers=(0,), *, offset=0, pre_rope=False, bos="auto", threads=None):
        fn = "Model.capture"
        layers = _c.text(fn, "layers", layers) if isinstance(layers, str) else _c.int_list(fn, "layers", layers)
        return super().capture(
            _c.tokens_or_text(fn, "text", text), _c.integer(fn, "tokens", tokens), layers,
            offset=_c.integer(fn, "offset", offset), pre_rope=_c.boolean(fn, "pre_rope", pre_rope),
            bos=_c.text(fn, "bos", bos), threads=_c.threads(fn, threads))

    def generate(self, prompt, max_tokens=32, *, attn=None, chat=False, return_ids=False, threads=None):
        fn = "Model.generate"
        return super().generate(
            _c.text(fn, "prompt", prompt, nul=True), _c.integer(fn, "max_tokens", max_tokens),
            attn=_c.text(fn, "attn", attn, none=True), chat=_c.boolean(fn, "chat", chat),
            return_ids=_c.boolean(fn, "return_ids", return_ids), threads=_c.threads(fn, threads))


def _carry_docs():
    for f in (methods, transforms, blas_info, default_model_path, default_text_path, canonical_spec, attention,
              reference, error):
        f.__doc__ = getattr(_ext, f.__name__).__doc__
    for cls in (BasisDecomposition, Model):
        base = cls.__bases__[0]
        cls.__doc__ = base.__doc__
        for name, f in vars(cls).items():
            f = getattr(f, "__func__", f)
            if callable(f) and getattr(base, name, None) is not None:
                f.__doc__ = getattr(base, name).__doc__


_carry_docs()

__version__ = "0.1.0"


def default_text():
    """The default text (six Jane Austen novels, ~4 MB) as a str; numattn.Error if not cached."""
    with open(default_text_path(), encoding="utf-8") as f:  # noqa: F405
        return f.read()


def _warn_blas_core():
    # OpenBLAS picks its kernels once, when the process loads it (numpy's import): the numattn
    # CLI re-executes itself with OPENBLAS_CORETYPE when the pick is the generic fallback, a
    # Python process cannot, so it says what to set.
    core = blas_info()["recommended_coretype"]
    if core and _os.environ.get("NUMATTN_KEEP_BLAS_CORE") != "1":
        _warnings.warn(
            f"OpenBLAS runs its generic 'Prescott' kernels on this CPU: GEMM-based methods are "
            f"5-10x slower and may differ in the last bit from the numattn CLI. Start Python with "
            f"OPENBLAS_CORETYPE={core} (NUMATTN_KEEP_BLAS_CORE=1 silences this).",
            RuntimeWarning, stacklevel=3)


_warn_blas_core()
