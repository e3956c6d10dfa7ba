"""``fit``: exact EM over a triple store on a Dask cluster, checkpointed after every M-step.

This module decides where a fit starts (a random start, a given model, a warm start or a resumed
checkpoint), checks the stores, the model directory and the memory, and connects to the cluster;
:class:`~dist_respattn.engine.loop.FitLoop` then runs the iterations. Each one: the parameters are
scattered once; one E-step task per partition reads its rows in blocks; a fixed tree of combine
tasks sums the statistics on the workers; the driver receives one value, runs the M-step, scores the
validation store if there is one, and writes a checkpoint. The driver never reads a row.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import distributed

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.artifacts.checkpoints import LATEST, Checkpoint, ModelDir
from dist_respattn.engine.cluster import (
    ClusterError,
    ClusterOptions,
    cluster_info,
    connect,
    embedded_worker_memory,
    fit_page_url,
    starts_embedded_cluster,
)
from dist_respattn.engine.loop import EarlyStopping, FitLoop, HeldoutRows, store_record
from dist_respattn.engine.memory import check_memory, estimate_memory
from dist_respattn.engine.settings import FitSettings
from dist_respattn.engine.tasks import ALL_ROWS, RowSelection
from dist_respattn.events import FitState, IterationRecord, Metric, history_from_json
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.fitting.selection import Hyperparameters
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.store import StoreLocation, TripleStore, check_recorded_corpus, check_same_corpus
from dist_respattn.store.rows import RowStore, open_store
from dist_respattn.store.streams.reader import TokenStreamStore

__all__ = ["FitError", "FitResult", "check_same_shape", "fit", "open_fit_store"]

logger = logging.getLogger("dist_respattn.fit")

#: How long a fit waits for a cluster to have at least one worker.
WORKER_WAIT_SECONDS = 30.0


class FitError(ValueError):
    """A fit cannot start as asked (model directory in use, mismatched model or settings)."""


@dataclass(frozen=True)
class FitResult:
    """What a fit produced.

    Attributes:
        model: the model after the last M-step (``load_model`` prefers ``best`` when validating).
        model_dir: where the checkpoints are.
        state: how the fit ended: converged, at ``max_iter``, or stopped early.
        history: one record per iteration (including those before a resume).
        best_iteration: the iteration of the ``best`` checkpoint, or ``None`` without validation.
        warnings: degenerate-fit warnings of the final model.
        dashboard: the dashboard URL of a cluster that outlives the fit (a given client or scheduler), if it
            serves one; ``None`` for an embedded cluster, whose dashboard closed with it (its URL was said at
            the start).
        seconds: wall time of this call; ``first_iteration_seconds``: from the call to the end of the
            first iteration it ran (``None`` when it ran none).
        run_id: the 8 hex digits in this call's task keys, span names and checkpoint names (``None``
            when it ran nothing: the fit had already ended).
        heldout_rows: what the held-out rows were (the validation store, or the training store's
            hold-out), or ``None`` without any.
    """

    model: ResponsibilityAttentionDistribution
    model_dir: str
    state: FitState
    history: list[IterationRecord] = field(default_factory=list)
    best_iteration: int | None = None
    warnings: list[str] = field(default_factory=list)
    dashboard: str | None = None
    seconds: float = 0.0
    first_iteration_seconds: float | None = None
    run_id: str | None = None
    heldout_rows: str | None = None

    @property
    def iterations(self) -> int:
        return len(self.history)


def open_fit_store(
    store: str | os.PathLike[str] | StoreLocation | RowStore,
    storage_options: dict[str, Any] | None = None,
    window: int | None = None,
    min_context: int | None = None,
) -> RowStore:
    """:func:`~dist_respattn.store.open_store` for the engine's entry points (fit, evaluate, predict, retrain): a
    store already open with this ``window`` and ``min_context`` is used as it is, and a store the opener refuses
    (a ``ValueError``, e.g. a triple store asked for another N) is a :class:`FitError`."""
    if (
        isinstance(store, (TripleStore, TokenStreamStore))
        and (window is None or window == store.schema.context_length)
        and (min_context is None or isinstance(store, TripleStore) or min_context == store.min_context)
    ):
        return store
    try:
        return open_store(store, storage_options=storage_options, window=window, min_context=min_context)
    except ValueError as exc:
        raise FitError(str(exc)) from None


def _prior_text(buckets: PositionBuckets | None) -> str:
    return "free (per-position)" if buckets is None else f"tied over {buckets.describe()}"


def _shape(obj: Any) -> tuple[int, int, int, int]:
    schema = getattr(obj, "schema", None)
    if schema is not None:
        return (schema.num_symbols, schema.context_length, schema.query_dim, schema.num_targets)
    return (obj.num_symbols, obj.context_length, obj.query_dim, obj.num_targets)


def check_same_shape(model: ResponsibilityAttentionDistribution, what: str, store: RowStore) -> None:
    """Raise :class:`FitError` naming both shapes when ``model`` (described as ``what``) does not fit ``store``."""
    if _shape(model) != _shape(store):
        raise FitError(
            f"{what} has (S, N, D, T) = {_shape(model)} but the store {store.location} has {_shape(store)}: "
            "a model only fits stores of its own shape"
        )


def _starting_point(
    folder: ModelDir,
    *,
    resume: bool,
    overwrite: bool,
    settings: FitSettings,
    train: RowStore,
    init: ResponsibilityAttentionDistribution | None,
    init_from: str | os.PathLike[str] | None,
) -> tuple[Checkpoint | None, ResponsibilityAttentionDistribution | None, dict[str, Any]]:
    """Decide where the fit starts: ``(checkpoint to resume, starting model, init record)``."""
    if init is not None and init_from is not None:
        raise FitError("give either init (a model) or init_from (a model directory), not both")
    if folder.has_checkpoint():
        if resume:
            checkpoint = load_checkpoint(folder.path, LATEST)
            saved = FitSettings.from_json(checkpoint.meta.get("settings", {}))
            differences = saved.differences(settings, ignore=("max_iter",))
            if differences:
                raise FitError(
                    f"{folder}: cannot resume with other settings than the checkpoint's ({'; '.join(differences)}); "
                    "resume with the same settings, or start over with overwrite=True"
                )
            fingerprint = checkpoint.meta.get("store", {}).get("fingerprint")
            if fingerprint != train.fingerprint():
                raise FitError(
                    f"{folder}: the checkpoint was fitted on store {checkpoint.meta.get('store', {}).get('url')} "
                    f"with fingerprint {fingerprint}, but {train.location} has fingerprint {train.fingerprint()}; "
                    "resume on the same store, or start a new fit (warm-started with init_from=MODEL_DIR)"
                )
            check_same_shape(checkpoint.model, f"checkpoint {folder}", train)
            return checkpoint, checkpoint.model, checkpoint.meta.get("init", {})
        if not overwrite:
            raise FitError(
                f"{folder} already holds a fit; resume it (resume=True) or start over (overwrite=True), "
                "or choose another model directory"
            )
    elif resume:
        foreign = folder.foreign_entries()
        if foreign:
            # Resuming is asked for, and the directory holds something else: most likely the wrong directory.
            raise FitError(
                f"{folder}: no fit to resume (no latest.json) and it holds {', '.join(foreign[:3])}"
                f"{' ...' if len(foreign) > 3 else ''}: is this the model directory? A fit writes into an empty "
                "or new one"
            )
    if init_from is not None:
        warm = load_checkpoint(init_from)
        check_same_shape(warm.model, f"the model in {init_from}", train)
        # Same shape is not enough: the warm model's emission rows are indexed by its own store's ids.
        check_recorded_corpus(
            warm.meta.get("store"), train, reference_role=f"training store of {init_from}", other_role="store"
        )
        return None, warm.model, {"kind": "model", "source": str(init_from), "iteration": warm.iteration}
    if init is not None:
        check_same_shape(init, "the initial model", train)
        return None, init, {"kind": "given"}
    if settings.init == "random":
        return None, None, {"kind": "random", "seed": settings.seed}
    return None, None, {"kind": "uniform"}


def _holdout(
    settings: FitSettings, train: RowStore, heldout: RowStore | None, checkpoint: Checkpoint | None
) -> HoldoutRule | None:
    """The automatic hold-out of the training store: only without a validation store, and when there is a choice
    to make or an early-stopping metric asked for; a resumed fit keeps its own."""
    if checkpoint is not None:
        saved = checkpoint.meta.get("holdout")
        return HoldoutRule.from_json(saved) if saved else None
    if heldout is not None or settings.holdout_fraction <= 0.0:
        return None
    if settings.search() is None and settings.early_stop_metric is None:
        return None
    # Rows sorted by target: consecutive rows share a target, so hold out single rows, not stripes.
    by_target = train.attributes.get("row_order") == "target"
    return HoldoutRule.for_rows(train.num_rows, settings.holdout_fraction, stripes=not by_target)


def _support_pairs(model: ResponsibilityAttentionDistribution) -> int | None:
    """The number of pairs of a model's sparse emission (``None`` for a dense one)."""
    table = model.emission_table
    return table.support.num_pairs if isinstance(table, SparseEmission) else None


