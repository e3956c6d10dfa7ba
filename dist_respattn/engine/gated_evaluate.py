"""``evaluate`` of an attribute-gated head: perplexity per attribute beside the shared head and each attribute's own
Kneser-Ney bigram, document classification by attribute, and folding in attributes the head never saw.

Everything runs as passes on the cluster (:mod:`dist_respattn.engine.gated_tasks`); the driver receives sums per
attribute or per document, never rows. The shared head's own evaluation (its figures and the four corpus-wide
baselines, :func:`~dist_respattn.engine.evaluate.evaluate`) comes along in ``shared``.

Perplexities are of the targets given the context and the query, ``exp(-mean log p(t | c, q, a))``, as for a
plain head. Classification scores a document (a file of a ``--text`` store) by the sum of its rows' target
log-probabilities under each attribute, with a uniform prior over the attributes: the posterior is their
softmax and the prediction its arg-max. Folding in: for each attribute of the evaluated store that the head
lacks, EM on its weight vector alone (every other parameter fixed) over half of its rows (a deterministic
hold-out's training stripes), then the other half is scored.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable
from typing import Any

import distributed
import numpy as np

from dist_respattn.artifacts import CheckpointError, load_checkpoint
from dist_respattn.artifacts.gated_checkpoints import SHARED_DIR, GatedCheckpoint, load_gated
from dist_respattn.baselines.ngram import fit_baselines
from dist_respattn.engine import gated_tasks
from dist_respattn.engine.broadcast import ParameterBroadcast
from dist_respattn.engine.cluster import ClusterOptions, connect
from dist_respattn.engine.evaluate import _open_recorded, evaluate
from dist_respattn.engine.fit import FitError, open_fit_store
from dist_respattn.engine.gated_fit import attribute_map
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.progress import FitReporter
from dist_respattn.engine.tasks import ALL_ROWS, RowSelection
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.gated.head import GatedHead, fold_in_step
from dist_respattn.store.rows import RowStore

__all__ = ["FOLD_IN_FRACTION", "evaluate_gated", "shared_dir_of"]

#: The share of a new attribute's rows scored after folding in on the rest.
FOLD_IN_FRACTION = 0.5


def shared_dir_of(model_dir: str | os.PathLike[str], checkpoint: GatedCheckpoint) -> str:
    """The shared head's model directory: the one the fit recorded, else the model directory's ``shared/``."""
    recorded = (checkpoint.meta.get("shared") or {}).get("dir")
    # The model directory's own shared/ first: a recorded relative path would depend on the working directory.
    for candidate in (os.path.join(os.fspath(model_dir), SHARED_DIR), recorded):
        if candidate and os.path.isdir(candidate):
            return os.fspath(candidate)
    raise CheckpointError(f"{model_dir}: the shared head it started from ({recorded}) is gone")


def _ppl(log_lik: float, weight: float) -> float | None:
    return math.exp(-log_lik / weight) if weight > 0 else None


class _Passes:
    """The evaluation's passes on one cluster."""

    def __init__(self, client: distributed.Client, make_bar: Any) -> None:
        self.runner = PassRunner(client, uuid.uuid4().hex[:8], make_bar=make_bar)
        self.params = ParameterBroadcast(client, self.runner.run_tag, prefix="gated-eval")
        self.count = 0

    def run(
        self, store: RowStore, task: Callable[..., Any], args: Callable[[int], tuple[Any, ...]], what: str,
        *, head: bool = True,
    ) -> Any:  # fmt: skip
        """One pass; with ``head`` its ``args`` read ``self.params.current``, which a pass that lost it scatters
        again."""
        self.count += 1
        return self.runner.run(
            what.split()[0], str(self.count), store.num_partitions, task, args, description=f"{what} {store.location}",
            before_attempt=self.params.republish if head else None,
        )  # fmt: skip

    def scores(
        self, head: GatedHead, store: RowStore, rows: RowSelection, mapping: np.ndarray | None, what: str
    ) -> gated_tasks.AttributeScores:
        self.params.publish(head, f"score-{self.count}")
        fingerprint, n = store.fingerprint(), len(gated_tasks.attribute_names_of(store))
        return self.run(
            store, gated_tasks.gated_score_task,
            lambda part: (store.location, part, self.params.current, fingerprint, rows, n, mapping), f"scoring {what}",
        )  # fmt: skip

    def pairs(self, store: RowStore, rows: RowSelection) -> gated_tasks.AttributePairs:
        fingerprint, n = store.fingerprint(), len(gated_tasks.attribute_names_of(store))
        return self.run(
            store, gated_tasks.attribute_pairs_task, lambda part: (store.location, part, fingerprint, rows, n),
            "pairs of", head=False,
        )  # fmt: skip


