"""``fit``: exact EM of any kind of head over a store on a Dask cluster, checkpointed after every M-step.

This module decides where a fit starts (the kind's own start, a given model, a warm start, the earlier stage of a
staged kind, or a resumed checkpoint), checks the stores, the model directory and the memory plan, and connects
to the cluster; :class:`~dist_respattn.engine.loop.FitLoop` then runs the iterations. Each one: the head is
scattered once; one task per partition reads its rows in blocks and gives the kind's statistics; a fixed tree of
combine tasks sums them on the workers; the driver receives one value, runs the kind's M-step, scores its
candidates on the held-out rows, and writes a checkpoint. The driver never reads a row.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import distributed
import numpy as np

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.artifacts.checkpoints import BEST, FIT_RECORD, LATEST, Checkpoint, CheckpointError, ModelDir
from dist_respattn.artifacts.model_dir_lock import held_lock_check, hold_model_dirs
from dist_respattn.engine.cluster import (
    ClusterError,
    ClusterOptions,
    cluster_info,
    connect,
    embedded_worker_memory,
    fit_page_url,
    refuse_a_worker_reimport,
    starts_embedded_cluster,
)
from dist_respattn.engine.loop import EarlyStopping, FitLoop, HeldoutRows, store_record
from dist_respattn.engine.memory import block_row_bytes, check_memory
from dist_respattn.engine.settings import FitSettings
from dist_respattn.engine.worker_tasks import ALL_ROWS, RowSelection, attribute_map, held_out_count
from dist_respattn.events import FitState, IterationRecord, Metric, history_from_json
from dist_respattn.model.caches import release_caches
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import (
    PREVIOUS_STAGE,
    Head,
    HeadSpec,
    Stage,
    Trainer,
    TrainerContext,
    spec_from_json,
)
from dist_respattn.store import (
    StoreLocation,
    TokenStreamStore,
    TripleStore,
    check_recorded_corpus,
    check_same_corpus,
    open_store,
)
from dist_respattn.store.rows import RowStore

__all__ = ["FitError", "FitResult", "check_same_shape", "fit", "open_fit_store", "stage_start"]

logger = logging.getLogger("dist_respattn.fit")

#: How long a fit waits for a cluster to have at least one worker.
WORKER_WAIT_SECONDS = 30.0


class FitError(ValueError):
    """A fit cannot start as asked (model directory in use, mismatched model or settings)."""


@dataclass(frozen=True)
class FitResult:
    """What a fit produced.

    Attributes:
        model: the head after the last M-step (``load_model`` prefers ``best`` when validating).
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
        stages: a staged kind's fits before this one, in order (``[]`` for a fit of one stage).
    """

    model: Head
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
    stages: list[FitResult] = field(default_factory=list)

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


def _no_rows(train: RowStore, min_context: int) -> str:
    """Why a store gives no row to fit: empty, or (a token-stream store) no document long enough for the window."""
    if isinstance(train, TokenStreamStore) and train.num_tokens > 0:
        starts = train.document_starts()
        longest = int(np.diff(np.append(starts, train.num_tokens)).max())
        window = train.schema.context_length
        flag = "--context" if min_context == window else "--min-context"
        fix = f": give {flag} {longest - 1} or less" if longest > 1 else ""
        return (
            f"the store {train.location} has no rows with a window of N = {window}: no document is long enough, as a "
            f"row needs {min_context:,} earlier tokens of its document ({flag}) and the longest document has "
            f"{longest:,} tokens{fix}"
        )
    return f"the store {train.location} has no rows: there is nothing to fit"


def _shape(obj: Any) -> tuple[int, int, int, int]:
    schema = getattr(obj, "schema", None)
    if schema is not None:
        return (schema.num_symbols, schema.context_length, schema.query_dim, schema.num_targets)
    return (obj.num_symbols, obj.context_length, obj.query_dim, obj.num_targets)


def _own_shape(store: RowStore) -> tuple[int, int, int, int]:
    """(S, N, D, T) as ``store`` was written: a token-stream store is opened with the window it is read with (the
    model's, the fit's), but records its own N, its writer's default."""
    found = _shape(store)
    if not isinstance(store, TokenStreamStore):
        return found
    return (found[0], int(store.recorded_window), found[2], found[3])


def _differ(a: tuple[int, ...], b: tuple[int, ...], names: str = "SNDT") -> str:
    """``S, D and T differ``: which of (S, N, D, T) differ between ``a`` and ``b``."""
    found = [name for name, x, y in zip(names, a, b, strict=True) if x != y]
    listed = found[0] if len(found) == 1 else f"{', '.join(found[:-1])} and {found[-1]}"
    return f"{listed} {'differs' if len(found) == 1 else 'differ'}"


def check_same_shape(model: Head, what: str, store: RowStore) -> None:
    """Raise :class:`FitError` naming both shapes when ``model`` (described as ``what``) does not fit ``store``.

    A token-stream store is named by the shape it was written with; the N it records is only its default window
    (it is read with any), so what is held against the model is its S, D and T and the window it is read with."""
    shape, found = _shape(model), _shape(store)
    if shape == found:
        return
    own = _own_shape(store)
    if not isinstance(store, TokenStreamStore):
        raise FitError(
            f"{what} has (S, N, D, T) = {shape} but the store {store.location} has {own}: "
            "a model only fits stores of its own shape"
        )
    mine, theirs = (shape[0], *shape[2:]), (found[0], *found[2:])
    clauses = (
        []
        if mine == theirs
        else [f"{_differ(mine, theirs, 'SDT')}, and a model only fits stores of its own S, D and T"]
    )
    if shape[1] != found[1]:
        clauses.append(f"the window N = {found[1]} is not the model's N = {shape[1]}")
    raise FitError(
        f"{what} has (S, N, D, T) = {shape} but the store {store.location} has {own} (its N = {own[1]} is only a "
        f"default: a token-stream store is read with any window, here N = {found[1]}): {'; '.join(clauses)}"
    )


