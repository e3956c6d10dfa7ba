"""The conjunction head's compiled passes over token windows: the E-step and held-out scoring.

Per position, over each row's window (O(N) a row, two binary searches at each position within the conjunction
depth). Windows are :class:`~dist_respattn.model.rows.WindowRows` spans, oldest first: position ``x`` of a window
``tokens[lo:hi]`` has recency ``hi - 1 - x`` and context column ``N - hi + x``; the row's current token (the one
whose embedding is the query on a token-stream store) is ``q = tokens[hi - 1]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.kernels.log_weights import NO_ROWS, exp_shifted, keep_row, squared_distance
from dist_respattn.model.kernels.per_position import GROUP_BY_TARGET_TABLE_BYTES, SparseKernelParameters, find_pair
from dist_respattn.model.kernels.prefetch import prefetch_element, prefetch_item
from dist_respattn.model.kernels.row_order import by_target, windows_in_order
from dist_respattn.model.rows import WindowRows, split_query_table

__all__ = [
    "ConjArrays",
    "ConjParameters",
    "LeaveOneOut",
    "conj_estep",
    "conj_score",
    "conj_score_grid",
    "find_key",
    "find_pair_slot",
    "pair_of_cells",
    "pair_table",
    "row_stats",
]

_NO_VALUES = np.zeros(0)
_NO_INDEX = np.zeros(0, dtype=np.int64)
_NO_SYMBOLS = np.zeros(0, dtype=np.int32)
_NO_TABLE = np.zeros((0, 0))
_NO_ROWS = np.zeros(0, dtype=np.int32)
_NO_SLOTS = np.zeros((0, 0), dtype=np.int32)
_PREFETCH_ROWS = 8  # how many rows ahead the passes prefetch the cells a row reads


@dataclass(frozen=True)
class ConjParameters:
    """A conjunction head's parameters as the kernels read them.

    Attributes:
        key_means, inv_two_sigma2, gate_const, prior, log_prior: the single head's gate (``prior`` (N,) in column
            order, ``prior[N - 1]`` the most recent).
        depth: positions of recency ``< depth`` read the pair rows; ``current``: their prior mean is the current
            token's row ``B[q]`` (else the attended token's, ``B[a]``).
        num_symbols: S (a pair's key is ``a * S + q``).
        pair_keys: (P,) int64 increasing; ``slots``, ``shift``: their hash table (:func:`pair_table`); ``indptr``
            (P + 1,) int64: pair ``p``'s stored targets are ``targets[indptr[p]:indptr[p + 1]]`` (int32, increasing).
        pair_weight: (P,) ``s_p / (n_p + s_p)``, the weight of ``B[a, t]`` in the pair's row (1 for an infinite
            strength); ``cell_value``: (M,) ``n[p, t] / (n_p + s_p)``.
        log_emission_ts: (T, S) ``log B`` target-major for a dense emission, else (0, 0); a sparse one's
            ``indptr`` (T + 1,), ``symbols`` (P,), ``log_values``, ``log_backoff`` (S,), ``log_base`` (T,).
        triple_keys: (U,) int64 increasing, the stored triples ``(p * S + a) * S + q`` (``p`` the token before the
            attended one), empty at order 2; ``triple_slots``, ``triple_shift``: their hash table; ``triple_indptr``
            (U + 1,), ``triple_targets`` (M3,) int32, ``triple_weight`` (U,) and ``triple_value`` (M3,): their rows
            as the pair rows' (:func:`~dist_respattn.model.heads.conj.head.pair_rows`), leaning toward the pair row.
        direct_row, direct_slots: a sparse emission's direct symbol -> pair rows of its most frequent targets
            (:func:`~dist_respattn.model.kernels.per_position.direct_pair_rows`), which the E-step reads instead of
            a binary search; empty for a dense one. Not among :meth:`arrays` (the scoring passes do not read them).
    """

    key_means: np.ndarray
    inv_two_sigma2: float
    gate_const: float
    prior: np.ndarray
    log_prior: np.ndarray
    depth: int
    current: bool
    num_symbols: int
    pair_keys: np.ndarray
    slots: np.ndarray
    shift: int
    indptr: np.ndarray
    targets: np.ndarray
    pair_weight: np.ndarray
    cell_value: np.ndarray
    log_emission_ts: np.ndarray
    b_indptr: np.ndarray
    b_symbols: np.ndarray
    log_values: np.ndarray
    log_backoff: np.ndarray
    log_base: np.ndarray
    triple_keys: np.ndarray
    triple_slots: np.ndarray
    triple_shift: int
    triple_indptr: np.ndarray
    triple_targets: np.ndarray
    triple_weight: np.ndarray
    triple_value: np.ndarray
    direct_row: np.ndarray
    direct_slots: np.ndarray

    @classmethod
    def build(
        cls, single: Any, depth: int, current: bool, pair_keys: np.ndarray, indptr: np.ndarray, targets: np.ndarray,
        pair_weight: np.ndarray, cell_value: np.ndarray,
        triples: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> ConjParameters:  # fmt: skip
        """From a single-hop head (its keys, prior, gate variance and emission ``B``), the pair rows and, at order
        3, the triple rows ``(keys, indptr, targets, weight, value)``."""
        params = single.kernel_parameters
        table = single.emission_table
        if isinstance(table, SparseEmission):
            # The single head's own log tables (the same logarithms): one copy of them in a process, not two.
            assert isinstance(params, SparseKernelParameters)
            sparse = (table.support.indptr, table.support.symbols, params.log_values, params.log_backoff,
                      params.log_base)  # fmt: skip
            dense = _NO_TABLE
            direct = (params.direct_row, params.direct_slots)
        else:
            sparse = (_NO_INDEX, _NO_SYMBOLS, _NO_VALUES, _NO_VALUES, _NO_VALUES)
            dense = params.log_emission_ts
            direct = (_NO_ROWS, _NO_SLOTS)
        if triples is None:
            triples = (_NO_INDEX, np.zeros(1, dtype=np.int64), _NO_SYMBOLS, _NO_VALUES, _NO_VALUES)
        triple_keys, triple_indptr, triple_targets, triple_weight, triple_value = triples
        return cls(
            params.key_means, float(params.inv_two_sigma2), float(params.gate_const),
            np.asarray(single.position_prior, dtype=np.float64), np.asarray(params.log_prior, dtype=np.float64),
            int(depth), bool(current), int(single.num_symbols), pair_keys, *pair_table(pair_keys), indptr, targets,
            pair_weight,
            cell_value, dense, *sparse, triple_keys, *pair_table(triple_keys), triple_indptr, triple_targets,
            triple_weight, triple_value, *direct,
        )  # fmt: skip

    @property
    def num_targets(self) -> int:
        """T: the rows of a dense ``B``'s (T, S) table, else of its sparse support."""
        return int(self.log_emission_ts.shape[0] if self.b_indptr.shape[0] == 0 else self.b_indptr.shape[0] - 1)

    def arrays(self) -> tuple[Any, ...]:
        """The fields in the kernels' argument order."""
        return (
            self.key_means, self.inv_two_sigma2, self.gate_const, self.prior, self.log_prior, self.depth, self.current,
            self.num_symbols, self.pair_keys, self.slots, self.shift, self.indptr, self.targets, self.pair_weight,
            self.cell_value,
            self.log_emission_ts, self.b_indptr, self.b_symbols, self.log_values, self.log_backoff, self.log_base,
            self.triple_keys, self.triple_slots, self.triple_shift, self.triple_indptr, self.triple_targets,
            self.triple_weight, self.triple_value,
        )  # fmt: skip


