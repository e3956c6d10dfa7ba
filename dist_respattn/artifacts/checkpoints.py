"""Checkpoints: a fitted head as arrays (npz, never pickles) plus JSON, written atomically.

A model directory holds, for a head of any kind (its ``to_arrays``; a single-hop head's shown)::

    ckpt-000005-1a2b3c4d/params.npz   key_means (S, D), emission (S, T), position_prior (N,), float64
    ckpt-000005-1a2b3c4d/meta.json    "model": {"kind": "single_hop", sigma2, ...}, iteration, history, settings, ...
    latest.json                       {"checkpoint": "ckpt-000005-1a2b3c4d", "iteration": 5}
    best.json                         the best checkpoint by the early-stopping metric (with validation)
    fit.json                          what the fit was asked: its head spec, settings, validation store and start,
                                      written before its first iteration (a resume continues it as asked)
    lock.json                         the writer lock of the fit writing the directory, while one runs
                                      (:mod:`~dist_respattn.artifacts.model_dir_lock`)

A fit whose M-step ran in shards on the workers writes its head in parts instead (``part-common.npz``, one
``part-<k>.npz`` per shard, each by the worker that owns it), its ``meta.json`` saying where (``"parts"``, version 2):
:meth:`ModelDir.commit_parts`; :meth:`ModelDir.load` joins them with the kind's ``Head.from_shards``.

A checkpoint is written into a temporary directory, flushed, and renamed into place; only then is
the pointer replaced (its own temporary file, then an atomic rename): :mod:`dist_respattn.durable.files`'
writes. A process killed at any moment therefore leaves the pointers on complete checkpoints. Old
checkpoints are pruned after the pointers moved past them. A model reference that may also name a
registry's version (``REGISTRY@7``) is resolved by :mod:`dist_respattn.artifacts.references`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import json
import logging
import os
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from dist_respattn.durable.files import TEMP_PREFIX, place_directory, replace_file, temporary_path, write_synced
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.heads.base import Head, head_from_arrays, head_kind

__all__ = [
    "BEST",
    "FIT_RECORD",
    "LATEST",
    "LOCK_FILE",
    "BackgroundCheckpoints",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFiles",
    "ModelDir",
    "checkpoint_name",
    "load_directory",
    "parse_checkpoint",
    "read_json_file",
]

PARAMS_FILE = "params.npz"
META_FILE = "meta.json"
LATEST = "latest"
BEST = "best"
FORMAT = "dist_respattn.checkpoint"
FORMAT_VERSION = 1
#: The version of a checkpoint whose head is in parts (a sharded M-step's: ``"parts"`` in its ``meta.json``).
PARTS_VERSION = 2
#: The file in a model directory that records what its fit was asked (see :meth:`ModelDir.write_fit_record`).
FIT_RECORD = "fit.json"
FIT_FORMAT = "dist_respattn.fit"
#: The writer lock of the fit writing a model directory (:mod:`~dist_respattn.artifacts.model_dir_lock`).
LOCK_FILE = "lock.json"

logger = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A model directory or checkpoint is missing, incomplete or not one of ours."""


#: Arrays a checkpoint may keep beside the model's: the fit's emission prior (see ``EmissionPrior.to_arrays``).
EXTRA_ARRAY_NAMES = ("emission_base", "emission_types")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the head (of any kind), its metadata (the JSON written with it) and its arrays (the
    head's and the fit's others: an emission prior, say)."""

    name: str
    model: Head
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def emission_prior(self) -> EmissionPrior | None:
        """The emission prior the fit used, when it had one."""
        record = self.meta.get("emission_prior")
        if not record or not all(name in self.arrays for name in EXTRA_ARRAY_NAMES):
            return None
        return EmissionPrior.from_arrays(self.arrays, record["kind"])

    @property
    def iteration(self) -> int:
        return int(self.meta["iteration"])

    @property
    def kind(self) -> str:
        """The head's kind, by its registered name."""
        return self.model.kind


class CheckpointFiles(NamedTuple):
    """A checkpoint's two files as bytes (what a registry version stores)."""

    params: bytes
    meta: bytes


