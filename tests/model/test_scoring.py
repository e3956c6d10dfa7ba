"""Held-out scoring totals, resumable EM runs and the degenerate-fit warnings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dist_respattn import (
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    fit_em,
    random_distribution,
    run_em,
)
from dist_respattn.model.heads.single_hop.diagnostics import PRIOR_COLLAPSE_MASS, degeneracy_warnings
from dist_respattn.model.heads.single_hop.scoring import score_rows
from dist_respattn.model.scores import ScoreTotals


@pytest.fixture(scope="module")
def head_and_rows():
    head = random_distribution(40, 5, 6, 17, seed=3)
    rows = head.sampler(4).sample_arrays(3000)
    return head, rows


@pytest.mark.parametrize("weighted", [False, True])
def test_score_rows_matches_predict_proba_and_log_density(head_and_rows, weighted):
    """The compiled pass equals predict_proba's probability of the target, its arg-max, and seq_log_density."""
    head, (context, query, target) = head_and_rows
    w = np.random.default_rng(0).random(target.size) if weighted else np.ones(target.size)
    totals = score_rows(head, (context, query, target), w if weighted else None)
    proba = head.predict_proba(context, query)
    rows = np.arange(target.size)
    assert totals.weight == pytest.approx(w.sum(), rel=1e-12)
    assert totals.log_lik == pytest.approx(np.sum(w * head.seq_log_density((context, query, target))), rel=1e-12)
    assert totals.target_log_prob == pytest.approx(np.sum(w * np.log(proba[rows, target])), rel=1e-12)
    assert totals.correct == pytest.approx(np.sum(w * (proba.argmax(axis=1) == target)), rel=1e-12)
    metrics = totals.metrics()
    assert metrics["perplexity"] == pytest.approx(math.exp(-totals.target_log_prob / totals.weight))


def test_score_totals_add_over_blocks(head_and_rows):
    """Totals of two halves add up to the totals of the whole (what the engine's combine relies on)."""
    head, (context, query, target) = head_and_rows
    whole = score_rows(head, (context, query, target))
    halves = score_rows(head, (context[:1000], query[:1000], target[:1000])) + score_rows(
        head, (context[1000:], query[1000:], target[1000:])
    )
    for name, value in whole.to_dict().items():
        assert getattr(halves, name) == pytest.approx(value, rel=1e-12)


def test_score_rows_names_a_bad_id(head_and_rows):
    head, (context, query, target) = head_and_rows
    bad = target.copy()
    bad[7] = head.num_targets
    with pytest.raises(ValueError, match=r"target\[7\]"):
        score_rows(head, (context, query, bad))


def test_empty_totals_have_nan_metrics():
    assert all(math.isnan(v) for v in ScoreTotals().metrics().values())


def test_a_resumed_run_takes_the_same_steps(head_and_rows):
    """run_em resumed after iteration k (its model and log-likelihood) ends bit-identical to one run."""
    _, rows = head_and_rows
    estimator = ResponsibilityAttentionEstimator(40, 5, 6, 17, estimate_sigma2=True)
    start = random_distribution(40, 5, 6, 17, seed=9)
    whole = fit_em(rows, estimator, init=start, max_iter=6, tol=0.0)
    first = fit_em(rows, estimator, init=start, max_iter=3, tol=0.0)
    accumulator_factory = estimator.accumulator_factory()

    def e_step(model):
        accumulator = accumulator_factory.make()
        accumulator.seq_update(rows, None, model)
        return accumulator.value()

    rest = run_em(
        e_step,
        estimator,
        init=first.distribution,
        max_iter=6,
        tol=0.0,
        first_iteration=4,
        previous_log_likelihood=first.log_likelihoods[-1],
    )
    assert [it.iteration for it in rest.history] == [4, 5, 6]
    assert first.log_likelihoods + rest.log_likelihoods == whole.log_likelihoods
    for name in ("key_means", "emission", "position_prior"):
        assert np.array_equal(getattr(rest.distribution, name), getattr(whole.distribution, name))
    assert rest.distribution.sigma2 == whole.distribution.sigma2


def test_a_callback_returning_true_stops_the_run(head_and_rows):
    _, rows = head_and_rows
    estimator = ResponsibilityAttentionEstimator(40, 5, 6, 17)
    result = fit_em(rows, estimator, max_iter=10, tol=0.0, callback=lambda record, model: record.iteration == 2)
    assert result.n_iter == 2
    assert result.stopped_by_callback and not result.converged


def test_degeneracy_warnings_name_each_failure():
    """A variance on its floor, a prior on one position and symbols without mass are each reported."""
    s, n, d, t = 6, 4, 3, 5
    prior = np.full(n, (1.0 - PRIOR_COLLAPSE_MASS) / (n - 1))
    prior[2] = PRIOR_COLLAPSE_MASS
    head = ResponsibilityAttentionDistribution(np.zeros((s, d)), np.full((s, t), 1.0 / t), prior, sigma2=1e-3)
    mass = np.array([1.0, 0.0, 2.0, 0.0, 0.0, 3.0])
    warnings = degeneracy_warnings(head, key_mass=mass, min_sigma2=1e-3)
    assert len(warnings) == 3
    assert "min_sigma2" in warnings[0]
    assert "position 2" in warnings[1]
    assert "3 of 6 symbols" in warnings[2]
    healthy = ResponsibilityAttentionDistribution(np.zeros((s, d)), np.full((s, t), 1.0 / t), context_length=n)
    assert degeneracy_warnings(healthy, key_mass=np.ones(s), min_sigma2=1e-3) == []