@dataclass
class ConjArrays:
    """The conjunction E-step's additive arrays beside the single head's.

    Attributes:
        recency_mass: (N,) responsibility per recency (with a short window's rejected draws).
        cell_counts: (M,) the responsibility of each stored (pair, target) cell, ``n[a, q, t]``.
        triple_counts: (M3,) the responsibility of each stored (triple, target) cell (order 3; empty at order 2).
    """

    recency_mass: np.ndarray
    cell_counts: np.ndarray
    triple_counts: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def zeros(cls, context_length: int, num_cells: int, num_triple_cells: int = 0) -> ConjArrays:
        return cls(np.zeros(context_length), np.zeros(num_cells), np.zeros(num_triple_cells))


@dataclass(frozen=True)
class LeaveOneOut:
    """What the E-step needs to explain each training row by rows counted without it: the stored counts and
    strengths of the pair rows and (order 3) the triple rows.

    Attributes:
        strengths: (6,) ``(beta, gamma, D, beta3, gamma3, D3)`` (the triple ones unread at order 2).
        cells: (M,) each pair cell's count; ``pairs``: (P, 3) each pair row's ``(total, types, moved)`` (its count,
            its stored targets, the mass its discount moves), as :func:`~dist_respattn.model.heads.conj.head.pair_rows`
            computes them.
        triple_cells: (M3,) and ``triples`` (U, 3): the same of the triple rows ((0,) and (0, 3) at order 2).
    """

    strengths: np.ndarray
    cells: np.ndarray
    pairs: np.ndarray
    triple_cells: np.ndarray
    triples: np.ndarray

    @classmethod
    def of_rows(
        cls, indptr: np.ndarray, counts: np.ndarray, strengths: tuple[float, float, float],
        triples: tuple[np.ndarray, np.ndarray, tuple[float, float, float]] | None = None,
    ) -> LeaveOneOut:  # fmt: skip
        """From the pair rows' ``indptr`` (P + 1,), ``counts`` (M,) and ``(beta, gamma, D)``, and the triple rows'
        ``(indptr, counts, (beta3, gamma3, D3))`` at order 3."""
        cells = np.ascontiguousarray(counts, dtype=np.float64)
        pairs = row_stats(indptr, cells, strengths[2])
        if triples is None:
            triple_cells, triple_stats, third = _NO_VALUES, np.zeros((0, 3)), (math.inf, 0.0, 0.0)
        else:
            triple_cells = np.ascontiguousarray(triples[1], dtype=np.float64)
            triple_stats, third = row_stats(triples[0], triple_cells, triples[2][2]), triples[2]
        return cls(np.array([*strengths, *third], dtype=np.float64), cells, pairs, triple_cells, triple_stats)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self.strengths, self.cells, self.pairs, self.triple_cells, self.triples


def row_stats(indptr: np.ndarray, counts: np.ndarray, discount: float) -> np.ndarray:
    """(P, 3) float64 each row's ``(total count, stored targets, mass the discount moves)``: ``indptr`` (P + 1,)
    the rows' cell offsets, ``counts`` (M,) float64 their cells' counts, ``discount`` D (a cell moves
    ``min(count, D)``)."""
    n_rows = indptr.shape[0] - 1
    owner = np.repeat(np.arange(n_rows), np.diff(indptr))
    stats = np.empty((n_rows, 3))
    stats[:, 0] = np.bincount(owner, weights=counts, minlength=n_rows)
    stats[:, 1] = np.diff(indptr)
    stats[:, 2] = np.bincount(owner, weights=np.minimum(counts, discount), minlength=n_rows)
    return stats


_NO_LEAVE_OUT = (_NO_VALUES, _NO_VALUES, np.zeros((0, 3)), _NO_VALUES, np.zeros((0, 3)))

_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True)
def _slot(key, shift):  # pragma: no cover - compiled
    """The home slot of ``key`` in a table of ``2 ** (64 - shift)`` slots (Fibonacci hashing)."""
    return np.int64((np.uint64(key) * _HASH_MULTIPLIER) >> np.uint64(shift))


@numba.njit(cache=True, nogil=True)
def _fill_table(keys, table, shift):  # pragma: no cover - compiled
    mask = table.shape[0] - 1
    for p in range(keys.shape[0]):
        h = _slot(keys[p], shift)
        while table[h, 1] >= 0:
            h = (h + 1) & mask
        table[h, 0] = keys[p]
        table[h, 1] = p


def pair_table(pair_keys: np.ndarray) -> tuple[np.ndarray, int]:
    """``(table (2^b, 2) int64, shift)``: an open-addressing hash table of the pairs, each slot ``(key, pair index)``
    (index -1: empty), at most half full: a lookup reads one cache line where a binary search over millions of pairs
    misses the cache at every step."""
    bits = max(int(np.ceil(np.log2(max(2 * pair_keys.shape[0], 2)))), 1)
    table = np.full((1 << bits, 2), -1, dtype=np.int64)
    _fill_table(np.ascontiguousarray(pair_keys, dtype=np.int64), table, 64 - bits)
    return table, 64 - bits


