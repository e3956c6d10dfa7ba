"""A head as plain arrays plus JSON-able metadata, for stores and checkpoints (never pickles)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import emission_from_arrays
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution

__all__ = ["MODEL_ARRAY_NAMES", "distribution_from_arrays", "distribution_to_arrays"]

#: The arrays a head may have: key means (S, D), position prior (N,) and its emission's (``emission``
#: (S, T) when dense; ``emission_values`` (P,), the backoff factors and the support when sparse:
#: see ``Emission.to_arrays``).
MODEL_ARRAY_NAMES = (
    "key_means",
    "position_prior",
    "emission",
    "emission_values",
    "emission_backoff_symbol",
    "emission_backoff_target",
    "support_indptr",
    "support_symbols",
)


def distribution_to_arrays(dist: ResponsibilityAttentionDistribution) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split a head into float64 arrays and a JSON-able metadata dict (``sigma2``, ``name``, shape)."""
    arrays = {
        "key_means": np.ascontiguousarray(dist.key_means, dtype=np.float64),
        "position_prior": np.ascontiguousarray(dist.position_prior, dtype=np.float64),
        **dist.emission_table.to_arrays(),
    }
    meta: dict[str, Any] = {
        "sigma2": float(dist.sigma2),
        "name": dist.name,
        "num_symbols": int(dist.num_symbols),
        "context_length": int(dist.context_length),
        "query_dim": int(dist.query_dim),
        "num_targets": int(dist.num_targets),
        "emission_layout": dist.emission_table.layout,
    }
    if dist.buckets is not None:
        meta["position_buckets"] = dist.buckets.to_json()
    return arrays, meta


def distribution_from_arrays(
    arrays: Any, meta: dict[str, Any], *, source: str = "model"
) -> ResponsibilityAttentionDistribution:
    """Rebuild a head from :func:`distribution_to_arrays` output (any mapping of arrays, e.g. an npz file).

    ``source`` names where the arrays came from, for the error when one is missing.
    """
    missing = [name for name in ("key_means", "position_prior") if name not in arrays]
    if "emission" not in arrays and "emission_values" not in arrays:
        missing.append("emission")
    if missing:
        raise ValueError(
            f"{source}: missing array(s) {', '.join(missing)}: expected key_means, position_prior and the emission's"
        )
    if "sigma2" not in meta:
        raise ValueError(f"{source}: metadata has no 'sigma2'")
    key_means = np.asarray(arrays["key_means"])
    try:
        emission = emission_from_arrays(arrays, key_means.shape[0] if key_means.ndim == 2 else None)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{source}: the emission's arrays do not fit together: {exc}") from None
    buckets = meta.get("position_buckets")
    return ResponsibilityAttentionDistribution(
        key_means,
        emission,
        np.asarray(arrays["position_prior"]),
        sigma2=float(meta["sigma2"]),
        name=meta.get("name"),
        buckets=None if buckets is None else PositionBuckets.from_json(buckets),
    )
