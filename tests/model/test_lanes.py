"""The 8-lane vector loops of the chain-of-hops E-step (``dist_respattn.model.kernels.lanes``) and its lock-step pair
searches, against plain NumPy and the one-at-a-time search."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from dist_respattn.model.heads.hops.kernels import _find_pairs
from dist_respattn.model.kernels.lanes import (
    LANES,
    add_four_products,
    add_weighted_rows,
    add_window_rows_8,
    sq_distances_8,
    transition_dots_8,
    transition_logs_8,
)
from dist_respattn.model.kernels.log_weights import exp_nonpositive_range
from dist_respattn.model.kernels.per_position import find_pair


@numba.njit(cache=True)
def _distances(queries, row, keys, h, symbols, lo, n, scale):
    out = np.full(LANES + 2, -1.0)
    sq_distances_8(queries, row, keys, h, symbols, lo, n, out, 1, scale)
    return out


@numba.njit(cache=True)
def _transition_logs(queries, keys, h, symbols, lo, scale, bias):
    out = np.full(LANES * LANES + 2, 7.0)
    shifts = np.full(LANES + 2, 7.0)
    transition_logs_8(queries, keys, h, symbols, lo, scale, bias, out, 1, shifts, 1)
    return out, shifts


@numba.njit(cache=True)
def _transition_dots(queries, keys, h, symbols, lo, scale, bias, common):
    out = np.full(LANES * LANES + 2, 7.0)
    shifts = np.full(LANES + 2, 7.0)
    query_norms = (queries * queries).sum(axis=1)
    key_norms = (keys * keys).sum(axis=2)
    transition_dots_8(queries, query_norms, keys, key_norms, h, symbols, lo, scale, bias, common, out, 1, shifts, 1)
    return out, shifts


@numba.njit(cache=True)
def _exps(x):
    out = np.empty(x.shape[0])
    bits = np.empty(x.shape[0], dtype=np.int64)
    exp_nonpositive_range(x, 0, out, 0, x.shape[0], bits, bits.view(np.float64))
    return out


@numba.njit(cache=True)
def _add(dst, h, row, table, symbols, lo, n, weights, w0, stride):
    add_weighted_rows(dst, h, row, table, symbols, lo, n, weights, w0, stride)


@numba.njit(cache=True)
def _add_8(dst, h, table, symbols, lo, n, weights, j0, stride):
    add_window_rows_8(dst, h, table, symbols, lo, n, weights, j0, stride)


@numba.njit(cache=True)
def _four_products(dst, table, rows, ys):
    add_four_products(dst, table, rows, ys)


@pytest.mark.parametrize("dim", [8, 16, 32, 40, 72])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_squared_distances_of_a_query_to_8_keys(dim, n):
    rng = np.random.default_rng(dim * 10 + n)
    queries = rng.normal(size=(6, dim))
    keys = rng.normal(scale=2.0, size=(2, 9, dim))
    symbols = rng.integers(0, 9, size=12).astype(np.int32)
    out = _distances(queries, 4, keys, 1, symbols, 3, n, 0.25)
    lanes = symbols[3 + np.minimum(np.arange(LANES), n - 1)]  # lanes past n repeat the last key
    expected = 0.25 * ((queries[4] - keys[1, lanes]) ** 2).sum(axis=1)
    np.testing.assert_allclose(out[1 : LANES + 1], expected, rtol=1e-14)
    assert out[0] == -1.0 and out[LANES + 1] == -1.0  # nothing written outside the 8 lanes
    # The same numbers with the roles of the two tables swapped: (a - b)^2 = (b - a)^2 lane by lane, so a pair's
    # distance does not depend on which side is the query.
    for k in range(n):
        back = _distances(
            keys[1], int(symbols[3 + k]), queries.reshape(1, 6, dim), 0, np.array([4], np.int32), 0, 1, 0.25
        )
        assert back[1] == out[1 + k]


@pytest.mark.parametrize("dim", [8, 32, 40, 64, 72])
@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_weighted_rows_added_into_a_row(dim, n):
    rng = np.random.default_rng(dim + n)
    table = rng.normal(size=(7, dim))
    symbols = rng.integers(0, 7, size=12).astype(np.int32)
    weights = rng.normal(size=40)
    dst = rng.normal(size=(3, 7, dim))
    expected = dst.copy()
    expected[2, 5] += sum(weights[1 + 4 * k] * table[symbols[2 + k]] for k in range(n))
    _add(dst, 2, 5, table, symbols, 2, n, weights, 1, 4)
    np.testing.assert_allclose(dst, expected, rtol=1e-13, atol=1e-14)


def test_lock_step_pair_searches_equal_the_one_at_a_time_search():
    rng = np.random.default_rng(3)
    for _ in range(200):
        s, t = 30, 6
        degree = rng.integers(0, 12, size=t)
        indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
        symbols = np.concatenate([np.sort(rng.choice(s, size=k, replace=False)) for k in degree]).astype(np.int32)
        tokens = rng.integers(0, s, size=20).astype(np.int32)
        target, m, lo = int(rng.integers(0, t)), int(rng.integers(0, 9)), int(rng.integers(0, 10))
        out = np.full(8, -7, dtype=np.int64)
        _find_pairs(indptr, symbols, target, tokens, lo, m, out)
        assert out[:m].tolist() == [find_pair(indptr, symbols, target, tokens[lo + k]) for k in range(m)]


@pytest.mark.parametrize("dim", [8, 16, 32, 40, 72])
@pytest.mark.parametrize("n", [1, 5, 8])
def test_a_windows_8_rows_added_in_one_pass_as_one_at_a_time(dim, n):
    rng = np.random.default_rng(dim * 3 + n)
    table = rng.normal(size=(12, dim))
    symbols = np.array([11, 0, 7, 3, 9, 1, 4, 10, 2, 6, 5, 8], dtype=np.int32)  # 8 distinct from 2 on
    weights = rng.normal(size=80)
    dst = rng.normal(size=(3, 12, dim))
    expected = dst.copy()
    for r in range(LANES):
        _add(expected, 1, int(symbols[2 + 1 + r]), table, symbols, 2, n, weights, 1 + r, 9)
    _add_8(dst, 1, table, symbols, 2, n, weights, 1, 9)  # rows symbols[3 .. 10], weights from 1 + r, stride 9
    np.testing.assert_array_equal(dst, expected)  # the same numbers: each row's terms in the same order


def _window_case(dim, seed):
    """12 hop queries and 3 hops' keys of ``dim`` dimensions, the symbols in a random order, a window of 8 positions
    from position 3 and a bias over them with one position no transition reaches."""
    rng = np.random.default_rng(seed)
    queries = rng.normal(size=(12, dim))
    keys = rng.normal(scale=2.0, size=(3, 12, dim))
    symbols = rng.permutation(12).astype(np.int32)
    bias = np.log(rng.dirichlet(np.ones(LANES)))
    bias[5] = -np.inf  # a position no transition reaches
    return queries, keys, symbols, bias, symbols[3 : 3 + LANES]


@pytest.mark.parametrize("dim", [8, 32, 40])
def test_a_windows_transitions_in_one_pass(dim):
    """Each source's shifted log-values over a window of 8 and their exponentials: NumPy's distances to rounding,
    and the exponentials exp_nonpositive_range's numbers exactly."""
    queries, keys, symbols, bias, window = _window_case(dim, seed=dim)
    out, shifts = _transition_logs(queries, keys, 2, symbols, 3, -0.3, bias)
    lv = bias[None, :] - 0.3 * ((queries[window][:, None, :] - keys[2, window][None, :, :]) ** 2).sum(axis=2)
    np.testing.assert_allclose(shifts[1 : 1 + LANES], lv.max(axis=1), rtol=1e-13)
    np.testing.assert_allclose(out[1:-1].reshape(LANES, LANES), np.exp(lv - lv.max(axis=1, keepdims=True)), rtol=1e-12)
    assert out[0] == 7.0 and out[-1] == 7.0 and shifts[0] == 7.0 and shifts[-1] == 7.0  # nothing written past them
    # With a zero scale the log-values are the bias: the exponentials are exp_nonpositive_range's, bit for bit (from
    # 0 down past its underflow bound).
    bias = np.array([0.0, -1e-3, -0.7, -20.0, -300.0, -707.5, -720.0, -np.inf])
    out, shifts = _transition_logs(queries, keys, 2, symbols, 3, 0.0, bias)
    assert shifts[1 : 1 + LANES].tolist() == [0.0] * LANES
    assert out[1:-1].tolist() == np.tile(_exps(bias), LANES).tolist()
    # A source no position reaches: its row all 0.
    out, shifts = _transition_logs(queries, keys, 2, symbols, 3, -0.3, np.full(LANES, -np.inf))
    assert np.all(out[1:-1] == 0.0) and np.all(shifts[1 : 1 + LANES] == -np.inf)


