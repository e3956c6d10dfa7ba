"""``evaluate``: how well a head scores a store, next to n-gram baselines, computed on the cluster.

The head's figures: mean joint log-likelihood per row, and the predictive quality of the targets
from ``predict_proba`` (which does not see the target): perplexity and accuracy. The baselines
predict the same targets from counts (:mod:`dist_respattn.baselines.ngram`): an add-k unigram, and for
stores made from a token stream the add-k, Jelinek-Mercer and interpolated Kneser-Ney bigrams on the
previous token (the last context id), and interpolated modified Kneser-Ney n-grams of orders 3 to
``baseline_order`` on the window's last tokens (:mod:`dist_respattn.baselines.kneser_ney`). Their counts
come from the model's training store when the model directory names one that opens unchanged (same
fingerprint), else from the evaluated store itself (in-sample, which flatters them); their parameters
are tuned on the model's held-out rows (its validation store, or its training store's hold-out) when
those can be read, else stated.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import distributed
import numpy as np

from dist_respattn.artifacts import Checkpoint, load_checkpoint
from dist_respattn.baselines.kneser_ney import MAX_ORDER, MIN_ORDER
from dist_respattn.baselines.ngram import DEFAULT_K, MODEL_LABELS, Baselines, fit_baselines
from dist_respattn.baselines.ranking import RANKING_BASELINES, ItemKNN, RankingBaselines, cooccurrence_of_blocks
from dist_respattn.engine import worker_tasks
from dist_respattn.engine.broadcast import ParameterBroadcast
from dist_respattn.engine.cluster import ClusterOptions, connect
from dist_respattn.engine.fit import FitError, check_same_shape, open_fit_store
from dist_respattn.engine.ngram_shards import ShardedNGrams
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.progress import FitReporter
from dist_respattn.engine.worker_tasks import ALL_ROWS, RowSelection, attribute_map, rank_task
from dist_respattn.events import HeldoutScores
from dist_respattn.model.emission.pairs import PairCounts, pairs_of_blocks
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import BlockPass, Columns, Head
from dist_respattn.model.ranking import RankingSettings, RankingTable
from dist_respattn.model.scores import ScoreTotals
from dist_respattn.store import StoreError, StoreLocation, TokenStreamStore, check_model_corpus, open_store
from dist_respattn.store.rows import RowStore, is_stream_store
from dist_respattn.text_format import count_text

__all__ = [
    "DEFAULT_BASELINE_K",
    "DEFAULT_BASELINE_ORDER",
    "Evaluation",
    "check_baseline_order",
    "check_rankable",
    "evaluate",
    "kneser_ney_key",
    "ranking_lines",
    "score",
    "score_store",
    "scored_store",
]

#: The unigram's add-k smoothing (and add-k's k when it cannot be tuned).
DEFAULT_BASELINE_K = DEFAULT_K
#: The longest n-gram baseline: Kneser-Ney n-grams of orders 3 to this one beside the bigrams (2: bigrams only).
DEFAULT_BASELINE_ORDER = MAX_ORDER


def kneser_ney_key(order: int) -> str:
    """The baselines' JSON key of the modified Kneser-Ney n-gram of ``order`` (3 to 5): ``kneser_ney_3``..."""
    return f"kneser_ney_{order}"


def check_baseline_order(order: Any) -> int:
    """``order`` as the longest n-gram baseline, an integer from 2 to 5; else a ValueError saying so."""
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not MIN_ORDER <= order <= MAX_ORDER:
        raise ValueError(f"baseline order {order!r}: expected an integer from {MIN_ORDER} to {MAX_ORDER}")
    return int(order)


def _label(name: str) -> str:
    return MODEL_LABELS.get(name, name)


#: Store sources whose rows are windows of a token stream, so the last context id is the previous token.
TOKEN_SOURCES = ("tokens", "text")


