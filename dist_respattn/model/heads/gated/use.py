"""Using a gated head: the plain head of an attribute or a mix of attributes, generation token by token (the
plain head's :func:`~dist_respattn.model.streaming.generate`, re-exported here). The words whose emission rows an
attribute makes alike are :func:`~dist_respattn.model.emission.neighbours.emission_neighbours` of its emission.

A mix of attributes ``sum_k lambda_k a_k`` is the head whose weights are ``sum_k lambda_k w[a_k]`` (and prior
``sum_k lambda_k pi_{a_k}``): the gated emission is linear in the weights, so this is the mixture of the
attributes' emissions (the paper's generation "in the style of" several books at once).
"""

from __future__ import annotations

import numpy as np

from dist_respattn.model.heads.gated.head import GatedHead
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.streaming import generate

__all__ = ["generate", "mixed_head"]


def mixed_head(head: GatedHead, mix: dict[int, float]) -> ResponsibilityAttentionDistribution:
    """The plain head of the attribute mix ``{attribute id: share}`` (shares > 0, normalized here)."""
    if not mix or any(not np.isfinite(v) or v <= 0.0 for v in mix.values()):
        raise ValueError(f"attribute mix {mix}: expected positive shares")
    total = float(sum(mix.values()))
    weights = sum(share / total * head.weights[a] for a, share in mix.items())
    prior = sum(share / total * head.prior_of(a) for a, share in mix.items())
    return ResponsibilityAttentionDistribution(
        head.key_means, head.factors.mixed(np.asarray(weights)), np.asarray(prior), head.sigma2
    )
