"""Token-stream stores: the token ids themselves, with the windows made by each reader, block by block.

A triple store of a token corpus spends N ids and a D-float query on every row (~130 bytes a token
at N = 8, D = 32); the stream itself is 2 bytes a token. A stream store is one zarr v3 group::

    tokens           uint8/16/32 (L,)   the smallest unsigned type that holds S ids
    document_starts  int64 (n_docs,)    the first token of each document, strictly increasing from 0
    weight           float32 (L,)       optional: the weight of the row whose target is that token
    document_attribute  int32 (n_docs,)  optional: each document's attribute id in [0, A) (who wrote it)
    token_attribute  int32 (L,)         optional, instead: the attribute of the row whose target is that token
    embeddings       float32 (S, D)     the table queries are looked up in
    vocabulary/                         for text: the tokens, as the attributes of a group

Its rows are the windows of :func:`~dist_respattn.model.encoder.sequence_windows`, document by
document: the row whose target is token ``j`` has ``context = tok[j-N : j]``, ``query = E[tok[j-1]]``
and ``target = tok[j]``, and exists when its N context tokens lie in ``j``'s own document. Rows are
numbered in token order, so N, the window, is a reader's choice (``fit --context N``; the store
records a default). Token chunks and shards (``chunk_tokens``, ``partition_tokens``) cut the rows:
partition ``k`` is the rows whose target lies in shard ``k``, and a reader fetches the N tokens
before a block along with it, so every task reads its own shard and at most the previous chunk.

Attributes (:mod:`~dist_respattn.store.attributes`) are optional: a store with them records their names
(``attribute_names``, A strings) and ``attribute_level`` (``document`` or ``token``) in its group attribute,
and :meth:`TokenStreamStore.read_attributes` gives the attribute of any rows it reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import zarr

from dist_respattn.model.rows import EncodedRows, WindowRows
from dist_respattn.store.attributes import (
    ATTRIBUTE_LEVELS,
    appended_names,
    checked_writer_names,
    describe_attributes,
    names_problem,
)
from dist_respattn.store.checks import Problem
from dist_respattn.store.documents import require_rows
from dist_respattn.store.errors import (
    IncompleteStoreError,
    SchemaMismatchError,
    StoreCorruptError,
    StoreError,
    store_exists,
)
from dist_respattn.store.identity import corpus_identity
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.lock import StoreLock, StoreLocked, live_writer, remove_partials
from dist_respattn.store.not_a_store import not_a_store
from dist_respattn.store.schema import ATTRIBUTE_KEY, SCHEMA_NAME, STREAM_SCHEMA_NAME, StoreSchema, StoreState
from dist_respattn.store.triple_store import (
    Partition,
    array_summary,
    named_metadata_errors,
    open_group_at,
    shard_key,
)
from dist_respattn.store.windows import make_windows, target_positions

__all__ = [
    "STREAM_SCHEMA_NAME",
    "StreamWriter",
    "TokenStreamStore",
    "is_stream_group",
    "rollback_stream_append",
    "token_dtype",
    "validate_stream",
]

STREAM_SCHEMA_VERSION = 1

#: Tokens per chunk (a block read: 2 MiB of uint16) and per shard (one partition, one task).
DEFAULT_CHUNK_TOKENS = 1 << 20
DEFAULT_CHUNKS_PER_PARTITION = 4
#: Document starts per chunk: an append rewrites only the last chunk or two.
_STARTS_CHUNK = 1 << 16
#: The array that holds a stream's attributes, by ``attribute_level``.
_ATTRIBUTE_ARRAYS = {"document": "document_attribute", "token": "token_attribute"}
#: The arrays with an entry per token, chunked and sharded alike.
_TOKEN_ARRAYS = ("tokens", "weight", "token_attribute")


def token_dtype(num_symbols: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds ids in [0, S)."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if num_symbols - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"num_symbols = {num_symbols}: more than uint32 ids")


def is_stream_group(attributes: dict[str, Any]) -> bool:
    return attributes.get("schema") == STREAM_SCHEMA_NAME


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The row numbering of a stream for one window N (arrays over the documents, in memory on every reader).

    ``starts`` (n_docs,) first tokens, ``rows`` (n_docs,) windows per document, ``row_starts`` (n_docs + 1,)
    the first row of each document.
    """

    starts: np.ndarray
    rows: np.ndarray
    row_starts: np.ndarray
    context_length: int
    num_tokens: int

    @classmethod
    def of(cls, starts: np.ndarray, num_tokens: int, context_length: int) -> _Rows:
        """Rows whose targets have at least ``context_length`` earlier tokens in their document (the window N,
        or the fewest a short history may have)."""
        ends = np.append(starts[1:], num_tokens)
        rows = np.maximum(ends - starts - context_length, 0)
        row_starts = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(rows, out=row_starts[1:])
        return cls(starts, rows, row_starts, context_length, num_tokens)

    @property
    def num_rows(self) -> int:
        return int(self.row_starts[-1])

    def rows_before(self, token: int) -> int:
        """How many rows have their target before token position ``token``."""
        if token >= self.num_tokens:
            return self.num_rows
        d = int(np.searchsorted(self.starts, token, side="right")) - 1
        inside = min(max(token - int(self.starts[d]) - self.context_length, 0), int(self.rows[d]))
        return int(self.row_starts[d]) + inside

    def positions(self, start: int, stop: int) -> np.ndarray:
        """The target token of rows ``[start, stop)``: (n,) int64."""
        return target_positions(self.starts, self.row_starts, self.context_length, start, stop)


