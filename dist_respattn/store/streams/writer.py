"""Writing a token-stream store: one shard of tokens at a time, committed by moving it onto its place; appends."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import zarr

from dist_respattn.store.attributes import ATTRIBUTE_LEVELS, appended_names, checked_writer_names
from dist_respattn.store.documents import require_rows
from dist_respattn.store.errors import SchemaMismatchError, StoreError, store_exists
from dist_respattn.store.group import open_group_at
from dist_respattn.store.layout import compressors_for, side_compressors
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.lock import StoreLock, StoreLocked, remove_partials
from dist_respattn.store.schema import ATTRIBUTE_KEY, STREAM_SCHEMA_NAME, StoreState
from dist_respattn.store.streams.reader import (
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_CHUNKS_PER_PARTITION,
    STARTS_CHUNK,
    STREAM_SCHEMA_VERSION,
    TOKEN_ARRAYS,
    StreamRows,
    TokenStreamStore,
    token_dtype,
)
from dist_respattn.store.streams.rollback import rollback_stream_locked

__all__ = ["StreamWriter", "write_stream"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _source_of(provenance: dict[str, Any]) -> str:
    """The input a writer's provenance names: the token file, or the text paths."""
    if provenance.get("source") == "text":
        return ", ".join(provenance.get("paths", [])) or "the text"
    return str(provenance.get("tokens") or "the tokens")


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
                f"a partition of {self.partition_tokens} tokens (partition_rows): expected a multiple of the chunk, "
                f"{self.chunk_tokens} tokens (chunk_rows)"
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
        self.group.create_array(
            "embeddings", data=np.ascontiguousarray(table, dtype=np.float32), compressors=side_compressors()
        )
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
        self.group = open_group_at(self.location, mode="r+")
        tokens: Any = self.group["tokens"]  # an array: the store was opened as a stream store above
        self.dtype = np.dtype(tokens.dtype)
        self.attributes = dict(store.attributes)
        committed = {"tokens": store.num_tokens, "documents": int(store.document_starts().size)}
        self.provenance = {**(provenance or {}), "time": _now(), "first_token": committed["tokens"]}
        self._arrays = {name: self.group[name] for name in TOKEN_ARRAYS if name in self.group}  # type: ignore[misc]
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
        # Tokens written with no document started are one document; no tokens, none (not "0 tokens in 1 document").
        implied = [first] if self.written > first else []
        starts = np.asarray(self._starts or implied, dtype=np.int64) - first
        if starts.size and starts[0] != 0:
            return  # an append that continues the last document: its rows are not the tail's alone
        rows = StreamRows.of(starts, self.written - first, window).num_rows if starts.size else 0
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
            self.group.create_array(
                "document_starts", data=starts, chunks=(STARTS_CHUNK,), compressors=side_compressors()
            )
            if by_document:
                ids = np.asarray(self._document_ids, dtype=np.int32)
                assert ids.shape == starts.shape, (ids.shape, starts.shape)
                self.group.create_array(
                    "document_attribute",
                    data=ids,
                    chunks=(STARTS_CHUNK,),
                    fill_value=-1,
                    compressors=side_compressors(),
                )
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
