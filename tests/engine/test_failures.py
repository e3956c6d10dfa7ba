"""Fits that survive failures: a worker SIGKILLed mid-iteration, the driver SIGKILLed mid-fit or mid-checkpoint.

Every failure is real: worker processes of a LocalCluster with nannies, ``dist-respattn fit`` run as a
subprocess against this module's cluster (which outlives it), and SIGKILL. Every outcome is compared bit for
bit (``np.array_equal``, ``sigma2 ==``) with an uninterrupted fit of the same settings from the same random
start. The last tests pin what ``--resume`` accepts: the same settings only, an empty model directory (a
new fit), and a finished fit (returned at once, no cluster touched).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dist_respattn.engine import FitSettings, fit, load_checkpoint, load_model
from dist_respattn.model.heads.gated.kind import GatedSpec
from dist_respattn.store import WriteOptions, write_arrays, write_synthetic
from tests.engine.clusters import local_cluster
from tests.engine.test_bad_input import (
    Launched,
    assert_fit_error,
    assert_same_parameters,
    cli_env,
    free_port,
    run_cli,
    start_cli,
    tree_state,
)

#: The fits whose workers are killed in iteration 2 (and their uninterrupted reference): one iteration after it
#: shows the fit goes on from the recovered sums.
LONG_SETTINGS = FitSettings(max_iter=3, tol=0.0, patience=100)
#: Iterations of the fits killed by the driver tests (and of their uninterrupted reference).
WIDE_ITERATIONS = 6


def kept_checkpoints(model_dir: Path) -> list[str]:
    """The checkpoints ``latest.json`` and ``best.json`` name (the fit keeps those, and only those)."""
    names = {json.loads((model_dir / f"{pointer}.json").read_text())["checkpoint"] for pointer in ("latest", "best")}
    return sorted(names)


def read_latest(model_dir: Path) -> dict | None:
    """``latest.json`` of a model directory, or ``None`` before the first checkpoint (it is replaced atomically)."""
    try:
        return json.loads((model_dir / "latest.json").read_text())
    except FileNotFoundError:
        return None


def read_best(model_dir: Path) -> dict:
    """``best.json`` of a model directory."""
    return json.loads((model_dir / "best.json").read_text())


def history_iterations(model_dir: Path) -> list[int]:
    """The iteration numbers recorded in the latest checkpoint's history, in order."""
    return [entry["iteration"] for entry in load_checkpoint(model_dir, "latest").meta["history"]]


def leftovers(model_dir: Path) -> list[str]:
    """Temporary entries (``.tmp-…``) of interrupted writes."""
    return sorted(name for name in os.listdir(model_dir) if name.startswith(".tmp-"))


def sigkill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a command that must still be running, and reap it."""
    assert proc.poll() is None, "the fit ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


# -- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_client():
    """A client of this module's LocalCluster (2 single-threaded worker processes), left running by every fit."""
    with local_cluster() as (_, client):
        yield client


@pytest.fixture(scope="module")
def address(engine_client) -> str:
    """The scheduler address of this module's cluster, for ``--scheduler``."""
    return engine_client.scheduler.address


@pytest.fixture(scope="module")
def long_store(tmp_path_factory) -> str:
    """200,000 rows of a small head in 13 partitions: an E-step long enough (~0.25 s on a quiet machine, ten times the
    20 ms the kill waits once it sees a task of iteration 2 running) to kill a worker in."""
    path = tmp_path_factory.mktemp("long") / "long.zarr"
    write_synthetic(
        path, 200_000, num_symbols=30, context_length=4, query_dim=5, num_targets=12, seed=4,
        options=WriteOptions(chunk_rows=8192, partition_rows=16_384),
    )  # fmt: skip
    return str(path)


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory) -> str:
    """6,000 rows of a head with S = T = 1500: each checkpoint's emission is 18 MB, so writing it takes a while."""
    path = tmp_path_factory.mktemp("wide") / "wide.zarr"
    write_synthetic(
        path, 6000, num_symbols=1500, context_length=4, query_dim=5, num_targets=1500, seed=3,
        options=WriteOptions(chunk_rows=1024, partition_rows=2048),
    )  # fmt: skip
    return str(path)


