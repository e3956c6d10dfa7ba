"""Shared fixtures of the engine tests: small synthetic stores and one local cluster for the package."""

from __future__ import annotations

import pytest

from dist_respattn import random_distribution
from dist_respattn.store import WriteOptions, write_synthetic
from tests.engine.clusters import local_cluster

#: A small head: S symbols, context length N, query dim D, T targets.
S, N, D, T = 30, 4, 5, 12
#: 20,000 rows in 2,048-row chunks and 4,096-row partitions: 5 partitions, the last one partial.
ROWS = 20_000
SMALL = WriteOptions(chunk_rows=2048, partition_rows=4096)


def small_truth(seed: int = 0):
    """The head the small stores are sampled from."""
    return random_distribution(S, N, D, T, seed=seed, sigma2=0.5)


@pytest.fixture(scope="session")
def small_store(tmp_path_factory) -> str:
    """A synthetic store of ROWS rows (5 partitions) sampled from ``small_truth()``; treat it as read-only."""
    path = str(tmp_path_factory.mktemp("stores") / "train.zarr")
    write_synthetic(path, ROWS, model=small_truth(), seed=1, options=SMALL)
    return path


@pytest.fixture(scope="session")
def small_validation_store(tmp_path_factory) -> str:
    """5,000 held-out rows from the same head as ``small_store``; read-only."""
    path = str(tmp_path_factory.mktemp("stores") / "validation.zarr")
    write_synthetic(path, 5_000, model=small_truth(), seed=2, options=SMALL)
    return path


@pytest.fixture(scope="package")
def client():
    """A client of a LocalCluster of two single-threaded worker processes on 127.0.0.1, shared by the modules of
    tests/engine that run one after another in a test process (each cluster start is three processes and a few
    seconds: one a module was ~10 clusters a run). Its users only submit fits, passes and reads to it; a module
    that kills, retires or adds workers, or needs other worker settings, starts a cluster of its own."""
    with local_cluster(2) as (_, c):
        yield c
