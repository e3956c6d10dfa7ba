"""The attention log-weights of a row over its N context positions, defined once (``l_ni`` of docs/math.md).

For a row with context ``c_1..c_N``, query ``y`` (D,) and, when it is seen, target ``t``::

    l_i = log pi_i + log B[c_i, t] - ||y - K[c_i]||^2 / (2 sigma2)

without the Gaussian normalizer ``-D/2 log(2 pi sigma2)``, which is the same for every position (the
callers add it to the row's log-likelihood). The E-step's responsibilities are ``softmax(l)``; the
predictive gate, the target unseen, is the same expression with ``log B[c_i, t] = 0``.

Two implementations of that one expression, beside each other and held equal by
``tests/model/test_log_weights.py``: :func:`row_log_weights`, compiled, one row at a time, called by every
compiled kernel (the E-steps, the row log-likelihoods, held-out scoring, top-K prediction; the dense E-step
through :func:`row_log_weights_at`, the same loop on a row of its batch's scratch arrays, the sparse E-step through
:func:`span_log_weights`, the same loop on a row's span of a token array), and
:func:`block_log_weights`, vectorized NumPy over a block, called by the NumPy backend and the
distribution's attention. Both compute ``(log pi_i + log B) - d_i / (2 sigma2)`` in that order.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = [
    "EXP_MIN",
    "LN2_HI",
    "LN2_LO",
    "LOG2E",
    "NO_ROWS",
    "attention_of",
    "block_log_weights",
    "exp_nonpositive",
    "exp_nonpositive_n",
    "exp_nonpositive_range",
    "exp_reduced",
    "exp_shifted",
    "exp_shifted_into",
    "keep_row",
    "log_positive_range",
    "row_log_weights",
    "row_log_weights_at",
    "span_log_weights",
    "squared_distance",
    "squared_distance_at",
]

#: The per-row output of a scoring kernel when none is asked for: (0, 2).
NO_ROWS = np.zeros((0, 2))


# Reassociation lets LLVM vectorize the sum (4x faster at D = 32). The order of the partial sums then
# depends on the vector width the host CPU offers: results are bit-identical on machines of one
# instruction set, and agree to ~1e-16 relative across instruction sets.
@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def squared_distance(y, key_means, c):  # pragma: no cover - compiled
    """``||y - K[c]||^2`` of a query ``y`` (D,) float64 and the key of symbol ``c``."""
    total = 0.0
    for d in range(y.shape[0]):
        a = y[d] - key_means[c, d]
        total += a * a
    return total


# The same loop as squared_distance's, so the same sum to the bit.
@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def squared_distance_at(ys, m, key_means, c):  # pragma: no cover - compiled
    """``||ys[m] - K[c]||^2``: :func:`squared_distance` of row ``m`` of a 2-D array of queries.

    Without the array view ``ys[m]``: in compiled code each view costs two atomic reference-count updates, and
    an atomic update waits for every store before it (in the E-step, a row's whole scatter) to complete."""
    total = 0.0
    for d in range(ys.shape[1]):
        a = ys[m, d] - key_means[c, d]
        total += a * a
    return total


@numba.njit(cache=True, nogil=True)
def row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, out, gate):  # pragma: no cover - compiled
    """``out[i] = log pi_i + out[i] - ||y - K[c_i]||^2 / (2 sigma2)`` for row ``row`` of ``context`` (n, N);
    returns ``max_i out[i]`` (``-inf`` when no position is possible).

    On entry ``out`` (N,) holds the row's emission log-probabilities ``log B[c_i, t]`` (whatever the
    emission's layout, the caller looks them up, all N before this arithmetic so that their cache misses
    overlap), or zeros for the predictive gate. ``y`` is the row's query, (D,) float64.

    ``gate`` (N,), unless it is empty (``out[:0]``: a view, no allocation), also receives the row's
    predictive gate ``log pi_i - ||y - K[c_i]||^2 / (2 sigma2)`` from the same distances: held-out
    scoring needs both the joint (with the seen target) and the attention (without it).
    """
    with_gate = gate.shape[0] > 0
    best = -np.inf
    for i in range(context.shape[1]):
        distance = squared_distance(y, key_means, context[row, i]) * inv_two_sigma2
        if with_gate:
            gate[i] = log_prior[i] - distance
        li = log_prior[i] + out[i] - distance
        out[i] = li
        best = max(best, li)
    return best


# Inlined into its caller: a call would pass every array as a dozen fields on the stack, once a row.
@numba.njit(cache=True, nogil=True, inline="always")
def span_log_weights(tokens, base, y, key_means, log_prior, inv_two_sigma2, out):  # pragma: no cover - compiled
    """:func:`row_log_weights` without a gate, of the row whose N symbols are ``tokens[base : base + N]`` (a token
    window where it lies, or a row of an (n, N) context array seen as one token array): the same expression."""
    best = -np.inf
    for i in range(log_prior.shape[0]):
        distance = squared_distance(y, key_means, tokens[base + i]) * inv_two_sigma2
        li = log_prior[i] + out[i] - distance
        out[i] = li
        best = max(best, li)
    return best


