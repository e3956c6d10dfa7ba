"""Crash safety: a writer killed midway (a real SIGKILL'd subprocess) never leaves a store that opens as valid,
and a writer that fails on bad input cleans up after itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import zarr

import dist_respattn.store.ingest.tokens as tokens_module
from dist_respattn.store import (
    IncompleteStoreError,
    StoreError,
    StoreSchema,
    StoreWriter,
    TripleStore,
    WriteOptions,
    rollback_append,
    validate,
    write_synthetic,
    write_tokens,
)
from tests.store.helpers import (
    ROWS,
    SMALL,
    D,
    N,
    S,
    T,
    as_if_killed,
    assert_rows,
    assert_same_rows,
    random_rows,
    read_all,
    shard_file,
    write_small,
)

# Writes (or appends) far more rows than it will ever finish, one small partition at a time.
WRITER = textwrap.dedent(
    f"""
    import sys
    from dist_respattn.store import WriteOptions, write_synthetic
    path, mode = sys.argv[1:3]
    if mode == "new":
        write_synthetic(path, 50_000_000, num_symbols={S}, context_length={N}, query_dim={D}, num_targets={T},
                        seed=1, options=WriteOptions(chunk_rows=256, partition_rows=1024))
    else:
        write_synthetic(path, 50_000_000, seed=1, options=WriteOptions(append=True))
    """
)


def kill_when(path: Path, mode: str, ready) -> None:
    """Run the writer, SIGKILL it as soon as ``ready()`` holds, and wait for it to die."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        deadline = time.monotonic() + 120
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"the writer ended on its own ({proc.returncode}): {proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                pytest.fail("the writer never got far enough")
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def chunk_files(path: Path, array: str) -> list[str]:
    folder = path / array / "c"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


@pytest.mark.slow
def test_a_killed_new_writer_leaves_a_store_that_refuses_to_open(tmp_path):
    path = tmp_path / "s.zarr"
    kill_when(path, "new", lambda: (path / "zarr.json").is_file() and len(chunk_files(path, "context")) >= 3)

    assert zarr.open_group(str(path), mode="r").attrs["dist_respattn"]["state"] == "writing"
    with pytest.raises(IncompleteStoreError, match="the writer stopped before finishing this store"):
        TripleStore.open(path)
    report = validate(path)
    assert not report.ok
    assert any("state 'writing'" in p.message for p in report.problems)
    # A new store has no committed rows to roll back to.
    with pytest.raises(StoreError, match="only an interrupted append can be rolled back"):
        rollback_append(path)
    with pytest.raises(IncompleteStoreError):
        TripleStore.open(path)


@pytest.mark.slow
def test_a_killed_append_is_rolled_back_to_the_committed_rows(tmp_path):
    path = tmp_path / "s.zarr"
    # 1,000 rows ending mid-partition, so the append rewrites the shard of committed rows 768..999.
    store = write_synthetic(path, ROWS, num_symbols=S, context_length=N, query_dim=D, num_targets=T, options=SMALL)
    committed, fingerprint = read_all(store), store.fingerprint()

    kill_when(path, "append", lambda: len(chunk_files(path, "target")) >= 8)  # partitions 4..7 are new

    attributes = zarr.open_group(str(path), mode="r").attrs["dist_respattn"]
    assert attributes["state"] == "appending" and attributes["rows"] == ROWS
    assert zarr.open_array(str(path / "target"), mode="r").shape[0] > ROWS  # uncommitted rows were written
    with pytest.raises(IncompleteStoreError, match=r"an append was interrupted.*1000 committed rows are intact"):
        TripleStore.open(path)
    report = validate(path)
    assert not report.ok and any("state 'appending'" in p.message for p in report.problems)
    # What a kill between zarr's write of a chunk and its rename leaves: the rollback deletes it.
    (path / "target" / "c" / f"2.{uuid.uuid4().hex}.partial").write_bytes(b"half a chunk")

    assert rollback_append(path) == ROWS
    assert not list(path.rglob("*.partial"))
    restored = TripleStore.open(path)
    assert restored.num_rows == ROWS and restored.fingerprint() == fingerprint
    assert restored.provenance["appends"] == []
    assert_same_rows(read_all(restored), committed)
    assert validate(path).ok
    assert rollback_append(path) == ROWS  # a complete store is left as it is

    # And the store takes a new append after the rollback.
    again = write_synthetic(path, 100, seed=1, options=WriteOptions(append=True))
    assert again.num_rows == ROWS + 100
    assert_same_rows(again.read_rows(0, ROWS), committed)
    assert validate(path).ok


# -- failures on bad input ---------------------------------------------------------------------


