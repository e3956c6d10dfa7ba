"""The functions that run on the workers: one task reads one partition of a store, block by block.

Every task opens the store itself (a ``TripleStore`` pickles as its location), checks that it is
still the store the fit planned on, and returns a small additive value: E-step statistics, the
(symbol, target) pairs, held-out grid totals or score totals. A :class:`RowSelection` says which
rows count (all, or one side of the fit's hold-out); the others are read but weigh nothing. Nothing
here talks to the client.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.fitting.selection import GridTable, GridTotals, score_grid
from dist_respattn.model.heads.single_hop.accumulator import (
    ResponsibilityAttentionAccumulatorFactory,
    SufficientStatistics,
)
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.scoring import ScoreTotals, base_order, score_rows
from dist_respattn.model.heads.single_hop.top_k import PredictionTotals, TopK, predict_top_k
from dist_respattn.model.kernels.histogram import grid_windows, score_windows
from dist_respattn.model.rows import WindowRows
from dist_respattn.store import EncodedRows, StoreError, StoreLocation
from dist_respattn.store.predictions import write_prediction_part
from dist_respattn.store.problems import block_problems
from dist_respattn.store.rows import RowStore, open_store

__all__ = [
    "ALL_ROWS",
    "PartitionPredictions",
    "RowSelection",
    "StartValue",
    "combine_values",
    "estep_task",
    "grid_task",
    "pairs_task",
    "predict_rows_task",
    "predict_task",
    "score_task",
    "start_task",
]


@dataclass(frozen=True)
class RowSelection:
    """The rows of a store a task counts: all of them, or the training or held-out side of a hold-out rule."""

    rule: HoldoutRule | None = None
    side: str = "all"

    def __post_init__(self) -> None:
        if self.side not in ("all", "train", "heldout"):
            raise ValueError(f"side = {self.side!r}: expected 'all', 'train' or 'heldout'")
        if (self.rule is None) != (self.side == "all"):
            raise ValueError("a hold-out rule goes with side 'train' or 'heldout', and only with them")

    def weights(self, block: EncodedRows | WindowRows) -> np.ndarray | None:
        """(n,) weights of the block's rows (``None``: the store's rows are unweighted and all count)."""
        if self.rule is None:
            return block.weight
        train, heldout = self.rule.split_weights(block.start, block.num_rows, block.weight)
        return train if self.side == "train" else heldout


ALL_ROWS = RowSelection()


@functools.cache
def _configure_worker_process() -> None:
    """Decode on this worker's own threads: blosc and zarr would otherwise each start a pool per core.

    With one worker process per core, extra decoding threads only fight the other workers' kernels. In a
    worker, freed blocks are also kept for the next block (:func:`_keep_freed_blocks`).
    """
    import numcodecs.blosc
    import zarr

    threads = 1
    try:
        from distributed import get_worker

        threads = max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):  # not inside a worker (tests call tasks directly)
        pass
    else:
        _keep_freed_blocks()
    if hasattr(numcodecs.blosc, "set_nthreads"):
        numcodecs.blosc.set_nthreads(threads)
    zarr.config.set({"threading.max_workers": threads})


#: glibc's ``mallopt`` parameters, and the values a worker sets: allocations below the first come from the
#: heap, and the heap keeps up to the second freed at its top.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES, _TRIM_THRESHOLD_BYTES = 256 * 2**20, 512 * 2**20


def _keep_freed_blocks() -> None:
    """Let this worker process reuse one block's memory for the next (glibc only; elsewhere nothing changes).

    Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, so memory goes back to the system
    as soon as it is freed; setting it also fixes glibc's mmap threshold at 128 KiB. Every array of every
    block (windows, weights, the kernel's visiting order, zarr's decode buffers) was then a fresh mapping,
    paid for in page faults and zeroing block after block. Kept in the heap, the next block reuses them:
    on a 2-worker E-step pass at 109M tokens, a worker's system time fell from about 4.2 s to 2.4 s a pass
    and the pass's wall time by 9%. A worker holds at most about one block's arrays more (hundreds of MB).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): keep the allocator as it is
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)