@dataclass(frozen=True)
class Evaluation:
    """A head's scores on a store and the baselines' scores on the same targets.

    Attributes:
        store: the evaluated store's URL; ``rows`` its rows; ``weight`` the total row weight.
        model: ``mean_log_likelihood``, ``target_log_prob``, ``perplexity``, ``accuracy``.
        baselines: ``{"unigram": {...}, "add_k": {...}, "jelinek_mercer": {...}, "kneser_ney": {...}}``
            (the bigrams for token stores only), each ``perplexity``, ``target_log_prob``, ``accuracy``,
            ``weight`` and the ``parameters`` it used (and how they were set: ``tuned_on``).
        baseline_counts_from: the store the baseline counts came from, whether that is in-sample, and
            where their parameters were tuned (``tuned_on``: a store, the training store's hold-out, or
            ``None``: stated defaults).
        warnings: degenerate-fit warnings about the head.
        ranking: with ``ranking=``, the next-item ranking of the last row of each document (see
            :func:`evaluate`): its settings, the head's ``full`` and ``sampled`` figures, and the ranking
            baselines' under ``baselines``; ``None`` otherwise (and no JSON key).
        report: what the head's kind adds (:meth:`~dist_respattn.model.heads.base.Head.report`): JSON keys beside
            these, and ``report_lines``, the lines said after the table.
        window: a token-stream store's windows: ``{"read_with": N, "recorded": N}``, the model's N its rows are
            windows of and the N the store records (its writer's default); ``None`` for a triple store.
        scored_rows: the rows the figures are of, those of positive weight (of ``rows``: a weighted store's rows of
            weight 0 are context only); ``None`` when not counted.
    """

    store: str
    rows: int
    weight: float
    model: dict[str, float]
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline_counts_from: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    report_lines: list[str] = field(default_factory=list)
    ranking: dict[str, Any] | None = None
    window: dict[str, int] | None = None
    scored_rows: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Evaluation:
        """The evaluation :meth:`to_json` wrote (its kind's report keys kept as its report)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"report", "report_lines"}
        known = {k: v for k, v in data.items() if k in names}
        report = {k: v for k, v in data.items() if k not in names and k != "report_lines"}
        return cls(**known, report=report, report_lines=list(data.get("report_lines") or []))

    def to_json(self) -> dict[str, Any]:
        return {
            **self.report,
            **({"report_lines": self.report_lines} if self.report_lines else {}),
            "store": self.store,
            "rows": self.rows,
            **({"scored_rows": self.scored_rows} if self.scored_rows is not None else {}),
            "weight": self.weight,
            "model": self.model,
            "baselines": self.baselines,
            "baseline_counts_from": self.baseline_counts_from,
            "warnings": self.warnings,
            **({"ranking": self.ranking} if self.ranking is not None else {}),
            **({"window": self.window} if self.window is not None else {}),
        }

    def summary(self) -> str:
        """A small table: one row for the head and one per baseline, then where the baselines came from."""
        width = max([15, *(len(_label(name)) for name in self.baselines)])
        header = f"{'':<{width}} {'log-lik/row':>12} {'perplexity':>12} {'accuracy':>9}"
        lines = [f"{self.store}: {self._rows_text()}{self._window_text()}", header]

        def cell(value: Any, spec: str, width: int) -> str:
            # A head that weighs none of the store's rows (each of an attribute it lacks, say) has no figures.
            missing = value is None or (isinstance(value, float) and value != value)  # None or NaN
            return f"{'n/a':>{width}}" if missing else f"{value:>{width}{spec}}"

        model = self.model
        lines.append(
            f"{'head':<{width}} {cell(model.get('mean_log_likelihood'), '.4f', 12)} "
            f"{cell(model.get('perplexity'), '.4f', 12)} {cell(model.get('accuracy'), '.2%', 9)}"
        )
        for name, figures in self.baselines.items():
            lines.append(
                f"{_label(name):<{width}} {'':>12} {figures['perplexity']:>12.4f} {figures['accuracy']:>9.2%}"
                f"  {_parameters_text(figures.get('parameters') or {})}"
            )
        if "kneser_ney" in self.baselines and model.get("perplexity") is not None:
            ratio = self.model["perplexity"] / self.baselines["kneser_ney"]["perplexity"]
            lines.append(f"head / Kneser-Ney perplexity: {ratio:.3f}")
        if self.baselines:
            source = self.baseline_counts_from
            lines.append(
                f"baseline counts from {source.get('store')}"
                + (" (the evaluated store itself: in-sample)" if source.get("in_sample") else "")
                + (f"; tuned on {source['tuned_on']}" if source.get("tuned_on") else "; parameters stated")
            )
        lines.extend(self.report_lines)
        if self.ranking is not None:
            lines.extend(ranking_lines(self.ranking))
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)

    def _rows_text(self) -> str:
        """``4,992 rows``; on a store with rows of weight 0, the rows scored and those left out."""
        scored = self.scored_rows
        if scored is None or scored == self.rows:
            return count_text(self.rows, "row")
        return (
            f"{count_text(scored, 'row')} scored, of {self.rows:,} (the other {self.rows - scored:,} weigh 0: context "
            "only)"
        )

    def _window_text(self) -> str:
        """What the header adds when a token-stream store was written with another N than the model reads it with."""
        window = self.window or {}
        if window.get("read_with") in (None, window.get("recorded")):
            return ""
        return (
            f", windows of the model's N = {window['read_with']} (the store records N = {window['recorded']}, its "
            "writer's default: a token-stream store is read with any window)"
        )


def _parameters_text(parameters: dict[str, Any]) -> str:
    names = ("k", "lambda", "discount", "discount_scale")
    shown = [f"{k} {v:.4g}" for k, v in parameters.items() if k in names and v is not None]
    return ", ".join(shown)


def window_for(head: Head, store: Any, storage_options: dict[str, Any] | None) -> int | None:
    """The window a model reads ``store`` with: its own N for a token-stream store, ``None`` for a triple store."""
    location = store.location if hasattr(store, "location") else StoreLocation.of(store, storage_options)
    return head.context_length if is_stream_store(location) else None


def min_context_for(head: Head, meta: dict[str, Any]) -> int | None:
    """The fewest earlier tokens of the rows a model scores: a head that reads token windows (a tied prior) scores
    the short histories its fit trained on (its training store's ``min_context``, else 1); others, full windows."""
    if not head.columns.windows:
        return None
    recorded = (meta.get("store") or {}).get("min_context")
    return int(recorded) if recorded else 1


def scored_store(
    model: Head,
    meta: dict[str, Any],
    store: str | os.PathLike[str] | StoreLocation | RowStore,
    storage_options: dict[str, Any] | None = None,
) -> RowStore:
    """``store`` opened as :func:`evaluate` (and ``predict``) read it for ``model``: a token-stream store with the
    model's own window N (:func:`window_for`) and rows with the fewest earlier tokens its fit trained on
    (:func:`min_context_for`, from its checkpoint's ``meta``); a triple store as it is. Its rows are the targets the
    model's figures are of: two models of other windows or kinds may score other rows of one store."""
    return open_fit_store(
        store, storage_options, window_for(model, store, storage_options), min_context_for(model, meta)
    )


def _open_recorded(record: dict[str, Any] | None, scored: RowStore) -> RowStore | None:
    """The store a checkpoint recorded, when it still opens as it was (same fingerprint) with the scored store's
    S and T; ``None`` otherwise."""
    url = (record or {}).get("url")
    if not url:
        return None
    try:
        store = open_store(url, window=(record or {}).get("window"), min_context=(record or {}).get("min_context"))
    except (StoreError, OSError, ValueError):
        return None
    if store.fingerprint() != (record or {}).get("fingerprint"):  # rewritten or appended to since the fit
        return None

    def ids(s: RowStore) -> tuple[int, int]:
        return (s.schema.num_symbols, s.schema.num_targets)

    return store if ids(store) == ids(scored) else None


def _training_store(meta: dict[str, Any], scored: RowStore) -> RowStore | None:
    """The model's training store when it still opens as fitted and is another store than the scored one."""
    record = meta.get("store") or {}
    if record.get("url") == str(scored.location):
        return None
    return _open_recorded(record, scored)


def _attribute_map(store: RowStore, head: Head) -> Any:
    names = getattr(store, "attribute_names", None)
    return attribute_map(tuple(names) if names else None, head.attribute_names())


def score_store(runner: PassRunner, model: Head, store: RowStore) -> ScoreTotals:
    """``model``'s totals over every row of ``store``: one pass of scoring tasks and their combine tree."""
    params = ParameterBroadcast(runner.client, runner.run_tag)
    params.publish(model, "evaluate")
    fingerprint = store.fingerprint()
    mapping = _attribute_map(store, model)
    try:
        return runner.run(
            "evaluate", "0", store.num_partitions, worker_tasks.score_task,
            lambda part: (store.location, part, params.current, fingerprint, ALL_ROWS, mapping),
            description=f"scoring {store.location}",
        )  # fmt: skip
    finally:
        params.release()


def score(model: Head, store: RowStore, *, client: distributed.Client) -> HeldoutScores:
    """``model``'s figures on every row of ``store``, without baselines: ``mean_log_likelihood``,
    ``target_log_prob``, ``perplexity`` and ``accuracy``, from one pass on ``client``'s cluster.

    Each call's keys carry a run tag of its own, so passes of several calls on one cluster never meet.
    """
    totals = score_store(PassRunner(client, uuid.uuid4().hex[:8]), model, store)
    return cast(HeldoutScores, totals.metrics())


def evaluate(
    model: Head | Checkpoint | str | os.PathLike[str],
    store: str | os.PathLike[str] | StoreLocation | RowStore,
    *,
    baseline_k: float = DEFAULT_BASELINE_K,
    baseline_order: int = DEFAULT_BASELINE_ORDER,
    options: dict[str, Any] | None = None,
    client: distributed.Client | None = None,
    cluster: ClusterOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    say: Callable[[str], Any] | None = None,
    progress: bool | None = None,
    ranking: RankingSettings | None = None,
) -> Evaluation:
    """Score ``store`` with ``model`` on a cluster: a head, a model directory (its ``best``, else ``latest``), a
    registry's version (``REGISTRY@7``, ``REGISTRY@latest``), or a checkpoint already loaded from one (a caller that
    checked it first need not load it twice).

    ``client``, or without one ``cluster``, is where it runs (see :func:`~dist_respattn.engine.connect`).
    ``options``: the head kind's own evaluate options by their ``dest`` names (what its report adds: see
    :meth:`~dist_respattn.model.heads.base.Head.report`). ``baseline_order``: for a store made from a token
    stream, interpolated modified Kneser-Ney n-grams of orders 3 to it (2 to 5; 2: the bigrams only), counted
    by one more pass over each store, under the keys :func:`kneser_ney_key` gives.

    ``ranking`` (a token-stream store only): rank the target of the last row of each document (the rest of the
    document its history, the row its window) under the head and under three baselines counted on the same
    training rows as the n-gram ones (most popular, the Kneser-Ney bigram as a Markov chain, item-KNN over the
    window), against every target (``full``) and against ``ranking.negatives`` unseen targets (``sampled``):
    hit rate, NDCG and MRR at ``ranking.k`` (:mod:`dist_respattn.model.ranking`), each worker ranking its own
    rows and returning sums.
    """
    baseline_order = check_baseline_order(baseline_order)
    meta: dict[str, Any] = {}
    if isinstance(model, Head):
        head = model
    else:
        checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model, storage_options=storage_options)
        head, meta = checkpoint.model, checkpoint.meta
    # A token-stream store is read with the model's window.
    scored = scored_store(head, meta, store, storage_options)
    check_same_shape(head, "the model", scored)
    check_model_corpus(meta.get("store"), scored)
    if scored.num_rows == 0:
        raise FitError(f"the store {scored.location} has no rows to evaluate")
    if ranking is not None:
        check_rankable(head, scored)
    bigram = scored.provenance.get("source") in TOKEN_SOURCES
    training = _training_store(meta, scored)
    baseline_store = training or scored
    train_rows, tuning = _baseline_rows(meta, scored, training)
    run_id = uuid.uuid4().hex[:8]
    with connect(cluster, client=client, say=say) as cl:
        reporter = FitReporter(cl, say=say, bar=progress)
        runner = PassRunner(cl, run_id, make_bar=reporter.make_bar)
        totals = score_store(runner, head, scored)
        # The pass over the scored store counts the rows a score counts too (a weighted store's rows of weight 0
        # are context only).
        scored_pairs: _ScoredPairs = _count_pairs(
            runner, scored, ALL_ROWS, "0", f"counting the pairs of {scored.location}", _scored_pairs_of_blocks
        )
        counts = scored_pairs.pairs
        if baseline_store is scored:
            train_counts = counts
        else:
            train_counts = _count_pairs(runner, baseline_store, train_rows, "1", "counting the training pairs")
        validation_counts = None
        if tuning is not None:
            tune_store, tune_rows, _ = tuning
            validation_counts = _count_pairs(runner, tune_store, tune_rows, "2", "counting the held-out pairs")
        fitted = fit_baselines(train_counts, validation=validation_counts, k=baseline_k)
        baselines = fitted.score(counts)
        names = ("unigram", "add_k", "jelinek_mercer", "kneser_ney") if bigram else ("unigram",)
        baseline_figures = {name: baselines[name].to_json() for name in names}
        if bigram and baseline_order > 2:
            baseline_figures.update(
                _ngram_baselines(runner, baseline_order, scored, (baseline_store, train_rows), tuning)
            )
        counts_from = {
            "store": str(baseline_store.location),
            "in_sample": baseline_store is scored,
            "tuned_on": tuning[2] if tuning is not None else None,
        }
        holdout = meta.get("holdout")
        held = (training, RowSelection(HoldoutRule.from_json(holdout), "heldout")) if training and holdout else None
        passes = ReportPasses(runner, scored, training, train_rows, held, say or (lambda line: None))
        given = {**(options or {}), "store": str(scored.location), "baselines": baseline_figures}
        report, report_lines = head.report(passes, {**given, "baseline_counts_from": counts_from})
        ranked = None
        if ranking is not None:
            ranked = _rank(runner, head, scored, (baseline_store, train_rows), fitted, train_counts, ranking)
    warnings = list(meta.get("warnings") or []) or head.warnings(meta.get("settings") or {})
    # A kind's report may refine the head's own figures (a gated head's perplexity over the rows of the attributes
    # it knows): its "model" keys win.
    model_figures = {**totals.metrics(), **(report.pop("model", None) or {})}
    return Evaluation(
        store=str(scored.location),
        rows=scored.num_rows,
        weight=totals.weight,
        model=model_figures,
        baselines=baseline_figures,
        baseline_counts_from=counts_from,
        warnings=warnings,
        report=report,
        report_lines=report_lines,
        ranking=ranked,
        scored_rows=scored_pairs.rows,
        window=(
            {"read_with": scored.schema.context_length, "recorded": scored.recorded_window}
            if isinstance(scored, TokenStreamStore)
            else None
        ),
    )


