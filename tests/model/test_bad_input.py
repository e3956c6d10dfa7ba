"""Bad input raises a ValueError/TypeError naming the argument, the first offending row and what was expected.

Bad values sit at two rows (7 and 9) of a 12-row batch so that "the first offending row" is checked:
the message must name row 7. Bad-value errors leave an accumulator untouched; rows the model gives
zero probability raise ``ImpossibleEvidenceError`` naming them, and the accumulator then refuses use.
"""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import (
    ImpossibleEvidenceError,
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    random_distribution,
    sequence_to_triples,
    sequence_windows,
)
from dist_respattn.model.fitting.selection import HyperparameterSearch

S, N, D, T = 50, 4, 3, 6
ROWS = 12
FIRST, SECOND = 7, 9  # the two bad rows; messages must name FIRST

MODEL = random_distribution(S, N, D, T, seed=11)


def clean_batch() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fresh, valid (context int64, query float64, target int64, weights float64) of ROWS rows."""
    context, query, target = MODEL.sampler(5).sample_arrays(ROWS)
    weights = np.linspace(0.5, 2.0, ROWS)
    return context.astype(np.int64), query.astype(np.float64), target.astype(np.int64), weights


def make_accumulator(backend: str = "numba") -> ResponsibilityAttentionAccumulator:
    return MODEL.estimator().accumulator_factory(backend=backend).make()


def triples(context, query, target) -> list[tuple]:
    return [(context[i], query[i], target[i]) for i in range(len(context))]


def call(entry: str, context, query, target, weights=None):
    """Run one batch entry point on the given arrays (arguments an entry does not take are ignored)."""
    if entry == "seq_update-numba":
        return make_accumulator("numba").seq_update((context, query, target), weights, MODEL)
    if entry == "seq_update-numpy":
        return make_accumulator("numpy").seq_update((context, query, target), weights, MODEL)
    if entry == "seq_initialize":
        return make_accumulator().seq_initialize((context, query, target), weights, 0)
    if entry == "seq_log_density":
        return MODEL.seq_log_density((context, query, target))
    if entry == "predict_proba":
        return MODEL.predict_proba(context, query)
    if entry == "attention_weights":
        return MODEL.attention_weights(context, query, target)
    if entry == "seq_encode":
        return MODEL.dist_to_encoder().seq_encode(triples(context, query, target))
    raise AssertionError(entry)


WEIGHTED = ["seq_update-numba", "seq_update-numpy", "seq_initialize"]
ENCODED = [*WEIGHTED, "seq_log_density"]  # entry points taking an encoded (context, query, target) triple
WITH_TARGET = [*ENCODED, "attention_weights", "seq_encode"]
ALL = [*WITH_TARGET, "predict_proba"]


# --------------------------------------------------------------------------------------------
# Values out of range or not finite, at rows 7 and 9: row 7 is named.


@pytest.mark.parametrize("entry", ALL)
@pytest.mark.parametrize(
    "first, second",
    [(-1, S), (S, -3), (2500, -1)],
    ids=["negative-first", "too-large-first", "far-too-large-first"],
)
def test_context_id_out_of_range_names_first_row(entry, first, second):
    context, query, target, weights = clean_batch()
    context[FIRST, 2] = first
    context[SECOND, 0] = second
    with pytest.raises(ValueError, match=rf"context\[{FIRST}, 2\] = .*expected a symbol id in \[0, {S}\)"):
        call(entry, context, query, target, weights)


@pytest.mark.parametrize("entry", WITH_TARGET)
@pytest.mark.parametrize("first, second", [(T, -1), (-1, T + 5)], ids=["too-large-first", "negative-first"])
def test_target_id_out_of_range_names_first_row(entry, first, second):
    context, query, target, weights = clean_batch()
    target[FIRST] = first
    target[SECOND] = second
    with pytest.raises(ValueError, match=rf"target\[{FIRST}\] = .*expected a target id in \[0, {T}\)"):
        call(entry, context, query, target, weights)


@pytest.mark.parametrize("entry", ALL)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_query_names_first_row(entry, bad):
    context, query, target, weights = clean_batch()
    query[FIRST, 1] = bad
    query[SECOND, 0] = np.nan
    with pytest.raises(ValueError, match=rf"query\[{FIRST}, 1\] = .*expected finite query values"):
        call(entry, context, query, target, weights)


@pytest.mark.parametrize("entry", WEIGHTED)
@pytest.mark.parametrize("bad", [-1.0, -1e-300, np.nan, np.inf, -np.inf], ids=["neg", "tiny-neg", "nan", "inf", "-inf"])
def test_bad_weight_names_first_row(entry, bad):
    context, query, target, weights = clean_batch()
    weights[FIRST] = bad
    weights[SECOND] = -5.0
    with pytest.raises(ValueError, match=rf"weights\[{FIRST}\] = .*expected a finite, non-negative weight"):
        call(entry, context, query, target, weights)


# --------------------------------------------------------------------------------------------
# Shapes and dtypes.


@pytest.mark.parametrize("entry", WEIGHTED)
@pytest.mark.parametrize("length", [ROWS - 1, ROWS + 1, 0])
def test_wrong_weight_length(entry, length):
    context, query, target, _ = clean_batch()
    with pytest.raises(ValueError, match=rf"weights has shape \({length},\): expected \({ROWS},\)"):
        call(entry, context, query, target, np.ones(length))


@pytest.mark.parametrize("entry", WEIGHTED)
def test_weights_two_dimensional_or_scalar(entry):
    context, query, target, _ = clean_batch()
    with pytest.raises(ValueError, match=rf"weights has shape \({ROWS}, 1\): expected \({ROWS},\)"):
        call(entry, context, query, target, np.ones((ROWS, 1)))
    with pytest.raises(ValueError, match=rf"weights must be an array of shape \({ROWS},\), got a scalar"):
        call(entry, context, query, target, 1.0)


@pytest.mark.parametrize("entry", WEIGHTED)
@pytest.mark.parametrize("bad", [np.ones(ROWS, dtype=bool), np.array(["1"] * ROWS), np.array([None] * ROWS)])
def test_non_numeric_weights_are_a_type_error(entry, bad):
    context, query, target, _ = clean_batch()
    with pytest.raises(TypeError, match=r"weights must be a real-valued array, got dtype"):
        call(entry, context, query, target, bad)


@pytest.mark.parametrize("entry", [*ENCODED, "predict_proba", "attention_weights"])
def test_float_context_dtype_is_a_type_error(entry):
    context, query, target, weights = clean_batch()
    with pytest.raises(TypeError, match=r"context must be an integer array of ids, got dtype float64"):
        call(entry, context.astype(np.float64), query, target, weights)


@pytest.mark.parametrize("entry", ALL)
def test_fractional_context_id_is_a_type_error(entry):
    context, query, target, weights = clean_batch()
    context = context.astype(np.float64)
    context[FIRST, 1] = 2.5
    context[SECOND, 1] = 3.5
    pattern = rf"context\[{FIRST}, 1\] = .*expected an integer id" if entry == "seq_encode" else r"context.*integer"
    with pytest.raises(TypeError, match=pattern):
        call(entry, context, query, target, weights)


@pytest.mark.parametrize("entry", WITH_TARGET)
def test_fractional_target_id_is_a_type_error(entry):
    context, query, target, weights = clean_batch()
    target = target.astype(np.float64)
    target[FIRST] = 2.5
    target[SECOND] = 3.5
    pattern = rf"target of triple {FIRST} = .*expected an integer id" if entry == "seq_encode" else r"target.*integer"
    with pytest.raises(TypeError, match=pattern):
        call(entry, context, query, target, weights)


@pytest.mark.parametrize("entry", ALL)
def test_bool_context_is_a_type_error(entry):
    context, query, target, weights = clean_batch()
    with pytest.raises(TypeError, match=r"context.*(bool|integer)"):
        call(entry, context % 2 == 0, query, target, weights)


@pytest.mark.parametrize("entry", WITH_TARGET)
def test_bool_target_is_a_type_error(entry):
    context, query, target, weights = clean_batch()
    with pytest.raises(TypeError, match=r"target.*(bool|integer)"):
        call(entry, context, query, target % 2 == 0, weights)


def test_seq_encode_bool_context_in_one_triple_is_a_type_error():
    # Stacking one boolean context among integer ones must not silently turn True/False into ids 1/0.
    context, query, target, _ = clean_batch()
    rows = triples(context, query, target)
    rows[FIRST] = (np.array([True, False, True, False]), query[FIRST], target[FIRST])
    with pytest.raises(TypeError, match=rf"context.*(triple {FIRST}|\[{FIRST}\b).*(bool|integer)"):
        MODEL.dist_to_encoder().seq_encode(rows)


@pytest.mark.parametrize("entry", ALL)
@pytest.mark.parametrize("length", [N - 1, N + 1])
def test_context_length_not_n(entry, length):
    context, query, target, weights = clean_batch()
    context = np.resize(context, (ROWS, length)) % S
    with pytest.raises(ValueError, match=rf"context.*{length}.*expected.*N ?= ?{N}"):
        call(entry, context, query, target, weights)


def test_seq_encode_names_the_triple_with_the_wrong_context_length():
    # Triple 0 is the odd one out: the message must blame it and expect N, not blame triple 1.
    context, query, target, _ = clean_batch()
    rows = triples(context, query, target)
    rows[0] = (np.arange(N + 1), query[0], target[0])
    with pytest.raises(ValueError, match=rf"context of triple 0 has shape \({N + 1},\).*expected.*{N}"):
        MODEL.dist_to_encoder().seq_encode(rows)


def test_seq_encode_names_the_triple_with_a_different_context_length():
    context, query, target, _ = clean_batch()
    rows = triples(context, query, target)
    rows[FIRST] = (np.arange(N + 1), query[FIRST], target[FIRST])
    rows[SECOND] = (np.arange(N - 1), query[SECOND], target[SECOND])
    with pytest.raises(ValueError, match=rf"context of triple {FIRST} has shape \({N + 1},\): expected \({N},\)"):
        MODEL.dist_to_encoder().seq_encode(rows)


@pytest.mark.parametrize("entry", ALL)
@pytest.mark.parametrize("dim", [D - 1, D + 1])
def test_query_dim_not_d(entry, dim):
    context, query, target, weights = clean_batch()
    query = np.resize(query, (ROWS, dim))
    with pytest.raises(ValueError, match=rf"quer(y|ies).*{dim}.*expected.*D ?= ?{D}"):
        call(entry, context, query, target, weights)


def test_seq_encode_names_the_triple_with_a_different_query_length():
    context, query, target, _ = clean_batch()
    rows = triples(context, query, target)
    rows[FIRST] = (context[FIRST], query[FIRST][: D - 1], target[FIRST])
    with pytest.raises(ValueError, match=rf"query of triple {FIRST}.*{D - 1}.*expected.*{D}"):
        MODEL.dist_to_encoder().seq_encode(rows)


@pytest.mark.parametrize("entry", [*ENCODED, "predict_proba", "attention_weights"])
def test_query_row_count_differs_from_context(entry):
    context, query, target, weights = clean_batch()
    with pytest.raises(ValueError, match=rf"query has {ROWS - 1} rows but context has {ROWS}: expected one row"):
        call(entry, context, query[:-1], target, weights)


@pytest.mark.parametrize("entry", ENCODED)
def test_target_row_count_differs_from_context(entry):
    context, query, target, weights = clean_batch()
    with pytest.raises(ValueError, match=rf"target has {ROWS - 1} rows but context has {ROWS}: expected one row"):
        call(entry, context, query, target[:-1], weights)


def test_attention_weights_target_count_differs_from_context():
    context, query, target, _ = clean_batch()
    with pytest.raises(ValueError, match=rf"target.*{ROWS}"):
        MODEL.attention_weights(context, query, target[:-1])


@pytest.mark.parametrize("entry", ENCODED)
def test_integer_query_dtype_is_a_type_error(entry):
    context, query, target, weights = clean_batch()
    with pytest.raises(TypeError, match=r"query must be a float32 or float64 array, got dtype int64"):
        call(entry, context, query.astype(np.int64), target, weights)


@pytest.mark.parametrize("entry", ENCODED)
@pytest.mark.parametrize("dtype", [np.float16, np.longdouble])
def test_other_float_query_dtypes_are_a_type_error(entry, dtype):
    # The check promises "float32 or float64"; other float dtypes must fail there, not inside numba.
    context, query, target, weights = clean_batch()
    with pytest.raises(TypeError, match=r"query must be a float32 or float64 array"):
        call(entry, context, query.astype(dtype), target, weights)


@pytest.mark.parametrize("entry", ENCODED)
def test_context_and_target_dimensions(entry):
    context, query, target, weights = clean_batch()
    with pytest.raises(ValueError, match=r"context must be 2-dimensional, got shape \(12,\)"):
        call(entry, context[:, 0], query, target, weights)
    with pytest.raises(ValueError, match=r"target must be 1-dimensional, got shape \(12, 1\)"):
        call(entry, context, query, target[:, None], weights)
    with pytest.raises(ValueError, match=r"query must be two-dimensional \(n, D\), got shape \(12,\)"):
        call(entry, context, query[:, 0], target, weights)


@pytest.mark.parametrize("entry", ENCODED)
@pytest.mark.parametrize(
    "bad", [lambda c, q, t: (c, q), lambda c, q, t: (c, q, t, t), lambda c, q, t: None, lambda c, q, t: 3]
)
def test_not_a_triple(entry, bad):
    context, query, target, weights = clean_batch()
    x = bad(context, query, target)
    with pytest.raises(TypeError, match=r"triple \(context, query, target\)"):
        if entry.startswith("seq_update"):
            make_accumulator(entry.split("-")[1]).seq_update(x, weights, MODEL)
        elif entry == "seq_initialize":
            make_accumulator().seq_initialize(x, weights, 0)
        else:
            MODEL.seq_log_density(x)


def test_seq_encode_names_the_entry_that_is_not_a_triple():
    context, query, target, _ = clean_batch()
    rows = triples(context, query, target)
    rows[FIRST] = (context[FIRST], query[FIRST])
    rows[SECOND] = 5
    with pytest.raises(TypeError, match=rf"triple {FIRST} is .*expected a \(context, query, target\) triple"):
        MODEL.dist_to_encoder().seq_encode(rows)


# --------------------------------------------------------------------------------------------
# The estimate handed to seq_update / update.


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("axis", range(4), ids=["S", "N", "D", "T"])
def test_estimate_of_another_shape(backend, axis):
    shape = [S, N, D, T]
    shape[axis] += 1
    other = random_distribution(*shape, seed=2)
    context, query, target, weights = clean_batch()
    accumulator = make_accumulator(backend)
    pattern = rf"estimate has \(S, N, D, T\) = \({', '.join(map(str, shape))}\): expected \({S}, {N}, {D}, {T}\)"
    with pytest.raises(ValueError, match=pattern):
        accumulator.seq_update((context, query, target), weights, other)
    with pytest.raises(ValueError, match=pattern):
        accumulator.update((context[0], query[0], int(target[0])), 1.0, other)
    assert accumulator.value().n_obs == 0.0


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_estimate_not_a_distribution(backend):
    context, query, target, weights = clean_batch()
    with pytest.raises(TypeError, match=r"estimate must be a ResponsibilityAttentionDistribution, got dict"):
        make_accumulator(backend).seq_update((context, query, target), weights, {})


# --------------------------------------------------------------------------------------------
# Single-triple paths (accumulator update/initialize, distribution log_density): the triple is row 0.


def single_triple_calls():
    return {
        "update-numba": lambda x, w: make_accumulator("numba").update(x, w, MODEL),
        "update-numpy": lambda x, w: make_accumulator("numpy").update(x, w, MODEL),
        "initialize": lambda x, w: make_accumulator().initialize(x, w, 0),
        "log_density": lambda x, w: MODEL.log_density(x),
    }


SINGLE = list(single_triple_calls())


def run_single(entry, x, weight=1.0):
    return single_triple_calls()[entry](x, weight)


@pytest.mark.parametrize("entry", SINGLE)
@pytest.mark.parametrize("bad", [-1, S, 2500])
def test_single_triple_context_out_of_range(entry, bad):
    context, query, target, _ = clean_batch()
    ctx = context[0].copy()
    ctx[2] = bad
    with pytest.raises(ValueError, match=rf"context\[0, 2\] = .*expected a symbol id in \[0, {S}\)"):
        run_single(entry, (ctx, query[0], int(target[0])))


@pytest.mark.parametrize("entry", SINGLE)
@pytest.mark.parametrize("bad", [-1, T])
def test_single_triple_target_out_of_range(entry, bad):
    context, query, _, _ = clean_batch()
    with pytest.raises(ValueError, match=rf"target\[0\] = .*expected a target id in \[0, {T}\)"):
        run_single(entry, (context[0], query[0], bad))


@pytest.mark.parametrize("entry", SINGLE)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_single_triple_non_finite_query(entry, bad):
    context, query, target, _ = clean_batch()
    y = query[0].copy()
    y[1] = bad
    with pytest.raises(ValueError, match=r"query\[0, 1\] = .*expected finite query values"):
        run_single(entry, (context[0], y, int(target[0])))


@pytest.mark.parametrize("entry", ["update-numba", "update-numpy", "initialize"])
@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_single_triple_bad_weight(entry, bad):
    context, query, target, _ = clean_batch()
    # A single triple's weight is named as the argument it came in, not as an entry of an array.
    with pytest.raises(ValueError, match=r"weight = .*: expected a finite number >= 0"):
        run_single(entry, (context[0], query[0], int(target[0])), bad)


@pytest.mark.parametrize("entry", SINGLE)
def test_single_triple_wrong_lengths(entry):
    context, query, target, _ = clean_batch()
    with pytest.raises(ValueError, match=rf"context of triple 0 has shape \({N + 1},\): expected \({N},\), N = {N}"):
        run_single(entry, (np.arange(N + 1), query[0], int(target[0])))
    with pytest.raises(ValueError, match=rf"query of triple 0 has shape \({D + 1},\): expected \({D},\), D = {D}"):
        run_single(entry, (context[0], np.zeros(D + 1), int(target[0])))


@pytest.mark.parametrize("entry", SINGLE)
def test_single_triple_non_integer_ids(entry):
    context, query, target, _ = clean_batch()
    ctx = context[0].astype(np.float64)
    ctx[1] = 2.5
    with pytest.raises(TypeError, match=r"context\[0, 1\] = .*expected an integer id"):
        run_single(entry, (ctx, query[0], int(target[0])))
    with pytest.raises(TypeError, match=r"target of triple 0 = 2\.5: expected an integer id"):
        run_single(entry, (context[0], query[0], 2.5))
    with pytest.raises(TypeError, match=r"target of triple 0 = True: expected an integer id, got a boolean"):
        run_single(entry, (context[0], query[0], True))
    with pytest.raises(TypeError, match=r"context of triple 0 holds booleans: expected integer ids"):
        run_single(entry, (context[0] % 2 == 0, query[0], int(target[0])))


@pytest.mark.parametrize("entry", SINGLE)
@pytest.mark.parametrize("bad", [5, None, (np.zeros(N, dtype=np.int64), np.zeros(D))], ids=["int", "none", "pair"])
def test_single_not_a_triple(entry, bad):
    with pytest.raises(TypeError, match=r"triple 0 is .*expected a \(context, query, target\) triple"):
        run_single(entry, bad)


# --------------------------------------------------------------------------------------------
# Atomicity: a bad-value error leaves the accumulator as it was, and usable.


def corrupt(kind: str, context, query, target, weights) -> None:
    """Put a bad value of ``kind`` at the last row, after many good rows the kernel could have added."""
    last = ROWS - 1
    if kind == "context":
        context[last, 3] = S
    elif kind == "target":
        target[last] = T
    elif kind == "query":
        query[last, 2] = np.nan
    elif kind == "weight":
        weights[last] = -1.0
    else:
        raise AssertionError(kind)


def assert_values_equal(a, b) -> None:
    for name, x, y in zip(a._fields, a, b, strict=True):
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("method", ["seq_update", "seq_initialize"])
@pytest.mark.parametrize("kind", ["context", "target", "query", "weight"])
def test_bad_value_leaves_accumulator_unchanged(backend, method, kind):
    context, query, target, weights = clean_batch()
    accumulator = make_accumulator(backend)
    accumulator.seq_update((context, query, target), weights, MODEL)
    before = accumulator.value()

    bad_context, bad_query, bad_target, bad_weights = (a.copy() for a in (context, query, target, weights))
    corrupt(kind, bad_context, bad_query, bad_target, bad_weights)
    with pytest.raises(ValueError, match=rf"\[{ROWS - 1}"):
        if method == "seq_update":
            accumulator.seq_update((bad_context, bad_query, bad_target), bad_weights, MODEL)
        else:
            accumulator.seq_initialize((bad_context, bad_query, bad_target), bad_weights, 0)
    assert_values_equal(accumulator.value(), before)

    # Still usable: a second good update gives what two good updates give on a fresh accumulator.
    accumulator.seq_update((context, query, target), weights, MODEL)
    reference = make_accumulator(backend)
    reference.seq_update((context, query, target), weights, MODEL)
    reference.seq_update((context, query, target), weights, MODEL)
    assert_values_equal(accumulator.value(), reference.value())


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_shape_errors_leave_accumulator_unchanged(backend):
    context, query, target, weights = clean_batch()
    accumulator = make_accumulator(backend)
    accumulator.seq_update((context, query, target), weights, MODEL)
    before = accumulator.value()
    with pytest.raises(ValueError):
        accumulator.seq_update((context, query, target), weights[:-1], MODEL)
    with pytest.raises(ValueError):
        accumulator.seq_update((context, query[:, :-1], target), weights, MODEL)
    with pytest.raises(ValueError):
        accumulator.seq_update((context, query, target), weights, random_distribution(S, N, D, T + 1, seed=1))
    with pytest.raises(TypeError):
        accumulator.seq_update((context.astype(np.float64), query, target), weights, MODEL)
    assert_values_equal(accumulator.value(), before)


# --------------------------------------------------------------------------------------------
# Impossible evidence.

# Five symbols, three targets; symbol s emits only target s % 3 (exact zeros elsewhere).
IMP_S, IMP_N, IMP_D, IMP_T = 5, 3, 2, 3
IMPOSSIBLE_MODEL = ResponsibilityAttentionDistribution(
    np.arange(IMP_S * IMP_D, dtype=np.float64).reshape(IMP_S, IMP_D) / 4.0,
    np.eye(IMP_T)[np.arange(IMP_S) % IMP_T],
    np.full(IMP_N, 1.0 / IMP_N),
    sigma2=1.5,
)
IMPOSSIBLE_ROWS = (3, 5)


def impossible_batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eight rows; rows 3 and 5 have contexts of symbols that emit only targets 0 and 1, and target 2."""
    context = np.tile(np.array([[0, 1, 2]], dtype=np.int64), (8, 1))
    target = np.array([0, 1, 2, 2, 0, 2, 1, 0], dtype=np.int64)
    context[list(IMPOSSIBLE_ROWS)] = [[0, 3, 1], [4, 1, 0]]
    query = np.random.default_rng(0).standard_normal((8, IMP_D))
    return context, query, target


