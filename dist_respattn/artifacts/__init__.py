"""What a fit leaves behind: checkpoints in a model directory and the model registry's versions (no dask, no zarr).

:mod:`~dist_respattn.artifacts.checkpoints` writes and reads a model directory, the registry
(:mod:`~dist_respattn.artifacts.registry`) publishes checkpoints as numbered versions, and
:mod:`~dist_respattn.artifacts.references` loads whichever a model argument names. All writes are
:mod:`dist_respattn.durable`'s, so a process killed at any moment leaves every pointer on complete files; a fit
writes its model directory under that directory's lock (:mod:`~dist_respattn.artifacts.model_dir_lock`).
"""

from dist_respattn.artifacts.checkpoints import Checkpoint, CheckpointError, CheckpointFiles, ModelDir
from dist_respattn.artifacts.model_dir_lock import ModelDirLock, ModelDirLocked, hold_model_dirs
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
    "ModelDirLock",
    "ModelDirLocked",
    "Registry",
    "RegistryError",
    "RegistryFiles",
    "RegistryLock",
    "RegistryLocked",
    "Version",
    "hold_model_dirs",
    "load_checkpoint",
    "load_model",
    "registry_reference",
]
