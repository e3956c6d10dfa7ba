"""The memory plan counts what the kernel a fit runs really holds: token windows of a stream store make no
(n, N) block, so a long window costs a few bytes a row."""

from __future__ import annotations

import numpy as np

from dist_respattn.engine.memory import WINDOW_ROW_BYTES, block_row_bytes
from dist_respattn.model.heads.base import Columns
from dist_respattn.model.memory import WORKER_BASELINE_BYTES, estimate_single_hop_memory
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from dist_respattn.store.rows import open_store

MIB = 2**20


def test_the_histogram_plan_of_a_long_window_is_small(tmp_path):
    rng = np.random.default_rng(0)
    written = write_stream_tokens(
        tmp_path / "s.zarr", rng.integers(0, 50, size=40_000), 8, num_symbols=50,
        options=WriteOptions(chunk_rows=16_384, partition_rows=32_768),
    )  # fmt: skip
    store = open_store(written.location, window=5000, min_context=1)
    n = store.schema.context_length
    assert n == 5000
    windows = block_row_bytes(store, Columns(windows=True))
    encoded = block_row_bytes(store, Columns())
    assert windows == WINDOW_ROW_BYTES and encoded == store.schema.row_bytes >= 4 * n

    def plan(row_bytes: int) -> int:
        shape = (store.schema.num_symbols, n, store.schema.query_dim, store.schema.num_targets)
        return estimate_single_hop_memory(
            shape, row_bytes=row_bytes, block_rows=store.chunk_rows, threads_per_worker=2, fan_in=8
        ).worker_bytes

    # Two threads each holding a few blocks of 16,384 window rows: a few MiB over the worker's own footprint,
    # where blocks of (n, 5000) contexts would be over a GiB.
    assert plan(windows) - WORKER_BASELINE_BYTES < 20 * MIB
    assert plan(encoded) - WORKER_BASELINE_BYTES > 1024 * MIB