def make_impossible_accumulator(backend: str) -> ResponsibilityAttentionAccumulator:
    return ResponsibilityAttentionAccumulator(IMP_S, IMP_N, IMP_D, IMP_T, backend=backend)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("weighted", [False, True])
def test_impossible_rows_are_named_and_break_the_accumulator(backend, weighted):
    context, query, target = impossible_batch()
    weights = np.full(8, 0.5) if weighted else None
    accumulator = make_impossible_accumulator(backend)
    with pytest.raises(ImpossibleEvidenceError, match=r"impossible evidence: rows 3, 5 have zero probability"):
        accumulator.seq_update((context, query, target), weights, IMPOSSIBLE_MODEL)
    assert issubclass(ImpossibleEvidenceError, ValueError)
    remake = r"partial update .*impossible evidence: rows 3, 5.*make a new one"
    with pytest.raises(RuntimeError, match=remake):
        accumulator.value()
    with pytest.raises(RuntimeError, match=remake):
        accumulator.seq_update((context[:1], query[:1], target[:1]), None, IMPOSSIBLE_MODEL)
    with pytest.raises(RuntimeError, match=remake):
        accumulator.seq_initialize((context[:1], query[:1], target[:1]), None, 0)
    with pytest.raises(RuntimeError, match=remake):
        accumulator.combine(make_impossible_accumulator(backend).value())
    with pytest.raises(RuntimeError, match=remake):
        accumulator.update((context[0], query[0], 0), 1.0, IMPOSSIBLE_MODEL)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_impossible_single_triple_update(backend):
    context, query, target = impossible_batch()
    accumulator = make_impossible_accumulator(backend)
    with pytest.raises(ImpossibleEvidenceError, match=r"row 0 has zero probability"):
        accumulator.update((context[3], query[3], int(target[3])), 1.0, IMPOSSIBLE_MODEL)
    with pytest.raises(RuntimeError, match=r"make a new one"):
        accumulator.value()


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_many_impossible_rows_are_counted(backend):
    context = np.tile(np.array([[0, 3, 1]], dtype=np.int64), (13, 1))
    query = np.zeros((13, IMP_D))
    target = np.full(13, 2, dtype=np.int64)
    accumulator = make_impossible_accumulator(backend)
    with pytest.raises(ImpossibleEvidenceError, match=r"rows 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 3 more"):
        accumulator.seq_update((context, query, target), None, IMPOSSIBLE_MODEL)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_zero_weight_impossible_rows_are_not_an_error(backend):
    context, query, target = impossible_batch()
    weights = np.ones(8)
    weights[list(IMPOSSIBLE_ROWS)] = 0.0
    accumulator = make_impossible_accumulator(backend)
    accumulator.seq_update((context, query, target), weights, IMPOSSIBLE_MODEL)
    keep = weights > 0
    reference = make_impossible_accumulator(backend)
    reference.seq_update((context[keep], query[keep], target[keep]), None, IMPOSSIBLE_MODEL)
    got, want = accumulator.value(), reference.value()
    for name, x, y in zip(got._fields, got, want, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12, err_msg=name)
    assert got.n_obs == 6.0


