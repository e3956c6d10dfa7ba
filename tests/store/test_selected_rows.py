"""Reading some rows of a range (a hold-out's stripes): the same rows as reading the range and keeping them.

Both store kinds, with documents, chunks and partitions cutting the ranges; and the blocks ``block_ranges``
names are those ``iter_blocks`` reads.
"""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from dist_respattn.store.streams.windows import make_windows, target_positions
from tests.store.helpers import random_rows, write_small


def _stream(path, *, weighted: bool):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 40, 2500)
    starts = np.array([0, 5, 300, 301, 900, 1500, 1507, 2100], dtype=np.int64)  # some documents hold no rows
    weights = rng.uniform(0, 2, tokens.size).astype(np.float32) if weighted else None
    options = WriteOptions(chunk_rows=256, partition_rows=768)
    return write_stream_tokens(path, tokens, 6, num_symbols=40, documents=starts, weights=weights, options=options)


def _kept(rows, keep):
    weight = None if rows.weight is None else rows.weight[keep]
    return rows.context[keep], rows.query[keep], rows.target[keep], weight


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["stream", "triples"])
@pytest.mark.parametrize("weighted", [False, True])
def test_read_selected_equals_the_kept_rows_of_the_range(tmp_path, kind, weighted):
    store = (
        _stream(tmp_path / "s.zarr", weighted=weighted)
        if kind == "stream"
        else write_small(tmp_path / "t.zarr", random_rows(weighted=weighted))
    )
    rng = np.random.default_rng(0)
    ranges = [(0, store.num_rows), (0, 0), (17, 18)] + [
        tuple(sorted(rng.integers(0, store.num_rows + 1, 2).tolist())) for _ in range(8)
    ]
    for start, stop in ranges:
        for share in (0.0, 0.05, 0.5, 1.0):
            keep = rng.random(stop - start) < share
            got = store.read_selected(start, stop, keep)
            want = _kept(store.read_rows(start, stop), keep)
            assert got.start == start
            for a, b in zip((got.context, got.query, got.target, got.weight), want, strict=True):
                assert (a is None and b is None) or (np.array_equal(a, b) and a.dtype == b.dtype)


@pytest.mark.parametrize("kind", ["stream", "triples"])
def test_block_ranges_are_the_blocks_iter_blocks_reads(tmp_path, kind):
    store = _stream(tmp_path / "s.zarr", weighted=False) if kind == "stream" else write_small(tmp_path / "t.zarr")
    for part in range(store.num_partitions):
        for block_rows in (None, 100):
            blocks = list(store.iter_blocks(part, block_rows))
            ranges = store.block_ranges(part, block_rows)
            assert ranges == [(b.start, b.start + b.num_rows) for b in blocks]


def test_compiled_windows_equal_numpy_indexing():
    rng = np.random.default_rng(1)
    span = rng.integers(0, 50, 400).astype(np.uint16)
    table = rng.standard_normal((50, 5)).astype(np.float32)
    local = np.sort(rng.choice(np.arange(8, 400), 120, replace=False))
    context, query, target = make_windows(span, local, 8, table)
    ids = span.astype(np.int32)
    assert np.array_equal(context, ids[local[:, None] - 8 + np.arange(8)]) and context.dtype == np.int32
    assert np.array_equal(query, table[ids[local - 1]]) and query.dtype == np.float32
    assert np.array_equal(target, ids[local]) and target.dtype == np.int32
    # Documents of 0 rows between others, and ranges starting inside, at the edge of, and past a document.
    starts = np.array([0, 10, 12, 12 + 3, 40], dtype=np.int64)
    rows = np.maximum(np.append(starts[1:], 60) - starts - 3, 0)
    row_starts = np.concatenate([[0], np.cumsum(rows)])
    for start in range(int(row_starts[-1]) + 1):
        for stop in range(start, int(row_starts[-1]) + 1):
            r = np.arange(start, stop)
            d = np.searchsorted(row_starts, r, side="right") - 1
            assert np.array_equal(
                target_positions(starts, row_starts, 3, start, stop), starts[d] + 3 + r - row_starts[d]
            )
