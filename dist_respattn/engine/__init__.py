"""The distributed engine: the only code that talks to a ``distributed.Client``.

``fit`` runs exact EM over a triple store on a Dask cluster (an embedded ``LocalCluster`` by
default), checkpointing every iteration; ``evaluate`` scores a store with a model; ``predict``
writes each row's top-K targets; ``load_model`` reads a model directory (or a registry's version) back.
"""

from __future__ import annotations

from dist_respattn.engine.checkpoint import Checkpoint, CheckpointError, ModelDir, load_checkpoint, load_model
from dist_respattn.engine.cluster import ClusterError, ClusterInfo, cluster_info, connect
from dist_respattn.engine.evaluate import Evaluation, evaluate
from dist_respattn.engine.fit import FitError, FitResult, fit, open_store
from dist_respattn.engine.memory import InsufficientMemoryError, MemoryEstimate, check_memory, estimate_memory
from dist_respattn.engine.predict import PredictionRun, predict
from dist_respattn.engine.progress import EVENT_TOPIC
from dist_respattn.engine.settings import FitSettings

__all__ = [
    "EVENT_TOPIC",
    "Checkpoint",
    "CheckpointError",
    "ClusterError",
    "ClusterInfo",
    "Evaluation",
    "FitError",
    "FitResult",
    "FitSettings",
    "InsufficientMemoryError",
    "MemoryEstimate",
    "ModelDir",
    "PredictionRun",
    "check_memory",
    "cluster_info",
    "connect",
    "estimate_memory",
    "evaluate",
    "fit",
    "load_checkpoint",
    "load_model",
    "open_store",
    "predict",
]
