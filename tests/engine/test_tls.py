"""``dist-respattn fit`` against a TLS-only Dask cluster: with the cluster's certificates it runs; without
certificates, or with certificates of another CA, it is refused quickly and cleanly.

A CA and a certificate for 127.0.0.1/localhost (server and client use) are made with ``cryptography``; a
``dask scheduler --protocol tls`` and two ``dask worker`` processes use them (Dask's TLS is mutual: the
scheduler asks the client for a certificate of its CA too).
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import distributed
import pytest

from dist_respattn.engine import load_checkpoint, load_model
from dist_respattn.engine.cluster import CONNECT_TIMEOUT_SECONDS

from ..certificates import TLSFiles, write_tls_files
from .conftest import D, N, S, T
from .test_cluster import COMMAND, DASK, ITERATION_LINE, clean_env, stop

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

#: A refusal is a configuration error: it must come well within the connect timeout, not after it.
REFUSAL_SECONDS = CONNECT_TIMEOUT_SECONDS


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, TLSFiles]:
    """``cluster``: the cluster's CA and certificate; ``other``: another CA's (same names, not trusted)."""
    folder = tmp_path_factory.mktemp("tls")
    return {name: write_tls_files(folder / name, name) for name in ("cluster", "other")}


@dataclass
class TLSCluster:
    address: str
    processes: list[subprocess.Popen]
    logs: Path

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            for log in sorted(self.logs.glob("*.log"))
        )


def _start_dask(folder: Path, name: str, *args: str) -> subprocess.Popen:
    with open(folder / f"{name}.log", "wb") as log:
        return subprocess.Popen([DASK, *args], stdout=log, stderr=subprocess.STDOUT, env=clean_env())


@pytest.fixture(scope="module")
def tls_cluster(certificates, tmp_path_factory) -> Iterator[TLSCluster]:
    """``dask scheduler --protocol tls`` (free ports on 127.0.0.1) and two ``dask worker`` processes, all with
    the cluster's certificates."""
    folder = tmp_path_factory.mktemp("tls-cluster")
    scheduler_file = folder / "scheduler.json"
    tls = certificates["cluster"].options()
    scheduler = _start_dask(
        folder, "scheduler", "scheduler", "--protocol", "tls", *tls, "--host", "127.0.0.1", "--port", "0",
        "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file),
    )  # fmt: skip
    processes = [scheduler]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.is_file() or not scheduler_file.read_text().strip().endswith("}"):
            assert scheduler.poll() is None, (folder / "scheduler.log").read_text(errors="replace")
            assert time.monotonic() < deadline, "the TLS scheduler did not write its scheduler file"
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:"), address
        for i in range(2):
            worker = _start_dask(
                folder, f"worker-{i}", "worker", address, *tls, "--nthreads", "1", "--host", "127.0.0.1",
                "--no-dashboard", "--local-directory", str(folder / f"worker-{i}"),
            )  # fmt: skip
            processes.append(worker)
        cluster = TLSCluster(address, processes, folder)
        with distributed.Client(
            address, timeout=60, set_as_default=False, security=certificates["cluster"].security()
        ) as client:
            client.wait_for_workers(2, timeout=60)
            assert all(w.startswith("tls://") for w in client.scheduler_info(n_workers=-1)["workers"])
        yield cluster
    finally:
        stop(processes[1:])
        stop(processes[:1])


