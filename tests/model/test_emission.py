"""The emission seam: one contract run against each layout, and the sparse layout against the dense one.

Each contract test runs once per implementation (dense, sparse), on emissions made the way a fit makes
them (the MAP rows of counts), so the two must agree everywhere, stored pairs and backoff alike.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionEstimator, fit_em, random_distribution
from dist_respattn.model.emission.layouts import (
    DENSE_CELL_LIMIT,
    DenseEmission,
    DenseEmissionCounts,
    PairSupport,
    SparseEmission,
    SparseEmissionCounts,
    choose_layout,
    emission_from_arrays,
)
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.fitting.selection import DEFAULT_SEARCH, score_grid
from dist_respattn.model.heads.single_hop import diagnostics
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator
from dist_respattn.model.heads.single_hop.scoring import score_rows
from dist_respattn.model.kernels import per_position
from tests.model.emission_layouts import LAYOUTS, counts_in_layout, support_of

S, T = 9, 11


def sparse_counts(seed: int = 0, shape: tuple[int, int] = (S, T), density: float = 0.4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = rng.exponential(size=shape) * (rng.random(shape) < density)
    counts[1] = 0.0  # a symbol with no pairs
    return counts


def make_emission(layout: str, seed: int = 0, shape: tuple[int, int] = (S, T)):
    counts = sparse_counts(seed, shape)
    rng = np.random.default_rng(seed + 100)
    strength = rng.uniform(0.1, 2.0, size=shape[0])
    base = rng.dirichlet(np.ones(shape[1]))
    return counts_in_layout(counts, layout).map_emission(strength, base), counts, strength, base


def expected_dense(counts, strength, base):
    return (counts + strength[:, None] * base) / (counts.sum(axis=1) + strength)[:, None]


# ----------------------------------------------------------------------------- the contract, per layout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_probabilities_are_the_map_rows_everywhere(layout):
    emission, counts, strength, base = make_emission(layout)
    assert emission.layout == layout
    want = expected_dense(counts, strength, base)
    s, t = np.meshgrid(np.arange(S), np.arange(T), indexing="ij")
    np.testing.assert_allclose(emission.prob(s.ravel(), t.ravel()), want.ravel(), rtol=1e-14, atol=0)
    np.testing.assert_allclose(emission.to_dense(), want, rtol=1e-14, atol=0)
    np.testing.assert_allclose(emission.to_dense().sum(axis=1), 1.0, rtol=1e-14)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(emission.log_prob(s.ravel(), t.ravel()), np.log(want.ravel()), rtol=1e-13)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_and_row_distances_go_through_the_seam(layout, monkeypatch):
    emission, *_ = make_emission(layout, seed=5)
    other, *_ = make_emission(layout, seed=6)
    symbols = np.array([4, 0, 1, 8])
    np.testing.assert_allclose(emission.rows(symbols), emission.to_dense()[symbols], rtol=1e-14, atol=0)
    want = 0.5 * np.abs(emission.to_dense() - other.to_dense()).sum(axis=1)
    monkeypatch.setattr(diagnostics, "_ROW_BLOCK_CELLS", 2 * T)  # blocks of two rows: a boundary inside
    np.testing.assert_allclose(diagnostics.emission_row_distances(emission, other), want, rtol=1e-13, atol=1e-16)
    np.testing.assert_array_equal(diagnostics.emission_row_distances(emission, emission), np.zeros(S))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_predictive_is_the_attention_mixture_of_rows(layout):
    emission, counts, strength, base = make_emission(layout, seed=3)
    rng = np.random.default_rng(4)
    context = rng.integers(0, S, size=(50, 5))
    attention = rng.dirichlet(np.ones(5), size=50)
    dense = expected_dense(counts, strength, base)
    want = np.einsum("bi,bit->bt", attention, dense[context])
    np.testing.assert_allclose(emission.predictive(context, attention), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_arrays_and_pickles_round_trip_exactly(layout):
    emission, *_ = make_emission(layout, seed=5)
    arrays = emission.to_arrays()
    assert all(isinstance(a, np.ndarray) and a.dtype.kind in "fi" for a in arrays.values())
    again = emission_from_arrays(arrays, S)
    assert type(again) is type(emission)
    assert np.array_equal(again.to_dense(), emission.to_dense())
    unpickled = pickle.loads(pickle.dumps(emission))
    assert np.array_equal(unpickled.to_dense(), emission.to_dense())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_samples_follow_the_rows(layout):
    emission, counts, strength, base = make_emission(layout, seed=6)
    want = expected_dense(counts, strength, base)
    rng = np.random.default_rng(7)
    n = 20000
    for s in (0, 1, 2):
        draws = emission.sample(np.full(n, s), rng)
        freq = np.bincount(draws, minlength=T) / n
        sd = np.sqrt(want[s] * (1 - want[s]) / n)
        assert np.all(np.abs(freq - want[s]) < 6 * sd + 1e-12), (s, freq, want[s])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_counts_add_look_up_and_total(layout):
    a = sparse_counts(10)
    b = a * 0.5  # on the same pairs: a fixed support adds arrays
    ca, cb = counts_in_layout(a, layout), counts_in_layout(b, layout)
    total = ca.copy()
    total.add(cb)
    np.testing.assert_array_equal(np.asarray(total), a + b)
    np.testing.assert_array_equal(np.asarray(ca), a)  # copy() left the original alone
    np.testing.assert_allclose(total.row_totals(), (a + b).sum(axis=1), rtol=1e-15)
    s, t = np.nonzero(np.ones((S, T)))
    np.testing.assert_array_equal(total.lookup(s, t), (a + b)[s, t])


def test_the_reference_smoothing_is_the_same_in_both_layouts():
    counts = sparse_counts(11)
    dense = counts_in_layout(counts, "dense").additive_emission(0.2).to_dense()
    sparse = counts_in_layout(counts, "sparse").additive_emission(0.2).to_dense()
    np.testing.assert_allclose(sparse, dense, rtol=1e-15)
    np.testing.assert_allclose(dense, (counts + 0.2) / (counts.sum(axis=1, keepdims=True) + T * 0.2), rtol=1e-14)


def test_sparse_counts_of_other_supports_add_to_their_union_in_a_fixed_order():
    a, b = sparse_counts(12), sparse_counts(13)
    total = counts_in_layout(a, "sparse")
    total.add(counts_in_layout(b, "sparse"))
    assert total.support.same_as(support_of(a + b))
    np.testing.assert_array_equal(np.asarray(total), a + b)


def test_sparse_memory_follows_the_pairs_not_s_times_t():
    small = counts_in_layout(sparse_counts(14, (300, 400), density=0.01), "sparse")
    large = counts_in_layout(sparse_counts(14, (300, 400), density=0.04), "sparse")
    dense = counts_in_layout(sparse_counts(14, (300, 400), density=0.01), "dense")
    pairs_small, pairs_large = small.support.num_pairs, large.support.num_pairs
    assert small.nbytes == pytest.approx(12 * pairs_small + 8 * 401, rel=0.01)
    assert (large.nbytes - 8 * 401) / (small.nbytes - 8 * 401) == pytest.approx(pairs_large / pairs_small, rel=1e-9)
    assert dense.nbytes == 8 * 300 * 400 > 5 * small.nbytes


def test_the_layout_is_chosen_by_size_and_can_be_forced():
    assert choose_layout(2000, 2000) == "dense"
    assert choose_layout(20000, 20000) == "sparse"
    assert choose_layout(20000, 20000, "dense") == "dense"
    assert choose_layout(4, 4, "sparse") == "sparse"
    assert choose_layout(DENSE_CELL_LIMIT, 1) == "dense" and choose_layout(DENSE_CELL_LIMIT + 1, 1) == "sparse"
    with pytest.raises(ValueError, match="emission layout = 'thin': expected one of auto, dense, sparse"):
        choose_layout(4, 4, "thin")


def test_a_support_locates_its_pairs_and_nothing_else():
    support = support_of(sparse_counts(15))
    s, t = np.nonzero(np.ones((S, T)))
    at = support.locate(s, t)
    inside = at >= 0
    assert inside.sum() == support.num_pairs
    assert np.array_equal(support.symbols[at[inside]], s[inside]) and np.array_equal(
        support.targets[at[inside]], t[inside]
    )
    assert PairSupport.from_keys(support.keys(), S, T).same_as(support)


# ------------------------------------------------------------------------- sparse kernels = dense ones

# (S, N, D, T): ordinary, S < N, T = 1, N = 1, odd sizes.
SHAPES = [(12, 4, 3, 7), (3, 6, 2, 5), (9, 3, 4, 1), (10, 1, 5, 6), (31, 7, 13, 17)]


def sampled(shape, n, seed, *, weighted):
    truth = random_distribution(*shape, seed=seed, key_scale=1.5, sigma2=0.7)
    data = truth.sampler(seed + 1).sample_arrays(n)
    weights = None
    if weighted:
        weights = np.random.default_rng(seed + 2).uniform(0.0, 3.0, size=n)
        weights[::7] = 0.0
    return truth, data, weights


def data_support(data, weights, num_symbols, num_targets) -> PairSupport:
    context, _, target = data
    live = np.ones(target.shape[0], bool) if weights is None else weights > 0
    keys = np.unique((target[live].astype(np.int64)[:, None] * num_symbols + context[live]).ravel())
    return PairSupport.from_keys(keys, num_symbols, num_targets)


def relative_error(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b), initial=0.0)) / max(float(np.max(np.abs(b), initial=0.0)), 1e-300)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))
def test_sparse_e_step_statistics_equal_the_dense_ones(shape, weighted):
    truth, data, weights = sampled(shape, 3000, sum(shape), weighted=weighted)
    support = data_support(data, weights, shape[0], shape[3])
    sparse_model = truth.with_emission(DenseEmission(truth.emission).restricted(support))
    # The E-step reads stored pairs only: the dense model with the same values there gives the same statistics.
    dense_model = truth.with_emission(DenseEmission(sparse_model.emission))
    dense = ResponsibilityAttentionAccumulator(*shape)
    dense.seq_update(data, weights, dense_model)
    sparse = ResponsibilityAttentionAccumulator(*shape, layout="sparse", support=support)
    sparse.seq_update(data, weights, sparse_model)
    d, s = dense.value(), sparse.value()
    for name in ("key_sum", "key_mass", "position_count"):
        assert relative_error(getattr(s, name), getattr(d, name)) <= 1e-12, name
    assert relative_error(s.emission_count.on(support).to_dense(), np.asarray(d.emission_count)) <= 1e-12
    for name in ("query_sq", "n_obs", "log_lik"):
        assert getattr(s, name) == pytest.approx(getattr(d, name), rel=1e-12, abs=1e-12), name


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))
def test_sparse_scores_equal_the_dense_ones_on_unseen_rows(shape):
    _, data, _ = sampled(shape, 2000, sum(shape) + 1, weighted=False)
    _, heldout, _ = sampled(shape, 700, sum(shape) + 50, weighted=False)
    sparse = fit_em(
        data, ResponsibilityAttentionEstimator(*shape, emission_prior="continuation"), layout="sparse", max_iter=2
    ).distribution
    dense = sparse.with_emission(DenseEmission(sparse.emission))
    assert sparse.emission_table.layout == "sparse"
    np.testing.assert_allclose(sparse.seq_log_density(heldout), dense.seq_log_density(heldout), rtol=1e-12)
    a, b = score_rows(sparse, heldout).metrics(), score_rows(dense, heldout).metrics()
    assert a["accuracy"] == b["accuracy"]
    assert a["perplexity"] == pytest.approx(b["perplexity"], rel=1e-12)
    np.testing.assert_allclose(
        sparse.predict_proba(heldout[0][:20], heldout[1][:20]),
        dense.predict_proba(heldout[0][:20], heldout[1][:20]),
        rtol=1e-12,
        atol=1e-15,
    )
    np.testing.assert_allclose(
        sparse.attention_weights(heldout[0][:20], heldout[1][:20], heldout[2][:20]),
        dense.attention_weights(heldout[0][:20], heldout[1][:20], heldout[2][:20]),
        rtol=1e-12,
        atol=1e-15,
    )


@pytest.mark.parametrize("shape", [(12, 4, 3, 7), (3, 6, 2, 5), (9, 3, 4, 1)], ids=str)
def test_sparse_fits_equal_dense_fits(shape):
    _, data, weights = sampled(shape, 4000, sum(shape) + 2, weighted=True)
    estimator = ResponsibilityAttentionEstimator(*shape, emission_prior="continuation", search=DEFAULT_SEARCH)
    rule = HoldoutRule(0.1, 16)
    dense = fit_em(data, estimator, weights=weights, holdout=rule, layout="dense", max_iter=4).distribution
    sparse = fit_em(data, estimator, weights=weights, holdout=rule, layout="sparse", max_iter=4).distribution
    assert sparse.emission_table.layout == "sparse" and dense.emission_table.layout == "dense"
    assert relative_error(sparse.emission, dense.emission) <= 1e-12
    assert relative_error(sparse.key_means, dense.key_means) <= 1e-12
    assert relative_error(sparse.position_prior, dense.position_prior) <= 1e-12
    assert sparse.sigma2 == pytest.approx(dense.sigma2, rel=1e-12)


def test_the_sparse_grid_pass_equals_the_dense_one():
    shape = (12, 4, 3, 7)
    _, data, _ = sampled(shape, 3000, 40, weighted=False)
    _, heldout, _ = sampled(shape, 500, 41, weighted=False)
    estimator = ResponsibilityAttentionEstimator(*shape, emission_prior="continuation", search=DEFAULT_SEARCH)
    model = fit_em(data, estimator, layout="sparse", max_iter=1, holdout=HoldoutRule(0.1, 16)).distribution
    support = model.emission_table.support
    resolved = estimator.resolved(_prior(data, shape))
    sparse_acc = resolved.accumulator_factory(layout="sparse").make(support)
    sparse_acc.seq_update(data, None, model)
    dense_acc = resolved.accumulator_factory().make()
    dense_acc.seq_update(data, None, model.with_emission(DenseEmission(model.emission)))
    sparse_c = resolved.candidates(sparse_acc.value(), previous=model)
    dense_c = resolved.candidates(dense_acc.value(), previous=model)
    table_s, table_d = sparse_c.grid_table(DEFAULT_SEARCH), dense_c.grid_table(DEFAULT_SEARCH)
    a, b = score_grid(table_s, heldout), score_grid(table_d, heldout)
    np.testing.assert_allclose(a.target_log_prob, b.target_log_prob, rtol=1e-12)
    np.testing.assert_allclose(a.log_lik, b.log_lik, rtol=1e-12)
    # Frequent targets' pairs are read through direct rows; by binary search alone the totals are the same bits.
    direct_row, _ = table_s.direct_pair_rows
    assert (direct_row >= 0).any()
    table_s.__dict__["direct_pair_rows"] = (np.full_like(direct_row, -1), np.zeros((0, shape[0]), np.int32))
    searched = score_grid(table_s, heldout)
    assert np.array_equal(searched.target_log_prob, a.target_log_prob) and np.array_equal(searched.log_lik, a.log_lik)
    # A table travels without its direct rows: they are made again where it is scored.
    assert "direct_pair_rows" not in pickle.loads(pickle.dumps(table_s)).__dict__


def _prior(data, shape):
    from dist_respattn.model.emission.pairs import PairCounts
    from dist_respattn.model.emission.prior import EmissionPrior

    context, _, target = data
    return EmissionPrior.from_pairs(
        PairCounts.from_rows(context[:, -1], target, None, num_symbols=shape[0], num_targets=shape[3])
    )


def test_a_row_outside_the_support_is_refused_by_the_sparse_e_step():
    shape = (40, 3, 2, 30)
    truth, data, _ = sampled(shape, 500, 60, weighted=False)
    support = data_support(tuple(a[:50] for a in data), None, 40, 30)
    model = truth.with_emission(DenseEmission(truth.emission).restricted(support))
    accumulator = ResponsibilityAttentionAccumulator(*shape, layout="sparse", support=support)
    with pytest.raises(ValueError, match="outside the sparse emission's support"):
        accumulator.seq_update(data, None, model)


def _sparse_statistics(data, weights, params, support, *, block_rows=None) -> per_position.StatisticArrays:
    stats = per_position.StatisticArrays.zeros(
        support.num_symbols, data[0].shape[1], data[1].shape[1], support.num_targets, support
    )
    per_position.accumulate_estep(*data, weights, params, stats, block_rows=block_rows)
    return stats


def test_the_sparse_e_step_finds_pairs_alike_by_direct_row_map_or_search():
    """A dense-enough target's pairs are read through a direct symbol -> pair row, the others through a map filled per
    block or a binary search: the statistics are bit for bit the same whichever the kernel takes."""
    shape = (200, 4, 3, 60)
    truth, data, weights = sampled(shape, 4000, 70, weighted=True)
    # Half the targets keep a few rows: their pairs are too few for a direct row.
    target = data[2]
    rank = np.zeros(target.shape[0], dtype=np.int64)
    for t in range(shape[3]):
        rank[target == t] = np.arange(int((target == t).sum()))
    keep = (target < shape[3] // 2) | (rank < 3)
    data, weights = tuple(a[keep] for a in data), weights[keep]
    support = data_support(data, weights, shape[0], shape[3])
    model = truth.with_emission(DenseEmission(truth.emission).restricted(support))
    params = model.kernel_parameters
    degree = np.diff(support.indptr)
    assert np.array_equal(params.direct_row >= 0, degree * per_position.DIRECT_ROW_SHARE >= shape[0])
    assert 0 < int((params.direct_row >= 0).sum()) < shape[3]
    rows = params.direct_row[params.direct_row >= 0]
    assert np.array_equal(rows, np.arange(rows.size)) and params.direct_slots.shape == (rows.size, shape[0])

    def with_rows(share: float) -> per_position.SparseKernelParameters:
        direct_row, direct_slots = per_position.direct_pair_rows(support.indptr, support.symbols, shape[0], share=share)
        return dataclasses.replace(params, direct_row=direct_row, direct_slots=direct_slots)

    none, more = with_rows(0), with_rows(1e9)
    assert none.direct_slots.shape == (0, shape[0]) and more.direct_slots.shape[0] > params.direct_slots.shape[0]
    # Blocks of 16 rows leave a target a row or two a block: those take the binary search, not the map.
    # (The visiting order, and so the order of the sums, follows the blocks: compare within one block size.)
    for block_rows in (None, 16):
        reference = _sparse_statistics(data, weights, params, support, block_rows=block_rows)
        for other in (none, more):
            stats = _sparse_statistics(data, weights, other, support, block_rows=block_rows)
            for name in ("key_sum", "key_mass", "pair_counts", "position_count", "scalars"):
                assert np.array_equal(getattr(stats, name), getattr(reference, name)), name
    outside = tuple(np.concatenate([a, a[:1]]) for a in data)
    outside[0][-1] = np.setdiff1d(np.arange(shape[0]), support.symbols[support.indptr[0] : support.indptr[1]])[0]
    outside[2][-1] = 0
    with pytest.raises(ValueError, match="1 row\\(s\\) hold a \\(symbol, target\\) pair outside"):
        _sparse_statistics(outside, np.append(weights, 1.0), more, support)


def test_a_sparse_emission_whose_rows_do_not_sum_to_one_is_refused():
    emission, *_ = make_emission("sparse")
    bad = SparseEmission(emission.support, emission.values * 1.5, emission.backoff, emission.base)
    key_means = np.zeros((S, 2))
    from dist_respattn import ResponsibilityAttentionDistribution

    with pytest.raises(ValueError, match=r"emission row 0 sums to .*expected every row to sum to 1"):
        ResponsibilityAttentionDistribution(key_means, bad, context_length=3)


@pytest.mark.parametrize("block_pairs", [1, 3, 1 << 20])
def test_the_sparse_check_finds_the_same_faults_a_block_of_pairs_at_a_time(monkeypatch, block_pairs):
    """Blocks of 1 and 3 pairs split every target's pairs (and the support) across blocks: the row sums and the
    first bad value are those of one block."""
    from dist_respattn.model import arguments

    monkeypatch.setattr(arguments, "_CHECK_BLOCK_PAIRS", block_pairs)
    emission, *_ = make_emission("sparse")
    assert emission.support.num_pairs > 3
    assert arguments.as_sparse_emission(emission, "emission") is emission
    scaled = SparseEmission(emission.support, emission.values * 1.5, emission.backoff, emission.base)
    with pytest.raises(ValueError, match=r"emission row 0 sums to .*expected every row to sum to 1"):
        arguments.as_sparse_emission(scaled, "emission")
    # half of one pair's mass moved onto a pair of another symbol: both rows are off, the smaller one is named
    symbols = emission.support.symbols
    a = 0
    b = int(np.flatnonzero(symbols != symbols[a])[-1])
    moved = emission.values.copy()
    moved[b] += moved[a] / 2
    moved[a] /= 2
    first = min(int(symbols[a]), int(symbols[b]))
    with pytest.raises(ValueError, match=rf"emission row {first} sums to .*expected every row to sum to 1"):
        arguments.as_sparse_emission(
            SparseEmission(emission.support, moved, emission.backoff, emission.base), "emission"
        )
    negative = emission.values.copy()
    last = emission.support.num_pairs - 1
    negative[last] = -negative[last]
    with pytest.raises(ValueError, match=rf"emission values\[{last}\] = -.*expected finite, non-negative"):
        arguments.as_sparse_emission(
            SparseEmission(emission.support, negative, emission.backoff, emission.base), "emission"
        )


def test_kernel_parameters_follow_the_layout():
    emission, *_ = make_emission("sparse")
    params = per_position.KernelParameters.from_arrays(np.zeros((S, 2)), emission, np.full(3, 1 / 3), 1.0)
    assert isinstance(params, per_position.SparseKernelParameters)
    assert params.nbytes < 8 * S * T + 8 * (S + T)
    assert isinstance(SparseEmissionCounts.zeros(emission.support).counts, np.ndarray)


def test_a_sparse_accumulator_collecting_its_pairs_allocates_nothing_of_s_times_t():
    """At S = T = 50,000 an (S, T) table is 20 GB: the start of a sparse fit must not make one (numpy reports its
    allocations to tracemalloc, even those the OS has not backed yet)."""
    import tracemalloc

    shape = (50_000, 4, 3, 50_000)
    rng = np.random.default_rng(0)
    data = (rng.integers(0, 50_000, (1000, 4)), rng.standard_normal((1000, 3)), rng.integers(0, 50_000, 1000))
    tracemalloc.start()
    try:
        accumulator = ResponsibilityAttentionAccumulator(*shape, layout="sparse")
        accumulator.seq_initialize_uniform(data, None)
        value = accumulator.value()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert value.emission_count.support.num_pairs == len(np.unique(data[2][:, None] * 50_000 + data[0]))
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB traced"


def _rows_on(support: PairSupport, rows: int, n: int, d: int, seed: int):
    """Rows whose every (context symbol, target) pair lies in ``support``: a target, then N of its symbols."""
    rng = np.random.default_rng(seed)
    target = support.targets[rng.integers(0, support.num_pairs, rows)]
    first, count = support.indptr[target], np.diff(support.indptr)[target]
    slots = first[:, None] + (rng.random((rows, n)) * count[:, None]).astype(np.int64)
    return support.symbols[slots].astype(np.int64), rng.standard_normal((rows, d)), target.astype(np.int64)


@pytest.mark.slow
def test_a_sparse_e_step_takes_memory_for_its_pairs_and_its_block_not_its_rows_or_s_times_t():
    """Traced peak of E-steps block by block: flat from 20,000 to 80,000 rows (3 and 10 blocks of 8,192), and growing
    by a few bytes a pair between two supports (S = T = 3,000: an (S, T) float64 table would be 72 MB)."""
    import tracemalloc

    shape = (3000, 4, 3, 3000)
    truth = random_distribution(*shape, seed=0)
    keys = np.random.default_rng(1).choice(shape[0] * shape[3], size=400_000, replace=False)
    large = PairSupport.from_keys(np.sort(keys), shape[0], shape[3])
    small = PairSupport.from_keys(np.sort(keys[:100_000]), shape[0], shape[3])

    def peak(support: PairSupport, rows: int) -> int:
        model = truth.with_emission(truth.emission_table.restricted(support))
        model.kernel_parameters  # noqa: B018  (built once per model, before the pass)
        data = _rows_on(support, rows, shape[1], shape[2], seed=rows)
        tracemalloc.start()
        try:
            accumulator = ResponsibilityAttentionAccumulator(*shape, layout="sparse", support=support)
            for first in range(0, rows, 8192):
                block = tuple(a[first : first + 8192] for a in data)
                accumulator.seq_update(block, None, model)
            accumulator.value()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak(small, 8192)  # the first E-step compiles its kernels, whose allocations are traced too
    few, many = peak(small, 20_000), peak(small, 80_000)
    wide = peak(large, 20_000)
    assert abs(many - few) < 2**20, f"{few / 2**20:.1f} MiB at 20,000 rows, {many / 2**20:.1f} MiB at 80,000"
    per_pair = (wide - few) / (large.num_pairs - small.num_pairs)
    assert 8 <= per_pair <= 40, f"{per_pair:.1f} bytes a pair"
    assert wide < 72e6 / 2, f"{wide / 2**20:.1f} MiB traced"


def test_a_dense_tables_row_totals_are_its_columns_whatever_columns_are_taken():
    """A sharded M-step totals each shard's columns of the (T, S) counts: every slice, one column wide or several,
    gives the bits of the whole table's totals (NumPy's own column sum adds a lone column pairwise)."""
    counts = np.random.default_rng(3).random((1001, 7)) * 1e3
    whole = DenseEmissionCounts(counts).row_totals()
    for a, b in ((0, 1), (3, 4), (0, 2), (2, 7), (0, 7)):
        assert np.array_equal(DenseEmissionCounts(np.ascontiguousarray(counts[:, a:b])).row_totals(), whole[a:b])
    assert np.array_equal(whole, np.cumsum(counts, axis=0)[-1])  # row by row, from the first
