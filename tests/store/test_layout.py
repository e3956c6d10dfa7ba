"""How rows are cut into chunks and partitions, how arrays are compressed, and what a partition read touches."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from dist_respattn.store import (
    COMPRESSION_CHOICES,
    Chunking,
    Partition,
    StoreCorruptError,
    StoreSchema,
    TripleStore,
    WriteOptions,
    choose_chunking,
    validate,
)
from dist_respattn.store.layout import compressors_for
from tests.store.helpers import CHUNK, PART, ROWS, D, N, assert_rows, random_rows, shard_file, write_small

# -- chunking ----------------------------------------------------------------------------------


def test_default_chunking_of_the_reference_row():
    row_bytes = StoreSchema(2000, 16, 32, 2000).row_bytes
    assert row_bytes == 16 * 4 + 32 * 4 + 4
    assert choose_chunking(row_bytes) == Chunking(131072, 262144)
    # A weight column (4 more bytes) keeps the same power of two.
    assert choose_chunking(StoreSchema(2000, 16, 32, 2000, has_weight=True).row_bytes) == Chunking(131072, 262144)


@pytest.mark.parametrize(
    ("row_bytes", "expected_chunk"),
    [(1, 1 << 20), (0, 1 << 20), (32, 1 << 20), (33, 1 << 19), (256, 131072), (1 << 20, 1024), (1 << 30, 1024)],
)
def test_default_chunk_is_a_power_of_two_near_32_mib_within_bounds(row_bytes, expected_chunk):
    assert choose_chunking(row_bytes) == Chunking(expected_chunk, 2 * expected_chunk)


def test_chunking_overrides():
    row_bytes = StoreSchema(2000, 16, 32, 2000).row_bytes
    assert choose_chunking(row_bytes, chunk_rows=1000) == Chunking(1000, 2000)
    assert choose_chunking(row_bytes, partition_rows=524288) == Chunking(131072, 524288)
    # A partition that is not a multiple of the default chunk is one chunk.
    assert choose_chunking(row_bytes, partition_rows=1000) == Chunking(1000, 1000)
    assert choose_chunking(row_bytes, chunk_rows=10, partition_rows=30) == Chunking(10, 30)


@pytest.mark.parametrize(
    ("chunk_rows", "partition_rows", "message"),
    [
        (100, 250, "partition_rows = 250: expected a positive multiple of chunk_rows = 100"),
        (100, 50, "partition_rows = 50"),
        (0, 100, "chunk_rows = 0: expected a positive number of rows"),
        (-64, None, "chunk_rows = -64"),
        (None, 0, "partition_rows = 0"),
        (64, -256, "partition_rows = -256"),
    ],
)
def test_invalid_chunkings_are_refused(chunk_rows, partition_rows, message):
    with pytest.raises(ValueError, match=message):
        choose_chunking(100, chunk_rows, partition_rows)


def test_a_writer_refuses_an_invalid_chunking_before_creating_the_store(tmp_path):
    with pytest.raises(ValueError, match="partition_rows = 250"):
        write_small(tmp_path / "s.zarr", options=WriteOptions(chunk_rows=100, partition_rows=250))
    assert not (tmp_path / "s.zarr").exists()


# -- compression -------------------------------------------------------------------------------


def test_compressors_for_each_choice():
    """The chosen compressor, then the checksum (last: it covers the bytes as stored)."""
    assert COMPRESSION_CHOICES == ("auto", "lz4", "zstd", "none")
    ids, checksum = compressors_for("ids", "auto")
    assert isinstance(ids, BloscCodec) and isinstance(checksum, Crc32cCodec)
    assert (ids.cname.value, ids.clevel, ids.shuffle.value) == ("lz4", 5, "bitshuffle")
    assert compressors_for("floats", "auto") == (Crc32cCodec(),)
    assert compressors_for("ids", "none") == compressors_for("floats", "none") == (Crc32cCodec(),)
    for kind in ("ids", "floats"):
        lz4, checksum = compressors_for(kind, "lz4")
        assert isinstance(lz4, BloscCodec) and lz4.cname.value == "lz4" and isinstance(checksum, Crc32cCodec)
        zstd, checksum = compressors_for(kind, "zstd")
        assert isinstance(zstd, ZstdCodec) and zstd.level == 3 and isinstance(checksum, Crc32cCodec)
    with pytest.raises(ValueError, match="compression = 'gzip': expected one of auto, lz4, zstd, none"):
        compressors_for("ids", "gzip")


@pytest.mark.parametrize(
    ("compression", "ids", "floats"),
    [
        ("auto", ["BloscCodec", "Crc32cCodec"], ["Crc32cCodec"]),
        ("lz4", ["BloscCodec", "Crc32cCodec"], ["BloscCodec", "Crc32cCodec"]),
        ("zstd", ["ZstdCodec", "Crc32cCodec"], ["ZstdCodec", "Crc32cCodec"]),
    ],
)
def test_stored_arrays_use_the_chosen_compressors(tmp_path, compression, ids, floats):
    rows = random_rows(weighted=True)
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, compression=compression)
    store = write_small(tmp_path / "s.zarr", rows, options=options)
    arrays = store.describe()["arrays"]
    assert arrays["context"]["compressors"] == ids and arrays["target"]["compressors"] == ids
    assert arrays["query"]["compressors"] == floats and arrays["weight"]["compressors"] == floats
    assert store.attributes["compression"] == compression
    assert_rows(store.read_rows(0, ROWS), rows["context"], rows["query"], rows["target"], rows["weight"])


def test_describe_reports_the_layout(tmp_path):
    store = write_small(tmp_path / "s.zarr")
    info = store.describe()
    assert (info["rows"], info["chunk_rows"], info["partition_rows"], info["partitions"]) == (ROWS, CHUNK, PART, 4)
    assert info["arrays"]["context"]["chunks"] == [CHUNK, N] and info["arrays"]["context"]["shards"] == [PART, N]
    assert info["arrays"]["query"]["chunks"] == [CHUNK, D] and info["arrays"]["target"]["shards"] == [PART]
    assert info["arrays"]["query"]["dtype"] == "float32" and info["arrays"]["context"]["dtype"] == "int32"
    assert info["fingerprint"] == store.fingerprint() and not info["has_true_model"]


def test_one_file_per_partition_and_array(tmp_path):
    store = write_small(tmp_path / "s.zarr")
    for name in ("context", "query", "target"):
        found = sorted(os.listdir(tmp_path / "s.zarr" / name / "c"))
        assert found == ["0", "1", "2", "3"], name
        for p in range(4):
            assert shard_file(store.location.url, name, p).is_file()


# -- partitions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "chunk_rows", "partition_rows"),
    [(1000, 64, 256), (1024, 64, 256), (10, 64, 256), (300, 100, 100), (257, 1, 4)],
)
@pytest.mark.slow
def test_partitions_cover_every_row_once_and_are_chunk_aligned(tmp_path, rows, chunk_rows, partition_rows):
    options = WriteOptions(chunk_rows=chunk_rows, partition_rows=partition_rows)
    store = write_small(tmp_path / "s.zarr", random_rows(rows), options=options)
    parts = store.partitions()
    assert len(parts) == store.num_partitions == math.ceil(rows / partition_rows)
    assert [p.index for p in parts] == list(range(len(parts)))
    covered = np.zeros(rows, dtype=int)
    for part in parts:
        assert part.start % chunk_rows == 0 and part.start % partition_rows == 0
        assert 0 < part.num_rows <= partition_rows
        covered[part.start : part.stop] += 1
    assert (covered == 1).all()
    assert parts[-1].stop == rows


@pytest.mark.parametrize("block_rows", [None, 1, 7, 64, 100, 256, 5000])
def test_iter_blocks_concatenates_to_the_partition(tmp_path, block_rows):
    store = write_small(tmp_path / "s.zarr", random_rows(weighted=True))
    # One full partition and the last, partial one (both read in full for the small block sizes too).
    for part in (store.partition(1), store.partition(3)):
        if block_rows == 1:
            part = Partition(part.index, part.start, part.start + 40)  # 40 one-row reads are enough
        whole = store.read_partition(part)
        blocks = list(store.iter_blocks(part, block_rows))
        step = CHUNK if block_rows is None else block_rows
        assert [b.start for b in blocks] == list(range(part.start, part.stop, step))
        assert all(b.num_rows <= step for b in blocks)
        for name in ("context", "query", "target", "weight"):
            np.testing.assert_array_equal(np.concatenate([getattr(b, name) for b in blocks]), getattr(whole, name))
    # A partition may be given by its index.
    assert [b.start for b in store.iter_blocks(3)] == [768, 832, 896, 960]


def test_bad_partition_block_and_row_requests_are_refused(tmp_path):
    store = write_small(tmp_path / "s.zarr")
    with pytest.raises(IndexError, match=r"partition 4 out of range \[0, 4\)"):
        store.partition(4)
    with pytest.raises(IndexError):
        store.read_partition(-1)
    with pytest.raises(ValueError, match="block_rows = 0"):
        next(store.iter_blocks(0, 0))
    with pytest.raises(IndexError, match=r"rows \[990, 1001\) outside \[0, 1000\)"):
        store.read_rows(990, 1001)
    with pytest.raises(IndexError):
        store.read_rows(10, 5)


def test_a_partition_read_touches_only_its_own_chunk_files(tmp_path):
    rows = random_rows(weighted=True)
    store = write_small(tmp_path / "s.zarr", rows)
    keep = 2
    for p in range(store.num_partitions):
        if p != keep:
            for name in ("context", "query", "target", "weight"):
                shard_file(tmp_path / "s.zarr", name, p).unlink()
    store = TripleStore.open(tmp_path / "s.zarr")
    part = store.partition(keep)
    expected = [None if a is None else a[part.start : part.stop] for a in rows.values()]
    assert_rows(store.read_partition(part), *expected)
    blocks = list(store.iter_blocks(part, 50))
    assert_rows(store.read_rows(part.start, part.stop), *expected)
    assert np.array_equal(np.concatenate([b.target for b in blocks]), expected[2])
    # The partitions whose files are gone refuse to read, naming what is missing.
    with pytest.raises(StoreCorruptError, match="partition 1"):
        store.read_partition(1)
    assert not validate(store.location).ok
