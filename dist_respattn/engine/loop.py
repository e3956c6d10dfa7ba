"""One fit's iterations on the cluster, for any kind of head: its passes, early stopping, checkpoints and events.

The loop itself is the model layer's (:func:`~dist_respattn.model.fitting.em.run_head_em`, which owns the start,
the choices and the convergence test); :class:`ClusterPasses` runs its passes on the cluster (the trainer's
statistics over the training rows' partitions, its preparation passes, every M-step's grid over the held-out
rows: the validation store, or the hold-out of the training store), and :class:`FitLoop` checkpoints, reports
and stops early after every M-step, holding what a fit carries from one iteration to the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import distributed
import numpy as np

from dist_respattn.artifacts.checkpoints import BackgroundCheckpoints, ModelDir, checkpoint_name
from dist_respattn.engine import kept_rows, worker_tasks
from dist_respattn.engine.broadcast import FitTables, ParameterBroadcast, payload_bytes
from dist_respattn.engine.held_tables import release_run
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.progress import FitReporter
from dist_respattn.engine.settings import FitSettings
from dist_respattn.engine.sharded import RemoteGrid, RemoteHead, ShardedRun, ShardedTrainer
from dist_respattn.engine.worker_tasks import ALL_ROWS, RowSelection
from dist_respattn.events import FitState, HeldoutScores, IterationRecord, Metric
from dist_respattn.model.fitting.em import EMIteration, EMResult, HeldoutChoice, run_head_em
from dist_respattn.model.heads.base import BlockPass, Grid, Head, HeadSpec, Statistics, Trainer
from dist_respattn.store.rows import RowStore

__all__ = ["ClusterPasses", "EarlyStopping", "FitLoop", "HeldoutRows", "store_record"]

logger = logging.getLogger(__name__)


class EarlyStopping:
    """Tracks the best held-out metric and the iterations since it last improved by ``min_improvement``.

    The best checkpoint follows every improvement; patience runs out after ``patience`` iterations
    none of which improved on the reference value (the last significant improvement) by at least
    ``min_improvement``, relatively, so a fit creeping forward by 0.01% an iteration stops.
    """

    def __init__(
        self,
        metric: Metric | str | None,
        patience: int,
        state: dict[str, Any] | None = None,
        *,
        min_improvement: float = 0.0,
    ) -> None:
        self.metric = None if metric is None else Metric(metric)
        self.patience = patience
        self.min_improvement = min_improvement
        state = state or {}
        self.best: float | None = state.get("best")
        self.best_iteration: int | None = state.get("best_iteration")
        self.best_checkpoint: str | None = state.get("best_checkpoint")
        self.since_best: int = int(state.get("since_best", 0))
        self.reference: float | None = state.get("reference", self.best)

    def value(self, heldout: HeldoutScores) -> float:
        return (self.metric or Metric.LOGLIK).of(heldout)

    def _gain(self, value: float, than: float | None) -> float:
        """How much better ``value`` is than ``than``, relatively (inf when there is nothing to beat)."""
        if than is None:
            return math.inf
        gain = than - value if self.metric is Metric.PERPLEXITY else value - than
        return gain / max(abs(than), 1e-300)

    def update(self, heldout: HeldoutScores, iteration: int, checkpoint: str) -> bool:
        """Record an iteration's held-out scores; True when it is the best so far."""
        value = self.value(heldout)
        if math.isnan(value):
            self.since_best += 1
            return False
        improved = self._gain(value, self.best) > 0.0
        if improved:
            self.best, self.best_iteration, self.best_checkpoint = value, iteration, checkpoint
        if self._gain(value, self.reference) >= self.min_improvement and improved:
            self.reference, self.since_best = value, 0
        else:
            self.since_best += 1
        return improved

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
            "reference": self.reference,
        }


def store_record(store: RowStore) -> dict[str, Any]:
    """What a checkpoint records of a store: URL, fingerprint, rows, partitions, source, corpus identity."""
    return {
        "url": str(store.location),
        "window": store.location.window,
        "min_context": getattr(store, "min_context", None),
        "fingerprint": store.fingerprint(),
        "rows": store.num_rows,
        "partitions": store.num_partitions,
        "source": store.provenance.get("source"),
        "identity": store.identity(),
    }


