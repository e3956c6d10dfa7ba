"""A model directory's writer lock, without a cluster: one writer at a time, readers never blocked, nothing of a
refused or failed writer left behind, and a dead holder's lock broken by the next writer.

Holders of other processes are lock records written by hand (a dict like the one ``record()`` writes) naming a live
process (this one, which ``hold_model_dirs`` does not know as a holder) or an exited one; the fits and commands
that hold it for real are in ``tests/engine/test_model_dir_lock.py``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from dist_respattn import random_distribution
from dist_respattn.artifacts import CheckpointError, ModelDir, ModelDirLock, ModelDirLocked, hold_model_dirs, load_model
from dist_respattn.artifacts.checkpoints import LATEST, LOCK_FILE, checkpoint_name
from dist_respattn.artifacts.model_dir_lock import held_lock_check
from dist_respattn.durable import TEMP_PREFIX
from dist_respattn.durable.lock import _process_started
from tests.registry.conftest import dead_pid

HOST = socket.gethostname()


def holder(**fields) -> dict:
    """A lock record like ``ModelDirLock.record()`` writes: a live fit (this process) unless overridden."""
    now = time.time()
    record = {
        "token": "f" * 32,
        "host": HOST,
        "pid": os.getpid(),
        "process_started": _process_started(os.getpid()),
        "command": "dist-respattn fit train.zarr",
        "purpose": "fit",
        "acquired": now - 60,
        "heartbeat": now,
        "stale_after": 300.0,
    }
    record.update(fields)
    return record


def leave_lock(directory: Path, **fields) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    record = holder(**fields)
    (directory / LOCK_FILE).write_text(json.dumps(record))
    return record


def commit(folder: ModelDir, iteration: int) -> str:
    name = checkpoint_name(iteration, "0123abcd")
    info = {"iteration": iteration}
    model = random_distribution(5, 3, 2, 4, seed=iteration)
    folder.commit(name, model, {"iteration": iteration}, latest=info, best=None, keep_best=None)
    return name


def state(directory: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under ``directory``: its bytes (``None`` for a directory) and mtime."""
    return {
        str(p.relative_to(directory)): (None if p.is_dir() else p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
    }


def test_a_second_writer_is_refused_naming_the_directory_the_holder_and_what_to_do(tmp_path):
    model_dir = tmp_path / "model"
    record = leave_lock(model_dir)
    before = state(model_dir)
    with pytest.raises(ModelDirLocked) as caught, hold_model_dirs([model_dir]):
        pytest.fail("held a directory another fit holds")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["acquired"]))
    assert str(caught.value) == (
        f"{model_dir}: another fit is writing this model directory (dist-respattn fit train.zarr, pid {os.getpid()} "
        f"on {HOST}, started {started}, last heartbeat 0 s ago); wait for it to end (resume=True then continues it), "
        "or give another model_dir"
    )
    assert isinstance(caught.value, CheckpointError)
    assert state(model_dir) == before  # the holder's lock is untouched


def test_a_holder_on_another_host_is_said_to_count_as_gone_after_its_stale_after(tmp_path):
    model_dir = tmp_path / "model"
    leave_lock(model_dir, host="elsewhere.example", pid=1, heartbeat=time.time() - 20)
    with pytest.raises(ModelDirLocked, match=r"pid 1 on elsewhere\.example, started .*, last heartbeat 20 s ago\); "
                       r"wait for it to end .*; a holder on another host counts as gone 300 s after its last "
                       rf"heartbeat \({model_dir}/lock\.json\)$"):  # fmt: skip
        ModelDirLock(model_dir).acquire()


