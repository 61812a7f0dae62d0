# %% [markdown]
# # A tour of numattn from Python
#
# Notebook-style script (cells marked `# %%`: open it in Jupyter with jupytext, or in VS Code, or
# run it as `python examples/attention_tour.py`). It needs only the numattn package
# (`pip install .`); the last section uses the default model when `scripts/fetch_data.sh`
# has cached it.

# %%
import os

import numpy as np

import numattn

QUICK = os.environ.get("NUMATTN_EXAMPLE_QUICK") == "1"  # the test suite runs it small
rng = np.random.default_rng(0)

# %% [markdown]
# ## The catalogue
# Every method states its family, cost and citation.

# %%
for m in numattn.methods():
    print(f"{m['spec']:<60} {m['family']:<8} {m['time_complexity']}")

# %% [markdown]
# ## Exact attention against the float64 reference
# Inputs are read in place (float32, any strides with a contiguous last axis).

# %%
B, H, HKV, N, D = 1, 8, 2, (256 if QUICK else 2048), 64
q = rng.standard_normal((B, H, N, D), dtype=np.float32)
k = rng.standard_normal((B, HKV, N, D), dtype=np.float32)
v = rng.standard_normal((B, HKV, N, D), dtype=np.float32)
out, lse = numattn.attention(q, k, v, method="exact.flash", causal=True, return_lse=True)
ref, ref_lse = numattn.reference(q, k, v, causal=True, return_lse=True)
print(numattn.error(out, ref, approx_lse=lse, exact_lse=ref_lse))

# %% [markdown]
# ## Approximations: error against budget
# Low-rank (Nyström landmarks) and sparse (window) methods on the same problem, non-causal.

# %%
ref_nc = numattn.reference(q, k, v)
for spec in ["lowrank.nystrom(landmarks=16)", "lowrank.nystrom(landmarks=64)",
             "sparse.window(window=32)", "sparse.window(window=128)"]:
    try:
        approx = numattn.attention(q, k, v, method=spec)
    except numattn.Error as e:
        print(f"{spec}: {e}")
        continue
    print(f"{numattn.canonical_spec(spec):<50} rel_fro_error {numattn.error(approx, ref_nc)['rel_fro_error']:.3e}")

# %% [markdown]
# ## Basis Decomposition
# A rank-r matrix is B (r of its rows) plus coefficients C: lossless in exact arithmetic, with the
# rounding amplified by κ(B), which the basis rule keeps small.

# %%
W = rng.standard_normal((64, 16)) @ rng.standard_normal((16, 48))
bd = numattn.BasisDecomposition(W, 16)
print(bd)
print("basis rows:", bd.basis[:8], "...  storage:", bd.accounting)
assert np.allclose(bd.reconstruct(), W)

# %% [markdown]
# ## A real model (if cached): perplexity and the attention of one layer

# %%
try:
    numattn.default_model_path()
    have_model = not QUICK
except numattn.Error:
    have_model = False
if have_model:
    model = numattn.Model.load("default")
    with open(numattn.default_text_path(), encoding="utf-8") as f:
        text = f.read(40000)
    print(model.ppl(text, ctx=256, chunks=4, baseline="exact.naive"))
    q, k, v = model.capture(text, tokens=512, layers=[15])[15]
    o = numattn.attention(q, k, v, causal=True)
    print("layer 15:", numattn.error(o, numattn.reference(q, k, v, causal=True)))
    print(model.generate("The capital of France is", max_tokens=8))
