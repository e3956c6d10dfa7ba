"""Using a gated head: the plain head of an attribute or a mix of attributes, generation token by token (the
plain head's :func:`~dist_respattn.model.streaming.generate`, re-exported here), and the words whose emission rows
an attribute makes alike.

A mix of attributes ``sum_k lambda_k a_k`` is the head whose weights are ``sum_k lambda_k w[a_k]`` (and prior
``sum_k lambda_k pi_{a_k}``): the gated emission is linear in the weights, so this is the mixture of the
attributes' emissions (the paper's generation "in the style of" several books at once).
"""

from __future__ import annotations

import numpy as np

from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.heads.gated.head import GatedHead
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.streaming import generate

__all__ = ["emission_neighbours", "generate", "mixed_head"]


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


def emission_neighbours(emission: SparseEmission, symbol: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` symbols (other than ``symbol``) whose emission rows ``B[s, :]`` are closest to ``symbol``'s in
    Hellinger distance ``sqrt(1 - sum_t sqrt(B[s, t] B[symbol, t]))``: ``(ids (k,), distances (k,))``, nearest
    first. Over the support's pairs and the backoff, O(P + T): never an (S, T) table."""
    support = emission.support
    q = emission.rows(np.array([int(symbol)]))[0]
    root_q = np.sqrt(q)
    root_base_q = np.sqrt(emission.base) * root_q
    symbols, targets = support.symbols, support.targets
    root_backoff = np.sqrt(emission.backoff)
    # On the pairs: sqrt(v q_t) replaces the backoff's sqrt(b_s u_t q_t) in the all-backoff sum.
    on_pairs = np.sqrt(emission.values) * root_q[targets] - root_backoff[symbols] * root_base_q[targets]
    overlap = root_backoff * float(root_base_q.sum()) + np.bincount(
        symbols, weights=on_pairs, minlength=support.num_symbols
    )
    distance = np.sqrt(np.clip(1.0 - overlap, 0.0, None))
    distance[int(symbol)] = np.inf
    order = np.argsort(distance, kind="stable")[: int(k)]
    return order, distance[order]
