"""The copy head's E-step over long windows with a tied prior: the copy terms carried by the window's histograms.

With the prior tied over recency buckets (``share_b = pi_b / |b|`` a position of bucket ``b``), a row's weight on
symbol ``s`` of its window, summed over the positions holding it, is::

    W(s) = N(y; K[s]) / A * [ B[s, t] sum_b share_b own_b h_b(s)        (own table,  own_b = 1 - kappa_b - rho_b)
                              + [s = t] sum_b share_b kappa_b h_b(t)      (cache: a copy of the attended token)
                              + sum_{x: c_x = s, c_{x+1} = t} share_b(x) rho_b(x) ]   (induction)

so the window's distinct symbols are the row's terms, as in the single head's histogram kernel
(:mod:`dist_respattn.model.kernels.histogram`), whose sliding bucket histograms this kernel shares with the own
table's share ``share_b own_b`` in place of ``share_b``. The cache term reads the target's histogram (K numbers);
the induction term walks the target's earlier occurrences in the window through a "previous occurrence of the same
token" chain, one step an occurrence. A row costs O(distinct symbols D + K + occurrences of its target) instead of
O(N D), and its statistics are the per-position kernel's (:mod:`dist_respattn.model.heads.copy.kernels`) summed per
bucket, which is all the tied M-step reads (equal to 1e-12, ``tests/model/test_copy.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from dist_respattn.model.heads.copy.kernels import CopyArrays, CopyParameters, log_emission, raise_row_problems
from dist_respattn.model.kernels.histogram import flush_pending, missing_mass, query_row, slide_terms, terms_state
from dist_respattn.model.kernels.log_weights import exp_shifted, row_log_weights
from dist_respattn.model.rows import WindowRows

__all__ = ["copy_estep_windows", "previous_occurrences"]

_NO_VALUES = np.zeros(0)


@numba.njit(cache=True, nogil=True)
def previous_occurrences(tokens, num_symbols):  # pragma: no cover - compiled
    """(n,) int64: for each position of ``tokens`` (n,), the previous position holding the same token (-1: none)."""
    last = np.full(num_symbols, -1, dtype=np.int64)
    previous = np.empty(tokens.shape[0], dtype=np.int64)
    for x in range(tokens.shape[0]):
        s = tokens[x]
        previous[x] = last[s]
        last[s] = x
    return previous


@numba.njit(cache=True, nogil=True)
def _estep(
    tokens, previous, begin, end, target, query_table, query_index, weights,
    key_means, inv_two_sigma2, gate_const, bucket_of_recency, sizes, share, share_own, kappa, rho,
    log_emission_ts, indptr, symbols, log_values, log_backoff, log_base,
    key_sum, key_mass, emission_count_ts, pair_counts, recency_mass, copy_mass, induction_mass, bucket_mass,
    scalars, impossible, slot,
):  # pragma: no cover - compiled  # fmt: skip
    """The fused copy E-step over the rows in order, one term a distinct symbol of the window. Returns
    ``(n_impossible, n_outside)`` as :func:`~dist_respattn.model.heads.copy.kernels.copy_estep`'s kernel does.
    ``slot`` (S,) int64 is all -1 on entry and on return."""
    n_pos = bucket_of_recency.shape[0]
    n_buckets = sizes.shape[0]
    n_tokens = tokens.shape[0]
    dim = key_means.shape[1]
    dense = indptr.shape[0] == 0
    starts = np.zeros(n_buckets + 1, dtype=np.int64)
    for b in range(n_buckets):
        starts[b + 1] = starts[b] + sizes[b]
    # The own table's terms slide as the single head's do, with share_b own_b as each position's prior share: a
    # term's prior is then its own-table weight, and its flushed pending mass the own share of its buckets.
    state = terms_state(n_pos, n_buckets)
    term_of, hist, count, prior, log_prior_of, inv_prior, pending, active, where, free, dirty, is_dirty = state[:12]
    ev_x, ev_from, ev_to = state[12:]
    n_active = 0
    n_free = n_pos
    prev_lo = -1
    prev_hi = -1
    terms = np.empty((1, n_pos), dtype=np.int64)
    log_prior = np.empty(n_pos)
    logw = np.empty(n_pos)
    resp = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    pair = np.empty(n_pos, dtype=np.int64)
    # The terms a copy or an induction reaches this row: their own-table, cache and induction weights.
    touched = np.zeros(n_pos, dtype=np.bool_)
    touched_at = np.empty(n_pos, dtype=np.int64)
    own_part = np.zeros(n_pos)
    cache_part = np.zeros(n_pos)
    induction_part = np.zeros(n_pos)
    # The induction occurrences: the attended position and its term.
    item_x = np.empty(n_pos, dtype=np.int64)
    item_j = np.empty(n_pos, dtype=np.int64)
    # This call's bucket masses: the own share (flushed), the copy and induction shares, the rejected draws.
    own_mass = np.zeros(n_buckets)
    copy_induction_mass = np.zeros(n_buckets)
    rejected_mass = np.zeros(n_buckets)
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
            tokens, lo, hi, prev_lo, prev_hi, n_active, n_free, bucket_of_recency, starts, share_own, slot, own_mass,
            term_of, hist, count, prior, log_prior_of, inv_prior, pending, active, where, free, dirty, is_dirty,
            ev_x, ev_from, ev_to,
        )  # fmt: skip
        prev_lo = lo
        prev_hi = hi
        m = hi - lo
        total = 0.0  # A: the prior mass of the positions the row has
        for b in range(n_buckets):
            total += share[b] * min(max(m - starts[b], 0), sizes[b])
        u = n_active
        outside = False
        for j in range(u):
            s = term_of[active[j]]
            terms[0, j] = s
            if dense:
                logw[j] = log_emission_ts[t, s]
                pair[j] = -1
            else:
                logw[j], pair[j] = log_emission(t, s, log_emission_ts, indptr, symbols, log_values, log_backoff,
                                                log_base)  # fmt: skip
                if pair[j] < 0 and prior[active[j]] > 0.0:
                    outside = True
        if outside:
            n_outside += 1
            continue
        # ------------------------------------------------ the cache and induction terms of the target
        n_touched = 0
        k_t = slot[t]
        if k_t >= 0:
            weight_t = 0.0
            for b in range(n_buckets):
                h = hist[k_t, b]
                if h > 0:
                    weight_t += share[b] * kappa[b] * h
            if weight_t > 0.0:
                j = where[k_t]
                touched[j] = True
                touched_at[n_touched] = j
                n_touched += 1
                cache_part[j] = weight_t
        # The target's occurrences in the window after its first position, latest first: the token before each.
        if hi < n_tokens and tokens[hi] == t:
            x1 = previous[hi]
        else:
            x1 = hi - 1
            while x1 >= lo and tokens[x1] != t:
                x1 -= 1
        n_items = 0
        while x1 > lo:
            x = x1 - 1
            b = bucket_of_recency[hi - 1 - x]
            v = share[b] * rho[b]
            if v > 0.0:
                j = where[slot[tokens[x]]]
                if not touched[j]:
                    touched[j] = True
                    touched_at[n_touched] = j
                    n_touched += 1
                induction_part[j] += v
                item_x[n_items] = x
                item_j[n_items] = j
                n_items += 1
            x1 = previous[x1]
        # ------------------------------------------------ the row's log-weights
        yy = query_row(query_table, query_index[row], y)
        log_total = math.log(total) if total > 0.0 else 0.0
        for j in range(u):
            log_prior[j] = log_prior_of[active[j]] - log_total
        for i in range(n_touched):
            j = touched_at[i]
            own_part[j] = math.exp(log_prior_of[active[j]] + logw[j])
            weight = own_part[j] + cache_part[j] + induction_part[j]
            logw[j] = math.log(weight) if weight > 0.0 else -np.inf
            log_prior[j] = -log_total
        best = -np.inf
        if total > 0.0:
            best = row_log_weights(terms[:, :u], 0, y, key_means, log_prior, inv_two_sigma2, logw[:u], logw[:0])
        if best == -np.inf:
            if n_impossible < impossible.shape[0]:
                impossible[n_impossible] = row
            n_impossible += 1
        else:
            z = exp_shifted(logw[:u], best, resp[:u], bits[:u])
            scale = w / z
            for j in range(u):
                r = resp[j] * scale
                k = active[j]
                s = terms[0, j]
                key_mass[s] += r
                for d in range(dim):
                    key_sum[s, d] += r * y[d]
                r_own = r
                if touched[j]:
                    per_weight = r / (own_part[j] + cache_part[j] + induction_part[j])
                    r_own = per_weight * own_part[j]
                    if cache_part[j] > 0.0:
                        # The cache share of the target's term, over its positions as share_b kappa_b h_b.
                        for b in range(n_buckets):
                            h = hist[k, b]
                            if h > 0:
                                v = per_weight * (share[b] * kappa[b] * h)
                                copy_mass[b] += v
                                copy_induction_mass[b] += v
                    induction_part[j] = per_weight  # now the term's responsibility per unit of induction weight
                if r_own != 0.0:
                    if dense:
                        emission_count_ts[t, s] += r_own
                    else:
                        pair_counts[pair[j]] += r_own
                    pending[k] += r_own * inv_prior[k]
            for i in range(n_items):
                b = bucket_of_recency[hi - 1 - item_x[i]]
                v = induction_part[item_j[i]] * (share[b] * rho[b])
                induction_mass[b] += v
                copy_induction_mass[b] += v
            if m < n_pos:
                missing_mass(m, sizes, share, w / total, rejected_mass)
            query_sq += w * yy
            n_obs += w
            log_lik += w * (best + math.log(z) + gate_const)
        for i in range(n_touched):
            j = touched_at[i]
            touched[j] = False
            cache_part[j] = 0.0
            induction_part[j] = 0.0
    for j in range(n_active):
        flush_pending(active[j], hist, share_own, pending, own_mass)
        slot[term_of[active[j]]] = -1
    for b in range(n_buckets):
        real = own_mass[b] + copy_induction_mass[b]
        bucket_mass[b] += real
        # The prior's M-step reads bucket sums only: each bucket's mass spread evenly over its positions.
        per_position = (real + rejected_mass[b]) / sizes[b]
        for r in range(starts[b], starts[b + 1]):
            recency_mass[r] += per_position
    scalars[0] += query_sq
    scalars[1] += n_obs
    scalars[2] += log_lik
    return n_impossible, n_outside


def copy_estep_windows(rows: WindowRows, params: CopyParameters, stats: Any, extra: CopyArrays) -> None:
    """:func:`~dist_respattn.model.heads.copy.kernels.copy_estep` for a head whose prior is tied over the buckets
    of ``params.bucket_of_recency`` (equal shares within a bucket): the same statistics summed per bucket (the
    recency masses spread evenly over each bucket's positions), at O(distinct symbols) a row."""
    bucket_of_recency = params.bucket_of_recency
    sizes = np.bincount(bucket_of_recency).astype(np.int64)
    # The tied prior's share of a position of each bucket, read at the bucket's most recent position.
    share = params.prior[::-1][np.concatenate([[0], np.cumsum(sizes)[:-1]])].astype(np.float64)
    own = np.maximum(1.0 - params.kappa - params.rho, 0.0)
    sparse = params.indptr.shape[0] > 0
    window = rows.kernel_arrays()
    previous = previous_occurrences(window.tokens, params.key_means.shape[0])
    found = np.empty(min(rows.num_rows, 64), dtype=np.int64)
    n_impossible, n_outside = _estep(
        window.tokens, previous, *window[1:],
        params.key_means, params.inv_two_sigma2, params.gate_const, bucket_of_recency, sizes, share, share * own,
        params.kappa, params.rho, params.log_emission_ts, params.indptr, params.symbols, params.log_values,
        params.log_backoff, params.log_base, stats.key_sum, stats.key_mass, stats.emission_count_ts,
        stats.pair_counts if sparse else _NO_VALUES, extra.recency_mass, extra.copy_mass, extra.induction_mass,
        extra.bucket_mass, stats.scalars, found, np.full(params.key_means.shape[0], -1, dtype=np.int64),
    )  # fmt: skip
    raise_row_problems(n_outside, n_impossible, found)