@pytest.mark.parametrize("dim", [8, 32, 40, 72])
@pytest.mark.parametrize("cells", [1, 5, 128])
def test_four_rows_products_added_over_the_cells(dim, cells):
    """Each cell's four products summed in order, then added: NumPy's numbers in the same order, bit for bit (no
    fused multiply-add), and nothing of the table or the rows changed."""
    rng = np.random.default_rng(dim * 1000 + cells)
    table = rng.random((9, cells))
    rows = np.array([7, 2, 5, 0], dtype=np.int64)
    ys = rng.normal(size=(4, dim))
    dst = rng.normal(size=(cells, dim))
    a = table[rows]  # (4, cells)
    expected = dst + (((a[0][:, None] * ys[0] + a[1][:, None] * ys[1]) + a[2][:, None] * ys[2]) + a[3][:, None] * ys[3])
    before = table.copy()
    _four_products(dst, table, rows, ys)
    np.testing.assert_array_equal(dst, expected)
    np.testing.assert_array_equal(table, before)


@pytest.mark.parametrize("common", [False, True], ids=["own-shift", "common-shift"])
@pytest.mark.parametrize("dim", [8, 32, 40])
def test_a_windows_transitions_from_norms(dim, common):
    """Each distance as |q|^2 + |k|^2 - 2 q.k from the symbols' norms: NumPy's direct distances to rounding; each
    source's row shifted by its own largest log-value, or all by the window's largest."""
    queries, keys, symbols, bias, window = _window_case(dim, seed=dim + 100)
    out, shifts = _transition_dots(queries, keys, 2, symbols, 3, -0.3, bias, common)
    lv = bias[None, :] - 0.3 * ((queries[window][:, None, :] - keys[2, window][None, :, :]) ** 2).sum(axis=2)
    top = np.full((LANES, 1), lv.max()) if common else lv.max(axis=1, keepdims=True)
    np.testing.assert_allclose(shifts[1 : 1 + LANES], top[:, 0], rtol=1e-13)
    np.testing.assert_allclose(out[1:-1].reshape(LANES, LANES), np.exp(lv - top), rtol=1e-12)
    assert out[0] == 7.0 and out[-1] == 7.0 and shifts[0] == 7.0 and shifts[-1] == 7.0  # nothing written past them
    # With a zero scale the log-values are the bias: exp_nonpositive_range's exponentials within two ulps (the
    # polynomial's steps fused), 0 below its underflow bound.
    bias = np.array([0.0, -1e-3, -0.7, -20.0, -300.0, -707.5, -720.0, -np.inf])
    out, shifts = _transition_dots(queries, keys, 2, symbols, 3, 0.0, bias, common)
    assert shifts[1 : 1 + LANES].tolist() == [0.0] * LANES
    np.testing.assert_allclose(out[1:-1], np.tile(_exps(bias), LANES), rtol=5e-16, atol=0.0)
    assert out[1:-1].reshape(LANES, LANES)[:, 6:].tolist() == [[0.0, 0.0]] * LANES
    # A source no position reaches: its row all 0.
    out, shifts = _transition_dots(queries, keys, 2, symbols, 3, -0.3, np.full(LANES, -np.inf), common)
    assert np.all(out[1:-1] == 0.0) and np.all(shifts[1 : 1 + LANES] == -np.inf)