@dataclass
class Run:
    """A finished ``dist-respattn fit`` subprocess and how long it took."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    model_dir: Path


def fit_command(store: str, model_dir: Path, address: str, *options: str) -> list[str]:
    return [COMMAND, "fit", store, "--model-dir", str(model_dir), "--scheduler", address, "--max-iter", "2",
            "--tol", "0", *options]  # fmt: skip


def run_timed(command: list[str], model_dir: Path, timeout: float = 120) -> Run:
    started = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=clean_env())
    return Run(completed.returncode, completed.stdout, completed.stderr, time.monotonic() - started, model_dir)


def run_concurrently(commands: dict[str, tuple[list[str], Path]]) -> dict[str, Run]:
    """Run the commands side by side (a refusal mostly waits) and time each one."""
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
        futures = {name: pool.submit(run_timed, command, model_dir) for name, (command, model_dir) in commands.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def refused(tls_cluster, certificates, small_store, tmp_path_factory) -> dict[str, Run]:
    """Two fits on the TLS cluster, run side by side: ``plain`` without any certificate, ``other`` with the
    certificates of another CA."""
    folder = tmp_path_factory.mktemp("tls-refused")
    commands = {
        "plain": (fit_command(small_store, folder / "plain", tls_cluster.address), folder / "plain"),
        "other": (
            fit_command(small_store, folder / "other", tls_cluster.address, *certificates["other"].options()),
            folder / "other",
        ),
    }
    return run_concurrently(commands)


def error_line(run: Run) -> str:
    """The one error line (announcements, such as where the held-out rows are, may come before it)."""
    lines = [line for line in run.stderr.strip().splitlines() if ": error: " in line]
    assert len(lines) == 1, run.stderr
    return lines[0]


def nothing_written(model_dir: Path) -> bool:
    return not model_dir.exists() or not any(model_dir.iterdir())


def test_fit_with_the_clusters_certificates_runs_and_writes_a_model(tls_cluster, certificates, small_store, tmp_path):
    """``--scheduler tls://... --tls-ca-file --tls-cert --tls-key`` connects (and says so), runs its 2
    iterations on the TLS workers and writes the model."""
    model_dir = tmp_path / "model"
    completed = subprocess.run(
        fit_command(small_store, model_dir, tls_cluster.address, *certificates["cluster"].options()),
        capture_output=True, text=True, timeout=180, check=False, env=clean_env(),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr + tls_cluster.log_tail()
    assert f"connected to the scheduler at {tls_cluster.address} (2 workers" in completed.stderr
    assert [int(i) for i, _ in ITERATION_LINE.findall(completed.stderr)] == [1, 2]
    checkpoint = load_checkpoint(model_dir)
    assert (checkpoint.iteration, checkpoint.meta["state"]) == (2, "max_iter")
    model = load_model(model_dir)
    assert (model.num_symbols, model.context_length, model.query_dim, model.num_targets) == (S, N, D, T)


def test_fit_without_certificates_is_refused(refused, tls_cluster):
    """No certificate for a ``tls://`` scheduler: exit 2 with an error naming TLS, and no model directory."""
    run = refused["plain"]
    assert run.returncode == 2, run.stderr
    line = error_line(run)
    assert line.startswith("dist-respattn fit: error: "), line
    assert "TLS" in line, line
    assert nothing_written(run.model_dir)
    assert "connected to the scheduler" not in run.stderr


def test_fit_without_certificates_fails_fast_on_one_line(refused):
    run = refused["plain"]
    assert "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.seconds < REFUSAL_SECONDS, f"the refusal took {run.seconds:.1f} s"


def test_fit_without_certificates_says_which_options_are_missing(refused):
    """The error says the scheduler speaks TLS and names the options that give the certificates (not Dask's
    internal "TLS expects a `ssl_context` argument" message)."""
    line = error_line(refused["plain"])
    assert "TLS" in line and "certificates" in line, line
    assert all(option in line for option in ("--tls-ca-file", "--tls-cert", "--tls-key")), line
    assert "ssl_context" not in line and "SSLContext" not in line, line


def test_fit_with_another_cas_certificates_is_refused(refused, tls_cluster, certificates):
    """Certificates of a CA the cluster does not trust: exit 2, one error line, no traceback, no model
    directory, well within the connect timeout; and the cluster still serves clients with its certificates."""
    run = refused["other"]
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert error_line(run).startswith("dist-respattn fit: error: "), run.stderr
    assert nothing_written(run.model_dir)
    assert run.seconds < REFUSAL_SECONDS, f"the refusal took {run.seconds:.1f} s"
    with distributed.Client(
        tls_cluster.address, timeout=30, set_as_default=False, security=certificates["cluster"].security()
    ) as client:
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2


def test_fit_with_another_cas_certificates_points_at_the_certificates(refused):
    """The refusal (a failed TLS handshake) points at the certificates and their CA, and the options."""
    line = error_line(refused["other"])
    assert "TLS" in line and "CA" in line, line
    assert "--tls-ca-file" in line, line
