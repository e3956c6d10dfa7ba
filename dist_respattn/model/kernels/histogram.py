"""The histogram kernels: rows of a head whose position prior is tied over recency buckets.

With the prior tied (:mod:`dist_respattn.model.buckets`), a row's attention depends on its window only
through how many times each symbol occurs in each bucket. A row's **terms** are its window's distinct
symbols ``s``, each with its prior::

    rho(s) = sum_b (pi_b / |b|) h_b(s) / A            (A = 1 for a full window; see the buckets' module)

and everything that costs D operations (the distance to the key, the emission lookup, the exp, the
scatter of ``r y`` into the key sums) is done once per term instead of once per position: the row's
log-weights are ``log rho(s) + log B[s, t] - ||y - K[s]||^2 / (2 sigma2)``, the expression of
:func:`~dist_respattn.model.kernels.log_weights.row_log_weights` with the terms as the row's positions. A
bucket's responsibility mass is the sum, over its positions, of their term's responsibility times the
position's share of the term's prior: the same numbers as the per-position kernel under the same tied
prior, summed per bucket (equal to 1e-12, ``tests/model/test_histogram.py``). The position counts are
the bucket masses split evenly over each bucket's positions, which the tied M-step sums back.

The E-step keeps the terms as integer counts per bucket and slides them from one row of a document to the
next (K + 1 count updates a row, see :func:`_estep_windows_numba`); the start pass, the held-out grid and
scoring read each row's window once (one load and one add a position, :func:`row_terms`).

Rows are :class:`WindowRows`: a token array and, per row, the half-open span ``[begin, end)`` of its
window in it, its target and its query (an index into a query table). A token-stream store hands its
chunk of tokens over as it is, its queries as its embedding table and the previous tokens: no (n, N)
window or (n, D) query array is made. A triple store's rows are the same thing with their context
array flattened (:meth:`WindowRows.from_encoded`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.fitting.selection import grid_count, grid_row
from dist_respattn.model.heads.single_hop.scoring import dense_mixture, mixture_at, top_k_scratch, top_k_threshold
from dist_respattn.model.kernels import per_position
from dist_respattn.model.kernels.log_weights import attention_of, exp_shifted, row_log_weights, squared_distance
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import ScoreTotals

__all__ = [
    "HistogramParameters",
    "accumulate_windows",
    "grid_windows",
    "histogram_parameters",
    "initialize_windows",
    "score_windows",
    "window_block_ranges",
]

#: Rows per block are chosen so that a block holds at most this many window positions: the start pass's
#: (symbol, target) tally holds one entry per distinct symbol of every row of a block.
WINDOW_BLOCK_POSITIONS = 1 << 22


@dataclass(frozen=True)
class HistogramParameters:
    """A head with a tied prior, laid out for the histogram kernels.

    Attributes:
        key_means: (S, D) float64; ``inv_two_sigma2``, ``gate_const``: as in the per-position kernels.
        bucket_of_recency: (N,) int64; ``sizes``: (K,) int64; ``share``: (K,) ``pi_b / |b|``, a position's prior.
        log_emission_ts: (T, S) dense ``log B`` (``(0, 0)`` when sparse); the sparse emission's arrays
            ``indptr``, ``symbols``, ``log_values``, ``log_backoff``, ``log_base``, ``direct_row``,
            ``direct_slots`` (empty when dense), as in
            :class:`~dist_respattn.model.kernels.per_position.SparseKernelParameters`.
    """

    key_means: np.ndarray
    inv_two_sigma2: float
    gate_const: float
    bucket_of_recency: np.ndarray
    sizes: np.ndarray
    share: np.ndarray
    log_emission_ts: np.ndarray
    indptr: np.ndarray
    symbols: np.ndarray
    log_values: np.ndarray
    log_backoff: np.ndarray
    log_base: np.ndarray
    direct_row: np.ndarray
    direct_slots: np.ndarray

    @property
    def num_symbols(self) -> int:
        return int(self.key_means.shape[0])

    @property
    def context_length(self) -> int:
        return int(self.bucket_of_recency.shape[0])

    @property
    def sparse(self) -> bool:
        return self.indptr.shape[0] > 0

    @classmethod
    def build(
        cls, params: per_position.KernelParameters | per_position.SparseKernelParameters, buckets: PositionBuckets
    ) -> HistogramParameters:
        prior = np.exp(params.log_prior)
        weights = buckets.bucket_weights(prior)
        sizes = np.asarray(buckets.sizes, dtype=np.int64)
        gate: dict[str, Any] = {
            "key_means": params.key_means,
            "inv_two_sigma2": params.inv_two_sigma2,
            "gate_const": params.gate_const,
            "bucket_of_recency": buckets.bucket_of_recency,
            "sizes": sizes,
            "share": weights / sizes,
        }
        if isinstance(params, per_position.SparseKernelParameters):
            return cls(
                log_emission_ts=_NO_TABLE, indptr=params.indptr, symbols=params.symbols, log_values=params.log_values,
                log_backoff=params.log_backoff, log_base=params.log_base, direct_row=params.direct_row,
                direct_slots=params.direct_slots, **gate,
            )  # fmt: skip
        return cls(
            log_emission_ts=params.log_emission_ts, indptr=_NO_INDEX, symbols=_NO_SYMBOLS, log_values=_NO_VALUES,
            log_backoff=_NO_VALUES, log_base=_NO_VALUES, direct_row=_NO_DIRECT_ROW, direct_slots=_NO_DIRECT_SLOTS,
            **gate,
        )  # fmt: skip

    def emission_arrays(self) -> tuple[np.ndarray, ...]:
        return (
            self.log_emission_ts, self.indptr, self.symbols, self.log_values, self.log_backoff, self.log_base,
            self.direct_row, self.direct_slots,
        )  # fmt: skip


_NO_TABLE = np.zeros((0, 0))
_NO_INDEX = np.zeros(0, dtype=np.int64)
_NO_SYMBOLS = np.zeros(0, dtype=np.int32)
#: A dense head's empty ranked targets, of a support's target dtype: a dense and a sparse head share one build.
_NO_TARGETS = np.zeros(0, dtype=np.int32)
_NO_VALUES = np.zeros(0)
_NO_DIRECT_ROW = np.zeros(0, dtype=np.int32)
_NO_DIRECT_SLOTS = np.zeros((0, 0), dtype=np.int32)


# --------------------------------------------------------------------------------------------
# Compiled parts shared by every pass.


@numba.njit(cache=True, nogil=True)
def row_terms(tokens, begin, end, bucket_of_recency, share, slot, term_sym, term_prior):  # pragma: no cover - compiled
    """A window's terms: ``term_sym[0, :u]`` its distinct symbols (in order of first occurrence, oldest first) and
    ``term_prior[:u]`` each one's prior ``sum share[b]`` over its positions.
    Returns ``(u, total)``, ``total = A`` the prior mass of the positions the row has.

    ``slot`` (S,) int64 is all -1 on entry and on return.
    """
    u = 0
    total = 0.0
    last = end - 1
    for x in range(begin, end):
        b = bucket_of_recency[last - x]
        share_b = share[b]
        s = tokens[x]
        k = slot[s]
        if k < 0:
            k = u
            slot[s] = u
            term_sym[0, u] = s
            term_prior[u] = share_b
            u += 1
        else:
            term_prior[k] += share_b
        total += share_b
    for k in range(u):
        slot[term_sym[0, k]] = -1
    return u, total


@numba.njit(cache=True, nogil=True)
def query_row(query_table, q, y):  # pragma: no cover - compiled
    yy = 0.0
    for d in range(y.shape[0]):
        v = np.float64(query_table[q, d])
        y[d] = v
        yy += v * v
    return yy


@numba.njit(cache=True, nogil=True)
def missing_mass(n_have, sizes, share, scale, bucket_mass):  # pragma: no cover - compiled
    """A short row's expected rejected draws per bucket, ``scale * share_b (|b| - have_b)``, into ``bucket_mass``."""
    first = 0
    for b in range(sizes.shape[0]):
        have = min(max(n_have - first, 0), sizes[b])
        bucket_mass[b] += scale * share[b] * (sizes[b] - have)
        first += sizes[b]