def check_rankable(head: Head, store: RowStore) -> None:
    """Raise ``ValueError`` when ``evaluate --ranking`` cannot rank ``store`` with ``head``: a store that is not a
    token-stream store (it has no documents' last rows), or a kind that gives no ``p(target | row)``."""
    if not is_stream_store(store.location):
        raise ValueError(
            f"--ranking ranks the last row of each document of a token-stream store: {store.location} is a triple "
            "store; write it as a stream (`dist-respattn ingest --tokens ...`, `split --format stream`)"
        )
    if type(head).block_proba is Head.block_proba:
        raise ValueError(f"--ranking: a {head.kind} head gives no p(target | row) of a block of rows to rank")


def _rank(
    runner: PassRunner,
    head: Head,
    scored: RowStore,
    training: tuple[RowStore, RowSelection],
    bigram: Baselines,
    train_counts: PairCounts,
    settings: RankingSettings,
) -> dict[str, Any]:
    """The ranking table (see :func:`evaluate`): one pass counting the training rows' co-occurrences, one ranking
    the scored store's last rows; the head and the baselines' tables are scattered to the workers once."""
    store, rows = training
    fingerprint = store.fingerprint()
    schema = store.schema
    # Item-KNN counts over the window the head attends over (a repeat gate's wrapped head's, not the whole history
    # its gate reads: a row's count costs its window's length).
    count = functools.partial(
        cooccurrence_of_blocks, schema.num_symbols, schema.num_targets, max_window=head.attention_length
    )
    cooccurrences = runner.run(
        "cooccurrence", "0", store.num_partitions, worker_tasks.pass_task,
        lambda part: (store.location, part, count, Columns(windows=True), fingerprint, rows),
        description="counting the training rows' co-occurrences",
    )  # fmt: skip
    rankers = RankingBaselines(train_counts.target_totals(), bigram, ItemKNN.of(cooccurrences))
    params = ParameterBroadcast(runner.client, runner.run_tag)
    tables = ParameterBroadcast(runner.client, runner.run_tag, prefix="rankers")
    params.publish(head, "rank")
    tables.publish(rankers, "rank")
    scored_fingerprint = scored.fingerprint()
    mapping = _attribute_map(scored, head)
    try:
        table: RankingTable = runner.run(
            "rank", "0", scored.num_partitions, rank_task,
            lambda part: (scored.location, part, params.current, tables.current, settings, scored_fingerprint,
                          mapping),
            description=f"ranking the last row of each document of {scored.location}",
        )  # fmt: skip
    finally:
        params.release()
        tables.release()
    figures = table.metrics()
    model = figures.get("model", {})
    return {
        **settings.to_json(),
        "rows": int(table.totals["model"]["full"].rows) if "model" in table.totals else 0,
        "full": model.get("full"),
        "sampled": model.get("sampled"),
        "baselines": {name: figures[name] for name in RANKING_BASELINES if name in figures},
        "baseline_counts_from": str(store.location),
    }


