"""The histogram kernels against the per-position ones under the same tied prior, short histories against a plain
per-position reference, EM with tied buckets, and the streaming predictor against recomputation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn import ResponsibilityAttentionDistribution, ResponsibilityAttentionEstimator, random_distribution
from dist_respattn.model.buckets import PositionBuckets, max_geometric_buckets
from dist_respattn.model.fitting.selection import DEFAULT_SEARCH, score_grid
from dist_respattn.model.heads.single_hop.scoring import score_rows
from dist_respattn.model.kernels.histogram import grid_windows, score_windows
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.streaming import Predictor
from tests.model.emission_layouts import LAYOUTS, counts_in_layout
from tests.model.test_kernel_parity import assert_close

RTOL = 1e-12


def tied_model(shape, buckets, seed, layout, data=None):
    """A random head with its prior tied over ``buckets``; sparse over the pairs of ``data`` (context, target)."""
    s, n, d, t = shape
    base = random_distribution(s, n, d, t, seed=seed, key_scale=1.5, sigma2=1.3)
    rng = np.random.default_rng(seed)
    prior = buckets.spread(rng.dirichlet(np.ones(buckets.num_buckets)))
    emission = base.emission
    if layout == "sparse":
        context, target = data
        counts = np.zeros((s, t))
        np.add.at(counts, (context.reshape(-1), np.repeat(target, context.shape[1])), 1.0)
        sparse_counts = counts_in_layout(counts, "sparse")
        emission = sparse_counts.map_emission(rng.uniform(0.5, 2.0, size=s), rng.dirichlet(np.ones(t)))
    return ResponsibilityAttentionDistribution(base.key_means, emission, prior, base.sigma2, buckets=buckets)


@st.composite
def tied_problems(draw):
    n_pos = draw(st.integers(1, 20))
    k = draw(st.sampled_from(sorted({n_pos, *range(1, max_geometric_buckets(n_pos) + 1)})))
    buckets = PositionBuckets.geometric(n_pos, k)
    repeats = draw(st.booleans())  # few symbols: windows full of repeats; many: hardly any
    s = draw(st.integers(1, 4)) if repeats else draw(st.integers(30, 60))
    t = draw(st.integers(1, 7))
    d = draw(st.integers(1, 5))
    rows = draw(st.integers(0, 30))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    context = rng.integers(0, s, size=(rows, n_pos)).astype(np.int32)
    query = rng.normal(size=(rows, d))
    target = rng.integers(0, t, size=rows).astype(np.int32)
    weights = draw(st.one_of(st.none(), st.just(rng.uniform(0.0, 2.0, size=rows))))
    if weights is not None and rows:
        weights[::3] = 0.0
    layout = draw(st.sampled_from(LAYOUTS))
    model = tied_model((s, n_pos, d, t), buckets, seed, layout, (context, target))
    return model, (context, query, target), weights


def dense_counts(value, model):
    counts = value.emission_count
    table = model.emission_table
    return (counts.on(table.support) if counts.layout == "sparse" else counts).to_dense()


def assert_same_statistics(a, b, model):
    buckets = model.buckets
    for name in ("key_sum", "key_mass", "query_sq", "n_obs", "log_lik"):
        assert_close(getattr(a, name), getattr(b, name), rtol=RTOL, label=name)
    assert_close(dense_counts(a, model), dense_counts(b, model), rtol=RTOL, label="emission_count")
    # The histogram kernel spreads each bucket's mass evenly: the tied M-step reads bucket sums only.
    assert_close(
        buckets.bucket_weights(a.position_count), buckets.bucket_weights(b.position_count), rtol=RTOL,
        label="bucket mass",
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(tied_problems())
def test_the_histogram_estep_equals_the_per_position_kernel_under_the_same_tied_prior(problem):
    model, data, weights = problem
    factory = model.estimator().accumulator_factory(layout=model.emission_table.layout)
    per_position = factory.make_for(model)
    per_position.seq_update(data, weights, model)
    histogram = factory.make_for(model)
    histogram.seq_update_windows(WindowRows.from_encoded(*data, weights), model)
    assert_same_statistics(per_position.value(), histogram.value(), model)


@settings(max_examples=40, deadline=None)
@given(tied_problems())
def test_histogram_scores_and_grid_equal_the_per_position_ones(problem):
    model, data, weights = problem
    rows = WindowRows.from_encoded(*data, weights)
    expected, got = score_rows(model, data, weights), score_windows(model, rows)
    for name in ("weight", "log_lik", "target_log_prob", "correct"):
        # Totals near 0 (T = 1: every log-probability is 0 up to rounding) are compared on the rows' weight.
        scale = max(abs(getattr(expected, name)), expected.weight, 1.0)
        assert abs(getattr(got, name) - getattr(expected, name)) <= RTOL * scale, name
    accumulator = model.estimator().accumulator_factory(layout=model.emission_table.layout).make_for(model)
    accumulator.seq_update(data, weights, model)
    estimator = ResponsibilityAttentionEstimator(
        *data_shape(model), emission_prior=_prior(model), search=DEFAULT_SEARCH, buckets=model.buckets
    )
    table = estimator.candidates(accumulator.value(), previous=model).grid_table(DEFAULT_SEARCH)
    want, have = score_grid(table, data, weights), grid_windows(table, rows)
    assert_close(have.weight, want.weight, rtol=RTOL, label="grid weight")
    scale = max(float(np.abs(want.target_log_prob).max(initial=0.0)), want.weight, 1.0)
    assert np.abs(have.target_log_prob - want.target_log_prob).max(initial=0.0) <= RTOL * scale
    assert_close(have.log_lik, want.log_lik, rtol=RTOL, label="grid log_lik")


def data_shape(model):
    return model.num_symbols, model.context_length, model.query_dim, model.num_targets


def _prior(model):
    from dist_respattn.model.emission.prior import EmissionPrior

    return EmissionPrior.uniform(model.num_symbols, model.num_targets)


# ------------------------------------------------------------------------------------------ short histories


def reference_short_rows(model, tokens, begin, end, target, query, weights):
    """Per position, in plain NumPy: the prior renormalized over the positions a row has, and the expected
    rejected draws of the masked positions in their buckets (the truncated-prior EM)."""
    buckets = model.buckets
    n_pos = model.context_length
    recency_bucket = buckets.bucket_of_recency
    pi = buckets.bucket_weights(model.position_prior)
    share = pi / np.asarray(buckets.sizes)
    s, d, t = model.num_symbols, model.query_dim, model.num_targets
    out = {
        "key_sum": np.zeros((s, d)),
        "key_mass": np.zeros(s),
        "emission_count": np.zeros((s, t)),
        "bucket_mass": np.zeros(buckets.num_buckets),
        "log_lik": 0.0,
    }
    emission = model.emission
    for r in range(target.shape[0]):
        w = 1.0 if weights is None else weights[r]
        if w == 0.0:
            continue
        window = tokens[begin[r] : end[r]]
        m = window.shape[0]
        rec = m - 1 - np.arange(m)
        prior = share[recency_bucket[rec]]
        mass = prior.sum()
        y = query[r]
        dist = ((model.key_means[window] - y) ** 2).sum(axis=1)
        logw = np.log(prior / mass) + np.log(emission[window, target[r]]) - dist / (2 * model.sigma2)
        best = logw.max()
        e = np.exp(logw - best)
        resp = w * e / e.sum()
        np.add.at(out["key_mass"], window, resp)
        np.add.at(out["key_sum"], window, resp[:, None] * y)
        np.add.at(out["emission_count"], (window, np.full(m, target[r])), resp)
        np.add.at(out["bucket_mass"], recency_bucket[rec], resp)
        missing = np.ones(n_pos, dtype=bool)
        missing[:m] = False
        np.add.at(out["bucket_mass"], recency_bucket[missing], w * share[recency_bucket[missing]] / mass)
        out["log_lik"] += w * (best + np.log(e.sum()) - 0.5 * d * np.log(2 * np.pi * model.sigma2))
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("n_pos", "k"), [(8, 4), (16, 5), (5, 5), (33, 7)])
def test_short_histories_mask_the_missing_positions_and_count_them_as_rejected_draws(layout, n_pos, k):
    rng = np.random.default_rng(n_pos * 10 + k)
    buckets = PositionBuckets.geometric(n_pos, k)
    # Documents of lengths 2..3N in one token array; a row for every target with at least one earlier token.
    lengths = rng.integers(2, 3 * n_pos, size=12)
    tokens = rng.integers(0, 9, size=int(lengths.sum()))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    end = np.concatenate([np.arange(a + 1, a + n) for a, n in zip(starts, lengths, strict=True)])
    doc = np.repeat(starts, lengths - 1)
    begin = np.maximum(doc, end - n_pos)
    target = tokens[end] % 6
    query = rng.normal(size=(end.shape[0], 3))
    weights = rng.uniform(0.0, 2.0, size=end.shape[0])
    context_like = (tokens.reshape(-1, 1), target)  # the pairs the sparse support must hold
    pairs_context = np.concatenate([tokens[b:e] for b, e in zip(begin, end, strict=True)])
    pairs_target = np.repeat(target, end - begin)
    model = tied_model((9, n_pos, 3, 6), buckets, n_pos + k, layout, (pairs_context[:, None], pairs_target))
    del context_like
    rows = WindowRows(tokens, begin, end, target, query, np.arange(end.shape[0]), weights, 0)
    accumulator = model.estimator().accumulator_factory(layout=layout).make_for(model)
    accumulator.seq_update_windows(rows, model)
    value = accumulator.value()
    expected = reference_short_rows(model, tokens, begin, end, target, query, weights)
    assert_close(value.key_sum, expected["key_sum"], rtol=RTOL, label="key_sum")
    assert_close(value.key_mass, expected["key_mass"], rtol=RTOL, label="key_mass")
    assert_close(dense_counts(value, model), expected["emission_count"], rtol=RTOL, label="emission_count")
    assert_close(buckets.bucket_weights(value.position_count), expected["bucket_mass"], rtol=RTOL, label="buckets")
    assert_close(value.log_lik, expected["log_lik"], rtol=RTOL, label="log_lik")
    assert (end - begin < n_pos).any() and (end - begin == n_pos).any()


def test_em_with_tied_buckets_and_short_histories_never_decreases_the_likelihood():
    rng = np.random.default_rng(5)
    n_pos, k = 32, 5
    buckets = PositionBuckets.geometric(n_pos, k)
    # Sequences with structure: a symbol predicts the one 5 places later.
    tokens = rng.integers(0, 12, size=4000)
    tokens[5:] = np.where(rng.random(tokens.size - 5) < 0.6, (tokens[:-5] + 1) % 12, tokens[5:])
    end = np.arange(1, tokens.size - 1)
    begin = np.maximum(end - n_pos, (end // 400) * 400)  # documents of 400 tokens: short histories at each start
    keep = begin < end
    end, begin = end[keep], begin[keep]
    embeddings = rng.normal(size=(12, 4))
    rows = WindowRows(tokens, begin, end, tokens[end], embeddings, tokens[end - 1].astype(np.int64), None, 0)
    estimator = ResponsibilityAttentionEstimator(12, n_pos, 4, 12, sigma2=2.0, emission_smoothing=0.0, buckets=buckets)
    model = tied_model((12, n_pos, 4, 12), buckets, 3, "dense")
    previous = -np.inf
    for _ in range(12):
        accumulator = estimator.accumulator_factory().make()
        accumulator.seq_update_windows(rows, model)
        log_lik = accumulator.value().log_lik
        assert log_lik >= previous - 1e-9 * abs(log_lik), (log_lik, previous)
        previous = log_lik
        model = estimator.estimate(None, accumulator.value(), previous=model)
        assert model.buckets == buckets and buckets.is_tied(model.position_prior)


# ------------------------------------------------------------------------------------------ the predictor


def recomputed(model, embeddings, history):
    """p(next | history) from scratch, position by position: the window's last N tokens, prior renormalized."""
    n_pos = model.context_length
    window = np.asarray(history[-n_pos:])
    m = window.shape[0]
    buckets = model.buckets
    prior = model.position_prior[::-1][:m][::-1]  # columns are oldest first; recency r is column N-1-r
    prior = prior / prior.sum()
    y = embeddings[window[-1]]
    dist = ((model.key_means[window] - y) ** 2).sum(axis=1)
    logw = np.log(prior) - dist / (2 * model.sigma2)
    a = np.exp(logw - logw.max())
    a /= a.sum()
    assert buckets is not None
    return a @ model.emission[window]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("n_pos", "k"), [(1, 1), (8, 4), (16, 16), (13, 5), (70, 70)])  # 70: no counts
