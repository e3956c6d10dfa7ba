"""The ranking baselines (:mod:`dist_respattn.baselines.ranking`) against hand counts on tiny windows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dist_respattn.baselines.ngram import fit_baselines
from dist_respattn.baselines.ranking import ItemKNN, RankingBaselines, cooccurrence_of_blocks
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.heads.base import Block
from dist_respattn.model.rows import WindowRows


def windows(rows: list[tuple[list[int], int]], weights: list[float] | None = None) -> Block:
    """A block of token windows: ``[(window tokens, target), ...]``."""
    tokens = np.concatenate([np.asarray(w, dtype=np.int64) for w, _ in rows])
    ends = np.cumsum([len(w) for w, _ in rows])
    begin = ends - np.array([len(w) for w, _ in rows])
    target = np.array([t for _, t in rows])
    batch = WindowRows(tokens, begin, ends, target, np.zeros((4, 1)), tokens[ends - 1], None, 0, True)
    return Block(batch, None if weights is None else np.asarray(weights))


def test_cooccurrences_count_a_symbol_once_a_row_and_skip_rows_of_no_weight() -> None:
    block = windows([([0, 0, 1], 2), ([1, 2], 2), ([0], 1), ([3], 0)], weights=[1.0, 1.0, 2.0, 0.0])
    counts = cooccurrence_of_blocks(4, 3, [block])
    # c(s, t): (0, 2) 1, (1, 2) 2, (2, 2) 1, (0, 1) 2 (weight 2); the weightless row adds nothing.
    cells = dict(
        zip((counts.pairs.keys // 3 * 10 + counts.pairs.keys % 3).tolist(), counts.pairs.counts.tolist(), strict=True)
    )
    assert cells == {2: 1.0, 12: 2.0, 22: 1.0, 1: 2.0}
    assert counts.symbol_rows.tolist() == [3.0, 2.0, 1.0, 0.0]
    assert counts.target_rows.tolist() == [0.0, 2.0, 2.0]
    knn = ItemKNN.of(counts)
    # sim(s, t) = c(s, t) / sqrt(n(s) n(t)); a window [0, 1, 0] scores t by sim(0, t) + sim(1, t).
    got = knn.scores([np.array([0, 1, 0])])[0]
    expected = [0.0, 2 / math.sqrt(3 * 2), 1 / math.sqrt(3 * 2) + 2 / math.sqrt(2 * 2)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_the_markov_chain_is_the_kneser_ney_bigram_of_the_previous_item_and_popularity_the_target_counts() -> None:
    pairs = PairCounts.from_rows(
        np.array([0, 0, 1, 2, 2, 2]), np.array([1, 2, 2, 0, 0, 1]), None, num_symbols=3, num_targets=3
    )
    bigram = fit_baselines(pairs)
    knn = ItemKNN.of(cooccurrence_of_blocks(3, 3, [windows([([0], 1)])]))
    rankers = RankingBaselines(pairs.target_totals(), bigram, knn)
    scores = rankers.scores([np.array([1, 2]), np.array([0])])
    np.testing.assert_array_equal(scores["most_popular"], [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]])
    every = np.arange(3)
    np.testing.assert_allclose(scores["markov"][0], bigram.prob("kneser_ney", np.full(3, 2), every))
    np.testing.assert_allclose(scores["markov"][1], bigram.prob("kneser_ney", np.full(3, 0), every))
    assert scores["item_knn"][1].tolist() == pytest.approx([0.0, 1.0, 0.0])