@numba.njit(cache=True, nogil=True)
def find_pair_slot(table, shift, key):  # pragma: no cover - compiled
    """The pair index of ``key`` through the hash ``table`` (:func:`pair_table`), or -1."""
    mask = table.shape[0] - 1
    h = _slot(key, shift)
    while True:
        p = table[h, 1]
        if p < 0 or table[h, 0] == key:
            return p
        h = (h + 1) & mask


@numba.njit(cache=True, nogil=True)
def find_key(keys, lo, hi, key):  # pragma: no cover - compiled
    """The index of ``key`` in the increasing ``keys[lo:hi]``, or -1."""
    end = hi
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    if lo < end and keys[lo] == key:
        return lo
    return -1


@numba.njit(cache=True, nogil=True)
def _log_b(t, c, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base):  # pragma: no cover
    """``(log B[c, t], pair index of B's sparse support or -1)`` in either layout."""
    if b_indptr.shape[0] == 0:
        return log_emission_ts[t, c], -1
    p = find_pair(b_indptr, b_symbols, t, c)
    if p >= 0:
        return log_values[p], p
    return log_backoff[c] + log_base[t], -1


@numba.njit(cache=True, nogil=True)
def _triple_log_e(
    t, key, log_e, value, w, log_b, triple_slots, triple_shift, triple_indptr, triple_targets, triple_weight,
    triple_value,
):  # pragma: no cover - compiled  # fmt: skip
    """``(log E3(t), triple cell)`` of a position whose pair row gives ``log_e`` = log E2(t) (E2 = ``value + w B``,
    ``B`` = exp(``log_b``)): the triple ``key``'s row ``v3[t] + w3 E2(t)`` (cell -1: no such triple, its ``log_e``
    unchanged; -2: the triple is stored but not this target). An infinite triple strength (w3 = 1, v3 = 0) gives
    ``log_e`` back bit for bit."""
    u = find_pair_slot(triple_slots, triple_shift, key)
    if u < 0:
        return log_e, -1
    w3 = triple_weight[u]
    k3 = find_key(triple_targets, triple_indptr[u], triple_indptr[u + 1], t)
    if k3 < 0:
        return (math.log(w3) if w3 > 0.0 else -np.inf) + log_e, -2
    # E2 in the pair row's own writing (its value plus the leaning row's part), so w3 = 1, v3 = 0 is E2 itself.
    e3 = triple_value[k3] + w3 * (value + w * math.exp(log_b))
    return (math.log(e3) if e3 > 0.0 else -np.inf), k3


@numba.njit(cache=True, nogil=True)
def _held_out_triple_log_e(
    t, key, log_e, value, w, log_b, own, triple_slots, triple_shift, triple_indptr, triple_targets, cells, stats,
    strength, type_strength, discount,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`_triple_log_e` with the triple row of the counts ``cells`` (M3,) without the row's ``own`` count
    (:func:`_held_out_row`; ``stats`` (U, 3)), under the pair row ``value + w B`` the row already left out of."""
    u = find_pair_slot(triple_slots, triple_shift, key)
    if u < 0:
        return log_e, -1
    k3 = find_key(triple_targets, triple_indptr[u], triple_indptr[u + 1], t)
    if k3 < 0:
        w3 = _stored_weight(stats, u, strength, type_strength)
        return (math.log(w3) if w3 > 0.0 else -np.inf) + log_e, -2
    w3, v3 = _held_out_row(own, cells[k3], stats, u, strength, type_strength, discount)
    e3 = v3 + w3 * (value + w * math.exp(log_b))
    return (math.log(e3) if e3 > 0.0 else -np.inf), k3


@numba.njit(cache=True, nogil=True)
def _stored_weight(stats, u, strength, type_strength):  # pragma: no cover - compiled
    """The prior row's weight ``(s + moved) / (total + s)`` of a row as stored (``stats[u]`` its ``(total, types,
    moved)``), 1 for a row with neither counts nor strength."""
    s = strength + type_strength * stats[u, 1]
    denominator = stats[u, 0] + s
    return (s + stats[u, 2]) / denominator if denominator > 0.0 and math.isfinite(s) else 1.0


@numba.njit(cache=True, nogil=True)
def _held_out_row(own, n, pair_stats, p, strength, type_strength, discount):  # pragma: no cover - compiled
    """``(weight, value)`` of a row (:func:`~dist_respattn.model.heads.conj.head.pair_rows`) whose cell held ``n``
    of the row's total, with ``own`` of it taken out: the row the cell would have without the training row that is
    being explained (leaving one out). ``pair_stats[p]`` is ``(total, types, moved)`` of the row as stored."""
    left = n - own
    if left < 1e-9 * max(n, 1.0):  # the row was the cell's only occurrence: the cell (and its type) goes
        left = 0.0
    total = max(pair_stats[p, 0] - own, 0.0)
    types = pair_stats[p, 1] - (1.0 if left == 0.0 and n > 0.0 else 0.0)
    moved = pair_stats[p, 2] - min(n, discount) + min(left, discount)
    s = strength + type_strength * types
    denominator = total + s
    if not (denominator > 0.0 and math.isfinite(s)):  # an infinite strength, or no counts and none: B's row alone
        return 1.0, 0.0
    return (s + moved) / denominator, (left - min(left, discount)) / denominator


@numba.njit(cache=True, nogil=True)
def _own_count(tokens, lo, hi, depth, x, w, with_before):  # pragma: no cover - compiled
    """The weight the row ``tokens[lo:hi]`` (weight ``w``) gave, in the start pass's tally, to the cell its position
    ``x`` reads: ``w`` for each of its ``depth`` most recent positions holding the same token (a pair cell: the
    current token and the target are the row's), and with ``with_before`` the same token before it too (a triple
    cell; positions with a predecessor in the window only)."""
    own = 0.0
    for x2 in range(max(lo, hi - depth), hi):
        if tokens[x2] != tokens[x]:
            continue
        if with_before and (x2 == lo or tokens[x2 - 1] != tokens[x - 1]):
            continue
        own += w
    return own


@numba.njit(cache=True, nogil=True)
def _prefetch_row(tokens, lo, hi, t, depth, num_symbols, slots, shift, log_emission_ts, counts_ts):  # pragma: no cover
    """Prefetch a row's hash slots and, for a dense emission, its (target, symbol) cells."""
    q = tokens[hi - 1]
    for x in range(lo, hi):
        c = tokens[x]
        if log_emission_ts.shape[0] > 0:
            prefetch_item(log_emission_ts, t, c)
            prefetch_item(counts_ts, t, c)
        if hi - 1 - x < depth and slots.shape[0] > 0:
            prefetch_item(slots, _slot(np.int64(c) * num_symbols + q, shift), 0)


