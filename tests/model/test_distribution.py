"""The distribution, the sampler and the sequence encoders, against their definitions and the reference library."""

from __future__ import annotations

import inspect
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dist_respattn
from dist_respattn import (
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionDataEncoder,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    random_distribution,
    sequence_to_triples,
    sequence_windows,
)
from tests.lazy_module import LazyModule
from tests.model.reference import reference_row_statistics
from tests.model.test_kernel_parity import assert_close

#: The reference library's module, imported by the first test that reads it (tests/lazy_module.py).
ref = LazyModule("mixle.stats.latent.responsibility_attention")

# (S, N, D, T): ordinary, S < N (repeated symbols), T = 1, N = 1, D = 1, odd sizes.
SHAPES = [(12, 4, 3, 7), (3, 6, 2, 5), (9, 3, 4, 1), (10, 1, 5, 6), (8, 5, 1, 4), (31, 7, 13, 17)]
shape_ids = pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))


def scored(shape, n, seed):
    """Rows sampled from one head and a different head to score them (keys close enough to share mass)."""
    truth = random_distribution(*shape, seed=seed, key_scale=1.5, sigma2=0.7)
    data = truth.sampler(seed + 1).sample_arrays(n)
    model = random_distribution(*shape, seed=seed + 2, key_scale=1.5, sigma2=1.3)
    return data, model


# ---------------------------------------------------------------------------- scoring


@shape_ids
def test_density_and_log_density_agree_with_the_batch(shape):
    (context, query, target), model = scored(shape, 60, sum(shape))
    batch = model.seq_log_density((context, query, target))
    assert batch.shape == (60,) and batch.dtype == np.float64
    for i in range(60):
        triple = (context[i], query[i], int(target[i]))
        log_density = model.log_density(triple)
        assert isinstance(log_density, float)
        assert_close(log_density, batch[i], rtol=1e-13, label=f"log_density row {i}")
        assert_close(model.density(triple), math.exp(log_density), rtol=1e-13, label=f"density row {i}")
    # Python lists are triples too.
    triple = (context[0].tolist(), query[0].tolist(), int(target[0]))
    assert_close(model.log_density(triple), batch[0], rtol=1e-13, label="list triple")


@shape_ids
def test_log_density_matches_the_reference_formula(shape):
    (context, query, target), model = scored(shape, 40, 3 * sum(shape))
    batch = model.seq_log_density((context, query, target))
    for i in range(40):
        row = reference_row_statistics(context, query, target, model, i)
        assert_close(batch[i], row["log_lik"], rtol=1e-12, label=f"row {i}")


def brute_force_predict(model, context, query):
    """p(target | context, query) from the definition, one row and one position at a time."""
    out = np.zeros(model.num_targets)
    log_a = []
    for i, c in enumerate(context):
        sq = sum((float(q) - float(k)) ** 2 for q, k in zip(query, model.key_means[c], strict=True))
        log_a.append(
            math.log(model.position_prior[i])
            - sq / (2 * model.sigma2)
            - model.query_dim / 2 * math.log(2 * math.pi * model.sigma2)
        )
    top = max(log_a)
    a = [math.exp(v - top) for v in log_a]
    total = sum(a)
    for i, c in enumerate(context):
        out += (a[i] / total) * model.emission[c]
    return out


@shape_ids
def test_predict_proba_matches_its_definition(shape):
    (context, query, _), model = scored(shape, 50, 5 * sum(shape))
    batch = model.predict_proba(context, query)
    assert batch.shape == (50, shape[3])
    assert_close(batch.sum(axis=1), np.ones(50), rtol=1e-13, label="row sums")
    assert np.all(batch >= 0.0)
    for i in range(50):
        single = model.predict_proba(context[i], query[i])
        assert single.shape == (shape[3],)
        assert_close(single, batch[i], rtol=1e-13, label=f"single row {i}")
        assert_close(batch[i], brute_force_predict(model, context[i], query[i]), rtol=1e-12, label=f"row {i}")
    # Lists work as well as arrays.
    assert_close(model.predict_proba(context[0].tolist(), query[0].tolist()), batch[0], rtol=1e-13, label="lists")


def test_predict_proba_far_from_every_key_is_still_a_distribution():
    # Squared distances of ~1e6 underflow every Gaussian; the prediction must stay a distribution.
    model = random_distribution(6, 3, 2, 4, seed=1, sigma2=0.01)
    context = np.array([[0, 1, 2], [3, 4, 5]])
    query = np.full((2, 2), 1e3)
    batch = model.predict_proba(context, query)
    assert np.all(np.isfinite(batch))
    assert_close(batch.sum(axis=1), np.ones(2), rtol=1e-13, label="row sums")


