"""Shared fixtures of the monitor tests: a real ``dask scheduler --preload dist_respattn.monitor`` with two
``dask worker`` processes, stores big enough that a fit's iterations can be watched, and helpers that start
``dist-respattn fit`` subprocesses and read the scheduler's web server (the fit page, its JSON, ``/metrics``).

The cluster and the stores live for the whole ``tests/monitor`` package (``test_live`` and ``test_browser``
share them); every process is on 127.0.0.1 and the scheduler takes free ports (read back from its
``--scheduler-file``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import distributed
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dist_respattn import random_distribution
from dist_respattn.engine.cluster import QUIET_CLUSTER
from dist_respattn.monitor import API_PATH, PAGE_PATH
from dist_respattn.store import WriteOptions, write_synthetic
from tests.engine.test_cluster import COMMAND, DASK, DaskProcesses, clean_env, stop

#: Training rows: about a sixth of a second an iteration on two one-thread workers (4 partitions): enough to watch
#: a fit run, and half the rows (and time) the page needs.
ROWS = 100_000
VALIDATION_ROWS = 5_000
LAYOUT = WriteOptions(chunk_rows=16_384, partition_rows=32_768)
#: The head the stores are sampled from (S, N, D, T).
SHAPE = (30, 4, 5, 12)

T = TypeVar("T")

#: The embedded cluster's quieter Dask settings (no statistical profiler, slower ticks), as ``DASK_*`` variables for
#: the scheduler and workers started here: under Dask's defaults the three idle processes spent ~5% of a core between
#: the package's fits (measured: a scheduler and one worker, idle 20 s, 1.27 CPU s under the defaults, 0.27 quiet).
#: What is tested of them (the preloaded monitor, its page and metrics, Dask's own) does not depend on these.
QUIET_ENV = {
    "DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value) for key, value in QUIET_CLUSTER.items()
}

# The scheduler is on 127.0.0.1: never go through a proxy the environment may name.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Stores:
    train: str
    validation: str


@pytest.fixture(scope="package")
def stores(tmp_path_factory) -> Stores:
    """A ROWS-row training store and a VALIDATION_ROWS-row validation store of one random head; read-only."""
    folder = tmp_path_factory.mktemp("monitor-stores")
    truth = random_distribution(*SHAPE, seed=0, sigma2=0.5)
    train, validation = str(folder / "train.zarr"), str(folder / "validation.zarr")
    write_synthetic(train, ROWS, model=truth, seed=1, options=LAYOUT)
    write_synthetic(validation, VALIDATION_ROWS, model=truth, seed=2, options=LAYOUT)
    return Stores(train, validation)


@dataclass
class Response:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_get(url: str, timeout: float = 30) -> Response:
    """GET ``url``; an HTTP error status is returned, not raised."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return Response(response.status, response.headers.get("Content-Type", ""), response.read())
    except urllib.error.HTTPError as error:
        return Response(error.code, error.headers.get("Content-Type", ""), error.read())


def parse_metrics(text: str) -> dict[str, Any]:
    """Prometheus text as ``{family name: family}``, parsed by prometheus_client's own parser."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_values(families: dict[str, Any], name: str, **labels: str) -> list[float]:
    """The values of the samples named ``name`` whose labels include ``labels``."""
    family = families.get(name)
    if family is None:
        return []
    return [s.value for s in family.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


class WebServer:
    """The scheduler's HTTP server (the dashboard's port): the fit page, its JSON and ``/metrics``."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def url(self, path: str) -> str:
        return self.base + path

    def get(self, path: str) -> Response:
        return http_get(self.url(path))

    def fits(self) -> list[dict[str, Any]]:
        response = self.get(API_PATH)
        assert response.status == 200, response.body[:500]
        body = response.json()
        assert body["installed"] is True, body
        return list(body["fits"])

    def fit_of(self, model_dir: Path | str) -> dict[str, Any] | None:
        """The board's record of the fit writing into ``model_dir`` (``None`` before its start event)."""
        mine = [f for f in self.fits() if f["model_dir"] == str(model_dir)]
        assert len(mine) <= 1, mine
        return mine[0] if mine else None

    def metrics(self) -> dict[str, Any]:
        response = self.get("/metrics")
        assert response.status == 200, response.body[:500]
        return parse_metrics(response.body.decode())

    def page(self) -> Response:
        return self.get(PAGE_PATH)


