"""Held-out scores of a head: joint log-likelihood and next-target predictive quality, as additive totals.

``predict_proba`` materializes an (n, T) matrix; scoring a store needs only, per row, the predictive
probability of the true target and whether it is the arg-max. The compiled passes here compute both
with O(T) scratch memory, so a block of any size is scored without an (n, T) temporary. With a sparse
emission a row costs its symbols' stored pairs, not T: the backoff part of the mixture is one
number times the base, whose best target outside the row's stored pairs is found in the base's order.
Totals are additive over blocks and partitions, like the E-step statistics.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.kernels import per_position
from dist_respattn.model.kernels.log_weights import attention_of, exp_shifted, row_log_weights
from dist_respattn.model.scores import ScoreTotals

__all__ = [
    "base_order",
    "dense_mixture",
    "insert_ranked",
    "mixture_at",
    "score_rows",
    "top_k_scratch",
    "top_k_threshold",
]


@numba.njit(cache=True, nogil=True)
def _joint_log_likelihood(joint, best, scratch, bits):  # pragma: no cover - compiled
    """``log sum_i exp(joint[i])`` of a row's log-weights whose max is ``best``; ``-inf`` when every one is."""
    if best == -np.inf:
        return -np.inf
    return best + math.log(exp_shifted(joint, best, scratch, bits))


@numba.njit(cache=True, nogil=True)
def dense_mixture(context, row, n, attention, emission, probs):  # pragma: no cover - compiled
    """``probs = sum_i attention[i] emission[context[row, i]]`` over the first ``n`` positions (T,); returns its
    arg-max (the lowest id on ties)."""
    probs[:] = 0.0
    for i in range(n):
        a = attention[i]
        row_b = emission[context[row, i]]
        for k in range(probs.shape[0]):
            probs[k] += a * row_b[k]
    arg = 0
    for k in range(1, probs.shape[0]):
        if probs[k] > probs[arg]:
            arg = k
    return arg


@numba.njit(cache=True, nogil=True)
def _score_numba(
    context, query, target, weights, key_means, emission, log_prior, inv_two_sigma2, log_emission_ts, gate_const
):  # pragma: no cover - compiled
    """Returns ``(log_lik, target_log_prob, correct, weight)`` sums over the rows."""
    n_rows, n_pos = context.shape
    num_targets = emission.shape[1]
    gate = np.empty(n_pos)
    joint = np.empty(n_pos)
    attention = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    probs = np.empty(num_targets)
    y = np.empty(query.shape[1])
    total_ll = 0.0
    total_lp = 0.0
    total_correct = 0.0
    total_w = 0.0
    for row in range(n_rows):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        t = target[row]
        for i in range(n_pos):
            joint[i] = log_emission_ts[t, context[row, i]]
        best = row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, joint, gate)
        # Joint likelihood: logsumexp of the log-weights with the seen target's emission.
        row_ll = _joint_log_likelihood(joint, best, attention, bits) + gate_const
        # Prediction: attention from the gate alone.
        attention_of(gate, attention, bits)
        arg = dense_mixture(context, row, n_pos, attention, emission, probs)
        if w != 0.0:
            total_ll += w * row_ll
            total_lp += w * (math.log(probs[t]) if probs[t] > 0.0 else -np.inf)
            if arg == t:
                total_correct += w
        total_w += w
    return total_ll, total_lp, total_correct, total_w


@numba.njit(cache=True, nogil=True)
def mixture_at(context, row, attention, k, indptr, symbols, values, backoff, base):  # pragma: no cover
    """``sum_i attention[i] B[c_i, k]`` of a sparse emission: N lookups."""
    total = 0.0
    for i in range(context.shape[1]):
        c = context[row, i]
        p = per_position.find_pair(indptr, symbols, k, c)
        total += attention[i] * (values[p] if p >= 0 else backoff[c] * base[k])
    return total


@numba.njit(cache=True, nogil=True)
def _ranks_before(value, target, other_value, other_target):  # pragma: no cover - compiled
    """Whether ``(value, target)`` comes first: higher probability, then the lower id (``predict_proba``'s
    stable sort)."""
    return value > other_value or (value == other_value and target < other_target)


@numba.njit(cache=True, nogil=True)
def insert_ranked(target, value, top_targets, top_values, count):  # pragma: no cover - compiled
    """Insert ``target`` into the ``count`` best met so far (best first, at most ``len(top_targets)``);
    returns the new count. A target already held is not added again."""
    cap = top_targets.shape[0]
    if count == cap and not _ranks_before(value, target, top_values[cap - 1], top_targets[cap - 1]):
        return count
    for j in range(count):
        if top_targets[j] == target:
            return count
    j = count if count < cap else cap - 1
    while j > 0 and _ranks_before(value, target, top_values[j - 1], top_targets[j - 1]):
        top_values[j] = top_values[j - 1]
        top_targets[j] = top_targets[j - 1]
        j -= 1
    top_values[j] = value
    top_targets[j] = target
    return min(count + 1, cap)


