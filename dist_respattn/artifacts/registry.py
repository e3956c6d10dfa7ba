"""A model registry: numbered versions of a head with their metrics and provenance, and a ``latest`` pointer.

Layout under the registry's root (a local directory or an fsspec URL)::

    registry.json            {"format": "dist_respattn.registry", "version": 1}
    latest.json              {"version": 7, "published": "..."}
    versions/000007.json     the version's record: metrics, gate, provenance, and its model's files + SHA-256
    models/<token>/params.npz, meta.json   the checkpoint published as that version (arrays + JSON, never pickles)

Publishing writes the model's files under a fresh token, then claims the version number by creating
``versions/<n>.json`` exclusively, then replaces ``latest.json``. A writer killed at any point leaves
``latest.json`` naming a complete version: before the claim, the new files are an orphan (removed by
the next run); after it, the version exists and ``latest`` still names the previous one until replaced.

A version's record carries ``record_sha256``, the SHA-256 of the rest of the record (its canonical
JSON: sorted keys, no spaces), and names its model's files with theirs, so an edited record or file is
found by :meth:`Registry.problems` and refused by :meth:`Registry.load` (and marked by ``models list``). A
record may name only a folder ``models/<token>`` of the registry and its two files, so no record, even with a
recomputed checksum, makes a command read outside the registry. Versions without a usable ``latest`` (the
pointer deleted, a first publish killed between the claim and the pointer, or the version it names edited or
damaged) are a problem too: ``retrain`` refuses to publish past them without the gate, and
:meth:`Registry.repair_latest` (``dist-respattn models repair``) points ``latest`` at the newest version that
checks out.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dist_respattn.artifacts.checkpoints import (
    LATEST,
    META_FILE,
    PARAMS_FILE,
    Checkpoint,
    CheckpointError,
    ModelDir,
    parse_checkpoint,
)
from dist_respattn.artifacts.registry_files import RegistryError, RegistryFiles
from dist_respattn.artifacts.registry_lock import LOCK_FILE, RegistryLock
from dist_respattn.durable.files import TEMP_PREFIX, json_bytes
from dist_respattn.text_format import count_text

__all__ = ["FORMAT", "REGISTRY_FILE", "Registry", "Version"]

FORMAT = "dist_respattn.registry"
FORMAT_VERSION = 1
REGISTRY_FILE = "registry.json"
LATEST_FILE = "latest.json"
#: The key of a version record's own checksum.
RECORD_SHA256 = "record_sha256"
VERSIONS = "versions"
MODELS = "models"
_VERSION_NAME = re.compile(r"^(\d{6,})\.json$")
#: What a version record's ``"model"`` may name: one folder directly under ``models/`` (publish names it by a
#: random token), never a path that leaves the registry (``..``, an absolute path, a URL).
_MODEL_FOLDER = re.compile(rf"^{MODELS}/[A-Za-z0-9_-]+$")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_checksum(record: dict[str, Any]) -> str:
    """The SHA-256 of a version record without its ``record_sha256``: its canonical JSON (sorted keys, no spaces)."""
    rest = {k: v for k, v in record.items() if k != RECORD_SHA256}
    return _sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())


@dataclass(frozen=True)
class Version:
    """One published version: its number and its record (``versions/<n>.json``).

    The record holds ``created``, ``metrics`` (the gate's scores of this model), ``gate`` (the
    comparison that let it in), ``provenance`` (store and validation store URL, fingerprint and rows,
    iterations, settings, package version, warm start) and ``files`` (the model's files and hashes).
    """

    number: int
    record: dict[str, Any]

    @property
    def model_path(self) -> str:
        """The folder of the version's model files, as the record names it (checked by
        :meth:`Registry.check_record` before any file is read)."""
        return str(self.record.get("model", ""))

    def to_json(self) -> dict[str, Any]:
        return dict(self.record)


class Registry:
    """A registry at ``url`` (a local directory, created on first publish, or an fsspec URL)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.files = RegistryFiles(url, storage_options)

    def __str__(self) -> str:
        return str(self.files)

    def lock(self, **kwargs: Any) -> RegistryLock:
        """The registry's writer lock (see :class:`RegistryLock`)."""
        return RegistryLock(self.files, **kwargs)

    # -- reading ---------------------------------------------------------------------------------

    def check_format(self) -> bool:
        """``True`` for a registry, ``False`` for an empty or missing root; anything else is an error."""
        marker = self.files.read_json(REGISTRY_FILE)
        if marker is None:
            # The lock, its break claims and a killed write's temporary files are not content.
            others = [n for n in self.files.listdir("") if not n.startswith((LOCK_FILE, TEMP_PREFIX))]
            if others:
                raise RegistryError(
                    f"{self.files.where(REGISTRY_FILE)}: missing, but {self.files} holds {', '.join(others[:5])}: "
                    "not a model registry (give an empty or new directory)"
                )
            return False
        if marker.get("format") != FORMAT:
            raise RegistryError(
                f"{self.files.where(REGISTRY_FILE)}: format {marker.get('format')!r}, expected {FORMAT!r}"
            )
        if int(marker.get("version", 0)) > FORMAT_VERSION:
            raise RegistryError(
                f"{self.files.where(REGISTRY_FILE)}: registry format version {marker['version']} is newer than "
                f"this release reads ({FORMAT_VERSION}); upgrade dist_respattn"
            )
        return True

    def numbers(self) -> list[int]:
        """The numbers of every version, ascending."""
        found = (_VERSION_NAME.match(name) for name in self.files.listdir(VERSIONS))
        return sorted(int(m.group(1)) for m in found if m)

    def version(self, number: int) -> Version:
        record = self.files.read_json(_version_file(number))
        if record is None:
            raise RegistryError(f"{self.files.where(_version_file(number))}: no version {number} in {self}")
        return Version(number, record)

    def versions(self) -> list[Version]:
        """Every version, oldest first."""
        return [self.version(n) for n in self.numbers()] if self.check_format() else []

    def latest_number(self) -> int | None:
        """The version ``latest`` names, or ``None`` for an empty registry."""
        if not self.check_format():
            return None
        pointer = self.files.read_json(LATEST_FILE)
        if pointer is None:
            return None
        number = pointer.get("version")
        if not isinstance(number, int) or number < 1:
            raise RegistryError(f"{self.files.where(LATEST_FILE)}: 'version' must be a version number, got {number!r}")
        return number

    def latest(self) -> Version | None:
        number = self.latest_number()
        return None if number is None else self.version(number)

    def resolve(self, which: str | int | None) -> Version:
        """A version by number, or ``latest`` (also for ``None``)."""
        if which is None or which == "latest":
            latest = self.latest()
            if latest is None:
                raise RegistryError(f"{self}: the registry has no published version yet")
            return latest
        try:
            number = int(which)
        except ValueError as exc:
            raise RegistryError(f"{which!r}: expected a version number or 'latest'") from exc
        return self.version(number)

    def _verified_files(self, version: Version) -> dict[str, bytes]:
        """The model files of ``version``: its record checked against its own checksum, each file against the
        SHA-256 the record holds."""
        self.check_record(version)
        contents = {}
        for name, digest in version.record["files"].items():
            where = f"{version.model_path}/{name}"
            data = self.files.read(where)
            if data is None:
                raise RegistryError(f"{self.files.where(where)}: missing (version {version.number} is damaged)")
            if _sha256(data) != digest:
                raise RegistryError(
                    f"{self.files.where(where)}: SHA-256 differs from version {version.number}'s record"
                )
            contents[name] = data
        return contents

    def _parse(self, version: Version, contents: dict[str, bytes]) -> Checkpoint:
        try:
            return parse_checkpoint(
                f"version {version.number}",
                json.loads(contents[META_FILE]),
                io.BytesIO(contents[PARAMS_FILE]),
                meta_source=self.files.where(f"{version.model_path}/{META_FILE}"),
                params_source=self.files.where(f"{version.model_path}/{PARAMS_FILE}"),
            )
        except (CheckpointError, ValueError) as exc:
            raise RegistryError(str(exc)) from exc

    def load(self, which: str | int | None = "latest") -> Checkpoint:
        """The checkpoint published as version ``which``; its files are checked against their SHA-256."""
        version = self.resolve(which)
        return self._parse(version, self._verified_files(version))

    def export(self, which: str | int | None, directory: str | os.PathLike[str]) -> tuple[Version, Path]:
        """Write version ``which`` as a model directory at ``directory`` (a new or empty local directory).

        The files are the published bytes, checked against the record, so the directory's model is the
        version's bit for bit; ``latest`` points at it. Returns the version and the checkpoint's path.
        """
        target = Path(directory)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise RegistryError(f"{target}: exists and is not an empty directory; give a new directory to export to")
        version = self.resolve(which)
        contents = self._verified_files(version)
        checkpoint = self._parse(version, contents)  # a version that does not load is not exported
        iteration = int(checkpoint.meta.get("iteration", 0))
        name = f"ckpt-{iteration:06d}-v{version.number:06d}"
        # Written beside DIR and renamed into place, so a killed export leaves DIR as it was (the next export, to
        # the same DIR, removes the killed one's staging copy) instead of a DIR no export will write into.
        staging = target.absolute().with_name(f".{target.absolute().name}.partial-export")
        if staging.exists():
            shutil.rmtree(staging)
        folder = ModelDir(staging)
        folder.write_files(name, contents)
        folder.point(LATEST, name, iteration=iteration, registry=str(self), version=version.number)
        if target.exists():
            target.rmdir()  # empty, as checked above
        os.replace(staging, target)
        return version, target / name

    def check_record(self, version: Version) -> None:
        """Raise :class:`RegistryError` unless ``version``'s record matches its own checksum (an edited record is
        refused) and names only what a published record names: a folder ``models/<token>`` of this registry and
        its files ``params.npz`` and ``meta.json`` (a record that would read outside the registry is refused, even
        with a recomputed checksum). Reads the record only, not the model's files."""
        where = self.files.where(_version_file(version.number))
        recorded = version.record.get(RECORD_SHA256)
        if recorded is None:
            raise RegistryError(f"{where}: no {RECORD_SHA256}: the record is not covered by a checksum")
        if recorded != record_checksum(version.record):
            raise RegistryError(f"{where}: the record differs from its {RECORD_SHA256} (edited after it was published)")
        model = version.record.get("model")
        if not isinstance(model, str) or not _MODEL_FOLDER.match(model):
            raise RegistryError(
                f"{where}: 'model' must name a folder {MODELS}/<token> inside the registry, got {model!r} (the record "
                "was not written by a publish)"
            )
        files = version.record.get("files")
        if not isinstance(files, dict) or set(files) != {PARAMS_FILE, META_FILE}:
            raise RegistryError(f"{where}: expected files {PARAMS_FILE}, {META_FILE}")

    def record_problem(self, version: Version) -> str | None:
        """Why ``version``'s record is not to be trusted (:meth:`check_record`), or ``None`` when it checks out."""
        try:
            self.check_record(version)
        except RegistryError as exc:
            return str(exc)
        return None

    def missing_latest(self) -> str | None:
        """Why ``latest`` is unusable although versions exist (a problem ``retrain`` refuses), else ``None``: it is
        missing, unreadable, names no version, or names a version that does not check out while others exist
        (which :meth:`repair_latest` may point it at instead)."""
        if not self.check_format():
            return None
        numbers = self.numbers()
        if not numbers:
            return None
        repair = f"run `dist-respattn models repair {self}` to point it at the newest version that checks out"
        try:
            latest = self.latest_number()
        except RegistryError as exc:  # an edited or damaged pointer: repair replaces it
            return f"{exc}: {repair}"
        if latest is None:
            exist = "exists" if len(numbers) == 1 else "exist"
            state = f"missing, but {count_text(len(numbers), 'version')} {exist} ({_span(numbers)})"
        elif latest not in numbers:
            state = f"names version {latest}, which does not exist"
        elif len(numbers) == 1:
            return None  # no other version to point at: the version's own problem is what there is to say
        else:
            try:
                self.load(latest)
            except RegistryError:
                state = f"names version {latest}, whose record or files do not check out (models check says why)"
            else:
                return None
        return f"{self.files.where(LATEST_FILE)}: {state}: {repair}"

    def problems(self) -> list[str]:
        """Everything wrong with the registry: versions without a usable ``latest``, edited or damaged versions."""
        found: list[str] = []
        try:
            latest_problem = self.missing_latest()
            numbers = self.numbers()
        except RegistryError as exc:
            return [str(exc)]
        if latest_problem is not None:
            found.append(latest_problem)
        for number in numbers:
            try:
                self.load(number)
            except RegistryError as exc:
                found.append(str(exc))
        return found

    # -- writing (under the lock) ----------------------------------------------------------------------

    def publish(self, lock: RegistryLock, params: bytes, meta: bytes, record: dict[str, Any]) -> Version:
        """Publish a checkpoint as the next version and point ``latest`` at it.

        ``params`` and ``meta`` are the checkpoint's ``params.npz`` and ``meta.json`` bytes; ``record``
        holds the version's ``metrics``, ``gate`` and ``provenance``.
        """
        lock.check()
        if not self.check_format():
            self.files.create_json(REGISTRY_FILE, {"format": FORMAT, "version": FORMAT_VERSION, "created": _now()})
        numbers = self.numbers()
        number = max(numbers, default=0) + 1
        folder = f"{MODELS}/{uuid.uuid4().hex[:12]}"
        self.files.write(f"{folder}/{PARAMS_FILE}", params)
        self.files.write(f"{folder}/{META_FILE}", meta)
        full = {
            "format": FORMAT,
            "version": number,
            "created": _now(),
            **record,
            "model": folder,
            "files": {PARAMS_FILE: _sha256(params), META_FILE: _sha256(meta)},
        }
        full = json.loads(json_bytes(full))  # the record as it will be read back (non-finite floats as null)
        full[RECORD_SHA256] = record_checksum(full)
        lock.check()
        if not self.files.create_json(_version_file(number), full):
            raise RegistryError(
                f"{self.files.where(_version_file(number))}: version {number} was claimed by another run at the same "
                "time; nothing was published (the registry lock was broken while held)"
            )
        self.files.write_json(LATEST_FILE, {"version": number, "published": _now()})
        return Version(number, full)

    def repair_latest(self, lock: RegistryLock, number: int | None = None) -> int | None:
        """Point ``latest`` at version ``number`` (default: the newest that checks out) when it is missing, names
        no version, or names one that does not check out (see :meth:`missing_latest`); return the version it names
        now (``None``: no version checks out, nothing written).

        A ``latest`` that names a version that checks out is left as it is (and returned).
        """
        lock.check()
        if self.missing_latest() is None:
            if number is not None:
                numbers = self.numbers()
                absent = "" if number in numbers else f"there is no version {number}, and "
                held = ", ".join(map(str, numbers)) if len(numbers) <= 8 else f"{numbers[0]} to {numbers[-1]}"
                raise RegistryError(
                    f"{self.files.where(LATEST_FILE)}: names version {self.latest_number()}, which checks out: "
                    f"nothing to repair (--version {number} is for a latest that does not; {absent}the registry "
                    f"holds versions {held})"
                )
            return self.latest_number()
        candidates = [number] if number is not None else list(reversed(self.numbers()))
        for candidate in candidates:
            try:
                self.load(candidate)
            except RegistryError:
                if number is not None:
                    raise
                continue
            lock.check()
            self.files.write_json(LATEST_FILE, {"version": candidate, "published": _now(), "repaired": True})
            return candidate
        return None

    def prune(self, lock: RegistryLock, keep: int) -> list[int]:
        """Remove all but the newest ``keep`` versions (never ``latest``), and model files no version names."""
        if keep < 1:
            raise ValueError(f"keep = {keep}: expected at least 1")
        lock.check()
        latest = self.latest_number()
        numbers = self.numbers()
        doomed = [n for n in numbers[: max(0, len(numbers) - keep)] if n != latest]
        for number in doomed:
            self.files.delete(_version_file(number))  # the version goes first: its files become an orphan
        self.remove_orphans(lock)
        return doomed

    def remove_orphans(self, lock: RegistryLock) -> list[str]:
        """Remove what killed runs left: model folders no version names, and unrenamed temporary files."""
        lock.check()
        named = {self.version(n).model_path for n in self.numbers()}
        orphans = [f"{MODELS}/{name}" for name in self.files.listdir(MODELS) if f"{MODELS}/{name}" not in named]
        for folder in orphans:
            self.files.delete(folder)
        # A run waiting for the lock writes lock.json (and lock.json.broken-*) through a temporary of its own:
        # removing it under that run would fail its claim with a missing file, not with "locked".
        orphans += self.files.remove_temporaries("", sparing=LOCK_FILE)
        orphans += self.files.remove_temporaries(VERSIONS)
        return orphans


def _span(numbers: list[int]) -> str:
    return str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}"


def _version_file(number: int) -> str:
    return f"{VERSIONS}/{number:06d}.json"
