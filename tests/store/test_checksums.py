"""Chunk checksums: bytes changed inside a chunk file of either store kind are found by ``validate`` and by any read,
named by array, chunk and position; a store written before checksums still reads, and ``validate`` says what it
cannot check.

The damage is real: 4 bytes of a chunk file overwritten on disk. A store "from before checksums" is made with zarr
itself, by writing every array again with the codecs it had then (no ``crc32c``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec

from dist_respattn.store import StoreCorruptError, TokenStreamStore, TripleStore, WriteOptions, validate
from dist_respattn.store.identity import embedding_sha256
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.store.helpers import CHUNK, PART, N, assert_same_rows, read_all, shard_file, write_small

#: Enough symbols that the ids (uint16) barely compress, so an edit lands in the values, not in a header.
STREAM_SYMBOLS, STREAM_TOKENS = 50_000, 1000
#: Inside the first chunk's stored bytes, past any codec header.
OFFSET = 100


def overwrite(path: Path, offset: int = OFFSET) -> None:
    """Overwrite 4 bytes of a file in place with zeros (small ids, zero floats: values that pass every range check)."""
    data = bytearray(path.read_bytes())
    assert data[offset : offset + 4] != bytes(4), "the edit must change the file"
    data[offset : offset + 4] = bytes(4)
    path.write_bytes(bytes(data))


def strip_checksums(path: Path) -> None:
    """Write every array of the store at ``path`` again as a store from before checksums had it: same chunks, shards,
    fill value and compressors, without the ``crc32c`` codec; the group's attributes are left as they are."""
    group = zarr.open_group(str(path), mode="r+")
    for name, array in list(group.arrays()):
        values, compressors = array[...], tuple(c for c in array.compressors if not isinstance(c, Crc32cCodec))
        chunks, shards, fill = array.chunks, array.shards, array.fill_value
        again = group.create_array(
            name, shape=values.shape, dtype=values.dtype, chunks=chunks, shards=shards, compressors=compressors,
            fill_value=fill, config={"write_empty_chunks": True}, overwrite=True,
        )  # fmt: skip
        again[...] = values


@pytest.fixture
def stream_path(tmp_path) -> Path:
    tokens = np.random.default_rng(0).integers(0, STREAM_SYMBOLS, STREAM_TOKENS)
    path = tmp_path / "t.zarr"
    write_stream_tokens(
        path, tokens, N, num_symbols=STREAM_SYMBOLS, dim=3, options=WriteOptions(chunk_rows=CHUNK, partition_rows=PART)
    )
    return path


@pytest.fixture
def triples_path(tmp_path) -> Path:
    path = tmp_path / "s.zarr"
    write_small(path)
    return path


def test_every_array_of_both_kinds_carries_a_checksum(stream_path, triples_path):
    for path in (stream_path, triples_path):
        group = zarr.open_group(str(path), mode="r")
        for name, array in group.arrays():
            assert isinstance(array.compressors[-1], Crc32cCodec), (path, name, array.compressors)
        assert validate(path).notes == []


def test_changed_bytes_in_a_token_shard_are_found_by_validate_and_by_a_read(stream_path):
    overwrite(stream_path / "tokens" / "c" / "0")
    report = validate(stream_path)
    assert [(p.array, p.chunk, p.row) for p in report.problems] == [("tokens", 0, 0)], report.summary()
    assert "checksum does not match" in report.problems[0].message
    summary = report.summary().splitlines()
    assert summary[1] == f"  array 'tokens', chunk 0, row 0: {report.problems[0].message}"
    store = TokenStreamStore.open(stream_path, N)
    with pytest.raises(StoreCorruptError) as raised:
        list(store.iter_blocks(0))
    message = str(raised.value)
    assert "\n" not in message and "array 'tokens' chunk 0 (tokens 0..63, in file 'tokens/c/0')" in message, message
    assert "checksum does not match" in message
    store.read_rows(store.partition(1).start, store.partition(1).stop)  # the other shards read as before


def test_changed_bytes_in_a_triple_stores_chunk_are_found_by_validate_and_by_a_read(triples_path):
    overwrite(shard_file(triples_path, "query", 0))  # float queries are stored raw: any change is a valid float
    report = validate(triples_path)
    assert [(p.array, p.chunk, p.row) for p in report.problems] == [("query", 0, 0)], report.summary()
    assert "checksum does not match" in report.problems[0].message
    with pytest.raises(StoreCorruptError, match=r"^[^\n]*array 'query' chunk 0 \(rows 0\.\.255\).*checksum does not"):
        TripleStore.open(triples_path).read_partition(0)


def test_a_changed_embedding_table_is_named(stream_path):
    overwrite(stream_path / "embeddings" / "c" / "0" / "0", offset=8)
    report = validate(stream_path)
    assert [p.array for p in report.problems] == ["embeddings"], report.summary()
    assert "checksum does not match" in report.problems[0].message
    with pytest.raises(StoreCorruptError, match="array 'embeddings' cannot be read: its checksum does not match"):
        TokenStreamStore.open(stream_path, N)


@pytest.mark.parametrize("kind", ["stream", "triples"])
def test_a_store_from_before_checksums_reads_and_validate_says_it_carries_none(kind, stream_path, triples_path):
    path = stream_path if kind == "stream" else triples_path
    before = read_all(TokenStreamStore.open(path, N) if kind == "stream" else TripleStore.open(path))
    strip_checksums(path)
    store = TokenStreamStore.open(path, N) if kind == "stream" else TripleStore.open(path)
    assert_same_rows(read_all(store), before)
    report = validate(path)
    assert report.ok and len(report.notes) == 1, report.summary()
    assert "carry no checksums" in report.notes[0] and "write the store again" in report.notes[0]
    assert report.summary().splitlines()[-1] == f"  note: {report.notes[0]}"
    # What the checksums are for: the same edit in such a store changes values and nothing notices.
    overwrite(path / "tokens" / "c" / "0" if kind == "stream" else shard_file(path, "query", 0))
    assert validate(path).ok
    changed = read_all(TokenStreamStore.open(path, N) if kind == "stream" else TripleStore.open(path))
    assert not np.array_equal(changed.query, before.query) or not np.array_equal(changed.context, before.context)


@pytest.mark.slow
def test_the_commands_name_changed_bytes_and_an_edited_table(stream_path):
    """``validate`` exits 1 naming the changed chunk; ``info`` prints the identity computed from the edited table and
    says it does not match the record."""
    command = str(Path(sys.executable).parent / "dist-respattn")
    overwrite(stream_path / "tokens" / "c" / "0")
    table = zarr.open_array(str(stream_path / "embeddings"), mode="r+")
    table[...] = table[...][::-1]
    result = subprocess.run([command, "validate", str(stream_path)], capture_output=True, text=True, check=False)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{stream_path}: 2 problem(s)"), result.stdout
    assert any(
        line.startswith("  array 'tokens', chunk 0, row 0: ") and "checksum does not match" in line for line in lines
    )
    assert any(line.startswith("  array 'embeddings': ") and "changed after" in line for line in lines)
    info = subprocess.run([command, "info", str(stream_path)], capture_output=True, text=True, check=False)
    assert info.returncode == 0, info.stderr
    computed = embedding_sha256(table[...])[:12]
    assert f"embedding table {computed}" in info.stdout
    assert "does not match the record: embeddings hashes to " + computed in info.stdout