def test_the_streaming_predictor_equals_recomputing_the_window(layout, n_pos, k):
    rng = np.random.default_rng(n_pos + 100 * k)
    buckets = PositionBuckets.geometric(n_pos, k)
    s = 7
    history = rng.integers(0, s, size=4 * n_pos + 5)  # ages every token across every bucket boundary
    ctx = np.array([history[i : i + n_pos] for i in range(0, max(history.size - n_pos, 1))]).reshape(-1, n_pos)
    model = tied_model(
        (s, n_pos, 3, 5), buckets, 11, layout, (np.resize(np.arange(s), ctx.shape), np.zeros(len(ctx), int))
    )
    if layout == "sparse":  # every pair in the support, so the dense view is exact
        model = tied_model((s, n_pos, 3, 5), buckets, 11, "dense")
    embeddings = rng.normal(size=(s, 3))
    predictor = Predictor(model, embeddings)
    for i, token in enumerate(history):
        predictor.push(int(token))
        got = predictor.predict()
        want = recomputed(model, embeddings, history[: i + 1])
        assert_close(got, want, rtol=RTOL, label=f"after {i + 1} tokens")
        assert predictor.state_size <= min(i + 1, n_pos)
    top, probs = predictor.top_k(3)
    assert probs[0] == pytest.approx(got.max()) and list(top) == list(np.lexsort((np.arange(5), -got))[:3])


