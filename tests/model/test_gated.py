"""The attribute-gated head's math: F = 1 is the shared head, EM never decreases the likelihood, folding in an
attribute changes its weights alone, and bad attribute ids are named."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.model.emission.layouts import PairSupport
from dist_respattn.model.heads.gated.head import (
    FactorTables,
    GatedHead,
    GatedStatistics,
    fold_in,
    gated_estep,
    gated_log_likelihood,
    gated_m_step,
)
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator
from tests.model.test_kernel_parity import assert_close

RTOL = 1e-12


def rows(shape, n, seed, num_attributes):
    truth = random_distribution(*shape, seed=seed, key_scale=1.5, sigma2=0.7)
    context, query, target = truth.sampler(seed + 1).sample_arrays(n)
    attribute = np.random.default_rng(seed + 2).integers(0, num_attributes, size=n)
    return (context, query, target), attribute


def shared_statistics(shared, data, weights):
    """The shared head's E-step statistics (its emission is sparse, on the factors' support)."""
    s, n_pos, d, t = shared.num_symbols, shared.context_length, shared.query_dim, shared.num_targets
    support = shared.emission_table.support
    accumulator = ResponsibilityAttentionAccumulator(s, n_pos, d, t, layout="sparse", support=support)
    accumulator.seq_update(data, weights, shared)
    return accumulator.value()


def gated_head(shape, num_factors, num_attributes, seed):
    s, n_pos, d, t = shape
    base = random_distribution(s, n_pos, d, t, seed=seed, key_scale=1.5, sigma2=1.3)
    rng = np.random.default_rng(seed)
    factors = rng.dirichlet(np.ones(t), size=(num_factors, s))
    weights = rng.dirichlet(np.ones(num_factors), size=num_attributes)
    return GatedHead.from_dense(base.key_means, base.position_prior, base.sigma2, factors, weights)


@pytest.mark.parametrize("weighted", [False, True])
def test_one_factor_is_the_shared_head(weighted):
    shape = (9, 5, 3, 7)
    data, attribute = rows(shape, 400, 3, num_attributes=4)
    head = gated_head(shape, 1, 4, 8)
    weights = np.random.default_rng(0).uniform(0.0, 2.0, size=400) if weighted else None
    gated = gated_estep(head, data, attribute, weights)
    shared = head.shared(0)
    value = shared_statistics(shared, data, weights)
    for name in ("key_sum", "key_mass", "position_count"):
        assert_close(getattr(gated, name), getattr(value, name), rtol=RTOL, label=name)
    support = head.factors.support
    dense_counts = value.emission_count.on(support).to_dense()[support.symbols, support.targets]
    assert_close(gated.factor_count[:, 0], dense_counts, rtol=RTOL, label="emission counts")
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
        head = gated_m_step(stats, head, strength=np.zeros(10))
    # Attribute 1 draws on another factor mix than attributes 0 and 2, which share theirs.
    w = head.weights
    assert abs(w[0] - w[2]).max() < abs(w[0] - w[1]).max()


def test_folding_in_an_attribute_changes_its_weights_and_nothing_else():
    shape = (8, 4, 3, 6)
    head = gated_head(shape, 3, 2, 5)
    data, _ = rows(shape, 600, 21, num_attributes=1)
    stats = gated_estep(head, data, np.zeros(600, dtype=np.int64))
    moved = gated_m_step(stats, head, strength=np.ones(8), update=("weights",))
    for name in ("key_means", "position_prior"):
        assert np.array_equal(getattr(moved, name), getattr(head, name)), name
    assert moved.factors is head.factors
    assert moved.sigma2 == head.sigma2 and not np.array_equal(moved.weights, head.weights)
    vector = fold_in(head, data, iterations=30)
    assert vector.shape == (3,) and vector.min() >= 0.0 and abs(vector.sum() - 1.0) < 1e-12

    # The folded-in vector explains its rows at least as well as the uniform start.
    def log_lik(weights):
        probe = head.with_weights(weights[None, :])
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
    with pytest.raises(ValueError, match="weights: row 0 does not sum to 1"):
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
    moved = gated_m_step(stats, head, strength=np.zeros(6))
    before, after = head.factors.to_dense(), moved.factors.to_dense()
    assert np.array_equal(after[:, 5], before[:, 5])
    assert not np.array_equal(after[:, 4], before[:, 4])


def sparse_gated_head(shape, num_factors, num_attributes, seed, data, *, per_attribute_prior=False):
    """Factors on the support of ``data``'s pairs, with a continuation-like backoff off it."""
    s, n_pos, _, t = shape
    base_head = random_distribution(s, n_pos, shape[2], t, seed=seed, key_scale=1.5, sigma2=1.3)
    context, _, target = data
    keys = np.unique(np.repeat(target.astype(np.int64), n_pos) * s + context.reshape(-1))
    support = PairSupport.from_keys(keys, s, t)
    rng = np.random.default_rng(seed)
    u = rng.dirichlet(np.ones(t))
    counts = rng.gamma(1.0, size=(support.num_pairs, num_factors))
    tables = FactorTables(support, np.zeros_like(counts), np.zeros((num_factors, s)), u)
    stats = GatedStatistics(
        np.zeros((s, shape[2])), np.zeros(s), np.zeros((1, n_pos)), counts, np.zeros((num_attributes, num_factors)),
        np.zeros(3),
    )  # fmt: skip
    prior = rng.dirichlet(np.ones(n_pos), size=num_attributes if per_attribute_prior else 1)
    start = GatedHead(
        base_head.key_means, prior, base_head.sigma2, tables, rng.dirichlet(np.ones(num_factors), size=num_attributes)
    )
    return gated_m_step(stats, start, strength=np.full(s, 0.7), update=("factors",))


