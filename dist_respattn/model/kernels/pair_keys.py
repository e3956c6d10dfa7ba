"""Weighted tallies of int64 pair keys (cells ``t * S + s``), compiled: the start pass's support in linear time.

``tally_keys`` gives what ``np.unique(keys, return_inverse=True)`` followed by ``np.bincount`` gives (each
distinct key once, increasing, with the sum of its weights added in input order) from a stable LSD radix sort
instead of a comparison sort: O(n) a block instead of O(n log n). ``merge_tallies`` adds two tallies in one
linear pass, each key's sum ``first + second``, as ``np.unique`` and ``np.bincount`` over their concatenation
would. Both therefore give the same bits as the NumPy formulation they replace.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["merge_tallies", "tally_keys", "tally_rows"]

_DIGIT_BITS = 11  # 2048 buckets: the counts stay in L1, and a 32-bit key range takes 3 passes
_DIGIT_MASK = (1 << _DIGIT_BITS) - 1


@numba.njit(cache=True, nogil=True)
def _radix_sorted(keys, weights):  # pragma: no cover - compiled
    """``(keys, weights)`` stably sorted by key (non-negative int64), least significant digit first."""
    n = keys.shape[0]
    top = 0
    for i in range(n):
        top = max(top, keys[i])
    src_k, src_w = keys.copy(), weights.copy()
    dst_k, dst_w = np.empty_like(src_k), np.empty_like(src_w)
    shift = 0
    while (top >> shift) > 0:
        starts = np.zeros((1 << _DIGIT_BITS) + 1, dtype=np.int64)
        for i in range(n):
            starts[((src_k[i] >> shift) & _DIGIT_MASK) + 1] += 1
        for d in range(1 << _DIGIT_BITS):
            starts[d + 1] += starts[d]
        for i in range(n):
            d = (src_k[i] >> shift) & _DIGIT_MASK
            at = starts[d]
            dst_k[at] = src_k[i]
            dst_w[at] = src_w[i]
            starts[d] = at + 1
        src_k, dst_k = dst_k, src_k
        src_w, dst_w = dst_w, src_w
        shift += _DIGIT_BITS
    return src_k, src_w


@numba.njit(cache=True, nogil=True)
def _sum_runs(sorted_keys, sorted_weights):  # pragma: no cover - compiled
    n = sorted_keys.shape[0]
    distinct = 0
    for i in range(n):
        if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
            distinct += 1
    out_keys = np.empty(distinct, dtype=np.int64)
    sums = np.zeros(distinct)
    j = -1
    for i in range(n):
        if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
            j += 1
            out_keys[j] = sorted_keys[i]
        sums[j] += sorted_weights[i]  # from 0.0, in input order: np.bincount's sum
    return out_keys, sums


@numba.njit(cache=True, nogil=True)
def _merge(a_keys, a_sums, b_keys, b_sums):  # pragma: no cover - compiled
    na, nb = a_keys.shape[0], b_keys.shape[0]
    keys = np.empty(na + nb, dtype=np.int64)
    sums = np.empty(na + nb)
    i = j = m = 0
    while i < na or j < nb:
        if j >= nb or (i < na and a_keys[i] < b_keys[j]):
            keys[m] = a_keys[i]
            sums[m] = 0.0 + a_sums[i]
            i += 1
        elif i >= na or b_keys[j] < a_keys[i]:
            keys[m] = b_keys[j]
            sums[m] = 0.0 + b_sums[j]
            j += 1
        else:
            keys[m] = a_keys[i]
            sums[m] = (0.0 + a_sums[i]) + b_sums[j]
            i += 1
            j += 1
        m += 1
    return keys[:m].copy(), sums[:m].copy()


@numba.njit(cache=True, nogil=True)
def _live_cells(context, target, mass, num_symbols):  # pragma: no cover - compiled
    """Cells ``target[n] * S + context[n, i]`` and masses of the entries with ``mass[n, i] > 0``, in row-major order."""
    n, n_pos = context.shape
    cells = np.empty(n * n_pos, dtype=np.int64)
    masses = np.empty(n * n_pos)
    m = 0
    for row in range(n):
        base = np.int64(target[row]) * num_symbols
        for i in range(n_pos):
            w = mass[row, i]
            if w > 0.0:
                cells[m] = base + context[row, i]
                masses[m] = w
                m += 1
    return cells[:m], masses[:m]


def tally_rows(
    context: np.ndarray, target: np.ndarray, mass: np.ndarray, num_symbols: int
) -> tuple[np.ndarray, np.ndarray]:
    """The tally of a block's (symbol, target) pairs: ``context`` (n, N) and ``target`` (n,) checked ids, ``mass``
    (n, N) float64 per entry (entries of mass 0 hold no pair); the cells are target-major, ``t * S + s``."""
    cells, masses = _live_cells(context, target, np.ascontiguousarray(mass, dtype=np.float64), int(num_symbols))
    return _sum_runs(*_radix_sorted(cells, masses))


def tally_keys(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct (P,) int64 increasing, sums (P,) float64)`` of non-negative int64 ``keys`` (n,) and ``weights`` (n,):
    each key's weights added in input order, from 0."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    if keys.shape != weights.shape or keys.ndim != 1:
        raise ValueError(f"keys {keys.shape} and weights {weights.shape}: expected two arrays of one shape (n,)")
    if keys.size and int(keys.min()) < 0:
        raise ValueError(f"keys hold {int(keys.min())}: expected non-negative cells")
    return _sum_runs(*_radix_sorted(keys, weights))


def merge_tallies(
    first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The union of two tallies ``(keys increasing, sums)``: a key in both gets ``first's + second's``."""
    return _merge(
        np.ascontiguousarray(first[0], dtype=np.int64),
        np.ascontiguousarray(first[1], dtype=np.float64),
        np.ascontiguousarray(second[0], dtype=np.int64),
        np.ascontiguousarray(second[1], dtype=np.float64),
    )