def test_impossible_rows_score_minus_infinity_without_error():
    context, query, target = impossible_batch()
    log_density = IMPOSSIBLE_MODEL.seq_log_density((context, query, target))
    assert np.isneginf(log_density[list(IMPOSSIBLE_ROWS)]).all()
    assert np.isfinite(np.delete(log_density, IMPOSSIBLE_ROWS)).all()


# --------------------------------------------------------------------------------------------
# Distribution construction.

GOOD_KEYS = MODEL.key_means
GOOD_EMISSION = MODEL.emission
GOOD_PRIOR = MODEL.position_prior


def build(key_means=GOOD_KEYS, emission=GOOD_EMISSION, position_prior=GOOD_PRIOR, sigma2=1.0, **kwargs):
    return ResponsibilityAttentionDistribution(key_means, emission, position_prior, sigma2, **kwargs)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_key_means(bad):
    keys = GOOD_KEYS.copy()
    keys[7, 2] = bad
    keys[9, 0] = np.nan
    with pytest.raises(ValueError, match=r"key_means\[7, 2\] = .*expected finite values"):
        build(key_means=keys)


def test_key_means_whose_sum_overflows_are_finite():
    """The finiteness check sums the entries first; finite entries whose sum overflows are still finite."""
    keys = GOOD_KEYS.copy()
    keys[:, 0] = 1e308
    keys[:, 1] = -1e308  # the sum's order makes no difference: inf + (-inf) is nan, the entries are checked
    assert np.array_equal(build(key_means=keys).key_means, keys)
    keys[7, 2], keys[9, 0] = np.inf, -np.inf
    with pytest.raises(ValueError, match=r"key_means\[7, 2\] = inf: expected finite values"):
        build(key_means=keys)


