"""Files on a local disk or behind any fsspec URL, and the three whole-file writes that stay sound under a kill.

The model registry and the stores' writer lock must stay readable whatever moment their writer dies at,
on filesystems without a rename of directories (object stores). So they are built from whole-object
writes only:

- :meth:`AtomicFiles.write`: replace one file whole (local: temp file, fsync, ``os.replace``; an
  object store's PUT is atomic per object);
- :meth:`AtomicFiles.create`: write one file only if it does not exist (local: a hard link of a
  complete temp file, which fails when the name exists; S3: ``If-None-Match: *``; any other fsspec
  backend: its ``pipe_file(mode="create")``, which is exclusive only where the backend makes it so);
- :meth:`AtomicFiles.delete`.

A local file too large to build in memory (a file of rows written as they come) uses the same pieces:
write it under :func:`temporary_path`, fsync it, then :func:`place_file` it under its name. A folder of
files that must appear together (a checkpoint) is written under a temporary name too, then moved into place
whole by :func:`place_directory`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import posixpath
import shutil
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = [
    "TEMP_PREFIX",
    "AtomicFiles",
    "fsync_directory",
    "json_bytes",
    "place_directory",
    "place_file",
    "replace_file",
    "temporary_path",
    "write_synced",
]

#: The prefix of a local write's temporary file (the readers of these files ignore such names).
TEMP_PREFIX = ".tmp-"


class AtomicFiles:
    """Files under a root: ``url`` is a local directory or an fsspec URL (``s3://bucket/models``).

    ``error`` is the exception a file that is not valid JSON raises (subclasses name their own).
    """

    error: type[ValueError] = ValueError

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.url = str(url)
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.local = isinstance(self.fs, LocalFileSystem)

    @classmethod
    def beside(
        cls, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> tuple[AtomicFiles, str]:
        """The files of the folder holding ``url``, and its name there (``s3://b/x.zarr``: ``s3://b/``, ``x.zarr``).

        For files that belong to ``url`` but must outlive it being deleted or replaced, such as its lock.
        """
        text = str(url).rstrip("/")
        name = posixpath.basename(text)
        files = cls(text, storage_options)
        files.root = posixpath.dirname(files.root.rstrip("/")) or "/"
        files.url = text[: len(text) - len(name)]  # keeps the scheme of a URL at the top of its bucket
        return files, name

    def __str__(self) -> str:
        return self.url

    def path(self, name: str) -> str:
        """The full path of ``name`` (a ``/``-separated path under the root)."""
        return posixpath.join(self.root, name)

    def where(self, name: str) -> str:
        """``name`` as the user would write it (for messages): the URL joined with the name."""
        return posixpath.join(self.url, name)

    def read(self, name: str) -> bytes | None:
        """The bytes of ``name``, or ``None`` when it does not exist."""
        try:
            return bytes(self.fs.cat_file(self.path(name)))
        except FileNotFoundError:
            return None

    def read_json(self, name: str) -> dict[str, Any] | None:
        """The JSON object in ``name``, or ``None`` when the file does not exist."""
        data = self.read(name)
        if data is None:
            return None
        try:
            value = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self.error(f"{self.where(name)}: not valid JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise self.error(f"{self.where(name)}: expected a JSON object")
        return value

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` whole: a reader sees the old bytes or the new ones, never a mix."""
        path = self.path(name)
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        place_file(self._write_temp(path, data), path, replace=True)

    def create(self, name: str, data: bytes) -> bool:
        """Write ``name`` only if it does not exist; ``False`` when it does (someone else created it)."""
        path = self.path(name)
        if not self.local:
            try:
                self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                return False
            return True
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return place_file(self._write_temp(path, data), path, replace=False)

    def write_json(self, name: str, value: dict[str, Any]) -> None:
        self.write(name, json_bytes(value))

    def create_json(self, name: str, value: dict[str, Any]) -> bool:
        return self.create(name, json_bytes(value))

    def delete(self, name: str) -> None:
        """Remove ``name`` (a file or a folder); already gone is fine."""
        path = self.path(name)
        with contextlib.suppress(FileNotFoundError):
            if self.fs.isdir(path):
                self.fs.rm(path, recursive=True)
            else:
                self.fs.rm_file(path)

    def listdir(self, folder: str) -> list[str]:
        """The names directly under ``folder`` (empty when it does not exist)."""
        self.fs.invalidate_cache()  # another run may have written since we last looked
        try:
            entries = self.fs.ls(self.path(folder), detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)

    def remove_temporaries(self, folder: str, *, sparing: str | None = None) -> list[str]:
        """Remove the temporary files of local writes that were killed before their rename (``.tmp-*``).

        ``sparing``: leave the temporaries of files named so or starting so, which other live runs may be
        writing at this moment.
        """
        spared = None if sparing is None else f"{TEMP_PREFIX}{sparing}"
        doomed = [
            name
            for name in self.listdir(folder)
            if name.startswith(TEMP_PREFIX) and (spared is None or not name.startswith(spared))
        ]
        for name in doomed:
            self.delete(posixpath.join(folder, name))
        return doomed

    def _write_temp(self, path: str, data: bytes) -> str:
        temp = temporary_path(path)
        write_synced(temp, data)
        return temp


def temporary_path(path: str | os.PathLike[str]) -> str:
    """A new temporary name beside the local file ``path`` (``folder/.tmp-NAME.1a2b3c4d``).

    Its :data:`TEMP_PREFIX` is what the readers skip and :meth:`AtomicFiles.remove_temporaries` cleans up after
    a writer killed before its rename.
    """
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(folder, f"{TEMP_PREFIX}{name}.{uuid.uuid4().hex[:8]}")


#: What ``os.link`` raises on a filesystem without hard links (vfat, exFAT, SMB without unix extensions, some FUSE).
_NO_HARD_LINKS = frozenset(
    code
    for code in (errno.EPERM, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None), errno.ENOSYS, errno.EMLINK)
    if code
)


def place_file(
    temp: str | os.PathLike[str], path: str | os.PathLike[str], *, replace: bool, keep_if_taken: bool = False
) -> bool:
    """Move the complete, fsynced local file ``temp`` to ``path`` in one step, and make the move durable.

    ``replace``: an existing ``path`` is replaced (``os.replace``: a reader sees the old file or the new one).
    Otherwise ``path`` is created only if it does not exist (a hard link, which fails on an existing name,
    so two writers never both succeed; on a filesystem without hard links, the name is claimed with
    ``O_EXCL`` and then replaced) and ``False`` is returned when it does. ``temp`` is gone afterwards, except
    when the name was taken and ``keep_if_taken`` asks to keep it (the caller then owns it).
    """
    temp, path = os.fspath(temp), os.fspath(path)
    taken = False
    try:
        if replace:
            os.replace(temp, path)
        else:
            try:
                _create_from(temp, path)
            except FileExistsError:
                taken = True
                return False
    finally:
        if not (taken and keep_if_taken):
            with contextlib.suppress(FileNotFoundError):  # moved into place already, or a failed move's leftover
                os.unlink(temp)
    fsync_directory(os.path.dirname(path) or ".")  # the new name survives a power cut, not just the bytes
    return True


def replace_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the local file ``path`` whole with ``data`` (a temporary file, fsynced, then :func:`place_file`).

    A reader sees the old bytes or the new ones, never a mix, whatever moment the writer dies at.
    """
    temp = temporary_path(path)
    write_synced(temp, data)
    place_file(temp, path, replace=True)


def write_synced(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to the local file ``path`` and flush it to disk (the bytes, not yet the name)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def place_directory(temp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Move the complete local directory ``temp`` (its files fsynced) to ``path`` in one rename, made durable.

    An existing ``path`` is removed first (a rewrite of the same folder): a directory cannot be replaced in one
    step, so callers point readers at such a folder only after it is in place (a checkpoint's pointer).
    """
    temp, path = os.fspath(temp), os.fspath(path)
    fsync_directory(temp)  # its entries, before the rename makes them visible under the real name
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.rename(temp, path)
    fsync_directory(os.path.dirname(path) or ".")


def _create_from(temp: str, path: str) -> None:
    """``path`` with ``temp``'s content, only if ``path`` does not exist (``FileExistsError`` if it does)."""
    try:
        os.link(temp, path)  # atomic, fails on an existing name, and the content is already complete
    except OSError as exc:
        if isinstance(exc, FileExistsError) or exc.errno not in _NO_HARD_LINKS:
            raise
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))  # claim the name, or FileExistsError
        os.replace(temp, path)


def json_bytes(value: dict[str, Any]) -> bytes:
    """The bytes :meth:`AtomicFiles.write_json` writes: indented strict JSON, non-finite floats as ``null``."""
    return (json.dumps(_finite(value), indent=2, allow_nan=False) + "\n").encode()


def _finite(value: Any) -> Any:
    """``value`` with every infinite or NaN float replaced by ``None`` (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """Flush a local directory's entries (a rename or link in it) to disk; a filesystem that cannot is skipped."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
