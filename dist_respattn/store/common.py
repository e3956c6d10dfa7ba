"""Options every writer shares, and the one way a writer is opened from them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.triples.writer import ProgressCallback, StoreWriter

__all__ = ["WriteOptions", "open_writer"]


@dataclasses.dataclass(frozen=True)
class WriteOptions:
    """How a writer lays out and commits a store.

    ``chunk_rows``/``partition_rows`` default to :func:`~dist_respattn.store.layout.choose_chunking`;
    ``compression`` is one of :data:`~dist_respattn.store.layout.COMPRESSION_CHOICES`; ``row_order`` is
    ``"input"`` or ``"target"`` (see :meth:`StoreWriter.create`); ``append`` adds to an
    existing store (whose layout then wins); ``overwrite`` replaces one; ``progress`` is called with
    the number of rows each write adds.
    """

    chunk_rows: int | None = None
    partition_rows: int | None = None
    compression: str = "auto"
    row_order: str = "input"
    query_dtype: str = "float32"
    append: bool = False
    overwrite: bool = False
    storage_options: dict[str, Any] | None = None
    progress: ProgressCallback | None = None


def open_writer(
    out: str | os.PathLike[str],
    schema: StoreSchema,
    options: WriteOptions,
    provenance: dict[str, Any],
    attribute_names: Sequence[str] | None = None,
) -> StoreWriter:
    """A writer creating ``out`` or appending to it, per ``options`` (rows with an attribute each when
    ``attribute_names`` are given)."""
    if options.append and options.overwrite:
        raise ValueError("append and overwrite exclude each other")
    if options.append:
        return StoreWriter.append(
            out, schema, provenance=provenance, storage_options=options.storage_options, progress=options.progress,
            attribute_names=attribute_names,
        )  # fmt: skip
    return StoreWriter.create(
        out,
        schema,
        chunk_rows=options.chunk_rows,
        partition_rows=options.partition_rows,
        compression=options.compression,
        row_order=options.row_order,
        provenance=provenance,
        overwrite=options.overwrite,
        storage_options=options.storage_options,
        progress=options.progress,
        attribute_names=attribute_names,
    )
