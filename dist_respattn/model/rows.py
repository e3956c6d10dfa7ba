"""Row batches the model reads: encoded rows (full context arrays) and token windows (spans of one token array).

The stores hand their blocks over as these; they are plain arrays, so the model needs nothing of the stores'.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["EncodedRows", "WindowArrays", "WindowRows", "split_query_table"]

#: The weights of rows that all weigh 1, as the window kernels take them.
_NO_WEIGHTS = np.zeros(0, dtype=np.float64)
#: The empty query tables of :func:`split_query_table`: the float64 one beside a float32 table, and the reverse.
_NO_WIDE_TABLE = np.zeros((0, 0))
_NO_NARROW_TABLE = np.zeros((0, 0), dtype=np.float32)


class WindowArrays(NamedTuple):
    """:class:`WindowRows` in the kernels' dtypes (:meth:`WindowRows.kernel_arrays`); unpacked into a kernel's first
    seven arguments."""

    tokens: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    target: np.ndarray
    query_table: np.ndarray
    query_index: np.ndarray
    weight: np.ndarray


class EncodedRows(NamedTuple):
    """A run of consecutive rows of a store, as the model's encoded arrays.

    ``context`` (n, N) int32, ``query`` (n, D) float32/64, ``target`` (n,) int32, ``weight`` (n,) float32
    or ``None``; ``start`` is the store row of the first one. ``checked``: the store has checked every
    value already (ids in range, finite queries, finite non-negative weights), so the model need not scan
    them again (a token-stream store's rows: ids checked as read, queries from its checked table).
    """

    context: np.ndarray
    query: np.ndarray
    target: np.ndarray
    weight: np.ndarray | None
    start: int
    checked: bool = False

    @property
    def num_rows(self) -> int:
        return int(self.target.shape[0])

    @property
    def encoded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(context, query, target)``, as the accumulator's ``seq_update`` takes it."""
        return self.context, self.query, self.target


class WindowRows(NamedTuple):
    """Rows given as spans of one token array.

    Attributes:
        tokens: (L,) symbol ids (any integer dtype), checked to lie in [0, S).
        begin, end: (n,) int64: row ``r``'s window is ``tokens[begin[r]:end[r]]``, oldest first (at most N
            tokens, at least one; fewer than N is a short history, the missing positions masked).
        target: (n,) ids in [0, T).
        query_table: (V, D) float32/64; ``query_index`` (n,) int64: row ``r``'s query is
            ``query_table[query_index[r]]`` (a stream store's embedding table and previous tokens, or a triple
            store's own query rows).
        weight: (n,) float32/64 or ``None`` (every row weighs 1).
        start: the store row of the first row.
        checked: every value is known good (ids in range, finite queries, finite non-negative weights).
    """

    tokens: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    target: np.ndarray
    query_table: np.ndarray
    query_index: np.ndarray
    weight: np.ndarray | None
    start: int
    checked: bool = False

    @property
    def num_rows(self) -> int:
        return int(self.target.shape[0])

    @classmethod
    def from_encoded(
        cls,
        context: np.ndarray,
        query: np.ndarray,
        target: np.ndarray,
        weight: np.ndarray | None = None,
        start: int = 0,
        checked: bool = False,
    ) -> WindowRows:
        """Full windows from an encoded batch ``(context (n, N), query (n, D), target (n,))``: views, no copy
        of the contexts (a C-ordered context array is already one token array of n spans of N)."""
        n, n_pos = context.shape
        ends = np.arange(1, n + 1, dtype=np.int64) * n_pos
        return cls(
            np.ascontiguousarray(context).reshape(-1),
            ends - n_pos,
            ends,
            target,
            query,
            np.arange(n, dtype=np.int64),
            weight,
            start,
            checked,
        )

    def kernel_arrays(self, *, narrow_queries: bool = False) -> WindowArrays:
        """The rows as the compiled window kernels take them, one dtype an array: ``tokens`` (L,) int32, ``begin``,
        ``end`` (n,) int64, ``target`` (n,) int64, ``query_table`` (V, D) float64, ``query_index`` (n,) int64 and
        ``weight`` (n,) float64, or (0,) when every row weighs 1.

        A kernel compiles once for each combination of its arguments' types, so rows from a uint8 or uint16
        stream, an int32 triple store and int64 test arrays would each compile (and cache) every kernel again;
        cast here, they share one build. So does a float32 query table (a store's own, the default), copied to
        float64 exactly (every float32 is a float64): a stream's (V, D) embedding table, or a triple store's block
        of queries (8 D bytes a row, beside the E-step's microsecond a row). ``narrow_queries`` hands a float32
        table over as it is, for the kernels that read it at half the cache lines and are built for both widths
        (the single head's E-step, the chain of hops' beside an empty float64 table). No other cast copies more
        than a block's tokens and ids.
        """
        weight = _NO_WEIGHTS if self.weight is None else np.asarray(self.weight, dtype=np.float64)
        table = self.query_table
        return WindowArrays(
            np.ascontiguousarray(self.tokens, dtype=np.int32),  # ids checked to lie in [0, S), S < 2**31
            np.ascontiguousarray(self.begin, dtype=np.int64),
            np.ascontiguousarray(self.end, dtype=np.int64),
            np.ascontiguousarray(self.target, dtype=np.int64),
            np.ascontiguousarray(table) if narrow_queries else np.ascontiguousarray(table, dtype=np.float64),
            np.ascontiguousarray(self.query_index, dtype=np.int64),
            np.ascontiguousarray(weight),
        )

    def select(self, rows: np.ndarray | slice) -> WindowRows:
        """The rows ``rows`` (an index or a boolean mask), sharing the token array and the query table."""
        weight = None if self.weight is None else self.weight[rows]
        return self._replace(
            begin=self.begin[rows], end=self.end[rows], target=self.target[rows],
            query_index=self.query_index[rows], weight=weight,
        )  # fmt: skip

    def check(self, num_symbols: int, num_targets: int, context_length: int, query_dim: int) -> None:
        """Raise a ValueError naming the first bad row, unless the rows come ``checked``."""
        if self.checked:
            return
        lengths = self.end - self.begin
        bad = np.flatnonzero((lengths < 1) | (lengths > context_length) | (self.begin < 0))
        if bad.size:
            r = int(bad[0])
            raise ValueError(f"row {r}: a window of {int(lengths[r])} tokens: expected 1 to N = {context_length}")
        if self.end.size and int(self.end.max()) > self.tokens.shape[0]:
            raise ValueError(f"a window ends past the {self.tokens.shape[0]} tokens given")
        if self.tokens.size and (int(self.tokens.min()) < 0 or int(self.tokens.max()) >= num_symbols):
            i = int(np.flatnonzero((self.tokens < 0) | (self.tokens >= num_symbols))[0])
            raise ValueError(f"token {i} = {int(self.tokens[i])}: expected a symbol id in [0, {num_symbols})")
        if self.target.size and (int(self.target.min()) < 0 or int(self.target.max()) >= num_targets):
            r = int(np.flatnonzero((self.target < 0) | (self.target >= num_targets))[0])
            raise ValueError(f"row {r}: target {int(self.target[r])}: expected an id in [0, {num_targets})")
        if self.query_table.ndim != 2 or self.query_table.shape[1] != query_dim:
            raise ValueError(f"query table of shape {self.query_table.shape}: expected (V, {query_dim})")
        # A table no larger than the rows' queries, every row of it in reach, is checked whole (one pass, no gather of
        # n rows: a tenth of the time at 300,000 rows of their own queries); else, or when it holds a non-finite
        # number, the rows' queries are gathered and the first bad row named.
        index, n_table = self.query_index, self.query_table.shape[0]
        whole = (
            0 < index.shape[0]
            and n_table <= index.shape[0]
            and int(index.min()) >= 0
            and int(index.max()) < n_table
            and bool(np.isfinite(self.query_table).all())
        )
        if not whole:
            finite = np.isfinite(self.query_table[self.query_index]).all(axis=1)
            if not finite.all():
                r = int(np.flatnonzero(~finite)[0])
                raise ValueError(f"row {r}: its query holds a non-finite value: expected finite numbers")
        if self.weight is not None:
            w = np.asarray(self.weight)
            bad = np.flatnonzero(~(np.isfinite(w) & (w >= 0.0)))
            if bad.size:
                r = int(bad[0])
                raise ValueError(f"row {r}: weight {w[r]}: expected a finite, non-negative weight")


def split_query_table(arrays: WindowArrays) -> tuple[WindowArrays, np.ndarray]:
    """``(arrays, narrow)`` for a kernel built once for both query widths that reads a float32 table in place: a
    float32 table as ``narrow`` (the kernel widens each value as it reads it, exactly, as the float64 copy of
    :meth:`WindowRows.kernel_arrays` would give), ``arrays``' own table then (0, 0); any other as float64, ``narrow``
    (0, 0). No copy of a triple store's block of queries (8 D bytes a row: at 300,000 sampled rows of D = 32,
    3-4% of the conjunction E-step's time), whose rows the kernel then fetches at half the cache lines."""
    table = arrays.query_table
    if table.dtype == np.float32:
        # (A read-only table is copied: numba would build the kernel again for its type.)
        return arrays._replace(query_table=_NO_WIDE_TABLE), table if table.flags.writeable else table.copy()
    return arrays._replace(query_table=np.ascontiguousarray(table, dtype=np.float64)), _NO_NARROW_TABLE
