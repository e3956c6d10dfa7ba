"""``dist-respattn fit`` as a subprocess on a real multi-process cluster, and on the cluster it embeds.

A ``dask scheduler`` and two ``dask worker`` processes are started here on 127.0.0.1; fits reach them
through ``--scheduler`` or ``$DASK_SCHEDULER_ADDRESS`` and must leave them running and serving (the
engine never closes a cluster it did not start), with one event per iteration on the scheduler. Without
an address the command starts, announces and closes its own local cluster with a live dashboard.
"""

from __future__ import annotations

import json
import operator
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.config
import distributed
import psutil
import pytest

from dist_respattn.engine import EVENT_TOPIC, ClusterOptions, cluster_info, load_checkpoint, load_model
from dist_respattn.engine.cluster import (
    FORKED_WORKERS,
    QUIET_CLUSTER,
    WHOLE_VALUES,
    connect,
    embedded_cluster_config,
)
from dist_respattn.events import EndEvent, IterationEvent, StartEvent
from dist_respattn.model.fitting.holdout import HoldoutRule

from .conftest import ROWS, D, N, S, T

BIN = Path(sys.executable).parent
COMMAND = str(BIN / "dist-respattn")
DASK = str(BIN / "dask")
ITERATION_LINE = re.compile(r"^iteration (\d+): held-out perplexity (\d+\.\d{3}) ", re.MULTILINE)
LOCAL_DASHBOARD = r"http://127\.0\.0\.1:\d+/status"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without a scheduler address, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    env.update(extra)
    return env


def run_fit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, "fit", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=clean_env() if env is None else env,
    )


def stop(processes: list[subprocess.Popen], timeout: float = 15.0) -> None:
    """Terminate ``processes`` and whatever they started, then kill what is left after ``timeout``."""
    tree: list[psutil.Process] = []
    for process in processes:
        try:
            parent = psutil.Process(process.pid)
            tree += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        if process.poll() is None:
            process.terminate()
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for leftover in alive:
        try:
            leftover.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)
    for process in processes:
        process.wait(timeout=timeout)


@dataclass
class DaskProcesses:
    """A scheduler and its workers running as ``dask`` subprocesses, with their logs."""

    address: str
    dashboard: str
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen]
    logs: Path

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            for log in sorted(self.logs.glob("*.log"))
        )

    def exited(self) -> dict[str, int]:
        """Exit codes of the processes that are no longer running."""
        named = {"scheduler": self.scheduler} | {f"worker {i}": w for i, w in enumerate(self.workers)}
        return {name: p.returncode for name, p in named.items() if p.poll() is not None}

    def serving_workers(self) -> list[str]:
        """The worker addresses a fresh client sees, after it ran a task on the cluster."""
        with distributed.Client(self.address, timeout=30, set_as_default=False) as client:
            assert client.submit(operator.add, 1, 2, pure=False).result(timeout=30) == 3
            return sorted(client.scheduler_info(n_workers=-1)["workers"])


