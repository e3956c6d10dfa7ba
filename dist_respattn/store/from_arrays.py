"""Writing a store from arrays in memory or ``.npy`` files (read in blocks, so they may exceed RAM)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.triple_store import TripleStore

__all__ = ["NpyRows", "load_array", "max_id", "row_blocks", "write_arrays"]

_SCAN_ROWS = 1 << 18


class NpyRows:
    """Rows of a ``.npy`` file, read block by block with plain file reads.

    A memory map would do the same, but every page it touches stays in the process's resident
    set; this keeps a writer's memory at one block whatever the file size.
    Supports ``shape``, ``ndim``, ``dtype``, ``len()`` and row slices ``rows[a:b]``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as handle:
            try:
                version = np.lib.format.read_magic(handle)
                if version == (1, 0):
                    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(handle)
                else:
                    shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(handle)
            except ValueError as exc:
                raise ValueError(f"{path}: not a readable .npy array ({exc})") from exc
            self.offset = handle.tell()
        if dtype.hasobject:
            raise ValueError(f"{path}: holds Python objects: expected a numeric array")
        if fortran_order and len(shape) > 1:
            raise ValueError(f"{path}: is stored in Fortran order: save it C-ordered (np.ascontiguousarray)")
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype = dtype
        self._row_items = int(np.prod(shape[1:], dtype=np.int64))
        expected = self.offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        actual = os.path.getsize(path)
        if actual < expected:
            raise ValueError(
                f"{path}: truncated: {actual - self.offset} bytes of data, expected {expected - self.offset} "
                f"for shape {self.shape} of {dtype}"
            )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("NpyRows reads contiguous row slices only")
        start, stop, _ = rows.indices(self.shape[0])
        count = max(stop - start, 0)
        offset = self.offset + start * self._row_items * self.dtype.itemsize
        values = np.fromfile(self.path, dtype=self.dtype, count=count * self._row_items, offset=offset)
        return values.reshape((count, *self.shape[1:]))


def load_array(value: Any, name: str) -> tuple[Any, str]:
    """An array (or :class:`NpyRows` for a ``.npy`` path) and the name errors should use: the path, or ``name``."""
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file (the {name} array)")
        return NpyRows(path), path
    return np.asarray(value), name


def row_blocks(values: Any, rows: int = _SCAN_ROWS) -> Iterator[np.ndarray]:
    """Consecutive blocks of ``rows`` rows of an array or :class:`NpyRows`, as arrays."""
    for start in range(0, values.shape[0], rows):
        yield np.asarray(values[start : start + rows])


def max_id(values: Any) -> int:
    """Largest id (-1 when empty), scanned in blocks so a file is never loaded whole."""
    return max((int(block.max()) for block in row_blocks(values) if block.size), default=-1)


def write_arrays(
    out: str | os.PathLike[str],
    context: Any,
    query: Any,
    target: Any,
    weight: Any = None,
    *,
    num_symbols: int | None = None,
    num_targets: int | None = None,
    options: WriteOptions | None = None,
) -> TripleStore:
    """Write ``context`` (n, N), ``query`` (n, D), ``target`` (n,) and optional ``weight`` (n,) to a store.

    Each may be an array or a ``.npy`` path. ``num_symbols`` and ``num_targets`` default to the
    largest id + 1 (or the existing store's when appending). Rows are copied one partition at a time.
    """
    options = options or WriteOptions()
    arrays = {"context": context, "query": query, "target": target}
    if weight is not None:
        arrays["weight"] = weight
    loaded = {name: load_array(value, name) for name, value in arrays.items()}
    names = {name: source for name, (_, source) in loaded.items()}
    values = {name: array for name, (array, _) in loaded.items()}
    for name, ndim in (("context", 2), ("query", 2), ("target", 1), ("weight", 1)):
        if name in values and values[name].ndim != ndim:
            raise ValueError(f"{names[name]}: {name} has shape {values[name].shape}: expected {ndim} dimensions")
    n = values["context"].shape[0]
    for name, array in values.items():
        if array.shape[0] != n:
            raise ValueError(
                f"{names[name]}: {array.shape[0]} rows but {names['context']} has {n}: expected one row per triple"
            )
    if options.append and (num_symbols is None or num_targets is None):
        existing = TripleStore.open(out, storage_options=options.storage_options).schema
        num_symbols = num_symbols or existing.num_symbols
        num_targets = num_targets or existing.num_targets
    schema = StoreSchema(
        num_symbols=num_symbols if num_symbols is not None else max(max_id(values["context"]) + 1, 1),
        context_length=values["context"].shape[1],
        query_dim=values["query"].shape[1],
        num_targets=num_targets if num_targets is not None else max(max_id(values["target"]) + 1, 1),
        query_dtype=options.query_dtype,
        has_weight="weight" in values,
    )
    provenance = {"source": "arrays", "files": {k: v for k, v in names.items() if v != k}}
    with open_writer(out, schema, options, provenance) as writer:
        step = writer.chunking.partition_rows
        for start in range(0, n, step):
            block = {name: array[start : start + step] for name, array in values.items()}
            writer.write(block["context"], block["query"], block["target"], block.get("weight"), source=names)
        return writer.close()
