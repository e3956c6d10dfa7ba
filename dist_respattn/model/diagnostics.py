"""How close a fitted head is to a known one (for synthetic data, where the truth is known)."""

from __future__ import annotations

import numpy as np

from dist_respattn.model.distribution import ResponsibilityAttentionDistribution

__all__ = ["recovery_report"]


def recovery_report(
    truth: ResponsibilityAttentionDistribution, fitted: ResponsibilityAttentionDistribution
) -> dict[str, float]:
    """Parameter errors of ``fitted`` against ``truth`` (same S, N, D, T).

    Symbols are identified by id, so no matching is needed. Returns:
        key_rmse: root mean squared key error per coordinate.
        key_rmse_relative: ``key_rmse`` over the root mean square of the true keys.
        prior_l1: L1 distance between the position priors (0..2).
        emission_tv_mean: mean total-variation distance between emission rows (0..1).
        emission_tv_max: largest such distance.
        sigma2_ratio: fitted sigma2 over true sigma2.
    """
    shapes = [(d.num_symbols, d.context_length, d.query_dim, d.num_targets) for d in (truth, fitted)]
    if shapes[0] != shapes[1]:
        raise ValueError(f"models differ in (S, N, D, T): truth {shapes[0]}, fitted {shapes[1]}")
    key_rmse = float(np.sqrt(np.mean((truth.key_means - fitted.key_means) ** 2)))
    tv = 0.5 * np.abs(truth.emission - fitted.emission).sum(axis=1)
    return {
        "key_rmse": key_rmse,
        "key_rmse_relative": key_rmse / float(np.sqrt(np.mean(truth.key_means**2))),
        "prior_l1": float(np.abs(truth.position_prior - fitted.position_prior).sum()),
        "emission_tv_mean": float(tv.mean()),
        "emission_tv_max": float(tv.max()),
        "sigma2_ratio": fitted.sigma2 / truth.sigma2,
    }