def test_a_new_store_that_fails_on_bad_input_is_deleted(tmp_path):
    rows = random_rows(2000)
    rows["context"][1300, 2] = S + 1  # after five partitions were written
    written = []
    options = WriteOptions(chunk_rows=64, partition_rows=256, progress=written.append)
    with pytest.raises(
        ValueError, match=rf"^context: context\[1300, 2\] = {S + 1}: expected a symbol id in \[0, {S}\)"
    ):
        write_small(tmp_path / "s.zarr", rows, options=options)
    assert sum(written) == 1280  # rows were on disk before the bad block
    assert not (tmp_path / "s.zarr").exists()


def test_a_new_token_store_that_fails_on_a_bad_id_is_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)
    tokens = np.random.default_rng(0).integers(0, 10, 2000)
    tokens[1234] = 10
    np.save(tmp_path / "tokens.npy", tokens)
    with pytest.raises(ValueError, match=r"tokens\.npy\[1234\] = 10: expected a token id in \[0, 10\)"):
        write_tokens(tmp_path / "t.zarr", tmp_path / "tokens.npy", 4, num_symbols=10, options=SMALL)
    assert not (tmp_path / "t.zarr").exists()


def test_a_failing_append_rolls_itself_back(tmp_path):
    store = write_small(tmp_path / "s.zarr")
    before, fingerprint = read_all(store), store.fingerprint()
    rows = random_rows(900, seed=1)
    rows["target"][700] = T  # global row 700 of the append (store row 1700), after three flushes
    with pytest.raises(ValueError, match=rf"^target: target\[700\] = {T}: expected a target id in \[0, {T}\)"):
        write_small(tmp_path / "s.zarr", rows, options=WriteOptions(append=True))
    after = TripleStore.open(tmp_path / "s.zarr")
    assert after.num_rows == ROWS and after.attributes["state"] == "complete"
    assert after.fingerprint() == fingerprint and after.provenance["appends"] == []
    assert_same_rows(read_all(after), before)
    assert validate(after.location).ok
    # The rolled-back store appends normally afterwards.
    rows["target"][700] = 0
    again = write_small(tmp_path / "s.zarr", rows, options=WriteOptions(append=True))
    assert_rows(again.read_rows(ROWS, ROWS + 900), rows["context"], rows["query"], rows["target"])


def test_a_failing_token_append_rolls_itself_back(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)
    tokens = np.random.default_rng(0).integers(0, 10, 700)
    store = write_tokens(tmp_path / "t.zarr", tokens, 3, num_symbols=10, options=SMALL)
    before, fingerprint = read_all(store), store.fingerprint()
    bad = tokens.copy()
    bad[600] = -2
    with pytest.raises(ValueError, match=r"tokens\[600\] = -2"):
        write_tokens(tmp_path / "t.zarr", bad, 3, options=WriteOptions(append=True))
    after = TripleStore.open(tmp_path / "t.zarr")
    assert after.fingerprint() == fingerprint
    assert_same_rows(read_all(after), before)
    assert validate(after.location).ok


def test_rollback_of_a_store_that_is_not_appending(tmp_path):
    write_small(tmp_path / "s.zarr")
    assert rollback_append(tmp_path / "s.zarr") == ROWS
    with pytest.raises(StoreError, match=r"nothing\.zarr: no such file or directory"):
        rollback_append(tmp_path / "nothing.zarr")


@pytest.mark.slow
def test_rollback_restores_an_append_interrupted_between_flushes(tmp_path):
    """The on-disk state a killed append leaves, made by an append that is never closed."""
    rows = random_rows(weighted=True)
    store = write_small(tmp_path / "s.zarr", rows)
    before, fingerprint = read_all(store), store.fingerprint()
    writer = StoreWriter.append(tmp_path / "s.zarr", StoreSchema(S, N, D, T, has_weight=True))
    more = random_rows(600, seed=2, weighted=True)
    writer.write(more["context"], more["query"], more["target"], more["weight"])  # flushes 1000..1536
    as_if_killed(writer._lock)  # never closed nor aborted: as if the process died here
    del writer
    assert zarr.open_array(str(tmp_path / "s.zarr" / "query"), mode="r").shape[0] == 1536
    assert shard_file(tmp_path / "s.zarr", "query", 5).exists()
    with pytest.raises(IncompleteStoreError):
        TripleStore.open(tmp_path / "s.zarr")
    assert rollback_append(tmp_path / "s.zarr") == ROWS
    after = TripleStore.open(tmp_path / "s.zarr")
    assert after.fingerprint() == fingerprint
    assert_same_rows(read_all(after), before)
    assert validate(after.location).ok


def test_an_unknown_compression_leaves_nothing_behind(tmp_path):
    with pytest.raises(ValueError, match="compression = 'gzip'"):
        write_small(tmp_path / "s.zarr", options=WriteOptions(compression="gzip"))
    assert not (tmp_path / "s.zarr").exists()