#: Settings a resume may give other values: when to stop, and where the M-step runs (the same bits either way).
RESUME_MAY_CHANGE = ("max_iter", "m_step_shards")


def _saved_spec(checkpoint: Checkpoint, settings: FitSettings) -> HeadSpec:
    """The spec a checkpoint's fit ran with (a checkpoint older than recorded specs: a single-hop fit of its
    settings)."""
    recorded = checkpoint.meta.get("head")
    if recorded:
        return spec_from_json(recorded)
    return FitSettings.from_json(checkpoint.meta.get("settings", {})).head_spec()


@dataclass
class _Start:
    """Where a fit starts: the checkpoint it resumes, the head it starts from, the checkpoint that head came from
    (a warm start's or the earlier stage's), and what the checkpoints record of the start."""

    checkpoint: Checkpoint | None = None
    head: Head | None = None
    source: Checkpoint | None = None
    record: dict[str, Any] = field(default_factory=dict)


def _starting_point(
    folder: ModelDir,
    *,
    spec: HeadSpec,
    resume: bool,
    overwrite: bool,
    settings: FitSettings,
    train: RowStore,
    init: Head | None,
    init_from: str | os.PathLike[str] | None,
) -> _Start:
    """Decide where the fit starts."""
    if init is not None and init_from is not None:
        raise FitError("give either init (a model) or init_from (a model directory), not both")
    if folder.has_checkpoint():
        if resume:
            checkpoint = load_checkpoint(folder.path, LATEST)
            saved = FitSettings.from_json(checkpoint.meta.get("settings", {}))
            differences = saved.differences(settings, ignore=RESUME_MAY_CHANGE)
            differences += _saved_spec(checkpoint, settings).differences(spec)
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
            record = checkpoint.meta.get("init", {})
            source = None
            if spec.continues_from_init:
                source = _continued_source(folder, record)
            return _Start(checkpoint, checkpoint.model, source, record)
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
        check_same_shape(warm.model, f"the model of init_from {init_from}", train)
        # Same shape is not enough: the warm model's emission rows are indexed by its own store's ids.
        check_recorded_corpus(
            warm.meta.get("store"), train, reference_role=f"training store of init_from {init_from}",
            other_role="store", remedy=_OTHER_CORPUS_MODEL.format(option="init_from"),
        )  # fmt: skip
        record = {"kind": "model", "source": str(init_from), "iteration": warm.iteration}
        if spec.continues_from_init:
            # A resumed continuing fit reads its start again: from anywhere, and refused if that fit moved on.
            record.update(source=os.path.abspath(init_from), checkpoint=warm.name)
        return _Start(None, warm.model, warm, record)
    if spec.continues_from_init:
        raise FitError(f"a {spec.kind} fit starts from another fit: give init_from=MODEL_DIR")
    if init is not None:
        check_same_shape(init, "the initial model", train)
        return _Start(None, init, None, {"kind": "given"})
    init_kind = getattr(spec, "init", "uniform")
    if init_kind == "random":
        return _Start(None, None, None, {"kind": "random", "seed": settings.seed})
    return _Start(None, None, None, {"kind": init_kind})


#: What a fit given a model of another corpus to start from or build on says to do: the store is the fit's, the
#: model the stranger (writing the store again like the model's, as a store check says, would be backwards).
_OTHER_CORPUS_MODEL = "give {option} a model fitted on a store of this corpus (fit one on it first)"


def _load_sources(
    spec: HeadSpec, train: RowStore, fit_dir: str, fitted: dict[str, Head] | None = None
) -> tuple[Head, ...]:
    """The heads of the fitted models ``spec`` is made of (:meth:`HeadSpec.sources`; a relative path is under the
    fit's model directory ``fit_dir``: an earlier stage's), each checked to be of the training store's corpus; a
    missing one or one of another corpus is a :class:`FitError` naming its option. ``fitted``: the heads this call's
    earlier stages ended with, by their directory (absolute, normalized): fitted on this training store, they are
    used as they are rather than loaded again (one copy of each in the driver, not two)."""
    heads = []
    for option, named in spec.sources():
        path = named if os.path.isabs(named) else os.path.join(fit_dir, named)
        held = (fitted or {}).get(os.path.normpath(os.path.abspath(path)))
        if held is not None:
            folder = ModelDir(path)
            # The head the stage ended with is the one loading gives when no earlier checkpoint is its best.
            if folder.pointed(BEST) in (None, folder.pointed(LATEST)):
                heads.append(held)
                continue
        try:
            checkpoint = load_checkpoint(path)
        except (CheckpointError, OSError) as exc:
            raise FitError(f"{option} {path}: {exc}") from None
        try:
            check_recorded_corpus(
                checkpoint.meta.get("store"), train, reference_role=f"training store of {option} {path}",
                other_role="store", remedy=_OTHER_CORPUS_MODEL.format(option=option),
            )  # fmt: skip
        except ValueError as exc:
            raise FitError(f"{option} {path}: {exc}") from None
        heads.append(checkpoint.model)
    return tuple(heads)


