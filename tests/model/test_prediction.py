"""Top-K prediction without an (n, T) matrix: equal to a stable sort of ``predict_proba``, in both layouts."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionEstimator, fit_em, random_distribution
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.heads.single_hop.sampler import random_sparse_distribution
from dist_respattn.model.heads.single_hop.scoring import base_order, score_rows, top_k_scratch, top_k_threshold
from dist_respattn.model.heads.single_hop.top_k import predict_top_k


def expected_top_k(model, context, query, k):
    proba = model.predict_proba(context, query)
    order = np.argsort(-proba, kind="stable")[:, :k]
    return order, np.take_along_axis(proba, order, axis=1)


def assert_same_predictions(model, context, query, k):
    top = predict_top_k(model, context, query, k)
    targets, probabilities = expected_top_k(model, context, query, k)
    np.testing.assert_array_equal(top.targets, targets)
    np.testing.assert_allclose(top.probabilities, probabilities, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(top.attention, model.attention_weights(context, query), rtol=1e-12, atol=1e-300)
    return top


@pytest.fixture(scope="module")
def sparse_head_and_rows():
    """A sparse MAP head fitted on sampled rows (its backoff ties targets of equal continuation counts)."""
    shape = (31, 7, 13, 17)
    truth = random_distribution(*shape, seed=5, key_scale=1.5, sigma2=0.7)
    data = truth.sampler(6).sample_arrays(2000)
    heldout = truth.sampler(7).sample_arrays(400)
    estimator = ResponsibilityAttentionEstimator(*shape, emission_prior="continuation")
    model = fit_em(data, estimator, layout="sparse", max_iter=2).distribution
    assert isinstance(model.emission_table, SparseEmission)
    return model, heldout


@pytest.mark.parametrize("k", [1, 3, 17, 40])
def test_dense_top_k_is_the_stable_sort_of_predict_proba(k):
    head = random_distribution(40, 5, 6, 17, seed=3)
    context, query, _ = head.sampler(4).sample_arrays(500)
    top = assert_same_predictions(head, context, query, k)
    assert top.targets.shape == (500, min(k, 17)) and top.targets.dtype == np.int32


@pytest.mark.parametrize("k", [1, 2, 5, 17])
def test_sparse_top_k_is_the_stable_sort_of_predict_proba(sparse_head_and_rows, k):
    model, (context, query, _) = sparse_head_and_rows
    assert_same_predictions(model, context, query, k)


def test_sparse_top_one_is_the_arg_max_the_scores_count(sparse_head_and_rows):
    """The scoring kernel's arg-max is the same search with K = 1: its accuracy counts top-1 hits."""
    model, (context, query, target) = sparse_head_and_rows
    top = predict_top_k(model, context, query, 1)
    assert score_rows(model, (context, query, target)).correct == float(np.sum(top.targets[:, 0] == target))


def test_a_bad_k_or_row_is_refused():
    head = random_distribution(10, 3, 2, 5, seed=1)
    context, query, _ = head.sampler(2).sample_arrays(20)
    with pytest.raises(ValueError, match="k = 0"):
        predict_top_k(head, context, query, 0)
    context = context.copy()
    context[4, 1] = 10
    with pytest.raises(ValueError, match=r"context\[4"):
        predict_top_k(head, context, query, 2)


@pytest.fixture(scope="module")
def large_sparse_head():
    """A sparse head over 78,000 words (smoke-sized support), ties in its stored values and in its base, and
    rows drawn towards the frequent symbols; N < 8 so ``predict_proba`` sums the backoff part in row order."""
    model = random_sparse_distribution(78_000, 6, 4, max_pairs=60, seed=11)
    rng = np.random.default_rng(12)
    context = np.minimum((78_000 * rng.random((40, 6)) ** 3).astype(np.int32), 77_999)
    return model, context, rng.standard_normal((40, 4))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_sparse_top_k_on_a_large_vocabulary_is_the_stable_sort(large_sparse_head, k):
    model, context, query = large_sparse_head
    assert_same_predictions(model, context, query, k)


@pytest.mark.parametrize("seed", range(6))
def test_sparse_top_k_with_many_ties_is_the_stable_sort(seed):
    """Small vocabularies where most targets tie (integer counts, a base of few distinct values) and the K-th
    best is often a target stored for no position of the row."""
    model = random_sparse_distribution(300, 5, 3, max_pairs=40, seed=seed)
    rng = np.random.default_rng(100 + seed)
    context = np.minimum((300 * rng.random((60, 5)) ** 2).astype(np.int32), 299)
    for k in (1, 2, 3, 7):
        assert_same_predictions(model, context, rng.standard_normal((60, 3)), k)


@pytest.mark.parametrize("k", [2, 5])
def test_sparse_top_k_work_is_bounded_by_the_row(large_sparse_head, k):
    """The search visits O(K + row) entries, row being its symbols' stored pairs, where the threshold search
    alone walks every stored entry at N lookups each when the K-th best is stored for no position."""
    model, context, query = large_sparse_head
    table = model.emission_table
    ranked_indptr, ranked_targets, ranked_values = table.ranked_rows
    order = base_order(table)
    attention = model.attention_weights(context, query)
    scratch = top_k_scratch(model.num_targets)
    ctx = context.astype(np.int64)
    n_pos = ctx.shape[1]
    for row in range(ctx.shape[0]):
        row_pairs = int(np.sum(ranked_indptr[ctx[row] + 1] - ranked_indptr[ctx[row]]))
        targets, values = np.empty(k, dtype=np.int64), np.empty(k)
        count, work = top_k_threshold(
            ctx, row, attention[row], table.support.indptr, table.support.symbols, table.values, table.backoff,
            table.base, ranked_indptr, ranked_targets, ranked_values, order, targets, values, *scratch,
        )  # fmt: skip
        assert count == k
        assert work <= 3 * row_pairs + n_pos * n_pos + k, (row, work, row_pairs)
        assert not scratch[1].any(), "the scratch is left clean for the next row"
