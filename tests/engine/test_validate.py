"""Validation on a real Dask cluster: the partitions scanned on the workers give the serial scan's report."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from dist_respattn.engine.validate import validate_on_cluster
from dist_respattn.store import validate
from tests.store.helpers import S, edit_attributes, random_rows, shard_file, write_small

pytestmark = pytest.mark.slow  # every test here shares a cluster


def test_validation_on_a_dask_cluster_matches_the_serial_scan(client, tmp_path):
    path = str(tmp_path / "s.zarr")
    write_small(path, random_rows(2000, weighted=True))  # 8 partitions
    assert validate_on_cluster(path, client=client).ok
    zarr.open_array(path + "/query", mode="r+")[1500, 1] = np.nan
    zarr.open_array(path + "/context", mode="r+")[130, 0] = S
    zarr.open_array(path + "/weight", mode="r+")[1999] = -2.0
    shard_file(path, "target", 5).unlink()
    shard_file(path, "query", 6).write_bytes(b"junk")
    serial = validate(path)
    steps = []
    parallel = validate_on_cluster(path, client=client, progress=steps.append)
    assert len(serial.problems) == 8
    assert parallel.problems == serial.problems
    assert (
        (parallel.rows_scanned, parallel.chunks_scanned) == (serial.rows_scanned, serial.chunks_scanned) == (2000, 32)
    )
    assert steps == [1] * 8
    # A structurally damaged store is reported without scanning, cluster or not.
    edit_attributes(path, schema_version=2)
    assert validate_on_cluster(path, client=client).problems == validate(path).problems


def test_a_stream_store_is_scanned_chunk_by_chunk_with_a_cluster_too(client, tmp_path):
    from dist_respattn.store import write_stream_tokens

    path = tmp_path / "s.npy"
    np.save(path, np.random.default_rng(0).integers(0, 40, size=5_000))
    store = write_stream_tokens(tmp_path / "s.zarr", path, 4, num_symbols=40)
    zarr.open_array(str(tmp_path / "s.zarr" / "tokens"), mode="r+")[1234] = 45
    report = validate_on_cluster(store.location, client=client)
    assert report.problems == validate(store.location).problems
    assert [(p.array, p.row) for p in report.problems] == [("tokens", 1234)]
