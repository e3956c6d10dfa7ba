"""What scoring and ranking a store's rows give, for a head of any kind: additive totals and top-K predictions."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["PredictionTotals", "ScoreTotals", "TopK"]


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


@dataclass(frozen=True)
class TopK:
    """Predictions of ``n`` rows.

    Attributes:
        targets: (n, K) int32, each row's K most probable targets, best first (lower id first on ties).
        probabilities: (n, K) float64, ``p(target | context, query)`` of those targets.
        attention: (n, N) float64, the predictive attention ``a_i ∝ pi_i N(query; K[c_i], sigma2 I)``.
    """

    targets: np.ndarray
    probabilities: np.ndarray
    attention: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.targets.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.targets.shape[1])


@dataclass(frozen=True)
class PredictionTotals:
    """Weighted totals of predicted rows whose targets are known (add two with ``+``).

    Attributes:
        rows: rows predicted; ``weight``: their total weight (the row count for unweighted rows).
        top1: weight of the rows whose target is the first prediction; ``top_k``: of those whose target is
            among the K.
    """

    rows: int = 0
    weight: float = 0.0
    top1: float = 0.0
    top_k: float = 0.0

    def __add__(self, other: PredictionTotals) -> PredictionTotals:
        return PredictionTotals(
            self.rows + other.rows, self.weight + other.weight, self.top1 + other.top1, self.top_k + other.top_k
        )

    @classmethod
    def of(cls, top: TopK, target: np.ndarray, weights: np.ndarray | None) -> PredictionTotals:
        """The totals of one block: ``top`` predicted for rows whose targets are ``target`` (n,)."""
        w = np.ones(top.num_rows) if weights is None else np.asarray(weights, dtype=np.float64)
        hit = top.targets == np.asarray(target)[:, None]
        return cls(top.num_rows, float(w.sum()), float(w[hit[:, 0]].sum()), float(w[hit.any(axis=1)].sum()))