@shape_ids
def test_attention_weights_are_the_gate_and_the_posterior_responsibilities(shape):
    (context, query, target), model = scored(shape, 50, 7 * sum(shape))
    gate = model.attention_weights(context, query)
    posterior = model.attention_weights(context, query, target)
    for weights in (gate, posterior):
        assert weights.shape == (50, shape[1])
        assert_close(weights.sum(axis=1), np.ones(50), rtol=1e-13, label="row sums")
    log_gate = np.log(model.position_prior)[None, :] - np.sum(
        (query[:, None, :] - model.key_means[context]) ** 2, axis=2
    ) / (2 * model.sigma2)
    expected_gate = np.exp(log_gate - log_gate.max(axis=1, keepdims=True))
    expected_gate /= expected_gate.sum(axis=1, keepdims=True)
    assert_close(gate, expected_gate, rtol=1e-12, label="gate")
    for i in range(50):
        # The reference E-step on one row of weight 1: its position counts are that row's r_i.
        row = reference_row_statistics(context, query, target, model, i)
        assert_close(posterior[i], row["position_count"], rtol=1e-12, label=f"posterior row {i}")
        single = model.attention_weights(context[i], query[i], int(target[i]))
        assert single.shape == (shape[1],)
        assert_close(single, posterior[i], rtol=1e-13, label=f"single row {i}")
        assert_close(model.attention_weights(context[i], query[i]), gate[i], rtol=1e-13, label=f"single gate {i}")


# ----------------------------------------------------------------------------- sampler


def test_sample_returns_a_triple_or_a_list_of_triples():
    model = random_distribution(7, 3, 4, 5, seed=0)
    sampler = model.sampler(1)
    one = sampler.sample()
    assert isinstance(one, tuple) and len(one) == 3
    context, query, target = one
    assert context.shape == (3,) and query.shape == (4,) and isinstance(target, int)
    assert np.issubdtype(context.dtype, np.integer) and query.dtype == np.float64
    assert 0 <= target < 5 and np.all((0 <= context) & (context < 7))
    five = sampler.sample(5)
    assert isinstance(five, list) and len(five) == 5
    assert all(len(t) == 3 and t[0].shape == (3,) and t[1].shape == (4,) for t in five)
    # The triples encode and score like any others.
    assert model.seq_log_density(model.dist_to_encoder().seq_encode(five)).shape == (5,)
    assert sampler.sample(0) == []


@pytest.mark.parametrize(("num_symbols", "context_length"), [(4, 4), (5, 4), (10, 4), (50, 4), (300, 16), (3, 1)])
def test_contexts_hold_distinct_uniform_symbols_when_s_at_least_n(num_symbols, context_length):
    n = 40_000
    model = random_distribution(num_symbols, context_length, 2, 3, seed=num_symbols)
    context, query, target = model.sampler(context_length).sample_arrays(n)
    assert context.shape == (n, context_length) and query.shape == (n, 2) and target.shape == (n,)
    ordered = np.sort(context, axis=1)
    assert not np.any(ordered[:, 1:] == ordered[:, :-1]), "a context repeats a symbol"
    assert context.min() >= 0 and context.max() < num_symbols
    # Every position is uniform over the symbols (a biased ordering of the drawn subset would show here):
    # each count is Binomial(n, 1/S); 6 standard deviations keep a false alarm below 1e-6 per check.
    p = 1.0 / num_symbols
    sd = math.sqrt(n * p * (1 - p))
    for i in range(context_length):
        counts = np.bincount(context[:, i], minlength=num_symbols)
        assert np.max(np.abs(counts - n * p)) < 6 * sd, f"position {i} is not uniform"


def test_contexts_repeat_symbols_when_s_below_n():
    model = random_distribution(3, 6, 2, 4, seed=0)
    context, _, _ = model.sampler(0).sample_arrays(2000)
    assert context.min() >= 0 and context.max() < 3
    assert np.all(np.isin(np.arange(3), context))


