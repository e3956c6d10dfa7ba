"""One definition of a row's log-weights: every path that computes them (or the responsibilities, attention and
log-likelihoods built on them) agrees with the others and with the formula, to 1e-12.

The paths: the compiled E-step (dense and sparse emission) and the NumPy backend, the row log-likelihood
(``seq_log_density``, both layouts), held-out scoring (both layouts), the distribution's attention (with and
without the target) and top-K prediction (both layouts). Each is run on the same rows of one head, its
emission stored both ways (the sparse one over the rows' pairs and a few more, the dense one its exact copy).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.model.emission.layouts import DenseEmission, SparseEmission
from dist_respattn.model.heads.single_hop.scoring import score_rows
from dist_respattn.model.heads.single_hop.top_k import predict_top_k
from dist_respattn.model.kernels import per_position
from dist_respattn.model.kernels.log_weights import (
    block_log_weights,
    log_positive_range,
    row_log_weights,
    span_log_weights,
)
from tests.model.emission_layouts import support_of

# (S, N, D, T): ordinary, S < N (repeated symbols in a context), N = 1.
SHAPES = [(12, 4, 3, 7), (3, 6, 2, 5), (10, 1, 5, 6)]
ROWS = 24
TOL = 1e-12


def heads(shape, seed):
    """Rows ``(context, query, target)``, their weights (some 0) and one head with a sparse and a dense emission."""
    truth = random_distribution(*shape, seed=seed, key_scale=1.5, sigma2=0.7)
    context, query, target = truth.sampler(seed + 1).sample_arrays(ROWS)
    rng = np.random.default_rng(seed + 2)
    weights = rng.uniform(0.2, 3.0, size=ROWS)
    weights[::5] = 0.0
    model = random_distribution(*shape, seed=seed + 3, key_scale=1.5, sigma2=1.3)
    # The sparse emission holds every pair the rows hold (its E-step needs them) and a random third of the rest.
    cells = rng.uniform(size=(shape[0], shape[3])) < 1.0 / 3.0
    cells[context, target[:, None]] = True
    sparse = model.with_emission(SparseEmission.from_dense(model.emission, support_of(cells)))
    dense = model.with_emission(DenseEmission(sparse.emission))
    return (context, query, target), weights, dense, sparse


def formula(data, model):
    """docs/math.md's E-step in float64 NumPy: ``l`` (n, N) without the Gaussian normalizer, the gate, ``L`` (n,)."""
    context, query, target = data
    y = query.astype(np.float64)
    distance = ((y[:, None, :] - model.key_means[context]) ** 2).sum(axis=2) / (2.0 * model.sigma2)
    gate = np.log(model.position_prior)[None, :] - distance
    log_w = gate + np.log(model.emission[context, target[:, None]])
    normalizer = -model.query_dim / 2.0 * np.log(2.0 * np.pi * model.sigma2)
    return log_w, gate, np.logaddexp.reduce(log_w, axis=1) + normalizer


def softmax(log_w):
    e = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def assert_close(actual, expected, label):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = np.maximum(np.abs(expected), 1.0)
    error = float(np.max(np.abs(actual - expected) / scale))
    assert error <= TOL, f"{label}: differs from the formula by {error:.3g} (> {TOL:g})"


@numba.njit(cache=True)
def _compiled_rows(context, query, log_emission, key_means, log_prior, inv_two_sigma2, out, gate):
    y = np.empty(query.shape[1])
    for row in range(context.shape[0]):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        out[row] = log_emission[row]
        row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, out[row], gate[row])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))
