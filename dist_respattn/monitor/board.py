"""The scheduler's picture of the fits it has seen, built from their ``dist_respattn.fit`` events.

A fit sends three kinds of event (see :mod:`dist_respattn.events`): ``start`` once,
``iteration`` after every M-step, and ``end`` with its final state. :class:`FitBoard` folds them into
one :class:`FitRecord` per fit. Scheduler state stays bounded: the board keeps the last
:data:`MAX_FITS` fits and each curve its last :data:`MAX_POINTS` iterations, however long the
scheduler lives.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from dist_respattn.events import EventKind, FitState

__all__ = ["FINAL_STATES", "MAX_FITS", "MAX_POINTS", "STATES", "FitBoard", "FitRecord"]

#: Fits kept on the board; the oldest finished one goes first when a new fit starts.
MAX_FITS = 50

#: Iterations kept per curve (a fit of more iterations shows its last ones).
MAX_POINTS = 5000

#: Every state a fit can be in; all but ``running`` are final.
STATES = tuple(FitState)
FINAL_STATES = frozenset(state for state in FitState if state.final)


def _number(value: Any) -> float | None:
    """A finite float, or ``None`` (JSON has no inf or NaN); text or other objects raise ``TypeError``."""
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class FitRecord:
    """One fit as the scheduler saw it.

    Attributes:
        run_id: the fit call's 8 hex digits (its task keys and spans carry them too).
        state: one of :data:`STATES`.
        store / validation: the training and validation store URLs (``validation`` may be ``None``).
        heldout_rows: what the fit's held-out rows are (the validation store, or a hold-out of the training
            store); ``no_heldout_rows``: the driver said the fit has none (so no held-out curve will come).
        rows: training rows; ``max_iter``: the iteration limit.
        client: the id of the driver's client (a fit whose client leaves while running has failed).
        started / updated: wall-clock seconds since the epoch.
        iteration: the last iteration finished (0 before the first).
        log_likelihood: ``[(iteration, mean log-likelihood per row), ...]``.
        heldout: ``[(iteration, held-out mean log-likelihood, perplexity, accuracy), ...]``.
        seconds: ``[(iteration, seconds), ...]``; ``rows_per_second`` of the last iteration.
        error: why a failed fit failed.
    """

    run_id: str
    state: FitState = FitState.RUNNING
    store: str | None = None
    validation: str | None = None
    heldout_rows: str | None = None
    no_heldout_rows: bool = False
    rows: int | None = None
    max_iter: int | None = None
    client: str | None = None
    model_dir: str | None = None
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    iteration: int = 0
    log_likelihood: deque[tuple[int, float | None]] = field(default_factory=lambda: deque(maxlen=MAX_POINTS))
    heldout: deque[tuple[int, float | None, float | None, float | None]] = field(
        default_factory=lambda: deque(maxlen=MAX_POINTS)
    )
    seconds: deque[tuple[int, float | None]] = field(default_factory=lambda: deque(maxlen=MAX_POINTS))
    rows_per_second: float | None = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def seconds_per_iteration(self) -> float | None:
        """The last iteration's wall time."""
        return self.seconds[-1][1] if self.seconds else None

    def to_json(self, curves: bool = True) -> dict[str, Any]:
        """The record as JSON; ``curves=False`` leaves out the per-iteration curves (for ``/metrics``)."""
        last_heldout = self.heldout[-1] if self.heldout else None
        summary: dict[str, Any] = {
            "run_id": self.run_id,
            "state": self.state,
            "store": self.store,
            "validation": self.validation,
            "heldout_rows": self.heldout_rows,
            "no_heldout_rows": self.no_heldout_rows,
            "rows": self.rows,
            "max_iter": self.max_iter,
            "model_dir": self.model_dir,
            "started": self.started,
            "updated": self.updated,
            "iteration": self.iteration,
            "mean_log_likelihood": self.log_likelihood[-1][1] if self.log_likelihood else None,
            "heldout_perplexity": last_heldout[2] if last_heldout else None,
            "heldout_log_likelihood": last_heldout[1] if last_heldout else None,
            "rows_per_second": self.rows_per_second,
            "seconds_per_iteration": self.seconds_per_iteration,
            "warnings": list(self.warnings),
            "error": self.error,
        }
        if curves:
            summary["log_likelihood_curve"] = [list(p) for p in self.log_likelihood]
            summary["heldout_curve"] = [list(p) for p in self.heldout]
            summary["seconds_curve"] = [list(p) for p in self.seconds]
        return summary


