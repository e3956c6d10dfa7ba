"""What a fit reports as it runs: its states, its held-out metrics, the per-iteration record and its events.

The engine writes these (into checkpoints, log lines and ``Client.log_event``) and the scheduler's monitor
reads them; both import them from here. This module uses the standard library only, so the scheduler
plugin that reads the events loads neither numba nor zarr nor the engine.

A fit's events go to the scheduler under :data:`EVENT_TOPIC`, each a dict with its ``run_id`` and an
``event`` field (:class:`EventKind`), of builtin types only (``Client.log_event`` takes nothing msgpack
would pack as another type, not even a ``str`` subclass such as an enum member):

- ``start`` (:class:`StartEvent`): ``store``, ``validation``, ``heldout_rows`` (what the held-out rows are;
  ``None``: the fit has none), ``rows``, ``max_iter``, ``model_dir``, ``client`` (the driver's client id),
  ``first_iteration``;
- ``iteration`` (:class:`IterationEvent`): the iteration's :class:`IterationRecord`;
- ``end`` (:class:`EndEvent`): the final ``state`` (a :class:`FitState` other than ``running``) and, for a
  failure, ``error``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, NotRequired, TypedDict

__all__ = [
    "EVENT_TOPIC",
    "EndEvent",
    "EventKind",
    "FitState",
    "HeldoutScores",
    "IterationEvent",
    "IterationRecord",
    "Metric",
    "StartEvent",
    "end_event",
    "history_from_json",
    "iteration_event",
    "start_event",
]

#: The topic of a fit's events on the scheduler.
EVENT_TOPIC = "dist_respattn.fit"


class FitState(StrEnum):
    """Where a fit is: running, or how it ended. Values are the strings checkpoints and events carry."""

    RUNNING = "running"
    CONVERGED = "converged"
    MAX_ITER = "max_iter"
    EARLY_STOPPED = "early_stopped"
    FAILED = "failed"

    @property
    def final(self) -> bool:
        """Whether the fit has ended in this state."""
        return self is not FitState.RUNNING


class Metric(StrEnum):
    """A held-out metric that early stopping watches and the registry's gate compares.

    ``perplexity``: of the targets under ``predict_proba`` (lower is better); ``loglik``: the mean joint
    log-likelihood per row (higher is better).
    """

    PERPLEXITY = "perplexity"
    LOGLIK = "loglik"

    @property
    def score_field(self) -> Literal["perplexity", "mean_log_likelihood"]:
        """The field of :class:`HeldoutScores` that holds this metric."""
        return "perplexity" if self is Metric.PERPLEXITY else "mean_log_likelihood"

    @property
    def lower_is_better(self) -> bool:
        return self is Metric.PERPLEXITY

    def of(self, scores: HeldoutScores | dict[str, Any]) -> float:
        """This metric's value in ``scores``."""
        return float(scores[self.score_field])


class EventKind(StrEnum):
    """The ``event`` field of a fit's events."""

    START = "start"
    ITERATION = "iteration"
    END = "end"


class HeldoutScores(TypedDict, total=False):
    """A model's figures on held-out rows (per row, weighted): what scoring a store gives.

    ``accuracy`` is there when the scoring pass computes it (evaluation), not in the M-step's choice.
    """

    mean_log_likelihood: float
    target_log_prob: float
    perplexity: float
    accuracy: float


class IterationRecord(TypedDict):
    """One EM iteration of a fit, as its checkpoints' ``history`` and its ``iteration`` event carry it.

    Attributes:
        iteration: 1 for the first M-step (counted across a resume).
        mean_log_likelihood: the training rows' mean joint log-likelihood under the model the E-step used.
        change: its relative change from the previous iteration (``None`` for the first).
        seconds / rows_per_second: the iteration's wall time and training rows per second (``inf`` for 0 s).
        n_obs: the total weight of the training rows.
        sigma2: a single-hop head's gate variance after the M-step (absent for other kinds: what a kind adds to
            its records is its head's ``record()``).
        hyperparameters: the choices the M-step made (its kind's JSON: a single-hop head's ``sigma2``,
            ``emission_strength``, ``type_strength``), or ``None``.
        choice: those choices in words, as the iteration's line says them (absent in records older than it).
        heldout: the held-out scores those choices were made with, or ``None`` without held-out rows.
        state: the fit's state after this iteration (a :class:`FitState`; its plain value in an event or
            a checkpoint read back).
        warnings: degenerate-fit warnings about the model.
        run_id: the fit call's 8 hex digits.
    """

    iteration: int
    mean_log_likelihood: float
    change: float | None
    seconds: float
    rows_per_second: float
    n_obs: float
    sigma2: NotRequired[float]
    hyperparameters: dict[str, Any] | None
    choice: NotRequired[str | None]
    heldout: HeldoutScores | None
    state: str
    warnings: list[str]
    run_id: str


class StartEvent(TypedDict):
    """A fit announcing itself (its first iteration may follow a resume)."""

    event: Literal["start"]
    run_id: str
    client: str
    store: str
    validation: str | None
    heldout_rows: str | None
    rows: int
    max_iter: int
    model_dir: str
    first_iteration: int


class IterationEvent(IterationRecord):
    """An iteration's record, sent to the scheduler."""

    event: Literal["iteration"]


class EndEvent(TypedDict):
    """How a fit ended; ``error`` says why a failed one failed."""

    event: Literal["end"]
    run_id: str
    state: str
    error: str | None


def start_event(
    run_id: str,
    *,
    client: str,
    store: str,
    validation: str | None,
    heldout_rows: str | None,
    rows: int,
    max_iter: int,
    model_dir: str,
    first_iteration: int,
) -> StartEvent:
    """The event a fit sends before its first pass."""
    return {
        "event": "start",
        "run_id": run_id,
        "client": client,
        "store": store,
        "validation": validation,
        "heldout_rows": heldout_rows,
        "rows": rows,
        "max_iter": max_iter,
        "model_dir": model_dir,
        "first_iteration": first_iteration,
    }


def iteration_event(record: IterationRecord) -> IterationEvent:
    """The event a fit sends after an iteration: its record, marked, its state a plain string."""
    return {**record, "event": "iteration", "state": str(record["state"])}


def end_event(run_id: str, state: FitState | str, error: str | None = None) -> EndEvent:
    """The event a fit sends when it ends (``state``'s plain string)."""
    return {"event": "end", "run_id": run_id, "state": str(state), "error": error}


def history_from_json(entries: list[dict[str, Any]]) -> list[IterationRecord]:
    """A checkpoint's ``history`` read back from JSON, its states as :class:`FitState` again."""
    history: list[IterationRecord] = []
    for entry in entries:
        record: Any = dict(entry)
        if "state" in record:
            record["state"] = FitState(record["state"])
        history.append(record)
    return history
