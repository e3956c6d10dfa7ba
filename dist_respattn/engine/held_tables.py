"""The tables fixed for a fit, held by each worker from the moment it receives them to the fit's end.

Dask's active memory manager (its ``ReduceReplicas`` policy, on by default) drops the spare copies of a value that no
task is waiting for, every few seconds: a table handed to each pass's tasks as a future was dropped from all but one
worker between the passes, and every other worker fetched it again for the next one. The tasks are given a
:class:`TableRef` instead (the table's key, the fit's run tag and the digest of its bytes), which Dask does not see
as a dependency. The driver sends each worker the table wrapped as a :class:`SentTable`, which the worker keeps for
the fit as it unpickles it, on arrival: before the memory manager can drop its copy, so no worker the driver sent it
to fetches it from another. A task resolves the reference (:func:`held`) from what its worker holds for the fit,
else from the worker's own copy in Dask's memory, else by fetching it from a worker that holds it, once (a table made
on a worker, a worker that joined later). A worker keeps the table until the fit ends (:func:`release_run`, run on
every worker) or until :data:`HELD_KEPT` newer tables push it out.

The choice leaves the scheduler's memory manager alone (a user's own scheduler keeps its settings; the driver
changes nothing there). A worker that joins (a replacement) fetches the tables on its first task; a table remade under
a new key with the same bytes (after lost work, or read again from a checkpoint) is found by its digest, and is not
fetched again by a worker that holds it. The fetch runs with the task's thread seceded from the worker's pool, so a
table still being computed, even by a task queued on the same worker, cannot wait on the thread that waits for it.
"""

from __future__ import annotations

import collections
import hashlib
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["HELD_KEPT", "SentTable", "TableLostError", "TableRef", "held", "held_args", "release_run", "table_digest"]

#: Tables a worker keeps at most (over every fit it serves); the oldest goes first, to be fetched again if needed.
HELD_KEPT = 8

#: A fetch's deadline: this many seconds, plus the table's size at the rate below.
FETCH_SECONDS = 120.0
FETCH_BYTES_PER_SECOND = 10e6


class TableLostError(RuntimeError):
    """A task could not get a table of the fit (every worker holding it was lost): the pass is work lost with a
    worker, submitted again after the tables are sent again."""


@dataclass(frozen=True)
class TableRef:
    """A table fixed for the fit, as a task's argument: ``key`` the future the driver holds, ``run`` the fit's run tag,
    ``digest`` its bytes' (:func:`table_digest`), ``nbytes`` their size."""

    key: str
    run: str
    digest: str
    nbytes: int = 0