def _checked_store(location: StoreLocation, fingerprint: str) -> RowStore:
    """Open the store on the worker and check it is the one the fit started on.

    Tasks carry the store's location, not an opened store: the scheduler unpickles every task, and
    must neither read the store (it may have no access to it) nor pay for opening it once per task.
    """
    _configure_worker_process()
    store = open_store(location)
    if store.fingerprint() != fingerprint:
        raise StoreError(
            f"{store.location}: the store changed while the fit ran (fingerprint {store.fingerprint()}, "
            f"expected {fingerprint}); restart the fit on the store as it is now"
        )
    return store


def _located(store: RowStore, part: int, block: EncodedRows | WindowRows, exc: ValueError) -> ValueError:
    """The kernel counts rows from the block's start; name the store, its array and the store row instead.

    A bad value (an id out of range, a non-finite number) is found again by the store's own checks,
    which give the global row and chunk; rows the model finds impossible keep the kernel's message,
    with the block's position in the store.
    """
    if not isinstance(exc, ImpossibleEvidenceError) and isinstance(block, EncodedRows):
        problems = block_problems(block, store.schema, block.start // store.chunk_rows)
        if problems:
            more = f" (and {len(problems) - 1} more kinds of bad value)" if len(problems) > 1 else ""
            return StoreError(
                f"{store.location}: partition {part}: {problems[0]}{more}; `dist-respattn validate` lists them all"
            )
    kind = type(exc) if isinstance(exc, ImpossibleEvidenceError) else ValueError
    return kind(
        f"{store.location}: partition {part}, block starting at store row {block.start} (row numbers below "
        f"count from there): {exc}"
    )


@dataclass(frozen=True)
class StartValue:
    """A start pass's value: the statistics of the first responsibilities and, when asked for, the pairs."""

    stats: SufficientStatistics
    pairs: PairCounts | None

    def __add__(self, other: StartValue) -> StartValue:
        pairs = None if self.pairs is None or other.pairs is None else self.pairs + other.pairs
        return StartValue(combine_values(self.stats, other.stats), pairs)


def _pairs_of(block: EncodedRows | WindowRows, weights: np.ndarray | None, store: RowStore) -> PairCounts:
    """The (previous symbol, target) pairs of a block's rows (a window's last token is the previous symbol)."""
    schema = store.schema
    previous = block.tokens[block.end - 1] if isinstance(block, WindowRows) else block.context[:, -1]
    return PairCounts.from_rows(
        previous, block.target, weights, num_symbols=schema.num_symbols, num_targets=schema.num_targets
    )


def _weighted(rows: WindowRows, weights: np.ndarray | None) -> WindowRows:
    return rows if weights is rows.weight else rows._replace(weight=weights)


def start_task(
    location: StoreLocation,
    part: int,
    factory: ResponsibilityAttentionAccumulatorFactory,
    start: str,
    seed: int,
    fingerprint: str,
    rows: RowSelection,
    with_pairs: bool,
    buckets: PositionBuckets | None = None,
) -> StartValue:
    """Statistics of partition ``part`` under the first responsibilities, and its (previous symbol, target) pairs.

    A sparse fit's statistics count the pairs the rows hold and carry them as their support, so the
    reduced start value holds the fit's support. ``start`` is ``"uniform"`` (1/N each) or ``"random"``
    (drawn from ``(seed, part)``): either way the
    first model is the same on any cluster. With ``buckets`` (a tied prior) the rows are read as token
    windows and start uniform over the positions each one has.
    """
    store = _checked_store(location, fingerprint)
    accumulator = factory.make()
    rng = np.random.default_rng([int(seed), int(part)])
    pairs = PairCounts.empty(store.schema.num_symbols, store.schema.num_targets) if with_pairs else None
    if buckets is not None:
        for windows in store.iter_windows(part):
            weights = rows.weights(windows)
            try:
                accumulator.seq_initialize_windows(_weighted(windows, weights), buckets)
            except ValueError as exc:
                raise _located(store, part, windows, exc) from None
            if pairs is not None:
                pairs = pairs + _pairs_of(windows, weights, store)
        return StartValue(accumulator.value(copy=False), pairs)
    for block in store.iter_blocks(part):
        weights = rows.weights(block)
        try:
            if start == "uniform":
                accumulator.seq_initialize_uniform(block.encoded, weights, checked=block.checked)
            else:
                accumulator.seq_initialize(block.encoded, weights, rng, checked=block.checked)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
        if pairs is not None:
            pairs = pairs + _pairs_of(block, weights, store)
    return StartValue(accumulator.value(copy=False), pairs)


def pairs_task(location: StoreLocation, part: int, fingerprint: str, rows: RowSelection) -> PairCounts:
    """The weighted (previous symbol, target) pairs of partition ``part``'s selected rows."""
    store = _checked_store(location, fingerprint)
    pairs = PairCounts.empty(store.schema.num_symbols, store.schema.num_targets)
    blocks = store.iter_windows(part) if store.short_histories else store.iter_blocks(part)
    for block in blocks:
        pairs = pairs + _pairs_of(block, rows.weights(block), store)
    return pairs


def estep_task(
    location: StoreLocation,
    part: int,
    model: ResponsibilityAttentionDistribution,
    factory: ResponsibilityAttentionAccumulatorFactory,
    fingerprint: str,
    rows: RowSelection = ALL_ROWS,
) -> SufficientStatistics:
    """E-step statistics of partition ``part``'s selected rows under ``model``, its blocks visited in row order.

    Holds one block of rows (one chunk, plus zarr's decode buffers) and one accumulator at a time.
    """
    store = _checked_store(location, fingerprint)
    accumulator = factory.make_for(model)
    if model.buckets is not None:  # a tied prior: the histogram kernel, over token windows
        for windows in store.iter_windows(part):
            try:
                accumulator.seq_update_windows(_weighted(windows, rows.weights(windows)), model)
            except ValueError as exc:
                raise _located(store, part, windows, exc) from None
        return accumulator.value(copy=False)
    for block in store.iter_blocks(part):
        try:
            accumulator.seq_update(block.encoded, rows.weights(block), model, checked=block.checked)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
    return accumulator.value(copy=False)


def score_task(
    location: StoreLocation, part: int, model: ResponsibilityAttentionDistribution, fingerprint: str
) -> ScoreTotals:
    """Held-out totals of partition ``part``: joint log-likelihood and predictive scores of the targets."""
    store = _checked_store(location, fingerprint)
    totals = ScoreTotals()
    if model.buckets is not None:
        for windows in store.iter_windows(part):
            try:
                totals = totals + score_windows(model, windows)
            except ValueError as exc:
                raise _located(store, part, windows, exc) from None
        return totals
    for block in store.iter_blocks(part):
        try:
            totals = totals + score_rows(model, block.encoded, block.weight)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
    return totals


def _predicted_blocks(
    store: RowStore, part: int, model: ResponsibilityAttentionDistribution, top_k: int
) -> Iterator[tuple[EncodedRows, TopK]]:
    """Partition ``part``'s blocks, each with its top ``top_k`` predictions (one block held at a time)."""
    if model.buckets is not None:
        raise ValueError(
            "a head with --position-buckets predicts one history at a time: `dist-respattn predict MODEL --stream` "
            "(or dist_respattn.Predictor); batch predictions into a store take heads with a free prior"
        )
    partition = store.partition(part)
    table = model.emission_table
    order = base_order(table) if isinstance(table, SparseEmission) else None
    for block in store.iter_blocks(partition):
        try:
            top = predict_top_k(model, block.context, block.query, top_k, base_order=order)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
        yield block, top


def predict_task(
    location: StoreLocation,
    part: int,
    model: ResponsibilityAttentionDistribution,
    fingerprint: str,
    out: StoreLocation,
    top_k: int,
) -> PredictionTotals:
    """Predict partition ``part``'s rows (the top ``top_k`` targets and the attention) into its part of ``out``.

    Holds one block of rows and its predictions at a time; returns how many rows it wrote and how many of
    their targets it ranked first and among the K.
    """
    store = _checked_store(location, fingerprint)
    totals = PredictionTotals()

    def blocks() -> Any:
        nonlocal totals
        for block, top in _predicted_blocks(store, part, model, top_k):
            totals = totals + PredictionTotals.of(top, block.target, block.weight)
            yield block.start, top

    partition = store.partition(part)
    write_prediction_part(
        out, part, partition.start, partition.stop, blocks(), top_k=min(top_k, model.num_targets),
        context_length=model.context_length,
    )  # fmt: skip
    return totals


@dataclass(frozen=True)
class PartitionPredictions:
    """One partition's predictions, brought back to the driver to be written as rows (no attention).

    Attributes:
        start: the partition's first store row.
        targets: (n, K) int32, each row's K most probable targets, best first; ``probabilities``: (n, K) theirs.
        stored: (n,) int32, each row's target in the store; ``totals``: the accuracy totals of the rows.
    """

    start: int
    targets: np.ndarray
    probabilities: np.ndarray
    stored: np.ndarray
    totals: PredictionTotals


def predict_rows_task(
    location: StoreLocation,
    part: int,
    model: ResponsibilityAttentionDistribution,
    fingerprint: str,
    top_k: int,
) -> PartitionPredictions:
    """Partition ``part``'s top ``top_k`` targets and their probabilities, returned (a partition's worth:
    ``n (K * 12 + 4)`` bytes) for the driver to write in row order."""
    store = _checked_store(location, fingerprint)
    partition = store.partition(part)
    kept = min(int(top_k), model.num_targets)
    targets, probabilities, stored = [np.zeros((0, kept), np.int32)], [np.zeros((0, kept))], [np.zeros(0, np.int32)]
    totals = PredictionTotals()
    for block, top in _predicted_blocks(store, part, model, top_k):
        totals = totals + PredictionTotals.of(top, block.target, block.weight)
        targets.append(top.targets)
        probabilities.append(top.probabilities)
        stored.append(np.asarray(block.target, dtype=np.int32))
    return PartitionPredictions(
        partition.start, np.concatenate(targets), np.concatenate(probabilities), np.concatenate(stored), totals
    )


def _selected_blocks(
    store: RowStore, part: int, rows: RowSelection, windows: bool = False
) -> Iterator[tuple[Any, np.ndarray | None]]:
    """Partition ``part``'s blocks with their weights under ``rows``; of a hold-out's held-out side, only
    the held-out rows of each block (a block with none is not read).

    The held-out side is a few percent of a training store: reading and windowing every row to weigh most
    of them 0 cost more than scoring the rest. The kernels skip rows of weight 0, and each block's rows
    are still scored in one call, in row order, so the totals are the same to the bit. ``windows``: the
    blocks are token windows (:class:`~dist_respattn.model.rows.WindowRows`), for a tied prior.
    """
    rule = rows.rule
    if rule is None or rows.side != "heldout":
        for block in store.iter_windows(part) if windows else store.iter_blocks(part):
            yield block, rows.weights(block)
        return
    for begin, end in store.block_ranges(part):
        held = rule.held_out(begin, end)
        if not held.any():
            continue
        block = store.read_windows(begin, end, held) if windows else store.read_selected(begin, end, held)
        yield block, np.ones(block.num_rows) if block.weight is None else np.asarray(block.weight, dtype=np.float64)


def grid_task(location: StoreLocation, part: int, table: GridTable, fingerprint: str, rows: RowSelection) -> GridTotals:
    """Held-out totals of partition ``part``'s selected rows at every point of the M-step's grid."""
    store = _checked_store(location, fingerprint)
    totals = GridTotals.zeros(table.shape)
    windows = table.buckets is not None
    for block, weights in _selected_blocks(store, part, rows, windows):
        try:
            if windows:
                totals = totals + grid_windows(table, _weighted(block, weights))
            else:
                totals = totals + score_grid(table, block.encoded, weights, checked=block.checked)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
    return totals


def combine_values(*values: Any) -> Any:
    """The sum of additive values, added left to right in the order given (so the result is reproducible).

    Takes E-step statistics (``SufficientStatistics``), or values that add with ``+`` (``StartValue``,
    ``PairCounts``, ``GridTotals``, ``ScoreTotals``, ``PredictionTotals``).
    """
    first, rest = values[0], values[1:]
    if isinstance(first, SufficientStatistics):
        stats = first.copy()
        for value in rest:
            stats = stats.add(value)
        return stats
    total = first
    for value in rest:
        total = total + value
    return total
