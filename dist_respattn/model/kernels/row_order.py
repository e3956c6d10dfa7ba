"""Token windows visited grouped by target: the order the window E-steps read a block's rows in.

An E-step reads and updates the emission cells ``(target, symbol)`` of each row's window. Over a table larger than
cache (a dense (T, S) table of a few thousand words, a sparse support's pair values), rows in their own order miss
the cache at nearly every cell; grouped by target, one target's rows read one row of the table while it is in cache.
The order is a stable counting sort of the block's targets: a fixed order for the same rows, whatever the worker, so
the sums stay bit-identical across workers and restarts.
"""

from __future__ import annotations

import numba
import numpy as np

from dist_respattn.model.arguments import kernel_ids
from dist_respattn.model.kernels.per_position import target_order
from dist_respattn.model.kernels.prefetch import prefetch_element
from dist_respattn.model.rows import WindowArrays, WindowRows

__all__ = ["by_target", "gather_windows", "windows_in_order"]

#: How many rows ahead :func:`gather_windows` prefetches a row's span and then its window's tokens.
_AHEAD = 16


def by_target(rows: WindowRows, num_targets: int) -> np.ndarray:
    """The rows' indices (n,) int64 stably sorted by target (a counting sort, O(n + T))."""
    return target_order(kernel_ids(rows.target), num_targets)  # int32 targets: the build the single head uses


@numba.njit(cache=True, nogil=True)
def gather_windows(tokens, begin, end, order):  # pragma: no cover - compiled
    """``(tokens, begin, end)`` of the rows ``order[0], order[1], ...``: their windows' tokens one after another.
    A first pass reads each row's span (its ``begin`` and ``end`` prefetched rows ahead), a second copies the windows
    (each prefetched rows ahead from the span the first pass kept: no load waits on another's miss)."""
    n = order.shape[0]
    new_begin = np.empty(n, dtype=np.int64)
    new_end = np.empty(n, dtype=np.int64)
    source = np.empty(n, dtype=np.int64)
    total = 0
    for k in range(n):
        if k + _AHEAD < n:
            prefetch_element(begin, order[k + _AHEAD])
            prefetch_element(end, order[k + _AHEAD])
        r = order[k]
        source[k] = begin[r]
        new_begin[k] = total
        total += end[r] - begin[r]
        new_end[k] = total
    new_tokens = np.empty(total, dtype=np.int32)
    for k in range(n):
        if k + _AHEAD < n:
            prefetch_element(tokens, source[k + _AHEAD])  # windows anywhere in the stream
        lo = source[k]
        for x in range(new_end[k] - new_begin[k]):
            new_tokens[new_begin[k] + x] = tokens[lo + x]
    return new_tokens, new_begin, new_end


def windows_in_order(rows: WindowRows, order: np.ndarray, *, narrow_queries: bool = False) -> WindowArrays:
    """``rows`` as the window kernels take them (:meth:`~dist_respattn.model.rows.WindowRows.kernel_arrays`),
    visited in ``order``, their windows' tokens copied into that order: the E-step then reads them one after another,
    not from anywhere in a block (grouping by target gained half as much without the copy, at 300,000 sampled rows
    of the chain of hops). The queries are not copied (a float64 copy of 300,000 rows in their order cost more than
    it saved): the E-steps prefetch each row's. ``narrow_queries``: as ``kernel_arrays`` takes it."""
    arrays = rows.kernel_arrays(narrow_queries=narrow_queries)
    tokens, begin, end = gather_windows(arrays.tokens, arrays.begin, arrays.end, order)
    weight = arrays.weight[order] if arrays.weight.shape[0] > 0 else arrays.weight
    return WindowArrays(tokens, begin, end, arrays.target[order], arrays.query_table, arrays.query_index[order], weight)
