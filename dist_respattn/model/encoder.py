"""Turning triples and token sequences into the encoded arrays ``(context, query, target)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dist_respattn.model.arguments import as_positive_int, plain

__all__ = ["ResponsibilityAttentionDataEncoder", "sequence_to_triples", "sequence_windows"]


def _exact_int(value: Any, name: str) -> int:
    """``value`` as an int when it is an integer (or an integral float); else TypeError naming it."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} = {value!r}: expected an integer id, got a boolean")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise TypeError(f"{name} = {plain(value)}: expected an integer id")


def _ids_array(values: Any, name: str, ndim: int) -> np.ndarray:
    """An int64 array from integer-valued input, naming the first non-integer entry on failure."""
    try:
        raw = np.asarray(values)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name} rows have different lengths: expected one fixed length") from exc
    if raw.dtype.kind == "b":
        raise TypeError(f"{name} holds booleans: expected integer ids")
    if raw.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {raw.shape}")
    if raw.dtype.kind in "iu":
        return raw.astype(np.int64, copy=False)
    if raw.dtype.kind == "f":
        bad = np.argwhere(~np.isfinite(raw) | (raw != np.floor(raw)))
        if bad.size:
            where = ", ".join(str(int(v)) for v in bad[0])
            raise TypeError(f"{name}[{where}] = {plain(raw[tuple(bad[0])])}: expected an integer id")
        return raw.astype(np.int64)
    raise TypeError(f"{name} must hold integer ids, got dtype {raw.dtype}")


def _check_range(ids: np.ndarray, upper: int | None, name: str, what: str, why: str = "") -> None:
    bad = np.argwhere((ids < 0) | (ids >= upper)) if upper is not None else np.argwhere(ids < 0)
    if bad.size:
        where = ", ".join(str(int(v)) for v in bad[0])
        expected = f"a {what} id in [0, {upper})" if upper is not None else f"a non-negative {what} id"
        raise ValueError(f"{name}[{where}] = {int(ids[tuple(bad[0])])}: expected {expected}{why}")


def _check_row_shapes(rows: list[np.ndarray], name: str, symbol: str, length: int | None) -> None:
    """Name the first triple whose ``name`` is not a vector of ``length`` (or of triple 0's length)."""
    want = (length,) if length is not None else rows[0].shape
    for i, row in enumerate(rows):
        if row.ndim != 1 or row.shape != want:
            source = f", {symbol} = {length}" if length is not None else " like triple 0"
            raise ValueError(f"{name} of triple {i} has shape {row.shape}: expected {want}{source}")


