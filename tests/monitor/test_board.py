"""``FitBoard``: how a fit's ``dist_respattn.fit`` events fold into its record, how the board stays bounded,
and the Prometheus gauges the collector makes of it (parsed back with prometheus_client's own parser)."""

from __future__ import annotations

import json
import math
import weakref

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from dist_respattn.events import FitState, IterationRecord, end_event, iteration_event, start_event
from dist_respattn.monitor import FINAL_STATES, STATES, FitBoard, metrics
from dist_respattn.monitor.board import MAX_FITS, MAX_POINTS

from .conftest import parse_metrics, sample_values

STORE, VALIDATION = "/data/train.zarr", "/data/validation.zarr"

# The events are made by the functions the engine sends them with (``dist_respattn.events``); ``fields``
# override what a test needs, including with values of the wrong type.


def start(run_id: str, client: str = "Client-a", **fields) -> dict:
    """A start event; without ``heldout_rows`` in ``fields`` it has no such field, as a driver from before the
    field sends it (the board must tell "not said" from "none")."""
    described = {
        "store": STORE, "validation": VALIDATION, "heldout_rows": None, "rows": 1000, "max_iter": 10,
        "model_dir": f"/models/{run_id}", "first_iteration": 1,
    }  # fmt: skip
    event = dict(start_event(run_id, client=client, **{**described, **fields}))
    if "heldout_rows" not in fields:
        del event["heldout_rows"]
    return event


def iteration(run_id: str, i: int, **fields) -> dict:
    """An iteration event as the engine sends it: an :class:`IterationRecord` through ``iteration_event``."""
    record = IterationRecord(
        iteration=i, mean_log_likelihood=-10.0 + 1.0 / i, change=None if i == 1 else 0.01, seconds=0.5,
        rows_per_second=2000.0, n_obs=1000.0, sigma2=1.0, hyperparameters=None,
        heldout={"mean_log_likelihood": -11.0 + 1.0 / i, "perplexity": 8.0 - 1.0 / i, "accuracy": 0.3},
        state=FitState.RUNNING, warnings=[], run_id=run_id,
    )  # fmt: skip
    return {**iteration_event(record), **fields}


def end(run_id: str, state: str, error: str | None = None) -> dict:
    return dict(end_event(run_id, state, error))


def only(board: FitBoard) -> dict:
    fits = board.fits()
    assert len(fits) == 1, fits
    return fits[0]


# ------------------------------------------------------------------------- folding events


def test_start_opens_a_running_record_with_the_fits_description():
    board = FitBoard()
    board.record(start("aaaa0001"), when=100.0)
    fit = only(board)
    assert fit == {
        "run_id": "aaaa0001", "state": "running", "store": STORE, "validation": VALIDATION, "heldout_rows": None,
        "no_heldout_rows": False, "rows": 1000,
        "max_iter": 10, "model_dir": "/models/aaaa0001", "started": 100.0, "updated": 100.0, "iteration": 0,
        "mean_log_likelihood": None, "heldout_perplexity": None, "heldout_log_likelihood": None,
        "rows_per_second": None, "seconds_per_iteration": None, "warnings": [], "error": None,
        "log_likelihood_curve": [], "heldout_curve": [], "seconds_curve": [],
    }  # fmt: skip
    json.dumps(fit, allow_nan=False)


def test_iterations_extend_the_curves_and_update_the_latest_figures():
    board = FitBoard()
    board.record(start("aaaa0001"), when=100.0)
    for i in (1, 2, 3):
        board.record(iteration("aaaa0001", i, seconds=0.25 * i, rows_per_second=1000 / (0.25 * i)), when=100.0 + i)
    fit = only(board)
    assert (fit["state"], fit["iteration"], fit["updated"], fit["started"]) == ("running", 3, 103.0, 100.0)
    assert fit["log_likelihood_curve"] == [[i, -10.0 + 1.0 / i] for i in (1, 2, 3)]
    assert fit["heldout_curve"] == [[i, -11.0 + 1.0 / i, 8.0 - 1.0 / i, 0.3] for i in (1, 2, 3)]
    assert fit["seconds_curve"] == [[1, 0.25], [2, 0.5], [3, 0.75]]
    assert fit["mean_log_likelihood"] == -10.0 + 1.0 / 3
    assert fit["heldout_log_likelihood"] == -11.0 + 1.0 / 3
    assert fit["heldout_perplexity"] == 8.0 - 1.0 / 3
    assert fit["seconds_per_iteration"] == 0.75
    assert fit["rows_per_second"] == pytest.approx(1000 / 0.75)
    # The iteration record's own "state" ("running") is the engine's, not the board's: it does not end the fit.
    board.record(iteration("aaaa0001", 4, state="max_iter"))
    assert only(board)["state"] == "running"