def test_near_identical_queries_and_keys_keep_their_distances_from_norms_nonnegative():
    """Keys a hair from the hop queries, far from the origin (|q|^2 ~ 3,200): |q|^2 + |k|^2 - 2 q.k cancels to
    within rounding of the norms, and the clamp keeps each distance >= 0, so no log-value exceeds its bias."""
    rng = np.random.default_rng(7)
    dim = 32
    queries = 10.0 + rng.normal(size=(12, dim))
    keys = np.stack([queries + rng.normal(scale=1e-9, size=(12, dim)) for _ in range(3)])
    symbols = rng.permutation(12).astype(np.int32)
    window = symbols[3 : 3 + LANES]
    bias = np.zeros(LANES)
    out, shifts = _transition_dots(queries, keys, 2, symbols, 3, -1.0, bias, False)
    assert np.all(shifts[1 : 1 + LANES] <= 0.0)  # the diagonal's distance ~1e-17, taken as >= 0
    assert np.all(out[1:-1] >= 0.0) and np.all(out[1:-1] <= 1.0)
    lv = -((queries[window][:, None, :] - keys[2, window][None, :, :]) ** 2).sum(axis=2)
    norms = (queries[window] ** 2).sum(axis=1)[:, None] + (keys[2, window] ** 2).sum(axis=1)[None, :]
    # Within rounding of the norms: a few ulps of |q|^2 + |k|^2.
    assert np.all(np.abs(shifts[1 : 1 + LANES] - lv.max(axis=1)) <= 8 * np.finfo(float).eps * norms.max())
    np.testing.assert_allclose(
        out[1:-1].reshape(LANES, LANES), np.exp(lv - lv.max(axis=1, keepdims=True)), rtol=0.0,
        atol=16 * np.finfo(float).eps * norms.max(),
    )  # fmt: skip
