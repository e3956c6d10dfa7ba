"""Algebraic laws of the accumulator (hypothesis): combine, identity, round-trips, splitting, tying."""

from __future__ import annotations

import copy
import io
import math
import pickle
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn import (
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionDistribution,
    SufficientStatistics,
    random_distribution,
)
from tests.model.test_kernel_parity import assert_close

FIELDS = SufficientStatistics._fields
ARRAY_FIELDS = FIELDS[:4]
SCALAR_FIELDS = FIELDS[4:]
RTOL = 1e-12


@dataclass
class Problem:
    shape: tuple[int, int, int, int]
    data: tuple[np.ndarray, np.ndarray, np.ndarray]
    weights: np.ndarray | None
    model: ResponsibilityAttentionDistribution
    backend: str

    @property
    def n(self) -> int:
        return self.data[0].shape[0]

    def make(self, keys: str | None = None) -> ResponsibilityAttentionAccumulator:
        return ResponsibilityAttentionAccumulator(*self.shape, keys=keys, backend=self.backend)

    def rows(self, start: int, stop: int) -> tuple[tuple[np.ndarray, ...], np.ndarray | None]:
        part = tuple(a[start:stop] for a in self.data)
        return part, None if self.weights is None else self.weights[start:stop]


shapes = st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6), st.integers(1, 6))
weight_values = st.one_of(st.just(0.0), st.floats(0.0, 5.0), st.floats(0.5, 2.0))


@st.composite
def problems(draw, *, max_rows: int = 40, shape: tuple[int, int, int, int] | None = None) -> Problem:
    """Triples sampled from one random head, weights (with zeros) or None, and another head to score them."""
    shape = draw(shapes) if shape is None else shape
    n = draw(st.integers(0, max_rows))
    seed = draw(st.integers(0, 2**32 - 1))
    truth = random_distribution(*shape, seed=np.random.default_rng([seed, 0]), key_scale=1.5, sigma2=0.7)
    data = truth.sampler(np.random.default_rng([seed, 1])).sample_arrays(n)
    weights = draw(st.none() | st.lists(weight_values, min_size=n, max_size=n).map(np.array))
    # The E-step scores the data under a different head than the one that generated it, as EM does.
    model = random_distribution(*shape, seed=np.random.default_rng([seed, 2]), key_scale=1.5, sigma2=1.3)
    backend = draw(st.sampled_from(["numba", "numpy"]))
    return Problem(shape, data, weights, model, backend)


@st.composite
def problem_triples(draw) -> list[Problem]:
    """Three problems of one shape (their statistics can be combined)."""
    shape = draw(shapes)
    return [draw(problems(shape=shape)) for _ in range(3)]


def statistics(problem: Problem, keys: str | None = None) -> ResponsibilityAttentionAccumulator:
    accumulator = problem.make(keys)
    accumulator.seq_update(problem.data, problem.weights, problem.model)
    return accumulator


def assert_values_close(actual: SufficientStatistics, expected: SufficientStatistics, *, rtol: float = RTOL) -> None:
    for name in FIELDS:
        assert_close(getattr(actual, name), getattr(expected, name), rtol=rtol, label=name)


def assert_values_equal(actual: SufficientStatistics, expected: SufficientStatistics) -> None:
    """Bit-equal arrays (same dtype and shape), equal floats (NaN equal to NaN)."""
    assert isinstance(actual, SufficientStatistics)
    for name in ARRAY_FIELDS:
        a, e = np.asarray(getattr(actual, name)), np.asarray(getattr(expected, name))
        assert a.dtype == np.float64 and a.shape == e.shape, name
        assert np.array_equal(a, e), name
        assert a.tobytes() == e.tobytes(), name
    for name in SCALAR_FIELDS:
        a, e = getattr(actual, name), getattr(expected, name)
        assert isinstance(a, float), name
        assert a == e or (math.isnan(a) and math.isnan(e)), f"{name}: {a!r} != {e!r}"


def combined(shape, *values: SufficientStatistics) -> SufficientStatistics:
    accumulator = ResponsibilityAttentionAccumulator(*shape)
    for value in values:
        accumulator.combine(value)
    return accumulator.value()


