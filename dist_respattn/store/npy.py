"""Reading ``.npy`` files block by block, so an input may exceed RAM, and the names errors give them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["NpyRows", "load_array", "max_id", "row_blocks"]

_SCAN_ROWS = 1 << 18
#: dtype kinds a store can take: booleans, integers and floats.
_NUMERIC_KINDS = "biuf"
_KIND_NAMES = {"U": "strings", "S": "bytes", "M": "dates", "m": "time spans", "c": "complex numbers", "V": "records"}


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
        array: Any = NpyRows(path)
        source = path
    else:
        array, source = np.asarray(value), name
    if array.dtype.kind not in _NUMERIC_KINDS:
        # Checked here, once: strings or dates would fail later inside NumPy with a message naming no file.
        raise ValueError(
            f"{source}: the {name} array holds {array.dtype} values "
            f"({_KIND_NAMES.get(array.dtype.kind, 'not numbers')}): expected numbers (ids as integers: "
            "encode tokens to ids first, or ingest text with --text)"
        )
    return array, source


def row_blocks(values: Any, rows: int = _SCAN_ROWS) -> Iterator[np.ndarray]:
    """Consecutive blocks of ``rows`` rows of an array or :class:`NpyRows`, as arrays."""
    for start in range(0, values.shape[0], rows):
        yield np.asarray(values[start : start + rows])


def max_id(values: Any) -> int:
    """Largest id (-1 when empty), scanned in blocks so a file is never loaded whole."""
    return max((int(block.max()) for block in row_blocks(values) if block.size), default=-1)
