"""One fit's iterations on the cluster: the start, E-step passes, held-out choices, early stopping, checkpoints.

:class:`FitLoop` supplies the E-step, the held-out selector and the after-M-step callback of the model
core's ``run_em`` (which owns the convergence test), holding what a fit carries from one iteration to
the next. After every M-step one pass over the held-out rows (the validation store, or the hold-out
of the training store) scores every candidate of the M-step's grid, which both makes the M-step's
open choices and gives the iteration's held-out scores.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import distributed

from dist_respattn.artifacts.checkpoints import BackgroundCheckpoints, ModelDir, checkpoint_name
from dist_respattn.engine import tasks
from dist_respattn.engine.broadcast import ParameterBroadcast
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.progress import FitReporter
from dist_respattn.engine.settings import FitSettings
from dist_respattn.engine.tasks import ALL_ROWS, RowSelection
from dist_respattn.events import FitState, HeldoutScores, IterationRecord, Metric
from dist_respattn.model.emission.layouts import DenseEmission, PairSupport, SparseEmission, SparseEmissionCounts
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.em import EMIteration, EMResult, LocalSearch, m_step, run_em
from dist_respattn.model.fitting.selection import Hyperparameters, HyperparameterSearch, Selection
from dist_respattn.model.heads.single_hop.accumulator import SufficientStatistics
from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.estimator import MStepCandidates, ResponsibilityAttentionEstimator
from dist_respattn.store.rows import RowStore

__all__ = ["EarlyStopping", "FitLoop", "HeldoutRows", "store_record"]

#: The grid of a fit that chooses nothing: one point, the fixed hyperparameters (the pass only scores).
SCORE_ONLY = HyperparameterSearch(None, None, None)


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
    """Where a fit's held-out rows are: all of a validation store, or the held-out side of the training store."""

    store: RowStore
    fingerprint: str
    rows: RowSelection

    @property
    def description(self) -> str:
        if self.rows.rule is None:
            return f"the validation store {self.store.location}"
        rule = self.rows.rule
        unit = "single rows" if rule.stripe_rows == 1 else f"stripes of {rule.stripe_rows} rows"
        return f"{rule.fraction:.0%} of the training store's rows ({unit})"


