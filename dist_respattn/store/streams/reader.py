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
from collections.abc import Iterator
from typing import Any

import numpy as np

from dist_respattn.model.rows import WindowRows
from dist_respattn.store.attributes import (
    ATTRIBUTE_LEVELS,
    describe_attributes,
    names_problem,
)
from dist_respattn.store.errors import (
    IncompleteStoreError,
    StoreCorruptError,
    StoreError,
)
from dist_respattn.store.group import (
    Partition,
    array_summary,
    named_metadata_errors,
    open_group_at,
    read_failure,
    read_whole,
    shard_key,
)
from dist_respattn.store.identity import corpus_identity, identity_changes, recorded_identity
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.lock import StoreLocked, live_writer
from dist_respattn.store.not_a_store import not_a_store
from dist_respattn.store.problems import EncodedRows, Problem
from dist_respattn.store.schema import ATTRIBUTE_KEY, SCHEMA_NAME, STREAM_SCHEMA_NAME, StoreSchema, StoreState
from dist_respattn.store.streams.windows import full_window_rows, make_windows, target_positions
from dist_respattn.text_format import count_text

__all__ = [
    "ATTRIBUTE_ARRAYS",
    "DEFAULT_CHUNKS_PER_PARTITION",
    "DEFAULT_CHUNK_TOKENS",
    "STARTS_CHUNK",
    "STREAM_SCHEMA_NAME",
    "STREAM_SCHEMA_VERSION",
    "TOKEN_ARRAYS",
    "StreamRows",
    "TokenStreamStore",
    "array_problems",
    "is_stream_group",
    "missing_arrays",
    "starts_problem",
    "token_dtype",
]

STREAM_SCHEMA_VERSION = 1

#: Tokens per chunk (a block read: 2 MiB of uint16) and per shard (one partition, one task).
DEFAULT_CHUNK_TOKENS = 1 << 20
DEFAULT_CHUNKS_PER_PARTITION = 4
#: Document starts per chunk: an append rewrites only the last chunk or two.
STARTS_CHUNK = 1 << 16
#: The array that holds a stream's attributes, by ``attribute_level``.
ATTRIBUTE_ARRAYS = {"document": "document_attribute", "token": "token_attribute"}
#: The arrays with an entry per token, chunked and sharded alike.
TOKEN_ARRAYS = ("tokens", "weight", "token_attribute")


def missing_arrays(group: Any, attributes: dict[str, Any]) -> list[tuple[str, str]]:
    """The arrays every stream store has (and ``weight`` when it records weights) that ``group`` lacks:
    ``(name, what was expected)`` pairs, in the order of the format's description."""
    expected = {
        "tokens": "the token ids (L,)",
        "document_starts": "int64 (n_docs,) document starts",
        "embeddings": "float32 (S, D), the table queries are looked up in",
    }
    if attributes.get("has_weight"):
        expected["weight"] = "float32 (L,), a weight per token"
    return [(name, what) for name, what in expected.items() if name not in group]


def _recorded_documents(attributes: dict[str, Any]) -> int | None:
    """The documents the store's provenance records (those it was written with and those of each append), or
    ``None`` when a record lacks the count."""
    provenance = attributes.get("provenance") or {}
    appends = provenance.get("appends") or []
    counts = [provenance.get("documents"), *(a.get("documents") if isinstance(a, dict) else None for a in appends)]
    whole = [count for count in counts if isinstance(count, int) and not isinstance(count, bool)]
    return sum(whole) if len(whole) == len(counts) else None


def array_problems(group: Any, attributes: dict[str, Any]) -> list[Problem]:
    """The arrays whose dtype, shape or chunking is not what the store's attributes record (token count, S, D,
    documents, chunk and shard sizes): one problem each, naming what was found and what was expected.

    Only the arrays' metadata is read. An array the store lacks is left to :func:`missing_arrays`, the attribute
    arrays to the checks of their own. A read of an array that does not match would crash or return garbage (tokens
    past the end of a shrunk array, queries past the end of a shrunk table) rather than name it.
    """
    num_symbols, dim, length = (int(attributes[k]) for k in ("num_symbols", "query_dim", "tokens"))
    chunk, shard = int(attributes["chunk_tokens"]), int(attributes["partition_tokens"])
    documents = _recorded_documents(attributes)
    tokens = count_text(length, "token")
    expected: dict[str, tuple[np.dtype, str, tuple[int | None, ...], str]] = {
        "tokens": (token_dtype(num_symbols), f"the smallest unsigned type that holds S = {num_symbols:,} ids",
                   (length,), f"the store's {tokens}"),
        "document_starts": (np.dtype(np.int64), "document starts", (documents,),
                            "its documents" if documents is None else f"the {count_text(documents, 'document')} its "
                            "provenance records"),
        "embeddings": (np.dtype(np.float32), "the table queries are looked up in", (num_symbols, dim),
                       f"S = {num_symbols:,} symbols by D = {dim}"),
    }  # fmt: skip
    if attributes.get("has_weight"):
        expected["weight"] = (np.dtype(np.float32), "a weight per token", (length,), f"the store's {tokens}")
    problems = []
    for name, (dtype, what, shape, of) in expected.items():
        try:
            array = group[name]
        except KeyError:  # missing: named by missing_arrays
            continue
        fix = (
            f"'{name}/zarr.json' no longer matches the store's record: restore the store from a copy, or write it "
            "again (the same command with --overwrite)"
        )
        if array.dtype != dtype:
            problems.append(Problem(f"dtype {array.dtype}: expected {dtype}, {what}; {fix}", array=name))
        found = tuple(int(n) for n in array.shape)
        if len(found) != len(shape) or any(w not in (None, n) for w, n in zip(shape, found, strict=True)):
            problems.append(Problem(f"shape {found}: expected {_shape_text(shape)}, {of}; {fix}", array=name))
        elif name in TOKEN_ARRAYS and (array.chunks[0], (array.shards or array.chunks)[0]) != (chunk, shard):
            problems.append(Problem(
                f"chunked {array.chunks[0]} tokens per chunk and {(array.shards or array.chunks)[0]} per shard: "
                f"expected {chunk} and {shard}, the store's chunk_tokens and partition_tokens; {fix}",
                array=name,
            ))  # fmt: skip
    return problems