#: The ranking baselines' names in the summary.
RANKING_LABELS = {"most_popular": "most popular", "markov": "Markov (KN bigram)", "item_knn": "item-KNN"}


def ranking_lines(ranking: dict[str, Any]) -> list[str]:
    """The summary's ranking table: a line per model, HR, NDCG and MRR at K by both protocols."""
    k = ranking.get("k")
    exclude = ", history excluded" if ranking.get("exclude_history") else ""
    negatives = ranking.get("negatives")
    sampled = f"{negatives} unseen negatives"
    # A document that has seen all but fewer than M targets is ranked against those few: its sampled figures are
    # of an easier ranking than the header would otherwise say, so it says how many a row had.
    mean = (ranking.get("sampled") or {}).get("mean_candidates")
    if isinstance(negatives, int) and isinstance(mean, (int, float)) and mean - 1 < negatives:
        sampled = f"{negatives} unseen negatives asked, {mean - 1:.1f} a row on average (too few unseen)"
    lines = [
        f"ranking the last row of {ranking.get('rows', 0):,} documents at K = {k} (full: every target{exclude}; "
        f"sampled: {sampled}, seed {ranking.get('seed')}; ties pessimistic)",
        f"{'':<19} {'HR':>7} {'NDCG':>7} {'MRR':>7}   {'HR':>7} {'NDCG':>7} {'MRR':>7}",
        f"{'':<19} {'full':>23}   {'sampled':>23}",
    ]

    def row(label: str, figures: dict[str, Any]) -> str:
        cells = [
            f"{figures[p][m]:>7.4f}" if figures.get(p) else f"{'n/a':>7}"
            for p in ("full", "sampled")
            for m in ("hit_rate", "ndcg", "mrr")
        ]
        return f"{label:<19} {' '.join(cells[:3])}   {' '.join(cells[3:])}"

    lines.append(row("head", ranking))
    for name, figures in (ranking.get("baselines") or {}).items():
        lines.append(row(RANKING_LABELS.get(name, name), figures))
    return lines