class FitLoop:
    """The iterations of one fit call (a fresh run id, so its keys, spans and checkpoints are its own).

    Args:
        client: the cluster's client.
        train: the training store; ``train_rows``: which of its rows are trained on (all, or the
            training side of the automatic hold-out).
        heldout: where the held-out rows are, or ``None`` (then nothing is chosen and nothing validated).
        settings: the fit's settings.
        folder: the model directory.
        stopping: early-stopping state (restored from the checkpoint when resuming).
        history: the per-iteration records so far; new ones are appended.
        record: what every checkpoint records besides the iteration: ``store``, ``validation``, ``init``,
            ``holdout`` and ``package_version``.
        prior: the emission prior of the fit being resumed (``None``: made from the training rows).
        last_choice: the last choice made on held-out rows by the fit being resumed, which the next
            search centres on (``None``: the first search is the whole grid).
        resumed: whether the start model given to :meth:`run` is this fit's own checkpoint (a sparse one
            then lies on this store's support already; a warm start's is moved onto it).
        check_support: called with a sparse fit's number of pairs once the start pass has found them
            (the memory plan's second check).
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
        heldout: HeldoutRows | None,
        settings: FitSettings,
        folder: ModelDir,
        stopping: EarlyStopping,
        history: list[IterationRecord],
        record: dict[str, Any],
        prior: EmissionPrior | None = None,
        last_choice: Hyperparameters | None = None,
        resumed: bool = False,
        check_support: Callable[[int], None] | None = None,
        say: Callable[[str], Any],
        progress: bool | None,
        verbose: bool = False,
        started: float,
    ) -> None:
        self.train, self.train_rows, self.heldout, self.settings = train, train_rows, heldout, settings
        self.folder, self.stopping, self.history, self.record, self.started = folder, stopping, history, record, started
        self.run_id = uuid.uuid4().hex[:8]
        self.estimator: ResponsibilityAttentionEstimator = settings.estimator(train.schema)
        if prior is not None and self.estimator.needs_pairs:
            self.estimator = self.estimator.resolved(prior)
        self.search = LocalSearch(self.estimator.search or SCORE_ONLY, last_choice)
        self.layout = settings.layout(train.schema)
        self.factory = self.estimator.accumulator_factory(layout=self.layout)
        self.resumed = resumed
        self.check_support = check_support
        self.say = say
        self.verbose = verbose
        self.fingerprint = train.fingerprint()
        self.reporter = FitReporter(client, say=say, bar=progress)
        self.runner = PassRunner(client, self.run_id, fan_in=settings.fan_in, make_bar=self.reporter.make_bar)
        self.params = ParameterBroadcast(client, self.run_id)
        self.grids = ParameterBroadcast(client, self.run_id, prefix="grid")
        self.checkpoints = BackgroundCheckpoints(folder)
        self.spans = contextlib.ExitStack()
        self.next_iteration = 1
        self.last_key_mass: Any = None
        self.first_iteration_seconds: float | None = None
        self.initial: Selection | None = None
        self.choice_label = "0"  # the held-out pass's key label: the iteration whose M-step it chooses for

    @property
    def prior(self) -> EmissionPrior | None:
        """The emission prior in use (once made from the training rows)."""
        prior = self.estimator.emission_prior
        return prior if isinstance(prior, EmissionPrior) else None

    def run(self, start: ResponsibilityAttentionDistribution | None, *, first_iteration: int) -> EMResult:
        """EM from ``start`` (``None``: the start pass) at ``first_iteration`` to the end of the fit."""
        self.next_iteration = first_iteration
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
            model = self.first_model() if start is None else self.with_prior(start)
            result = run_em(
                self.e_step,
                self.estimator,
                init=model,
                select=self.select if self.heldout is not None else None,
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
            self.spans.close()
            self.params.release()
            self.grids.release()
        if not self.history:  # max_iter = 0: the starting model is the fit, and a new fit must replace an old one
            self.folder.commit(
                checkpoint_name(0, self.run_id),
                result.distribution,
                self.checkpoint_meta(0, FitState.MAX_ITER, degeneracy_warnings(result.distribution)),
                latest={"iteration": 0, "state": FitState.MAX_ITER},
                best=None,
                keep_best=None,
                arrays=self.checkpoint_arrays(),
            )
        self.reporter.ended(self.run_id, FitState(self.history[-1]["state"]) if self.history else FitState.MAX_ITER)
        return result

    # -- the start ------------------------------------------------------------------------------

    def first_model(self) -> ResponsibilityAttentionDistribution:
        """The M-step of the start's responsibilities (uniform, or random from the seed), its choices made."""
        train, settings, factory = self.train, self.settings, self.factory
        with_pairs = self.estimator.needs_pairs
        with distributed.span(f"respattn-init-{self.run_id}"):
            value = self.runner.run(
                "init", "0", train.num_partitions, tasks.start_task,
                lambda part: (
                    train.location, part, factory, settings.init, settings.seed, self.fingerprint,
                    self.train_rows, with_pairs, self.estimator.buckets,
                ),
                description="initializing",
            )  # fmt: skip
            if with_pairs:
                self.resolve_prior(value.pairs)
            self.found_support(value.stats)
            self.last_key_mass = value.stats.key_mass
            self.choice_label = "0"
            model, self.initial = m_step(
                self.estimator, value.stats, None, self.select if self.heldout is not None else None
            )
        return model

    def found_support(self, stats: SufficientStatistics) -> PairSupport | None:
        """A sparse fit's support, from the start pass's counts (which carry it); checked against memory."""
        counts = stats.emission_count
        if not isinstance(counts, SparseEmissionCounts) or counts.support is None:
            return None
        support = counts.support
        self.say(
            f"sparse emission over {support.num_pairs:,} (symbol, target) pairs "
            f"({support.num_pairs / (support.num_symbols * support.num_targets):.2%} of S x T)"
        )
        if self.check_support is not None:
            self.check_support(support.num_pairs)
        return support

    def with_prior(self, start: ResponsibilityAttentionDistribution) -> ResponsibilityAttentionDistribution:
        """A given start: a warm start's emission prior still has to come from this store's pairs, and a
        sparse fit's start must lie on this store's support (a resumed fit's own model does already)."""
        if self.layout == "sparse" and not self.resumed:
            train = self.train
            value = self.runner.run(
                "support", "0", train.num_partitions, tasks.start_task,
                lambda part: (
                    train.location, part, self.factory, "uniform", 0, self.fingerprint, self.train_rows, False,
                    self.estimator.buckets,
                ),
                description="finding the pairs",
            )  # fmt: skip
            support = self.found_support(value.stats)
            assert support is not None
            start = start.with_emission(start.emission_table.restricted(support))
        elif self.layout == "dense" and isinstance(start.emission_table, SparseEmission):
            start = start.with_emission(DenseEmission(start.emission_table.to_dense()))
        if self.estimator.needs_pairs:
            train = self.train
            pairs = self.runner.run(
                "pairs", "0", train.num_partitions, tasks.pairs_task,
                lambda part: (train.location, part, self.fingerprint, self.train_rows),
                description="counting pairs",
            )  # fmt: skip
            self.resolve_prior(pairs)
        return start

    def resolve_prior(self, pairs: PairCounts) -> None:
        kind = self.estimator.emission_prior
        assert isinstance(kind, str)
        self.estimator = self.estimator.resolved(EmissionPrior.from_pairs(pairs, kind))

    # -- the passes -----------------------------------------------------------------------------

    def checkpoint_meta(self, iteration: int, state: FitState, warnings: list[str]) -> dict[str, Any]:
        """The JSON written with a checkpoint."""
        prior = self.prior
        return {
            "iteration": iteration,
            "state": state,
            "history": list(self.history),  # a copy: the list grows while the checkpoint is written
            "settings": self.settings.to_json(),
            "store": self.record["store"],
            "validation": self.record["validation"],
            "holdout": self.record.get("holdout"),
            "emission_prior": None if prior is None else {"kind": prior.kind},
            "hyperparameters": self.history[-1].get("hyperparameters") if self.history else self.initial_choice(),
            # An iteration-0 checkpoint has no history, yet its start's choice centres the next search.
            "last_choice": None if self.search.previous is None else self.search.previous.to_json(),
            "early_stopping": self.stopping.to_json(),
            "warnings": warnings,
            "init": self.record["init"],
            "package_version": self.record["package_version"],
            "written": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def initial_choice(self) -> dict[str, float] | None:
        """The hyperparameters of the first model (the start's M-step), when this run made it."""
        return None if self.initial is None else self.initial.hyperparameters.to_json()

    def checkpoint_arrays(self) -> dict[str, Any]:
        """The arrays a checkpoint keeps besides the model: the emission prior, so a resume needs no pass."""
        prior = self.prior
        return {} if prior is None else prior.to_arrays()

    def e_step(self, model: ResponsibilityAttentionDistribution | None) -> SufficientStatistics:
        """The statistics of the training rows under ``model``."""
        assert model is not None, "the start is made by first_model"
        train, factory = self.train, self.factory
        iteration = self.next_iteration
        # The span stays open through the held-out pass; after_iteration closes it.
        self.spans.enter_context(distributed.span(f"respattn-iteration-{iteration}-{self.run_id}"))
        self.params.publish(model, str(iteration))
        self.choice_label = str(iteration)
        value = self.runner.run(
            "estep", str(iteration), train.num_partitions, tasks.estep_task,
            lambda part: (train.location, part, self.params.current, factory, self.fingerprint, self.train_rows),
            description=f"iteration {iteration}",
            before_attempt=self.params.republish,
        )  # fmt: skip
        self.last_key_mass = value.key_mass
        if factory.keys is None:  # nothing tied: pooling would only copy the S×T tables twice
            return value
        # Pool the heads tied by `keys` (the reference's protocol; a fit of one head pools only itself).
        accumulator = factory.make_for(model).from_value(value)
        pool: dict[str, Any] = {}
        accumulator.key_merge(pool)
        accumulator.key_replace(pool)
        return accumulator.value()

    def select(self, candidates: MStepCandidates) -> Selection:
        """Score the M-step's grid on the held-out rows in one pass and choose (the iteration's held-out scores)."""
        heldout = self.heldout
        assert heldout is not None
        label = self.choice_label
        table = candidates.grid_table(self.search.grid(candidates))
        self.grids.publish(table, label)
        try:
            totals = self.runner.run(
                "heldout", label, heldout.store.num_partitions, tasks.grid_task,
                lambda part: (heldout.store.location, part, self.grids.current, heldout.fingerprint, heldout.rows),
                description=f"held-out choice {label}",
                before_attempt=self.grids.republish,
            )  # fmt: skip
        finally:
            self.grids.release()
        return self.search.chose(candidates.select(table, totals))

    def after_iteration(self, record: EMIteration, model: ResponsibilityAttentionDistribution) -> bool:
        """Checkpoint and report the model after an M-step; True stops the fit early.

        The held-out scores are those the M-step's choice was made with (``record.heldout``).
        """
        settings, stopping = self.settings, self.stopping
        iteration = record.iteration
        # The model core's scores are a plain dict of the same fields.
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
        warnings = degeneracy_warnings(
            model,
            key_mass=self.last_key_mass,
            min_sigma2=settings.min_sigma2 if settings.estimate_sigma2 else None,
        )
        entry: IterationRecord = {
            "iteration": iteration,
            "mean_log_likelihood": record.mean_log_likelihood,
            "change": None if math.isinf(record.change) else record.change,
            "seconds": record.seconds,
            "rows_per_second": self.train.num_rows / record.seconds if record.seconds > 0 else float("inf"),
            "n_obs": record.n_obs,
            "sigma2": model.sigma2,
            "hyperparameters": None if record.hyperparameters is None else record.hyperparameters.to_json(),
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
            arrays=self.checkpoint_arrays(),
        )
        if state.final:  # the fit ends here: its last checkpoint must be on disk when fit returns
            self.checkpoints.wait()
        self.reporter.iteration(
            entry,
            best=improved if scored is not None else None,
            best_iteration=stopping.best_iteration,
            metric=stopping.metric,
            verbose=self.verbose,
        )
        self.spans.close()
        self.next_iteration = iteration + 1
        if self.first_iteration_seconds is None:
            self.first_iteration_seconds = time.perf_counter() - self.started
        return stop
