"""``evaluate``: how well a head scores a store, next to unigram and bigram baselines, computed on the cluster.

The head's figures: mean joint log-likelihood per row, and the predictive quality of the targets
from ``predict_proba`` (which does not see the target): perplexity and accuracy. The baselines
predict the same targets from counts: a unigram, and for stores made from a token stream an add-k
bigram on the previous token (the last context id). Their counts come from the model's training
store when the model directory names one that opens unchanged (same fingerprint), else from the
evaluated store itself (in-sample, which flatters them).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import distributed
import numpy as np

from dist_respattn.engine import tasks
from dist_respattn.engine.broadcast import ParameterBroadcast
from dist_respattn.engine.checkpoint import load_checkpoint
from dist_respattn.engine.cluster import connect
from dist_respattn.engine.fit import FitError, check_same_shape, open_store
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.progress import FitReporter
from dist_respattn.model.diagnostics import degeneracy_warnings
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.scoring import ScoreTotals
from dist_respattn.store import StoreError, StoreLocation, TripleStore

__all__ = ["DEFAULT_BASELINE_K", "Evaluation", "baseline_metrics", "evaluate", "score_store"]

#: Add-k smoothing of the baselines' counts.
DEFAULT_BASELINE_K = 0.1

#: Store sources whose rows are windows of a token stream, so the last context id is the previous token.
TOKEN_SOURCES = ("tokens", "text")


@dataclass(frozen=True)
class Evaluation:
    """A head's scores on a store and the baselines' scores on the same targets.

    Attributes:
        store: the evaluated store's URL; ``rows`` its rows; ``weight`` the total row weight.
        model: ``mean_log_likelihood``, ``target_log_prob``, ``perplexity``, ``accuracy``.
        baselines: ``{"unigram": {...}, "bigram": {...}}`` with the predictive figures.
        baseline_counts_from: the store the baseline counts came from, and whether that is in-sample.
        warnings: degenerate-fit warnings about the head.
    """

    store: str
    rows: int
    weight: float
    model: dict[str, float]
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    baseline_counts_from: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "rows": self.rows,
            "weight": self.weight,
            "model": self.model,
            "baselines": self.baselines,
            "baseline_counts_from": self.baseline_counts_from,
            "warnings": self.warnings,
        }

    def summary(self) -> str:
        """A small table: one row for the head and one per baseline."""
        header = f"{'':<10} {'log-lik/row':>12} {'perplexity':>12} {'accuracy':>9}"
        lines = [f"{self.store}: {self.rows:,} rows", header]
        lines.append(
            f"{'head':<10} {self.model['mean_log_likelihood']:>12.4f} {self.model['perplexity']:>12.4f} "
            f"{self.model['accuracy']:>9.2%}"
        )
        for name, figures in self.baselines.items():
            lines.append(f"{name:<10} {'':>12} {figures['perplexity']:>12.4f} {figures['accuracy']:>9.2%}")
        if self.baselines:
            source = self.baseline_counts_from
            lines.append(
                f"baseline counts from {source.get('store')}"
                + (" (the evaluated store itself: in-sample)" if source.get("in_sample") else "")
            )
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def baseline_metrics(
    train: tasks.TargetCounts, scored: tasks.TargetCounts, *, k: float = DEFAULT_BASELINE_K
) -> dict[str, dict[str, float]]:
    """Predictive figures of the add-k unigram (and bigram) fitted on ``train`` counts, on ``scored`` counts.

    Shapes: unigram counts (T,); bigram counts (S, T) by previous token.
    """
    total = float(scored.unigram.sum())
    out: dict[str, dict[str, float]] = {}
    if total <= 0.0:
        return out
    num_targets = train.unigram.shape[0]
    unigram = (train.unigram + k) / (train.unigram.sum() + num_targets * k)
    out["unigram"] = _figures(float(scored.unigram @ np.log(unigram)), float(scored.unigram[np.argmax(unigram)]), total)
    if train.bigram is not None and scored.bigram is not None:
        bigram = (train.bigram + k) / (train.bigram.sum(axis=1, keepdims=True) + num_targets * k)
        guess = np.argmax(bigram, axis=1)
        correct = float(scored.bigram[np.arange(bigram.shape[0]), guess].sum())
        out["bigram"] = _figures(float(np.sum(scored.bigram * np.log(bigram))), correct, total)
    return out


def _figures(log_prob: float, correct: float, total: float) -> dict[str, float]:
    mean = log_prob / total
    return {
        "target_log_prob": mean,
        "perplexity": math.exp(-mean) if mean > -700.0 else float("inf"),
        "accuracy": correct / total,
    }


def _training_store(meta: dict[str, Any], scored: TripleStore) -> TripleStore | None:
    """The model's training store when it still opens as fitted (same fingerprint), has the scored store's S and T,
    and is another store than the scored one."""
    record = meta.get("store") or {}
    url = record.get("url")
    if not url or url == str(scored.location):
        return None
    try:
        store = TripleStore.open(url)
    except (StoreError, OSError, ValueError):
        return None
    if store.fingerprint() != record.get("fingerprint"):  # rewritten or appended to since the fit
        return None

    def ids(s: TripleStore) -> tuple[int, int]:
        return (s.schema.num_symbols, s.schema.num_targets)

    return store if ids(store) == ids(scored) else None


def score_store(runner: PassRunner, model: ResponsibilityAttentionDistribution, store: TripleStore) -> ScoreTotals:
    """``model``'s totals over every row of ``store``: one pass of scoring tasks and their combine tree."""
    params = ParameterBroadcast(runner.client, runner.run_tag)
    params.publish(model, "evaluate")
    fingerprint = store.fingerprint()
    try:
        return runner.run(
            "evaluate", "0", store.num_partitions, tasks.score_task,
            lambda part: (store.location, part, params.current, fingerprint), description=f"scoring {store.location}",
        )  # fmt: skip
    finally:
        params.release()


