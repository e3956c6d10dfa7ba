"""Token-stream stores: their rows are ``sequence_windows`` of each document, however the stream is cut.

The stream is written in chunks and shards of tokens and read with any window N; a block's windows
need the N tokens before it, read along, and never cross a document boundary.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store import WriteOptions, validate, write_tokens
from dist_respattn.store.errors import StoreCorruptError
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from dist_respattn.store.rows import open_store
from dist_respattn.store.streams.reader import TokenStreamStore, token_dtype
from tests.engine.test_bad_input import Launched, run_cli


def reference_rows(tokens, starts, n, table, weights=None):
    """``sequence_windows`` of each document, concatenated, and the weight of each row's target token."""
    ends = [*starts[1:], tokens.size]
    parts = [sequence_windows(tokens[a:b], n, num_symbols=table.shape[0], embeddings=table, query_dtype=np.float32)
             for a, b in zip(starts, ends, strict=True)]  # fmt: skip
    context = np.concatenate([p[0] for p in parts])
    query = np.concatenate([p[1] for p in parts])
    target = np.concatenate([p[2] for p in parts])
    w = None
    if weights is not None:
        pieces = [weights[a + n : b] for a, b in zip(starts, ends, strict=True) if b - a > n]
        w = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return context, query, target, w


def all_rows(store, *, by_blocks: bool):
    parts = (
        [b for p in range(store.num_partitions) for b in store.iter_blocks(p)]
        if by_blocks
        else [store.read_partition(p) for p in range(store.num_partitions)]
    )
    starts = [b.start for b in parts]
    assert starts == sorted(starts)
    cat = lambda name: np.concatenate([getattr(b, name) for b in parts])  # noqa: E731
    return cat("context"), cat("query"), cat("target"), None if parts[0].weight is None else cat("weight")


@st.composite
def streams(draw):
    num_symbols = draw(st.integers(1, 300))
    length = draw(st.integers(1, 3000))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, num_symbols, length)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(length - 1, 1)), max_size=12))) - {length})
    chunk = draw(st.sampled_from([7, 64, 256, 1024]))
    partition = chunk * draw(st.integers(1, 4))
    n = draw(st.integers(1, 12))
    weighted = draw(st.booleans())
    weights = rng.uniform(0, 2, length).astype(np.float32) if weighted else None
    return num_symbols, tokens, np.array([0, *cuts], dtype=np.int64), chunk, partition, n, weights


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=streams(), read_n=st.integers(1, 12))
def test_windows_equal_sequence_windows_across_every_boundary(tmp_path_factory, case, read_n):
    num_symbols, tokens, starts, chunk, partition, n, weights = case
    path = tmp_path_factory.mktemp("stream") / "s.zarr"
    write = lambda: write_stream_tokens(  # noqa: E731
        path, tokens, n, num_symbols=num_symbols, documents=starts, weights=weights,
        options=WriteOptions(chunk_rows=chunk, partition_rows=partition),
    )  # fmt: skip
    ends = [*starts[1:], tokens.size]
    if all(b - a <= n for a, b in zip(starts, ends, strict=True)):  # no row at the written window: refused
        with pytest.raises(ValueError, match="give no rows"):
            write()
        assert not path.exists()
        return
    store = write()
    assert store.num_tokens == tokens.size and store.schema.context_length == n
    for window in {n, read_n}:
        reader = store.with_context(window)
        want = reference_rows(tokens, starts, window, reader.embeddings(), weights)
        assert reader.num_rows == want[2].size
        if reader.num_rows == 0:
            continue
        for by_blocks in (False, True):
            got = all_rows(reader, by_blocks=by_blocks)
            assert np.array_equal(got[0], want[0]) and got[0].dtype == np.int32
            assert np.array_equal(got[1], want[1])
            assert np.array_equal(got[2], want[2])
            if weights is not None:
                assert np.array_equal(got[3], want[3])
    # The tokens take the smallest integer type that holds S.
    assert store.describe()["arrays"]["tokens"]["dtype"] == str(token_dtype(num_symbols))


