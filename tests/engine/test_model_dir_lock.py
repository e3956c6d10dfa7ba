"""One fit writes a model directory at a time, with real processes: a ``dist-respattn fit`` holding its directory
(stopped with SIGSTOP mid-fit, so it holds it for as long as the test needs) refuses a second ``fit --resume`` and
``fit --overwrite`` at once, in one line naming the directory, its pid and when it started, both leaving every file
as it was; the first then completes as if alone. A fit SIGKILLed mid-fit leaves its lock file, and the next fit breaks
it at once. Before the lock, the second fit ran alongside the first and pruned its checkpoints: the first died on a
``.tmp-ckpt-…/meta.json`` it was writing. A staged fit's stages' directories and ``retrain``'s work directory are held
too (in-process here: they are refused before any cluster is reached).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from dist_respattn.artifacts import ModelDirLocked
from dist_respattn.artifacts.checkpoints import LOCK_FILE
from dist_respattn.cli.common import fit_ended
from dist_respattn.durable.lock import _process_started
from dist_respattn.engine import ClusterOptions, FitSettings, fit
from dist_respattn.model.heads.gated.kind import GatedSpec
from dist_respattn.registry import retrain
from dist_respattn.registry.retrain import WORK_DIR_MARK
from tests.engine.test_bad_input import Launched, assert_fit_error, free_port, run_cli, start_cli, tree_state
from tests.engine.test_failures import history_iterations, kept_checkpoints, sigkill

pytestmark = pytest.mark.slow  # every test here starts commands or uses the package's cluster

HOST = socket.gethostname()
#: Iterations of the fits here (tol 0 and a patience that never runs out: all of them run).
ITERATIONS = 5
REFUSED = "another fit is writing this model directory"


@pytest.fixture(scope="module")
def address(client) -> str:
    """The scheduler address of the engine tests' shared cluster, for ``--scheduler``."""
    return client.scheduler.address


def fit_args(store: str, model_dir: Path, address: str, *extra: str) -> tuple[str, ...]:
    return (
        "fit", store, "--model-dir", str(model_dir), "--scheduler", address, "--max-iter", str(ITERATIONS),
        "--tol", "0", "--patience", "100", *extra,
    )  # fmt: skip


def read_until(proc: subprocess.Popen[str], prefix: str) -> list[str]:
    """The command's stderr lines up to the first that starts with ``prefix``."""
    assert proc.stderr is not None
    said: list[str] = []
    while not (line := proc.stderr.readline()).startswith(prefix):
        assert line, f"the fit ended before {prefix!r}: {''.join(said)}"
        said.append(line)
    return said


def live_holder(directory: Path) -> dict:
    """A lock file in ``directory`` naming a live fit on this host (this process, which holds no lock itself)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    record = {
        "token": "f" * 32, "host": HOST, "pid": os.getpid(), "process_started": _process_started(os.getpid()),
        "command": "dist-respattn fit train.zarr", "purpose": "fit", "acquired": now, "heartbeat": now,
        "stale_after": 300.0,
    }  # fmt: skip
    (directory / LOCK_FILE).write_text(json.dumps(record))
    return record


def wait_stopped(pid: int, timeout: float = 30.0) -> None:
    """Wait until every thread of process ``pid`` is stopped (state ``T`` in ``/proc``): ``kill`` returns before a
    SIGSTOP has reached them, and a loaded machine may let one run on for a while."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that ended
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