def evaluate(
    model: ResponsibilityAttentionDistribution | str | os.PathLike[str],
    store: str | os.PathLike[str] | StoreLocation | TripleStore,
    *,
    baseline_k: float = DEFAULT_BASELINE_K,
    client: distributed.Client | None = None,
    scheduler: str | None = None,
    n_workers: int | None = None,
    memory_limit: str | int = "auto",
    security: distributed.Security | None = None,
    storage_options: dict[str, Any] | None = None,
    say: Callable[[str], Any] | None = None,
    progress: bool | None = None,
) -> Evaluation:
    """Score ``store`` with ``model`` (a head, or a model directory: its ``best``, else ``latest``) on a cluster."""
    scored = open_store(store, storage_options)
    meta: dict[str, Any] = {}
    if isinstance(model, ResponsibilityAttentionDistribution):
        head = model
    else:
        checkpoint = load_checkpoint(model)
        head, meta = checkpoint.model, checkpoint.meta
    check_same_shape(head, "the model", scored)
    if scored.num_rows == 0:
        raise FitError(f"the store {scored.location} has no rows to evaluate")
    bigram = scored.provenance.get("source") in TOKEN_SOURCES
    baseline_store = _training_store(meta, scored) or scored
    run_id = uuid.uuid4().hex[:8]
    with connect(
        scheduler, client=client, n_workers=n_workers, memory_limit=memory_limit, security=security, say=say
    ) as cl:
        reporter = FitReporter(cl, say=say, bar=progress)
        runner = PassRunner(cl, run_id, make_bar=reporter.make_bar)
        totals = score_store(runner, head, scored)
        fingerprint = scored.fingerprint()
        counts = runner.run(
            "counts", "0", scored.num_partitions, tasks.count_targets_task,
            lambda part: (scored.location, part, fingerprint, bigram), description="counting targets",
        )  # fmt: skip
        if baseline_store is scored:
            train_counts = counts
        else:
            base_fingerprint = baseline_store.fingerprint()
            train_counts = runner.run(
                "counts", "1", baseline_store.num_partitions, tasks.count_targets_task,
                lambda part: (baseline_store.location, part, base_fingerprint, bigram),
                description="counting training targets",
            )  # fmt: skip
    settings = meta.get("settings") or {}
    warnings = list(meta.get("warnings") or []) or degeneracy_warnings(
        head, min_sigma2=settings.get("min_sigma2") if settings.get("estimate_sigma2") else None
    )
    return Evaluation(
        store=str(scored.location),
        rows=scored.num_rows,
        weight=totals.weight,
        model=totals.metrics(),
        baselines=baseline_metrics(train_counts, counts, k=baseline_k),
        baseline_counts_from={"store": str(baseline_store.location), "in_sample": baseline_store is scored},
        warnings=warnings,
    )