def _kneser_ney_by_attribute(
    passes: _Passes, checkpoint: GatedCheckpoint, scored: RowStore, names: tuple[str, ...]
) -> list[float | None]:
    """Each scored attribute's interpolated Kneser-Ney bigram perplexity, trained on that attribute's training
    rows (the gated fit's, by name) and its discount tuned on the fit's held-out rows of the attribute."""
    train = _open_recorded(checkpoint.meta.get("store"), scored)
    if train is None:  # the training store moved or changed: no per-attribute baseline rather than a failure
        return [None] * len(names)
    holdout = checkpoint.meta.get("holdout")
    rule = HoldoutRule.from_json(holdout) if holdout else None
    train_pairs = passes.pairs(train, RowSelection(rule, "train") if rule else ALL_ROWS).pairs
    tune_pairs = passes.pairs(train, RowSelection(rule, "heldout")).pairs if rule else None
    scored_pairs = passes.pairs(scored, ALL_ROWS).pairs
    index = {name: i for i, name in enumerate(gated_tasks.attribute_names_of(train))}
    out: list[float | None] = []
    for a, name in enumerate(names):
        i = index.get(name)
        if i is None or train_pairs[i].num_pairs == 0 or scored_pairs[a].num_pairs == 0:
            out.append(None)
            continue
        baselines = fit_baselines(train_pairs[i], validation=tune_pairs[i] if tune_pairs else None)
        out.append(float(baselines.score_one("kneser_ney", scored_pairs[a]).perplexity))
    return out


def _classify(
    passes: _Passes, head: GatedHead, scored: RowStore, mapping: np.ndarray, names: tuple[str, ...],
    head_names: tuple[str, ...],
) -> tuple[float | None, int, list[dict[str, Any]]]:  # fmt: skip
    """Every document's posterior over the head's attributes, and the accuracy over the documents whose attribute
    the head knows."""
    if getattr(scored, "kind", None) != "stream":
        raise FitError(f"{scored.location}: --classify-attributes needs a token-stream store (its files are documents)")
    passes.params.publish(head, "classify")
    fingerprint = scored.fingerprint()
    candidates = np.arange(head.num_attributes, dtype=np.int64)
    docs: gated_tasks.DocumentScores = passes.run(
        scored, gated_tasks.classify_task,
        lambda part: (scored.location, part, passes.params.current, fingerprint, candidates),
        "classifying the documents of",
    )  # fmt: skip
    truth = mapping[docs.attribute]
    known = truth >= 0
    shifted = docs.log_lik - docs.log_lik.max(axis=1, keepdims=True)
    posterior = np.exp(shifted)
    posterior /= posterior.sum(axis=1, keepdims=True)
    predicted = np.argmax(docs.log_lik, axis=1)
    documents = []
    for k in range(docs.documents.shape[0]):
        top = np.argsort(-posterior[k], kind="stable")[:3]
        documents.append({
            "document": int(docs.documents[k]),
            "rows": int(docs.rows[k]),
            "attribute": names[int(docs.attribute[k])],
            "predicted": head_names[int(predicted[k])],
            "posterior_top": [[head_names[int(a)], round(float(posterior[k, a]), 6)] for a in top],
        })  # fmt: skip
    accuracy = float(np.mean(predicted[known] == truth[known])) if known.any() else None
    return accuracy, int(known.sum()), documents