@pytest.fixture(scope="module")
def wide_reference(tmp_path_factory, wide_store, engine_client):
    """The uninterrupted fit of ``wide_store``: ``WIDE_ITERATIONS`` iterations (tol 0, and a patience that never runs
    out, so every fit runs them all), with the default start and choices."""
    model_dir = tmp_path_factory.mktemp("wide-reference") / "model"
    settings = FitSettings(max_iter=WIDE_ITERATIONS, tol=0.0, patience=100)
    return fit(wide_store, model_dir=model_dir, settings=settings, client=engine_client, progress=False)


def wide_fit_args(store: str, model_dir: Path, address: str) -> tuple[str, ...]:
    """The CLI of the reference fit (the defaults of ``FitSettings`` besides max-iter, tol and patience)."""
    return (
        "fit", store, "--model-dir", str(model_dir), "--max-iter", str(WIDE_ITERATIONS), "--tol", "0",
        "--patience", "100", "--scheduler", address, "--json",
    )  # fmt: skip


# -- a worker killed mid-iteration ----------------------------------------------------------------------------


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def passes_log():
    """The messages of ``dist_respattn.engine.passes`` during the test (a handler of its own: a LocalCluster's
    ``silence_logs`` raises the level of caplog's handlers to ERROR)."""
    handler = _Messages()
    logger = logging.getLogger("dist_respattn.engine.passes")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def long_references(tmp_path_factory, long_store, engine_client):
    """The uninterrupted fit of ``long_store`` on the module's cluster (``LONG_SETTINGS``) per emission layout,
    made on first use."""
    made: dict[str, Any] = {}

    def reference(layout: str):
        if layout not in made:
            model_dir = tmp_path_factory.mktemp(f"long-reference-{layout}") / "model"
            settings = dataclasses.replace(LONG_SETTINGS, emission_layout=layout)
            made[layout] = fit(long_store, model_dir=model_dir, settings=settings, client=engine_client, progress=False)
        return made[layout]

    return reference


@pytest.mark.slow
# The recovery (recomputing lost tasks, a new scatter when the parameters are lost) is the engine's and the same for
# every layout; a sparse fit's sums over any set of workers are tested in test_sparse_fit.py. Every worker is killed
# in a sparse fit: it loses the parameters and the support too, which the fit sent once, apart, and sends again.
@pytest.mark.parametrize(("victims", "layout"), [("one", "dense"), ("every", "sparse")])
def test_worker_killed_mid_iteration_gives_identical_parameters(
    tmp_path, long_store, long_references, engine_client, victims, layout, passes_log
):
    """SIGKILL of worker processes while E-step tasks of iteration 2 run: the fit finishes, bit-identical.

    ``one``: the worker holding the scattered parameters (or, if none is seen, one running an E-step task);
    the tasks lost with it (running, or finished and held in its memory) are recomputed. ``every``: both
    workers, so the parameters themselves are lost and the pass must be resubmitted after a new scatter.
    The nannies restart the workers, and the fixed combine tree gives the same sums as the uninterrupted fit.
    On the module's cluster (a cluster of its own would add its start-up): the test waits for both workers to be
    back before it ends, and the fits of the other tests keep nothing on the workers that a kill could take.
    """
    client = engine_client
    client.wait_for_workers(2, timeout=60)
    pids = client.run(os.getpid)
    kill: dict = {}
    said: list[tuple[float, str]] = []

    def kill_during_iteration_2() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = {
                worker: [str(k) for k in keys if str(k).startswith("respattn-estep-2-")]
                for worker, keys in client.processing().items()
            }
            running = {worker: keys for worker, keys in running.items() if keys}
            if running:
                time.sleep(0.02)  # into the tasks
                if victims == "every":
                    targets = list(pids)
                else:
                    holders = [
                        worker
                        for worker, keys in client.has_what().items()
                        if any(str(k).startswith("respattn-params-2-") for k in keys)
                    ]
                    targets = holders[:1] or list(running)[:1]
                for worker in targets:
                    os.kill(pids[worker], signal.SIGKILL)
                kill.update(pids=[pids[w] for w in targets], running=running, at=time.monotonic())
                return
            time.sleep(0.002)

    killer = threading.Thread(target=kill_during_iteration_2, daemon=True)

    def say(line: str) -> None:
        said.append((time.monotonic(), line))
        if line.startswith("iteration 1:"):
            killer.start()

    settings = dataclasses.replace(LONG_SETTINGS, emission_layout=layout)
    result = fit(long_store, model_dir=tmp_path / "model", settings=settings, client=client, say=say, progress=False)
    killer.join(timeout=60)
    client.wait_for_workers(2, timeout=60)
    after = client.run(os.getpid)
    assert kill, "no E-step task of iteration 2 was seen running"
    assert len(kill["pids"]) == (1 if victims == "one" else 2)
    assert set(kill["pids"]).isdisjoint(after.values()), "a killed worker is still there"
    iteration_2_done = next(t for t, line in said if line.startswith("iteration 2:"))
    assert kill["at"] < iteration_2_done, "the kill came after iteration 2 ended"
    if victims == "every":
        assert any(m.startswith("estep 2 lost work") for m in passes_log), passes_log
    expected = long_references(layout)
    assert result.model.emission_table.layout == layout
    assert [e["iteration"] for e in result.history] == [1, 2, 3]
    assert [e["mean_log_likelihood"] for e in result.history] == [e["mean_log_likelihood"] for e in expected.history]
    assert_same_parameters(result.model, expected.model)
    assert_same_parameters(load_model(tmp_path / "model", "latest"), expected.model)