def test_warnings_are_the_last_iterations():
    board = FitBoard()
    board.record(start("aaaa0001"))
    board.record(iteration("aaaa0001", 1, warnings=["key 3 attends to nothing", 7]))
    assert only(board)["warnings"] == ["key 3 attends to nothing", "7"]
    board.record(iteration("aaaa0001", 2, warnings=[]))
    assert only(board)["warnings"] == []


def test_a_fit_without_validation_has_no_heldout_curve():
    board = FitBoard()
    board.record(start("aaaa0001", validation=None, heldout_rows=None))
    board.record(iteration("aaaa0001", 1, heldout=None))
    fit = only(board)
    assert fit["validation"] is None
    assert fit["no_heldout_rows"] and fit["heldout_rows"] is None  # the page says "no validation store"
    assert fit["heldout_curve"] == []
    assert fit["heldout_perplexity"] is None and fit["heldout_log_likelihood"] is None
    assert fit["log_likelihood_curve"] == [[1, -9.0]]


def test_the_held_out_rows_of_a_fit_are_its_drivers_word():
    """Held-out rows the driver names are shown; a driver that does not say leaves them unknown, not none."""
    board = FitBoard()
    board.record(start("aaaa0001", validation=None, heldout_rows="5% of the training store"))
    board.record(start("aaaa0002", validation=None))
    first, second = board.fits()
    assert (first["heldout_rows"], first["no_heldout_rows"]) == ("5% of the training store", False)
    assert (second["heldout_rows"], second["no_heldout_rows"]) == (None, False)


@pytest.mark.parametrize("state", sorted(FINAL_STATES))
def test_end_sets_the_final_state_and_error(state):
    board = FitBoard()
    board.record(start("aaaa0001"))
    board.record(iteration("aaaa0001", 1))
    error = "ValueError: boom" if state == "failed" else None
    board.record(end("aaaa0001", state, error), when=200.0)
    fit = only(board)
    assert (fit["state"], fit["error"], fit["updated"], fit["iteration"]) == (state, error, 200.0, 1)


@pytest.mark.parametrize("state", ["running", "exploded", None])
def test_an_end_without_a_final_state_is_a_failure(state):
    board = FitBoard()
    board.record(start("aaaa0001"))
    board.record(end("aaaa0001", state))
    assert only(board)["state"] == "failed"


def test_events_of_a_fit_the_board_missed_the_start_of_still_make_a_record():
    """A monitor installed mid-fit (after the scheduler's event log dropped the start) shows the fit anyway."""
    board = FitBoard()
    board.record(iteration("aaaa0001", 7))
    fit = only(board)
    assert (fit["state"], fit["iteration"], fit["store"], fit["rows"]) == ("running", 7, None, None)
    assert fit["log_likelihood_curve"] == [[7, -10.0 + 1.0 / 7]]


def test_a_new_start_of_the_same_run_restarts_it():
    board = FitBoard()
    board.record(start("aaaa0001"), when=1.0)
    board.record(end("aaaa0001", "failed", "killed"), when=2.0)
    board.record(start("aaaa0001"), when=3.0)
    fit = only(board)
    assert (fit["state"], fit["started"]) == ("running", 3.0)


def test_fits_are_listed_oldest_first_and_without_curves_on_request():
    board = FitBoard()
    for run_id in ("aaaa0001", "aaaa0002", "aaaa0003"):
        board.record(start(run_id))
        board.record(iteration(run_id, 1))
    assert [f["run_id"] for f in board.fits()] == ["aaaa0001", "aaaa0002", "aaaa0003"]
    summaries = board.fits(curves=False)
    assert all("log_likelihood_curve" not in f and "heldout_curve" not in f for f in summaries)
    assert [f["iteration"] for f in summaries] == [1, 1, 1]