def _last_choice(checkpoint: Checkpoint | None) -> Hyperparameters | None:
    """The last choice a resumed fit made on held-out rows: its checkpoint's ``last_choice`` (which an
    iteration-0 checkpoint needs: it has no history), else, for older checkpoints, the history's last."""
    if checkpoint is None:
        return None
    saved = checkpoint.meta.get("last_choice")
    if saved:
        return Hyperparameters.from_json(saved)
    for entry in reversed(checkpoint.meta.get("history", [])):
        if entry.get("heldout") is not None and entry.get("hyperparameters"):
            return Hyperparameters.from_json(entry["hyperparameters"])
    return None


def _validation_store(
    validation: str | os.PathLike[str] | StoreLocation | RowStore | None,
    checkpoint: Checkpoint | None,
    storage_options: dict[str, Any] | None,
    window: int | None = None,
    min_context: int | None = None,
) -> RowStore | None:
    """The validation store: the one given, or on resume the checkpoint's (a different one is refused)."""
    saved = checkpoint.meta.get("validation") if checkpoint is not None else None
    heldout = open_fit_store(validation, storage_options, window, min_context) if validation is not None else None
    if saved is None:
        if heldout is not None and checkpoint is not None and checkpoint.iteration > 0:
            raise FitError("the fit being resumed ran without a validation store; resume it without one")
        if heldout is not None and checkpoint is not None and checkpoint.meta.get("holdout"):
            # Its prior was counted without the held-out rows, and its choices made on them.
            raise FitError(
                "the fit being resumed holds out part of its training store for its choices; resume it without a "
                "validation store, or start over (overwrite=True) to validate on one"
            )
        return heldout
    if heldout is None:
        heldout = open_fit_store(saved["url"], storage_options, saved.get("window") or window, min_context)
    if heldout.fingerprint() != saved.get("fingerprint"):
        raise FitError(
            f"the fit being resumed was validated on {saved['url']} (fingerprint {saved.get('fingerprint')}), "
            f"not on {heldout.location} (fingerprint {heldout.fingerprint()}); resume with the same validation store"
        )
    return heldout