@dataclass
class MonitoredCluster(DaskProcesses):
    """``dask scheduler --preload dist_respattn.monitor`` and two one-thread ``dask worker`` processes."""

    web: WebServer


def start_dask(folder: Path, name: str, *args: str) -> subprocess.Popen:
    """``dask ARGS`` with stdout and stderr in ``folder/<name>.log``."""
    with open(folder / f"{name}.log", "wb") as log:
        return subprocess.Popen([DASK, *args], stdout=log, stderr=subprocess.STDOUT, env=clean_env(**QUIET_ENV))


def read_scheduler_file(path: Path, scheduler: subprocess.Popen, timeout: float = 60) -> dict[str, Any]:
    """The scheduler's ``--scheduler-file``, once it is written (the scheduler must not exit meanwhile)."""

    def written() -> dict[str, Any] | None:
        assert scheduler.poll() is None, f"the scheduler exited with {scheduler.returncode}"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    return wait_until(written, timeout, "the scheduler to write its scheduler file")


@pytest.fixture(scope="package")
def monitored_cluster(tmp_path_factory) -> Iterator[MonitoredCluster]:
    """The monitor preloaded on a subprocess scheduler (free ports, 127.0.0.1) with two workers."""
    folder = tmp_path_factory.mktemp("monitored-cluster")
    scheduler_file = folder / "scheduler.json"
    scheduler = start_dask(
        folder, "scheduler", "scheduler", "--preload", "dist_respattn.monitor", "--host", "127.0.0.1",
        "--port", "0", "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file),
    )  # fmt: skip
    processes = [scheduler]
    try:
        info = read_scheduler_file(scheduler_file, scheduler)
        address, http_port = info["address"], info["services"]["dashboard"]
        for i in range(2):
            worker = start_dask(
                folder, f"worker-{i}", "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1",
                "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(folder / f"worker-{i}"),
            )  # fmt: skip
            processes.append(worker)
        web = WebServer(f"http://127.0.0.1:{http_port}")
        cluster = MonitoredCluster(address, web.base, scheduler, processes[1:], folder, web)
        with distributed.Client(address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
        assert not cluster.exited(), cluster.log_tail()
        yield cluster
    finally:
        stop(processes[1:])
        stop(processes[:1])


def wait_until(
    probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1, alive: FitProcess | None = None
) -> T:
    """Call ``probe`` until it returns something other than ``None`` (or ``False``), for ``timeout`` seconds.

    With ``alive``, fail as soon as that fit process has exited (whatever the probe says next could only
    describe a finished fit).
    """
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None and alive.process.poll() is not None:
            value = probe()
            if value is not None and value is not False:
                return value
            pytest.fail(f"the fit exited ({alive.process.returncode}) before {what}:\n{alive.stderr()[-3000:]}")
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class FitProcess:
    """A ``dist-respattn fit`` subprocess, its model directory and its output files."""

    process: subprocess.Popen
    model_dir: Path
    out: Path
    err: Path
    started: float = field(default_factory=time.monotonic)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def wait(self, timeout: float = 180) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the driver (nothing of it runs on: no end event, no goodbye to the scheduler)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def start_fit(cluster: MonitoredCluster, stores: Stores, model_dir: Path, max_iter: int, *extra: str) -> FitProcess:
    """``dist-respattn fit`` of the training store, validated, on ``cluster`` for exactly ``max_iter``
    iterations (``--tol 0`` and a patience beyond ``max_iter``: it neither converges nor stops early)."""
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    out, err = model_dir.parent / f"{model_dir.name}.stdout", model_dir.parent / f"{model_dir.name}.stderr"
    command = [
        COMMAND, "fit", stores.train, "--validation", stores.validation, "--model-dir", str(model_dir),
        "--scheduler", cluster.address, "--max-iter", str(max_iter), "--tol", "0",
        "--patience", str(max_iter + 1), *extra,
    ]  # fmt: skip
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=clean_env())
    return FitProcess(process, model_dir, out, err)


def wait_running(cluster: MonitoredCluster, fit: FitProcess, iteration: int, timeout: float = 90) -> dict[str, Any]:
    """The board's record of ``fit`` once it is running with at least ``iteration`` iterations done."""

    def probe() -> dict[str, Any] | None:
        record = cluster.web.fit_of(fit.model_dir)
        if record is not None and record["state"] == "running" and record["iteration"] >= iteration:
            return record
        return None

    return wait_until(probe, timeout, f"the fit to run iteration {iteration}", alive=fit)