def _json_bytes(data: dict[str, Any]) -> bytes:
    """A checkpoint's JSON as written since the first release: indented, non-finite floats as ``NaN``/``Infinity``."""
    return (json.dumps(data, indent=2, allow_nan=True) + "\n").encode()


def read_json_file(path: Path) -> dict[str, Any]:
    """The JSON object in the local file ``path`` (a pointer or a ``meta.json``); anything else raises
    :class:`CheckpointError` naming it."""
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


class ModelDir:
    """A directory of checkpoints with ``latest`` and ``best`` pointers (a local path).

    ``guard``: called before a pointer moves (raising stops the write): the check that the writer still holds the
    directory's lock (:func:`~dist_respattn.artifacts.model_dir_lock.held_lock_check`).
    """

    def __init__(self, path: str | os.PathLike[str], *, guard: Callable[[], None] | None = None) -> None:
        self.path = Path(path)
        self.guard = guard

    def __str__(self) -> str:
        return str(self.path)

    def pointer_path(self, pointer: str) -> Path:
        return self.path / f"{pointer}.json"

    def has_checkpoint(self) -> bool:
        return self.pointer_path(LATEST).is_file()

    def check_writable(self) -> None:
        """Raise :class:`CheckpointError` when checkpoints cannot be written here: the path, or the nearest
        existing directory above it, is a file or read-only. Checked before a fit starts, not at its first
        checkpoint."""
        path = self.path.absolute()
        if path.exists() and not path.is_dir():
            raise CheckpointError(f"{self.path}: a file, not a directory: give a model directory (a new one is made)")
        existing = path
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise CheckpointError(f"{self.path}: {existing} is a file, so no model directory can be made under it")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise CheckpointError(f"{self.path}: {existing} is not writable: give a model directory you can write")

    def foreign_entries(self) -> list[str]:
        """Names in the directory that no fit writes (not a checkpoint, pointer or leftover of a write)."""
        if not self.path.is_dir():
            return []
        ours = {self.pointer_path(LATEST).name, self.pointer_path(BEST).name, FIT_RECORD}
        return sorted(
            entry.name
            for entry in self.path.iterdir()
            if entry.name not in ours and not entry.name.startswith(("ckpt-", TEMP_PREFIX, LOCK_FILE))
        )

    def write_fit_record(self, record: dict[str, Any]) -> None:
        """Replace ``fit.json`` with ``record``: what the fit was asked (its head spec, settings, validation store
        and start, as JSON). Written before a fit's first iteration, so a fit killed before any checkpoint of a
        stage (a staged kind's later stage, say) is resumed with its own settings, not the defaults."""
        self.path.mkdir(parents=True, exist_ok=True)
        replace_file(self.path / FIT_RECORD, _json_bytes({"format": FIT_FORMAT, "version": FORMAT_VERSION, **record}))

    def fit_record(self) -> dict[str, Any] | None:
        """What ``fit.json`` records (see :meth:`write_fit_record`), or ``None`` where there is none (no fit
        started here, or a fit written before the record existed); a damaged record raises
        :class:`CheckpointError` naming it."""
        path = self.path / FIT_RECORD
        if not path.is_file():
            return None
        record = read_json_file(path)
        if record.get("format") != FIT_FORMAT or not isinstance(record.get("settings"), dict):
            raise CheckpointError(
                f"{path}: not a fit's record (format {record.get('format')!r}, expected {FIT_FORMAT!r}, with its "
                "settings): give the fit's settings again, or start over (overwrite=True)"
            )
        if int(record.get("version", 0)) > FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: fit record version {record['version']} is newer than this release reads "
                f"({FORMAT_VERSION}); upgrade dist_respattn"
            )
        return record

    def pointed(self, pointer: str) -> str | None:
        """The checkpoint name ``pointer`` (``"latest"`` or ``"best"``) names, or ``None``."""
        path = self.pointer_path(pointer)
        if not path.is_file():
            return None
        name = read_json_file(path).get("checkpoint")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise CheckpointError(f"{path}: 'checkpoint' must name a checkpoint directory, got {name!r}")
        return name

    def write(
        self,
        name: str,
        model: Head,
        meta: dict[str, Any],
        arrays: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Write checkpoint ``name`` (complete, or not at all). Pointers are moved separately.

        ``arrays``: more float arrays for ``params.npz`` beside the model's (the fit's emission prior). The head's
        kind is recorded by name (``"model": {"kind": ...}``), so any command loads it with its kind's reader.
        """
        model_arrays, model_meta = model.to_arrays()
        params = io.BytesIO()
        np.savez(params, **{**(arrays or {}), **model_arrays})  # type: ignore[arg-type]
        record = {"format": FORMAT, "version": FORMAT_VERSION, "model": {"kind": model.kind, **model_meta}, **meta}
        self.write_files(name, {PARAMS_FILE: params.getvalue(), META_FILE: _json_bytes(record)})

    def write_files(self, name: str, files: dict[str, bytes]) -> None:
        """Write checkpoint ``name`` from its files' bytes (``params.npz``, ``meta.json``), complete or not at all.

        The files go into a temporary directory beside it (``.tmp-<name>.<random>``, which readers skip and
        :meth:`prune` removes), each fsynced, and the directory is renamed into place; a rewrite of the same
        checkpoint (the same iteration of the same run) replaces it.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / name
        temp = Path(temporary_path(final))
        temp.mkdir()
        try:
            for file_name, data in files.items():
                write_synced(temp / file_name, data)
            place_directory(temp, final)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)  # a failed write (a full disk) leaves nothing; a kill, prune's
            raise

    def commit_parts(
        self,
        name: str,
        write_parts: Callable[[Path], dict[str, Any]],
        model_meta: dict[str, Any],
        meta: dict[str, Any],
        *,
        latest: dict[str, Any],
        best: dict[str, Any] | None,
        keep_best: str | None,
        arrays: dict[str, np.ndarray] | None = None,
    ) -> None:
        """:meth:`commit` of a head written in parts by others (a sharded M-step's owners, on the workers).

        ``write_parts(directory)`` writes the parts into the checkpoint's temporary directory and returns the record
        of them (``{"common": file, "shards": [file, ...]}``); then ``params.npz`` (``arrays``: the fit's extras) and
        ``meta.json`` (with ``"parts"``, ``model_meta`` as its ``"model"``) are written, the directory renamed into
        place and the pointers moved, as :meth:`commit` does: a kill at any moment leaves the pointers on complete
        checkpoints.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / name
        temp = Path(temporary_path(final))
        temp.mkdir()
        try:
            parts = write_parts(temp)
            params = io.BytesIO()
            np.savez(params, **(arrays or {}))  # type: ignore[arg-type]
            record = {"format": FORMAT, "version": PARTS_VERSION, "model": model_meta, "parts": parts, **meta}
            write_synced(temp / PARAMS_FILE, params.getvalue())
            write_synced(temp / META_FILE, _json_bytes(record))
            place_directory(temp, final)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        self._point_and_prune(name, latest=latest, best=best, keep_best=keep_best)

    def point(self, pointer: str, name: str, **info: Any) -> None:
        """Atomically make ``pointer`` name checkpoint ``name`` (which must be complete)."""
        if self.guard is not None:
            self.guard()
        replace_file(self.pointer_path(pointer), _json_bytes({"checkpoint": name, **info}))

    def load(self, name: str) -> Checkpoint:
        """Read checkpoint ``name``; a missing or damaged file raises :class:`CheckpointError` naming it."""
        folder = self.path / name
        meta_path, params_path = folder / META_FILE, folder / PARAMS_FILE
        for path in (meta_path, params_path):
            if not path.is_file():
                raise CheckpointError(f"{path}: missing (the checkpoint is incomplete or was removed)")
        return parse_checkpoint(
            name, read_json_file(meta_path), params_path, meta_source=str(meta_path), params_source=str(params_path),
            folder=folder,
        )  # fmt: skip

    def read_files(self, name: str) -> CheckpointFiles:
        """The bytes of checkpoint ``name``'s files, to copy it elsewhere unchanged (a registry version); a
        checkpoint written in parts is copied as one ``params.npz`` (its parts joined) and its ``meta.json``."""
        folder = self.path / name
        meta = read_json_file(folder / META_FILE)
        if "parts" not in meta:
            return CheckpointFiles((folder / PARAMS_FILE).read_bytes(), (folder / META_FILE).read_bytes())
        checkpoint = self.load(name)
        model_arrays, _ = checkpoint.model.to_arrays()
        params = io.BytesIO()
        np.savez(params, **{**checkpoint.arrays, **model_arrays})  # type: ignore[arg-type]
        single = {k: v for k, v in meta.items() if k != "parts"}
        single["version"] = FORMAT_VERSION
        return CheckpointFiles(params.getvalue(), _json_bytes(single))

    def commit(
        self,
        name: str,
        model: Head,
        meta: dict[str, Any],
        *,
        latest: dict[str, Any],
        best: dict[str, Any] | None,
        keep_best: str | None,
        arrays: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Write checkpoint ``name``, point ``latest`` (and ``best`` when given) at it, prune the rest.

        ``keep_best`` is the current best checkpoint (kept); when it is ``None`` a stale ``best.json``
        (left by a fit this one overwrote) is removed, so it cannot shadow ``latest``.
        """
        self.write(name, model, meta, arrays)
        self._point_and_prune(name, latest=latest, best=best, keep_best=keep_best)

    def _point_and_prune(
        self, name: str, *, latest: dict[str, Any], best: dict[str, Any] | None, keep_best: str | None
    ) -> None:
        self.point(LATEST, name, **latest)
        if best is not None:
            self.point(BEST, name, **best)
        elif keep_best is None:
            self.pointer_path(BEST).unlink(missing_ok=True)
        self.prune({name} | ({keep_best} if keep_best else set()))

    def prune(self, keep: set[str]) -> None:
        """Remove checkpoints not in ``keep`` and leftovers of interrupted writes.

        Only the holder of the directory's lock may (the fit whose checkpoints these are): any other checkpoint or
        temporary is then a dead writer's. The lock's own temporary files (``.tmp-lock.json.*``, its heartbeat's)
        are spared, not to fail a beat.
        """
        if not self.path.is_dir():
            return
        for entry in self.path.iterdir():
            stale_temp = entry.name.startswith(TEMP_PREFIX) and not entry.name.startswith(TEMP_PREFIX + LOCK_FILE)
            old_checkpoint = entry.is_dir() and entry.name.startswith("ckpt-") and entry.name not in keep
            if stale_temp or old_checkpoint:
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)