# -- the driver killed mid-fit ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_driver_killed_then_resumed_gives_identical_parameters(tmp_path, wide_store, wide_reference, address):
    """``fit`` SIGKILLed once its latest checkpoint is iteration 2 or later, then the same command with
    ``--resume``: the final parameters are bit-identical to the uninterrupted fit, the history holds every
    iteration once, and no leftover of the killed run remains.
    """
    model_dir = tmp_path / "model"
    args = wide_fit_args(wide_store, model_dir, address)
    proc = start_cli(*args)
    deadline = time.monotonic() + 90
    while (latest := read_latest(model_dir)) is None or latest["iteration"] < 2:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint of iteration 2 after 90 s"
        time.sleep(0.005)
    sigkill(proc)
    killed_at = read_latest(model_dir)["iteration"]
    assert killed_at < WIDE_ITERATIONS, "the fit had ended before it was killed"
    assert load_checkpoint(model_dir, "latest").iteration == killed_at

    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["state"] == "max_iter"
    assert report["iterations"] == WIDE_ITERATIONS
    assert_same_parameters(load_model(model_dir, "latest"), wide_reference.model)
    assert history_iterations(model_dir) == list(range(1, WIDE_ITERATIONS + 1))
    runs = [entry["run_id"] for entry in load_checkpoint(model_dir, "latest").meta["history"]]
    assert len(set(runs[:killed_at])) == 1 and set(runs[:killed_at]).isdisjoint(runs[killed_at:]), runs
    assert leftovers(model_dir) == []
    assert sorted(name for name in os.listdir(model_dir) if name.startswith("ckpt-")) == kept_checkpoints(model_dir)


@pytest.mark.slow
def test_kill_during_a_checkpoint_write_leaves_the_previous_checkpoint(tmp_path, wide_store, wide_reference, address):
    """SIGKILL of the driver while a checkpoint is being written (its ``.tmp-ckpt-…`` directory exists).

    The previous checkpoint is what ``load_checkpoint``/``load_model`` return, and ``--resume`` removes the
    half-written one and finishes bit-identical to the uninterrupted fit. The kill watches the model
    directory every ~0.2 ms and a write takes tens of ms; an attempt that misses the window (the write
    finished first) is resumed and tried again at the next checkpoint.
    """
    model_dir = tmp_path / "model"
    args = (*wide_fit_args(wide_store, model_dir, address), "--resume")  # a new fit while the directory is empty
    caught: list[str] = []
    for _attempt in range(WIDE_ITERATIONS - 1):
        proc = start_cli(*args)
        deadline = time.monotonic() + 90
        while not caught:
            names = os.listdir(model_dir) if model_dir.is_dir() else []
            writing = [n for n in names if n.startswith(".tmp-ckpt-")]
            if writing and "latest.json" in names:
                os.kill(proc.pid, signal.SIGKILL)
                caught = writing
                break
            assert proc.poll() is None, f"the fit ended without being caught in a write: {proc.communicate()[1]}"
            assert time.monotonic() < deadline
            time.sleep(0.0002)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        if any((model_dir / name).is_dir() for name in caught):
            break  # the kill landed inside the write
        caught = []
    assert caught, "no kill landed inside a checkpoint write"
    latest = read_latest(model_dir)
    being_written = int(caught[0].split("-")[2])
    assert latest["iteration"] < being_written
    checkpoint = load_checkpoint(model_dir, "latest")
    assert checkpoint.name == latest["checkpoint"]
    assert checkpoint.iteration == latest["iteration"]
    assert history_iterations(model_dir) == list(range(1, latest["iteration"] + 1))
    model = load_model(model_dir, "latest")
    assert model.emission.shape == (1500, 1500)
    assert np.isfinite(model.emission).all() and np.isfinite(model.key_means).all()

    resumed = run_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert leftovers(model_dir) == []
    assert_same_parameters(load_model(model_dir, "latest"), wide_reference.model)
    assert history_iterations(model_dir) == list(range(1, WIDE_ITERATIONS + 1))