def test_a_second_fit_resume_or_overwrite_is_refused_at_once_and_the_first_completes(tmp_path, small_store, address):
    model_dir = tmp_path / "model"
    first = start_cli(*fit_args(small_store, model_dir, address))
    try:
        # Its second iteration's line comes after its first checkpoint is on disk (a commit waits for the one before).
        read_until(first, "iteration 2:")
        os.kill(first.pid, signal.SIGSTOP)
        try:
            wait_stopped(first.pid)  # the signal is delivered later: a thread may still be writing a checkpoint
            before = tree_state(model_dir), model_dir.stat().st_mtime_ns
            held = (model_dir / LOCK_FILE).read_text() if (model_dir / LOCK_FILE).exists() else "{}"
            launched = {
                flag: Launched(fit_args(small_store, model_dir, address, flag), deadline=60)
                for flag in ("--resume", "--overwrite")
            }
            second = {flag: (run.wait(), run.seconds) for flag, run in launched.items()}
            after = tree_state(model_dir), model_dir.stat().st_mtime_ns
        finally:
            os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert "latest.json" in before[0]
    for flag, (result, seconds) in second.items():
        line = assert_fit_error(
            result,
            f"{model_dir}: {REFUSED} (dist-respattn fit {small_store}, pid {first.pid} on {HOST}, started ",
            "; wait for it to end (--resume then continues it), or give another --model-dir",
        )
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(json.loads(held)["acquired"]))
        assert f", started {started}, last heartbeat " in line, (flag, line)
        assert line.endswith("--model-dir"), (flag, line)
        assert seconds < 30, (flag, seconds)  # refused before any cluster or store work
    assert after == before  # not a file written or removed, the holder's lock as it was
    assert first.returncode == 0, err
    assert out.startswith(f"EM {fit_ended('max_iter', ITERATIONS)} in "), out
    assert history_iterations(model_dir) == list(range(1, ITERATIONS + 1))
    assert sorted(os.listdir(model_dir)) == sorted(
        ["latest.json", "best.json", "fit.json", *kept_checkpoints(model_dir)]
    )


def test_a_killed_fits_lock_does_not_stop_the_next_fit(tmp_path, small_store, address):
    """SIGKILL leaves the lock file (nothing runs to remove it); its pid on this host is gone, so ``--resume`` breaks
    it at once, says so, and continues the fit to its end."""
    model_dir = tmp_path / "model"
    killed = start_cli(*fit_args(small_store, model_dir, address))
    read_until(killed, "iteration 1:")
    sigkill(killed)
    assert json.loads((model_dir / LOCK_FILE).read_text())["pid"] == killed.pid
    resumed = run_cli(*fit_args(small_store, model_dir, address, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"{model_dir}/{LOCK_FILE}: breaking a stale lock (its process {killed.pid} on this host is gone)" in (
        resumed.stderr.splitlines()
    )
    assert history_iterations(model_dir) == list(range(1, ITERATIONS + 1))
    assert not (model_dir / LOCK_FILE).exists()


def test_a_staged_fit_is_refused_when_one_of_its_stages_directories_is_being_written(tmp_path, small_store):
    """A gated fit writes its shared head's fit in ``shared/``: a fit writing there (given ``--model-dir
    DIR/shared``) refuses it, before the stores' columns are checked and before any cluster (there is none at the
    address given); nothing of the refused fit is left."""
    model_dir = tmp_path / "model"
    live_holder(model_dir / "shared")
    before = tree_state(model_dir)
    nowhere = ClusterOptions(scheduler=f"tcp://127.0.0.1:{free_port()}")
    for overwrite in (False, True):
        with pytest.raises(ModelDirLocked, match=f"^{model_dir / 'shared'}: {REFUSED} "):
            fit(small_store, model_dir=model_dir, head=GatedSpec(2), overwrite=overwrite, cluster=nowhere)
    assert tree_state(model_dir) == before


def test_retrain_is_refused_while_a_fit_writes_its_work_directory(tmp_path, small_store):
    """Two retrains given one ``--work-dir`` (for two registries): the second is refused naming the directory, before
    it touches its registry."""
    work_dir = tmp_path / "work"
    live_holder(work_dir / "model")
    (work_dir / WORK_DIR_MARK).write_text("{}")
    registry = tmp_path / "registry"
    nowhere = ClusterOptions(scheduler=f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(ModelDirLocked, match=f"^{work_dir / 'model'}: {REFUSED} .*give another --work-dir$"):
        retrain(registry, small_store, work_dir=work_dir, settings=FitSettings(max_iter=1), cluster=nowhere)
    assert not registry.exists()
    assert sorted(os.listdir(work_dir / "model")) == [LOCK_FILE]
