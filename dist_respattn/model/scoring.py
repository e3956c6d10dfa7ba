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
from dataclasses import asdict, dataclass
from typing import Any

import numba
import numpy as np

from dist_respattn.model import kernels
from dist_respattn.model._checks import as_encoded, as_weights
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.emission import SparseEmission

__all__ = ["ScoreTotals", "score_rows"]


@dataclass(frozen=True)
class ScoreTotals:
    """Weighted totals over scored rows (add two with ``+``).

    Attributes:
        weight: sum of row weights (the row count for unweighted rows).
        log_lik: sum of ``w log p(query, target | context)``, the joint likelihood EM maximizes.
        target_log_prob: sum of ``w log p(target | context, query)``, the predictive likelihood.
        correct: sum of ``w`` over rows whose target is the arg-max of ``predict_proba`` (first on ties).
    """

    weight: float = 0.0
    log_lik: float = 0.0
    target_log_prob: float = 0.0
    correct: float = 0.0

    def __add__(self, other: ScoreTotals) -> ScoreTotals:
        return ScoreTotals(
            self.weight + other.weight,
            self.log_lik + other.log_lik,
            self.target_log_prob + other.target_log_prob,
            self.correct + other.correct,
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """Means per unit weight: ``mean_log_likelihood``, ``target_log_prob``, ``perplexity``, ``accuracy``."""
        if self.weight <= 0.0:
            nan = float("nan")
            return {"mean_log_likelihood": nan, "target_log_prob": nan, "perplexity": nan, "accuracy": nan}
        mean_target = self.target_log_prob / self.weight
        return {
            "mean_log_likelihood": self.log_lik / self.weight,
            "target_log_prob": mean_target,
            "perplexity": math.exp(-mean_target) if mean_target > -700.0 else float("inf"),
            "accuracy": self.correct / self.weight,
        }


@numba.njit(cache=True, nogil=True)
def _row_gate(context, row, y, key_means, log_prior, inv_two_sigma2, gate):  # pragma: no cover - compiled
    """``gate[i] = log pi_i - ||y - K[c_i]||^2 / (2 sigma2)`` for one row; returns its max."""
    best = -np.inf
    for i in range(context.shape[1]):
        c = context[row, i]
        sq = 0.0
        for d in range(y.shape[0]):
            diff = y[d] - key_means[c, d]
            sq += diff * diff
        g = log_prior[i] - sq * inv_two_sigma2
        gate[i] = g
        best = max(best, g)
    return best


@numba.njit(cache=True, nogil=True)
def _log_sum_exp(values):  # pragma: no cover - compiled
    """``log sum exp(values)``; ``-inf`` when every value is ``-inf``."""
    best = -np.inf
    for i in range(values.shape[0]):
        best = max(best, values[i])
    if best == -np.inf:
        return -np.inf
    acc = 0.0
    for i in range(values.shape[0]):
        acc += math.exp(values[i] - best)
    return best + math.log(acc)


@numba.njit(cache=True, nogil=True)
def _exp_gate(gate, best):  # pragma: no cover - compiled
    """``gate = exp(gate - best)`` in place; returns the sum (the attention is ``gate / sum``)."""
    norm = 0.0
    for i in range(gate.shape[0]):
        gate[i] = math.exp(gate[i] - best)
        norm += gate[i]
    return norm


@numba.njit(cache=True, nogil=True)
def _score_numba(
    context, query, target, weights, key_means, emission, log_prior, inv_two_sigma2, log_emission_ts, gate_const
):  # pragma: no cover - compiled
    """Returns ``(log_lik, target_log_prob, correct, weight)`` sums over the rows."""
    n_rows, n_pos = context.shape
    num_targets = emission.shape[1]
    gate = np.empty(n_pos)
    joint = np.empty(n_pos)
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
        best_gate = _row_gate(context, row, y, key_means, log_prior, inv_two_sigma2, gate)
        for i in range(n_pos):
            joint[i] = gate[i] + log_emission_ts[t, context[row, i]]
        # Joint likelihood: logsumexp of the gate plus the emission of the seen target.
        row_ll = _log_sum_exp(joint) + gate_const
        # Prediction: attention from the gate alone.
        norm = _exp_gate(gate, best_gate)
        probs[:] = 0.0
        for i in range(n_pos):
            a = gate[i] / norm
            row_b = emission[context[row, i]]
            for k in range(num_targets):
                probs[k] += a * row_b[k]
        arg = 0
        for k in range(1, num_targets):
            if probs[k] > probs[arg]:
                arg = k
        if w != 0.0:
            total_ll += w * row_ll
            total_lp += w * (math.log(probs[t]) if probs[t] > 0.0 else -np.inf)
            if arg == t:
                total_correct += w
        total_w += w
    return total_ll, total_lp, total_correct, total_w


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
    sym_indptr,
    sym_targets,
    sym_excess,
    base_order,
):  # pragma: no cover - compiled
    """``_score_numba`` for a sparse emission: ``(log_lik, target_log_prob, correct, weight)``.

    ``sym_*`` are the emission's symbol-major rows (targets and their excess over the backoff part);
    ``base_order`` the targets by decreasing base (stable), for the best target no stored pair touches.
    """
    n_rows, n_pos = context.shape
    num_targets = base.shape[0]
    gate = np.empty(n_pos)
    joint = np.empty(n_pos)
    scratch = np.zeros(num_targets)
    touched = np.zeros(num_targets, dtype=np.bool_)
    touched_list = np.empty(num_targets, dtype=np.int64)
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
        best_gate = _row_gate(context, row, y, key_means, log_prior, inv_two_sigma2, gate)
        for i in range(n_pos):
            c = context[row, i]
            p = kernels._find_pair(indptr, symbols, t, c)
            b = values[p] if p >= 0 else backoff[c] * base[t]
            joint[i] = gate[i] + (math.log(b) if b > 0.0 else -np.inf)
        # Joint likelihood: logsumexp of the gate plus the emission of the seen target.
        row_ll = _log_sum_exp(joint) + gate_const
        # Prediction: attention from the gate alone.
        norm = _exp_gate(gate, best_gate)
        # p(k) = A base[k] + scratch[k]: A the attention-weighted backoff, scratch the stored pairs' excess.
        scale = 0.0
        n_touched = 0
        for i in range(n_pos):
            a = gate[i] / norm
            c = context[row, i]
            scale += a * backoff[c]
            for j in range(sym_indptr[c], sym_indptr[c + 1]):
                k = sym_targets[j]
                if not touched[k]:
                    touched[k] = True
                    touched_list[n_touched] = k
                    n_touched += 1
                scratch[k] += a * sym_excess[j]
        prob_t = scale * base[t] + scratch[t]
        arg = -1
        best = -np.inf
        for j in range(n_touched):
            k = touched_list[j]
            v = scale * base[k] + scratch[k]
            if v > best or (v == best and k < arg):
                best, arg = v, k
        for j in range(num_targets):  # the untouched target of highest base (lowest id on ties)
            k = base_order[j]
            if not touched[k]:
                v = scale * base[k]
                if v > best or (v == best and k < arg):
                    best, arg = v, k
                break
        for j in range(n_touched):
            k = touched_list[j]
            touched[k] = False
            scratch[k] = 0.0
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
    context, query, target = as_encoded(x, context_length=model.context_length, query_dim=model.query_dim)
    w = as_weights(weights, context.shape[0])
    kernels.scan_values(context, query, target, w, num_symbols=model.num_symbols, num_targets=model.num_targets)
    params = model.kernel_parameters
    kernel_weights = np.zeros(0) if w is None else w.astype(np.float64, copy=False)
    table = model.emission_table
    if isinstance(table, SparseEmission):
        sym_indptr, sym_targets, sym_excess = table.symbol_rows
        log_lik, target_log_prob, correct, weight = _score_sparse_numba(
            context, query, target, kernel_weights, params.key_means, params.log_prior, params.inv_two_sigma2,
            params.gate_const, table.support.indptr, table.support.symbols, table.values, table.backoff, table.base,
            sym_indptr, sym_targets, sym_excess, _base_order(table),
        )  # fmt: skip
        return ScoreTotals(float(weight), float(log_lik), float(target_log_prob), float(correct))
    assert isinstance(params, kernels.KernelParameters)
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


def _base_order(table: SparseEmission) -> np.ndarray:
    """Targets by decreasing base, lowest id first among equals (the arg-max's tie rule)."""
    return np.argsort(-table.base, kind="stable")
