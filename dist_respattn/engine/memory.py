"""How much memory a fit needs on each worker and on the driver, checked before anything runs.

The dense (S, T) emission is the largest object: the model holds it twice on a worker (the
probabilities and the kernel's log table), every E-step value carries an (S, T) count table, and a
combine task holds its children's tables and their sum. Rows are bounded by blocks (one chunk each).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import dask

from dist_respattn.store import StoreSchema

__all__ = ["InsufficientMemoryError", "MemoryEstimate", "check_memory", "estimate_memory"]

#: A worker process's own footprint after a fit (interpreter, NumPy, numba's kernels, zarr, distributed):
#: measured 200-202 MiB at rest (135 MiB before the first task).
WORKER_BASELINE_BYTES = 210 * 2**20
#: The driver's own footprint before any model exists.
DRIVER_BASELINE_BYTES = 250 * 2**20
#: Blocks a reading task holds at once (the block in use, zarr's decode buffers, the next block).
BLOCKS_HELD = 4
#: Share of a worker's memory limit a fit may plan to use when Dask's spill threshold is off.
DEFAULT_USABLE_FRACTION = 0.7


def usable_fraction() -> float:
    """Dask's spill threshold (``distributed.worker.memory.spill``, 0.7 by default): above it a worker
    writes data to disk, which for a fit only means slower iterations, so the plan stays under it."""
    spill = dask.config.get("distributed.worker.memory.spill", DEFAULT_USABLE_FRACTION)
    return float(spill) if spill else DEFAULT_USABLE_FRACTION


class InsufficientMemoryError(MemoryError):
    """A fit would not fit in the workers' or the driver's memory."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a fit needs: per worker (at its thread count) and on the driver, with the parts named."""

    worker_bytes: int
    driver_bytes: int
    value_bytes: int
    model_bytes: int
    block_bytes: int

    def describe(self) -> str:
        return (
            f"{_mib(self.worker_bytes)} a worker, {_mib(self.driver_bytes)} on the driver "
            f"(one E-step value {_mib(self.value_bytes)}, the model on a worker {_mib(self.model_bytes)}, "
            f"one block of rows {_mib(self.block_bytes)})"
        )


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def estimate_memory(schema: StoreSchema, *, block_rows: int, threads_per_worker: int, fan_in: int) -> MemoryEstimate:
    """Plan a fit's memory from the store's shape and block size (an upper estimate, not a measurement).

    ``block_rows``: the most rows a task reads at once (a chunk, or the whole store when smaller).

    Worker: its baseline, the current and next model (or the current model and the M-step's grid
    table, which is smaller), and per thread one running E-step (its statistics, the value it returns
    and its blocks of rows) plus one combine (``fan_in`` values in, one out). Driver: the reduced value,
    its pooled copy, two models and the M-step's temporaries (its candidates' emission and grid table
    share the value's counts).
    """
    s, n, d, t = schema.num_symbols, schema.context_length, schema.query_dim, schema.num_targets
    value = 8 * (s * t + s * d + s + n + 3)
    model = 8 * (2 * s * t + s * d + 2 * n)
    block = block_rows * schema.row_bytes
    per_thread = 2 * value + BLOCKS_HELD * block + (fan_in + 1) * value
    worker = WORKER_BASELINE_BYTES + 2 * model + threads_per_worker * per_thread
    driver = DRIVER_BASELINE_BYTES + 2 * value + 2 * model + 2 * value
    return MemoryEstimate(worker, driver, value, model, block)


def _available_bytes() -> int:
    """Memory this machine could give the driver now, page cache included (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # not Linux: free pages only, which undercounts reclaimable cache
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def check_memory(estimate: MemoryEstimate, *, worker_limit: int, shape: str) -> None:
    """Refuse a fit that cannot fit: the message gives the sizes and what to change.

    ``worker_limit``: the smallest worker memory limit in bytes (0: no limit set). ``shape``: the
    store's ``S, N, D, T`` for the message.
    """
    fraction = usable_fraction()
    if worker_limit and estimate.worker_bytes > fraction * worker_limit:
        raise InsufficientMemoryError(
            f"a fit at {shape} needs about {_mib(estimate.worker_bytes)} on each worker but the smallest worker "
            f"memory limit is {_mib(worker_limit)} (Dask spills to disk at {fraction:.0%} of it): "
            f"{estimate.describe()}. Give the workers more memory (--memory-limit, or `dask worker "
            "--memory-limit`), run fewer threads per worker, write the store with smaller chunks "
            "(--chunk-rows), or use a smaller vocabulary (S, T)"
        )
    available = _available_bytes()
    if available and estimate.driver_bytes > available:
        raise InsufficientMemoryError(
            f"a fit at {shape} needs about {_mib(estimate.driver_bytes)} on the driver but this machine has "
            f"{_mib(available)} available: {estimate.describe()}. Run the driver on a larger machine or use a "
            "smaller vocabulary (S, T)"
        )
