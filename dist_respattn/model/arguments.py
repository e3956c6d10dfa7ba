"""Argument checks shared by the model classes: each error names the argument, the row and what was expected."""

from __future__ import annotations

from typing import Any, NamedTuple

import numba
import numpy as np

from dist_respattn.model.kernels.emission_rows import pair_row_sums

__all__ = [
    "SIMPLEX_ATOL",
    "CheckedBatch",
    "ImpossibleEvidenceError",
    "as_encoded",
    "as_finite_matrix",
    "as_id_array",
    "as_nonnegative_float",
    "as_positive_float",
    "as_positive_int",
    "as_row_simplex",
    "as_simplex",
    "as_weights",
    "check_batch",
    "first_where",
    "kernel_ids",
    "nonfinite_free",
    "plain",
    "scan_values",
]

#: How far a probability vector's sum may stray from one (float32 inputs round at ~1e-7 per entry).
SIMPLEX_ATOL = 1e-6


class ImpossibleEvidenceError(ValueError):
    """Raised when a weighted row has zero probability under the model, so no posterior exists."""


def plain(value: Any) -> str:
    """``repr`` of a value with NumPy scalars shown as Python numbers (``2500``, not ``np.int64(2500)``)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def nonfinite_free(array: np.ndarray) -> bool:
    """Whether every entry of a float ``array`` is finite, in one pass that makes no temporary array.

    A sum is finite only when every term is (an infinity or a NaN never cancels back to a finite value), so a
    finite sum settles it; a sum that is not finite (an overflow of finite terms, or a bad entry) is checked entry
    by entry. The check on every model and every E-step's statistics, so it must not cost a mask and a search.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.add.reduce(array, axis=None)):
            return True
    return bool(np.isfinite(array).all())