class ResponsibilityAttentionDataEncoder:
    """Encodes a list of ``(context (N,), query (D,), target)`` triples into stacked arrays.

    Any of S, N, D, T left as ``None`` is not checked.
    """

    def __init__(
        self,
        num_symbols: int | None = None,
        context_length: int | None = None,
        query_dim: int | None = None,
        num_targets: int | None = None,
    ) -> None:
        self.num_symbols = num_symbols
        self.context_length = context_length
        self.query_dim = query_dim
        self.num_targets = num_targets

    def __repr__(self) -> str:
        return (
            f"ResponsibilityAttentionDataEncoder(S={self.num_symbols}, N={self.context_length}, "
            f"D={self.query_dim}, T={self.num_targets})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResponsibilityAttentionDataEncoder) and self._shape() == other._shape()

    def __hash__(self) -> int:
        return hash(self._shape())

    def _shape(self) -> tuple[int | None, ...]:
        return (self.num_symbols, self.context_length, self.query_dim, self.num_targets)

    def seq_encode(self, x: Sequence[tuple[Any, Any, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stack triples into ``context`` (n, N) int64, ``query`` (n, D) float64, ``target`` (n,) int64."""
        rows = list(x)
        for i, row in enumerate(rows):
            if not isinstance(row, (tuple, list)) or len(row) != 3:
                raise TypeError(f"triple {i} is {row!r}: expected a (context, query, target) triple")
        if not rows:
            n_pos = self.context_length or 0
            return (
                np.zeros((0, n_pos), dtype=np.int64),
                np.zeros((0, self.query_dim or 0)),
                np.zeros(0, dtype=np.int64),
            )
        contexts = [np.asarray(row[0]) for row in rows]
        queries = [np.asarray(row[1]) for row in rows]
        _check_row_shapes(contexts, "context", "N", self.context_length)
        _check_row_shapes(queries, "query", "D", self.query_dim)
        for i, c in enumerate(contexts):
            if c.dtype.kind == "b":
                raise TypeError(f"context of triple {i} holds booleans: expected integer ids")
        context = _ids_array(contexts, "context", 2)
        target = np.array([_exact_int(row[2], f"target of triple {i}") for i, row in enumerate(rows)], dtype=np.int64)
        try:
            query = np.asarray(queries, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError("queries must be real-valued vectors") from exc
        _check_range(context, self.num_symbols, "context", "symbol")
        _check_range(target, self.num_targets, "target", "target")
        non_finite = np.argwhere(~np.isfinite(query))
        if non_finite.size:
            bad_row, bad_col = (int(v) for v in non_finite[0])
            raise ValueError(
                f"query[{bad_row}, {bad_col}] = {plain(query[bad_row, bad_col])}: expected finite query values"
            )
        return context, query, target

    def row_count(self, x: tuple[np.ndarray, np.ndarray, np.ndarray]) -> int:
        """Number of triples in an encoded batch."""
        return int(np.asarray(x[0]).shape[0])


def sequence_windows(
    tokens: Any,
    context_length: int,
    *,
    num_symbols: int | None = None,
    embeddings: Any = None,
    query_dtype: Any = np.float64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unroll a token sequence into encoded arrays, with no Python loop per position.

    For each prediction point ``p`` with a full window behind it and a next token ahead
    (``N - 1 <= p < L - 1``): ``context = tokens[p-N+1 : p+1]`` (the N most recent tokens, the current
    one included), ``query = embeddings[tokens[p]]`` (or the one-hot of ``tokens[p]`` of dimension S),
    ``target = tokens[p+1]``.

    Args:
        tokens: (L,) integer ids.
        context_length: the window N >= 1.
        num_symbols: vocabulary size S; inferred as ``max(tokens) + 1`` when omitted.
        embeddings: optional (S', D) table with S' covering every token id.
        query_dtype: dtype of the returned queries.

    Returns:
        ``context`` (L-N, N) int64 (a copy, not a view of ``tokens``), ``query`` (L-N, D),
        ``target`` (L-N,) int64; empty arrays when ``L <= N``.
    """
    n_pos = as_positive_int(context_length, "context_length")
    tok = _ids_array(tokens, "tokens", 1)
    _check_range(tok, num_symbols, "tokens", "token")
    n_symbols = int(num_symbols) if num_symbols is not None else (int(tok.max()) + 1 if tok.size else 0)
    if embeddings is None:
        table = None
        dim = n_symbols
    else:
        table = np.asarray(embeddings, dtype=query_dtype)
        if table.ndim != 2:
            raise ValueError(f"embeddings must be a (S, D) matrix, got shape {table.shape}")
        _check_range(tok, table.shape[0], "tokens", "token", f": embeddings has only {table.shape[0]} rows")
        dim = table.shape[1]
    n_rows = max(tok.shape[0] - n_pos, 0)
    if n_rows == 0:
        return np.zeros((0, n_pos), dtype=np.int64), np.zeros((0, dim), dtype=query_dtype), np.zeros(0, dtype=np.int64)
    context = np.lib.stride_tricks.sliding_window_view(tok[:-1], n_pos).copy()
    current = tok[n_pos - 1 : -1]
    if table is None:
        query = np.zeros((n_rows, dim), dtype=query_dtype)
        query[np.arange(n_rows), current] = 1.0
    else:
        query = table[current]
    return context, query, tok[n_pos:].copy()


def sequence_to_triples(
    tokens: Sequence[int],
    context_length: int,
    *,
    num_symbols: int | None = None,
    embeddings: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Unroll a token sequence into a list of ``(context, query, target)`` triples.

    The triples are those of :func:`sequence_windows` (see it for the definition); use that
    function directly for large sequences, as it returns arrays without building tuples.
    """
    context, query, target = sequence_windows(tokens, context_length, num_symbols=num_symbols, embeddings=embeddings)
    return [(context[i], query[i], int(target[i])) for i in range(target.shape[0])]