@numba.njit(cache=True, nogil=True)
def flush_pending(k, hist, share, pending, bucket_mass):  # pragma: no cover - compiled
    """Add term ``k``'s pending responsibility to its buckets' masses, ``share_b h_b`` each, and clear it."""
    v = pending[k]
    if v != 0.0:
        for b in range(share.shape[0]):
            h = hist[k, b]
            if h > 0:
                bucket_mass[b] += v * (share[b] * h)
        pending[k] = 0.0


@numba.njit(cache=True, nogil=True)
def slide_terms(
    tokens, lo, hi, prev_lo, prev_hi, n_active, n_free, bucket_of_recency, starts, share, slot, bucket_mass,
    term_of, hist, count, prior, log_prior_of, inv_prior, pending, active, where, free, dirty, is_dirty,
    ev_x, ev_from, ev_to,
):  # pragma: no cover - compiled  # fmt: skip
    """Bring a window's terms from the row ``[prev_lo, prev_hi)`` to the row ``[lo, hi)``; returns the new
    ``(n_active, n_free)``.

    From one row to the next of a document, the new token enters bucket 0, the oldest token of each bucket moves
    to the next one and the window's oldest leaves: K + 1 count updates. Any other step (a new document, a skipped
    row) rebuilds the terms from the window. A changed term's pending responsibility is first added to
    ``bucket_mass`` (``share_b h_b pending``, :func:`flush_pending`); its prior ``sum_b share_b h_b(s)``, its log
    and its inverse are then recomputed from its integer counts, so they never depend on the path that led there.

    The state (made by :func:`terms_state`, slots 0..N-1, at most N distinct symbols): ``term_of`` each slot's
    symbol, ``hist`` (N, K) its counts per bucket, ``count`` in all, ``prior``/``log_prior_of``/``inv_prior``,
    ``pending`` (see :func:`flush_pending`); ``active[:n_active]`` the used slots and ``where`` each one's index
    there; ``free[:n_free]`` the free ones; ``dirty``/``is_dirty`` the slots a step changed; ``ev_*`` a step's
    changes (the token at ``ev_x`` moves from bucket ``ev_from``, -1 entering, to ``ev_to``, -1 leaving). ``slot``
    (S,) maps a symbol in the window to its slot (-1 otherwise).
    """
    n_pos = bucket_of_recency.shape[0]
    n_buckets = share.shape[0]
    n_ev = 0
    # The next row of a document: a short window grows by its new token, a full one also drops its oldest.
    # Any other pair of spans (another document, a skipped row, windows given otherwise) rebuilds.
    prev_m = prev_hi - prev_lo
    if hi == prev_hi + 1 and ((lo == prev_lo and prev_m < n_pos) or (lo == prev_lo + 1 and prev_m == n_pos)):
        for b in range(n_buckets - 1, -1, -1):
            x = prev_hi - starts[b + 1]  # the oldest token of bucket b (its recency becomes starts[b + 1])
            if x >= prev_lo:
                ev_x[n_ev] = x
                ev_from[n_ev] = b
                ev_to[n_ev] = b + 1 if b + 1 < n_buckets else -1
                n_ev += 1
        ev_x[n_ev] = prev_hi
        ev_from[n_ev] = -1
        ev_to[n_ev] = 0
        n_ev += 1
    else:
        for j in range(n_active):
            k = active[j]
            flush_pending(k, hist, share, pending, bucket_mass)
            slot[term_of[k]] = -1
            free[n_pos - 1 - j] = k
        n_active = 0
        n_free = n_pos
        for x in range(lo, hi):
            ev_x[n_ev] = x
            ev_from[n_ev] = -1
            ev_to[n_ev] = bucket_of_recency[hi - 1 - x]
            n_ev += 1
    n_dirty = 0
    for e in range(n_ev):
        s = tokens[ev_x[e]]
        k = slot[s]
        b_from = ev_from[e]
        b_to = ev_to[e]
        if k < 0:  # a symbol new to the window takes a free slot
            n_free -= 1
            k = free[n_free]
            slot[s] = k
            term_of[k] = s
            for b in range(n_buckets):
                hist[k, b] = 0
            count[k] = 0
            where[k] = n_active
            active[n_active] = k
            n_active += 1
            pending[k] = 0.0
        else:
            flush_pending(k, hist, share, pending, bucket_mass)
        if b_from >= 0:
            hist[k, b_from] -= 1
        if b_to >= 0:
            hist[k, b_to] += 1
        if b_from < 0:
            count[k] += 1
        elif b_to < 0:
            count[k] -= 1
        if count[k] == 0:  # it left the window: free its slot
            slot[s] = -1
            j = where[k]
            n_active -= 1
            last_k = active[n_active]
            active[j] = last_k
            where[last_k] = j
            free[n_free] = k
            n_free += 1
            is_dirty[k] = False
            continue
        if not is_dirty[k]:
            is_dirty[k] = True
            dirty[n_dirty] = k
            n_dirty += 1
    for j in range(n_dirty):
        k = dirty[j]
        if not is_dirty[k]:
            continue  # left the window after it changed
        is_dirty[k] = False
        mass = 0.0
        for b in range(n_buckets):
            h = hist[k, b]
            if h > 0:
                mass += share[b] * h
        prior[k] = mass
        log_prior_of[k] = math.log(mass) if mass > 0.0 else -np.inf
        inv_prior[k] = 1.0 / mass if mass > 0.0 else 0.0
    return n_active, n_free