# ------------------------------------------------------------------------- the driver's client leaving


def test_client_left_fails_only_the_running_fits_of_that_client():
    board = FitBoard()
    board.record(start("aaaa0001", client="Client-a"))  # running, client a: fails
    board.record(iteration("aaaa0001", 2))
    board.record(start("aaaa0002", client="Client-a"))  # finished, client a: stays
    board.record(end("aaaa0002", "converged"))
    board.record(start("aaaa0003", client="Client-b"))  # running, client b: stays
    board.record(start("aaaa0004", client="Client-a"))  # failed on its own, client a: keeps its error
    board.record(end("aaaa0004", "failed", "StoreError: gone"))
    board.client_left("Client-a", when=500.0)
    fits = {f["run_id"]: f for f in board.fits()}
    assert fits["aaaa0001"]["state"] == "failed"
    assert "driver left" in fits["aaaa0001"]["error"]
    assert fits["aaaa0001"]["updated"] == 500.0
    assert fits["aaaa0001"]["iteration"] == 2  # what it reached stays on the board
    assert (fits["aaaa0002"]["state"], fits["aaaa0002"]["error"]) == ("converged", None)
    assert (fits["aaaa0003"]["state"], fits["aaaa0003"]["error"]) == ("running", None)
    assert (fits["aaaa0004"]["state"], fits["aaaa0004"]["error"]) == ("failed", "StoreError: gone")
    board.client_left("Client-unknown")
    assert {f["run_id"]: f["state"] for f in board.fits()}["aaaa0003"] == "running"


# ------------------------------------------------------------------------- bounded


def test_the_board_keeps_max_fits_and_evicts_the_oldest_finished_fit_first():
    board = FitBoard()
    assert board.max_fits == MAX_FITS
    board.record(start("running-oldest"))  # the oldest fit is still running: it must stay
    for i in range(MAX_FITS - 1):
        board.record(start(f"done-{i:03d}"))
        board.record(end(f"done-{i:03d}", "max_iter"))
    assert len(board.fits()) == MAX_FITS
    board.record(start("new-1"))
    ids = [f["run_id"] for f in board.fits()]
    assert len(ids) == MAX_FITS
    assert "running-oldest" in ids and "done-000" not in ids and ids[-1] == "new-1"
    board.record(start("new-2"))
    ids = [f["run_id"] for f in board.fits()]
    assert len(ids) == MAX_FITS and "done-001" not in ids and ids[0] == "running-oldest"


def test_with_only_running_fits_the_oldest_goes():
    board = FitBoard(max_fits=3)
    for i in range(5):
        board.record(start(f"run-{i}"))
    assert [f["run_id"] for f in board.fits()] == ["run-2", "run-3", "run-4"]


def test_a_finished_fit_goes_before_older_running_ones():
    board = FitBoard(max_fits=3)
    for i in range(3):
        board.record(start(f"run-{i}"))
    board.record(end("run-2", "converged"))  # the newest is the only finished fit
    board.record(start("run-3"))
    assert [f["run_id"] for f in board.fits()] == ["run-0", "run-1", "run-3"]


def test_curves_keep_the_last_max_points_iterations():
    board = FitBoard()
    board.record(start("aaaa0001", max_iter=MAX_POINTS + 25))
    total = MAX_POINTS + 25
    for i in range(1, total + 1):
        board.record(iteration("aaaa0001", i))
    fit = only(board)
    assert fit["iteration"] == total
    for curve in ("log_likelihood_curve", "heldout_curve", "seconds_curve"):
        assert len(fit[curve]) == MAX_POINTS, curve
        assert [p[0] for p in fit[curve]] == list(range(26, total + 1)), curve
    assert fit["mean_log_likelihood"] == -10.0 + 1.0 / total


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "event",
    [None, "start", 42, ["start"], {}, {"event": "start"}, {"event": "start", "run_id": 7},
     {"event": "iteration", "run_id": None, "iteration": 1}, {"event": "start", "run_id": b"aaaa0001"}],
    ids=repr,
)  # fmt: skip
def test_events_that_are_not_a_fits_are_ignored(event):
    board = FitBoard()
    board.record(start("aaaa0001"))
    before = board.fits()
    board.record(event)
    assert board.fits() == before


