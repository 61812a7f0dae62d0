"""numattn.BasisDecomposition on matrices of known rank, against NumPy."""

import numpy as np
import pytest

import numattn


def low_rank(rng, m, n, r):
    return rng.standard_normal((m, r)) @ rng.standard_normal((r, n))


def test_row_form_is_lossless_on_exact_rank():
    rng = np.random.default_rng(20)
    w = low_rank(rng, 12, 9, 4)
    bd = numattn.BasisDecomposition(w, 4)
    assert bd.rank == 4 and bd.shape == (12, 9) and bd.form == "rows" and bd.strategy == "pivoted"
    s, sc = bd.basis, bd.complement
    assert s.dtype == np.int64 and len(s) == 4 and sorted(np.concatenate([s, sc])) == list(range(12))
    np.testing.assert_array_equal(bd.basis_block, w[s])  # B = W[S, :]
    assert bd.coefficients.shape == (8, 4)
    np.testing.assert_allclose(bd.coefficients @ bd.basis_block, w[sc], atol=1e-10)
    np.testing.assert_allclose(bd.reconstruct(), w, atol=1e-10)
    assert bd.residual < 1e-12 and 1 <= bd.cond < 1e6
    np.testing.assert_allclose(bd.cond, np.linalg.cond(w[s]), rtol=1e-8)
    x = rng.standard_normal((5, 12))
    np.testing.assert_allclose(bd.apply(x), x @ w, atol=1e-9)
    acc = bd.accounting
    assert acc["params_dense"] == 108 and acc["params_bd"] == 4 * (12 + 9 - 4)


def test_column_form_shared_basis_and_factors():
    rng = np.random.default_rng(21)
    ws = [low_rank(rng, 7, 10, 3) for _ in range(3)]
    bd = numattn.BasisDecomposition(ws, 3, form="cols", strategy="maxmin")
    assert bd.matrices == 3 and bd.strategy == "maxmin" and len(bd.conds) == 3
    for i, w in enumerate(ws):
        np.testing.assert_allclose(bd.reconstruct(i), w, atol=1e-9)
        np.testing.assert_array_equal(bd.basis_block_of(i), w[:, bd.basis])
    assert max(bd.residuals) == bd.residual < 1e-10
    u, v = rng.standard_normal((8, 2)), rng.standard_normal((2, 6))
    f = numattn.BasisDecomposition(u, V=v)
    assert f.rank == 2
    np.testing.assert_allclose(f.reconstruct(), u @ v, atol=1e-10)
    forced = numattn.BasisDecomposition(ws[0].T.astype(np.float32), basis=[0, 2, 5])
    np.testing.assert_array_equal(forced.basis, [0, 2, 5])


def test_bad_input():
    rng = np.random.default_rng(22)
    w = low_rank(rng, 6, 5, 2)
    with pytest.raises(numattn.Error):
        numattn.BasisDecomposition(w, 9)  # rank beyond the matrix
    with pytest.raises(numattn.Error, match="2-d"):
        numattn.BasisDecomposition(w[0], 2)
    with pytest.raises(TypeError, match="float16"):
        numattn.BasisDecomposition(w.astype(np.float16), 2)
    with pytest.raises(numattn.Error, match="strategy|auto"):
        numattn.BasisDecomposition(w, 2, strategy="best")
    with pytest.raises(numattn.OptionError, match="rank"):
        numattn.BasisDecomposition(w)
    with pytest.raises(numattn.OptionError):
        numattn.BasisDecomposition(w, 2).reconstruct(3)