def test_sampled_targets_and_queries_follow_the_head_with_one_position():
    # With N = 1 the attended symbol is the context symbol: targets ~ B[s], queries ~ N(K[s], sigma2 I).
    num_symbols, dim, num_targets, n = 5, 3, 4, 60_000
    model = random_distribution(num_symbols, 1, dim, num_targets, seed=3, emission_concentration=1.0, sigma2=0.5)
    context, query, target = model.sampler(4).sample_arrays(n)
    # 6 standard deviations per check (35 checks): a false alarm below 1e-7 for any seed.
    for s in range(num_symbols):
        rows = context[:, 0] == s
        n_s = int(rows.sum())
        assert n_s > 0.8 * n / num_symbols
        freq = np.bincount(target[rows], minlength=num_targets) / n_s
        sd = np.sqrt(model.emission[s] * (1 - model.emission[s]) / n_s)
        assert np.all(np.abs(freq - model.emission[s]) < 6 * sd + 1e-12), (s, freq, model.emission[s])
        mean = query[rows].mean(axis=0)
        assert np.all(np.abs(mean - model.key_means[s]) < 6 * math.sqrt(model.sigma2 / n_s)), (s, mean)
    residual = query - model.key_means[context[:, 0]]
    # The sample variance of n D = 180k standard normals times sigma2: relative sd sqrt(2 / 180k) = 0.33%.
    assert abs(residual.var() / model.sigma2 - 1.0) < 0.02


def test_sampler_respects_zeros_in_the_prior_and_the_emission():
    # Only position 1 is ever attended, and symbol s always emits s mod 3.
    num_symbols, num_targets = 6, 3
    emission = np.zeros((num_symbols, num_targets))
    emission[np.arange(num_symbols), np.arange(num_symbols) % num_targets] = 1.0
    model = ResponsibilityAttentionDistribution(
        np.arange(num_symbols, dtype=float)[:, None] * 10.0, emission, [0.0, 1.0, 0.0], 0.01
    )
    context, query, target = model.sampler(0).sample_arrays(5000)
    assert np.array_equal(target, context[:, 1] % num_targets)
    assert np.all(np.abs(query[:, 0] - 10.0 * context[:, 1]) < 1.0)


def test_sampler_is_deterministic_for_a_seed():
    model = random_distribution(9, 3, 2, 4, seed=0)
    a = model.sampler(123).sample_arrays(500)
    b = model.sampler(123).sample_arrays(500)
    c = model.sampler(np.random.default_rng(123)).sample_arrays(500)
    for x, y, z in zip(a, b, c, strict=True):
        assert np.array_equal(x, y) and np.array_equal(x, z)
    d = model.sampler(124).sample_arrays(500)
    assert not np.array_equal(a[1], d[1])
    first = model.sampler(5).sample(3)
    again = model.sampler(5).sample(3)
    for (c1, q1, t1), (c2, q2, t2) in zip(first, again, strict=True):
        assert np.array_equal(c1, c2) and np.array_equal(q1, q2) and t1 == t2


def test_sampler_query_dtype():
    model = random_distribution(9, 3, 2, 4, seed=0)
    _, query, _ = model.sampler(0).sample_arrays(10, query_dtype=np.float32)
    assert query.dtype == np.float32


@pytest.mark.slow
def test_a_million_triples_sample_in_bulk():
    # A guard against a Python loop per draw (which would take minutes), not a benchmark: ~2 s here.
    model = random_distribution(2000, 16, 32, 2000, seed=0)
    started = time.perf_counter()
    context, query, target = model.sampler(1).sample_arrays(1_000_000)
    elapsed = time.perf_counter() - started
    assert context.shape == (1_000_000, 16) and query.shape == (1_000_000, 32) and target.shape == (1_000_000,)
    assert elapsed < 30.0, f"sampling took {elapsed:.1f} s"


# --------------------------------------------------------------------- sequence encoders


def naive_windows(tokens, context_length, num_symbols=None, embeddings=None):
    """The definition, one prediction point at a time."""
    tokens = list(tokens)
    dim = (
        (num_symbols if num_symbols is not None else (max(tokens) + 1 if tokens else 0))
        if embeddings is None
        else embeddings.shape[1]
    )
    contexts, queries, targets = [], [], []
    for p in range(context_length - 1, len(tokens) - 1):
        contexts.append(tokens[p - context_length + 1 : p + 1])
        if embeddings is None:
            q = np.zeros(dim)
            q[tokens[p]] = 1.0
        else:
            q = np.asarray(embeddings[tokens[p]], dtype=np.float64)
        queries.append(q)
        targets.append(tokens[p + 1])
    return (
        np.array(contexts, dtype=np.int64).reshape(len(targets), context_length),
        np.array(queries, dtype=np.float64).reshape(len(targets), dim),
        np.array(targets, dtype=np.int64),
    )


