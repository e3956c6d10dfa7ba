"""Shared fixtures of the engine tests: small synthetic stores and one local cluster for the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dist_respattn import random_distribution
from dist_respattn.store import WriteOptions, write_synthetic
from tests.engine.clusters import local_cluster
from tests.stdlib_packages import PACKAGES, package_corpus

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


#: A package the gated stores' training rows lack and their test rows hold.
NEW_PACKAGE = "html"


@pytest.fixture(scope="package")
def package_stores(tmp_path_factory) -> tuple[str, str]:
    """``(train, test)`` token-stream stores of stdlib text, each file's package its attribute, made by
    ``dist-respattn ingest`` (a real command); the test store is made ``--like`` the training store and holds one more
    package, ``NEW_PACKAGE``. Shared by the gated fit and serving modules (each made the same two stores); read-only."""
    base = tmp_path_factory.mktemp("package-stores")
    train, test = str(base / "train.zarr"), str(base / "test.zarr")
    command = str(Path(sys.executable).parent / "dist-respattn")
    corpus = package_corpus(base / "corpus")
    done = subprocess.run(
        [command, "ingest", "--text", corpus, "--attribute-by", "directory", "--vocab-size", "300", "--dim", "6",
         "--context", "4", train, "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    held = package_corpus(base / "held", (*PACKAGES[:2], NEW_PACKAGE))
    done = subprocess.run(
        [command, "ingest", "--text", held, "--attribute-by", "directory", "--like", train, test, "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return train, test