@numba.njit(cache=True, nogil=True)
def _row_terms(
    tokens, lo, hi, t, y, key_means, inv_two_sigma2, prior, log_prior, depth, current, num_symbols, pair_keys, slots,
    shift, indptr,
    targets, pair_weight, cell_value, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base,
    triple_keys, triple_slots, triple_shift, triple_indptr, triple_targets, triple_weight, triple_value,
    logw, gate, cell, bpair,
):  # pragma: no cover - compiled  # fmt: skip
    """One window's terms, position ``j`` of ``tokens[lo:hi]`` oldest first: ``logw[j]`` the joint log-weight
    ``log pi_j - log A + log E_j(t) - d_j / (2 sigma2)``, ``gate[j]`` the same without ``log E_j(t)``, ``cell[j]``
    the stored (pair, target) cell it reads (-1: none; -2: its pair is stored but not this target) and ``bpair[j]``
    B's sparse pair (-1 off B's support or dense). Returns ``(max logw, A)``."""
    n_pos = prior.shape[0]
    m = hi - lo
    total = 0.0
    for r in range(m):
        total += prior[n_pos - 1 - r]
    log_total = 0.0 if m == n_pos else (math.log(total) if total > 0.0 else 0.0)
    q = tokens[hi - 1]
    dense = b_indptr.shape[0] == 0
    best = -np.inf
    for j in range(m):
        x = lo + j
        r = hi - 1 - x
        col = n_pos - 1 - r
        c = tokens[x]
        # The dense lookup written out here: a call passing the sparse layout's arrays cost more than it.
        if dense:
            log_b = log_emission_ts[t, c]
            bpair[j] = -1
        else:
            log_b, bpair[j] = _log_b(t, c, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base)
        cell[j] = -1
        log_e = log_b
        if r < depth and pair_keys.shape[0] > 0:
            p = find_pair_slot(slots, shift, np.int64(c) * num_symbols + q)
            if p >= 0:
                k = find_key(targets, indptr[p], indptr[p + 1], t)
                w = pair_weight[p]
                if current:  # the pair rows' prior mean is the current token's row B[q]
                    if dense:
                        log_b = log_emission_ts[t, q]
                    else:
                        log_b, _ = _log_b(t, q, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base)
                if k >= 0:
                    e = cell_value[k] + w * math.exp(log_b)
                    log_e = math.log(e) if e > 0.0 else -np.inf
                    cell[j] = k
                else:
                    log_e = (math.log(w) if w > 0.0 else -np.inf) + log_b
                    cell[j] = -2
                if j > 0 and triple_keys.shape[0] > 0:
                    log_e = _triple_log_e(
                        t, (np.int64(tokens[x - 1]) * num_symbols + c) * num_symbols + q, log_e,
                        cell_value[k] if k >= 0 else 0.0, w, log_b, triple_slots, triple_shift, triple_indptr,
                        triple_targets, triple_weight, triple_value,
                    )[0]  # fmt: skip
        distance = squared_distance(y, key_means, c) * inv_two_sigma2
        g = (log_prior[col] - log_total) - distance
        gate[j] = g
        lj = g + log_e
        logw[j] = lj
        best = max(best, lj)
    return best, total


