"""A model directory's writer lock: one fit writes a model directory at a time.

The lock is the file ``lock.json`` in the model directory, a :class:`~dist_respattn.durable.lock.WriterLock`
(the stores' and the registry's): created exclusively (a hard link of a complete temporary file), naming its holder
(command, pid and when that process started, host, since when), a heartbeat every ``stale_after / 4`` seconds, and
broken by the next writer when its holder's process is gone from this host (a SIGKILLed fit leaves its file, but
never a lock that stops the next fit) or its heartbeat is older than ``stale_after`` (a holder on another host
sharing the directory). Model directories are local paths (:class:`~dist_respattn.artifacts.checkpoints.ModelDir`),
so there is no remote (fsspec) case.

A fit holds it from before it reads the directory until it returns (:func:`hold_model_dirs`), for the directory
and each of its stages' (``shared/``, a recipe's parts), so neither a second fit (``--resume`` or ``--overwrite``)
nor a fit given one of the stages' directories runs alongside it; under the lock, what the checkpoints' commit
prunes (``.tmp-*``, older ``ckpt-*``) can only be a dead writer's. Readers (``evaluate``, ``predict``,
``load_model``) take no lock. Holding is reentrant in one thread (``retrain`` holds its work directory across the
fit it runs there), and refused to another thread of the same process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dist_respattn.artifacts.checkpoints import LOCK_FILE, CheckpointError, ModelDir
from dist_respattn.durable.files import AtomicFiles
from dist_respattn.durable.lock import DEFAULT_STALE_AFTER, WriterLock

__all__ = ["FIT_ADVICE", "LOCK_FILE", "ModelDirLock", "ModelDirLocked", "held_lock_check", "hold_model_dirs"]

logger = logging.getLogger("dist_respattn.artifacts")


#: What a fit refused by another's lock can do (the command line names the flags).
FIT_ADVICE = "wait for it to end (resume=True then continues it), or give another model_dir"


class ModelDirLocked(CheckpointError):
    """Another fit is writing the model directory (the message names it, its pid and since when)."""


class _ModelDirFiles(AtomicFiles):
    error = CheckpointError


class ModelDirLock(WriterLock):
    """``with ModelDirLock(directory):`` holds the model directory's lock (or raises :class:`ModelDirLocked`).

    The directory must exist; :func:`hold_model_dirs` makes it, and removes it again when the holder wrote nothing.
    ``advice`` ends the message of a run refused by another holder: what that run can do instead.
    """

    locked_error = ModelDirLocked
    lock_noun = "model directory's lock"
    what_is_lost = "latest.json was left where it was"
    logger = logger

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        purpose: str | None = None,
        stale_after: float = DEFAULT_STALE_AFTER,
        advice: str = FIT_ADVICE,
    ) -> None:
        self.directory = os.fspath(directory)
        self.advice = advice
        super().__init__(_ModelDirFiles(self.directory), LOCK_FILE, stale_after=stale_after, purpose=purpose)

    def _describe(self, holder: dict[str, Any] | None) -> str:
        """``DIR: another fit is writing this model directory (who, since when); what to do``."""
        what = f"{self.directory}: another fit is writing this model directory"
        if holder is None:
            return f"{what}; {self.advice}"
        age = time.time() - float(holder.get("heartbeat") or 0.0)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("acquired") or 0.0)))
        elsewhere = ""
        if holder.get("host") != socket.gethostname():
            # Its pid cannot be checked from here: only the heartbeat tells it is alive.
            elsewhere = (
                f"; a holder on another host counts as gone {float(holder.get('stale_after') or self.stale_after):.0f}"
                f" s after its last heartbeat ({self.files.where(self.name)})"
            )
        return (
            f"{what} ({holder.get('command')!s}, pid {holder.get('pid')} on {holder.get('host')}, started {since}, "
            f"last heartbeat {age:.0f} s ago); {self.advice}{elsewhere}"
        )


@dataclass(frozen=True)
class _Held:
    """A lock this process holds, and the thread that took it (whose holds inside its own are no-ops)."""

    lock: ModelDirLock
    thread: int


_HELD: dict[str, _Held] = {}
_HELD_LOCK = threading.Lock()


def _key(directory: str | os.PathLike[str]) -> str:
    """One name per directory, however it is spelled (relative, through a symlink)."""
    return os.path.realpath(directory)


@contextlib.contextmanager
def hold_model_dirs(
    directories: Iterable[str | os.PathLike[str]],
    *,
    purpose: str = "fit",
    stale_after: float = DEFAULT_STALE_AFTER,
    advice: str = FIT_ADVICE,
) -> Iterator[None]:
    """Hold the writer lock of each model directory, in order, for the block; raise :class:`ModelDirLocked` at
    once, holding none, when another fit holds one of them.

    A directory that does not exist is made (its lock is a file in it) and removed again at the end when it is
    empty (a fit that failed before writing anything leaves no directory). A directory this thread already holds
    is held once more; one that another thread of this process holds is refused. A path that cannot be a model
    directory (a file, read-only) raises :class:`~dist_respattn.artifacts.checkpoints.CheckpointError` first.
    ``purpose`` is recorded for whoever finds the lock held; ``advice`` is what this run's refusal tells its user.
    """
    with contextlib.ExitStack() as stack:
        for directory in dict.fromkeys(os.fspath(d) for d in directories):
            stack.enter_context(_hold(directory, purpose=purpose, stale_after=stale_after, advice=advice))
        yield


@contextlib.contextmanager
def _hold(directory: str, *, purpose: str, stale_after: float, advice: str) -> Iterator[None]:
    key = _key(directory)
    with _HELD_LOCK:
        held = _HELD.get(key)
        if held is not None and held.thread != threading.get_ident():
            raise ModelDirLocked(f"{directory}: another fit of this process (another thread) is writing it; {advice}")
    if held is not None:  # this thread's own hold, around this one: it outlasts this block
        yield
        return
    ModelDir(directory).check_writable()
    made = _missing(Path(directory))
    Path(directory).mkdir(parents=True, exist_ok=True)
    lock = ModelDirLock(directory, purpose=purpose, stale_after=stale_after, advice=advice)
    try:
        lock.acquire()
    except BaseException:
        _remove_if_empty(made)
        raise
    with _HELD_LOCK:
        _HELD[key] = _Held(lock, threading.get_ident())
    try:
        yield
    finally:
        with _HELD_LOCK:
            del _HELD[key]
        lock.release()
        _remove_if_empty(made)


def held_lock_check(directory: str | os.PathLike[str]) -> Callable[[], None] | None:
    """The :meth:`~dist_respattn.durable.lock.WriterLock.check` of the lock this process holds on ``directory``
    (raises :class:`ModelDirLocked` once the lock was broken as stale and maybe taken by another fit), or ``None``
    when it holds none: a :class:`~dist_respattn.artifacts.checkpoints.ModelDir`'s ``guard``."""
    with _HELD_LOCK:
        held = _HELD.get(_key(directory))
    return held.lock.check if held is not None else None


def _missing(path: Path) -> list[Path]:
    """The directories a ``mkdir -p`` of ``path`` makes, innermost first."""
    made = []
    path = path.absolute()
    while not path.exists():
        made.append(path)
        path = path.parent
    return made


def _remove_if_empty(made: list[Path]) -> None:
    """Remove the directories :func:`_missing` listed, innermost first, while they are empty."""
    for path in made:
        try:
            path.rmdir()
        except OSError:  # something is in it now (a checkpoint, another fit's lock): it stays
            break
