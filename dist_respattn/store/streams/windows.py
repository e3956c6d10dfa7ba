"""A stream's rows made from its tokens in one compiled pass: the target positions, windows, queries, targets.

A block of a stream store is a span of tokens; its rows are the windows of the targets in it. Made with
NumPy, each row costs an (N,) int64 index and a gathered query, two temporaries of the block's size
(measured: about a third of the sparse E-step kernel's own time per partition). Here each row is
copied straight from the span: N ids, D floats of its query's embedding, and its target.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["full_window_rows", "make_windows", "target_positions"]


@numba.njit(cache=True, nogil=True)
def _target_positions_numba(starts, row_starts, context_length, start, stop, out):  # pragma: no cover - compiled
    """Fills ``out`` (stop - start,) with the target token of rows ``[start, stop)``, document by document."""
    lo, hi = 0, row_starts.shape[0] - 1
    # The document of row `start`: the last d with row_starts[d] <= start (documents may hold no rows).
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if row_starts[mid] <= start:
            lo = mid
        else:
            hi = mid - 1
    d = lo
    row = start
    k = 0
    while row < stop:
        while row_starts[d + 1] <= row:
            d += 1
        end = min(stop, row_starts[d + 1])
        first = starts[d] + context_length + (row - row_starts[d])
        for j in range(end - row):
            out[k + j] = first + j
        k += end - row
        row = end


def target_positions(
    starts: np.ndarray, row_starts: np.ndarray, context_length: int, start: int, stop: int
) -> np.ndarray:
    """The target token of rows ``[start, stop)``: (n,) int64.

    ``starts`` (n_docs,) are the documents' first tokens and ``row_starts`` (n_docs + 1,) their first rows.
    """
    out = np.empty(max(stop - start, 0), dtype=np.int64)
    if out.size:
        _target_positions_numba(starts, row_starts, int(context_length), int(start), int(stop), out)
    return out


@numba.njit(cache=True, nogil=True)
def _windows_numba(span, local, table, context, query, target):  # pragma: no cover - compiled
    n_pos = context.shape[1]
    dim = query.shape[1]
    for r in range(local.shape[0]):
        j = local[r]
        for i in range(n_pos):
            context[r, i] = span[j - n_pos + i]
        previous = span[j - 1]
        for d in range(dim):
            query[r, d] = table[previous, d]
        target[r] = span[j]


def make_windows(
    span: np.ndarray, local: np.ndarray, context_length: int, table: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(context (n, N) int32, query (n, D), target (n,) int32)`` of the rows whose targets are ``span[local]``.

    ``span`` (L,) holds token ids already checked to lie in ``[0, S)``, with at least N tokens before every
    ``local`` (n,) position; ``table`` (S, D) is the embedding table, whose dtype the queries keep.
    """
    local = np.ascontiguousarray(local, dtype=np.int64)
    n = local.shape[0]
    context = np.empty((n, int(context_length)), dtype=np.int32)
    query = np.empty((n, table.shape[1]), dtype=table.dtype)
    target = np.empty(n, dtype=np.int32)
    if n:
        _windows_numba(np.ascontiguousarray(span), local, np.ascontiguousarray(table), context, query, target)
    return context, query, target


@numba.njit(cache=True, nogil=True)
def _full_window_rows_numba(span, end, n_pos, begin, target, query_index):  # pragma: no cover - compiled
    for r in range(end.shape[0]):
        j = end[r]
        begin[r] = j - n_pos
        target[r] = span[j]
        query_index[r] = span[j - 1]


def full_window_rows(
    span: np.ndarray, end: np.ndarray, context_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(begin, target, query_index)`` (n,) int64 of the full windows ending at ``span[end]`` (their targets): each
    row's window ``span[end - N : end]``, its target ``span[end]`` and its query's row of the embedding table, the
    previous token ``span[end - 1]``; in one pass over the rows (``end`` (n,) int64, at least N tokens before each)."""
    end = np.ascontiguousarray(end, dtype=np.int64)
    n = end.shape[0]
    begin, target, query_index = (np.empty(n, dtype=np.int64) for _ in range(3))
    if n:
        _full_window_rows_numba(np.ascontiguousarray(span), end, int(context_length), begin, target, query_index)
    return begin, target, query_index
