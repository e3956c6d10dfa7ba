"""What is at a path given as a store that is not one, in words, with the fix: the one message every store opener
raises for a missing path, a folder of stores, a model directory, predict's output or anything else."""

from __future__ import annotations

import difflib
import json
import posixpath
from typing import Any

from dist_respattn.store.errors import StoreError
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.schema import ATTRIBUTE_KEY

__all__ = ["EXPECTED_STORE", "not_a_store"]

#: What a command that reads rows expects, and where it comes from.
EXPECTED_STORE = "expected a store written by `dist-respattn ingest` or `split` (a token-stream or triple store)"

#: The files that mark a model directory and a registry (see ``dist_respattn.artifacts``, which builds on
#: this layer, so its names are repeated here), and a checkpoint's own two files.
_MODEL_POINTERS = ("latest.json", "best.json")
_REGISTRY_MARKER = "registry.json"
_CHECKPOINT_FILES = ("meta.json", "params.npz")
#: The order split writes its stores in, which a folder of them is listed in.
_SPLIT_ORDER = ("train.zarr", "validation.zarr", "test.zarr")


def not_a_store(location: StoreLocation) -> StoreError:
    """The error for ``location`` when it holds no store: ``PATH: <what is there>: <the fix>``.

    Looks at the path only when it is refused (a listing of it, or of its parent when it is missing), so opening a
    store costs nothing more.
    """
    try:
        found = _what_is_there(location)
    except (OSError, ValueError):  # unreadable (permissions, a remote error): say what is expected only
        found = f"no store there: {EXPECTED_STORE}"
    return StoreError(f"{location}: {found}")


def _what_is_there(location: StoreLocation) -> str:
    """What ``location`` holds, said for a user who gave it as a store."""
    fs, root = location.filesystem()
    if not fs.exists(root):
        return "no such file or directory" + _close_names(fs, root)
    if not fs.isdir(root):
        return f"a file, not a store: {EXPECTED_STORE}"
    entries = {posixpath.basename(str(path).rstrip("/")): str(path) for path in fs.ls(root, detail=False)}
    if _REGISTRY_MARKER in entries:
        return f"a model registry, not a store: commands take one of its versions as MODEL ({location.url}@latest)"
    if any(name in entries for name in _MODEL_POINTERS):
        return "a model directory, not a store: commands take it as MODEL"
    if all(name in entries for name in _CHECKPOINT_FILES):
        parent = posixpath.dirname(location.url)
        return f"a checkpoint of a model directory, not a store: commands take its model directory, {parent}, as MODEL"
    if "zarr.json" in entries:
        return _zarr_node(fs.cat_file(entries["zarr.json"]))
    stores = sorted(
        (name for name, path in entries.items() if name.endswith(".zarr") and fs.isdir(path)),
        key=lambda name: (_SPLIT_ORDER.index(name) if name in _SPLIT_ORDER else len(_SPLIT_ORDER), name),
    )
    if stores:
        return f"a folder of stores ({', '.join(stores)}): name one of them"
    return f"{'an empty directory' if not entries else 'a directory'}, not a store: {EXPECTED_STORE}"


def _zarr_node(metadata: bytes) -> str:
    """What a zarr node that is not a store is, from its ``zarr.json``."""
    try:
        node: Any = json.loads(metadata)
    except ValueError:
        return f"a zarr node whose zarr.json is not valid JSON: {EXPECTED_STORE}"
    if not isinstance(node, dict) or node.get("node_type") != "group":
        return f"a zarr array, not a store: {EXPECTED_STORE}"
    ours = (node.get("attributes") or {}).get(ATTRIBUTE_KEY)
    schema = ours.get("schema") if isinstance(ours, dict) else None
    # Imported here: the predictions module opens its groups with this layer's opener, which raises these errors.
    from dist_respattn.store.predictions import PREDICTIONS_SCHEMA

    if schema == PREDICTIONS_SCHEMA:
        store = ours.get("store") if isinstance(ours, dict) else None
        return "predictions written by `predict`" + (f" of the store {store}" if store else "") + ", not a store"
    if schema is None:
        return f"a zarr group but no store of dist_respattn: {EXPECTED_STORE}"
    return f"a zarr group of schema {schema!r}, not a store this release reads: {EXPECTED_STORE}"


def _close_names(fs: Any, root: str) -> str:
    """`` (did you mean train.zarr?)``: the names in ``root``'s folder close to its own, or nothing."""
    parent, name = posixpath.split(root)
    if not name or not fs.isdir(parent):
        return ""
    names = [posixpath.basename(str(path).rstrip("/")) for path in fs.ls(parent, detail=False)]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.75)
    return f" (did you mean {' or '.join(close)}?)" if close else ""
