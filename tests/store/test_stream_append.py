"""Appending to token-stream stores: the same rows as one write, and nothing lost when an append fails or is killed.

An append adds documents after the committed tokens, in place: it fills the last shard first, and
only then marks the store complete with the new token and document counts. A failed append rolls
itself back; a killed one leaves the store ``appending``, which readers refuse and ``repair``
rolls back to the committed tokens.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.store import WriteOptions
from dist_respattn.store.errors import IncompleteStoreError, SchemaMismatchError
from dist_respattn.store.ingest.to_stream import write_stream_text, write_stream_tokens
from dist_respattn.store.streams.reader import TokenStreamStore
from dist_respattn.store.streams.rollback import rollback_stream_append
from dist_respattn.store.streams.validation import validate_stream
from tests.engine.test_bad_input import run_cli
from tests.store.test_stream_store import all_rows

S = 40
# Shards of 96 tokens in chunks of 32: the first store ends mid-shard, so the append rewrites that shard.
LAYOUT = {"chunk_rows": 32, "partition_rows": 96}


def stream(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, S, length)


def assert_same_store(a: TokenStreamStore, b: TokenStreamStore) -> None:
    assert a.num_tokens == b.num_tokens and a.num_rows == b.num_rows
    np.testing.assert_array_equal(a.document_starts(), b.document_starts())
    for x, y in zip(all_rows(a, by_blocks=True), all_rows(b, by_blocks=True), strict=True):
        if x is None:
            assert y is None
        else:
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("weighted", [False, True])
def test_an_append_reads_as_the_one_write_of_both_streams(tmp_path, weighted):
    first, second = stream(0, 250), stream(1, 170)
    w1, w2 = (np.linspace(0, 1, 250), np.linspace(1, 2, 170)) if weighted else (None, None)
    options = WriteOptions(**LAYOUT)
    write_stream_tokens(tmp_path / "a.zarr", first, 3, num_symbols=S, documents=np.array([0, 100]), weights=w1,
                        options=options)  # fmt: skip
    appended = write_stream_tokens(
        tmp_path / "a.zarr", second, None, documents=np.array([0, 60]), weights=w2,
        options=WriteOptions(append=True),
    )  # fmt: skip
    whole = write_stream_tokens(
        tmp_path / "b.zarr", np.concatenate([first, second]), 3, num_symbols=S,
        documents=np.array([0, 100, 250, 310]), weights=None if w1 is None else np.concatenate([w1, w2]),
        options=options,
    )  # fmt: skip
    assert_same_store(appended, whole)
    assert validate_stream(tmp_path / "a.zarr")[0] == []
    assert [a["tokens"] for a in appended.provenance["appends"]] == [170]
    # Read with another window, the two are still the same rows.
    assert_same_store(appended.with_context(5), whole.with_context(5))


def test_an_append_of_another_shape_is_refused_and_leaves_the_store_as_it_was(tmp_path):
    write_stream_tokens(tmp_path / "a.zarr", stream(0, 250), 3, num_symbols=S, options=WriteOptions(**LAYOUT))
    before = TokenStreamStore.open(tmp_path / "a.zarr").fingerprint()
    with pytest.raises(SchemaMismatchError, match="no weights; drop --weights"):
        write_stream_tokens(tmp_path / "a.zarr", stream(1, 10), None, weights=np.ones(10),
                            options=WriteOptions(append=True))  # fmt: skip
    with pytest.raises(ValueError, match=r"--append to .*a\.zarr: --context 4 .*window N = 3"):
        write_stream_tokens(tmp_path / "a.zarr", stream(1, 10), 4, options=WriteOptions(append=True))
    assert TokenStreamStore.open(tmp_path / "a.zarr").fingerprint() == before


def test_an_append_that_fails_on_a_bad_id_rolls_itself_back(tmp_path):
    layout = WriteOptions(chunk_rows=1 << 14, partition_rows=1 << 16)  # the append keeps the store's layout
    write_stream_tokens(tmp_path / "a.zarr", stream(0, 100_000), 3, num_symbols=S, options=layout)
    before = TokenStreamStore.open(tmp_path / "a.zarr")
    bad = stream(1, 1_600_000)  # two writer blocks: the bad id comes after the first block's shards were written
    bad[1_500_000] = S
    with pytest.raises(ValueError, match=r"\[1500000\] = 40: expected a token id in \[0, 40\)"):
        write_stream_tokens(tmp_path / "a.zarr", bad, None, options=WriteOptions(append=True))
    after = TokenStreamStore.open(tmp_path / "a.zarr")
    assert after.fingerprint() == before.fingerprint()
    assert_same_store(after, before)
    assert sorted(p.name for p in (tmp_path / "a.zarr" / "tokens" / "c").iterdir()) == ["0", "1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr"]  # the abort rolled back and released the lock


# Appends far more tokens than it will ever finish, in small shards.
APPENDER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from dist_respattn.store import WriteOptions
    from dist_respattn.store.ingest.to_stream import write_stream_tokens
    tokens = np.random.default_rng(1).integers(0, 40, 20_000_000, dtype=np.uint8)
    write_stream_tokens(sys.argv[1], tokens, None, options=WriteOptions(append=True))
    """
)