@numba.njit(cache=True, nogil=True)
def top_k_scratch(num_targets):  # pragma: no cover - compiled
    """Scratch of :func:`top_k_threshold` for T = ``num_targets``, made once per block and left clean by every
    row: ``(scores (T,), seen (T,) all False, touched (T,))``."""
    return np.zeros(num_targets), np.zeros(num_targets, dtype=np.bool_), np.empty(num_targets, dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _top_k_scan(
    context, row, attention, backoff, base, ranked_indptr, ranked_targets, ranked_values, base_order, top_targets,
    top_values, scores, seen, touched,
):  # pragma: no cover - compiled  # fmt: skip
    """The top K of one row from every stored pair of its symbols once, then the first targets in base order
    stored for none: ``(count, work)``, work being pairs plus base entries visited, at most row + K + row."""
    n_pos = context.shape[1]
    cap = top_targets.shape[0]
    # The backoff part is one number times the base (as predict_proba computes it); each stored pair adds
    # its excess over the backoff.
    scale = 0.0
    for i in range(n_pos):
        scale += attention[i] * backoff[context[row, i]]
    n_touched = 0
    work = 0
    for i in range(n_pos):
        c = context[row, i]
        a = attention[i]
        off = backoff[c]
        for at in range(ranked_indptr[c], ranked_indptr[c + 1]):
            k = ranked_targets[at]
            if not seen[k]:
                seen[k] = True
                scores[k] = scale * base[k]
                touched[n_touched] = k
                n_touched += 1
            scores[k] += a * (ranked_values[at] - off * base[k])
        work += ranked_indptr[c + 1] - ranked_indptr[c]
    count = 0
    for j in range(n_touched):
        k = touched[j]
        count = insert_ranked(k, scores[k], top_targets, top_values, count)
    # The best of the rest are the first in base order stored for no position: each entry skipped is a
    # touched one, so this walk is at most K + row long.
    added = 0
    for j in range(base_order.shape[0]):
        if added == cap:
            break
        work += 1
        k = base_order[j]
        if not seen[k]:
            count = insert_ranked(k, scale * base[k], top_targets, top_values, count)
            added += 1
    for j in range(n_touched):
        seen[touched[j]] = False
    return count, work


@numba.njit(cache=True, nogil=True)
def top_k_threshold(
    context,
    row,
    attention,
    indptr,
    symbols,
    values,
    backoff,
    base,
    ranked_indptr,
    ranked_targets,
    ranked_values,
    base_order,
    top_targets,
    top_values,
    scores,
    seen,
    touched,
):  # pragma: no cover - compiled
    """The K = ``len(top_targets)`` targets of highest ``sum_i a_i B[c_i, k]`` (lowest id first on ties), exactly,
    in O(K + row) work, row being the stored pairs of the row's symbols; they and their probabilities are
    written best first. Returns ``(count, work)``: work counts the stored entries and base entries visited,
    a mixture's lookup of all N positions counting N. ``scores``, ``seen``, ``touched``: :func:`top_k_scratch`.

    Fagin's threshold algorithm first, over the positions' symbols, each with its stored targets by decreasing
    probability: at depth d a target not yet met has, at position i, at most the d-th probability of
    its list or the backoff ``backoff[c] max(base)`` when it is not in the list; once the K-th best score
    met beats that bound, no other target can. It usually stops after a few entries (K = 1 above all), but
    when the K-th best is a target stored for no position its score never beats the bound (the backoff
    floor), and a full walk would cost N lookups per entry. So it gets the row's worth of lookups; past
    that, one pass over the row's stored pairs (:func:`_top_k_scan`) scores every stored target at once.
    """
    n_pos = context.shape[1]
    cap = top_targets.shape[0]
    max_base = base[base_order[0]]
    row_pairs = 0
    for i in range(n_pos):
        c = context[row, i]
        row_pairs += ranked_indptr[c + 1] - ranked_indptr[c]
    count = 0
    depth = 0
    work = 0
    while True:
        if n_pos > 1 and work + n_pos * n_pos > row_pairs:
            # Cheaper to score every stored pair once than to go on looking up N positions per entry.
            count, scanned = _top_k_scan(
                context, row, attention, backoff, base, ranked_indptr, ranked_targets, ranked_values, base_order,
                top_targets, top_values, scores, seen, touched,
            )  # fmt: skip
            return count, work + scanned
        bound = 0.0
        left = False
        for i in range(n_pos):
            c = context[row, i]
            at = ranked_indptr[c] + depth
            off = backoff[c] * max_base
            if at < ranked_indptr[c + 1]:
                left = True
                bound += attention[i] * max(ranked_values[at], off)
                k = ranked_targets[at]
                v = mixture_at(context, row, attention, k, indptr, symbols, values, backoff, base)
                work += n_pos
                count = insert_ranked(k, v, top_targets, top_values, count)
            else:
                bound += attention[i] * off
        if count == cap and top_values[cap - 1] > bound:
            return count, work
        if not left:
            break
        depth += 1
    # Every stored target was scored (one position, or none); the best of the rest are the first in base order
    # stored for no position.
    added = 0
    for j in range(base_order.shape[0]):
        if added == cap:
            break
        k = base_order[j]
        stored = False
        work += n_pos
        for i in range(n_pos):
            if per_position.find_pair(indptr, symbols, k, context[row, i]) >= 0:
                stored = True
                break
        if not stored:
            v = mixture_at(context, row, attention, k, indptr, symbols, values, backoff, base)
            count = insert_ranked(k, v, top_targets, top_values, count)
            added += 1
    return count, work


@numba.njit(cache=True, nogil=True)
def _score_sparse_numba(
    context,
    query,
    target,
    weights,
    key_means,
    log_prior,
    inv_two_sigma2,
    gate_const,
    indptr,
    symbols,
    values,
    backoff,
    base,
    ranked_indptr,
    ranked_targets,
    ranked_values,
    base_order,
):  # pragma: no cover - compiled
    """``_score_numba`` for a sparse emission: ``(log_lik, target_log_prob, correct, weight)``.

    ``ranked_*`` are each symbol's stored targets by decreasing probability (the arg-max's threshold
    search, :func:`top_k_threshold` with K = 1, walks them); ``base_order`` the targets by decreasing base (stable).
    """
    n_rows, n_pos = context.shape
    gate = np.empty(n_pos)
    joint = np.empty(n_pos)
    attention = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    top_target = np.empty(1, dtype=np.int64)
    top_value = np.empty(1)
    scores, seen, touched = top_k_scratch(base.shape[0])
    y = np.empty(query.shape[1])
    total_ll = 0.0
    total_lp = 0.0
    total_correct = 0.0
    total_w = 0.0
    for row in range(n_rows):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        t = target[row]
        for i in range(n_pos):
            c = context[row, i]
            p = per_position.find_pair(indptr, symbols, t, c)
            b = values[p] if p >= 0 else backoff[c] * base[t]
            joint[i] = math.log(b) if b > 0.0 else -np.inf
        best = row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, joint, gate)
        # Joint likelihood: logsumexp of the log-weights with the seen target's emission.
        row_ll = _joint_log_likelihood(joint, best, attention, bits) + gate_const
        # Prediction: attention from the gate alone.
        attention_of(gate, attention, bits)
        prob_t = mixture_at(context, row, attention, t, indptr, symbols, values, backoff, base)
        top_k_threshold(
            context, row, attention, indptr, symbols, values, backoff, base, ranked_indptr, ranked_targets,
            ranked_values, base_order, top_target, top_value, scores, seen, touched,
        )  # fmt: skip
        arg = top_target[0]
        if w != 0.0:
            total_ll += w * row_ll
            total_lp += w * (math.log(prob_t) if prob_t > 0.0 else -np.inf)
            if arg == t:
                total_correct += w
        total_w += w
    return total_ll, total_lp, total_correct, total_w


