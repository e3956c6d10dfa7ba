"""The fused kernel (and the NumPy backend) against the plain reference, to 1e-10 relative."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionEstimator, random_distribution
from dist_respattn.model.kernels import per_position
from tests.model.reference import reference_m_step, reference_row_statistics, reference_statistics

# (S, N, D, T): ordinary, S < N, T = 1, N = 1, D = 1, and odd sizes that exercise loop tails.
SHAPES = [(12, 4, 3, 7), (3, 6, 2, 5), (9, 3, 4, 1), (10, 1, 5, 6), (8, 5, 1, 4), (31, 7, 13, 17)]
FIELDS = ["key_sum", "key_mass", "emission_count", "position_count", "query_sq", "n_obs", "log_lik"]


def assert_close(actual, expected, *, rtol=1e-10, label=""):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-300)
    error = float(np.max(np.abs(actual - expected), initial=0.0)) / scale
    assert error <= rtol, f"{label}: relative error {error:.3g} > {rtol:g}"


def sample(shape, n, seed, *, weighted):
    truth = random_distribution(*shape, seed=seed, key_scale=1.5, sigma2=0.7)
    context, query, target = truth.sampler(seed + 1).sample_arrays(n)
    weights = np.random.default_rng(seed + 2).uniform(0.0, 3.0, size=n) if weighted else None
    if weighted:
        weights[::7] = 0.0
    # Score under a different model than the one that generated the data, as EM does.
    model = random_distribution(*shape, seed=seed + 3, key_scale=1.5, sigma2=1.3)
    return (context, query, target), weights, model


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))
@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_statistics_match_reference(shape, backend, weighted):
    data, weights, model = sample(shape, 300, seed=sum(shape), weighted=weighted)
    expected = reference_statistics(*data, weights, model.key_means, model.emission, model.position_prior, model.sigma2)
    accumulator = model.estimator().accumulator_factory(backend=backend).make()
    accumulator.seq_update(data, weights, model)
    value = accumulator.value()
    for name in FIELDS:
        assert_close(getattr(value, name), expected[name], label=name)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))
@pytest.mark.parametrize("estimate_sigma2", [False, True])
def test_m_step_matches_reference(shape, estimate_sigma2):
    data, weights, model = sample(shape, 400, seed=7 * sum(shape), weighted=True)
    expected_stats = reference_statistics(
        *data, weights, model.key_means, model.emission, model.position_prior, model.sigma2
    )
    assert np.all(expected_stats["key_mass"] > 0), "every symbol needs mass for the plain reference M-step"
    estimator = ResponsibilityAttentionEstimator(*shape, sigma2=model.sigma2, estimate_sigma2=estimate_sigma2)
    accumulator = estimator.accumulator_factory().make()
    accumulator.seq_update(data, weights, model)
    fitted = estimator.estimate(None, accumulator.value())
    keys, emission, prior, sigma2 = reference_m_step(
        expected_stats, sigma2=model.sigma2, estimate_sigma2=estimate_sigma2, min_sigma2=1e-6, emission_smoothing=1e-6
    )
    assert_close(fitted.key_means, keys, label="key_means")
    assert_close(fitted.emission, emission, label="emission")
    assert_close(fitted.position_prior, prior, label="position_prior")
    assert_close(fitted.sigma2, sigma2, label="sigma2")


def test_float32_queries_give_the_statistics_of_their_float64_values():
    data, _, model = sample((12, 4, 6, 7), 500, seed=3, weighted=False)
    context, query, target = data
    low = query.astype(np.float32)
    a = model.estimator().accumulator_factory().make()
    a.seq_update((context, low, target), None, model)
    b = model.estimator().accumulator_factory().make()
    b.seq_update((context, low.astype(np.float64), target), None, model)
    for name in FIELDS:
        assert_close(getattr(a.value(), name), getattr(b.value(), name), rtol=1e-13, label=name)


def test_row_log_likelihood_matches_reference():
    data, _, model = sample((12, 4, 3, 7), 200, seed=11, weighted=False)
    context, query, target = data
    expected = [reference_row_statistics(context, query, target, model, i)["log_lik"] for i in range(len(target))]
    assert_close(model.seq_log_density(data), expected, label="log_lik")


def test_extreme_distances_stay_finite():
    # Queries far from every key: the log weights are around -1e6, yet responsibilities normalize.
    model = random_distribution(5, 3, 2, 4, seed=0, sigma2=1e-3)
    context = np.array([[0, 1, 2], [3, 4, 0]])
    query = np.array([[40.0, -40.0], [-30.0, 35.0]])
    target = np.array([1, 2])
    expected = reference_statistics(
        context, query, target, None, model.key_means, model.emission, model.position_prior, model.sigma2
    )
    accumulator = model.estimator().accumulator_factory().make()
    accumulator.seq_update((context, query, target), None, model)
    for name in FIELDS:
        assert_close(getattr(accumulator.value(), name), expected[name], label=name)


# (12, 4, 3, 7) has a tiny emission table, read in row order; (800, 3, 2, 800) a 5 MB one, whose
# rows the compiled kernel visits grouped by target.
@pytest.mark.parametrize("shape", [(12, 4, 3, 7), (800, 3, 2, 800)], ids=["small-table", "large-table"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_many_small_blocks_match_one_pass(backend, shape):
    # Blocks of 7 rows: the per-block visiting order and the block boundaries must not change the sums.
    data, weights, model = sample(shape, 300, seed=5, weighted=True)
    expected = reference_statistics(*data, weights, model.key_means, model.emission, model.position_prior, model.sigma2)
    stats = per_position.StatisticArrays.zeros(*shape)
    per_position.accumulate_estep(*data, weights, model.kernel_parameters, stats, backend=backend, block_rows=7)
    assert_close(stats.key_sum, expected["key_sum"], label="key_sum")
    assert_close(stats.emission_count_ts.T, expected["emission_count"], label="emission_count")
    assert_close(stats.scalars, [expected[f] for f in ("query_sq", "n_obs", "log_lik")], label="scalars")
