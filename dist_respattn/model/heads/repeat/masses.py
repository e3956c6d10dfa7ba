"""The wrapped head's mass on each row's history, ``p(H)``, from its sparse terms: no (T,) distribution a row.

The gate of a row needs only two numbers of the wrapped distribution besides ``p(t)``: its mass on the history's
distinct tokens ``H`` and on the rest. A window head under a sparse emission gives its distribution as terms
(:class:`~dist_respattn.model.heads.sparse_top.SparseTerms`)::

    p(x) = scale base[x] + sum_g w_g excess[s_g, x] + sum_e addend_e [x_e = x] + sum_l scale_l cell_l[x]

so its mass on ``H`` is ``scale base(H) + sum_g w_g E_H[s_g] + (the entries and cells whose target is in H)``, with
``E_H[s] = sum_{x in H} excess[s, x]`` over the symbol's stored pairs. ``E_H`` and ``base(H)`` are kept for the
sliding history as its tokens come and go (a token entering adds its column of stored pairs, one leaving takes it
away), so a row costs its terms plus the columns of the tokens its history gained: a document's whole history for
the price of its distinct tokens once, where the (T,) path paid ``T`` times the window a row.

The sums are the dense path's up to rounding (another order of the same terms): within ~1e-15 of the mass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np

from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.heads.sparse_top import SparseTerms, cell_tables, list_indptr_of
from dist_respattn.model.heads.stack.head import StackHead, mix_rows
from dist_respattn.model.heads.windowed import WindowHead
from dist_respattn.model.rows import WindowRows

__all__ = ["HistoryMasses", "PieceMasses", "TargetColumns", "has_masses", "history_masses", "target_columns"]


class TargetColumns(NamedTuple):
    """A sparse emission's stored pairs by target, as the history's running sums read them.

    Attributes:
        indptr: (T + 1,) int64; target ``x``'s pairs are ``indptr[x]:indptr[x + 1]``.
        symbols: (P,) int32 their symbols; ``excess``: (P,) float64 ``B[s, x] - backoff[s] base[x]``.
        symbol_totals: (S,) float64 each symbol's ``sum_x excess[s, x]``; ``base``: (T,) the shared base and
            ``base_total`` its sum.
    """

    indptr: np.ndarray
    symbols: np.ndarray
    excess: np.ndarray
    symbol_totals: np.ndarray
    base: np.ndarray
    base_total: float


def target_columns(table: SparseEmission) -> TargetColumns:
    """The stored pairs of ``table`` by target (the support's own order: no sort)."""
    support = table.support
    targets = np.repeat(np.arange(support.num_targets, dtype=np.int64), np.diff(support.indptr))
    excess = table.values - table.backoff[support.symbols] * table.base[targets]
    totals = np.bincount(support.symbols, weights=excess, minlength=support.num_symbols).astype(np.float64)
    return TargetColumns(support.indptr, support.symbols, excess, totals, table.base, float(table.base.sum()))


def has_masses(view: WindowHead) -> bool:
    """Whether the wrapped head's distributions come as sparse terms (:attr:`WindowHead.has_terms`): then its masses
    on the histories are read from them (:class:`HistoryMasses`), else from its (T,) rows."""
    return bool(view.has_terms)


class PieceMasses(NamedTuple):
    """A piece's rows under the wrapped head, as :meth:`HistoryMasses.masses` reads them.

    Attributes:
        own: (m, 2) each row's ``(log p(q | c), log p(t | c, q))``; ``seen``: (m,) the mass on the row's history;
            ``total``: (m,) the whole mass (1 up to rounding).
    """

    own: np.ndarray
    seen: np.ndarray
    total: np.ndarray


class _PartState:
    """One part's running sums over the history it has slid to (kept from one piece of a block to the next)."""

    def __init__(self, columns: TargetColumns, num_symbols: int) -> None:
        self.columns = columns
        self.counts = np.zeros(num_symbols, dtype=np.int64)
        self.state = np.zeros(3, dtype=np.int64)
        self.held = np.zeros(num_symbols)
        self.held_base = np.zeros(1)


class HistoryMasses:
    """The wrapped head's mass on each row's history and its total mass, a piece of a block at a time, in row order.

    Args:
        view: the wrapped head as a window head whose predictions have terms (:func:`has_masses`): a stack's parts
            are read one by one and mixed with its prediction weights.
        tokens: (L,) the block's token span; the histories are windows of it (:meth:`masses`' ``begin``, ``end``).
        columns: the parts' emissions by target (:class:`TargetColumns`) by ``id`` of the emission, built as they
            are first read and kept by the caller (a head's are built once, whatever the blocks).
    """

    def __init__(self, view: WindowHead, tokens: np.ndarray, columns: dict[int, TargetColumns]) -> None:
        self.view = view
        self.tokens = tokens
        self.states: dict[int, _PartState] = {}
        self.columns = columns

    def _state(self, k: int, table: SparseEmission) -> _PartState:
        if k not in self.states:
            key = id(table)
            if key not in self.columns:
                self.columns[key] = target_columns(table)
            self.states[k] = _PartState(self.columns[key], int(table.num_symbols))
        return self.states[k]

    def masses(self, rows: WindowRows, begin: np.ndarray, end: np.ndarray) -> PieceMasses:
        """The next piece's rows (the wrapped head's windows) with their histories ``tokens[begin:end]``
        (:class:`PieceMasses`)."""
        parts, weights, own = _parts(self.view, rows)
        m = rows.num_rows
        seen, total = np.zeros(m), np.zeros(m)
        for k, (part, sub) in enumerate(parts):
            terms = part.window_terms(sub, part.window_attention(sub))
            assert terms is not None  # has_masses
            state = self._state(k, terms.table)
            part_seen, part_total = np.empty(m), np.empty(m)
            _masses_of(self.tokens, begin, end, state, terms, part_seen, part_total)
            seen += weights[:, k] * part_seen
            total += weights[:, k] * part_total
        return PieceMasses(own, seen, total)


def _parts(
    view: WindowHead, rows: WindowRows
) -> tuple[Sequence[tuple[WindowHead, WindowRows]], np.ndarray, np.ndarray]:
    """``(parts, weights (m, K), own (m, 2))``: the heads whose distributions the wrapped one mixes, each with the
    rows as it reads them, their weights per row, and the wrapped head's row densities."""
    if isinstance(view, StackHead):
        densities = view.densities(rows)
        joint, target, _ = mix_rows(view.gate, densities, view.mode)
        weights = view.prediction_weights(densities)
        live = [k for k in range(len(view.views)) if view.gate[k] > 0.0]
        parts = [(view.views[k], view.component_rows(rows, k)) for k in live]
        return parts, weights[:, live], np.stack([joint - target, target], axis=1)
    own = np.asarray(view.row_densities(rows), dtype=np.float64)  # type: ignore[attr-defined]
    return [(view, rows)], np.ones((rows.num_rows, 1)), own


def _masses_of(
    tokens: np.ndarray, begin: np.ndarray, end: np.ndarray, state: _PartState, terms: SparseTerms,
    seen: np.ndarray, total: np.ndarray,
) -> None:  # fmt: skip
    c = state.columns
    first, second = cell_tables(terms)
    history_masses(
        tokens, np.asarray(begin, dtype=np.int64), np.asarray(end, dtype=np.int64),
        c.indptr, c.symbols, c.excess, c.symbol_totals, c.base, c.base_total,
        state.counts, state.state, state.held, state.held_base,
        terms.scale, terms.symbols, terms.weights, terms.indptr, terms.targets, terms.addends,
        list_indptr_of(terms), terms.list_table, terms.list_row, terms.list_scale,
        first.indptr, first.targets, first.values, second.indptr, second.targets, second.values,
        seen, total,
    )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _enter(x, indptr, symbols, excess, base, held, held_base):  # pragma: no cover - compiled
    for p in range(indptr[x], indptr[x + 1]):
        held[symbols[p]] += excess[p]
    held_base[0] += base[x]


@numba.njit(cache=True, nogil=True)
def _leave(x, indptr, symbols, excess, base, held, held_base):  # pragma: no cover - compiled
    for p in range(indptr[x], indptr[x + 1]):
        held[symbols[p]] -= excess[p]
    held_base[0] -= base[x]


@numba.njit(cache=True, nogil=True)
def _slide_sums(tokens, lo, hi, indptr, symbols, excess, base, counts, state, held, held_base):  # pragma: no cover
    """Move the history ``[state[0], state[1])`` to ``[lo, hi)``, its running sums with it (a new start: zeros).
    :func:`~dist_respattn.model.heads.repeat.kernels._slide` with the sums beside the counts: a compiled callback
    for them would cost a call a token."""
    if lo < state[0] or hi < state[1] or lo >= state[1]:
        for x in range(state[0], state[1]):  # every count and every sum back to exactly 0
            s = tokens[x]
            if counts[s] > 0:
                counts[s] = 0
                for p in range(indptr[s], indptr[s + 1]):
                    held[symbols[p]] = 0.0
        held_base[0] = 0.0
        state[0] = lo
        state[1] = lo
        state[2] = 0
    while state[1] < hi:
        s = tokens[state[1]]
        if counts[s] == 0:
            state[2] += 1
            _enter(s, indptr, symbols, excess, base, held, held_base)
        counts[s] += 1
        state[1] += 1
    while state[0] < lo:
        s = tokens[state[0]]
        counts[s] -= 1
        if counts[s] == 0:
            state[2] -= 1
            _leave(s, indptr, symbols, excess, base, held, held_base)
        state[0] += 1


@numba.njit(cache=True, nogil=True)
def history_masses(  # pragma: no cover - compiled
    tokens, begin, end, col_indptr, col_symbols, col_excess, symbol_totals, base, base_total,
    counts, state, held, held_base,
    scale, symbols, weights, indptr, targets, addends,
    l_indptr, l_table, l_row, l_scale, c0_indptr, c0_targets, c0_values, c1_indptr, c1_targets, c1_values,
    seen, total,
):  # fmt: skip
    """Each row's mass of its terms on its history and its total mass.

    Args:
        tokens: (L,) the token span; ``begin``, ``end``: (n,) int64 each row's history ``tokens[begin:end]``.
        col_indptr, col_symbols, col_excess, symbol_totals, base, base_total: the emission's
            :class:`TargetColumns`.
        counts: (S,) int64, ``state`` (3,) int64, ``held`` (S,) float64 ``E_H`` and ``held_base`` (1,) ``base(H)``:
            the history slid to so far (zeros for a new span), updated.
        scale ... values: the rows' :class:`~dist_respattn.model.heads.sparse_top.SparseTerms` (the two cell tables
            as their arrays).
        seen, total: (n,) float64 out.
    """
    n = begin.shape[0]
    for r in range(n):
        _slide_sums(tokens, begin[r], end[r], col_indptr, col_symbols, col_excess, base, counts, state, held,
                    held_base)  # fmt: skip
        on = scale[r] * held_base[0]
        every = scale[r] * base_total
        for g in range(symbols.shape[1]):
            w = weights[r, g]
            if w == 0.0:
                continue
            s = symbols[r, g]
            on += w * held[s]
            every += w * symbol_totals[s]
        for e in range(indptr[r], indptr[r + 1]):
            every += addends[e]
            if counts[targets[e]] > 0:
                on += addends[e]
        for j in range(l_indptr[r], l_indptr[r + 1]):
            u = l_row[j]
            if l_table[j] == 0:
                lo, hi, cell_targets, cell_values = c0_indptr[u], c0_indptr[u + 1], c0_targets, c0_values
            else:
                lo, hi, cell_targets, cell_values = c1_indptr[u], c1_indptr[u + 1], c1_targets, c1_values
            for at in range(lo, hi):
                v = l_scale[j] * cell_values[at]
                every += v
                if counts[cell_targets[at]] > 0:
                    on += v
        seen[r] = on
        total[r] = every
