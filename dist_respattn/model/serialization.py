"""A head as plain arrays plus JSON-able metadata, for stores and checkpoints (never pickles)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dist_respattn.model.distribution import ResponsibilityAttentionDistribution

__all__ = ["MODEL_ARRAY_NAMES", "distribution_from_arrays", "distribution_to_arrays"]

#: The arrays that define a head: key means (S, D), emission (S, T), position prior (N,).
MODEL_ARRAY_NAMES = ("key_means", "emission", "position_prior")


def distribution_to_arrays(dist: ResponsibilityAttentionDistribution) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split a head into float64 arrays and a JSON-able metadata dict (``sigma2``, ``name``, shape)."""
    arrays = {
        "key_means": np.ascontiguousarray(dist.key_means, dtype=np.float64),
        "emission": np.ascontiguousarray(dist.emission, dtype=np.float64),
        "position_prior": np.ascontiguousarray(dist.position_prior, dtype=np.float64),
    }
    meta = {
        "sigma2": float(dist.sigma2),
        "name": dist.name,
        "num_symbols": int(dist.num_symbols),
        "context_length": int(dist.context_length),
        "query_dim": int(dist.query_dim),
        "num_targets": int(dist.num_targets),
    }
    return arrays, meta


def distribution_from_arrays(
    arrays: Any, meta: dict[str, Any], *, source: str = "model"
) -> ResponsibilityAttentionDistribution:
    """Rebuild a head from :func:`distribution_to_arrays` output (any mapping of arrays, e.g. an npz file).

    ``source`` names where the arrays came from, for the error when one is missing.
    """
    missing = [name for name in MODEL_ARRAY_NAMES if name not in arrays]
    if missing:
        raise ValueError(f"{source}: missing array(s) {', '.join(missing)}: expected {', '.join(MODEL_ARRAY_NAMES)}")
    if "sigma2" not in meta:
        raise ValueError(f"{source}: metadata has no 'sigma2'")
    return ResponsibilityAttentionDistribution(
        np.asarray(arrays["key_means"]),
        np.asarray(arrays["emission"]),
        np.asarray(arrays["position_prior"]),
        sigma2=float(meta["sigma2"]),
        name=meta.get("name"),
    )
