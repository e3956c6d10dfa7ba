"""The single-hop head: distribution, sampler, accumulator, estimator, scoring, top-K, arrays and diagnostics;
``kind`` makes it a kind of the head protocol, registered here as ``"single_hop"``."""

from __future__ import annotations

from dist_respattn.model.heads.base import HeadKind, register_kind
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec

__all__ = ["KIND"]

KIND = register_kind(
    HeadKind(
        "single_hop",
        ResponsibilityAttentionDistribution,
        SingleHopSpec,
        summary="one attention head over the context positions (the default on stores of fixed windows)",
        head_name="single",
    )
)
