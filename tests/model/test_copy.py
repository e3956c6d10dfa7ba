"""The copy head's math: its kernel against a per-position NumPy writing of the model, the single head's
statistics when the copy weights are 0, EM's monotone likelihood, and a copy task it learns."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.fitting.selection import FLAT_GATE_SCALE, HyperparameterSearch
from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.copy import CopyHead, CopySpec
from dist_respattn.model.heads.copy.histogram import copy_estep_windows
from dist_respattn.model.heads.copy.kernels import CopyArrays, copy_estep
from dist_respattn.model.heads.copy.kind import CopyCandidates, copy_statistics
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator
from dist_respattn.model.heads.single_hop.estimator import ResponsibilityAttentionEstimator
from dist_respattn.model.heads.single_hop.kind import SingleHopCandidates, SingleHopSpec
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.kernels.per_position import StatisticArrays
from dist_respattn.model.rows import EncodedRows, WindowRows


def windows_of(tokens: np.ndarray, starts: list[int], n_pos: int, query_table: np.ndarray) -> WindowRows:
    """Every next-token row of a token array cut into documents at ``starts``: window = the (at most N) tokens
    before the target within its document, query = the last token's row of ``query_table``."""
    bounds = [*starts, tokens.shape[0]]
    begin, end = [], []
    for lo, hi in itertools.pairwise(bounds):
        for x in range(lo + 1, hi):
            begin.append(max(lo, x - n_pos))
            end.append(x)
    b, e = np.array(begin, dtype=np.int64), np.array(end, dtype=np.int64)
    return WindowRows(tokens, b, e, tokens[e].astype(np.int32), query_table, tokens[e - 1].astype(np.int64), None, 0)


def reference_statistics(head: CopyHead, rows: WindowRows) -> dict[str, np.ndarray]:
    """The E-step written position by position: responsibilities, their three-way split, the rejected draws."""
    single = head.single
    s, n_pos, d, t_n = head.shape
    k = head.buckets.num_buckets
    bucket = head.buckets.bucket_of_recency
    emission = single.emission_table.to_dense()
    out = {"key_sum": np.zeros((s, d)), "key_mass": np.zeros(s), "emission_count": np.zeros((s, t_n)),
           "recency_mass": np.zeros(n_pos), "copy_mass": np.zeros(k), "induction_mass": np.zeros(k),
           "bucket_mass": np.zeros(k), "log_lik": np.zeros(1), "n_obs": np.zeros(1)}  # fmt: skip
    for row in range(rows.num_rows):
        window = rows.tokens[rows.begin[row] : rows.end[row]]
        m = window.shape[0]
        y = rows.query_table[rows.query_index[row]].astype(np.float64)
        t = int(rows.target[row])
        recency = np.arange(m)[::-1]  # position j of the window, oldest first, has recency m - 1 - j
        prior = single.position_prior[n_pos - 1 - recency]
        area = single.position_prior[n_pos - m :].sum()
        gauss = np.exp(-((y - single.key_means[window]) ** 2).sum(axis=1) / (2 * single.sigma2))
        gauss *= (2 * np.pi * single.sigma2) ** (-d / 2)
        kappa, rho = head.kappa[bucket[recency]], head.rho[bucket[recency]]
        own = (1 - kappa - rho) * emission[window, t]
        cop = kappa * (window == t)
        ind = rho * np.append(window[1:] == t, False)
        joint = prior / area * gauss * (own + cop + ind)
        r = joint / joint.sum()
        for j in range(m):
            c, b = int(window[j]), int(bucket[recency[j]])
            e = own[j] + cop[j] + ind[j]
            out["key_sum"][c] += r[j] * y
            out["key_mass"][c] += r[j]
            out["emission_count"][c, t] += r[j] * own[j] / e
            out["copy_mass"][b] += r[j] * cop[j] / e
            out["induction_mass"][b] += r[j] * ind[j] / e
            out["bucket_mass"][b] += r[j]
            out["recency_mass"][recency[j]] += r[j]
        out["recency_mass"][m:] += single.position_prior[: n_pos - m][::-1] / area
        out["log_lik"] += np.log(joint.sum())
        out["n_obs"] += 1
    return out