class TokenStreamStore:
    """A complete stream store, opened for reading with a window N (default: the one it records).

    It reads like a :class:`~dist_respattn.store.TripleStore` (``schema``, ``num_rows``, partitions,
    ``iter_blocks``, ``fingerprint``, ``identity``) and pickles as its location and N.
    """

    kind = "stream"

    def __init__(self, location: StoreLocation, group: Any, attributes: dict[str, Any], context_length: int) -> None:
        # The location carries the window, so a worker reopening it reads the same rows.
        self.location = location.with_window(int(context_length))
        self._group = group
        self.attributes = attributes
        self.num_tokens = int(attributes["tokens"])
        self.chunk_tokens = int(attributes["chunk_tokens"])
        self.partition_tokens = int(attributes["partition_tokens"])
        self.schema = StoreSchema(
            int(attributes["num_symbols"]),
            int(context_length),
            int(attributes["query_dim"]),
            int(attributes["num_symbols"]),
            str(attributes.get("query_dtype", "float32")),
            bool(attributes.get("has_weight", False)),
        )
        self._tokens = group["tokens"]
        self._weight = group["weight"] if self.schema.has_weight else None
        self._table = np.asarray(group["embeddings"][...], dtype=np.dtype(self.schema.query_dtype))
        self._table_checked = False
        starts = np.asarray(group["document_starts"][...], dtype=np.int64)
        problem = _starts_problem(starts, self.num_tokens)
        if problem is not None:
            raise StoreCorruptError(f"{location}: {problem}")
        min_context = int(context_length) if location.min_context is None else int(location.min_context)
        if not 1 <= min_context <= int(context_length):
            raise ValueError(
                f"--min-context {min_context} with a window of N = {context_length}: expected 1 to N earlier tokens"
            )
        #: Rows have at least this many earlier tokens; with fewer than N, the missing positions are masked.
        self.min_context = min_context
        self.location = self.location.with_min_context(None if min_context == int(context_length) else min_context)
        self._rows = _Rows.of(starts, self.num_tokens, min_context)
        self.num_rows = self._rows.num_rows
        # Blocks of rows are those of one token chunk; for a caller that sizes buffers by chunk_rows.
        self.chunk_rows = self.chunk_tokens
        self.partition_rows = self.partition_tokens
        self._verified_shards: set[tuple[str, int]] = set()
        self._identity: dict[str, str | None] | None = None
        #: The attribute names (``None``: the store has no attributes) and what one id belongs to (``document``
        #: or ``token``; ``None`` without attributes).
        self._attribute_names: tuple[str, ...] | None = None
        self.attribute_level: str | None = None
        names = attributes.get("attribute_names")
        if names is not None:
            level = attributes.get("attribute_level")
            problem = names_problem(names)
            if problem is None and level not in ATTRIBUTE_LEVELS:
                problem = f"attribute attribute_level = {level!r}: expected one of {', '.join(ATTRIBUTE_LEVELS)}"
            if problem is not None:
                raise StoreCorruptError(f"{location}: {problem}")
            self._attribute_names = tuple(names)
            self.attribute_level = str(level)
        self._document_attribute: np.ndarray | None = None  # read on first use

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | StoreLocation,
        context_length: int | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
    ) -> TokenStreamStore:
        location = StoreLocation.of(url, storage_options)
        group = open_group_at(location)
        attributes = dict(group.attrs.get(ATTRIBUTE_KEY) or {})
        if not is_stream_group(attributes):
            if attributes.get("schema") != SCHEMA_NAME:
                raise not_a_store(location)
            raise StoreError(f"{location}: not a token-stream store (attribute schema {attributes.get('schema')!r})")
        if int(attributes.get("schema_version", 0)) > STREAM_SCHEMA_VERSION:
            raise StoreError(
                f"{location}: stream format version {attributes['schema_version']} is newer than this release"
            )
        if attributes.get("state") == StoreState.APPENDING:
            writer = live_writer(location)
            if writer is not None:  # not interrupted: still being appended to, and repair would be refused
                raise StoreLocked(f"{location}: not complete yet: {writer}")
            raise IncompleteStoreError(
                f"{location}: state 'appending': an append did not finish; `dist-respattn repair {location}` "
                "rolls it back to its committed tokens"
            )
        if attributes.get("state") != StoreState.COMPLETE:
            raise IncompleteStoreError(
                f"{location}: state {attributes.get('state')!r}: its writer did not finish; "
                "write it again (the same command with --overwrite)"
            )
        if context_length is None:
            context_length = location.window
        n = int(attributes["context_length"]) if context_length is None else int(context_length)
        if n < 1:
            raise ValueError(f"context_length = {n}: expected a positive window")
        with named_metadata_errors(location):
            return cls(location, group, attributes, n)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (TokenStreamStore.open, (self.location, self.schema.context_length))

    def __repr__(self) -> str:
        s = self.schema
        return (
            f"TokenStreamStore({str(self.location)!r}, tokens={self.num_tokens}, rows={self.num_rows}, "
            f"S={s.num_symbols}, N={s.context_length}, D={s.query_dim}, partitions={self.num_partitions})"
        )

    def with_context(self, context_length: int, min_context: int | None = None) -> TokenStreamStore:
        """The same stream read with another window N (rows with at least ``min_context`` earlier tokens: N by
        default, full windows only)."""
        return TokenStreamStore(
            self.location.with_min_context(min_context), self._group, self.attributes, context_length
        )

    @property
    def short_histories(self) -> bool:
        """Whether some rows may have fewer than N earlier tokens (they are read as token windows only)."""
        return self.min_context < self.schema.context_length

    # -- partitions -------------------------------------------------------------------------

    @property
    def num_partitions(self) -> int:
        return max(-(-self.num_tokens // self.partition_tokens), 1)

    def partitions(self) -> list[Partition]:
        return [self.partition(i) for i in range(self.num_partitions)]

    def partition(self, index: int) -> Partition:
        """The rows whose target lies in token shard ``index`` (possibly none: a shard of document heads)."""
        if not 0 <= index < self.num_partitions:
            raise IndexError(f"{self.location}: partition {index} out of range [0, {self.num_partitions})")
        first = index * self.partition_tokens
        return Partition(index, self._rows.rows_before(first), self._rows.rows_before(first + self.partition_tokens))

    def _check_shard_present(self, name: str, array: Any, shard: int) -> None:
        """A missing shard reads as zeros in zarr; refuse it by name instead (checked once per array and shard)."""
        if (name, shard) in self._verified_shards:
            return
        fs, root = self.location.filesystem()
        key = shard_key(array, name, shard)
        first = shard * self.partition_tokens
        span = f"tokens {first}..{min(first + self.partition_tokens, self.num_tokens) - 1}"
        try:
            size = int(fs.info(f"{root}/{key}")["size"])
        except FileNotFoundError:
            raise StoreCorruptError(
                f"{self.location}: array '{name}' shard {shard} ({span}): file '{key}' is missing"
            ) from None
        if size == 0:
            raise StoreCorruptError(f"{self.location}: array '{name}' shard {shard} ({span}): file '{key}' is empty")
        self._verified_shards.add((name, shard))

    def _read(self, name: str, array: Any, start: int, stop: int) -> np.ndarray:
        for shard in range(start // self.partition_tokens, max(stop - 1, start) // self.partition_tokens + 1):
            self._check_shard_present(name, array, shard)
        try:
            return array[start:stop]
        except Exception as exc:
            chunk = start // self.chunk_tokens
            raise StoreCorruptError(
                f"{self.location}: array '{name}' chunk {chunk} (tokens {start}..{stop - 1}) cannot be read "
                f"(a truncated or damaged shard?): {type(exc).__name__}: {exc}"
            ) from exc

    def read_rows(self, start: int, stop: int) -> EncodedRows:
        """Rows ``[start, stop)``: their windows made from the tokens they span and the N tokens before."""
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        return self._rows_at(self._rows.positions(start, stop), start)

    def read_selected(self, start: int, stop: int, selected: np.ndarray) -> EncodedRows:
        """The rows of ``[start, stop)`` where ``selected`` (stop - start,) bool is true, in row order.

        Only the tokens from the first selected row's window to the last selected target are read and only
        the selected windows are made (a hold-out's stripes, say). ``start`` of the result is ``start``.
        """
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        return self._rows_at(self._rows.positions(start, stop)[np.asarray(selected, dtype=bool)], start)

    def _rows_at(self, pos: np.ndarray, start: int) -> EncodedRows:
        """The rows whose targets are the increasing token positions ``pos`` (n,), labelled from store row ``start``."""
        n_pos = self.schema.context_length
        s = self.schema
        if self.short_histories:
            raise StoreError(
                f"{self.location}: read with --min-context {self.min_context} < N = {n_pos}: rows with fewer than N "
                "earlier tokens have no (n, N) window; they are read as token windows (read_windows), which the "
                "histogram kernel of a head with --position-buckets takes"
            )
        if pos.shape[0] == 0:
            return EncodedRows(
                np.zeros((0, n_pos), np.int32), np.zeros((0, s.query_dim), s.query_dtype), np.zeros(0, np.int32),
                np.zeros(0, np.float32) if s.has_weight else None, start,
            )  # fmt: skip
        first, last = int(pos[0]) - n_pos, int(pos[-1]) + 1
        span = self._checked_span(first, last)
        local = pos - first
        context, query, target = make_windows(span, local, n_pos, self._checked_table())
        weight = self._checked_weights(first, last, local)
        # Every value is checked now (ids above, queries through the table, weights): the model need not scan them.
        return EncodedRows(context, query, target, weight, start, checked=True)

    def read_windows(self, start: int, stop: int, selected: np.ndarray | None = None) -> WindowRows:
        """Rows ``[start, stop)`` (those where ``selected`` holds, when given) as token windows: the tokens they
        span and the N before (never before the first document's start), each row's window ``[begin, end)`` in
        them (cut at its document's start: a short history), its target and its query's row of the embedding
        table (the previous token). No (n, N) or (n, D) array is made."""
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        pos = self._rows.positions(start, stop)
        if selected is not None:
            pos = pos[np.asarray(selected, dtype=bool)]
        s = self.schema
        table = self._checked_table()
        if pos.shape[0] == 0:
            empty = np.zeros(0, dtype=np.int64)
            return WindowRows(
                np.zeros(0, np.int64), empty, empty, empty, table, empty,
                np.zeros(0, np.float32) if s.has_weight else None, start, True,
            )  # fmt: skip
        first, last = max(int(pos[0]) - s.context_length, 0), int(pos[-1]) + 1
        span = self._checked_span(first, last)
        starts = self._rows.starts
        doc_start = starts[np.searchsorted(starts, pos, side="right") - 1]
        end = pos - first
        begin = np.maximum(np.maximum(doc_start, pos - s.context_length) - first, 0)
        weight = self._checked_weights(first, last, end)
        target = span[end].astype(np.int64)
        query_index = span[end - 1].astype(np.int64)
        return WindowRows(span, begin, end, target, table, query_index, weight, start, True)

    def iter_windows(self, part: Partition | int, block_rows: int | None = None) -> Iterator[WindowRows]:
        """A partition's rows as token windows, by token chunk (or ``block_rows`` rows at a time)."""
        for begin, end in self.block_ranges(part, block_rows):
            yield self.read_windows(begin, end)

    def _checked_span(self, first: int, last: int) -> np.ndarray:
        """Tokens ``[first, last)``, every id checked to lie in ``[0, S)`` (a bad one is named by its position)."""
        s = self.schema
        span = self._read("tokens", self._tokens, first, last)
        bad = np.flatnonzero(span >= s.num_symbols)
        if bad.size:
            i = int(bad[0])
            raise StoreCorruptError(
                f"{self.location}: array 'tokens' position {first + i} = {int(span[i])}: expected a token id in "
                f"[0, {s.num_symbols}) ({bad.size} bad ids in tokens {first}..{last - 1}); "
                "`dist-respattn validate` lists them"
            )
        return span

    def _checked_weights(self, first: int, last: int, local: np.ndarray) -> np.ndarray | None:
        """The weights of the targets at ``first + local`` (``None`` for an unweighted store), checked finite and
        non-negative."""
        if self._weight is None:
            return None
        weight = self._read("weight", self._weight, first, last)[local]
        bad = np.flatnonzero(~(np.isfinite(weight) & (weight >= 0.0)))
        if bad.size:
            i = int(bad[0])
            raise StoreCorruptError(
                f"{self.location}: array 'weight' position {first + int(local[i])} = {weight[i]}: expected a "
                "finite, non-negative weight; `dist-respattn validate` lists every bad value"
            )
        return weight

    def _checked_table(self) -> np.ndarray:
        """The embedding table (S, D), checked finite once per opened store (queries are its rows)."""
        if not self._table_checked:
            bad = np.argwhere(~np.isfinite(self._table))
            if bad.size:
                row, col = (int(v) for v in bad[0])
                raise StoreCorruptError(
                    f"{self.location}: array 'embeddings' entry [{row}, {col}] = {self._table[row, col]}: expected "
                    "finite embeddings; `dist-respattn validate` lists every bad value"
                )
            self._table_checked = True
        return self._table

    def iter_blocks(self, part: Partition | int, block_rows: int | None = None) -> Iterator[EncodedRows]:
        """A partition's rows by token chunk (or ``block_rows`` rows at a time)."""
        for begin, end in self.block_ranges(part, block_rows):
            yield self.read_rows(begin, end)

    def block_ranges(self, part: Partition | int, block_rows: int | None = None) -> list[tuple[int, int]]:
        """The ``(start, stop)`` rows of the blocks :meth:`iter_blocks` reads, without reading them."""
        part = self.partition(part) if isinstance(part, int) else part
        if block_rows is not None:
            step = int(block_rows)
            return [(begin, min(begin + step, part.stop)) for begin in range(part.start, part.stop, step)]
        ranges = []
        first = part.index * self.partition_tokens
        for chunk_start in range(first, min(first + self.partition_tokens, self.num_tokens), self.chunk_tokens):
            begin = max(self._rows.rows_before(chunk_start), part.start)
            end = min(self._rows.rows_before(chunk_start + self.chunk_tokens), part.stop)
            if end > begin:
                ranges.append((begin, end))
        return ranges

    def read_partition(self, part: Partition | int) -> EncodedRows:
        part = self.partition(part) if isinstance(part, int) else part
        return self.read_rows(part.start, part.stop)

    # -- attributes -------------------------------------------------------------------------

    @property
    def attribute_names(self) -> tuple[str, ...] | None:
        """The A attribute names (id ``k`` is ``attribute_names[k]``), or ``None``: the store has no attributes."""
        return self._attribute_names

    def _require_attributes(self) -> tuple[str, ...]:
        if self._attribute_names is None:
            raise StoreError(
                f"{self.location}: has no attributes (its rows carry no attribute id): write it with them "
                "(ingest --attribute-by for text, --attributes A.npy for token ids)"
            )
        return self._attribute_names

    def _attribute_array(self, name: str, length: int) -> Any:
        """The zarr array ``name`` of the attributes, checked to be (``length``,) integers."""
        if name not in self._group:
            raise StoreCorruptError(
                f"{self.location}: array '{name}' is missing: the attributes say the store has an attribute per "
                f"{self.attribute_level}; `dist-respattn validate` lists every problem"
            )
        array = self._group[name]
        if array.dtype != np.int32 or tuple(array.shape) != (length,):
            raise StoreCorruptError(
                f"{self.location}: array '{name}': {array.dtype} {tuple(array.shape)}: expected int32 ({length},), "
                f"one id per {self.attribute_level}"
            )
        return array

    def _document_attribute_ids(self) -> np.ndarray:
        """``document_attribute`` (n_docs,) int32, read once (ids not yet checked: a read checks those it uses)."""
        if self._document_attribute is None:
            array = self._attribute_array("document_attribute", int(self._rows.starts.size))
            self._document_attribute = np.asarray(array[...], dtype=np.int32)
        return self._document_attribute

    def read_attributes(self, start: int, stop: int, selected: np.ndarray | None = None) -> np.ndarray:
        """The attribute ids (n,) int32 of rows ``[start, stop)``, or of those where ``selected`` (stop - start,)
        bool holds: the rows :meth:`read_rows`, :meth:`read_selected` and :meth:`read_windows` return, in their
        order, for the N and ``min_context`` this store was opened with.

        Each id is checked to lie in [0, A): a bad one raises :class:`StoreCorruptError` naming the array, its
        chunk and position, and the row. A store without attributes raises :class:`StoreError`.
        """
        names = self._require_attributes()
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        pos = self._rows.positions(start, stop)
        at = None if selected is None else np.flatnonzero(np.asarray(selected, dtype=bool))
        if at is not None:
            pos = pos[at]
        if pos.shape[0] == 0:
            return np.zeros(0, dtype=np.int32)
        if self.attribute_level == "token":
            name, unit, chunk, index = "token_attribute", "position", self.chunk_tokens, pos
            array = self._attribute_array(name, self.num_tokens)
            first = int(pos[0])
            values = self._read(name, array, first, int(pos[-1]) + 1)[pos - first]
        else:
            name, unit, chunk = "document_attribute", "document", _STARTS_CHUNK
            index = np.searchsorted(self._rows.starts, pos, side="right") - 1
            values = self._document_attribute_ids()[index]
        bad = np.flatnonzero((values < 0) | (values >= len(names)))
        if bad.size:
            i = int(bad[0])
            row = start + (i if at is None else int(at[i]))
            raise StoreCorruptError(
                f"{self.location}: array '{name}' chunk {int(index[i]) // chunk}, {unit} {int(index[i])} (row {row}) "
                f"= {int(values[i])}: expected an attribute id in [0, {len(names)}) ({bad.size} bad ids in rows "
                f"{start}..{stop - 1}); `dist-respattn validate` lists them"
            )
        return np.asarray(values, dtype=np.int32)

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the stream (token positions, not rows), every id checked in [0, S)."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"{self.location}: tokens [{start}, {stop}) outside [0, {self.num_tokens})")
        if start == stop:
            return np.zeros(0, dtype=self._tokens.dtype)
        return self._checked_span(start, stop)

    def read_documents(self, start: int, stop: int, selected: np.ndarray | None = None) -> np.ndarray:
        """The document index (n,) int64 of rows ``[start, stop)`` (those where ``selected`` holds, when given), in
        the order :meth:`read_rows` returns them: document ``d`` begins at ``document_starts()[d]``."""
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        pos = self._rows.positions(start, stop)
        if selected is not None:
            pos = pos[np.asarray(selected, dtype=bool)]
        return (np.searchsorted(self._rows.starts, pos, side="right") - 1).astype(np.int64)

    def document_attributes(self) -> np.ndarray | None:
        """Each document's attribute id: (n_docs,) int32, checked in [0, A).

        ``None`` for a store without attributes, and for one with an attribute per token: there a document's
        tokens may carry different ids, so no one id is the document's (read them with :meth:`read_attributes`).
        """
        if self._attribute_names is None or self.attribute_level != "document":
            return None
        ids = self._document_attribute_ids()
        bad = np.flatnonzero((ids < 0) | (ids >= len(self._attribute_names)))
        if bad.size:
            d = int(bad[0])
            raise StoreCorruptError(
                f"{self.location}: array 'document_attribute' chunk {d // _STARTS_CHUNK}, document {d} = "
                f"{int(ids[d])}: expected an attribute id in [0, {len(self._attribute_names)}) ({bad.size} bad ids); "
                "`dist-respattn validate` lists them"
            )
        return ids.copy()

    # -- what else the store carries ---------------------------------------------------------

    @property
    def provenance(self) -> dict[str, Any]:
        return dict(self.attributes.get("provenance") or {})

    def fingerprint(self) -> str:
        """A digest of the attributes and the window: one written store read with one N."""
        text = json.dumps({**self.attributes, "window": self.schema.context_length}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def true_model(self) -> None:
        return None

    def embeddings(self) -> np.ndarray:
        return self._group["embeddings"][...]

    def vocabulary(self) -> dict[str, Any] | None:
        if "vocabulary" not in self._group:
            return None
        return dict(self._group["vocabulary"].attrs)

    def document_starts(self) -> np.ndarray:
        return self._rows.starts.copy()

    def identity(self) -> dict[str, str | None]:
        if self._identity is None:
            self._identity = corpus_identity(self)
        return dict(self._identity)

    def describe(self) -> dict[str, Any]:
        arrays = {
            name: array_summary(self._group[name])
            for name in ("tokens", "document_starts", "weight", *_ATTRIBUTE_ARRAYS.values())
            if name in self._group
        }
        fs, root = self.location.filesystem()
        stored = sum(int(fs.info(p)["size"]) for p in fs.find(root))
        return {
            "url": str(self.location),
            "format": "stream",
            "tokens": self.num_tokens,
            "documents": int(self._rows.starts.size),
            "rows": self.num_rows,
            **self.schema.to_json(),
            "chunk_tokens": self.chunk_tokens,
            "partition_tokens": self.partition_tokens,
            "chunk_rows": self.chunk_tokens,  # rows are cut by token chunk: at most this many a block
            "partition_rows": self.partition_tokens,
            "partitions": self.num_partitions,
            "bytes_on_disk": stored,
            "bytes_per_token": stored / max(self.num_tokens, 1),
            "fingerprint": self.fingerprint(),
            "arrays": arrays,
            "has_true_model": False,
            "identity": self.identity(),
            "provenance": self.provenance,
            **describe_attributes(self._attribute_names, self.attribute_level),
        }


def _source_of(provenance: dict[str, Any]) -> str:
    """The input a writer's provenance names: the token file, or the text paths."""
    if provenance.get("source") == "text":
        return ", ".join(provenance.get("paths", [])) or "the text"
    return str(provenance.get("tokens") or "the tokens")


def _starts_problem(starts: np.ndarray, num_tokens: int) -> str | None:
    """What is wrong with document starts (``None``: nothing): they must rise strictly from 0 inside the stream."""
    if starts.ndim != 1 or starts.size == 0 or starts[0] != 0:
        return f"array 'document_starts': shape {starts.shape}, first {starts[:1].tolist()}: expected starts from 0"
    down = np.flatnonzero(np.diff(starts) <= 0)
    if down.size:
        i = int(down[0]) + 1
        return (
            f"array 'document_starts' position {i} = {int(starts[i])} after {int(starts[i - 1])}: "
            "expected strictly increasing document starts"
        )
    if num_tokens and starts[-1] >= num_tokens:
        return f"array 'document_starts' position {starts.size - 1} = {int(starts[-1])}: past the {num_tokens} tokens"
    return None


class StreamWriter:
    """Writes a stream store in bounded memory: one shard of tokens at a time, then commits it.

    The store is built at ``OUT.partial-<id>`` and moved onto ``OUT`` by :meth:`close`, so a failed
    write leaves whatever ``OUT`` held untouched. The writer holds ``OUT``'s writer lock
    (:class:`~dist_respattn.store.lock.StoreLock`) from before it looks at ``OUT`` until it is done, and
    removes the staging copies killed writers left.

    With ``attribute_names`` (A distinct strings) every row carries an attribute id in [0, A): one per
    document (``attribute_level="document"``: each :meth:`start_document` gives its ``attribute``) or one per
    token (``"token"``: each :meth:`write` gives an ``attribute`` per token).
    """

    def __init__(
        self,
        out: str | os.PathLike[str] | StoreLocation,
        *,
        num_symbols: int,
        table: np.ndarray,
        context_length: int,
        weighted: bool = False,
        chunk_tokens: int | None = None,
        partition_tokens: int | None = None,
        query_dtype: str = "float32",
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        provenance: dict[str, Any] | None = None,
        attribute_names: Sequence[str] | None = None,
        attribute_level: str = "document",
    ) -> None:
        self.final = StoreLocation.of(out, storage_options)
        self._attribute_names = checked_writer_names(self.final, attribute_names)
        if attribute_level not in ATTRIBUTE_LEVELS:
            raise ValueError(f"attribute_level = {attribute_level!r}: expected one of {', '.join(ATTRIBUTE_LEVELS)}")
        self._attribute_level = attribute_level if self._attribute_names is not None else None
        self._lock = StoreLock.take(self.final, purpose="overwrite" if overwrite else "new store")
        try:
            self._start(num_symbols, table, context_length, weighted, chunk_tokens, partition_tokens, query_dtype,
                        overwrite, provenance)  # fmt: skip
        except BaseException:
            self._lock.release()
            raise

    def _start(
        self,
        num_symbols: int,
        table: np.ndarray,
        context_length: int,
        weighted: bool,
        chunk_tokens: int | None,
        partition_tokens: int | None,
        query_dtype: str,
        overwrite: bool,
        provenance: dict[str, Any] | None,
    ) -> None:
        """The rest of ``__init__``, with the lock held: refuse an existing ``OUT``, begin the staging copy."""
        from dist_respattn.store.layout import compressors_for

        remove_partials(self.final)
        if self.final.exists() and not self.final.is_empty_dir() and not overwrite:
            raise store_exists(self.final)
        self.location = self.final.sibling(f".partial-{uuid.uuid4().hex[:8]}")
        if chunk_tokens is None:  # a shard smaller than the default chunk is one chunk
            chunk_tokens = min(int(partition_tokens or DEFAULT_CHUNK_TOKENS), DEFAULT_CHUNK_TOKENS)
        self.chunk_tokens = int(chunk_tokens)
        self.partition_tokens = int(partition_tokens or self.chunk_tokens * DEFAULT_CHUNKS_PER_PARTITION)
        if self.partition_tokens % self.chunk_tokens:
            raise ValueError(
                f"partition size {self.partition_tokens}: expected a multiple of the chunk size {self.chunk_tokens}"
            )
        self.num_symbols = int(num_symbols)
        self.dtype = token_dtype(self.num_symbols)
        #: Provenance recorded at close (writers add counts known only at the end).
        self.provenance: dict[str, Any] = {**(provenance or {}), "created": _now()}
        self.attributes: dict[str, Any] = {
            "schema": STREAM_SCHEMA_NAME,
            "schema_version": STREAM_SCHEMA_VERSION,
            "num_symbols": self.num_symbols,
            "context_length": int(context_length),
            "query_dim": int(table.shape[1]),
            "query_dtype": query_dtype,
            "has_weight": bool(weighted),
            "tokens": 0,
            "chunk_tokens": self.chunk_tokens,
            "partition_tokens": self.partition_tokens,
            "state": StoreState.WRITING,
            "provenance": self.provenance,
        }
        if self._attribute_names is not None:
            self.attributes["attribute_names"] = list(self._attribute_names)
            self.attributes["attribute_level"] = self._attribute_level
        self.group = zarr.create_group(self.location.zarr_store(), attributes={ATTRIBUTE_KEY: self.attributes})
        shards = (self.partition_tokens,) if self.partition_tokens != self.chunk_tokens else None
        ids = compressors_for("ids", "auto")
        self._arrays = {
            "tokens": self.group.create_array(
                "tokens", shape=(0,), dtype=self.dtype, chunks=(self.chunk_tokens,), shards=shards,
                compressors=ids, fill_value=0, config={"write_empty_chunks": True},
            )
        }  # fmt: skip
        if weighted:
            self._arrays["weight"] = self.group.create_array(
                "weight", shape=(0,), dtype=np.float32, chunks=(self.chunk_tokens,), shards=shards,
                compressors=ids, fill_value=0.0, config={"write_empty_chunks": True},
            )  # fmt: skip
        if self._attribute_level == "token":
            # -1, never an id: a cell no writer filled fails the checks.
            self._arrays["token_attribute"] = self.group.create_array(
                "token_attribute", shape=(0,), dtype=np.int32, chunks=(self.chunk_tokens,), shards=shards,
                compressors=ids, fill_value=-1, config={"write_empty_chunks": True},
            )  # fmt: skip
        self.group.create_array("embeddings", data=np.ascontiguousarray(table, dtype=np.float32))
        self._buffer: dict[str, list[np.ndarray]] = {name: [] for name in self._arrays}
        self._buffered = 0
        self.written = 0
        self._starts: list[int] = []
        self._document_ids: list[int] = []  # with an attribute per document: each start's
        self._closed = False
        self._appending: dict[str, int] | None = None  # an append's committed tokens and documents

    @classmethod
    def append(
        cls,
        url: str | os.PathLike[str] | StoreLocation,
        *,
        weighted: bool,
        storage_options: dict[str, Any] | None = None,
        provenance: dict[str, Any] | None = None,
        attribute_names: Sequence[str] | None = None,
    ) -> StreamWriter:
        """Start appending documents to the complete stream store at ``url``, in place.

        The store is marked ``appending`` with its committed tokens and documents recorded, so a
        failed append is rolled back to them (by :meth:`abort`, or later by
        :func:`rollback_stream_append`, which ``dist-respattn repair`` runs); readers refuse it
        until it is complete again. New tokens always begin a new document. The writer holds the
        store's writer lock (purpose ``append``) from before it reads the store until it is done.

        A store with attributes takes appended rows with theirs only (at the store's level): ``attribute_names``
        are the store's names followed by any new ones (:func:`~dist_respattn.store.attributes.merge_names`),
        recorded when the append commits. A store without attributes takes none.
        """
        location = StoreLocation.of(url, storage_options).with_window(None)
        lock = StoreLock.take(location, purpose="append")
        try:
            return cls._append_locked(location, weighted, provenance, attribute_names, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _append_locked(
        cls,
        location: StoreLocation,
        weighted: bool,
        provenance: dict[str, Any] | None,
        attribute_names: Sequence[str] | None,
        lock: StoreLock,
    ) -> StreamWriter:
        """:meth:`append` once the lock is held: what killed writers left is removed, then the store marked."""
        store = TokenStreamStore.open(location)
        remove_partials(store.location)
        if weighted != store.schema.has_weight:
            have = "a weight per token" if store.schema.has_weight else "no weights"
            raise SchemaMismatchError(
                f"{store.location}: cannot append: the store has {have}"
                + ("; pass --weights" if store.schema.has_weight else "; drop --weights")
            )
        names = appended_names(store.location, store.attribute_names, attribute_names, per=str(store.attribute_level))
        self = cls.__new__(cls)
        self._attribute_names = names
        self._attribute_level = store.attribute_level
        self._lock = lock
        self.final = self.location = store.location.with_window(None)
        self.chunk_tokens, self.partition_tokens = store.chunk_tokens, store.partition_tokens
        self.num_symbols = store.schema.num_symbols
        self.dtype = np.dtype(store._tokens.dtype)
        self.group = open_group_at(self.location, mode="r+")
        self.attributes = dict(store.attributes)
        committed = {"tokens": store.num_tokens, "documents": int(store.document_starts().size)}
        self.provenance = {**(provenance or {}), "time": _now(), "first_token": committed["tokens"]}
        self._arrays = {name: self.group[name] for name in _TOKEN_ARRAYS if name in self.group}  # type: ignore[misc]
        self._buffer = {name: [] for name in self._arrays}
        self._buffered = 0
        self.written = committed["tokens"]
        self._starts = []
        self._document_ids = []
        self._closed = False
        self._appending = committed
        # Last: from here on a failure leaves the store 'appending', and abort or repair rolls it back.
        self.group.attrs[ATTRIBUTE_KEY] = {**self.attributes, "state": StoreState.APPENDING, "committed": committed}
        return self

    def write_vocabulary(self, vocabulary: dict[str, Any]) -> None:
        self.group.create_group("vocabulary", attributes=vocabulary, overwrite=True)

    @property
    def attribute_names(self) -> tuple[str, ...] | None:
        """The names committed with the tokens (an append's: the store's, then any new ones), or ``None``."""
        return self._attribute_names

    @property
    def attribute_level(self) -> str | None:
        """``"document"`` or ``"token"``: what one attribute id is given with; ``None`` without attributes."""
        return self._attribute_level

    def start_document(self, attribute: int | None = None) -> None:
        """The next token written begins a document (a document of no tokens is not recorded).

        ``attribute``: the document's attribute id in [0, A), required when the store has an attribute per
        document and refused otherwise.
        """
        own: int | None = None
        if self._attribute_level == "document":
            if attribute is None:
                raise ValueError(
                    f"{self.final}: the store has an attribute per document ({self._attribute_count()} names): "
                    "expected start_document(attribute=ID)"
                )
            own = self._checked_id(attribute, "start_document(attribute=...)")
        elif attribute is not None:
            raise ValueError(f"{self.final}: start_document(attribute={attribute!r}): {self._no_document_ids()}")
        position = self.written + self._buffered
        if not self._starts or self._starts[-1] != position:
            self._starts.append(position)
            if own is not None:
                self._document_ids.append(own)
        elif own is not None:
            self._document_ids[-1] = own  # the empty document's is replaced

    def _attribute_count(self) -> int:
        return 0 if self._attribute_names is None else len(self._attribute_names)

    def _no_document_ids(self) -> str:
        if self._attribute_level == "token":
            return "the store has an attribute per token: give them to write(tokens, attribute=IDS)"
        return "the store has no attributes (a writer is given attribute_names to make one with them)"

    def _checked_id(self, value: Any, where: str) -> int:
        a = self._attribute_count()
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < a:
            raise ValueError(f"{self.final}: {where} = {value!r}: expected an attribute id in [0, {a})")
        return int(value)

    def _checked_token_ids(self, attribute: Any, count: int) -> np.ndarray | None:
        """``write``'s per-token ids, checked against the store's attributes: (count,) int32, or ``None``."""
        if self._attribute_level != "token":
            if attribute is None:
                return None
            if self._attribute_level == "document":
                raise ValueError(
                    f"{self.final}: write(attribute=...): the store has an attribute per document: give it to "
                    "start_document(attribute=ID)"
                )
            raise ValueError(f"{self.final}: write(attribute=...): {self._no_document_ids()}")
        if attribute is None:
            raise ValueError(
                f"{self.final}: the store has an attribute per token ({self._attribute_count()} names): expected "
                "write(tokens, attribute=IDS), one id per token"
            )
        ids = np.asarray(attribute)
        if ids.shape != (count,) or ids.dtype.kind not in "iu":
            raise ValueError(
                f"{self.final}: write(attribute=...): shape {ids.shape}, dtype {ids.dtype}: expected ({count},) "
                "integer ids, one per token"
            )
        a = self._attribute_count()
        bad = np.flatnonzero((ids < 0) | (ids >= a))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{self.final}: write(attribute=...)[{i}] (token {self.written + self._buffered + i}) = "
                f"{int(ids[i])}: expected an attribute id in [0, {a})"
            )
        return ids.astype(np.int32, copy=False)

    def write(self, tokens: np.ndarray, weight: np.ndarray | None = None, attribute: np.ndarray | None = None) -> None:
        """Append ids of the current document (checked ids in [0, S)); ``weight`` per token when weighted;
        ``attribute`` (len(tokens),) ids in [0, A) when the store has an attribute per token."""
        if tokens.size == 0:
            return
        ids = self._checked_token_ids(attribute, int(tokens.size))
        if not self._starts:
            if self._attribute_level == "document":
                raise ValueError(
                    f"{self.final}: the store has an attribute per document: begin the first document with "
                    "start_document(attribute=ID)"
                )
            self.start_document()  # the first token a writer writes always begins a document
        self._buffer["tokens"].append(np.asarray(tokens).astype(self.dtype, copy=False))
        if "weight" in self._arrays:
            assert weight is not None
            self._buffer["weight"].append(np.asarray(weight, dtype=np.float32))
        if ids is not None:
            self._buffer["token_attribute"].append(ids)
        self._buffered += int(tokens.size)
        # Flush whole shards only, so each shard file is written once (an append first fills the last one).
        while self._buffered >= (room := self.partition_tokens - self.written % self.partition_tokens):
            self._flush(room)

    def _flush(self, count: int) -> None:
        """Write the first ``count`` buffered tokens (a whole shard, or the last one) at the end of the arrays."""
        for name, array in self._arrays.items():
            joined = np.concatenate(self._buffer[name])
            array.resize((self.written + count,))
            array[self.written : self.written + count] = joined[:count]
            self._buffer[name] = [joined[count:]] if joined.size > count else []
        self.written += count
        self._buffered -= count

    def _require_rows(self) -> None:
        """Refuse to commit tokens that give no rows at the store's window (see :func:`require_rows`)."""
        window = int(self.attributes["context_length"])
        first = 0 if self._appending is None else int(self._appending["tokens"])
        starts = np.asarray(self._starts or [first], dtype=np.int64) - first
        if starts[0] != 0:
            return  # an append that continues the last document: its rows are not the tail's alone
        rows = _Rows.of(starts, self.written - first, window).num_rows
        require_rows(
            rows, source=_source_of(self.provenance), tokens=self.written - first, documents=int(starts.size),
            context_length=window,
        )  # fmt: skip

    def close(self) -> TokenStreamStore:
        if self._closed:
            raise StoreError(f"{self.final}: the writer is already closed")
        if self._buffered:
            self._flush(self._buffered)
        self._require_rows()
        self._give_up_if_unlocked()  # before the first change a reader of OUT could see
        attributes: dict[str, Any] = dict(self.attributes)
        attributes["tokens"] = self.written
        attributes["state"] = StoreState.COMPLETE
        if self._attribute_names is not None:  # an append's new names are committed with its tokens
            attributes["attribute_names"] = list(self._attribute_names)
        by_document = self._attribute_level == "document"
        if self._appending is None:
            starts = np.asarray(self._starts or [0], dtype=np.int64)
            self.group.create_array("document_starts", data=starts, chunks=(_STARTS_CHUNK,))
            if by_document:
                ids = np.asarray(self._document_ids, dtype=np.int32)
                assert ids.shape == starts.shape, (ids.shape, starts.shape)
                self.group.create_array("document_attribute", data=ids, chunks=(_STARTS_CHUNK,), fill_value=-1)
            attributes["provenance"] = {**self.provenance, "tokens_count": self.written, "documents": int(starts.size)}
        else:
            # Only the tail is written: the committed starts stay as they are until the state says complete.
            first = self._appending["documents"]
            tails = {"document_starts": np.asarray(self._starts, dtype=np.int64)}
            if by_document:
                tails["document_attribute"] = np.asarray(self._document_ids, dtype=np.int32)
            for name, tail in tails.items():
                array: Any = self.group[name]
                array.resize((first + tail.size,))
                array[first:] = tail
            provenance = dict(attributes.get("provenance") or {})
            record = {**self.provenance, "tokens": self.written - self._appending["tokens"],
                      "documents": len(self._starts)}  # fmt: skip
            provenance["appends"] = [*provenance.get("appends", []), record]
            attributes["provenance"] = provenance
        self.group.attrs[ATTRIBUTE_KEY] = attributes
        self._closed = True
        try:
            if self._appending is None:
                self.location.replace(self.final)
        except BaseException:
            self._remove_staging()
            raise
        finally:
            self._lock.release()
        return TokenStreamStore.open(self.final)

    def _give_up_if_unlocked(self) -> None:
        """Raise :class:`~dist_respattn.store.lock.StoreLocked` without committing when this writer's lock was
        broken while it held it (its heartbeats stopped for the lock's whole timeout): another writer may be at
        work on ``OUT``, so this one leaves it to them (a new store's staging copy, this writer's own, is deleted)."""
        try:
            self._lock.check()
        except StoreLocked:
            self._closed = True  # not aborted either: rolling an append back is the new holder's call
            try:
                if self._appending is None:
                    self._remove_staging()
            finally:
                self._lock.release()
            raise

    def abort(self) -> None:
        """Undo the write: delete a new store's staging copy, or roll an append back to the committed tokens."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._appending is not None:
                rollback_stream_locked(self.location)
            else:
                self._remove_staging()
        finally:
            self._lock.release()

    def _remove_staging(self) -> None:
        fs, root = self.location.filesystem()
        if fs.exists(root):
            fs.rm(root, recursive=True)

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            self.abort()


def rollback_stream_append(
    url: str | os.PathLike[str] | StoreLocation, *, storage_options: dict[str, Any] | None = None
) -> int:
    """Restore a stream store whose append was interrupted to its committed tokens; return that count.

    A complete store is left as it is. The committed tokens and documents are those the append
    recorded when it began; the shards past them are deleted and the arrays cut back. Refused
    (:class:`~dist_respattn.store.lock.StoreLocked`) while a live writer holds the store's lock; a dead
    writer's lock is broken. The staging copies killed writers left beside the store are removed.
    """
    location = StoreLocation.of(url, storage_options).with_window(None)
    with StoreLock.of(location, purpose="repair"):
        remove_partials(location)
        return rollback_stream_locked(location)


def rollback_stream_locked(location: StoreLocation) -> int:
    """:func:`rollback_stream_append` for a caller that holds the store's lock (a writer's abort, ``repair``)."""
    from dist_respattn.store.writer import delete_shards_from

    location = location.with_window(None)
    group = open_group_at(location, mode="r+")
    attributes = dict(group.attrs.get(ATTRIBUTE_KEY) or {})
    state = attributes.get("state")
    if state == StoreState.COMPLETE:
        return int(attributes["tokens"])
    if state != StoreState.APPENDING or "committed" not in attributes:
        raise StoreError(
            f"{location}: state {state!r}: only an interrupted append can be rolled back; "
            "write the store again (the same command with --overwrite)"
        )
    committed = attributes.pop("committed")
    tokens, documents = int(committed["tokens"]), int(committed["documents"])
    shards = -(-tokens // int(attributes["partition_tokens"]))
    for name in _TOKEN_ARRAYS:
        if name in group:
            if group[name].shape[0] != tokens:
                group[name].resize((tokens,))
            delete_shards_from(location, name, shards)
    for name in ("document_starts", "document_attribute"):
        if name in group and group[name].shape[0] != documents:
            group[name].resize((documents,))
    attributes["state"] = StoreState.COMPLETE
    group.attrs[ATTRIBUTE_KEY] = attributes
    problems, _, _ = validate_stream(location)
    if problems:
        raise StoreError(f"{location}: still damaged after the rollback: " + "; ".join(str(p) for p in problems))
    return tokens


def validate_stream(
    store_url: str | os.PathLike[str] | StoreLocation,
    storage_options: dict[str, Any] | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> tuple[list[Problem], int, int]:
    """Every problem of a stream store, named by array and position: ``(problems, tokens scanned, chunks scanned)``.

    ``total`` is called once with the number of partitions (shards of tokens) the scan reads, ``progress`` with 1
    as each is done.
    """
    location = StoreLocation.of(store_url, storage_options)
    group = open_group_at(location)
    attributes = dict(group.attrs.get(ATTRIBUTE_KEY) or {})
    problems: list[Problem] = []
    if attributes.get("state") == StoreState.APPENDING:
        problems.append(Problem("state 'appending': an append did not finish; `dist-respattn repair` rolls it back"))
        return problems, 0, 0
    if attributes.get("state") != StoreState.COMPLETE:
        state = attributes.get("state")
        problems.append(Problem(f"state {state!r}: the writer did not finish; write it again with --overwrite"))
        return problems, 0, 0
    num_tokens = int(attributes["tokens"])
    starts = np.asarray(group["document_starts"][...], dtype=np.int64)
    problem = _starts_problem(starts, num_tokens)
    if problem is not None:
        problems.append(Problem(problem, array="document_starts"))
    num_attributes, attribute_problems = _attribute_problems(group, attributes, num_tokens, int(starts.size))
    problems.extend(attribute_problems)
    if num_attributes is None:  # names that cannot be read: the tokens are still checked
        attributes = {k: v for k, v in attributes.items() if k not in ("attribute_names", "attribute_level")}
    store = (
        TokenStreamStore(location, group, attributes, int(attributes["context_length"])) if problem is None else None
    )
    chunk = int(attributes["chunk_tokens"])
    num_symbols = int(attributes["num_symbols"])
    scanned = ["tokens", "weight"] + (["token_attribute"] if num_attributes and "token_attribute" in group else [])
    shard = int(attributes.get("partition_tokens") or chunk)
    if total is not None:
        total(-(-num_tokens // shard))
    chunks = 0
    for begin in range(0, num_tokens, chunk):
        end = min(begin + chunk, num_tokens)
        chunks += 1
        for name in scanned:
            if name not in group:
                continue
            try:
                values = store._read(name, group[name], begin, end) if store is not None else group[name][begin:end]
            except StoreCorruptError as exc:
                problems.append(Problem(str(exc).split(": ", 1)[1], array=name, chunk=begin // chunk, row=begin))
                continue
            if name == "tokens":
                bad = np.flatnonzero(values >= num_symbols)
                what = f"expected token ids in [0, {num_symbols})"
            elif name == "weight":
                bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
                what = "expected finite, non-negative weights"
            else:
                bad = np.flatnonzero((values < 0) | (values >= num_attributes))
                what = f"expected attribute ids in [0, {num_attributes})"
            if bad.size:
                i = int(bad[0])
                problems.append(Problem(f"position {begin + i} = {values[i]}: {what}", array=name,
                                        chunk=begin // chunk, row=begin + i, count=int(bad.size)))  # fmt: skip
        # A shard is done when its last chunk is (the shard is a multiple of the chunk).
        if progress is not None and (end % shard == 0 or end == num_tokens):
            progress(1)
    return problems, num_tokens, chunks


def _attribute_problems(
    group: Any, attributes: dict[str, Any], num_tokens: int, num_documents: int
) -> tuple[int | None, list[Problem]]:
    """The attribute arrays' structure, and a per-document array's values: ``(A, problems)``.

    A is ``None`` when the store has no attributes or its names cannot be read; the per-token array's
    values are left to the chunk scan.
    """
    problems: list[Problem] = []
    names = attributes.get("attribute_names")
    if names is None:
        for name in _ATTRIBUTE_ARRAYS.values():
            if name in group:
                problems.append(Problem("present but the attributes record no attribute_names", array=name))
        return None, problems
    problem = names_problem(names)
    level = attributes.get("attribute_level")
    if problem is None and level not in ATTRIBUTE_LEVELS:
        problem = f"attribute attribute_level = {level!r}: expected one of {', '.join(ATTRIBUTE_LEVELS)}"
    if problem is not None:
        return None, [Problem(problem)]
    a = len(names)
    expected = _ATTRIBUTE_ARRAYS[str(level)]
    for name in _ATTRIBUTE_ARRAYS.values():
        if name != expected and name in group:
            problems.append(Problem(f"present but the attributes say there is an attribute per {level}", array=name))
    length = num_documents if level == "document" else num_tokens
    if expected not in group:
        problems.append(Problem(f"missing: expected int32 ({length},), an attribute id per {level}", array=expected))
        return a, problems
    array = group[expected]
    if array.dtype != np.int32 or tuple(array.shape) != (length,):
        problems.append(Problem(f"{array.dtype} {tuple(array.shape)}: expected int32 ({length},), an attribute id "
                                f"per {level}", array=expected))  # fmt: skip
        return None, problems
    if level == "token":
        tokens = group["tokens"]
        if tuple(array.chunks) != tuple(tokens.chunks) or (array.shards or array.chunks) != (
            tokens.shards or tokens.chunks
        ):
            problems.append(Problem(f"chunks {array.chunks}, shards {array.shards}: expected those of 'tokens' "
                                    f"({tokens.chunks}, {tokens.shards})", array=expected))  # fmt: skip
            return None, problems
        return a, problems
    ids = np.asarray(array[...])
    bad = np.flatnonzero((ids < 0) | (ids >= a))
    if bad.size:
        d = int(bad[0])
        problems.append(Problem(f"document {d} = {int(ids[d])}: expected attribute ids in [0, {a})", array=expected,
                                chunk=d // _STARTS_CHUNK, row=d, count=int(bad.size)))  # fmt: skip
    return a, problems


def write_stream(
    out: str | os.PathLike[str] | StoreLocation,
    documents: Iterable[tuple[np.ndarray, np.ndarray | None]],
    **writer_options: Any,
) -> TokenStreamStore:
    """Write documents (``(ids, weights or None)`` pairs, each a sequence of its own) as a stream store."""
    with StreamWriter(out, **writer_options) as writer:
        for ids, weight in documents:
            writer.start_document()
            writer.write(ids, weight)
        return writer.close()
