"""One fit's iterations on the cluster: E-step passes, validation, early stopping, checkpoints, progress.

:class:`FitLoop` supplies the E-step and the after-M-step callback of the model core's ``run_em``
(which owns the convergence test), holding what a fit carries from one iteration to the next.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import distributed

from dist_respattn.engine import tasks
from dist_respattn.engine.broadcast import ParameterBroadcast
from dist_respattn.engine.checkpoint import BackgroundCheckpoints, ModelDir, checkpoint_name
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.progress import FitReporter
from dist_respattn.engine.settings import FitSettings
from dist_respattn.model.accumulator import SufficientStatistics
from dist_respattn.model.diagnostics import degeneracy_warnings
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.em import EMIteration, EMResult, run_em
from dist_respattn.store import TripleStore

__all__ = ["EarlyStopping", "FitLoop", "store_record"]


class EarlyStopping:
    """Tracks the best held-out metric and the iterations since it improved."""

    def __init__(self, metric: str | None, patience: int, state: dict[str, Any] | None = None) -> None:
        self.metric = metric
        self.patience = patience
        state = state or {}
        self.best: float | None = state.get("best")
        self.best_iteration: int | None = state.get("best_iteration")
        self.best_checkpoint: str | None = state.get("best_checkpoint")
        self.since_best: int = int(state.get("since_best", 0))

    def value(self, heldout: dict[str, float]) -> float:
        return heldout["perplexity"] if self.metric == "perplexity" else heldout["mean_log_likelihood"]

    def update(self, heldout: dict[str, float], iteration: int, checkpoint: str) -> bool:
        """Record an iteration's held-out scores; True when it is the best so far."""
        value = self.value(heldout)
        better = self.best is None or (value < self.best if self.metric == "perplexity" else value > self.best)
        if better and not math.isnan(value):
            self.best, self.best_iteration, self.best_checkpoint, self.since_best = value, iteration, checkpoint, 0
            return True
        self.since_best += 1
        return False

    @property
    def exhausted(self) -> bool:
        return self.since_best >= self.patience

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "patience": self.patience,
            "best": self.best,
            "best_iteration": self.best_iteration,
            "best_checkpoint": self.best_checkpoint,
            "since_best": self.since_best,
        }


def store_record(store: TripleStore) -> dict[str, Any]:
    """What a checkpoint records of a store: URL, fingerprint, rows, partitions, source."""
    return {
        "url": str(store.location),
        "fingerprint": store.fingerprint(),
        "rows": store.num_rows,
        "partitions": store.num_partitions,
        "source": store.provenance.get("source"),
    }


