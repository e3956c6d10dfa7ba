"""The fused E-step: responsibilities and sufficient-statistic scatter over blocks of triples.

Everything here works on plain arrays. Shapes: ``context`` (n, N) ids in [0, S), ``query`` (n, D),
``target`` (n,) ids in [0, T), ``weights`` (n,) >= 0. Statistics accumulate in float64.

Two implementations share one block driver: a compiled one (numba, the default) that fuses the
E-step and the scatter per row, and a vectorized NumPy one kept as a fallback and as the baseline
the compiled kernel is measured against.

The emission tables are stored target-major, ``(T, S)``: every lookup and scatter of a row touches
one row ``t`` of them. When they outgrow cache, the compiled kernel visits each block's rows grouped
by target (a counting sort), and it prefetches the rows and emission cells it will visit next; both
are measured in ``benchmarks/bench_kernel.py``, as is the symbol-major layout. It takes the exponentials of
a few rows' log-weights in one pass (``_BATCH_ROWS``); ``benchmarks/bench_kernel_speed.py`` times it beside
another revision's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numba
import numpy as np

from dist_respattn.model.arguments import ImpossibleEvidenceError, kernel_ids, scan_values
from dist_respattn.model.emission.layouts import DenseEmission, Emission, PairSupport, SparseEmission
from dist_respattn.model.kernels.aligned import aligned_copy, aligned_zeros
from dist_respattn.model.kernels.log_weights import (
    block_log_weights,
    exp_nonpositive_n,
    exp_shifted,
    exp_shifted_into,
    row_log_weights,
    row_log_weights_at,
    span_log_weights,
)
from dist_respattn.model.kernels.prefetch import prefetch_element, prefetch_item
from dist_respattn.model.rows import WindowArrays

__all__ = [
    "DEFAULT_BLOCK_ROWS",
    "GROUP_BY_TARGET_TABLE_BYTES",
    "KernelParameters",
    "SparseKernelParameters",
    "StatisticArrays",
    "accumulate_estep",
    "accumulate_estep_windows",
    "accumulate_responsibilities",
    "accumulate_uniform_windows",
    "block_ranges",
    "direct_pair_rows",
    "find_pair",
    "row_log_likelihood",
    "target_order",
]

#: Rows per block. The compiled kernel may sort each block by target (an int64 order, 8 bytes a
#: row). Measured at S = T = 2000: 1.18 M rows/s unsorted, 1.28 M sorting blocks of 32768 rows,
#: 1.61 M at 131072, 1.59 M at 262144.
DEFAULT_BLOCK_ROWS = 131072

#: Emission tables of at least this many bytes make the kernel visit rows grouped by target.
#: Measured at S = 2000, N = 16, D = 32: T = 2000 (32 MB), 1.16 M rows/s in row order, 1.52 M grouped;
#: T = 20 (0.3 MB), 2.0 M rows/s in row order, 1.8 M grouped.
GROUP_BY_TARGET_TABLE_BYTES = 4 * 2**20

#: Rows per block of the NumPy backend, whose (block, N, D) float64 gathers dominate its memory.
NUMPY_BLOCK_ROWS = 16384

Backend = Literal["numba", "numpy"]


@dataclass(frozen=True)
class KernelParameters:
    """Model parameters laid out for the kernel.

    Attributes:
        key_means: (S, D) float64, C order.
        log_emission_ts: (T, S) float64, ``log emission.T`` (``-inf`` where the emission is 0).
        log_prior: (N,) float64, ``log position_prior``.
        inv_two_sigma2: ``1 / (2 sigma2)``.
        gate_const: ``-D/2 log(2 pi sigma2)``, the Gaussian normalizer.
    """

    key_means: np.ndarray
    log_emission_ts: np.ndarray
    log_prior: np.ndarray
    inv_two_sigma2: float
    gate_const: float

    @property
    def num_symbols(self) -> int:
        return int(self.log_emission_ts.shape[1])

    @property
    def num_targets(self) -> int:
        return int(self.log_emission_ts.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.log_emission_ts.nbytes)

    @classmethod
    def from_arrays(
        cls, key_means: np.ndarray, emission: np.ndarray | Emission, position_prior: np.ndarray, sigma2: float
    ) -> KernelParameters | SparseKernelParameters:
        """Build from validated (S, D) keys, an emission ((S, T) array, or either layout), (N,) prior and
        the gate variance: :class:`KernelParameters` for a dense emission, :class:`SparseKernelParameters`
        for a sparse one."""
        if isinstance(emission, SparseEmission):
            return SparseKernelParameters.build(key_means, emission, position_prior, sigma2)
        probs = emission.probs if isinstance(emission, DenseEmission) else np.asarray(emission)
        with np.errstate(divide="ignore"):
            log_emission_ts = aligned_copy(np.log(probs.T))
        return cls(log_emission_ts=log_emission_ts, **_gate_fields(key_means, position_prior, sigma2))


def _gate_fields(key_means: np.ndarray, position_prior: np.ndarray, sigma2: float) -> dict[str, Any]:
    with np.errstate(divide="ignore"):
        log_prior = np.log(position_prior)
    return {
        "key_means": aligned_copy(key_means),
        "log_prior": log_prior,
        "inv_two_sigma2": 0.5 / sigma2,
        "gate_const": -0.5 * key_means.shape[1] * float(np.log(2.0 * np.pi * sigma2)),
    }


@dataclass(frozen=True)
class SparseKernelParameters:
    """A sparse emission's parameters laid out for the kernels.

    Attributes:
        key_means, log_prior, inv_two_sigma2, gate_const: as in :class:`KernelParameters`.
        indptr: (T + 1,) int64 and ``symbols`` (P,) int32: the support, target-major.
        log_values: (P,) ``log B`` at the support's pairs.
        log_backoff: (S,) and ``log_base`` (T,): ``log B[s, t] = log_backoff[s] + log_base[t]`` off the support.
        direct_row: (T,) int32, the row of ``direct_slots`` of each target that has one, else -1.
        direct_slots: (R, S) int32, ``direct_slots[direct_row[t], s]`` = the pair index of (s, t), -1 off the
            support: a direct symbol -> pair table for each target whose pairs are at least
            ``1 / DIRECT_ROW_SHARE`` of S (see :func:`direct_pair_rows`).
    """

    key_means: np.ndarray
    log_prior: np.ndarray
    inv_two_sigma2: float
    gate_const: float
    indptr: np.ndarray
    symbols: np.ndarray
    log_values: np.ndarray
    log_backoff: np.ndarray
    log_base: np.ndarray
    direct_row: np.ndarray
    direct_slots: np.ndarray

    @property
    def num_symbols(self) -> int:
        return int(self.log_backoff.shape[0])

    @property
    def num_targets(self) -> int:
        return int(self.log_base.shape[0])

    @property
    def nbytes(self) -> int:
        return int(
            self.log_values.nbytes
            + self.log_backoff.nbytes
            + self.log_base.nbytes
            + self.direct_row.nbytes
            + self.direct_slots.nbytes
        )

    @classmethod
    def build(
        cls, key_means: np.ndarray, emission: SparseEmission, position_prior: np.ndarray, sigma2: float
    ) -> SparseKernelParameters:
        with np.errstate(divide="ignore"):
            log_values, log_backoff, log_base = np.log(emission.values), np.log(emission.backoff), np.log(emission.base)
        support = emission.support
        direct_row, direct_slots = direct_pair_rows(support.indptr, support.symbols, support.num_symbols)
        return cls(
            indptr=support.indptr,
            symbols=support.symbols,
            log_values=log_values,
            log_backoff=log_backoff,
            log_base=log_base,
            direct_row=direct_row,
            direct_slots=direct_slots,
            **_gate_fields(key_means, position_prior, sigma2),
        )


#: A target whose pairs are at least ``S / DIRECT_ROW_SHARE`` gets a direct symbol -> pair row (4 S bytes, so at
#: most ``4 DIRECT_ROW_SHARE`` bytes a pair of that target), the targets with the most pairs first, while all the
#: rows hold at most ``DIRECT_ROW_BYTES_PER_PAIR`` bytes a pair of the support. Measured at the reference shape
#: (S = T = 2000, N = 16, 1M rows, 98% of the cells in the support, every target a row): the sparse kernel went
#: from 0.68x to 0.81x the dense one's rows/s (``benchmarks/bench_scale.py``).
DIRECT_ROW_SHARE = 8
DIRECT_ROW_BYTES_PER_PAIR = 8


def direct_pair_rows(
    indptr: np.ndarray, symbols: np.ndarray, num_symbols: int, *, share: float = DIRECT_ROW_SHARE
) -> tuple[np.ndarray, np.ndarray]:
    """``(direct_row (T,) int32, direct_slots (R, S) int32)``: a symbol -> pair table for each target with at least
    ``num_symbols / share`` pairs (``share = 0`` makes none), -1 where a symbol is not one of the target's pairs;
    within ``DIRECT_ROW_BYTES_PER_PAIR`` bytes a pair of the support, the targets with the most pairs first.

    The kernels read a pair of such a target with one load instead of a binary search or a map filled per block.
    Pair indices are int32: a support of fewer than 2**31 pairs.
    """
    degree = np.diff(indptr)
    candidates = np.flatnonzero(degree * share >= num_symbols) if share > 0 and num_symbols > 0 else degree[:0]
    budget_rows = DIRECT_ROW_BYTES_PER_PAIR * int(indptr[-1]) // max(4 * num_symbols, 1)
    by_degree = candidates[np.argsort(-degree[candidates], kind="stable")]
    dense = np.sort(by_degree[:budget_rows])
    direct_row = np.full(degree.shape[0], -1, dtype=np.int32)
    direct_row[dense] = np.arange(dense.shape[0], dtype=np.int32)
    direct_slots = np.full((dense.shape[0], num_symbols), -1, dtype=np.int32)
    for r, t in enumerate(dense.tolist()):
        lo, hi = int(indptr[t]), int(indptr[t + 1])
        direct_slots[r, symbols[lo:hi]] = np.arange(lo, hi, dtype=np.int32)
    return direct_row, direct_slots


@dataclass
class StatisticArrays:
    """The additive sufficient statistics, in the layout the kernel scatters into.

    Attributes:
        key_sum: (S, D) sum of ``w r y`` per symbol.
        key_mass: (S,) sum of ``w r`` per symbol.
        emission_count_ts: (T, S) sum of ``w r`` per (target, symbol), target-major; (0, 0) when sparse.
        position_count: (N,) sum of ``w r`` per position.
        scalars: (3,) ``[query_sq, n_obs, log_lik]``: sum of ``w ||y||^2``, of ``w``, of ``w L``.
        pair_counts: (P,) sum of ``w r`` per pair of ``support`` (sparse statistics), else ``None``.
        support: the pairs of a sparse emission's statistics, else ``None``.
    """

    key_sum: np.ndarray
    key_mass: np.ndarray
    emission_count_ts: np.ndarray
    position_count: np.ndarray
    scalars: np.ndarray
    pair_counts: np.ndarray | None = None
    support: PairSupport | None = None

    @classmethod
    def zeros(
        cls,
        num_symbols: int,
        context_length: int,
        query_dim: int,
        num_targets: int,
        support: PairSupport | None = None,
        *,
        dense: bool | None = None,
    ) -> StatisticArrays:
        """Empty statistics for a head of the given S, N, D, T: dense (T, S) counts, or sparse over ``support``.

        ``dense=False`` without a support makes no emission counts at all (a sparse accumulator that is
        still collecting its pairs counts them apart); by default the counts are dense without a support.
        """
        dense = support is None if dense is None else dense
        # The tables the kernels update by row start on a cache line (see kernels/aligned.py).
        return cls(
            key_sum=aligned_zeros((num_symbols, query_dim)),
            key_mass=aligned_zeros(num_symbols),
            emission_count_ts=aligned_zeros((num_targets, num_symbols)) if dense else _NO_TABLE,
            position_count=np.zeros(context_length),
            scalars=np.zeros(3),
            pair_counts=None if support is None else aligned_zeros(support.num_pairs),
            support=support,
        )


_NO_TABLE = np.zeros((0, 0))


def block_ranges(n_rows: int, block_rows: int) -> Iterator[tuple[int, int]]:
    """Yield ``(start, stop)`` covering ``range(n_rows)`` in blocks of ``block_rows``."""
    if block_rows < 1:
        raise ValueError(f"block_rows = {block_rows}: expected a positive integer")
    for start in range(0, n_rows, block_rows):
        yield start, min(start + block_rows, n_rows)


# --------------------------------------------------------------------------------------------
# Compiled kernels. Query values are widened to float64 before any arithmetic so that float32
# stores give the same statistics as float64 inputs holding the same values.


@numba.njit(cache=True, nogil=True)
def target_order(target, num_targets):  # pragma: no cover - compiled
    """Row indices (n,) int64 stably sorted by target: a counting sort, O(n + T)."""
    n = target.shape[0]
    counts = np.zeros(num_targets + 1, dtype=np.int64)
    for row in range(n):
        counts[target[row] + 1] += 1
    for k in range(num_targets):
        counts[k + 1] += counts[k]
    order = np.empty(n, dtype=np.int64)
    for row in range(n):
        k = target[row]
        order[counts[k]] = row
        counts[k] += 1
    return order


#: How many rows ahead the E-step prefetches emission cells (their context, query and target twice as far).
_PREFETCH_ROWS = 4

#: Rows the E-step takes through each step together: their log-weights are exponentiated in one pass, so the
#: exponential's long chain of dependent multiply-adds runs for many rows at once instead of one row at a time.
_BATCH_ROWS = 8

#: A streamed group of rows (see ``_estep_numba``) is prefetched over the rows of the group before it, at most this
#: many cache lines of each emission table a row; a shorter group before it leaves its cells to the prefetch by row.
_STREAM_LINES_PER_ROW = 32

_SPARSE_PREFETCH_ROWS = 8  # the same for the sparse E-step

#: How many loads of a map fill one step of a binary search costs: a step waits on the load before it.
_SEARCH_STEP_COST = 4.0

#: The sparse E-step prefetches all of the next group's pairs when it has at most this many.
_GROUP_PREFETCH_PAIRS = 512

#: Key tables (``key_means``, and ``key_sum`` as large) of at least this many bytes make the sparse E-step
#: prefetch the key rows of a later row's symbols; smaller ones stay in the core's own cache.
_KEY_PREFETCH_BYTES = 2**20


@numba.njit(cache=True, nogil=True)
def _row_log_weights(
    context, row, y, tn, key_means, log_emission_ts, log_prior, inv_two_sigma2, out
):  # pragma: no cover - compiled
    """:func:`~dist_respattn.model.kernels.log_weights.row_log_weights` of a row under a dense (T, S) log emission."""
    # Issue the N emission loads together, before the arithmetic, so their cache misses overlap.
    for i in range(context.shape[1]):
        out[i] = log_emission_ts[tn, context[row, i]]
    return row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, out, out[:0])


@numba.njit(cache=True, nogil=True)
def prefetch_row(array, row):  # pragma: no cover - compiled
    """Prefetch every cache line of row ``row`` of a 2-D C-order array (rows need not start on a line)."""
    step = max(64 // array.itemsize, 1)
    for j in range(0, array.shape[1], step):
        prefetch_item(array, row, j)
    prefetch_item(array, row, array.shape[1] - 1)


@numba.njit(cache=True, nogil=True, inline="always")
def _row_start(begin, k, row, n_pos):  # pragma: no cover - compiled
    """Where the symbols of row ``row``, visited ``k``-th, start in the token array: ``begin[k]``, or ``row N`` when
    ``begin`` is ``None`` (the tokens are then an (n, N) context array's, row after row)."""
    if begin is None:
        return row * n_pos
    return begin[k]


@numba.njit(cache=True, nogil=True, inline="always")
def _query_row(query_index, k, row):  # pragma: no cover - compiled
    """The row of the query table holding the query of row ``row``, visited ``k``-th: ``query_index[k]``, or ``row``
    when ``query_index`` is ``None`` (the table is then an (n, D) query array)."""
    if query_index is None:
        return row
    return query_index[k]


@numba.njit(cache=True, nogil=True, inline="always")
def _prefetch_window(tokens, begin, query_table, query_index, k, row, n_pos):  # pragma: no cover - compiled
    """Prefetch the N symbols and the query row of row ``row``, visited ``k``-th (every cache line of them: they need
    not start on one)."""
    base = _row_start(begin, k, row, n_pos)
    prefetch_element(tokens, base)
    prefetch_element(tokens, base + n_pos - 1)
    prefetch_row(query_table, _query_row(query_index, k, row))


@numba.njit(cache=True, nogil=True)
def _group_end(target, order, k):  # pragma: no cover - compiled
    """The end of the group of rows ``order[k], ...`` that share ``order[k]``'s target (rows come grouped)."""
    t = target[order[k]]
    end = k + 1
    while end < order.shape[0] and target[order[end]] == t:
        end += 1
    return end


@numba.njit(cache=True, nogil=True)
def _estep_numba(
    tokens,
    begin,
    query_table,
    query_index,
    target,
    weights,
    key_means,
    log_emission_ts,
    log_prior,
    inv_two_sigma2,
    gate_const,
    key_sum,
    key_mass,
    emission_count_ts,
    position_count,
    scalars,
    impossible,
    order,
):  # pragma: no cover - compiled
    """Fused E-step and scatter over rows ``order[0], order[1], ...``.

    Row ``r``'s context is ``tokens[s : s + N]`` (``s = begin[r]``, or ``r N`` when ``begin`` is empty: the tokens
    of an (n, N) context array) and its query row ``query_index[r]`` of ``query_table`` (row ``r`` when
    ``query_index`` is empty: an (n, D) query array), so a token stream's rows are read where they lie, and
    their queries from its embedding table, without an (n, N) or (n, D) copy; both give the same numbers.

    Rows go through in batches of ``_BATCH_ROWS`` possible, weighted rows: the log-weights of each, then the
    exponentials of the whole batch in one pass, then each row's statistics in visiting order. Every number is
    computed as one row at a time would, and added in the same order, so the statistics do not depend on the
    batching. The loop makes no array views (each costs atomic reference counts, which wait for the stores
    before them): the batch lives in flat scratch arrays indexed by position.

    When rows come grouped by target (``order`` from :func:`target_order`), a group that will read at least as
    many emission cells as its target's row of the (T, S) tables has cache lines is streamed: while the group
    before it runs, every line of that row of both tables is prefetched, a few a row, instead of its cells one
    by one a few rows ahead (``_STREAM_LINES_PER_ROW``).

    Rows with no possible position are skipped; the first ``len(impossible)`` of them are written to
    ``impossible``. Returns how many there were.
    """
    n = target.shape[0]
    n_pos = log_prior.shape[0]
    dim = query_table.shape[1]
    n_sym = log_emission_ts.shape[1]
    lines = (n_sym + 7) // 8  # cache lines of a row of the emission tables (8 float64 a line)
    flat_logw = np.empty(_BATCH_ROWS * n_pos)
    flat_resp = np.empty(_BATCH_ROWS * n_pos)
    flat_bits = np.empty(_BATCH_ROWS * n_pos, dtype=np.int64)
    flat_scale = flat_bits.view(np.float64)
    ys = np.empty((_BATCH_ROWS, dim))  # the batch's queries in float64
    # The batch's symbols and targets, unsigned: they index the tables without a check for a negative index.
    sym = np.empty(_BATCH_ROWS * n_pos, dtype=np.uint64)
    batch_t = np.empty(_BATCH_ROWS, dtype=np.uint64)
    batch_best = np.empty(_BATCH_ROWS)
    batch_w = np.empty(_BATCH_ROWS)
    batch_yy = np.empty(_BATCH_ROWS)
    n_impossible = 0
    query_sq = 0.0
    n_obs = 0.0
    log_lik = 0.0
    # The group of rows visited now, ending before order[group_end], and the next one, order[group_end:next_end]
    # of target t_next; whether each has its emission rows streamed, and how far the next one's is.
    group_end = 0
    group_streamed = False
    next_end = 0
    next_streamed = False
    t_next = 0
    stream_at = 0
    stream_step = 0
    k = 0
    while k < n:
        m = 0
        while k < n and m < _BATCH_ROWS:
            row = order[k]
            if k >= group_end:
                if k == 0:
                    group_end = _group_end(target, order, k)
                    group_streamed = False
                else:
                    group_end = next_end
                    group_streamed = next_streamed
                next_end = group_end
                next_streamed = False
                if group_end < n:
                    t_next = target[order[group_end]]
                    next_end = _group_end(target, order, group_end)
                    # Streamed when its rows read at least `lines` cells and this group is long enough to spread
                    # the prefetches over.
                    next_streamed = (next_end - group_end) * n_pos >= lines and lines <= _STREAM_LINES_PER_ROW * (
                        group_end - k
                    )
                rows_left = group_end - k
                stream_step = 8 * ((lines + rows_left - 1) // rows_left)
                stream_at = 0
            if next_streamed and stream_at < n_sym:
                stream_stop = min(stream_at + stream_step, n_sym)
                for j in range(stream_at, stream_stop, 8):
                    prefetch_item(log_emission_ts, t_next, j)
                    prefetch_item(emission_count_ts, t_next, j)
                stream_at = stream_stop
                if stream_at == n_sym:  # a row need not start on a line: its last one too
                    prefetch_item(log_emission_ts, t_next, n_sym - 1)
                    prefetch_item(emission_count_ts, t_next, n_sym - 1)
            far = k + 2 * _PREFETCH_ROWS
            if far < n:
                # Rows are visited out of order: fetch a later row's context, query and target first...
                row_far = order[far]
                _prefetch_window(tokens, begin, query_table, query_index, far, row_far, n_pos)
                prefetch_element(target, row_far)
            ahead = k + _PREFETCH_ROWS
            if ahead < n and not (group_streamed if ahead < group_end else next_streamed and ahead < next_end):
                # ...then, once those have arrived, the emission cells it will read and update, scattered
                # over a (T, S) table far larger than cache, so the misses overlap with this row's work.
                row_ahead = order[ahead]
                t_ahead = target[row_ahead]
                base_ahead = _row_start(begin, ahead, row_ahead, n_pos)
                for i in range(n_pos):
                    prefetch_item(log_emission_ts, t_ahead, tokens[base_ahead + i])
                    prefetch_item(emission_count_ts, t_ahead, tokens[base_ahead + i])
            visited = k
            k += 1
            w = weights[row] if weights.shape[0] > 0 else 1.0
            if w == 0.0:
                # A zero-weight row contributes nothing, even when the model cannot explain it.
                continue
            yy = 0.0
            q = _query_row(query_index, visited, row)
            for d in range(dim):
                v = np.float64(query_table[q, d])
                ys[m, d] = v
                yy += v * v
            tn = np.uint64(target[row])
            at = m * n_pos
            base = _row_start(begin, visited, row, n_pos)
            for i in range(n_pos):
                sym[at + i] = np.uint64(tokens[base + i])
            # Issue the N emission loads together, before the arithmetic, so their cache misses overlap.
            for i in range(n_pos):
                flat_logw[at + i] = log_emission_ts[tn, sym[at + i]]
            best = row_log_weights_at(sym, ys, m, key_means, log_prior, inv_two_sigma2, flat_logw, at)
            if best == -np.inf:
                if n_impossible < impossible.shape[0]:
                    impossible[n_impossible] = row
                n_impossible += 1
                continue
            for i in range(n_pos):
                flat_logw[at + i] -= best
            batch_t[m] = tn
            batch_best[m] = best
            batch_w[m] = w
            batch_yy[m] = yy
            m += 1
        exp_nonpositive_n(flat_logw, flat_resp, flat_bits, flat_scale, m * n_pos)
        for b in range(m):
            tn = batch_t[b]
            w = batch_w[b]
            at = b * n_pos
            total = 0.0
            for i in range(n_pos):
                total += flat_resp[at + i]
            scale = w / total
            for i in range(n_pos):
                flat_resp[at + i] *= scale
            for i in range(n_pos):
                emission_count_ts[tn, sym[at + i]] += flat_resp[at + i]
            for i in range(n_pos):
                r = flat_resp[at + i]
                c = sym[at + i]
                key_mass[c] += r
                position_count[i] += r
            # Two key rows a pass over the query: half the loop's overhead and its run-time overlap checks. Each
            # cell still gets its terms in the same order (a symbol at both positions: the first one's, then the
            # second's), so the sums are the same to the bit.
            i = 0
            while i + 1 < n_pos:
                r0 = flat_resp[at + i]
                c0 = sym[at + i]
                r1 = flat_resp[at + i + 1]
                c1 = sym[at + i + 1]
                for d in range(dim):
                    yd = ys[b, d]
                    key_sum[c0, d] += r0 * yd
                    key_sum[c1, d] += r1 * yd
                i += 2
            if i < n_pos:
                r0 = flat_resp[at + i]
                c0 = sym[at + i]
                for d in range(dim):
                    key_sum[c0, d] += r0 * ys[b, d]
            query_sq += w * batch_yy[b]
            n_obs += w
            log_lik += w * (batch_best[b] + np.log(total) + gate_const)
    scalars[0] += query_sq
    scalars[1] += n_obs
    scalars[2] += log_lik
    return n_impossible


@numba.njit(cache=True, nogil=True)
def _scatter_numba(
    context, query, target, weights, resp, key_sum, key_mass, emission_count_ts, position_count, scalars
):  # pragma: no cover - compiled
    """Add given responsibilities ``resp`` (n, N), rows summing to one, times the row weights."""
    n, n_pos = context.shape
    dim = query.shape[1]
    query_sq = 0.0
    n_obs = 0.0
    dense = emission_count_ts.shape[0] > 0  # sparse statistics count their pairs elsewhere
    for row in range(n):
        w = weights[row] if weights.shape[0] > 0 else 1.0
        tn = target[row]
        for i in range(n_pos):
            r = resp[row, i] * w
            c = context[row, i]
            key_mass[c] += r
            position_count[i] += r
            if dense:
                emission_count_ts[tn, c] += r
            for d in range(dim):
                key_sum[c, d] += r * np.float64(query[row, d])
        yy = 0.0
        for d in range(dim):
            v = np.float64(query[row, d])
            yy += v * v
        query_sq += w * yy
        n_obs += w
    scalars[0] += query_sq
    scalars[1] += n_obs


@numba.njit(cache=True, nogil=True)
def _row_log_likelihood_numba(
    context, query, target, key_means, log_emission_ts, log_prior, inv_two_sigma2, gate_const, out
):  # pragma: no cover - compiled
    n_pos = context.shape[1]
    logw = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    y = np.empty(query.shape[1])
    for row in range(context.shape[0]):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        best = _row_log_weights(
            context, row, y, target[row], key_means, log_emission_ts, log_prior, inv_two_sigma2, logw
        )
        if best == -np.inf:
            out[row] = -np.inf
            continue
        total = exp_shifted(logw, best, resp, bits)
        out[row] = best + np.log(total) + gate_const


# --------------------------------------------------------------------------------------------
# Compiled kernels of a sparse emission. A pair's value is found by a binary search of its target's
# symbols; the E-step visits a block's rows grouped by target and, for a target with enough rows in
# the block, fills a dense symbol -> pair map once instead (``slot``, S entries, -1 when unset).


@numba.njit(cache=True, nogil=True)
def find_pair(indptr, symbols, t, c):  # pragma: no cover - compiled
    """The index of pair (c, t) in the support, or -1."""
    lo = indptr[t]
    end = indptr[t + 1]
    hi = end
    while lo < hi:
        mid = (lo + hi) >> 1
        if symbols[mid] < c:
            lo = mid + 1
        else:
            hi = mid
    if lo < end and symbols[lo] == c:
        return lo
    return -1


@numba.njit(cache=True, nogil=True)
def _log_emission_sparse(indptr, symbols, log_values, log_backoff, log_base, t, c):  # pragma: no cover
    p = find_pair(indptr, symbols, t, c)
    if p >= 0:
        return log_values[p]
    return log_backoff[c] + log_base[t]


@numba.njit(cache=True, nogil=True)
def _estep_sparse_numba(
    tokens,
    begin,
    query_table,
    query_index,
    target,
    weights,
    key_means,
    indptr,
    symbols,
    log_values,
    log_prior,
    inv_two_sigma2,
    gate_const,
    key_sum,
    key_mass,
    pair_counts,
    position_count,
    scalars,
    impossible,
    order,
    slot,
    direct_row,
    direct_slots,
    prefetch_keys,
):  # pragma: no cover - compiled
    """Fused E-step and scatter over rows ``order[...]``, which come grouped by target; rows' contexts and queries
    are read as ``_estep_numba`` reads them (from a token array and a query table, or (n, N) and (n, D) arrays).

    ``prefetch_keys`` makes it prefetch the key rows (of ``key_means`` and ``key_sum``) of the symbols of a later
    row: worth it when they outgrow the core's own cache (``_KEY_PREFETCH_BYTES``).

    A target's pairs are found through its row of ``direct_slots`` when it has one, else through ``slot``
    (an all -1 int32 map of S entries, filled for the group and cleared after) when the group has enough
    rows, else by a binary search. All three give the same pair, so the statistics do not depend on which.

    Returns ``(n_impossible, n_outside)``: rows the model cannot explain (the first ones written to
    ``impossible``), and rows holding a pair outside the support (counted, not added: the caller raises).
    """
    n = target.shape[0]
    n_pos = log_prior.shape[0]
    dim = query_table.shape[1]
    logw = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    pair = np.empty(n_pos, dtype=np.int64)
    y = np.empty(dim)
    # Views made once, not a row or a group at a time (each costs atomic reference counts in the loop).
    scale_bits = bits.view(np.float64)
    slot_table = slot.reshape(1, slot.shape[0])
    n_impossible = 0
    n_outside = 0
    query_sq = 0.0
    n_obs = 0.0
    log_lik = 0.0
    k = 0
    while k < n:
        tn = target[order[k]]
        group_end = k + 1
        while group_end < n and target[order[group_end]] == tn:
            group_end += 1
        lo = indptr[tn]
        hi = indptr[tn + 1]
        degree = hi - lo
        row_index = direct_row[tn]
        fill = False
        # The map read is row `table_row` of `table`: the target's direct row, or the map filled for the group.
        if row_index >= 0:
            table = direct_slots
            table_row = row_index
        else:
            # A map costs 2 writes per pair of the target, in order; a search ~log2(degree) steps per lookup, each
            # a load that depends on the one before (so weighted as _SEARCH_STEP_COST writes).
            fill = (group_end - k) * n_pos * (np.log2(degree + 1.0) + 1.0) * _SEARCH_STEP_COST > 2.0 * degree
            table = slot_table
            table_row = 0
        use_map = fill or row_index >= 0
        if group_end < n:
            # The next group's pairs are contiguous: when they are few, fetch all of their symbols, values and
            # counts while this group runs (a group holds a few rows at tens of thousands of targets).
            t_next = target[order[group_end]]
            lo_next = indptr[t_next]
            hi_next = indptr[t_next + 1]
            if hi_next - lo_next <= _GROUP_PREFETCH_PAIRS:
                for j in range(lo_next, hi_next, 16):
                    prefetch_element(symbols, j)
                for j in range(lo_next, hi_next, 8):
                    prefetch_element(log_values, j)
                    prefetch_element(pair_counts, j)
                if hi_next > lo_next:
                    prefetch_element(symbols, hi_next - 1)
                    prefetch_element(log_values, hi_next - 1)
                    prefetch_element(pair_counts, hi_next - 1)
        if fill:
            for j in range(lo, hi):
                slot[symbols[j]] = j
        for kk in range(k, group_end):
            row = order[kk]
            far = kk + 2 * _SPARSE_PREFETCH_ROWS
            if far < n:
                _prefetch_window(tokens, begin, query_table, query_index, far, order[far], n_pos)
            ahead = kk + _SPARSE_PREFETCH_ROWS
            if prefetch_keys and ahead < n:
                base_ahead = _row_start(begin, ahead, order[ahead], n_pos)
                for i in range(n_pos):
                    prefetch_row(key_means, tokens[base_ahead + i])
                    prefetch_row(key_sum, tokens[base_ahead + i])
            if use_map and ahead < group_end:
                # ...and, as the dense kernel does, the values and counts of a later row of the group: its
                # context has arrived by now, and its pairs' cells are spread over the target's P / T pairs.
                base_ahead = _row_start(begin, ahead, order[ahead], n_pos)
                for i in range(n_pos):
                    p_ahead = max(table[table_row, tokens[base_ahead + i]], 0)  # -1: outside the support
                    prefetch_element(log_values, p_ahead)
                    prefetch_element(pair_counts, p_ahead)
            w = weights[row] if weights.shape[0] > 0 else 1.0
            if w == 0.0:
                continue
            outside = False
            base = _row_start(begin, kk, row, n_pos)
            for i in range(n_pos):
                c = tokens[base + i]
                p = table[table_row, c] if use_map else find_pair(indptr, symbols, tn, c)
                pair[i] = p
                if p < 0:
                    outside = True
            if outside:
                n_outside += 1
                continue
            yy = 0.0
            q = _query_row(query_index, kk, row)
            for d in range(dim):
                v = np.float64(query_table[q, d])
                y[d] = v
                yy += v * v
            for i in range(n_pos):
                logw[i] = log_values[pair[i]]
            best = span_log_weights(tokens, base, y, key_means, log_prior, inv_two_sigma2, logw)
            if best == -np.inf:
                if n_impossible < impossible.shape[0]:
                    impossible[n_impossible] = row
                n_impossible += 1
                continue
            total = exp_shifted_into(logw, best, resp, bits, scale_bits)
            scale = w / total
            for i in range(n_pos):
                r = resp[i] * scale
                resp[i] = r
                c = tokens[base + i]
                pair_counts[pair[i]] += r
                key_mass[c] += r
                position_count[i] += r
            # Two key rows a pass over the query, each cell's terms in the same order (as the dense E-step).
            i = 0
            while i + 1 < n_pos:
                r0 = resp[i]
                c0 = tokens[base + i]
                r1 = resp[i + 1]
                c1 = tokens[base + i + 1]
                for d in range(dim):
                    yd = y[d]
                    key_sum[c0, d] += r0 * yd
                    key_sum[c1, d] += r1 * yd
                i += 2
            if i < n_pos:
                r0 = resp[i]
                c0 = tokens[base + i]
                for d in range(dim):
                    key_sum[c0, d] += r0 * y[d]
            query_sq += w * yy
            n_obs += w
            log_lik += w * (best + np.log(total) + gate_const)
        if fill:
            for j in range(lo, hi):
                slot[symbols[j]] = -1
        k = group_end
    scalars[0] += query_sq
    scalars[1] += n_obs
    scalars[2] += log_lik
    return n_impossible, n_outside


@numba.njit(cache=True, nogil=True)
def _row_log_likelihood_sparse_numba(
    context,
    query,
    target,
    key_means,
    indptr,
    symbols,
    log_values,
    log_backoff,
    log_base,
    log_prior,
    inv_two_sigma2,
    gate_const,
    out,
):  # pragma: no cover - compiled
    n_pos = context.shape[1]
    logw = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    y = np.empty(query.shape[1])
    for row in range(context.shape[0]):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        tn = target[row]
        for i in range(n_pos):
            logw[i] = _log_emission_sparse(indptr, symbols, log_values, log_backoff, log_base, tn, context[row, i])
        best = row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, logw, logw[:0])
        if best == -np.inf:
            out[row] = -np.inf
            continue
        total = exp_shifted(logw, best, resp, bits)
        out[row] = best + np.log(total) + gate_const


# --------------------------------------------------------------------------------------------
# Vectorized NumPy implementation of the same two steps (the fallback and the baseline).


def _responsibilities_numpy(
    context: np.ndarray, query: np.ndarray, target: np.ndarray, weights: np.ndarray, params: KernelParameters
) -> tuple[np.ndarray, np.ndarray]:
    """(w r (n, N), L (n,)) for one block; L is -inf on weighted rows with no possible position."""
    log_emission = params.log_emission_ts[target[:, None], context]
    log_w = block_log_weights(context, query, params.key_means, params.log_prior, params.inv_two_sigma2, log_emission)
    best = log_w.max(axis=1)
    safe_best = np.where(np.isneginf(best), 0.0, best)
    e = np.exp(log_w - safe_best[:, None])
    total = e.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        loglik = np.where(total > 0.0, safe_best + np.log(total) + params.gate_const, -np.inf)
        resp = np.where(total[:, None] > 0.0, e * (weights / total)[:, None], 0.0)
    resp[weights == 0.0] = 0.0
    loglik[weights == 0.0] = 0.0
    return resp, loglik


def _scatter_numpy(
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    weights: np.ndarray,
    resp: np.ndarray,
    loglik: np.ndarray,
    stats: StatisticArrays,
) -> None:
    """Bincount scatter of one block's weighted responsibilities into ``stats``."""
    num_targets, num_symbols = stats.emission_count_ts.shape
    y = query.astype(np.float64, copy=False)
    flat_sym = context.reshape(-1)
    flat_r = resp.reshape(-1)
    stats.key_mass += np.bincount(flat_sym, weights=flat_r, minlength=num_symbols)
    # key_sum[s] = sum over (row, i) with c = s of r * y_row: a sparse (S × n) by (n × D) product,
    # done as one bincount per query dimension on the per-row symbol masses.
    for d in range(y.shape[1]):
        stats.key_sum[:, d] += np.bincount(
            flat_sym, weights=(resp * y[:, d : d + 1]).reshape(-1), minlength=num_symbols
        )
    cell = np.repeat(target.astype(np.int64), context.shape[1]) * num_symbols + flat_sym
    stats.emission_count_ts += np.bincount(cell, weights=flat_r, minlength=num_targets * num_symbols).reshape(
        num_targets, num_symbols
    )
    stats.position_count += resp.sum(axis=0)
    live = (weights > 0.0) & np.isfinite(loglik)
    stats.scalars[0] += float(np.dot(weights, np.einsum("nd,nd->n", y, y)))
    stats.scalars[1] += float(weights[live].sum())
    stats.scalars[2] += float(np.dot(weights[live], loglik[live]))


# --------------------------------------------------------------------------------------------
# Block driver.

_NO_WEIGHTS = np.zeros(0)

#: An empty index: the kernels' rows are then an (n, N) context and an (n, D) query array, row ``r`` at row ``r``.
_NO_INDEX = None


def _kernel_weights(weights: np.ndarray | None) -> np.ndarray:
    # The compiled kernels read an empty array as "every weight is 1" so no (n,) array of ones is made.
    return _NO_WEIGHTS if weights is None else np.ascontiguousarray(weights, dtype=np.float64)


#: How many impossible rows an error message lists.
_IMPOSSIBLE_SHOWN = 10


def _impossible_rows_message(rows: np.ndarray, n_impossible: int) -> str:
    """``rows``: the first impossible row numbers found (in order), ``n_impossible``: how many in all."""
    rows = rows[:_IMPOSSIBLE_SHOWN]
    shown = ", ".join(str(int(r)) for r in rows)
    more = f" and {n_impossible - rows.size} more" if n_impossible > rows.size else ""
    subject = f"row {shown} has" if n_impossible == 1 else f"rows {shown}{more} have"
    return (
        f"impossible evidence: {subject} zero probability under the model "
        "(every context position has a zero prior or a zero emission probability for the row's target); "
        "use emission_smoothing > 0 or drop these rows"
    )


def accumulate_estep(
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    weights: np.ndarray | None,
    params: KernelParameters | SparseKernelParameters,
    stats: StatisticArrays,
    *,
    backend: Backend = "numba",
    block_rows: int | None = None,
    group_by_target: bool | None = None,
    checked: bool = False,
) -> None:
    """Run the E-step on every row and add its weighted statistics into ``stats``.

    The input is scanned first (``scan_values``), so bad values raise before ``stats`` changes, unless
    ``checked`` says the caller has passed these rows through ``check_batch`` already. Rows
    the model gives zero probability raise ``ImpossibleEvidenceError`` after the other rows have been
    added: the caller must then discard ``stats``.

    ``group_by_target`` makes the compiled kernel visit each block's rows grouped by target; by
    default it does so when the emission table is at least ``GROUP_BY_TARGET_TABLE_BYTES`` (a sparse
    emission's rows are always grouped).

    Rows are processed in blocks of ``block_rows`` (default ``DEFAULT_BLOCK_ROWS`` for the compiled
    kernel, ``NUMPY_BLOCK_ROWS`` for NumPy). Memory beyond the inputs and ``stats``: 8 bytes a block
    row for the compiled kernel's visiting order (and 8 bytes a symbol for a sparse emission's map);
    ``block_rows × N × D`` float64 for NumPy.
    """
    if not checked:
        scan_values(context, query, target, weights, num_symbols=params.num_symbols, num_targets=params.num_targets)
    context, target = kernel_ids(context), kernel_ids(target)
    if isinstance(params, SparseKernelParameters):
        if backend != "numba":
            raise ValueError(f"backend = {backend!r}: a sparse emission runs on the compiled kernel ('numba') only")
        if stats.pair_counts is None:
            raise ValueError("the statistics are dense but the emission is sparse: make them over its support")
        _accumulate_sparse(context, query, target, _kernel_weights(weights), params, stats, block_rows)
    elif backend == "numba":
        _accumulate_dense_rows(
            _encoded_blocks(context, query), target, _kernel_weights(weights), params, stats, block_rows,
            group_by_target,
        )  # fmt: skip
    elif backend == "numpy":
        bad_rows: list[int] = []
        for start, stop in block_ranges(context.shape[0], block_rows or NUMPY_BLOCK_ROWS):
            w = np.ones(stop - start) if weights is None else weights[start:stop].astype(np.float64, copy=False)
            ctx_b, y_b, t_b = context[start:stop], query[start:stop], target[start:stop]
            resp, loglik = _responsibilities_numpy(ctx_b, y_b, t_b, w, params)
            bad_rows.extend((start + np.flatnonzero(np.isneginf(loglik))).tolist())
            _scatter_numpy(ctx_b, y_b, t_b, w, resp, loglik, stats)
        if bad_rows:
            rows = np.asarray(bad_rows[:_IMPOSSIBLE_SHOWN])
            raise ImpossibleEvidenceError(_impossible_rows_message(rows, len(bad_rows)))
    else:
        raise ValueError(f"backend = {backend!r}: expected 'numba' or 'numpy'")


def _accumulate_sparse(
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    kernel_weights: np.ndarray,
    params: SparseKernelParameters,
    stats: StatisticArrays,
    block_rows: int | None,
) -> None:
    """The sparse E-step over blocks of encoded rows (see :func:`_accumulate_sparse_rows`)."""
    _accumulate_sparse_rows(_encoded_blocks(context, query), target, kernel_weights, params, stats, block_rows)


def _accumulate_sparse_rows(
    rows_of: Any,
    target: np.ndarray,
    kernel_weights: np.ndarray,
    params: SparseKernelParameters,
    stats: StatisticArrays,
    block_rows: int | None,
) -> None:
    """The sparse E-step over blocks, each visited grouped by target (see ``_estep_sparse_numba``): block
    ``[start, stop)``'s ``(tokens, begin, query_table, query_index)`` are ``rows_of(start, stop)``."""
    impossible: list[int] = []
    n_impossible = n_outside = 0
    slot = np.full(params.num_symbols, -1, dtype=np.int32)
    for start, stop in block_ranges(target.shape[0], block_rows or DEFAULT_BLOCK_ROWS):
        order = target_order(target[start:stop], params.num_targets)
        found = np.empty(stop - start, dtype=np.int64)
        n_found, outside = _estep_sparse_numba(  # type: ignore[call-arg]
            *_in_order(rows_of(start, stop), order),
            target[start:stop],
            kernel_weights[start:stop] if kernel_weights.shape[0] else kernel_weights,
            params.key_means,
            params.indptr,
            params.symbols,
            params.log_values,
            params.log_prior,
            params.inv_two_sigma2,
            params.gate_const,
            stats.key_sum,
            stats.key_mass,
            stats.pair_counts,
            stats.position_count,
            stats.scalars,
            found,
            order,
            slot,
            params.direct_row,
            params.direct_slots,
            params.key_means.nbytes >= _KEY_PREFETCH_BYTES,
        )
        impossible.extend((start + np.sort(found[:n_found])[:_IMPOSSIBLE_SHOWN]).tolist())
        n_impossible += n_found
        n_outside += outside
    if n_outside:
        raise ValueError(
            f"{n_outside} row(s) hold a (symbol, target) pair outside the sparse emission's support: the support "
            "must come from these rows (a fit finds it in its start pass); refit, or use --emission-layout dense"
        )
    if n_impossible:
        raise ImpossibleEvidenceError(_impossible_rows_message(np.asarray(impossible), n_impossible))


def _in_order(rows: tuple[Any, ...], order: np.ndarray) -> tuple[Any, ...]:
    """A block's ``(tokens, begin, query_table, query_index)`` with its window starts and query rows in the kernel's
    visiting ``order`` (the kernel then reads them one after the other, not scattered); encoded rows as they are."""
    tokens, begin, query_table, query_index = rows
    if begin is None:
        return rows
    return tokens, begin[order], query_table, query_index[order]


def _encoded_blocks(context: np.ndarray, query: np.ndarray) -> Any:
    """``rows_of(start, stop)`` of encoded rows: block ``[start, stop)``'s ``(tokens, begin, query_table,
    query_index)`` as the compiled E-steps take them (its (n, N) contexts as one token array, its (n, D) queries)."""
    return lambda start, stop: (context[start:stop].reshape(-1), None, query[start:stop], None)


def _window_blocks(rows: WindowArrays) -> Any:
    """``rows_of(start, stop)`` of token windows: the whole token array and query table, block ``[start, stop)``'s
    window starts and query rows."""
    return lambda start, stop: (rows.tokens, rows.begin[start:stop], rows.query_table, rows.query_index[start:stop])


def _accumulate_dense_rows(
    rows_of: Any,
    target: np.ndarray,
    kernel_weights: np.ndarray,
    params: KernelParameters,
    stats: StatisticArrays,
    block_rows: int | None,
    group_by_target: bool | None,
) -> None:
    """The dense E-step over blocks (see ``_estep_numba``): block ``[start, stop)``'s ``(tokens, begin, query_table,
    query_index)`` are ``rows_of(start, stop)``."""
    impossible: list[int] = []
    n_impossible = 0
    # Visiting a block's rows grouped by target pays when the emission tables outgrow cache (rows
    # of one target then read and update one row of the (T, S) tables); with a small table,
    # reading rows in their own order is cheaper.
    if group_by_target is None:
        group_by_target = params.log_emission_ts.nbytes >= GROUP_BY_TARGET_TABLE_BYTES
    for start, stop in block_ranges(target.shape[0], block_rows or DEFAULT_BLOCK_ROWS):
        if group_by_target:
            order = target_order(target[start:stop], params.num_targets)
        else:
            order = np.arange(stop - start, dtype=np.int64)
        # Room for every row of the block: they are found in visiting order, and the message
        # lists the first ones in row order.
        found = np.empty(stop - start, dtype=np.int64)
        n_found = _estep_numba(  # type: ignore[call-arg]
            *_in_order(rows_of(start, stop), order),
            target[start:stop],
            kernel_weights[start:stop] if kernel_weights.shape[0] else kernel_weights,
            params.key_means,
            params.log_emission_ts,
            params.log_prior,
            params.inv_two_sigma2,
            params.gate_const,
            stats.key_sum,
            stats.key_mass,
            stats.emission_count_ts,
            stats.position_count,
            stats.scalars,
            found,
            order,
        )
        impossible.extend((start + np.sort(found[:n_found])[:_IMPOSSIBLE_SHOWN]).tolist())
        n_impossible += n_found
    if n_impossible:
        raise ImpossibleEvidenceError(_impossible_rows_message(np.asarray(impossible), n_impossible))


@numba.njit(cache=True, nogil=True)
def _first_short_window(begin, end, n_pos):  # pragma: no cover - compiled
    """The first row whose window ``[begin, end)`` does not hold ``n_pos`` tokens, or -1."""
    for r in range(begin.shape[0]):
        if end[r] - begin[r] != n_pos:
            return r
    return -1


def accumulate_estep_windows(
    rows: WindowArrays,
    params: KernelParameters | SparseKernelParameters,
    stats: StatisticArrays,
    *,
    block_rows: int | None = None,
    group_by_target: bool | None = None,
) -> None:
    """:func:`accumulate_estep` (the compiled kernel) of full token windows, checked: row ``r``'s context is
    ``rows.tokens[rows.begin[r] : rows.begin[r] + N]`` and its query ``rows.query_table[rows.query_index[r]]``.

    A token stream's rows are read where they lie (the block's tokens, its embedding table): no (n, N) context or
    (n, D) query is made. The rows are visited in the same blocks and order, every number computed and added as
    :func:`accumulate_estep` does from the encoded arrays of the same rows, so the statistics are the same to
    the bit. Every window must hold N tokens (a ValueError names the first that does not, before anything is
    added).
    """
    n_pos = params.log_prior.shape[0]
    short = _first_short_window(rows.begin, rows.end, n_pos)
    if short >= 0:
        raise ValueError(
            f"row {short}: a window of {int(rows.end[short] - rows.begin[short])} tokens: a free position prior reads "
            f"full windows of N = {n_pos} (short histories need --position-buckets)"
        )
    if isinstance(params, SparseKernelParameters):
        if stats.pair_counts is None:
            raise ValueError("the statistics are dense but the emission is sparse: make them over its support")
        _accumulate_sparse_rows(_window_blocks(rows), rows.target, rows.weight, params, stats, block_rows)
    else:
        _accumulate_dense_rows(
            _window_blocks(rows), rows.target, rows.weight, params, stats, block_rows, group_by_target
        )


def accumulate_responsibilities(
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    weights: np.ndarray | None,
    responsibilities: np.ndarray,
    stats: StatisticArrays,
) -> None:
    """Add given responsibilities (n, N), rows summing to one, times the row weights, into ``stats``.

    The log-likelihood sum is left alone. Used by initialization, where responsibilities are drawn at
    random instead of computed from a model. Values must already have passed ``scan_values``.
    """
    _scatter_numba(
        context,
        np.ascontiguousarray(query, dtype=np.float64),  # float32 queries widened (exactly): one build for both
        target,
        _kernel_weights(weights),
        np.ascontiguousarray(responsibilities, dtype=np.float64),
        stats.key_sum,
        stats.key_mass,
        stats.emission_count_ts,
        stats.position_count,
        stats.scalars,
    )


@numba.njit(cache=True, nogil=True)
def _scatter_uniform_windows_numba(
    tokens,
    begin,
    query_table,
    query_index,
    weights,
    target,
    uniform,
    key_sum,
    key_mass,
    emission_count_ts,
    position_count,
    scalars,
):  # pragma: no cover - compiled
    """:func:`_scatter_numba` of full token windows under uniform responsibilities ``uniform`` (1/N) on every
    position: row ``r``'s context is ``tokens[begin[r] : begin[r] + N]``, its query ``query_table[query_index[r]]``.
    Every product and sum is :func:`_scatter_numba`'s, in its order.

    A row's N key rows take one product ``r y_d`` each, made once for the row (the same product N times); a query
    row's ``||y||^2``, a chain of D dependent additions, is made the first time the block meets that row and read
    back after (the same sum): 0.29-0.36 -> 0.20 s for a 4.2M-row partition of the 109M-token store."""
    n = begin.shape[0]
    n_pos = position_count.shape[0]
    dim = query_table.shape[1]
    query_sq = 0.0
    n_obs = 0.0
    dense = emission_count_ts.shape[0] > 0
    scaled = np.empty(dim)
    norms = np.full(query_table.shape[0], -1.0)  # each query row's ||y||^2 once met (-1: not yet)
    for row in range(n):
        w = weights[row] if weights.shape[0] > 0 else 1.0
        tn = target[row]
        at = begin[row]
        q = query_index[row]
        r = uniform * w
        for d in range(dim):
            scaled[d] = r * np.float64(query_table[q, d])
        for i in range(n_pos):
            c = np.uint32(tokens[at + i])  # checked ids: unsigned, no test for a negative index
            key_mass[c] += r
            position_count[i] += r
            if dense:
                emission_count_ts[tn, c] += r
            for d in range(dim):
                key_sum[c, d] += scaled[d]
        yy = norms[q]
        if yy < 0.0:
            yy = 0.0
            for d in range(dim):
                v = np.float64(query_table[q, d])
                yy += v * v
            norms[q] = yy
        query_sq += w * yy
        n_obs += w
    scalars[0] += query_sq
    scalars[1] += n_obs


def accumulate_uniform_windows(rows: WindowArrays, uniform: float, stats: StatisticArrays) -> None:
    """:func:`accumulate_responsibilities` of full token windows (checked) under uniform responsibilities
    ``uniform`` on every position, read where they lie: no (n, N) context, (n, D) query or (n, N) responsibilities
    are made, and the statistics are those of the same rows encoded, to the bit. Every window must hold N tokens."""
    n_pos = stats.position_count.shape[0]
    short = _first_short_window(rows.begin, rows.end, n_pos)
    if short >= 0:
        raise ValueError(
            f"row {short}: a window of {int(rows.end[short] - rows.begin[short])} tokens: a free position prior reads "
            f"full windows of N = {n_pos} (short histories need --position-buckets)"
        )
    _scatter_uniform_windows_numba(
        rows.tokens, rows.begin, rows.query_table, rows.query_index, rows.weight, rows.target, float(uniform),
        stats.key_sum, stats.key_mass, stats.emission_count_ts, stats.position_count, stats.scalars,
    )  # fmt: skip


def row_log_likelihood(
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    params: KernelParameters | SparseKernelParameters,
    *,
    checked: bool = False,
) -> np.ndarray:
    """``log p(query, target | context)`` per row: (n,) float64, ``-inf`` for impossible rows.

    The values are scanned first unless ``checked`` (the caller ran ``check_batch``)."""
    if not checked:
        scan_values(context, query, target, None, num_symbols=params.num_symbols, num_targets=params.num_targets)
    out = np.empty(context.shape[0])
    context, target = kernel_ids(context), kernel_ids(target)
    query = np.ascontiguousarray(query, dtype=np.float64)  # float32 queries widened (exactly): one build for both
    if isinstance(params, SparseKernelParameters):
        _row_log_likelihood_sparse_numba(
            context, query, target, params.key_means, params.indptr, params.symbols, params.log_values,
            params.log_backoff, params.log_base, params.log_prior, params.inv_two_sigma2, params.gate_const, out,
        )  # fmt: skip
        return out
    _row_log_likelihood_numba(
        context,
        query,
        target,
        params.key_means,
        params.log_emission_ts,
        params.log_prior,
        params.inv_two_sigma2,
        params.gate_const,
        out,
    )
    return out