@st.composite
def token_sequences(draw):
    num_symbols = draw(st.integers(1, 8))
    tokens = draw(st.lists(st.integers(0, num_symbols - 1), max_size=30))
    context_length = draw(st.integers(1, 7))
    declared = draw(st.sampled_from([None, num_symbols, num_symbols + 2]))
    embeddings = None
    if draw(st.booleans()):
        dim = draw(st.integers(1, 4))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        embeddings = rng.standard_normal((num_symbols + 1, dim))
    return tokens, context_length, declared, embeddings


def assert_arrays_identical(actual, expected, label):
    assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    assert np.array_equal(actual, expected), label


@settings(deadline=None, max_examples=200)
@given(token_sequences())
def test_sequence_windows_match_the_definition(case):
    tokens, context_length, declared, embeddings = case
    context, query, target = sequence_windows(
        np.array(tokens, dtype=np.int64), context_length, num_symbols=declared, embeddings=embeddings
    )
    expected = naive_windows(tokens, context_length, declared, embeddings)
    for name, got, want in zip(("context", "query", "target"), (context, query, target), expected, strict=True):
        assert_arrays_identical(got, want, name)
    # Lists of ints give the same arrays, and the arrays are copies, not views of the tokens.
    as_list = sequence_windows(tokens, context_length, num_symbols=declared, embeddings=embeddings)
    for got, want in zip(as_list, expected, strict=True):
        assert np.array_equal(got, want)
    source = np.array(tokens, dtype=np.int64)
    windows = sequence_windows(source, context_length, num_symbols=declared, embeddings=embeddings)
    assert not np.shares_memory(windows[0], source) and not np.shares_memory(windows[2], source)

    triples = sequence_to_triples(tokens, context_length, num_symbols=declared, embeddings=embeddings)
    assert len(triples) == max(len(tokens) - context_length, 0)
    for i, (c, q, t) in enumerate(triples):
        assert np.array_equal(c, expected[0][i]) and np.array_equal(q, expected[1][i])
        assert type(t) is int and t == expected[2][i]


@settings(deadline=None, max_examples=200)
@given(token_sequences())
def test_sequence_to_triples_equals_the_reference_library(case):
    tokens, context_length, declared, embeddings = case
    if not tokens and declared is None:
        declared = 1  # the reference infers S from max(tokens), which an empty sequence lacks
    ours = sequence_to_triples(tokens, context_length, num_symbols=declared, embeddings=embeddings)
    theirs = ref.sequence_to_triples(tokens, context_length, num_symbols=declared, embeddings=embeddings)
    assert len(ours) == len(theirs)
    for (c, q, t), (rc, rq, rt) in zip(ours, theirs, strict=True):
        assert_arrays_identical(c, rc.astype(np.int64), "context")
        assert_arrays_identical(q, rq, "query")
        assert t == rt and type(t) is type(rt)


@pytest.mark.parametrize("length", [0, 1, 2, 3])
def test_sequence_windows_with_no_full_window_is_empty(length):
    tokens = list(range(length))
    context, query, target = sequence_windows(tokens, 3, num_symbols=5)
    assert context.shape == (0, 3) and query.shape == (0, 5) and target.shape == (0,)
    context, query, target = sequence_windows(tokens, 3, num_symbols=5, embeddings=np.ones((5, 2)))
    assert context.shape == (0, 3) and query.shape == (0, 2) and target.shape == (0,)
    assert sequence_to_triples(tokens, 3, num_symbols=5) == []


def test_sequence_windows_with_one_position():
    context, query, target = sequence_windows([2, 0, 1, 1], 1, num_symbols=3)
    assert np.array_equal(context, [[2], [0], [1]])
    assert np.array_equal(query, np.eye(3)[[2, 0, 1]])
    assert np.array_equal(target, [0, 1, 1])


# ------------------------------------------------------------ compatibility with the reference


def both_heads(shape, seed):
    ours = random_distribution(*shape, seed=seed, key_scale=1.5, sigma2=0.8)
    theirs = ref.ResponsibilityAttentionDistribution(
        ours.key_means.copy(), ours.emission.copy(), ours.position_prior.copy(), ours.sigma2
    )
    return ours, theirs