@numba.njit(cache=True, nogil=True)
def _estep(
    tokens, begin, end, target, query_table, query_index, weights, narrow_table,
    key_means, inv_two_sigma2, gate_const, prior, log_prior, depth, current, num_symbols, pair_keys, slots, shift,
    indptr, targets,
    pair_weight, cell_value, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base,
    triple_keys, triple_slots, triple_shift, triple_indptr, triple_targets, triple_weight, triple_value,
    direct_row, direct_slots, loo_strengths, loo_cells, loo_pairs, loo_triple_cells, loo_triples,
    key_sum, key_mass, emission_count_ts, pair_counts, recency_mass, cell_counts, triple_counts, scalars, impossible,
):  # pragma: no cover - compiled  # fmt: skip
    """The fused E-step over the rows in order. Returns ``(n_impossible, n_outside)``: rows no position explains
    (the first written to ``impossible``) and rows that fall on a cell or a B pair off the supports. A float32 query
    table comes as ``narrow_table``, read in place (``query_table`` then (0, 0)), else ``narrow_table`` is (0, 0):
    :func:`~dist_respattn.model.rows.split_query_table`.

    With ``loo_strengths`` (6,) ``(beta, gamma, D, beta3, gamma3, D3)`` (else (0,)), each row is explained by the
    pair and triple rows of the counts ``loo_cells`` (M,) and ``loo_triple_cells`` (M3,) without the row's own
    counts in them (leaving one out, :func:`_held_out_row`; ``loo_pairs`` (P, 3) and ``loo_triples`` (U, 3) each
    row's ``(total, types, moved)``): what rows counted from the data need, so that EM does not move the prior
    toward the positions whose rows hold the very row they explain. The cells' responsibilities are then not summed
    (``cell_counts`` and ``triple_counts`` may be empty).

    Each window's terms are :func:`_row_terms`' written out here, with a sparse ``B`` read through the direct rows:
    a call passing some thirty arrays costs more a row than its lookups (measured: two more arrays in that call,
    +10% a row)."""
    n_pos = prior.shape[0]
    dim = key_means.shape[1]
    wide = narrow_table.shape[0] == 0  # the queries in query_table (float64), else in narrow_table (float32)
    sparse = b_indptr.shape[0] > 0
    with_direct = direct_row.shape[0] > 0
    with_pairs = pair_keys.shape[0] > 0
    with_triples = triple_keys.shape[0] > 0
    leave_out = loo_strengths.shape[0] > 0
    logw = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    cell = np.empty(n_pos, dtype=np.int64)
    tcell = np.empty(n_pos, dtype=np.int64)
    bpair = np.empty(n_pos, dtype=np.int64)
    y = np.empty(dim)
    n_impossible = 0
    n_outside = 0
    query_sq = 0.0
    n_obs = 0.0
    log_lik = 0.0
    n_rows = target.shape[0]
    for row in range(n_rows):
        ahead = row + _PREFETCH_ROWS
        if ahead < n_rows:
            # The cells a later row reads (and updates), scattered over tables larger than cache: their misses then
            # overlap with this row's work (as in the single head's per-position kernel). A sparse B's direct row
            # cells of the row twice as far, then, here, the values and counts their pair indices name.
            lo_a = begin[ahead]
            hi_a = end[ahead]
            t_a = target[ahead]
            q_a = tokens[hi_a - 1]
            r_a = direct_row[t_a] if with_direct else -1
            for x in range(lo_a, hi_a):
                c = tokens[x]
                if not sparse:
                    prefetch_item(log_emission_ts, t_a, c)
                    prefetch_item(emission_count_ts, t_a, c)
                elif r_a >= 0:
                    p_a = max(direct_slots[r_a, c], 0)  # -1: off the support
                    prefetch_element(log_values, p_a)
                    prefetch_element(pair_counts, p_a)
                if hi_a - 1 - x < depth and with_pairs:
                    prefetch_item(slots, _slot(np.int64(c) * num_symbols + q_a, shift), 0)
                    if with_triples and x > lo_a:
                        key3 = (np.int64(tokens[x - 1]) * num_symbols + c) * num_symbols + q_a
                        prefetch_item(triple_slots, _slot(key3, triple_shift), 0)
            near = row + _PREFETCH_ROWS // 2
            if with_pairs:
                # The pair rows of a nearer row: its hash slots (prefetched above, rows earlier) name the pairs,
                # whose bounds, weights and first stored targets are then fetched.
                hi_n = end[near]
                q_n = tokens[hi_n - 1]
                for x in range(max(begin[near], hi_n - depth), hi_n):
                    p_n = find_pair_slot(slots, shift, np.int64(tokens[x]) * num_symbols + q_n)
                    if p_n >= 0:
                        prefetch_element(indptr, p_n)
                        prefetch_element(pair_weight, p_n)
                        k0 = indptr[p_n]
                        prefetch_element(targets, k0)
                        prefetch_element(cell_value, k0)
                        if leave_out:  # the counts the row is taken out of (the cells' sums are not kept)
                            prefetch_element(loo_cells, k0)
                            prefetch_item(loo_pairs, p_n, 0)
                        else:
                            prefetch_element(cell_counts, k0)
                        if with_triples and x > begin[near]:
                            # The triple row the same way (its slot prefetched with the pair's).
                            key3 = (np.int64(tokens[x - 1]) * num_symbols + tokens[x]) * num_symbols + q_n
                            u_n = find_pair_slot(triple_slots, triple_shift, key3)
                            if u_n >= 0:
                                prefetch_element(triple_indptr, u_n)
                                prefetch_element(triple_weight, u_n)
                                k3 = triple_indptr[u_n]
                                prefetch_element(triple_targets, k3)
                                prefetch_element(triple_value, k3)
                                if leave_out:
                                    prefetch_element(loo_triple_cells, k3)
                                    prefetch_item(loo_triples, u_n, 0)
                                else:
                                    prefetch_element(triple_counts, k3)
            far = row + 2 * _PREFETCH_ROWS
            if with_direct and far < n_rows:
                r_f = direct_row[target[far]]
                if r_f >= 0:
                    for x in range(begin[far], end[far]):
                        prefetch_item(direct_slots, r_f, tokens[x])
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        t = target[row]
        q = query_index[row]
        yy = 0.0
        for d in range(dim):
            v = query_table[q, d] if wide else np.float64(narrow_table[q, d])
            y[d] = v
            yy += v * v
        m = hi - lo
        # The window's terms (as _row_terms): logw[j] the joint log-weight, cell[j] the stored cell (-1 none, -2 the
        # pair's row holds no such target), bpair[j] B's sparse pair (-1 off the support or dense).
        total = 0.0
        for r in range(m):
            total += prior[n_pos - 1 - r]
        log_total = 0.0 if m == n_pos else (math.log(total) if total > 0.0 else 0.0)
        qt = tokens[hi - 1]
        t_row = direct_row[t] if with_direct else -1
        log_bq = 0.0  # B[qt, t], looked up once a row (at its first pair row) when the pair rows lean toward it
        have_bq = False
        best = -np.inf
        for j in range(m):
            x = lo + j
            r = hi - 1 - x
            col = n_pos - 1 - r
            c = tokens[x]
            if not sparse:
                log_b = log_emission_ts[t, c]
                bpair[j] = -1
            else:
                bp = np.int64(direct_slots[t_row, c]) if t_row >= 0 else find_pair(b_indptr, b_symbols, t, c)
                bpair[j] = bp
                log_b = log_values[bp] if bp >= 0 else log_backoff[c] + log_base[t]
            cell[j] = -1
            tcell[j] = -1
            log_e = log_b
            if r < depth and with_pairs:
                p = find_pair_slot(slots, shift, np.int64(c) * num_symbols + qt)
                own = 0.0
                if p >= 0 and leave_out:
                    own = _own_count(tokens, lo, hi, depth, x, w, False)
                    if loo_pairs[p, 0] - own <= 1e-9 * max(loo_pairs[p, 0], 1.0):
                        p = -1  # a pair only this row holds: without it, no pair row (B's row of the attended token)
                if p >= 0:
                    k = find_key(targets, indptr[p], indptr[p + 1], t)
                    w_p = pair_weight[p]
                    if current:  # the pair rows' prior mean is the current token's row B[q]
                        if not have_bq:
                            if not sparse:
                                log_bq = log_emission_ts[t, qt]
                            else:
                                bq = np.int64(direct_slots[t_row, qt]) if t_row >= 0 else find_pair(
                                    b_indptr, b_symbols, t, qt)  # fmt: skip
                                log_bq = log_values[bq] if bq >= 0 else log_backoff[qt] + log_base[t]
                            have_bq = True
                        log_b = log_bq
                    value = cell_value[k] if k >= 0 else 0.0
                    if leave_out and k >= 0:
                        w_p, value = _held_out_row(
                            own, loo_cells[k], loo_pairs, p, loo_strengths[0], loo_strengths[1], loo_strengths[2]
                        )
                    if k >= 0:
                        e = value + w_p * math.exp(log_b)
                        log_e = math.log(e) if e > 0.0 else -np.inf
                        cell[j] = k
                    else:
                        log_e = (math.log(w_p) if w_p > 0.0 else -np.inf) + log_b
                        cell[j] = -2
                    if with_triples and j > 0 and leave_out:
                        log_e, tcell[j] = _held_out_triple_log_e(
                            t, (np.int64(tokens[x - 1]) * num_symbols + c) * num_symbols + qt, log_e, value, w_p,
                            log_b, _own_count(tokens, lo, hi, depth, x, w, True), triple_slots, triple_shift,
                            triple_indptr, triple_targets, loo_triple_cells, loo_triples, loo_strengths[3],
                            loo_strengths[4], loo_strengths[5],
                        )  # fmt: skip
                    elif with_triples and j > 0:
                        log_e, tcell[j] = _triple_log_e(
                            t, (np.int64(tokens[x - 1]) * num_symbols + c) * num_symbols + qt, log_e,
                            value, w_p, log_b, triple_slots, triple_shift,
                            triple_indptr, triple_targets, triple_weight, triple_value,
                        )  # fmt: skip
            distance = squared_distance(y, key_means, c) * inv_two_sigma2
            lj = ((log_prior[col] - log_total) - distance) + log_e
            logw[j] = lj
            best = max(best, lj)
        if best == -np.inf:
            if n_impossible < impossible.shape[0]:
                impossible[n_impossible] = row
            n_impossible += 1
            continue
        outside = False
        for j in range(m):
            if cell[j] == -2 or (sparse and bpair[j] < 0) or (with_triples and tcell[j] == -2):
                outside = True
        if outside:
            n_outside += 1
            continue
        z = exp_shifted(logw[:m], best, resp[:m], bits[:m])
        scale = w / z
        for j in range(m):
            rj = resp[j] * scale
            x = lo + j
            r = hi - 1 - x
            c = tokens[x]
            key_mass[c] += rj
            for d in range(dim):
                key_sum[c, d] += rj * y[d]
            # B's counts take every position's responsibility (the pair rows' prior mean is fitted on all of it).
            if sparse:
                pair_counts[bpair[j]] += rj
            else:
                emission_count_ts[t, c] += rj
            # The cells' responsibilities, the rows' counts when EM fits them (rows counted from the data keep
            # theirs: no sums, and ``cell_counts`` may be empty then).
            if cell[j] >= 0 and not leave_out:
                cell_counts[cell[j]] += rj
            # The pair cell takes the responsibility too (its row is the triple rows' prior mean, fitted on all).
            if with_triples and tcell[j] >= 0 and not leave_out:
                triple_counts[tcell[j]] += rj
            recency_mass[r] += rj
        if m < n_pos:
            rejected = w / total
            for r in range(m, n_pos):
                recency_mass[r] += rejected * prior[n_pos - 1 - r]
        query_sq += w * yy
        n_obs += w
        log_lik += w * (best + math.log(z) + gate_const)
    scalars[0] += query_sq
    scalars[1] += n_obs
    scalars[2] += log_lik
    return n_impossible, n_outside