@dataclass(frozen=True)
class HeldoutRows:
    """Where a fit's held-out rows are: all of a validation store, or the held-out side of the training store.

    ``mapping``: the store's attribute ids as the trainer's (``None``: the same, or no attributes read).
    """

    store: RowStore
    fingerprint: str
    rows: RowSelection
    mapping: np.ndarray | None = None

    @property
    def description(self) -> str:
        if self.rows.rule is None:
            return f"the validation store {self.store.location}"
        rule = self.rows.rule
        unit = "single rows" if rule.stripe_rows == 1 else f"stripes of {rule.stripe_rows} rows"
        return f"{rule.fraction:.0%} of the training store's rows ({unit})"


class ClusterPasses:
    """The passes of one fit on the cluster (:class:`~dist_respattn.model.fitting.em.EMPasses`), under one run tag.

    Each iteration's E-step and held-out pass run in a span of their own (``respattn-iteration-<k>-<tag>``), the
    preparation's in ``respattn-init-<tag>``; the head and each grid are scattered once and released after, the
    tables fixed for the fit that they hold (a sparse support) once a fit.
    """

    def __init__(
        self,
        client: distributed.Client,
        run_id: str,
        *,
        train: RowStore,
        train_rows: RowSelection,
        train_map: np.ndarray | None,
        heldout: HeldoutRows | None,
        fan_in: int,
        reporter: FitReporter,
        plan_memory: Callable[[], None],
        sharded: ShardedRun | None = None,
    ) -> None:
        self.train, self.train_rows, self.train_map, self.held = train, train_rows, train_map, heldout
        #: The sharded M-step's run (``None``: every M-step runs on the driver).
        self.sharded = sharded
        self.reporter = reporter
        self.plan = plan_memory
        self.fingerprint = train.fingerprint()
        self.runner = PassRunner(client, run_id, fan_in=fan_in, make_bar=reporter.make_bar)
        # The tables fixed for the fit (a sparse support) that the models and grids hold go once, apart.
        self.tables = FitTables(client, run_id)
        self.params = ParameterBroadcast(client, run_id, tables=self.tables)
        self.grids = ParameterBroadcast(client, run_id, prefix="grid", tables=self.tables)
        self.spans = contextlib.ExitStack()
        self.span_name: str | None = None
        self.run_id = run_id
        self.train_sizes = [p.stop - p.start for p in train.partitions()]
        # A hold-out's held-out side reads only its share of each partition's rows.
        share = 1.0 if heldout is None or heldout.rows.rule is None else heldout.rows.rule.fraction
        self.heldout_sizes = (
            [] if heldout is None else [int((p.stop - p.start) * share) for p in heldout.store.partitions()]
        )
        #: The last E-step's statistics (for the head's warnings).
        self.last_statistics: Any = None
        #: Whether a held-out pass ran (the workers may keep its rows: :meth:`_kept_heldout`).
        self._heldout_kept = False
        #: The head chosen on the grid still on the workers, and its choice (:meth:`chosen`).
        self._chosen: tuple[Head, Any] | None = None
        if sharded is not None:
            sharded.attach(self)

    def in_span(self, name: str) -> None:
        """Run the next tasks in span ``name`` (of this run)."""
        self._in_span(name)

    def _in_span(self, name: str) -> None:
        if self.span_name != name:
            self.spans.close()
            self.spans.enter_context(distributed.span(f"{name}-{self.run_id}"))
            self.span_name = name

    def close_span(self) -> None:
        self.spans.close()
        self.span_name = None

    def run(self, request: BlockPass) -> Any:
        self._in_span("respattn-init")
        train = self.train
        value = self.runner.run(
            request.name, "0", train.num_partitions, worker_tasks.pass_task,
            lambda part: (
                train.location, part, request.map_partition, request.columns, self.fingerprint, self.train_rows,
                self.train_map,
            ),
            description=request.description,
        )  # fmt: skip
        self.last_statistics = value
        return value

    def statistics(self, trainer: Trainer, head: Head, iteration: int) -> Statistics:
        """The trainer's statistics of the training rows under ``head`` (the span stays open through the held-out
        pass; the loop closes it after the iteration's checkpoint)."""
        self._in_span(f"respattn-iteration-{iteration}")
        if isinstance(trainer, ShardedTrainer):
            if self.sharded is not None and self.sharded.ready(trainer.inner):
                value: Any = self.sharded.statistics(self, trainer.inner, head, iteration)
                self.params.release()  # the start's head, sent once: the next passes read the owners' parts
                self.last_statistics = value
                return cast("Statistics", value)
            trainer = trainer.inner
        plan = self.runner.plan(self.train_sizes, payload_bytes(head))
        # The head chosen on the grid the workers scored is made there, from that grid (the driver's own copy is the
        # checkpoint's); any other head is sent. After lost work the driver's copy is sent instead.
        chosen = self._chosen_argument(head, iteration)
        argument: list[Any] = [chosen]
        if chosen is None:
            self.params.publish(head, str(iteration), workers=plan.workers)
            argument[0] = self.params.current

        def before_attempt(attempt: int) -> None:
            if attempt == 0:
                return
            if chosen is not None and self.params.current_model is None:
                self.tables.forget()  # they may have gone with the workers too
                self.params.publish(head, f"{iteration}.{attempt}")
            else:
                self.params.republish(attempt)
            argument[0] = self.params.current

        train = self.train
        try:
            value = self.runner.run(
                "estep", str(iteration), train.num_partitions, worker_tasks.statistics_task,
                lambda part: (
                    train.location, part, trainer, argument[0], self.fingerprint, self.train_rows, self.train_map,
                ),
                description=f"iteration {iteration}",
                before_attempt=before_attempt,
                plan=plan,
            )  # fmt: skip
        finally:
            # The workers drop the E-step's head (and what its tasks built from it) before the held-out pass brings
            # its grid, which may hold a head as large (a stack's): a head sent and the next grid are never held at
            # once. A head made from the grid is held with that grid through the E-step, and goes with the next
            # held-out pass's first task on each worker (:func:`~dist_respattn.engine.worker_tasks.release_chosen`).
            self.params.release()
            self.grids.release()
            self._chosen = None
        self.last_statistics = value
        return value

    def chosen(self, head: Head, choice: Any) -> None:
        """``head`` is the one chosen (``choice``) on the last held-out pass's grid: when that grid makes heads
        (:attr:`~dist_respattn.model.heads.base.Grid.makes_heads`) and is still on the workers, the next E-step's
        tasks make it from there."""
        grid = self.grids.current_model
        self._chosen = (head, choice) if isinstance(grid, Grid) and grid.makes_heads else None

    def _chosen_argument(self, head: Head, iteration: int) -> Any:
        """The E-step's head argument made on the workers from the kept grid (``None``: the head is sent)."""
        if self._chosen is None or self._chosen[0] is not head or self.grids.current_model is None:
            self.grids.release()
            return None
        return worker_tasks.chosen_argument(self.run_id, str(iteration), self.grids.current, self._chosen[1])

    def heldout(self, grid: Grid, label: str) -> Any:
        """Every point of ``grid`` scored on the held-out rows in one pass (``None``: the fit has none)."""
        heldout = self.held
        if heldout is None:
            return None
        if label == "0":
            self._in_span("respattn-init")
        # Each worker keeps what a grid task planned from its partition's rows for the fit's later grids
        # (:mod:`~dist_respattn.engine.kept_rows`): a partition's task goes back to the worker that holds it.
        run = self.run_id
        if isinstance(grid, RemoteGrid):  # made where it is scored, from the sharded M-step's parts
            argument = grid.argument
            return self.runner.run(
                "heldout", label, heldout.store.num_partitions, worker_tasks.grid_task,
                lambda part: (
                    heldout.store.location, part, argument, heldout.fingerprint, heldout.rows, heldout.mapping, run,
                ),
                description=f"held-out choice {label}",
                plan=self.runner.plan(self.heldout_sizes, 0),
                prefer=self._kept_heldout,
            )  # fmt: skip
        plan = self.runner.plan(self.heldout_sizes, payload_bytes(grid))
        self.grids.publish(grid, label, workers=plan.workers)
        keep = False
        try:
            scores = self.runner.run(
                "heldout", label, heldout.store.num_partitions, worker_tasks.grid_task,
                lambda part: (
                    heldout.store.location, part, self.grids.current, heldout.fingerprint, heldout.rows,
                    heldout.mapping, run,
                ),
                description=f"held-out choice {label}",
                before_attempt=self.grids.republish,
                plan=plan,
                prefer=self._kept_heldout,
            )  # fmt: skip
            # A grid that makes heads stays on the workers until the next E-step has made the chosen one from it.
            keep = grid.makes_heads
            return scores
        finally:
            if not keep:
                self.grids.release()

    def _kept_heldout(self) -> dict[int, str]:
        """The worker keeping each held-out partition's rows for this fit (none before the first held-out pass)."""
        if self.held is None or not self._heldout_kept:
            self._heldout_kept = True  # the first pass keeps them: ask from the next one on
            return {}
        client = self.runner.client
        try:
            held = client.run(kept_rows.held_parts, self.run_id, self.held.fingerprint)
        except Exception as exc:  # a worker going away: the tasks run where the scheduler puts them
            logger.debug("could not ask the workers which held-out rows they keep: %s", exc)
            return {}
        return {part: worker for worker, parts in sorted(held.items()) for part in parts}

    def say(self, line: str) -> None:
        self.reporter.line(line)

    def plan_memory(self) -> None:
        self.plan()

    def release(self) -> None:
        self.close_span()
        self.params.release()
        self.grids.release()
        self.tables.release()
        if self.sharded is not None:
            self.sharded.release()
        self._release_held_tables()

    def _release_held_tables(self) -> None:
        """Let every worker drop the tables it kept for this fit (:mod:`~dist_respattn.engine.held_tables`). Best
        effort: a worker that misses this (or a fit that ended with its driver) keeps them only until newer tables
        push them out."""
        client = self.runner.client
        if client.status != "running":
            return
        try:
            client.run(release_run, self.run_id)
            client.run(kept_rows.release_run, self.run_id)
            client.run(worker_tasks.release_chosen, self.run_id)
        except Exception as exc:  # a cluster going away: nothing is left to release
            logger.debug("could not tell the workers to drop the fit's tables: %s", exc)


