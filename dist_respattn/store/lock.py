"""A store's writer lock: one writer at a time (``ingest``, ``--append``, ``--overwrite``, ``repair``).

The lock is the file ``<store>.lock`` beside the store (``corpus.zarr.lock``, ``s3://bucket/corpus.zarr.lock``),
so it exists before a new store does and outlives an ``--overwrite`` swapping the store's folder. It is
a :class:`~dist_respattn.durable.lock.WriterLock`: created exclusively (a hard link locally, a
conditional PUT on S3), a heartbeat every ``stale_after / 4`` seconds, and broken by the next writer
when its holder's process is gone from this host or its heartbeat is older than ``stale_after``.

Under the lock a writer also removes what killed writers left beside the store: the staging copies
``<store>.partial-<id>`` of an ``--overwrite`` or a stream store (:func:`remove_partials`).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from dist_respattn.durable.files import AtomicFiles
from dist_respattn.durable.lock import DEFAULT_STALE_AFTER, WriterLock
from dist_respattn.store.errors import StoreError
from dist_respattn.store.location import StoreLocation

__all__ = ["LOCK_SUFFIX", "PARTIAL_SUFFIX", "StoreLock", "StoreLocked", "live_writer", "remove_partials"]

logger = logging.getLogger("dist_respattn.store")

#: The lock of store ``X`` is the file ``X.lock``.
LOCK_SUFFIX = ".lock"
#: A writer that replaces store ``X`` builds the new one at ``X.partial-<8 hex digits>``.
PARTIAL_SUFFIX = ".partial-"
_PARTIAL_ID = re.compile(r"^[0-9a-f]{8}$")


class StoreLocked(StoreError):
    """Another live writer holds the store's lock (the message names it and when it last showed life)."""


class _StoreFiles(AtomicFiles):
    error = StoreError


class StoreLock(WriterLock):
    """``with StoreLock.of(url, purpose="append"):`` holds the store's writer lock (or raises :class:`StoreLocked`)."""

    locked_error = StoreLocked
    held_by = "the store is being written by another writer"
    lock_noun = "store's writer lock"
    what_is_lost = "the store was not marked complete"
    logger = logger

    @classmethod
    def of(
        cls,
        url: str | os.PathLike[str] | StoreLocation,
        storage_options: dict[str, Any] | None = None,
        *,
        purpose: str | None = None,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> StoreLock:
        """The lock of the store at ``url`` (not yet acquired); ``purpose`` says what the holder does."""
        location = StoreLocation.of(url, storage_options)
        files, name = _StoreFiles.beside(location.url, location.options)
        return cls(files, name + LOCK_SUFFIX, stale_after=stale_after, purpose=purpose)

    @classmethod
    def take(cls, location: StoreLocation, *, purpose: str, stale_after: float = DEFAULT_STALE_AFTER) -> StoreLock:
        """The store's lock, acquired (raises :class:`StoreLocked` when a live writer holds it)."""
        lock = cls.of(location, purpose=purpose, stale_after=stale_after)
        lock.acquire()
        return lock


def live_writer(location: StoreLocation) -> str | None:
    """Who is writing the store now (a message naming the lock and its holder), or ``None``."""
    try:
        return StoreLock.of(location).live_holder()
    except (OSError, StoreError):  # an unreadable lock says nothing about a live writer
        return None


def remove_partials(location: StoreLocation) -> list[str]:
    """Delete the staging copies ``<store>.partial-<id>`` beside the store; their writers are dead.

    Call only under the store's lock: every writer of ``<store>`` holds it while its copy exists, so
    a copy found by the lock's holder belongs to a writer that was killed.
    """
    fs, root = location.filesystem()
    folder, name = os.path.split(root)
    try:
        entries = fs.ls(folder or "/", detail=False)
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        base = os.path.basename(str(entry).rstrip("/"))
        if base.startswith(name + PARTIAL_SUFFIX) and _PARTIAL_ID.match(base[len(name) + len(PARTIAL_SUFFIX) :]):
            fs.rm(str(entry).rstrip("/"), recursive=True)
            removed.append(f"{location.url}{base[len(name) :]}")
    if removed:
        logger.warning("%s: removed what killed writers left: %s", location, ", ".join(removed))
    return removed