@pytest.mark.slow
def test_leftovers_of_an_interrupted_write_are_ignored_then_cleaned(tmp_path, small_store, engine_client):
    """The on-disk states a kill can leave around a checkpoint write, made by hand.

    A ``.tmp-ckpt-…`` directory with a truncated ``params.npz``, a truncated ``.tmp-latest.json.…``, a
    complete checkpoint directory the pointer never moved to, and no ``best.json`` (a kill between a checkpoint's
    ``latest`` and ``best`` pointers): ``load_checkpoint`` still returns the pointed checkpoint, and a resumed fit
    removes the first three, points ``best`` where the checkpoint's early-stopping state says, and ends
    bit-identical to an uninterrupted one, its ``best`` included (before, ``best`` stayed lost and ``load_model``
    gave the last iteration instead).
    """
    model_dir = tmp_path / "model"
    first = fit(
        small_store, model_dir=model_dir, settings=FitSettings(max_iter=2, tol=0.0), client=engine_client,
        progress=False,
    )  # fmt: skip
    pointed = read_latest(model_dir)["checkpoint"]
    params = (model_dir / pointed / "params.npz").read_bytes()
    (model_dir / ".tmp-ckpt-000003-deadbeef").mkdir()
    (model_dir / ".tmp-ckpt-000003-deadbeef" / "params.npz").write_bytes(params[: len(params) // 2])
    (model_dir / ".tmp-latest.json.0badf00d").write_text('{"checkpoint": "ckpt-0000')
    shutil.copytree(model_dir / pointed, model_dir / "ckpt-000003-deadbeef")
    (model_dir / "best.json").unlink()

    checkpoint = load_checkpoint(model_dir, "latest")
    assert (checkpoint.name, checkpoint.iteration) == (pointed, 2)
    assert_same_parameters(checkpoint.model, first.model)

    settings = FitSettings(max_iter=3, tol=0.0)
    resumed = fit(
        small_store, model_dir=model_dir, settings=settings, resume=True, client=engine_client, progress=False
    )
    expected = fit(small_store, model_dir=tmp_path / "ref", settings=settings, client=engine_client, progress=False)
    assert_same_parameters(resumed.model, expected.model)
    assert_same_parameters(load_model(model_dir, "latest"), expected.model)
    assert read_best(model_dir)["iteration"] == read_best(tmp_path / "ref")["iteration"] == expected.best_iteration
    assert_same_parameters(load_model(model_dir), load_model(tmp_path / "ref"))
    assert leftovers(model_dir) == []
    assert sorted(os.listdir(model_dir)) == sorted(
        ["latest.json", "best.json", "fit.json", *kept_checkpoints(model_dir)]
    )
    assert history_iterations(model_dir) == [1, 2, 3]


# -- a gated fit killed at each phase ---------------------------------------------------------------------------

#: Iterations of each stage of the killed gated fits (tol 0 and a patience that never runs out: all of them run).
GATED_ITERATIONS = 3


@pytest.fixture(scope="module")
def gated_store(tmp_path_factory) -> str:
    """Random rows with one of 3 attributes each, in 8 partitions: a gated fit's iterations long enough to be
    killed in, on a store written in well under a second."""
    path = tmp_path_factory.mktemp("gated") / "gated.zarr"
    rng = np.random.default_rng(6)
    rows, s, t = 10_000, 40, 40
    write_arrays(
        path, rng.integers(0, s, (rows, 4)), rng.standard_normal((rows, 5)), rng.integers(0, t, rows),
        num_symbols=s, num_targets=t, attributes=rng.integers(0, 3, rows),
        options=WriteOptions(chunk_rows=1250, partition_rows=2500),
    )  # fmt: skip
    return str(path)


def gated_fit_args(store: str, model_dir: Path, address: str) -> tuple[str, ...]:
    """The gated fit killed (and its uninterrupted reference): settings of its own for both stages, none a default."""
    return (
        "fit", store, "--model-dir", str(model_dir), "--attribute-factors", "2", "--max-iter", str(GATED_ITERATIONS),
        "--tol", "0", "--patience", "100", "--scheduler", address, "--json",
    )  # fmt: skip


@pytest.fixture(scope="module")
def gated_reference(tmp_path_factory, gated_store, engine_client) -> Path:
    """The model directory of the uninterrupted gated fit, made through the API (the test checks that its recorded
    settings and spec are those of the command's fit)."""
    model_dir = tmp_path_factory.mktemp("gated-reference") / "model"
    loop = {"max_iter": GATED_ITERATIONS, "tol": 0.0, "patience": 100}
    fit(
        gated_store, model_dir=model_dir, settings=FitSettings(**loop), head=GatedSpec(2, stage_settings=loop),
        client=engine_client, progress=False,
    )  # fmt: skip
    return model_dir


def _latest_iteration(model_dir: Path) -> int | None:
    latest = read_latest(model_dir)
    return None if latest is None else int(latest["iteration"])


#: Each phase of a gated fit, as its model directory shows it: the shared stage has checkpointed and not ended;
#: it has ended and the gated stage has no checkpoint yet; the gated stage has checkpointed and not ended.
GATED_PHASES = {
    "shared": lambda m: (_latest_iteration(m / "shared") or 0) in range(1, GATED_ITERATIONS),
    "between": lambda m: _latest_iteration(m / "shared") == GATED_ITERATIONS and read_latest(m) is None,
    "gated": lambda m: (_latest_iteration(m) or 0) in range(1, GATED_ITERATIONS),
}


@pytest.mark.slow
def test_a_gated_fit_killed_at_each_phase_resumes_alone_bit_identical(tmp_path, gated_store, gated_reference, address):
    """``fit --attribute-factors 2 --max-iter 3 ...`` SIGKILLed during its shared stage; then ``fit STORE --model-dir
    DIR --resume`` alone, SIGKILLed between the stages (before the gated stage's first checkpoint); then the same,
    SIGKILLed during its gated stage; then the same to the end. Before: refused in the first two phases (the
    directory "holds shared"), and given the gated options again, the gated stage ran with its defaults (up to 30
    iterations, tol 1e-6, patience 2). Now each resumed command goes on from where the last one died, and both stages
    end bit-identical to the uninterrupted fit, with the same histories and settings.

    One fit killed at each phase in turn, not a fit from the start for each phase: a resume that went wrong at any
    phase shows in the phases after it (a refusal or an early end as a command that ends before the next phase is
    seen; a stage run with other settings in the recorded settings, histories and bits compared at the end)."""
    model_dir = tmp_path / "model"
    resume = ("fit", gated_store, "--model-dir", str(model_dir), "--resume", "--scheduler", address, "--json")
    command = gated_fit_args(gated_store, model_dir, address)
    for phase in GATED_PHASES:
        proc = start_cli(*command)
        deadline = time.monotonic() + 120
        while not GATED_PHASES[phase](model_dir):
            assert proc.poll() is None, f"the fit ended before the {phase} phase was seen: {proc.communicate()[1]}"
            assert time.monotonic() < deadline, f"no {phase} phase after 120 s"
            time.sleep(0.002)
        sigkill(proc)
        assert GATED_PHASES[phase](model_dir), f"the fit left the {phase} phase before it died"
        command = resume

    resumed = run_cli(*resume)
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert (report["kind"], report["state"], report["iterations"]) == ("gated", "max_iter", GATED_ITERATIONS)
    assert report["shared"]["iterations"] == GATED_ITERATIONS
    for stage in (".", "shared"):
        ours, theirs = load_checkpoint(model_dir / stage, "latest"), load_checkpoint(gated_reference / stage, "latest")
        assert ours.iteration == theirs.iteration == GATED_ITERATIONS
        assert [h["mean_log_likelihood"] for h in ours.meta["history"]] == [
            h["mean_log_likelihood"] for h in theirs.meta["history"]
        ]
        assert ours.meta["settings"] == theirs.meta["settings"] and ours.meta["head"] == theirs.meta["head"]
        # The best iteration too (a kill between the latest and best pointers must not lose it): the gated stage
        # starts from the shared stage's best.
        assert read_best(model_dir / stage)["iteration"] == read_best(gated_reference / stage)["iteration"]
        arrays, expected = ours.model.to_arrays()[0], theirs.model.to_arrays()[0]
        assert arrays.keys() == expected.keys()
        for name, values in expected.items():
            assert np.array_equal(arrays[name], values), (stage, name)


# -- what --resume accepts ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory, small_store, engine_client, address):
    """Fits made through the API, then ``--resume`` commands on them, all started at once.

    ``settings``: a finished fit (2 iterations, tol 0) resumed with another ``--tol`` and another ``--seed`` (one
    command: both differences are found by one comparison, and the line must name each). ``kind``: a copy of it
    resumed as another kind of head.
    ``store``: a copy of the same fit resumed on another store (a copy: two fits of one directory at once, even
    two refused ones, would find each other's lock). ``empty``: ``--resume`` into an empty directory.
    ``both``: another copy resumed with ``--overwrite`` too. ``warm``: another copy resumed
    with an ``--init-from`` it was not started from.
    ``converged``: a converged fit resumed with its own settings, with ``DASK_SCHEDULER_ADDRESS`` naming a
    port nothing listens on (a fit that tried to reach a cluster would fail).
    """
    root = tmp_path_factory.mktemp("resume")
    finished = root / "finished"
    settings = FitSettings(max_iter=2, tol=0.0)
    reference = fit(small_store, model_dir=finished, settings=settings, client=engine_client, progress=False)
    converged_dir = root / "converged"
    converged_fit = fit(
        small_store, model_dir=converged_dir, settings=FitSettings(max_iter=50, tol=0.05), client=engine_client,
        progress=False,
    )  # fmt: skip
    assert converged_fit.state == "converged" and converged_fit.iterations < 50
    other_store = root / "other.zarr"
    write_synthetic(
        other_store, 2000, num_symbols=30, context_length=4, query_dim=5, num_targets=12, seed=9,
        options=WriteOptions(chunk_rows=1024, partition_rows=2048),
    )  # fmt: skip
    empty = root / "empty"
    empty.mkdir()
    copied = root / "finished-copy"
    shutil.copytree(finished, copied)
    both, warm, kind = root / "finished-both", root / "finished-warm", root / "finished-kind"
    for path in (both, warm, kind):
        shutil.copytree(finished, path)
    before = {path: tree_state(path) for path in (finished, copied, converged_dir, both, warm, kind)}
    common = ("--max-iter", "2", "--tol", "0", "--scheduler", address)
    resume_finished = ("fit", small_store, "--model-dir", str(finished), "--resume", "--scheduler", address)
    launched = {
        "settings": Launched((*resume_finished, "--tol", "0.001", "--seed", "5"), deadline=60),
        "kind": Launched(
            ("fit", small_store, "--model-dir", str(kind), "--resume", "--scheduler", address, "--head", "conj"),
            deadline=60,
        ),
        "store": Launched(("fit", str(other_store), "--model-dir", str(copied), "--resume", *common), deadline=60),
        "empty": Launched(("fit", small_store, "--model-dir", str(empty), "--resume", *common, "--json"), deadline=60),
        "both": Launched(
            ("fit", small_store, "--model-dir", str(both), "--resume", "--overwrite", *common), deadline=60
        ),
        "warm": Launched(
            ("fit", small_store, "--model-dir", str(warm), "--resume", "--init-from", str(converged_dir), *common),
            deadline=60,
        ),
        "converged": Launched(
            ("fit", small_store, "--model-dir", str(converged_dir), "--resume"),
            env=cli_env(DASK_SCHEDULER_ADDRESS=f"tcp://127.0.0.1:{free_port()}"),
            deadline=60,
        ),
    }
    return {
        "finished": finished, "copied": copied, "converged_dir": converged_dir, "converged_fit": converged_fit,
        "empty_dir": empty, "both_dir": both, "warm_dir": warm, "kind_dir": kind, "reference": reference,
        "other_store": str(other_store), "before": before, **launched,
    }  # fmt: skip


@pytest.mark.parametrize("setting", ["tol: 0.0 -> 0.001", "seed: 0 -> 5"], ids=["tol", "seed"])
@pytest.mark.slow
def test_resume_with_other_settings_is_refused(resume_runs, setting):
    """``--resume`` with another ``--tol`` and ``--seed`` than the checkpoint's: one line naming each setting
    and both its values, exit 2, and the model directory unchanged (contents and mtimes)."""
    finished = resume_runs["finished"]
    line = assert_fit_error(resume_runs["settings"].wait(), str(finished), "cannot resume with other settings", setting)
    assert line.count(setting) == 1, line  # the seed the fit and its head both record, said once
    assert tree_state(finished) == resume_runs["before"][finished]


@pytest.mark.slow
def test_resume_with_another_kind_names_the_kinds_not_their_settings(resume_runs):
    """``--resume --head conj`` of a single head's fit: one line naming the two kinds, not their settings; nothing
    changed. (On a copy of the finished fit: run beside the ``settings`` command on the fit itself, one of the two
    now and then found the other's lock and failed on it.)"""
    kind = resume_runs["kind_dir"]
    line = assert_fit_error(
        resume_runs["kind"].wait(), str(kind), "a fit of a single_hop head", "cannot be resumed as a conj head"
    )
    assert "sigma2" not in line and "depth" not in line, line
    assert tree_state(kind) == resume_runs["before"][kind]


@pytest.mark.slow
def test_resume_on_another_store_is_refused(resume_runs):
    """``--resume`` of a fit on another store than its own: one line naming the store, nothing changed."""
    copied = resume_runs["copied"]
    assert_fit_error(resume_runs["store"].wait(), str(copied), resume_runs["other_store"], "fingerprint")
    assert tree_state(copied) == resume_runs["before"][copied]


@pytest.mark.slow
def test_resume_with_overwrite_is_refused(resume_runs):
    """``--resume --overwrite`` asks to continue a fit and to start it over: one line naming both flags, exit 2,
    and the fit kept as it was (before, the resume won and the overwrite was dropped without a word)."""
    both = resume_runs["both_dir"]
    assert_fit_error(resume_runs["both"].wait(), "--resume", "--overwrite", "give one")
    assert tree_state(both) == resume_runs["before"][both]


@pytest.mark.slow
def test_resume_with_another_warm_start_is_refused(resume_runs):
    """``--resume --init-from MODEL`` of a fit not started from MODEL: one line naming the directory, MODEL and the
    flag, exit 2, nothing changed (before, the fit resumed and the warm start was ignored)."""
    warm = resume_runs["warm_dir"]
    assert_fit_error(
        resume_runs["warm"].wait(), str(warm), "started without --init-from", str(resume_runs["converged_dir"])
    )
    assert tree_state(warm) == resume_runs["before"][warm]


@pytest.mark.slow
def test_resume_in_an_empty_model_dir_starts_a_new_fit(resume_runs):
    """``--resume`` into an empty directory runs a whole fit, bit-identical to the same fit made without it."""
    result = resume_runs["empty"].wait()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["state"], report["iterations"]) == ("max_iter", 2)
    empty = resume_runs["empty_dir"]
    assert_same_parameters(load_model(empty, "latest"), resume_runs["reference"].model)
    assert history_iterations(empty) == [1, 2]


@pytest.mark.slow
def test_resume_of_a_converged_fit_returns_at_once(resume_runs):
    """``--resume`` of a converged fit reports it and returns: no cluster reached, the directory unchanged."""
    result = resume_runs["converged"].wait()
    assert result.returncode == 0, result.stderr
    converged = resume_runs["converged_fit"]
    iterations = converged.iterations
    assert result.stderr.splitlines() == [
        f"{resume_runs['converged_dir']}: the fit already ended at iteration {iterations} (converged)"
    ]
    assert f"EM converged after {iterations} iterations" in result.stdout
    directory = resume_runs["converged_dir"]
    assert tree_state(directory) == resume_runs["before"][directory]
    assert_same_parameters(load_model(directory, "latest"), converged.model)