def _shape_text(shape: tuple[int | None, ...]) -> str:
    """``(4000,)``, ``(300, 3)``; a length the store does not record as ``n``: ``(n,)``."""
    return str(tuple("n" if n is None else n for n in shape)).replace("'", "")


def token_dtype(num_symbols: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds ids in [0, S)."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if num_symbols - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"num_symbols = {num_symbols}: more than uint32 ids")


def is_stream_group(attributes: dict[str, Any]) -> bool:
    return attributes.get("schema") == STREAM_SCHEMA_NAME


@dataclasses.dataclass(frozen=True)
class StreamRows:
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
    def of(cls, starts: np.ndarray, num_tokens: int, context_length: int) -> StreamRows:
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
        self._table = np.asarray(read_whole(location, group, "embeddings"), dtype=np.dtype(self.schema.query_dtype))
        self._table_checked = False
        starts = np.asarray(read_whole(location, group, "document_starts"), dtype=np.int64)
        problem = starts_problem(starts, self.num_tokens)
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
        self._rows = StreamRows.of(starts, self.num_tokens, min_context)
        self.num_rows = self._rows.num_rows
        # Blocks of rows are those of one token chunk; for a caller that sizes buffers by chunk_rows.
        self.chunk_rows = self.chunk_tokens
        self.partition_rows = self.partition_tokens
        self._verified_shards: set[tuple[str, int]] = set()
        self._identity: dict[str, str | None] | None = None
        self._fingerprint: str | None = None
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
            missing = missing_arrays(group, attributes)
            if missing:  # zarr's own error would be a bare KeyError naming no store
                name, expected = missing[0]
                raise StoreCorruptError(
                    f"{location}: array '{name}': missing: expected {expected}; write the store again "
                    "(the same command with --overwrite)"
                )
            problems = array_problems(group, attributes)
            if problems:  # else a read goes past an array's end (a worker crashes) or decodes garbage
                more = len(problems) - 1
                also = f" (and {more} more: `dist-respattn validate {location}` lists them)" if more else ""
                raise StoreCorruptError(f"{location}: {problems[0]}{also}")
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
    def recorded_window(self) -> int:
        """The window N the store records: its writer's, the default a reader takes (``schema.context_length`` is
        the one it is read with)."""
        return int(self.attributes["context_length"])

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

    def read_array(self, name: str, array: Any, start: int, stop: int) -> np.ndarray:
        for shard in range(start // self.partition_tokens, max(stop - 1, start) // self.partition_tokens + 1):
            self._check_shard_present(name, array, shard)
        try:
            return array[start:stop]
        except Exception as exc:
            raise self._unreadable_chunk(name, array, start, stop, exc) from exc

    def _unreadable_chunk(self, name: str, array: Any, start: int, stop: int, exc: Exception) -> StoreCorruptError:
        """The error for tokens ``[start, stop)`` of ``name`` that could not be read, naming the chunk at fault and its
        file: the chunks the read spans (a block's and, for its look-back, the one before) are read again one by one.
        """
        chunk, cause = None, exc
        for index in range(start // self.chunk_tokens, max(stop - 1, start) // self.chunk_tokens + 1):
            try:
                array[max(start, index * self.chunk_tokens) : min(stop, (index + 1) * self.chunk_tokens)]
            except Exception as again:
                chunk, cause = index, again
                break
        why = read_failure(cause)
        if why.startswith(type(cause).__name__):  # not a checksum: zarr's own words, and a likely cause
            why = f"(a truncated or damaged shard?): {why}"
        if chunk is None:  # each chunk reads on its own now: name the read
            where = (
                f"chunks {start // self.chunk_tokens}..{(stop - 1) // self.chunk_tokens} (tokens {start}..{stop - 1})"
            )
        else:
            first = chunk * self.chunk_tokens
            key = shard_key(array, name, first // self.partition_tokens)
            last = min(first + self.chunk_tokens, self.num_tokens) - 1
            where = f"chunk {chunk} (tokens {first}..{last}, in file '{key}')"
        return StoreCorruptError(f"{self.location}: array '{name}' {where} cannot be read: {why}")

    @property
    def num_stream_rows(self) -> int:
        """The stream's targets with an earlier token in their document (every token but each document's first): the
        rows of the store read with the shortest history, whatever the window."""
        return self.num_tokens - int(self._rows.starts.size)

    def stream_rows(self, start: int, stop: int) -> np.ndarray:
        """(stop - start,) int64: the index of each row of ``[start, stop)`` among the stream's rows
        (:attr:`num_stream_rows`), which every window N and shortest history of the store number alike (a fit's
        hold-out numbers rows so, to hold out the same tokens at every window)."""
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        pos = self._rows.positions(start, stop)
        document = np.searchsorted(self._rows.starts, pos, side="right") - 1
        return (pos - document - 1).astype(np.int64)

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
        end = pos  # this call's own array (computed by positions): shifted in place, not copied
        end -= first
        if self.short_histories:
            starts = self._rows.starts
            doc_start = starts[np.searchsorted(starts, end + first, side="right") - 1]
            begin = np.maximum(np.maximum(doc_start - first, end - s.context_length), 0)
            target = span[end].astype(np.int64)
            query_index = span[end - 1].astype(np.int64)
        else:  # every row has N tokens of its document before it: its window, target and query in one pass
            begin, target, query_index = full_window_rows(span, end, s.context_length)
        weight = self._checked_weights(first, last, end)
        return WindowRows(span, begin, end, target, table, query_index, weight, start, True)

    def iter_windows(self, part: Partition | int, block_rows: int | None = None) -> Iterator[WindowRows]:
        """A partition's rows as token windows, by token chunk (or ``block_rows`` rows at a time)."""
        for begin, end in self.block_ranges(part, block_rows):
            yield self.read_windows(begin, end)

    def _checked_span(self, first: int, last: int) -> np.ndarray:
        """Tokens ``[first, last)``, every id checked to lie in ``[0, S)`` (a bad one is named by its position)."""
        s = self.schema
        span = self.read_array("tokens", self._tokens, first, last)
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
        weight = self.read_array("weight", self._weight, first, last)[local]
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
            values = self.read_array(name, array, first, int(pos[-1]) + 1)[pos - first]
        else:
            name, unit, chunk = "document_attribute", "document", STARTS_CHUNK
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

    def last_rows(self, start: int, stop: int) -> np.ndarray:
        """(stop - start,) bool: which rows of ``[start, stop)`` are the last of their document (the row whose target
        is the document's last token; a document too short for a row at this window has none)."""
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        rows = self._rows
        last = rows.row_starts[1:][rows.rows > 0] - 1
        mask = np.zeros(stop - start, dtype=bool)
        inside = last[(last >= start) & (last < stop)]
        mask[inside - start] = True
        return mask

    def document_ends(self) -> np.ndarray:
        """(n_docs,) int64: the token after each document's last (the next document's start, or the stream's end)."""
        return np.append(self._rows.starts[1:], self.num_tokens).astype(np.int64)

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
                f"{self.location}: array 'document_attribute' chunk {d // STARTS_CHUNK}, document {d} = "
                f"{int(ids[d])}: expected an attribute id in [0, {len(self._attribute_names)}) ({bad.size} bad ids); "
                "`dist-respattn validate` lists them"
            )
        return ids.copy()

    # -- what else the store carries ---------------------------------------------------------

    @property
    def provenance(self) -> dict[str, Any]:
        return dict(self.attributes.get("provenance") or {})

    def fingerprint(self) -> str:
        """A digest of the attributes and the window: one written store read with one N (made once: a text
        corpus's attributes list its files, megabytes of JSON to digest)."""
        if self._fingerprint is None:
            text = json.dumps({**self.attributes, "window": self.schema.context_length}, sort_keys=True, default=str)
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._fingerprint

    def renew(self) -> None:
        """Forget the shard files seen present, so the next reads check them again (a store kept open from one
        task to the next: a file removed in between must be refused by name, not read as zeros)."""
        self._verified_shards.clear()

    def resident_nbytes(self) -> int:
        """The bytes this opened store holds in memory: the embedding table, the documents' row numbering and the
        document attributes once read."""
        rows = self._rows
        held = [self._table, rows.starts, rows.rows, rows.row_starts, self._document_attribute]
        return sum(int(a.nbytes) for a in held if a is not None)

    def true_model(self) -> None:
        return None

    def embeddings(self) -> np.ndarray:
        return read_whole(self.location, self._group, "embeddings")

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
            for name in ("tokens", "document_starts", "weight", *ATTRIBUTE_ARRAYS.values())
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
            # A recorded hash the content no longer has: edited after it was written (validate reports it too).
            "identity_changes": list(identity_changes(recorded_identity(self.provenance), self.identity()).values()),
            "provenance": self.provenance,
            **describe_attributes(self._attribute_names, self.attribute_level),
        }


def starts_problem(starts: np.ndarray, num_tokens: int) -> str | None:
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