@shape_ids
def test_scores_and_predictions_equal_the_reference_library(shape):
    ours, theirs = both_heads(shape, sum(shape))
    data = random_distribution(*shape, seed=sum(shape) + 1, key_scale=1.5).sampler(0).sample_arrays(80)
    context, query, target = data
    assert_close(ours.seq_log_density(data), theirs.seq_log_density(data), rtol=1e-10, label="seq_log_density")
    assert_close(ours.predict_proba(context, query), theirs.predict_proba(context, query), rtol=1e-10, label="batch")
    for i in range(0, 80, 9):
        triple = (context[i], query[i], int(target[i]))
        assert_close(ours.log_density(triple), theirs.log_density(triple), rtol=1e-10, label=f"log_density {i}")
        assert_close(ours.density(triple), theirs.density(triple), rtol=1e-10, label=f"density {i}")
        assert_close(
            ours.predict_proba(context[i], query[i]),
            theirs.predict_proba(context[i], query[i]),
            rtol=1e-10,
            label=f"single {i}",
        )
    # The encoders agree, and each side scores the other's encoding.
    triples = [(context[i], query[i], int(target[i])) for i in range(20)]
    mine, other = ours.dist_to_encoder().seq_encode(triples), theirs.dist_to_encoder().seq_encode(triples)
    for a, b in zip(mine, other, strict=True):
        assert np.array_equal(a, b)
    assert_close(ours.seq_log_density(other), theirs.seq_log_density(mine), rtol=1e-10, label="cross-encoded")


@shape_ids
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_statistics_and_m_step_equal_the_reference_library(shape, backend):
    ours, theirs = both_heads(shape, 2 * sum(shape))
    data = random_distribution(*shape, seed=2 * sum(shape) + 1, key_scale=1.5).sampler(0).sample_arrays(400)
    weights = np.random.default_rng(sum(shape)).uniform(0.0, 2.0, size=400)
    weights[::6] = 0.0

    accumulator = ResponsibilityAttentionAccumulator(*shape, backend=backend)
    accumulator.seq_update(data, weights, ours)
    value = accumulator.value()
    reference = ref.ResponsibilityAttentionAccumulator(*shape)
    reference.seq_update(data, weights, theirs)
    reference_value = reference.value()
    assert len(reference_value) == 5
    names = ("key_sum", "key_mass", "emission_count", "position_count", "query_sq")
    for name, a, b in zip(names, value[:5], reference_value, strict=True):
        assert_close(a, b, rtol=1e-10, label=name)
        assert_close(getattr(accumulator, name), b, rtol=1e-10, label=f"attribute {name}")
    assert np.all(value.key_mass > 0), "the reference M-step gives zero-mass symbols a zero key; keep them out"

    for estimate_sigma2 in (False, True):
        kwargs = {"sigma2": 0.9, "estimate_sigma2": estimate_sigma2, "min_sigma2": 1e-6, "emission_smoothing": 1e-3}
        estimators = [
            (ResponsibilityAttentionEstimator(*shape, **kwargs), ref.ResponsibilityAttentionEstimator(*shape, **kwargs))
        ]
        if not estimate_sigma2:
            estimators.append((ours.estimator(), theirs.estimator()))
        for mine, other in estimators:
            fitted = mine.estimate(None, value)
            # Each side takes the other's value too: our 7 fields' first 5, and the reference's 5.
            from_reference = mine.estimate(None, reference_value)
            expected = other.estimate(None, reference_value)
            by_reference = other.estimate(None, tuple(value[:5]))
            for name in ("key_means", "emission", "position_prior", "sigma2"):
                want = getattr(expected, name)
                assert_close(getattr(fitted, name), want, rtol=1e-10, label=f"{name} ({estimate_sigma2=})")
                assert_close(getattr(from_reference, name), want, rtol=1e-10, label=f"{name} from the reference")
                assert_close(getattr(by_reference, name), want, rtol=1e-10, label=f"{name} by the reference")
            assert isinstance(fitted, dist_respattn.ResponsibilityAttentionDistribution)


def test_the_reference_value_restores_and_combines_into_our_accumulator():
    shape = (6, 3, 2, 4)
    ours, theirs = both_heads(shape, 1)
    data = ours.sampler(2).sample_arrays(100)
    reference = ref.ResponsibilityAttentionAccumulator(*shape)
    reference.seq_update(data, np.ones(100), theirs)
    restored = ResponsibilityAttentionAccumulator(*shape).from_value(reference.value())
    value = restored.value()
    assert_close(value.n_obs, 100.0, rtol=1e-12, label="n_obs")
    assert math.isnan(value.log_lik)
    accumulator = ResponsibilityAttentionAccumulator(*shape)
    accumulator.seq_update(data, None, ours)
    accumulator.combine(reference.value())
    assert_close(accumulator.value().position_count.sum(), 200.0, rtol=1e-12, label="combined mass")


