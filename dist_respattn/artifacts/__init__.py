"""What a fit leaves behind: checkpoints in a model directory and the model registry's versions (no dask, no zarr).

:mod:`~dist_respattn.artifacts.checkpoints` writes and reads a model directory, the registry
(:mod:`~dist_respattn.artifacts.registry`) publishes checkpoints as numbered versions, and
:mod:`~dist_respattn.artifacts.references` loads whichever a model argument names. All writes are
:mod:`dist_respattn.durable`'s, so a process killed at any moment leaves every pointer on complete files.
"""

from dist_respattn.artifacts.checkpoints import Checkpoint, CheckpointError, CheckpointFiles, ModelDir
from dist_respattn.artifacts.references import load_checkpoint, load_model, registry_reference
from dist_respattn.artifacts.registry import Registry, Version
from dist_respattn.artifacts.registry_files import RegistryError, RegistryFiles
from dist_respattn.artifacts.registry_lock import DEFAULT_STALE_AFTER, RegistryLock, RegistryLocked

__all__ = [
    "DEFAULT_STALE_AFTER",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFiles",
    "ModelDir",
    "Registry",
    "RegistryError",
    "RegistryFiles",
    "RegistryLock",
    "RegistryLocked",
    "Version",
    "load_checkpoint",
    "load_model",
    "registry_reference",
]