def test_a_dead_holders_lock_is_broken_and_the_directory_left_as_the_fit_leaves_it(tmp_path, caplog):
    """A fit SIGKILLed leaves its lock file; its pid on this host is gone, so the next writer takes the lock at
    once, and releases it when done: the directory then holds what the fit wrote, no lock."""
    model_dir = tmp_path / "model"
    pid = dead_pid()
    leave_lock(model_dir, pid=pid)
    with hold_model_dirs([model_dir]):
        assert json.loads((model_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
        name = commit(ModelDir(model_dir), 1)
    assert f"{model_dir}/{LOCK_FILE}: breaking a stale lock (its process {pid} on this host is gone)" in (
        caplog.messages
    )
    assert sorted(os.listdir(model_dir)) == [name, "latest.json"]


def test_readers_are_not_blocked(tmp_path):
    model_dir = tmp_path / "model"
    commit(ModelDir(model_dir), 1)
    leave_lock(model_dir)
    assert load_model(model_dir).num_symbols == 5
    assert ModelDir(model_dir).pointed(LATEST) == checkpoint_name(1, "0123abcd")


def test_a_directory_made_for_the_lock_is_removed_when_nothing_was_written(tmp_path):
    """A new directory (and its missing parents) exists while held; a writer that wrote nothing (a refused or
    failed fit) leaves none of it. One that existed before, or that holds what was written, stays."""
    made = tmp_path / "a" / "b" / "model"
    with hold_model_dirs([made]):
        assert sorted(os.listdir(made)) == [LOCK_FILE]
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "existing"
    existing.mkdir()
    with hold_model_dirs([existing]):
        pass
    assert list(tmp_path.iterdir()) == [existing] and list(existing.iterdir()) == []
    with hold_model_dirs([made]):
        commit(ModelDir(made), 1)
    assert sorted(os.listdir(made)) == [checkpoint_name(1, "0123abcd"), "latest.json"]
    # A refused writer leaves nothing either: here a directory under one another fit holds (a staged fit's stage).
    holder_dir = tmp_path / "held"
    leave_lock(holder_dir)
    with pytest.raises(ModelDirLocked), hold_model_dirs([holder_dir / "shared", holder_dir]):
        pass
    assert sorted(os.listdir(holder_dir)) == [LOCK_FILE]


def test_a_file_or_a_directory_under_a_file_is_refused_before_any_lock(tmp_path):
    afile = tmp_path / "model"
    afile.write_text("not a directory")
    with pytest.raises(CheckpointError, match="a file, not a directory"), hold_model_dirs([afile]):
        pass
    with pytest.raises(CheckpointError, match="is a file, so no model directory can be made under it"):
        with hold_model_dirs([afile / "sub"]):
            pass
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_holding_is_reentrant_in_a_thread_and_refused_to_another_thread(tmp_path):
    """``retrain`` holds its work directory's model around the fit it runs there, which holds it too (under
    another spelling of the path here): the inner hold is the outer one. Another thread of the process is refused."""
    model_dir = tmp_path / "model"
    with hold_model_dirs([model_dir], purpose="retrain"):
        record = json.loads((model_dir / LOCK_FILE).read_text())
        with hold_model_dirs([tmp_path / "." / "model", model_dir / "shared"]):
            assert json.loads((model_dir / LOCK_FILE).read_text()) == record
            assert (model_dir / "shared" / LOCK_FILE).is_file()
        assert json.loads((model_dir / LOCK_FILE).read_text()) == record  # the outer hold still holds it
        assert not (model_dir / "shared").exists()
        refused: list[BaseException] = []

        def other_thread() -> None:
            try:
                with hold_model_dirs([model_dir]):
                    pass
            except ModelDirLocked as exc:
                refused.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert [str(e) for e in refused] == [
            f"{model_dir}: another fit of this process (another thread) is writing it; wait for it to end "
            "(resume=True then continues it), or give another model_dir"
        ]
    assert not model_dir.exists()


def test_prune_spares_the_locks_temporaries_and_a_resume_ignores_the_lock(tmp_path):
    """Under the lock, a commit prunes every other ``.tmp-*`` (a dead writer's), but not the lock's own temporary
    file (its heartbeat's, being written); ``lock.json`` and its break claims are no foreign file to a resume."""
    model_dir = tmp_path / "model"
    with hold_model_dirs([model_dir]):
        heartbeat = model_dir / f"{TEMP_PREFIX}{LOCK_FILE}.0a1b2c3d"
        heartbeat.write_text("{}")
        (model_dir / f"{TEMP_PREFIX}ckpt-000009-deadbeef").mkdir()
        (model_dir / f"{LOCK_FILE}.broken-{'0' * 32}").write_text("{}")
        name = commit(ModelDir(model_dir), 1)
        assert sorted(os.listdir(model_dir)) == sorted(
            [heartbeat.name, LOCK_FILE, f"{LOCK_FILE}.broken-{'0' * 32}", name, "latest.json"]
        )
        assert ModelDir(model_dir).foreign_entries() == []


def test_a_writer_whose_lock_was_broken_moves_no_pointer(tmp_path):
    """A fit stopped for longer than ``stale_after`` (its heartbeat with it) finds, at its next checkpoint, that
    another fit broke its lock: the checkpoint's pointers stay where they were, and it stops saying why."""
    model_dir = tmp_path / "model"
    with hold_model_dirs([model_dir]):
        folder = ModelDir(model_dir, guard=held_lock_check(model_dir))
        first = commit(folder, 1)
        lock = json.loads((model_dir / LOCK_FILE).read_text())
        (model_dir / LOCK_FILE).write_text(json.dumps(holder(token="0" * 32)))  # another fit's, once it broke ours
        with pytest.raises(ModelDirLocked, match=r"lock\.json: this run lost the model directory's lock \(.*\); "):
            commit(folder, 2)
        assert folder.pointed(LATEST) == first
        (model_dir / LOCK_FILE).write_text(json.dumps(lock))
    assert held_lock_check(model_dir) is None  # not held any more: an unguarded directory