# The reference API of docs/math.md: class -> methods a reference user calls ("__init__" is the constructor).
REFERENCE_API = {
    "ResponsibilityAttentionDistribution": [
        "__init__",
        "density",
        "log_density",
        "seq_log_density",
        "predict_proba",
        "sampler",
        "estimator",
        "dist_to_encoder",
    ],
    "ResponsibilityAttentionSampler": ["__init__", "sample"],
    "ResponsibilityAttentionAccumulator": [
        "__init__",
        "update",
        "seq_update",
        "initialize",
        "seq_initialize",
        "combine",
        "value",
        "from_value",
        "key_merge",
        "key_replace",
        "acc_to_encoder",
    ],
    "ResponsibilityAttentionAccumulatorFactory": ["__init__", "make"],
    "ResponsibilityAttentionEstimator": ["__init__", "accumulator_factory", "estimate"],
    "ResponsibilityAttentionDataEncoder": ["__init__", "seq_encode"],
}
API_CASES = [(cls, method) for cls, methods in REFERENCE_API.items() for method in methods]


def assert_accepts_the_same_arguments(ours, theirs, label):
    """Every parameter of ``theirs`` is accepted by ``ours`` the way a caller of ``theirs`` may pass it."""
    mine = inspect.signature(ours).parameters
    other = inspect.signature(theirs).parameters
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    my_positional = [name for name, p in mine.items() if p.kind in positional_kinds]
    for index, (name, parameter) in enumerate(other.items()):
        assert name in mine, f"{label}: parameter {name!r} of the reference is missing"
        if parameter.kind in positional_kinds:
            assert my_positional[index : index + 1] == [name], f"{label}: {name!r} is not positional {index}"
        if parameter.kind in keyword_kinds:
            assert mine[name].kind in keyword_kinds, f"{label}: {name!r} cannot be passed by keyword"
        # A parameter the reference lets callers omit must be optional here too.
        if parameter.default is not inspect.Parameter.empty:
            assert mine[name].default is not inspect.Parameter.empty, f"{label}: {name!r} has no default"
    for name, parameter in mine.items():
        if name not in other and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            assert parameter.default is not inspect.Parameter.empty, f"{label}: extra {name!r} is required"


@pytest.mark.parametrize(("class_name", "method"), API_CASES, ids=[f"{c}.{m}" for c, m in API_CASES])
def test_signatures_accept_the_reference_arguments(class_name, method):
    ours = getattr(getattr(dist_respattn, class_name), method)
    theirs = getattr(getattr(ref, class_name), method)
    assert_accepts_the_same_arguments(ours, theirs, f"{class_name}.{method}")


def test_sequence_to_triples_signature_matches_the_reference():
    assert_accepts_the_same_arguments(sequence_to_triples, ref.sequence_to_triples, "sequence_to_triples")


def test_reference_style_calls_work():
    # The calls of a reference user, keywords as the reference names them.
    ours = ResponsibilityAttentionDistribution(
        key_means=np.zeros((3, 2)), emission=np.full((3, 4), 0.25), position_prior=[0.5, 0.5], sigma2=1.0, name="h"
    )
    sampler = ours.sampler(seed=0)
    triples = sampler.sample(size=4)  # `batched=` is checked by test_signatures_accept_the_reference_arguments
    estimator = ours.estimator(pseudo_count=None)
    factory = estimator.accumulator_factory()
    accumulator = factory.make()
    encoder = accumulator.acc_to_encoder()
    assert encoder == ResponsibilityAttentionDataEncoder(3, 2, 2, 4)
    accumulator.seq_update(encoder.seq_encode(triples), np.ones(4), ours)
    accumulator.update(triples[0], 1.0, ours)
    accumulator.initialize(triples[0], 1.0, np.random.RandomState(0))
    accumulator.seq_initialize(encoder.seq_encode(triples), np.ones(4), np.random.RandomState(1))
    fitted = estimator.estimate(nobs=None, suff_stat=accumulator.value())
    assert fitted.name == "h"
    assert_close(accumulator.value().n_obs, 10.0, rtol=1e-12, label="n_obs")
