"""The top-K targets of window heads and their stacks under sparse emissions, without a dense row of T a row.

A window head's predictive distribution of a row, as its ``window_proba`` sums it, is::

    p(t) = scale base[t] + sum_g w_g (B[s_g, t] - backoff[s_g] base[t]) [(s_g, t) stored] + sum_e addend_e [t_e = t]

the backoff part of its sparse emission (one number a row times the shared base), each position's (or each distinct
symbol's) stored pairs' excess over it, then a few explicit entries (the conjunction head's pair and triple cells,
the copy head's copies and inductions), added in that order. :class:`SparseTerms` holds those terms of a block of
rows; a stack mixes its parts' distributions ``sum_k w_k p_k(t)``.

:func:`top_targets` finds each row's K best targets of such a mixture exactly, with the arithmetic of the dense path:
a target's probability is replayed term by term in the order the dense path adds them (so the values, and the
lowest-id-first order among equal ones, are the dense path's bit for bit). The targets are found by Fagin's
threshold algorithm: every explicit entry's target first, then, depth by depth, the next target of each symbol's
stored targets by decreasing probability and of each part's base order, until the K-th best beats what any target
not yet met can reach (``sum_k w_k sum_g w_g max(d-th stored probability of s_g, backoff[s_g] base[d-th of the
base order])``, with a margin of 1e-12 for rounding: every probability is at most 1). A row costs its explicit
entries and a few depths of lookups, never T.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba.typed import List

from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.heads.single_hop.scoring import insert_ranked
from dist_respattn.model.kernels.per_position import find_pair

__all__ = [
    "MARGIN",
    "CellRows",
    "SparseTerms",
    "cell_tables",
    "densify",
    "group_symbols",
    "list_indptr_of",
    "rows_in_order",
    "top_targets",
]

#: How far past the threshold the K-th best must be: the rounding of a probability (at most 1) summed in another
#: order is below 1e-13.
MARGIN = 1e-12


class SparseTerms(NamedTuple):
    """A head's predictive distributions of ``n`` rows as the sum its dense path adds.

    Attributes:
        table: the sparse emission ``B`` (its backoff, base and stored pairs).
        scale: (n,) float64 each row's factor of ``base``.
        symbols: (n, G) int64 and ``weights`` (n, G) float64: the symbols whose stored pairs are added, in order,
            each pair's excess weighed by ``weights`` (0: none).
        indptr: (n + 1,) int64; ``targets`` (m,) int64, ``addends`` (m,) float64: row ``r``'s explicit entries
            ``indptr[r]:indptr[r + 1]``, in the order they are added (after the stored pairs).
        cells: the rows of cells the head's lists read (:class:`CellRows`: a conjunction head's pair rows and triple
            rows), or ``()``.
        list_indptr: (n + 1,) int64; ``list_table`` (L,) int64, ``list_row`` (L,) int64 and ``list_scale`` (L,)
            float64: row ``r``'s lists ``list_indptr[r]:list_indptr[r + 1]``, in the order they are added (after the
            explicit entries), list ``l`` adding ``list_scale[l] * value`` of each cell of row ``list_row[l]`` of
            ``cells[list_table[l]]`` to its target.
    """

    table: SparseEmission
    scale: np.ndarray
    symbols: np.ndarray
    weights: np.ndarray
    indptr: np.ndarray
    targets: np.ndarray
    addends: np.ndarray
    cells: tuple[CellRows, ...] = ()
    list_indptr: np.ndarray | None = None
    list_table: np.ndarray = np.zeros(0, dtype=np.int64)
    list_row: np.ndarray = np.zeros(0, dtype=np.int64)
    list_scale: np.ndarray = np.zeros(0)


@numba.njit(cache=True, nogil=True)
def _rank_rows(indptr, values, ranked):  # pragma: no cover - compiled
    """``ranked``: each row's cell indices by decreasing value (the lower index first among equal ones)."""
    for u in range(indptr.shape[0] - 1):
        lo = indptr[u]
        hi = indptr[u + 1]
        if hi - lo > 32:
            order = np.argsort(-values[lo:hi], kind="mergesort")
            for j in range(hi - lo):
                ranked[lo + j] = lo + order[j]
            continue
        for j in range(lo, hi):  # insertion sort: most rows hold a few cells
            x = j
            v = values[j]
            at = j
            while at > lo and values[ranked[at - 1]] < v:
                ranked[at] = ranked[at - 1]
                at -= 1
            ranked[at] = x


