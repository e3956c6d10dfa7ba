"""A writer lock on a local disk or behind any fsspec URL: one writer at a time, and recovery from a holder that died.

The lock is one file (the registry's ``lock.json``, a store's ``<store>.lock``, a model directory's ``lock.json``),
created exclusively (see :meth:`AtomicFiles.create`), naming its holder (a random token, host, pid and when that
process started, command, purpose) and a heartbeat the holder rewrites every ``stale_after / 4`` seconds from a
background thread. A lock is stale, and may be broken by the next run, when its heartbeat is older than
``stale_after`` or when its holder was on this host and its process is gone: no process has its pid, or
(where ``/proc`` says when a process started) the one that has it started at another moment, the holder
having been killed and its pid reused (a container restarted in its pod runs its command under the same
host name and pid, often 1). To break a stale lock a run must first create ``<lock>.broken-<its token>``
exclusively; only the winner of that create deletes the stale lock (after checking it is still the
same one) and creates its own, then removes the claim. Of any number of runs breaking the same stale
lock, exactly one acquires; the others report it locked.

A holder calls :meth:`WriterLock.check` before it commits: a lock broken while held (its heartbeats
stopped for ``stale_after``) is then found, and the holder gives up instead of committing.
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
from typing import Any, Self

from dist_respattn.durable.files import AtomicFiles

__all__ = ["DEFAULT_STALE_AFTER", "WriterLock"]

#: Seconds without a heartbeat after which a lock counts as abandoned.
DEFAULT_STALE_AFTER = 300.0


class WriterLock:
    """``with WriterLock(files, name):`` holds the lock file ``name`` under ``files`` for the block.

    Subclasses say what is locked: ``locked_error`` is raised when another live holder has it, and
    ``held_by`` / ``what_is_lost`` word the messages (see :class:`~dist_respattn.registry.RegistryLock`).
    ``purpose`` (e.g. ``"append"``) is recorded for whoever finds the lock held.
    """

    locked_error: type[Exception] = RuntimeError
    #: How a message says the lock is held: ``"<lock file>: {held_by} (<holder>)"``.
    held_by = "locked by another run"
    #: What :meth:`check` calls the lock a holder lost, and what it says that holder did not do.
    lock_noun = "lock"
    what_is_lost = "nothing was written"
    logger = logging.getLogger("dist_respattn")

    def __init__(
        self, files: AtomicFiles, name: str, *, stale_after: float = DEFAULT_STALE_AFTER, purpose: str | None = None
    ) -> None:
        if not stale_after > 0:
            raise ValueError(f"stale_after = {stale_after}: expected seconds > 0")
        self.files = files
        self.name = name
        self.purpose = purpose
        self.stale_after = float(stale_after)
        self.token = uuid.uuid4().hex
        self.acquired = 0.0
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.lost: str | None = None

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def record(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "process_started": _process_started(os.getpid()),
            "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:3]]) if sys.argv else "?",
            "purpose": self.purpose,
            "acquired": self.acquired,
            "heartbeat": time.time(),
            "stale_after": self.stale_after,
        }

    def acquire(self) -> None:
        self.acquired = time.time()
        # A live holder is refused before this run writes anything, not even the temporary file of its create.
        found = self.files.read_json(self.name)
        if found is not None and self._stale_reason(found) is None:
            raise self.locked_error(self._describe(found))
        if not self.files.create_json(self.name, self.record()):
            holder = self.files.read_json(self.name)
            if holder is not None:  # (None: it was released as we looked; try once more)
                reason = self._stale_reason(holder)
                if reason is None:
                    raise self.locked_error(self._describe(holder))
                self.logger.warning("%s: breaking a stale lock (%s)", self.files.where(self.name), reason)
                self._break(holder)
            elif not self.files.create_json(self.name, self.record()):
                raise self.locked_error(self._describe(self.files.read_json(self.name)))
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name=f"respattn-lock-{self.name}", daemon=True)
        self._heartbeat.start()

    def live_holder(self) -> str | None:
        """Who holds the lock now (the message another run would get), or ``None`` when it is free or abandoned."""
        holder = self.files.read_json(self.name)
        if holder is None or self._stale_reason(holder) is not None:
            return None
        return self._describe(holder)

    def check(self) -> None:
        """Raise ``locked_error`` unless this run still holds the lock (call before committing)."""
        holder = self.files.read_json(self.name)
        if holder is None or holder.get("token") != self.token:
            raise self.locked_error(
                f"{self.files.where(self.name)}: this run lost the {self.lock_noun} "
                f"({self.lost or 'it was broken as stale by another run'}); {self.what_is_lost}"
            )

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        holder = self.files.read_json(self.name)
        if holder is not None and holder.get("token") == self.token:
            self.files.delete(self.name)

    def _beat(self) -> None:
        while not self._stop.wait(self.stale_after / 4):
            try:
                holder = self.files.read_json(self.name)
                if holder is None or holder.get("token") != self.token:
                    self.lost = "the lock file was replaced while this run held it"
                    return
                self.files.write_json(self.name, self.record())
            except Exception as exc:  # a missed beat is retried; check() decides before publishing
                self.lost = f"a heartbeat failed: {exc}"

    def _stale_reason(self, holder: dict[str, Any]) -> str | None:
        """Why ``holder``'s lock is abandoned, or ``None`` when it is alive."""
        age = time.time() - float(holder.get("heartbeat") or 0.0)
        if age > _holder_stale_after(holder, self.stale_after):
            return f"no heartbeat for {age:.0f} s"
        if holder.get("host") == socket.gethostname():
            pid = holder.get("pid")
            if not _process_alive(pid):
                return f"its process {pid} on this host is gone"
            started = holder.get("process_started")
            if started is not None and _process_started(pid) not in (None, started):
                return f"its process {pid} on this host is gone: the pid is another process's now"
        return None

    def _break(self, stale: dict[str, Any]) -> None:
        """Replace the stale lock with this run's, if this run wins the claim on it (else raise).

        The claim is released once this run's lock exists: a slower breaker that then wins the claim
        finds the lock changed and backs off, so it never deletes a live lock.
        """
        claim = f"{self.name}.broken-{stale.get('token')}"
        if not self.files.create_json(claim, {"by": self.token, "at": time.time()}):
            left = self.files.read_json(claim) or {}
            if time.time() - float(left.get("at") or 0.0) > self.stale_after:  # its breaker died mid-break
                self.files.delete(claim)
                return self._break(stale)
            raise self.locked_error(
                f"{self.files.where(self.name)}: another run is taking over the stale lock of "
                f"pid {stale.get('pid')} on {stale.get('host')}"
            )
        try:
            current = self.files.read_json(self.name)
            if current is not None and current.get("token") != stale.get("token"):
                raise self.locked_error(self._describe(current))  # another run replaced it first
            self.files.delete(self.name)
            if not self.files.create_json(self.name, self.record()):
                raise self.locked_error(self._describe(self.files.read_json(self.name)))
        finally:
            self.files.delete(claim)

    def _describe(self, holder: dict[str, Any] | None) -> str:
        if holder is None:
            return f"{self.files.where(self.name)}: {self.held_by}"
        age = time.time() - float(holder.get("heartbeat") or 0.0)
        doing = f", {holder['purpose']}" if holder.get("purpose") else ""
        return (
            f"{self.files.where(self.name)}: {self.held_by} "
            f"({holder.get('command')!s}{doing}, pid {holder.get('pid')} on {holder.get('host')}, "
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


def _process_started(pid: Any) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``), or ``None`` where that is
    unknown (no such process, no ``/proc``): with the pid, it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            # Split after the command's name, which is in parentheses and may hold spaces: field 22 is the start.
            return int(f.read().rsplit(")", 1)[-1].split()[19])
    except (OSError, TypeError, ValueError, IndexError):
        return None
