"""The fit page, its JSON and the ``/metrics`` gauges of a real scheduler while a fit runs, after it ends, and
after its driver is killed; and the same page on an embedded cluster, where the fit installs the monitor.

The scheduler is ``dask scheduler --preload dist_respattn.monitor`` with two ``dask worker`` processes (see
``conftest.py``); the fits are ``dist-respattn fit --scheduler`` subprocesses.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dist_respattn.engine import EVENT_TOPIC, FitSettings, fit, load_checkpoint
from dist_respattn.monitor import API_PATH, PAGE_PATH, STATES, FitMonitor
from tests.engine.clusters import local_cluster

from .conftest import (
    ROWS,
    MonitoredCluster,
    Response,
    Stores,
    WebServer,
    http_get,
    sample_values,
    start_fit,
    wait_running,
    wait_until,
)

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

#: Iterations of the watched fit: about a sixth of a second each here, so it runs for a couple of seconds after
#: the first poll that sees iteration 2 (the pages are polled every 0.1 s): long enough to watch it run.
MAX_ITER = 12


@dataclass
class WatchedFit:
    """What the scheduler's web server showed of one fit: polls while it ran, and the end."""

    model_dir: Path
    returncode: int
    stdout: str
    stderr: str
    polls: list[dict[str, Any]]  # every JSON record of the fit while it was running, in order
    first_running: dict[str, Any]  # the first record with iteration >= 2
    metrics_running: dict[str, Any]  # /metrics read right after first_running
    status: Response  # the dashboard's /status, read while the fit ran
    page: Response  # the fit page, read while the fit ran
    final: dict[str, Any]
    metrics_final: dict[str, Any]


@pytest.fixture(scope="module")
def watched_fit(monitored_cluster: MonitoredCluster, stores: Stores, tmp_path_factory) -> WatchedFit:
    """Start a MAX_ITER-iteration fit, watch the page's JSON and ``/metrics`` while it runs, then at its end."""
    web = monitored_cluster.web
    process = start_fit(monitored_cluster, stores, tmp_path_factory.mktemp("watched") / "model", MAX_ITER)
    try:
        first = wait_running(monitored_cluster, process, 2)
        metrics_running = web.metrics()
        status, page = web.get("/status"), web.page()
        polls = [first]
        # Keep polling until the fit leaves "running"; every record seen while running is kept.
        while process.process.poll() is None:
            record = web.fit_of(process.model_dir)
            assert record is not None
            if record["state"] != "running":
                break
            polls.append(record)
            time.sleep(0.1)
        returncode = process.wait(timeout=180)
        final = web.fit_of(process.model_dir)
        assert final is not None
        return WatchedFit(
            process.model_dir, returncode, process.stdout(), process.stderr(), polls, first, metrics_running,
            status, page, final, web.metrics(),
        )  # fmt: skip
    finally:
        process.kill()


def check_consistent(record: dict[str, Any], stores: Stores, max_iter: int) -> None:
    """The figures of one JSON record agree with each other and with the fit's store and settings."""
    n = record["iteration"]
    assert (record["rows"], record["max_iter"]) == (ROWS, max_iter)
    assert (record["store"], record["validation"]) == (stores.train, stores.validation)
    assert (record["heldout_rows"], record["no_heldout_rows"]) == (f"the validation store {stores.validation}", False)
    assert [p[0] for p in record["log_likelihood_curve"]] == list(range(1, n + 1))
    assert [p[0] for p in record["heldout_curve"]] == list(range(1, n + 1))
    assert [p[0] for p in record["seconds_curve"]] == list(range(1, n + 1))
    assert record["mean_log_likelihood"] == record["log_likelihood_curve"][-1][1]
    assert record["heldout_log_likelihood"] == record["heldout_curve"][-1][1]
    assert record["heldout_perplexity"] == record["heldout_curve"][-1][2]
    assert record["seconds_per_iteration"] == record["seconds_curve"][-1][1] > 0
    assert record["rows_per_second"] == pytest.approx(ROWS / record["seconds_per_iteration"], rel=1e-9)
    for _, loglik in record["log_likelihood_curve"]:
        assert loglik is not None and loglik < 0
    for _, heldout_loglik, perplexity, accuracy in record["heldout_curve"]:
        # The held-out pass scores the M-step's candidates: log-likelihood and perplexity, no accuracy.
        assert heldout_loglik < 0 and perplexity > 1 and accuracy is None


