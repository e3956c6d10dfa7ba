"""Compiled per-row passes of a mixture of single-hop heads: scores and top-K without an (n, T) matrix.

For a row ``(context c, query y)`` each component ``k`` gives its predictive attention ``a_k`` (N,) and its query
density ``q_k = p_k(y | c) = sum_i pi_ki N(y; K_k[c_i], sigma2_k I)``; the mixture weighs them by
``w_k ∝ pi_k q_k`` (the gate's posterior given the query, the target unseen) and predicts
``p(t | c, y) = sum_k w_k sum_i a_ki B_k[c_i, t]``. Its joint density is ``sum_k pi_k q_k p_k(t | c, y)``.

The components' parameters are stacked (:class:`StackedComponents`): keys (K, S, D), log priors (K, N) and either
dense emissions (K, S, T) or every component's sparse emission by symbol (its stored targets and what they add to
the row's backoff part ``backoff[s] base[t]``). A row costs O(K N D) for the gates and O(T) scratch for its mixture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from dist_respattn.model.emission.layouts import DenseEmission, SparseEmission
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.scoring import insert_ranked
from dist_respattn.model.kernels.log_weights import exp_shifted, row_log_weights

__all__ = ["StackedComponents", "mixture_query_log_density", "mixture_score", "mixture_top_k"]


@dataclass(frozen=True)
class StackedComponents:
    """K single-hop heads' parameters in the layout the compiled passes read (built once per mixture head).

    Attributes:
        log_gate: (K,) ``log pi_k``.
        key_means: (K, S, D); ``log_prior``: (K, N); ``inv_two_sigma2``, ``gate_const``: (K,).
        dense: whether every emission is dense (then ``emission`` is (K, S, T), else (K, 0, 0)).
        sym_indptr: (K, S + 1) int64 into ``sym_targets``/``sym_excess`` (sparse: each component's stored pairs by
            symbol, offset by the components before it); ``backoff`` (K, S) and ``base`` (K, T). Empty when dense.
    """

    log_gate: np.ndarray
    key_means: np.ndarray
    log_prior: np.ndarray
    inv_two_sigma2: np.ndarray
    gate_const: np.ndarray
    dense: bool
    emission: np.ndarray
    sym_indptr: np.ndarray
    sym_targets: np.ndarray
    sym_excess: np.ndarray
    backoff: np.ndarray
    base: np.ndarray

    @classmethod
    def of(cls, gate: np.ndarray, components: tuple[ResponsibilityAttentionDistribution, ...]) -> StackedComponents:
        """The stacked parameters of ``components`` under the gate ``gate`` (K,)."""
        k = len(components)
        first = components[0]
        s, t = first.num_symbols, first.num_targets
        with np.errstate(divide="ignore"):
            log_gate = np.log(np.asarray(gate, dtype=np.float64))
            log_prior = np.stack([np.log(c.position_prior) for c in components])
        dense = all(isinstance(c.emission_table, DenseEmission) for c in components)
        if dense:
            emission = np.stack([c.emission_table.to_dense() for c in components])
            sym_indptr = np.zeros((k, s + 1), dtype=np.int64)
            sym_targets, sym_excess = np.zeros(0, dtype=np.int64), np.zeros(0)
            backoff, base = np.zeros((k, s)), np.zeros((k, t))
        else:
            # A dense component among sparse ones is read as sparse over every pair (its backoff is then unused).
            emission = np.zeros((k, 0, 0))
            indptrs, targets, excesses, backoffs, bases = [], [], [], [], []
            offset = 0
            for c in components:
                table = c.emission_table
                if not isinstance(table, SparseEmission):
                    probs = table.to_dense()
                    indptr = np.arange(0, s * t + 1, t, dtype=np.int64)
                    target, excess = np.tile(np.arange(t, dtype=np.int64), s), probs.reshape(-1)
                    backoffs.append(np.zeros(s))
                    bases.append(np.zeros(t))
                else:
                    indptr, target, excess = table.symbol_rows
                    backoffs.append(table.backoff)
                    bases.append(table.base)
                indptrs.append(np.asarray(indptr, dtype=np.int64) + offset)
                targets.append(np.asarray(target, dtype=np.int64))
                excesses.append(np.asarray(excess, dtype=np.float64))
                offset += int(indptr[-1])
            sym_indptr = np.stack(indptrs)
            sym_targets, sym_excess = np.concatenate(targets), np.concatenate(excesses)
            backoff, base = np.stack(backoffs), np.stack(bases)
        return cls(
            log_gate=log_gate,
            key_means=np.ascontiguousarray(np.stack([c.key_means for c in components]), dtype=np.float64),
            log_prior=np.ascontiguousarray(log_prior),
            inv_two_sigma2=np.array([0.5 / c.sigma2 for c in components]),
            gate_const=np.array([c.gate_const for c in components]),
            dense=dense,
            emission=np.ascontiguousarray(emission, dtype=np.float64),
            sym_indptr=sym_indptr,
            sym_targets=sym_targets,
            sym_excess=sym_excess,
            backoff=np.ascontiguousarray(backoff, dtype=np.float64),
            base=np.ascontiguousarray(base, dtype=np.float64),
        )

    def arguments(self) -> tuple[Any, ...]:
        """The arrays in the order the compiled passes take them."""
        return (
            self.log_gate, self.key_means, self.log_prior, self.inv_two_sigma2, self.gate_const, self.dense,
            self.emission, self.sym_indptr, self.sym_targets, self.sym_excess, self.backoff, self.base,
        )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _gates(
    context, row, y, log_gate, key_means, log_prior, inv_two_sigma2, gate_const, scratch, bits, attention, weight
):  # pragma: no cover - compiled
    """Each component's predictive attention ``attention[k]`` (N,) and the mixture weights ``weight[k] = w_k``;
    returns ``log sum_k pi_k q_k`` (``-inf`` when no component explains the query)."""
    n_comp = key_means.shape[0]
    best_all = -np.inf
    for k in range(n_comp):
        scratch[:] = 0.0
        best = row_log_weights(context, row, y, key_means[k], log_prior[k], inv_two_sigma2[k], scratch, scratch[:0])
        if best == -np.inf:
            attention[k, :] = 0.0
            weight[k] = -np.inf
            continue
        total = exp_shifted(scratch, best, attention[k], bits)
        for i in range(attention.shape[1]):
            attention[k, i] /= total
        weight[k] = log_gate[k] + best + math.log(total) + gate_const[k]
        best_all = max(best_all, weight[k])
    if best_all == -np.inf:
        weight[:] = 0.0
        return -np.inf
    total = 0.0
    for k in range(n_comp):
        weight[k] = math.exp(weight[k] - best_all) if weight[k] > -np.inf else 0.0
        total += weight[k]
    for k in range(n_comp):
        weight[k] /= total
    return best_all + math.log(total)


@numba.njit(cache=True, nogil=True)
def _component_prob(
    context, row, k, t, attention, dense, emission, sym_indptr, sym_targets, sym_excess, backoff, base
):  # pragma: no cover - compiled
    """``p_k(t | c, y) = sum_i a_ki B_k[c_i, t]`` (a sparse pair found by a binary search of the symbol's targets)."""
    total = 0.0
    for i in range(context.shape[1]):
        c = context[row, i]
        if dense:
            b = emission[k, c, t]
        else:
            b = backoff[k, c] * base[k, t]
            lo, hi = sym_indptr[k, c], sym_indptr[k, c + 1]
            while lo < hi:
                mid = (lo + hi) >> 1
                if sym_targets[mid] < t:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < sym_indptr[k, c + 1] and sym_targets[lo] == t:
                b += sym_excess[lo]
        total += attention[k, i] * b
    return total


@numba.njit(cache=True, nogil=True)
def _mixture_probs(
    context, row, attention, weight, dense, emission, sym_indptr, sym_targets, sym_excess, backoff, base, probs
):  # pragma: no cover - compiled
    """``probs = p(. | c, y) = sum_k w_k sum_i a_ki B_k[c_i, .]`` (T,); returns its arg-max (the lowest id on ties)."""
    probs[:] = 0.0
    for k in range(attention.shape[0]):
        w = weight[k]
        if w == 0.0:
            continue
        if dense:
            for i in range(context.shape[1]):
                a = w * attention[k, i]
                row_b = emission[k, context[row, i]]
                for t in range(probs.shape[0]):
                    probs[t] += a * row_b[t]
        else:
            # The backoff part is one number times the base; then each position's stored pairs add their excess.
            coefficient = 0.0
            for i in range(context.shape[1]):
                coefficient += w * attention[k, i] * backoff[k, context[row, i]]
            for t in range(probs.shape[0]):
                probs[t] += coefficient * base[k, t]
            for i in range(context.shape[1]):
                a = w * attention[k, i]
                c = context[row, i]
                for j in range(sym_indptr[k, c], sym_indptr[k, c + 1]):
                    probs[sym_targets[j]] += a * sym_excess[j]
    arg = 0
    for t in range(1, probs.shape[0]):
        if probs[t] > probs[arg]:
            arg = t
    return arg


@numba.njit(cache=True, nogil=True)
def _score(
    context, query, target, weights, num_targets, log_gate, key_means, log_prior, inv_two_sigma2, gate_const, dense,
    emission, sym_indptr, sym_targets, sym_excess, backoff, base,
):  # pragma: no cover - compiled  # fmt: skip
    n_rows, n_pos = context.shape
    n_comp = key_means.shape[0]
    scratch = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    attention = np.empty((n_comp, n_pos))
    weight = np.empty(n_comp)
    probs = np.empty(num_targets)
    y = np.empty(query.shape[1])
    total_ll = total_lp = total_correct = total_w = 0.0
    for row in range(n_rows):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        total_w += w
        if w == 0.0:
            continue
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        t = target[row]
        log_query = _gates(
            context, row, y, log_gate, key_means, log_prior, inv_two_sigma2, gate_const, scratch, bits, attention,
            weight,
        )  # fmt: skip
        arg = _mixture_probs(
            context, row, attention, weight, dense, emission, sym_indptr, sym_targets, sym_excess, backoff, base, probs
        )
        # p(y, t | c) = p(y | c) p(t | c, y): the mixture's query density times its predictive probability.
        p_t = probs[t]
        row_ll = log_query + math.log(p_t) if p_t > 0.0 and log_query > -np.inf else -np.inf
        total_ll += w * row_ll
        total_lp += w * (math.log(p_t) if p_t > 0.0 else -np.inf)
        if arg == t:
            total_correct += w
    return total_ll, total_lp, total_correct, total_w


@numba.njit(cache=True, nogil=True)
def _top_k(
    context, query, num_targets, log_gate, key_means, log_prior, inv_two_sigma2, gate_const, dense, emission,
    sym_indptr, sym_targets, sym_excess, backoff, base, top_targets, top_values, mixed_attention,
):  # pragma: no cover - compiled  # fmt: skip
    n_rows, n_pos = context.shape
    n_comp = key_means.shape[0]
    scratch = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    attention = np.empty((n_comp, n_pos))
    weight = np.empty(n_comp)
    probs = np.empty(num_targets)
    y = np.empty(query.shape[1])
    for row in range(n_rows):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        _gates(
            context, row, y, log_gate, key_means, log_prior, inv_two_sigma2, gate_const, scratch, bits, attention,
            weight,
        )  # fmt: skip
        _mixture_probs(
            context, row, attention, weight, dense, emission, sym_indptr, sym_targets, sym_excess, backoff, base, probs
        )
        for i in range(n_pos):
            total = 0.0
            for k in range(n_comp):
                total += weight[k] * attention[k, i]
            mixed_attention[row, i] = total
        count = 0
        for t in range(num_targets):
            count = insert_ranked(t, probs[t], top_targets[row], top_values[row], count)


@numba.njit(cache=True, nogil=True)
def _query_log_density(
    context, query, log_gate, key_means, log_prior, inv_two_sigma2, gate_const, out
):  # pragma: no cover - compiled
    n_rows, n_pos = context.shape
    n_comp = key_means.shape[0]
    scratch = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    attention = np.empty((n_comp, n_pos))
    weight = np.empty(n_comp)
    y = np.empty(query.shape[1])
    for row in range(n_rows):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        out[row] = _gates(
            context, row, y, log_gate, key_means, log_prior, inv_two_sigma2, gate_const, scratch, bits, attention,
            weight,
        )  # fmt: skip


def mixture_score(
    stacked: StackedComponents,
    num_targets: int,
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    weights: np.ndarray | None,
) -> tuple[float, float, float, float]:
    """``(log_lik, target_log_prob, correct, weight)`` sums over checked rows (``weights`` (n,) or ``None``: 1 each)."""
    kernel_weights = np.zeros(0) if weights is None else np.asarray(weights, dtype=np.float64)
    query = np.ascontiguousarray(query, dtype=np.float64)  # float32 queries widened (exactly): one build for both
    ll, lp, correct, weight = _score(context, query, target, kernel_weights, num_targets, *stacked.arguments())
    return float(ll), float(lp), float(correct), float(weight)


def mixture_top_k(
    stacked: StackedComponents, num_targets: int, context: np.ndarray, query: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(targets (n, k) int64, probabilities (n, k), attention (n, N))`` of checked rows, best first, lower id first
    on ties (``k`` at most T)."""
    n_rows = context.shape[0]
    targets = np.empty((n_rows, k), dtype=np.int64)
    probabilities = np.empty((n_rows, k))
    attention = np.empty(context.shape, dtype=np.float64)
    s = stacked
    _top_k(
        context, query, num_targets, s.log_gate, s.key_means, s.log_prior, s.inv_two_sigma2, s.gate_const, s.dense,
        s.emission, s.sym_indptr, s.sym_targets, s.sym_excess, s.backoff, s.base, targets, probabilities, attention,
    )  # fmt: skip
    return targets, probabilities, attention


def mixture_query_log_density(stacked: StackedComponents, context: np.ndarray, query: np.ndarray) -> np.ndarray:
    """(n,) ``log p(y | c) = log sum_k pi_k p_k(y | c)`` of checked rows."""
    out = np.empty(context.shape[0])
    s = stacked
    _query_log_density(context, query, s.log_gate, s.key_means, s.log_prior, s.inv_two_sigma2, s.gate_const, out)
    return out