def fit(
    store: str | os.PathLike[str] | StoreLocation | RowStore,
    *,
    model_dir: str | os.PathLike[str],
    settings: FitSettings | None = None,
    validation: str | os.PathLike[str] | StoreLocation | RowStore | None = None,
    init: ResponsibilityAttentionDistribution | None = None,
    init_from: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    client: distributed.Client | None = None,
    cluster: ClusterOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    say: Callable[[str], Any] | None = None,
    progress: bool | None = None,
    verbose: bool = False,
) -> FitResult:
    """Fit a head to ``store`` by exact EM on a Dask cluster, checkpointing into ``model_dir``.

    Args:
        store: the training triple store (path, URL, location or opened store).
        model_dir: a local directory for the checkpoints (``latest``, and ``best`` with validation).
        settings: the fit's settings (defaults: :class:`FitSettings`).
        validation: a store of the same shape and corpus (vocabulary, embeddings), scored after every
            M-step to make its choices and for early stopping. Without one, a deterministic hold-out of
            the training store (``settings.holdout_fraction``) plays that part.
        init: a starting model; ``init_from``: a model directory to warm-start from.
            Neither: the M-step of the start's responsibilities (``settings.init``: uniform, or random
            ones seeded by ``(settings.seed, partition)``).
        resume: continue the fit whose checkpoints are in ``model_dir`` (a new fit when there are none);
            the result is bit-identical to an uninterrupted fit.
        overwrite: start a new fit in a ``model_dir`` that already holds one.
        client: the cluster to run on; without one, ``cluster`` says how to reach or start one (see
            :func:`connect`).
        storage_options: fsspec options for store URLs.
        say: receives the progress lines (default: the ``dist_respattn.fit`` logger).
        progress: progress bars per pass (default: when stderr is a terminal).
        verbose: iteration lines with the mean joint log-likelihoods per row too (training and held-out).

    Raises:
        StoreError: a store is missing, incomplete or holds bad values (named by array and row).
        FitError: the model directory, starting model or settings do not fit the request.
        ClusterError / InsufficientMemoryError: no cluster, or not enough memory for this shape.
    """
    called = time.perf_counter()
    settings = settings or FitSettings()
    say = say if say is not None else logger.info
    train = open_fit_store(store, storage_options, settings.context_length)
    try:
        min_context = settings.min_context_for(train.schema.context_length)
        settings.buckets(train.schema.context_length)  # refuses a K that does not fit this window
    except ValueError as exc:
        raise FitError(str(exc)) from None
    train = open_fit_store(train, storage_options, None, min_context)
    if train.num_rows == 0:
        raise FitError(f"the store {train.location} has no rows: there is nothing to fit")
    folder = ModelDir(model_dir)
    folder.check_writable()
    checkpoint, start_model, init_record = _starting_point(
        folder, resume=resume, overwrite=overwrite, settings=settings, train=train, init=init, init_from=init_from
    )
    buckets = settings.buckets(train.schema.context_length)
    if start_model is not None and start_model.buckets != buckets:
        raise FitError(
            f"the starting model's position prior is {_prior_text(start_model.buckets)} but the fit asks for "
            f"{_prior_text(buckets)}: give --position-buckets to match it, or start from the data"
        )
    heldout = _validation_store(validation, checkpoint, storage_options, train.location.window, min_context)
    if heldout is not None and _shape(heldout) != _shape(train):
        raise FitError(
            f"the validation store {heldout.location} has (S, N, D, T) = {_shape(heldout)} but the training "
            f"store {train.location} has {_shape(train)}"
        )
    if heldout is not None:
        check_same_corpus(train, heldout, reference_role="training store", other_role="validation store")
    if resume and checkpoint is None:
        say(f"{folder}: no fit to resume there yet (no latest.json): starting a new fit")
    rule = _holdout(settings, train, heldout, checkpoint)
    # Counting reads no rows, but visits every row index: once.
    held_count = rule.count(train.num_rows) if rule is not None and checkpoint is None else 0
    if rule is not None and checkpoint is None and held_count == 0:
        rule = None  # a store too small for one stripe: nothing is held out, the choices keep their defaults
    if rule is not None:
        rows = RowSelection(rule, "heldout")
        held = HeldoutRows(train, train.fingerprint(), rows)
        train_rows = RowSelection(rule, "train")
    elif heldout is not None:
        held, train_rows = HeldoutRows(heldout, heldout.fingerprint(), ALL_ROWS), ALL_ROWS
    else:
        held, train_rows = None, ALL_ROWS
    metric = Metric(settings.early_stop_metric) if settings.early_stop_metric else None
    if metric is None and held is not None:
        metric = Metric.PERPLEXITY
    if metric is not None and held is None:
        raise FitError(f"early stopping on {metric} needs held-out rows: a validation store, or --holdout-fraction > 0")
    history = history_from_json(checkpoint.meta.get("history", [])) if checkpoint else []
    stopping = EarlyStopping(
        metric,
        settings.patience,
        checkpoint.meta.get("early_stopping") if checkpoint else None,
        min_improvement=settings.min_improvement,
    )
    if checkpoint is not None and (
        checkpoint.meta.get("state") in (FitState.CONVERGED, FitState.EARLY_STOPPED)
        or checkpoint.iteration >= settings.max_iter
    ):
        state = FitState(checkpoint.meta.get("state", FitState.MAX_ITER))
        say(f"{folder}: the fit already ended at iteration {checkpoint.iteration} ({state})")
        return FitResult(
            checkpoint.model, str(folder), state, history, stopping.best_iteration,
            checkpoint.meta.get("warnings", []), None, time.perf_counter() - called, None,
        )  # fmt: skip

    from dist_respattn import __version__

    block_rows = max(min(s.chunk_rows, s.num_rows) for s in (train, heldout) if s is not None)
    layout = settings.layout(train.schema)
    resumed_pairs = _support_pairs(checkpoint.model) if checkpoint is not None else None

    def plan(num_pairs: int | None, *, threads: int, worker_limit: int) -> None:
        estimate = estimate_memory(
            train.schema, block_rows=block_rows, threads_per_worker=threads, fan_in=settings.fan_in,
            layout=layout, num_pairs=num_pairs,
        )  # fmt: skip
        check_memory(estimate, worker_limit=worker_limit, shape=f"(S, N, D, T) = {_shape(train)}")

    embedded = starts_embedded_cluster(cluster, client)
    if embedded:
        # The workers' limit is known before they start: a plan they cannot hold is refused without a cluster.
        embedded_threads = cluster.threads_per_worker if cluster is not None else 1
        plan(resumed_pairs, threads=embedded_threads, worker_limit=embedded_worker_memory(cluster))

    with connect(cluster, client=client, say=say) as cl:
        try:
            cl.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
        except TimeoutError as exc:
            raise ClusterError(f"the cluster has no workers after {WORKER_WAIT_SECONDS:.0f} s") from exc
        info = cluster_info(cl)
        page = fit_page_url(cl)
        if page is not None:
            say(f"fit page: {page} (the fit's iterations in a browser, while its cluster runs)")
        if rule is not None and held is not None and checkpoint is None:
            say(
                f"no validation store: the hyperparameters are chosen on {held.description}, "
                f"{held_count:,} rows the fit does not train on (--validation to give one)"
            )
        threads = max(1, info.threads // max(1, info.workers))

        def check(num_pairs: int | None) -> None:
            plan(num_pairs, threads=threads, worker_limit=info.smallest_memory_limit)

        check(resumed_pairs)
        loop = FitLoop(
            cl,
            train=train,
            train_rows=train_rows,
            heldout=held,
            settings=settings,
            folder=folder,
            stopping=stopping,
            history=history,
            record={
                "store": store_record(train),
                "validation": store_record(heldout) if heldout is not None else None,
                "holdout": rule.to_json() if rule is not None else None,
                "init": init_record,
                "package_version": __version__,
            },
            prior=checkpoint.emission_prior() if checkpoint is not None else None,
            last_choice=_last_choice(checkpoint),
            resumed=checkpoint is not None,
            check_support=check,
            say=say,
            progress=progress,
            verbose=verbose,
            started=called,
        )
        result = loop.run(start_model, first_iteration=checkpoint.iteration + 1 if checkpoint else 1)
        # An embedded cluster's dashboard closes with it: only a cluster that outlives the fit has one to show.
        dashboard = None if embedded else info.dashboard
    final_state = FitState(history[-1]["state"]) if history else FitState.MAX_ITER
    return FitResult(
        model=result.distribution,
        model_dir=str(folder),
        state=final_state,
        history=history,
        best_iteration=stopping.best_iteration,
        warnings=history[-1]["warnings"] if history else [],
        dashboard=dashboard,
        seconds=time.perf_counter() - called,
        first_iteration_seconds=loop.first_iteration_seconds,
        run_id=loop.run_id,
        heldout_rows=held.description if held is not None else None,
    )