class FitLoop:
    """The iterations of one fit call, for any kind (a fresh run id, so its keys, spans and checkpoints are its own).

    Args:
        client: the cluster's client.
        train: the training store; ``train_rows``: which of its rows are trained on (all, or the
            training side of the automatic hold-out); ``train_map``: the store's attribute ids as the trainer's
            (``None``: the same).
        heldout: where the held-out rows are, or ``None`` (then nothing is chosen and nothing validated).
        settings: the fit's loop settings (``max_iter``, ``tol``, early stopping, ``fan_in``).
        spec: the head's spec (recorded in every checkpoint); ``trainer``: the fit's trainer, made from it.
        folder: the model directory.
        stopping: early-stopping state (restored from the checkpoint when resuming).
        history: the per-iteration records so far; new ones are appended.
        record: what every checkpoint records besides the iteration: ``store``, ``validation``, ``init``,
            ``holdout``, ``package_version`` (and whatever else the fit adds).
        last_choice: the last choice made on held-out rows by the fit being resumed, which the next
            search centres on (``None``: the first search is the whole grid).
        resumed: whether the start head given to :meth:`run` is this fit's own checkpoint.
        shard_bounds: the sharded M-step's bounds that checkpoint recorded (``None``: none), which the fit keeps.
        plan_memory: checks the trainer's memory plan against the cluster (called again by the trainer once a
            pass told it more).
        say / progress: where the lines go, and whether to show bars.
        verbose: iteration lines with the joint log-likelihoods too.
        started: ``time.perf_counter()`` at the call, for the time to the first iteration.
    """

    def __init__(
        self,
        client: distributed.Client,
        *,
        train: RowStore,
        train_rows: RowSelection = ALL_ROWS,
        train_map: np.ndarray | None = None,
        heldout: HeldoutRows | None,
        settings: FitSettings,
        spec: HeadSpec,
        trainer: Trainer,
        folder: ModelDir,
        stopping: EarlyStopping,
        history: list[IterationRecord],
        record: dict[str, Any],
        last_choice: Any = None,
        resumed: bool = False,
        shard_bounds: list[int] | None = None,
        plan_memory: Callable[[], None] | None = None,
        say: Callable[[str], Any],
        progress: bool | None,
        verbose: bool = False,
        started: float,
    ) -> None:
        self.train, self.heldout, self.settings, self.spec, self.trainer = train, heldout, settings, spec, trainer
        self.folder, self.stopping, self.history, self.record, self.started = folder, stopping, history, record, started
        self.run_id = uuid.uuid4().hex[:8]
        self.resumed = resumed
        self.say = say
        self.verbose = verbose
        self.reporter = FitReporter(client, say=say, bar=progress)
        sharded = (
            # A fit of no iterations keeps its start on the driver: its start is its model, committed by the driver.
            ShardedRun(
                client,
                self.run_id,
                settings.m_step_shards,
                say,
                folder=folder if settings.max_iter > 0 else None,
                bounds=shard_bounds,
            )
            if settings.m_step_shards > 0
            else None
        )
        #: The trainer the loop runs: the fit's, its M-steps in shards on the workers when asked for.
        self.loop_trainer: Trainer = trainer if sharded is None else ShardedTrainer(trainer, sharded)
        self.passes = ClusterPasses(
            client, self.run_id, train=train, train_rows=train_rows, train_map=train_map, heldout=heldout,
            fan_in=settings.fan_in, reporter=self.reporter, plan_memory=plan_memory or (lambda: None),
            sharded=sharded,
        )  # fmt: skip
        self.choice = HeldoutChoice(self.passes, last_choice)
        self.checkpoints = BackgroundCheckpoints(folder)
        self.first_iteration_seconds: float | None = None
        self.initial_choice: Any = None

    def run(self, start: Head | None, *, first_iteration: int) -> EMResult:
        """EM from ``start`` (``None``: the trainer's own start) at ``first_iteration`` to the end of the fit."""
        previous_ll = self.history[-1]["mean_log_likelihood"] if self.history else None
        self.reporter.started(
            self.run_id,
            store=self.record["store"]["url"],
            validation=self.record["validation"]["url"] if self.record["validation"] else None,
            heldout_rows=self.heldout.description if self.heldout is not None else None,
            rows=self.train.num_rows,
            max_iter=self.settings.max_iter,
            model_dir=str(self.folder),
            first_iteration=first_iteration,
        )
        try:
            result = run_head_em(
                self.loop_trainer,
                self.passes,
                start=start,
                resumed=self.resumed,
                choose=self.choose,
                max_iter=self.settings.max_iter,
                tol=self.settings.tol,
                callback=self.after_iteration,
                first_iteration=first_iteration,
                previous_log_likelihood=previous_ll,
            )
        except BaseException as exc:
            self.checkpoints.close(raise_errors=False)  # the fit's own error is the one to report
            self.reporter.ended(self.run_id, FitState.FAILED, error=f"{type(exc).__name__}: {exc}")
            raise
        else:
            self.checkpoints.close()
        finally:
            self.passes.release()
        head = result.distribution
        if isinstance(head, RemoteHead):
            # The fit's head, from its last checkpoint: the driver reads it once, at the end.
            assert head.checkpoint is not None
            head.release()
            result = dataclasses.replace(result, distribution=self.folder.load(head.checkpoint).model)
        if not self.history:  # max_iter = 0: the starting model is the fit, and a new fit must replace an old one
            self.folder.commit(
                checkpoint_name(0, self.run_id),
                result.distribution,
                self.checkpoint_meta(0, FitState.MAX_ITER, self.trainer.warnings(result.distribution)),
                latest={"iteration": 0, "state": FitState.MAX_ITER},
                best=None,
                keep_best=None,
                arrays=self.checkpoint_arrays(),
            )
        self.reporter.ended(self.run_id, FitState(self.history[-1]["state"]) if self.history else FitState.MAX_ITER)
        return result

    def choose(self, candidates: Any, label: str) -> Any:
        """The M-step's choice on the held-out rows; the start's (label ``"0"``) is kept for its checkpoint."""
        head, selection = self.choice(candidates, label)
        self.passes.chosen(head, selection.hyperparameters)
        if label == "0":
            self.initial_choice = selection.hyperparameters
        return head, selection

    # -- checkpoints ------------------------------------------------------------------------------------------

    def checkpoint_meta(self, iteration: int, state: FitState, warnings: list[str]) -> dict[str, Any]:
        """The JSON written with a checkpoint."""
        _, extras = self.trainer.checkpoint_extras()
        previous = self.choice.previous
        initial = self.initial_choice
        return {
            "iteration": iteration,
            "state": state,
            "history": list(self.history),  # a copy: the list grows while the checkpoint is written
            "settings": self.settings.to_json(),
            "head": self.spec.to_json(),
            "store": self.record["store"],
            "validation": self.record["validation"],
            "holdout": self.record.get("holdout"),
            **extras,
            "hyperparameters": self.history[-1].get("hyperparameters")
            if self.history
            else (None if initial is None else initial.to_json()),
            # An iteration-0 checkpoint has no history, yet its start's choice centres the next search.
            "last_choice": None if previous is None else previous.to_json(),
            "early_stopping": self.stopping.to_json(),
            "warnings": warnings,
            "init": self.record["init"],
            **{k: v for k, v in self.record.items() if k not in ("store", "validation", "holdout", "init")},
            "written": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def checkpoint_arrays(self) -> dict[str, Any]:
        """The arrays a checkpoint keeps besides the head (the trainer's: an emission prior, say)."""
        arrays, _ = self.trainer.checkpoint_extras()
        return arrays

    def after_iteration(self, record: EMIteration, model: Head) -> bool:
        """Checkpoint and report the model after an M-step; True stops the fit early.

        The held-out scores are those the M-step's choice was made with (``record.heldout``).
        """
        settings, stopping = self.settings, self.stopping
        iteration = record.iteration
        # The model layer's scores are a plain dict of the same fields.
        scored = cast("HeldoutScores | None", record.heldout) if self.heldout is not None else None
        name = checkpoint_name(iteration, self.run_id)
        improved = stopping.update(scored, iteration, name) if scored is not None else False
        converged = record.change < settings.tol
        stop = scored is not None and stopping.exhausted and not converged
        state = (
            FitState.CONVERGED if converged
            else FitState.EARLY_STOPPED if stop
            else FitState.MAX_ITER if iteration >= settings.max_iter
            else FitState.RUNNING
        )  # fmt: skip
        warnings = self.loop_trainer.warnings(model, self.passes.last_statistics)
        choice = record.hyperparameters
        entry: IterationRecord = {
            "iteration": iteration,
            "mean_log_likelihood": record.mean_log_likelihood,
            "change": None if math.isinf(record.change) else record.change,
            "seconds": record.seconds,
            "rows_per_second": self.train.num_rows / record.seconds if record.seconds > 0 else float("inf"),
            "n_obs": record.n_obs,
            **model.record(),  # type: ignore[typeddict-item]
            "hyperparameters": None if choice is None else choice.to_json(),
            "choice": None if choice is None else choice.describe(),
            "heldout": scored,
            "state": state,
            "warnings": warnings,
            "run_id": self.run_id,
        }
        self.history.append(entry)
        pointers: dict[str, Any] = {
            "latest": {"iteration": iteration, "state": state},
            "best": {"iteration": iteration, "metric": stopping.metric, "value": stopping.best} if improved else None,
            "keep_best": stopping.best_checkpoint,
            "arrays": self.checkpoint_arrays(),
        }
        if isinstance(model, RemoteHead):
            # The owners write its parts; the next passes read them from there, so it is committed now.
            assert self.passes.sharded is not None
            self.checkpoints.wait()
            self.passes.sharded.commit(
                self.folder, name, model, self.checkpoint_meta(iteration, state, warnings), final=state.final,
                **pointers,
            )  # fmt: skip
        else:
            self.checkpoints.submit(name, model, self.checkpoint_meta(iteration, state, warnings), **pointers)
        if state.final:  # the fit ends here: its last checkpoint must be on disk when fit returns
            self.checkpoints.wait()
        self.reporter.iteration(
            entry,
            best=improved if scored is not None else None,
            best_iteration=stopping.best_iteration,
            metric=stopping.metric,
            verbose=self.verbose,
        )
        self.passes.close_span()
        if self.first_iteration_seconds is None:
            self.first_iteration_seconds = time.perf_counter() - self.started
        return stop