def test_the_predictor_reads_a_sparse_emission_like_its_dense_view():
    rng = np.random.default_rng(2)
    buckets = PositionBuckets.geometric(12, 4)
    context = rng.integers(0, 9, size=(40, 12))
    target = rng.integers(0, 6, size=40)
    sparse = tied_model((9, 12, 3, 6), buckets, 4, "sparse", (context, target))
    dense = ResponsibilityAttentionDistribution(
        sparse.key_means, sparse.emission, sparse.position_prior, sparse.sigma2, buckets=buckets
    )
    embeddings = rng.normal(size=(9, 3))
    a, b = Predictor(sparse, embeddings), Predictor(dense, embeddings)
    for token in rng.integers(0, 9, size=40):
        a.push(int(token))
        b.push(int(token))
        assert_close(a.predict(), b.predict(), rtol=RTOL, label="sparse against dense")


def peaked_model(n_pos, s, t, seed, emission=None):
    """A head whose attention decays fast with the key's distance (keys spread wide, a small sigma2), with an
    emission that has targets a million times rarer under some symbols than others."""
    rng = np.random.default_rng(seed)
    buckets = PositionBuckets.geometric(n_pos, max_geometric_buckets(n_pos))
    if emission is None:
        emission = rng.dirichlet(np.full(t, 0.3), size=s) + 1e-12
        emission[:, : t // 4] *= 1e-6  # targets rare under every symbol: a relative bound is needed for them
        emission /= emission.sum(axis=1, keepdims=True)
    keys = rng.normal(scale=3.0, size=(s, 4))
    prior = buckets.spread(rng.dirichlet(np.ones(buckets.num_buckets)))
    return ResponsibilityAttentionDistribution(keys, emission, prior, 0.5, buckets=buckets), rng.normal(size=(s, 4))


def test_the_predictor_reads_only_the_rows_that_count_and_each_target_stays_within_a_rounding():
    # Every target's probability is the full mixture of the predictor's own attention to a relative 2**-53, plus the
    # rounding of sums taken in another order; rows are left unread (else the bound is never exercised).
    model, embeddings = peaked_model(64, 120, 40, seed=5)
    history = np.random.default_rng(6).integers(0, 120, size=300)
    predictor = Predictor(model, embeddings)
    skipped = 0
    for i, token in enumerate(history):
        predictor.push(int(token))
        got = predictor.predict()
        symbols, a = predictor.attention()
        full = a @ model.emission[symbols]
        assert np.all(np.abs(got - full) <= 1e-14 * full), f"after {i + 1} tokens"
        assert_close(got, recomputed(model, embeddings, history[: i + 1]), rtol=RTOL, label=f"after {i + 1} tokens")
        assert predictor.rows_read <= symbols.shape[0]
        skipped += symbols.shape[0] - predictor.rows_read
    assert skipped > 0.5 * history.size  # most predictions leave rows unread


def test_a_target_no_symbol_emits_stays_exactly_zero_and_an_emission_of_zeros_is_read_in_full():
    s, t = 30, 12
    emission = np.random.default_rng(3).dirichlet(np.ones(t), size=s)
    emission[:, 4] = 0.0  # a target no symbol emits
    emission[:15, 7] = 0.0  # and one half the symbols never emit: unread rows could hide its mass
    emission /= emission.sum(axis=1, keepdims=True)
    model, embeddings = peaked_model(16, s, t, seed=8, emission=emission)
    predictor = Predictor(model, embeddings)
    history = np.random.default_rng(9).integers(0, s, size=80)
    for i, token in enumerate(history):
        predictor.push(int(token))
        got = predictor.predict()
        symbols, a = predictor.attention()
        full = a @ model.emission[symbols]
        assert got[4] == 0.0
        assert np.all(np.abs(got - full) <= 1e-14 * full), f"after {i + 1} tokens"


def test_attention_on_symbols_whose_prior_is_near_the_smallest_doubles_is_computed_from_logarithms():
    # The far buckets' shares are subnormal (exact multiples of 2**-1074) and hold the symbols nearest the query: their
    # weights, rho(s) exp(...), are too small for doubles to resolve, so the predictor takes logarithms first.
    tiny = 2.0**-1074
    buckets = PositionBuckets.geometric(8, 4)  # sizes 1, 1, 2, 4
    by_recency = np.array([1.0, 3 * tiny, 5 * tiny, 5 * tiny, 7 * tiny, 7 * tiny, 7 * tiny, 7 * tiny])
    keys = np.array([[0.0], [40.0], [40.5]])
    emission = np.random.default_rng(4).dirichlet(np.ones(4), size=3)
    model = ResponsibilityAttentionDistribution(keys, emission, by_recency[::-1].copy(), 1.0, buckets=buckets)
    embeddings = np.full((3, 1), 40.0)  # every query next to symbols 1 and 2, 40 away from symbol 0
    predictor = Predictor(model, embeddings)
    history = [1, 2, 2, 1, 0]
    for i, token in enumerate(history):
        predictor.push(token)
        assert_close(predictor.predict(), recomputed(model, embeddings, history[: i + 1]), rtol=RTOL, label=str(i))
    symbols, a = predictor.attention()
    assert list(symbols) == [0, 1, 2] and a[0] < 1e-20 < a[2] < a[1]  # the far symbols, not the newest


@pytest.mark.parametrize(("n_pos", "k"), [(8, 4), (70, 70)])  # 70 buckets: the window's positions, no counts
def test_the_state_holds_the_window_counts_after_symbols_leave_and_return(n_pos, k):
    # A symbol that leaves the window frees its slot (the last slot moves in); counts stay those of the window.
    buckets = PositionBuckets.geometric(n_pos, k)
    model = tied_model((5, n_pos, 3, 4), buckets, 2, "dense")
    predictor = Predictor(model, np.random.default_rng(0).normal(size=(5, 3)))
    history = [0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 1, 4, 4, 2, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1]
    history = history + [2] * (n_pos + 3) + history  # the window empties of every symbol but 2, then fills again
    for i, token in enumerate(history):
        predictor.push(token)
        window = history[max(0, i + 1 - n_pos) : i + 1]
        symbols, _ = predictor.attention()
        assert list(symbols) == sorted(set(window)), f"after {i + 1} tokens"
        recency = np.arange(len(window))[::-1]
        bucket_of = np.searchsorted(buckets.starts, recency, side="right") - 1
        per_bucket = set(zip(window, bucket_of.tolist(), strict=True))
        assert predictor.state_size == len(per_bucket)
        assert predictor.length == i + 1


# ------------------------------------------------------------------------------------------ bad specs


@pytest.mark.parametrize(("n_pos", "k"), [(8, 5), (8, 7), (8, 0), (512, 11), (1, 2)])
def test_bucket_specs_that_leave_a_bucket_empty_are_refused(n_pos, k):
    with pytest.raises(ValueError, match=r"--position-buckets .* expected K = N"):
        PositionBuckets.geometric(n_pos, k)


def test_the_bucket_rule_is_one_one_two_four_and_the_rest():
    assert PositionBuckets.geometric(512, 10).sizes == (1, 1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert PositionBuckets.geometric(100, 5).sizes == (1, 1, 2, 4, 92)
    assert PositionBuckets.geometric(8, 8).is_free
    assert PositionBuckets.geometric(6, 1).sizes == (6,)
    b = PositionBuckets.geometric(8, 4)
    assert list(b.bucket_of_position) == [3, 3, 3, 3, 2, 2, 1, 0]
    assert PositionBuckets.from_json(b.to_json()) == b


def test_a_prior_not_tied_over_its_buckets_is_refused():
    model = random_distribution(4, 8, 2, 3, seed=0)
    with pytest.raises(ValueError, match="not constant within"):
        ResponsibilityAttentionDistribution(
            model.key_means, model.emission, np.arange(1.0, 9.0) / 36.0, 1.0, buckets=PositionBuckets.geometric(8, 4)
        )


def test_window_rows_name_a_bad_window_token_or_target():
    model = tied_model((5, 4, 2, 3), PositionBuckets.geometric(4, 3), 0, "dense")
    accumulator = model.estimator().accumulator_factory().make()
    tokens = np.array([0, 1, 2, 7, 1])
    good = dict(tokens=tokens, begin=np.array([0]), end=np.array([2]), target=np.array([1]),
                query_table=np.zeros((1, 2)), query_index=np.array([0]), weight=None, start=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"token 3 = 7: expected a symbol id in \[0, 5\)"):
        accumulator.seq_update_windows(WindowRows(**good), model)
    with pytest.raises(ValueError, match=r"row 0: a window of 0 tokens"):
        accumulator.seq_update_windows(WindowRows(**{**good, "tokens": tokens[:3], "end": np.array([0])}), model)
    with pytest.raises(ValueError, match=r"row 0: target 3"):
        accumulator.seq_update_windows(WindowRows(**{**good, "tokens": tokens[:3], "target": np.array([3])}), model)


def test_the_sparse_lookups_direct_rows_maps_and_searches_give_the_same_statistics():
    """A target's pairs are read through its direct row, a map filled for the row, or binary searches: the
    same pairs, so the same bits."""
    import dataclasses

    from dist_respattn.model.kernels import histogram, per_position

    rng = np.random.default_rng(4)
    buckets = PositionBuckets.geometric(32, 6)
    tokens = rng.integers(0, 50, size=3000)
    end = np.arange(32, 3000)
    rows = WindowRows(tokens, end - 32, end, tokens[end] % 9, rng.normal(size=(50, 3)), tokens[end - 1], None, 0)
    context = np.stack([tokens[e - 32 : e] for e in end])
    model = tied_model((50, 32, 3, 9), buckets, 6, "sparse", (context, rows.target))
    params = histogram.histogram_parameters(model)
    no_direct = dataclasses.replace(
        params, direct_row=np.full(9, -1, dtype=np.int32), direct_slots=np.zeros((0, 50), dtype=np.int32)
    )
    assert (params.direct_row >= 0).any()
    values = []
    for p, window_rows in ((params, rows), (no_direct, rows), (no_direct, rows._replace(begin=end - 2))):
        stats = per_position.StatisticArrays.zeros(50, 32, 3, 9, model.emission_table.support)
        histogram.accumulate_windows(window_rows, p, stats, buckets)
        values.append(stats)
    # Direct rows against maps (32-token windows: many terms a row) must agree to the bit ...
    for name in ("key_sum", "key_mass", "pair_counts", "position_count", "scalars"):
        assert np.array_equal(getattr(values[0], name), getattr(values[1], name)), name
    # ... and 2-token windows given as such (few terms: binary searches; spans that neither grow nor shift a
    # full window, so every row rebuilds) give the per-position reference's statistics.
    expected = reference_short_rows(model, tokens, end - 2, end, rows.target, rows.query_table[rows.query_index], None)
    assert_close(values[2].key_sum, expected["key_sum"], rtol=RTOL, label="key_sum")
    assert_close(buckets.bucket_weights(values[2].position_count), expected["bucket_mass"], rtol=RTOL, label="mass")
    assert_close(values[2].scalars[2], expected["log_lik"], rtol=RTOL, label="log_lik")


def test_a_predictor_without_embeddings_takes_the_query_with_each_prediction():
    from dist_respattn import Predictor as RootPredictor

    buckets = PositionBuckets.geometric(8, 4)
    model = tied_model((6, 8, 3, 5), buckets, 1, "dense")
    table = np.random.default_rng(1).normal(size=(6, 3))
    bare, with_table = RootPredictor(model), Predictor(model, table)
    for token in [1, 4, 4, 0, 5, 2, 2, 2, 3, 1]:
        bare.push(token)
        with_table.push(token)
        assert np.array_equal(bare.predict(table[token]), with_table.predict())
    with pytest.raises(ValueError, match="no embeddings were given: pass the query"):
        bare.predict()
    with pytest.raises(ValueError, match="query of shape"):
        bare.top_k(2, query=np.zeros(4))
    with pytest.raises(ValueError, match="the history is empty"):
        Predictor(model, table).predict()


def test_a_predictor_of_another_kind_is_refused_naming_the_call_every_kind_answers():
    """``Predictor`` keeps a single-hop head's bucket counts; given another kind (the default model on a token
    stream is a repeat gate over a stack) it says which call serves every kind, instead of failing on a missing
    attribute. That call gives the kind's own predictor, and for a single-hop head a ``Predictor``."""
    from dist_respattn.model.heads.mixture import MixtureHead

    shape = (6, 4, 3, 5)
    table = np.random.default_rng(1).normal(size=(6, 3))
    mixture = MixtureHead([0.6, 0.4], [random_distribution(*shape, seed=s) for s in (1, 2)])
    with pytest.raises(TypeError, match=r"this is a mixture head: use model\.predictor\(query_table=embeddings"):
        Predictor(mixture, table)
    predictor = mixture.predictor(query_table=table)
    predictor.extend([1, 4, 4, 0])
    assert predictor.predict().shape == (5,)
    assert type(mixture.components[0].predictor(query_table=table)) is Predictor