def score_rows(
    model: ResponsibilityAttentionDistribution,
    x: tuple[Any, Any, Any],
    weights: Any = None,
) -> ScoreTotals:
    """Score an encoded batch ``(context (n, N), query (n, D), target (n,))`` with weights (n,) or ``None``.

    The predictive part does not see the target: it scores ``predict_proba(context, query)[target]``
    and whether that target is the arg-max. Bad ids or non-finite values raise naming the row.
    """
    context, query, target, w = model.check_batch(x, weights)
    query = np.ascontiguousarray(query, dtype=np.float64)  # float32 queries widened (exactly): one build for both
    params = model.kernel_parameters
    kernel_weights = np.zeros(0) if w is None else w.astype(np.float64, copy=False)
    table = model.emission_table
    if isinstance(table, SparseEmission):
        ranked_indptr, ranked_targets, ranked_values = table.ranked_rows
        log_lik, target_log_prob, correct, weight = _score_sparse_numba(
            context, query, target, kernel_weights, params.key_means, params.log_prior, params.inv_two_sigma2,
            params.gate_const, table.support.indptr, table.support.symbols, table.values, table.backoff, table.base,
            ranked_indptr, ranked_targets, ranked_values, base_order(table),
        )  # fmt: skip
        return ScoreTotals(float(weight), float(log_lik), float(target_log_prob), float(correct))
    assert isinstance(params, per_position.KernelParameters)
    log_lik, target_log_prob, correct, weight = _score_numba(
        context,
        query,
        target,
        kernel_weights,
        params.key_means,
        table.to_dense(),
        params.log_prior,
        params.inv_two_sigma2,
        params.log_emission_ts,
        params.gate_const,
    )
    return ScoreTotals(float(weight), float(log_lik), float(target_log_prob), float(correct))


def base_order(table: SparseEmission) -> np.ndarray:
    """Targets by decreasing base, lowest id first among equals (the arg-max's tie rule)."""
    return np.argsort(-table.base, kind="stable")