def test_key_means_not_a_matrix():
    with pytest.raises(ValueError, match=r"key_means must be two-dimensional, got shape \(50,\)"):
        build(key_means=GOOD_KEYS[:, 0])
    with pytest.raises(TypeError, match=r"key_means must be a real-valued matrix"):
        build(key_means=[["a"] * D] * S)


def test_emission_row_not_summing_to_one():
    emission = GOOD_EMISSION.copy()
    emission[7] *= 0.9
    emission[9] *= 1.1
    with pytest.raises(ValueError, match=r"emission row 7 sums to .*: expected every row to sum to 1"):
        build(emission=emission)


def test_negative_emission_entry():
    emission = GOOD_EMISSION.copy()
    emission[7, 1] = -0.1
    emission[7, 2] += 0.1
    emission[9, 0] = -1.0
    with pytest.raises(ValueError, match=r"emission\[7, 1\] = .*expected non-negative probabilities"):
        build(emission=emission)


def test_non_finite_emission_entry():
    emission = GOOD_EMISSION.copy()
    emission[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"emission\[7, 1\] = .*expected finite values"):
        build(emission=emission)


@pytest.mark.parametrize("rows", [S - 1, S + 1])
def test_emission_rows_not_s(rows):
    emission = np.full((rows, T), 1.0 / T)
    with pytest.raises(ValueError, match=rf"emission has {rows} rows but key_means has {S}: expected one emission row"):
        build(emission=emission)


