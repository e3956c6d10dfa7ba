"""What ``evaluate`` says of a gated head beyond its overall scores: perplexity per attribute beside the shared head
and each attribute's own Kneser-Ney bigram, document classification by attribute, and folding in attributes the head
never saw; every figure a pass over the cluster (the driver receives sums per attribute or per document, never rows).

Perplexities are of the targets given the context and the query, ``exp(-mean log p(t | c, q, a))``, as for a plain
head. Classification scores a document (a file of a token-stream store) by the sum of its rows' target
log-probabilities under each attribute, with a uniform prior over the attributes: the posterior is their softmax and
the prediction its arg-max. Folding in: for each attribute of the evaluated store that the head lacks, EM on its
weight vector alone (every other parameter fixed) over half of its rows (a deterministic hold-out's training
stripes), then the other half is scored.

The passes of a report read blocks whose ``attribute`` column holds the store's own ids, named by
``passes.attribute_names(over)`` (:class:`ReportPasses`): the report matches them to the head's names itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import Block, BlockPass, Columns, Passes
from dist_respattn.model.heads.gated.head import (
    GatedHead,
    GatedStatistics,
    fold_in_step,
    gated_estep,
    gated_log_likelihood,
)

__all__ = [
    "FOLD_IN_FRACTION",
    "AttributePairs",
    "AttributeScores",
    "DocumentScores",
    "ReportPasses",
    "attribute_map",
    "attribute_pairs_partition",
    "attribute_scores_partition",
    "classify_partition",
    "fold_in_partition",
    "gated_report",
    "report_lines",
]

#: The share of a new attribute's rows scored after folding in on the rest.
FOLD_IN_FRACTION = 0.5


class ReportPasses(Passes, Protocol):
    """The passes a gated report runs: :class:`~dist_respattn.model.heads.base.Passes` whose blocks carry the store's
    own attribute ids, and what it needs to know of the stores.

    ``over``: ``"train"`` the evaluated store (every row, its own weights); ``"training_store"`` the store the head
    was fitted on (its training rows); ``"heldout"`` that store's held-out rows (its hold-out side). ``run`` returns
    ``None`` (or raises ``LookupError``) when those rows cannot be read: a training store that moved or changed, a fit
    without a hold-out of its training store.
    """

    def attribute_names(self, over: str) -> tuple[str, ...]:
        """The names of the store's attributes (its ids are their positions)."""

    def num_rows(self, over: str) -> int:
        """The store's row count (the fold-in's hold-out stripes are cut by it)."""

    def baseline(self, name: str, train: Any, validation: Any, scored: Any) -> dict[str, Any]:
        """The n-gram baseline ``name`` (``"kneser_ney"``...) fitted on the (symbol, target) pair counts ``train``,
        tuned on ``validation`` (or stated defaults for ``None``), scored on ``scored``: its JSON figures
        (``perplexity``...). The engine's baselines, so the model layer needs none of its own."""


def attribute_map(names: tuple[str, ...], head_names: tuple[str, ...]) -> np.ndarray:
    """(len(names),) int64: each store attribute's id in the head (by name), ``-1`` for one the head lacks."""
    index = {name: i for i, name in enumerate(head_names)}
    return np.array([index.get(name, -1) for name in names], dtype=np.int64)


def _ppl(log_lik: float, weight: float) -> float | None:
    return math.exp(-log_lik / weight) if weight > 0 else None


