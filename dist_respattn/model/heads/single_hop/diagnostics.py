"""How close a fitted head is to a known one (for synthetic data, where the truth is known)."""

from __future__ import annotations

import numpy as np

from dist_respattn.model.emission.layouts import Emission
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution

__all__ = ["COLLAPSE_FLOOR", "PRIOR_COLLAPSE_MASS", "degeneracy_warnings", "emission_row_distances", "recovery_report"]

#: A learned variance held at a floor this small (the default is 1e-6) has collapsed: the likelihood grows
#: without bound as sigma2 shrinks, and only the floor stops it.
COLLAPSE_FLOOR = 1e-3
#: A position prior with at least this much mass on one position has collapsed onto it.
PRIOR_COLLAPSE_MASS = 0.99


#: Cells of the (b, T) emission rows compared at a time: bounded memory for any S and either layout.
_ROW_BLOCK_CELLS = 1 << 22


def emission_row_distances(a: Emission, b: Emission) -> np.ndarray:
    """Total-variation distance between the rows of two emissions of one (S, T): (S,) in [0, 1]."""
    if (a.num_symbols, a.num_targets) != (b.num_symbols, b.num_targets):
        raise ValueError(
            f"emissions differ in (S, T): {(a.num_symbols, a.num_targets)}, {(b.num_symbols, b.num_targets)}"
        )
    out = np.empty(a.num_symbols)
    step = max(1, _ROW_BLOCK_CELLS // max(a.num_targets, 1))
    for first in range(0, a.num_symbols, step):
        symbols = np.arange(first, min(first + step, a.num_symbols))
        out[symbols] = 0.5 * np.abs(a.rows(symbols) - b.rows(symbols)).sum(axis=1)
    return out


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
    tv = emission_row_distances(truth.emission_table, fitted.emission_table)
    return {
        "key_rmse": key_rmse,
        "key_rmse_relative": key_rmse / float(np.sqrt(np.mean(truth.key_means**2))),
        "prior_l1": float(np.abs(truth.position_prior - fitted.position_prior).sum()),
        "emission_tv_mean": float(tv.mean()),
        "emission_tv_max": float(tv.max()),
        "sigma2_ratio": fitted.sigma2 / truth.sigma2,
    }


def degeneracy_warnings(
    model: ResponsibilityAttentionDistribution,
    *,
    key_mass: np.ndarray | None = None,
    min_sigma2: float | None = None,
) -> list[str]:
    """Ways a fitted head has degenerated, one sentence each (empty when it has not).

    - the learned gate variance sits on its floor ``min_sigma2`` (pass it only when sigma2 is learned);
    - the position prior puts at least ``PRIOR_COLLAPSE_MASS`` of its mass on one position;
    - some symbols received no responsibility mass (``key_mass`` (S,) of the last E-step).
    """
    warnings = []
    if min_sigma2 is not None and model.sigma2 <= min_sigma2 * (1.0 + 1e-9):
        # The floor binds whenever the maximum-likelihood variance is below it. Only a floor near zero means
        # the keys collapsed onto the queries; a larger one was chosen, and the data's variance is just smaller.
        cause = (
            "the keys have collapsed onto the queries (fix the variance, or let held-out rows choose it)"
            if min_sigma2 <= COLLAPSE_FLOOR
            else "the maximum-likelihood variance is smaller, so the floor sets it (lower min_sigma2 to learn it)"
        )
        warnings.append(f"sigma2 = {model.sigma2:.3g} sits on min_sigma2 = {min_sigma2:.3g}, its floor: {cause}")
    top = int(np.argmax(model.position_prior))
    if model.context_length > 1 and model.position_prior[top] >= PRIOR_COLLAPSE_MASS:
        warnings.append(
            f"the position prior puts {model.position_prior[top]:.1%} of its mass on position {top}: "
            "the head attends to one position only"
        )
    if key_mass is not None:
        dead = int(np.count_nonzero(np.asarray(key_mass) <= 0.0))
        if dead:
            warnings.append(
                f"{dead} of {model.num_symbols} symbols received no responsibility mass "
                "(they never occur in a context, or never win any attention); their keys are not learned"
            )
    return warnings