@numba.njit(cache=True, nogil=True)
def terms_state(n_pos, n_buckets):  # pragma: no cover - compiled
    """The empty state of a window's terms for :func:`slide_terms`: ``(term_of, hist, count, prior, log_prior_of,
    inv_prior, pending, active, where, free, dirty, is_dirty, ev_x, ev_from, ev_to)`` (every slot free)."""
    return (
        np.empty(n_pos, dtype=np.int64), np.zeros((n_pos, n_buckets), dtype=np.int64), np.zeros(n_pos, dtype=np.int64),
        np.zeros(n_pos), np.zeros(n_pos), np.zeros(n_pos), np.zeros(n_pos), np.empty(n_pos, dtype=np.int64),
        np.empty(n_pos, dtype=np.int64), np.arange(n_pos - 1, -1, -1).astype(np.int64),
        np.empty(n_pos + n_buckets + 2, dtype=np.int64), np.zeros(n_pos, dtype=np.bool_),
        np.empty(n_pos + 1, dtype=np.int64), np.empty(n_pos + 1, dtype=np.int64), np.empty(n_pos + 1, dtype=np.int64),
    )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _estep_windows_numba(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, inv_two_sigma2, gate_const, bucket_of_recency, sizes, share,
    log_emission_ts, indptr, symbols, log_values, log_backoff, log_base, direct_row, direct_slots,
    key_sum, key_mass, emission_count_ts, pair_counts, bucket_mass, scalars, impossible, slot,
):  # pragma: no cover - compiled  # fmt: skip
    """The fused histogram E-step over the rows in order. Returns ``(n_impossible, n_outside)`` as the per-position
    sparse kernel does (rows the model cannot explain, the first written to ``impossible``; rows with a pair
    off the support, counted and skipped).

    The window's histograms slide from row to row (:func:`slide_terms`). ``slot`` (S,) int64 is all -1 on entry
    and on return.
    """
    n_pos = bucket_of_recency.shape[0]
    n_buckets = sizes.shape[0]
    dim = key_means.shape[1]
    sparse = indptr.shape[0] > 0
    starts = np.zeros(n_buckets + 1, dtype=np.int64)
    for b in range(n_buckets):
        starts[b + 1] = starts[b] + sizes[b]
    # The terms of the current window (see slide_terms). A term's pending responsibility over its prior, summed over
    # the rows since its counts last changed, gives its bucket masses ``share_b h_b pending`` when the counts change
    # (K + 2 terms a row) instead of every row.
    state = terms_state(n_pos, n_buckets)
    term_of, hist, count, prior, log_prior_of, inv_prior, pending, active, where, free, dirty, is_dirty = state[:12]
    ev_x, ev_from, ev_to = state[12:]
    n_active = 0
    n_free = n_pos
    prev_lo = -1
    prev_hi = -1
    # The row's terms as the shared log-weights expect them.
    terms = np.empty((1, n_pos), dtype=np.int64)
    log_prior = np.empty(n_pos)
    logw = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    pair = np.empty(n_pos, dtype=np.int64)
    pair_map = np.full(key_means.shape[0] if sparse else 0, -1, dtype=np.int64)
    y = np.empty(dim)
    n_impossible = 0
    n_outside = 0
    query_sq = 0.0
    n_obs = 0.0
    log_lik = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        t = target[row]
        n_active, n_free = slide_terms(
            tokens, lo, hi, prev_lo, prev_hi, n_active, n_free, bucket_of_recency, starts, share, slot, bucket_mass,
            term_of, hist, count, prior, log_prior_of, inv_prior, pending, active, where, free, dirty, is_dirty,
            ev_x, ev_from, ev_to,
        )  # fmt: skip
        prev_lo = lo
        prev_hi = hi
        # ------------------------------------------------ the row's log-weights, one term a distinct symbol
        m = hi - lo
        total = 0.0  # A: the prior mass of the positions the row has
        for b in range(n_buckets):
            total += share[b] * min(max(m - starts[b], 0), sizes[b])
        u = n_active
        for j in range(u):
            terms[0, j] = term_of[active[j]]
        outside = False
        # The layout's branch outside the loop: the loads then issue back to back and their misses overlap.
        if sparse:
            # A target without a direct row: a symbol -> pair map filled for the row when that costs less than
            # the binary searches (2 writes a pair of the target against ~log2(degree) steps a term).
            lo_pair = indptr[t]
            hi_pair = indptr[t + 1]
            degree = hi_pair - lo_pair
            direct = direct_row[t]
            fill = direct < 0 and u * (np.log2(degree + 1.0) + 1.0) > 2.0 * degree
            if fill:
                for q in range(lo_pair, hi_pair):
                    pair_map[symbols[q]] = q
            # The lookups written out in each case: a call per term (arrays passed by value) cost more than them.
            if direct >= 0:
                for j in range(u):
                    pair[j] = direct_slots[direct, terms[0, j]]
            elif fill:
                for j in range(u):
                    pair[j] = pair_map[terms[0, j]]
            else:
                for j in range(u):
                    pair[j] = per_position.find_pair(indptr, symbols, t, terms[0, j])
            for j in range(u):
                p = pair[j]
                if p < 0:
                    outside = True
                else:
                    logw[j] = log_values[p]
            if fill:
                for q in range(lo_pair, hi_pair):
                    pair_map[symbols[q]] = -1
        else:
            for j in range(u):
                logw[j] = log_emission_ts[t, terms[0, j]]
        if outside:
            n_outside += 1
            continue
        yy = query_row(query_table, query_index[row], y)
        log_total = math.log(total) if total > 0.0 else 0.0
        for j in range(u):
            log_prior[j] = log_prior_of[active[j]] - log_total
        best = -np.inf
        if total > 0.0:
            best = row_log_weights(terms[:, :u], 0, y, key_means, log_prior, inv_two_sigma2, logw[:u], logw[:0])
        if best == -np.inf:
            if n_impossible < impossible.shape[0]:
                impossible[n_impossible] = row
            n_impossible += 1
            continue
        z = exp_shifted(logw[:u], best, resp[:u], bits[:u])
        scale = w / z
        for j in range(u):
            r = resp[j] * scale
            k = active[j]
            s = terms[0, j]
            key_mass[s] += r
            if sparse:
                pair_counts[pair[j]] += r
            else:
                emission_count_ts[t, s] += r
            for d in range(dim):
                key_sum[s, d] += r * y[d]
            # Each position's share of the term's responsibility goes to its bucket when the counts change.
            pending[k] += r * inv_prior[k]
        if m < n_pos:
            missing_mass(m, sizes, share, w / total, bucket_mass)
        query_sq += w * yy
        n_obs += w
        log_lik += w * (best + math.log(z) + gate_const)
    for j in range(n_active):
        flush_pending(active[j], hist, share, pending, bucket_mass)
        slot[term_of[active[j]]] = -1
    scalars[0] += query_sq
    scalars[1] += n_obs
    scalars[2] += log_lik
    return n_impossible, n_outside


