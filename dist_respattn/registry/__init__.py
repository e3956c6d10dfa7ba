"""A model registry for scheduled retraining: numbered versions, a quality gate, a lock.

``retrain`` warm-starts from the registry's latest version, fits, scores the candidate and the
current version on the same validation store, and publishes a new version only when the candidate
passes the gate. The registry lives on a local disk or behind any fsspec URL (``s3://``); see
:mod:`dist_respattn.registry.registry` for its layout and why a killed run never damages it.
"""

from dist_respattn.registry.files import RegistryError, RegistryFiles
from dist_respattn.registry.lock import DEFAULT_STALE_AFTER, RegistryLock, RegistryLocked
from dist_respattn.registry.registry import Registry, Version
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
