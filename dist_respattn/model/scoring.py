"""Held-out scores of a head: joint log-likelihood and next-target predictive quality, as additive totals.

``predict_proba`` materializes an (n, T) matrix; scoring a store needs only, per row, the predictive
probability of the true target and whether it is the arg-max. The compiled pass here computes both
with O(T) scratch memory per row, so a block of any size is scored without an (n, T) temporary.
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
        best_gate = -np.inf
        for i in range(n_pos):
            c = context[row, i]
            sq = 0.0
            for d in range(y.shape[0]):
                diff = y[d] - key_means[c, d]
                sq += diff * diff
            g = log_prior[i] - sq * inv_two_sigma2
            gate[i] = g
            joint[i] = g + log_emission_ts[t, c]
            best_gate = max(best_gate, g)
        # Joint likelihood: logsumexp of the gate plus the emission of the seen target.
        best_joint = -np.inf
        for i in range(n_pos):
            best_joint = max(best_joint, joint[i])
        if best_joint == -np.inf:
            row_ll = -np.inf
        else:
            s = 0.0
            for i in range(n_pos):
                s += math.exp(joint[i] - best_joint)
            row_ll = best_joint + math.log(s) + gate_const
        # Prediction: attention from the gate alone, then the mixture of emission rows.
        norm = 0.0
        for i in range(n_pos):
            gate[i] = math.exp(gate[i] - best_gate)
            norm += gate[i]
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
    log_lik, target_log_prob, correct, weight = _score_numba(
        context,
        query,
        target,
        np.zeros(0) if w is None else w.astype(np.float64, copy=False),
        params.key_means,
        model.emission,
        params.log_prior,
        params.inv_two_sigma2,
        params.log_emission_ts,
        params.gate_const,
    )
    return ScoreTotals(float(weight), float(log_lik), float(target_log_prob), float(correct))
