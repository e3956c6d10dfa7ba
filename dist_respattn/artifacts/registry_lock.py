"""The registry's writer lock: one retraining run at a time, and recovery from a holder that died.

The lock is the file ``lock.json`` under the registry's root, a :class:`~dist_respattn.durable.lock.WriterLock`
(heartbeat, stale-lock recovery, exclusive break claims). It is not the only fence: a version number
is claimed by an exclusive create too (:mod:`dist_respattn.artifacts.registry`), so even two runs that
both believed they held the lock could not publish the same version.
"""

from __future__ import annotations

import logging

from dist_respattn.artifacts.registry_files import RegistryError, RegistryFiles
from dist_respattn.durable.lock import DEFAULT_STALE_AFTER, WriterLock

__all__ = ["DEFAULT_STALE_AFTER", "LOCK_FILE", "RegistryLock", "RegistryLocked"]

LOCK_FILE = "lock.json"


class RegistryLocked(RegistryError):
    """Another run holds the registry's lock (the message names it and when it last showed life)."""


class RegistryLock(WriterLock):
    """``with RegistryLock(files):`` holds the registry's lock for the block (or raises :class:`RegistryLocked`)."""

    locked_error = RegistryLocked
    held_by = "the registry is locked by another run"
    lock_noun = "registry lock"
    what_is_lost = "nothing was published"
    logger = logging.getLogger("dist_respattn.registry")

    def __init__(self, files: RegistryFiles, *, stale_after: float = DEFAULT_STALE_AFTER) -> None:
        super().__init__(files, LOCK_FILE, stale_after=stale_after)