def first_where(mask: np.ndarray) -> tuple[int, ...]:
    """The index of the first ``True`` entry of ``mask`` in C order (a caller has found there is one)."""
    return tuple(int(v) for v in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _as_real(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def as_positive_float(value: Any, name: str) -> float:
    """Return ``value`` as a finite float > 0, or raise naming ``name``."""
    result = _as_real(value, name)
    if not np.isfinite(result) or result <= 0.0:
        raise ValueError(f"{name} = {result!r}: expected a finite number > 0")
    return result


def as_nonnegative_float(value: Any, name: str) -> float:
    """Return ``value`` as a finite float >= 0, or raise naming ``name``."""
    result = _as_real(value, name)
    if not np.isfinite(result) or result < 0.0:
        raise ValueError(f"{name} = {result!r}: expected a finite number >= 0")
    return result


def as_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as an int >= 1; a bool or a non-integer is a TypeError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} = {value!r}: expected a positive integer")
    if value < 1:
        raise ValueError(f"{name} = {value!r}: expected a positive integer")
    return int(value)


def as_finite_matrix(value: Any, name: str, *, shape: tuple[int | None, int | None] = (None, None)) -> np.ndarray:
    """Return ``value`` as a C-contiguous float64 matrix with every entry finite.

    ``shape`` entries that are not ``None`` are required exactly.
    """
    try:
        result = np.array(value, dtype=np.float64, order="C")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real-valued matrix") from exc
    if result.ndim != 2:
        raise ValueError(f"{name} must be two-dimensional, got shape {result.shape}")
    for axis, (got, want) in enumerate(zip(result.shape, shape, strict=True)):
        if want is not None and got != want:
            raise ValueError(f"{name} has shape {result.shape}: expected {want} along axis {axis}")
    if result.size == 0:
        raise ValueError(f"{name} is empty (shape {result.shape}): expected at least one row and column")
    if not nonfinite_free(result):
        i, j = first_where(~np.isfinite(result))
        raise ValueError(f"{name}[{i}, {j}] = {plain(result[i, j])}: expected finite values")
    return result


def as_row_simplex(value: Any, name: str) -> np.ndarray:
    """Return a float64 matrix whose rows are probability vectors (non-negative, summing to one)."""
    result = as_finite_matrix(value, name)
    if float(result.min()) < 0.0:  # finite by now, so the least entry tells
        i, j = first_where(result < 0.0)
        raise ValueError(f"{name}[{i}, {j}] = {plain(result[i, j])}: expected non-negative probabilities")
    sums = result.sum(axis=1)
    off = np.flatnonzero(np.abs(sums - 1.0) > SIMPLEX_ATOL)
    if off.size:
        i = int(off[0])
        raise ValueError(f"{name} row {i} sums to {plain(sums[i])}: expected every row to sum to 1")
    return result


def as_simplex(value: Any, name: str) -> np.ndarray:
    """Return a float64 probability vector (non-negative, summing to one)."""
    try:
        result = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real-valued vector") from exc
    if result.ndim != 1 or result.size == 0:
        raise ValueError(f"{name} must be a non-empty vector, got shape {result.shape}")
    bad = np.flatnonzero(~np.isfinite(result) | (result < 0.0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {plain(result[i])}: expected finite, non-negative probabilities")
    total = float(result.sum())
    if abs(total - 1.0) > SIMPLEX_ATOL:
        raise ValueError(f"{name} sums to {total!r}: expected 1")
    return result


def as_id_array(value: Any, name: str, ndim: int) -> np.ndarray:
    """``value`` as an integer array of ``ndim`` dimensions (not copied); other dtypes are a TypeError."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array of ids, got dtype {array.dtype}")
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {array.shape}")
    return array


def as_encoded(
    x: Any,
    *,
    context_length: int,
    query_dim: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check the shapes and dtypes of an encoded batch ``(context, query, target)``.

    Returns the arrays without copying. Values (id ranges, finiteness) are :func:`scan_values`' part
    (:func:`check_batch` does both), one compiled pass, so a huge batch is never copied or masked whole.

    Shapes: ``context`` (n, N) integer, ``query`` (n, D) float, ``target`` (n,) integer.
    """
    try:
        context, query, target = x
    except (TypeError, ValueError) as exc:
        raise TypeError("an encoded batch must be the triple (context, query, target) of arrays") from exc
    context = as_id_array(context, "context", 2)
    target = as_id_array(target, "target", 1)
    query = np.asarray(query)
    if query.dtype not in (np.float32, np.float64):
        raise TypeError(f"query must be a float32 or float64 array, got dtype {query.dtype}")
    if query.ndim != 2:
        raise ValueError(f"query must be two-dimensional (n, D), got shape {query.shape}")
    n = context.shape[0]
    if context.shape[1] != context_length:
        raise ValueError(
            f"context has shape {context.shape}: expected (n, {context_length}) for context length N={context_length}"
        )
    if query.shape[1] != query_dim:
        raise ValueError(f"query has shape {query.shape}: expected (n, {query_dim}) for query dimension D={query_dim}")
    for other_name, other in (("query", query), ("target", target)):
        if other.shape[0] != n:
            raise ValueError(f"{other_name} has {other.shape[0]} rows but context has {n}: expected one row per triple")
    return context, query, target


def as_weights(weights: Any, n: int) -> np.ndarray | None:
    """Return ``weights`` as an ``(n,)`` array (its values are :func:`scan_values`' part), or ``None``."""
    if weights is None:
        return None
    array = np.asarray(weights)
    if array.dtype.kind not in "fiu" or array.dtype.kind == "b":
        raise TypeError(f"weights must be a real-valued array, got dtype {array.dtype}")
    if array.ndim == 0:
        raise ValueError(f"weights must be an array of shape ({n},), got a scalar")
    if array.shape != (n,):
        raise ValueError(f"weights has shape {array.shape}: expected ({n},), one weight per triple")
    return array


#: Pairs a block in :func:`as_sparse_emission`: its temporaries stay ~20 MB whatever the support's size, so reading a
#: head (e.g. the driver joining a sharded fit's last checkpoint) costs the head's own arrays and little more.
_CHECK_BLOCK_PAIRS = 1 << 20


def as_sparse_emission(value: Any, name: str) -> Any:
    """Check a :class:`~dist_respattn.model.emission.layouts.SparseEmission`: finite non-negative values,
    rows summing to 1. The (P,) values are read a block of pairs at a time (no temporary the size of the support)."""
    support = value.support
    num_pairs = int(value.values.shape[0])
    blocks = [(start, min(num_pairs, start + _CHECK_BLOCK_PAIRS)) for start in range(0, num_pairs, _CHECK_BLOCK_PAIRS)]
    for part, array, spans in (
        ("values", value.values, blocks),
        ("backoff", value.backoff, [(0, value.backoff.shape[0])]),
        ("base", value.base, [(0, value.base.shape[0])]),
    ):
        for start, stop in spans:
            block = array[start:stop]
            bad = np.flatnonzero(~np.isfinite(block) | (block < 0.0))
            if bad.size:
                i = start + int(bad[0])
                raise ValueError(f"{name} {part}[{i}] = {plain(array[i])}: expected finite, non-negative probabilities")
    # One pass over the support's rows (a target each): the pairs' targets known without a search (a
    # SparseEmission's arrays have its support's shapes, checked when it was made).
    sums, stored_base = pair_row_sums(
        np.asarray(value.values, dtype=np.float64),
        np.asarray(value.base, dtype=np.float64),
        support.indptr,
        support.symbols,
        support.num_symbols,
    )
    sums += value.backoff * (float(value.base.sum()) - stored_base)
    off = np.flatnonzero(np.abs(sums - 1.0) > SIMPLEX_ATOL)
    if off.size:
        i = int(off[0])
        raise ValueError(f"{name} row {i} sums to {plain(sums[i])}: expected every row to sum to 1")
    return value


# --------------------------------------------------------------------------------------------
# The values of an encoded batch, in one compiled pass (no temporaries the size of the batch).

_OK, _BAD_CONTEXT, _BAD_TARGET, _BAD_QUERY, _BAD_WEIGHT = 0, 1, 2, 3, 4


@numba.njit(cache=True, nogil=True)
def _scan_block_numba(context, query, target, weights, num_symbols, num_targets):  # pragma: no cover - compiled
    """First bad value in row order: ``(code, row, column)``; ``code == 0`` when the block is clean."""
    n, n_pos = context.shape
    dim = query.shape[1]
    for row in range(n):
        for i in range(n_pos):
            c = context[row, i]
            if c < 0 or c >= num_symbols:
                return _BAD_CONTEXT, row, i
        tn = target[row]
        if tn < 0 or tn >= num_targets:
            return _BAD_TARGET, row, 0
        for d in range(dim):
            if not np.isfinite(query[row, d]):
                return _BAD_QUERY, row, d
        if weights.shape[0] > 0:
            w = weights[row]
            if not np.isfinite(w) or w < 0.0:
                return _BAD_WEIGHT, row, 0
    return _OK, -1, -1


def _raise_scan_error(code: int, row: int, col: int, context, query, target, weights, num_symbols, num_targets):
    if code == _BAD_CONTEXT:
        raise ValueError(
            f"context[{row}, {col}] = {plain(context[row, col])}: expected a symbol id in [0, {num_symbols})"
        )
    if code == _BAD_TARGET:
        raise ValueError(f"target[{row}] = {plain(target[row])}: expected a target id in [0, {num_targets})")
    if code == _BAD_QUERY:
        raise ValueError(f"query[{row}, {col}] = {plain(query[row, col])}: expected finite query values")
    raise ValueError(f"weights[{row}] = {plain(weights[row])}: expected a finite, non-negative weight")


_NO_WEIGHTS = np.zeros(0)


def scan_values(
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    weights: np.ndarray | None,
    *,
    num_symbols: int,
    num_targets: int,
) -> None:
    """Raise a ``ValueError`` naming the first bad value in row order; one pass, no temporaries.

    Checks: context ids in [0, S), target ids in [0, T), finite queries, finite non-negative weights.
    """
    w = _NO_WEIGHTS if weights is None else weights.astype(np.float64, copy=False)
    code, row, col = _scan_block_numba(context, query, target, w, num_symbols, num_targets)
    if code != _OK:
        _raise_scan_error(code, row, col, context, query, target, weights, num_symbols, num_targets)


class CheckedBatch(NamedTuple):
    """An encoded batch whose shapes, dtypes and values :func:`check_batch` has checked (nothing copied).

    Attributes:
        context: (n, N) integer ids in [0, S).
        query: (n, D) float32 or float64, finite.
        target: (n,) integer ids in [0, T).
        weights: (n,) finite and non-negative, or ``None`` (every row weighs 1).
    """

    context: np.ndarray
    query: np.ndarray
    target: np.ndarray
    weights: np.ndarray | None


def check_batch(
    x: Any,
    weights: Any = None,
    *,
    num_symbols: int,
    context_length: int,
    query_dim: int,
    num_targets: int,
    values_checked: bool = False,
) -> CheckedBatch:
    """Check an encoded batch ``(context (n, N), query (n, D), target (n,))`` and its weights (n,) or ``None``
    against a head of S symbols, context length N, query dimension D and T targets.

    The one input check of the model layer (the accumulator, the distribution, scoring, the held-out grid and
    in-process EM all call it): shapes and dtypes (:func:`as_encoded`, :func:`as_weights`), then every value in
    row order (:func:`scan_values`). The error names the array, the row (and column) and what was expected.

    ``values_checked`` skips the scan of the values (the shapes and dtypes are still checked): for rows whose
    maker has checked them already, as a token-stream store does (its ids are checked as they are read, its
    queries are rows of its checked embedding table). The scan costs about a tenth of the E-step's own time.

    The ids come back as :func:`kernel_ids` (C-ordered int32: no copy of a store's rows, one of int64 arrays).
    """
    context, query, target = as_encoded(x, context_length=context_length, query_dim=query_dim)
    w = as_weights(weights, context.shape[0])
    if not values_checked:
        scan_values(context, query, target, w, num_symbols=num_symbols, num_targets=num_targets)
    return CheckedBatch(kernel_ids(context), query, kernel_ids(target), w)


def kernel_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` (contexts (n, N) or targets (n,), checked to lie in [0, S) or [0, T)) as the compiled kernels take
    them: C-ordered int32, the dtype a store reads. A kernel compiles once for each combination of its arguments'
    types, so int64 arrays would build (and cache) every kernel a second time; they are copied instead (after
    the check: a cast first could wrap an id out of range into it)."""
    return np.ascontiguousarray(ids, dtype=np.int32)