@numba.njit(cache=True, nogil=True)
def _score(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, inv_two_sigma2, gate_const, prior, log_prior, depth, current, num_symbols, pair_keys, slots, shift,
    indptr, targets,
    pair_weight, cell_value, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base,
    triple_keys, triple_slots, triple_shift, triple_indptr, triple_targets, triple_weight, triple_value, attention,
    per_row,
):  # pragma: no cover - compiled  # fmt: skip
    """Weighted ``(log_lik, target_log_prob, weight)`` of the rows; ``attention`` (n, N) receives each row's
    predictive attention in column order (zero on masked columns), ``per_row`` (n, 2) each row's
    ``(log p(query | window), log p(target | window, query))`` unweighted (:func:`keep_row`; (0, 2): none)."""
    n_pos = prior.shape[0]
    dim = key_means.shape[1]
    logw = np.empty(n_pos)
    gate = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    cell = np.empty(n_pos, dtype=np.int64)
    bpair = np.empty(n_pos, dtype=np.int64)
    y = np.empty(dim)
    log_lik = 0.0
    target_log_prob = 0.0
    weight = 0.0
    n_rows = target.shape[0]
    for row in range(n_rows):
        ahead = row + _PREFETCH_ROWS
        if ahead < n_rows:
            # The cells a later row reads (and updates), scattered over tables larger than cache: their misses then
            # overlap with this row's work (as in the single head's per-position kernel).
            _prefetch_row(tokens, begin[ahead], end[ahead], target[ahead], depth, num_symbols, slots, shift,
                          log_emission_ts, log_emission_ts)  # fmt: skip

        w = 1.0 if weights.shape[0] == 0 else weights[row]
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        q = query_index[row]
        for d in range(dim):
            y[d] = np.float64(query_table[q, d])
        best, _ = _row_terms(
            tokens, lo, hi, target[row], y, key_means, inv_two_sigma2, prior, log_prior, depth, current, num_symbols,
            pair_keys, slots, shift, indptr, targets, pair_weight, cell_value, log_emission_ts, b_indptr, b_symbols,
            log_values, log_backoff, log_base, triple_keys, triple_slots, triple_shift, triple_indptr, triple_targets,
            triple_weight, triple_value, logw, gate, cell, bpair,
        )  # fmt: skip
        g_best = -np.inf
        for j in range(m):
            g_best = max(g_best, gate[j])
        z_gate = exp_shifted(gate[:m], g_best, resp[:m], bits[:m])
        for i in range(n_pos):
            attention[row, i] = 0.0
        for j in range(m):
            attention[row, n_pos - m + j] = resp[j] / z_gate
        if w == 0.0 and per_row.shape[0] == 0:
            continue
        if best == -np.inf:
            joint = -np.inf
        else:
            joint = best + math.log(exp_shifted(logw[:m], best, resp[:m], bits[:m]))
        keep_row(per_row, row, g_best + math.log(z_gate) + gate_const, joint - (g_best + math.log(z_gate)))
        if w == 0.0:
            continue
        log_lik += w * (joint + gate_const)
        target_log_prob += w * (joint - (g_best + math.log(z_gate)))
        weight += w
    return log_lik, target_log_prob, weight