def test_prior_not_summing_to_one():
    with pytest.raises(ValueError, match=r"position_prior sums to .*: expected 1"):
        build(position_prior=GOOD_PRIOR * 0.9)


@pytest.mark.parametrize("bad", [-0.1, np.nan, np.inf])
def test_bad_prior_entry(bad):
    prior = np.full(N, 1.0 / N)
    prior[2] = bad
    prior[3] = -1.0
    with pytest.raises(ValueError, match=r"position_prior\[2\] = .*expected finite, non-negative probabilities"):
        build(position_prior=prior)


def test_prior_not_a_vector():
    with pytest.raises(ValueError, match=r"position_prior must be a non-empty vector, got shape \(2, 2\)"):
        build(position_prior=np.full((2, 2), 0.25))
    with pytest.raises(ValueError, match=r"position_prior must be a non-empty vector, got shape \(0,\)"):
        build(position_prior=[])


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf])
def test_bad_sigma2(bad):
    with pytest.raises(ValueError, match=r"sigma2 = .*: expected a finite number > 0"):
        build(sigma2=bad)


@pytest.mark.parametrize("bad", [True, False, np.True_, None, "abc"])
def test_sigma2_not_a_number(bad):
    with pytest.raises(TypeError, match=r"sigma2 must be a real number"):
        build(sigma2=bad)


