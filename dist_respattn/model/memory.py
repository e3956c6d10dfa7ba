"""How much memory a fit of a head needs on each worker and on the driver: the plans the engine checks.

The emission is the largest object: the model holds it twice on a worker (the probabilities and the
kernel's log table), every E-step value carries its counts, and a combine task holds its children's
counts and their sum. Dense, each is an (S, T) table; sparse, each costs a few bytes per (symbol,
target) pair of the support (``SPARSE_*_BYTES_PER_PAIR``), found by the start pass, so a sparse fit is
checked twice: before the cluster starts without the pairs, and after the start pass with them.
Rows are bounded by blocks (one chunk each).
"""

from __future__ import annotations

from dataclasses import dataclass

from dist_respattn.model.kernels.per_position import DIRECT_ROW_BYTES_PER_PAIR

__all__ = [
    "BLOCKS_HELD",
    "DRIVER_BASELINE_BYTES",
    "SPARSE_MERGE_BYTES_PER_PAIR",
    "SPARSE_MODEL_BYTES_PER_PAIR",
    "SPARSE_VALUE_BYTES_PER_PAIR",
    "WORKER_BASELINE_BYTES",
    "MemoryEstimate",
    "estimate_gated_memory",
    "estimate_single_hop_memory",
    "mib",
]

#: A worker process's own footprint after a fit (interpreter, NumPy, numba's kernels, zarr, distributed):
#: measured 200-202 MiB at rest (135 MiB before the first task).
WORKER_BASELINE_BYTES = 210 * 2**20
#: The driver's own footprint before any model exists.
DRIVER_BASELINE_BYTES = 250 * 2**20
#: Blocks a reading task holds at once (the block in use, zarr's decode buffers, the next block).
BLOCKS_HELD = 4
#: A sparse E-step value per pair: its float64 count.
SPARSE_VALUE_BYTES_PER_PAIR = 8
#: A sparse model per pair: values and the kernel's log values (float64), the support's symbol (int32),
#: the per-pair target the M-step and scoring derive (int32), and at most ``DIRECT_ROW_BYTES_PER_PAIR`` of the
#: kernel's direct symbol -> pair rows of dense targets.
SPARSE_MODEL_BYTES_PER_PAIR = 8 + 8 + 4 + 4 + DIRECT_ROW_BYTES_PER_PAIR
#: The driver's start pass per pair: the union of two partial supports (int64 cells, counts, np.unique's
#: sort and inverse) before it is reduced to one support.
SPARSE_MERGE_BYTES_PER_PAIR = 8 + 8 + 8 + 8 + 8


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a fit needs: per worker (at its thread count) and on the driver, with the parts named."""

    worker_bytes: int
    driver_bytes: int
    value_bytes: int
    model_bytes: int
    block_bytes: int
    layout: str = "dense"
    num_pairs: int | None = None
    #: An attribute-gated head's emission tables (``layout == "gated"``): F factors, and A own tables if any.
    num_tables: int | None = None

    def advice(self) -> str:
        """What to change in this fit's head to need less (ends with ", " to run on in a sentence)."""
        if self.layout == "gated":
            return "fit fewer tables (a smaller --attribute-factors, or without --per-attribute emission), "
        if self.layout == "dense":
            return "store the emission's pairs only (--emission-layout sparse), "
        return "use a shorter context (fewer pairs), "

    def describe(self) -> str:
        emission = (
            "a dense (S, T) emission"
            if self.layout == "dense"
            else f"attribute-gated emission tables, {self.num_tables} tables over {self.num_pairs:,} pairs"
            if self.layout == "gated"
            else "a sparse emission, its pairs not yet counted"
            if self.num_pairs is None
            else f"a sparse emission over {self.num_pairs:,} pairs at {SPARSE_MODEL_BYTES_PER_PAIR} bytes a pair "
            f"in a model and {SPARSE_VALUE_BYTES_PER_PAIR} in a value"
        )
        return (
            f"{mib(self.worker_bytes)} a worker, {mib(self.driver_bytes)} on the driver with {emission} "
            f"(one E-step value {mib(self.value_bytes)}, the model on a worker {mib(self.model_bytes)}, "
            f"one block of rows {mib(self.block_bytes)})"
        )


