"""Arrays whose data starts on a 64-byte cache line, for the tables the compiled kernels read and update by row.

NumPy's large arrays start 16 bytes past a page boundary, so a row of a (S, 32) float64 table spans 5 cache
lines instead of 4 and every 64-byte vector load or store of it straddles two. Starting such tables on a line
makes the E-step ~5% faster (``benchmarks/bench_kernel_speed.py``); the values are the same either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CACHE_LINE", "aligned_copy", "aligned_zeros", "is_aligned"]

#: Bytes of a cache line.
CACHE_LINE = 64


def is_aligned(array: np.ndarray) -> bool:
    """Whether ``array``'s data starts on a cache line."""
    return array.ctypes.data % CACHE_LINE == 0


def aligned_zeros(shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    """``np.zeros(shape, dtype)`` starting on a cache line (C order)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    buffer = np.zeros(count * dtype.itemsize + CACHE_LINE, dtype=np.uint8)
    start = -buffer.ctypes.data % CACHE_LINE
    return buffer[start : start + count * dtype.itemsize].view(dtype).reshape(shape)


def aligned_copy(array: Any, dtype: Any = np.float64) -> np.ndarray:
    """``array`` as a C-order ``dtype`` array starting on a cache line: itself when it already is one, else a copy."""
    array = np.asarray(array)
    if array.dtype == dtype and array.flags.c_contiguous and is_aligned(array):
        return array
    out = aligned_zeros(array.shape, dtype)
    out[...] = array
    return out