def test_the_page_follows_a_running_fit_live(watched_fit, stores):
    """While the fit runs its JSON record is ``running`` with iterations that only grow (at least two polls
    apart), curves as long as the iteration count, the store's rows, and earlier points that never change."""
    assert watched_fit.returncode == 0, watched_fit.stderr
    polls = watched_fit.polls
    assert watched_fit.first_running["iteration"] >= 2
    iterations = [p["iteration"] for p in polls]
    assert iterations == sorted(iterations), iterations
    assert iterations[-1] > iterations[0], f"the iteration never moved while the fit ran: {iterations}"
    # (the last iteration is on the board a moment before the end event)
    assert all(p["state"] == "running" and 2 <= p["iteration"] <= MAX_ITER for p in polls)
    for record in polls:
        check_consistent(record, stores, MAX_ITER)
    for earlier, later in itertools.pairwise(polls):
        n = earlier["iteration"]
        for curve in ("log_likelihood_curve", "heldout_curve", "seconds_curve"):
            assert later[curve][:n] == earlier[curve], curve
        assert later["started"] == earlier["started"] and later["updated"] >= earlier["updated"]


def test_metrics_show_the_running_fit_next_to_dasks_own(watched_fit, stores):
    """``/metrics`` read while the fit ran: its iteration gauge (>= 2), ``state="running"`` 1 and the other
    states 0, its figures, the count of running fits, and Dask's own ``dask_scheduler_workers`` (2 workers)."""
    families = watched_fit.metrics_running
    run_id = watched_fit.final["run_id"]
    labels = {"run_id": run_id, "store": stores.train}
    (iteration,) = sample_values(families, "dist_respattn_fit_iteration", **labels)
    assert watched_fit.first_running["iteration"] <= iteration < MAX_ITER
    assert iteration >= 2
    states = {s.labels["state"]: s.value for s in families["dist_respattn_fit_state"].samples
              if s.labels["run_id"] == run_id}  # fmt: skip
    assert states == {state: float(state == "running") for state in STATES}
    (running,) = sample_values(families, "dist_respattn_fits", state="running")
    assert running >= 1
    (loglik,) = sample_values(families, "dist_respattn_fit_log_likelihood", **labels)
    assert loglik < 0
    (perplexity,) = sample_values(families, "dist_respattn_fit_heldout_perplexity", **labels)
    assert perplexity > 1
    (rate,) = sample_values(families, "dist_respattn_fit_rows_per_second", **labels)
    (seconds,) = sample_values(families, "dist_respattn_fit_seconds_per_iteration", **labels)
    assert seconds > 0 and rate == pytest.approx(ROWS / seconds)
    workers = families["dask_scheduler_workers"]
    assert workers.type == "gauge"
    assert sum(s.value for s in workers.samples) == 2


def test_the_dashboard_and_the_fit_page_answer_while_the_fit_runs(watched_fit, monitored_cluster):
    """Dask's own dashboard (``/status``) still answers with its HTML page, and the fit page is served (the
    fit's report names it next to the dashboard)."""
    status, page = watched_fit.status, watched_fit.page
    assert status.status == 200 and status.content_type.startswith("text/html")
    assert b"<html" in status.body.lower() and b"Dask" in status.body
    assert page.status == 200 and page.content_type.startswith("text/html")
    assert b"api/fits.json" in page.body and b'id="fits"' in page.body
    web = monitored_cluster.web
    assert f"dashboard: {web.url('/status')}, fit page: {web.url(PAGE_PATH)} " in watched_fit.stdout, watched_fit.stdout


def test_the_ended_fit_shows_its_checkpoint_history(watched_fit, stores):
    """After the fit: ``max_iter`` at MAX_ITER iterations, and every point of its curves is the value the model
    directory's checkpoint history saved (bit for bit: the JSON carries the same float64s)."""
    assert watched_fit.returncode == 0, watched_fit.stderr
    final = watched_fit.final
    checkpoint = load_checkpoint(watched_fit.model_dir, "latest")
    history = checkpoint.meta["history"]
    assert (final["state"], final["iteration"], final["error"]) == ("max_iter", MAX_ITER, None)
    assert (checkpoint.iteration, checkpoint.meta["state"]) == (MAX_ITER, "max_iter")
    check_consistent(final, stores, MAX_ITER)
    assert final["run_id"] == history[-1]["run_id"]
    assert final["log_likelihood_curve"] == [[h["iteration"], h["mean_log_likelihood"]] for h in history]
    assert final["heldout_curve"] == [
        [h["iteration"], h["heldout"]["mean_log_likelihood"], h["heldout"]["perplexity"], h["heldout"].get("accuracy")]
        for h in history
    ]
    assert final["seconds_curve"] == [[h["iteration"], h["seconds"]] for h in history]
    assert final["rows_per_second"] == history[-1]["rows_per_second"]
    assert final["model_dir"] == str(watched_fit.model_dir)


