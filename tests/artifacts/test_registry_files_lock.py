"""The registry's files and its writer lock, on a local disk (no cluster).

``RegistryFiles.create`` must be exclusive even between threads racing on one name; ``RegistryLock`` must
refuse a live holder (naming its pid and host), break a holder that stopped beating or whose process on
this host is gone (also a zombie), keep a live holder alive by its heartbeat, and tell a holder whose lock
was broken that it lost it. Stale locks are written by hand (a dict like the one ``record()`` writes)
or made by a real lock whose heartbeat thread was stopped; dead pids are real exited subprocesses.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from dist_respattn.artifacts.registry_lock import LOCK_FILE
from dist_respattn.durable.lock import _process_started
from dist_respattn.registry import RegistryError, RegistryFiles, RegistryLock, RegistryLocked
from tests.registry.conftest import dead_pid, read_json

HOST = socket.gethostname()


def lock_record(**fields) -> dict:
    """A lock record like ``RegistryLock.record()`` writes: a live holder (this process) unless overridden."""
    now = time.time()
    record = {
        "token": "f" * 32,
        "host": HOST,
        "pid": os.getpid(),
        "command": "dist-respattn retrain --registry",
        "acquired": now,
        "heartbeat": now,
        "stale_after": 300.0,
    }
    record.update(fields)
    return record


def stop_heartbeat(lock: RegistryLock) -> None:
    """Stop a held lock's heartbeat thread (a holder that hangs): its lock file is left as it is."""
    lock._stop.set()
    assert lock._heartbeat is not None
    lock._heartbeat.join()
    lock._heartbeat = None


@pytest.fixture
def files(tmp_path) -> RegistryFiles:
    return RegistryFiles(tmp_path / "registry")


# -- RegistryFiles ------------------------------------------------------------------------------------------


def test_create_is_exclusive_and_leaves_no_temporary_file(files):
    assert files.create("versions/000001.json", b"first")
    assert not files.create("versions/000001.json", b"second")
    assert files.read("versions/000001.json") == b"first"
    assert os.listdir(files.path("versions")) == ["000001.json"]