@numba.njit(cache=True, nogil=True)
def _initialize_windows_numba(
    tokens, begin, end, target, query_table, query_index, weights, bucket_of_recency, sizes, num_symbols,
    key_sum, key_mass, emission_count_ts, bucket_mass, scalars, slot, cells, masses,
):  # pragma: no cover - compiled  # fmt: skip
    """Uniform responsibilities, ``1/m`` on each of a row's ``m`` positions (the E-step of a flat gate, a flat
    emission and a uniform prior, whose masked positions are rejected draws like the E-step's). Dense counts go
    to ``emission_count_ts`` unless it is empty; every (target-major cell, mass) of a term is written to
    ``cells``/``masses``. Returns how many were written."""
    n_pos = bucket_of_recency.shape[0]
    dim = query_table.shape[1]
    share = np.full(sizes.shape[0], 1.0)
    term_sym = np.empty((1, n_pos), dtype=np.int64)
    term_prior = np.empty(n_pos)
    y = np.empty(dim)
    dense = emission_count_ts.shape[0] > 0
    written = 0
    query_sq = 0.0
    n_obs = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        t = target[row]
        u, m = row_terms(tokens, lo, hi, bucket_of_recency, share, slot, term_sym, term_prior)
        yy = query_row(query_table, query_index[row], y)
        scale = w / m
        for k in range(u):
            r = term_prior[k] * scale
            s = term_sym[0, k]
            key_mass[s] += r
            for d in range(dim):
                key_sum[s, d] += r * y[d]
            if dense:
                emission_count_ts[t, s] += r
            cells[written] = np.int64(t) * num_symbols + s
            masses[written] = r
            written += 1
        last = hi - 1
        for x in range(lo, hi):
            bucket_mass[bucket_of_recency[last - x]] += scale
        if hi - lo < n_pos:
            missing_mass(hi - lo, sizes, share, scale, bucket_mass)
        query_sq += w * yy
        n_obs += w
    scalars[0] += query_sq
    scalars[1] += n_obs
    return written


