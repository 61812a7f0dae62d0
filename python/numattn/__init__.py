"""numattn: attention computed, approximated and studied the way a numerical analyst would.

Every method states its cost, its error against an exact float64 reference and the assumption it
exploits. This package is the Python face of the C++ library (``numattn._numattn``, nanobind):

- ``methods()`` — the catalogue; ``canonical_spec(spec)``;
- ``attention(q, k, v, method="exact.flash", ...)`` — any NumPy array or DLPack producer, read in
  place when it is float32 (strided views included);
- ``reference(q, k, v, ...)`` — the float64 oracle; ``error(approx, exact)`` — the metrics;
- ``BasisDecomposition(W, rank, strategy=...)`` — Basis Decomposition (arXiv 2510.01718);
- ``Model.load("default" | path)`` — a GGUF Llama model: ``ppl``, ``capture``, ``generate``.

Errors are ``numattn.Error`` (a ``ValueError``) with numattn's message; long calls release the
GIL and stop on Ctrl-C between chunks, layers or tokens.
"""

import os as _os
import warnings as _warnings

from ._numattn import *  # noqa: F401,F403
from ._numattn import (  # noqa: F401
    Error,
    NonFiniteInputError,
    OptionError,
    attention,
    canonical_spec,
    error,
    methods,
    reference,
)

from ._numattn import blas_info  # noqa: E402

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