def test_metrics_after_the_fit(watched_fit, stores):
    """The gauges end on the fit's last figures and its final state."""
    families = watched_fit.metrics_final
    history = load_checkpoint(watched_fit.model_dir, "latest").meta["history"]
    labels = {"run_id": history[-1]["run_id"], "store": stores.train}
    assert sample_values(families, "dist_respattn_fit_iteration", **labels) == [float(MAX_ITER)]
    assert sample_values(families, "dist_respattn_fit_log_likelihood", **labels) == [history[-1]["mean_log_likelihood"]]
    assert sample_values(families, "dist_respattn_fit_heldout_perplexity", **labels) == [
        history[-1]["heldout"]["perplexity"]
    ]
    assert sample_values(families, "dist_respattn_fit_state", **labels, state="max_iter") == [1.0]
    assert sample_values(families, "dist_respattn_fit_state", **labels, state="running") == [0.0]


def test_a_fit_whose_driver_is_killed_shows_failed(monitored_cluster, stores, tmp_path):
    """SIGKILL the driver mid-fit: it sends no end event, but once the scheduler notices its client left the
    fit shows ``failed`` (with why) on the page and in ``/metrics``, at the iteration it reached, and stays so."""
    web = monitored_cluster.web
    process = start_fit(monitored_cluster, stores, tmp_path / "model", 1000)
    try:
        wait_running(monitored_cluster, process, 1)
        process.kill()
        killed = time.monotonic()

        def failed() -> dict[str, Any] | None:
            record = web.fit_of(process.model_dir)
            return record if record is not None and record["state"] != "running" else None

        record = wait_until(failed, 60, "the killed fit to leave 'running'")
        noticed = time.monotonic() - killed
    finally:
        process.kill()
    assert record["state"] == "failed", record
    assert "driver left" in record["error"]
    assert 1 <= record["iteration"] < 1000
    assert noticed < 30, f"the scheduler took {noticed:.1f} s to notice the driver left"
    time.sleep(1.0)
    again = web.fit_of(process.model_dir)
    assert again is not None
    assert (again["state"], again["iteration"]) == ("failed", record["iteration"])
    families = web.metrics()
    assert sample_values(families, "dist_respattn_fit_state", run_id=record["run_id"], state="failed") == [1.0]
    assert sample_values(families, "dist_respattn_fit_state", run_id=record["run_id"], state="running") == [0.0]
    assert monitored_cluster.exited() == {}, monitored_cluster.log_tail()


def test_an_embedded_cluster_serves_the_page_once_a_fit_installed_the_monitor(stores, tmp_path):
    """A LocalCluster without any preload has no fit page; ``fit(..., client=client)`` installs the monitor and
    the page, its JSON and the gauges are then served on that cluster's dashboard port."""
    with local_cluster(1) as (_, client):
        web = WebServer(client.dashboard_link.rsplit("/", 1)[0])
        assert http_get(web.url(API_PATH)).status == 404
        result = fit(
            stores.train, model_dir=tmp_path / "model", validation=stores.validation, client=client,
            settings=FitSettings(max_iter=3, tol=0.0, patience=10), say=lambda _: None, progress=False,
        )  # fmt: skip
        assert result.state == "max_iter"
        (record,) = web.fits()
        page = web.get(PAGE_PATH)
        families = web.metrics()
        status = web.get("/status")
    history = load_checkpoint(tmp_path / "model", "latest").meta["history"]
    assert (record["state"], record["iteration"], record["run_id"]) == ("max_iter", 3, history[-1]["run_id"])
    check_consistent(record, stores, 3)
    assert record["log_likelihood_curve"] == [[h["iteration"], h["mean_log_likelihood"]] for h in history]
    assert page.status == 200 and page.content_type.startswith("text/html") and b'id="fits"' in page.body
    assert status.status == 200
    assert sample_values(families, "dist_respattn_fit_iteration", run_id=record["run_id"]) == [3.0]
    assert sample_values(families, "dist_respattn_fit_state", run_id=record["run_id"], state="max_iter") == [1.0]
    assert "dask_scheduler_workers" in families


def test_a_malformed_event_in_the_schedulers_log_does_not_keep_the_monitor_off():
    with local_cluster(n_workers=0) as (cluster, client):
        client.log_event(EVENT_TOPIC, {"event": "iteration", "run_id": "abcd1234", "iteration": "x"})
        client.log_event(EVENT_TOPIC, {"event": "iteration", "run_id": "abcd5678", "iteration": 1})
        client.register_plugin(FitMonitor(), name=FitMonitor.name)
        plugin = cluster.scheduler.plugins[FitMonitor.name]
        assert [f["run_id"] for f in plugin.board.fits()] == ["abcd5678"]