class CellRows(NamedTuple):
    """Rows of cells (a conjunction head's pair or triple rows): row ``u``'s cells ``indptr[u]:indptr[u + 1]``, their
    ``targets`` (int32, increasing within a row) and ``values`` (float64); ``ranked`` (int32): each row's cells by
    decreasing value (the threshold search walks them)."""

    indptr: np.ndarray
    targets: np.ndarray
    values: np.ndarray
    ranked: np.ndarray

    @classmethod
    def build(cls, indptr: np.ndarray, targets: np.ndarray, values: np.ndarray) -> CellRows:
        indptr = np.asarray(indptr, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        ranked = np.empty(values.shape[0], dtype=np.int32)
        _rank_rows(indptr, values, ranked)
        return cls(np.asarray(indptr, dtype=np.int64), np.asarray(targets, dtype=np.int32),
                   np.asarray(values, dtype=np.float64), ranked)  # fmt: skip


#: Two empty cell tables: the lists of a head that has none.
_NO_CELLS = CellRows(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0), np.zeros(0, dtype=np.int32))


def rows_in_order(
    n: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr (n + 1,), targets, addends)`` of explicit entries given as ``(row, target, addend)`` arrays in the
    order they are added: grouped by row, each row's entries in that order."""
    row = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts]) if parts else np.zeros(0, np.int64)
    target = np.concatenate([np.asarray(p[1], dtype=np.int64) for p in parts]) if parts else np.zeros(0, np.int64)
    addend = np.concatenate([np.asarray(p[2], dtype=np.float64) for p in parts]) if parts else np.zeros(0)
    order = np.argsort(row, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=n), out=indptr[1:])
    return indptr, target[order], addend[order]


@numba.njit(cache=True, nogil=True)
def _group(context, weight, symbols, weights):  # pragma: no cover - compiled
    n_rows, n_pos = context.shape
    n_symbols = 0
    for r in range(n_rows):
        for i in range(n_pos):
            n_symbols = max(n_symbols, context[r, i] + 1)
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
            symbols[r, j] = c
            weights[r, j] = acc[c]
            acc[c] = 0.0