def test_missing_prior_without_context_length():
    with pytest.raises(ValueError, match=r"position_prior is required .*context_length=N"):
        ResponsibilityAttentionDistribution(GOOD_KEYS, GOOD_EMISSION)


@pytest.mark.parametrize("bad", [0, -2])
def test_non_positive_context_length(bad):
    with pytest.raises(ValueError, match=rf"context_length = {bad}: expected a positive integer"):
        ResponsibilityAttentionDistribution(GOOD_KEYS, GOOD_EMISSION, context_length=bad)


@pytest.mark.parametrize("bad", [2.5, True])
def test_non_integer_context_length(bad):
    # int(2.5) == 2 and int(True) == 1: a non-integer N must be refused, not truncated.
    with pytest.raises((TypeError, ValueError), match=r"context_length = .*expected a positive integer"):
        ResponsibilityAttentionDistribution(GOOD_KEYS, GOOD_EMISSION, context_length=bad)


def test_context_length_mismatch():
    with pytest.raises(ValueError, match=rf"context_length = {N + 1} but position_prior has length {N}"):
        build(context_length=N + 1)


def test_a_short_position_prior_is_named_by_its_length_not_its_sum():
    # The first N - 1 entries of a uniform prior sum to (N - 1) / N: the length is the cause, and the message says so.
    short = np.full(N - 1, 1.0 / N)
    with pytest.raises(ValueError, match=rf"context_length = {N} but position_prior has length {N - 1}"):
        ResponsibilityAttentionDistribution(GOOD_KEYS, GOOD_EMISSION, position_prior=short, context_length=N)


# --------------------------------------------------------------------------------------------
# Estimator construction and estimate().