def test_the_store_is_a_few_bytes_a_token_and_reopens_with_its_window(tmp_path):
    rng = np.random.default_rng(0)
    tokens = (rng.zipf(1.3, 400_000) % 20_000).astype(np.int64)
    store = write_stream_tokens(tmp_path / "s.zarr", tokens, 8, num_symbols=20_000)
    info = store.describe()
    # The 20,000 × 32 embedding table is most of it at this size; the ids are about 1.4 bytes a token.
    ids_bytes = sum(os.path.getsize(p) for p in (tmp_path / "s.zarr" / "tokens").rglob("*") if p.is_file())
    assert ids_bytes / tokens.size < 2.0
    assert info["bytes_per_token"] < 2.0 + 20_000 * 32 * 4 / tokens.size
    again = open_store(store.location)
    assert isinstance(again, TokenStreamStore) and again.schema.context_length == 8
    assert open_store(store.location, window=3).num_rows == tokens.size - 3
    assert again.fingerprint() != open_store(store.location, window=3).fingerprint()


def test_a_triple_store_refuses_another_window(tmp_path):
    triples = write_tokens(tmp_path / "t.zarr", np.arange(50) % 7, 4)
    assert open_store(triples.location, window=4).schema.context_length == 4
    with pytest.raises(ValueError, match="a triple store of N = 4: the window is fixed"):
        open_store(triples.location, window=5)


def test_bad_ids_and_document_starts_are_named_by_array_and_position(tmp_path):
    tokens = np.arange(100) % 10
    bad = tokens.copy()
    bad[57] = 10
    with pytest.raises(ValueError, match=r"tokens\[57\] = 10: expected a token id in \[0, 10\)"):
        write_stream_tokens(tmp_path / "a.zarr", bad, 4, num_symbols=10)
    with pytest.raises(ValueError, match=r"documents\[2\] = 30: expected strictly increasing document starts"):
        write_stream_tokens(tmp_path / "b.zarr", tokens, 4, documents=np.array([0, 40, 30]))
    with pytest.raises(ValueError, match=r"weights\[3\] = -1.0: expected a finite, non-negative weight"):
        write_stream_tokens(tmp_path / "c.zarr", tokens, 4, weights=np.array([1, 1, 1, -1] + [1] * 96, float))
    # Without --symbols, S is the largest id + 1, bounded before any table is sized by it.
    stray = tokens.copy()
    stray[63] = 5_000_000
    for write in (write_stream_tokens, write_tokens):
        with pytest.raises(
            ValueError,
            match=r"tokens\[63\] = 5,000,000: a token id that would make S = 5,000,001 "
            r"symbols \(ids alone may imply at most 1,048,576\); give S with --symbols S",
        ):
            write(tmp_path / "d.zarr", stray, 4)
    assert not any(p.name.startswith(("a.zarr", "b.zarr", "c.zarr", "d.zarr")) for p in tmp_path.iterdir())


