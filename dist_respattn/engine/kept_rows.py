"""The held-out rows a worker keeps for a fit, planned for its grid passes, from one M-step's grid to the next.

Every M-step's held-out pass scores the same rows of the same partitions: only the grid's points and the M-step's
values change. Reading them again each time was most of the pass after the first (at 109M tokens, 5.4M held-out rows
in 26 partitions: each block's hold-out stripes found, its windows made and a 128-byte query copied a row, and every
position's pair looked up in the support). A grid task of a fit therefore keeps what its grid planned from the rows
(:meth:`~dist_respattn.model.heads.base.Grid.score_keeping`: for the single head, the rows' context ids, distinct
queries, targets, weights, the pairs' indices in the support and which rows repeat an earlier one), and the fit's
next grid task on the same partition on this worker scores them from it
(:meth:`~dist_respattn.model.heads.base.Grid.score_kept`): the same bits, since the rows and the order of every
addition are the same.

What is kept is found by the fit's run tag, the store's location and fingerprint, the partition, the rows counted
and the attribute map; the grid itself checks that it may be scored from it (for the single head: counts over the
same support, in the same layout). At most :func:`budget` bytes are kept in a process, the least recently used
dropped first; a partition's rows that would take more are scored without being kept. The fit's end drops them on
every worker (:func:`release_run`). The driver asks the workers which partitions they hold (:func:`held_parts`)
and places each partition's task on its holder when it can.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Hashable
from typing import Any

__all__ = [
    "KEPT_BYTES",
    "KEPT_FRACTION",
    "SERVED",
    "budget",
    "drop",
    "find",
    "forget",
    "held_parts",
    "keep",
    "kept_bytes",
    "note_served",
    "release_run",
    "served",
]

#: The bytes a worker process keeps between every fit's held-out rows (a 109M-token text store's 5.4M held-out rows
#: plan into ~67 bytes a row: ~180 MB a worker of two).
KEPT_BYTES = 512 * 2**20
#: At most this share of a worker's memory limit is kept (the rows kept grow with the held-out rows, which a worker's
#: memory must not: 16 MiB of a 512 MiB worker, 384 MiB of a 12 GiB one).
KEPT_FRACTION = 1 / 32

_lock = threading.Lock()
#: (run, key) -> (what the grid kept, its bytes), the most recently used last.
_kept: collections.OrderedDict[tuple[str, Hashable], tuple[Any, int]] = collections.OrderedDict()
#: The grid tasks each fit scored from what was kept, by run tag (for the benchmarks' and tests' meters).
SERVED: collections.Counter[str] = collections.Counter()


def served(run: str) -> int:
    """How many grid tasks of fit ``run`` this process scored from what it kept."""
    with _lock:
        return SERVED[run]


def note_served(run: str) -> None:
    """Count a grid task of fit ``run`` scored from what was kept."""
    with _lock:
        SERVED[run] += 1


def find(run: str, key: Hashable) -> Any | None:
    """What a task of fit ``run`` kept for ``key`` in this process, or ``None``."""
    with _lock:
        entry = _kept.get((run, key))
        if entry is None:
            return None
        _kept.move_to_end((run, key))
        return entry[0]


def budget() -> int:
    """The bytes this process may keep: :data:`KEPT_BYTES`, and in a worker with a memory limit at most
    :data:`KEPT_FRACTION` of it."""
    try:
        import distributed

        limit = distributed.get_worker().memory_manager.memory_limit
    except (ImportError, ValueError, AttributeError):  # not in a worker
        return KEPT_BYTES
    return KEPT_BYTES if not limit else min(KEPT_BYTES, int(limit * KEPT_FRACTION))


def keep(run: str, key: Hashable, kept: Any, nbytes: int, room: int | None = None) -> bool:
    """Keep ``kept`` (``nbytes`` bytes) for fit ``run`` and ``key``, dropping the least recently used beyond
    ``room`` (default :func:`budget`); ``False`` (nothing kept) when it alone is larger."""
    room = budget() if room is None else room
    if nbytes > room:
        return False
    with _lock:
        _kept[run, key] = (kept, int(nbytes))
        _kept.move_to_end((run, key))
        total = sum(size for _, size in _kept.values())
        while total > room:
            _, (_, size) = _kept.popitem(last=False)
            total -= size
    return True


def drop(run: str, key: Hashable) -> None:
    """Forget what was kept for ``key`` (it no longer serves the fit's grids)."""
    with _lock:
        _kept.pop((run, key), None)


def kept_bytes() -> int:
    """The bytes kept now in this process."""
    with _lock:
        return sum(size for _, size in _kept.values())


def held_parts(run: str, name: str) -> list[int]:
    """The partitions of the pass ``name`` (a key's first item) this process keeps rows of for fit ``run``."""
    with _lock:
        return sorted(int(key[1]) for r, key in _kept if r == run and isinstance(key, tuple) and key[0] == name)


def release_run(run: str) -> int:
    """Drop what this process keeps for fit ``run`` (run on every worker at the fit's end): how many partitions."""
    with _lock:
        slots = [slot for slot in _kept if slot[0] == run]
        for slot in slots:
            del _kept[slot]
    return len(slots)


def forget() -> None:
    """Drop everything kept and the counts served (tests)."""
    with _lock:
        _kept.clear()
        SERVED.clear()