class ReportPasses:
    """The passes a head's report runs (:class:`~dist_respattn.model.heads.base.Passes`): over the evaluated store
    (``over="train"``: every row), the store the head was fitted on (``"training_store"``: its training rows) or
    that store's hold-out (``"heldout"``). Blocks carry each store's own attribute ids (the report maps them by name:
    it also reads the attributes the head lacks). ``run`` raises ``LookupError`` for rows that cannot be read (a
    training store that moved or changed, a fit without a hold-out)."""

    def __init__(
        self,
        runner: PassRunner,
        scored: RowStore,
        training: RowStore | None,
        training_rows: RowSelection,
        heldout: tuple[RowStore, RowSelection] | None,
        say: Callable[[str], Any],
    ) -> None:
        self.runner, self.scored, self.training, self.training_rows = runner, scored, training, training_rows
        self.held, self.tell = heldout, say
        self.count = 0

    def _rows(self, over: str) -> tuple[RowStore, RowSelection]:
        if over == "train":
            return self.scored, ALL_ROWS
        if over == "training_store":
            if self.training is None:
                raise LookupError("the model's training store does not open as it was fitted")
            return self.training, self.training_rows
        if over == "heldout":
            if self.held is None:
                raise LookupError("the model's fit held out no rows of a training store that opens as it was fitted")
            return self.held
        raise ValueError(f"over = {over!r}: expected 'train', 'training_store' or 'heldout'")

    def run(self, request: BlockPass, *, over: str = "train") -> Any:
        store, rows = self._rows(over)
        fingerprint = store.fingerprint()
        self.count += 1
        return self.runner.run(
            request.name, f"report{self.count}", store.num_partitions, worker_tasks.pass_task,
            lambda part: (store.location, part, request.map_partition, request.columns, fingerprint, rows),
            description=request.description,
        )  # fmt: skip

    def attribute_names(self, over: str) -> tuple[str, ...]:
        names = getattr(self._rows(over)[0], "attribute_names", None)
        return tuple(names or ())

    def num_rows(self, over: str) -> int:
        return int(self._rows(over)[0].num_rows)

    def baseline(
        self, name: str, train: PairCounts, validation: PairCounts | None, scored: PairCounts
    ) -> dict[str, Any]:
        """The n-gram baseline ``name`` of these pair counts (fitted on ``train``, tuned on ``validation``)."""
        return fit_baselines(train, validation=validation).score_one(name, scored).to_json()

    def choose(self, candidates: Any) -> Head:
        raise ValueError("a report chooses nothing on held-out rows")

    def say(self, line: str) -> None:
        self.tell(line)

    def plan_memory(self) -> None:
        pass


