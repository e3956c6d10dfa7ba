"""The MAP M-step and the held-out choices: the prior's rows, monotone penalized EM, the grid, the hold-out."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn import (
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionEstimator,
    fit_em,
    random_distribution,
)
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.emission.prior import BASE_PSEUDO_COUNT, EmissionPrior
from dist_respattn.model.fitting.holdout import HoldoutRule, _splitmix64
from dist_respattn.model.fitting.selection import (
    DEFAULT_SEARCH,
    GridTotals,
    Hyperparameters,
    HyperparameterSearch,
    score_grid,
)
from dist_respattn.model.heads.single_hop.scoring import score_rows
from tests.model.emission_layouts import LAYOUTS, counts_in_layout
from tests.model.test_kernel_parity import assert_close

SHAPE = (12, 4, 3, 9)  # S, N, D, T


def sampled(n, seed, shape=SHAPE):
    truth = random_distribution(*shape, seed=seed, key_scale=1.5)
    return truth.sampler(seed + 1).sample_arrays(n)


def pairs_of(data, weights=None, shape=SHAPE):
    context, _, target = data
    return PairCounts.from_rows(context[:, -1], target, weights, num_symbols=shape[0], num_targets=shape[3])


def statistics(data, model, weights=None, shape=SHAPE):
    accumulator = ResponsibilityAttentionAccumulator(*shape)
    if model is None:
        accumulator.seq_initialize_uniform(data, weights)
    else:
        accumulator.seq_update(data, weights, model)
    return accumulator.value()


# ------------------------------------------------------------------------------ the prior's rows


def test_the_continuation_prior_counts_distinct_predecessors_and_successors():
    # symbol 0 precedes targets 1, 2 (twice) and 3; symbol 1 precedes target 2.
    symbols = np.array([0, 0, 0, 0, 1])
    targets = np.array([1, 2, 2, 3, 2])
    pairs = PairCounts.from_rows(symbols, targets, None, num_symbols=3, num_targets=5)
    prior = EmissionPrior.from_pairs(pairs, "continuation")
    mass = np.array([0, 1, 2, 1, 0]) + BASE_PSEUDO_COUNT
    assert_close(prior.base, mass / mass.sum(), rtol=1e-15, label="base")
    assert prior.types.tolist() == [3.0, 1.0, 1.0]  # symbol 2 precedes nothing: at least one type
    unigram = EmissionPrior.from_pairs(pairs, "unigram")
    mass = np.array([0, 1, 3, 1, 0]) + BASE_PSEUDO_COUNT
    assert_close(unigram.base, mass / mass.sum(), rtol=1e-15, label="unigram base")
    uniform = EmissionPrior.from_pairs(pairs, "uniform")
    assert np.all(uniform.base == 0.2) and not uniform.types.any()


def test_a_symbol_seen_only_deep_in_the_windows_still_backs_off():
    """Witten-Bell's strength alone (no emission_strength): symbol 5 has counts at position 0 only, never
    directly before a target, and its row must still give every target some probability."""
    rng = np.random.default_rng(0)
    context = rng.integers(0, 5, size=(400, 3))
    context[:40, 0] = 5
    data = (context, rng.normal(size=(400, 2)), rng.integers(0, 60, size=400))
    estimator = ResponsibilityAttentionEstimator(
        6, 3, 2, 60, emission_prior="continuation", emission_strength=0.0, type_strength=1.0
    )
    model = fit_em(data, estimator, max_iter=2).distribution
    assert np.all(model.emission[5] > 0.0)
    assert np.all(np.isfinite(model.seq_log_density(data)))


def test_estimator_and_fit_em_refuse_options_that_cannot_take_effect():
    with pytest.raises(ValueError, match="uniform prior"):
        ResponsibilityAttentionEstimator(*SHAPE, emission_prior="uniform", emission_strength=0.0, type_strength=1.0)
    data = sampled(300, 1)
    with pytest.raises(ValueError, match="has none"):
        fit_em(data, ResponsibilityAttentionEstimator(*SHAPE), validation=data)
    with pytest.raises(ValueError, match="not both"):
        fit_em(data, recipe(), validation=data, holdout=HoldoutRule(0.1, 16))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_map_rows_are_the_posterior_mode_and_sum_to_one(layout):
    rng = np.random.default_rng(0)
    counts = rng.exponential(size=(6, 7)) * (rng.random((6, 7)) < 0.5)
    counts[2] = 0.0  # a row with no counts is the base scaled by its strength alone
    strength = np.array([0.5, 1.0, 2.0, 0.0, 3.0, 0.1])
    counts[3] = 0.0  # neither counts nor strength: the prior's mean
    base = rng.dirichlet(np.ones(7))
    emission = counts_in_layout(counts, layout).map_emission(strength, base).to_dense()
    with np.errstate(invalid="ignore"):
        expected = (counts + strength[:, None] * base) / (counts.sum(axis=1) + strength)[:, None]
    expected[3] = base
    assert_close(emission, expected, rtol=1e-15, label="emission")
    assert_close(emission.sum(axis=1), np.ones(6), rtol=1e-15, label="row sums")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_additive_smoothing_is_a_uniform_base_of_strength_t_a(layout):
    rng = np.random.default_rng(1)
    counts = rng.exponential(size=(5, 8)) * (rng.random((5, 8)) < 0.6)
    a = 0.3
    uniform = EmissionPrior.uniform(5, 8)
    layered = counts_in_layout(counts, layout)
    assert_close(
        layered.map_emission(uniform.strengths(8 * a, 0.0), uniform.base).to_dense(),
        (counts + a) / (counts.sum(axis=1, keepdims=True) + 8 * a),
        rtol=1e-14,
        label="emission",
    )


# ------------------------------------------------------------------------- monotone penalized EM


def penalized_log_likelihood(model, data, prior, strengths):
    """``sum log p(query, target | context) + sum_s sum_t a_s u_t log B[s, t]``: what MAP-EM raises."""
    log_prior_term = float(np.sum(strengths[:, None] * prior.base[None, :] * np.log(model.emission)))
    return float(np.sum(model.seq_log_density(data))) + log_prior_term


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    emission_strength=st.sampled_from([0.05, 0.5, 3.0]),
    type_strength=st.sampled_from([0.0, 0.5, 2.0]),
    kind=st.sampled_from(["continuation", "unigram", "uniform"]),
    sigma2=st.sampled_from([0.5, 1.7]),
)
def test_map_em_raises_the_penalized_likelihood_monotonically(seed, emission_strength, type_strength, kind, sigma2):
    data = sampled(400, seed)
    prior = EmissionPrior.from_pairs(pairs_of(data), kind)
    estimator = ResponsibilityAttentionEstimator(
        *SHAPE,
        sigma2=sigma2,
        emission_prior=prior,
        emission_strength=emission_strength,
        type_strength=type_strength,
    )
    strengths = prior.strengths(emission_strength, type_strength)
    model = estimator.estimate(None, statistics(data, None))
    objective = penalized_log_likelihood(model, data, prior, strengths)
    for _ in range(8):
        model = estimator.estimate(None, statistics(data, model), previous=model)
        value = penalized_log_likelihood(model, data, prior, strengths)
        assert value >= objective - 1e-9 * abs(objective), f"the penalized likelihood fell: {objective} -> {value}"
        objective = value


# ------------------------------------------------------------------------------------ the grid


def candidates_for(data, seed=0, search=DEFAULT_SEARCH):
    prior = EmissionPrior.from_pairs(pairs_of(data), "continuation")
    estimator = ResponsibilityAttentionEstimator(*SHAPE, emission_prior=prior, search=search)
    first = estimator.estimate(None, statistics(data, None))
    return estimator.candidates(statistics(data, first), previous=first)


def test_every_grid_point_scores_what_its_model_scores():
    data, heldout = sampled(600, 3), sampled(300, 4)
    weights = np.random.default_rng(5).uniform(0.0, 2.0, 300)
    weights[::7] = 0.0
    search = HyperparameterSearch((1.0, 16.0, 2.0**20), (0.1, 3.0), (0.0, 1.0))
    candidates = candidates_for(data, search=search)
    table = candidates.grid_table(search)
    totals = score_grid(table, heldout, weights)
    assert table.shape == (3, 2, 2)
    assert_close(totals.weight, weights.sum(), rtol=1e-14, label="weight")
    for index in np.ndindex(*table.shape):
        hp = table.hyperparameters(index)
        direct = score_rows(candidates.model(hp), heldout, weights)
        assert_close(totals.target_log_prob[index], direct.target_log_prob, rtol=1e-10, label=f"predictive {index}")
        assert_close(totals.log_lik[index], direct.log_lik, rtol=1e-10, label=f"joint {index}")
    selection = candidates.select(table, totals)
    best = max(np.ndindex(*table.shape), key=lambda i: totals.target_log_prob[i])
    assert selection.hyperparameters == table.hyperparameters(best)
    assert_close(
        selection.heldout["perplexity"],
        math.exp(-totals.target_log_prob[best] / totals.weight),
        rtol=1e-14,
        label="perplexity",
    )


@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(1, 299), max_size=4, unique=True))
def test_grid_totals_add_over_blocks(cuts):
    data, heldout = sampled(300, 6), sampled(300, 7)
    candidates = candidates_for(data)
    table = candidates.grid_table(DEFAULT_SEARCH)
    whole = score_grid(table, heldout)
    bounds = [0, *sorted(cuts), 300]
    parts = GridTotals.zeros(table.shape)
    for start, stop in itertools.pairwise(bounds):
        parts = parts + score_grid(table, tuple(a[start:stop] for a in heldout))
    assert_close(parts.target_log_prob, whole.target_log_prob, rtol=1e-12, label="predictive")
    assert_close(parts.log_lik, whole.log_lik, rtol=1e-12, label="joint")


def test_without_held_out_weight_the_defaults_stand():
    data = sampled(200, 8)
    candidates = candidates_for(data)
    table = candidates.grid_table(DEFAULT_SEARCH)
    selection = candidates.select(table, GridTotals.zeros(table.shape))
    assert selection.hyperparameters == candidates.defaults and selection.heldout is None


def test_a_fixed_hyperparameter_is_not_searched():
    data = sampled(200, 9)
    search = HyperparameterSearch(sigma2_scales=None, emission_strengths=(1.0, 10.0), type_strengths=None)
    candidates = candidates_for(data, search=search)
    table = candidates.grid_table(search)
    assert table.shape == (1, 2, 1)
    assert table.sigma2[0] == candidates.defaults.sigma2
    assert table.type_strengths[0] == candidates.defaults.type_strength


# --------------------------------------------------------------------------------- the hold-out


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 50_000), cuts=st.lists(st.integers(0, 50_000), max_size=5))
def test_the_holdout_depends_on_the_row_index_only(rows, cuts):
    rule = HoldoutRule.for_rows(rows)
    whole = rule.held_out(0, rows)
    bounds = sorted({0, rows, *(c for c in cuts if c < rows)})
    pieces = [rule.held_out(a, b) for a, b in itertools.pairwise(bounds)]
    assert np.array_equal(np.concatenate(pieces) if pieces else np.zeros(0, bool), whole)
    assert rule.count(rows) == int(whole.sum())


def test_the_holdout_takes_whole_stripes_near_the_fraction():
    rule = HoldoutRule.for_rows(2_000_000, 0.05)
    assert rule.stripe_rows == 2048
    held = rule.held_out(0, 2_000_000)
    assert 0.04 < held.mean() < 0.06
    stripes = held[: (held.size // 2048) * 2048].reshape(-1, 2048)
    assert np.all(stripes.all(axis=1) | ~stripes.any(axis=1)), "a stripe is held out whole or not at all"
    assert HoldoutRule.for_rows(1000).stripe_rows == 16
    assert not HoldoutRule(0.0).held_out(0, 100).any()


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 50_000), start=st.integers(0, 10**9), length=st.integers(0, 9000))
def test_the_holdout_is_each_row_s_stripe_choice(rows, start, length):
    """The mask repeats each stripe's choice (its hash under the fraction) over its rows: each row's own stripe's,
    looked up row by row."""
    rule = HoldoutRule.for_rows(rows, 0.3)
    stop = start + length
    first = start // rule.stripe_rows
    stripe_of_row = np.arange(start, stop, dtype=np.int64) // rule.stripe_rows
    stripes = np.arange(first, (stop - 1) // rule.stripe_rows + 1, dtype=np.uint64)
    chosen = (_splitmix64(stripes) >> np.uint64(11)).astype(np.float64) * 2.0**-53 < rule.fraction
    want = chosen[stripe_of_row - first] if length else np.zeros(0, bool)
    assert np.array_equal(rule.held_out(start, stop), want)


@pytest.mark.parametrize("weighted", [False, True])
def test_one_side_s_weights_are_those_split_weights_gives(weighted):
    rule = HoldoutRule.for_rows(50_000, 0.2)
    weights = np.random.default_rng(0).uniform(size=7000) if weighted else None
    train, heldout = rule.split_weights(12_345, 7000, weights)
    for side, want in (("train", train), ("heldout", heldout)):
        got = rule.side_weights(12_345, 7000, weights, side)
        assert got.dtype == np.float64 and np.array_equal(got, want)
    assert 0 < heldout.astype(bool).sum() < 7000


def test_split_weights_partition_the_rows():
    rule = HoldoutRule.for_rows(5000, 0.2)
    weights = np.random.default_rng(0).uniform(size=5000)
    train, heldout = rule.split_weights(1234, 5000, weights)
    assert np.array_equal(train + heldout, weights)
    assert np.array_equal(heldout > 0, rule.held_out(1234, 6234))


# ---------------------------------------------------------------------------- fit_em's recipe


def recipe(shape=SHAPE, **kwargs):
    return ResponsibilityAttentionEstimator(*shape, emission_prior="continuation", search=DEFAULT_SEARCH, **kwargs)


def test_fit_em_chooses_on_the_validation_rows_and_reports_their_scores():
    data, validation = sampled(2000, 10), sampled(500, 11)
    seen = []
    result = fit_em(data, recipe(), validation=validation, max_iter=4, tol=0.0, callback=lambda r, m: seen.append(m))
    for record, model in zip(result.history, seen, strict=True):
        assert record.hyperparameters is not None and record.hyperparameters.sigma2 == model.sigma2
        direct = score_rows(model, validation).metrics()
        assert_close(record.heldout["perplexity"], direct["perplexity"], rtol=1e-10, label="held-out perplexity")
        assert_close(
            record.heldout["mean_log_likelihood"], direct["mean_log_likelihood"], rtol=1e-10, label="held-out joint"
        )
    assert result.initial is not None and result.initial.heldout is not None


def test_fit_em_without_validation_holds_out_the_rule_s_rows():
    data = sampled(4000, 12)
    rule = HoldoutRule.for_rows(4000)
    result = fit_em(data, recipe(), max_iter=2, tol=0.0)
    assert result.history[0].n_obs == 4000 - rule.count(4000)
    # The same fit, with those rows given as the validation set and dropped from training, takes the same steps.
    held = rule.held_out(0, 4000)
    explicit = fit_em(
        tuple(a[~held] for a in data),
        recipe(),
        validation=tuple(a[held] for a in data),
        max_iter=2,
        tol=0.0,
    )
    assert_close(explicit.distribution.emission, result.distribution.emission, rtol=1e-12, label="emission")
    assert explicit.history[-1].hyperparameters == result.history[-1].hyperparameters


def test_a_uniform_start_needs_no_seed():
    data = sampled(1000, 13)
    a = fit_em(data, recipe(), max_iter=2, seed=0).distribution
    b = fit_em(data, recipe(), max_iter=2, seed=1).distribution
    assert np.array_equal(a.emission, b.emission) and np.array_equal(a.key_means, b.key_means)
    c = fit_em(data, recipe(), max_iter=2, start="random", seed=1).distribution
    assert not np.array_equal(a.emission, c.emission)


def test_the_chosen_gate_does_not_collapse_on_token_windows():
    # Windows of a token stream with the query the current token's embedding: learned by maximum likelihood,
    # sigma2 falls onto its floor; chosen on held-out rows, it stays where prediction is best.
    from dist_respattn import sequence_windows

    rng = np.random.default_rng(14)
    tokens = rng.choice(20, size=6000, p=rng.dirichlet(np.full(20, 0.5)))
    embeddings = rng.standard_normal((20, 4)) / 2.0
    data = sequence_windows(tokens, 3, num_symbols=20, embeddings=embeddings)
    shape = (20, 3, 4, 20)
    learned = fit_em(
        data, ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True, min_sigma2=1e-6), max_iter=15
    ).distribution
    assert learned.sigma2 < 1e-3
    chosen = fit_em(data, recipe(shape), max_iter=4).history[-1].hyperparameters
    assert isinstance(chosen, Hyperparameters) and chosen.sigma2 > 1e-2