def kernel_statistics(head: CopyHead, rows: WindowRows) -> dict[str, np.ndarray]:
    value = copy_statistics(head, [Block(rows, None)])
    stats = value.stats
    counts = stats.emission_count
    table = head.single.emission_table
    if isinstance(table, SparseEmission):  # an E-step's sparse counts travel without the support the head carries
        counts = counts.on(table.support)  # type: ignore[attr-defined]
    return {"key_sum": stats.key_sum, "key_mass": stats.key_mass, "emission_count": counts.to_dense(),
            "recency_mass": stats.position_count[::-1], "copy_mass": value.copy_mass,
            "induction_mass": value.induction_mass, "bucket_mass": value.bucket_mass,
            "log_lik": np.array([stats.log_lik]), "n_obs": np.array([stats.n_obs])}  # fmt: skip


def random_copy_head(shape: tuple[int, int, int, int], buckets: int | None, seed: int, *, copy: bool = True,
                     sparse: bool = False) -> CopyHead:  # fmt: skip
    """A random single head (tied over ``buckets`` when given) with random copy and induction weights."""
    rng = np.random.default_rng(seed)
    single = random_distribution(*shape, seed=seed, sigma2=0.8)
    if buckets is not None:
        tied = PositionBuckets.geometric(shape[1], buckets)
        single = type(single)(single.key_means, single.emission_table, tied.tie(single.position_prior),
                              single.sigma2, buckets=tied)  # fmt: skip
    if sparse:
        # Every pair on the support: the sparse lookups, with no row off it.
        single = single.with_emission(single.emission_table.restricted(PairSupport.full(shape[0], shape[3])))
    k = (single.buckets or PositionBuckets.free(shape[1])).num_buckets
    mass = rng.dirichlet(np.ones(3), size=k) if copy else np.zeros((k, 3))
    return CopyHead(single, mass[:, 0], mass[:, 1])


def corpus(rng: np.random.Generator, n_tokens: int, vocab: int, n_docs: int) -> tuple[np.ndarray, list[int]]:
    tokens = rng.integers(0, vocab, size=n_tokens).astype(np.int32)
    starts = sorted({0, *rng.choice(np.arange(1, n_tokens), size=n_docs - 1, replace=False).tolist()})
    return tokens, starts


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    n_pos=st.integers(1, 6),
    vocab=st.sampled_from([2, 3, 9]),  # 2 and 3 symbols: windows full of repeats; 9: few
    n_docs=st.integers(1, 4),
    tied=st.booleans(),
    sparse=st.booleans(),
)
def test_kernel_equals_the_per_position_reference(
    seed: int, n_pos: int, vocab: int, n_docs: int, tied: bool, sparse: bool
) -> None:
    rng = np.random.default_rng(seed)
    shape = (9, n_pos, 2, 9)
    buckets = min(2, n_pos) if tied and n_pos > 1 else None
    head = random_copy_head(shape, buckets, seed, sparse=sparse)
    tokens, starts = corpus(rng, 40, vocab, n_docs)
    rows = windows_of(tokens, starts, n_pos, rng.normal(size=(9, 2)))
    mine, theirs = kernel_statistics(head, rows), reference_statistics(head, rows)
    assert_same_statistics(head, mine, theirs)


def assert_same_statistics(head: CopyHead, mine: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    """Equal to 1e-12; a tied prior's recency masses per bucket (its histogram kernel spreads each bucket's mass
    evenly over the bucket's positions, and the tied M-step reads the sums only)."""
    for name, value in theirs.items():
        got = mine[name]
        if name == "recency_mass" and head.single.buckets is not None:
            bucket = head.buckets.bucket_of_recency
            value, got = np.bincount(bucket, weights=value), np.bincount(bucket, weights=got)
        np.testing.assert_allclose(got, value, rtol=1e-12, atol=1e-12, err_msg=name)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), n_pos=st.sampled_from([6, 16, 40]), vocab=st.sampled_from([2, 5, 30]),
       sparse=st.booleans(), weighted=st.booleans(), shuffled=st.booleans())  # fmt: skip
