"""One writer at a time: ``ingest``, ``--append``, ``--overwrite`` and ``repair`` take the store's lock.

The writers are real processes (``dist-respattn`` commands, and writers that run until the test lets them
close); the lock is the file ``<store>.lock`` beside the store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from dist_respattn.store import StoreError, TripleStore, WriteOptions, rollback_append, validate, write_synthetic
from tests.engine.test_bad_input import Launched, run_cli
from tests.store.helpers import D, N, S, T, as_if_killed, random_rows

#: Small partitions, so a writer flushes a shard every few hundred rows.
TINY = WriteOptions(chunk_rows=256, partition_rows=1024)
BASE_ROWS = 3000

#: A writer (a new store, or an append) that writes blocks of rows until the file STOP appears, then closes
#: and prints the rows it wrote: it runs as long as the test needs, whatever the machine's speed.
WRITER = f"""
import os, sys
import numpy as np
from dist_respattn.store import StoreSchema, StoreWriter
path, mode, stop = sys.argv[1:]
schema = StoreSchema({S}, {N}, {D}, {T})
writer = (StoreWriter.append(path, schema) if mode == "append"
          else StoreWriter.create(path, schema, chunk_rows=256, partition_rows=1024, overwrite=mode == "overwrite"))
rng, written = np.random.default_rng(0), 0
while not os.path.exists(stop) or written < 4096:
    writer.write(rng.integers(0, {S}, (512, {N})), rng.standard_normal((512, {D})), rng.integers(0, {T}, 512))
    written += 512
writer.close()
print(written)
"""


def run_at_once(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Several ``dist-respattn`` commands started together (none depends on another's end); their results in order."""
    launched = [Launched(command, deadline=120) for command in commands]
    return [command.wait() for command in launched]