def start_dask(folder: Path, *args: str) -> subprocess.Popen:
    """``dask ARGS`` with stdout and stderr in ``folder/<name>.log``."""
    name = f"{args[0]}-{len(list(folder.glob(f'{args[0]}*.log')))}"
    with open(folder / f"{name}.log", "wb") as log:
        return subprocess.Popen([DASK, *args], stdout=log, stderr=subprocess.STDOUT, env=clean_env())


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory) -> Iterator[DaskProcesses]:
    """``dask scheduler`` (dashboard on a free port) and two one-thread ``dask worker`` processes on 127.0.0.1."""
    folder = tmp_path_factory.mktemp("dask-cluster")
    port, dashboard_port = free_ports(2)
    address = f"tcp://127.0.0.1:{port}"
    scheduler = start_dask(
        folder, "scheduler", "--host", "127.0.0.1", "--port", str(port),
        "--dashboard-address", f"127.0.0.1:{dashboard_port}",
    )  # fmt: skip
    processes = [scheduler]
    try:
        worker_options = ("--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard")
        for i in range(2):
            processes.append(
                start_dask(folder, "worker", address, *worker_options, "--local-directory", str(folder / f"worker-{i}"))
            )
        workers = processes[1:]
        cluster = DaskProcesses(address, f"http://127.0.0.1:{dashboard_port}/status", scheduler, workers, folder)
        with distributed.Client(address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
        assert not cluster.exited(), cluster.log_tail()
        yield cluster
    finally:
        stop(processes[1:])
        stop(processes[:1])


@dataclass
class SchedulerFit:
    """One ``dist-respattn fit --scheduler`` run on ``dask_cluster``."""

    completed: subprocess.CompletedProcess[str]
    model_dir: Path
    workers_before: list[str]


@pytest.fixture(scope="module")
def scheduler_fit(dask_cluster, small_store, tmp_path_factory) -> SchedulerFit:
    """4 iterations of the small store on the subprocess cluster, through ``--scheduler``."""
    before = dask_cluster.serving_workers()
    model_dir = tmp_path_factory.mktemp("scheduler-fit") / "model"
    completed = run_fit(
        small_store, "--model-dir", str(model_dir), "--scheduler", dask_cluster.address, "--max-iter", "4", "--tol", "0"
    )
    return SchedulerFit(completed, model_dir, before)


def fit_events(address: str, run_id: str) -> list[dict[str, Any]]:
    """Every event (start, iterations, end) one fit published on the scheduler at ``address``, in order."""
    with distributed.Client(address, timeout=30, set_as_default=False) as client:
        return [record for _, record in client.get_events(EVENT_TOPIC) if record.get("run_id") == run_id]


# ------------------------------------------------------------------------- an existing cluster


@pytest.mark.slow
def test_fit_through_scheduler_option_reports_each_iteration_and_writes_a_model(scheduler_fit, dask_cluster):
    """``fit --scheduler ADDRESS`` exits 0, says it connected to that scheduler (with its 2 workers and its
    dashboard), prints one line per iteration in order, and leaves a 4-iteration model of the store's shape."""
    completed = scheduler_fit.completed
    assert completed.returncode == 0, completed.stderr
    connected = rf"^connected to the scheduler at {re.escape(dask_cluster.address)} \(2 workers\b.*$"
    line = re.search(connected, completed.stderr, re.MULTILINE)
    assert line, completed.stderr
    assert line.group(0).endswith(f"dashboard: {dask_cluster.dashboard}")
    assert "started a local cluster" not in completed.stderr
    assert [int(i) for i, _ in ITERATION_LINE.findall(completed.stderr)] == [1, 2, 3, 4]
    assert "EM stopped at --max-iter after 4 iterations" in completed.stdout

    model = load_model(scheduler_fit.model_dir)
    assert (model.num_symbols, model.context_length, model.query_dim, model.num_targets) == (S, N, D, T)
    checkpoint = load_checkpoint(scheduler_fit.model_dir, "latest")
    assert checkpoint.iteration == 4
    assert checkpoint.meta["state"] == "max_iter"
    printed = [float(perplexity) for _, perplexity in ITERATION_LINE.findall(completed.stderr)]
    saved = [entry["heldout"]["perplexity"] for entry in checkpoint.meta["history"]]
    assert printed == [round(perplexity, 3) for perplexity in saved]


@pytest.mark.slow
def test_fit_through_scheduler_option_leaves_the_cluster_running(scheduler_fit, dask_cluster):
    """After the fit the scheduler and both worker processes still run, and a new client runs a task on the
    same two workers as before the fit: the engine closed its client, not the cluster it did not start."""
    assert scheduler_fit.completed.returncode == 0, scheduler_fit.completed.stderr
    assert dask_cluster.exited() == {}, dask_cluster.log_tail()
    assert len(scheduler_fit.workers_before) == 2
    assert dask_cluster.serving_workers() == scheduler_fit.workers_before


@pytest.mark.slow
def test_fit_publishes_one_event_per_iteration_on_the_scheduler(scheduler_fit, dask_cluster):
    """A client attached to the scheduler reads one ``dist_respattn.fit`` record per iteration of the fit,
    in order, with the log-likelihood the checkpoint saved, the seconds taken and the rows per second."""
    assert scheduler_fit.completed.returncode == 0, scheduler_fit.completed.stderr
    history = load_checkpoint(scheduler_fit.model_dir, "latest").meta["history"]
    stream = fit_events(dask_cluster.address, history[0]["run_id"])
    assert [e["event"] for e in stream] == ["start", "iteration", "iteration", "iteration", "iteration", "end"]
    # Each has exactly the fields its type declares: the types the monitor's tests make their events from.
    for event, kind in zip(stream, (StartEvent, *[IterationEvent] * 4, EndEvent), strict=True):
        assert set(event) == kind.__required_keys__ | kind.__optional_keys__, event["event"]
    assert (
        stream[0]["rows"] == ROWS
        and stream[0]["max_iter"] == 4
        and stream[0]["model_dir"] == str(scheduler_fit.model_dir)
    )
    assert stream[-1]["state"] == history[-1]["state"] == "max_iter" and stream[-1]["error"] is None
    events = stream[1:-1]
    assert [e["iteration"] for e in events] == [1, 2, 3, 4]
    assert [e["mean_log_likelihood"] for e in events] == [h["mean_log_likelihood"] for h in history]
    for event in events:
        assert event["seconds"] > 0
        assert event["rows_per_second"] == pytest.approx(ROWS / event["seconds"], rel=1e-9)
        # The fit trains on all but the rows its hold-out keeps for the choices (it has no validation store).
        assert event["n_obs"] == ROWS - HoldoutRule.for_rows(ROWS).count(ROWS)


@pytest.mark.slow
def test_fit_through_the_environment_variable(dask_cluster, small_store, tmp_path):
    """With no ``--scheduler``, ``$DASK_SCHEDULER_ADDRESS`` names the cluster: the fit runs there (its events
    are on that scheduler, no local cluster is started) and the cluster keeps running with the same workers."""
    before = dask_cluster.serving_workers()
    model_dir = tmp_path / "model"
    completed = run_fit(
        small_store, "--model-dir", str(model_dir), "--max-iter", "2", "--tol", "0",
        env=clean_env(DASK_SCHEDULER_ADDRESS=dask_cluster.address),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert f"connected to the scheduler at {dask_cluster.address} (2 workers" in completed.stderr
    assert "started a local cluster" not in completed.stderr
    assert [int(i) for i, _ in ITERATION_LINE.findall(completed.stderr)] == [1, 2]
    run_id = load_checkpoint(model_dir).meta["history"][0]["run_id"]
    iterations = [e for e in fit_events(dask_cluster.address, run_id) if e["event"] == "iteration"]
    assert [e["iteration"] for e in iterations] == [1, 2]
    assert dask_cluster.exited() == {}, dask_cluster.log_tail()
    assert dask_cluster.serving_workers() == before


@pytest.mark.slow
def test_scheduler_option_wins_over_the_environment_variable(dask_cluster, small_store, tmp_path):
    """``--scheduler`` is used even when ``$DASK_SCHEDULER_ADDRESS`` names a scheduler that does not exist."""
    (dead_port,) = free_ports(1)
    completed = run_fit(
        small_store, "--model-dir", str(tmp_path / "model"), "--scheduler", dask_cluster.address, "--max-iter", "1",
        env=clean_env(DASK_SCHEDULER_ADDRESS=f"tcp://127.0.0.1:{dead_port}"),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert f"connected to the scheduler at {dask_cluster.address} " in completed.stderr


@pytest.fixture
def dashboardless_scheduler(tmp_path) -> Iterator[str]:
    """``dask scheduler --no-dashboard`` (its plain HTTP routes on a free port), without workers."""
    port, http_port = free_ports(2)
    scheduler = start_dask(
        tmp_path, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
        "--dashboard-address", f"127.0.0.1:{http_port}",
    )  # fmt: skip
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop([scheduler])


@pytest.mark.slow
def test_no_dashboard_is_reported_when_the_scheduler_serves_none(dashboardless_scheduler):
    """A scheduler started with ``--no-dashboard`` serves no dashboard (though Dask still registers an HTTP
    service named "dashboard"): the cluster info a fit reports, and prints as ``dashboard: …``, is ``None``."""
    with distributed.Client(dashboardless_scheduler, timeout=30, set_as_default=False) as client:
        assert cluster_info(client).dashboard is None


def _bokeh_sessions(dask_scheduler: Any) -> int:
    """The Bokeh sessions the scheduler's dashboard holds (one a page someone opened, until it expires)."""
    return sum(
        len(app.get_sessions(path)) for app in dask_scheduler.http_application.applications for path in app.app_paths
    )


@pytest.mark.slow
def test_the_dashboard_is_found_without_opening_its_page(client):
    """Describing a cluster finds its dashboard (a link that answers) without the scheduler building the status
    page's Bokeh document: the check asks with ``HEAD``, which opens no session (a ``GET`` opened one, and the
    scheduler kept it updating until it expired)."""
    from dist_respattn.engine import cluster

    cluster._serves_dashboard.cache_clear()  # the check is made once per link: make it here
    before = client.run_on_scheduler(_bokeh_sessions)
    info = cluster_info(client)
    assert info.dashboard is not None and info.dashboard.startswith("http://127.0.0.1:")
    assert client.run_on_scheduler(_bokeh_sessions) == before
    with urllib.request.urlopen(info.dashboard, timeout=30) as page:  # the page itself is there: one session more
        assert page.status == 200
    assert client.run_on_scheduler(_bokeh_sessions) == before + 1


# ------------------------------------------------------------------------- the embedded cluster


@pytest.mark.slow
def test_embedded_cluster_is_announced_with_its_dashboard(small_store, tmp_path):
    """``fit --workers 1`` with no address starts a local cluster of one worker process and says so on stderr
    (counted in words a person reads: "1 worker", not "1 workers") with a dashboard URL on 127.0.0.1, not
    repeated at the end of the report (the cluster has shut down by then), and names the fit page the monitor
    serves beside it; the fit runs its 2 iterations. (The plural, "2 worker processes (2 workers, 2 threads)", is
    the announcement the Ctrl-C test below reads from its 2-worker fit.)"""
    completed = run_fit(small_store, "--model-dir", str(tmp_path / "model"), "--workers", "1", "--max-iter", "2")
    assert completed.returncode == 0, completed.stderr
    counts = "1 worker process (1 worker, 1 thread)"
    announced = re.search(
        rf"^started a local cluster of {re.escape(counts)}; dashboard: ({LOCAL_DASHBOARD})$",
        completed.stderr,
        re.MULTILINE,
    )
    assert announced, completed.stderr
    page = announced.group(1).removesuffix("/status") + "/respattn/fits"
    assert f"\nfit page: {page} (the fit's iterations in a browser" in completed.stderr, completed.stderr
    assert "dashboard" not in completed.stdout, completed.stdout
    assert [int(i) for i, _ in ITERATION_LINE.findall(completed.stderr)] == [1, 2]
    assert load_checkpoint(tmp_path / "model").iteration == 2


def _worker_settings(dask_worker: Any) -> dict[str, Any]:
    """What a worker process runs with: its periodic callbacks, its event loop's tick, its memory monitor,
    whether it was forked from a process that had imported the workers' modules (nothing in a worker imports
    ``worker_preload`` itself), and whether numba's CPU target was ready before any kernel ran in it."""
    from numba.core.imputils import builtin_registry
    from numba.core.registry import cpu_target

    numba_ready = "_toplevel_target_context" in vars(cpu_target)  # made on first use (a cached property)
    return {
        "callbacks": sorted(dask_worker.periodic_callbacks),
        "tick": dask_worker._tick_interval,
        "memory_monitor": dask_worker.memory_manager.memory_monitor_interval,
        "shard": distributed.comm.tcp.TCP.max_shard_size,
        "preloaded": "dist_respattn.engine.worker_preload" in sys.modules,
        "parent": psutil.Process().parent().cmdline(),
        "parent_pid": psutil.Process().parent().pid,
        "numba_ready": numba_ready and builtin_registry in cpu_target.target_context._registries,
    }


@pytest.mark.slow
def test_embedded_cluster_runs_quieter_than_dask_defaults_and_keeps_what_the_user_set():
    """An embedded cluster's workers run without Dask's profiler and with the slower tick, system monitor and
    memory monitor of ``QUIET_CLUSTER`` (its scheduler too), forked from a forkserver that imported their modules
    and readied numba's CPU target (``FORKED_WORKERS``); a setting the user changed from Dask's default (the tick,
    here) is kept, and the caller's own Dask config is left as it was."""
    with dask.config.set({"distributed.admin.tick.interval": "500ms"}), connect(ClusterOptions(n_workers=1)) as client:
        (worker,) = client.run(_worker_settings).values()
        scheduler_tick = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler._tick_interval)
        assert dask.config.get("distributed.worker.profile.enabled") is True
    assert "profile" not in worker["callbacks"] and "profile-cycle" not in worker["callbacks"], worker
    assert (worker["tick"], scheduler_tick) == (0.5, 0.5)
    assert worker["memory_monitor"] == 0.25
    # Values up to 1 GiB go in one frame, not in 64 MiB frames the receiver copies back together.
    assert worker["shard"] == 2**30
    # Forked from the forkserver, which had imported what a worker runs and readied numba's target to run it.
    assert worker["preloaded"] and "multiprocessing.forkserver" in " ".join(worker["parent"]), worker
    assert worker["numba_ready"], worker


def _environment_variable() -> str | None:
    return os.environ.get("RESPATTN_SET_LATER")


@pytest.mark.slow
def test_a_forked_worker_sees_the_environment_as_it_is_when_its_cluster_starts(monkeypatch):
    """A variable set after the forkserver started (by this process's first embedded cluster) reaches the workers
    of the next cluster, as it would reach spawned ones (credentials set between two fits, say)."""
    with connect(ClusterOptions(n_workers=1)) as client:
        assert list(client.run(_environment_variable).values()) == [None]
    monkeypatch.setenv("RESPATTN_SET_LATER", "set-later")
    with connect(ClusterOptions(n_workers=1)) as client:
        assert list(client.run(_environment_variable).values()) == ["set-later"]


def test_embedded_cluster_config_leaves_out_what_the_user_changed():
    """Every quieter setting applies while it has Dask's default value; one the user changed is left out, a shard
    size the user set keeps the whole-values setting out, and a start method the user chose is kept."""
    assert embedded_cluster_config() == {**QUIET_CLUSTER, **WHOLE_VALUES, **FORKED_WORKERS}
    with dask.config.set({"distributed.admin.tick.interval": "500ms", "distributed.worker.profile.interval": "5ms"}):
        assert embedded_cluster_config() == {
            **{key: value for key, value in QUIET_CLUSTER.items() if key != "distributed.admin.tick.interval"},
            **WHOLE_VALUES,
            **FORKED_WORKERS,
        }
    with dask.config.set({"distributed.comm.shard": "32MiB", "distributed.worker.multiprocessing-method": "fork"}):
        assert embedded_cluster_config() == QUIET_CLUSTER


def test_embedded_cluster_config_keeps_a_default_value_the_user_named(monkeypatch):
    """A ``DASK_*`` variable (or config file) that names a setting keeps it, even at Dask's default value: spawned
    workers, the profiler on."""
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "spawn")
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "True")
    assert embedded_cluster_config() == {
        **{key: value for key, value in QUIET_CLUSTER.items() if key != "distributed.worker.profile.enabled"},
        **WHOLE_VALUES,
    }


