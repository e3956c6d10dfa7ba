"""The copy head's compiled passes over token windows: the E-step with its three-way split, and held-out scoring.

Per position, over each row's window: O(N) a row (a tied prior's E-step runs over the window's histograms instead,
:mod:`dist_respattn.model.heads.copy.histogram`). Windows are :class:`~dist_respattn.model.rows.WindowRows` spans,
oldest first: position ``x`` of a window ``tokens[lo:hi]`` has recency ``hi - 1 - x`` and context column
``N - hi + x``; its successor in the document is ``tokens[x + 1]`` when ``x + 1 < hi`` (the most recent position has
none in the window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.kernels.log_weights import NO_ROWS, exp_shifted, keep_row, squared_distance
from dist_respattn.model.kernels.per_position import SparseKernelParameters, find_pair
from dist_respattn.model.kernels.prefetch import prefetch_item
from dist_respattn.model.rows import WindowRows

__all__ = [
    "CopyArrays",
    "CopyParameters",
    "copy_estep",
    "copy_hits",
    "copy_hits_dense",
    "copy_row_terms",
    "copy_score",
    "log_emission",
    "raise_row_problems",
]

_NO_VALUES = np.zeros(0)
_NO_INDEX = np.zeros(0, dtype=np.int64)
_NO_SYMBOLS = np.zeros(0, dtype=np.int32)
_NO_TABLE = np.zeros((0, 0))
_PREFETCH_ROWS = 8  # how many rows ahead the E-step prefetches a dense emission's cells


@dataclass(frozen=True)
class CopyParameters:
    """A copy head's parameters as the kernels read them.

    Attributes:
        key_means: (S, D) float64; ``inv_two_sigma2``: ``1 / (2 sigma2)``; ``gate_const``: ``-D/2 log(2 pi sigma2)``.
        prior: (N,) the position prior in column order (``prior[N - 1]`` the most recent); ``log_prior`` its log.
        bucket_of_recency: (N,) int64, the bucket of each recency.
        kappa, rho: (K,) the copy and induction weights of each bucket; ``log_own``: (K,) ``log(1 - kappa - rho)``.
        log_emission_ts: (T, S) ``log B`` target-major for a dense emission, else (0, 0); a sparse one's
            ``indptr`` (T + 1,), ``symbols`` (P,), ``log_values`` (P,), ``log_backoff`` (S,), ``log_base`` (T,).
    """

    key_means: np.ndarray
    inv_two_sigma2: float
    gate_const: float
    prior: np.ndarray
    log_prior: np.ndarray
    bucket_of_recency: np.ndarray
    kappa: np.ndarray
    rho: np.ndarray
    log_own: np.ndarray
    log_emission_ts: np.ndarray
    indptr: np.ndarray
    symbols: np.ndarray
    log_values: np.ndarray
    log_backoff: np.ndarray
    log_base: np.ndarray

    @classmethod
    def build(cls, single: Any, bucket_of_recency: np.ndarray, kappa: np.ndarray, rho: np.ndarray) -> CopyParameters:
        """From a single-hop head (its keys, prior, gate variance and emission) and the copy weights."""
        params = single.kernel_parameters
        table = single.emission_table
        if isinstance(table, SparseEmission):
            # The single head's own log tables (the same logarithms): one copy of them in a process, not two.
            assert isinstance(params, SparseKernelParameters)
            sparse = (table.support.indptr, table.support.symbols, params.log_values, params.log_backoff,
                      params.log_base)  # fmt: skip
            dense = _NO_TABLE
        else:
            sparse = (_NO_INDEX, _NO_SYMBOLS, _NO_VALUES, _NO_VALUES, _NO_VALUES)
            dense = params.log_emission_ts
        kappa, rho = np.asarray(kappa, dtype=np.float64), np.asarray(rho, dtype=np.float64)
        own = 1.0 - kappa - rho
        with np.errstate(divide="ignore"):
            log_own = np.where(own > 0.0, np.log(np.maximum(own, 0.0)), -np.inf)
        return cls(
            params.key_means, float(params.inv_two_sigma2), float(params.gate_const),
            np.asarray(single.position_prior, dtype=np.float64), np.asarray(params.log_prior, dtype=np.float64),
            np.asarray(bucket_of_recency, dtype=np.int64), kappa, rho, log_own, dense, *sparse,
        )  # fmt: skip

    def arrays(self) -> tuple[Any, ...]:
        """The fields in the kernels' argument order."""
        return (
            self.key_means, self.inv_two_sigma2, self.gate_const, self.prior, self.log_prior, self.bucket_of_recency,
            self.kappa, self.rho, self.log_own, self.log_emission_ts, self.indptr, self.symbols, self.log_values,
            self.log_backoff, self.log_base,
        )  # fmt: skip