def test_sparse_factors_mix_into_each_attributes_sparse_emission():
    shape = (12, 4, 3, 9)
    data, attribute = rows(shape, 500, 31, num_attributes=3)
    head = sparse_gated_head(shape, 3, 3, 32, data, per_attribute_prior=True)
    dense = head.factors.to_dense()
    assert_close(dense.sum(axis=2), np.ones((3, 12)), rtol=RTOL, label="factor rows sum to 1")
    per_row = gated_log_likelihood(head, data, attribute)
    for a in range(3):
        mine = attribute == a
        plain = head.shared(a).seq_log_density(tuple(v[mine] for v in data))
        assert_close(per_row[mine], plain, rtol=RTOL, label=f"attribute {a}")
    # The E-step's log-likelihood is the rows' sum, and scoring every candidate holds each row's own column.
    stats = gated_estep(head, data, attribute)
    assert_close(stats.scalars[2], per_row.sum(), rtol=RTOL, label="log-likelihood")
    table = gated_log_likelihood(head, data, candidates=np.arange(3))
    assert_close(table[np.arange(500), attribute], per_row, rtol=RTOL, label="candidates")


def test_float32_queries_give_what_their_float64_values_give():
    """A store keeps its queries as float32: the E-step and every score are those of the same numbers in float64.
    (In CI's warm-up this also builds the gated kernels' float32 versions once, before the suite's worker processes
    would each build them.)"""
    shape = (12, 4, 3, 9)
    data, attribute = rows(shape, 300, 51, num_attributes=3)
    head = sparse_gated_head(shape, 2, 3, 52, data)
    low = (data[0], data[1].astype(np.float32), data[2])
    high = (data[0], low[1].astype(np.float64), data[2])
    assert low[1].dtype == np.float32
    statistics = gated_estep(head, low, attribute), gated_estep(head, high, attribute)
    for name, a, b in zip(GatedStatistics._fields, *statistics, strict=True):
        assert_close(a, b, rtol=1e-13, label=name)
    for given_query in (False, True):
        assert_close(gated_log_likelihood(head, low, attribute, given_query=given_query),
                     gated_log_likelihood(head, high, attribute, given_query=given_query), rtol=1e-13)  # fmt: skip
    assert_close(gated_log_likelihood(head, low, candidates=np.arange(3)),
                 gated_log_likelihood(head, high, candidates=np.arange(3)), rtol=1e-13)  # fmt: skip


