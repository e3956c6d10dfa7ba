"""The attribute-gated head's math: F = 1 is the shared head, EM never decreases the likelihood, folding in an
attribute changes its weights alone, and bad attribute ids are named."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.model.gated import GatedHead, fold_in, gated_estep, gated_m_step
from tests.model.test_kernel_parity import assert_close

RTOL = 1e-12


def rows(shape, n, seed, num_attributes):
    truth = random_distribution(*shape, seed=seed, key_scale=1.5, sigma2=0.7)
    context, query, target = truth.sampler(seed + 1).sample_arrays(n)
    attribute = np.random.default_rng(seed + 2).integers(0, num_attributes, size=n)
    return (context, query, target), attribute


def gated_head(shape, num_factors, num_attributes, seed):
    s, n_pos, d, t = shape
    base = random_distribution(s, n_pos, d, t, seed=seed, key_scale=1.5, sigma2=1.3)
    rng = np.random.default_rng(seed)
    factors = rng.dirichlet(np.ones(t), size=(num_factors, s))
    weights = rng.dirichlet(np.ones(num_factors), size=num_attributes)
    return GatedHead(base.key_means, base.position_prior, base.sigma2, factors, weights)


@pytest.mark.parametrize("weighted", [False, True])
def test_one_factor_is_the_shared_head(weighted):
    shape = (9, 5, 3, 7)
    data, attribute = rows(shape, 400, 3, num_attributes=4)
    head = gated_head(shape, 1, 4, 8)
    weights = np.random.default_rng(0).uniform(0.0, 2.0, size=400) if weighted else None
    gated = gated_estep(head, data, attribute, weights)
    shared = head.shared(0)
    accumulator = shared.estimator().accumulator_factory().make()
    accumulator.seq_update(data, weights, shared)
    value = accumulator.value()
    for name in ("key_sum", "key_mass", "position_count"):
        assert_close(getattr(gated, name), getattr(value, name), rtol=RTOL, label=name)
    assert_close(gated.factor_count[0], value.emission_count.to_dense(), rtol=RTOL, label="emission counts")
    assert_close(gated.scalars, [value.query_sq, value.n_obs, value.log_lik], rtol=RTOL, label="scalars")
    # Every attribute's one weight holds its rows' whole mass.
    assert_close(gated.attribute_count[:, 0], np.bincount(attribute, weights=weights, minlength=4), rtol=RTOL)


def test_gated_em_never_decreases_the_likelihood_and_uses_its_factors():
    shape = (10, 4, 3, 8)
    data, attribute = rows(shape, 1500, 11, num_attributes=3)
    # Attribute-dependent targets: the data the factors are for.
    target = data[2].copy()
    target[attribute == 1] = (target[attribute == 1] * 3 + 1) % 8
    data = (data[0], data[1], target)
    head = gated_head(shape, 2, 3, 12)
    previous = -np.inf
    for _ in range(15):
        stats = gated_estep(head, data, attribute)
        log_lik = float(stats.scalars[2])
        assert log_lik >= previous - 1e-9 * abs(log_lik), (log_lik, previous)
        previous = log_lik
        head = gated_m_step(stats, head, emission_strength=0.0, base=np.zeros(8))
    # Attribute 1 draws on another factor mix than attributes 0 and 2, which share theirs.
    w = head.weights
    assert abs(w[0] - w[2]).max() < abs(w[0] - w[1]).max()


def test_folding_in_an_attribute_changes_its_weights_and_nothing_else():
    shape = (8, 4, 3, 6)
    head = gated_head(shape, 3, 2, 5)
    data, _ = rows(shape, 600, 21, num_attributes=1)
    stats = gated_estep(head, data, np.zeros(600, dtype=np.int64))
    moved = gated_m_step(stats, head, emission_strength=1.0, base=np.full(6, 1 / 6), update=("weights",))
    for name in ("key_means", "position_prior", "factors"):
        assert np.array_equal(getattr(moved, name), getattr(head, name)), name
    assert moved.sigma2 == head.sigma2 and not np.array_equal(moved.weights, head.weights)
    vector = fold_in(head, data, iterations=30)
    assert vector.shape == (3,) and vector.min() >= 0.0 and abs(vector.sum() - 1.0) < 1e-12

    # The folded-in vector explains its rows at least as well as the uniform start.
    def log_lik(weights):
        probe = GatedHead(head.key_means, head.position_prior, head.sigma2, head.factors, weights[None, :])
        return float(gated_estep(probe, data, np.zeros(600, dtype=np.int64)).scalars[2])

    assert log_lik(vector) >= log_lik(np.full(3, 1 / 3))


def test_bad_attribute_ids_and_tables_are_named():
    shape = (5, 3, 2, 4)
    head = gated_head(shape, 2, 3, 1)
    data, attribute = rows(shape, 20, 2, num_attributes=3)
    attribute[7] = 3
    with pytest.raises(ValueError, match=r"attribute\[7\] = 3: expected an attribute id in \[0, 3\)"):
        gated_estep(head, data, attribute)
    with pytest.raises(ValueError, match=r"expected .* integer ids"):
        gated_estep(head, data, attribute[:5])
    with pytest.raises(ValueError, match="weights: a row at"):
        GatedHead(head.key_means, head.position_prior, 1.0, head.factors, head.weights * 2.0)


def test_gated_statistics_add_over_row_splits():
    shape = (7, 3, 2, 5)
    head = gated_head(shape, 2, 2, 4)
    data, attribute = rows(shape, 300, 6, num_attributes=2)
    whole = gated_estep(head, data, attribute)
    first = gated_estep(head, tuple(a[:120] for a in data), attribute[:120])
    second = gated_estep(head, tuple(a[120:] for a in data), attribute[120:])
    for name, a, b in zip(whole._fields, whole, first.plus(second), strict=True):
        assert_close(b, a, rtol=RTOL, label=name)


def test_a_factor_row_without_mass_keeps_its_distribution():
    shape = (6, 2, 2, 4)
    head = gated_head(shape, 2, 1, 9)
    data, attribute = rows(shape, 50, 10, num_attributes=1)
    context = np.where(data[0] == 5, 4, data[0])  # symbol 5 never seen: its rows get no mass
    stats = gated_estep(head, (context, data[1], data[2]), attribute)
    moved = gated_m_step(stats, head, emission_strength=0.0, base=np.zeros(4))
    assert np.array_equal(moved.factors[:, 5], head.factors[:, 5])
    assert not np.array_equal(moved.factors[:, 4], head.factors[:, 4])