def test_the_histogram_kernel_equals_the_per_position_one_under_a_tied_prior(
    seed: int, n_pos: int, vocab: int, sparse: bool, weighted: bool, shuffled: bool
) -> None:
    """Long windows full of repeats (2 symbols: every target recurs many times; 30: a few), several documents,
    weighted rows, and rows out of order (every row rebuilds its histograms instead of sliding them)."""
    rng = np.random.default_rng(seed)
    shape = (30, n_pos, 2, 30)
    head = random_copy_head(shape, 4, seed, sparse=sparse)
    tokens, starts = corpus(rng, 150, vocab, 3)
    rows = windows_of(tokens, starts, n_pos, rng.normal(size=(30, 2)))
    if weighted:
        rows = rows._replace(weight=rng.uniform(0.0, 2.0, size=rows.num_rows) * (rng.random(rows.num_rows) < 0.8))
    if shuffled:
        order = rng.permutation(rows.num_rows)
        rows = rows._replace(begin=rows.begin[order], end=rows.end[order], target=rows.target[order],
                             query_index=rows.query_index[order],
                             weight=None if rows.weight is None else rows.weight[order])  # fmt: skip
    per_position = {
        "stats": StatisticArrays.zeros(*shape, head.single.emission_table.support if sparse else None),
        "extra": CopyArrays.zeros(n_pos, head.buckets.num_buckets),
    }
    windows = {
        "stats": StatisticArrays.zeros(*shape, head.single.emission_table.support if sparse else None),
        "extra": CopyArrays.zeros(n_pos, head.buckets.num_buckets),
    }
    copy_estep(rows, head.parameters, per_position["stats"], per_position["extra"])
    copy_estep_windows(rows, head.parameters, windows["stats"], windows["extra"])
    for name in ("key_sum", "key_mass", "emission_count_ts", "pair_counts", "scalars"):
        a, b = getattr(windows["stats"], name), getattr(per_position["stats"], name)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
    bucket = head.buckets.bucket_of_recency
    for name in ("copy_mass", "induction_mass", "bucket_mass"):
        a, b = getattr(windows["extra"], name), getattr(per_position["extra"], name)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(
        np.bincount(bucket, weights=windows["extra"].recency_mass),
        np.bincount(bucket, weights=per_position["extra"].recency_mass),
        rtol=1e-12,
        atol=1e-12,
    )
    if vocab == 2:  # repeats everywhere: the copy terms took mass, so the equalities above are not of zeros
        assert windows["extra"].copy_mass.sum() > 0.0 and windows["extra"].induction_mass.sum() > 0.0


def test_repeats_reach_the_copy_and_induction_terms() -> None:
    """A window of one repeated symbol: the reference and the kernel both give copy and induction mass."""
    rng = np.random.default_rng(0)
    head = random_copy_head((4, 4, 2, 4), None, 1)
    tokens = np.array([1, 1, 1, 1, 1, 1], dtype=np.int32)
    rows = windows_of(tokens, [0], 4, rng.normal(size=(4, 2)))
    stats = kernel_statistics(head, rows)
    assert stats["copy_mass"].sum() > 0.1 and stats["induction_mass"].sum() > 0.1
    np.testing.assert_allclose(stats["copy_mass"], reference_statistics(head, rows)["copy_mass"], rtol=1e-12)