def test_compiled_and_vectorized_log_weights_are_the_formula(shape):
    data, _, dense, _ = heads(shape, seed=sum(shape))
    context, query, target = data
    expected_log_w, expected_gate, _ = formula(data, dense)
    params = dense.kernel_parameters
    log_emission = params.log_emission_ts[target[:, None], context]
    log_w, gate = np.empty(context.shape), np.empty(context.shape)
    _compiled_rows(context, query, log_emission, params.key_means, params.log_prior, params.inv_two_sigma2, log_w, gate)
    assert_close(log_w, expected_log_w, "row_log_weights")
    assert_close(gate, expected_gate, "row_log_weights' gate")
    args = (context, query, params.key_means, params.log_prior, params.inv_two_sigma2)
    assert_close(block_log_weights(*args, log_emission), expected_log_w, "block_log_weights")
    assert_close(block_log_weights(*args), expected_gate, "block_log_weights without an emission")


def estep_rows(model, data, weights, backend):
    """Each weighted row's responsibilities (N,) and log-likelihood through the E-step, one row at a time."""
    context, query, target = data
    S, N, D, T = model.num_symbols, model.context_length, model.query_dim, model.num_targets
    support = model.emission_table.support if isinstance(model.emission_table, SparseEmission) else None
    resp, loglik = np.full(context.shape, np.nan), np.full(context.shape[0], np.nan)
    for row in range(context.shape[0]):
        stats = per_position.StatisticArrays.zeros(S, N, D, T, support)
        one = slice(row, row + 1)
        w = weights[one]
        per_position.accumulate_estep(
            context[one], query[one], target[one], w, model.kernel_parameters, stats, backend=backend
        )
        if w[0] == 0.0:
            assert not stats.position_count.any() and stats.scalars[2] == 0.0, f"row {row} of weight 0 counted"
            continue
        resp[row], loglik[row] = stats.position_count / w[0], stats.scalars[2] / w[0]
    return resp, loglik


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))
def test_every_path_gives_the_same_responsibilities_attention_and_log_likelihood(shape):
    data, weights, dense, sparse = heads(shape, seed=7 * sum(shape))
    context, query, target = data
    log_w, gate, loglik = formula(data, dense)
    resp, attention = softmax(log_w), softmax(gate)
    weighted = weights > 0.0

    for name, model, backend in (("dense", dense, "numba"), ("dense", dense, "numpy"), ("sparse", sparse, "numba")):
        got_resp, got_loglik = estep_rows(model, data, weights, backend)
        assert_close(got_resp[weighted], resp[weighted], f"E-step responsibilities ({name}, {backend})")
        assert_close(got_loglik[weighted], loglik[weighted], f"E-step log-likelihood ({name}, {backend})")

    for name, model in (("dense", dense), ("sparse", sparse)):
        assert_close(model.seq_log_density(data), loglik, f"seq_log_density ({name})")
        assert_close(model.attention_weights(context, query, target), resp, f"posterior attention ({name})")
        assert_close(model.attention_weights(context, query), attention, f"predictive attention ({name})")
        assert_close(predict_top_k(model, context, query, 2).attention, attention, f"top-K attention ({name})")
        predictive = np.einsum("ni,nit->nt", attention, dense.emission[context])
        for row in range(ROWS):
            one = slice(row, row + 1)
            totals = score_rows(model, (context[one], query[one], target[one]), weights[one])
            if weights[row] > 0.0:
                assert_close(totals.log_lik / weights[row], loglik[row], f"scored log-likelihood ({name}, row {row})")
                assert_close(
                    totals.target_log_prob / weights[row],
                    np.log(predictive[row, target[row]]),
                    f"scored target log-probability ({name}, row {row})",
                )
            else:
                assert totals.log_lik == 0.0 and totals.weight == 0.0, f"scored row {row} of weight 0 counted"


@numba.njit(cache=True)
def _span_rows(tokens, begin, query, log_emission, key_means, log_prior, inv_two_sigma2, out):
    y = np.empty(query.shape[1])
    for row in range(begin.shape[0]):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        out[row] = log_emission[row]
        span_log_weights(tokens, begin[row], y, key_means, log_prior, inv_two_sigma2, out[row])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-N{}-D{}-T{}".format(*s))