def parse_checkpoint(
    name: str,
    meta: dict[str, Any],
    params: str | os.PathLike[str] | BinaryIO,
    *,
    meta_source: str,
    params_source: str,
    folder: Path | None = None,
) -> Checkpoint:
    """A checkpoint from its ``meta.json`` content and its ``params.npz`` (a path or a binary file).

    Checks the format and rebuilds the head; a damaged file raises :class:`CheckpointError` naming
    ``meta_source`` or ``params_source``. A head written in parts (``"parts"`` in ``meta``) is read from its part
    files in ``folder``.
    """
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_source}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if int(meta.get("version", 0)) > PARTS_VERSION:
        raise CheckpointError(
            f"{meta_source}: checkpoint format version {meta['version']} is newer than this release reads "
            f"({PARTS_VERSION}); upgrade dist_respattn"
        )
    arrays = _read_npz(params, params_source)
    model_meta = meta.get("model") or {}
    # A checkpoint older than recorded kinds holds a single-hop head; an older gated one says so at its top.
    kind = model_meta.get("kind") or meta.get("kind") or "single_hop"
    parts = meta.get("parts")
    try:
        if parts:
            if folder is None:
                raise CheckpointError(f"{meta_source}: a checkpoint in parts is read from its directory")
            common = _read_npz(folder / parts["common"], str(folder / parts["common"]))
            shards = [_read_npz(folder / file, str(folder / file)) for file in parts["shards"]]
            model = head_kind(kind).head.from_shards(common, shards, model_meta)
        else:
            model = head_from_arrays(kind, arrays, model_meta if "kind" in model_meta else {**meta, **model_meta})
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{params_source}: {exc}") from exc
    return Checkpoint(name, model, meta, arrays)