def start_writer(path: Path, mode: str, stop: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", WRITER, str(path), mode, str(stop)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(writer: subprocess.Popen[str], stop: Path) -> int:
    """Let the writer close; the rows it wrote."""
    stop.touch()
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    return int(out)


def synthetic_store(path: Path) -> TripleStore:
    return write_synthetic(
        path, BASE_ROWS, num_symbols=S, context_length=N, query_dim=D, num_targets=T, seed=0, options=TINY
    )


def state(path: Path) -> str:
    return str(zarr.open_group(str(path), mode="r").attrs["dist_respattn"]["state"])


def wait_until(ready, what: str, proc: subprocess.Popen[str] | None = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the writer ended before {what} ({proc.returncode}): {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def appending(path: Path) -> bool:
    try:
        return state(path) == "appending" and len(os.listdir(path / "target" / "c")) > BASE_ROWS // 1024 + 3
    except (OSError, KeyError):
        return False


@pytest.mark.slow  # a writer, then two commands at once beside it: ~4 s, more on a busy machine
def test_repair_during_a_running_append_is_refused_and_the_append_loses_nothing(tmp_path):
    """The reported loss: ``repair`` while ``ingest --append`` runs rolled the append's rows back under it
    ("still damaged after the rollback"), then the append marked the store complete with chunks missing.
    Now ``repair`` is refused naming the live writer, and the append ends with every row. A reader meanwhile
    is told a writer is at work, not to run ``repair``."""
    path, stop = tmp_path / "big.zarr", tmp_path / "stop"
    synthetic_store(path)
    writer = start_writer(path, "append", stop)
    wait_until(lambda: appending(path), "the append to write new shards", writer)

    repair, info = run_at_once(("repair", str(path)), ("info", str(path)))
    appended = finish(writer, stop)

    assert repair.returncode == 2, (repair.stdout, repair.stderr)
    message = repair.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"{path}.lock" in message and "another writer" in message and f"append, pid {writer.pid} on " in message
    report = validate(path)
    assert report.ok, report.summary()
    assert TripleStore.open(path).num_rows == BASE_ROWS + appended
    assert not Path(f"{path}.lock").exists()  # released on success

    assert info.returncode == 2
    assert f"being written by another writer (-c {path} append, append, pid {writer.pid} on " in info.stderr
    assert "run `dist-respattn repair`" not in info.stderr, info.stderr


@pytest.mark.slow  # a writer, then three commands at once beside it: ~4 s
def test_a_second_writer_is_refused_while_the_first_runs(tmp_path):
    """Two writers to one new path: the second is refused at once, and the first writes a sound store."""
    path, stop = tmp_path / "new.zarr", tmp_path / "stop"
    first = start_writer(path, "new", stop)
    wait_until(lambda: (path / "target" / "c").is_dir(), "the first writer to write rows", first)
    refused = run_at_once(
        *(("synth", str(path), "--rows", "10", "--symbols", "3", "--context", "2", "--dim", "2", "--targets", "3",
           *extra) for extra in ((), ("--overwrite",))),
        ("synth", str(path), "--rows", "10", "--append"),
    )  # fmt: skip
    written = finish(first, stop)
    for second in refused:
        assert second.returncode == 2, second.stderr
        assert "another writer" in second.stderr and f"new store, pid {first.pid} on " in second.stderr
        assert "run `dist-respattn repair`" not in second.stderr  # the writer is alive, not interrupted
    assert validate(path).ok and TripleStore.open(path).num_rows == written


KILLED_APPEND = """
import sys
from dist_respattn.store import WriteOptions, write_synthetic
write_synthetic(sys.argv[1], 50_000_000, seed=1, options=WriteOptions(append=True))
"""


@pytest.mark.slow  # two processes: ~4 s
def test_a_killed_writers_lock_is_broken_by_repair(tmp_path):
    """A writer SIGKILLed mid-append leaves its lock; its process is gone, so ``repair`` breaks it and rolls back."""
    path = tmp_path / "big.zarr"
    store = synthetic_store(path)
    fingerprint = store.fingerprint()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_APPEND, str(path)], stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: appending(path), "the append to write new shards")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lock = json.loads(Path(f"{path}.lock").read_text())
    assert lock["pid"] == proc.pid and lock["purpose"] == "append"

    repaired = run_cli("repair", str(path))
    assert repaired.returncode == 0, repaired.stderr
    assert f"breaking a stale lock (its process {proc.pid} on this host is gone)" in repaired.stderr
    assert repaired.stdout == f"{path}: complete, {BASE_ROWS:,} rows\n"
    assert TripleStore.open(path).fingerprint() == fingerprint
    assert not Path(f"{path}.lock").exists()


def test_a_live_lock_refuses_the_python_writers_and_rollback(tmp_path):
    """The same lock guards the Python API: a lock held by a live process (this one) refuses every writer."""
    from dist_respattn.store.lock import StoreLock, StoreLocked

    path = tmp_path / "s.zarr"
    synthetic_store(path)
    with StoreLock.of(path, purpose="test"):
        with pytest.raises(StoreLocked, match=r"another writer \(.*pid \d+"):
            write_synthetic(path, 10, seed=1, options=WriteOptions(append=True))
        with pytest.raises(StoreLocked):
            rollback_append(path)
        with pytest.raises(StoreLocked):
            write_synthetic(path, 10, num_symbols=S, context_length=N, query_dim=D, num_targets=T,
                            options=WriteOptions(overwrite=True))  # fmt: skip
    assert state(path) == "complete" and TripleStore.open(path).num_rows == BASE_ROWS
    assert write_synthetic(path, 10, seed=1, options=WriteOptions(append=True)).num_rows == BASE_ROWS + 10
    assert not Path(f"{path}.lock").exists()
    with pytest.raises(StoreError):  # a writer that failed released its lock
        rollback_append(tmp_path / "missing.zarr")
    assert not (tmp_path / "missing.zarr.lock").exists()


def partials(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.partial-*"))


def kill_an_overwrite(path: Path, stop: Path) -> Path:
    """SIGKILL an ``--overwrite`` of ``path`` once its staging copy holds rows; that copy."""
    writer = start_writer(path, "overwrite", stop)
    try:
        wait_until(lambda: any((p / "target" / "c").is_dir() for p in partials(path)), "the staging copy", writer)
    finally:
        writer.kill()
        writer.communicate()
    (left,) = partials(path)
    return left


@pytest.mark.slow  # two writers killed: ~5 s
def test_a_killed_overwrite_leaves_a_staging_copy_that_the_next_overwrite_or_repair_removes(tmp_path):
    path, stop = tmp_path / "s.zarr", tmp_path / "stop"
    fingerprint = synthetic_store(path).fingerprint()

    left = kill_an_overwrite(path, stop)
    assert TripleStore.open(path).fingerprint() == fingerprint  # the old store is untouched
    repaired = run_cli("repair", str(path))
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout == (
        f"removed {left} (the staging copy of a killed writer)\n{path}: complete, {BASE_ROWS:,} rows\n"
    )
    assert partials(path) == [] and TripleStore.open(path).fingerprint() == fingerprint

    kill_an_overwrite(path, stop)
    replaced = write_synthetic(
        path, 100, num_symbols=S, context_length=N, query_dim=D, num_targets=T, options=WriteOptions(overwrite=True)
    )
    assert partials(path) == [] and replaced.num_rows == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]  # no lock, nothing else left


@pytest.mark.slow
def test_repair_removes_a_killed_stream_writers_staging_copy(tmp_path):
    """A stream store is written whole into a staging copy: a killed first write leaves only that copy."""
    from dist_respattn.store.streams.writer import StreamWriter

    path = tmp_path / "stream.zarr"
    writer = StreamWriter(path, num_symbols=5, table=np.eye(5, dtype=np.float32), context_length=2)
    writer.write(np.arange(5))
    as_if_killed(writer._lock)
    del writer
    (left,) = partials(path)
    repaired = run_cli("repair", str(path), "--json")
    assert repaired.returncode == 0, repaired.stderr
    report = json.loads(repaired.stdout)
    assert report == {"url": str(path), "kind": None, "rows": None, "tokens": None, "removed": [str(left)]}
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    again = run_cli("repair", str(path))
    assert again.returncode == 2 and f"{path}: no store here" in again.stderr


def test_an_unfinished_new_store_says_to_write_it_again_with_overwrite(tmp_path):
    """``write it again`` alone sent the user to the same command, which refuses an existing path."""
    from dist_respattn.store import IncompleteStoreError, StoreSchema, StoreWriter

    path = tmp_path / "s.zarr"
    writer = StoreWriter.create(path, StoreSchema(S, N, D, T))
    as_if_killed(writer._lock)
    with pytest.raises(IncompleteStoreError, match="write it again, adding --overwrite to the same command"):
        TripleStore.open(path)
    with pytest.raises(StoreError, match=r"write the store again \(the same command with --overwrite\)"):
        rollback_append(path)


def test_a_writer_whose_lock_was_broken_does_not_mark_the_store_complete(tmp_path):
    """A holder that stalled past the timeout may have had its lock broken and another writer let in."""
    from dist_respattn.store import StoreSchema, StoreWriter
    from dist_respattn.store.lock import StoreLock, StoreLocked

    path = tmp_path / "s.zarr"
    synthetic_store(path)
    writer = StoreWriter.append(path, StoreSchema(S, N, D, T))
    writer.write(*(random_rows(300)[name] for name in ("context", "query", "target")))
    as_if_killed(writer._lock)  # to the next writer it looks dead, so it is broken
    with StoreLock.of(path, purpose="repair"):
        with pytest.raises(StoreLocked, match="this run lost the store's writer lock"):
            writer.close()
        assert state(path) == "appending"  # not committed, not rolled back: the store is the new holder's


# -- token-stream stores ---------------------------------------------------------------------------

BASE_TOKENS = 3000
STREAM_SYMBOLS = 40

#: A stream append that writes documents of 512 tokens until the file STOP appears, then closes and
#: prints the tokens it wrote (as :data:`WRITER` does for a triple store).
STREAM_APPENDER = f"""
import os, sys
import numpy as np
from dist_respattn.store.streams.writer import StreamWriter
path, stop = sys.argv[1:]
writer = StreamWriter.append(path, weighted=False)
rng, written = np.random.default_rng(0), 0
while not os.path.exists(stop) or written < 4096:
    writer.start_document()
    writer.write(rng.integers(0, {STREAM_SYMBOLS}, 512))
    written += 512
writer.close()
print(written)
"""


def stream_store(path: Path) -> None:
    """A stream store of BASE_TOKENS tokens in shards of 1024 (so an append writes a shard every two documents)."""
    from dist_respattn.store.ingest.to_stream import write_stream_tokens

    tokens = np.random.default_rng(0).integers(0, STREAM_SYMBOLS, BASE_TOKENS)
    write_stream_tokens(path, tokens, 3, num_symbols=STREAM_SYMBOLS, options=TINY)


def stream_appending(path: Path) -> bool:
    try:
        return state(path) == "appending" and len(os.listdir(path / "tokens" / "c")) > BASE_TOKENS // 1024 + 3
    except (OSError, KeyError):
        return False


@pytest.mark.slow  # a writer, then two commands at once beside it: ~4 s, more on a busy machine
def test_repair_during_a_running_stream_append_is_refused_and_the_append_loses_nothing(tmp_path):
    """The reported loss, for a token-stream store: ``repair`` while an append ran cut the store back to its
    committed tokens under the writer (or failed with "still damaged after the rollback"), and the append then
    marked the store complete with its shards gone. Now ``repair`` is refused naming the live writer, and the
    append ends with every token; a reader meanwhile is told a writer is at work, not to run ``repair``."""
    from dist_respattn.store.streams.reader import TokenStreamStore
    from dist_respattn.store.streams.validation import validate_stream

    path, stop = tmp_path / "stream.zarr", tmp_path / "stop"
    stream_store(path)
    argv = [sys.executable, "-c", STREAM_APPENDER, str(path), str(stop)]
    writer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: stream_appending(path), "the append to write new shards", writer)

    repair, info = run_at_once(("repair", str(path)), ("info", str(path)))
    appended = finish(writer, stop)

    assert repair.returncode == 2, (repair.stdout, repair.stderr)
    message = repair.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"{path}.lock" in message and "another writer" in message and f"append, pid {writer.pid} on " in message
    assert validate_stream(path)[0] == []
    store = TokenStreamStore.open(path)
    assert store.num_tokens == BASE_TOKENS + appended
    assert store.document_starts().size == 1 + appended // 512
    assert not Path(f"{path}.lock").exists()  # released on success

    assert info.returncode == 2
    assert f"being written by another writer (-c {path} {stop}, append, pid {writer.pid} on " in info.stderr
    assert "run `dist-respattn repair`" not in info.stderr, info.stderr


