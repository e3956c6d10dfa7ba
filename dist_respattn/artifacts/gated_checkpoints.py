"""Checkpoints of an attribute-gated head: the same model directory layout, files and atomic commits as a plain
head's (:mod:`dist_respattn.artifacts.checkpoints`), with ``"kind": "gated"`` in ``meta.json``.

``params.npz`` holds the head's arrays (:meth:`~dist_respattn.model.heads.gated.head.GatedHead.to_arrays`: keys (S, D),
position prior (A', N), weights (A, F), factor values (P, F) and backoffs (F, S), the shared base (T,), the
support); ``meta.json`` the attribute names, settings, history and the shared head the fit started from, whose
checkpoint also gives the factors' prior (its emission and strengths). A gated model directory keeps that
shared head's own fit in its ``shared/`` subdirectory.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.artifacts.checkpoints import (
    BEST,
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    META_FILE,
    PARAMS_FILE,
    CheckpointError,
    ModelDir,
    read_json_file,
)
from dist_respattn.artifacts.registry import REGISTRY_FILE
from dist_respattn.model.heads.gated.head import GatedHead

__all__ = ["GATED_KIND", "SHARED_DIR", "GatedCheckpoint", "commit_gated", "is_gated_dir", "load_gated"]

GATED_KIND = "gated"
#: The subdirectory of a gated model directory that holds the shared head's fit.
SHARED_DIR = "shared"


@dataclass(frozen=True)
class GatedCheckpoint:
    """A loaded gated checkpoint: its name, head and ``meta.json``."""

    name: str
    head: GatedHead
    meta: dict[str, Any]

    @property
    def iteration(self) -> int:
        return int(self.meta.get("iteration", 0))

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(self.meta["attribute_names"])


def commit_gated(
    folder: ModelDir,
    name: str,
    head: GatedHead,
    meta: dict[str, Any],
    *,
    best: bool,
    keep: set[str],
) -> None:
    """Write checkpoint ``name`` complete or not at all, point ``latest`` (and ``best`` when asked) at it, and
    prune every other checkpoint but ``keep``."""
    arrays, head_meta = head.to_arrays()
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    record = {"format": FORMAT, "version": FORMAT_VERSION, "kind": GATED_KIND, "model": head_meta, **meta}
    folder.write_files(
        name, {PARAMS_FILE: buffer.getvalue(), META_FILE: (json.dumps(record, indent=2) + "\n").encode()}
    )
    info = {"iteration": int(meta.get("iteration", 0))}
    folder.point(LATEST, name, **info)
    if best:
        folder.point(BEST, name, **info)
    folder.prune({name} | keep)


def is_gated_dir(model_dir: str | os.PathLike[str]) -> bool:
    """Whether ``model_dir`` is a model directory whose latest checkpoint is a gated head's."""
    folder = ModelDir(model_dir)
    if not folder.path.is_dir() or (folder.path / REGISTRY_FILE).is_file():
        return False
    try:
        name = folder.pointed(LATEST)
    except CheckpointError:  # a damaged pointer: the plain loader names it
        return False
    if name is None:
        return False
    meta_path = folder.path / name / META_FILE
    return meta_path.is_file() and read_json_file(meta_path).get("kind") == GATED_KIND


def load_gated(model_dir: str | os.PathLike[str], which: str = "auto") -> GatedCheckpoint:
    """The ``best`` (``"auto"``: when there is one) or ``latest`` gated checkpoint of ``model_dir``."""
    folder = ModelDir(model_dir)
    if not folder.path.is_dir():
        raise CheckpointError(f"{folder}: no such model directory")
    order = [BEST, LATEST] if which == "auto" else [which]
    name = next((n for n in (folder.pointed(p) for p in order) if n is not None), None)
    if name is None:
        raise CheckpointError(f"{folder}: no {' or '.join(order)} checkpoint: is this the model directory of a fit?")
    meta_path, params_path = folder.path / name / META_FILE, folder.path / name / PARAMS_FILE
    for path in (meta_path, params_path):
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (the checkpoint is incomplete or was removed)")
    meta = read_json_file(meta_path)
    if meta.get("kind") != GATED_KIND:
        raise CheckpointError(
            f"{folder}: holds a plain head, not an attribute-gated one (fit it with --attribute-factors F)"
        )
    try:
        with np.load(params_path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        head = GatedHead.from_arrays(arrays, meta.get("model", {}))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{params_path}: cannot be read as a gated head ({type(exc).__name__}: {exc})") from exc
    return GatedCheckpoint(name, head, meta)
