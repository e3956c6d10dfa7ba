"""Checking a fit's memory plan against the cluster's workers and this machine, before anything runs.

The plans themselves are the head kinds' (:mod:`dist_respattn.model.memory`): what their models, statistics and
blocks hold. Here they meet Dask's limits: a worker plans to stay under the spill threshold, the driver under what
this machine has available.
"""

from __future__ import annotations

import os
from typing import Any

import dask

from dist_respattn.model.heads.base import Columns
from dist_respattn.model.memory import MemoryEstimate, estimate_single_hop_memory, mib
from dist_respattn.store import StoreSchema, TokenStreamStore

__all__ = [
    "WINDOW_ROW_BYTES",
    "InsufficientMemoryError",
    "MemoryEstimate",
    "block_row_bytes",
    "check_memory",
    "estimate_memory",
    "usable_fraction",
]

#: Share of a worker's memory limit a fit may plan to use when Dask's spill threshold is off.
DEFAULT_USABLE_FRACTION = 0.7
#: A row of a stream store read as a token window: its token and, as int64, its position, document start,
#: window begin and end, target and query index, and the read's temporaries (a search, a check). No (n, N)
#: context is made, whatever the window N.
WINDOW_ROW_BYTES = 80


def usable_fraction() -> float:
    """Dask's spill threshold (``distributed.worker.memory.spill``, 0.7 by default): above it a worker
    writes data to disk, which for a fit only means slower iterations, so the plan stays under it."""
    spill = dask.config.get("distributed.worker.memory.spill", DEFAULT_USABLE_FRACTION)
    return float(spill) if spill else DEFAULT_USABLE_FRACTION


class InsufficientMemoryError(MemoryError):
    """A fit would not fit in the workers' or the driver's memory."""


def estimate_memory(
    schema: StoreSchema,
    *,
    block_rows: int,
    threads_per_worker: int,
    fan_in: int,
    layout: str = "dense",
    num_pairs: int | None = None,
) -> MemoryEstimate:
    """The memory plan of a single-hop fit on a store of this schema (see
    :func:`~dist_respattn.model.memory.estimate_single_hop_memory`)."""
    shape = (schema.num_symbols, schema.context_length, schema.query_dim, schema.num_targets)
    return estimate_single_hop_memory(
        shape, row_bytes=schema.row_bytes, block_rows=block_rows, threads_per_worker=threads_per_worker,
        fan_in=fan_in, layout=layout, num_pairs=num_pairs,
    )  # fmt: skip


def block_row_bytes(store: Any, columns: Columns) -> int:
    """Bytes a reading task holds per row of a block of ``store`` read for ``columns``: a stream store read as
    token windows (a tied prior's histogram kernel) holds ``WINDOW_ROW_BYTES`` a row whatever the window N; any
    other read makes the rows' arrays (an (n, N) context among them), the schema's ``row_bytes``."""
    if columns.windows and isinstance(store, TokenStreamStore):
        return WINDOW_ROW_BYTES
    return int(store.schema.row_bytes)


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
            f"a fit at {shape} needs about {mib(estimate.worker_bytes)} on each worker but the smallest worker "
            f"memory limit is {mib(worker_limit)} (Dask spills to disk at {fraction:.0%} of it): "
            f"{estimate.describe()}. Give the workers more memory (--memory-limit, or `dask worker "
            "--memory-limit`), run fewer threads per worker, write the store with smaller chunks "
            f"(--chunk-rows), {estimate.advice()}or use a smaller vocabulary (S, T)"
        )
    available = _available_bytes()
    if available and estimate.driver_bytes > available:
        raise InsufficientMemoryError(
            f"a fit at {shape} needs about {mib(estimate.driver_bytes)} on the driver but this machine has "
            f"{mib(available)} available: {estimate.describe()}. Run the driver on a larger machine, "
            f"{estimate.advice()}or use a smaller vocabulary (S, T)"
        )
