"""The tables fixed for a fit on the workers (:mod:`dist_respattn.engine.held_tables`): each worker the driver sends
one to keeps it as it arrives, so Dask's memory manager dropping that worker's copy costs no fetch."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest

from dist_respattn.engine import held_tables
from dist_respattn.engine.broadcast import FitTables
from dist_respattn.engine.held_tables import TableRef, held, release_run
from tests.engine.clusters import local_cluster


def _holds(ref: TableRef) -> bool:
    return (ref.run, ref.digest) in held_tables._HELD


def _fetches() -> int:
    return len(held_tables.FETCHED)


def _read(ref: TableRef) -> int:
    return int(held(ref).sum())


@pytest.mark.slow
def test_each_worker_keeps_a_table_the_driver_sends_before_its_spare_copy_is_dropped():
    """A table sent to 2 workers under a memory manager that drops the spare copies of values no task waits for every
    20 ms: the manager drops one (the scheduler knows of one copy), yet both workers hold it for the fit from the
    start, and a task on each reads it without fetching it from the other; the fit's end lets it go."""
    table = np.arange(1_000_000, dtype=np.int64)
    key = "respattn-table-0-run0"
    with (
        dask.config.set({"distributed.scheduler.active-memory-manager.interval": "20ms"}),
        local_cluster(2) as (_, client),
    ):
        workers = sorted(client.ncores())
        tables = FitTables(client, "run0")
        ref = tables.futures({key: table}, None)[key]
        assert client.run(_holds, ref) == dict.fromkeys(workers, True)
        deadline = time.monotonic() + 30
        while len(client.who_has().get(ref.key, ())) > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(client.who_has()[ref.key]) == 1  # a spare copy was dropped before any task ran
        sums = [client.submit(_read, ref, workers=[w], allow_other_workers=False, pure=False) for w in workers]
        assert client.gather(sums) == [int(table.sum())] * 2
        assert client.run(_fetches) == dict.fromkeys(workers, 0)
        assert client.run(release_run, ref.run) == dict.fromkeys(workers, 1)
        assert client.run(_holds, ref) == dict.fromkeys(workers, False)
        tables.release()