@pytest.mark.parametrize(
    "event",
    [
        {"event": "progress", "run_id": "bbbb0002"},  # an unknown kind
        {"event": "iteration", "run_id": "bbbb0002", "iteration": "three"},
        {"event": "iteration", "run_id": "bbbb0002", "iteration": 1, "mean_log_likelihood": "high"},
        {"event": "iteration", "run_id": "bbbb0002", "iteration": 1, "warnings": None},
    ],
    ids=["unknown-kind", "iteration-not-a-number", "loglik-not-a-number", "warnings-none"],
)
def test_malformed_events_of_a_run_are_ignored(event):
    """A malformed event neither raises (the plugin's replay of the scheduler's event log would fail on it)
    nor adds a fit to the board (a phantom 'running' fit would stay on the page and in ``/metrics``)."""
    board = FitBoard()
    board.record(start("aaaa0001"))
    before = board.fits()
    board.record(event)
    assert board.fits() == before


def test_a_malformed_iteration_leaves_a_known_fit_as_it_was():
    board = FitBoard()
    board.record(start("aaaa0001"))
    board.record(iteration("aaaa0001", 1))
    before = board.fits()
    board.record(iteration("aaaa0001", 2, mean_log_likelihood="high"))
    assert board.fits() == before


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_become_none(bad):
    board = FitBoard()
    board.record(start("aaaa0001"))
    board.record(
        iteration(
            "aaaa0001", 1, mean_log_likelihood=bad, seconds=bad, rows_per_second=bad,
            heldout={"mean_log_likelihood": bad, "perplexity": bad, "accuracy": bad},
        )
    )  # fmt: skip
    fit = only(board)
    assert fit["log_likelihood_curve"] == [[1, None]]
    assert fit["heldout_curve"] == [[1, None, None, None]]
    assert fit["seconds_curve"] == [[1, None]]
    for name in ("mean_log_likelihood", "heldout_log_likelihood", "heldout_perplexity", "rows_per_second"):
        assert fit[name] is None, name
    assert fit["seconds_per_iteration"] is None
    json.dumps(board.fits(), allow_nan=False)  # what the JSON handler does: must not raise


def test_a_zero_second_iteration_has_no_rate():
    """The engine reports ``rows_per_second = inf`` for an iteration of 0 s; JSON gets ``null``."""
    board = FitBoard()
    board.record(iteration("aaaa0001", 1, seconds=0.0, rows_per_second=math.inf))
    fit = only(board)
    assert (fit["seconds_per_iteration"], fit["rows_per_second"]) == (0.0, None)


# ------------------------------------------------------------------------- the Prometheus collector


@pytest.fixture
def collected(monkeypatch):
    """Collect one board's gauges through a registry of its own (the collector reads every tracked board)."""
    monkeypatch.setattr(metrics, "_boards", weakref.WeakSet())
    registry = CollectorRegistry()
    registry.register(metrics.FitCollector())

    def collect(board: FitBoard) -> dict:
        metrics._boards.add(board)
        return parse_metrics(generate_latest(registry).decode())

    return collect