@numba.njit(cache=True, nogil=True)
def _score_windows_numba(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, inv_two_sigma2, gate_const, bucket_of_recency, share,
    log_emission_ts, emission, indptr, symbols, values, backoff, base, direct_row, direct_slots,
    ranked_indptr, ranked_targets, ranked_values, base_order, slot,
):  # pragma: no cover - compiled  # fmt: skip
    """``(log_lik, target_log_prob, correct, weight)`` sums, as
    :func:`~dist_respattn.model.heads.single_hop.scoring.score_rows` gives them, with a row's terms as its positions.
    Dense: ``emission`` (S, T) probabilities; sparse: the emission's values, backoff, base and ranked rows
    (``emission`` empty)."""
    n_pos = bucket_of_recency.shape[0]
    sparse = indptr.shape[0] > 0
    term_sym = np.empty((1, n_pos), dtype=np.int64)
    term_prior = np.empty(n_pos)
    log_prior = np.empty(n_pos)
    gate = np.empty(n_pos)
    joint = np.empty(n_pos)
    attention = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    top_target = np.empty(1, dtype=np.int64)
    top_value = np.empty(1)
    scores, seen, touched = top_k_scratch(base.shape[0])
    probs = np.empty(emission.shape[1])
    y = np.empty(key_means.shape[1])
    total_ll = 0.0
    total_lp = 0.0
    total_correct = 0.0
    total_w = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        t = target[row]
        u, total = row_terms(tokens, begin[row], end[row], bucket_of_recency, share, slot, term_sym, term_prior)
        query_row(query_table, query_index[row], y)
        for k in range(u):
            log_prior[k] = math.log(term_prior[k] / total) if term_prior[k] > 0.0 else -np.inf
            s = term_sym[0, k]
            if sparse:
                direct = direct_row[t]
                p = direct_slots[direct, s] if direct >= 0 else per_position.find_pair(indptr, symbols, t, s)
                b = values[p] if p >= 0 else backoff[s] * base[t]
                joint[k] = math.log(b) if b > 0.0 else -np.inf
            else:
                joint[k] = log_emission_ts[t, s]
        terms = term_sym[:, :u]
        best = row_log_weights(terms, 0, y, key_means, log_prior, inv_two_sigma2, joint[:u], gate[:u])
        row_ll = -np.inf
        if best > -np.inf:
            row_ll = best + math.log(exp_shifted(joint[:u], best, attention[:u], bits[:u])) + gate_const
        attention_of(gate[:u], attention[:u], bits[:u])
        if sparse:
            prob_t = mixture_at(terms, 0, attention, t, indptr, symbols, values, backoff, base)
            top_k_threshold(
                terms, 0, attention, indptr, symbols, values, backoff, base, ranked_indptr, ranked_targets,
                ranked_values, base_order, top_target, top_value, scores, seen, touched,
            )  # fmt: skip
            arg = top_target[0]
        else:
            arg = dense_mixture(terms, 0, u, attention, emission, probs)
            prob_t = probs[t]
        total_ll += w * row_ll
        total_lp += w * (math.log(prob_t) if prob_t > 0.0 else -np.inf)
        if arg == t:
            total_correct += w
        total_w += w
    return total_ll, total_lp, total_correct, total_w


