"""A registry and its stores on S3: moto's server on 127.0.0.1 as the object store.

The training and validation stores are written to ``s3://`` through the store writer, the cluster's workers
read them (they inherit the test credentials: the cluster starts after the environment is set), and
``dist-respattn retrain`` and ``models list|check`` run through the command's ``main`` in this process, against
``s3://respattn/registry`` with ``--storage-option endpoint_url=…`` (what a shell sees of those commands is
test_cli.py's). The lock's exclusive create is S3's conditional PUT (``If-None-Match``), which moto honours.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import urllib.request

import boto3
import pytest
from moto.server import ThreadedMotoServer

from dist_respattn.artifacts.registry_lock import LOCK_FILE
from dist_respattn.registry import Registry, RegistryFiles, RegistryLock, RegistryLocked
from dist_respattn.store import write_synthetic
from tests.engine.clusters import local_cluster
from tests.registry.conftest import LAYOUT, dead_pid, run_in_process, truth

#: The module's fixture alone (the object store, stores on it, a cluster, two commands) takes ~20 s.
pytestmark = pytest.mark.slow

BUCKET = "respattn"
REGISTRY = f"s3://{BUCKET}/registry"


@dataclasses.dataclass(frozen=True)
class S3:
    endpoint: str
    train: str
    validation: str

    @property
    def options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint}

    @property
    def cli_options(self) -> tuple[str, ...]:
        return ("--storage-option", f"endpoint_url={self.endpoint}")


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free port of 127.0.0.1, credentials in the environment (for this process, the
    commands it starts and the cluster's workers), a bucket, and the training and validation stores in it."""
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.ERROR)  # one access-log line per request otherwise
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "NO_PROXY": "127.0.0.1,localhost",
        }.items():
            env.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            # moto keeps its buckets in this process, across servers: when xdist's work stealing splits the module,
            # this fixture is set up again in the same process, and must start from an empty object store.
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30)
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            layout = dataclasses.replace(LAYOUT, storage_options={"endpoint_url": endpoint})
            paths = S3(endpoint, f"s3://{BUCKET}/stores/train.zarr", f"s3://{BUCKET}/stores/validation.zarr")
            write_synthetic(paths.train, 8192, model=truth(0), seed=1, options=layout)
            write_synthetic(paths.validation, 4096, model=truth(0), seed=2, options=layout)
            yield paths
        finally:
            server.stop()
            werkzeug.setLevel(level)


@pytest.fixture(scope="module")
def client(s3):
    """This module's cluster, started once the credentials are in the environment its workers inherit: one worker
    process, which reads the stores from S3 as any number would (what several workers do is tested elsewhere)."""
    with local_cluster(1) as (_, c):
        yield c


def keys(s3: S3, prefix: str) -> list[str]:
    listing = boto3.client("s3", endpoint_url=s3.endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for item in listing.get("Contents", []))


@pytest.fixture(scope="module")
def runs(s3, address):
    """Two ``retrain`` commands on the S3 registry (the second with ``--keep 1``), then ``models list`` and
    ``models check`` on it."""
    common = (
        "retrain",
        "--registry",
        REGISTRY,
        "--store",
        s3.train,
        "--validation",
        s3.validation,
        *s3.cli_options,
        "--scheduler",
        address,
        "--max-iter",
        "2",
    )
    # Through the command's main in this process: what is tested here is S3, not the process boundary, and a
    # process for each would load the package again.
    first = run_in_process(*common, "--json")
    second = run_in_process(*common, "--tolerance", "0.5", "--keep", "1")
    listing = run_in_process("models", "list", REGISTRY, *s3.cli_options, "--json")
    check = run_in_process("models", "check", REGISTRY, *s3.cli_options)
    return {"first": first, "second": second, "list": listing, "check": check}


def test_retrain_on_s3_publishes_then_publishes_again_and_prunes(s3, runs):
    first = runs["first"]
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert (report["published"], report["version"], report["registry"]) == (True, 1, REGISTRY)
    assert report["gate"]["store"] == s3.validation and report["gate"]["current"] is None

    second = runs["second"]
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[0] == f"published version 2 to {REGISTRY}"
    assert second.stdout.splitlines()[-1] == "pruned versions: 1"
    assert f"{REGISTRY}: warm start from version 1" in second.stderr.splitlines()

    registry = Registry(REGISTRY, s3.options)
    assert registry.numbers() == [2] and registry.latest_number() == 2
    assert registry.problems() == []
    version = registry.version(2)
    assert version.record["provenance"]["store"]["url"] == s3.train
    assert version.record["provenance"]["warm_start_from"] == 1
    assert registry.load().meta["init"] == {"kind": "given"}
    assert keys(s3, "registry/") == sorted(
        [
            "registry/registry.json",
            "registry/latest.json",
            "registry/versions/000002.json",
            f"registry/{version.model_path}/params.npz",
            f"registry/{version.model_path}/meta.json",
        ]
    )  # version 1's model is gone with it, and no lock is left


