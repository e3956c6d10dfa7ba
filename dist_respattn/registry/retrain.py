"""``retrain``: warm-start from the registry's latest version, fit, gate on held-out scores, publish.

One run, under the registry's lock:

1. load ``latest`` (if any) and warm-start the fit from it;
2. fit on the training store (checkpoints in a work directory), validating after every iteration;
3. score the fitted model (its ``best`` checkpoint with validation) and the current version on the
   same store, the validation store, else the training store (marked in-sample), each as ``evaluate`` scores it
   (its own window on a token stream) and both on the same rows;
4. publish a new version only when the candidate is not worse than the current version by more
   than ``tolerance`` (relative) on the gate metric; otherwise leave ``latest`` where it was.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import distributed

from dist_respattn.artifacts import DEFAULT_STALE_AFTER, Registry, RegistryError, hold_model_dirs
from dist_respattn.engine import (
    Checkpoint,
    ClusterOptions,
    FitSettings,
    ModelDir,
    connect,
    fit,
    load_checkpoint,
    open_fit_store,
    refuse_a_worker_reimport,
    score,
    scored_store,
    store_record,
)
from dist_respattn.events import Metric
from dist_respattn.model.heads.base import HeadSpec, spec_from_json
from dist_respattn.store import TokenStreamStore, check_model_corpus, check_recorded_corpus
from dist_respattn.store.rows import RowStore

__all__ = [
    "DEFAULT_TOLERANCE",
    "GATE_METRICS",
    "WORK_DIR_MARK",
    "GateDecision",
    "RetrainResult",
    "claim_work_dir",
    "gate",
    "retrain",
]

logger = logging.getLogger("dist_respattn.retrain")

#: The gate lets a candidate be worse than the current version by at most this fraction.
DEFAULT_TOLERANCE = 0.01

#: Gate metrics: held-out perplexity of the targets (lower is better) or mean log-likelihood (higher).
GATE_METRICS = tuple(metric.value for metric in Metric)


@dataclass(frozen=True)
class GateDecision:
    """The quality gate's comparison of the candidate with the current version on one store."""

    metric: Metric
    candidate: float
    current: float | None
    tolerance: float
    passed: bool
    store: str
    in_sample: bool

    @property
    def limit(self) -> float | None:
        """The worst value the candidate could have had and still passed."""
        if self.current is None:
            return None
        if self.metric.lower_is_better:
            return self.current * (1.0 + self.tolerance)
        return self.current - self.tolerance * abs(self.current)

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "candidate": self.candidate,
            "current": self.current,
            "tolerance": self.tolerance,
            "limit": self.limit,
            "passed": self.passed,
            "store": self.store,
            "in_sample": self.in_sample,
        }

    def describe(self) -> str:
        if self.current is None:
            return f"{self.metric} {self.candidate:.6g}: the registry's first version, nothing to compare with"
        verdict = "passed" if self.passed else "failed"
        direction = "at most" if self.metric.lower_is_better else "at least"
        return (
            f"gate {verdict}: {self.metric} {self.candidate:.6g} against the current version's {self.current:.6g} "
            f"({direction} {self.limit:.6g} allowed at tolerance {self.tolerance:g}) on {self.store}"
            + (" (in-sample: no validation store)" if self.in_sample else "")
        )


def gate(
    metric: Metric | str, candidate: float, current: float | None, tolerance: float, *, store: str, in_sample: bool
) -> GateDecision:
    """Decide whether ``candidate`` may replace ``current`` (``None``: there is no current version)."""
    if metric not in GATE_METRICS:
        raise ValueError(f"gate metric {metric!r}: expected one of {', '.join(GATE_METRICS)}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance = {tolerance}: expected a fraction >= 0")
    metric = Metric(metric)
    decision = GateDecision(metric, candidate, current, tolerance, True, store, in_sample)
    limit = decision.limit
    if limit is not None:
        better_or_equal = candidate <= limit if metric.lower_is_better else candidate >= limit
        decision = GateDecision(metric, candidate, current, tolerance, bool(better_or_equal), store, in_sample)
    return decision