def _parse(event: Any) -> dict[str, Any] | None:
    """The fields an event sets on its fit, checked and converted; ``None`` for an event that is not a fit's.

    Raises ``TypeError``/``ValueError``/``KeyError`` for a fit event with values of the wrong type.
    """
    if not isinstance(event, dict) or not isinstance(event.get("run_id"), str):
        return None
    kind = event.get("event", EventKind.ITERATION)
    if kind == EventKind.START:
        rows, max_iter = event.get("rows"), event.get("max_iter")
        return {
            "event": kind,
            "store": _text(event.get("store")),
            "validation": _text(event.get("validation")),
            "heldout_rows": _text(event.get("heldout_rows")),
            # A driver that does not send the field leaves it unknown: only an explicit null means none.
            "no_heldout_rows": "heldout_rows" in event and event["heldout_rows"] is None,
            "rows": None if rows is None else int(rows),
            "max_iter": None if max_iter is None else int(max_iter),
            "client": _text(event.get("client")),
            "model_dir": _text(event.get("model_dir")),
            "state": FitState.RUNNING,
        }
    if kind == EventKind.ITERATION:
        iteration = event["iteration"]
        if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
            raise ValueError(f"iteration {iteration!r}")
        heldout = event.get("heldout")
        if heldout is not None and not isinstance(heldout, dict):
            raise TypeError("heldout")
        warnings = event.get("warnings", [])
        if not isinstance(warnings, (list, tuple)):  # msgpack hands lists over as tuples
            raise TypeError("warnings")
        return {
            "event": kind,
            "iteration": iteration,
            "log_likelihood_point": (iteration, _number(event.get("mean_log_likelihood"))),
            "seconds_point": (iteration, _number(event.get("seconds"))),
            "heldout_point": None
            if heldout is None
            else (
                iteration,
                _number(heldout.get("mean_log_likelihood")),
                _number(heldout.get("perplexity")),
                _number(heldout.get("accuracy")),
            ),
            "rows_per_second": _number(event.get("rows_per_second")),
            "warnings": [str(w) for w in warnings],
        }
    if kind == EventKind.END:
        state = event.get("state")
        return {
            "event": kind,
            "state": FitState(state) if state in FINAL_STATES else FitState.FAILED,
            "error": _text(event.get("error")),
        }
    return None


def _text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


class FitBoard:
    """The fits a scheduler has seen, newest last; fed by events, read by the page and ``/metrics``.

    Thread-safe: events arrive on the scheduler's event loop, Prometheus may collect from another thread.
    """

    def __init__(self, max_fits: int = MAX_FITS) -> None:
        self.max_fits = max_fits
        self._fits: OrderedDict[str, FitRecord] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, event: dict[str, Any], when: float | None = None) -> None:
        """Fold one fit event into the board.

        An event that is not a well-formed fit event (another sender's, an unknown kind, a value of the
        wrong type) is ignored whole: the board must survive anything in the scheduler's event log,
        which the plugin replays when it starts.
        """
        try:
            update = _parse(event)
        except (TypeError, ValueError, KeyError, AttributeError):
            return
        if update is None:
            return
        when = time.time() if when is None else when
        with self._lock:
            fit = self._fit(event["run_id"], when)
            fit.updated = when
            kind = update.pop("event")
            if kind == EventKind.START:
                fit.started = when
            elif kind == EventKind.ITERATION:
                fit.iteration = update["iteration"]
                fit.log_likelihood.append(update.pop("log_likelihood_point"))
                fit.seconds.append(update.pop("seconds_point"))
                heldout = update.pop("heldout_point")
                if heldout is not None:
                    fit.heldout.append(heldout)
            for name, value in update.items():
                setattr(fit, name, value)

    def client_left(self, client: str, when: float | None = None) -> None:
        """A driver's client left: its fits still running have failed (the driver died or was stopped)."""
        with self._lock:
            for fit in self._fits.values():
                if fit.client == client and fit.state is FitState.RUNNING:
                    fit.state = FitState.FAILED
                    fit.error = "the driver left before the fit ended (a resumed fit shows as a new run)"
                    fit.updated = time.time() if when is None else when

    def fits(self, curves: bool = True) -> list[dict[str, Any]]:
        """Every fit on the board as JSON, oldest first (``curves=False``: the latest figures only)."""
        with self._lock:
            return [fit.to_json(curves) for fit in self._fits.values()]

    def _fit(self, run_id: str, when: float) -> FitRecord:
        fit = self._fits.get(run_id)
        if fit is None:
            fit = self._fits[run_id] = FitRecord(run_id, started=when, updated=when)
            self._evict()
        return fit

    def _evict(self) -> None:
        """Drop the oldest fits beyond ``max_fits``, finished ones first."""
        while len(self._fits) > self.max_fits:
            victim = next((k for k, f in self._fits.items() if f.state.final), next(iter(self._fits)))
            del self._fits[victim]
