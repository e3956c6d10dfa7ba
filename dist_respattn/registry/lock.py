"""The registry's writer lock: one retraining run at a time, and recovery from a holder that died.

The lock is the file ``lock.json``, created exclusively (see :meth:`RegistryFiles.create`), naming its
holder (a random token, host, pid, command) and a heartbeat the holder rewrites every
``stale_after / 4`` seconds from a background thread. A lock is stale, and may be broken by the next
run, when its heartbeat is older than ``stale_after`` or when its holder was on this host and its
process is gone. To break a stale lock a run must first create ``lock.json.broken-<its token>``
exclusively; only the winner of that create deletes the stale lock (after checking it is still the
same one) and creates its own, then removes the claim. Of any number of runs breaking the same stale
lock, exactly one acquires; the others report the registry locked.

The lock is not the only fence: a version number is claimed by an exclusive create too
(:mod:`dist_respattn.registry.registry`), so even two runs that both believed they held the lock
could not publish the same version.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any

from dist_respattn.registry.files import RegistryError, RegistryFiles

logger = logging.getLogger("dist_respattn.registry")

__all__ = ["DEFAULT_STALE_AFTER", "LOCK_FILE", "RegistryLock", "RegistryLocked"]

LOCK_FILE = "lock.json"

#: Seconds without a heartbeat after which a lock counts as abandoned.
DEFAULT_STALE_AFTER = 300.0


class RegistryLocked(RegistryError):
    """Another run holds the registry's lock (the message names it and when it last showed life)."""


class RegistryLock:
    """``with RegistryLock(files):`` holds the registry's lock for the block (or raises :class:`RegistryLocked`)."""

    def __init__(self, files: RegistryFiles, *, stale_after: float = DEFAULT_STALE_AFTER) -> None:
        if not stale_after > 0:
            raise ValueError(f"stale_after = {stale_after}: expected seconds > 0")
        self.files = files
        self.stale_after = float(stale_after)
        self.token = uuid.uuid4().hex
        self.acquired = 0.0
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.lost: str | None = None

    def __enter__(self) -> RegistryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def record(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": " ".join(sys.argv[:3]),
            "acquired": self.acquired,
            "heartbeat": time.time(),
            "stale_after": self.stale_after,
        }

    def acquire(self) -> None:
        self.acquired = time.time()
        if not self.files.create_json(LOCK_FILE, self.record()):
            holder = self.files.read_json(LOCK_FILE)
            if holder is not None:  # (None: it was released as we looked; try once more)
                reason = self._stale_reason(holder)
                if reason is None:
                    raise RegistryLocked(self._describe(holder))
                logger.warning("%s: breaking a stale lock (%s)", self.files.where(LOCK_FILE), reason)
                self._break(holder)
            elif not self.files.create_json(LOCK_FILE, self.record()):
                raise RegistryLocked(self._describe(self.files.read_json(LOCK_FILE)))
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name="respattn-registry-lock", daemon=True)
        self._heartbeat.start()

    def check(self) -> None:
        """Raise :class:`RegistryLocked` unless this run still holds the lock (call before publishing)."""
        holder = self.files.read_json(LOCK_FILE)
        if holder is None or holder.get("token") != self.token:
            raise RegistryLocked(
                f"{self.files.where(LOCK_FILE)}: this run lost the registry lock "
                f"({self.lost or 'it was broken as stale by another run'}); nothing was published"
            )

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        holder = self.files.read_json(LOCK_FILE)
        if holder is not None and holder.get("token") == self.token:
            self.files.delete(LOCK_FILE)

    def _beat(self) -> None:
        while not self._stop.wait(self.stale_after / 4):
            try:
                holder = self.files.read_json(LOCK_FILE)
                if holder is None or holder.get("token") != self.token:
                    self.lost = "the lock file was replaced while this run held it"
                    return
                self.files.write_json(LOCK_FILE, self.record())
            except Exception as exc:  # a missed beat is retried; check() decides before publishing
                self.lost = f"a heartbeat failed: {exc}"

    def _stale_reason(self, holder: dict[str, Any]) -> str | None:
        """Why ``holder``'s lock is abandoned, or ``None`` when it is alive."""
        age = time.time() - float(holder.get("heartbeat") or 0.0)
        if age > _holder_stale_after(holder, self.stale_after):
            return f"no heartbeat for {age:.0f} s"
        if holder.get("host") == socket.gethostname() and not _process_alive(holder.get("pid")):
            return f"its process {holder.get('pid')} on this host is gone"
        return None

    def _break(self, stale: dict[str, Any]) -> None:
        """Replace the stale lock with this run's, if this run wins the claim on it (else raise).

        The claim is released once this run's lock exists: a slower breaker that then wins the claim
        finds the lock changed and backs off, so it never deletes a live lock.
        """
        claim = f"{LOCK_FILE}.broken-{stale.get('token')}"
        if not self.files.create_json(claim, {"by": self.token, "at": time.time()}):
            left = self.files.read_json(claim) or {}
            if time.time() - float(left.get("at") or 0.0) > self.stale_after:  # its breaker died mid-break
                self.files.delete(claim)
                return self._break(stale)
            raise RegistryLocked(
                f"{self.files.where(LOCK_FILE)}: another run is taking over the stale lock of "
                f"pid {stale.get('pid')} on {stale.get('host')}"
            )
        try:
            current = self.files.read_json(LOCK_FILE)
            if current is not None and current.get("token") != stale.get("token"):
                raise RegistryLocked(self._describe(current))  # another run replaced it first
            self.files.delete(LOCK_FILE)
            if not self.files.create_json(LOCK_FILE, self.record()):
                raise RegistryLocked(self._describe(self.files.read_json(LOCK_FILE)))
        finally:
            self.files.delete(claim)

    def _describe(self, holder: dict[str, Any] | None) -> str:
        if holder is None:
            return f"{self.files.where(LOCK_FILE)}: the registry is locked by another run"
        age = time.time() - float(holder.get("heartbeat") or 0.0)
        return (
            f"{self.files.where(LOCK_FILE)}: the registry is locked by another run "
            f"({holder.get('command')!s}, pid {holder.get('pid')} on {holder.get('host')}, "
            f"last heartbeat {age:.0f} s ago); it counts as abandoned after "
            f"{_holder_stale_after(holder, self.stale_after):.0f} s "
            "without a heartbeat"
        )


def _holder_stale_after(holder: dict[str, Any], default: float) -> float:
    """The holder's own staleness limit (it beats at a quarter of it), else ``default``."""
    try:
        return float(holder.get("stale_after", default))
    except (TypeError, ValueError):
        return default


def _process_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie (killed, not yet reaped) is gone for our purpose
        with open(f"/proc/{int(pid)}/stat") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                return False
    return True
