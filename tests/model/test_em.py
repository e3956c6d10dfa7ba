"""The in-process EM loop and the M-step: monotone likelihood, recovery of a known head, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dist_respattn import (
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    SufficientStatistics,
    fit_em,
    random_distribution,
    run_em,
)
from dist_respattn.model.heads.single_hop.diagnostics import recovery_report
from tests.model.test_kernel_parity import assert_close

SEEDS = [0, 1, 2]


def sampled(shape, n, seed, *, key_scale=1.5, sigma2=1.0):
    truth = random_distribution(*shape, seed=seed, key_scale=key_scale, sigma2=sigma2)
    return truth, truth.sampler(seed + 1000).sample_arrays(n)


def statistics(data, model, weights=None) -> SufficientStatistics:
    accumulator = ResponsibilityAttentionAccumulator(
        model.num_symbols, model.context_length, model.query_dim, model.num_targets
    )
    accumulator.seq_update(data, weights, model)
    return accumulator.value()


def mean_log_likelihood(model, data) -> float:
    return float(np.mean(model.seq_log_density(data)))


# ----------------------------------------------------------------------------- monotone EM


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("estimate_sigma2", [False, True], ids=["fixed-sigma2", "learned-sigma2"])
def test_em_never_decreases_the_log_likelihood(seed, estimate_sigma2):
    # Overlapping keys (key_scale 1.5 against sigma 1) make EM take many small steps: the regime where a
    # wrong M-step term would show up as a decrease.
    shape = (15, 4, 3, 6)
    _, data = sampled(shape, 3000, seed)
    # Plain EM (no emission smoothing, no prior on the positions) maximizes the likelihood itself, so
    # every step must not decrease it; smoothing would make it MAP-EM, monotone in another objective.
    estimator = ResponsibilityAttentionEstimator(
        *shape, sigma2=1.7, estimate_sigma2=estimate_sigma2, emission_smoothing=0.0
    )
    models = []
    result = fit_em(data, estimator, max_iter=30, tol=0.0, seed=seed, callback=lambda _, m: models.append(m))
    lls = result.log_likelihoods
    assert result.n_iter == 30 and not result.converged
    assert all(np.isfinite(lls))
    # The slack is for float summation order only; an EM step gains far more than 1e-9 until it has
    # converged to that precision.
    for k in range(1, len(lls)):
        assert lls[k] >= lls[k - 1] - 1e-9 * abs(lls[k - 1]), f"iteration {k + 1}: {lls[k]!r} < {lls[k - 1]!r}"
    assert mean_log_likelihood(result.distribution, data) >= lls[-1] - 1e-9 * abs(lls[-1])
    assert lls[-1] > lls[0], "EM made no progress from the random initialization"
    if not estimate_sigma2:
        assert all(m.sigma2 == 1.7 for m in models)
    # Iteration k reports the likelihood of the model its E-step used: the M-step result of iteration k - 1.
    for k in range(1, len(lls)):
        assert_close(lls[k], mean_log_likelihood(models[k - 1], data), rtol=1e-12, label=f"iteration {k + 1}")


def test_weighted_em_never_decreases_the_weighted_log_likelihood():
    shape = (10, 3, 2, 5)
    _, data = sampled(shape, 2000, 5)
    weights = np.random.default_rng(5).uniform(0.0, 2.0, size=2000)
    weights[::5] = 0.0
    estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True, emission_smoothing=0.0)
    result = fit_em(data, estimator, weights=weights, max_iter=20, tol=0.0, seed=5)
    lls = result.log_likelihoods
    for k in range(1, len(lls)):
        assert lls[k] >= lls[k - 1] - 1e-9 * abs(lls[k - 1])
    assert all(it.n_obs == pytest.approx(weights.sum(), rel=1e-12) for it in result.history)
    final = result.distribution.seq_log_density(data)
    assert float(np.dot(weights, final) / weights.sum()) >= lls[-1] - 1e-9 * abs(lls[-1])


# --------------------------------------------------------------------------------- recovery


@pytest.mark.parametrize("seed", SEEDS)
def test_em_recovers_a_known_head(seed):
    shape = (40, 6, 8, 12)
    truth = random_distribution(*shape, seed=seed, key_scale=3.0, sigma2=1.0)
    data = truth.sampler(seed + 1000).sample_arrays(40_000)
    estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True)
    result = fit_em(data, estimator, max_iter=200, tol=1e-8, seed=seed)
    report = recovery_report(truth, result.distribution)
    # Tolerances, against the sampling error of 40k rows (about 1k rows per symbol, 3.3k per target row):
    # - keys: per-coordinate error ~ sigma / sqrt(1000) = 0.03 against key RMS 3, i.e. ~1% relative;
    #   over seeds 0..99 the worst seen was 1.3%, so 3% leaves a wide margin.
    # - prior: sum_i |pi_hat - pi| ~ sum_i sqrt(2 pi_i / (pi n)) ~ 0.01 (worst seen 0.015) against 0.05.
    # - emission: mean TV ~ 0.5 sum_t sqrt(2 B_t / (pi 1000)) ~ 0.03 (worst seen 0.037) against 0.1.
    # - sigma2: relative sd sqrt(2 / (n D)) = 0.25% (worst seen 0.8%) against 5%.
    # Keys 3 sigma apart in 8 dimensions make the responsibilities nearly hard, so EM converges in about
    # ten iterations to the maximum-likelihood estimate, not to a local optimum (none seen in 100 seeds).
    assert result.converged
    assert report["key_rmse_relative"] < 0.03, report
    assert report["prior_l1"] < 0.05, report
    assert report["emission_tv_mean"] < 0.1, report
    assert abs(report["sigma2_ratio"] - 1.0) < 0.05, report


# ------------------------------------------------------------------------------- backends


def test_numba_and_numpy_backends_fit_the_same_parameters():
    shape = (20, 5, 4, 8)
    _, data = sampled(shape, 5000, 3)
    weights = np.random.default_rng(3).uniform(0.0, 2.0, size=5000)
    fits = {}
    for backend in ("numba", "numpy"):
        estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True)
        fits[backend] = fit_em(data, estimator, weights=weights, max_iter=5, tol=0.0, seed=7, backend=backend)
    a, b = fits["numba"].distribution, fits["numpy"].distribution
    assert_close(a.key_means, b.key_means, rtol=1e-9, label="key_means")
    assert_close(a.emission, b.emission, rtol=1e-9, label="emission")
    assert_close(a.position_prior, b.position_prior, rtol=1e-9, label="position_prior")
    assert_close(a.sigma2, b.sigma2, rtol=1e-9, label="sigma2")
    assert_close(fits["numba"].log_likelihoods, fits["numpy"].log_likelihoods, rtol=1e-9, label="log-likelihoods")


def test_fit_em_is_deterministic_for_a_seed():
    shape = (8, 3, 2, 4)
    _, data = sampled(shape, 1000, 9)
    estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True)
    a = fit_em(data, estimator, max_iter=4, tol=0.0, seed=42).distribution
    b = fit_em(data, estimator, max_iter=4, tol=0.0, seed=np.random.default_rng(42)).distribution
    for name in ("key_means", "emission", "position_prior"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.sigma2 == b.sigma2


# --------------------------------------------------------------------------------- run_em


class RecordingEStep:
    """An in-process E-step that records the models it is called with."""

    def __init__(self, data, estimator, seed=0):
        self.data = data
        self.estimator = estimator
        self.rng = np.random.default_rng(seed)
        self.calls: list[ResponsibilityAttentionDistribution | None] = []

    def __call__(self, model):
        self.calls.append(model)
        accumulator = self.estimator.accumulator_factory().make()
        if model is None:
            accumulator.seq_initialize(self.data, None, self.rng)
        else:
            accumulator.seq_update(self.data, None, model)
        return accumulator.value()


def test_run_em_with_init_skips_the_random_initialization():
    shape = (6, 3, 2, 4)
    _, data = sampled(shape, 500, 1)
    init = random_distribution(*shape, seed=2)
    estimator = ResponsibilityAttentionEstimator(*shape)
    e_step = RecordingEStep(data, estimator)
    result = run_em(e_step, estimator, init=init, max_iter=3, tol=0.0)
    assert len(e_step.calls) == 3
    assert None not in e_step.calls
    assert e_step.calls[0] is init
    assert_close(result.log_likelihoods[0], mean_log_likelihood(init, data), rtol=1e-12, label="first iteration")
    # Without init, the first call is the random initialization.
    e_step = RecordingEStep(data, estimator)
    run_em(e_step, estimator, max_iter=2, tol=0.0)
    assert e_step.calls[0] is None and len(e_step.calls) == 3


def test_fit_em_with_init_does_not_use_the_seed():
    shape = (6, 3, 2, 4)
    _, data = sampled(shape, 500, 4)
    init = random_distribution(*shape, seed=8)
    estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True)
    a = fit_em(data, estimator, init=init, max_iter=3, seed=0).distribution
    b = fit_em(data, estimator, init=init, max_iter=3, seed=1).distribution
    assert np.array_equal(a.key_means, b.key_means) and a.sigma2 == b.sigma2


def test_max_iter_zero_returns_the_init():
    shape = (6, 3, 2, 4)
    _, data = sampled(shape, 200, 6)
    init = random_distribution(*shape, seed=3)
    estimator = ResponsibilityAttentionEstimator(*shape)
    e_step = RecordingEStep(data, estimator)
    result = run_em(e_step, estimator, init=init, max_iter=0)
    assert result.distribution is init
    assert result.n_iter == 0 and result.history == [] and not result.converged
    assert e_step.calls == []
    result = fit_em(data, estimator, init=init, max_iter=0)
    assert result.distribution is init and result.n_iter == 0
    with pytest.raises(ValueError, match="max_iter"):
        run_em(e_step, estimator, init=init, max_iter=-1)


def test_convergence_flag():
    shape = (6, 3, 2, 4)
    _, data = sampled(shape, 500, 7)
    estimator = ResponsibilityAttentionEstimator(*shape)
    # The first iteration has nothing to compare with, so the earliest possible stop is the second.
    result = fit_em(data, estimator, max_iter=50, tol=1e300, seed=0)
    assert result.converged and result.n_iter == 2
    assert math.isinf(result.history[0].change)
    assert result.history[1].change < 1e300
    result = fit_em(data, estimator, max_iter=4, tol=0.0, seed=0)
    assert not result.converged and result.n_iter == 4
    assert [it.iteration for it in result.history] == [1, 2, 3, 4]


def test_run_em_rejects_an_e_step_with_no_rows():
    shape = (4, 2, 2, 3)
    estimator = ResponsibilityAttentionEstimator(*shape)
    empty = estimator.accumulator_factory().make().value()
    with pytest.raises(ValueError, match="no weighted rows"):
        run_em(lambda model: empty, estimator, init=random_distribution(*shape, seed=0), max_iter=1)


# ------------------------------------------------------------------------- M-step edge cases


def stats_without_symbol(shape, missing, seed=0, n=400):
    """Statistics of data whose contexts never hold symbol ``missing`` (so its mass is exactly zero)."""
    truth, (context, query, target) = sampled(shape, n, seed)
    context = np.where(context == missing, (missing + 1) % shape[0], context)
    value = statistics((context, query, target), truth)
    assert value.key_mass[missing] == 0.0 and np.all(value.key_mass[np.arange(shape[0]) != missing] > 0)
    return value


@pytest.mark.parametrize("estimate_sigma2", [False, True])
def test_zero_mass_symbol_keeps_the_previous_key(estimate_sigma2):
    shape = (6, 1, 3, 4)  # N = 1 allows a repeated symbol, so removing one keeps the contexts valid
    value = stats_without_symbol(shape, missing=2)
    previous = random_distribution(*shape, seed=99)
    estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=estimate_sigma2)
    fitted = estimator.estimate(None, value, previous=previous)
    assert np.array_equal(fitted.key_means[2], previous.key_means[2])
    live = np.arange(6) != 2
    assert_close(fitted.key_means[live], value.key_sum[live] / value.key_mass[live, None], rtol=1e-14, label="keys")
    assert np.all(np.isfinite(fitted.key_means))


def test_zero_mass_symbol_takes_the_pooled_mean_query_without_previous():
    shape = (6, 1, 3, 4)
    value = stats_without_symbol(shape, missing=4)
    fitted = ResponsibilityAttentionEstimator(*shape).estimate(None, value)
    pooled = value.key_sum.sum(axis=0) / value.key_mass.sum()
    assert_close(fitted.key_means[4], pooled, rtol=1e-14, label="pooled key")
    assert np.all(np.isfinite(fitted.key_means))


@pytest.mark.parametrize("estimate_sigma2", [False, True])
def test_statistics_with_no_mass_give_a_defined_model(estimate_sigma2):
    shape = (4, 3, 2, 5)
    empty = ResponsibilityAttentionAccumulator(*shape).value()
    for smoothing in (0.0, 1e-6):
        estimator = ResponsibilityAttentionEstimator(
            *shape, sigma2=2.5, estimate_sigma2=estimate_sigma2, emission_smoothing=smoothing
        )
        fitted = estimator.estimate(None, empty)
        assert np.array_equal(fitted.key_means, np.zeros((4, 2)))
        assert np.allclose(fitted.emission, 0.2, rtol=1e-14, atol=0)
        assert np.allclose(fitted.position_prior, 1 / 3, rtol=1e-14, atol=0)
        assert fitted.sigma2 == 2.5
        previous = random_distribution(*shape, seed=1, sigma2=0.3)
        fitted = estimator.estimate(None, empty, previous=previous)
        assert np.array_equal(fitted.key_means, previous.key_means)
        # A learned variance with no mass to learn from stays where the E-step's model had it.
        assert fitted.sigma2 == (0.3 if estimate_sigma2 else 2.5)


def test_unsmoothed_empty_emission_row_is_uniform():
    shape = (5, 2, 2, 4)
    truth, data = sampled(shape, 300, 2)
    value = statistics(data, truth)
    counts = np.array(value.emission_count)
    counts[3] = 0.0
    value = value._replace(emission_count=counts)
    fitted = ResponsibilityAttentionEstimator(*shape, emission_smoothing=0.0).estimate(None, value)
    assert np.array_equal(fitted.emission[3], np.full(4, 0.25))
    rows = [0, 1, 2, 4]
    expected = counts[rows] / counts[rows].sum(axis=1, keepdims=True)
    assert_close(fitted.emission[rows], expected, rtol=1e-14, label="emission")
    assert not np.any(np.isnan(fitted.emission))


@pytest.mark.parametrize("pseudo_count", [0.0, 0.5, 3.0, 1e4])
def test_pseudo_count_is_a_symmetric_dirichlet_prior_on_positions(pseudo_count):
    shape = (7, 4, 2, 3)
    truth, data = sampled(shape, 250, 3)
    value = statistics(data, truth)
    for estimator in (
        ResponsibilityAttentionEstimator(*shape, pseudo_count=pseudo_count),
        truth.estimator(pseudo_count=pseudo_count),
    ):
        fitted = estimator.estimate(None, value)
        # The posterior mean under Dirichlet(a/N, ..., a/N): (count_i + a/N) / (sum count + a).
        expected = (value.position_count + pseudo_count / 4) / (value.position_count.sum() + pseudo_count)
        assert_close(fitted.position_prior, expected, rtol=1e-13, label="position_prior")
    no_prior = ResponsibilityAttentionEstimator(*shape).estimate(None, value)
    assert_close(no_prior.position_prior, value.position_count / value.n_obs, rtol=1e-13, label="no prior")
    # With no counts, the prior alone is uniform.
    empty = ResponsibilityAttentionAccumulator(*shape).value()
    fitted = ResponsibilityAttentionEstimator(*shape, pseudo_count=pseudo_count).estimate(None, empty)
    assert np.allclose(fitted.position_prior, 0.25, rtol=1e-14, atol=0)


def test_learned_sigma2_is_floored_at_min_sigma2():
    shape = (5, 1, 3, 2)
    truth = random_distribution(*shape, seed=4)
    context = np.repeat(np.arange(5), 20)[:, None]
    # Queries exactly at the keys: the within-symbol scatter is zero (or a rounding error either side).
    query = truth.key_means[context[:, 0]]
    target = np.zeros(100, dtype=np.int64)
    value = statistics((context, query, target), truth)
    for min_sigma2 in (1e-6, 1e-3, 0.7):
        estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True, min_sigma2=min_sigma2)
        assert estimator.estimate(None, value).sigma2 == min_sigma2
    # A floor above the data's variance wins too; below it, the variance is learned.
    _, data = sampled(shape, 2000, 4, sigma2=1.0)
    value = statistics(data, truth)
    high = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True, min_sigma2=50.0).estimate(None, value)
    assert high.sigma2 == 50.0
    low = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True, min_sigma2=1e-6).estimate(None, value)
    assert 0.5 < low.sigma2 < 2.0


@pytest.mark.parametrize("seed", SEEDS)
def test_learned_sigma2_never_below_min_sigma2_during_em(seed):
    shape = (6, 2, 2, 3)
    _, data = sampled(shape, 500, seed, sigma2=1e-4, key_scale=3.0)
    estimator = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True, min_sigma2=0.05)
    seen: list[float] = []
    result = fit_em(data, estimator, max_iter=15, tol=0.0, seed=seed, callback=lambda _, m: seen.append(m.sigma2))
    assert min(seen) >= 0.05
    assert result.distribution.sigma2 >= 0.05


def test_learned_sigma2_is_the_pooled_within_symbol_variance():
    shape = (6, 3, 4, 5)
    truth, data = sampled(shape, 800, 8)
    context, query, target = data
    value = statistics(data, truth)
    fitted = ResponsibilityAttentionEstimator(*shape, estimate_sigma2=True).estimate(None, value)
    # Directly: sum_n sum_i r_ni ||y_n - K_new[c_ni]||^2 / (D sum_n 1), with r from the E-step's model.
    r = truth.attention_weights(context, query, target)
    diff = query[:, None, :] - fitted.key_means[context]
    expected = float(np.sum(r * np.einsum("nid,nid->ni", diff, diff))) / (4 * 800)
    assert_close(fitted.sigma2, expected, rtol=1e-10, label="sigma2")