def test_rows_come_checked_and_a_damaged_table_or_weight_is_named_when_read(tmp_path):
    """A stream's rows are checked as they are made (the model then skips its own scan of them), so a table
    or weight damaged on disk after the write is named by its array and position when a block is read."""
    import zarr

    from dist_respattn.model import random_distribution

    tokens = np.random.default_rng(3).integers(0, 20, 600)
    weights = np.random.default_rng(4).uniform(0.5, 1.5, 600)
    path = tmp_path / "s.zarr"
    store = write_stream_tokens(path, tokens, 4, num_symbols=20, weights=weights)
    block = next(store.iter_blocks(0))
    assert block.checked
    head = random_distribution(20, 4, store.schema.query_dim, 20, seed=0)
    stats = []
    for checked in (False, True):
        accumulator = head.estimator().accumulator_factory().make()
        accumulator.seq_update(block.encoded, block.weight, head, checked=checked)
        stats.append(accumulator.value())
    unchecked, checked_stats = stats[0].to_dict(), stats[1].to_dict()
    assert unchecked.keys() == checked_stats.keys()
    assert all(np.array_equal(unchecked[k], checked_stats[k]) for k in unchecked)

    group = zarr.open_group(str(path), mode="r+")
    weight = group["weight"][...]
    weight[321] = np.nan
    group["weight"][...] = weight
    with pytest.raises(StoreCorruptError, match=r"array 'weight' position 321 = nan: expected a finite, non-negative"):
        open_store(path).read_partition(0)
    group["weight"][...] = weights.astype(np.float32)
    table = group["embeddings"][...]
    table[7, 1] = np.inf
    group["embeddings"][...] = table
    with pytest.raises(StoreCorruptError, match=r"array 'embeddings' entry \[7, 1\] = inf: expected finite embeddings"):
        open_store(path).read_partition(0)


def test_a_truncated_or_missing_shard_is_named(tmp_path):
    tokens = np.random.default_rng(1).integers(0, 50, 4000)
    path = tmp_path / "s.zarr"
    store = write_stream_tokens(
        path, tokens, 4, num_symbols=50, options=WriteOptions(chunk_rows=256, partition_rows=1024)
    )
    shard = path / "tokens" / "c" / "2"
    shard.write_bytes(shard.read_bytes()[:100])
    reopened = open_store(path)
    # The first chunk of the shard, not the one before it whose last tokens the partition's first windows read
    with pytest.raises(
        StoreCorruptError, match=r"array 'tokens' chunk 8 \(tokens 2048\.\.2303, in file 'tokens/c/2'\) cannot be read"
    ):
        reopened.read_partition(2)
    report = validate(path)
    assert not report.ok and report.problems[0].array == "tokens"
    (path / "tokens" / "c" / "3").unlink()
    with pytest.raises(StoreCorruptError, match=r"array 'tokens' shard 3 \(tokens 3072\.\.3999\): file .* is missing"):
        open_store(path).read_partition(3)
    assert store.num_partitions == 4


@pytest.mark.slow
def test_the_cli_writes_checks_and_fits_a_stream_with_a_chosen_window(tmp_path):
    tokens = np.random.default_rng(2).integers(0, 40, 30_000)
    np.save(tmp_path / "t.npy", tokens)
    np.save(tmp_path / "d.npy", np.array([0, 10_000, 10_003, 20_000]))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=tmp_path, timeout=300)

    done = run("ingest", "s.zarr", "--tokens", "t.npy", "--documents", "d.npy", "--context", "6", "--format", "stream")
    assert done.returncode == 0, done.stderr
    assert "30,000 in 4 documents" in done.stdout
    # validate, fit and a refused fit only read the store: they run at once.
    launched = [
        Launched(args, cwd=tmp_path, deadline=300)
        for args in (
            ("validate", "s.zarr"),
            ("fit", "s.zarr", "--model-dir", "m", "--head", "single", "--context", "3", "--max-iter", "2",
             "--workers", "1", "--json"),
            ("fit", "s.zarr", "--model-dir", "m2", "--context", "0"),
        )
    ]  # fmt: skip
    validated, fitted, wrong = (command.wait() for command in launched)
    assert validated.returncode == 0, validated.stdout
    assert fitted.returncode == 0, fitted.stderr
    from dist_respattn.engine import load_checkpoint

    checkpoint = load_checkpoint(Path(tmp_path / "m"))
    assert checkpoint.model.context_length == 3
    assert checkpoint.meta["store"]["window"] == 3
    assert checkpoint.meta["store"]["rows"] == 30_000 - 3 * 3 - 3  # three documents of 3 heads, one of 3 tokens
    assert wrong.returncode == 2 and "--context" in wrong.stderr