def conj_estep(
    rows: WindowRows,
    params: ConjParameters,
    stats: Any,
    extra: ConjArrays,
    leave_one_out: LeaveOneOut | None = None,
    group_by_target: bool | None = None,
) -> None:
    """The conjunction E-step over ``rows`` (checked), added into the single head's ``stats``
    (:class:`~dist_respattn.model.kernels.per_position.StatisticArrays`, without their position counts, which
    follow from ``extra.recency_mass``) and ``extra``; with ``leave_one_out``, each row explained by the rows of
    those counts without its own (the training rows of rows counted from the data). Rows the model cannot explain
    raise ``ImpossibleEvidenceError`` after the others were added; a cell off the supports raises a ValueError.

    The rows are visited grouped by target when ``B`` is sparse or its dense table is large
    (:func:`_groups_by_target`; ``group_by_target`` True or False decides instead), as the single head's E-step
    visits them: a fixed order for the same rows, whatever the worker."""
    sparse = params.b_indptr.shape[0] > 0
    if group_by_target is None:
        group_by_target = _groups_by_target(params)
    order = by_target(rows, params.num_targets) if group_by_target and rows.num_rows > 1 else None
    # Room for every row when they are visited out of order: the message lists the first ones in row order.
    found = np.empty(min(rows.num_rows, 64) if order is None else rows.num_rows, dtype=np.int64)
    loo = leave_one_out.arrays() if leave_one_out is not None else _NO_LEAVE_OUT
    window, narrow = split_query_table(
        rows.kernel_arrays(narrow_queries=True) if order is None else windows_in_order(rows, order, narrow_queries=True)
    )
    n_impossible, n_outside = _estep(  # type: ignore[call-arg]
        *window, narrow,
        *params.arrays(), params.direct_row, params.direct_slots, *loo,
        stats.key_sum, stats.key_mass, stats.emission_count_ts, stats.pair_counts if sparse else _NO_VALUES,
        extra.recency_mass, extra.cell_counts, extra.triple_counts, stats.scalars, found,
    )  # fmt: skip
    if order is not None:
        found = np.sort(order[found[: min(n_impossible, found.shape[0])]])
    if n_outside:
        raise ValueError(
            f"{n_outside} row(s) hold a (attended, current, target) cell or a (symbol, target) pair outside the "
            "supports: the supports must come from these rows (a fit finds them in its start pass); refit"
        )
    if n_impossible:
        shown = ", ".join(str(int(r)) for r in found[: min(n_impossible, 10)])
        raise ImpossibleEvidenceError(
            f"impossible evidence: rows {shown} have zero probability under the conjunction head (every position "
            "of the window has a zero prior or a zero probability for the row's target)"
        )


def _groups_by_target(params: ConjParameters) -> bool:
    """Whether the E-step visits rows grouped by target by default: the single head's rule. A sparse ``B``'s rows
    always (its direct rows and pair values are read by target); a dense one's when its (T, S) table is at least
    :data:`~dist_respattn.model.kernels.per_position.GROUP_BY_TARGET_TABLE_BYTES` (in row order, nearly every cell
    of a larger table misses the cache; on 300,000 sampled rows of S = T = 2000 at depth 2, 0.32-0.33x the single
    head's rows a second against 0.26-0.27x, docs/guide/conjunction-head.md)."""
    return params.b_indptr.shape[0] > 0 or params.log_emission_ts.nbytes >= GROUP_BY_TARGET_TABLE_BYTES


def conj_score(
    rows: WindowRows, params: ConjParameters, per_row: np.ndarray = NO_ROWS
) -> tuple[float, float, float, np.ndarray]:
    """``(log_lik, target_log_prob, weight, attention (n, N))`` of ``rows`` (checked) under the conjunction head;
    with ``per_row`` (n, 2) also each row's ``(log p(query | window), log p(target | window, query))`` into it."""
    attention = np.empty((rows.num_rows, params.prior.shape[0]))
    log_lik, target_log_prob, weight = _score(  # type: ignore[call-arg]
        *rows.kernel_arrays(),
        *params.arrays(), attention, per_row,
    )  # fmt: skip
    return float(log_lik), float(target_log_prob), float(weight), attention


