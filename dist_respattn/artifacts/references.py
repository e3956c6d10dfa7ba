"""What a model argument names: a model directory, or a registry's version (``REGISTRY@7``, ``REGISTRY@latest``).

Here, above both, so that checkpoints know nothing of the registry and the registry builds on checkpoints.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from dist_respattn.artifacts.checkpoints import (
    BEST,
    LATEST,
    Checkpoint,
    CheckpointError,
    ModelDir,
    load_directory,
)
from dist_respattn.artifacts.registry import REGISTRY_FILE, Registry
from dist_respattn.model.heads.base import Head

__all__ = ["load_checkpoint", "load_model", "registry_reference"]

#: ``REGISTRY@7`` or ``REGISTRY@latest``: a version of a model registry where a model directory is expected.
_REGISTRY_REFERENCE = re.compile(r"^(?P<registry>.+)@(?P<version>\d+|latest)$")


def registry_reference(model: str | os.PathLike[str]) -> tuple[str, str] | None:
    """``(registry URL, version)`` of ``REGISTRY@7`` or ``REGISTRY@latest``; ``None`` for a model directory.

    A local directory of that very name is a model directory (``@`` is a legal character in a path).
    """
    text = os.fspath(model)
    match = _REGISTRY_REFERENCE.match(text)
    if match is None or ("://" not in text and Path(text).is_dir()):
        return None
    return match.group("registry"), match.group("version")


def load_checkpoint(
    model_dir: str | os.PathLike[str], which: str = "auto", *, storage_options: dict[str, Any] | None = None
) -> Checkpoint:
    """Load the ``"latest"`` or ``"best"`` checkpoint of ``model_dir``; ``"auto"`` prefers ``best``.

    ``model_dir`` may also name a published version of a model registry, ``REGISTRY@7`` or
    ``REGISTRY@latest`` (a local path or an fsspec URL, read with ``storage_options``); its files are
    checked against the version's record.
    """
    if which not in ("auto", LATEST, BEST):
        raise ValueError(f"which = {which!r}: expected 'auto', 'latest' or 'best'")
    reference = registry_reference(model_dir)
    if reference is not None:
        if which != "auto":
            raise CheckpointError(f"{os.fspath(model_dir)}: a registry version has one checkpoint, not a {which!r} one")
        url, version = reference
        registry = Registry(url, storage_options)
        if not registry.check_format():  # else read as a registry with no version yet, which misleads
            raise CheckpointError(
                f"{os.fspath(model_dir)}: no model registry at {url} (no {REGISTRY_FILE}): give the path of a "
                "registry before the @ (retrain publishes its first version)"
            )
        return registry.load(version)
    folder = ModelDir(model_dir)
    if (folder.path / REGISTRY_FILE).is_file():  # its latest.json is not a model directory's pointer
        raise CheckpointError(
            f"{folder}: a model registry, not a model directory: name one of its versions, {folder}@latest or "
            f"{folder}@N (`dist-respattn models list {folder}` shows them)"
        )
    return load_directory(folder.path, which)


def load_model(
    model_dir: str | os.PathLike[str], which: str = "auto", *, storage_options: dict[str, Any] | None = None
) -> Head:
    """The head saved in ``model_dir``: the ``best`` checkpoint when there is one, else the ``latest``; or the
    head published as a registry's version, ``REGISTRY@7`` or ``REGISTRY@latest``."""
    return load_checkpoint(model_dir, which, storage_options=storage_options).model