def test_create_raced_by_threads_has_one_winner(files):
    """Eight threads create the same name at the same moment, forty times: each time exactly one succeeds and
    the file holds the winner's complete bytes."""
    for round_ in range(40):
        name = f"versions/{round_:06d}.json"
        barrier = threading.Barrier(8)
        won: list[bytes] = []

        def create(data: bytes, name: str = name, barrier: threading.Barrier = barrier, won: list[bytes] = won) -> None:
            barrier.wait()
            if files.create(name, data):
                won.append(data)

        threads = [threading.Thread(target=create, args=(bytes([i]) * 4096,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1
        assert files.read(name) == won[0]
    assert len(os.listdir(files.path("versions"))) == 40


def test_write_replaces_whole_and_read_of_a_missing_file_is_none(files):
    assert files.read("latest.json") is None
    assert files.read_json("latest.json") is None
    files.write_json("latest.json", {"version": 1, "nan": float("nan")})
    assert files.read_json("latest.json") == {"version": 1, "nan": None}  # strict JSON: NaN becomes null
    files.write_json("latest.json", {"version": 2})
    assert files.read_json("latest.json") == {"version": 2}
    assert sorted(os.listdir(files.path(""))) == ["latest.json"]


def test_read_json_of_a_damaged_file_names_it(files):
    files.write("latest.json", b'{"version": ')
    with pytest.raises(RegistryError, match=r"latest\.json: not valid JSON"):
        files.read_json("latest.json")
    files.write("latest.json", b"[1, 2]")
    with pytest.raises(RegistryError, match=r"latest\.json: expected a JSON object"):
        files.read_json("latest.json")


def test_list_and_delete(files):
    assert files.listdir("models") == []
    files.write("models/a/params.npz", b"a")
    files.write("models/a/meta.json", b"a")
    files.write("models/b/params.npz", b"b")
    assert files.listdir("models") == ["a", "b"]
    files.delete("models/a")  # a folder
    files.delete("models/b/params.npz")  # a file
    files.delete("models/missing")  # already gone is fine
    assert files.listdir("models") == ["b"]
    assert files.listdir("models/b") == []


# -- RegistryLock --------------------------------------------------------------------------------------------


def test_second_acquire_names_the_holder(files):
    with RegistryLock(files) as held:
        record = files.read_json(LOCK_FILE)
        assert record["token"] == held.token
        assert (record["pid"], record["host"]) == (os.getpid(), HOST)
        with pytest.raises(RegistryLocked) as caught:
            RegistryLock(files).acquire()
        message = str(caught.value)
        assert f"pid {os.getpid()} on {HOST}" in message
        assert message.startswith(f"{files.where(LOCK_FILE)}: the registry is locked by another run")
        assert "last heartbeat 0 s ago" in message
        held.check()  # the refused run did not touch the holder's lock
    assert not os.path.exists(files.path(LOCK_FILE))


def test_lock_of_a_live_process_on_another_host_is_respected(files):
    files.write_json(LOCK_FILE, lock_record(host="elsewhere.example", pid=dead_pid()))
    with pytest.raises(RegistryLocked, match=r"pid \d+ on elsewhere\.example"):
        RegistryLock(files).acquire()
    assert files.read_json(LOCK_FILE)["host"] == "elsewhere.example"


def test_lock_without_a_heartbeat_for_longer_than_its_stale_after_is_broken(files):
    """A holder on another host (its pid cannot be checked) whose last heartbeat is older than its own
    ``stale_after``: broken and replaced; one beat younger, it is respected."""
    files.write_json(LOCK_FILE, lock_record(host="elsewhere.example", heartbeat=time.time() - 0.2, stale_after=0.5))
    with pytest.raises(RegistryLocked, match=r"pid \d+ on elsewhere\.example, last heartbeat 0 s ago"):
        RegistryLock(files, stale_after=300).acquire()
    time.sleep(0.4)
    with RegistryLock(files, stale_after=300) as lock:
        assert files.read_json(LOCK_FILE)["token"] == lock.token


@pytest.mark.slow
def test_holder_that_stops_beating_loses_the_lock(files):
    """A real holder (``stale_after`` 0.5 s) keeps its lock while its heartbeat runs, then hangs (its heartbeat
    thread is stopped): after 0.5 s the next run breaks the lock, and the old holder's ``check()`` raises."""
    old = RegistryLock(files, stale_after=0.5)
    old.acquire()
    first = read_json(files.path(LOCK_FILE))["heartbeat"]
    time.sleep(1.2)  # ~9 heartbeats at 0.125 s
    assert read_json(files.path(LOCK_FILE))["heartbeat"] > first + 0.5
    with pytest.raises(RegistryLocked):
        RegistryLock(files, stale_after=0.5).acquire()
    old.check()

    stop_heartbeat(old)
    time.sleep(0.8)
    new = RegistryLock(files, stale_after=0.5)
    new.acquire()
    try:
        with pytest.raises(RegistryLocked, match="this run lost the registry lock") as caught:
            old.check()
        assert "nothing was published" in str(caught.value)
        old.release()  # not its lock any more: left alone
        new.check()
        assert files.read_json(LOCK_FILE)["token"] == new.token
    finally:
        new.release()
    assert not os.path.exists(files.path(LOCK_FILE))


def test_heartbeat_notices_a_replaced_lock(files):
    """The holder's heartbeat sees the lock file replaced under it, stops beating over it, and ``check()``
    says why."""
    lock = RegistryLock(files, stale_after=0.4)
    lock.acquire()
    try:
        # A beat that read the lock just before the replacement writes it back just after (the heartbeat
        # reads, then writes): then the replacement is made again.
        beat = lock._heartbeat
        assert beat is not None
        for _ in range(5):
            files.write_json(LOCK_FILE, lock_record(token="0" * 32))
            time.sleep(0.3)
            if not beat.is_alive():
                break
        assert not beat.is_alive()
        assert files.read_json(LOCK_FILE)["token"] == "0" * 32  # not overwritten by a later beat
        with pytest.raises(RegistryLocked, match="the lock file was replaced while this run held it"):
            lock.check()
    finally:
        lock.release()
    assert files.read_json(LOCK_FILE)["token"] == "0" * 32  # release leaves another run's lock alone


def test_lock_of_a_dead_process_on_this_host_is_broken(files):
    """A fresh heartbeat, but the holder's pid on this host belongs to a process that exited."""
    pid = dead_pid()
    files.write_json(LOCK_FILE, lock_record(pid=pid))
    with RegistryLock(files) as lock:
        record = files.read_json(LOCK_FILE)
        assert (record["token"], record["pid"]) == (lock.token, os.getpid())


def test_lock_of_a_killed_unreaped_process_is_broken(files):
    """The holder was SIGKILLed and is a zombie (not yet reaped by its parent): it is gone all the same."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        files.write_json(LOCK_FILE, lock_record(pid=proc.pid))
        with pytest.raises(RegistryLocked, match=f"pid {proc.pid} on"):
            RegistryLock(files).acquire()
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with RegistryLock(files) as lock:
            assert files.read_json(LOCK_FILE)["token"] == lock.token
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_a_process_whose_pid_was_reused_is_broken(files):
    """The holder's pid on this host is alive, but the process that has it started at another moment than the one
    the lock records (the holder was killed and its pid given to another, as a container restarted in its pod runs
    its command as pid 1 again): broken. The same pid with its own start, or a record without one (written before
    starts were recorded), is respected."""
    started = _process_started(os.getpid())
    assert started is not None  # Linux: /proc says when a process started
    files.write_json(LOCK_FILE, lock_record(process_started=started))
    with pytest.raises(RegistryLocked, match=f"pid {os.getpid()} on {HOST}"):
        RegistryLock(files).acquire()
    files.write_json(LOCK_FILE, lock_record())
    with pytest.raises(RegistryLocked, match=f"pid {os.getpid()} on {HOST}"):
        RegistryLock(files).acquire()
    files.write_json(LOCK_FILE, lock_record(process_started=started - 1))
    with RegistryLock(files) as lock:
        record = files.read_json(LOCK_FILE)
        assert (record["token"], record["pid"], record["process_started"]) == (lock.token, os.getpid(), started)


@pytest.mark.slow
def test_threads_breaking_the_same_stale_lock_at_once(files):
    """Two threads find the same stale lock (a new one each round, as every lock has its own token) at the
    same moment, 200 times. Whatever the interleaving, exactly one acquires, and it still holds the lock."""
    for _ in range(200):
        stale = lock_record(token=uuid.uuid4().hex, heartbeat=time.time() - 100, stale_after=1.0)
        files.write_json(LOCK_FILE, stale)
        barrier = threading.Barrier(2)
        locks = [RegistryLock(files, stale_after=60) for _ in range(2)]
        acquired: list[RegistryLock] = []

        def take(lock: RegistryLock, barrier: threading.Barrier = barrier, acquired: list = acquired) -> None:
            barrier.wait()
            try:
                lock.acquire()
            except RegistryLocked:
                return
            acquired.append(lock)

        threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(acquired) == 1, f"{len(acquired)} threads acquired the stale lock"
        holding = []
        for lock in acquired:
            try:
                lock.check()
                holding.append(lock)
            except RegistryLocked:
                pass
        assert len(holding) == 1
        assert files.read_json(LOCK_FILE)["token"] == holding[0].token
        for lock in acquired:
            lock.release()
        assert files.read_json(LOCK_FILE) is None


class _PausingFiles(RegistryFiles):
    """Registry files whose ``delete`` of the lock pauses (for the thread that owns this instance) until told to
    go on: a scheduling point that makes one interleaving of two real lock breakers happen every time."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.at_delete = threading.Event()
        self.go = threading.Event()

    def delete(self, name: str) -> None:
        if name == LOCK_FILE:
            self.at_delete.set()
            assert self.go.wait(10)
        super().delete(name)


def test_only_one_of_two_runs_breaking_the_same_stale_lock_acquires(tmp_path):
    """Run B has claimed the stale lock and is about to delete it when run A reads the same stale lock:
    A cannot claim it too, so A is refused and B, resuming, acquires. Exactly one of them holds the lock."""
    url = str(tmp_path / "registry")
    slow = _PausingFiles(url)
    slow.write_json(LOCK_FILE, lock_record(token="0" * 32, heartbeat=time.time() - 100, stale_after=1.0))
    b = RegistryLock(slow, stale_after=60)
    outcome: list[str] = []

    def take_b() -> None:
        try:
            b.acquire()
            outcome.append("acquired")
        except RegistryLocked:
            outcome.append("locked")

    thread = threading.Thread(target=take_b)
    thread.start()
    assert slow.at_delete.wait(10)  # B has claimed the stale lock and will delete it
    a = RegistryLock(RegistryFiles(url), stale_after=60)
    with pytest.raises(RegistryLocked, match="another run is taking over the stale lock"):
        a.acquire()
    slow.go.set()
    thread.join()
    try:
        assert outcome == ["acquired"]
        b.check()
    finally:
        b.release()


def test_stale_after_must_be_positive(files):
    with pytest.raises(ValueError, match="stale_after = 0"):
        RegistryLock(files, stale_after=0)