class FitLoop:
    """The iterations of one fit call (a fresh run id, so its keys, spans and checkpoints are its own).

    Args:
        client: the cluster's client.
        train / heldout: the training store and the validation store (or ``None``).
        settings: the fit's settings.
        folder: the model directory.
        stopping: early-stopping state (restored from the checkpoint when resuming).
        history: the per-iteration records so far; new ones are appended.
        record: what every checkpoint records besides the iteration: ``store``, ``validation``, ``init``
            and ``package_version``.
        say / progress: where the lines go, and whether to show bars.
        started: ``time.perf_counter()`` at the call, for the time to the first iteration.
    """

    def __init__(
        self,
        client: distributed.Client,
        *,
        train: TripleStore,
        heldout: TripleStore | None,
        settings: FitSettings,
        folder: ModelDir,
        stopping: EarlyStopping,
        history: list[dict[str, Any]],
        record: dict[str, Any],
        say: Callable[[str], Any],
        progress: bool | None,
        started: float,
    ) -> None:
        self.train, self.heldout, self.settings, self.folder = train, heldout, settings, folder
        self.stopping, self.history, self.record, self.started = stopping, history, record, started
        self.run_id = uuid.uuid4().hex[:8]
        self.estimator = settings.estimator(train.schema)
        self.factory = self.estimator.accumulator_factory()
        self.fingerprint = train.fingerprint()
        self.heldout_fingerprint = heldout.fingerprint() if heldout is not None else ""
        self.reporter = FitReporter(client, say=say, bar=progress)
        self.runner = PassRunner(client, self.run_id, fan_in=settings.fan_in, make_bar=self.reporter.make_bar)
        self.params = ParameterBroadcast(client, self.run_id)
        self.checkpoints = BackgroundCheckpoints(folder)
        self.spans = contextlib.ExitStack()
        self.next_iteration = 1
        self.last_key_mass: Any = None
        self.first_iteration_seconds: float | None = None

    def run(self, start: ResponsibilityAttentionDistribution | None, *, first_iteration: int) -> EMResult:
        """EM from ``start`` (``None``: random responsibilities) at ``first_iteration`` to the end of the fit."""
        self.next_iteration = first_iteration
        previous_ll = self.history[-1]["mean_log_likelihood"] if self.history else None
        self.reporter.started(
            self.run_id,
            store=self.record["store"]["url"],
            validation=self.record["validation"]["url"] if self.record["validation"] else None,
            rows=self.train.num_rows,
            max_iter=self.settings.max_iter,
            model_dir=str(self.folder),
            first_iteration=first_iteration,
        )
        try:
            result = run_em(
                self.e_step,
                self.estimator,
                init=start,
                max_iter=self.settings.max_iter,
                tol=self.settings.tol,
                callback=self.after_iteration,
                first_iteration=first_iteration,
                previous_log_likelihood=previous_ll,
            )
        except BaseException as exc:
            self.checkpoints.close(raise_errors=False)  # the fit's own error is the one to report
            self.reporter.ended(self.run_id, "failed", error=f"{type(exc).__name__}: {exc}")
            raise
        else:
            self.checkpoints.close()
        finally:
            self.spans.close()
            self.params.release()
        if not self.history:  # max_iter = 0: the starting model is the fit, and a new fit must replace an old one
            self.folder.commit(
                checkpoint_name(0, self.run_id),
                result.distribution,
                self.checkpoint_meta(0, "max_iter", degeneracy_warnings(result.distribution)),
                latest={"iteration": 0, "state": "max_iter"},
                best=None,
                keep_best=None,
            )
        self.reporter.ended(self.run_id, self.history[-1]["state"] if self.history else "max_iter")
        return result

    def checkpoint_meta(self, iteration: int, state: str, warnings: list[str]) -> dict[str, Any]:
        """The JSON written with a checkpoint."""
        return {
            "iteration": iteration,
            "state": state,
            "history": list(self.history),  # a copy: the list grows while the checkpoint is written
            "settings": self.settings.to_json(),
            "store": self.record["store"],
            "validation": self.record["validation"],
            "early_stopping": self.stopping.to_json(),
            "warnings": warnings,
            "init": self.record["init"],
            "package_version": self.record["package_version"],
            "written": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def e_step(self, model: ResponsibilityAttentionDistribution | None) -> SufficientStatistics:
        """The statistics of the training store under ``model`` (random responsibilities for ``None``)."""
        train, settings, factory = self.train, self.settings, self.factory
        if model is None:
            with distributed.span(f"respattn-init-{self.run_id}"):
                value = self.runner.run(
                    "init", "0", train.num_partitions, tasks.init_task,
                    lambda part: (train.location, part, factory, settings.seed, self.fingerprint),
                    description="initializing",
                )  # fmt: skip
        else:
            iteration = self.next_iteration
            # The span stays open through the validation pass; after_iteration closes it.
            self.spans.enter_context(distributed.span(f"respattn-iteration-{iteration}-{self.run_id}"))
            self.params.publish(model, str(iteration))
            value = self.runner.run(
                "estep", str(iteration), train.num_partitions, tasks.estep_task,
                lambda part: (train.location, part, self.params.current, factory, self.fingerprint),
                description=f"iteration {iteration}",
                before_attempt=self.params.republish,
            )  # fmt: skip
        self.last_key_mass = value.key_mass
        if factory.keys is None:  # nothing tied: pooling would only copy the S×T tables twice
            return value
        # Pool the heads tied by `keys` (the reference's protocol; a fit of one head pools only itself).
        accumulator = factory.make().from_value(value)
        pool: dict[str, Any] = {}
        accumulator.key_merge(pool)
        accumulator.key_replace(pool)
        return accumulator.value()

    def score_heldout(self, model: ResponsibilityAttentionDistribution, iteration: int) -> dict[str, float] | None:
        """The validation store's scores under the model after ``iteration`` (``None`` without one)."""
        heldout = self.heldout
        if heldout is None:
            return None
        self.params.publish(model, str(iteration + 1))  # the next E-step uses the same scattered model
        totals = self.runner.run(
            "heldout", str(iteration), heldout.num_partitions, tasks.score_task,
            lambda part: (heldout.location, part, self.params.current, self.heldout_fingerprint),
            description=f"validation {iteration}",
        )  # fmt: skip
        return totals.metrics()

    def after_iteration(self, record: EMIteration, model: ResponsibilityAttentionDistribution) -> bool:
        """Validate, checkpoint and report the model after an M-step; True stops the fit early."""
        settings, stopping = self.settings, self.stopping
        iteration = record.iteration
        scored = self.score_heldout(model, iteration)
        name = checkpoint_name(iteration, self.run_id)
        improved = stopping.update(scored, iteration, name) if scored is not None else False
        converged = record.change < settings.tol
        stop = scored is not None and stopping.exhausted and not converged
        state = (
            "converged" if converged
            else "early_stopped" if stop
            else "max_iter" if iteration >= settings.max_iter
            else "running"
        )  # fmt: skip
        warnings = degeneracy_warnings(
            model,
            key_mass=self.last_key_mass,
            min_sigma2=settings.min_sigma2 if settings.estimate_sigma2 else None,
        )
        entry = {
            "iteration": iteration,
            "mean_log_likelihood": record.mean_log_likelihood,
            "change": None if math.isinf(record.change) else record.change,
            "seconds": record.seconds,
            "rows_per_second": self.train.num_rows / record.seconds if record.seconds > 0 else float("inf"),
            "n_obs": record.n_obs,
            "sigma2": model.sigma2,
            "heldout": scored,
            "state": state,
            "warnings": warnings,
            "run_id": self.run_id,
        }
        self.history.append(entry)
        self.checkpoints.submit(
            name,
            model,
            self.checkpoint_meta(iteration, state, warnings),
            latest={"iteration": iteration, "state": state},
            best={"iteration": iteration, "metric": stopping.metric, "value": stopping.best} if improved else None,
            keep_best=stopping.best_checkpoint,
        )
        if state != "running":  # the fit ends here: its last checkpoint must be on disk when fit returns
            self.checkpoints.wait()
        self.reporter.iteration(entry)
        self.spans.close()
        self.next_iteration = iteration + 1
        if self.first_iteration_seconds is None:
            self.first_iteration_seconds = time.perf_counter() - self.started
        return stop