@pytest.mark.parametrize("tied", [False, True])
def test_zero_copy_weights_give_the_single_heads_statistics(tied: bool) -> None:
    shape = (7, 8, 3, 7)
    head = random_copy_head(shape, 3 if tied else None, 4, copy=False)
    rng = np.random.default_rng(5)
    context = rng.integers(0, 7, size=(300, 8)).astype(np.int32)
    query, target = rng.normal(size=(300, 3)), rng.integers(0, 7, size=300).astype(np.int32)
    rows = WindowRows.from_encoded(context, query, target)
    mine = copy_statistics(head, [Block(rows, None)])
    accumulator = ResponsibilityAttentionAccumulator(*shape)
    if tied:
        accumulator.seq_update_windows(rows, head.single)
    else:
        accumulator.seq_update((context, query, target), None, head.single)
    theirs = accumulator.value()
    buckets = head.buckets
    for a, b in [(mine.stats.key_sum, theirs.key_sum), (mine.stats.key_mass, theirs.key_mass),
                 (mine.stats.emission_count.to_dense(), theirs.emission_count.to_dense()),
                 (buckets.bucket_weights(mine.stats.position_count), buckets.bucket_weights(theirs.position_count)),
                 (mine.bucket_mass, buckets.bucket_weights(theirs.position_count))]:  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert mine.stats.log_lik == pytest.approx(theirs.log_lik, rel=1e-12)
    assert mine.stats.n_obs == theirs.n_obs and mine.stats.query_sq == pytest.approx(theirs.query_sq, rel=1e-12)
    assert not mine.copy_mass.any() and not mine.induction_mass.any()


def repeats_data(rng: np.random.Generator, n: int, n_pos: int, vocab: int) -> tuple[np.ndarray, ...]:
    """Rows of a token stream of phrases repeated (so copies and inductions occur), as full windows."""
    phrase = rng.integers(0, vocab, size=6)
    stream = np.concatenate([phrase if rng.random() < 0.5 else rng.integers(0, vocab, size=6) for _ in range(n)])
    context = np.lib.stride_tricks.sliding_window_view(stream[:-1], n_pos)[:n].astype(np.int32)
    target = stream[n_pos : n_pos + n].astype(np.int32)
    query = np.zeros((n, 1))
    return np.ascontiguousarray(context), query, target


@pytest.mark.parametrize("tied", [False, True])
def test_maximum_likelihood_em_never_lowers_the_likelihood(tied: bool) -> None:
    rng = np.random.default_rng(6)
    data = repeats_data(rng, 400, 6, 10)
    single = SingleHopSpec(sigma2=1.0, emission_smoothing=0.0, position_buckets=3 if tied else None)
    lls: list[float] = []
    fit_em(data, CopySpec(single), shape=(10, 6, 1, 10), max_iter=10, tol=0.0,
           callback=lambda it, head: lls.append(it.mean_log_likelihood))  # fmt: skip
    assert len(lls) == 10
    assert all(b >= a - 1e-12 * abs(a) for a, b in itertools.pairwise(lls)), lls
    assert lls[-1] > lls[0]


def test_a_copy_task_is_learned() -> None:
    """Targets copied from a random position of the window: the copy terms take all the mass (a token copied from
    position i is also the induction term's at i - 1, so the two share it, except at the most recent position, which
    has no successor: kappa = 1 there), and the test perplexity falls far below the single head's, which must learn
    an identity table from few rows."""
    rng = np.random.default_rng(8)
    s, n_pos = 200, 4

    def draw(n: int) -> tuple[np.ndarray, ...]:
        context = rng.integers(0, s, size=(n, n_pos)).astype(np.int32)
        target = context[np.arange(n), rng.integers(0, n_pos, size=n)]
        return context, np.zeros((n, 1)), target

    train, test = draw(1000), draw(500)
    single_spec = SingleHopSpec(sigma2=1.0, emission_strength=1.0, type_strength=1.0, emission_layout="dense")
    copy = fit_em(train, CopySpec(single_spec), shape=(s, n_pos, 1, s), max_iter=20).distribution
    single = fit_em(train, single_spec, shape=(s, n_pos, 1, s), max_iter=20).distribution
    assert isinstance(copy, CopyHead)
    assert (copy.kappa + copy.rho).min() > 0.95 and copy.kappa[0] > 0.95
    mine = copy.score([Block(WindowRows.from_encoded(*test), None)]).target_log_prob / 500
    theirs = single.score([Block(EncodedRows(*test, None, 0), None)]).target_log_prob / 500
    assert np.exp(-mine) < 0.5 * np.exp(-theirs), (np.exp(-mine), np.exp(-theirs))
    # Started from the fitted single head (fit --init-from a single fit --head copy), it learns the copies too.
    warm = fit_em(train, CopySpec(single_spec), shape=(s, n_pos, 1, s), init=single, max_iter=5).distribution
    assert isinstance(warm, CopyHead) and (warm.kappa + warm.rho).min() > 0.9