def _continued_source(folder: ModelDir, record: dict[str, Any]) -> Checkpoint:
    """The fit a resumed continuing fit started from, as it was then (a moved one is refused: the fit's prior would
    change under it)."""
    source = record.get("source")
    if not source:
        raise FitError(f"{folder}: the fit records no fit it started from; start it over (overwrite=True)")
    checkpoint = load_checkpoint(source)
    if record.get("checkpoint") not in (None, checkpoint.name):
        raise FitError(
            f"{folder}: the fit in {source} is now {checkpoint.name}, but this fit started from "
            f"{record.get('checkpoint')}: its starting point would change under it; start over (overwrite=True)"
        )
    return checkpoint


def _holdout(
    settings: FitSettings,
    trainer: Trainer,
    train: RowStore,
    heldout: RowStore | None,
    checkpoint: Checkpoint | None,
    stream_rows: bool = False,
) -> HoldoutRule | None:
    """The automatic hold-out of the training store: only without a validation store, and when there is a choice
    to make or an early-stopping metric asked for; a resumed fit keeps its own. ``stream_rows``: this is a stage of
    a fit whose stages read a token stream at several windows (the recipe's conjunction head at N = 8, its other parts
    and their stack at the long one, with short histories), so its rows are numbered as the stream's: every stage
    holds out the same tokens, and a stage fitted on the held-out rows (the stack's gate) never reads a row a part was
    fitted on."""
    if checkpoint is not None:
        saved = checkpoint.meta.get("holdout")
        return HoldoutRule.from_json(saved) if saved else None
    if heldout is not None or settings.holdout_fraction <= 0.0:
        return None
    if not trainer.searches() and settings.early_stop_metric is None and not trainer.fits_heldout_rows():
        return None
    if stream_rows and isinstance(train, TokenStreamStore):
        return HoldoutRule.for_rows(train.num_stream_rows, settings.holdout_fraction, numbering="stream")
    # Rows sorted by target: consecutive rows share a target, so hold out single rows, not stripes.
    by_target = train.attributes.get("row_order") == "target"
    return HoldoutRule.for_rows(train.num_rows, settings.holdout_fraction, stripes=not by_target)


def _last_choice(checkpoint: Checkpoint | None, trainer: Trainer) -> Any:
    """The last choice a resumed fit made on held-out rows: its checkpoint's ``last_choice`` (which an
    iteration-0 checkpoint needs: it has no history), else, for older checkpoints, the history's last."""
    if checkpoint is None:
        return None
    saved = checkpoint.meta.get("last_choice")
    if saved:
        return trainer.choice_from_json(saved)
    for entry in reversed(checkpoint.meta.get("history", [])):
        if entry.get("heldout") is not None and entry.get("hyperparameters"):
            return trainer.choice_from_json(entry["hyperparameters"])
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


def _stage_settings(settings: FitSettings, stage: Stage) -> FitSettings:
    try:
        return dataclasses.replace(settings, **stage.settings) if stage.settings else settings
    except (TypeError, ValueError) as exc:
        raise FitError(str(exc)) from None


