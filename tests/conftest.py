"""Plugins for the whole suite, and the one-worker cluster the command-line tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest_plugins = ["pytester", "tests.bytecode", "tests.cpu_report", "tests.slow_budget", "tests.warm_up"]


@pytest.fixture(scope="session")
def one_worker_address() -> Iterator[str]:
    """The scheduler address of a LocalCluster of one single-threaded worker process (tests/engine/clusters.py),
    shared by the command-line tests that fit, evaluate and predict on a cluster with ``--scheduler``: each used to
    start one of its own (a scheduler and a worker process, a few seconds), and their commands only submit work to it
    and leave nothing on it. A test that needs workers of its own, or changes them, starts its own cluster."""
    from tests.engine.clusters import local_cluster

    with local_cluster(1) as (cluster, _):
        yield cluster.scheduler_address