def test_collector_gauges_of_a_running_and_a_finished_fit(collected):
    board = FitBoard()
    board.record(start("aaaa0001"))
    for i in (1, 2, 3):
        board.record(iteration("aaaa0001", i, seconds=0.5, rows_per_second=2000.0))
    board.record(start("aaaa0002", store="/data/other.zarr", validation=None))
    board.record(iteration("aaaa0002", 1, heldout=None, seconds=2.0, rows_per_second=500.0))
    board.record(end("aaaa0002", "converged"))
    families = collected(board)

    one = {"run_id": "aaaa0001", "store": STORE}
    two = {"run_id": "aaaa0002", "store": "/data/other.zarr"}
    for name in ("iteration", "log_likelihood", "heldout_log_likelihood", "heldout_perplexity", "rows_per_second",
                 "seconds_per_iteration", "state"):  # fmt: skip
        assert families[f"dist_respattn_fit_{name}"].type == "gauge", name
    assert families["dist_respattn_fits"].type == "gauge"
    assert sample_values(families, "dist_respattn_fit_iteration", **one) == [3.0]
    assert sample_values(families, "dist_respattn_fit_iteration", **two) == [1.0]
    assert sample_values(families, "dist_respattn_fit_log_likelihood", **one) == [-10.0 + 1.0 / 3]
    assert sample_values(families, "dist_respattn_fit_heldout_log_likelihood", **one) == [-11.0 + 1.0 / 3]
    assert sample_values(families, "dist_respattn_fit_heldout_perplexity", **one) == [8.0 - 1.0 / 3]
    assert sample_values(families, "dist_respattn_fit_rows_per_second", **one) == [2000.0]
    assert sample_values(families, "dist_respattn_fit_seconds_per_iteration", **one) == [0.5]
    assert sample_values(families, "dist_respattn_fit_seconds_per_iteration", **two) == [2.0]
    # No validation: no held-out sample at all (not a 0 or a NaN).
    assert sample_values(families, "dist_respattn_fit_heldout_perplexity", **two) == []
    assert sample_values(families, "dist_respattn_fit_heldout_log_likelihood", **two) == []

    states_one = {s.labels["state"]: s.value for s in families["dist_respattn_fit_state"].samples
                  if s.labels["run_id"] == "aaaa0001"}  # fmt: skip
    states_two = {s.labels["state"]: s.value for s in families["dist_respattn_fit_state"].samples
                  if s.labels["run_id"] == "aaaa0002"}  # fmt: skip
    assert states_one == {state: float(state == "running") for state in STATES}
    assert states_two == {state: float(state == "converged") for state in STATES}
    totals = {s.labels["state"]: s.value for s in families["dist_respattn_fits"].samples}
    assert totals == {state: float(state in ("running", "converged")) for state in STATES}


def test_collector_leaves_out_unknown_figures(collected):
    """A fit before its first iteration (or with NaN figures) has a state but no figure samples."""
    board = FitBoard()
    board.record(start("aaaa0001"))
    board.record(start("aaaa0002"))
    board.record(iteration("aaaa0002", 1, mean_log_likelihood=math.nan, heldout=None))
    families = collected(board)
    assert sample_values(families, "dist_respattn_fit_iteration", run_id="aaaa0001") == [0.0]
    assert sample_values(families, "dist_respattn_fit_log_likelihood", run_id="aaaa0001") == []
    assert sample_values(families, "dist_respattn_fit_log_likelihood", run_id="aaaa0002") == []
    assert sample_values(families, "dist_respattn_fit_state", run_id="aaaa0001", state="running") == [1.0]
    assert sample_values(families, "dist_respattn_fits", state="running") == [2.0]


def test_collector_of_an_empty_board(collected):
    families = collected(FitBoard())
    assert families["dist_respattn_fit_iteration"].samples == []
    assert families["dist_respattn_fit_state"].samples == []
    assert {s.labels["state"]: s.value for s in families["dist_respattn_fits"].samples} == dict.fromkeys(STATES, 0.0)


def test_track_serves_a_board_on_the_global_registry_until_untracked():
    """``track`` is what the plugin calls: the board's fits appear in the process's default registry (the
    one Dask's ``/metrics`` renders) and leave it with ``untrack``."""
    board = FitBoard()
    board.record(start("cccc0003"))
    board.record(iteration("cccc0003", 1))
    metrics.track(board)
    try:
        families = parse_metrics(generate_latest(REGISTRY).decode())
        assert sample_values(families, "dist_respattn_fit_iteration", run_id="cccc0003") == [1.0]
        metrics.track(board)  # idempotent: no second collector, no duplicate samples
        families = parse_metrics(generate_latest(REGISTRY).decode())
        assert sample_values(families, "dist_respattn_fit_iteration", run_id="cccc0003") == [1.0]
    finally:
        metrics.untrack(board)
    families = parse_metrics(generate_latest(REGISTRY).decode())
    assert sample_values(families, "dist_respattn_fit_iteration", run_id="cccc0003") == []
