"""Next-item ranking metrics as recommender benchmarks report them: hit rate, NDCG and MRR at K of one held-out
target a row, ranked against every target (``full``) or against sampled negatives the document has not seen.

The definitions are RecBole's (``recbole/evaluator/metrics.py``) for one relevant item of rank ``r`` (1 best):
``HR@K = [r <= K]``, ``NDCG@K = [r <= K] / log2(r + 1)`` (the ideal DCG of one item is 1), ``MRR@K = [r <= K] / r``,
each averaged over the ranked rows. Ties are pessimistic: the target ranks after every other candidate of equal
score, ``r = 1 + #{candidates c != target : score(c) >= score(target)}``, so a ranking is a function of the scores
alone (no sort order, no seed) and a model that gives many targets the same score (a constant one, a backoff)
gains nothing from where the target's id happens to fall among them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dist_respattn.model.heads.base import Block

__all__ = [
    "DEFAULT_NEGATIVES",
    "DEFAULT_RANKING_SEED",
    "PROTOCOLS",
    "RankingSettings",
    "RankingTable",
    "RankingTotals",
    "check_ranking_k",
    "check_ranking_negatives",
    "rank_rows",
    "sampled_ranks",
    "select_block",
    "target_ranks",
    "unseen_negatives",
]

#: The two protocols: every target a candidate, or the target against sampled unseen negatives.
PROTOCOLS = ("full", "sampled")
#: Negatives a row's target is ranked against in the sampled protocol (as SASRec's and LISA's evaluations).
DEFAULT_NEGATIVES = 100
DEFAULT_RANKING_SEED = 0


def check_ranking_k(k: Any) -> int:
    """``k`` as the cut-off K, a positive integer; else a ValueError naming ``--ranking``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"ranking K = {k!r} (--ranking): expected a positive integer, e.g. 10")
    return int(k)