@pytest.mark.slow
def test_a_user_who_names_spawn_gets_spawned_workers(monkeypatch):
    """``DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD=spawn`` makes the embedded cluster's worker a fresh
    interpreter its nanny (in this process) started, not a child of the forkserver."""
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "spawn")
    with connect(ClusterOptions(n_workers=1)) as client:
        (worker,) = client.run(_worker_settings).values()
    assert worker["parent_pid"] == os.getpid(), worker
    assert "multiprocessing.forkserver" not in " ".join(worker["parent"]), worker


@pytest.mark.slow
def test_embedded_cluster_json_report_offers_no_closed_dashboard(small_store, tmp_path):
    """With ``--json`` the report's ``dashboard`` field is empty (the embedded cluster and its dashboard closed with
    the fit) and stderr stays quiet. (One worker process: how many the cluster has plays no part here.)"""
    completed = run_fit(
        small_store, "--model-dir", str(tmp_path / "model"), "--workers", "1", "--max-iter", "2", "--json"
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["dashboard"] is None
    assert (report["state"], report["iterations"]) == ("max_iter", 2)
    assert "started a local cluster" not in completed.stderr


@pytest.mark.slow
def test_embedded_dashboard_answers_while_the_fit_runs_and_ctrl_c_closes_the_cluster(small_store, tmp_path):
    """While an embedded-cluster fit runs, its announced dashboard answers with Dask's status page; Ctrl-C
    (SIGINT) then ends the command with status 130 and "interrupted", and every process it started exits."""
    process = subprocess.Popen(
        [COMMAND, "fit", small_store, "--model-dir", str(tmp_path / "model"), "--workers", "2",
         "--max-iter", "1000", "--tol", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:
        assert process.stderr is not None
        seen = []
        while not (seen and "started a local cluster" in seen[-1]):
            line = process.stderr.readline()
            assert line, "".join(seen) + "(the fit ended without announcing its cluster)"
            seen.append(line)
        # The whole announcement, in the plural of a cluster of 2 worker processes.
        url = re.fullmatch(
            rf"started a local cluster of 2 worker processes \(2 workers, 2 threads\); dashboard: ({LOCAL_DASHBOARD})",
            seen[-1].strip(),
        )
        assert url, seen[-1]
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) >= 2  # the two worker processes (and multiprocessing's helpers)
        with urllib.request.urlopen(url.group(1), timeout=30) as response:
            assert response.status == 200
            assert b"Dask" in response.read()
        assert process.poll() is None, "the fit ended before the dashboard was read"

        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        # Its last line says what the fit kept (tests/engine/test_interrupts.py checks the rest of it).
        assert stderr.rstrip().splitlines()[-1].startswith("dist-respattn fit: interrupted"), stderr
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"processes left running after the fit ended: {[p.pid for p in alive]}"
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


UNGUARDED_SCRIPT = """\
from dist_respattn.engine import ClusterOptions, FitSettings, fit
from dist_respattn.store import WriteOptions, write_synthetic

# No `if __name__ == "__main__":`: each worker process the fit starts runs this file again, up to the fit.
write_synthetic("train.zarr", 500, num_symbols=5, context_length=2, query_dim=2, num_targets=3,
                options=WriteOptions(overwrite=True))
fit("train.zarr", model_dir="model", cluster=ClusterOptions(n_workers=1), settings=FitSettings(max_iter=1))
"""


@pytest.mark.slow
def test_a_script_that_starts_a_cluster_without_the_main_guard_is_told_to_add_it(tmp_path):
    """The embedded cluster's worker process imports the script again; the fit it reaches there refuses, in one
    line naming the guard, instead of multiprocessing's "bootstrapping phase" error; the script fails."""
    (tmp_path / "script.py").write_text(UNGUARDED_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # the user's script, run as a user runs it
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert (
        "ClusterError: this script is being imported again by a worker process of the cluster it starts (each "
        "worker process imports the main script), so it would start one of its own: put the calls under "
        '`if __name__ == "__main__":` (see the docs\' quickstart)\n'
    ) in done.stderr, done.stderr
    assert "bootstrapping phase" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("dist_respattn.engine.cluster.ClusterError: "), done.stderr
    assert not (tmp_path / "model").exists()