def _baseline_rows(
    meta: dict[str, Any], scored: RowStore, training: RowStore | None
) -> tuple[RowSelection, tuple[RowStore, RowSelection, str] | None]:
    """Which training rows the baselines count, and where their parameters are tuned: ``(rows, (store, rows,
    description) or None)``.

    A model fitted with a hold-out of its training store is compared with baselines trained on the same
    rows and tuned on the same held-out rows; one fitted with a validation store, with baselines tuned on it.
    """
    holdout = meta.get("holdout")
    if training is not None and holdout:
        rule = HoldoutRule.from_json(holdout)
        return RowSelection(rule, "train"), (training, RowSelection(rule, "heldout"), "the training store's hold-out")
    validation = _open_recorded(meta.get("validation"), scored)
    if validation is not None and validation.location != scored.location:
        return ALL_ROWS, (validation, ALL_ROWS, str(validation.location))
    return ALL_ROWS, None


def _ngram_baselines(
    runner: PassRunner,
    order: int,
    scored: RowStore,
    training: tuple[RowStore, RowSelection],
    tuning: tuple[RowStore, RowSelection, str] | None,
) -> dict[str, dict[str, Any]]:
    """The Kneser-Ney n-grams of orders 3 to ``order``: counted once at ``order`` on the scored, training and
    tuning rows (one pass each; the training counts are the scored ones when the stores are the same), then
    fitted and scored at each order, all on the workers in shards (:mod:`~dist_respattn.engine.ngram_shards`):
    the driver receives scalars."""
    sharded = ShardedNGrams(runner)
    scored_parts = sharded.count(order, scored, ALL_ROWS, "0", f"counting the n-grams of {scored.location}")
    store, rows = training
    train_parts = (
        scored_parts
        if store is scored and rows is ALL_ROWS
        else sharded.count(order, store, rows, "1", "counting the training n-grams")
    )
    held = None
    if tuning is not None:
        held = sharded.count(order, tuning[0], tuning[1], "2", "counting the held-out n-grams")
    figures = sharded.figures(order, scored_parts, train_parts, held)
    return {kneser_ney_key(k): value for k, value in figures.items()}