def _fold_in(
    passes: _Passes, head: GatedHead, shared: GatedHead, scored: RowStore, names: tuple[str, ...],
    head_names: tuple[str, ...], iterations: int,
) -> dict[str, Any]:  # fmt: skip
    """Fold in every attribute of ``scored`` the head lacks (see the module); per attribute its weights and the
    held half's perplexity under them, under uniform weights and under the shared head."""
    new = [a for a, name in enumerate(names) if name not in head_names]
    if not new:
        return {}
    mapping = np.full(len(names), -1, dtype=np.int64)
    mapping[new] = np.arange(len(new))
    rule = HoldoutRule.for_rows(scored.num_rows, FOLD_IN_FRACTION)
    f = head.num_factors
    probe = head.with_weights(np.full((len(new), f), 1.0 / f))
    uniform = probe
    fingerprint = scored.fingerprint()
    folding = RowSelection(rule, "train")
    for step in range(int(iterations)):
        passes.params.publish(probe, f"fold-{step}")

        def args(part: int) -> tuple[Any, ...]:
            return (scored.location, part, passes.params.current, fingerprint, folding, False, mapping)

        stats = passes.run(scored, gated_tasks.gated_estep_task, args, f"folding in ({step + 1}/{iterations})")
        probe = fold_in_step(probe, stats.attribute_count, 0.0)
    held = RowSelection(rule, "heldout")
    folded = passes.scores(probe, scored, held, mapping, "the folded-in attributes of")
    flat = passes.scores(uniform, scored, held, mapping, "the attributes at uniform weights of")
    plain = passes.scores(shared, scored, held, np.zeros(len(names), dtype=np.int64), "the shared head on")
    out = {}
    for k, a in enumerate(new):
        out[names[a]] = {
            "rows_scored": float(folded.weight[a]),
            "weights": [round(float(v), 6) for v in probe.weights[k]],
            "perplexity": _ppl(folded.log_lik[a], folded.weight[a]),
            "perplexity_uniform_weights": _ppl(flat.log_lik[a], flat.weight[a]),
            "perplexity_shared": _ppl(plain.log_lik[a], plain.weight[a]),
        }
    return out


def evaluate_gated(
    model_dir: str | os.PathLike[str],
    store: Any,
    *,
    classify: bool = False,
    fold_in: bool = False,
    fold_in_iterations: int = 20,
    client: distributed.Client | None = None,
    cluster: ClusterOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    say: Callable[[str], Any] | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Score ``store`` with the gated head of ``model_dir`` (see the module); returns the JSON report:
    ``model`` (gated totals), ``shared`` (the shared head's evaluation with the corpus-wide baselines),
    ``by_attribute``, and with ``classify`` ``attribute_accuracy`` and ``documents``, with ``fold_in`` ``fold_in``."""
    checkpoint = load_gated(model_dir)
    head = checkpoint.head
    head_names = checkpoint.attribute_names
    shared_dir = shared_dir_of(model_dir, checkpoint)
    shared_model = load_checkpoint(shared_dir).model
    scored = open_fit_store(store, storage_options, head.context_length)
    names = gated_tasks.attribute_names_of(scored)
    mapping = attribute_map(names, head_names)
    shared_head = GatedHead.from_shared(shared_model, 1)
    with connect(cluster, client=client, say=say) as cl:
        shared_report = evaluate(shared_dir, scored, client=cl, say=say, progress=progress).to_json()
        passes = _Passes(cl, FitReporter(cl, say=say, bar=progress).make_bar)
        try:
            gated = passes.scores(head, scored, ALL_ROWS, mapping, "the gated head on")
            plain = passes.scores(shared_head, scored, ALL_ROWS, np.zeros(len(names), np.int64), "the shared head on")
            kneser_ney = _kneser_ney_by_attribute(passes, checkpoint, scored, names)
            report: dict[str, Any] = {}
            if classify:
                accuracy, known, documents = _classify(passes, head, scored, mapping, names, head_names)
                report.update(attribute_accuracy=accuracy, classified_documents=known, documents=documents)
            if fold_in:
                report["fold_in"] = _fold_in(passes, head, shared_head, scored, names, head_names, fold_in_iterations)
        finally:
            passes.params.release()
    by_attribute = {
        name: {
            "rows": float(plain.weight[a]),
            "perplexity": _ppl(gated.log_lik[a], gated.weight[a]),
            "perplexity_shared": _ppl(plain.log_lik[a], plain.weight[a]),
            "perplexity_kneser_ney": kneser_ney[a],
            "known": bool(mapping[a] >= 0),
        }
        for a, name in enumerate(names)
        if plain.weight[a] > 0  # a name the store keeps (--like) without rows of its own
    }
    seen = mapping >= 0
    return {
        "store": str(scored.location),
        "model_dir": os.fspath(model_dir),
        "kind": "gated",
        "factors": head.num_factors,
        "untied": head.fixed_weights,
        "model": {
            "perplexity": _ppl(float(gated.log_lik.sum()), float(gated.weight.sum())),
            "rows": float(gated.weight.sum()),
            "perplexity_shared_same_rows": _ppl(float(plain.log_lik[seen].sum()), float(plain.weight[seen].sum())),
        },
        "shared": shared_report,
        "by_attribute": by_attribute,
        **report,
    }