def test_a_live_lock_refuses_the_stream_writers_and_rollback(tmp_path):
    """A stream store's append, overwrite and rollback take the same lock as a triple store's writers."""
    from dist_respattn.store.ingest.to_stream import write_stream_tokens
    from dist_respattn.store.lock import StoreLock, StoreLocked
    from dist_respattn.store.streams.reader import TokenStreamStore
    from dist_respattn.store.streams.rollback import rollback_stream_append

    path = tmp_path / "stream.zarr"
    stream_store(path)
    more = np.arange(100) % STREAM_SYMBOLS
    with StoreLock.of(path, purpose="test"):
        with pytest.raises(StoreLocked, match=r"another writer \(.*test, pid \d+"):
            write_stream_tokens(path, more, None, options=WriteOptions(append=True))
        with pytest.raises(StoreLocked):
            rollback_stream_append(path)
        with pytest.raises(StoreLocked):
            write_stream_tokens(path, more, 3, num_symbols=STREAM_SYMBOLS, options=WriteOptions(overwrite=True))
    assert TokenStreamStore.open(path).num_tokens == BASE_TOKENS and partials(path) == []
    appended = write_stream_tokens(path, more, None, options=WriteOptions(append=True))
    assert appended.num_tokens == BASE_TOKENS + 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stream.zarr"]  # the append released its lock
