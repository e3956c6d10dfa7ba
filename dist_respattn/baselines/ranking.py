"""Recommender baselines that rank next items from training counts: most popular, a Markov chain (the Kneser-Ney
bigram on the previous item) and item co-occurrence (item-KNN over the window)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.baselines.ngram import Baselines
from dist_respattn.model.emission.pairs import PairCounts

__all__ = [
    "RANKING_BASELINES",
    "CooccurrenceCounts",
    "ItemKNN",
    "RankingBaselines",
    "cooccurrence_of_blocks",
]

#: The baselines' names in a ranking table, in the order it lists them.
RANKING_BASELINES = ("most_popular", "markov", "item_knn")

#: Rows whose window pairs are made at once when counting co-occurrences (bounds the (rows x N) arrays).
_COUNT_ROWS = 4096


@dataclass(frozen=True)
class CooccurrenceCounts:
    """Co-occurrence counts of training rows (add two with ``+``).

    Attributes:
        pairs: (symbol, target) counts: the summed weights of the rows whose target is ``t`` and whose window holds
            ``s`` (once, however often it occurs there).
        symbol_rows: (S,) the summed weights of the rows whose window holds ``s``.
        target_rows: (T,) the summed weights of the rows whose target is ``t``.
    """

    pairs: PairCounts
    symbol_rows: np.ndarray
    target_rows: np.ndarray

    @classmethod
    def empty(cls, num_symbols: int, num_targets: int) -> CooccurrenceCounts:
        return cls(PairCounts.empty(num_symbols, num_targets), np.zeros(num_symbols), np.zeros(num_targets))

    def __add__(self, other: CooccurrenceCounts) -> CooccurrenceCounts:
        return CooccurrenceCounts(
            self.pairs + other.pairs, self.symbol_rows + other.symbol_rows, self.target_rows + other.target_rows
        )


def _window_cooccurrences(rows: Any, weights: np.ndarray | None, num_symbols: int, num_targets: int) -> Any:
    """The co-occurrence counts of one batch of token windows (:class:`~dist_respattn.model.rows.WindowRows`)."""
    lengths = (rows.end - rows.begin).astype(np.int64)
    w = np.ones(rows.num_rows) if weights is None else np.asarray(weights, dtype=np.float64)
    row = np.repeat(np.arange(rows.num_rows, dtype=np.int64), lengths)
    offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    symbol = np.asarray(rows.tokens)[np.repeat(rows.begin, lengths) + offsets].astype(np.int64)
    # A symbol counts once a row, however often the window holds it (a user rates an item once; text repeats).
    cells = np.unique(row * num_symbols + symbol)
    row, symbol = cells // num_symbols, cells % num_symbols
    live = w[row] > 0
    row, symbol = row[live], symbol[live]
    target = np.asarray(rows.target, dtype=np.int64)
    pairs = PairCounts.from_rows(symbol, target[row], w[row], num_symbols=num_symbols, num_targets=num_targets)
    return CooccurrenceCounts(
        pairs,
        np.bincount(symbol, weights=w[row], minlength=num_symbols).astype(np.float64),
        np.bincount(target, weights=w, minlength=num_targets).astype(np.float64),
    )


def cooccurrence_of_blocks(
    num_symbols: int, num_targets: int, blocks: Iterable[Any], *, max_window: int | None = None
) -> CooccurrenceCounts:
    """The co-occurrence counts of blocks of token windows, added block by block in order (a pass's partition map);
    with ``max_window``, of each window's last ``max_window`` tokens."""
    total = CooccurrenceCounts.empty(num_symbols, num_targets)
    for block in blocks:
        rows = block.rows
        if max_window is not None:
            rows = rows._replace(begin=np.maximum(np.asarray(rows.begin), np.asarray(rows.end) - int(max_window)))
        for start in range(0, rows.num_rows, _COUNT_ROWS):
            part = slice(start, min(start + _COUNT_ROWS, rows.num_rows))
            weights = None if block.weights is None else block.weights[part]
            total = total + _window_cooccurrences(rows.select(part), weights, num_symbols, num_targets)
    return total


@dataclass(frozen=True)
class ItemKNN:
    """Item-to-item cosine similarities of co-occurrence counts, as item-KNN recommenders score items:
    ``sim(s, t) = c(s, t) / sqrt(n(s) n(t))`` (``c``: rows whose window holds ``s`` and whose target is ``t``;
    ``n(s)``: rows whose window holds ``s``; ``n(t)``: rows whose target is ``t``), and a row's score of ``t``
    is ``sum over the distinct symbols s of its window of sim(s, t)``. Every neighbour is kept (no top-k
    pruning) and there is no shrinkage term.

    Attributes:
        indptr: (S + 1,) symbol ``s``'s neighbours are ``targets[indptr[s]:indptr[s + 1]]``, with ``similarity``.
        targets: (P,) int64; similarity: (P,) float64.
        num_targets: T.
    """

    indptr: np.ndarray
    targets: np.ndarray
    similarity: np.ndarray
    num_targets: int

    @classmethod
    def of(cls, counts: CooccurrenceCounts) -> ItemKNN:
        pairs = counts.pairs
        symbols, targets = pairs.keys // pairs.num_targets, pairs.keys % pairs.num_targets
        norm = np.sqrt(counts.symbol_rows[symbols] * counts.target_rows[targets])
        similarity = np.where(norm > 0, pairs.counts / np.where(norm > 0, norm, 1.0), 0.0)
        indptr = np.searchsorted(symbols, np.arange(pairs.num_symbols + 1)).astype(np.int64)
        return cls(indptr, targets.astype(np.int64), similarity, int(pairs.num_targets))

    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.targets.nbytes + self.similarity.nbytes)

    def scores(self, windows: Sequence[np.ndarray]) -> np.ndarray:
        """(n, T) each window's scores (``windows[r]``: its symbols)."""
        out = np.zeros((len(windows), self.num_targets))
        for r, window in enumerate(windows):
            for s in np.unique(np.asarray(window, dtype=np.int64)):
                a, b = self.indptr[s], self.indptr[s + 1]
                out[r, self.targets[a:b]] += self.similarity[a:b]
        return out


@dataclass(frozen=True)
class RankingBaselines:
    """The ranking baselines of one training store, what a ranking pass sends the workers.

    Attributes:
        popularity: (T,) the training rows' target counts (most popular: every row scores ``t`` by it).
        bigram: the fitted n-gram baselines, whose Kneser-Ney bigram ``P(t | previous item)`` is the Markov chain.
        knn: the item-KNN similarities (:class:`ItemKNN`).
    """

    popularity: np.ndarray
    bigram: Baselines
    knn: ItemKNN

    def nbytes(self) -> int:
        train = self.bigram.train
        return int(self.popularity.nbytes + train.keys.nbytes + train.counts.nbytes + self.knn.nbytes())

    def scores(self, windows: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """``{name: (n, T) scores}`` of rows whose windows are ``windows`` (each at least one symbol: the previous
        item is its last), by :data:`RANKING_BASELINES`."""
        n, num_targets = len(windows), self.popularity.shape[0]
        markov = np.empty((n, num_targets))
        every = np.arange(num_targets, dtype=np.int64)
        for r, window in enumerate(windows):
            markov[r] = self.bigram.prob("kneser_ney", np.full(num_targets, int(window[-1])), every)
        return {
            "most_popular": np.broadcast_to(self.popularity, (n, num_targets)),
            "markov": markov,
            "item_knn": self.knn.scores(windows),
        }