# --------------------------------------------------------------------------------------------
# Entry points.

_IMPOSSIBLE_SHOWN = 10


def window_block_ranges(rows: WindowRows, context_length: int) -> list[tuple[int, int]]:
    """Row blocks of at most ``WINDOW_BLOCK_POSITIONS`` window positions (at least one row each)."""
    step = max(1, WINDOW_BLOCK_POSITIONS // max(int(context_length), 1))
    return list(per_position.block_ranges(rows.num_rows, step))


def _slot(num_symbols: int) -> np.ndarray:
    return np.full(num_symbols, -1, dtype=np.int64)


def accumulate_windows(
    rows: WindowRows, params: HistogramParameters, stats: per_position.StatisticArrays, buckets: PositionBuckets
) -> None:
    """The histogram E-step over ``rows`` (already checked), added into ``stats`` (position counts: each bucket's
    mass split evenly over its positions). Rows the model cannot explain raise ``ImpossibleEvidenceError`` after
    the others were added (discard ``stats``); a pair off a sparse support raises a ValueError."""
    sparse = params.sparse
    if sparse and stats.pair_counts is None:
        raise ValueError("the statistics are dense but the emission is sparse: make them over its support")
    bucket_mass = np.zeros(buckets.num_buckets)
    found = np.empty(min(rows.num_rows, 64), dtype=np.int64)
    n_impossible, n_outside = _estep_windows_numba(  # type: ignore[call-arg]
        *rows.kernel_arrays(),
        params.key_means, params.inv_two_sigma2, params.gate_const, params.bucket_of_recency, params.sizes,
        params.share, *params.emission_arrays(),
        stats.key_sum, stats.key_mass, stats.emission_count_ts, stats.pair_counts if sparse else _NO_VALUES,
        bucket_mass, stats.scalars, found, _slot(params.num_symbols),
    )  # fmt: skip
    stats.position_count += buckets.spread(bucket_mass)
    if n_outside:
        raise ValueError(
            f"{n_outside} row(s) hold a (symbol, target) pair outside the sparse emission's support: the support "
            "must come from these rows (a fit finds it in its start pass); refit, or use --emission-layout dense"
        )
    if n_impossible:
        shown = ", ".join(str(int(r)) for r in found[: min(n_impossible, _IMPOSSIBLE_SHOWN)])
        more = f" and {n_impossible - min(n_impossible, _IMPOSSIBLE_SHOWN)} more" if n_impossible > 10 else ""
        raise ImpossibleEvidenceError(
            f"impossible evidence: rows {shown}{more} have zero probability under the model (every position of "
            "the window has a zero prior or a zero emission probability for the row's target); use "
            "emission_smoothing > 0 or drop these rows"
        )


def initialize_windows(
    rows: WindowRows, buckets: PositionBuckets, stats: per_position.StatisticArrays, num_symbols: int
) -> tuple[np.ndarray, np.ndarray]:
    """Uniform first responsibilities over each row's positions, added into ``stats``; returns the rows'
    ``(target-major cells (P,), masses (P,))``, one entry per row and distinct symbol (for a sparse fit's pairs)."""
    bucket_mass = np.zeros(buckets.num_buckets)
    capacity = int(np.sum(rows.end - rows.begin))
    cells = np.empty(capacity, dtype=np.int64)
    masses = np.empty(capacity)
    written = _initialize_windows_numba(
        *rows.kernel_arrays(),
        buckets.bucket_of_recency, np.asarray(buckets.sizes, dtype=np.int64), int(num_symbols),
        stats.key_sum, stats.key_mass, stats.emission_count_ts, bucket_mass, stats.scalars, _slot(num_symbols),
        cells, masses,
    )  # fmt: skip
    stats.position_count += buckets.spread(bucket_mass)
    return cells[:written], masses[:written]


def score_windows(model: Any, rows: WindowRows) -> ScoreTotals:
    """Held-out totals of ``rows`` under a head with a tied prior (``model.buckets``), as ``score_rows`` gives them."""
    params = histogram_parameters(model)
    rows.check(model.num_symbols, model.num_targets, model.context_length, model.query_dim)
    table = model.emission_table
    if isinstance(table, SparseEmission):
        dense, values, backoff, base = _NO_TABLE, table.values, table.backoff, table.base
        ranked = table.ranked_rows
        order = np.argsort(-table.base, kind="stable")
    else:
        dense, values, backoff, base = table.to_dense(), _NO_VALUES, _NO_VALUES, _NO_VALUES
        ranked = (_NO_INDEX, _NO_TARGETS, _NO_VALUES)
        order = _NO_INDEX
    log_lik, target_log_prob, correct, weight = _score_windows_numba(
        *rows.kernel_arrays(),
        params.key_means, params.inv_two_sigma2, params.gate_const, params.bucket_of_recency, params.share,
        params.log_emission_ts, dense, params.indptr, params.symbols, values, backoff, base, params.direct_row,
        params.direct_slots, *ranked, order, _slot(params.num_symbols),
    )  # fmt: skip
    return ScoreTotals(float(weight), float(log_lik), float(target_log_prob), float(correct))


def histogram_parameters(model: Any) -> HistogramParameters:
    """A head's :class:`HistogramParameters` (built once per head and kept on it, like its kernel parameters)."""
    if model.buckets is None:
        raise ValueError("the head's position prior is not tied over buckets: it has no histogram kernel")
    cached = model.__dict__.get("_histogram_parameters")
    if cached is None:
        cached = HistogramParameters.build(model.kernel_parameters, model.buckets)
        model.__dict__["_histogram_parameters"] = cached
    return cached


@numba.njit(cache=True, nogil=True)
def _grid_windows_numba(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, bucket_of_recency, share, emission_count_ts, indptr, symbols, pair_counts, row_totals, base, types,
    inv_two_sigma2, gate_const, emission_strengths, type_strengths, direct_row, direct_slots, slot, out_pred, out_joint,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`~dist_respattn.model.fitting.selection._grid_numba` with a row's terms as its positions; returns the
    weight."""
    n_pos = bucket_of_recency.shape[0]
    n_emis = emission_strengths.shape[0] * type_strengths.shape[0]
    term_sym = np.empty((1, n_pos), dtype=np.int64)
    term_prior = np.empty(n_pos)
    log_prior = np.empty(n_pos)
    dist = np.empty(n_pos)
    count = np.empty(n_pos)
    total = np.empty(n_pos)
    typ = np.empty(n_pos)
    emis = np.empty((n_emis, n_pos))
    gate = np.empty(n_pos)
    y = np.empty(key_means.shape[1])
    weight = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        query_row(query_table, query_index[row], y)
        t = target[row]
        u_t = base[t]
        u, mass = row_terms(tokens, begin[row], end[row], bucket_of_recency, share, slot, term_sym, term_prior)
        for k in range(u):
            c = term_sym[0, k]
            log_prior[k] = math.log(term_prior[k] / mass) if term_prior[k] > 0.0 else -np.inf
            dist[k] = squared_distance(y, key_means, c)
            count[k] = grid_count(t, c, emission_count_ts, indptr, symbols, pair_counts, direct_row, direct_slots)
            total[k] = row_totals[c]
            typ[k] = types[c]
        grid_row(
            w, u, log_prior, dist, count, total, typ, u_t, inv_two_sigma2, gate_const, emission_strengths,
            type_strengths, emis, gate, out_pred, out_joint,
        )  # fmt: skip
        weight += w
    return weight


def grid_windows(table: Any, rows: WindowRows) -> Any:
    """Held-out totals of ``rows`` at every point of a grid table whose prior is tied (``table.buckets``), as
    :func:`~dist_respattn.model.fitting.selection.score_grid` gives them."""
    from dist_respattn.model.emission.layouts import DenseEmissionCounts, SparseEmissionCounts
    from dist_respattn.model.fitting.selection import GridTotals

    buckets: PositionBuckets = table.buckets
    counts = table.counts
    rows.check(counts.num_symbols, counts.num_targets, buckets.context_length, table.key_means.shape[1])
    if isinstance(counts, SparseEmissionCounts):
        support = counts.support
        assert support is not None, "a grid table's sparse counts carry their support"
        dense_ts, indptr, symbols, pair_counts = _NO_TABLE, support.indptr, support.symbols, counts.counts
    else:
        assert isinstance(counts, DenseEmissionCounts)
        dense_ts, indptr, symbols, pair_counts = counts.count_ts, _NO_INDEX, _NO_SYMBOLS, _NO_VALUES
    weights = buckets.bucket_weights(np.exp(table.log_prior))
    g1, g2, g3 = table.shape
    pred = np.zeros((g1, g2 * g3))
    joint = np.zeros((g1, g2 * g3))
    dim = table.key_means.shape[1]
    weight = _grid_windows_numba(  # type: ignore[call-arg]
        *rows.kernel_arrays(),
        table.key_means, buckets.bucket_of_recency, weights / np.asarray(buckets.sizes), dense_ts, indptr, symbols,
        pair_counts, table.row_totals, table.base, table.types, 0.5 / table.sigma2,
        -0.5 * dim * np.log(2.0 * np.pi * table.sigma2), table.emission_strengths, table.type_strengths,
        *table.direct_pair_rows, _slot(counts.num_symbols), pred, joint,
    )  # fmt: skip
    return GridTotals(float(weight), pred.reshape(g1, g2, g3), joint.reshape(g1, g2, g3))