def pair_of_cells(pair_keys: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The index of each ``cells[m] = a * S + q`` among the increasing ``pair_keys``: (m,) int64, -1 where absent."""
    cells = np.asarray(cells, dtype=np.int64)
    if pair_keys.size == 0:
        return np.full(cells.shape, -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(pair_keys, cells), pair_keys.size - 1)
    return np.where(pair_keys[at] == cells, at, -1)


@numba.njit(cache=True, nogil=True)
def _score_grid(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, inv_two_sigma2, gate_const, prior, log_prior, depth, current, num_symbols, pair_keys, slots, shift,
    indptr, targets, pair_total, counts, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base,
    strengths, type_strengths, discounts, discount_of, moved,
    triple_keys, triple_slots, triple_shift, triple_indptr, triple_targets, triple_total, triple_counts,
    strengths3, type_strengths3, discounts3, discount3_of, moved3, totals,
):  # pragma: no cover - compiled  # fmt: skip
    """Weighted ``(log_lik, target_log_prob, weight)`` of the rows at every grid point ``g`` (the pair rows'
    strengths ``strengths[g] + type_strengths[g] * types`` and the discount ``discounts[g]``, whose per-pair moved
    mass is ``moved[discount_of[g], p]``; at order 3 the triple rows' the same way, ``strengths3[g]`` ...
    ``moved3[discount3_of[g], u]``) into ``totals`` (G, 3): each row's gate, ``B`` values and cell counts found
    once, then every point's mixture."""
    n_pos = prior.shape[0]
    dim = key_means.shape[1]
    n_points = strengths.shape[0]
    dense = b_indptr.shape[0] == 0
    gate = np.empty(n_pos)
    prior_row = np.empty(n_pos)  # the prior mean's value at the target: B[a, t] (or B[q, t])
    cell_n = np.empty(n_pos)
    pair_n = np.empty(n_pos)
    types = np.empty(n_pos)
    pair_of = np.empty(n_pos, dtype=np.int64)
    with_triples = triple_keys.shape[0] > 0
    tcell_n = np.empty(n_pos)
    triple_n = np.full(n_pos, -1.0)
    ttypes = np.empty(n_pos)
    triple_of = np.empty(n_pos, dtype=np.int64)
    logw = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    y = np.empty(dim)
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        t = target[row]
        q = tokens[hi - 1]
        for d in range(dim):
            y[d] = np.float64(query_table[query_index[row], d])
        total = 0.0
        for r in range(m):
            total += prior[n_pos - 1 - r]
        log_total = 0.0 if m == n_pos else (math.log(total) if total > 0.0 else 0.0)
        g_best = -np.inf
        for j in range(m):
            x = lo + j
            r = hi - 1 - x
            c = tokens[x]
            gate[j] = (log_prior[n_pos - 1 - r] - log_total) - squared_distance(y, key_means, c) * inv_two_sigma2
            g_best = max(g_best, gate[j])
            pair_n[j] = -1.0  # no pair row: B's
            triple_n[j] = -1.0  # no triple row: the pair's
            if r < depth and pair_keys.shape[0] > 0:
                p = find_pair_slot(slots, shift, np.int64(c) * num_symbols + q)
                if p >= 0:
                    k = find_key(targets, indptr[p], indptr[p + 1], t)
                    cell_n[j] = counts[k] if k >= 0 else 0.0
                    pair_n[j] = pair_total[p]
                    types[j] = indptr[p + 1] - indptr[p]
                    pair_of[j] = p
                    if with_triples and j > 0:
                        u = find_pair_slot(triple_slots, triple_shift,
                                           (np.int64(tokens[x - 1]) * num_symbols + c) * num_symbols + q)  # fmt: skip
                        if u >= 0:
                            k3 = find_key(triple_targets, triple_indptr[u], triple_indptr[u + 1], t)
                            tcell_n[j] = triple_counts[k3] if k3 >= 0 else 0.0
                            triple_n[j] = triple_total[u]
                            ttypes[j] = triple_indptr[u + 1] - triple_indptr[u]
                            triple_of[j] = u
                    if current:
                        c = q
            if dense:
                prior_row[j] = math.exp(log_emission_ts[t, c])
            else:
                log_b, _ = _log_b(t, c, log_emission_ts, b_indptr, b_symbols, log_values, log_backoff, log_base)
                prior_row[j] = math.exp(log_b)
        # exp_shifted shifts its log-weights in place: the gate is shifted by g_best here, and every point's
        # log-weights below are made from the shifted gate, so g_best goes back into each joint.
        log_z_gate = math.log(exp_shifted(gate[:m], g_best, resp[:m], bits[:m]))
        for g in range(n_points):
            beta = strengths[g]
            best = -np.inf
            for j in range(m):
                e = prior_row[j]
                if pair_n[j] >= 0.0 and not math.isinf(beta):
                    s = beta + type_strengths[g] * types[j]
                    if pair_n[j] + s > 0.0:
                        taken = min(cell_n[j], discounts[g])
                        lean = s + moved[discount_of[g], pair_of[j]]
                        e = (cell_n[j] - taken + lean * prior_row[j]) / (pair_n[j] + s)
                if triple_n[j] >= 0.0 and not math.isinf(strengths3[g]):
                    s3 = strengths3[g] + type_strengths3[g] * ttypes[j]
                    if triple_n[j] + s3 > 0.0:
                        taken3 = min(tcell_n[j], discounts3[g])
                        lean3 = s3 + moved3[discount3_of[g], triple_of[j]]
                        e = (tcell_n[j] - taken3 + lean3 * e) / (triple_n[j] + s3)
                logw[j] = gate[j] + (math.log(e) if e > 0.0 else -np.inf)
                best = max(best, logw[j])
            if best == -np.inf:
                joint = -np.inf
            else:
                joint = g_best + best + math.log(exp_shifted(logw[:m], best, resp[:m], bits[:m]))
            totals[g, 0] += w * (joint + gate_const)
            totals[g, 1] += w * (joint - (g_best + log_z_gate))
            totals[g, 2] += w


def _moved(indptr: np.ndarray, counts: np.ndarray, discounts: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(row totals (R,), moved (K, R), discount_of (G,))`` of rows ``indptr`` (R + 1,) with cell ``counts``: each
    row's summed counts and, per distinct discount among ``discounts`` (G,), the mass it moves to the row's prior."""
    n_rows = indptr.shape[0] - 1
    owner = np.repeat(np.arange(n_rows), np.diff(indptr))
    total = np.bincount(owner, weights=counts, minlength=n_rows)
    distinct, discount_of = np.unique(discounts, return_inverse=True)
    moved = np.stack([np.bincount(owner, weights=np.minimum(counts, d), minlength=n_rows) for d in distinct])
    return total, np.ascontiguousarray(moved, dtype=np.float64), discount_of.astype(np.int64).reshape(-1)


def conj_score_grid(
    rows: WindowRows, params: ConjParameters, counts: np.ndarray, points: np.ndarray, triple_counts: Any = None
) -> np.ndarray:
    """(G, 3) weighted ``(log_lik, target_log_prob, weight)`` of ``rows`` (checked) at every point (G, 3) of pair
    strengths and discount ``(beta, gamma, D)`` (at order 3, (G, 6): the triple rows' ``(beta3, gamma3, D3)``
    after them), with the cell ``counts`` (M,) and ``triple_counts`` (M3,) (``params``' own strengths and
    discounts are not read)."""
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    pair_total, moved, discount_of = _moved(params.indptr, counts, points[:, 2])
    totals = np.zeros((points.shape[0], 3))
    (key_means, inv_two_sigma2, gate_const, prior, log_prior, depth, current, num_symbols, pair_keys, slots, shift,
     indptr, targets, _, _, *rest) = params.arrays()  # fmt: skip
    emission = rest[:6]
    if points.shape[1] == 6:
        triple_counts = np.ascontiguousarray(triple_counts, dtype=np.float64)
        triple_total, moved3, discount3_of = _moved(params.triple_indptr, triple_counts, points[:, 5])
        triple_points = points[:, 3:6]
    else:  # order 2: no triple rows read
        triple_counts, triple_total = _NO_VALUES, _NO_VALUES
        moved3, discount3_of = np.zeros((1, 0)), np.zeros(points.shape[0], dtype=np.int64)
        triple_points = np.tile([np.inf, 0.0, 0.0], (points.shape[0], 1))
    triple_keys = params.triple_keys if points.shape[1] == 6 else _NO_INDEX
    _score_grid(  # type: ignore[call-arg]
        *rows.kernel_arrays(),
        key_means, inv_two_sigma2, gate_const, prior, log_prior, depth, current, num_symbols, pair_keys, slots, shift,
        indptr, targets, pair_total, counts, *emission,
        np.ascontiguousarray(points[:, 0]), np.ascontiguousarray(points[:, 1]), np.ascontiguousarray(points[:, 2]),
        discount_of, moved,
        triple_keys, params.triple_slots, params.triple_shift, params.triple_indptr, params.triple_targets,
        triple_total, triple_counts, *(np.ascontiguousarray(triple_points[:, i]) for i in range(3)), discount3_of,
        moved3, totals,
    )  # fmt: skip
    return totals