@pytest.mark.parametrize("field", range(4), ids=["num_symbols", "context_length", "query_dim", "num_targets"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_estimator_bad_size(field, bad):
    names = ["num_symbols", "context_length", "query_dim", "num_targets"]
    sizes: list = [S, N, D, T]
    sizes[field] = bad
    with pytest.raises((TypeError, ValueError), match=rf"{names[field]} = {bad!r}: expected a positive integer"):
        ResponsibilityAttentionEstimator(*sizes)


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_estimator_estimate_sigma2_not_a_bool(bad):
    with pytest.raises(TypeError, match=rf"estimate_sigma2 = {bad!r}: expected True or False"):
        ResponsibilityAttentionEstimator(S, N, D, T, estimate_sigma2=bad)


@pytest.mark.parametrize("name", ["sigma2", "min_sigma2"])
@pytest.mark.parametrize("bad", [0.0, -1e-9, np.nan, np.inf])
def test_estimator_non_positive_variance(name, bad):
    with pytest.raises(ValueError, match=rf"{name} = .*: expected a finite number > 0"):
        ResponsibilityAttentionEstimator(S, N, D, T, **{name: bad})


@pytest.mark.parametrize("bad", [-1e-9, -1.0, np.nan, np.inf])
def test_estimator_bad_emission_smoothing(bad):
    with pytest.raises(ValueError, match=r"emission_smoothing = .*: expected a finite number >= 0"):
        ResponsibilityAttentionEstimator(S, N, D, T, emission_smoothing=bad)


@pytest.mark.parametrize("bad", [-1e-9, -1.0, np.nan, np.inf])
def test_estimator_bad_pseudo_count(bad):
    with pytest.raises(ValueError, match=r"pseudo_count = .*: expected a finite number >= 0"):
        ResponsibilityAttentionEstimator(S, N, D, T, pseudo_count=bad)


@pytest.mark.parametrize("name", ["emission_smoothing", "pseudo_count"])
@pytest.mark.parametrize("bad", ["abc", [1.0], True], ids=["str", "list", "bool"])
def test_estimator_smoothing_not_a_number(name, bad):
    with pytest.raises(TypeError, match=rf"{name}.*(number|real)"):
        ResponsibilityAttentionEstimator(S, N, D, T, **{name: bad})


def test_estimator_emission_smoothing_none_is_the_reference_default():
    assert ResponsibilityAttentionEstimator(S, N, D, T, emission_smoothing=None).emission_smoothing == 1e-6


def test_estimator_takes_additive_smoothing_or_a_prior_not_both():
    with pytest.raises(ValueError, match=r"emission_smoothing.*emission_prior.*not both"):
        ResponsibilityAttentionEstimator(S, N, D, T, emission_smoothing=0.1, emission_prior="continuation")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"emission_prior": "kneser"}, r"emission_prior = 'kneser': expected one of continuation, unigram, uniform"),
        ({"emission_prior": "unigram", "emission_strength": 0.0, "type_strength": 0.0}, r"both 0"),
        ({"emission_prior": "unigram", "emission_strength": -1.0}, r"emission_strength = -1.0"),
        ({"estimate_sigma2": True, "search": HyperparameterSearch()}, r"learned.*or chosen.*not both"),
        ({"search": HyperparameterSearch()}, r"needs an emission_prior"),
        ({"search": "grid"}, r"search must be a HyperparameterSearch"),
    ],
    ids=["kind", "no-strength", "negative", "learned-and-searched", "search-without-prior", "search-type"],
)
def test_estimator_prior_options_are_checked(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        ResponsibilityAttentionEstimator(S, N, D, T, **kwargs)


def test_an_unresolved_prior_names_what_it_needs():
    estimator = ResponsibilityAttentionEstimator(S, N, D, T, emission_prior="continuation")
    with pytest.raises(ValueError, match=r"made from the training rows' .* pairs: fit with fit_em"):
        estimator.estimate(None, good_statistics())


ESTIMATOR = ResponsibilityAttentionEstimator(S, N, D, T, estimate_sigma2=True)


def good_statistics():
    context, query, target, weights = clean_batch()
    accumulator = make_accumulator()
    accumulator.seq_update((context, query, target), weights, MODEL)
    return accumulator.value()


FIELD_SHAPES = {"key_sum": (S, D), "key_mass": (S,), "emission_count": (S, T), "position_count": (N,)}


@pytest.mark.parametrize("field", list(FIELD_SHAPES))
def test_estimate_statistics_of_wrong_shape(field):
    stats = good_statistics()
    want = FIELD_SHAPES[field]
    wrong = np.zeros(tuple(reversed(want)) if len(want) == 2 else (want[0] + 1,))
    pattern = rf"{field} has shape \({', '.join(map(str, wrong.shape))},?\): expected \({', '.join(map(str, want))},?\)"
    with pytest.raises(ValueError, match=pattern):
        ESTIMATOR.estimate(None, stats._replace(**{field: wrong}))


@pytest.mark.parametrize("field", ["key_mass", "emission_count", "position_count"])
def test_estimate_negative_masses_names_entry(field):
    stats = good_statistics()
    array = np.array(getattr(stats, field), order="C")
    index = (1,) if array.ndim == 1 else (3, 1)
    array[index] = -1.0
    array.reshape(-1)[-1] = -2.0
    where = ", ".join(map(str, index))
    with pytest.raises(ValueError, match=rf"{field}\[{where}\] = -1\.0.*expected non-negative"):
        ESTIMATOR.estimate(None, stats._replace(**{field: array}))


@pytest.mark.parametrize("field", ["key_mass", "emission_count", "position_count"])
def test_estimate_negative_masses_names_field(field):
    stats = good_statistics()
    array = np.array(getattr(stats, field), order="C")
    array.reshape(-1)[3] = -1.0
    with pytest.raises(ValueError, match=rf"{field} .*negative.*expected non-negative"):
        ESTIMATOR.estimate(None, stats._replace(**{field: array}))


@pytest.mark.parametrize("field", list(FIELD_SHAPES))
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_estimate_non_finite_statistics_names_entry(field, bad):
    stats = good_statistics()
    array = np.array(getattr(stats, field), order="C")
    index = (3,) if array.ndim == 1 else (3, 1)
    array[index] = bad
    where = ", ".join(map(str, index))
    with pytest.raises(ValueError, match=rf"{field}\[{where}\] = .*expected finite"):
        ESTIMATOR.estimate(None, stats._replace(**{field: array}))


def test_statistics_whose_sums_overflow_are_accepted():
    """The check sums each array first; huge finite counts (their sum overflows) pass, and nothing is changed."""
    from dist_respattn.model.heads.single_hop.accumulator import SufficientStatistics

    stats = good_statistics()
    huge = np.full((S, T), 1e308)
    key_sum = np.array(stats.key_sum)
    key_sum[3, 1] = -5.0  # key sums may be negative
    value = SufficientStatistics.checked(stats._replace(key_sum=key_sum, emission_count=huge), (S, N, D, T))
    assert np.array_equal(np.asarray(value.emission_count), huge)
    assert np.array_equal(value.key_sum, key_sum)


@pytest.mark.parametrize("field", list(FIELD_SHAPES))
def test_estimate_non_finite_statistics_names_field(field):
    stats = good_statistics()
    array = np.array(getattr(stats, field), order="C")
    array.reshape(-1)[3] = np.nan
    with pytest.raises(ValueError, match=rf"{field} .*non-finite"):
        ESTIMATOR.estimate(None, stats._replace(**{field: array}))


@pytest.mark.parametrize("estimate_sigma2", [False, True])
@pytest.mark.parametrize(
    "field, bad", [("query_sq", np.nan), ("query_sq", np.inf), ("query_sq", -1.0), ("n_obs", -1.0), ("n_obs", np.nan)]
)
def test_estimate_bad_scalar_statistics(estimate_sigma2, field, bad):
    stats = good_statistics()
    estimator = ResponsibilityAttentionEstimator(S, N, D, T, estimate_sigma2=estimate_sigma2)
    with pytest.raises(ValueError, match=rf"{field} = .*expected"):
        estimator.estimate(None, stats._replace(**{field: bad}))


@pytest.mark.parametrize("count", [0, 4, 6, 8])
def test_estimate_wrong_number_of_fields(count):
    stats = tuple(good_statistics())
    fields = (stats * 2)[:count]
    with pytest.raises(ValueError, match=rf"sufficient statistics have {count} fields: expected 7 \(or the reference"):
        ESTIMATOR.estimate(None, fields)


def test_estimate_not_a_tuple():
    with pytest.raises(TypeError, match=r"sufficient statistics must be a tuple"):
        ESTIMATOR.estimate(None, 3.0)


def test_combine_checks_like_estimate():
    stats = good_statistics()
    accumulator = make_accumulator()
    with pytest.raises(ValueError, match=rf"key_sum has shape \({S}, {D + 1}\): expected \({S}, {D}\)"):
        accumulator.combine(stats._replace(key_sum=np.zeros((S, D + 1))))
    assert accumulator.value().n_obs == 0.0


# --------------------------------------------------------------------------------------------
# sequence_windows / sequence_to_triples.

UNROLL = {"sequence_windows": sequence_windows, "sequence_to_triples": sequence_to_triples}


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_two_dimensional_tokens(fn):
    with pytest.raises(ValueError, match=r"tokens must be 1-dimensional, got shape \(2, 3\)"):
        UNROLL[fn]([[1, 2, 3], [4, 5, 6]], 2)


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_negative_token(fn):
    tokens = [1, 2, 3, 4, 0, 1, 2, -1, 3, -4, 1]
    with pytest.raises(ValueError, match=r"tokens\[7\] = -1: expected a non-negative token id"):
        UNROLL[fn](tokens, 2)
    with pytest.raises(ValueError, match=r"tokens\[7\] = -1: expected a token id in \[0, 5\)"):
        UNROLL[fn](tokens, 2, num_symbols=5)


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_token_too_large(fn):
    tokens = [1, 2, 3, 4, 0, 1, 2, 5, 3, 9, 1]
    with pytest.raises(ValueError, match=r"tokens\[7\] = 5: expected a token id in \[0, 5\)"):
        UNROLL[fn](tokens, 2, num_symbols=5)


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_fractional_tokens(fn):
    tokens = [1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 2.0, 2.5, 3.0, np.nan, 1.0]
    with pytest.raises(TypeError, match=r"tokens\[7\] = .*expected an integer id"):
        UNROLL[fn](tokens, 2)


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_bool_tokens(fn):
    with pytest.raises(TypeError, match=r"tokens holds booleans: expected integer ids"):
        UNROLL[fn]([True, False, True], 1)


@pytest.mark.parametrize("fn", list(UNROLL))
@pytest.mark.parametrize("bad", [0, -1])
def test_unroll_non_positive_context_length(fn, bad):
    with pytest.raises(ValueError, match=rf"context_length = {bad}: expected a positive integer"):
        UNROLL[fn]([1, 2, 3, 4], bad)


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_non_integer_context_length(fn):
    # int(2.5) == 2: a fractional window must be refused, not truncated.
    with pytest.raises((TypeError, ValueError), match=r"context_length = 2\.5: expected a positive integer"):
        UNROLL[fn]([1, 2, 3, 4], 2.5)


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_embeddings_with_too_few_rows_names_it(fn):
    tokens = [1, 2, 3, 4, 0, 1, 2, 5, 3, 9, 1]
    with pytest.raises(ValueError, match=r"embeddings has only 5 rows"):
        UNROLL[fn](tokens, 2, embeddings=np.zeros((5, 3)))


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_embeddings_with_too_few_rows_names_first_token(fn):
    # tokens[7] = 5 is the first id without an embedding row; the message should point at it.
    tokens = [1, 2, 3, 4, 0, 1, 2, 5, 3, 9, 1]
    with pytest.raises(ValueError, match=r"tokens\[7\] = 5.*embeddings has only 5 rows"):
        UNROLL[fn](tokens, 2, embeddings=np.zeros((5, 3)))


@pytest.mark.parametrize("fn", list(UNROLL))
def test_unroll_embeddings_not_a_matrix(fn):
    with pytest.raises(ValueError, match=r"embeddings must be a \(S, D\) matrix, got shape \(5,\)"):
        UNROLL[fn]([1, 2, 3], 1, embeddings=np.zeros(5))


# --------------------------------------------------------------------------------------------
# Sampler.


@pytest.mark.parametrize("bad", [-1, -100])
def test_sampler_negative_size(bad):
    sampler = MODEL.sampler(0)
    with pytest.raises(ValueError, match=rf"size = {bad}: expected a non-negative number of triples"):
        sampler.sample_arrays(bad)
    with pytest.raises(ValueError, match=rf"size = {bad}: expected a non-negative number of triples"):
        sampler.sample(bad)


def test_sampler_fractional_size():
    # int(2.5) == 2: a fractional size must be refused, not truncated.
    with pytest.raises((TypeError, ValueError), match=r"size = 2\.5: expected"):
        MODEL.sampler(0).sample_arrays(2.5)


# --------------------------------------------------------------------------------------------
# The offending value is printed as the user wrote it ("2500", "nan"), not as a NumPy repr
# ("np.int64(2500)", "np.float64(nan)").


def _seq_update_context():
    context, query, target, weights = clean_batch()
    context[FIRST, 2] = 2500
    make_accumulator().seq_update((context, query, target), weights, MODEL)


def _seq_update_target():
    context, query, target, weights = clean_batch()
    target[FIRST] = T
    make_accumulator().seq_update((context, query, target), weights, MODEL)


def _seq_update_query():
    context, query, target, weights = clean_batch()
    query[FIRST, 1] = np.nan
    make_accumulator().seq_update((context, query, target), weights, MODEL)


def _seq_update_weight():
    context, query, target, weights = clean_batch()
    weights[FIRST] = -1.0
    make_accumulator().seq_update((context, query, target), weights, MODEL)


def _predict_proba_context():
    context, query, _, _ = clean_batch()
    context[FIRST, 2] = 2500
    MODEL.predict_proba(context, query)


def _seq_encode_query():
    context, query, target, _ = clean_batch()
    query[FIRST, 1] = np.nan
    MODEL.dist_to_encoder().seq_encode(triples(context, query, target))


def _seq_encode_fractional_context():
    context, query, target, _ = clean_batch()
    context = context.astype(np.float64)
    context[FIRST, 1] = 2.5
    MODEL.dist_to_encoder().seq_encode(triples(context, query, target))


def _seq_encode_fractional_target():
    context, query, target, _ = clean_batch()
    target = target.astype(np.float64)
    target[FIRST] = 2.5
    MODEL.dist_to_encoder().seq_encode(triples(context, query, target))


def _tokens_fractional():
    sequence_windows([1.0, 2.0, 2.5], 1)


def _key_means_nan():
    keys = GOOD_KEYS.copy()
    keys[7, 2] = np.nan
    build(key_means=keys)


def _emission_negative():
    emission = GOOD_EMISSION.copy()
    emission[7, 1] = -0.5
    build(emission=emission)


def _emission_row_sum():
    emission = GOOD_EMISSION.copy()
    emission[7] *= 0.5
    build(emission=emission)


def _prior_negative():
    build(position_prior=[0.5, 0.5, 0.5, -0.5])


PLAIN_VALUE_CASES = [
    (_seq_update_context, r"context\[7, 2\] = 2500: expected a symbol id in \[0, 50\)"),
    (_seq_update_target, r"target\[7\] = 6: expected a target id in \[0, 6\)"),
    (_seq_update_query, r"query\[7, 1\] = nan: expected finite query values"),
    (_seq_update_weight, r"weights\[7\] = -1\.0: expected a finite, non-negative weight"),
    (_predict_proba_context, r"context\[7, 2\] = 2500: expected a symbol id in \[0, 50\)"),
    (_seq_encode_query, r"query\[7, 1\] = nan: expected finite query values"),
    (_seq_encode_fractional_context, r"context\[7, 1\] = 2\.5: expected an integer id"),
    (_seq_encode_fractional_target, r"target of triple 7 = 2\.5: expected an integer id"),
    (_tokens_fractional, r"tokens\[2\] = 2\.5: expected an integer id"),
    (_key_means_nan, r"key_means\[7, 2\] = nan: expected finite values"),
    (_emission_negative, r"emission\[7, 1\] = -0\.5: expected non-negative probabilities"),
    (_emission_row_sum, r"emission row 7 sums to 0\.(5|49)\d*: expected every row to sum to 1"),
    (_prior_negative, r"position_prior\[3\] = -0\.5: expected finite, non-negative probabilities"),
]


@pytest.mark.parametrize(
    "thunk, pattern", PLAIN_VALUE_CASES, ids=[c[0].__name__.lstrip("_") for c in PLAIN_VALUE_CASES]
)
def test_message_prints_the_plain_value(thunk, pattern):
    with pytest.raises((TypeError, ValueError), match=pattern):
        thunk()