def check_ranking_negatives(count: Any) -> int:
    """``count`` as the sampled protocol's negatives, a positive integer; else a ValueError naming the flag."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"ranking negatives = {count!r} (--ranking-negatives): expected a positive integer, e.g. 100")
    return int(count)


@dataclass(frozen=True)
class RankingSettings:
    """How rows are ranked: cut-off ``k``; ``negatives`` sampled a row (seeded by ``seed`` and the row's document);
    ``exclude_history``: in the full protocol, targets that occur in the row's history are no candidates (the
    target itself always is)."""

    k: int = 10
    negatives: int = DEFAULT_NEGATIVES
    seed: int = DEFAULT_RANKING_SEED
    exclude_history: bool = False

    def __post_init__(self) -> None:
        check_ranking_k(self.k)
        check_ranking_negatives(self.negatives)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"ranking seed = {self.seed!r} (--ranking-seed): expected an integer >= 0")

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "negatives": self.negatives, "seed": self.seed, "exclude_history": self.exclude_history}


def target_ranks(scores: np.ndarray, target: np.ndarray, candidates: np.ndarray | None = None) -> np.ndarray:
    """Each row's target's rank (1 best) among its candidate targets, ties pessimistic.

    Args:
        scores: (n, T) a score per target (higher ranks first; a probability, a count).
        target: (n,) the held-out target of each row.
        candidates: (n, T) bool, the targets each row ranks (``None``: all); the target counts as one whatever
            this says.

    Returns:
        (n,) int64: ``1 + #{c != target, candidate : scores[c] >= scores[target]}``, counted, never sorted.
    """
    scores = np.asarray(scores)
    rows = np.arange(scores.shape[0])
    tgt = np.asarray(target, dtype=np.int64)
    at_least = scores >= scores[rows, tgt][:, None]
    if candidates is not None:
        at_least &= candidates
    at_least[rows, tgt] = False
    return 1 + at_least.sum(axis=1).astype(np.int64)


def sampled_ranks(scores: np.ndarray, target: np.ndarray, negatives: Sequence[np.ndarray]) -> np.ndarray:
    """Each row's target's rank (1 best) against its own negatives (``negatives[r]``: target ids, the target not
    among them), ties pessimistic as :func:`target_ranks`. (n,) int64."""
    out = np.ones(len(negatives), dtype=np.int64)
    for r, drawn in enumerate(negatives):
        out[r] += int(np.count_nonzero(scores[r, drawn] >= scores[r, int(target[r])]))
    return out


def unseen_negatives(num_targets: int, seen: np.ndarray, count: int, seed: int, document: int) -> np.ndarray:
    """``count`` distinct target ids drawn uniformly from those not in ``seen`` (the document's tokens, its target
    among them), by a generator seeded with ``(seed, document)``: the same for every model and any partitioning.
    Fewer when fewer are unseen (all of them, in increasing order)."""
    seen_ids = np.asarray(seen, dtype=np.int64)
    seen_ids = seen_ids[(seen_ids >= 0) & (seen_ids < num_targets)]
    unseen = np.setdiff1d(np.arange(num_targets, dtype=np.int64), seen_ids, assume_unique=False)
    if unseen.size <= count:
        return unseen
    rng = np.random.default_rng([int(seed), int(document)])
    return rng.choice(unseen, size=count, replace=False)


@dataclass(frozen=True)
class RankingTotals:
    """Sums over ranked rows at cut-off K (add two with ``+``): ``rows``, and the sums of ``[r <= K]``,
    ``[r <= K] / log2(r + 1)`` and ``[r <= K] / r``; ``candidates``: the candidates ranked (target included)."""

    rows: int = 0
    hits: float = 0.0
    ndcg: float = 0.0
    mrr: float = 0.0
    candidates: int = 0

    @classmethod
    def of(cls, ranks: np.ndarray, k: int, candidates: int) -> RankingTotals:
        r = np.asarray(ranks, dtype=np.float64)
        inside = r <= k
        return cls(
            int(r.size),
            float(inside.sum()),
            float(np.sum(1.0 / np.log2(r[inside] + 1.0))),
            float(np.sum(1.0 / r[inside])),
            int(candidates),
        )

    def __add__(self, other: RankingTotals) -> RankingTotals:
        return RankingTotals(
            self.rows + other.rows,
            self.hits + other.hits,
            self.ndcg + other.ndcg,
            self.mrr + other.mrr,
            self.candidates + other.candidates,
        )

    def metrics(self) -> dict[str, float | int]:
        """``hit_rate``, ``ndcg``, ``mrr`` (means over the rows; NaN of none), ``rows`` and ``mean_candidates``."""
        if self.rows == 0:
            nan = float("nan")
            return {"hit_rate": nan, "ndcg": nan, "mrr": nan, "rows": 0, "mean_candidates": nan}
        return {
            "hit_rate": self.hits / self.rows,
            "ndcg": self.ndcg / self.rows,
            "mrr": self.mrr / self.rows,
            "rows": self.rows,
            "mean_candidates": self.candidates / self.rows,
        }


@dataclass(frozen=True)
class RankingTable:
    """Ranking sums by model name, then protocol (``full``, ``sampled``); add two with ``+`` (the same names in
    the same order: a pass's partitions all rank the same models)."""

    totals: dict[str, dict[str, RankingTotals]] = field(default_factory=dict)

    def __add__(self, other: RankingTable) -> RankingTable:
        names = list(self.totals) + [name for name in other.totals if name not in self.totals]
        empty = {protocol: RankingTotals() for protocol in PROTOCOLS}
        return RankingTable({
            name: {
                protocol: self.totals.get(name, empty)[protocol] + other.totals.get(name, empty)[protocol]
                for protocol in PROTOCOLS
            }
            for name in names
        })  # fmt: skip

    def metrics(self) -> dict[str, dict[str, dict[str, float | int]]]:
        """``{name: {"full": {"hit_rate", "ndcg", "mrr", "rows", "mean_candidates"}, "sampled": {...}}}``."""
        return {name: {p: t.metrics() for p, t in by.items()} for name, by in self.totals.items()}


def rank_rows(
    scores: Mapping[str, np.ndarray],
    target: np.ndarray,
    histories: Sequence[np.ndarray],
    documents: np.ndarray,
    settings: RankingSettings,
) -> RankingTable:
    """Rank each row's target under every model of ``scores`` (name -> (n, T) scores) by both protocols.

    ``histories[r]``: the tokens of row ``r``'s document before its target (all of them, not only the window);
    ``documents`` (n,): the document of each row (seeds its negatives). The full protocol's candidates are every
    target (less the history's, with ``exclude_history``); the sampled one's, the row's target and
    ``settings.negatives`` targets its document has not seen (:func:`unseen_negatives`), the same for every model.
    """
    tgt = np.asarray(target, dtype=np.int64)
    n = tgt.shape[0]
    num_targets = next(iter(scores.values())).shape[1] if scores else 0
    candidates = None
    if settings.exclude_history and n:
        candidates = np.ones((n, num_targets), dtype=bool)
        for r, history in enumerate(histories):
            seen = np.asarray(history, dtype=np.int64)
            candidates[r, seen[seen < num_targets]] = False
        candidates[np.arange(n), tgt] = True
    full_candidates = num_targets * n if candidates is None else int(candidates.sum())
    negatives = [
        unseen_negatives(num_targets, np.append(np.asarray(h, dtype=np.int64), tgt[r]), settings.negatives,
                         settings.seed, int(documents[r]))
        for r, h in enumerate(histories)
    ]  # fmt: skip
    sampled_candidates = n + sum(int(d.size) for d in negatives)
    out = {}
    for name, table in scores.items():
        out[name] = {
            "full": RankingTotals.of(target_ranks(table, tgt, candidates), settings.k, full_candidates),
            "sampled": RankingTotals.of(sampled_ranks(table, tgt, negatives), settings.k, sampled_candidates),
        }
    return RankingTable(out)


def select_block(block: Block, rows: slice) -> Block:
    """The rows ``rows`` of a block (its row batch, weights, attributes and documents alike)."""

    def cut(values: Any) -> Any:
        return None if values is None else values[rows]

    batch = block.rows
    if hasattr(batch, "select"):  # token windows
        part = batch.select(rows)
    else:
        part = batch._replace(
            context=batch.context[rows], query=batch.query[rows], target=batch.target[rows], weight=cut(batch.weight)
        )
    return Block(part, cut(block.weights), cut(block.attribute), cut(block.documents), block.partition, block.start,
                 block.checked)  # fmt: skip