@pytest.mark.parametrize("sparse", [False, True])
def test_the_arg_max_hits_are_those_of_the_distributions(sparse: bool) -> None:
    """``score``'s compiled hits (either layout) against the arg-max of each row's
    distribution as :meth:`CopyHead.predict_proba` gives it."""
    rng = np.random.default_rng(9)
    head = random_copy_head((6, 5, 2, 6), 3, 10, sparse=sparse)
    context = rng.integers(0, 3, size=(200, 5)).astype(np.int32)  # few symbols: copies and inductions are frequent
    query, target = rng.normal(size=(200, 2)), rng.integers(0, 6, size=200).astype(np.int32)
    hits = head.score([Block(WindowRows.from_encoded(context, query, target), None)]).correct
    expected = float(np.sum(np.argmax(head.predict_proba(context, query), axis=1) == target))
    assert hits == expected and 0 < hits < 200


#: A small grid: every point is also scored as a head of its own below.
SMALL_SEARCH = HyperparameterSearch((1.0, 8.0, FLAT_GATE_SCALE), (0.1, 3.0), (0.0, 1.0))


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), n_pos=st.integers(1, 6), tied=st.booleans(), sparse=st.booleans())
def test_the_held_out_grid_scores_each_candidate_as_the_copy_head_it_makes(
    seed: int, n_pos: int, tied: bool, sparse: bool
) -> None:
    """Every point of a copy M-step's grid (gate variance x emission strengths) equals the held-out score of the
    copy head that point makes, on windows with repeats, short windows at document starts and weighted rows."""
    rng = np.random.default_rng(seed)
    shape = (9, n_pos, 2, 9)
    buckets = min(2, n_pos) if tied and n_pos > 1 else None
    head = random_copy_head(shape, buckets, seed, sparse=sparse)
    query_table = rng.normal(size=(9, 2))
    tokens, starts = corpus(rng, 60, 3, 3)
    train = windows_of(tokens, starts, n_pos, query_table)
    heldout = windows_of(*corpus(rng, 40, 3, 2), n_pos, query_table)
    heldout = heldout._replace(weight=rng.uniform(0.0, 2.0, size=heldout.num_rows))
    statistics = copy_statistics(head, [Block(train, None)])
    estimator = ResponsibilityAttentionEstimator(
        *shape, emission_prior=EmissionPrior.uniform(9, 9), search=SMALL_SEARCH, buckets=head.single.buckets
    )
    single = SingleHopCandidates(estimator.candidates(statistics.stats, previous=head.single), SMALL_SEARCH)
    candidates = CopyCandidates(single, head.kappa, head.rho, head.buckets.bucket_of_recency)
    grid = candidates.grid(None)
    totals = grid.score([Block(heldout, None)])
    assert totals.target_log_prob.size == 12
    for index in itertools.product(*(range(g) for g in grid.table.shape)):
        scored = candidates.model(grid.table.hyperparameters(index)).score([Block(heldout, None)], accuracy=False)
        assert totals.weight == pytest.approx(scored.weight, rel=1e-12)
        assert totals.target_log_prob[index] == pytest.approx(scored.target_log_prob, rel=1e-11, abs=1e-11), index
        assert totals.log_lik[index] == pytest.approx(scored.log_lik, rel=1e-11, abs=1e-11), index
    choice, heldout_metrics = candidates.choose(grid, totals)
    assert heldout_metrics is not None and choice == grid.table.hyperparameters(totals.best())