# Inlined into its caller: a call would pass every array as a dozen fields on the stack, once a row.
@numba.njit(cache=True, nogil=True, inline="always")
def row_log_weights_at(symbols, ys, m, key_means, log_prior, inv_two_sigma2, out, at):  # pragma: no cover
    """:func:`row_log_weights` without a gate, for kernels that hold a batch of rows in flat scratch arrays: the
    row's N symbols are ``symbols[at : at + N]``, its query row ``m`` of ``ys``, its log-weights
    ``out[at : at + N]``. The same expression, without the array views ``ys[m]`` and ``out[at:]`` (see
    :func:`squared_distance_at`); unsigned ``symbols`` index without numba's check for a negative index."""
    best = -np.inf
    for i in range(log_prior.shape[0]):
        distance = squared_distance_at(ys, m, key_means, symbols[at + i]) * inv_two_sigma2
        li = log_prior[i] + out[at + i] - distance
        out[at + i] = li
        best = max(best, li)
    return best


LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * LN2_HI is exact for |k| < 2**20
LN2_LO = 1.90821492927058770002e-10
EXP_MIN = -708.0  # below this exp underflows past the normal range; those terms are set to 0


@numba.njit(cache=True, nogil=True, inline="always")
def exp_reduced(r):  # pragma: no cover - compiled
    """``exp(r)`` on ``|r| <= ln2/2``: a degree-13 Taylor polynomial (error < 1e-17)."""
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    return p * r + 1.0


@numba.njit(cache=True, nogil=True)
def exp_nonpositive(x, out, bits):  # pragma: no cover - compiled
    """``out[i] = exp(x[i])`` for ``x[i] <= 0`` (``-inf`` gives 0), to ~1 ulp.

    libm's ``exp`` is a scalar call (~10 ns); this branch-free version (Cody-Waite reduction and a
    degree-13 Taylor polynomial, error < 1e-17 on |r| <= ln2/2) vectorizes across the N positions.
    ``bits`` is an int64 scratch array of the same length, viewed as float64 to build ``2**k``.
    """
    exp_nonpositive_n(x, out, bits, bits.view(np.float64), x.shape[0])


@numba.njit(cache=True, nogil=True)
def exp_nonpositive_n(x, out, bits, scale, size):  # pragma: no cover - compiled
    """:func:`exp_nonpositive` of the first ``size`` values of ``x``, ``scale`` being ``bits.view(np.float64)``:
    a kernel calling it row after row makes that view (and its slices) once instead of each time."""
    exp_nonpositive_range(x, 0, out, 0, size, bits, scale)


@numba.njit(cache=True, nogil=True, inline="always")
def exp_nonpositive_range(x, x0, out, o0, n, bits, scale):  # pragma: no cover - compiled
    """``out[o0 + i] = exp(x[x0 + i])`` for ``i < n``, as :func:`exp_nonpositive` (the same numbers), on 1-d
    arrays at offsets: no slice is made (a kernel's views of its scratch cost a row more than the exponentials
    do). ``bits`` is int64 scratch of at least ``n`` and ``scale`` its float64 view (``bits.view(np.float64)``)."""
    for i in range(n):
        v = max(x[x0 + i], EXP_MIN)
        k = np.floor(v * LOG2E + 0.5)
        r = (v - k * LN2_HI) - k * LN2_LO
        out[o0 + i] = exp_reduced(r)
        bits[i] = (np.int64(k) + 1023) << 52
    for i in range(n):
        out[o0 + i] = out[o0 + i] * scale[i] if x[x0 + i] >= EXP_MIN else 0.0


# fdlibm's e_log.c, its polynomial and its two ways of adding up, without its branches. Its notice:
#   Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
#   Developed at SunPro, a Sun Microsystems, Inc. business.
#   Permission to use, copy, modify, and distribute this software is freely granted, provided that this notice
#   is preserved.
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_SMALLEST_NORMAL = 2.2250738585072014e-308
_TWO54 = 18014398509481984.0
# fdlibm sums the last terms another way for mantissas in (1 + 0x6147a/2^20, 1 + 0x6b851/2^20), near sqrt(2): after
# the reduction to [sqrt(1/2), sqrt(2)), the reduced mantissas from these two bounds on (exact in float64).
_OTHER_SUM_FROM = 1.0 + 0x6147B / 2.0**20
_OTHER_SUM_BELOW = (1.0 + 0x6B851 / 2.0**20) / 2.0