def mib(n: int) -> str:
    """``n`` bytes in MiB, for messages."""
    return f"{n / 2**20:,.0f} MiB"


def estimate_single_hop_memory(
    shape: tuple[int, int, int, int],
    *,
    row_bytes: int,
    block_rows: int,
    threads_per_worker: int,
    fan_in: int,
    layout: str = "dense",
    num_pairs: int | None = None,
) -> MemoryEstimate:
    """Plan a fit's memory from the store's shape and block size (an upper estimate, not a measurement).

    ``shape``: ``(S, N, D, T)``; ``block_rows``: the most rows (of ``row_bytes`` each) a task reads at once (a
    chunk, or the whole store when smaller).
    ``layout``: the emission's; a sparse one costs ``num_pairs`` times the bytes per pair (none counted
    when ``None``: the plan before the start pass has found them).

    Worker: its baseline, the current and next model (or the current model and the M-step's grid
    table, which is smaller), and per thread one running E-step (its statistics, the value it returns
    and its blocks of rows) plus one combine (``fan_in`` values in, one out). Driver: the reduced value,
    its pooled copy, two models and the M-step's temporaries (its candidates' emission and grid table
    share the value's counts).
    """
    s, n, d, t = shape
    merge = 0
    if layout == "dense":
        value = 8 * (s * t + s * d + s + n + 3)
        model = 8 * (2 * s * t + s * d + 2 * n)
    else:
        pairs = num_pairs or 0
        # The sparse E-step's symbol map (4 bytes a symbol) and the backoff factors beside the pairs.
        value = SPARSE_VALUE_BYTES_PER_PAIR * pairs + 8 * (s * d + s + n + 3)
        model = SPARSE_MODEL_BYTES_PER_PAIR * pairs + 8 * (t + 1) + 8 * (s * d + 3 * s + 2 * t + 2 * n)
        merge = SPARSE_MERGE_BYTES_PER_PAIR * pairs
    block = block_rows * row_bytes
    per_thread = 2 * value + BLOCKS_HELD * block + (fan_in + 1) * value
    worker = WORKER_BASELINE_BYTES + 2 * model + threads_per_worker * per_thread
    driver = DRIVER_BASELINE_BYTES + max(2 * value + 2 * model + 2 * value, merge)
    return MemoryEstimate(worker, driver, value, model, block, layout, num_pairs)


def estimate_gated_memory(
    shape: tuple[int, int, int, int],
    *,
    row_bytes: int,
    num_pairs: int,
    num_tables: int,
    num_attributes: int,
    block_rows: int,
    threads_per_worker: int,
    fan_in: int,
) -> MemoryEstimate:
    """Plan an attribute-gated fit's memory as :func:`estimate_single_hop_memory` plans a single-hop one.

    A model holds each table's values and their logs (16 bytes a pair a table) beside the support and its
    direct rows; a value holds the pair counts of every table (8 bytes a pair a table), the shared head's
    statistics and the (attribute, table) mass. The driver holds the reduced value and, while it chooses the
    prior's scale, the current head and each candidate's.
    """
    s, n, d, t = shape
    pairs, tables, attributes = int(num_pairs), int(num_tables), int(num_attributes)
    value = 8 * (pairs * tables + s * d + s + attributes * n + attributes * tables + 3)
    model = (
        16 * pairs * tables + (4 + DIRECT_ROW_BYTES_PER_PAIR) * pairs + 16 * tables * s + 8 * (t + 1)
        + 8 * (s * d + attributes * n + 2 * attributes * tables)
    )  # fmt: skip
    block = block_rows * row_bytes
    per_thread = 2 * value + BLOCKS_HELD * block + (fan_in + 1) * value
    worker = WORKER_BASELINE_BYTES + 2 * model + threads_per_worker * per_thread
    driver = DRIVER_BASELINE_BYTES + 2 * value + 3 * model
    return MemoryEstimate(worker, driver, value, model, block, "gated", pairs, tables)