def test_a_span_of_tokens_gives_the_rows_log_weights_to_the_bit(shape):
    """The sparse E-step's log-weights of a row read where it lies in a token array: row_log_weights' numbers."""
    rows, _, model, _ = heads(shape, seed=11)
    context, query, _ = rows
    n, n_pos = context.shape
    rng = np.random.default_rng(5)
    log_emission = np.log(rng.uniform(0.01, 1.0, size=(n, n_pos)))
    # The rows' windows at scattered places of one token array, other tokens between them.
    begin = np.arange(n, dtype=np.int64) * (n_pos + 3) + 2
    tokens = rng.integers(0, shape[0], size=int(begin[-1]) + n_pos + 5).astype(np.int32)
    for r in range(n):
        tokens[begin[r] : begin[r] + n_pos] = context[r]
    params = model.kernel_parameters
    want, got = np.empty((n, n_pos)), np.empty((n, n_pos))
    gate = np.empty((n, n_pos))
    y = np.ascontiguousarray(query, dtype=np.float64)
    _compiled_rows(context, y, log_emission, params.key_means, params.log_prior, params.inv_two_sigma2, want, gate)
    _span_rows(tokens, begin, y, log_emission, params.key_means, params.log_prior, params.inv_two_sigma2, got)
    assert np.array_equal(want, got)


# ------------------------------------------------------------------------------------------- the vectorized logarithm


def _log_of(x: np.ndarray, n: int | None = None) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.full(x.size, 7.0)
    bits = np.empty(x.size, dtype=np.int64)
    log_positive_range(x, out, x.size if n is None else n, bits, bits.view(np.float64))
    return out


def test_the_vectorized_log_is_within_one_ulp_of_math_log_over_every_float():
    rng = np.random.default_rng(11)
    # Every binade of the normal floats (each exponent, 64 random mantissas, and its first and last mantissas), the
    # subnormals (random ones, each power of two, the largest), and mantissas about 1, about sqrt(2) (where the
    # mantissa is halved) and about the bounds where the last terms are summed another way.
    exponents = np.repeat(np.arange(1, 2047, dtype=np.int64), 66)
    mantissas = rng.integers(0, 1 << 52, exponents.size)
    mantissas[::66], mantissas[1::66] = 0, (1 << 52) - 1
    normal = ((exponents << 52) | mantissas).view(np.float64)
    subnormal = np.concatenate([
        rng.integers(1, 1 << 52, 20_000), 1 << np.arange(52, dtype=np.int64), [(1 << 52) - 1],
    ]).view(np.float64)  # fmt: skip
    edges = np.array([1.0, math.sqrt(2.0), math.sqrt(0.5), 1.0 + 0x6147B / 2**20, 1.0 + 0x6B851 / 2**20])
    steps = np.arange(-300, 301)
    near = np.concatenate([e + steps * np.spacing(e) for e in edges])
    near = np.concatenate([near * 2.0**k for k in (-1000, -1, 0, 1, 1000)])
    x = np.concatenate([normal, subnormal, near, rng.uniform(0.0, 1.0, 50_000)])
    x = x[x > 0.0]
    assert np.any(x < 2.2250738585072014e-308) and np.isfinite(x).all()
    got = _log_of(x)
    want = np.array([math.log(v) for v in x])
    error = np.abs(got - want)
    assert np.all(error <= np.spacing(np.abs(want))), float(np.max(error / np.spacing(np.abs(want))))
    assert got[x == 1.0].tolist() == [0.0] * int(np.sum(x == 1.0))


def test_the_vectorized_log_of_zero_negatives_nan_and_inf():
    x = np.array([0.0, -0.0, -1e-300, -5.0, -np.inf, np.nan, np.inf, 5e-324, 1.7976931348623157e308])
    got = _log_of(x)
    assert got[:6].tolist() == [-np.inf] * 6  # as ``math.log(v) if v > 0.0 else -inf``
    assert got[6] == np.inf
    assert got[7] == math.log(5e-324) and got[8] == math.log(1.7976931348623157e308)
    # Only the first n values are written.
    assert _log_of(np.array([2.0, 3.0, 4.0]), 2)[2] == 7.0