@dataclass
class CopyArrays:
    """The copy E-step's additive arrays beside the single head's (see :class:`CopyStatistics`).

    Attributes:
        recency_mass: (N,) responsibility per recency (with a short window's rejected draws, as the histogram
            kernel counts them).
        copy_mass, induction_mass: (K,) the responsibility each bucket's positions gave to the copy and to the
            induction terms; ``bucket_mass``: (K,) the responsibility of each bucket's positions.
    """

    recency_mass: np.ndarray
    copy_mass: np.ndarray
    induction_mass: np.ndarray
    bucket_mass: np.ndarray

    @classmethod
    def zeros(cls, context_length: int, num_buckets: int) -> CopyArrays:
        return cls(np.zeros(context_length), np.zeros(num_buckets), np.zeros(num_buckets), np.zeros(num_buckets))


@numba.njit(cache=True, nogil=True)
def log_emission(t, c, log_emission_ts, indptr, symbols, log_values, log_backoff, log_base):  # pragma: no cover
    """``(log B[c, t], pair index or -1)`` in either layout (a dense one has no pair index: -1)."""
    if indptr.shape[0] == 0:
        return log_emission_ts[t, c], -1
    p = find_pair(indptr, symbols, t, c)
    if p >= 0:
        return log_values[p], p
    return log_backoff[c] + log_base[t], -1


@numba.njit(cache=True, nogil=True)
def _row_terms(
    tokens, lo, hi, t, y, key_means, inv_two_sigma2, prior, log_prior, bucket_of_recency, kappa, rho, log_own,
    log_emission_ts, indptr, symbols, log_values, log_backoff, log_base, logw, gate, own, cop, ind, pair,
):  # pragma: no cover - compiled  # fmt: skip
    """One window's terms, position ``j`` of ``tokens[lo:hi]`` oldest first: ``logw[j]`` the joint log-weight
    ``log pi_j - log A + log E_j(t) - d_j / (2 sigma2)``, ``gate[j]`` the same without ``log E_j(t)``, and the
    shares of ``E_j(t)`` of its own table, copy and induction terms (``own``, ``cop``, ``ind``), ``pair[j]`` a
    sparse emission's pair (-1 off the support or dense). Returns ``(max logw, A)``."""
    n_pos = prior.shape[0]
    dense = indptr.shape[0] == 0
    m = hi - lo
    total = 0.0
    for r in range(m):
        total += prior[n_pos - 1 - r]
    # A full window renormalizes nothing (so kappa = rho = 0 gives the single head's weights exactly).
    log_total = 0.0 if m == n_pos else (math.log(total) if total > 0.0 else 0.0)
    best = -np.inf
    for j in range(m):
        x = lo + j
        r = hi - 1 - x
        col = n_pos - 1 - r
        c = tokens[x]
        b = bucket_of_recency[r]
        # The dense lookup written out here: a call passing the sparse layout's arrays cost more than it.
        if dense:
            log_b = log_emission_ts[t, c]
            pair[j] = -1
        else:
            log_b, pair[j] = log_emission(t, c, log_emission_ts, indptr, symbols, log_values, log_backoff, log_base)
        k = kappa[b]
        h = rho[b]
        w_own = 1.0 - k - h
        is_copy = c == t
        is_ind = x + 1 < hi and tokens[x + 1] == t
        if not is_copy and not is_ind:
            log_e = log_own[b] + log_b
            own[j] = 1.0
            cop[j] = 0.0
            ind[j] = 0.0
        else:
            e_own = w_own * math.exp(log_b) if w_own > 0.0 else 0.0
            e_cop = k if is_copy else 0.0
            e_ind = h if is_ind else 0.0
            e = e_own + e_cop + e_ind
            if e > 0.0:
                log_e = math.log(e)
                own[j] = e_own / e
                cop[j] = e_cop / e
                ind[j] = e_ind / e
            else:
                log_e = -np.inf
                own[j] = 0.0
                cop[j] = 0.0
                ind[j] = 0.0
        distance = squared_distance(y, key_means, c) * inv_two_sigma2
        g = (log_prior[col] - log_total) - distance
        gate[j] = g
        lj = (log_prior[col] - log_total) + log_e - distance
        logw[j] = lj
        best = max(best, lj)
    return best, total