def table_digest(value: Any) -> tuple[str, int]:
    """The BLAKE2b digest of ``value``'s pickle (its arrays' memory read in place) and the bytes it covers."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    digest = hashlib.blake2b(data, digest_size=20)
    size = len(data)
    for buffer in buffers:
        raw = buffer.raw()
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
        size += raw.nbytes
    return digest.hexdigest(), size


#: What this process holds, by (run, digest), the most recently used last.
_HELD: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
_LOCK = threading.Lock()
#: One fetch of a table at a time in this process (its other tasks wait for it, seceded too).
_FETCHING: dict[tuple[str, str], threading.Lock] = {}
#: The tables this process fetched from other workers: (time, key, bytes), for the benchmarks' meters.
FETCHED: list[tuple[float, str, int]] = []


def _kept(ref: TableRef) -> tuple[bool, Any]:
    with _LOCK:
        slot = (ref.run, ref.digest)
        if slot in _HELD:
            _HELD.move_to_end(slot)
            return True, _HELD[slot]
        return False, None


def _keep(ref: TableRef, table: Any) -> None:
    with _LOCK:
        _HELD[ref.run, ref.digest] = table
        _HELD.move_to_end((ref.run, ref.digest))
        while len(_HELD) > HELD_KEPT:
            _HELD.popitem(last=False)


class SentTable:
    """A table fixed for the fit as the driver sends it to each worker (``ref`` its reference, under the key it is
    sent as): the process that unpickles it keeps ``table`` for the fit at once.

    A worker unpickles what the driver's scatter sends it as the message arrives, before Dask's memory manager knows
    of its copy: a copy the manager drops later (a spare, once another worker holds one) is then no loss. Kept by a
    call to the worker after the scatter instead, the copy could be dropped in between (the manager may run at any
    moment, and drops the spare copy of a value no task waits for), and that worker would fetch the table from
    another on its first task; so would a worker whose first task comes after a drop, as before.
    """

    __slots__ = ("ref", "table")

    def __init__(self, ref: TableRef, table: Any) -> None:
        self.ref, self.table = ref, table

    def __reduce__(self) -> tuple[Any, ...]:
        return (_arrived, (self.ref, self.table))

    def __sizeof__(self) -> int:  # what a worker's memory accounting sees: the table's bytes, not the wrapper's
        return object.__sizeof__(self) + self.ref.nbytes


def _arrived(ref: TableRef, table: Any) -> SentTable:
    """A :class:`SentTable` unpickled: its table kept for the fit."""
    _keep(ref, table)
    return SentTable(ref, table)


def _table(value: Any) -> Any:
    """The table a copy in Dask's memory holds (a :class:`SentTable`'s, or one made on a worker as it is)."""
    return value.table if isinstance(value, SentTable) else value


def held(value: Any) -> Any:
    """A task's argument as it is used: a :class:`TableRef` as its table (see the module's text), anything else as
    it is."""
    if not isinstance(value, TableRef):
        return value
    found, table = _kept(value)
    if found:
        return table
    from distributed import get_worker, worker_client
    from distributed.utils import sync

    worker = get_worker()
    found, table = sync(worker.loop, _own_copy, worker, value.key)
    if not found:
        with worker_client() as client:  # seceded: the worker runs its other tasks meanwhile
            with _LOCK:
                fetching = _FETCHING.setdefault((value.run, value.digest), threading.Lock())
            with fetching:
                found, table = _kept(value)
                if not found:
                    table = _fetch(client, value)
                    _keep(value, table)
        return table
    _keep(value, table)
    return table


def held_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with each :class:`TableRef` resolved (:func:`held`)."""
    return tuple(held(arg) for arg in args)


async def _own_copy(worker: Any, key: str) -> tuple[bool, Any]:
    """This worker's copy of ``key`` in Dask's memory, read on its event loop (which owns the store)."""
    if key in worker.data:
        return True, _table(worker.data[key])
    return False, None


def _fetch(client: Any, ref: TableRef) -> Any:
    import distributed

    future: Any = distributed.Future(ref.key, client)
    # A future made from a key does not tell the scheduler that this client wants it, so it would never learn that
    # the table is in memory (nor that it was lost): tell it, as the client does for its futures on reconnecting.
    client._send_to_scheduler({"op": "client-desires-keys", "keys": [ref.key], "client": client.id})
    try:
        table = future.result(timeout=FETCH_SECONDS + ref.nbytes / FETCH_BYTES_PER_SECOND)
    except Exception as exc:  # lost with its holders, cancelled, or no answer
        raise TableLostError(f"could not fetch the fit's table {ref.key} ({type(exc).__name__}: {exc})") from exc
    finally:
        future.release()
    FETCHED.append((time.time(), ref.key, ref.nbytes))
    return _table(table)


def release_run(run: str) -> int:
    """Drop what this process holds for fit ``run`` (run on every worker at the fit's end): how many tables."""
    with _LOCK:
        slots = [slot for slot in _HELD if slot[0] == run]
        for slot in slots:
            del _HELD[slot]
        for slot in [slot for slot in _FETCHING if slot[0] == run]:
            del _FETCHING[slot]
    return len(slots)
