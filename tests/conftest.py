"""Plugins for the whole suite, and the one-worker cluster the command-line tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest_plugins = ["pytester", "tests.bytecode", "tests.slow_budget", "tests.warm_up"]


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the suite's default): half again as many test processes as cores this process may use (3 on 2).
    Much of the suite's time is spent waiting on other processes (clusters starting, commands run, workers killed
    and replaced), which leaves the cores idle under one test process a core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(2, (3 * cores + 1) // 2)


@pytest.fixture(scope="session")
def one_worker_address() -> Iterator[str]:
    """The scheduler address of a LocalCluster of one single-threaded worker process (tests/engine/clusters.py),
    shared by the command-line tests that fit, evaluate and predict on a cluster with ``--scheduler``: each used to
    start one of its own (a scheduler and a worker process, a few seconds), and their commands only submit work to it
    and leave nothing on it. A test that needs workers of its own, or changes them, starts its own cluster."""
    from tests.engine.clusters import local_cluster

    with local_cluster(1) as (cluster, _):
        yield cluster.scheduler_address