def _mapped(
    attribute: np.ndarray, weights: np.ndarray | None, mapping: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The head's ids of store ids ``attribute`` under ``mapping`` (``-1``: a row that does not count, weight 0)."""
    if mapping is None:
        return attribute, weights
    mapped = mapping[attribute]
    keep = mapped >= 0
    w = np.where(keep, 1.0 if weights is None else np.asarray(weights, dtype=np.float64), 0.0)
    return np.where(keep, mapped, 0), w


def _selected(block: Block, rule: HoldoutRule | None, side: str) -> np.ndarray | None:
    """A block's weights on one side of ``rule`` (``None``: the block's own)."""
    if rule is None:
        return block.weights
    train, heldout = rule.split_weights(block.start, block.num_rows, block.weights)
    return train if side == "train" else heldout


def _store_ids(block: Block) -> np.ndarray:
    if block.attribute is None:
        raise ValueError("a gated report reads each row's attribute: the block carries none")
    return np.asarray(block.attribute, dtype=np.int64)


# ------------------------------------------------------------------------------------------ scores


@dataclass(frozen=True)
class AttributeScores:
    """Totals per store attribute: ``log_lik`` (A,) the summed row target log-probabilities, ``weight`` (A,)."""

    log_lik: np.ndarray
    weight: np.ndarray

    def __add__(self, other: AttributeScores) -> AttributeScores:
        return AttributeScores(self.log_lik + other.log_lik, self.weight + other.weight)


def attribute_scores_partition(
    scorers: tuple[tuple[GatedHead, np.ndarray], ...],
    num_attributes: int,
    rule: HoldoutRule | None,
    side: str,
    blocks: Iterator[Block],
) -> tuple[AttributeScores, ...]:
    """For each ``(head, mapping)`` of ``scorers``: each selected row's ``log p(target | context, query, a)`` under the
    head, summed per store attribute (``num_attributes``); ``mapping`` gives the head's id of each store attribute,
    ``-1`` for rows not scored (the shared head is scored as a gated head of one factor, every row as attribute 0)."""
    totals = [[np.zeros(num_attributes), np.zeros(num_attributes)] for _ in scorers]
    for block in blocks:
        attribute = _store_ids(block)
        weights = _selected(block, rule, side)
        for (head, mapping), total in zip(scorers, totals, strict=True):
            own, w = _mapped(attribute, np.ones(block.num_rows) if weights is None else weights, mapping)
            lines = gated_log_likelihood(head, block.rows.encoded, own, given_query=True, values_checked=block.checked)
            assert w is not None
            live = w > 0
            total[0] += np.bincount(attribute[live], weights=w[live] * lines[live], minlength=num_attributes)
            total[1] += np.bincount(attribute[live], weights=w[live], minlength=num_attributes)
    return tuple(AttributeScores(log_lik, weight) for log_lik, weight in totals)


@dataclass(frozen=True)
class _Summed:
    """A tuple of additive values, added element by element (a pass's value of several scorers)."""

    values: tuple[Any, ...]

    def __add__(self, other: _Summed) -> _Summed:
        return _Summed(tuple(a + b for a, b in zip(self.values, other.values, strict=True)))


def _scores_pass(*args: Any) -> _Summed:
    return _Summed(attribute_scores_partition(*args))


# ------------------------------------------------------------------------------------------ documents


@dataclass(frozen=True)
class DocumentScores:
    """Per document: ``documents`` (k,) ids, ``log_lik`` (k, A) the summed row log-likelihood under every
    attribute, ``attribute`` (k,) its own store attribute, ``rows`` (k,)."""

    documents: np.ndarray
    log_lik: np.ndarray
    attribute: np.ndarray
    rows: np.ndarray

    @classmethod
    def empty(cls, num_attributes: int) -> DocumentScores:
        return cls(np.zeros(0, np.int64), np.zeros((0, num_attributes)), np.zeros(0, np.int64), np.zeros(0))

    def __add__(self, other: DocumentScores) -> DocumentScores:
        """Documents of both, a document cut by a partition boundary summed (in this order, then ``other``'s)."""
        docs = np.concatenate([self.documents, other.documents])
        order = np.argsort(docs, kind="stable")
        unique, first = np.unique(docs[order], return_index=True)
        group = np.repeat(np.arange(unique.shape[0]), np.diff(np.append(first, docs.shape[0])))
        log_lik = np.zeros((unique.shape[0], self.log_lik.shape[1]))
        np.add.at(log_lik, group, np.concatenate([self.log_lik, other.log_lik])[order])
        rows = np.bincount(group, weights=np.concatenate([self.rows, other.rows])[order], minlength=unique.shape[0])
        attribute = np.concatenate([self.attribute, other.attribute])[order][first]
        return DocumentScores(unique, log_lik, attribute, rows)


def classify_partition(head: GatedHead, candidates: np.ndarray, blocks: Iterator[Block]) -> DocumentScores:
    """Every document's (its rows in these blocks) log-likelihood under each candidate attribute (K,)."""
    total = DocumentScores.empty(candidates.shape[0])
    for block in blocks:
        if block.documents is None:
            raise ValueError("--classify-attributes needs a token-stream store (its files are documents)")
        attribute, documents = _store_ids(block), np.asarray(block.documents)
        table = gated_log_likelihood(
            head, block.rows.encoded, candidates=candidates, given_query=True, values_checked=block.checked
        )
        weight = block.weights_or_ones()
        # A row of weight 0 does not count (its log-likelihood may be -inf: 0 * -inf would be NaN).
        table = np.where(weight[:, None] > 0.0, table * weight[:, None], 0.0)
        unique, first, group = np.unique(documents, return_index=True, return_inverse=True)
        log_lik = np.zeros((unique.shape[0], candidates.shape[0]))
        np.add.at(log_lik, group, table)
        rows = np.bincount(group, weights=(weight > 0.0).astype(float), minlength=unique.shape[0])
        total = total + DocumentScores(unique, log_lik, attribute[first], rows)
    return total


# ------------------------------------------------------------------------------------------ folding in, n-grams


def fold_in_partition(
    probe: GatedHead, mapping: np.ndarray, rule: HoldoutRule, blocks: Iterator[Block]
) -> GatedStatistics:
    """The fold-in E-step (no factor counts) of the rows of ``rule``'s training side, each as the probe's id of its
    store attribute (``mapping``; ``-1``: not counted)."""
    stats = GatedStatistics.zeros(probe, factor_counts=False)
    for block in blocks:
        attribute, weights = _mapped(_store_ids(block), _selected(block, rule, "train"), mapping)
        gated_estep(
            probe, block.rows.encoded, attribute, weights, stats, factor_counts=False, values_checked=block.checked
        )
    return stats


@dataclass(frozen=True)
class AttributePairs:
    """The previous-symbol pairs of the rows, one :class:`PairCounts` per store attribute."""

    pairs: tuple[PairCounts, ...]

    def __add__(self, other: AttributePairs) -> AttributePairs:
        return AttributePairs(tuple(a + b for a, b in zip(self.pairs, other.pairs, strict=True)))


def attribute_pairs_partition(
    num_attributes: int, num_symbols: int, num_targets: int, blocks: Iterator[Block]
) -> AttributePairs:
    """Per store attribute, the weighted (last context symbol, target) pairs of the blocks' rows."""
    s, t = num_symbols, num_targets
    pairs = [PairCounts.empty(s, t) for _ in range(num_attributes)]
    for block in blocks:
        attribute, weights = _store_ids(block), block.weights
        context, target = np.asarray(block.rows.context), np.asarray(block.rows.target)
        for a in np.unique(attribute):
            mine = attribute == a
            w = None if weights is None else np.asarray(weights)[mine]
            pairs[int(a)] = pairs[int(a)] + PairCounts.from_rows(
                context[mine, -1], target[mine], w, num_symbols=s, num_targets=t
            )
    return AttributePairs(tuple(pairs))


def _optional(passes: ReportPasses, request: BlockPass, over: str) -> Any:
    try:
        return passes.run(request, over=over)
    except LookupError:
        return None


def _kneser_ney_by_attribute(head: GatedHead, passes: ReportPasses, names: tuple[str, ...]) -> list[float | None]:
    """Each scored attribute's interpolated Kneser-Ney bigram perplexity, trained on that attribute's training rows
    (the gated fit's, by name) and its discount tuned on the fit's held-out rows of the attribute."""
    s, t = head.num_symbols, head.num_targets
    try:
        train_names = passes.attribute_names("training_store")
    except LookupError:
        train_names = None
    if not train_names:  # the training store moved or changed: no per-attribute baseline rather than a failure
        return [None] * len(names)

    def pairs(over: str, count: int) -> Any:
        request = BlockPass(
            "pairs", "pairs of", functools.partial(attribute_pairs_partition, count, s, t), Columns(attributes=True)
        )
        return _optional(passes, request, over)

    train = pairs("training_store", len(train_names))
    if train is None:
        return [None] * len(names)
    tune = pairs("heldout", len(train_names))
    scored = pairs("train", len(names))
    index = {name: i for i, name in enumerate(train_names)}
    out: list[float | None] = []
    for a, name in enumerate(names):
        i = index.get(name)
        if i is None or train.pairs[i].num_pairs == 0 or scored.pairs[a].num_pairs == 0:
            out.append(None)
            continue
        figures = passes.baseline(
            "kneser_ney", train.pairs[i], tune.pairs[i] if tune is not None else None, scored.pairs[a]
        )
        out.append(float(figures["perplexity"]))
    return out


# ------------------------------------------------------------------------------------------ the report


def _classify(
    head: GatedHead, passes: ReportPasses, mapping: np.ndarray, names: tuple[str, ...]
) -> tuple[float | None, int, list[dict[str, Any]]]:
    """Every document's posterior over the head's attributes, and the accuracy over the documents whose attribute
    the head knows."""
    head_names = head.attribute_names()
    candidates = np.arange(head.num_attributes, dtype=np.int64)
    docs: DocumentScores = passes.run(
        BlockPass(
            "classify", "classifying the documents of", functools.partial(classify_partition, head, candidates),
            Columns(attributes=True, documents=True),
        )
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
    head: GatedHead, shared: GatedHead, passes: ReportPasses, names: tuple[str, ...], iterations: int
) -> dict[str, Any]:
    """Fold in every attribute of the scored store the head lacks (see the module); per attribute its weights and the
    held half's perplexity under them, under uniform weights and under the shared head."""
    head_names = head.attribute_names()
    new = [a for a, name in enumerate(names) if name not in head_names]
    if not new:
        return {}
    mapping = np.full(len(names), -1, dtype=np.int64)
    mapping[new] = np.arange(len(new))
    rule = HoldoutRule.for_rows(passes.num_rows("train"), FOLD_IN_FRACTION)
    f = head.num_factors
    probe = head.with_weights(np.full((len(new), f), 1.0 / f))
    uniform = probe
    for step in range(int(iterations)):
        stats = passes.run(
            BlockPass(
                "folding", f"folding in ({step + 1}/{iterations})",
                functools.partial(fold_in_partition, probe, mapping, rule), Columns(attributes=True),
            )
        )  # fmt: skip
        probe = fold_in_step(probe, stats.attribute_count, 0.0)
    scorers = ((probe, mapping), (uniform, mapping), (shared, np.zeros(len(names), dtype=np.int64)))
    summed = passes.run(
        BlockPass(
            "scoring", "scoring the folded-in attributes of",
            functools.partial(_scores_pass, scorers, len(names), rule, "heldout"), Columns(attributes=True),
        )
    )  # fmt: skip
    folded, flat, plain = summed.values
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


def gated_report(head: GatedHead, passes: ReportPasses, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``evaluate``'s report of a gated head on the scored store (``over="train"``): JSON and lines (see the module).

    ``options``: ``classify_attributes``, ``fold_in``, ``fold_in_iterations`` (the command's flags), and from the
    engine's own evaluation of the store the figures the report repeats for the shared head: ``store`` (its URL),
    ``baselines`` and ``baseline_counts_from`` (the corpus-wide n-gram baselines: the same for both heads, fitted on
    the same training store).

    JSON: ``kind``, ``factors``, ``untied``, ``model`` (``perplexity`` of the rows of known attributes, ``rows``,
    ``perplexity_shared_same_rows``), ``shared`` (the shared head's evaluation: ``store``, ``rows``, ``weight``,
    ``model``, ``baselines``, ``baseline_counts_from``, ``warnings``), ``by_attribute``; with ``classify_attributes``
    ``attribute_accuracy``, ``classified_documents`` and ``documents``; with ``fold_in`` ``fold_in``.
    """
    from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings

    if head.reference is None:
        raise ValueError(
            "this gated head does not carry the shared head it started from, which its report compares it with (read "
            "an old checkpoint with its shared/ fit)"
        )
    names = passes.attribute_names("train")
    mapping = attribute_map(names, head.attribute_names())
    shared = GatedHead.from_shared(head.reference, 1)
    scorers = ((head, mapping), (shared, np.zeros(len(names), dtype=np.int64)))
    summed = passes.run(
        BlockPass(
            "scoring", "scoring the gated and the shared head on",
            functools.partial(_scores_pass, scorers, len(names), None, "all"), Columns(attributes=True),
        )
    )  # fmt: skip
    gated, plain = summed.values
    reference = head.reference
    shared_totals = passes.run(
        BlockPass("scoring", "scoring the shared head on", reference.score, reference.columns)
    )  # fmt: skip
    kneser_ney = _kneser_ney_by_attribute(head, passes, names)
    extra: dict[str, Any] = {}
    if options.get("classify_attributes"):
        accuracy, known, documents = _classify(head, passes, mapping, names)
        extra.update(attribute_accuracy=accuracy, classified_documents=known, documents=documents)
    if options.get("fold_in"):
        extra["fold_in"] = _fold_in(head, shared, passes, names, int(options.get("fold_in_iterations") or 20))
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
    report = {
        "kind": "gated",
        "factors": head.num_factors,
        "untied": head.fixed_weights,
        "model": {
            "perplexity": _ppl(float(gated.log_lik.sum()), float(gated.weight.sum())),
            "rows": float(gated.weight.sum()),
            "perplexity_shared_same_rows": _ppl(float(plain.log_lik[seen].sum()), float(plain.weight[seen].sum())),
        },
        "shared": {
            "store": options.get("store"),
            "rows": passes.num_rows("train"),
            "weight": float(shared_totals.weight),
            "model": shared_totals.metrics(),
            "baselines": options.get("baselines") or {},
            "baseline_counts_from": options.get("baseline_counts_from") or {},
            "warnings": degeneracy_warnings(reference),
        },
        "by_attribute": by_attribute,
        **extra,
    }
    return report, report_lines(report, store=options.get("store"))


def report_lines(report: dict[str, Any], *, store: str | None = None) -> list[str]:
    """The lines ``evaluate`` prints of a gated report (as it printed them before gated heads were a kind)."""
    shared = report["shared"]
    kn = (shared.get("baselines") or {}).get("kneser_ney", {}).get("perplexity")
    model = report["model"]

    def figure(value: Any) -> str:
        # A store with no rows of the attributes the head knows (a fold-in store, say) has no gated figures.
        return "n/a" if value is None else f"{value:.3f}"

    lines = [
        f"{store or shared.get('store') or 'the store'}: {model['rows']:,.0f} rows of known attributes",
        f"perplexity: gated {figure(model['perplexity'])}, shared {figure(model['perplexity_shared_same_rows'])}"
        + (f", Kneser-Ney bigram {kn:.3f} (all rows)" if kn else ""),
        f"{'attribute':<28} {'rows':>9} {'gated':>9} {'shared':>9} {'KN (own)':>9}",
    ]

    def cell(value: Any) -> str:
        return f"{value:>9.2f}" if value is not None else f"{'-':>9}"

    for name, row in report["by_attribute"].items():
        lines.append(
            f"{name[:28]:<28} {row['rows']:>9,.0f} {cell(row['perplexity'])} {cell(row['perplexity_shared'])} "
            f"{cell(row['perplexity_kneser_ney'])}"
        )
    if "attribute_accuracy" in report:
        accuracy = report["attribute_accuracy"]
        shown = "n/a" if accuracy is None else f"{accuracy:.1%}"
        lines.append(f"attribute classification: {shown} of {report['classified_documents']:,} documents")
    if "fold_in" in report and not report["fold_in"]:
        lines.append(
            f"note: --fold-in: every attribute of {store or shared.get('store') or 'the store'} is one the model "
            "knows, so there is nothing to fold in (give a store holding attributes the model lacks)"
        )
    for name, row in (report.get("fold_in") or {}).items():
        lines.append(
            f"folded in {name}: perplexity {row['perplexity']:.3f} (uniform weights "
            f"{row['perplexity_uniform_weights']:.3f}, shared {row['perplexity_shared']:.3f}) on "
            f"{row['rows_scored']:,.0f} held rows"
        )
    return lines
