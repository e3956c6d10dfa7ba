"""A model registry for scheduled retraining: numbered versions, a quality gate, a lock.

``retrain`` warm-starts from the registry's latest version, fits, scores the candidate and the
current version on the same validation store, and publishes a new version only when the candidate
passes the gate. The registry lives on a local disk or behind any fsspec URL (``s3://``); see
:mod:`dist_respattn.artifacts.registry` for its layout and why a killed run never damages it. The registry
itself is part of the persistence layer, :mod:`dist_respattn.artifacts`; this package adds the retraining job.
"""

from dist_respattn.artifacts import (
    DEFAULT_STALE_AFTER,
    Registry,
    RegistryError,
    RegistryFiles,
    RegistryLock,
    RegistryLocked,
    Version,
)
from dist_respattn.registry.retrain import DEFAULT_TOLERANCE, GATE_METRICS, GateDecision, RetrainResult, gate, retrain

__all__ = [
    "DEFAULT_STALE_AFTER",
    "DEFAULT_TOLERANCE",
    "GATE_METRICS",
    "GateDecision",
    "Registry",
    "RegistryError",
    "RegistryFiles",
    "RegistryLock",
    "RegistryLocked",
    "RetrainResult",
    "Version",
    "gate",
    "retrain",
]
