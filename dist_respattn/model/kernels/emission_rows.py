"""One pass over a sparse emission's pairs: the MAP values an M-step makes, and the row sums that check them.

Both run on the driver (or a shard's owner) between two passes over the data, on the critical path of every
iteration. Written with NumPy, each took several temporaries the size of the support (and the check a binary
search for each pair's target): at 14.2M pairs ~0.25 s to make the values and ~0.36 s to check them. One pass
over the pairs needs neither; the check walks the support's CSR rows, a target each.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["add_stored_rows", "column_totals", "map_pair_values", "pair_row_sums", "pair_row_totals"]


@numba.njit(cache=True, nogil=True)
def map_pair_values(count, row_total, strength, base, symbols, targets):  # pragma: no cover - compiled
    """(P,) MAP values ``(c + a_s u_t) / (c_s + a_s)`` of pairs ``(symbols[p], targets[p])`` from their counts
    ``count`` (P,), the rows' totals (S,), strengths (S,) and base (T,); a row of no count and no strength is the
    base. NumPy's operations on whole arrays, pair by pair in the same order: the same bits."""
    values = np.empty(count.shape[0])
    for p in range(count.shape[0]):
        s = symbols[p]
        u = base[targets[p]]
        den = row_total[s] + strength[s]
        values[p] = (count[p] + strength[s] * u) / den if den > 0.0 else u
    return values


@numba.njit(cache=True, nogil=True)
def pair_row_sums(values, base, indptr, symbols, num_symbols):  # pragma: no cover - compiled
    """``(sums, stored_base)``, each (S,): per symbol, the sum of its pairs' ``values`` (P,) and of the base (T,)
    of their targets."""
    sums = np.zeros(num_symbols)
    stored_base = np.zeros(num_symbols)
    for t in range(indptr.shape[0] - 1):
        u = base[t]
        for p in range(indptr[t], indptr[t + 1]):
            s = symbols[p]
            sums[s] += values[p]
            stored_base[s] += u
    return sums, stored_base


@numba.njit(cache=True, nogil=True)
def pair_row_totals(symbols, counts, num_symbols):  # pragma: no cover - compiled
    """(S,) per symbol, the sum of its pairs' ``counts`` (P,), added pair by pair in order from 0: what
    ``np.bincount(symbols, weights=counts, minlength=S)`` gives, to the bit, without its (P,) intp copy of the
    symbols."""
    totals = np.zeros(num_symbols)
    for p in range(symbols.shape[0]):
        totals[symbols[p]] += counts[p]
    return totals


@numba.njit(cache=True, nogil=True)
def column_totals(count_ts):  # pragma: no cover - compiled
    """(S,) per column of ``count_ts`` (T, S), its sum added row by row from the first: the same bits whatever the
    number of columns, so a shard of the columns (a sharded M-step's) totals them as the whole table does. NumPy's
    ``sum(axis=0)`` adds a lone contiguous column pairwise but several columns row by row."""
    totals = np.zeros(count_ts.shape[1])
    for t in range(count_ts.shape[0]):
        for s in range(count_ts.shape[1]):
            totals[s] += count_ts[t, s]
    return totals


@numba.njit(cache=True, nogil=True)
def add_stored_rows(context, attention, indptr, targets, excess, out):  # pragma: no cover - compiled
    """Add each position's symbol's stored pairs to ``out`` (n, T) in place: ``out[r, targets[p]] += attention[r, i]
    * excess[p]`` for every pair ``p`` of symbol ``context[r, i]`` (CSR ``indptr`` (S + 1,)), position by position,
    row by row, pair by pair: the order ``np.add.at`` over the same index lists adds in, so the same bits, without
    its per-element dispatch (it was most of a conjunction head's predictions at T = 5,000)."""
    n, n_pos = context.shape
    for i in range(n_pos):
        for r in range(n):
            s = context[r, i]
            a = attention[r, i]
            for p in range(indptr[s], indptr[s + 1]):
                out[r, targets[p]] += a * excess[p]