def group_symbols(context: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(symbols (n, N), weights (n, N))``: each row's distinct symbols of positive weight in order of first
    occurrence and their summed weights (0 past the last), as :func:`~dist_respattn.model.emission.mixture.
    symbol_mixture` sums them."""
    context = np.ascontiguousarray(context, dtype=np.int64)
    weight = np.ascontiguousarray(weight, dtype=np.float64)
    symbols = np.zeros(context.shape, dtype=np.int64)
    weights = np.zeros(context.shape)
    if context.size:
        _group(context, weight, symbols, weights)
    return symbols, weights


@numba.njit(cache=True, nogil=True)
def _densify_lists(l_indptr, l_table, l_row, l_scale, c_indptr, c_targets, c_values, out):  # pragma: no cover
    for r in range(out.shape[0]):
        for j in range(l_indptr[r], l_indptr[r + 1]):
            tab = l_table[j]
            u = l_row[j]
            for at in range(c_indptr[tab][u], c_indptr[tab][u + 1]):
                out[r, c_targets[tab][at]] += l_scale[j] * c_values[tab][at]


@numba.njit(cache=True, nogil=True)
def _densify(symbols, weights, indptr, targets, addends, s_indptr, s_targets, excess, out):  # pragma: no cover
    for r in range(out.shape[0]):
        for g in range(symbols.shape[1]):
            w = weights[r, g]
            if w == 0.0:
                continue
            c = symbols[r, g]
            for p in range(s_indptr[c], s_indptr[c + 1]):
                out[r, s_targets[p]] += w * excess[p]
        for e in range(indptr[r], indptr[r + 1]):
            out[r, targets[e]] += addends[e]


def densify(terms: SparseTerms) -> np.ndarray:
    """(n, T) the distributions the terms sum to, added in their order (tests; small T)."""
    table = terms.table
    out = np.multiply.outer(terms.scale, table.base)
    s_indptr, s_targets, excess = table.symbol_rows
    _densify(terms.symbols, terms.weights, terms.indptr, terms.targets, terms.addends, s_indptr, s_targets, excess,
             out)  # fmt: skip
    cells = cell_tables(terms)
    _densify_lists(list_indptr_of(terms), terms.list_table, terms.list_row, terms.list_scale,
                   _typed([c.indptr for c in cells]), _typed([c.targets for c in cells]),
                   _typed([c.values for c in cells]), out)  # fmt: skip
    return out


def _typed(values: list[np.ndarray]) -> List:
    out = List()
    for v in values:
        out.append(v)
    return out


def cell_tables(terms: SparseTerms) -> tuple[CellRows, CellRows]:
    """Exactly two cell tables of the terms' lists (empty ones in place of the missing): the compiled passes take
    both."""
    cells = tuple(terms.cells) + (_NO_CELLS,) * (2 - len(terms.cells))
    if len(cells) != 2:
        raise ValueError(f"{len(terms.cells)} cell tables: at most 2")
    return cells[0], cells[1]


def list_indptr_of(terms: SparseTerms) -> np.ndarray:
    """(n + 1,) int64 the rows' list pointers (zeros: terms without lists)."""
    n = terms.scale.shape[0]
    return np.zeros(n + 1, dtype=np.int64) if terms.list_indptr is None else terms.list_indptr


@numba.njit(cache=True, nogil=True)
def _part_value(
    t, r, k, scale, symbols, weights, heads, nexts, addends, indptr, sym_of, values, backoff, base, l_indptr, l_table,
    l_row, l_scale, c_indptr, c_targets, c_values,
):  # pragma: no cover - compiled  # fmt: skip
    """Part ``k``'s probability of target ``t`` in row ``r``, summed in the dense path's order: the backoff part,
    the stored pairs, the explicit entries, the lists' cells."""
    b = base[t]
    v = scale[r] * b
    for g in range(symbols.shape[1]):
        w = weights[r, g]
        if w == 0.0:
            continue
        c = symbols[r, g]
        p = find_pair(indptr, sym_of, t, c)
        if p >= 0:
            v += w * (values[p] - backoff[c] * b)
    e = heads[k][t]
    while e >= 0:
        v += addends[e]
        e = nexts[k][e]
    for j in range(l_indptr[r], l_indptr[r + 1]):
        tab = 2 * k + l_table[j]
        at = find_pair(c_indptr[tab], c_targets[tab], t=l_row[j], c=t)  # row l_row[j]'s cell of target t
        if at >= 0:
            v += l_scale[j] * c_values[tab][at]
    return v


@numba.njit(cache=True, nogil=True)
def _value(t, r, mix, scales, symbols, weights, heads, nexts, e_addends, s_indptr, s_symbols, values, backoff, base,
           l_indptr, l_table, l_row, l_scale, c_indptr, c_targets, c_values):  # pragma: no cover  # fmt: skip
    """The mixture's probability of target ``t`` in row ``r``: ``0 + mix[r, 0] p_0(t) + mix[r, 1] p_1(t) + ...``."""
    v = 0.0
    for k in range(len(scales)):
        v += mix[r, k] * _part_value(
            t, r, k, scales[k], symbols[k], weights[k], heads, nexts, e_addends[k], s_indptr[k], s_symbols[k],
            values[k], backoff[k], base[k], l_indptr[k], l_table[k], l_row[k], l_scale[k], c_indptr, c_targets,
            c_values,
        )  # fmt: skip
    return v


@numba.njit(cache=True, nogil=True)
def _top_targets(
    mix, scales, symbols, weights, e_indptr, e_targets, e_addends, s_indptr, s_symbols, values, backoff, base,
    r_indptr, r_targets, r_values, orders, l_indptr, l_table, l_row, l_scale, c_indptr, c_targets, c_values,
    c_ranked, top_targets, top_values, visited,
):  # pragma: no cover - compiled  # fmt: skip
    n_parts = len(scales)
    n_rows = top_targets.shape[0]
    cap = top_targets.shape[1]
    num_targets = base[0].shape[0]
    seen = np.zeros(num_targets, dtype=np.bool_)
    touched = np.empty(num_targets, dtype=np.int64)
    heads = List()
    nexts = List()
    for k in range(n_parts):
        heads.append(np.full(num_targets, -1, dtype=np.int64))
        nexts.append(np.full(e_targets[k].shape[0], -1, dtype=np.int64))
    tails = np.full((n_parts, num_targets), -1, dtype=np.int64)
    for r in range(n_rows):
        n_touched = 0
        count = 0
        # Every explicit entry's target, its entries chained in order.
        for k in range(n_parts):
            head = heads[k]
            nxt = nexts[k]
            tk = e_targets[k]
            for e in range(e_indptr[k][r], e_indptr[k][r + 1]):
                t = tk[e]
                if head[t] < 0:
                    head[t] = e
                else:
                    nxt[tails[k, t]] = e
                tails[k, t] = e
                if not seen[t]:
                    seen[t] = True
                    touched[n_touched] = t
                    n_touched += 1
        for j in range(n_touched):
            t = touched[j]
            v = _value(t, r, mix, scales, symbols, weights, heads, nexts, e_addends, s_indptr, s_symbols, values,
                       backoff, base, l_indptr, l_table, l_row, l_scale, c_indptr, c_targets, c_values)  # fmt: skip
            count = insert_ranked(t, v, top_targets[r], top_values[r], count)
        depth = 0
        while True:
            # What a target not met yet can reach: at this depth of every list.
            bound = 0.0
            for k in range(n_parts):
                off = base[k][orders[k][depth]] if depth < num_targets else 0.0
                part = 0.0
                sk = symbols[k]
                wk = weights[k]
                for g in range(sk.shape[1]):
                    w = wk[r, g]
                    if w == 0.0:
                        continue
                    c = sk[r, g]
                    at = r_indptr[k][c] + depth
                    stored = r_values[k][at] if at < r_indptr[k][c + 1] else 0.0
                    part += w * max(stored, backoff[k][c] * off)
                for j in range(l_indptr[k][r], l_indptr[k][r + 1]):
                    tab = 2 * k + l_table[k][j]
                    u = l_row[k][j]
                    at = c_indptr[tab][u] + depth
                    if at < c_indptr[tab][u + 1]:
                        part += l_scale[k][j] * c_values[tab][c_ranked[tab][at]]
                bound += mix[r, k] * part
            if count == cap and top_values[r, cap - 1] > bound + MARGIN:
                break
            if depth >= num_targets:
                break
            # Each part's lists at this depth: its symbols' stored targets by decreasing probability, its base order,
            # its rows of cells by decreasing value.
            for kk in range(n_parts):
                sk = symbols[kk]
                wk = weights[kk]
                n_symbol_lists = sk.shape[1]
                n_cell_lists = l_indptr[kk][r + 1] - l_indptr[kk][r]
                for g in range(n_symbol_lists + 1 + n_cell_lists):
                    if g < n_symbol_lists:
                        if wk[r, g] == 0.0:
                            continue
                        c = sk[r, g]
                        at = r_indptr[kk][c] + depth
                        if at >= r_indptr[kk][c + 1]:
                            continue
                        t = r_targets[kk][at]
                    elif g == n_symbol_lists:
                        t = orders[kk][depth]
                    else:
                        j = l_indptr[kk][r] + g - n_symbol_lists - 1
                        tab = 2 * kk + l_table[kk][j]
                        u = l_row[kk][j]
                        at = c_indptr[tab][u] + depth
                        if at >= c_indptr[tab][u + 1]:
                            continue
                        t = c_targets[tab][c_ranked[tab][at]]
                    if seen[t]:
                        continue
                    seen[t] = True
                    touched[n_touched] = t
                    n_touched += 1
                    v = _value(t, r, mix, scales, symbols, weights, heads, nexts, e_addends, s_indptr, s_symbols,
                               values, backoff, base, l_indptr, l_table, l_row, l_scale, c_indptr, c_targets,
                               c_values)  # fmt: skip
                    count = insert_ranked(t, v, top_targets[r], top_values[r], count)
            depth += 1
        visited[r, 0] = n_touched
        visited[r, 1] = depth
        for j in range(n_touched):
            seen[touched[j]] = False
        for k in range(n_parts):
            tk = e_targets[k]
            for e in range(e_indptr[k][r], e_indptr[k][r + 1]):
                heads[k][tk[e]] = -1
                nexts[k][e] = -1


def top_targets(
    parts: list[SparseTerms], mix: np.ndarray, k: int, visited: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(targets (n, K) int64, probabilities (n, K))``: each row's ``k`` targets of highest
    ``sum_j mix[:, j] p_j(t)`` (``p_j`` the distribution ``parts[j]`` sums to; lowest id first among equal ones),
    best first, and those probabilities, exactly as the dense sum ``0 + mix[:, 0] p_0 + mix[:, 1] p_1 + ...``
    computes them. ``k`` is at most T. ``visited``: (n, 2) int64 filled with each row's targets evaluated and the
    depth the search stopped at (what it cost)."""
    n = int(np.asarray(mix).shape[0])
    tables = [p.table for p in parts]
    num_targets = tables[0].num_targets
    k = min(int(k), num_targets)
    mix = np.ascontiguousarray(mix, dtype=np.float64)
    targets = np.zeros((n, k), dtype=np.int64)
    probabilities = np.zeros((n, k))
    if n == 0:
        return targets, probabilities

    typed = _typed
    ranked = [t.ranked_rows for t in tables]
    cells = [c for p in parts for c in cell_tables(p)]
    _top_targets(
        mix,
        typed([np.ascontiguousarray(p.scale, dtype=np.float64) for p in parts]),
        typed([np.ascontiguousarray(p.symbols, dtype=np.int64) for p in parts]),
        typed([np.ascontiguousarray(p.weights, dtype=np.float64) for p in parts]),
        typed([np.ascontiguousarray(p.indptr, dtype=np.int64) for p in parts]),
        typed([np.ascontiguousarray(p.targets, dtype=np.int64) for p in parts]),
        typed([np.ascontiguousarray(p.addends, dtype=np.float64) for p in parts]),
        typed([t.support.indptr for t in tables]),
        typed([t.support.symbols for t in tables]),
        typed([t.values for t in tables]),
        typed([t.backoff for t in tables]),
        typed([t.base for t in tables]),
        typed([r[0] for r in ranked]),
        typed([r[1] for r in ranked]),
        typed([r[2] for r in ranked]),
        typed([t.base_order for t in tables]),
        typed([list_indptr_of(p) for p in parts]),
        typed([np.ascontiguousarray(p.list_table, dtype=np.int64) for p in parts]),
        typed([np.ascontiguousarray(p.list_row, dtype=np.int64) for p in parts]),
        typed([np.ascontiguousarray(p.list_scale, dtype=np.float64) for p in parts]),
        typed([c.indptr for c in cells]),
        typed([c.targets for c in cells]),
        typed([c.values for c in cells]),
        typed([c.ranked for c in cells]),
        targets,
        probabilities,
        np.zeros((n, 2), dtype=np.int64) if visited is None else visited,
    )
    return targets, probabilities
