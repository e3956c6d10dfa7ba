"""The copy head's held-out grid: every (gate variance, emission strengths) candidate of a single-hop M-step scored
with the copy terms, in one pass over token windows.

A copy M-step leaves open what a single-hop one does (the gate variance and the emission prior's strengths); its
copy and induction weights follow from the statistics alone. So the candidates are the single head's grid
(:class:`~dist_respattn.model.fitting.selection.GridTable`), each scored as the copy head it makes: position ``i``
of bucket ``b`` emits ``(1 - kappa_b - rho_b) B_k[c_i, t] + kappa_b [t = c_i] + rho_b [t = c_{i+1}]`` with ``B_k``
the MAP emission at strength pair ``k``, the same expression :mod:`~dist_respattn.model.heads.copy.kernels`
scores with. Under a tied prior a row's terms are its window's distinct symbols (O(N) loads, then O(D) work and the
grid's arithmetic per distinct symbol), as in the single head's histogram grid.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from dist_respattn.model.fitting.selection import (
    GridTable,
    GridTotals,
    grid_count,
    grid_count_arrays,
    grid_points,
    map_emissions,
)
from dist_respattn.model.kernels.log_weights import squared_distance
from dist_respattn.model.rows import WindowRows

__all__ = ["copy_grid"]


@numba.njit(cache=True, nogil=True)
def _copy_grid_numba(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, log_prior, bucket_of_recency, kappa, rho, emission_count_ts, indptr, symbols, pair_counts, row_totals,
    base, types, inv_two_sigma2, gate_const, emission_strengths, type_strengths, direct_row, direct_slots,
    out_pred, out_joint,
):  # pragma: no cover - compiled  # fmt: skip
    """Every grid point's predictive and joint log-likelihood of the rows into ``out_*`` (G1, G2*G3); returns the
    weight. A short window renormalizes its prior over the positions it has, as the copy E-step does."""
    n_pos = log_prior.shape[0]
    n_emis = emission_strengths.shape[0] * type_strengths.shape[0]
    row_prior = np.empty(n_pos)
    dist = np.empty(n_pos)
    count = np.empty(n_pos)
    total = np.empty(n_pos)
    typ = np.empty(n_pos)
    own = np.empty(n_pos)
    extra = np.empty(n_pos)
    emis = np.empty((n_emis, n_pos))
    gate = np.empty(n_pos)
    y = np.empty(key_means.shape[1])
    weight = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        q = query_index[row]
        for d in range(y.shape[0]):
            y[d] = np.float64(query_table[q, d])
        t = target[row]
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        mass = 0.0
        for r in range(m):
            mass += math.exp(log_prior[n_pos - 1 - r])
        log_mass = 0.0 if m == n_pos else (math.log(mass) if mass > 0.0 else 0.0)
        for j in range(m):
            x = lo + j
            r = hi - 1 - x
            c = tokens[x]
            b = bucket_of_recency[r]
            row_prior[j] = log_prior[n_pos - 1 - r] - log_mass
            dist[j] = squared_distance(y, key_means, c)
            count[j] = grid_count(t, c, emission_count_ts, indptr, symbols, pair_counts, direct_row, direct_slots)
            total[j] = row_totals[c]
            typ[j] = types[c]
            own[j] = 1.0 - kappa[b] - rho[b]
            extra[j] = (kappa[b] if c == t else 0.0) + (rho[b] if x + 1 < hi and tokens[x + 1] == t else 0.0)
        map_emissions(m, count, total, typ, base[t], emission_strengths, type_strengths, emis)
        for k in range(n_emis):
            for j in range(m):
                emis[k, j] = own[j] * emis[k, j] + extra[j]
        grid_points(w, m, row_prior, dist, inv_two_sigma2, gate_const, emis, gate, out_pred, out_joint)
        weight += w
    return weight


@numba.njit(cache=True, nogil=True)
def _copy_grid_terms_numba(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, bucket_of_recency, share, kappa, rho, emission_count_ts, indptr, symbols, pair_counts, row_totals,
    base, types, inv_two_sigma2, gate_const, emission_strengths, type_strengths, direct_row, direct_slots, slot,
    out_pred, out_joint,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`_copy_grid_numba` under a tied prior, one term a distinct symbol of the window (as the single head's
    histogram grid): a term's prior is its positions' shares, its emission at strength pair ``k`` their mix of
    ``own_b B_k[s, t]`` and the cache and induction weights. One pass over a window's positions, then O(D) work a
    term. ``slot`` (S,) int64 is all -1 on entry and on return."""
    n_pos = bucket_of_recency.shape[0]
    n_emis = emission_strengths.shape[0] * type_strengths.shape[0]
    term_sym = np.empty(n_pos, dtype=np.int64)
    term_prior = np.empty(n_pos)
    term_own = np.empty(n_pos)
    term_extra = np.empty(n_pos)
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
        q = query_index[row]
        for d in range(y.shape[0]):
            y[d] = np.float64(query_table[q, d])
        t = target[row]
        lo = begin[row]
        hi = end[row]
        u = 0
        mass = 0.0
        for x in range(lo, hi):
            b = bucket_of_recency[hi - 1 - x]
            s = tokens[x]
            k = slot[s]
            if k < 0:
                k = u
                slot[s] = u
                term_sym[u] = s
                term_prior[u] = 0.0
                term_own[u] = 0.0
                term_extra[u] = 0.0
                u += 1
            share_b = share[b]
            term_prior[k] += share_b
            term_own[k] += share_b * (1.0 - kappa[b] - rho[b])
            if s == t:
                term_extra[k] += share_b * kappa[b]
            if x + 1 < hi and tokens[x + 1] == t:
                term_extra[k] += share_b * rho[b]
            mass += share_b
        for k in range(u):
            slot[term_sym[k]] = -1
        for k in range(u):
            c = term_sym[k]
            log_prior[k] = math.log(term_prior[k] / mass) if term_prior[k] > 0.0 else -np.inf
            dist[k] = squared_distance(y, key_means, c)
            count[k] = grid_count(t, c, emission_count_ts, indptr, symbols, pair_counts, direct_row, direct_slots)
            total[k] = row_totals[c]
            typ[k] = types[c]
        map_emissions(u, count, total, typ, base[t], emission_strengths, type_strengths, emis)
        for k in range(u):
            if term_prior[k] > 0.0:
                own = term_own[k] / term_prior[k]
                extra = term_extra[k] / term_prior[k]
                for e in range(n_emis):
                    emis[e, k] = own * emis[e, k] + extra
        grid_points(w, u, log_prior, dist, inv_two_sigma2, gate_const, emis, gate, out_pred, out_joint)
        weight += w
    return weight


