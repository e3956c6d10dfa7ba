"""How rows are cut into chunks and partitions, and how each array is compressed.

Defaults come from the benchmark in ``benchmarks/bench_store.py``:

- a chunk (the unit of a block read) holds about 32 MiB of rows across all arrays, a power of two
  between 1,024 and 1,048,576 rows (131,072 rows at N = 16, D = 32, the E-step kernel's own block).
  zarr spends ~2 ms on each chunk read whatever its size, so halving the chunk count from 16 MiB
  chunks cut the read time by ~15%;
- a partition (one shard per array, one Dask task) is 2 chunks, about 64 MiB — inside the
  10–100 MB a Dask task should move, and few enough files for object stores;
- ids are compressed with LZ4 after a bit shuffle (3.0× smaller, decoded at > 1 GB/s a core);
  float queries are stored raw, since they barely compress (1.14× with LZ4) and decoding them
  would cut read speed by a quarter to a third.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

__all__ = [
    "COMPRESSION_CHOICES",
    "Chunking",
    "choose_chunking",
    "compressors_for",
    "has_checksums",
    "side_compressors",
]

_CHUNK_TARGET_BYTES = 32 << 20
_CHUNKS_PER_PARTITION = 2
_MIN_CHUNK_ROWS = 1 << 10
_MAX_CHUNK_ROWS = 1 << 20

#: ``auto``: ids lz4+bitshuffle, floats raw. The others apply one codec to every array.
COMPRESSION_CHOICES = ("auto", "lz4", "zstd", "none")


@dataclasses.dataclass(frozen=True)
class Chunking:
    """Rows per chunk and per partition (a multiple of the chunk)."""

    chunk_rows: int
    partition_rows: int

    def __post_init__(self) -> None:
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows = {self.chunk_rows}: expected a positive number of rows")
        if self.partition_rows < 1 or self.partition_rows % self.chunk_rows:
            raise ValueError(
                f"partition_rows = {self.partition_rows}: "
                f"expected a positive multiple of chunk_rows = {self.chunk_rows}"
            )


def _floor_power_of_two(value: float) -> int:
    power = 1
    while power * 2 <= value:
        power *= 2
    return power


def choose_chunking(row_bytes: int, chunk_rows: int | None = None, partition_rows: int | None = None) -> Chunking:
    """Chunk and partition sizes for rows of ``row_bytes`` bytes, honouring the ones a user gives.

    A given ``chunk_rows`` alone gets 2 chunks per partition; a given ``partition_rows`` alone gets the
    default chunk size, or the whole partition as one chunk when it is smaller than that.
    """
    default_chunk = min(
        max(_floor_power_of_two(_CHUNK_TARGET_BYTES / max(row_bytes, 1)), _MIN_CHUNK_ROWS), _MAX_CHUNK_ROWS
    )
    if chunk_rows is None and partition_rows is None:
        return Chunking(default_chunk, default_chunk * _CHUNKS_PER_PARTITION)
    if partition_rows is None:
        assert chunk_rows is not None
        return Chunking(int(chunk_rows), int(chunk_rows) * _CHUNKS_PER_PARTITION)
    if chunk_rows is None:
        chunk_rows = default_chunk if partition_rows % default_chunk == 0 else partition_rows
    return Chunking(int(chunk_rows), int(partition_rows))


def compressors_for(kind: str, compression: str) -> tuple[Any, ...]:
    """The zarr compressors for an array of ``kind`` ('ids' or 'floats') under a compression choice, the checksum
    last (it must see the bytes as stored, after compression)."""
    if compression not in COMPRESSION_CHOICES:
        raise ValueError(f"compression = {compression!r}: expected one of {', '.join(COMPRESSION_CHOICES)}")
    lz4 = BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")
    if compression == "none" or (compression == "auto" and kind == "floats"):
        return (Crc32cCodec(),)
    if compression == "zstd":
        return (ZstdCodec(level=3), Crc32cCodec())
    return (lz4, Crc32cCodec())


def side_compressors() -> tuple[Any, ...]:
    """The compressors of a store's side arrays (embedding table, document starts, a true model's arrays): zarr's
    default zstd, then the checksum."""
    return (ZstdCodec(level=0), Crc32cCodec())


def has_checksums(array: Any) -> bool:
    """Whether every chunk of a zarr array carries a CRC-32C (stores written before checksums carry none)."""
    return any(isinstance(codec, Crc32cCodec) for codec in array.compressors)