@dataclass(frozen=True)
class RetrainResult:
    """What a retraining run did.

    Attributes:
        published: whether a new version was published.
        version: the new version's number (``None`` when nothing was published).
        previous: the version ``latest`` named before the run (``None`` for an empty registry).
        gate: the gate's decision.
        fit: the fit's state, iterations, best iteration and seconds.
        pruned: versions removed by ``keep``.
        registry: the registry's URL.
    """

    published: bool
    version: int | None
    previous: int | None
    gate: GateDecision
    fit: dict[str, Any]
    registry: str
    pruned: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_status(self) -> int:
        """0 when published, 1 when the gate kept the current version."""
        return 0 if self.published else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "version": self.version,
            "previous": self.previous,
            "gate": self.gate.to_json(),
            "fit": self.fit,
            "registry": self.registry,
            "pruned": self.pruned,
            "seconds": round(self.seconds, 3),
            "exit_status": self.exit_status,
        }


#: The file that marks a directory as retrain's own work directory: its ``model/`` is retrain's to replace.
WORK_DIR_MARK = "retrain-work-dir.json"


def claim_work_dir(work_dir: Path) -> None:
    """Make ``work_dir`` retrain's work directory, refusing one whose ``model/`` holds a fit retrain did not write.

    Each run replaces ``work_dir/model`` (scheduled retrains reuse one work directory), so a directory is marked
    the first time retrain uses it; a ``model/`` with files in a directory without the mark is someone's fit,
    and is never overwritten.

    Raises:
        ValueError: ``work_dir/model`` holds files and ``work_dir`` is not marked.
    """
    mark, model = work_dir / WORK_DIR_MARK, work_dir / "model"
    if not mark.is_file() and model.is_dir() and any(model.iterdir()):
        raise ValueError(
            f"--work-dir {work_dir}: {model} holds a fit that retrain did not write, and retrain replaces it; "
            "pass an empty or new --work-dir, or one an earlier retrain used"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    if not mark.is_file():
        mark.write_text(json.dumps({"written_by": "dist-respattn retrain", "replaces": "model/"}) + "\n")


def _fitted_kind(version: Checkpoint) -> str:
    """The kind ``version`` was fitted as: a staged fit's whole kind (a recipe's), else its head's."""
    recorded = version.meta.get("fit_head") or version.meta.get("head") or {}
    return str(recorded.get("kind") or version.model.kind)


def _gate_stores(
    store: RowStore, candidate: Checkpoint, current: Checkpoint | None, storage_options: dict[str, Any] | None
) -> tuple[RowStore, RowStore | None, str | None]:
    """``store`` opened for the candidate and for the current version (``None``: none yet) as ``evaluate`` opens it
    for each, and why they score different rows when they do (``None``: the same rows).

    On a token stream each model reads its own window N, and the rows of a model that reads token windows start at
    the short histories its fit trained on, those of a model of fixed windows at N earlier tokens: both are then read
    from the most earlier tokens either starts at, so the two are scored on the same targets. A triple store's rows
    are every model's.
    """
    new = scored_store(candidate.model, candidate.meta, store.location, storage_options)
    if current is None:
        return new, None, None
    old = scored_store(current.model, current.meta, store.location, storage_options)
    if not (isinstance(new, TokenStreamStore) and isinstance(old, TokenStreamStore)):
        return new, old, None
    fewest = max(new.min_context, old.min_context)
    # A stream's rows have at most N earlier tokens: a window shorter than the other model's whole one keeps its own.
    new, old = (
        s if fewest > s.schema.context_length else s.with_context(s.schema.context_length, fewest) for s in (new, old)
    )
    if new.num_rows == old.num_rows:
        return new, old, None
    short = min(new.schema.context_length, old.schema.context_length)
    why = (
        f"the new model and the current version are scored on different rows of {store.location}: {new.num_rows:,} "
        f"and {old.num_rows:,} (rows of at least {fewest} earlier tokens cannot be read with a window of N = {short})"
    )
    return new, old, why


def _recorded_spec(version: Any, settings: FitSettings) -> HeadSpec:
    """What a retrain fits: the version's kind with its recorded settings, or (a head of the kind ``settings``
    describe, or no version yet) the head ``settings`` describe, so the options given apply."""
    # A staged fit's model (a recipe's stack) records the whole fit's spec beside its own stage's: retrain that.
    meta = version.meta if version is not None else {}
    recorded = meta.get("fit_head") or meta.get("head") or {}
    default = settings.head_spec()
    if recorded and recorded.get("kind") != default.kind:
        return spec_from_json(recorded)
    return default


def _start(settings: FitSettings) -> str:
    return f"random start, seed {settings.seed}" if settings.init == "random" else "uniform start"


def _check_corpus(record: dict[str, Any], train: RowStore, heldout: RowStore | None) -> None:
    """Refuse stores whose vocabulary or embedding table differs from the latest version's training store:
    warm-starting a head on ids that mean other tokens would fit nonsense, and the gate would compare it."""
    trained_on = (record.get("provenance") or {}).get("store")
    check_model_corpus(trained_on, train)
    if heldout is not None:
        check_recorded_corpus(
            trained_on, heldout, reference_role="the model's training store", other_role="validation store"
        )


def retrain(
    registry: str | os.PathLike[str],
    store: str | os.PathLike[str],
    *,
    validation: str | os.PathLike[str] | None = None,
    settings: FitSettings | None = None,
    head: HeadSpec | None = None,
    first_head: HeadSpec | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    gate_metric: Metric | str | None = None,
    keep: int | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    stale_after: float = DEFAULT_STALE_AFTER,
    client: distributed.Client | None = None,
    cluster: ClusterOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    say: Callable[[str], Any] | None = None,
    progress: bool | None = None,
) -> RetrainResult:
    """Retrain from the registry's latest version and publish the result if it passes the gate.

    Args:
        registry: the registry (local directory or fsspec URL; created on first publish).
        store: the training store.
        validation: the store both models are scored on for the gate (without one, the training store,
            marked in-sample): each as ``evaluate`` scores it (on a token stream, with its own window), both on the
            same rows.
        settings: the fit's settings. ``gate_metric`` defaults to ``settings.early_stop_metric``, else
            perplexity; ``tolerance`` is the relative slack of the gate.
        head: the kind of head and its settings; default: the latest version's kind as it was fitted (a single-hop
            head: the one ``settings`` describe). A fit of the kind the latest version was fitted as is warm-started
            from it (a staged kind's earlier stages from its own, e.g. a gated head's shared head); a ``head`` of
            another kind starts from the data, and is gated against that version all the same.
        first_head: what a registry with no version yet gets when ``head`` is ``None`` (default: the single-hop
            head ``settings`` describe; the command line gives the recipe on a token-stream store, as ``fit`` does).
        keep: after publishing, keep only this many newest versions.
        work_dir: where the fit's checkpoints go (kept); default a temporary directory, removed after.
        stale_after: seconds without a heartbeat after which another run's lock counts as abandoned.
        client: as for :func:`~dist_respattn.engine.fit.fit`, and so are the four below.
        cluster: where an embedded cluster runs when no ``client`` is given.
        storage_options: fsspec options for the stores and the registry.
        say: where progress lines go (default: this module's logger).
        progress: draw progress bars (default: when stderr is a terminal).

    Raises:
        RegistryLocked: another run holds the registry.
        ModelDirLocked: another fit is writing ``work_dir``'s model (another retrain given the same ``work_dir``).
        RegistryError / StoreError / FitError / ClusterError: as their messages say; nothing is published.
    """
    started = time.perf_counter()
    settings = settings or FitSettings()
    say = say if say is not None else logger.info
    chosen = gate_metric or (Metric.LOGLIK if settings.early_stop_metric == Metric.LOGLIK else Metric.PERPLEXITY)
    metric = gate(chosen, 0.0, None, tolerance, store="", in_sample=False).metric  # checked before any work
    if keep is not None and keep < 1:
        raise ValueError(f"keep = {keep}: expected at least 1")
    refuse_a_worker_reimport(cluster, client)  # before the registry's lock, which a script's own run holds (see fit)
    reg = Registry(str(registry), storage_options)
    reg.check_format()
    train = open_fit_store(store, storage_options, settings.context_length)
    heldout = open_fit_store(validation, storage_options, train.location.window) if validation is not None else None
    if work_dir is not None:
        claim_work_dir(Path(work_dir))
    scratch = None if work_dir is not None else Path(tempfile.mkdtemp(prefix="respattn-retrain-"))
    model_dir = Path(work_dir or scratch or ".") / "model"
    try:
        # The work directory's model is held from before the registry is touched until its checkpoint is read for
        # publishing: no fit (another retrain sharing --work-dir) replaces it in between.
        held = hold_model_dirs([model_dir], purpose="retrain", advice="wait for it to end, or give another --work-dir")
        with held, reg.lock(stale_after=stale_after) as lock:
            reg.remove_orphans(lock)  # what a killed run left: an unclaimed version's files, temporary files
            unusable = reg.missing_latest()
            if unusable is not None:  # a fresh fit published past versions nobody compared it with: no gate
                raise RegistryError(f"{unusable}; retrain refuses to publish without a latest version to gate against")
            current = reg.latest()
            # Its record is read only once it checks out (load verifies it, and its files).
            loaded = reg.load(current.number) if current is not None else None
            if current is not None:
                _check_corpus(current.record, train, heldout)
            spec = head or (first_head if loaded is None and first_head is not None else None)
            spec = spec or _recorded_spec(loaded, settings)
            warm = loaded.model if loaded is not None else None
            if current is None:
                say(f"{reg}: no published version yet; a fresh fit ({_start(settings)})")
            elif loaded is not None and spec.kind != _fitted_kind(loaded):
                # Another kind than the version's (``head`` picked it): a head of another kind is in general no start
                # for this fit (a recipe's repeat gate reads whole documents, a single head N tokens), so it starts
                # from the data; the gate still compares it with the version.
                warm = None
                say(
                    f"{reg}: version {current.number} is a {_fitted_kind(loaded)} fit and this one a {spec.kind} fit: "
                    f"a fresh fit ({_start(settings)}), gated against version {current.number}"
                )
            else:
                say(f"{reg}: warm start from version {current.number}")
            with connect(cluster, client=client, say=say) as cl:
                fitted = fit(
                    train, model_dir=model_dir, settings=settings, head=spec, validation=heldout, init=warm,
                    overwrite=True, client=cl, storage_options=storage_options, say=say, progress=progress,
                )  # fmt: skip
                candidate = load_checkpoint(model_dir)  # best with validation, else latest
                gate_store = heldout if heldout is not None else train
                # Both by the pass evaluate runs, each read as evaluate reads the store for it: through the training
                # store's window the current version scored other rows and windows than evaluate gives it (a
                # recipe's repeat gate reads whole documents, short histories too), and the fit's own held-out
                # figures are its stage's. Each pass has its own run tag, so their keys never meet.
                new_rows, old_rows, unlike = _gate_stores(gate_store, candidate, loaded, storage_options)
                if unlike is not None:
                    say(f"warning: {unlike}")
                scores = score(candidate.model, new_rows, client=cl)
                current_scores = (
                    score(loaded.model, old_rows, client=cl) if loaded is not None and old_rows is not None else None
                )
            decision = gate(
                metric,
                metric.of(scores),
                metric.of(current_scores) if current_scores is not None else None,
                tolerance,
                store=str(gate_store.location),
                in_sample=heldout is None,
            )
            say(decision.describe())
            fit_summary = {
                "state": fitted.state,
                "iterations": fitted.iterations,
                "best_iteration": fitted.best_iteration,
                "checkpoint_iteration": candidate.iteration,
                "seconds": round(fitted.seconds, 3),
                "run_id": fitted.run_id,
            }
            previous = current.number if current is not None else None
            if not decision.passed:
                say(f"{reg}: not published; latest stays at version {previous}")
                return RetrainResult(
                    False, None, previous, decision, fit_summary, str(reg), [], time.perf_counter() - started
                )
            files = ModelDir(model_dir).read_files(candidate.name)
            record = {
                "metrics": {"gate_store": str(gate_store.location), **scores},
                "previous_metrics": current_scores,
                "gate": decision.to_json(),
                "provenance": {
                    "store": store_record(train),
                    "validation": store_record(heldout) if heldout is not None else None,
                    "iterations": fitted.iterations,
                    "fit": fit_summary,
                    "settings": settings.to_json(),
                    "warm_start_from": previous,
                    "package_version": candidate.meta.get("package_version"),
                    "host": platform.node(),
                },
            }
            version = reg.publish(lock, files.params, files.meta, record)
            say(f"{reg}: published version {version.number}")
            pruned = reg.prune(lock, keep) if keep is not None else []
            if pruned:
                what = "version" if len(pruned) == 1 else "versions"
                say(f"{reg}: pruned {what} {', '.join(map(str, pruned))} (keeping {keep})")
            return RetrainResult(
                True, version.number, previous, decision, fit_summary, str(reg), pruned, time.perf_counter() - started
            )
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