def test_one_sparse_factor_is_the_shared_sparse_head():
    shape = (12, 4, 3, 9)
    data, attribute = rows(shape, 500, 41, num_attributes=2)
    head = sparse_gated_head(shape, 1, 2, 42, data)
    shared = head.shared(0)
    value = shared_statistics(shared, data, None)
    gated = gated_estep(head, data, attribute)
    assert_close(gated.factor_count[:, 0], value.emission_count.values_array(), rtol=RTOL, label="pair counts")
    assert_close(gated.scalars, [value.query_sq, value.n_obs, value.log_lik], rtol=RTOL, label="scalars")
    # Its M-step is the shared head's MAP M-step on the same strengths and base.
    strength = np.full(12, 0.7)
    moved = gated_m_step(gated, head, strength=strength)
    emission = value.emission_count.on(head.factors.support).map_emission(strength, head.factors.base)
    assert_close(moved.factors.values[:, 0], emission.values, rtol=RTOL, label="values")
    assert_close(moved.factors.backoff[0], emission.backoff, rtol=RTOL, label="backoff")


def test_identity_weights_are_one_separate_head_per_attribute():
    shape = (10, 3, 2, 6)
    data, attribute = rows(shape, 400, 51, num_attributes=3)
    head = sparse_gated_head(shape, 3, 3, 52, data, per_attribute_prior=True)
    untied = GatedHead(head.key_means, head.position_prior, head.sigma2, head.factors, np.eye(3), fixed_weights=True)
    stats = gated_estep(untied, data, attribute)
    # Each attribute's rows fill its own factor alone, and the weights never move.
    assert_close(stats.attribute_count, np.diag(np.bincount(attribute, minlength=3)), rtol=RTOL, label="mass")
    moved = gated_m_step(stats, untied, strength=np.full(10, 0.5))
    assert np.array_equal(moved.weights, np.eye(3))
    for a in range(3):
        assert_close(moved.position_prior[a], stats.position_count[a] / stats.position_count[a].sum(), rtol=RTOL)


def test_a_head_survives_its_arrays_and_a_pickle():
    import pickle

    shape = (10, 3, 2, 6)
    data, attribute = rows(shape, 200, 61, num_attributes=2)
    head = sparse_gated_head(shape, 2, 2, 62, data, per_attribute_prior=True)
    expected = gated_log_likelihood(head, data, attribute)
    arrays, meta = head.to_arrays()
    for copy in (GatedHead.from_arrays(arrays, meta), pickle.loads(pickle.dumps(head))):
        assert np.array_equal(gated_log_likelihood(copy, data, attribute), expected)
    assert "_kernel_cache" not in pickle.loads(pickle.dumps(head)).__dict__


def test_neighbours_are_nearest_in_hellinger_distance_over_dense_rows():
    from dist_respattn.model.emission.neighbours import emission_neighbours

    shape = (12, 4, 3, 9)
    data, _ = rows(shape, 300, 71, num_attributes=2)
    head = sparse_gated_head(shape, 2, 2, 72, data)
    emission = head.emission_of(1)
    dense = emission.to_dense()
    expected = np.sqrt(np.clip(1.0 - np.sqrt(dense * dense[3]).sum(axis=1), 0.0, None))
    expected[3] = np.inf
    ids, distances = emission_neighbours(emission, 3, 4)
    assert np.array_equal(ids, np.argsort(expected, kind="stable")[:4])
    assert_close(distances, expected[ids], rtol=1e-9, label="distances")


def test_a_mix_of_one_attribute_is_that_attribute_and_generation_is_seeded():
    from dist_respattn.model.heads.gated.use import generate, mixed_head

    shape = (9, 3, 2, 9)
    data, _ = rows(shape, 300, 81, num_attributes=3)
    head = sparse_gated_head(shape, 2, 3, 82, data, per_attribute_prior=True)
    alone = mixed_head(head, {2: 5.0})
    assert_close(alone.emission_table.to_dense(), head.emission_of(2).to_dense(), rtol=RTOL, label="emission")
    assert_close(alone.position_prior, head.prior_of(2), rtol=RTOL, label="prior")
    half = mixed_head(head, {0: 1.0, 1: 1.0}).emission_table.to_dense()
    assert_close(half, 0.5 * (head.emission_of(0).to_dense() + head.emission_of(1).to_dense()), rtol=RTOL)
    table = np.random.default_rng(0).normal(size=(9, 2))
    first = generate(alone, table, np.array([1, 2, 3]), 40, np.random.default_rng(5))
    again = generate(alone, table, np.array([1, 2, 3]), 40, np.random.default_rng(5))
    other = generate(alone, table, np.array([1, 2, 3]), 40, np.random.default_rng(6))
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert first.min() >= 0 and first.max() < 9
    with pytest.raises(ValueError, match="positive shares"):
        mixed_head(head, {0: -1.0})


