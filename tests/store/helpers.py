"""Shared shapes, inputs and readers for the store tests (no fixtures here: plain functions)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import zarr

from dist_respattn.store import EncodedRows, TripleStore, WriteOptions, write_arrays

#: A small schema: S symbols, context length N, query dim D, T targets.
S, N, D, T = 13, 4, 3, 7
#: 1,000 rows in 64-row chunks and 256-row partitions: 4 partitions, the last one partial (232 rows).
ROWS = 1000
CHUNK, PART = 64, 256
SMALL = WriteOptions(chunk_rows=CHUNK, partition_rows=PART)


def random_rows(n: int = ROWS, *, seed: int = 0, weighted: bool = False, s: int = S, t: int = T) -> dict:
    """Valid inputs of ``n`` rows: int64 ids, float64 queries (not float32-exact), float64 weights."""
    rng = np.random.default_rng(seed)
    rows = {
        "context": rng.integers(0, s, (n, N)),
        "query": rng.standard_normal((n, D)),
        "target": rng.integers(0, t, n),
    }
    if weighted:
        rows["weight"] = rng.random(n) * 3.0
    return rows


def write_small(path, rows: dict | None = None, *, options: WriteOptions = SMALL, **kwargs) -> TripleStore:
    """``write_arrays`` of ``rows`` (default: :func:`random_rows`) with S and T given."""
    rows = random_rows() if rows is None else rows
    return write_arrays(
        path,
        rows["context"],
        rows["query"],
        rows["target"],
        rows.get("weight"),
        num_symbols=kwargs.pop("num_symbols", S),
        num_targets=kwargs.pop("num_targets", T),
        options=options,
        **kwargs,
    )


def read_all(store: TripleStore) -> EncodedRows:
    """Every row through the partition reader (``read_partition``), concatenated."""
    parts = [store.read_partition(p) for p in store.partitions()]
    if not parts:
        return store.read_rows(0, 0)
    weight = None if parts[0].weight is None else np.concatenate([p.weight for p in parts])
    return EncodedRows(
        np.concatenate([p.context for p in parts]),
        np.concatenate([p.query for p in parts]),
        np.concatenate([p.target for p in parts]),
        weight,
        0,
    )


def read_blocks(store: TripleStore, block_rows: int | None = None) -> EncodedRows:
    """Every row through ``iter_blocks`` over every partition, concatenated."""
    blocks = [b for p in store.partitions() for b in store.iter_blocks(p, block_rows)]
    weight = None if blocks[0].weight is None else np.concatenate([b.weight for b in blocks])
    return EncodedRows(
        np.concatenate([b.context for b in blocks]),
        np.concatenate([b.query for b in blocks]),
        np.concatenate([b.target for b in blocks]),
        weight,
        blocks[0].start,
    )


def assert_rows(rows: EncodedRows, context, query, target, weight=None, *, query_dtype=np.float32) -> None:
    """Exact equality of stored rows with the given arrays (queries and weights compared after the store's cast)."""
    assert rows.context.dtype == np.int32 and rows.target.dtype == np.int32
    assert rows.query.dtype == np.dtype(query_dtype)
    np.testing.assert_array_equal(rows.context, np.asarray(context))
    np.testing.assert_array_equal(rows.query, np.asarray(query).astype(query_dtype))
    np.testing.assert_array_equal(rows.target, np.asarray(target))
    if weight is None:
        assert rows.weight is None
    else:
        assert rows.weight is not None and rows.weight.dtype == np.float32
        np.testing.assert_array_equal(rows.weight, np.asarray(weight).astype(np.float32))


def assert_same_rows(a: EncodedRows, b: EncodedRows) -> None:
    for name in ("context", "query", "target", "weight"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        else:
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)


def shard_file(store_path, array: str, partition: int) -> Path:
    """The shard (chunk) file of one partition: ``<array>/c/<p>/0`` for 2-D arrays, ``<array>/c/<p>`` for 1-D."""
    base = Path(store_path) / array / "c" / str(partition)
    return base / "0" if array in ("context", "query") else base


def edit_attributes(store_path, **changes) -> None:
    """Change fields of the ``dist_respattn`` group attribute with zarr itself."""
    group = zarr.open_group(str(store_path), mode="r+")
    attributes = dict(group.attrs["dist_respattn"])
    attributes.update(changes)
    group.attrs["dist_respattn"] = attributes


def copy_store(src, dst) -> None:
    shutil.copytree(os.fspath(src), os.fspath(dst))


def as_if_killed(lock) -> None:
    """Leave a held writer lock as a writer killed now would: no more heartbeats, its pid a dead process's."""
    from tests.artifacts.test_registry_files_lock import stop_heartbeat
    from tests.registry.conftest import dead_pid

    stop_heartbeat(lock)
    record = lock.files.read_json(lock.name)
    lock.files.write_json(lock.name, {**record, "pid": dead_pid()})
