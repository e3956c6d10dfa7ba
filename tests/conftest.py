"""Plugins for the whole suite, and the one-worker cluster the command-line tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest_plugins = ["pytester", "tests.bytecode", "tests.slow_budget"]


@pytest.fixture(scope="session")
def one_worker_address() -> Iterator[str]:
    """The scheduler address of a LocalCluster of one single-threaded worker process (tests/engine/clusters.py),
    shared by the command-line tests that fit, evaluate and predict on a cluster with ``--scheduler``: each used to
    start one of its own (a scheduler and a worker process, a few seconds), and their commands only submit work to it
    and leave nothing on it. A test that needs workers of its own, or changes them, starts its own cluster."""
    from tests.engine.clusters import local_cluster

    with local_cluster(1) as (cluster, _):
        yield cluster.scheduler_address


#: The tests that call every compiled kernel in process (the model's, every kind's contract, the store's tokenizer and
#: window gathers). They run first on each test process, so numba's on-disk cache is written before the tests that
#: start worker and command processes, which then load the kernels instead of each compiling them (a cold cache
#: otherwise costs ~150 s of CPU across those processes).
COMPILING_FIRST = (
    "tests/model/",
    "tests/heads/test_head_contract.py",
    "tests/store/test_byte_tokenizer.py",
    "tests/store/test_selected_rows.py",
)


def _compiles_first(item: pytest.Item) -> bool:
    return item.nodeid.startswith(COMPILING_FIRST)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests so that each test process runs its share of :data:`COMPILING_FIRST` before anything else.

    pytest-xdist's ``worksteal`` scheduler (the suite's ``--dist``) hands its W workers consecutive slices of the
    collected list (``len(pending) // (W - i)`` items to the i-th), so each slice is made to start with its share of
    the compiling tests; stolen work comes from the slices' ends. Within each group the collection order is kept.
    """
    first = [item for item in items if _compiles_first(item)]
    rest = [item for item in items if not _compiles_first(item)]
    n_workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    ordered: list[pytest.Item] = []
    left = len(items)
    for worker in range(n_workers):
        size = left // (n_workers - worker)
        share = len(first) // (n_workers - worker)
        take = min(share, size)
        ordered += first[:take] + rest[: size - take]
        first, rest = first[take:], rest[size - take :]
        left -= size
    ordered += first + rest
    items[:] = ordered