def test_target_log_probabilities_match_the_shared_heads_predictions():
    shape = (10, 3, 2, 10)
    data, attribute = rows(shape, 200, 91, num_attributes=2)
    head = sparse_gated_head(shape, 3, 2, 92, data, per_attribute_prior=True)
    given = gated_log_likelihood(head, data, attribute, given_query=True)
    for a in range(2):
        mine = attribute == a
        probs = head.shared(a).predict_proba(data[0][mine], data[1][mine])
        assert_close(given[mine], np.log(probs[np.arange(mine.sum()), data[2][mine]]), rtol=1e-10, label=f"{a}")
    shared = random_distribution(10, 3, 2, 10, seed=93)
    as_gated = GatedHead.from_shared(shared, 2)
    assert_close(gated_log_likelihood(as_gated, data, attribute), shared.seq_log_density(data), rtol=RTOL)


def test_a_prior_centred_on_the_shared_emission_keeps_rows_normalized_and_shrinks_toward_it():
    shape = (12, 4, 3, 9)
    data, attribute = rows(shape, 400, 101, num_attributes=3)
    head = sparse_gated_head(shape, 3, 3, 102, data)
    center = head.emission_of(0)
    stats = gated_estep(head, data, attribute)
    for scale, check in ((1e-6, None), (1e9, center)):
        moved = gated_m_step(stats, head, strength=np.full(12, scale), center=center)
        dense = moved.factors.to_dense()
        assert_close(dense.sum(axis=2), np.ones((3, 12)), rtol=1e-12, label="rows sum to 1")
        if check is not None:  # a strong prior keeps every factor at its centre
            for f in range(3):
                assert_close(dense[f], center.to_dense(), rtol=1e-6, label=f"factor {f}")


def test_a_weight_at_zero_stays_zero_so_own_tables_stay_their_attributes():
    shape = (10, 3, 2, 6)
    data, attribute = rows(shape, 300, 111, num_attributes=2)
    head = sparse_gated_head(shape, 4, 2, 112, data)
    # Columns 0 and 1: each attribute's own table; 2 and 3 shared.
    weights = np.array([[0.9, 0.0, 0.05, 0.05], [0.0, 0.9, 0.05, 0.05]])
    own = head.with_weights(weights)
    stats = gated_estep(own, data, attribute)
    assert stats.attribute_count[0, 1] == 0.0 and stats.attribute_count[1, 0] == 0.0
    moved = gated_m_step(stats, own, strength=np.ones(10), weight_strength=1.0)
    assert moved.weights[0, 1] == 0.0 and moved.weights[1, 0] == 0.0
    assert_close(moved.weights.sum(axis=1), np.ones(2), rtol=RTOL, label="rows")
    assert np.all(moved.weights[:, 2:] > 0.0)
    assert moved.num_parameters() == own.num_parameters()


def test_block_proba_ranks_each_row_under_its_attributes_head():
    """What ``evaluate --ranking`` ranks: each row's p(target | row) under its attribute's head, and the
    gated head's target probabilities on the rows' own targets."""
    from dist_respattn.model.heads.base import Block
    from dist_respattn.model.rows import EncodedRows

    shape = (10, 3, 2, 10)
    data, attribute = rows(shape, 40, 91, num_attributes=2)
    head = gated_head(shape, 3, 2, 92)
    block = Block(EncodedRows(*data, None, 0), None, attribute)
    got = head.block_proba(block)
    for a in range(2):
        mine = attribute == a
        assert_close(got[mine], head.shared(a).predict_proba(data[0][mine], data[1][mine]), rtol=1e-12, label=f"{a}")
    given = gated_log_likelihood(head, data, attribute, given_query=True)
    assert_close(np.log(got[np.arange(40), data[2]]), given, rtol=1e-10, label="targets")
    with pytest.raises(ValueError, match="carries none"):
        head.block_proba(Block(EncodedRows(*data, None, 0), None))
