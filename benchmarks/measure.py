"""Timing and memory helpers shared by the benchmark scripts (imported as a sibling module)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

#: With ``slow=True``, a path is timed again (up to ``repeats``) only while one run is shorter than this.
SLOW_PATH_REPEAT_BELOW_S = 1.0


def time_once(run: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds one call of ``run`` took (``time.perf_counter``), and what it returned."""
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def best_of(run: Callable[[], Any], repeats: int, *, slow: bool = False) -> tuple[float, Any]:
    """The shortest of ``repeats`` timed calls and what that call returned (a slow path stops after a >= 1 s call)."""
    best, out = time_once(run)
    for _ in range(repeats - 1):
        if slow and best >= SLOW_PATH_REPEAT_BELOW_S:
            break
        seconds, result = time_once(run)
        if seconds < best:
            best, out = seconds, result
    return best, out


def max_relative_difference(ours: Iterable[Any], theirs: Iterable[Any], fields: int | None = None) -> float:
    """Largest difference over the first ``fields`` statistics (all by default), each relative to its largest
    magnitude."""
    worst = 0.0
    for a, b in zip(tuple(ours)[:fields], tuple(theirs)[:fields], strict=True):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-300)
        worst = max(worst, float(np.max(np.abs(a - b), initial=0.0)) / scale)
    return worst


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes, or ``None``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def current_rss_bytes() -> int | None:
    """The current resident set size, or ``None`` where it cannot be read."""
    rss = _status_bytes("VmRSS")
    if rss is not None:
        return rss
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


def peak_rss_bytes() -> int:
    """The resident high-water mark: ``VmHWM`` (which :func:`reset_peak_rss` resets), else ``ru_maxrss``."""
    hwm = _status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def release_free_memory() -> bool:
    """Collect garbage and hand the allocator's free pages back to the OS (glibc ``malloc_trim``).

    Memory freed by earlier work but still resident would absorb later allocations without raising
    RSS, hiding them; ``False`` where there is no glibc.
    """
    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0) or True)
    except (OSError, AttributeError):
        return False


def reset_peak_rss() -> bool:
    """Reset the high-water mark to the current RSS (Linux ``clear_refs``); ``False`` if unsupported.

    Without it, a peak left by earlier work (imports, sampling) could hide growth below it.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True