def copy_grid(table: GridTable, rows: WindowRows, bucket_of_recency: np.ndarray, kappa: Any, rho: Any) -> GridTotals:
    """Held-out totals of window ``rows`` at every point of a single-hop grid ``table``, each point's head carrying
    the copy weights ``kappa``, ``rho`` (K,) of the buckets ``bucket_of_recency`` (N,) maps recencies to."""
    counts = table.counts
    rows.check(counts.num_symbols, counts.num_targets, table.log_prior.shape[0], table.key_means.shape[1])
    dense_ts, indptr, symbols, pair_counts = grid_count_arrays(table)
    g1, g2, g3 = table.shape
    pred = np.zeros((g1, g2 * g3))
    joint = np.zeros((g1, g2 * g3))
    dim = table.key_means.shape[1]
    kappa, rho = np.asarray(kappa, dtype=np.float64), np.asarray(rho, dtype=np.float64)
    bucket_of_recency = np.asarray(bucket_of_recency, dtype=np.int64)
    emission = (dense_ts, indptr, symbols, pair_counts, table.row_totals, table.base, table.types)
    gates = (0.5 / table.sigma2, -0.5 * dim * np.log(2.0 * np.pi * table.sigma2))
    strengths = (table.emission_strengths, table.type_strengths, *table.direct_pair_rows)
    window = rows.kernel_arrays()
    buckets = table.buckets
    if buckets is None:
        weight = _copy_grid_numba(
            *window, table.key_means, np.asarray(table.log_prior, dtype=np.float64), bucket_of_recency, kappa, rho,
            *emission, *gates, *strengths, pred, joint,
        )  # fmt: skip
    else:
        # A tied prior: one term a distinct symbol (the copy weights' buckets are the prior's).
        share = buckets.bucket_weights(np.exp(table.log_prior)) / np.asarray(buckets.sizes)
        slot = np.full(counts.num_symbols, -1, dtype=np.int64)
        weight = _copy_grid_terms_numba(
            *window, table.key_means, bucket_of_recency, share, kappa, rho, *emission, *gates, *strengths, slot,
            pred, joint,
        )  # fmt: skip
    return GridTotals(float(weight), pred.reshape(g1, g2, g3), joint.reshape(g1, g2, g3))
