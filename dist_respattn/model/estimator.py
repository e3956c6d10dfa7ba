"""The closed-form M-step of the responsibility-attention head."""

from __future__ import annotations

from typing import Any

import numpy as np

from dist_respattn.model import kernels
from dist_respattn.model._checks import as_nonnegative_float, as_positive_float, as_positive_int
from dist_respattn.model.accumulator import (
    ResponsibilityAttentionAccumulatorFactory,
    SufficientStatistics,
)
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution

__all__ = ["ResponsibilityAttentionEstimator", "estimate_parameters"]


def estimate_parameters(
    stats: SufficientStatistics,
    *,
    sigma2: float,
    estimate_sigma2: bool,
    min_sigma2: float,
    emission_smoothing: float,
    pseudo_count: float | None,
    previous_key_means: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The M-step on arrays: ``(key_means (S, D), emission (S, T), position_prior (N,), sigma2)``.

    - ``K[s] = key_sum[s] / key_mass[s]``. A symbol with zero mass keeps ``previous_key_means[s]``
      when given, else takes the pooled mean query ``sum_s key_sum[s] / sum_s key_mass[s]`` (zeros
      when there is no mass at all): a defined key, never NaN.
    - ``B[s, t] = (emission_count[s, t] + a) / (sum_t emission_count[s, t] + T a)`` with
      ``a = emission_smoothing``; a row with no mass and ``a = 0`` is uniform.
    - ``pi_i ∝ position_count[i] + pseudo_count / N`` (a symmetric Dirichlet prior of total strength
      ``pseudo_count``; none when ``None``); uniform when there is no mass.
    - With ``estimate_sigma2``: ``sigma2 = max(min_sigma2, (query_sq - sum_s ||key_sum[s]||^2 / key_mass[s])
      / (D sum_s key_mass[s]))``, the pooled within-symbol variance; otherwise ``sigma2`` is kept.
    """
    query_dim = stats.key_sum.shape[1]
    context_length = stats.position_count.shape[0]
    mass = stats.key_mass
    live = mass > 0.0
    key_means = np.empty_like(stats.key_sum)
    key_means[live] = stats.key_sum[live] / mass[live, None]
    if not live.all():
        if previous_key_means is not None:
            key_means[~live] = previous_key_means[~live]
        else:
            total_mass = float(mass.sum())
            pooled = stats.key_sum.sum(axis=0) / total_mass if total_mass > 0.0 else np.zeros(query_dim)
            key_means[~live] = pooled

    counts = stats.emission_count + emission_smoothing
    row_total = counts.sum(axis=1, keepdims=True)
    empty_rows = row_total[:, 0] <= 0.0
    row_total[empty_rows] = 1.0
    emission = counts / row_total
    emission[empty_rows] = 1.0 / emission.shape[1]

    prior_counts = stats.position_count + (0.0 if pseudo_count is None else pseudo_count / context_length)
    prior_total = float(prior_counts.sum())
    position_prior = prior_counts / prior_total if prior_total > 0.0 else np.full(context_length, 1.0 / context_length)

    new_sigma2 = sigma2
    if estimate_sigma2:
        total_mass = float(mass[live].sum())
        if total_mass > 0.0:
            explained = float(np.sum(np.einsum("sd,sd->s", stats.key_sum[live], stats.key_sum[live]) / mass[live]))
            new_sigma2 = max(min_sigma2, (stats.query_sq - explained) / (query_dim * total_mass))
    return key_means, emission, position_prior, new_sigma2


class ResponsibilityAttentionEstimator:
    """Estimates a :class:`ResponsibilityAttentionDistribution` by closed-form EM M-steps.

    Args:
        num_symbols, context_length, query_dim, num_targets: S, N, D, T.
        sigma2: the gate variance when ``estimate_sigma2`` is False (kept fixed); unused otherwise
            except as the value kept when the statistics carry no mass.
        estimate_sigma2: learn the shared isotropic gate variance (see :func:`estimate_parameters`).
        min_sigma2: floor of the learned variance, against collapse onto single points.
        emission_smoothing: additive smoothing of the emission counts (>= 0).
        pseudo_count: strength of a symmetric Dirichlet prior on the position prior (>= 0), or None.
            (The reference library accepts and ignores it.)
        name: name given to the estimated distributions.
        keys: tie name handed to the accumulators (see ``ResponsibilityAttentionAccumulator``).
    """

    def __init__(
        self,
        num_symbols: int,
        context_length: int,
        query_dim: int,
        num_targets: int,
        *,
        sigma2: float = 1.0,
        estimate_sigma2: bool = False,
        min_sigma2: float = 1e-6,
        emission_smoothing: float = 1e-6,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None:
        if not isinstance(estimate_sigma2, (bool, np.bool_)):
            raise TypeError(f"estimate_sigma2 = {estimate_sigma2!r}: expected True or False")
        self.num_symbols = as_positive_int(num_symbols, "num_symbols")
        self.context_length = as_positive_int(context_length, "context_length")
        self.query_dim = as_positive_int(query_dim, "query_dim")
        self.num_targets = as_positive_int(num_targets, "num_targets")
        self.sigma2 = as_positive_float(sigma2, "sigma2")
        self.estimate_sigma2 = bool(estimate_sigma2)
        self.min_sigma2 = as_positive_float(min_sigma2, "min_sigma2")
        self.emission_smoothing = as_nonnegative_float(emission_smoothing, "emission_smoothing")
        self.pseudo_count = None if pseudo_count is None else as_nonnegative_float(pseudo_count, "pseudo_count")
        self.name = name
        self.keys = keys

    def __repr__(self) -> str:
        return (
            f"ResponsibilityAttentionEstimator(S={self.num_symbols}, N={self.context_length}, D={self.query_dim}, "
            f"T={self.num_targets}, sigma2={self.sigma2!r}, estimate_sigma2={self.estimate_sigma2})"
        )

    def accumulator_factory(self, *, backend: kernels.Backend = "numba") -> ResponsibilityAttentionAccumulatorFactory:
        """A factory of empty accumulators for this estimator's shape and tie name."""
        return ResponsibilityAttentionAccumulatorFactory(
            self.num_symbols,
            self.context_length,
            self.query_dim,
            self.num_targets,
            keys=self.keys,
            name=self.name,
            backend=backend,
        )

    def estimate(
        self,
        nobs: float | None,
        suff_stat: Any,
        *,
        previous: ResponsibilityAttentionDistribution | None = None,
    ) -> ResponsibilityAttentionDistribution:
        """The M-step: a new distribution from an accumulator ``value()``.

        ``nobs`` is accepted for the reference protocol; the statistics carry their own count.
        ``previous`` (the model of the E-step) supplies the keys of symbols that received no mass.
        """
        stats = SufficientStatistics.checked(
            suff_stat, (self.num_symbols, self.context_length, self.query_dim, self.num_targets)
        )
        key_means, emission, position_prior, sigma2 = estimate_parameters(
            stats,
            sigma2=self.sigma2 if previous is None or not self.estimate_sigma2 else previous.sigma2,
            estimate_sigma2=self.estimate_sigma2,
            min_sigma2=self.min_sigma2,
            emission_smoothing=self.emission_smoothing,
            pseudo_count=self.pseudo_count,
            previous_key_means=None if previous is None else previous.key_means,
        )
        return ResponsibilityAttentionDistribution(key_means, emission, position_prior, sigma2, self.name)