#: The dtype kinds of the arrays a checkpoint holds: bools, signed and unsigned integers, floats.
_NUMBER_KINDS = frozenset("biuf")


def _read_npz(params: str | os.PathLike[str] | BinaryIO, source: str) -> dict[str, np.ndarray]:
    """The arrays of an npz file; a damaged one raises :class:`CheckpointError` naming ``source``."""
    try:
        with np.load(params, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        # A truncated or overwritten npz fails inside zipfile, whose errors are neither OSError nor ValueError.
        raise CheckpointError(
            f"{source}: cannot be read ({type(exc).__name__}: {exc}): the checkpoint is damaged; restore it "
            "from a copy, or fit again (overwrite=True starts over in this model directory)"
        ) from exc
    for key, array in arrays.items():
        # Every array a fit writes is of numbers (bools, integers, floats). The heads' checks convert what they read
        # to float64, which turns text that looks like numbers into numbers and drops nothing of a complex's: refused
        # here, before any of them sees it.
        if array.dtype.kind not in _NUMBER_KINDS:
            raise CheckpointError(
                f"{source}: array {key!r} has dtype {array.dtype}: expected numbers (a fit writes bools, integers "
                "and floats); the checkpoint is damaged; restore it from a copy, or fit again (overwrite=True starts "
                "over in this model directory)"
            )
    return arrays


def checkpoint_name(iteration: int, run_id: str) -> str:
    """``ckpt-<iteration>-<run>``: names sort by iteration, and a new run never overwrites an old one."""
    return f"ckpt-{iteration:06d}-{run_id}"


def load_directory(model_dir: str | os.PathLike[str], which: str = "auto") -> Checkpoint:
    """Load the ``"latest"`` or ``"best"`` checkpoint of the model directory ``model_dir``; ``"auto"`` prefers
    ``best``. A missing directory, pointer or file raises :class:`CheckpointError` naming it."""
    if which not in ("auto", LATEST, BEST):
        raise ValueError(f"which = {which!r}: expected 'auto', 'latest' or 'best'")
    folder = ModelDir(model_dir)
    if not folder.path.is_dir():
        raise CheckpointError(f"{folder}: no such model directory")
    order = [BEST, LATEST] if which == "auto" else [which]
    for pointer in order:
        name = folder.pointed(pointer)
        if name is not None:
            checkpoint = folder.load(name)
            # A head may need another fit its checkpoint names (an older gated head's shared/ fit): it says so.
            model = checkpoint.model.completed(
                str(folder.path), checkpoint.meta, lambda path: load_directory(path).model
            )
            return checkpoint if model is checkpoint.model else dataclasses.replace(checkpoint, model=model)
    raise CheckpointError(
        f"{folder}: no {' or '.join(order)} checkpoint (expected {'/'.join(p + '.json' for p in order)}); "
        "is this the model directory of a fit?"
    )


class BackgroundCheckpoints:
    """Commits checkpoints on one background thread, in order, while the next iteration runs.

    Writing and flushing a checkpoint (tens of MB at S = T = 2000) would otherwise add to every
    iteration. Commits run one at a time in submission order; :meth:`submit` first waits for the
    previous commit and re-raises its error, and :meth:`close` waits for the last one. A process
    killed mid-commit leaves the pointers on the previous complete checkpoint, as a synchronous
    write would.
    """

    def __init__(self, folder: ModelDir) -> None:
        self.folder = folder
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="respattn-checkpoint")
        self._pending: concurrent.futures.Future[None] | None = None

    def submit(self, name: str, model: Head, meta: dict[str, Any], **pointers: Any) -> None:
        """Commit a checkpoint in the background (``pointers``: see :meth:`ModelDir.commit`)."""
        self.wait()
        self._pending = self._pool.submit(self.folder.commit, name, model, meta, **pointers)

    def wait(self) -> None:
        """Block until the last submitted checkpoint is committed; raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self, *, raise_errors: bool = True) -> None:
        """Wait for the last commit and stop the thread; ``raise_errors=False`` when already failing."""
        try:
            self.wait()
        except Exception:
            if raise_errors:
                raise
            logger.exception("the last checkpoint could not be written")
        finally:
            self._pool.shutdown(wait=True)
