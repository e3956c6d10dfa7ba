"""The chain of hops: forward–backward against enumeration over hop paths, the reference library's chained
attention, the single head at H = 1, and EM's monotone objective."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.emission.layouts import DenseEmission, PairSupport
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.heads.base import Block, TrainerContext
from dist_respattn.model.heads.hops import HopsHead, HopsSpec
from dist_respattn.model.heads.hops.kernels import HopArrays, hop_estep, hop_score
from dist_respattn.model.heads.hops.kind import hop_m_step, hop_statistics
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.rows import EncodedRows, WindowRows
from dist_respattn.model.streaming import generate
from tests.lazy_module import LazyModule
from tests.model.test_copy import corpus, windows_of

#: The reference library's module, imported by the first test that reads it (tests/lazy_module.py).
ref = LazyModule("mixle.stats.latent.chained_attention")


def random_chain(shape, hops, seed, *, softmax=False, sigma2=0.7):
    """A random chain of ``hops`` hops over rows of ``shape`` (random later keys, priors and hop queries)."""
    s, n, d, t = shape
    rng = np.random.default_rng(seed)
    single = random_distribution(s, n, d, t, seed=seed, sigma2=sigma2, key_scale=1.0)
    single = ResponsibilityAttentionDistribution(
        single.key_means, single.emission_table.probs, rng.dirichlet(np.ones(n)), sigma2
    )
    keys = rng.normal(size=(hops - 1, s, d))
    priors = rng.dirichlet(np.ones(n), size=hops - 1)
    return HopsHead(single, keys, priors, rng.normal(size=(s, d)), softmax=softmax)


def rows_of(context, query, target, lengths=None):
    """Window rows of ``context`` (n, N), each ``lengths[r]`` most recent tokens kept (all without)."""
    n, n_pos = context.shape
    if lengths is None:
        return WindowRows.from_encoded(context, query, target)
    tokens = np.ascontiguousarray(context).reshape(-1)
    end = (np.arange(n) + 1) * n_pos
    return WindowRows(tokens, end - lengths, end, target, query, np.arange(n), None, 0)


def gaussian(x, mean, sigma2):
    d = x.shape[0]
    return np.exp(-((x - mean) ** 2).sum() / (2 * sigma2)) / (2 * np.pi * sigma2) ** (d / 2)


def enumerate_paths(head, window, y, t):
    """Every hop path of one window: ``{path: weight}`` with and without the emission, by the definitions."""
    single, sigma2 = head.single, head.single.sigma2
    n_pos, m = head.context_length, len(window)
    cols = range(n_pos - m, n_pos)
    priors = np.vstack([single.position_prior[None], head.priors])
    priors = priors[:, n_pos - m :] / priors[:, n_pos - m :].sum(axis=1, keepdims=True)
    keys = np.concatenate([single.key_means[None], head.keys])
    emission = single.emission_table.to_dense()
    out = {}
    for path in itertools.product(range(m), repeat=head.n_hops):
        w = priors[0, path[0]] * gaussian(y, keys[0, window[path[0]]], sigma2)
        for h in range(1, head.n_hops):
            q = head.hop_queries[window[path[h - 1]]]
            factor = lambda j: priors[h, j] * gaussian(q, keys[h, window[j]], sigma2)  # noqa: B023, E731
            w *= factor(path[h]) / (sum(factor(j) for j in range(m)) if head.softmax else 1.0)
        out[path] = (w * emission[window[path[-1]], t], w)
    assert len(cols) == m
    return out


def assert_estep_equals_enumeration(head, hops, context, query, target, lengths, log_domain_rows=0):
    """The kernel's E-step (:func:`hop_estep`) on these rows equals the enumeration over hop paths; it redid
    ``log_domain_rows`` rows in the log domain. Returns the enumeration's log-likelihood."""
    rows = rows_of(context, query, target, lengths)
    arrays = HopArrays.zeros(hops, head.shape, None)
    assert hop_estep(rows, head.parameters, arrays) == log_domain_rows
    key_sum, key_mass, _, counts, log_lik = brute_statistics(head, context, query, target, lengths)
    assert arrays.scalars[2] == pytest.approx(log_lik, rel=1e-12)
    np.testing.assert_allclose(arrays.key_sum, key_sum, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(arrays.key_mass, key_mass, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(arrays.emission_count_ts, counts.T, rtol=1e-11, atol=1e-13)
    return log_lik


def brute_statistics(head, context, query, target, lengths):
    """The chain's statistics by enumerating the paths of every row (their posteriors, weighted by definition)."""
    s, n_pos, d, t = head.shape
    h_n = head.n_hops
    key_sum, key_mass, position = np.zeros((h_n, s, d)), np.zeros((h_n, s)), np.zeros((h_n, n_pos))
    counts, log_lik = np.zeros((s, t)), 0.0
    for r in range(context.shape[0]):
        window = context[r, n_pos - lengths[r] :]
        m = len(window)
        paths = enumerate_paths(head, window, query[r], target[r])
        z = sum(v[0] for v in paths.values())
        log_lik += np.log(z)
        for path, (joint, _) in paths.items():
            p = joint / z
            for h, j in enumerate(path):
                q = query[r] if h == 0 else head.hop_queries[window[path[h - 1]]]
                key_sum[h, window[j]] += p * q
                key_mass[h, window[j]] += p
                position[h, n_pos - m + j] += p
            counts[window[path[-1]], target[r]] += p
    return key_sum, key_mass, position, counts, log_lik


@pytest.mark.parametrize("dim", [2, 8], ids=["D2", "D8-lanes"])
@pytest.mark.parametrize("softmax", [False, True], ids=["joint", "softmax"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_backward_equals_enumeration_over_hop_paths(seed, softmax, dim):
    """The E-step's statistics and the scores equal the enumeration over hop paths, with D = 2 and with D a multiple
    of 8 (the distances and hop-query sums then run as 8-lane vector code)."""
    shape = (5, 4, dim, 3)
    hops = 3 if seed == 2 else 2
    head = random_chain(shape, hops, seed, softmax=softmax)
    rng = np.random.default_rng(seed + 10)
    n = 6
    context = rng.integers(0, shape[0], size=(n, shape[1])).astype(np.int32)
    query = rng.normal(size=(n, shape[2]))
    target = rng.integers(0, shape[3], size=n).astype(np.int32)
    lengths = np.array([4, 4, 1, 2, 3, 4])
    rows = rows_of(context, query, target, lengths)
    stats = hop_statistics(head, [Block(rows, None)])
    key_sum, key_mass, _, counts, log_lik = brute_statistics(head, context, query, target, lengths)
    assert stats.log_lik == pytest.approx(log_lik, rel=1e-12)
    np.testing.assert_allclose(stats.stats.key_sum, key_sum[0], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(stats.key_sum, key_sum[1:], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(stats.stats.key_mass, key_mass[0], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(stats.key_mass, key_mass[1:], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(stats.stats.emission_count.to_dense(), counts, rtol=1e-11, atol=1e-13)
    # Full windows: the position masses are the posteriors'; a short window adds its rejected draws after them.
    full = lengths == shape[1]
    assert full.sum() == 3
    sub = hop_statistics(head, [Block(rows.select(full), None)])
    _, _, position_full, _, _ = brute_statistics(head, context[full], query[full], target[full], lengths[full])
    np.testing.assert_allclose(sub.stats.position_count, position_full[0], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(sub.position_mass, position_full[1:], rtol=1e-11, atol=1e-13)
    # The scores: the joint path sum (with each Gaussian's normalizer), and the predictive over targets.
    totals = head.score([Block(rows, None)])
    assert totals.weight == n
    assert totals.log_lik == pytest.approx(log_lik, rel=1e-12)
    predictive = 0.0
    for r in range(n):
        paths = enumerate_paths(head, context[r, shape[1] - lengths[r] :], query[r], target[r])
        predictive += np.log(sum(v[0] for v in paths.values()) / sum(v[1] for v in paths.values()))
    assert totals.target_log_prob == pytest.approx(predictive, rel=1e-12)


@pytest.mark.parametrize("softmax", [False, True], ids=["joint", "softmax"])
@pytest.mark.parametrize(("hops", "n_pos"), [(2, 8), (3, 10)])
def test_windows_of_8_new_positions_equal_the_enumeration(hops, n_pos, softmax):
    """Windows of 8 positions that share no pair with a neighbour (sampled rows: each later hop's transitions in one
    8-lane pass a source), full at N = 8 and short at N = 10, against the enumeration over hop paths."""
    shape = (11, n_pos, 8, 4)
    head = random_chain(shape, hops, 20 + hops, softmax=softmax)
    rng = np.random.default_rng(30 + hops)
    n = 4
    context = np.stack([rng.permutation(shape[0])[:n_pos] for _ in range(n)]).astype(np.int32)
    query = rng.normal(size=(n, shape[2]))
    target = rng.integers(0, shape[3], size=n).astype(np.int32)
    lengths = np.full(n, 8)
    assert_estep_equals_enumeration(head, hops, context, query, target, lengths)


@pytest.mark.parametrize("hops", [2, 3])
def test_windows_of_8_with_keys_near_their_hop_queries_equal_the_enumeration(hops):
    """Later hops' keys a hair from the hop queries and far from the origin (|q|^2 ~ 800: the distances from norms,
    |q|^2 + |k|^2 - 2 q.k, cancel to near 0 on the "same token" pairs), windows of 8 new positions: the statistics
    still equal the enumeration over hop paths, which takes the distances directly."""
    shape = (11, 8, 8, 4)
    head = random_chain(shape, hops, 40 + hops, sigma2=2.0)
    rng = np.random.default_rng(50 + hops)
    hop_queries = 10.0 + rng.normal(size=(shape[0], shape[2]))
    keys = hop_queries[None] + rng.normal(scale=1e-6, size=(hops - 1, shape[0], shape[2]))
    keys[:, ::2] += rng.normal(scale=0.5, size=(hops - 1, (shape[0] + 1) // 2, shape[2]))  # some far, some near
    head = HopsHead(head.single, keys, np.asarray(head.priors), hop_queries, softmax=False)
    n = 6
    context = np.stack([rng.permutation(shape[0])[:8] for _ in range(n)]).astype(np.int32)
    query = rng.normal(size=(n, shape[2]))
    target = rng.integers(0, shape[3], size=n).astype(np.int32)
    lengths = np.full(n, 8)
    assert_estep_equals_enumeration(head, hops, context, query, target, lengths)


def test_one_hop_is_the_single_head():
    shape = (7, 5, 3, 6)
    single = random_distribution(*shape, seed=3, sigma2=0.6)
    head = HopsHead(single, np.zeros((0, shape[0], shape[2])), np.zeros((0, shape[1])), np.zeros((shape[0], shape[2])))
    context, query, target = single.sampler(4).sample_arrays(200)
    rows = WindowRows.from_encoded(context.astype(np.int32), query, target.astype(np.int32))
    encoded = EncodedRows(context.astype(np.int32), query, target.astype(np.int32), None, 0)
    mine, theirs = head.score([Block(rows, None)]), single.score([Block(encoded, None)])
    assert mine.log_lik == pytest.approx(theirs.log_lik, rel=1e-12)
    assert mine.target_log_prob == pytest.approx(theirs.target_log_prob, rel=1e-12)
    assert mine.correct == theirs.correct
    np.testing.assert_allclose(head.predict_proba(context[:5], query[:5]), single.predict_proba(context[:5], query[:5]))


def test_statistics_and_parameters_equal_the_reference_chained_attention():
    """The reference library's chain on its own toy data: keys one-hot queries (D = S), the hop query table the
    identity, uniform priors, softmax transitions; ours carries the query's Gaussian normalizer in the joint."""
    n_hops, s, t, sigma2 = 2, 5, 4, 0.3
    rng = np.random.RandomState(0)
    truth = ref.ChainedAttentionDistribution(
        rng.normal(size=(n_hops, s, s)) * 0.5 + np.eye(s)[None], rng.dirichlet(np.ones(t), size=s), sigma2=sigma2
    )
    data = truth.sampler(seed=1).sample(200)
    enc = truth.dist_to_encoder().seq_encode(data)
    keys, vals, q, target = enc
    if not np.array_equal(keys, vals):
        # The reference's contexts hold (key, value) pairs; ours one token per position: values = keys.
        data = [(k, k, qq, tt) for (k, _, qq, tt) in data]
        enc = truth.dist_to_encoder().seq_encode(data)
        keys, vals, q, target = enc
    estimate = truth
    accumulator = ref.ChainedAttentionEstimator(n_hops, s, t, sigma2=sigma2).accumulator_factory().make()
    accumulator.seq_update(enc, np.ones(len(data)), estimate)
    key_num, key_mass, emission_count, ll, n = accumulator.value()

    n_pos = keys.shape[1]
    single = ResponsibilityAttentionDistribution(
        truth.key_tables[0], DenseEmission(truth.emission), np.full(n_pos, 1.0 / n_pos), sigma2
    )
    head = HopsHead(single, truth.key_tables[1:], np.full((n_hops - 1, n_pos), 1.0 / n_pos), np.eye(s), softmax=True)
    query = np.eye(s)[q]
    rows = WindowRows.from_encoded(keys.astype(np.int32), query, target.astype(np.int32))
    stats = hop_statistics(head, [Block(rows, None)])
    np.testing.assert_allclose(stats.stats.key_sum, key_num[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats.key_sum, key_num[1:], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats.stats.key_mass, key_mass[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats.key_mass, key_mass[1:], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats.stats.emission_count.to_dense(), emission_count, rtol=1e-10, atol=1e-12)
    assert stats.n_obs == n
    # Ours is the joint: the reference's conditional log-likelihood and the query's density under hop 1's gate.
    distance = ((query[:, None, :] - truth.key_tables[0][keys]) ** 2).sum(axis=2)
    density = np.log(np.exp(-distance / (2 * sigma2)).mean(axis=1)) - s / 2 * np.log(2 * np.pi * sigma2)
    assert stats.log_lik == pytest.approx(ll + density.sum(), rel=1e-10)
    # The M-step: the reference's key tables (the mean incoming query) on every symbol some hop reached.
    fitted = ref.ChainedAttentionEstimator(n_hops, s, t, sigma2=sigma2).estimate(None, accumulator.value())
    spec = HopsSpec(SingleHopSpec(sigma2=sigma2, emission_smoothing=1e-4, emission_layout="dense"), 2, softmax=True)
    ours = spec.trainer(TrainerContext((s, n_pos, s, t))).m_step(stats, head).head
    assert (key_mass > 0).all()  # every symbol reached by every hop: the key tables are the whole tables
    np.testing.assert_allclose(ours.single.key_means, fitted.key_tables[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.keys, fitted.key_tables[1:], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.single.emission_table.to_dense(), fitted.emission, rtol=1e-10, atol=1e-12)
    new_keys, _ = hop_m_step(stats, head)
    np.testing.assert_array_equal(new_keys, ours.keys)


def test_maximum_likelihood_em_never_lowers_the_objective():
    shape = (6, 4, 2, 5)
    truth = random_chain(shape, 2, 8)
    rng = np.random.default_rng(9)
    context = rng.integers(0, shape[0], size=(300, shape[1])).astype(np.int32)
    query = (truth.hop_queries[context[:, -1]] + 0.3 * rng.normal(size=(300, shape[2]))).astype(np.float32)
    target = rng.integers(0, shape[3], size=300).astype(np.int32)
    spec = HopsSpec(SingleHopSpec(sigma2=0.7, emission_smoothing=0.0, emission_layout="dense"), hops=2)
    result = fit_em((context, query.astype(np.float64), target), spec, shape=shape, max_iter=12, tol=0.0)
    trace = np.asarray(result.log_likelihoods)
    assert len(trace) >= 5
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))


def test_the_streaming_predictor_equals_recomputation_and_generates() -> None:
    """The predictor over a growing history equals the chain's predictive over the same window, short windows
    included, and ``sample``'s generator draws from it."""
    shape = (9, 4, 3, 9)
    head = random_chain(shape, 2, 5)
    embeddings = np.random.default_rng(6).normal(size=(shape[0], shape[2]))
    predictor = head.predictor(query_table=embeddings)
    history = [3, 1, 4, 1, 5, 8]
    for k, token in enumerate(history):
        predictor.push(token)
        window = np.array(history[max(0, k + 1 - shape[1]) : k + 1], dtype=np.int32)
        rows = WindowRows(window, np.array([0]), np.array([len(window)]), np.zeros(1, dtype=np.int32),
                          embeddings[[token]], np.zeros(1, dtype=np.int64), None, 0)  # fmt: skip
        _, _, _, attention = hop_score(rows, head.parameters)
        np.testing.assert_allclose(predictor.predict(), head.window_proba(rows, attention)[0], rtol=1e-12)
        assert predictor.state_size == len(window)
    drawn = generate(head, embeddings, np.array([3, 1]), 5, np.random.default_rng(0))
    assert drawn.shape == (5,) and ((drawn >= 0) & (drawn < shape[3])).all()


def _statistic_arrays(head, rows, params):
    arrays = HopArrays.zeros(head.n_hops, head.shape, head.single.emission_table.support.num_pairs)
    hop_estep(rows, params, arrays)
    return [arrays.key_sum, arrays.key_mass, arrays.recency_mass, arrays.pair_counts, arrays.scalars]


@pytest.mark.parametrize("shape", [(5, 4, 2, 5), (5, 10, 16, 5)], ids=["N4-D2", "N10-D16-lanes"])
@pytest.mark.parametrize("hops", [2, 3])
def test_stream_windows_and_a_sparse_emission_equal_the_enumeration(hops, shape):
    """Windows of one token stream (each shares all but one token with the previous one, short ones at document
    starts: the distances the kernel takes from the previous row) under a sparse emission read through direct rows,
    binary searches, or both: the same statistics bit for bit, and the enumeration's; with D a multiple of 8 and
    windows of more than 8 positions too (the distances 8 keys a pass, a window in blocks)."""
    head = random_chain(shape, hops, 7)
    support = PairSupport.full(shape[0], shape[3])
    head = HopsHead(head.single.with_emission(head.single.emission_table.restricted(support)), head.keys,
                    head.priors, head.hop_queries)  # fmt: skip
    rng = np.random.default_rng(8)
    tokens, starts = corpus(rng, 40, shape[0], 3)
    rows = windows_of(tokens, starts, shape[1], rng.normal(size=(shape[0], shape[2])))
    params = head.parameters
    assert (params.direct_row >= 0).all()  # a full support: every target has its direct row
    some = params.direct_row.copy()
    some[::2] = -1
    variants = [
        _statistic_arrays(head, rows, params),
        _statistic_arrays(head, rows, dataclasses.replace(params, direct_row=params.direct_row[:0])),
        _statistic_arrays(head, rows, dataclasses.replace(params, direct_row=some)),
    ]
    for other in variants[1:]:
        for a, b in zip(variants[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    lengths = rows.end - rows.begin
    context = np.zeros((rows.num_rows, shape[1]), dtype=np.int32)
    for r in range(rows.num_rows):
        context[r, shape[1] - lengths[r] :] = tokens[rows.begin[r] : rows.end[r]]
    query = rows.query_table[rows.query_index]
    key_sum, key_mass, _, counts, log_lik = brute_statistics(head, context, query, rows.target, lengths)
    stats = hop_statistics(head, [Block(rows, None)])
    assert stats.log_lik == pytest.approx(log_lik, rel=1e-12)
    np.testing.assert_allclose(stats.stats.key_sum, key_sum[0], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(stats.key_sum, key_sum[1:], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(stats.key_mass, key_mass[1:], rtol=1e-11, atol=1e-13)
    emission_count = stats.stats.emission_count.on(support).to_dense()
    np.testing.assert_allclose(emission_count, counts, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("shape", [(5, 8, 8, 5), (5, 10, 16, 5)], ids=["N8-D8", "N10-D16"])
@pytest.mark.parametrize("hops", [2, 3])
def test_a_stream_s_statistics_are_the_same_with_and_without_the_rings(hops, shape):
    """The E-step keeps a stream's pairs from row to row in rings only where its vector code cannot run (D not a
    multiple of 8); with D a multiple of 8 it takes the copy without them, every window's pairs its own. Forced
    either way on one stream (windows of 8 and of 10 positions, short ones at document starts): the same statistics
    to rounding, no row redone in the log domain."""
    head = random_chain(shape, hops, 21)
    rng = np.random.default_rng(22)
    tokens, starts = corpus(rng, 60, shape[0], 3)
    rows = windows_of(tokens, starts, shape[1], rng.normal(size=(shape[0], shape[2])))
    both = []
    for rings in (True, False):
        arrays = HopArrays.zeros(hops, head.shape, None)
        assert hop_estep(rows, head.parameters, arrays, rings=rings) == 0
        both.append(arrays)
    with_rings, without = both
    for name in ("key_sum", "key_mass", "recency_mass", "emission_count_ts", "scalars"):
        np.testing.assert_allclose(getattr(without, name), getattr(with_rings, name), rtol=1e-12, atol=1e-14)
    assert (without.key_mass[1:] > 0).any()  # the later hops' sums are there to compare


@pytest.mark.parametrize("hops", [2, 3])
def test_rows_the_linear_domain_cannot_scale_are_redone_in_the_log_domain(hops):
    """The E-step scales each hop's forward and backward vectors by one number; where the paths' weights lie too far
    apart for that (here the query's favourite position, symbol 0, asks a hop query no later key is near, and every
    other path starts e^-500 lower: a normalizer below 1e-200), the row is redone in the log domain. Both kinds of
    rows, in full windows of 6 and short ones, give the enumeration's statistics; a random chain's rows never
    leave the linear domain."""
    s, n_pos, d, t = 3, 6, 1, 3
    rng = np.random.default_rng(5)
    # sigma2 = 1/2: a log-weight is minus the squared distance. Hop 1 from y = 0: symbol 0 at 0, symbol 1 at
    # sqrt(500) (e^-500), symbol 2 at 1; hop queries: symbol 0's 100 (every later key is near 0), the others' near 0.
    single = ResponsibilityAttentionDistribution(
        np.array([[0.0], [np.sqrt(500.0)], [1.0]]),
        rng.dirichlet(np.ones(t), size=s),
        rng.dirichlet(np.ones(n_pos)),
        0.5,
    )
    keys = rng.normal(scale=0.3, size=(hops - 1, s, d))
    head = HopsHead(single, keys, rng.dirichlet(np.ones(n_pos), size=hops - 1), np.array([[100.0], [0.0], [0.5]]))
    n = 8
    far = rng.integers(0, 2, size=(n, n_pos))  # symbols 0 and 1 only: the rows past the linear domain
    far[:, -1], far[:, -2] = 0, 1
    near = rng.integers(0, s, size=(n, n_pos))
    near[:, -1] = 2
    context = np.concatenate([far, near]).astype(np.int32)
    query = np.concatenate([np.zeros((n, d)), rng.normal(scale=0.5, size=(n, d))])
    target = rng.integers(0, t, size=2 * n).astype(np.int32)
    lengths = np.tile([6, 5, 2, 6, 4, 3, 6, 6], 2)
    log_lik = assert_estep_equals_enumeration(head, hops, context, query, target, lengths, log_domain_rows=n)
    assert log_lik < -400 * n  # the far rows' likelihoods are ~e^-500
    ordinary = random_chain((5, 6, 2, 4), hops, 3)
    context = rng.integers(0, 5, size=(50, 6)).astype(np.int32)
    rows = rows_of(context, rng.normal(size=(50, 2)), rng.integers(0, 4, size=50).astype(np.int32))
    assert hop_estep(rows, ordinary.parameters, HopArrays.zeros(hops, ordinary.shape, None)) == 0


@pytest.mark.parametrize("hops", [2, 3])
def test_stream_rows_past_the_linear_domain_are_redone_from_shifted_transitions(hops):
    """A stream's windows take a joint factor's transitions unshifted (each pair's exponential kept from the window
    before); a row the linear domain cannot scale is redone in the log domain from shifted transitions, rebuilt from
    the rings. The chain of the test above on one stream of two documents, the query 0 every row: windows of symbols
    0 and 1 only are past the linear domain, with symbol 2 they are not; every row gives the enumeration's
    statistics."""
    s, n_pos, d, t = 3, 6, 1, 3
    rng = np.random.default_rng(5)
    single = ResponsibilityAttentionDistribution(
        np.array([[0.0], [np.sqrt(500.0)], [1.0]]),
        rng.dirichlet(np.ones(t), size=s),
        rng.dirichlet(np.ones(n_pos)),
        0.5,
    )
    keys = rng.normal(scale=0.3, size=(hops - 1, s, d))
    head = HopsHead(single, keys, rng.dirichlet(np.ones(n_pos), size=hops - 1), np.array([[100.0], [0.0], [0.5]]))
    tokens = np.concatenate([rng.integers(0, 2, size=50), rng.integers(0, s, size=50)]).astype(np.int32)
    tokens[::3] = 1  # every window holds a 1 (a window of 0s only is ~e^-10000: zero for the enumeration)
    rows = windows_of(tokens, [0, 30], n_pos, np.zeros((s, d)))
    arrays = HopArrays.zeros(hops, head.shape, None)
    redone = hop_estep(rows, head.parameters, arrays)
    assert 0 < redone < rows.num_rows
    lengths = rows.end - rows.begin
    context = np.zeros((rows.num_rows, n_pos), dtype=np.int32)
    for r in range(rows.num_rows):
        context[r, n_pos - lengths[r] :] = tokens[rows.begin[r] : rows.end[r]]
    query = rows.query_table[rows.query_index]
    key_sum, key_mass, _, counts, log_lik = brute_statistics(head, context, query, rows.target, lengths)
    assert arrays.scalars[2] == pytest.approx(log_lik, rel=1e-12)
    np.testing.assert_allclose(arrays.key_sum, key_sum, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(arrays.key_mass, key_mass, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(arrays.emission_count_ts, counts.T, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("rings", [True, False], ids=["rings", "no-rings"])
@pytest.mark.parametrize("hops", [2, 3])
def test_windows_of_new_pairs_between_stream_windows_equal_the_enumeration(hops, rings):
    """With D a multiple of 8 and the rings, a window none of whose pairs the previous row's window held and that the
    next row's does not slide into (a sampled row) has its transition distances computed straight into a plain
    table, the rings left alone and marked as holding no window; without them (the E-step's choice at this D) every
    window does. Stream rows taken out of order around such windows, and a weightless row between a window and the
    one sliding into it (the window before it then is one of new pairs whose successor it skips): every row gives
    the enumeration's statistics, the weightless ones none."""
    shape = (6, 4, 8, 6)
    head = random_chain(shape, hops, 11)
    rng = np.random.default_rng(12)
    tokens, starts = corpus(rng, 40, shape[0], 2)
    stream = windows_of(tokens, starts, shape[1], rng.normal(size=(shape[0], shape[2])))
    n = stream.num_rows
    # In stream order, with windows of rows far away in between (rows n - 1 and 20: windows of new pairs), and
    # weightless rows: 30 between the windows of rows 5 (of new pairs: 20 before it, 30 after) and 6, 25 between 7
    # and 8.
    order = [0, 1, 2, n - 1, 3, 4, 20, 5, 30, 6, 7, 25, 8, 9, n - 5, 10, 11, 12]
    weight = np.ones(len(order))
    weight[[8, 11]] = 0.0
    rows = stream.select(np.array(order))._replace(weight=weight)
    arrays = HopArrays.zeros(hops, head.shape, None)
    assert hop_estep(rows, head.parameters, arrays, rings=rings) == 0
    kept = rows.select(weight > 0)
    lengths = kept.end - kept.begin
    context = np.zeros((kept.num_rows, shape[1]), dtype=np.int32)
    for r in range(kept.num_rows):
        context[r, shape[1] - lengths[r] :] = tokens[kept.begin[r] : kept.end[r]]
    query = kept.query_table[kept.query_index]
    key_sum, key_mass, _, counts, log_lik = brute_statistics(head, context, query, kept.target, lengths)
    assert arrays.scalars[2] == pytest.approx(log_lik, rel=1e-12)
    np.testing.assert_allclose(arrays.key_sum, key_sum, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(arrays.key_mass, key_mass, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(arrays.emission_count_ts, counts.T, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("hops", [2, 3])
def test_sampled_rows_visited_by_target_equal_the_enumeration(hops):
    """Rows that are not a stream's, visited grouped by target (their windows' tokens copied into that order, short
    windows and weightless rows among them): the enumeration's statistics, and row order's to rounding; rows no path
    explains are named in row order, not in the order they were visited."""
    shape = (6, 4, 8, 5)
    head = random_chain(shape, hops, 13)
    rng = np.random.default_rng(14)
    n = 24
    context = rng.integers(0, shape[0], size=(n, shape[1])).astype(np.int32)
    query = rng.normal(size=(n, shape[2]))
    target = rng.integers(0, shape[3], size=n).astype(np.int32)
    lengths = rng.integers(1, shape[1] + 1, size=n)
    weight = np.ones(n)
    weight[[3, 10]] = 0.0
    rows = rows_of(context, query, target, lengths)._replace(weight=weight)
    grouped = HopArrays.zeros(hops, head.shape, None)
    assert hop_estep(rows, head.parameters, grouped, group_by_target=True) == 0
    in_rows = HopArrays.zeros(hops, head.shape, None)
    hop_estep(rows, head.parameters, in_rows, group_by_target=False)
    kept = weight > 0
    key_sum, key_mass, _, counts, log_lik = brute_statistics(
        head, context[kept], query[kept], target[kept], lengths[kept]
    )
    assert grouped.scalars[2] == pytest.approx(log_lik, rel=1e-12)
    np.testing.assert_allclose(grouped.key_sum, key_sum, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(grouped.key_mass, key_mass, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(grouped.emission_count_ts, counts.T, rtol=1e-11, atol=1e-13)
    for a, b in zip(dataclasses.astuple(grouped), dataclasses.astuple(in_rows), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    # Targets 1 and 4 no symbol emits: rows 2 (target 4) and 9 (target 1), visited 9 first.
    probs = head.single.emission_table.to_dense()
    probs[:, [1, 4]] = 0.0
    impossible = HopsHead(head.single.with_emission(DenseEmission(probs / probs.sum(axis=1, keepdims=True))),
                          head.keys, head.priors, head.hop_queries)  # fmt: skip
    target = np.where(np.isin(target, [1, 4]), 0, target).astype(np.int32)
    target[2], target[9] = 4, 1
    rows = rows_of(context, query, target, lengths)
    with pytest.raises(ImpossibleEvidenceError, match=r"rows 2, 9 have"):
        hop_estep(rows, impossible.parameters, HopArrays.zeros(hops, head.shape, None), group_by_target=True)


@pytest.mark.parametrize("grouped", [False, True], ids=["row-order", "by-target"])
def test_float32_queries_give_their_float64_copy_s_statistics(grouped):
    """A float32 query table is read as it is, each row's query widened as the E-step takes it (a read-only one, a
    store's, copied first): the statistics of the same queries as a float64 table, bit for bit."""
    shape = (11, 8, 8, 4)
    head = random_chain(shape, 3, 5)
    rng = np.random.default_rng(6)
    n = 40
    context = np.stack([rng.permutation(shape[0])[:8] for _ in range(n)]).astype(np.int32)
    narrow = rng.normal(size=(n, shape[2])).astype(np.float32)
    target = rng.integers(0, shape[3], size=n).astype(np.int32)
    lengths = rng.integers(5, 9, size=n)
    read_only = narrow.copy()
    read_only.flags.writeable = False
    results = []
    for table in (narrow.astype(np.float64), narrow, read_only):
        arrays = HopArrays.zeros(3, head.shape, None)
        hop_estep(rows_of(context, table, target, lengths), head.parameters, arrays, group_by_target=grouped)
        results.append(arrays)
    for other in results[1:]:
        for a, b in zip(dataclasses.astuple(results[0]), dataclasses.astuple(other), strict=True):
            np.testing.assert_array_equal(a, b)


def test_window_rows_name_the_first_row_with_a_non_finite_query():
    """The rows' own query table is checked whole, a table larger than the rows' queries by the rows it gives them:
    either way the first row reading a non-finite number is named, and a non-finite row no row reads is accepted."""
    rng = np.random.default_rng(7)
    context = rng.integers(0, 5, size=(6, 4)).astype(np.int32)
    target = rng.integers(0, 3, size=6).astype(np.int32)
    query = rng.normal(size=(6, 2))
    rows = WindowRows.from_encoded(context, query, target)
    rows.check(5, 3, 4, 2)
    for bad in (np.nan, np.inf):
        table = query.copy()
        table[[4, 2], 1] = bad
        with pytest.raises(ValueError, match=r"row 2: its query holds a non-finite value"):
            rows._replace(query_table=table).check(5, 3, 4, 2)
        # Rows reading a table of 7 rows through an index: the bad row 6 read by row 3 only, then by none.
        wide = np.vstack([query, np.full((1, 2), bad)])
        index = np.array([0, 1, 2, 6, 4, 5])
        with pytest.raises(ValueError, match=r"row 3: its query holds a non-finite value"):
            rows._replace(query_table=wide, query_index=index).check(5, 3, 4, 2)
        rows._replace(query_table=wide).check(5, 3, 4, 2)
        # As many rows as the table's, one of them unread: accepted, the bad one never read.
        rows._replace(query_table=wide[1:], query_index=np.array([0, 1, 2, 3, 4, 4])).check(5, 3, 4, 2)
