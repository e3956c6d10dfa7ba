"""``PassRunner.run_ordered``: every partition's value in partition order, a window in flight, lost work resubmitted
from the first partition not yet handed over, pending tasks cancelled, a lost scheduler reported as such.

Real worker processes of a LocalCluster; the scheduler counts no failure as allowed (``allowed-failures`` 0), so a
worker process that exits while running a task fails it with ``KilledWorker`` at once, as lost work. The last test
SIGKILLs every worker while ``predict --out FILE.jsonl`` runs: the model goes with them, and the file must still
come out the same as an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

import dask
import distributed
import pytest

from dist_respattn import random_distribution
from dist_respattn.engine import predict
from dist_respattn.engine.cluster import ClusterError
from dist_respattn.engine.passes import PassRunner
from dist_respattn.store import WriteOptions, write_synthetic
from tests.engine.clusters import local_cluster

pytestmark = pytest.mark.slow  # every test here uses a cluster

TAG = "0a1b2c3d"


def echo(part: int, delay: float) -> tuple[int, str]:
    """``(part, this task's key)`` after ``delay`` seconds."""
    time.sleep(delay)
    return part, str(distributed.get_worker().get_current_task())


def die_once(part: int, victim: int, marker: str) -> int:
    """``part``; the first time ``victim`` runs, its worker process exits instead."""
    if part == victim and not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os._exit(1)
    time.sleep(0.05)
    return part


def first_then_wait(part: int, release: str, fail: bool) -> tuple[int, str]:
    """Partition 0 at once (or, with ``fail``, its error); the others wait (up to a minute) for the file ``release``."""
    if part == 0 and fail:
        raise ValueError("partition 0 is broken")
    deadline = time.monotonic() + 60
    while part > 0 and not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    return part, ""


class Bar:
    """A progress bar that records what it is told."""

    def __init__(self, total: int, description: str) -> None:
        self.total, self.description, self.count, self.closed = total, description, 0, False

    def update(self, n: int) -> None:
        self.count += n

    def close(self) -> None:
        self.closed = True


class Bars:
    def __init__(self) -> None:
        self.made: list[Bar] = []

    def __call__(self, total: int, description: str) -> Bar:
        self.made.append(Bar(total, description))
        return self.made[-1]


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes of 4 threads: a window of 3 waiting tasks never keeps partition 0 from a thread."""
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        local_cluster(2, threads_per_worker=4) as (cluster, client),
    ):
        yield cluster, client


@pytest.fixture
def passes_log():
    """The messages of ``dist_respattn.engine.passes`` (a handler of its own: the cluster silences caplog's)."""
    messages: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Handler(logging.DEBUG)
    logger = logging.getLogger("dist_respattn.engine.passes")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def our_tasks(client: distributed.Client, prefix: str) -> list[tuple[str, str]]:
    """The keys starting ``prefix`` the scheduler still knows, with their states."""
    return client.run_on_scheduler(
        lambda dask_scheduler, prefix=prefix: [
            (str(k), ts.state) for k, ts in dask_scheduler.tasks.items() if str(k).startswith(prefix)
        ]
    )


def test_values_come_in_partition_order_with_at_most_the_window_in_flight(cluster):
    _, client = cluster
    n, window = 8, 3
    bars = Bars()
    submitted: list[int] = []

    def args_for(part: int) -> tuple[Any, ...]:
        submitted.append(part)
        return part, 0.4 if part == 0 else 0.05  # the first is the slowest: the others finish before it

    runner = PassRunner(client, TAG, make_bar=bars)
    seen = []
    for part, key in runner.run_ordered("echo", "0", n, echo, args_for, window=window, description="echoing"):
        seen.append((part, key, max(submitted)))
    assert [part for part, _, _ in seen] == list(range(n))
    assert [key for _, key, _ in seen] == [f"respattn-echo-0-{part}-{TAG}" for part in range(n)]
    assert submitted == list(range(n))  # each submitted once
    in_flight = [last - part + 1 for part, _, last in seen]
    assert max(in_flight) == window, in_flight
    (bar,) = bars.made
    assert (bar.total, bar.description, bar.count, bar.closed) == (n, "echoing", n, True)


def test_lost_work_is_resubmitted_from_the_first_partition_not_yet_yielded(cluster, tmp_path, passes_log):
    _, client = cluster
    n, victim = 8, 5
    attempts: list[int] = []
    submitted: list[tuple[int, int]] = []

    def args_for(part: int) -> tuple[Any, ...]:
        submitted.append((attempts[-1], part))
        return part, victim, str(tmp_path / "died")

    runner = PassRunner(client, TAG)
    seen: list[tuple[int, int]] = []  # (value, the attempt it came from)
    for value in runner.run_ordered("die", "0", n, die_once, args_for, window=3, before_attempt=attempts.append):
        seen.append((value, attempts[-1]))
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the worker
    assert (tmp_path / "died").exists(), "the victim's worker did not exit"
    assert [value for value, _ in seen] == list(range(n))  # nothing yielded twice, nothing skipped
    assert attempts == [0, 1]
    handed_over = sum(1 for _, attempt in seen if attempt == 0)
    assert handed_over <= victim
    # The second attempt submits exactly the partitions not yet yielded, each once.
    assert [part for attempt, part in submitted if attempt == 1] == list(range(handed_over, n))
    assert any(m.startswith("die 0 lost work with a worker") and f"partitions {handed_over} to {n - 1}" in m
               for m in passes_log), passes_log  # fmt: skip


@pytest.mark.parametrize("ending", ["a task fails", "the caller stops"])
def test_pending_tasks_are_cancelled_when_the_pass_ends_early(cluster, ending, tmp_path):
    _, client = cluster
    release = str(tmp_path / "release")
    tag = f"{TAG}{len(ending)}"
    runner = PassRunner(client, tag)
    try:
        fail = ending == "a task fails"
        parts = runner.run_ordered("wait", "0", 6, first_then_wait, lambda p: (p, release, fail), window=3)
        if fail:
            with pytest.raises(ValueError, match="partition 0 is broken") as failed:
                list(parts)
        else:
            with contextlib.closing(parts):
                assert next(parts)[0] == 0
            failed = None
        # The error's traceback (kept by pytest.raises) still refers to the pass's frames: the tasks must go anyway.
        deadline = time.monotonic() + 10
        while our_tasks(client, "respattn-wait-0-") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert our_tasks(client, "respattn-wait-0-") == []
        del failed
    finally:
        open(release, "w").close()  # frees the workers' threads of the waiting tasks
    client.wait_for_workers(2, timeout=60)


def test_a_lost_scheduler_is_a_cluster_error_saying_what_to_do():
    with local_cluster(1) as (cluster, client):
        runner = PassRunner(client, TAG, after_loss="run predict again once the cluster is back")
        parts = runner.run_ordered("echo", "0", 4, echo, lambda p: (p, 0.0 if p == 0 else 30.0), window=2)
        with (
            contextlib.closing(parts),
            pytest.raises(ClusterError, match=r"lost the connection to the Dask scheduler during echo 0.*; run predict "
                          "again once the cluster is back"),
        ):  # fmt: skip
            for part, _ in parts:
                if part == 0:
                    threading.Thread(target=cluster.close, daemon=True).start()


def test_predict_into_a_rows_file_survives_losing_every_worker_and_the_model_with_them(tmp_path, passes_log):
    head = random_distribution(30, 4, 5, 12, seed=4)
    store = str(tmp_path / "store.zarr")
    # 15 partitions (the last one partial): once the first is in the file, 14 are left to lose with the workers.
    write_synthetic(store, 120_000, model=head, seed=5, options=WriteOptions(chunk_rows=4096, partition_rows=8192))
    with local_cluster(2) as (_, client):
        reference = predict(head, store, out=tmp_path / "reference.jsonl", top_k=3, client=client, progress=False)
        pids = client.run(os.getpid)
        killed: dict[str, Any] = {}

        def kill_every_worker_mid_pass() -> None:
            """Once the driver has written the first partition's rows (the later ones are in flight), SIGKILL all."""
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                started = [p for p in tmp_path.glob(".tmp-killed.jsonl.*") if p.stat().st_size > 0]
                if started:
                    for pid in pids.values():
                        os.kill(pid, signal.SIGKILL)
                    killed["written"] = started[0].stat().st_size
                    return
                time.sleep(0.001)

        killer = threading.Thread(target=kill_every_worker_mid_pass, daemon=True)
        killer.start()
        run = predict(head, store, out=tmp_path / "killed.jsonl", top_k=3, client=client, progress=False)
        killer.join(timeout=120)
        client.wait_for_workers(2, timeout=60)
        assert set(client.run(os.getpid).values()).isdisjoint(pids.values()), "a killed worker is still there"
    assert killed, "the rows file was never seen being written"
    assert any(m.startswith("predict 0 lost work with a worker") for m in passes_log), passes_log
    assert (run.rows, run.partitions, run.top1_accuracy) == (
        reference.rows,
        reference.partitions,
        reference.top1_accuracy,
    )
    assert (tmp_path / "killed.jsonl").read_bytes() == (tmp_path / "reference.jsonl").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.jsonl", "reference.jsonl", "store.zarr"]
