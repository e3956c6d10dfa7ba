"""Opening a triple store and reading its partitions: what every worker does, independently."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dist_respattn.model.heads.base import Head, head_from_arrays
from dist_respattn.model.rows import EncodedRows, WindowRows
from dist_respattn.store.attributes import describe_attributes
from dist_respattn.store.errors import IncompleteStoreError, StoreCorruptError, StoreError
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
from dist_respattn.store.problems import structural_problems
from dist_respattn.store.schema import ATTRIBUTE_KEY, SCHEMA_NAME, STREAM_SCHEMA_NAME, StoreSchema, StoreState

__all__ = ["TripleStore"]


class TripleStore:
    """A complete triple store, opened for reading.

    Opening checks the attributes and the array metadata (cheap: no chunk is read); :func:`validate`
    scans the values. A store pickles as its location, so workers reopen it themselves.

    Attributes:
        location: where the store lives.
        schema: S, N, D, T, query dtype, weighted or not.
        num_rows: committed rows.
        chunk_rows / partition_rows: rows per chunk (block read) and per partition (task).
        attributes: the full ``dist_respattn`` attribute dict (provenance included).

    A store may carry an attribute id per row (``attribute`` int32 (n,), chunked and sharded like ``target``) and
    the names of the ids (``attribute_names`` in its attributes): see :mod:`~dist_respattn.store.attributes`.
    """

    kind = "triples"

    def __init__(self, location: StoreLocation, group: Any, schema: StoreSchema, attributes: dict[str, Any]) -> None:
        self.location = location
        self._group = group
        self.schema = schema
        self.attributes = attributes
        self.num_rows = int(attributes["rows"])
        self.chunk_rows = int(attributes["chunk_rows"])
        self.partition_rows = int(attributes["partition_rows"])
        self._arrays = {name: group[name] for name in schema.array_specs()}
        names = attributes.get("attribute_names")
        #: The attribute names (checked by :func:`structural_problems` on open), ``None`` without attributes.
        self._attribute_names: tuple[str, ...] | None = None if names is None else tuple(names)
        self._attribute = group["attribute"] if names is not None else None
        self._verified_shards: set[tuple[str, int]] = set()
        self._identity: dict[str, str | None] | None = None
        self._fingerprint: str | None = None

    @classmethod
    def open(
        cls, url: str | os.PathLike[str] | StoreLocation, *, storage_options: dict[str, Any] | None = None
    ) -> TripleStore:
        """Open the store at a local path or fsspec URL; raise a :class:`StoreError` naming what is wrong."""
        location = StoreLocation.of(url, storage_options)
        group = open_group_at(location)
        if dict(group.attrs.get(ATTRIBUTE_KEY) or {}).get("schema") not in (SCHEMA_NAME, STREAM_SCHEMA_NAME):
            raise not_a_store(location)  # no store at all (a store of the other kind is a problem named below)
        with named_metadata_errors(location):
            schema, attributes, problems = structural_problems(group)
        if problems:
            unfinished = attributes.get("state") in (StoreState.WRITING, StoreState.APPENDING)
            writer = live_writer(location) if unfinished else None
            if writer is not None:  # not interrupted: still being written, and repair would be refused
                raise StoreLocked(f"{location}: not complete yet: {writer}")
            error = IncompleteStoreError if unfinished else StoreError
            raise error(f"{location}: " + "; ".join(str(p) for p in problems))
        assert schema is not None
        with named_metadata_errors(location):
            return cls(location, group, schema, attributes)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (TripleStore.open, (self.location,))

    def __repr__(self) -> str:
        s = self.schema
        return (
            f"TripleStore({str(self.location)!r}, rows={self.num_rows}, S={s.num_symbols}, N={s.context_length}, "
            f"D={s.query_dim}, T={s.num_targets}, partitions={self.num_partitions})"
        )

    # -- partitions -------------------------------------------------------------------------

    @property
    def num_partitions(self) -> int:
        return -(-self.num_rows // self.partition_rows)

    def partitions(self) -> list[Partition]:
        """The partitions in order: consecutive, chunk-aligned, covering every row once."""
        return [self.partition(i) for i in range(self.num_partitions)]

    def partition(self, index: int) -> Partition:
        if not 0 <= index < self.num_partitions:
            raise IndexError(f"{self.location}: partition {index} out of range [0, {self.num_partitions})")
        start = index * self.partition_rows
        return Partition(index, start, min(start + self.partition_rows, self.num_rows))

    def _check_shards_present(self, part: Partition, arrays: dict[str, Any] | None = None) -> None:
        """Raise naming the array when one of the partition's shard files (of the row arrays, or ``arrays``) is
        missing or empty.

        zarr reads a missing (or zero-length) shard as fill values, which would pass silently as
        rows of -1 ids and NaN queries. Checked once per array and partition per opened store.
        """
        fs, root = self.location.filesystem()
        for name, array in (self._arrays if arrays is None else arrays).items():
            if (name, part.index) in self._verified_shards:
                continue
            key = shard_key(array, name, part.index)
            rows = f"rows {part.start}..{part.stop - 1}"
            try:
                size = int(fs.info(f"{root}/{key}")["size"])
            except FileNotFoundError:
                raise StoreCorruptError(
                    f"{self.location}: array '{name}' partition {part.index} ({rows}): chunk file '{key}' is missing"
                ) from None
            if size == 0:
                raise StoreCorruptError(
                    f"{self.location}: array '{name}' partition {part.index} ({rows}): chunk file '{key}' is empty"
                )
            self._verified_shards.add((name, part.index))

    def read_rows(self, start: int, stop: int) -> EncodedRows:
        """Rows ``[start, stop)`` as encoded arrays; a missing or undecodable chunk raises naming it."""
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        if stop > start:
            for index in range(start // self.partition_rows, (stop - 1) // self.partition_rows + 1):
                self._check_shards_present(self.partition(index))
        values: dict[str, np.ndarray] = {}
        for name, array in self._arrays.items():
            try:
                values[name] = array[start:stop]
            except Exception as exc:
                chunk = start // self.chunk_rows
                raise StoreCorruptError(
                    f"{self.location}: array '{name}' chunk {chunk} (rows {start}..{stop - 1}) cannot be read: "
                    f"{read_failure(exc)}"
                ) from exc
        return EncodedRows(values["context"], values["query"], values["target"], values.get("weight"), start)

    def iter_blocks(self, part: Partition | int, block_rows: int | None = None) -> Iterator[EncodedRows]:
        """A partition's rows in blocks of ``block_rows`` (default: one chunk), reading only its own chunks.

        Memory is a few blocks (the block being read, zarr's decode buffers, and the previous block
        while the caller holds it), whatever the partition or store size.
        """
        for start, stop in self.block_ranges(part, block_rows):
            yield self.read_rows(start, stop)

    def block_ranges(self, part: Partition | int, block_rows: int | None = None) -> list[tuple[int, int]]:
        """The ``(start, stop)`` rows of the blocks :meth:`iter_blocks` reads, without reading them."""
        part = self.partition(part) if isinstance(part, int) else part
        step = self.chunk_rows if block_rows is None else int(block_rows)
        if step < 1:
            raise ValueError(f"block_rows = {block_rows}: expected a positive number of rows")
        return [(start, min(start + step, part.stop)) for start in range(part.start, part.stop, step)]

    def read_selected(self, start: int, stop: int, selected: np.ndarray) -> EncodedRows:
        """The rows of ``[start, stop)`` where ``selected`` (stop - start,) bool is true, in row order.

        Reads the rows from the first selected one to the last (zarr decodes their chunks whole anyway).
        ``start`` of the result is ``start``.
        """
        selected = np.asarray(selected, dtype=bool)
        at = np.flatnonzero(selected)
        if at.size == 0:
            return self.read_rows(start, start)
        first, last = start + int(at[0]), start + int(at[-1]) + 1
        rows = self.read_rows(first, last)
        keep = selected[first - start : last - start]
        weight = None if rows.weight is None else rows.weight[keep]
        return EncodedRows(rows.context[keep], rows.query[keep], rows.target[keep], weight, start)

    #: A triple store's rows all have N context ids: no short histories.
    short_histories = False

    def read_windows(self, start: int, stop: int, selected: np.ndarray | None = None) -> WindowRows:
        """Rows ``[start, stop)`` (where ``selected`` holds, when given) as full token windows, for the histogram
        kernel: views of the rows' own arrays."""
        rows = self.read_rows(start, stop) if selected is None else self.read_selected(start, stop, selected)
        return WindowRows.from_encoded(rows.context, rows.query, rows.target, rows.weight, start, rows.checked)

    def iter_windows(self, part: Partition | int, block_rows: int | None = None) -> Iterator[WindowRows]:
        """A partition's rows as full token windows, in the blocks of :meth:`iter_blocks`."""
        for start, stop in self.block_ranges(part, block_rows):
            yield self.read_windows(start, stop)

    def read_partition(self, part: Partition | int) -> EncodedRows:
        """A whole partition in memory (for a bounded-memory pass use :meth:`iter_blocks`)."""
        part = self.partition(part) if isinstance(part, int) else part
        return self.read_rows(part.start, part.stop)

    # -- attributes -------------------------------------------------------------------------

    @property
    def attribute_names(self) -> tuple[str, ...] | None:
        """The A attribute names (id ``k`` is ``attribute_names[k]``), or ``None``: the store has no attributes."""
        return self._attribute_names

    def read_attributes(self, start: int, stop: int, selected: np.ndarray | None = None) -> np.ndarray:
        """The attribute ids (n,) int32 of rows ``[start, stop)``, or of those where ``selected`` (stop - start,)
        bool holds: the rows :meth:`read_rows`, :meth:`read_selected` and :meth:`read_windows` return, in order.

        Each id is checked to lie in [0, A): a bad one raises :class:`StoreCorruptError` naming the array, chunk
        and row. A store without attributes raises :class:`StoreError`.
        """
        names = self._attribute_names
        if names is None or self._attribute is None:
            raise StoreError(
                f"{self.location}: has no attributes (its rows carry no attribute id): write it with them "
                "(ingest --attribute-by for text, --attributes A.npy for token ids or arrays)"
            )
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) outside [0, {self.num_rows})")
        rows = np.arange(start, stop) if selected is None else start + np.flatnonzero(np.asarray(selected, dtype=bool))
        if rows.size == 0:
            return np.zeros(0, dtype=np.int32)
        first, last = int(rows[0]), int(rows[-1]) + 1
        for index in range(first // self.partition_rows, (last - 1) // self.partition_rows + 1):
            self._check_shards_present(self.partition(index), {"attribute": self._attribute})
        try:
            values = self._attribute[first:last][rows - first]
        except Exception as exc:
            raise StoreCorruptError(
                f"{self.location}: array 'attribute' chunk {first // self.chunk_rows} (rows {first}..{last - 1}) "
                f"cannot be read: {read_failure(exc)}"
            ) from exc
        bad = np.flatnonzero((values < 0) | (values >= len(names)))
        if bad.size:
            i = int(bad[0])
            row = int(rows[i])
            raise StoreCorruptError(
                f"{self.location}: array 'attribute' chunk {row // self.chunk_rows}, row {row} = {int(values[i])}: "
                f"expected an attribute id in [0, {len(names)}) ({bad.size} bad ids in rows {first}..{last - 1}); "
                "`dist-respattn validate` lists them"
            )
        return np.asarray(values, dtype=np.int32)

    def read_documents(self, start: int, stop: int, selected: np.ndarray | None = None) -> np.ndarray:
        """Not kept by a triple store: its rows are windows, written without the document they came from."""
        raise StoreError(
            f"{self.location}: a triple store does not record each row's document; write the corpus as a "
            "token-stream store (ingest --format stream), whose rows know their documents"
        )

    # -- what else the store carries ---------------------------------------------------------

    @property
    def provenance(self) -> dict[str, Any]:
        return dict(self.attributes.get("provenance") or {})

    def fingerprint(self) -> str:
        """A digest of the store's attributes (schema, rows, layout, provenance with its creation time).

        It identifies one written store: it changes with every append, and two stores written
        separately differ even when they hold the same rows.
        """
        if self._fingerprint is None:  # made once: a text corpus's attributes list its files
            text = json.dumps(self.attributes, sort_keys=True, default=str)
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._fingerprint

    def renew(self) -> None:
        """Forget the shard files seen present, so the next reads check them again (a store kept open from one
        task to the next: a file removed in between must be refused by name, not read as fill values)."""
        self._verified_shards.clear()

    def resident_nbytes(self) -> int:
        """The bytes this opened store holds in memory: none beyond its metadata (rows are read by block)."""
        return 0

    def true_model(self) -> Head | None:
        """The head a synthetic store was sampled from, or ``None`` (read by its kind: a store written before kinds
        were recorded holds a single-hop head)."""
        if "truth" not in self._group:
            return None
        truth = self._group["truth"]
        arrays = {name: truth[name][...] for name, _ in truth.arrays()}
        meta = dict(truth.attrs)
        try:
            return head_from_arrays(str(meta.get("kind") or "single_hop"), arrays, meta)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{self.location}/truth: {exc}") from None

    def embeddings(self) -> np.ndarray | None:
        """The (S, D) table token queries were looked up in, when the store was made from tokens."""
        return read_whole(self.location, self._group, "embeddings") if "embeddings" in self._group else None

    def vocabulary(self) -> dict[str, Any] | None:
        """The vocabulary JSON of a store made from text (``vocabulary/zarr.json`` attributes), or ``None``."""
        if "vocabulary" not in self._group:
            return None
        return dict(self._group["vocabulary"].attrs)

    def identity(self) -> dict[str, str | None]:
        """Which corpus the ids and queries belong to: ``{"vocabulary": sha256 | None, "embeddings": sha256 | None}``.

        The hashes the writer recorded, or for an older store the same hashes computed from its
        vocabulary and embedding table; ``None`` for what the store does not carry (see
        :mod:`dist_respattn.store.identity`). Two stores of one corpus have equal identities.
        """
        if self._identity is None:
            self._identity = corpus_identity(self)
        return dict(self._identity)

    def describe(self) -> dict[str, Any]:
        """What ``dist-respattn info`` prints: schema, rows, layout, sizes, corpus identity and provenance."""
        arrays = {name: array_summary(array) for name, array in self._arrays.items()}
        if self._attribute is not None:
            arrays["attribute"] = array_summary(self._attribute)
        return {
            "url": str(self.location),
            "rows": self.num_rows,
            **self.schema.to_json(),
            "chunk_rows": self.chunk_rows,
            "partition_rows": self.partition_rows,
            "partitions": self.num_partitions,
            "fingerprint": self.fingerprint(),
            "arrays": arrays,
            "has_true_model": "truth" in self._group,
            "identity": self.identity(),
            # A recorded hash the content no longer has: edited after it was written (validate reports it too).
            "identity_changes": list(identity_changes(recorded_identity(self.provenance), self.identity()).values()),
            "provenance": self.provenance,
            **describe_attributes(self._attribute_names),
        }