# error_model="numpy": the division is then one instruction (no check for a zero divisor, never zero here), so the
# loops vectorize.
@numba.njit(cache=True, nogil=True, error_model="numpy")
def log_positive_range(x, out, n, bits, scale):  # pragma: no cover - compiled
    """``out[i] = log(x[i])`` for ``x[i] > 0`` and ``-inf`` otherwise (0, negative, NaN), for ``i < n``, within 1 ulp
    of the correctly rounded logarithm (subnormal ``x`` and ``inf`` included).

    libm's ``log`` is a scalar call (~3.5 ns); this is fdlibm's algorithm (``x = 2^k m``, ``m`` in [sqrt(1/2),
    sqrt(2)), ``log m = 2 atanh(f / (2 + f))`` with ``f = m - 1`` by a degree-14 polynomial in ``s = f / (2 + f)``,
    error < 1 ulp) without branches, in three loops that vectorize across ``x``. ``bits`` is int64 scratch of at
    least ``n`` and ``scale`` its float64 view (``bits.view(np.float64)``); ``x``, ``out`` and ``bits`` distinct.
    """
    for i in range(n):
        v = x[i]
        scale[i] = v * _TWO54 if v < _SMALLEST_NORMAL else v  # subnormals made normal (k less 54 below)
    for i in range(n):
        b = bits[i]
        hx = (b >> 32) & 0xFFFFF
        j = (hx + 0x95F64) & 0x100000  # the mantissa at or past sqrt(2): halved, k one more
        k = ((b >> 52) & 0x7FF) - 1023 + (j >> 20) - (54 if x[i] < _SMALLEST_NORMAL else 0)
        bits[i] = ((hx | (j ^ 0x3FF00000)) << 32) | (b & 0xFFFFFFFF)
        out[i] = np.float64(k)
    for i in range(n):
        v = x[i]
        m = scale[i]
        dk = out[i]
        f = m - 1.0
        s = f / (2.0 + f)
        z = s * s
        w = z * z
        r = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7))) + w * (_LG2 + w * (_LG4 + w * _LG6))
        hfsq = 0.5 * f * f
        near_sqrt2 = (m >= _OTHER_SUM_FROM) | (m < _OTHER_SUM_BELOW)
        if near_sqrt2:
            y = dk * LN2_HI - ((hfsq - (s * (hfsq + r) + dk * LN2_LO)) - f)
        else:
            y = dk * LN2_HI - ((s * (f - r) - dk * LN2_LO) - f)
        y = y if v < np.inf else np.inf
        out[i] = y if v > 0.0 else -np.inf


@numba.njit(cache=True, nogil=True)
def exp_shifted(logw, best, out, bits):  # pragma: no cover - compiled
    """``out = exp(logw - best)`` (``logw`` is shifted in place); returns ``sum(out)``.

    With ``best = max(logw)`` this is the softmax numerator of the log-weights: the responsibilities are
    ``out / sum``, the row's log-likelihood ``best + log(sum)`` plus the Gaussian normalizer.
    """
    return exp_shifted_into(logw, best, out, bits, bits.view(np.float64))


@numba.njit(cache=True, nogil=True)
def exp_shifted_into(logw, best, out, bits, scale):  # pragma: no cover - compiled
    """:func:`exp_shifted` with ``scale = bits.view(np.float64)`` made once by the caller (see
    :func:`exp_nonpositive_n`)."""
    for i in range(logw.shape[0]):
        logw[i] -= best
    exp_nonpositive_n(logw, out, bits, scale, logw.shape[0])
    total = 0.0
    for i in range(out.shape[0]):
        total += out[i]
    return total


@numba.njit(cache=True, nogil=True)
def keep_row(per_row, row, log_query, log_target):  # pragma: no cover - compiled
    """``per_row[row] = (log p(query | window), log p(target | window, query))`` when the scoring kernel was asked
    for its rows (``per_row`` (n, 2)); nothing when ``per_row`` is :data:`NO_ROWS`."""
    if per_row.shape[0] > 0:
        per_row[row, 0] = log_query
        per_row[row, 1] = log_target


@numba.njit(cache=True, nogil=True)
def attention_of(log_weights, out, bits):  # pragma: no cover - compiled
    """``out = softmax(log_weights)`` (N,) (``log_weights`` is shifted in place); ``bits`` is int64 scratch of N."""
    best = -np.inf
    for i in range(log_weights.shape[0]):
        best = max(best, log_weights[i])
    total = exp_shifted(log_weights, best, out, bits)
    for i in range(out.shape[0]):
        out[i] /= total


def block_log_weights(
    context: np.ndarray,
    query: np.ndarray,
    key_means: np.ndarray,
    log_prior: np.ndarray,
    inv_two_sigma2: float,
    log_emission: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`row_log_weights` of a block of rows, vectorized: (n, N) float64.

    Args:
        context: (n, N) symbol ids; ``query``: (n, D) float32 or float64 (widened to float64).
        key_means: (S, D) float64; ``log_prior``: (N,) ``log pi``; ``inv_two_sigma2``: ``1 / (2 sigma2)``.
        log_emission: (n, N) ``log B[c_ni, t_n]``, or ``None`` for the predictive gate.

    Memory: two (n, N, D) float64 temporaries (the gathered keys and their differences from the queries).
    """
    y = query.astype(np.float64, copy=False)
    diff = y[:, None, :] - key_means[context]
    sq = np.einsum("nid,nid->ni", diff, diff)
    prior = np.broadcast_to(log_prior[None, :], sq.shape)
    return (prior if log_emission is None else prior + log_emission) - sq * inv_two_sigma2