def start(shape, value: SufficientStatistics) -> ResponsibilityAttentionAccumulator:
    """An accumulator set from a private copy of ``value``.

    The laws below are about arithmetic; whether ``from_value`` aliases its argument is tested on its
    own (``test_from_value_does_not_alias_its_argument``), so these tests do not fail twice for it.
    """
    return ResponsibilityAttentionAccumulator(*shape).from_value(copy.deepcopy(value))


# ------------------------------------------------------------------------------ combine


@settings(deadline=None, max_examples=60)
@given(problem_triples())
def test_combine_is_associative(triple):
    a, b, c = (statistics(p).value() for p in triple)
    shape = triple[0].shape
    left = start(shape, a).combine(b).combine(c).value()
    right = start(shape, a).combine(start(shape, b).combine(c).value()).value()
    assert_values_close(left, right)


@settings(deadline=None, max_examples=60)
@given(problem_triples())
def test_combine_is_commutative(triple):
    a, b, _ = (statistics(p).value() for p in triple)
    shape = triple[0].shape
    ab = start(shape, a).combine(b).value()
    ba = start(shape, b).combine(a).value()
    assert_values_close(ab, ba)
    # Two terms commute exactly: x + y == y + x in IEEE arithmetic.
    assert_values_equal(ab, ba)


@settings(deadline=None, max_examples=60)
@given(problems())
def test_empty_value_is_the_identity_of_combine(problem):
    value = statistics(problem).value()
    empty = problem.make().value()
    for name in ARRAY_FIELDS:
        assert not np.any(getattr(empty, name)), name
    assert (empty.query_sq, empty.n_obs, empty.log_lik) == (0.0, 0.0, 0.0)
    # x + 0 == x exactly, on either side.
    assert_values_equal(problem.make().combine(value).value(), value)
    assert_values_equal(start(problem.shape, value).combine(empty).value(), value)


@settings(deadline=None, max_examples=40)
@given(problems())
def test_combine_returns_self_and_value_is_a_snapshot(problem):
    accumulator = statistics(problem)
    before = accumulator.value()
    snapshot = accumulator.value()
    assert accumulator.combine(before) is accumulator
    # The earlier value() is a copy: combining into the accumulator does not change it.
    assert_values_equal(snapshot, before)
    assert_values_close(accumulator.value(), combined(problem.shape, before, before))


@settings(deadline=None, max_examples=20)
@given(problems())
def test_value_without_a_copy_hands_over_the_same_statistics_and_ends_the_accumulator(problem):
    accumulator = statistics(problem)
    copied = accumulator.value()
    assert_values_equal(accumulator.value(copy=False), copied)
    with pytest.raises(RuntimeError, match=r"handed its arrays over with value\(copy=False\); make a new one"):
        accumulator.combine(copied)


# ---------------------------------------------------------------------------- round-trips


@settings(deadline=None, max_examples=60)
@given(problems())
def test_from_value_round_trips_exactly(problem):
    value = statistics(problem).value()
    restored = problem.make().from_value(value)
    assert_values_equal(restored.value(), value)
    assert_values_equal(restored.value(), statistics(problem).value())


