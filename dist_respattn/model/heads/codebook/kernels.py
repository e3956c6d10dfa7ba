"""The codebook head's compiled passes over token windows: the E-step, held-out scoring and predictions.

A row's window ``tokens[lo:hi]`` (oldest first) splits into its near part, the last ``m0 = min(hi - lo, N0)``
tokens (recency ``r = 0..m0-1``, token ``tokens[hi - 1 - r]``), and its far part ``tokens[lo:hi - N0]`` (when the
window is longer than N0), which the head reads only through the counts ``hist[b, w]`` of its tokens' codewords.
Consecutive rows of a token stream slide by one token, so the counts are updated, not rebuilt: B updates a token
entering or leaving the far part. A row then costs O(N0 D + B W D) whatever N.

The E-step takes the far field in the linear domain, over flat cells ``k = b W + w``: a row's far term is
``pi_far / (n_far A) exp(-shift) sum_k n_k g_k omega_b E_b[w, t]``, where ``g_k = exp(-(||y - nu_k||^2 - min) /
(2 sigma2))`` are the query's gates, made once per row of the query table (``shift = min / (2 sigma2)``), and
``omega_b E_b[w, t]`` one row of a target-major table: three contiguous rows multiplied, no logarithm or exponential
per cell, one exponential per row for the far field's share. A row whose far sum falls below :data:`FAR_TINY`
(every cell in use far beyond the query's nearest codeword) takes its cells in the log domain instead. The
responsibilities are the same numbers as the log domain's, to rounding.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from dist_respattn.model.kernels.lanes import LANES, add_four_products
from dist_respattn.model.kernels.log_weights import (
    EXP_MIN,
    LN2_HI,
    LN2_LO,
    LOG2E,
    exp_nonpositive_range,
    exp_reduced,
)
from dist_respattn.model.kernels.pair_keys import merge_tallies
from dist_respattn.model.kernels.per_position import prefetch_row
from dist_respattn.model.kernels.prefetch import prefetch_element, prefetch_item

__all__ = [
    "CodebookArrays",
    "CodebookParameters",
    "EstepTables",
    "NearCounts",
    "codebook_estep",
    "codebook_proba",
    "codebook_score",
    "far_histogram",
    "far_masses",
    "near_table",
    "state_proba",
    "take_near_counts",
]


@dataclass(frozen=True)
class CodebookParameters:
    """A codebook head's parameters as the kernels read them.

    Attributes:
        key_means: (S, D) float64; ``inv_two_sigma2``: ``1 / (2 sigma2)``; ``gate_const``: ``-D/2 log(2 pi sigma2)``.
        prior: (N0 + 1,) the prior of each near recency, then of the far field; ``log_prior`` its log.
        log_omega: (B,) log of the codebooks' weights.
        codes: (S, B) int64, each symbol's codeword in each codebook.
        code_means: (B, W, D) the codewords' key means.
        log_emission_ts: (T, S) ``log B`` target-major; ``log_code_ts``: (T, B, W) ``log E_b[w, t]`` target-major.
        emission: (S, T) ``B``; ``code_emission``: (B, W, T) ``E`` (the predictions' mixtures read rows of them).
    """

    key_means: np.ndarray
    inv_two_sigma2: float
    gate_const: float
    prior: np.ndarray
    log_prior: np.ndarray
    log_omega: np.ndarray
    codes: np.ndarray
    code_means: np.ndarray
    log_emission_ts: np.ndarray
    log_code_ts: np.ndarray
    emission: np.ndarray
    code_emission: np.ndarray

    @classmethod
    def build(cls, head: Any, logs: dict[int, np.ndarray] | None = None) -> CodebookParameters:
        """From a :class:`~dist_respattn.model.heads.codebook.head.CodebookHead`. ``logs``: the target-major logs of
        tables already made, by the table's ``id`` (heads that share a table share its log)."""
        d = head.query_dim
        logs = {} if logs is None else logs
        with np.errstate(divide="ignore"):
            log_prior = np.log(head.prior)
            log_omega = np.log(head.omega)
            if id(head.emission) not in logs:
                logs[id(head.emission)] = np.ascontiguousarray(np.log(head.emission).T)
            if id(head.code_emission) not in logs:
                logs[id(head.code_emission)] = np.ascontiguousarray(np.log(head.code_emission).transpose(2, 0, 1))
            log_emission_ts, log_code_ts = logs[id(head.emission)], logs[id(head.code_emission)]
        return cls(
            np.ascontiguousarray(head.key_means), 1.0 / (2.0 * head.sigma2),
            -0.5 * d * math.log(2.0 * math.pi * head.sigma2), head.prior, log_prior, log_omega,
            np.ascontiguousarray(head.codes, dtype=np.int64), np.ascontiguousarray(head.code_means),
            log_emission_ts, log_code_ts, np.ascontiguousarray(head.emission),
            np.ascontiguousarray(head.code_emission),
        )  # fmt: skip

    def arrays(self) -> tuple[Any, ...]:
        """The fields in the kernels' argument order."""
        return (
            self.key_means, self.inv_two_sigma2, self.gate_const, self.prior, self.log_prior, self.log_omega,
            self.codes, self.code_means, self.log_emission_ts, self.log_code_ts,
        )  # fmt: skip


@dataclass
class CodebookArrays:
    """The E-step's additive arrays (see :class:`~dist_respattn.model.heads.codebook.kind.CodebookStatistics`;
    ``code_count`` here target-major, (T, B, W))."""

    key_sum: np.ndarray
    key_mass: np.ndarray
    emission_count: np.ndarray
    code_sum: np.ndarray
    code_mass: np.ndarray
    code_count: np.ndarray
    prior_mass: np.ndarray
    omega_mass: np.ndarray
    scalars: np.ndarray  # (n_obs, log_lik)
    #: The flat cells ``s T + t`` of ``emission_count`` the E-step found at 0 before adding to them, in that order
    #: (one array a call): :func:`take_near_counts` reads and clears only these.
    touched: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def zeros(
        cls, s: int, d: int, t: int, near: int, b: int, w: int, emission_count: np.ndarray | None = None
    ) -> CodebookArrays:
        """Zeroed arrays; ``emission_count``: an (S, T) table of zeros to count into instead of a new one (see
        :func:`near_table`)."""
        return cls(
            np.zeros((s, d)), np.zeros(s), np.zeros((s, t)) if emission_count is None else emission_count,
            np.zeros((b, w, d)), np.zeros((b, w)), np.zeros((t, b, w)), np.zeros(near + 1), np.zeros(b), np.zeros(2),
        )  # fmt: skip

    def fields(self) -> tuple[np.ndarray, ...]:
        return (
            self.key_sum, self.key_mass, self.emission_count, self.code_sum, self.code_mass, self.code_count,
            self.prior_mass, self.omega_mass, self.scalars,
        )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _count(hist, log_hist, b, w, step):  # pragma: no cover - compiled
    """``hist[b, w] += step`` and its log kept beside it (``-inf`` at 0), so a row reads no log of its counts."""
    h = hist[b, w] + step
    hist[b, w] = h
    log_hist[b, w] = math.log(h) if h > 0.0 else -np.inf


@numba.njit(cache=True, nogil=True)
def _slide(tokens, codes, hist, log_hist, cur_lo, cur_hi, lo, hi):  # pragma: no cover - compiled
    """Move the far counts ``hist`` (B, W) (and their logs) from the span ``[cur_lo, cur_hi)`` to ``[lo, hi)``: token
    by token when the new span starts and ends no earlier and overlaps the old one, else rebuilt. Returns
    ``(lo, hi)``."""
    n_books = hist.shape[0]
    if lo >= cur_lo and hi >= cur_hi and lo <= cur_hi:
        for x in range(cur_lo, lo):
            s = tokens[x]
            for b in range(n_books):
                _count(hist, log_hist, b, codes[s, b], -1.0)
        for x in range(cur_hi, hi):
            s = tokens[x]
            for b in range(n_books):
                _count(hist, log_hist, b, codes[s, b], 1.0)
        return lo, hi
    hist[:, :] = 0.0
    for x in range(lo, hi):
        s = tokens[x]
        for b in range(n_books):
            hist[b, codes[s, b]] += 1.0
    for b in range(n_books):
        for w in range(hist.shape[1]):
            log_hist[b, w] = math.log(hist[b, w]) if hist[b, w] > 0.0 else -np.inf
    return lo, hi


@numba.njit(cache=True, nogil=True)
def _cell_distances(y, code_means, out):  # pragma: no cover - compiled
    """``out[b, w] = ||y - nu[b, w]||^2``."""
    n_books, n_words, n_dim = code_means.shape
    for b in range(n_books):
        for w in range(n_words):
            dist = 0.0
            for d in range(n_dim):
                a = y[d] - code_means[b, w, d]
                dist += a * a
            out[b, w] = dist


@numba.njit(cache=True, nogil=True)
def _row_terms(
    tokens, hi, m0, hist, log_hist, n_far, t, y, cell_dist, key_means, inv_two_sigma2, prior, log_prior, log_omega,
    log_emission_ts, log_code_ts, with_emission, near_logw, cell_logw,
):  # pragma: no cover - compiled  # fmt: skip
    """One row's log-weights: ``near_logw[r]`` of its near recency r (< m0; the token ``tokens[hi - 1 - r]``) and
    ``cell_logw[b, w]`` of its far cells (``-inf`` where no far token has that codeword), each
    ``log pi - log A - ||y - key||^2 / (2 sigma2)`` plus, ``with_emission``, the emission's ``log`` of target t.
    ``cell_dist`` (B, W): the squared distances of ``y`` to the codewords' keys. Returns ``(max log-weight, A)``,
    A the prior mass of the options the row has."""
    n_near = prior.shape[0] - 1
    total = 0.0
    for r in range(m0):
        total += prior[r]
    if n_far > 0:
        total += prior[n_near]
    log_total = math.log(total) if total > 0.0 else 0.0
    best = -np.inf
    for r in range(m0):
        c = tokens[hi - 1 - r]
        dist = 0.0
        for d in range(y.shape[0]):
            a = y[d] - key_means[c, d]
            dist += a * a
        lw = log_prior[r] - log_total - dist * inv_two_sigma2
        if with_emission:
            lw += log_emission_ts[t, c]
        near_logw[r] = lw
        best = max(best, lw)
    n_books, n_words = hist.shape
    if n_far == 0:
        cell_logw[:, :] = -np.inf
        return best, total
    far_const = log_prior[n_near] - math.log(n_far) - log_total
    for b in range(n_books):
        book_const = far_const + log_omega[b]
        for w in range(n_words):
            if hist[b, w] <= 0.0:
                cell_logw[b, w] = -np.inf
                continue
            lw = book_const + log_hist[b, w] - cell_dist[b, w] * inv_two_sigma2
            if with_emission:
                lw += log_code_ts[t, b, w]
            cell_logw[b, w] = lw
            best = max(best, lw)
    return best, total


@numba.njit(cache=True, nogil=True)
def _distances_of(row_query, query_table, code_means, cache, done, scratch):  # pragma: no cover - compiled
    """(B, W) the squared distances of query-table row ``row_query`` to the codewords' keys: from ``cache``
    (V, B, W), filled on first use (``done`` (V,)), or, without a cache (V = 0), computed into ``scratch``."""
    if cache.shape[0] == 0:
        _cell_distances(query_table[row_query].astype(np.float64), code_means, scratch)
        return scratch
    if not done[row_query]:
        _cell_distances(query_table[row_query].astype(np.float64), code_means, cache[row_query])
        done[row_query] = True
    return cache[row_query]


@numba.njit(cache=True, nogil=True)
def _log_sum(near_logw, m0, cell_logw, best):  # pragma: no cover - compiled
    """``log sum exp`` of a row's log-weights (``best`` their max; ``-inf`` when every weight is 0)."""
    if best == -np.inf:
        return -np.inf
    total = 0.0
    for r in range(m0):
        total += math.exp(near_logw[r] - best)
    n_books, n_words = cell_logw.shape
    for b in range(n_books):
        for w in range(n_words):
            if cell_logw[b, w] > -np.inf:
                total += math.exp(cell_logw[b, w] - best)
    return best + math.log(total)


#: A row's far sum (its cells' linear terms ``n_k g_k omega_b E_b[w, t]``, see :func:`_estep`) below this is
#: recomputed in the log domain: its largest term may then have lost digits, or underflowed, against the query's
#: nearest codeword.
FAR_TINY = 1e-200

#: How many rows ahead the E-step prefetches the table cells a row reads and updates.
PREFETCH_ROWS = 4


@numba.njit(cache=True, nogil=True)
def _recount(tokens, flat_codes, hist, lo, hi):  # pragma: no cover - compiled
    """Flat counts ``hist`` (B W,) (cell ``b W + w``, ``flat_codes[s, b]`` a symbol's cells) of ``tokens[lo:hi]``
    made afresh: for a far part that did not slide from the last row's (the E-step slides the usual one in its
    loop, as :func:`_slide` does with logs)."""
    n_books = flat_codes.shape[1]
    hist[:] = 0.0
    for x in range(lo, hi):
        s = tokens[x]
        for b in range(n_books):
            hist[flat_codes[s, b]] += 1.0


# Reassociated sums vectorize; they are kept in loops that store nothing, so that LLVM compiles one path for them:
# a loop that also stores gets a runtime check that the arrays do not overlap, whose outcome depends on where they
# lie, and the vector and scalar paths sum in different orders (a fit would then differ in its last bits).
@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _cell_distance(y, code_means, k):  # pragma: no cover - compiled
    """``||y - nu_k||^2`` of flat cell k (``code_means`` (B W, D))."""
    dist = 0.0
    for d in range(y.shape[0]):
        a = y[d] - code_means[k, d]
        dist += a * a
    return dist


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _total(values):  # pragma: no cover - compiled
    """``sum(values)``."""
    total = 0.0
    for k in range(values.shape[0]):
        total += values[k]
    return total


@numba.njit(cache=True, nogil=True)
def _query_gates(y, code_means, inv_two_sigma2, gates, at, scratch, bits, scale):  # pragma: no cover - compiled
    """``gates[at + k] = exp(-(||y - nu_k||^2 - min_k' ||y - nu_k'||^2) / (2 sigma2))`` over the flat cells k, each in
    [0, 1]; returns the shift ``min_k ||y - nu_k||^2 / (2 sigma2)`` (``code_means`` (B W, D); ``scratch`` float64
    and ``bits`` int64 of B W, ``scale`` the float64 view of ``bits``)."""
    n_cells = code_means.shape[0]
    least = np.inf
    for k in range(n_cells):
        dist = _cell_distance(y, code_means, k)
        scratch[k] = dist
        least = min(least, dist)
    for k in range(n_cells):
        scratch[k] = -(scratch[k] - least) * inv_two_sigma2
    exp_nonpositive_range(scratch, 0, gates, at, n_cells, bits, scale)
    return least * inv_two_sigma2


@numba.njit(cache=True, nogil=True)
def _far_terms_log(hist, y, code_means, inv_two_sigma2, log_omega, log_code_ts, t, terms):
    # pragma: no cover - compiled
    """The far cells' terms in the log domain, for a row whose linear sum is below :data:`FAR_TINY`: ``terms[k] =
    exp(l_k - max l)`` with ``l_k = log n_k + log omega_b + log E_b[w, t] - ||y - nu_k||^2 / (2 sigma2)``. Returns
    ``(sum, max l + log sum)`` (``(0, -inf)`` when no cell is possible)."""
    n_books, n_words = log_code_ts.shape[1], log_code_ts.shape[2]
    best = -np.inf
    for b in range(n_books):
        for w in range(n_words):
            k = b * n_words + w
            lw = -np.inf
            if hist[k] > 0.0:
                dist = _cell_distance(y, code_means, k)
                lw = math.log(hist[k]) + log_omega[b] + log_code_ts[t, b, w] - dist * inv_two_sigma2
            terms[k] = lw
            best = max(best, lw)
    if best == -np.inf:
        terms[:] = 0.0
        return 0.0, -np.inf
    total = 0.0
    for k in range(terms.shape[0]):
        terms[k] = math.exp(terms[k] - best)
        total += terms[k]
    return total, best + math.log(total)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _near_distance(y, key_means, c):  # pragma: no cover - compiled
    """``||y - mu[c]||^2``."""
    dist = 0.0
    for d in range(y.shape[0]):
        a = y[d] - key_means[c, d]
        dist += a * a
    return dist


@numba.njit(cache=True, nogil=True)
def _estep(
    tokens, begin, end, target, query_table, query_index, weight, key_means, inv_two_sigma2, gate_const, prior,
    log_prior, log_omega, log_emission_ts, log_code_ts, flat_codes, flat_means, code_ts, key_sum, key_mass,
    emission_count, code_sum, code_count, prior_mass, scalars, gates, shifts, done, code_query, touched,
):  # pragma: no cover - compiled  # fmt: skip
    """The E-step of window rows. Flat cells ``k = b W + w``: ``flat_means`` (B W, D), ``code_ts`` (T, B W),
    ``code_sum`` (B W, D), ``code_count`` (T, B W) (the cells' and codebooks' masses are its sums, made at the end:
    :func:`far_masses`). ``gates``/``shifts`` ((V, B W), (V,)): each query-table row's cell gates and their shift
    (:func:`_query_gates`, made beforehand: :meth:`EstepTables.query_gates`); ``done``/``code_query`` ((V,),
    (V, B W)): the table rows used and their cells' responsibilities (the query sums are made per table row at the
    end); all empty (V = 0), every row makes its own gates and adds its query sums. ``touched`` (at least rows x N0;
    uint32 when S T <= 2^32, else int64): the flat cells ``c T + t`` of ``emission_count`` found at 0 before an add,
    in order; returns how many."""
    n_near = prior.shape[0] - 1
    n_books = log_code_ts.shape[1]
    n_words = log_code_ts.shape[2]
    n_cells = n_books * n_words
    n_dim = key_means.shape[1]
    n_targets = emission_count.shape[1]
    n_touched = 0
    hist = np.zeros(n_cells)
    terms = np.empty(n_cells)
    near_logw = np.empty(n_near)
    y = np.empty(n_dim)
    cached = done.shape[0] > 0
    own_gates = np.empty(n_cells)
    scratch = np.empty(max(n_cells, n_near + 1))
    bits = np.empty(scratch.shape[0], dtype=np.int64)
    scale = bits.view(np.float64)
    cur_lo = 0
    cur_hi = 0
    weighted = weight.shape[0] > 0
    n_rows = target.shape[0]
    for row in range(n_rows):
        # The table cells a later row reads and updates: its near (symbol, target) cells, and the far rows it reads
        # (its codeword-table row and its gates). The far rows it updates (its codeword counts and query
        # responsibilities) are not prefetched: the rows it reads just before them are contiguous 1 KB rows too, and
        # prefetching the updated ones as well cost a row 4-8% more (see docs/guide/codebook-head.md).
        ahead = row + PREFETCH_ROWS
        if ahead < n_rows:
            t_ahead = target[ahead]
            hi_ahead = end[ahead]
            for r in range(min(hi_ahead - begin[ahead], n_near)):
                c = tokens[hi_ahead - 1 - r]
                prefetch_item(log_emission_ts, t_ahead, c)
                prefetch_item(emission_count, c, t_ahead)
            prefetch_row(code_ts, t_ahead)
            if cached:
                prefetch_row(gates, query_index[ahead])
        wt = weight[row] if weighted else 1.0
        if wt == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        m0 = min(m, n_near)
        n_far = m - m0
        far_hi = hi - m0 if n_far > 0 else lo
        if far_hi >= cur_hi and lo >= cur_lo and lo <= cur_hi:
            # The far part slid by a token or so (the usual row): its counts moved here, not through a call.
            for x in range(cur_lo, lo):
                s = tokens[x]
                for b in range(n_books):
                    hist[flat_codes[s, b]] -= 1.0
            for x in range(cur_hi, far_hi):
                s = tokens[x]
                for b in range(n_books):
                    hist[flat_codes[s, b]] += 1.0
        else:
            _recount(tokens, flat_codes, hist, lo, far_hi)
        cur_lo, cur_hi = lo, far_hi
        t = target[row]
        v = query_index[row]
        for d in range(n_dim):
            y[d] = query_table[v, d]
        total = 0.0
        for r in range(m0):
            total += prior[r]
        if n_far > 0:
            total += prior[n_near]
        log_total = math.log(total) if total > 0.0 else 0.0
        best = -np.inf
        for r in range(m0):
            c = tokens[hi - 1 - r]
            lw = log_prior[r] - log_total - _near_distance(y, key_means, c) * inv_two_sigma2 + log_emission_ts[t, c]
            near_logw[r] = lw
            best = max(best, lw)
        far_sum = 0.0
        far_log = -np.inf
        if n_far > 0:
            # The cells' terms n_k g_k omega_b E_b[w, t] (their sum: the far field's term up to the factor
            # pi_far / (n_far A) exp(-shift)), made here, each branch reading its own gates: a call, or one name for
            # either array, cost a row a call's arguments or the array's reference counting.
            if cached:
                done[v] = True
                shift = shifts[v]
                for k in range(n_cells):
                    terms[k] = hist[k] * gates[v, k] * code_ts[t, k]
            else:
                shift = _query_gates(y, flat_means, inv_two_sigma2, own_gates, 0, scratch, bits, scale)
                for k in range(n_cells):
                    terms[k] = hist[k] * own_gates[k] * code_ts[t, k]
            far_const = log_prior[n_near] - math.log(n_far) - log_total
            far_sum = _total(terms)
            if far_sum > FAR_TINY:
                far_log = far_const - shift + math.log(far_sum)
            else:
                far_sum, far_log = _far_terms_log(hist, y, flat_means, inv_two_sigma2, log_omega, log_code_ts, t,
                                                  terms)  # fmt: skip
                far_log += far_const
            best = max(best, far_log)
        if best == -np.inf:
            scalars[0] += wt
            scalars[1] += wt * (gate_const - np.inf)
            continue
        # The near positions' and the far field's weights, exponentiated in one vectorized pass.
        for r in range(m0):
            scratch[r] = near_logw[r] - best
        scratch[m0] = far_log - best
        # exp_nonpositive_range's loops, written out: inlined as a call, it counted its arrays' references each row.
        for r in range(m0):
            e = max(scratch[r], EXP_MIN)
            k_e = np.floor(e * LOG2E + 0.5)
            near_logw[r] = exp_reduced((e - k_e * LN2_HI) - k_e * LN2_LO)
            bits[r] = (np.int64(k_e) + 1023) << 52
        for r in range(m0):
            near_logw[r] = near_logw[r] * scale[r] if scratch[r] >= EXP_MIN else 0.0
        far_e = math.exp(scratch[m0]) if far_sum > 0.0 else 0.0
        z = far_e
        for r in range(m0):
            z += near_logw[r]
        log_p = best + math.log(z)
        scalars[0] += wt
        scalars[1] += wt * (gate_const + log_p)
        share = wt / z
        for r in range(m0):
            resp = near_logw[r] * share
            c = tokens[hi - 1 - r]
            key_mass[c] += resp
            for d in range(n_dim):
                key_sum[c, d] += resp * y[d]
            count = emission_count[c, t]
            if count == 0.0:  # listed for the table's clearing (a cell back at 0 is listed again)
                touched[n_touched] = c * n_targets + t
                n_touched += 1
            emission_count[c, t] = count + resp
            prior_mass[r] += resp
        if far_sum > 0.0:
            far = far_e * share
            per_term = far / far_sum
            # The cells' masses and the codebooks' are the sums of the codeword counts, made once at the end.
            if cached:
                for k in range(n_cells):
                    resp = terms[k] * per_term
                    code_count[t, k] += resp
                    # With a query table of few rows, the query sums are made per table row once, at the end.
                    code_query[v, k] += resp
            else:
                for k in range(n_cells):
                    resp = terms[k] * per_term
                    code_count[t, k] += resp
                    for d in range(n_dim):
                        code_sum[k, d] += resp * y[d]
            prior_mass[n_near] += far
        # The options this row lacks were drawn and rejected: pi_o / A expected draws each (exact EM of the
        # renormalized prior, as the single head's short windows count them).
        for r in range(m0, n_near):
            prior_mass[r] += wt * prior[r] / total
        if n_far == 0:
            prior_mass[n_near] += wt * prior[n_near] / total
    return n_touched


#: The most (query-table rows x cells) whose codeword distances (scores) or gates (the E-step) a pass keeps (64 MB
#: of float64).
CACHE_CELLS = 8_000_000


def _cache_for(rows: Any, params: CodebookParameters) -> tuple[np.ndarray, np.ndarray]:
    """The per-query-table-row cache of codeword distances: used when the table has no more rows than the block (a
    token stream's embedding table, read by every row) and fits :data:`CACHE_CELLS`; else empty (each row computes
    its own)."""
    n_books, n_words, _ = params.code_means.shape
    v = rows.query_table.shape[0]
    if _caches(rows, n_books * n_words):
        return np.empty((v, n_books, n_words)), np.zeros(v, dtype=np.bool_)
    return np.zeros((0, n_books, n_words)), np.zeros(0, dtype=np.bool_)


def _caches(rows: Any, cells: int) -> bool:
    """Whether a pass over ``rows`` keeps a value per (query-table row, cell) (see :func:`_cache_for`)."""
    v = rows.query_table.shape[0]
    return bool(v <= rows.num_rows and v * cells <= CACHE_CELLS)


@dataclass(frozen=True)
class EstepTables:
    """A head's tables as the E-step reads them, over flat cells ``k = b W + w`` (built once per head).

    Attributes:
        flat_codes: (S, B) int64, each symbol's cell in each codebook, ``b W + codes[s, b]``.
        flat_means: (B W, D) the codewords' keys.
        code_ts: (T, B W) ``omega_b E_b[w, t]``, target-major: a row's cells are one contiguous row.
        gate_cache: the gates of the last query table :meth:`query_gates` was asked for (its copy, ``1 / (2
            sigma2)``, the gates and their shifts): they depend only on the head and the table, which a token
            stream's blocks share.
    """

    flat_codes: np.ndarray
    flat_means: np.ndarray
    code_ts: np.ndarray
    gate_cache: dict[str, tuple[np.ndarray, float, np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def build(cls, head: Any) -> EstepTables:
        n_books, n_words, d = head.code_means.shape
        cells = n_books * n_words
        flat_codes = head.codes.astype(np.int64) + np.arange(n_books, dtype=np.int64)[None, :] * n_words
        weighted = head.code_emission * head.omega[:, None, None]
        code_ts = np.ascontiguousarray(weighted.transpose(2, 0, 1).reshape(-1, cells))
        return cls(np.ascontiguousarray(flat_codes), np.ascontiguousarray(head.code_means.reshape(cells, d)), code_ts)

    def query_gates(self, query_table: np.ndarray, inv_two_sigma2: float) -> tuple[np.ndarray, np.ndarray]:
        """``(gates (V B W,), shifts (V,))`` of every row of ``query_table`` (:func:`_query_gates`): made on the
        first call with a table, then reused while the calls bring a table equal to it (compared in full, so a
        table changed in place is not mistaken for the one kept). Concurrent callers may each make them; the
        values are the same and the kept ones are never written."""
        kept = self.gate_cache.get("last")
        if kept is not None:
            table, inv, gates, shifts = kept
            if (
                inv == inv_two_sigma2
                and table.shape == query_table.shape
                and table.dtype == query_table.dtype
                and np.array_equal(table, query_table)
            ):
                return gates, shifts
        cells = self.flat_means.shape[0]
        gates, shifts = np.empty(query_table.shape[0] * cells), np.empty(query_table.shape[0])
        _all_gates(query_table, self.flat_means, inv_two_sigma2, gates, shifts)
        self.gate_cache["last"] = (np.array(query_table, copy=True), inv_two_sigma2, gates, shifts)
        return gates, shifts


@numba.njit(cache=True, nogil=True)
def _all_gates(query_table, flat_means, inv_two_sigma2, gates, shifts):  # pragma: no cover - compiled
    """:func:`_query_gates` of every query-table row v into ``gates[v B W:(v + 1) B W]`` and ``shifts[v]``."""
    n_cells = flat_means.shape[0]
    y = np.empty(query_table.shape[1])
    scratch = np.empty(n_cells)
    bits = np.empty(n_cells, dtype=np.int64)
    scale = bits.view(np.float64)
    for v in range(query_table.shape[0]):
        for d in range(y.shape[0]):
            y[d] = query_table[v, d]
        shifts[v] = _query_gates(y, flat_means, inv_two_sigma2, gates, v * n_cells, scratch, bits, scale)


class _Scratch(threading.local):
    """A thread's tables kept zeroed between E-step passes, so that a pass neither makes nor first touches them
    (their pages stay mapped): the dense (S, T) near count table (32 MB at S = T = 2,001) and the (V, B W) query
    responsibilities. A pass takes a table (so a nested pass makes its own), clears the cells it wrote and gives it
    back (an exception drops it)."""

    near: np.ndarray | None = None
    code_query: np.ndarray | None = None


_SCRATCH = _Scratch()


@contextmanager
def near_table(s: int, t: int) -> Iterator[NearTable]:
    """This thread's (S, T) near count table, zeroed, for the E-step calls of one pass: the arrays
    ``CodebookArrays.zeros(..., emission_count=table.counts)`` count into it, and :func:`take_near_counts` reads the
    counts out and clears it. It goes back to the thread only once cleared."""
    kept, _SCRATCH.near = _SCRATCH.near, None
    table = NearTable(kept if kept is not None and kept.shape == (s, t) else np.zeros((s, t)))
    yield table
    if table.clean:
        _SCRATCH.near = table.counts


class NearTable:
    """A zeroed (S, T) count table lent by :func:`near_table`; ``clean`` once :func:`take_near_counts` cleared it."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = counts
        self.clean = False


def codebook_estep(rows: Any, params: CodebookParameters, tables: EstepTables, arrays: CodebookArrays) -> None:
    """Add the E-step statistics of window ``rows`` (in order; weights in ``rows.weight``) into ``arrays``, all but
    the far masses ``code_mass`` and ``omega_mass``, which :func:`far_masses` makes from the counts once the blocks
    are in; the near count cells found at 0 are listed in ``arrays.touched``."""
    n_books, n_words, d = params.code_means.shape
    cells = n_books * n_words
    cached = _caches(rows, cells)
    window = rows.kernel_arrays()  # a float32 query table as float64: one build of each kernel for both
    size = window.query_table.shape[0] if cached else 0
    if cached:
        gates, shifts = tables.query_gates(window.query_table, params.inv_two_sigma2)
        kept, _SCRATCH.code_query = _SCRATCH.code_query, None
        code_query = kept if kept is not None and kept.shape == (size, cells) else np.zeros((size, cells))
    else:
        gates, shifts, code_query = np.empty(0), np.empty(0), np.zeros((0, cells))
    done = np.zeros(size, dtype=np.bool_)
    cell_type = np.uint32 if arrays.emission_count.size <= 2**32 else np.int64  # np.sort: uint32 twice as fast
    touched = np.empty(rows.num_rows * (params.prior.shape[0] - 1), dtype=cell_type)
    p = params
    n_touched = _estep(  # type: ignore[call-arg]
        *window, p.key_means, p.inv_two_sigma2, p.gate_const, p.prior, p.log_prior, p.log_omega,
        p.log_emission_ts, p.log_code_ts, tables.flat_codes, tables.flat_means, tables.code_ts, arrays.key_sum,
        arrays.key_mass, arrays.emission_count, arrays.code_sum.reshape(cells, d), arrays.code_count.reshape(-1, cells),
        arrays.prior_mass, arrays.scalars, gates.reshape(-1, cells), shifts, done, code_query, touched,
    )  # fmt: skip
    arrays.touched.append(touched[:n_touched])
    if cached:
        _query_sums(code_query, done, window.query_table, arrays.code_sum.reshape(cells, d))
        _SCRATCH.code_query = code_query  # zeroed by the query sums


class NearCounts:
    """The near positions' (symbol, target) counts of an (S, T) table, in one form that depends only on the counts:
    the cells with a nonzero count, as flat cells ``s T + t`` in increasing order (``keys``, int64) with their counts
    (``values``), while they are at most half the table's cells (16 bytes a cell: never more than the dense table);
    the dense (S, T) table (``dense``) once more are nonzero. A pass over a few thousand rows counts into a few tens
    of thousands of cells of millions, so neither the statistics nor their sums make or ship the dense table; the
    M-step reads :meth:`toarray`.

    The counts are non-negative, so a sum's nonzero cells are the union of its terms' whichever way the terms are
    grouped: the sum of the same counts has the same form whatever the order and number of the operands, and a
    combine tree's value is the same bits on any number of workers. Each cell's sum is the dense table's to the bit:
    a pass adds a cell's terms in row order from 0 (into a thread's table kept zeroed, :func:`near_table`), and
    adding counts adds each cell's two counts (``self``'s first) as the dense tables would. Nothing but :meth:`add`
    on the value itself changes it: reading it (:meth:`toarray`, ``np.asarray``) makes a new table or gives a
    read-only view."""

    def __init__(
        self, shape: tuple[int, int], keys: np.ndarray | None, values: np.ndarray | None, dense: np.ndarray | None
    ) -> None:
        """The value of either form as given (use :meth:`from_cells` or :meth:`from_dense` to make one)."""
        self.shape = (int(shape[0]), int(shape[1]))
        self.keys = keys
        self.values = values
        self.dense = dense

    @staticmethod
    def _dense_above(shape: tuple[int, int]) -> int:
        """The most nonzero cells the pairs form holds (half the table's cells)."""
        return shape[0] * shape[1] // 2

    @classmethod
    def from_cells(cls, shape: tuple[int, int], keys: np.ndarray, values: np.ndarray) -> NearCounts:
        """The counts of distinct flat cells ``keys`` (increasing) holding ``values`` (all nonzero)."""
        shape = (int(shape[0]), int(shape[1]))
        if keys.shape[0] > cls._dense_above(shape):
            dense = np.zeros(shape)
            dense.reshape(-1)[keys] = values
            return cls(shape, None, None, dense)
        return cls(shape, np.ascontiguousarray(keys, dtype=np.int64), np.ascontiguousarray(values, dtype=np.float64),
                   None)  # fmt: skip

    @classmethod
    def from_dense(cls, table: np.ndarray) -> NearCounts:
        """The counts of an (S, T) table (copied)."""
        table = np.asarray(table, dtype=np.float64)
        keys = np.flatnonzero(table)
        if keys.shape[0] > cls._dense_above(table.shape):
            return cls(table.shape, None, None, np.array(table, order="C"))
        return cls(table.shape, keys.astype(np.int64), table.reshape(-1)[keys], None)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def nbytes(self) -> int:
        if self.dense is not None:
            return int(self.dense.nbytes)
        assert self.keys is not None and self.values is not None
        return int(self.keys.nbytes + self.values.nbytes)

    def __sizeof__(self) -> int:  # what a worker's memory accounting (``sys.getsizeof``) sees
        return object.__sizeof__(self) + self.nbytes

    def toarray(self) -> np.ndarray:
        """The (S, T) counts: a new table from the pairs, or a read-only view of the dense one."""
        if self.dense is not None:
            view = self.dense.view()
            view.flags.writeable = False
            return view
        assert self.keys is not None and self.values is not None
        out = np.zeros(self.shape)
        out.reshape(-1)[self.keys] = self.values
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if copy is False and self.dense is None:
            raise ValueError("near counts held as pairs make their (S, T) table: np.asarray cannot avoid a copy")
        out = self.toarray()
        if dtype is not None and np.dtype(dtype) != out.dtype:
            return out.astype(dtype)
        return out.copy() if copy and self.dense is not None else out

    def copy(self) -> NearCounts:
        if self.dense is not None:
            return NearCounts(self.shape, None, None, self.dense.copy())
        assert self.keys is not None and self.values is not None
        return NearCounts(self.shape, self.keys.copy(), self.values.copy(), None)

    def add(self, other: NearCounts) -> NearCounts:
        """``self + other`` into this value (the caller owns it: see :meth:`copy`); ``other`` is only read. Two
        pair lists are merged in one pass (a cell in both: ``self``'s count + ``other``'s), and the result becomes
        the dense table once more than half its cells are nonzero; a dense operand makes the result dense."""
        if other.shape != self.shape:
            raise ValueError(f"near counts of shape {other.shape} added to {self.shape}")
        if self.dense is None and other.dense is None:
            assert self.keys is not None and self.values is not None
            assert other.keys is not None and other.values is not None
            keys, values = merge_tallies((self.keys, self.values), (other.keys, other.values))
            merged = NearCounts.from_cells(self.shape, keys, values)
            self.keys, self.values, self.dense = merged.keys, merged.values, merged.dense
            return self
        dense = self.dense if self.dense is not None else self.toarray()  # a table of our own either way
        if other.dense is not None:
            np.add(dense, other.dense, out=dense)
        else:
            assert other.keys is not None and other.values is not None
            _scatter_add(dense.reshape(-1), other.keys, other.values)
        self.keys, self.values, self.dense = None, None, dense
        return self


@numba.njit(cache=True, nogil=True)
def _scatter_add(flat, keys, values):  # pragma: no cover - compiled
    """``flat[keys[i]] += values[i]`` in order."""
    for i in range(keys.shape[0]):
        flat[keys[i]] += values[i]


#: How many listed cells ahead :func:`_take` prefetches.
TAKE_AHEAD = 16


@numba.njit(cache=True, nogil=True)
def _take(flat, sorted_keys, keys, values):  # pragma: no cover - compiled
    """The cells ``sorted_keys`` (increasing, a cell possibly listed more than once) read once each and cleared;
    those of nonzero count go to ``keys``/``values`` in order. Returns how many."""
    m = 0
    previous = np.int64(-1)
    n = sorted_keys.shape[0]
    for i in range(n):
        if i + TAKE_AHEAD < n:  # the cells lie spread over the table, each a cache miss: started ahead
            prefetch_element(flat, np.int64(sorted_keys[i + TAKE_AHEAD]))
        k = np.int64(sorted_keys[i])
        if k == previous:
            continue
        previous = k
        count = flat[k]
        flat[k] = 0.0
        if count != 0.0:
            keys[m] = k
            values[m] = count
            m += 1
    return m


def take_near_counts(arrays: CodebookArrays, table: NearTable | None = None) -> NearCounts:
    """The near counts of ``arrays.emission_count`` as :class:`NearCounts`, the cells read cleared (the table is
    zero again; ``table``, the :class:`NearTable` it came from, marked clean). The listed cells are sorted first, so
    the counts come out in the table's order whatever the order the rows reached them in."""
    listed = np.sort(np.concatenate(arrays.touched)) if arrays.touched else np.empty(0, dtype=np.uint32)
    keys, values = np.empty(listed.shape[0], dtype=np.int64), np.empty(listed.shape[0])
    m = _take(arrays.emission_count.reshape(-1), listed, keys, values)
    arrays.touched.clear()
    if table is not None:
        table.clean = True
    if m < listed.shape[0]:  # cells listed twice or left at 0: the pairs kept at their size
        keys, values = keys[:m].copy(), values[:m].copy()
    return NearCounts.from_cells(arrays.emission_count.shape, keys, values)


def far_masses(arrays: CodebookArrays) -> None:
    """Set ``arrays.code_mass`` and ``arrays.omega_mass`` from the codeword counts (the E-step adds neither: a far
    cell's mass is its counts' sum over the targets, a codebook's its cells')."""
    _far_masses(arrays.code_count.reshape(arrays.code_count.shape[0], -1), arrays.code_mass.reshape(-1),
                arrays.omega_mass)  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _far_masses(code_count, code_mass, omega_mass):  # pragma: no cover - compiled
    """``code_mass[k] = sum_t code_count[t, k]`` (targets in order) and ``omega_mass[b]`` the sum of its cells'."""
    code_mass[:] = 0.0
    for t in range(code_count.shape[0]):
        for k in range(code_count.shape[1]):
            code_mass[k] += code_count[t, k]
    n_words = code_mass.shape[0] // omega_mass.shape[0]
    for b in range(omega_mass.shape[0]):
        total = 0.0
        for w in range(n_words):
            total += code_mass[b * n_words + w]
        omega_mass[b] = total


@numba.njit(cache=True, nogil=True)
def _query_sums(code_query, done, query_table, code_sum):  # pragma: no cover - compiled
    """``code_sum[k] += sum_v code_query[v, k] y_v`` over the query-table rows used, in row order, four rows at a
    time (their four terms summed, then added: each cell's sums are loaded and stored once per four rows; with D a
    multiple of 8, 8 dimensions a vector, the four rows' 32 dimensions held over the cells: :func:`add_four_products`,
    the same numbers); the rows read are cleared (``code_query`` is zero again)."""
    n_dim = code_sum.shape[1]
    n_cells = code_query.shape[1]
    used = np.flatnonzero(done)
    ys = np.empty((4, n_dim))
    vs = np.empty(4, dtype=np.int64)
    n_used = used.shape[0]
    full = n_used - n_used % 4
    lanes = n_dim % LANES == 0
    for i in range(0, full, 4):
        for j in range(4):
            vs[j] = used[i + j]
            for d in range(n_dim):
                ys[j, d] = query_table[vs[j], d]
        if lanes:
            add_four_products(code_sum, code_query, vs, ys)
        else:
            v0, v1, v2, v3 = vs[0], vs[1], vs[2], vs[3]
            for k in range(n_cells):
                a0, a1, a2, a3 = code_query[v0, k], code_query[v1, k], code_query[v2, k], code_query[v3, k]
                for d in range(n_dim):
                    code_sum[k, d] += ((a0 * ys[0, d] + a1 * ys[1, d]) + a2 * ys[2, d]) + a3 * ys[3, d]
        for j in range(4):
            for k in range(n_cells):
                code_query[vs[j], k] = 0.0
    for i in range(full, n_used):
        v = used[i]
        for d in range(n_dim):
            ys[0, d] = query_table[v, d]
        for k in range(n_cells):
            a = code_query[v, k]
            code_query[v, k] = 0.0
            for d in range(n_dim):
                code_sum[k, d] += a * ys[0, d]


@numba.njit(cache=True, nogil=True)
def _score(
    tokens, begin, end, target, query_table, query_index, key_means, inv_two_sigma2, gate_const, prior, log_prior,
    log_omega, codes, code_means, log_emission_ts, log_code_ts, out, cache, done,
):  # pragma: no cover - compiled  # fmt: skip
    n_near = prior.shape[0] - 1
    n_books = code_means.shape[0]
    n_words = code_means.shape[1]
    hist = np.zeros((n_books, n_words))
    log_hist = np.full((n_books, n_words), -np.inf)
    scratch = np.empty((n_books, n_words))
    near_logw = np.empty(n_near)
    cell_logw = np.empty((n_books, n_words))
    cur_lo = 0
    cur_hi = 0
    for row in range(target.shape[0]):
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        m0 = min(m, n_near)
        n_far = m - m0
        far_hi = hi - m0 if n_far > 0 else lo
        cur_lo, cur_hi = _slide(tokens, codes, hist, log_hist, cur_lo, cur_hi, lo, far_hi)
        t = target[row]
        v = query_index[row]
        y = query_table[v].astype(np.float64)
        cell_dist = _distances_of(v, query_table, code_means, cache, done, scratch) if n_far > 0 else scratch
        best, _ = _row_terms(
            tokens,
            hi,
            m0,
            hist,
            log_hist,
            n_far,
            t,
            y,
            cell_dist,
            key_means,
            inv_two_sigma2,
            prior,
            log_prior,
            log_omega,
            log_emission_ts,
            log_code_ts,
            False,
            near_logw,
            cell_logw,
        )
        log_q = _log_sum(near_logw, m0, cell_logw, best)
        best, _ = _row_terms(
            tokens,
            hi,
            m0,
            hist,
            log_hist,
            n_far,
            t,
            y,
            cell_dist,
            key_means,
            inv_two_sigma2,
            prior,
            log_prior,
            log_omega,
            log_emission_ts,
            log_code_ts,
            True,
            near_logw,
            cell_logw,
        )
        log_p = _log_sum(near_logw, m0, cell_logw, best)
        out[row, 0] = gate_const + log_q
        out[row, 1] = log_p - log_q


def codebook_score(rows: Any, params: CodebookParameters) -> np.ndarray:
    """(n, 2) each window row's ``(log p(query | window), log p(target | window, query))``."""
    out = np.empty((rows.num_rows, 2))
    cache, done = _cache_for(rows, params)
    _score(  # type: ignore[call-arg]
        *rows.kernel_arrays()[:6], *params.arrays(), out, cache, done,  # every array but the weights
    )  # fmt: skip
    return out


@numba.njit(cache=True, nogil=True)
def _mix(tokens, hi, m0, near_logw, cell_logw, log_q, emission, code_emission, probs, near_att, cell_att):
    # pragma: no cover - compiled
    """``probs = sum_r a_r B[c_r] + sum_bw a_bw E_b[w]`` with the attention ``a = exp(logw - log_q)``."""
    probs[:] = 0.0
    for r in range(m0):
        a = math.exp(near_logw[r] - log_q)
        near_att[r] = a
        row = emission[tokens[hi - 1 - r]]
        for t in range(probs.shape[0]):
            probs[t] += a * row[t]
    n_books, n_words = cell_logw.shape
    for b in range(n_books):
        for w in range(n_words):
            if cell_logw[b, w] == -np.inf:
                cell_att[b, w] = 0.0
                continue
            a = math.exp(cell_logw[b, w] - log_q)
            cell_att[b, w] = a
            row = code_emission[b, w]
            for t in range(probs.shape[0]):
                probs[t] += a * row[t]


@numba.njit(cache=True, nogil=True)
def _proba(
    tokens, begin, end, query_table, query_index, key_means, inv_two_sigma2, gate_const, prior, log_prior,
    log_omega, codes, code_means, log_emission_ts, log_code_ts, emission, code_emission, out, near_att, cell_att,
):  # pragma: no cover - compiled  # fmt: skip
    n_near = prior.shape[0] - 1
    n_books = code_means.shape[0]
    n_words = code_means.shape[1]
    hist = np.zeros((n_books, n_words))
    log_hist = np.full((n_books, n_words), -np.inf)
    cell_dist = np.empty((n_books, n_words))
    near_logw = np.empty(n_near)
    cell_logw = np.empty((n_books, n_words))
    cur_lo = 0
    cur_hi = 0
    for row in range(begin.shape[0]):
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        m0 = min(m, n_near)
        n_far = m - m0
        far_hi = hi - m0 if n_far > 0 else lo
        cur_lo, cur_hi = _slide(tokens, codes, hist, log_hist, cur_lo, cur_hi, lo, far_hi)
        y = query_table[query_index[row]].astype(np.float64)
        _cell_distances(y, code_means, cell_dist)
        best, _ = _row_terms(
            tokens,
            hi,
            m0,
            hist,
            log_hist,
            n_far,
            0,
            y,
            cell_dist,
            key_means,
            inv_two_sigma2,
            prior,
            log_prior,
            log_omega,
            log_emission_ts,
            log_code_ts,
            False,
            near_logw,
            cell_logw,
        )
        log_q = _log_sum(near_logw, m0, cell_logw, best)
        near_att[row, :] = 0.0
        _mix(tokens, hi, m0, near_logw, cell_logw, log_q, emission, code_emission, out[row], near_att[row],
             cell_att[row])  # fmt: skip


def codebook_proba(rows: Any, params: CodebookParameters) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(probs (n, T), near attention (n, N0) by recency, cell attention (n, B, W))`` of window rows: each row's
    ``p(target | window, query)`` and the predictive attention it mixes."""
    n = rows.num_rows
    n_books, n_words, _ = params.code_means.shape
    out = np.empty((n, params.emission.shape[1]))
    near_att = np.zeros((n, params.prior.shape[0] - 1))
    cell_att = np.zeros((n, n_books, n_words))
    window = rows.kernel_arrays()
    _proba(  # type: ignore[call-arg]
        window.tokens, window.begin, window.end, window.query_table, window.query_index, *params.arrays(),
        params.emission, params.code_emission, out, near_att, cell_att,
    )  # fmt: skip
    return out, near_att, cell_att


def far_histogram(tokens: np.ndarray, codes: np.ndarray, num_codewords: int) -> np.ndarray:
    """(B, W) the codeword counts of ``tokens`` (a far part, any order)."""
    hist = np.zeros((codes.shape[1], num_codewords))
    if len(tokens):
        _slide(np.asarray(tokens, dtype=np.int32), codes, hist, np.empty_like(hist), 0, 0, 0, len(tokens))
    return hist


def state_proba(
    near: np.ndarray, hist: np.ndarray, n_far: int, y: np.ndarray, params: CodebookParameters
) -> np.ndarray:
    """(T,) ``p(target | state, query y)`` of a streaming state: ``near`` the last min(history, N0) tokens, oldest
    first, and ``hist`` (B, W) the far tokens' codeword counts (``n_far`` of them). O((N0 + B W)(D + T))."""
    tokens = np.ascontiguousarray(near, dtype=np.int32)  # the window kernels' token dtype: their build, reused
    m0 = tokens.shape[0]
    n_near = params.prior.shape[0] - 1
    near_logw = np.empty(n_near)
    cell_logw = np.empty(hist.shape)
    y = np.asarray(y, dtype=np.float64)
    cell_dist = np.empty(hist.shape)
    _cell_distances(y, params.code_means, cell_dist)
    with np.errstate(divide="ignore"):
        log_hist = np.log(hist)
    best, _ = _row_terms(
        tokens, m0, m0, hist, log_hist, n_far, 0, y, cell_dist, params.key_means, params.inv_two_sigma2,
        params.prior, params.log_prior, params.log_omega, params.log_emission_ts, params.log_code_ts, False,
        near_logw, cell_logw,
    )  # fmt: skip
    log_q = _log_sum(near_logw, m0, cell_logw, best)
    probs = np.empty(params.emission.shape[1])
    _mix(tokens, m0, m0, near_logw, cell_logw, log_q, params.emission, params.code_emission, probs,
         np.zeros(n_near), np.zeros(hist.shape))  # fmt: skip
    return probs
