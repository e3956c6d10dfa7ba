"""The functions that run on the workers: one task reads one partition of a store, block by block.

Every task opens the store itself (a store pickles as its location; a worker keeps the stores it opened while
their root metadata is unchanged: :mod:`~dist_respattn.engine.kept_stores`), checks that it is still the store the
pass was planned on, turns its blocks into the :class:`~dist_respattn.model.heads.base.Block` a head reads
(the columns it asks for: encoded rows or token windows, attributes, documents) and hands them to the head's
own code: a trainer's statistics, a preparation pass, a grid's or a head's scores, a head's top-K. It returns
one small additive value. A :class:`RowSelection` says which rows count (all, or one side of the fit's
hold-out); the others are read but weigh nothing. Nothing here talks to the client or knows a kind of head.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.baselines.ranking import RankingBaselines
from dist_respattn.engine import kept_rows
from dist_respattn.engine.held_tables import held, held_args
from dist_respattn.engine.kept_stores import open_kept, unchanged
from dist_respattn.engine.payload import opened
from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import Block, Columns, Grid, Head, Trainer, combine
from dist_respattn.model.ranking import RankingSettings, RankingTable, rank_rows, select_block
from dist_respattn.model.rows import EncodedRows, WindowRows
from dist_respattn.model.scores import PredictionTotals
from dist_respattn.store import StoreError, StoreLocation, TokenStreamStore, open_store
from dist_respattn.store.predictions import write_prediction_part
from dist_respattn.store.problems import block_problems
from dist_respattn.store.rows import RowStore

__all__ = [
    "ALL_ROWS",
    "BUILD",
    "LAST_ROWS",
    "PartitionPredictions",
    "RowSelection",
    "attribute_map",
    "built",
    "chosen_argument",
    "combine_values",
    "common_arrays_task",
    "common_m_step_task",
    "grid_task",
    "held_out_count",
    "held_out_rows",
    "load_part_task",
    "partition_blocks",
    "pass_task",
    "predict_rows_task",
    "predict_task",
    "rank_task",
    "release_chosen",
    "score_task",
    "shard_arrays_task",
    "shard_m_step_task",
    "statistics_task",
    "write_part_task",
]


@dataclass(frozen=True)
class RowSelection:
    """The rows of a store a task counts: all of them, the training or held-out side of a hold-out rule, or
    (``side="last"``, a token-stream store's) the last row of each document, which ranking holds out."""

    rule: HoldoutRule | None = None
    side: str = "all"

    def __post_init__(self) -> None:
        if self.side not in ("all", "train", "heldout", "last"):
            raise ValueError(f"side = {self.side!r}: expected 'all', 'train', 'heldout' or 'last'")
        if (self.rule is None) != (self.side in ("all", "last")):
            raise ValueError("a hold-out rule goes with side 'train' or 'heldout', and only with them")

    def weights(self, rows: Any, store: RowStore | None = None) -> np.ndarray | None:
        """(n,) weights of a block's rows of ``store`` (``None``: the store's rows are unweighted and all count; the
        store is read only by a rule that numbers a token stream's rows)."""
        if self.rule is None:
            return rows.weight
        if self.rule.numbering == "rows":
            return self.rule.side_weights(rows.start, rows.num_rows, rows.weight, self.side)
        if store is None:
            raise ValueError("a hold-out of a token stream's rows needs the store the rows are read from")
        keep = held_out_rows(self.rule, store, rows.start, rows.start + rows.num_rows)
        if self.side == "train":
            keep = ~keep
        if rows.weight is None:
            return keep.astype(np.float64)
        return np.where(keep, np.asarray(rows.weight, dtype=np.float64), 0.0)


def held_out_rows(rule: HoldoutRule, store: RowStore, start: int, stop: int) -> np.ndarray:
    """(stop - start,) bool: which rows ``[start, stop)`` of ``store`` ``rule`` holds out (a rule numbering a token
    stream's rows reads each row's number among them from the store)."""
    if rule.numbering == "rows":
        return rule.held_out(start, stop)
    if not isinstance(store, TokenStreamStore):
        raise StoreError(f"{store.location}: a hold-out of a token stream's rows is read from a token-stream store")
    return rule.held_out_at(store.stream_rows(start, stop))


def held_out_count(rule: HoldoutRule, store: RowStore) -> int:
    """How many rows of ``store`` ``rule`` holds out."""
    if rule.numbering == "rows":
        return rule.count(store.num_rows)
    step = 1 << 20
    return sum(
        int(held_out_rows(rule, store, start, min(start + step, store.num_rows)).sum())
        for start in range(0, store.num_rows, step)
    )


ALL_ROWS = RowSelection()
#: The last row of each document of a token-stream store (its target: the document's last token).
LAST_ROWS = RowSelection(side="last")


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


def checked_store(location: StoreLocation, fingerprint: str) -> RowStore:
    """Open the store on the worker and check it is the one the pass was planned on.

    Tasks carry the store's location, not an opened store: the scheduler unpickles every task, and
    must neither read the store (it may have no access to it) nor pay for opening it once per task. The worker
    opens it once and keeps it for the next tasks while its root metadata is unchanged
    (:func:`~dist_respattn.engine.kept_stores.open_kept`).
    """
    _configure_worker_process()
    store = open_kept(location)
    if store.fingerprint() != fingerprint:
        raise StoreError(
            f"{store.location}: the store changed while the fit ran (fingerprint {store.fingerprint()}, "
            f"expected {fingerprint}); restart the fit on the store as it is now"
        )
    return store


def _as_encoded(rows: Any) -> Any:
    """Token windows of N tokens each (a triple store's rows read as windows) as the encoded rows they are, for the
    store's checks (on an error only: copies); any other rows as they are."""
    if not isinstance(rows, WindowRows):
        return rows
    begin = np.asarray(rows.begin, dtype=np.int64)
    width = np.asarray(rows.end, dtype=np.int64) - begin
    if width.size == 0 or np.any(width != width[0]):
        return rows
    context = np.asarray(rows.tokens)[begin[:, None] + np.arange(int(width[0]))]
    query = np.asarray(rows.query_table)[np.asarray(rows.query_index)]
    weight = None if rows.weight is None or rows.weight.shape[0] == 0 else rows.weight
    return EncodedRows(context, query, np.asarray(rows.target), weight, rows.start)


def _located(store: RowStore, part: int, block: Block, exc: ValueError) -> ValueError:
    """The kernels count rows from the block's start; name the store, its array and the store row instead.

    A bad value (an id out of range, a non-finite number) is found again by the store's own checks,
    which give the global row and chunk; rows the model finds impossible keep the kernel's message,
    with the block's position in the store.
    """
    rows = _as_encoded(block.rows)
    if not isinstance(exc, ImpossibleEvidenceError) and isinstance(rows, EncodedRows):
        problems = block_problems(rows, store.schema, rows.start // store.chunk_rows)
        if problems:
            more = f" (and {len(problems) - 1} more kinds of bad value)" if len(problems) > 1 else ""
            return StoreError(
                f"{store.location}: partition {part}: {problems[0]}{more}; `dist-respattn validate` lists them all"
            )
    kind = type(exc) if isinstance(exc, ImpossibleEvidenceError) else ValueError
    return kind(
        f"{store.location}: partition {part}, block starting at store row {rows.start} (row numbers below "
        f"count from there): {exc}"
    )


def attribute_map(store_names: tuple[str, ...] | None, head_names: tuple[str, ...] | None) -> np.ndarray | None:
    """(A_store,) int64: each store attribute's id among ``head_names`` (by name), ``-1`` for one not there;
    ``None`` when the ids are the store's own (no names to follow, or the same names in the same order)."""
    if head_names is None or store_names is None or tuple(store_names) == tuple(head_names):
        return None
    index = {name: i for i, name in enumerate(head_names)}
    return np.array([index.get(name, -1) for name in store_names], dtype=np.int64)


def _mapped(attribute: np.ndarray, weights: np.ndarray | None, mapping: np.ndarray | None) -> tuple[Any, Any]:
    """The attributes in the head's ids, and the weights with rows of attributes it does not know at 0."""
    if mapping is None:
        return attribute, weights
    mapped = mapping[attribute]
    known = mapped >= 0
    if known.all():
        return mapped, weights
    w = np.where(known, 1.0 if weights is None else np.asarray(weights, dtype=np.float64), 0.0)
    return np.where(known, mapped, -1), w


class _Blocks:
    """A partition's blocks as the head reads them, remembering the last one (to place an error in the store)."""

    def __init__(
        self, store: RowStore, part: int, rows: RowSelection, columns: Columns, mapping: np.ndarray | None
    ) -> None:
        self.store, self.part, self.rows, self.columns, self.mapping = store, part, rows, columns, mapping
        self.current: Block | None = None

    def __iter__(self) -> Iterator[Block]:
        store, rows, columns = self.store, self.rows, self.columns
        held_only = (rows.rule is not None and rows.side == "heldout") or rows.side == "last"
        if not held_only and not columns.attributes and not columns.documents:
            # The common path: the store's own block iteration (for a stream store, windows made in one pass).
            blocks = store.iter_windows(self.part) if columns.windows else store.iter_blocks(self.part)
            for block in blocks:
                yield self._made(block, rows.weights(block, store), None)
            return
        for begin, end in store.block_ranges(self.part):
            selected = None
            weights: np.ndarray | None
            if held_only:
                # The held-out side is a few percent of a training store: only its rows are read and windowed.
                if rows.rule is None:
                    selected = _last_rows(store, begin, end)
                else:
                    selected = held_out_rows(rows.rule, store, begin, end)
                if not selected.any():
                    continue
                if columns.windows:
                    block = store.read_windows(begin, end, selected)
                else:
                    block = store.read_selected(begin, end, selected)
                weights = np.ones(block.num_rows) if block.weight is None else np.asarray(block.weight, np.float64)
            else:
                block = store.read_windows(begin, end) if columns.windows else store.read_rows(begin, end)
                weights = rows.weights(block, store)
            yield self._made(block, weights, selected)

    def _made(self, block: Any, weights: np.ndarray | None, selected: np.ndarray | None) -> Block:
        attribute = documents = None
        start, stop = block.start, block.start + (block.num_rows if selected is None else selected.shape[0])
        if self.columns.attributes:
            attribute, weights = _mapped(
                self.store.read_attributes(start, stop, selected).astype(np.int64), weights, self.mapping
            )
        if self.columns.documents:
            documents = self.store.read_documents(start, stop, selected).astype(np.int64)
        made = Block(block, weights, attribute, documents, self.part, block.start, bool(block.checked))
        self.current = made
        return made


def _streamed(store: RowStore) -> TokenStreamStore:
    """``store`` as a token-stream store (only those have documents' last rows); else a StoreError."""
    if not isinstance(store, TokenStreamStore):
        raise StoreError(f"{store.location}: the last row of each document is read from a token-stream store only")
    return store


def _last_rows(store: RowStore, begin: int, end: int) -> np.ndarray:
    return _streamed(store).last_rows(begin, end)


def partition_blocks(
    store: RowStore, part: int, rows: RowSelection, columns: Columns, mapping: np.ndarray | None = None
) -> _Blocks:
    """Partition ``part``'s blocks under ``rows`` with ``columns``; of a hold-out's held-out side, only the
    held-out rows of each block (a block with none is not read). Iterate it once."""
    return _Blocks(store, part, rows, columns, mapping)


def _replaced(store: RowStore) -> StoreError | None:
    """The store-changed error when the store at ``store``'s location is no longer the one opened (replaced or
    appended to while a pass read it, or gone); ``None`` when it is the same.

    Asked when a task's pass over the rows ends, failed or not: a store replaced under a running pass fails as
    whatever its half-written bytes give (a missing chunk, an id out of range), which would send the user to
    ``validate`` a store that is fine, or reads without an error the rows of two stores."""
    if unchanged(store):  # the root metadata's bytes it was opened from: the same attributes, the same fingerprint
        return None
    try:
        now: str | None = open_store(store).fingerprint()
    except Exception:  # any failure to open it again means it is not the store the pass began on
        now = None
    if now == store.fingerprint():
        return None
    seen = "no store can be opened there now" if now is None else f"its fingerprint is now {now}"
    return StoreError(
        f"{store.location}: the store changed while a pass read it ({seen}, expected {store.fingerprint()}); "
        "run the command again on the store as it is now"
    )


def _run(store: RowStore, part: int, blocks: _Blocks, work: Callable[[Iterator[Block]], Any]) -> Any:
    """``work(blocks)``; a bad value or an impossible row named by store, partition and row; a store replaced
    or removed while the pass read it said to be so."""
    try:
        result = work(iter(blocks))
    except Exception as exc:
        replaced = _replaced(store)
        if replaced is not None:
            raise replaced from None
        if not isinstance(exc, ValueError) or blocks.current is None or isinstance(exc, StoreError):
            raise
        raise _located(store, part, blocks.current, exc) from None
    # Asked after a pass that went well too (one metadata read a task): a whole other store reads without error.
    replaced = _replaced(store)
    if replaced is not None:
        raise replaced
    return result


#: The first item of a task argument made on the worker (:func:`built`).
BUILD = "respattn-build"

#: What :func:`built` made, by key: at most two at a time (a pass's head or grid, and the next one's).
_BUILT: collections.OrderedDict[str, Any] = collections.OrderedDict()
_BUILT_LOCK = threading.Lock()
_BUILT_KEPT = 2


def built(value: Any) -> Any:
    """A task's argument as it is used: ``(BUILD, key, function, args)`` is ``function(*args)`` (its args the parts
    of a head or a grid, which Dask brought to this worker from the workers holding them, and the fit's tables by
    reference: :func:`~dist_respattn.engine.held_tables.held`), made once per worker and ``key`` and shared by the
    worker's tasks, each shared payload among them opened; a shared payload opened
    (:func:`~dist_respattn.engine.payload.opened`); anything else as it is."""
    if not (isinstance(value, tuple) and len(value) == 4 and value[0] == BUILD):
        return opened(value)
    _, key, function, args = value
    with _BUILT_LOCK:
        if key in _BUILT:
            _BUILT.move_to_end(key)
            return _BUILT[key]
    # The fit's tables, by reference, and shared payloads opened (outside the lock: a fetch waits seceded, and a
    # function run on the worker's event loop may wait for the lock: release_chosen).
    args = tuple(opened(arg) for arg in held_args(args))
    with _BUILT_LOCK:
        if key in _BUILT:
            _BUILT.move_to_end(key)
            return _BUILT[key]
        made = function(*args)
        _BUILT[key] = made
        while len(_BUILT) > _BUILT_KEPT:
            _BUILT.popitem(last=False)
        return made


#: How long :func:`release_chosen` waits for a head being made.
RELEASE_WAIT_SECONDS = 1.0

#: The first part of a chosen head's :func:`built` key (:func:`chosen_argument`), then the fit's run tag.
CHOSEN = "respattn-chosen"


def chosen_argument(run: str, label: str, grid: Any, choice: Any) -> tuple[Any, ...]:
    """A task argument that is the head under ``choice`` made on the worker from ``grid`` (the held-out pass's
    grid, or its future: :meth:`~dist_respattn.model.heads.base.Grid.model`), once per worker (:func:`built`)."""
    return (BUILD, f"{CHOSEN}-{run}-{label}", _chosen_head, (grid, choice))


def _chosen_head(grid: Grid, choice: Any) -> Head:
    return grid.model(choice)


def release_chosen(run: str) -> int:
    """Drop the heads this process made for fit ``run`` from its grids (:func:`chosen_argument`): how many.

    A held-out pass's first task on a worker drops the head the E-step before it read, as that pass's head used to
    go when its future was released: the worker does not keep it through the held-out pass and the next E-step."""
    prefix = f"{CHOSEN}-{run}-"
    # Run on a worker's event loop at the fit's end (client.run): it does not wait long for a build under way (what
    # it leaves is bounded by what built keeps).
    if not _BUILT_LOCK.acquire(timeout=RELEASE_WAIT_SECONDS):
        return 0
    try:
        keys = [key for key in _BUILT if key.startswith(prefix)]
        for key in keys:
            del _BUILT[key]
    finally:
        _BUILT_LOCK.release()
    return len(keys)


def common_m_step_task(sharding: Any, common: Any, previous: Any, previous_meta: dict[str, Any] | None) -> Any:
    """A sharded M-step's common part (on its owner): ``previous`` is the E-step's head as a task read it (a shared
    payload, or its common part's arrays)."""
    return sharding.common_m_step(common, built(previous), previous_meta)


def shard_m_step_task(sharding: Any, index: int, shard: Any, tables: Any) -> Any:
    """A sharded M-step's shard ``index`` (on its owner); ``tables``: the fit's, by reference."""
    return sharding.shard_m_step(index, shard, held(tables))


def common_arrays_task(sharding: Any, choice: Any, common_part: Any, tables: Any) -> Any:
    """A head's common part under ``choice`` (on its owner); ``tables``: the fit's, by reference."""
    return sharding.common_arrays(choice, common_part, held(tables))


def shard_arrays_task(sharding: Any, index: int, choice: Any, shard_part: Any, tables: Any) -> Any:
    """A head's shard ``index`` under ``choice`` (on its owner); ``tables``: the fit's, by reference."""
    return sharding.shard_arrays(index, choice, shard_part, held(tables))


def write_part_task(path: str, arrays: dict[str, np.ndarray]) -> int:
    """Write one part of a sharded checkpoint (an npz of ``arrays``) at ``path`` in the checkpoint's temporary
    directory, flushed to disk, and return its bytes (run on the worker that holds the part)."""
    import io

    from dist_respattn.durable.files import write_synced

    data = io.BytesIO()
    np.savez(data, **arrays)  # type: ignore[arg-type]
    payload = data.getvalue()
    try:
        write_synced(path, payload)
    except FileNotFoundError as exc:
        raise OSError(
            f"{exc}: the sharded M-step's owners write their parts of each checkpoint into the model directory, so "
            "it must be on a filesystem every worker can write (or turn the sharded M-step off: --m-step-shards 0)"
        ) from exc
    return len(payload)


def load_part_task(path: str, leave_out: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """One part of a sharded checkpoint, read from ``path`` (the head's part the next passes read), but for the
    arrays named in ``leave_out`` (not read: those the fit's tables hold)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: a part of a sharded checkpoint is missing")
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files if name not in leave_out}


def statistics_task(
    location: StoreLocation,
    part: int,
    trainer: Trainer,
    head: Head,
    fingerprint: str,
    rows: RowSelection = ALL_ROWS,
    mapping: np.ndarray | None = None,
) -> Any:
    """The E-step statistics of partition ``part``'s selected rows under ``head``, its blocks visited in row order.

    Holds one block of rows (one chunk, plus zarr's decode buffers) and the trainer's running statistics at a
    time. ``head`` may come as a shared payload and its tables (:func:`~dist_respattn.engine.payload.opened`).
    """
    head = built(head)
    store = checked_store(location, fingerprint)
    blocks = partition_blocks(store, part, rows, trainer.columns, mapping)
    return _run(store, part, blocks, functools.partial(trainer.statistics, head))


def pass_task(
    location: StoreLocation,
    part: int,
    map_partition: Callable[[Iterator[Block]], Any],
    columns: Columns,
    fingerprint: str,
    rows: RowSelection = ALL_ROWS,
    mapping: np.ndarray | None = None,
) -> Any:
    """``map_partition`` (a kind's own pass: its start, its pairs...) over partition ``part``'s selected rows."""
    store = checked_store(location, fingerprint)
    return _run(store, part, partition_blocks(store, part, rows, columns, mapping), map_partition)


def grid_task(
    location: StoreLocation,
    part: int,
    grid: Grid,
    fingerprint: str,
    rows: RowSelection,
    mapping: np.ndarray | None = None,
    run: str | None = None,
) -> Any:
    """Held-out totals of partition ``part``'s selected rows at every point of an M-step's grid (which may come as
    a shared payload and its tables: :func:`~dist_respattn.engine.payload.opened`).

    With ``run`` (the fit's run tag), what the grid planned from the rows is kept on this worker for the fit's next
    grids, which score it without reading the rows again (:mod:`~dist_respattn.engine.kept_rows`)."""
    if run is not None:
        release_chosen(run)  # the E-step before this pass is over
    grid = built(grid)
    store = checked_store(location, fingerprint)
    key = _rows_key(location, part, fingerprint, rows, mapping)
    if run is not None:
        found = kept_rows.find(run, key)
        if found is not None:
            totals = grid.score_kept(found)
            if totals is not None:
                kept_rows.note_served(run)
                return totals
            kept_rows.drop(run, key)  # made for another support or kind: planned again below
    blocks = partition_blocks(store, part, rows, grid.columns, mapping)
    if run is None:
        return _run(store, part, blocks, grid.score)
    room = kept_rows.budget()
    totals, kept = _run(store, part, blocks, lambda it: grid.score_keeping(it, room))
    if kept is not None:
        kept_rows.keep(run, key, kept, int(kept.nbytes), room)
    return totals


def _rows_key(
    location: StoreLocation, part: int, fingerprint: str, rows: RowSelection, mapping: np.ndarray | None
) -> tuple[Any, ...]:
    """What a partition's kept rows are found by: the store (its fingerprint first: the pass's name among what a
    worker keeps, :func:`~dist_respattn.engine.kept_rows.held_parts`), the partition, the rows counted and the
    attribute map."""
    return (fingerprint, int(part), location, rows, None if mapping is None else np.asarray(mapping).tobytes())


def score_task(
    location: StoreLocation,
    part: int,
    head: Head,
    fingerprint: str,
    rows: RowSelection = ALL_ROWS,
    mapping: np.ndarray | None = None,
) -> Any:
    """Held-out totals of partition ``part``: joint log-likelihood and predictive scores of the targets."""
    store = checked_store(location, fingerprint)
    return _run(store, part, partition_blocks(store, part, rows, head.columns, mapping), head.score)


def _predicted_blocks(
    store: RowStore, part: int, head: Head, top_k: int, mapping: np.ndarray | None
) -> Iterator[tuple[Block, Any]]:
    """Partition ``part``'s blocks, each with its top ``top_k`` predictions (one block held at a time)."""
    blocks = partition_blocks(store, part, ALL_ROWS, head.columns, mapping)
    try:
        for block in blocks:
            try:
                top = head.top_k(block, top_k)
            except ValueError as exc:
                if isinstance(exc, StoreError):
                    raise
                raise _located(store, part, block, exc) from None
            yield block, top
    except Exception:
        replaced = _replaced(store)
        if replaced is not None:
            raise replaced from None
        raise
    replaced = _replaced(store)
    if replaced is not None:
        raise replaced


def predict_task(
    location: StoreLocation,
    part: int,
    head: Head,
    fingerprint: str,
    out: StoreLocation,
    top_k: int,
    mapping: np.ndarray | None = None,
) -> PredictionTotals:
    """Predict partition ``part``'s rows (the top ``top_k`` targets and the attention) into its part of ``out``.

    Holds one block of rows and its predictions at a time; returns how many rows it wrote and how many of
    their targets it ranked first and among the K.
    """
    store = checked_store(location, fingerprint)
    totals = PredictionTotals()

    def blocks() -> Any:
        nonlocal totals
        for block, top in _predicted_blocks(store, part, head, top_k, mapping):
            totals = totals + PredictionTotals.of(top, block.rows.target, block.rows.weight)
            yield block.start, top

    partition = store.partition(part)
    write_prediction_part(
        out, part, partition.start, partition.stop, blocks(), top_k=min(top_k, head.num_targets),
        context_length=head.attention_length,
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
    head: Head,
    fingerprint: str,
    top_k: int,
    mapping: np.ndarray | None = None,
) -> PartitionPredictions:
    """Partition ``part``'s top ``top_k`` targets and their probabilities, returned (a partition's worth:
    ``n (K * 12 + 4)`` bytes) for the driver to write in row order."""
    store = checked_store(location, fingerprint)
    partition = store.partition(part)
    kept = min(int(top_k), head.num_targets)
    targets, probabilities, stored = [np.zeros((0, kept), np.int32)], [np.zeros((0, kept))], [np.zeros(0, np.int32)]
    totals = PredictionTotals()
    for block, top in _predicted_blocks(store, part, head, top_k, mapping):
        totals = totals + PredictionTotals.of(top, block.rows.target, block.rows.weight)
        targets.append(top.targets)
        probabilities.append(top.probabilities)
        stored.append(np.asarray(block.rows.target, dtype=np.int32))
    return PartitionPredictions(
        partition.start, np.concatenate(targets), np.concatenate(probabilities), np.concatenate(stored), totals
    )


def combine_values(*values: Any) -> Any:
    """The sum of additive values, added left to right in the order given (so the result is reproducible):
    :func:`~dist_respattn.model.heads.base.combine`, as the combine tree's task."""
    return combine(list(values))


#: Rows whose (n, T) scores a ranking task holds at once.
RANK_ROWS = 256


def rank_task(
    location: StoreLocation,
    part: int,
    head: Head,
    baselines: RankingBaselines,
    settings: RankingSettings,
    fingerprint: str,
    mapping: np.ndarray | None = None,
) -> RankingTable:
    """Rank the target of the last row of each document of partition ``part`` (a token-stream store's) under
    ``head`` (``"model"``) and the ranking ``baselines``, and return the sums (never the rows).

    A row's history is its document's tokens before the target (read once for a run of rows); the baselines read
    its last N of them (the window the head attends over: a repeat gate's wrapped head's), the protocols all of them
    (what to exclude, what a negative may not be).
    """
    store = _streamed(checked_store(location, fingerprint))
    columns = head.columns | Columns(documents=True)
    blocks = partition_blocks(store, part, LAST_ROWS, columns, mapping)
    n_pos = head.attention_length
    starts = store.document_starts()
    ends = store.document_ends()

    def work(iterator: Iterator[Block]) -> RankingTable:
        table = RankingTable()
        for block in iterator:
            for first in range(0, block.num_rows, RANK_ROWS):
                piece = select_block(block, slice(first, min(first + RANK_ROWS, block.num_rows)))
                documents = np.asarray(piece.documents, dtype=np.int64)
                begin = int(starts[documents[0]])
                tokens = store.read_tokens(begin, int(ends[documents[-1]])).astype(np.int64)
                histories = [tokens[int(starts[d]) - begin : int(ends[d]) - begin - 1] for d in documents]
                scores = {"model": head.block_proba(piece), **baselines.scores([h[-n_pos:] for h in histories])}
                table = table + rank_rows(scores, np.asarray(piece.rows.target), histories, documents, settings)
        return table

    return _run(store, part, blocks, work)