@numba.njit(cache=True, nogil=True)
def _row_scratch(n_pos, dim):  # pragma: no cover - compiled
    """One row's scratch, reused row after row: per position the log weight, the gate, the responsibility, the
    exponent bits, the own/copy/induction shares and the sparse pair index (all (N,)); and the query (D,)."""
    return (
        np.empty(n_pos), np.empty(n_pos), np.empty(n_pos), np.empty(n_pos, dtype=np.int64), np.empty(n_pos),
        np.empty(n_pos), np.empty(n_pos), np.empty(n_pos, dtype=np.int64), np.empty(dim),
    )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _estep(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, inv_two_sigma2, gate_const, prior, log_prior, bucket_of_recency, kappa, rho, log_own,
    log_emission_ts, indptr, symbols, log_values, log_backoff, log_base,
    key_sum, key_mass, emission_count_ts, pair_counts, recency_mass, copy_mass, induction_mass, bucket_mass,
    scalars, impossible,
):  # pragma: no cover - compiled  # fmt: skip
    """The fused E-step over the rows in order. Returns ``(n_impossible, n_outside)``: rows no position explains
    (the first written to ``impossible``) and rows whose own-table share falls on a pair off a sparse support."""
    n_pos = prior.shape[0]
    dim = key_means.shape[1]
    sparse = indptr.shape[0] > 0
    logw, gate, resp, bits, own, cop, ind, pair, y = _row_scratch(n_pos, dim)
    n_impossible = 0
    n_outside = 0
    query_sq = 0.0
    n_obs = 0.0
    log_lik = 0.0
    n_rows = target.shape[0]
    for row in range(n_rows):
        ahead = row + _PREFETCH_ROWS
        if not sparse and ahead < n_rows:
            # The emission cells a later row reads and updates, scattered over (T, S) tables larger than cache:
            # their misses then overlap with this row's work (as in the single head's per-position kernel).
            t_ahead = target[ahead]
            for x in range(begin[ahead], end[ahead]):
                prefetch_item(log_emission_ts, t_ahead, tokens[x])
                prefetch_item(emission_count_ts, t_ahead, tokens[x])
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        t = target[row]
        q = query_index[row]
        yy = 0.0
        for d in range(dim):
            v = np.float64(query_table[q, d])
            y[d] = v
            yy += v * v
        m = hi - lo
        best, total = _row_terms(
            tokens, lo, hi, t, y, key_means, inv_two_sigma2, prior, log_prior, bucket_of_recency, kappa, rho, log_own,
            log_emission_ts, indptr, symbols, log_values, log_backoff, log_base, logw, gate, own, cop, ind, pair,
        )  # fmt: skip
        if best == -np.inf:
            if n_impossible < impossible.shape[0]:
                impossible[n_impossible] = row
            n_impossible += 1
            continue
        if sparse:
            outside = False
            for j in range(m):
                if pair[j] < 0 and own[j] > 0.0 and logw[j] > -np.inf:
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
            b = bucket_of_recency[r]
            key_mass[c] += rj
            for d in range(dim):
                key_sum[c, d] += rj * y[d]
            share = rj * own[j]
            if share != 0.0:
                if sparse:
                    pair_counts[pair[j]] += share
                else:
                    emission_count_ts[t, c] += share
            copy_mass[b] += rj * cop[j]
            induction_mass[b] += rj * ind[j]
            bucket_mass[b] += rj
            recency_mass[r] += rj
        if m < n_pos:
            # The masked positions are draws the row rejected (see dist_respattn.model.buckets).
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
    key_means, inv_two_sigma2, gate_const, prior, log_prior, bucket_of_recency, kappa, rho, log_own,
    log_emission_ts, indptr, symbols, log_values, log_backoff, log_base, attention, per_row,
):  # pragma: no cover - compiled  # fmt: skip
    """Weighted ``(log_lik, target_log_prob, weight)`` of the rows; ``attention`` (n, N) receives each row's
    predictive attention in column order (zero on masked columns), ``per_row`` (n, 2) each row's
    ``(log p(query | window), log p(target | window, query))`` unweighted (:func:`keep_row`; (0, 2): none)."""
    n_pos = prior.shape[0]
    dim = key_means.shape[1]
    logw, gate, resp, bits, own, cop, ind, pair, y = _row_scratch(n_pos, dim)
    log_lik = 0.0
    target_log_prob = 0.0
    weight = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        q = query_index[row]
        for d in range(dim):
            y[d] = np.float64(query_table[q, d])
        best, _ = _row_terms(
            tokens, lo, hi, target[row], y, key_means, inv_two_sigma2, prior, log_prior, bucket_of_recency, kappa,
            rho, log_own, log_emission_ts, indptr, symbols, log_values, log_backoff, log_base, logw, gate, own, cop,
            ind, pair,
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


def copy_estep(rows: WindowRows, params: CopyParameters, stats: Any, extra: CopyArrays) -> None:
    """The copy E-step over ``rows`` (checked), added into the single head's ``stats``
    (:class:`~dist_respattn.model.kernels.per_position.StatisticArrays`, without their position counts, which
    follow from ``extra.recency_mass``) and ``extra``. Rows the model cannot explain raise
    ``ImpossibleEvidenceError`` after the others were added; a pair off a sparse support raises a ValueError."""
    sparse = params.indptr.shape[0] > 0
    found = np.empty(min(rows.num_rows, 64), dtype=np.int64)
    n_impossible, n_outside = _estep(  # type: ignore[call-arg]
        *rows.kernel_arrays(),
        *params.arrays(),
        stats.key_sum, stats.key_mass, stats.emission_count_ts, stats.pair_counts if sparse else _NO_VALUES,
        extra.recency_mass, extra.copy_mass, extra.induction_mass, extra.bucket_mass, stats.scalars, found,
    )  # fmt: skip
    raise_row_problems(n_outside, n_impossible, found)


def raise_row_problems(n_outside: int, n_impossible: int, found: np.ndarray) -> None:
    """After a copy E-step has added the rows it could: a ValueError for rows with a pair off a sparse support, or
    ``ImpossibleEvidenceError`` naming (up to 10 of) the rows ``found`` no position explains."""
    if n_outside:
        raise ValueError(
            f"{n_outside} row(s) hold a (symbol, target) pair outside the sparse emission's support: the support "
            "must come from these rows (a fit finds it in its start pass); refit, or use --emission-layout dense"
        )
    if n_impossible:
        shown = ", ".join(str(int(r)) for r in found[: min(n_impossible, 10)])
        raise ImpossibleEvidenceError(
            f"impossible evidence: rows {shown} have zero probability under the copy head (every position of the "
            "window has a zero prior or a zero probability for the row's target)"
        )


def copy_score(
    rows: WindowRows, params: CopyParameters, per_row: np.ndarray = NO_ROWS
) -> tuple[float, float, float, np.ndarray]:
    """``(log_lik, target_log_prob, weight, attention (n, N))`` of ``rows`` (checked) under the copy head; with
    ``per_row`` (n, 2) also each row's ``(log p(query | window), log p(target | window, query))`` into it."""
    attention = np.empty((rows.num_rows, params.prior.shape[0]))
    log_lik, target_log_prob, weight = _score(  # type: ignore[call-arg]
        *rows.kernel_arrays(),
        *params.arrays(), attention, per_row,
    )  # fmt: skip
    return float(log_lik), float(target_log_prob), float(weight), attention


def copy_row_terms(rows: WindowRows, context_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(context (n, N) int64, successor (n, N) int64)`` of window rows in column order: the window's tokens
    right-aligned (0 on masked columns) and each position's successor in the window (-1 where there is none:
    the most recent position and the masked ones). What the NumPy predictions read."""
    n = rows.num_rows
    context = np.zeros((n, context_length), dtype=np.int64)
    successor = np.full((n, context_length), -1, dtype=np.int64)
    for r in range(n):
        lo, hi = int(rows.begin[r]), int(rows.end[r])
        m = hi - lo
        window = np.asarray(rows.tokens[lo:hi], dtype=np.int64)
        context[r, context_length - m :] = window
        successor[r, context_length - m : context_length - 1] = window[1:]
    return context, successor


@numba.njit(cache=True, nogil=True)
def _hits_dense(
    tokens, begin, end, target, weights, attention, bucket_of_recency, own, kappa, rho, probs, scratch
):  # pragma: no cover - compiled  # fmt: skip
    """``sum w`` over the rows whose target is the arg-max (first on ties) of ``p(. | row)``, each row's (T,)
    distribution built in ``scratch`` in the order :meth:`CopyHead.window_proba` sums it (the own table's parts
    column by column, then the copies, then the inductions)."""
    n_pos = attention.shape[1]
    n_targets = scratch.shape[0]
    hits = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        for t in range(n_targets):
            scratch[t] = 0.0
        for j in range(m):
            b = bucket_of_recency[m - 1 - j]
            a = attention[row, n_pos - m + j] * own[b]
            c = tokens[lo + j]
            for t in range(n_targets):
                scratch[t] += a * probs[c, t]
        for j in range(m):
            scratch[tokens[lo + j]] += attention[row, n_pos - m + j] * kappa[bucket_of_recency[m - 1 - j]]
        for j in range(m - 1):
            scratch[tokens[lo + j + 1]] += attention[row, n_pos - m + j] * rho[bucket_of_recency[m - 1 - j]]
        best = 0
        for t in range(1, n_targets):
            if scratch[t] > scratch[best]:
                best = t
        if best == target[row]:
            hits += w
    return hits


def copy_hits_dense(rows: WindowRows, attention: np.ndarray, params: CopyParameters, probs: np.ndarray) -> float:
    """The weighted arg-max hits of ``rows`` (their predictive ``attention`` (n, N) from :func:`copy_score`) under a
    dense emission ``probs`` (S, T): O(N T) a row, compiled, with O(T) scratch."""
    own = 1.0 - params.kappa - params.rho
    window = rows.kernel_arrays()
    hits = _hits_dense(
        window.tokens, window.begin, window.end, window.target, window.weight, attention, params.bucket_of_recency, own,
        params.kappa, params.rho, probs, np.empty(probs.shape[1]),
    )  # fmt: skip
    return float(hits)


@numba.njit(cache=True, nogil=True)
def _hits_sparse(
    tokens, begin, end, target, weights, attention, bucket_of_recency, own, kappa, rho, backoff, base, indptr,
    targets, excess, scratch,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`_hits_dense` under a sparse emission: each row's backoff part ``(sum_i a_i backoff[c_i]) base``, then
    each position's stored pairs (``excess`` over the backoff), the copies and the inductions, in the order
    ``SparseEmission.predictive`` and :meth:`CopyHead.window_proba` sum them."""
    n_pos = attention.shape[1]
    n_targets = scratch.shape[0]
    hits = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        scale = 0.0
        for j in range(m):
            scale += attention[row, n_pos - m + j] * own[bucket_of_recency[m - 1 - j]] * backoff[tokens[lo + j]]
        for t in range(n_targets):
            scratch[t] = scale * base[t]
        for j in range(m):
            a = attention[row, n_pos - m + j] * own[bucket_of_recency[m - 1 - j]]
            c = tokens[lo + j]
            for p in range(indptr[c], indptr[c + 1]):
                scratch[targets[p]] += a * excess[p]
        for j in range(m):
            scratch[tokens[lo + j]] += attention[row, n_pos - m + j] * kappa[bucket_of_recency[m - 1 - j]]
        for j in range(m - 1):
            scratch[tokens[lo + j + 1]] += attention[row, n_pos - m + j] * rho[bucket_of_recency[m - 1 - j]]
        best = 0
        for t in range(1, n_targets):
            if scratch[t] > scratch[best]:
                best = t
        if best == target[row]:
            hits += w
    return hits


def copy_hits(rows: WindowRows, attention: np.ndarray, params: CopyParameters, emission: Any) -> float:
    """The weighted arg-max hits (first on ties) of ``rows`` (their predictive ``attention`` (n, N) from
    :func:`copy_score`) under ``emission`` of either layout: compiled, O(T) scratch and O(N T) (dense) or
    O(T + the window symbols' stored pairs) (sparse) a row."""
    if not isinstance(emission, SparseEmission):
        return copy_hits_dense(rows, attention, params, emission.to_dense())
    own = 1.0 - params.kappa - params.rho
    indptr, targets, excess = emission.symbol_rows
    window = rows.kernel_arrays()
    hits = _hits_sparse(
        window.tokens, window.begin, window.end, window.target, window.weight, attention, params.bucket_of_recency, own,
        params.kappa, params.rho, emission.backoff, emission.base, indptr, targets, excess,
        np.empty(emission.num_targets),
    )  # fmt: skip
    return float(hits)