def fit(
    store: str | os.PathLike[str] | StoreLocation | RowStore,
    *,
    model_dir: str | os.PathLike[str],
    settings: FitSettings | None = None,
    head: HeadSpec | None = None,
    validation: str | os.PathLike[str] | StoreLocation | RowStore | None = None,
    init: Head | None = None,
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
        store: the training store (path, URL, location or opened store).
        model_dir: a local directory for the checkpoints (``latest``, and ``best`` with validation).
        settings: the fit's settings (defaults: :class:`FitSettings`): when to stop, the held-out rows, the
            combine tree and, for a single-hop head, the head's own.
        head: the kind of head and its settings (a :class:`~dist_respattn.model.heads.base.HeadSpec`); default:
            the single-hop head ``settings`` describe. A staged kind (an attribute-gated head fits a single-hop
            head first) fits each stage into its own directory under ``model_dir``, each from the one before.
        validation: a store of the same shape and corpus (vocabulary, embeddings), scored after every
            M-step to make its choices and for early stopping. Without one, a deterministic hold-out of
            the training store (``settings.holdout_fraction``) plays that part.
        init: a starting model; ``init_from``: a model directory to warm-start from.
            Neither: the kind's own start (a single-hop head: the M-step of uniform responsibilities, or of
            random ones seeded by ``(settings.seed, partition)``).
        resume: continue the fit whose checkpoints are in ``model_dir`` (a new fit when there are none);
            the result is bit-identical to an uninterrupted fit. The settings and ``head`` must be those the
            directory's ``fit.json`` records (written before the fit's first iteration; ``max_iter`` may grow), and
            its validation store and ``init_from`` are the recorded ones unless given.
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
        ModelDirLocked: another fit is writing ``model_dir`` (or one of its stages' directories), on this host or
            another sharing the directory: refused before the directory is read or written.
        ClusterError / InsufficientMemoryError: no cluster, or not enough memory for this shape.
    """
    # Before the model directory's lock: a worker importing a script without a main guard would find it held by the
    # script's own fit, and fail with that instead of what to fix.
    refuse_a_worker_reimport(cluster, client)
    if resume and overwrite:
        # Either would be obeyed by halves: a resume that keeps the old fit, or a new one that drops it unasked.
        raise FitError("resume=True continues the fit in model_dir and overwrite=True starts it over: give one")
    settings = settings or FitSettings()
    spec = head if head is not None else settings.head_spec()
    if spec.window_dependent:
        try:
            opened = open_fit_store(store, storage_options, settings.context_length)
            schema = opened.schema
            spec = spec.for_window(schema.context_length, num_targets=schema.num_targets, num_rows=opened.num_rows)
        except ValueError as exc:
            raise FitError(str(exc)) from None
    stages = spec.stages()
    # Held from before the directories are read until the fit returns, its stages' too (a fit given one of them
    # would prune this one's checkpoints there): a second fit, a resume or an overwrite, is refused at once.
    with hold_model_dirs([model_dir, *(_stage_dir(model_dir, stage) for stage in stages)]):
        if resume:
            validation, init_from = _check_recorded(ModelDir(model_dir), settings, spec, validation, init, init_from)
        if len(stages) > 1:
            # Refused before the first stage runs: a later one would find the store lacking only after it.
            opened = open_fit_store(store, storage_options, settings.context_length)
            _check_columns(opened, spec)
            _check_stage_windows(opened, spec, stages)

        record = _FitRecord(
            model_dir,
            {
                "head": spec.to_json(),
                "settings": settings.to_json(),
                "validation": _store_argument(validation),
                "init_from": None if init_from is None else os.path.abspath(init_from),
            },
            [_stage_dir(model_dir, stage) for stage in stages],
        )
        if len(stages) > 1 and init_from is not None:
            init_from = _first_stage_start(init_from, spec, stages)
        try:
            if len(stages) == 1:
                return _fit_stage(
                    store, model_dir=model_dir, settings=_stage_settings(settings, stages[0]), spec=stages[0].spec,
                    validation=validation, init=init, init_from=init_from, resume=resume, overwrite=overwrite,
                    client=client, cluster=cluster, storage_options=storage_options, say=say, progress=progress,
                    verbose=verbose, before_run=record.write,
                )  # fmt: skip
            return _fit_stages(
                store, stages, model_dir=model_dir, settings=settings, fit_head=spec.to_json(), validation=validation,
                init=init, init_from=init_from, resume=resume, overwrite=overwrite, client=client, cluster=cluster,
                storage_options=storage_options, say=say, progress=progress, verbose=verbose, before_run=record.write,
            )  # fmt: skip
        except Exception:
            # A fit that failed (not one interrupted: Ctrl-C leaves the record, as a kill does) before any checkpoint
            # leaves nothing behind: there is nothing to resume.
            record.withdraw()
            raise


class _FitRecord:
    """The ``fit.json`` of one call of :func:`fit`: written just before its first iteration (whichever stage that
    is in), so a kill at any moment leaves every stage's settings, a later stage's own included, for a resume;
    put back as it was when the call fails before it wrote any checkpoint (nothing of it to resume). A directory
    made for it is removed with the fit's lock, which made it (:func:`hold_model_dirs`)."""

    def __init__(self, model_dir: str | os.PathLike[str], record: dict[str, Any], stage_dirs: list[str]) -> None:
        self.folder = ModelDir(model_dir)
        self.record = record
        self.stage_dirs = stage_dirs
        self.written = False
        self.previous: dict[str, Any] | None = None
        self.pointers: list[str | None] = []

    def latest_checkpoints(self) -> list[str | None]:
        """The checkpoint each stage's ``latest`` names (a damaged pointer counts as none)."""
        names: list[str | None] = []
        for directory in self.stage_dirs:
            try:
                names.append(ModelDir(directory).pointed(LATEST))
            except CheckpointError:
                names.append(None)
        return names

    def write(self) -> None:
        if self.written:
            return
        try:
            self.previous = self.folder.fit_record()
        except CheckpointError:  # a damaged record of no fit (a resume refuses one first): replaced
            self.previous = None
        self.pointers = self.latest_checkpoints()
        self.folder.write_fit_record(self.record)
        self.written = True

    def withdraw(self) -> None:
        if not self.written or self.latest_checkpoints() != self.pointers:
            return
        if self.previous is not None:
            self.folder.write_fit_record(self.previous)
        else:
            (self.folder.path / FIT_RECORD).unlink(missing_ok=True)


def _store_argument(store: str | os.PathLike[str] | StoreLocation | RowStore | None) -> str | None:
    """A store argument as the fit record keeps it: its URL, or its absolute path (``None`` without one)."""
    if store is None:
        return None
    if isinstance(store, (TripleStore, TokenStreamStore)):
        text = str(store.location)
    else:
        text = str(store) if isinstance(store, StoreLocation) else os.fspath(store)
    # A resume may run from another working directory.
    return text if "://" in text else os.path.abspath(text)


def _check_recorded(
    folder: ModelDir,
    settings: FitSettings,
    spec: HeadSpec,
    validation: str | os.PathLike[str] | StoreLocation | RowStore | None,
    init: Head | None,
    init_from: str | os.PathLike[str] | None,
) -> tuple[str | os.PathLike[str] | StoreLocation | RowStore | None, str | os.PathLike[str] | None]:
    """A resumed fit against what its model directory records it was asked (``fit.json``): other settings are
    refused (``max_iter`` may grow, as on any resume), and the validation store and warm start it was given are
    its own unless given again (another warm start is refused, as another validation store is). Returns
    ``(validation, init_from)``; a directory without a record (no fit started there, or one older than the record)
    leaves them as given."""
    try:
        recorded = folder.fit_record()
    except CheckpointError as exc:
        raise FitError(str(exc)) from None
    if recorded is None:
        return validation, init_from
    saved = FitSettings.from_json(recorded["settings"])
    recorded_kind = (recorded.get("head") or {}).get("kind")
    if recorded_kind is not None and recorded_kind != spec.kind:
        # Said alone: every setting of one kind differs from the other's, and a list of them hides the cause.
        raise FitError(
            f"{folder}: holds a fit of a {recorded_kind} head, which cannot be resumed as a {spec.kind} head; resume "
            "it as its own kind, or start over with overwrite=True"
        )
    differences = saved.differences(settings, ignore=RESUME_MAY_CHANGE)
    if recorded.get("head"):
        differences += spec_from_json(recorded["head"]).differences(spec)
    # A setting both the fit and its head record (the seed) is said once.
    differences = list(dict.fromkeys(differences))
    if differences:
        raise FitError(
            f"{folder}: cannot resume with other settings than the fit's ({'; '.join(differences)}); "
            "resume with the same settings, or start over with overwrite=True"
        )
    if validation is None:
        validation = recorded.get("validation")
    started = recorded.get("init_from")
    if init_from is not None and (started is None or os.path.abspath(init_from) != started):
        # A resume continues from its checkpoint: a warm start given now would be dropped without a word.
        begun = f"from {started}" if started is not None else "without init_from"
        raise FitError(
            f"{folder}: the fit being resumed was started {begun}, not from {os.path.abspath(init_from)}; resume it "
            "without init_from, or start over (overwrite=True) from the new one"
        )
    if init_from is None and init is None:
        init_from = started
    return validation, init_from


def _check_columns(train: RowStore, spec: HeadSpec) -> None:
    """Raise :class:`FitError` naming the ingest options when the store lacks a column a fit of ``spec`` reads, or
    naming the setting when the store's attributes make it meaningless (:meth:`HeadSpec.check_attributes`)."""
    wanted = spec.columns
    if wanted.attributes and not getattr(train, "attribute_names", None):
        raise FitError(
            f"the store {train.location} has no attribute per row; a {spec.kind} head needs one: ingest it with "
            "--attribute-by {file,directory} (text) or --attributes A.npy (tokens, arrays)"
        )
    try:
        spec.check_attributes(tuple(getattr(train, "attribute_names", None) or ()) or None)
    except ValueError as error:
        raise FitError(f"{train.location}: {error}") from None


def _check_stage_windows(train: RowStore, spec: HeadSpec, stages: list[Stage]) -> None:
    """Raise :class:`FitError` when a stage reads the store at a window other than a triple store's own, whose rows
    are written with theirs: said before the first stage, not after those before it (the recipe's repeat gate reads
    the whole document)."""
    if isinstance(train, TokenStreamStore):
        return
    n = train.schema.context_length
    other = [
        f"N = {int(stage.settings['context_length']):,} (its {stage.spec.kind} stage)"
        for stage in stages
        if stage.settings.get("context_length") not in (None, n)
    ]
    if other:
        raise FitError(
            f"{train.location}: a {spec.kind} fit reads its store at {', '.join(other)} too, but a triple store's "
            f"window is fixed (N = {n}): write the corpus as a token-stream store (split or ingest with --format "
            "stream), or fit one kind on this one (--head single, copy or conj)"
        )


def _stage_dir(model_dir: str | os.PathLike[str], stage: Stage) -> str:
    return os.fspath(model_dir) if stage.directory == "." else os.path.join(os.fspath(model_dir), stage.directory)


def _fit_stages(
    store: Any, stages: list[Stage], *, model_dir: Any, settings: FitSettings, fit_head: dict[str, Any], **options: Any
) -> FitResult:
    """The stages of a staged kind, in order, on one cluster: each stage in its directory, from the stage before.

    Resuming continues the first stage not yet ended; a stage whose successor has started is not continued (more
    iterations would move the successor's starting point under it). A warm start from a head of the staged kind
    starts each earlier stage from that head's own (:meth:`~dist_respattn.model.heads.base.Head.stage_heads`); the
    later stages start from the stage before, as always.
    """
    resume, overwrite = options.pop("resume"), options.pop("overwrite")
    init, init_from, validation = options.pop("init"), options.pop("init_from"), options.pop("validation")
    client, cluster, say = options.pop("client"), options.pop("cluster"), options.pop("say")
    directories = [_stage_dir(model_dir, stage) for stage in stages]
    started = [ModelDir(d).has_checkpoint() for d in directories]
    done: list[FitResult] = []
    if not resume and not overwrite:
        # Refused before any stage runs: a later stage would otherwise find its directory taken after the first.
        for directory in directories:
            if ModelDir(directory).has_checkpoint():
                raise FitError(
                    f"{directory} already holds a fit; resume it (resume=True) or start over (overwrite=True), "
                    "or choose another model directory"
                )
    elif resume:
        # The stages' own directories are the fit's; anything else in them means the wrong directory was given.
        nested = {os.path.normpath(stage.directory).split(os.sep)[0] for stage in stages if stage.directory != "."}
        for directory in directories:
            foreign = [entry for entry in ModelDir(directory).foreign_entries() if entry not in nested]
            if foreign and not ModelDir(directory).has_checkpoint():
                raise FitError(
                    f"{directory}: no fit to resume (no latest.json) and it holds {', '.join(foreign[:3])}"
                    f"{' ...' if len(foreign) > 3 else ''}: is this the model directory? A fit writes into an empty "
                    "or new one"
                )
    # The stages run on a client of the cluster connected here, so each thinks the cluster outlives it.
    embedded = starts_embedded_cluster(cluster, client)
    fitted: dict[str, Head] = {}
    # Stages that read the store at other windows than the first's hold out the same tokens (see _holdout).
    stream_rows = any(key in stage.settings for stage in stages for key in ("context_length", "min_context"))
    with connect(cluster, client=client, say=say or logger.info) as cl:
        for index, stage in enumerate(stages):
            later_started = resume and any(started[index + 1 :])
            if later_started:
                done.append(_kept_stage(directories[index]))
                fitted[os.path.normpath(os.path.abspath(directories[index]))] = done[-1].model
                continue
            first = index == 0
            if say is not None and len(stages) > 1:
                # The stages' iteration lines look alike: each block is headed by what it fits and where.
                window = stage.settings.get("context_length")
                say(
                    f"stage {index + 1} of {len(stages)}: {stage.spec.kind}"
                    f"{f', N = {window}' if window else ''} -> {directories[index]}"
                )
            start = init
            if init is not None and init.kind != stage.spec.kind:
                start = init.stage_heads().get(stage.directory)
            result = _fit_stage(
                store, model_dir=directories[index], settings=_stage_settings(settings, stage), spec=stage.spec,
                validation=validation if first or not stage.spec.continues_from_init else None,
                init=start if first else None,
                init_from=init_from if first else stage_start(stages, directories, index),
                fit_dir=model_dir,
                stream_rows=stream_rows,
                fit_head=fit_head if stage.directory == "." else None,
                # A later stage not yet started (the fit stopped between stages) starts; its directory holds the
                # earlier stages' own, which is not a sign of the wrong directory.
                resume=resume and (first or ModelDir(directories[index]).has_checkpoint()), overwrite=overwrite,
                client=cl, cluster=None, say=say, fitted=fitted, **options,
            )  # fmt: skip
            # An embedded cluster's dashboard closes with it: no stage has one to show.
            done.append(dataclasses.replace(result, dashboard=None) if embedded else result)
            # What the stage's passes built from its head (kernel tables, scoring caches) is not kept with it.
            release_caches(result.model)
            fitted[os.path.normpath(os.path.abspath(directories[index]))] = result.model
    last = done[-1]
    return dataclasses.replace(last, stages=done[:-1])


def _first_stage_start(init_from: str | os.PathLike[str], spec: HeadSpec, stages: list[Stage]) -> str:
    """Where a staged fit warm-started from ``init_from`` starts its first stage: from the first stage of the fit
    in ``init_from`` when that is a staged fit of the same kind (retraining a recipe retrains each of its parts from
    its own), else from ``init_from`` itself."""
    try:
        recorded = ModelDir(init_from).fit_record()
    except CheckpointError:
        recorded = None
    first = os.path.join(os.fspath(init_from), stages[0].directory)
    if recorded and (recorded.get("head") or {}).get("kind") == spec.kind and ModelDir(first).has_checkpoint():
        return first
    return os.fspath(init_from)


def stage_start(stages: list[Stage], directories: list[str], index: int) -> str | None:
    """The model directory a later stage starts from (:attr:`Stage.start_from`), or ``None``: its own start."""
    wanted = stages[index].start_from
    if wanted is None:
        return None
    if wanted == PREVIOUS_STAGE:
        return directories[index - 1]
    earlier = [i for i, stage in enumerate(stages[:index]) if stage.directory == wanted]
    if not earlier:
        raise FitError(f"stage {stages[index].directory!r} starts from {wanted!r}, which is no earlier stage")
    return directories[earlier[0]]


def _kept_stage(directory: str) -> FitResult:
    """A stage a resumed staged fit does not continue, as its checkpoints record it (nothing runs)."""
    checkpoint = load_checkpoint(directory, LATEST)
    meta = checkpoint.meta
    return FitResult(
        checkpoint.model, directory, FitState(meta.get("state", FitState.MAX_ITER)),
        history_from_json(meta.get("history", [])), (meta.get("early_stopping") or {}).get("best_iteration"),
        list(meta.get("warnings", [])),
    )  # fmt: skip


def _fit_stage(
    store: str | os.PathLike[str] | StoreLocation | RowStore,
    *,
    model_dir: str | os.PathLike[str],
    settings: FitSettings,
    spec: HeadSpec,
    validation: str | os.PathLike[str] | StoreLocation | RowStore | None,
    init: Head | None,
    init_from: str | os.PathLike[str] | None,
    resume: bool,
    overwrite: bool,
    client: distributed.Client | None,
    cluster: ClusterOptions | None,
    storage_options: dict[str, Any] | None,
    say: Callable[[str], Any] | None,
    progress: bool | None,
    verbose: bool,
    before_run: Callable[[], None] | None = None,
    fit_dir: str | os.PathLike[str] | None = None,
    fit_head: dict[str, Any] | None = None,
    fitted: dict[str, Head] | None = None,
    stream_rows: bool = False,
) -> FitResult:
    """One fit of one kind (see :func:`fit`); ``before_run`` is called just before its first iteration (not when
    the fit had already ended). ``stream_rows``: a hold-out of the training store numbers a token stream's rows as
    the stream's (:func:`_holdout`). ``fit_dir``: the whole fit's model directory when this is one of its stages;
    ``fit_head``: the whole staged fit's spec (JSON), recorded in the checkpoints of the stage that is the directory's
    own model, so a registry version of it is retrained as that kind. ``fitted``: the heads of the earlier stages
    of this call, by directory (:func:`_load_sources`)."""
    called = time.perf_counter()
    say = say if say is not None else logger.info
    train = open_fit_store(store, storage_options, settings.context_length)
    try:
        min_context = settings.min_context_for(train.schema.context_length, short_histories=spec.short_histories)
        settings.buckets(train.schema.context_length)  # refuses a K that does not fit this window
    except ValueError as exc:
        raise FitError(str(exc)) from None
    train = open_fit_store(train, storage_options, None, min_context)
    if train.num_rows == 0:
        raise FitError(_no_rows(train, min_context))
    # Its pointers move only while this fit still holds the directory's lock (see fit).
    folder = ModelDir(model_dir, guard=held_lock_check(model_dir))
    folder.check_writable()
    start = _starting_point(
        folder, spec=spec, resume=resume, overwrite=overwrite, settings=settings, train=train, init=init,
        init_from=init_from,
    )  # fmt: skip
    checkpoint = start.checkpoint
    source = start.source
    # A resumed fit's checkpoint holds the heads it is made of: their directories may be gone by now.
    fit_root = os.path.abspath(fit_dir if fit_dir is not None else model_dir)
    sources = _load_sources(spec, train, fit_root, fitted) if checkpoint is None else ()
    names = train.attribute_names if hasattr(train, "attribute_names") else None
    context = TrainerContext(
        _shape(train),
        tuple(names) if names else None,
        source.model if source is not None else start.head if checkpoint is None else None,
        dict(source.meta) if source is not None else {},
        dict(source.arrays) if source is not None else {},
        dict(checkpoint.meta) if checkpoint is not None else {},
        dict(checkpoint.arrays) if checkpoint is not None else {},
        sources,
    )
    try:
        trainer = spec.trainer(context)
        if start.head is not None:
            trainer.check_start(start.head, resumed=checkpoint is not None)
    except ValueError as exc:
        raise FitError(str(exc)) from None
    if spec.continues_from_init:
        # A continuing fit keeps the held-out and training rows of the fit it starts from.
        assert source is not None
        heldout, rule = _continued_heldout(source, train, storage_options, min_context)
    else:
        heldout = _validation_store(validation, checkpoint, storage_options, train.location.window, min_context)
        rule = _holdout(settings, trainer, train, heldout, checkpoint, stream_rows)
    if heldout is not None and _shape(heldout) != _shape(train):
        streams = isinstance(heldout, TokenStreamStore) and isinstance(train, TokenStreamStore)
        raise FitError(
            f"the validation store {heldout.location} has (S, N, D, T) = {_own_shape(heldout)} but the training "
            f"store {train.location} has {_own_shape(train)}"
            + (
                f": {_differ(_shape(heldout), _shape(train))} (a token-stream store's own N does not matter: both "
                f"are read with the window N = {train.schema.context_length})"
                if streams
                else ""
            )
        )
    if heldout is not None:
        check_same_corpus(train, heldout, reference_role="training store", other_role="validation store")
        if heldout.num_rows == 0:  # else its scores fail deep in the first held-out pass, the store unnamed
            raise FitError(
                f"the validation store {heldout.location} has no rows to score: give --validation a store with rows, "
                "or leave it out (the choices are then made on holdout_fraction of the training rows)"
            )
    if resume and checkpoint is None:
        say(f"{folder}: no fit to resume there yet (no latest.json): starting a new fit")
    # Counting reads no rows, but visits every row index: once.
    fresh = checkpoint is None and not spec.continues_from_init
    held_count = held_out_count(rule, train) if rule is not None and fresh else 0
    if rule is not None and fresh and held_count == 0:
        rule = None  # a store too small for one stripe: nothing is held out, the choices keep their defaults
    trained_names = trainer.attribute_names()
    train_map = attribute_map(context.attribute_names, trained_names)
    if rule is not None:
        held = HeldoutRows(train, train.fingerprint(), RowSelection(rule, "heldout"), train_map)
        train_rows = RowSelection(rule, "train")
    elif heldout is not None:
        held_names = getattr(heldout, "attribute_names", None)
        mapping = attribute_map(tuple(held_names) if held_names else None, trained_names)
        held, train_rows = HeldoutRows(heldout, heldout.fingerprint(), ALL_ROWS, mapping), ALL_ROWS
    else:
        held, train_rows = None, ALL_ROWS
    # A kind fitted on held-out rows (a stack's gate) runs its E-steps over them, when there are any; its checkpoints
    # still record the training store, whose corpus and rows its components were fitted on.
    estep_store, estep_rows, estep_map = train, train_rows, train_map
    if held is not None and trainer.fits_heldout_rows():
        estep_store, estep_rows, estep_map = held.store, held.rows, held.mapping
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
        _restore_best(folder, checkpoint)
        say(f"{folder}: the fit already ended at iteration {checkpoint.iteration} ({state})")
        # The report still names the rows its held-out figures are of (a hold-out of the training store is no
        # validation store).
        return FitResult(
            checkpoint.model, str(folder), state, history, stopping.best_iteration,
            checkpoint.meta.get("warnings", []), None, time.perf_counter() - called, None,
            heldout_rows=held.description if held is not None else None,
        )  # fmt: skip

    from dist_respattn import __version__

    block_rows = max(min(s.chunk_rows, s.num_rows) for s in (train, heldout) if s is not None)
    shape_text = f"(S, N, D, T) = {_shape(train)}"

    # What a task holds per row depends on how the trainer reads it: token windows of a stream store make no
    # (n, N) context, so a long window costs nothing per row.
    row_bytes = max(block_row_bytes(s, trainer.columns) for s in (train, heldout) if s is not None)

    def plan(*, threads: int, worker_limit: int) -> None:
        estimate = trainer.memory(
            block_rows=block_rows, row_bytes=row_bytes, threads_per_worker=threads, fan_in=settings.fan_in
        )
        if estimate is not None:
            check_memory(estimate, worker_limit=worker_limit, shape=shape_text)

    embedded = starts_embedded_cluster(cluster, client)
    if embedded:
        # The workers' limit is known before they start: a plan they cannot hold is refused without a cluster.
        embedded_threads = cluster.threads_per_worker if cluster is not None else 1
        plan(threads=embedded_threads, worker_limit=embedded_worker_memory(cluster))

    with connect(cluster, client=client, say=say) as cl:
        try:
            cl.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
        except TimeoutError as exc:
            raise ClusterError(f"the cluster has no workers after {WORKER_WAIT_SECONDS:.0f} s") from exc
        info = cluster_info(cl)
        page = fit_page_url(cl)
        if page is not None:
            say(f"fit page: {page} (the fit's iterations in a browser, while its cluster runs)")
        if rule is not None and held is not None and fresh and trainer.fits_heldout_rows():
            say(
                f"no validation store: the fit runs on {held.description}, {held_count:,} rows (--validation to "
                "give one: rows the models it is made of were not fitted on)"
            )
        elif rule is not None and held is not None and fresh:
            say(
                f"no validation store: the hyperparameters are chosen on {held.description}, "
                f"{held_count:,} rows the fit does not train on (--validation to give one)"
            )
        threads = max(1, info.threads // max(1, info.workers))

        def plan_now() -> None:
            plan(threads=threads, worker_limit=info.smallest_memory_limit)

        plan_now()
        loop = FitLoop(
            cl,
            train=estep_store,
            train_rows=estep_rows,
            train_map=estep_map,
            heldout=held,
            settings=settings,
            spec=spec,
            trainer=trainer,
            folder=folder,
            stopping=stopping,
            history=history,
            record={
                "store": store_record(train),
                "validation": store_record(heldout) if heldout is not None else None,
                "holdout": rule.to_json() if rule is not None else None,
                "init": start.record,
                "package_version": __version__,
                **({"fit_head": fit_head} if fit_head is not None else {}),
            },
            last_choice=_last_choice(checkpoint, trainer),
            resumed=checkpoint is not None,
            shard_bounds=(checkpoint.meta.get("parts") or {}).get("bounds") if checkpoint is not None else None,
            plan_memory=plan_now,
            say=say,
            progress=progress,
            verbose=verbose,
            started=called,
        )
        if before_run is not None:
            before_run()
        if checkpoint is not None:
            _restore_best(folder, checkpoint)
        result = loop.run(start.head, first_iteration=checkpoint.iteration + 1 if checkpoint else 1)
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


def _restore_best(folder: ModelDir, checkpoint: Checkpoint) -> None:
    """Point ``best`` where the early-stopping state of ``checkpoint`` (the one ``latest`` names) says it is, when it
    does not: a fit killed between a checkpoint's ``latest`` and ``best`` pointers leaves ``best`` behind (or none),
    and a resume must end with the ``best`` the uninterrupted fit has (what ``load_model`` and a later stage
    read)."""
    state = checkpoint.meta.get("early_stopping") or {}
    name = state.get("best_checkpoint")
    if not name or not (folder.path / name).is_dir():
        return
    try:
        if folder.pointed(BEST) == name:
            return
    except CheckpointError:
        pass  # a damaged pointer: replaced
    folder.point(BEST, name, iteration=state.get("best_iteration"), metric=state.get("metric"), value=state.get("best"))


def _continued_heldout(
    source: Checkpoint, train: RowStore, storage_options: dict[str, Any] | None, min_context: int | None
) -> tuple[RowStore | None, HoldoutRule | None]:
    """The held-out rows of the fit a continuing fit starts from: its hold-out of the training store, else its
    validation store; it must have had one (the continuing fit stops early and keeps its best iteration by them)."""
    if (source.meta.get("store") or {}).get("fingerprint") not in (None, train.fingerprint()):
        raise FitError(f"the fit in {source.name} was fitted on another store than {train.location}")
    holdout = source.meta.get("holdout")
    if holdout:
        return None, HoldoutRule.from_json(holdout)
    record = source.meta.get("validation") or {}
    if not record.get("url"):
        raise FitError(
            "the fit this one starts from had no held-out rows (no --validation, --holdout-fraction 0): it needs them "
            "to stop early and keep its best iteration"
        )
    return open_fit_store(
        record["url"], storage_options, record.get("window"), record.get("min_context") or min_context
    ), None
