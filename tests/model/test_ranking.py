"""Ranking metrics (:mod:`dist_respattn.model.ranking`) against hand computations and RecBole's definitions, and the
heads' ``block_proba`` (what ``evaluate --ranking`` ranks) against their own predictions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.ranking import (
    RankingSettings,
    RankingTable,
    RankingTotals,
    check_ranking_k,
    check_ranking_negatives,
    rank_rows,
    sampled_ranks,
    select_block,
    target_ranks,
    unseen_negatives,
)
from dist_respattn.model.rows import EncodedRows, WindowRows


def test_ties_rank_the_target_after_every_candidate_of_equal_score() -> None:
    scores = np.array([
        [0.1, 0.5, 0.2, 0.2],  # target 2: 0.5 above it, 0.2 tied -> rank 3
        [0.1, 0.5, 0.2, 0.2],  # target 1: best -> rank 1
        [0.1, 0.5, 0.2, 0.2],  # target 0: the lowest score -> ranked last, 4 of 4
        [0.3, 0.3, 0.3, 0.3],  # a constant model: every target last
    ])  # fmt: skip
    assert target_ranks(scores, np.array([2, 1, 0, 3])).tolist() == [3, 1, 4, 4]
    # Candidates: row 0 without target 1 -> only the tie remains above; the target itself always counts.
    candidates = np.ones((4, 4), dtype=bool)
    candidates[0, 1] = False
    candidates[1, 1] = False
    assert target_ranks(scores, np.array([2, 1, 0, 3]), candidates).tolist() == [2, 1, 4, 4]
    assert sampled_ranks(scores, np.array([2, 0]), [np.array([0, 3]), np.array([1])]).tolist() == [2, 2]


def test_the_totals_are_recboles_hit_ndcg_and_mrr_of_one_relevant_item() -> None:
    ranks = np.array([1, 3, 10, 11, 200])
    totals = RankingTotals.of(ranks, 10, candidates=5 * 300)
    expected_ndcg = (1 / math.log2(2) + 1 / math.log2(4) + 1 / math.log2(11)) / 5
    assert totals.metrics() == pytest.approx(
        {"hit_rate": 3 / 5, "ndcg": expected_ndcg, "mrr": (1 + 1 / 3 + 1 / 10) / 5, "rows": 5, "mean_candidates": 300}
    )
    # RecBole's own formulas (recbole/evaluator/metrics.py) on its pos_index matrix: row u has a 1 at the target's
    # 0-based position in the top K, and per user the value at column K - 1 is averaged.
    k = 10
    pos_index = np.zeros((ranks.size, k), dtype=bool)
    for u, r in enumerate(ranks):
        if r <= k:
            pos_index[u, r - 1] = True
    hit = (np.cumsum(pos_index, axis=1) > 0)[:, k - 1]
    positions = np.arange(1, k + 1)
    dcg = np.cumsum(np.where(pos_index, 1.0 / np.log2(positions + 1), 0.0), axis=1)[:, k - 1]
    ndcg = dcg / 1.0  # one relevant item: the ideal DCG is 1 / log2(2)
    mrr = np.where(pos_index.any(axis=1), 1.0 / (pos_index.argmax(axis=1) + 1), 0.0)
    got = totals.metrics()
    assert got["hit_rate"] == pytest.approx(hit.mean())
    assert got["ndcg"] == pytest.approx(ndcg.mean())
    assert got["mrr"] == pytest.approx(mrr.mean())


def test_totals_add_up_and_an_empty_table_is_the_identity() -> None:
    a = RankingTotals.of(np.array([1, 4]), 3, 8)
    b = RankingTotals.of(np.array([2]), 3, 4)
    assert a + b == RankingTotals.of(np.array([1, 4, 2]), 3, 12)
    table = RankingTable({"model": {"full": a, "sampled": b}})
    assert RankingTable() + table == table == table + RankingTable()
    assert (table + table).totals["model"]["full"].rows == 4
    assert RankingTotals().metrics()["rows"] == 0 and math.isnan(RankingTotals().metrics()["ndcg"])


def test_negatives_are_seeded_by_document_and_never_seen() -> None:
    seen = np.array([0, 1, 2, 2])
    first = unseen_negatives(50, seen, 10, seed=7, document=3)
    assert first.tolist() == unseen_negatives(50, seen, 10, seed=7, document=3).tolist()
    assert first.size == 10 and np.unique(first).size == 10 and not np.isin(first, seen).any()
    assert first.tolist() != unseen_negatives(50, seen, 10, seed=7, document=4).tolist()
    assert first.tolist() != unseen_negatives(50, seen, 10, seed=8, document=3).tolist()
    # Fewer unseen targets than asked: all of them.
    assert unseen_negatives(5, seen, 10, seed=0, document=0).tolist() == [3, 4]


def test_rank_rows_by_hand_with_exclusion_and_the_sampled_protocol() -> None:
    """T = 6; one row whose history is [0, 1] and target 2; scores put the history above the target."""
    scores = np.array([[0.9, 0.8, 0.5, 0.5, 0.1, 0.6]])
    target, histories, documents = np.array([2]), [np.array([0, 1])], np.array([0])
    # Full: 0, 1, 5 above and 3 tied -> rank 5. Sampled: the unseen targets are exactly 3, 4, 5 (3 negatives) ->
    # 3 (tie) and 5 above -> rank 3, whatever the seed.
    plain = rank_rows({"m": scores}, target, histories, documents, RankingSettings(k=3, negatives=3))
    assert plain.totals["m"]["full"] == RankingTotals(1, 0.0, 0.0, 0.0, 6)
    assert plain.totals["m"]["sampled"] == RankingTotals(1, 1.0, 1 / math.log2(4), 1 / 3, 4)
    # The history excluded: 0 and 1 are no candidates -> 5 above, 3 tied -> rank 3.
    excluded = rank_rows({"m": scores}, target, histories, documents, RankingSettings(k=3, exclude_history=True))
    assert excluded.totals["m"]["full"] == RankingTotals(1, 1.0, 1 / math.log2(4), 1 / 3, 4)
    # A target that is in its history stays a candidate (re-consumption): history [2, 0] -> only 0 excluded.
    again = rank_rows({"m": scores}, target, [np.array([2, 0])], documents, RankingSettings(k=3, exclude_history=True))
    assert again.totals["m"]["full"].candidates == 5
    assert again.totals["m"]["full"].hits == 0.0  # 1, 5 above and 3 tied: rank 4
    # Two negatives of the three unseen: seeded, the same for every model of the table.
    two = rank_rows({"a": scores, "b": -scores}, target, histories, documents, RankingSettings(k=3, negatives=2))
    drawn = unseen_negatives(6, np.array([0, 1, 2]), 2, seed=0, document=0)
    expected_a = 1 + int(np.count_nonzero(scores[0, drawn] >= 0.5))
    expected_b = 1 + int(np.count_nonzero(-scores[0, drawn] >= -0.5))
    assert two.totals["a"]["sampled"].mrr == pytest.approx(1 / expected_a)
    assert two.totals["b"]["sampled"].mrr == pytest.approx(1 / expected_b)


def test_bad_k_and_negatives_are_refused_naming_the_flag() -> None:
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="--ranking\\)"):
            check_ranking_k(bad)
        with pytest.raises(ValueError, match="--ranking-negatives"):
            check_ranking_negatives(bad)
    with pytest.raises(ValueError, match="--ranking-seed"):
        RankingSettings(seed=-1)


def _tied_head(n_pos: int) -> ResponsibilityAttentionDistribution:
    base = random_distribution(7, n_pos, 3, 5, seed=1, sigma2=0.7)
    buckets = PositionBuckets.geometric(n_pos, 3)
    return ResponsibilityAttentionDistribution(
        base.key_means, base.emission, buckets.spread(np.array([0.5, 0.3, 0.2])), base.sigma2, buckets=buckets
    )


def test_a_tied_heads_block_proba_masks_short_histories_and_equals_predict_proba_on_full_windows() -> None:
    head = _tied_head(4)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 7, size=12)
    table = rng.normal(size=(7, 3))
    # Rows: a full window [0, 4), a short one [4, 6) (2 tokens), a single token [6, 7).
    begin, end = np.array([0, 4, 6]), np.array([4, 6, 7])
    rows = WindowRows(tokens, begin, end, np.array([0, 1, 2]), table, tokens[end - 1], None, 0)  # query: previous token
    got = head.block_proba(Block(rows, None))
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got[0], head.predict_proba(tokens[0:4], table[tokens[3]]), rtol=1e-12)
    for r in (1, 2):
        window = tokens[begin[r] : end[r]]
        prior = head.position_prior[4 - window.size :]  # the window's positions: the last ones
        y = table[tokens[end[r] - 1]]
        w = prior * np.exp(-((y - head.key_means[window]) ** 2).sum(axis=1) / (2 * head.sigma2))
        expected = (w / w.sum()) @ head.emission[window]
        np.testing.assert_allclose(got[r], expected, rtol=1e-12)
        assert got[r].sum() == pytest.approx(1.0)


def test_select_block_cuts_encoded_rows_and_windows_alike() -> None:
    context = np.arange(12, dtype=np.int32).reshape(4, 3) % 5
    query = np.arange(8.0).reshape(4, 2)
    target = np.array([0, 1, 2, 3], dtype=np.int32)
    encoded = Block(EncodedRows(context, query, target, None, 10), None, documents=np.array([5, 6, 7, 8]))
    part = select_block(encoded, slice(1, 3))
    assert part.rows.target.tolist() == [1, 2] and part.documents.tolist() == [6, 7]
    np.testing.assert_array_equal(part.rows.context, context[1:3])
    windows = Block(WindowRows.from_encoded(context, query, target), np.ones(4))
    cut = select_block(windows, slice(2, 4))
    assert cut.rows.target.tolist() == [2, 3] and cut.weights.tolist() == [1.0, 1.0]
    assert [cut.rows.tokens[b:e].tolist() for b, e in zip(cut.rows.begin, cut.rows.end, strict=True)] == [
        context[2].tolist(),
        context[3].tolist(),
    ]