@pytest.mark.parametrize("shape", [(3, 2, 2, 4), (1, 2, 2, 4), (3, 2, 2, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_from_value_does_not_alias_its_argument(shape, order):
    """An accumulator set by ``from_value`` owns its arrays: combining into it leaves the value alone.

    A tree reduction does ``make().from_value(left).combine(right)``; if the accumulator shared memory
    with ``left``, the reduction would silently change a value another task (or a retry) still reads.
    """
    truth = random_distribution(*shape, seed=11)
    data = truth.sampler(12).sample_arrays(25)
    source = ResponsibilityAttentionAccumulator(*shape)
    source.seq_update(data, None, truth)
    value = source.value()
    value = value._replace(**{name: np.asarray(getattr(value, name), order=order) for name in ARRAY_FIELDS})
    before = copy.deepcopy(value)
    accumulator = ResponsibilityAttentionAccumulator(*shape).from_value(value)
    for name in ARRAY_FIELDS:
        assert not np.shares_memory(getattr(accumulator, name), getattr(value, name)), f"from_value aliases {name}"
    accumulator.combine(before)
    assert_values_equal(value, before)


@settings(deadline=None, max_examples=60)
@given(problems())
def test_value_round_trips_through_dict_npz_and_pickle(problem):
    value = statistics(problem).value()
    as_dict = value.to_dict()
    assert set(as_dict) == set(FIELDS)
    assert_values_equal(SufficientStatistics.from_dict(as_dict), value)
    assert_values_equal(problem.make().from_value(SufficientStatistics.from_dict(as_dict)).value(), value)

    buffer = io.BytesIO()
    np.savez(buffer, **as_dict)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as loaded:
        assert_values_equal(SufficientStatistics.from_dict(loaded), value)

    unpickled = pickle.loads(pickle.dumps(value))
    assert_values_equal(unpickled, value)
    assert_values_equal(problem.make().from_value(unpickled).value(), value)

    accumulator = pickle.loads(pickle.dumps(statistics(problem)))
    assert_values_equal(accumulator.value(), value)


def test_from_dict_names_missing_fields():
    value = ResponsibilityAttentionAccumulator(2, 2, 2, 2).value().to_dict()
    del value["log_lik"]
    with pytest.raises(ValueError, match="log_lik"):
        SufficientStatistics.from_dict(value)


# ------------------------------------------------------------------------- batch splitting


@settings(deadline=None, max_examples=80)
@given(problems(), st.data())
def test_splitting_a_batch_gives_the_same_statistics(problem, data):
    split = data.draw(st.integers(0, problem.n), label="split")
    whole = statistics(problem).value()
    parts = problem.make()
    for start, stop in ((0, split), (split, problem.n)):
        rows, weights = problem.rows(start, stop)
        parts.seq_update(rows, weights, problem.model)
    assert_values_close(parts.value(), whole)
    # Two accumulators, one per part, combined: the distributed shape of the same sum.
    left, right = problem.make(), problem.make()
    left.seq_update(*problem.rows(0, split), problem.model)
    right.seq_update(*problem.rows(split, problem.n), problem.model)
    assert_values_close(left.combine(right.value()).value(), whole)


@settings(deadline=None, max_examples=40)
@given(problems(max_rows=12))
def test_row_by_row_update_matches_seq_update(problem):
    one_by_one = problem.make()
    context, query, target = problem.data
    for i in range(problem.n):
        weight = 1.0 if problem.weights is None else float(problem.weights[i])
        one_by_one.update((context[i], query[i], int(target[i])), weight, problem.model)
    assert_values_close(one_by_one.value(), statistics(problem).value())


# ---------------------------------------------------------------------------- masses


def assert_masses_sum_to_n_obs(value: SufficientStatistics, expected_n_obs: float) -> None:
    assert_close(value.n_obs, expected_n_obs, rtol=RTOL, label="n_obs")
    for name in ("position_count", "key_mass", "emission_count"):
        assert_close(np.asarray(getattr(value, name)).sum(), value.n_obs, rtol=RTOL, label=f"{name}.sum()")
    # Each emission row sums to the symbol's mass.
    assert_close(
        np.asarray(value.emission_count).sum(axis=1), value.key_mass, rtol=RTOL, label="emission_count row sums"
    )


def total_weight(problem: Problem) -> float:
    return float(problem.n if problem.weights is None else problem.weights.sum())


@settings(deadline=None, max_examples=60)
@given(problems())
def test_seq_update_masses_sum_to_the_weighted_count(problem):
    value = statistics(problem).value()
    assert_masses_sum_to_n_obs(value, total_weight(problem))
    query = problem.data[1]
    w = np.ones(problem.n) if problem.weights is None else problem.weights
    assert_close(value.query_sq, float(np.sum(w * np.einsum("nd,nd->n", query, query))), rtol=RTOL, label="query_sq")
    assert np.isfinite(value.log_lik)


@settings(deadline=None, max_examples=60)
@given(problems(), st.integers(0, 2**32 - 1))
def test_seq_initialize_is_seeded_and_masses_sum_to_the_weighted_count(problem, seed):
    values = []
    for rng in (seed, seed, np.random.default_rng(seed), np.random.default_rng(seed)):
        accumulator = problem.make()
        accumulator.seq_initialize(problem.data, problem.weights, rng)
        values.append(accumulator.value())
    for value in values[1:]:
        assert_values_equal(value, values[0])
    assert_masses_sum_to_n_obs(values[0], total_weight(problem))
    # A random initialization has no model, hence no log-likelihood.
    assert values[0].log_lik == 0.0


def test_seq_initialize_depends_on_the_seed():
    truth = random_distribution(5, 4, 3, 6, seed=0)
    data = truth.sampler(1).sample_arrays(50)
    values = []
    for seed in (0, 1):
        accumulator = ResponsibilityAttentionAccumulator(5, 4, 3, 6)
        accumulator.seq_initialize(data, None, seed)
        values.append(accumulator.value())
    assert not np.array_equal(values[0].position_count, values[1].position_count)


# ----------------------------------------------------------------------------- tying


@settings(deadline=None, max_examples=50)
@given(problem_triples(), st.data())
def test_key_merge_then_key_replace_pools_tied_accumulators(triple, data):
    shape = triple[0].shape
    tied = [statistics(p, keys="tied") for p in triple]
    untied = statistics(data.draw(problems(shape=shape, max_rows=10), label="untied"))
    before = [a.value() for a in tied]
    untied_before = untied.value()
    pooled = combined(shape, *before)

    stats_dict: dict = {}
    for accumulator in [*tied, untied]:
        accumulator.key_merge(stats_dict)
    # The reference semantics: the first accumulator merged becomes the pool object itself, and the
    # others are combined into it; an accumulator without keys adds nothing.
    assert list(stats_dict) == ["tied"]
    assert stats_dict["tied"] is tied[0]
    assert_values_close(tied[0].value(), pooled)
    assert_values_equal(tied[1].value(), before[1])
    assert_values_equal(tied[2].value(), before[2])

    for accumulator in [*tied, untied]:
        accumulator.key_replace(stats_dict)
    for accumulator in tied:
        assert_values_close(accumulator.value(), pooled)
        assert_masses_sum_to_n_obs(accumulator.value(), pooled.n_obs)
    assert_values_equal(untied.value(), untied_before)
    # The pool stays the first accumulator, and the others hold copies, not views of it.
    assert stats_dict["tied"] is tied[0]
    tied[1].combine(before[0])
    assert_values_close(tied[0].value(), pooled)


def test_key_merge_and_replace_without_keys_do_nothing():
    truth = random_distribution(4, 3, 2, 5, seed=3)
    data = truth.sampler(4).sample_arrays(30)
    accumulator = ResponsibilityAttentionAccumulator(4, 3, 2, 5)
    accumulator.seq_update(data, None, truth)
    before = accumulator.value()
    stats_dict: dict = {}
    accumulator.key_merge(stats_dict)
    accumulator.key_replace(stats_dict)
    assert stats_dict == {}
    assert_values_equal(accumulator.value(), before)


def test_key_replace_before_any_merge_keeps_the_statistics():
    truth = random_distribution(4, 3, 2, 5, seed=5)
    data = truth.sampler(6).sample_arrays(30)
    accumulator = ResponsibilityAttentionAccumulator(4, 3, 2, 5, keys="tied")
    accumulator.seq_update(data, None, truth)
    before = accumulator.value()
    accumulator.key_replace({})
    assert_values_equal(accumulator.value(), before)


# ------------------------------------------------------------------ the reference's 5-field value


@settings(deadline=None, max_examples=60)
@given(problem_triples())
def test_five_field_reference_value_is_accepted(triple):
    a, b, _ = (statistics(p).value() for p in triple)
    shape = triple[0].shape
    five = tuple(a[:5])
    assert len(five) == 5 and not isinstance(five, SufficientStatistics)

    restored = start(shape, five).value()
    for name in FIELDS[:5]:
        assert np.array_equal(getattr(restored, name), getattr(a, name)), name
    # The count follows from the position counts; the log-likelihood is unknown.
    assert restored.n_obs == float(np.sum(a.position_count))
    assert_close(restored.n_obs, a.n_obs, rtol=RTOL, label="n_obs")
    assert math.isnan(restored.log_lik)

    merged = start(shape, b).combine(five).value()
    expected = combined(shape, a, b)
    for name in FIELDS[:6]:
        assert_close(getattr(merged, name), getattr(expected, name), rtol=RTOL, label=name)
    assert math.isnan(merged.log_lik)
