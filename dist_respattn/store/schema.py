"""What a triple store holds and how its group attributes describe it.

A store is one zarr v3 group::

    context  int32   (n, N)   symbol ids in [0, S)
    query    float32 (n, D)   (float64 on request)
    target   int32   (n,)     target ids in [0, T)
    weight   float32 (n,)     optional, finite and >= 0
    truth/                    optional: the head a synthetic store was sampled from
    embeddings float32 (S, D) optional: the table token queries were looked up in

All row arrays share one chunking along rows (``chunk_rows``) and one sharding
(``partition_rows``, a multiple of ``chunk_rows``); a shard is a partition. The group attribute
``dist_respattn`` holds a :class:`StoreSchema` as JSON, plus the row count and the write state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dist_respattn.store.errors import SchemaMismatchError, StoreError

__all__ = [
    "ATTRIBUTE_KEY",
    "ROW_ARRAYS",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "STREAM_SCHEMA_NAME",
    "StoreSchema",
    "StoreState",
]

ATTRIBUTE_KEY = "dist_respattn"
SCHEMA_NAME = "dist_respattn.triples"
SCHEMA_VERSION = 1
#: A token-stream store's schema (see ``dist_respattn.store.streams.reader``), named here so that opening a triple
#: store can tell a store of the other kind from something that is no store.
STREAM_SCHEMA_NAME = "dist_respattn.token_stream"

#: The arrays with one entry (row) per triple, in the order they are written and checked.
ROW_ARRAYS = ("context", "query", "target", "weight")


class StoreState:
    """Values of the ``state`` attribute. Only a ``complete`` store opens."""

    COMPLETE = "complete"
    WRITING = "writing"  # a new store whose writer has not committed
    APPENDING = "appending"  # rows past ``rows`` are an uncommitted append


@dataclasses.dataclass(frozen=True)
class StoreSchema:
    """The shape of the triples a store holds: S, N, D, T, the query dtype and whether rows are weighted."""

    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    query_dtype: str = "float32"
    has_weight: bool = False

    def __post_init__(self) -> None:
        for name in ("num_symbols", "context_length", "query_dim", "num_targets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} = {value!r}: expected a positive integer")
            object.__setattr__(self, name, int(value))
        if self.query_dtype not in ("float32", "float64"):
            raise ValueError(f"query_dtype = {self.query_dtype!r}: expected 'float32' or 'float64'")
        if self.num_symbols > np.iinfo(np.int32).max or self.num_targets > np.iinfo(np.int32).max:
            raise ValueError("num_symbols and num_targets must fit int32 ids")

    def array_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per row array: the shape of one row and the dtype, e.g. ``{"context": ((N,), int32), ...}``."""
        specs = {
            "context": ((self.context_length,), np.dtype(np.int32)),
            "query": ((self.query_dim,), np.dtype(self.query_dtype)),
            "target": ((), np.dtype(np.int32)),
        }
        if self.has_weight:
            specs["weight"] = ((), np.dtype(np.float32))
        return specs

    @property
    def row_bytes(self) -> int:
        """Bytes of one row across all row arrays, uncompressed."""
        return sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in self.array_specs().values())

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, attrs: dict[str, Any], where: str) -> StoreSchema:
        """Read the schema fields from a store's attributes, naming ``where`` and the field on failure."""
        fields = [f.name for f in dataclasses.fields(cls)]
        missing = [f for f in fields[:4] if f not in attrs]
        if missing:
            raise StoreError(f"{where}: attribute '{ATTRIBUTE_KEY}' lacks {', '.join(repr(f) for f in missing)}")
        try:
            return cls(**{f: attrs[f] for f in fields if f in attrs})
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{where}: bad schema attribute: {exc}") from exc

    def check_same(self, other: StoreSchema, where: str) -> None:
        """Raise :class:`SchemaMismatchError` naming every field where ``other`` differs from this schema."""
        diffs = [
            f"{f.name} {getattr(other, f.name)!r} (store has {getattr(self, f.name)!r})"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]
        if diffs:
            raise SchemaMismatchError(f"{where}: the new rows do not match the store: {'; '.join(diffs)}")
