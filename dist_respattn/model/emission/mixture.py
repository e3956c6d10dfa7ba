"""A block of windows' emission mixtures, compiled: each row's weight summed per distinct symbol first (a long window
holds each symbol many times), so a row costs its window plus its distinct symbols' stored rows, not N of them."""

from __future__ import annotations

import numba
import numpy as np

from dist_respattn.model.emission.layouts import SparseEmission

__all__ = ["symbol_mixture"]


@numba.njit(cache=True, nogil=True)
def _add_symbol_rows(context, weight, indptr, targets, values, dense, out):  # pragma: no cover - compiled
    """``out[r] += sum_s (sum_{i: c_ri = s} weight[r, i]) row_s``, ``row_s`` the dense ``dense[s]`` (a (0, 0)
    ``dense``: the stored ``values[indptr[s]:indptr[s + 1]]`` at ``targets``)."""
    n_rows, n_pos = context.shape
    n_symbols = indptr.shape[0] - 1 if dense.shape[0] == 0 else dense.shape[0]
    acc = np.zeros(n_symbols)
    touched = np.empty(n_pos, dtype=np.int64)
    for r in range(n_rows):
        m = 0
        for i in range(n_pos):
            w = weight[r, i]
            if w <= 0.0:
                continue
            c = context[r, i]
            if acc[c] == 0.0:
                touched[m] = c
                m += 1
            acc[c] += w
        for j in range(m):
            c = touched[j]
            a = acc[c]
            acc[c] = 0.0
            if dense.shape[0] > 0:
                for t in range(dense.shape[1]):
                    out[r, t] += a * dense[c, t]
            else:
                for p in range(indptr[c], indptr[c + 1]):
                    out[r, targets[p]] += a * values[p]


def symbol_mixture(emission: object, context: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(n, T) ``sum_i weight[:, i] B[context[:, i], :]`` of an emission (dense or sparse) for (n, N) contexts and
    weights (what ``Emission.predictive`` gives, to rounding), in O(N + distinct symbols' rows) a row."""
    context = np.ascontiguousarray(context, dtype=np.int64)
    weight = np.ascontiguousarray(weight, dtype=np.float64)
    if isinstance(emission, SparseEmission):
        out = np.multiply.outer((weight * emission.backoff[context]).sum(axis=1), emission.base)
        indptr, targets, excess = emission.symbol_rows
        _add_symbol_rows(context, weight, indptr, targets, excess, np.zeros((0, 0)), out)
        return out
    probs = np.ascontiguousarray(emission.to_dense(), dtype=np.float64)  # type: ignore[attr-defined]
    out = np.zeros((context.shape[0], probs.shape[1]))
    _add_symbol_rows(context, weight, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0), probs,
                     out)  # fmt: skip
    return out