@pytest.mark.slow
def test_a_killed_append_is_refused_by_readers_and_repaired_to_the_committed_tokens(tmp_path):
    path = tmp_path / "a.zarr"
    write_stream_tokens(path, stream(0, 250), 3, num_symbols=S, options=WriteOptions(**LAYOUT))
    before = TokenStreamStore.open(path)
    shards = path / "tokens" / "c"
    proc = subprocess.Popen([sys.executable, "-c", APPENDER, str(path)], stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(shards.iterdir())) < 10:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the append never wrote its shards"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
        if proc.stderr is not None:
            proc.stderr.close()
    attributes = json.loads((path / "zarr.json").read_text())["attributes"]["dist_respattn"]
    assert attributes["state"] == "appending" and attributes["committed"] == {"tokens": 250, "documents": 1}
    # A kill between zarr's write of a file and its rename leaves `<file>.<hex>.partial` (the kill above
    # may or may not land there): one in a committed shard's place and one of the group's metadata.
    for leftover in (shards / f"1.{uuid.uuid4().hex}.partial", path / f"zarr.{uuid.uuid4().hex}.partial"):
        leftover.write_bytes(b"half a file")
    with pytest.raises(IncompleteStoreError, match="an append did not finish; `dist-respattn repair"):
        TokenStreamStore.open(path)
    assert "an append did not finish" in run_cli("validate", str(path)).stdout

    repaired = run_cli("repair", str(path))
    assert repaired.returncode == 0, repaired.stderr
    assert f"{path}: complete, 247 rows" in repaired.stdout
    after = TokenStreamStore.open(path)
    assert after.fingerprint() == before.fingerprint()
    assert_same_store(after, before)
    assert sorted(p.name for p in shards.iterdir()) == ["0", "1", "2"]
    assert not list(path.rglob("*.partial"))
    assert rollback_stream_append(path) == 250  # a complete store is left as it is
    again = write_stream_tokens(path, stream(1, 50), None, options=WriteOptions(append=True))
    assert again.num_tokens == 300


def test_text_appended_to_a_text_stream_uses_its_vocabulary(tmp_path):
    (tmp_path / "a.txt").write_text("def f(x):\n    return x + 1\n" * 20)
    (tmp_path / "b.txt").write_text("def g(y):\n    return f(y) * 2\n" * 5)
    first = write_stream_text(tmp_path / "a.zarr", [tmp_path / "a.txt"], 2, vocab_size=8,
                              options=WriteOptions(**LAYOUT))  # fmt: skip
    like = write_stream_text(tmp_path / "b.zarr", [tmp_path / "b.txt"], None, like=first, options=WriteOptions())
    appended = write_stream_text(tmp_path / "a.zarr", [tmp_path / "b.txt"], None, options=WriteOptions(append=True))
    assert appended.vocabulary() == first.vocabulary()
    tokens = appended._tokens[...]
    np.testing.assert_array_equal(tokens[first.num_tokens :], like._tokens[...])
    np.testing.assert_array_equal(appended.document_starts(), [0, first.num_tokens])
    assert appended.identity() == first.identity()


@pytest.mark.slow
def test_the_cli_appends_to_a_stream_in_its_own_format(tmp_path):
    np.save(tmp_path / "t.npy", stream(0, 250))
    np.save(tmp_path / "u.npy", stream(1, 100))
    out = str(tmp_path / "s.zarr")
    assert run_cli("ingest", out, "--tokens", str(tmp_path / "t.npy"), "--context", "3").returncode == 0
    report = json.loads(run_cli("ingest", out, "--tokens", str(tmp_path / "u.npy"), "--append", "--json").stdout)
    assert report["format"] == "stream" and report["tokens"] == 350 and report["rows_added"] == 97
    refused = run_cli("ingest", out, "--tokens", str(tmp_path / "u.npy"), "--append", "--format", "triples")
    assert refused.returncode == 2
    assert "--format triples: " in refused.stderr
    assert "is a stream store, and an append keeps its format" in refused.stderr