def test_models_list_and_check_on_s3(runs):
    listing = runs["list"]
    assert listing.returncode == 0, listing.stderr
    report = json.loads(listing.stdout)
    assert (report["registry"], report["latest"], [v["version"] for v in report["versions"]]) == (REGISTRY, 2, [2])
    check = runs["check"]
    assert (check.returncode, check.stdout) == (0, f"{REGISTRY}: 1 version, latest 2: every file checks out\n")


def test_lock_on_s3_is_exclusive(s3):
    files = RegistryFiles(f"s3://{BUCKET}/locking", s3.options)
    with RegistryLock(files) as held:
        with pytest.raises(RegistryLocked, match=f"pid {os.getpid()} on {socket.gethostname()}"):
            RegistryLock(files).acquire()
        held.check()
        assert files.read_json(LOCK_FILE)["token"] == held.token
    assert files.read(LOCK_FILE) is None
    with RegistryLock(files):  # released: free again
        pass


def test_create_on_s3_raced_by_threads_has_one_winner(s3):
    files = RegistryFiles(f"s3://{BUCKET}/racing", s3.options)
    barrier = threading.Barrier(6)
    won: list[int] = []

    def create(i: int) -> None:
        barrier.wait()
        if files.create("versions/000001.json", str(i).encode()):
            won.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert files.read("versions/000001.json") == str(won[0]).encode()


def test_stale_lock_of_a_dead_process_on_s3_is_broken(s3):
    files = RegistryFiles(f"s3://{BUCKET}/stale", s3.options)
    files.write_json(
        LOCK_FILE,
        {"token": "0" * 32, "host": socket.gethostname(), "pid": dead_pid(), "heartbeat": 1e12, "stale_after": 300.0},
    )
    with RegistryLock(files) as lock:
        assert files.read_json(LOCK_FILE)["token"] == lock.token


def test_retrain_on_an_s3_registry_held_by_another_run_exits_3(s3, runs, address):
    files = Registry(REGISTRY, s3.options).files
    with RegistryLock(files):
        result = run_in_process(
            "retrain", "--registry", REGISTRY, "--store", s3.train, *s3.cli_options, "--scheduler", address
        )
    assert result.returncode == 3, result.stderr
    assert result.stdout.startswith(f"not run: {REGISTRY}/{LOCK_FILE}: the registry is locked by another run (")
    assert f"pid {os.getpid()} on {socket.gethostname()}" in result.stdout
    assert len(result.stdout.splitlines()) == 1
    assert Registry(REGISTRY, s3.options).numbers() == [2]


def test_a_store_on_s3_takes_its_writer_lock_beside_it(s3):
    """The store's lock is the object ``<store>.lock`` (a conditional PUT): a live holder refuses an append and
    ``repair``; released, both run, and the append's rows are all there."""
    from dist_respattn.store import StoreLocation, TripleStore, WriteOptions, rollback_append
    from dist_respattn.store.lock import StoreLock, StoreLocked

    url = f"s3://{BUCKET}/stores/locked.zarr"
    layout = dataclasses.replace(LAYOUT, storage_options=s3.options)
    write_synthetic(url, 1000, model=truth(0), seed=5, options=layout)
    files = RegistryFiles(f"s3://{BUCKET}/stores", s3.options)
    assert files.read("locked.zarr.lock") is None  # released by the writer
    append = WriteOptions(append=True, storage_options=s3.options)
    with StoreLock.of(url, s3.options, purpose="test"):
        assert files.read_json("locked.zarr.lock")["purpose"] == "test"
        with pytest.raises(StoreLocked, match=rf"{url}\.lock: the store is being written by another writer"):
            write_synthetic(url, 100, seed=6, options=append)
        with pytest.raises(StoreLocked):
            rollback_append(url, storage_options=s3.options)
    assert rollback_append(url, storage_options=s3.options) == 1000
    assert write_synthetic(url, 100, seed=6, options=append).num_rows == 1100
    assert TripleStore.open(StoreLocation.of(url, s3.options)).num_rows == 1100
    assert files.read("locked.zarr.lock") is None