def _count_pairs(
    runner: PassRunner,
    store: RowStore,
    rows: RowSelection,
    label: str,
    description: str,
    count: Callable[..., Any] = pairs_of_blocks,
) -> Any:
    """The (previous symbol, target) pairs of ``store``'s selected rows (token windows for short histories), as
    ``count(S, T, blocks)`` gives them on each partition (with the rows scored: ``_scored_pairs_of_blocks``)."""
    fingerprint = store.fingerprint()
    schema = store.schema
    counted = functools.partial(count, schema.num_symbols, schema.num_targets)
    columns = Columns(windows=bool(getattr(store, "short_histories", False)))
    return runner.run(
        "pairs", label, store.num_partitions, worker_tasks.pass_task,
        lambda part: (store.location, part, counted, columns, fingerprint, rows), description=description,
    )  # fmt: skip


@dataclass(frozen=True)
class _ScoredPairs:
    """A pass's (previous symbol, target) pairs and how many of its rows weigh more than 0 (add two with ``+``).

    Attributes:
        pairs: the weighted pair counts (:class:`~dist_respattn.model.emission.pairs.PairCounts`).
        rows: the rows of positive weight: those a score counts (a row of weight 0 is context only).
    """

    pairs: PairCounts
    rows: int

    def __add__(self, other: _ScoredPairs) -> _ScoredPairs:
        return _ScoredPairs(self.pairs + other.pairs, self.rows + other.rows)


def _scored_pairs_of_blocks(num_symbols: int, num_targets: int, blocks: Any) -> _ScoredPairs:
    """:func:`pairs_of_blocks` of a partition's blocks, with the number of their rows of positive weight."""
    rows = 0

    def counted() -> Any:
        nonlocal rows
        for block in blocks:
            rows += block.num_rows if block.weights is None else int(np.count_nonzero(block.weights > 0))
            yield block

    return _ScoredPairs(pairs_of_blocks(num_symbols, num_targets, counted()), rows)
