"""The distributed engine: the only code that talks to a ``distributed.Client``.

``fit`` runs exact EM over a store of rows on a Dask cluster (an embedded ``LocalCluster`` by
default, or as :class:`ClusterOptions` say), checkpointing every iteration; ``evaluate`` scores a store
with a model next to n-gram baselines, ``score`` without them (``scored_store``: the store read with the
rows and windows ``evaluate`` scores a model on); ``predict`` writes each row's top-K targets;
``load_model`` reads a model directory (or a registry's version) back; ``store_record`` is what
a checkpoint records of a store; ``open_store`` is the store layer's one opener for any store, re-exported
(``open_fit_store``: the same, its refusals a :class:`FitError`).
"""

from __future__ import annotations

from dist_respattn.artifacts import (
    Checkpoint,
    CheckpointError,
    CheckpointFiles,
    ModelDir,
    ModelDirLocked,
    load_checkpoint,
    load_model,
)
from dist_respattn.engine.cluster import (
    ClusterError,
    ClusterInfo,
    ClusterOptions,
    cluster_info,
    connect,
    refuse_a_worker_reimport,
)
from dist_respattn.engine.evaluate import Evaluation, evaluate, score, scored_store
from dist_respattn.engine.fit import FitError, FitResult, fit, open_fit_store
from dist_respattn.engine.loop import store_record
from dist_respattn.engine.memory import InsufficientMemoryError, MemoryEstimate, check_memory, estimate_memory
from dist_respattn.engine.predict import PredictionRun, predict
from dist_respattn.engine.settings import FitSettings
from dist_respattn.events import EVENT_TOPIC
from dist_respattn.store.rows import open_store  # the one opener for any store, the store layer's

__all__ = [
    "EVENT_TOPIC",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFiles",
    "ClusterError",
    "ClusterInfo",
    "ClusterOptions",
    "Evaluation",
    "FitError",
    "FitResult",
    "FitSettings",
    "InsufficientMemoryError",
    "MemoryEstimate",
    "ModelDir",
    "ModelDirLocked",
    "PredictionRun",
    "check_memory",
    "cluster_info",
    "connect",
    "estimate_memory",
    "evaluate",
    "fit",
    "load_checkpoint",
    "load_model",
    "open_fit_store",
    "open_store",
    "predict",
    "refuse_a_worker_reimport",
    "score",
    "scored_store",
    "store_record",
]
