"""Bytes on the wire and CPU seconds per process of a LocalCluster, read at points of a fit (imported as a sibling
module by the benchmark scripts).

Bytes: every process (the driver, the scheduler, each worker) counts what its TCP comms write
(``distributed.comm.tcp.TCP.write`` wrapped to add the bytes it returns, the frames' headers included), by the
address of the comm's peer. The peers are told apart by address: a worker's or the scheduler's listening address,
else the ephemeral address of a connection some process opened (every process lists those of its comms), so each
byte is counted once, by the writer, and put on a route: driver -> workers, workers -> driver, worker -> worker,
and to or from the scheduler.

CPU: each worker process's user + system seconds (``getrusage``, all its threads) beside the thread CPU of the
tasks it ran (Dask's own ``("execute", <prefix>, "thread-cpu", "seconds")`` metrics, by task prefix): the
difference is what the worker spent beyond the tasks (its event loop, (de)serialization, transfers, the store's
reads outside a task).
"""

from __future__ import annotations

import os
import resource
import time
from collections import defaultdict
from typing import Any

#: The process's counters: bytes written by (local address, peer address) of the comm.
_WRITTEN: defaultdict[tuple[str, str], int] = defaultdict(int)


def install() -> bool:
    """Wrap ``TCP.write`` in this process to count bytes by peer (once; idempotent)."""
    from distributed.comm import tcp

    if getattr(tcp.TCP.write, "_counted", False):
        return True
    original = tcp.TCP.write

    async def write(self: Any, msg: Any, serializers: Any = None, on_error: str = "message") -> int:
        n = await original(self, msg, serializers=serializers, on_error=on_error)
        _WRITTEN[self.local_address, self.peer_address] += int(n)
        return n

    write._counted = True  # type: ignore[attr-defined]
    tcp.TCP.write = write  # type: ignore[method-assign]
    return True


def snapshot() -> dict[str, Any]:
    """This process's counters now: bytes written by (local, peer) address, its id and CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"written": dict(_WRITTEN), "pid": os.getpid(), "cpu": usage.ru_utime + usage.ru_stime}


def _kind(key: Any) -> str:
    """A fit's key's kind: ``respattn-estep-3-part1-…`` -> ``estep``, ``respattn-load2-…`` -> ``load``."""
    words = str(key[0] if isinstance(key, tuple) else key).split("-")
    return words[1].rstrip("0123456789") if len(words) > 1 and words[0] == "respattn" else words[0]


def _worker_snapshot(dask_worker: Any) -> dict[str, Any]:
    tasks: defaultdict[str, float] = defaultdict(float)
    for key, value in dask_worker.digests_total.items():
        if isinstance(key, tuple) and key and key[0] == "execute" and key[-2:] == ("thread-cpu", "seconds"):
            tasks[str(key[-3])] += float(value)
    # What it fetched from other workers: Dask's log of its transfers (the last 1,000), each key's bytes as Dask
    # sized it (``sizeof``: exact for arrays and containers of arrays, not for other objects), by the key's kind.
    fetched = [(entry["start"], _kind(key), int(nbytes)) for entry in dask_worker.transfer_incoming_log
               for key, nbytes in entry["keys"].items()]  # fmt: skip
    # And the fit's tables its tasks fetched themselves, to keep to the fit's end (their pickles' bytes).
    try:
        from dist_respattn.engine.held_tables import FETCHED
    except ImportError:  # a version without them
        FETCHED = []
    fetched += [(when, f"{_kind(key)} (held)", int(nbytes)) for when, key, nbytes in FETCHED]
    return {**snapshot(), "task_cpu": dict(tasks), "address": dask_worker.address, "fetched": fetched}


def _scheduler_snapshot(dask_scheduler: Any) -> dict[str, Any]:
    return {**snapshot(), "address": dask_scheduler.address}


class ClusterMeters:
    """Snapshots of every process's counters, taken with :meth:`mark` (``client.run``: a round trip each)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        install()
        client.run(install)
        client.run_on_scheduler(install)
        self.marks: list[dict[str, Any]] = []

    def mark(self, label: str) -> None:
        workers = self.client.run(_worker_snapshot)
        scheduler = self.client.run_on_scheduler(_scheduler_snapshot)
        self.marks.append({"label": label, "time": time.time(), "driver": snapshot(), "scheduler": scheduler,
                           "workers": {w["address"]: w for w in workers.values()}})  # fmt: skip

    def between(self, first: int, last: int) -> dict[str, Any]:
        """Bytes by route and each worker's CPU between marks ``first`` and ``last``.

        A comm's end is the scheduler's when its local address is the scheduler's listening address (a
        LocalCluster's scheduler runs in the driver's process), a worker's when it is a worker's listening address
        or a local address of a worker's comm, else the driver's."""
        a, b = self.marks[first], self.marks[last]
        scheduler = b["scheduler"]["address"]
        worker_ends = set(b["workers"])
        for worker in b["workers"].values():
            worker_ends.update(local for local, _ in worker["written"])

        def end(address: str) -> str:
            return "scheduler" if address == scheduler else "worker" if address in worker_ends else "driver"

        routes: defaultdict[str, int] = defaultdict(int)

        def add(now: dict[str, Any], before: dict[str, Any]) -> None:
            for (local, peer), n in now["written"].items():
                delta = n - before["written"].get((local, peer), 0)
                if delta:
                    routes[f"{end(local)} -> {end(peer)}"] += delta

        add(b["driver"], a["driver"])
        if b["scheduler"]["pid"] != b["driver"]["pid"]:
            add(b["scheduler"], a["scheduler"])
        else:  # the scheduler's relay of a result to the client is a copy within the driver's process
            for route in ("scheduler -> driver", "driver -> scheduler"):
                if route in routes:
                    routes[f"{route} (one process)"] = routes.pop(route)
        for address, worker in b["workers"].items():
            add(worker, a["workers"].get(address, {"written": {}}))
        cpu = {}
        for address, worker in b["workers"].items():
            before = a["workers"].get(address, {"cpu": 0.0, "task_cpu": {}})
            tasks = {k: v - before["task_cpu"].get(k, 0.0) for k, v in worker["task_cpu"].items()}
            tasks = {k: v for k, v in tasks.items() if v > 0}
            process = worker["cpu"] - before["cpu"]
            cpu[address] = {"process": process, "tasks": tasks, "beyond_tasks": process - sum(tasks.values())}
        fetched: defaultdict[str, int] = defaultdict(int)
        for worker in b["workers"].values():
            for start, prefix, nbytes in worker["fetched"]:
                if a["time"] < start <= b["time"]:
                    fetched[prefix] += nbytes
        return {"from": a["label"], "to": b["label"], "seconds": b["time"] - a["time"], "bytes": dict(routes),
                "fetched_by_prefix": dict(fetched),
                "driver_cpu": b["driver"]["cpu"] - a["driver"]["cpu"], "workers": cpu}  # fmt: skip
