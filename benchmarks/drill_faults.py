"""Fault drill: fits and registry retrains on a real cluster of subprocesses, each hit by one injected fault.

Starts ``dask scheduler`` and two ``dask worker --nthreads 1`` processes on 127.0.0.1, writes a synthetic
training store of ``--rows`` rows (S=200, N=8, D=16, T=50; 8,192-row partitions of 4,096-row chunks) and a
validation store of a fifth of that, then:

1. **the reference**: one ``dist-respattn fit STORE --scheduler ADDR --max-iter N --tol 0`` with no fault;
2. **``--fits K`` drilled fits** of the same store and settings, each a ``dist-respattn fit`` subprocess with one
   fault injected at a random moment: after the i-th ``iteration`` line appears on the fit's stderr (plus a
   random fraction of an iteration's seconds), or after a random delay once it has connected to the scheduler
   (up to 0.85 x N x the reference's seconds per iteration, so the init pass can be hit too):

   - ``worker``: SIGKILL of one ``dask worker`` (its nanny and worker process); a replacement worker is started
     at once, so the cluster keeps 2. The fit must finish on its own (exit 0);
   - ``driver``: SIGKILL of the fit, then ``fit --resume`` to the end;
   - ``scheduler``: SIGKILL of the scheduler; the fit exits non-zero (its client gives up reconnecting after
     10 s; one still running 60 s after the kill counts as hung and is killed), a new scheduler is started on
     the same port (another port if that one cannot be bound), the workers are restarted when they do not
     reconnect (a worker whose scheduler vanished closes itself), then ``fit --resume``;
   - ``none``: a control, drawn at a low rate.

   The first fits take each fault kind of ``--kinds`` once, in a seeded random order (so any run of
   ``--fits`` >= 3 covers worker, driver and scheduler); the rest are drawn at random. Each final model
   (``load_checkpoint(model_dir, "latest")``) must match the reference bit for bit: key means, emission and
   position prior ``np.array_equal``, the same ``sigma2``, and the same iteration count;
3. **``--retrains R`` registry drills**: ``dist-respattn retrain --registry DIR --store ... --validation ...
   --keep 3 --tolerance 100`` subprocesses on the same cluster (the lax gate makes most runs publish and
   prune), SIGKILLed mid-fit (after an iteration line), just after the gate decision (while it publishes and
   prunes), after a random delay, or not at all (``--retrain-triggers``; ``write``, not drawn by default,
   kills the moment one of the run's first temporary files appears in the registry). After every kill and every
   completed run the registry is checked: ``Registry(DIR).problems() == []``, ``latest`` loads and never goes
   back; after a run that published, at most ``--keep`` versions and no model files that no version names; a
   run that follows a kill must take over the stale lock (exit 0 or 1, never 3 "locked"). Every state that
   fails a check counts as corrupted. If the last drill was a kill, one more unkilled run closes the drill (it
   checks the lock recovery), and ``dist-respattn models check`` must pass at the end.

The fault schedule (kinds, triggers, iteration numbers, fractions of delays, victims) depends on ``--seed`` only;
the delays in seconds scale with the reference fit's measured duration.

A fit or retrain still running ``max(60 s, 10 x the reference fit's seconds)`` after it started counts as hung
and is killed (a fit is then not finished, unless its kind resumes it). Exit status 1 when a fit did not
finish, a final model differs from the reference, a retrain hung, or a corrupted registry state was found.
Every subprocess runs in its own process group, and every group is stopped on the way out
(SIGTERM of this script included). The work directory (stores, model directories, registry, logs) is removed
unless ``--keep``, or when the drill fails (its logs are then kept and named).

Run::

    python benchmarks/drill_faults.py                                     # 10 fits, 10 retrains
    python benchmarks/drill_faults.py --fits 3 --retrains 2 --rows 20000 --iterations 4 --json   # a smoke run
"""

from __future__ import annotations

import os

# One thread for every process (the kernel is single-threaded); the subprocesses inherit these.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TextIO  # noqa: E402

import distributed  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
from tqdm import tqdm  # noqa: E402

import dist_respattn  # noqa: E402
from dist_respattn import random_distribution  # noqa: E402
from dist_respattn.engine import load_checkpoint  # noqa: E402
from dist_respattn.registry import Registry  # noqa: E402
from dist_respattn.store import WriteOptions, write_synthetic  # noqa: E402

#: The head of the stores: S symbols, context length N, query dimension D, T targets.
SHAPE = (200, 8, 16, 50)
#: Small partitions, so that a fit runs several E-step tasks a worker can be lost in.
STORE_OPTIONS = WriteOptions(chunk_rows=4096, partition_rows=8192)

FAULT_KINDS = ("worker", "driver", "scheduler")
FIT_KINDS = (*FAULT_KINDS, "none")
#: How often each kind is drawn once the first fits have taken each fault once (``none`` is the control).
KIND_WEIGHTS = {"worker": 0.3, "driver": 0.3, "scheduler": 0.3, "none": 0.1}

#: When a retrain is killed: mid-fit, just after the gate decision (publishing), after a random delay, never;
#: and, only when asked for, the moment a temporary file of one of its registry writes appears (``write``).
RETRAIN_TRIGGERS = ("iteration", "gate", "delay", "none")
RETRAIN_WEIGHTS = {"iteration": 0.3, "gate": 0.3, "delay": 0.25, "none": 0.15, "write": 0.3}
#: The longest wait after the gate line before the kill: publishing a small head, pruning and releasing the lock
#: take ~10-20 ms after that line (the process then needs ~0.5 s more to exit).
GATE_DELAY_S = 0.02
#: ``retrain``'s exit status: published, gate kept the current version, error, another run holds the lock.
RETRAIN_PUBLISHED, RETRAIN_KEPT, RETRAIN_LOCKED = 0, 1, 3

ITERATION_LINE = re.compile(r"^iteration (\d+): ")
#: The line ``retrain`` says once the gate has decided (``describe()``), before it publishes.
GATE_LINE = re.compile(r"gate (passed|failed)|the registry's first version")
#: A fit's line once it has connected to the scheduler: the anchor of a fault at a random delay.
CONNECTED_LINE = re.compile(r"^connected to the scheduler at ")
#: The ``write`` trigger kills at one of the first this many temporary files a retrain creates in the registry.
WRITE_SIGHTINGS = 5

BIN = Path(sys.executable).parent
DIST_RESPATTN = str(BIN / "dist-respattn")
DASK = str(BIN / "dask")

#: Seconds a command may run before it counts as hung (and is killed): the reference fit's, and the longest wait
#: for a moment of a fault. Every later command gets ``HANG_FACTOR`` times the reference fit's seconds, at least
#: ``HANG_MIN_S``.
COMMAND_TIMEOUT_S = 600.0
HANG_FACTOR = 10.0
HANG_MIN_S = 60.0
#: Seconds a fit may take to exit once its scheduler is gone (its client retries for 10 s); after that it counts
#: as hung and is killed (then resumed like any other).
EXIT_AFTER_SCHEDULER_LOSS_S = 60.0
#: Seconds the cluster may take to have its 2 workers serving.
CLUSTER_READY_S = 90.0
#: Seconds the old workers get to reconnect to a restarted scheduler before they are replaced.
RECONNECT_WAIT_S = 5.0


# ---------------------------------------------------------------------------------------- processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env() -> dict[str, str]:
    """This process's environment without a scheduler address (every command is given ``--scheduler``)."""
    return {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads (it and everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class Processes:
    """Every subprocess of the drill, each the leader of a process group of its own."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[Any]] = []

    def start(self, args: list[str], name: str, *, pipe_stderr: bool = False) -> subprocess.Popen[Any]:
        """``args`` with stdout in ``logs/<name>.out`` and stderr in ``logs/<name>.log`` (or a pipe)."""
        with open(self.logs / f"{name}.out", "wb") as out:
            err: Any = subprocess.PIPE if pipe_stderr else open(self.logs / f"{name}.log", "wb")
            try:
                proc = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    text=pipe_stderr,
                    env=child_env(),
                    start_new_session=True,
                )
            finally:
                if not pipe_stderr:
                    err.close()
        self.started.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[Any]) -> None:
        """SIGKILL the process group of ``proc``, but for multiprocessing's resource trackers, and reap its leader.

        A tracker left alive sees the pipes of the processes it served close and unlinks the semaphores they left
        in ``/dev/shm``; killed with them, it left them there for good (seven files a drill run)."""
        for member in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(member.pid) == proc.pid and not any(
                    "multiprocessing.resource_tracker" in part for part in member.info["cmdline"] or ()
                ):
                    member.kill()
        proc.wait()

    @staticmethod
    def stop(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
        """SIGTERM the group of ``proc``; SIGKILL whatever is left of it after ``timeout``."""
        if group_alive(proc.pid):
            signal_group(proc, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while group_alive(proc.pid) and time.monotonic() < deadline:
                if proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.1)
                else:
                    time.sleep(0.1)
            signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)

    def stop_all(self) -> None:
        """Stop every group still running: commands first, then workers, the scheduler last."""
        for proc in reversed(self.started):
            self.stop(proc)
        for proc in self.started:
            if proc.stderr is not None:
                with contextlib.suppress(OSError):
                    proc.stderr.close()


class Watched:
    """A command whose stderr is read line by line (and copied to a log) as it runs."""

    def __init__(self, procs: Processes, args: list[str], name: str) -> None:
        self.name = name
        self.args = args
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.iterations = 0
        self.ended = False
        self._cond = threading.Condition()
        self._log = open(procs.logs / f"{name}.log", "w")  # closed by the reader thread
        self.proc = procs.start(args, name, pipe_stderr=True)
        self._reader = threading.Thread(target=self._read, name=f"drill-read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stream: TextIO = self.proc.stderr  # type: ignore[assignment]
        try:
            for line in stream:
                self._log.write(line)
                self._log.flush()
                match = ITERATION_LINE.match(line)
                with self._cond:
                    self.lines.append((time.monotonic(), line.rstrip("\n")))
                    if match:
                        self.iterations = max(self.iterations, int(match.group(1)))
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            self._log.close()
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``condition()`` holds (``True``), or stderr ends or ``timeout`` passes (``False``)."""
        with self._cond:
            self._cond.wait_for(lambda: condition() or self.ended, timeout)
            return condition()

    def saw(self, pattern: re.Pattern[str]) -> bool:
        return any(pattern.search(text) for _, text in self.lines)

    def running(self) -> bool:
        return self.proc.poll() is None

    def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the command ends first; whether it still runs."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=max(0.0, seconds))
        return self.running()

    def wait(self, timeout: float = COMMAND_TIMEOUT_S) -> int | None:
        """The exit status (``-9`` after SIGKILL), or ``None`` when it was still running after ``timeout`` (killed)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            Processes.kill(self.proc)
            self._reader.join(timeout=10)
            return None
        self._reader.join(timeout=10)
        return code

    def iteration_stamps(self) -> list[float]:
        return [stamp for stamp, text in self.lines if ITERATION_LINE.match(text)]

    def tail(self, lines: int = 6) -> str:
        return " | ".join(text for _, text in self.lines[-lines:])


# ------------------------------------------------------------------------------------------ cluster


class Cluster:
    """``dask scheduler`` and 2 ``dask worker --nthreads 1`` subprocesses on 127.0.0.1."""

    WORKERS = 2

    def __init__(self, procs: Processes, folder: Path) -> None:
        self.procs = procs
        self.folder = folder
        self.port = free_port()
        self.scheduler: subprocess.Popen[Any] | None = None
        self.workers: list[subprocess.Popen[Any]] = []
        self._started = {"scheduler": 0, "worker": 0}

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _name(self, role: str) -> str:
        self._started[role] += 1
        return f"{role}-{self._started[role]}"

    def start(self) -> None:
        self.start_scheduler()
        for _ in range(self.WORKERS):
            self.start_worker()
        self.wait_ready()

    def start_scheduler(self) -> bool:
        """A scheduler on ``self.port`` if it can bind it, else on a new port; whether the port is the same."""
        for attempt in range(3):
            port = self.port if attempt == 0 else free_port()
            proc = self.procs.start(
                [
                    *(DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port)),
                    *("--no-dashboard", "--dashboard-address", "127.0.0.1:0"),
                ],
                self._name("scheduler"),
            )
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    self.scheduler = proc
                    same = port == self.port
                    self.port = port
                    return same
                time.sleep(0.1)
            self.procs.stop(proc)
        raise RuntimeError(f"no dask scheduler came up (logs in {self.procs.logs})")

    def start_worker(self) -> subprocess.Popen[Any]:
        name = self._name("worker")
        proc = self.procs.start(
            [
                *(DASK, "worker", self.address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"),
                *("--local-directory", str(self.folder / name)),
            ],
            name,
        )
        self.workers.append(proc)
        return proc

    def serving(self, timeout: float = 10.0) -> int:
        """How many workers the scheduler has (0 when it cannot be reached)."""
        try:
            with distributed.Client(self.address, timeout=timeout, set_as_default=False) as client:
                return len(client.scheduler_info(n_workers=-1)["workers"])
        except (OSError, TimeoutError):
            return 0

    def wait_ready(self, timeout: float = CLUSTER_READY_S) -> None:
        """Until the scheduler has exactly 2 workers (a killed one is gone, its replacement registered)."""
        deadline = time.monotonic() + timeout
        seen = -1
        while time.monotonic() < deadline:
            self.workers = [w for w in self.workers if w.poll() is None]
            seen = self.serving()
            if seen == self.WORKERS:
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"the cluster at {self.address} has {seen} workers, not {self.WORKERS} (logs: {self.procs.logs})"
        )

    def kill_worker(self, victim: int) -> int:
        """SIGKILL worker ``victim`` (its nanny and worker process) and start a replacement; the killed pid."""
        proc = self.workers[victim % len(self.workers)]
        pid = proc.pid
        self.procs.kill(proc)
        self.workers.remove(proc)
        self.start_worker()
        return pid

    def kill_scheduler(self) -> int:
        assert self.scheduler is not None
        pid = self.scheduler.pid
        self.procs.kill(self.scheduler)
        self.scheduler = None
        return pid

    def restart_after_scheduler_loss(self) -> dict[str, Any]:
        """A new scheduler (same port if possible); the old workers get a moment to reconnect, else are replaced."""
        same_port = self.start_scheduler()
        old = [w for w in self.workers if w.poll() is None]
        reconnected = False
        if same_port and old:
            deadline = time.monotonic() + RECONNECT_WAIT_S
            while time.monotonic() < deadline and not reconnected:
                reconnected = self.serving() == self.WORKERS
                time.sleep(0.2)
        if not reconnected:
            for worker in old:
                self.procs.stop(worker)
            self.workers = []
            for _ in range(self.WORKERS):
                self.start_worker()
        self.wait_ready()
        return {"same_port": same_port, "workers_reconnected": reconnected, "old_workers_alive": len(old)}


# -------------------------------------------------------------------------------------------- plans


@dataclasses.dataclass(frozen=True)
class Moment:
    """When a fault is injected (``fraction`` is uniform in [0, 1) unless said otherwise).

    ``iteration``: after the ``iteration``-th iteration line, plus ``fraction`` of an iteration's seconds;
    ``delay``: ``fraction`` of the expected span after the anchor (a fit: its "connected" line; a retrain: its start);
    ``gate``: after the gate decision's line, plus ``fraction`` of ``GATE_DELAY_S``;
    ``write``: at once when the ``1 + int(fraction * WRITE_SIGHTINGS)``-th temporary file is seen in the registry;
    ``none``: never.
    """

    trigger: str
    iteration: int | None
    fraction: float

    def sighting(self) -> int:
        return 1 + int(self.fraction * WRITE_SIGHTINGS)

    def describe(self, seconds: float | None = None) -> str:
        delay = "" if seconds is None else f" +{seconds:.2f} s"
        if self.trigger == "iteration":
            return f"after iteration {self.iteration}{delay}"
        if self.trigger == "gate":
            return f"after the gate decision{delay}"
        if self.trigger == "delay":
            return f"after{delay or f' {self.fraction:.2f} of its span'}"
        if self.trigger == "write":
            return f"at its temporary file #{self.sighting()} in the registry"
        return "never"


@dataclasses.dataclass(frozen=True)
class FitPlan:
    kind: str
    moment: Moment
    victim: int


def plan_fits(rng: random.Random, count: int, kinds: tuple[str, ...], iterations: int) -> list[FitPlan]:
    """The first fits take each fault kind once (shuffled), the rest are drawn by ``KIND_WEIGHTS``."""
    faults = [k for k in FAULT_KINDS if k in kinds]
    first = rng.sample(faults, len(faults))
    drawn = list(kinds)
    weights = [KIND_WEIGHTS[k] for k in drawn]
    plans = []
    for index in range(count):
        kind = first[index] if index < len(first) else rng.choices(drawn, weights)[0]
        if rng.random() < 0.6 and iterations > 1:
            moment = Moment("iteration", rng.randint(1, iterations - 1), rng.random())
        else:
            moment = Moment("delay", None, rng.uniform(0.05, 0.85))
        plans.append(FitPlan(kind, moment, rng.randrange(Cluster.WORKERS)))
    return plans


def plan_retrains(rng: random.Random, count: int, triggers: tuple[str, ...], iterations: int) -> list[Moment]:
    """The first retrains take each trigger once (shuffled), the rest are drawn by ``RETRAIN_WEIGHTS``."""
    first = rng.sample(triggers, len(triggers))
    weights = [RETRAIN_WEIGHTS[t] for t in triggers]
    moments = []
    for index in range(count):
        trigger = first[index] if index < len(first) else rng.choices(triggers, weights)[0]
        if trigger == "iteration":
            moments.append(Moment("iteration", rng.randint(1, max(1, iterations - 1)), rng.random()))
        elif trigger == "delay":
            moments.append(Moment("delay", None, rng.uniform(0.1, 1.0)))
        else:
            moments.append(Moment(trigger, None, rng.random()))
    return moments


def reach(
    run: Watched,
    moment: Moment,
    *,
    iteration_s: float,
    span_s: float,
    anchor: re.Pattern[str] | None = None,
    temp_files: Callable[[], list[str]] | None = None,
) -> tuple[bool, str]:
    """Wait for ``moment`` in ``run``: whether the command still runs then (a fault can land), and when it is."""
    if moment.trigger == "iteration":
        assert moment.iteration is not None
        iteration = moment.iteration
        if not run.wait_for(lambda: run.iterations >= iteration, COMMAND_TIMEOUT_S):
            return False, moment.describe()
        delay = moment.fraction * iteration_s
    elif moment.trigger == "gate":
        if not run.wait_for(lambda: run.saw(GATE_LINE), COMMAND_TIMEOUT_S):
            return False, moment.describe()
        delay = moment.fraction * GATE_DELAY_S
    elif moment.trigger == "write":
        assert temp_files is not None
        seen: list[str] = []
        while run.running():
            seen += [name for name in temp_files() if name not in seen]
            if len(seen) >= moment.sighting():
                return True, f"{moment.describe()} ({seen[-1]})"
            time.sleep(0.0002)
        return False, moment.describe()
    else:
        start = run.started
        if anchor is not None:
            if not run.wait_for(lambda: run.saw(anchor), COMMAND_TIMEOUT_S):
                return False, moment.describe()
            start = next(stamp for stamp, text in run.lines if anchor.search(text))
        delay = max(0.0, start + moment.fraction * span_s - time.monotonic())
        return run.sleep(delay), f"{moment.fraction * span_s:.2f} s after {'connecting' if anchor else 'its start'}"
    return run.sleep(delay), moment.describe(delay)


# ---------------------------------------------------------------------------------------------- fits


@dataclasses.dataclass
class Drill:
    """What every drilled command shares."""

    procs: Processes
    cluster: Cluster
    workdir: Path
    store: str
    validation: str
    iterations: int
    keep_versions: int
    tolerance: float
    say: Callable[[str], None]
    iteration_s: float = 0.5
    fit_s: float = 5.0
    span_s: float = 3.0
    counter: dict[str, int] = dataclasses.field(default_factory=dict)

    def name(self, prefix: str) -> str:
        self.counter[prefix] = self.counter.get(prefix, 0) + 1
        return f"{prefix}-{self.counter[prefix]:02d}"

    def fit_args(self, model_dir: Path) -> list[str]:
        return [
            *(DIST_RESPATTN, "fit", self.store, "--model-dir", str(model_dir), "--scheduler", self.cluster.address),
            *("--max-iter", str(self.iterations), "--tol", "0"),
        ]

    @property
    def hang_s(self) -> float:
        """Seconds after which a fit or a retrain counts as hung."""
        return max(HANG_MIN_S, HANG_FACTOR * self.fit_s)

    def run_fit(self, model_dir: Path, *extra: str, timeout: float | None = None) -> tuple[Watched, int | None]:
        run = Watched(self.procs, [*self.fit_args(model_dir), *extra], self.name("fit"))
        return run, run.wait(self.hang_s if timeout is None else timeout)


def parameters(model_dir: Path) -> dict[str, Any]:
    checkpoint = load_checkpoint(model_dir, "latest")
    model = checkpoint.model
    return {
        "key_means": model.key_means,
        "emission": model.emission,
        "position_prior": model.position_prior,
        "sigma2": model.sigma2,
        "iteration": checkpoint.iteration,
        "state": checkpoint.meta.get("state"),
        "history": [entry.get("mean_log_likelihood") for entry in checkpoint.meta.get("history", [])],
    }


def compare(model_dir: Path, reference: dict[str, Any]) -> dict[str, Any]:
    """Which parameters differ from the reference fit's (an empty list: bit-identical)."""
    try:
        ours = parameters(model_dir)
    except (OSError, ValueError) as exc:
        return {"loaded": False, "error": str(exc), "different": ["(no checkpoint)"], "iteration": None}
    different = [
        name for name in ("key_means", "emission", "position_prior") if not np.array_equal(ours[name], reference[name])
    ]
    if ours["sigma2"] != reference["sigma2"]:
        different.append("sigma2")
    return {
        "loaded": True,
        # Entries of interrupted checkpoint writes that the resumed fit left behind (it should remove them).
        "leftovers": sorted(name for name in os.listdir(model_dir) if name.startswith(".tmp-")),
        "different": different,
        "iteration": ours["iteration"],
        "iteration_equal": ours["iteration"] == reference["iteration"],
        "history_equal": ours["history"] == reference["history"],
    }


def reference_fit(drill: Drill) -> dict[str, Any]:
    """The fault-free fit every drilled fit is compared with; also times an iteration and a whole fit."""
    drill.cluster.wait_ready()
    model_dir = drill.workdir / "reference"
    run, code = drill.run_fit(model_dir, timeout=COMMAND_TIMEOUT_S)
    if code != 0:
        raise RuntimeError(f"the reference fit failed (exit {code}): {run.tail()}")
    stamps = run.iteration_stamps()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    drill.iteration_s = float(statistics.median(gaps)) if gaps else 0.5
    drill.fit_s = time.monotonic() - run.started
    # A fit runs at least this long after connecting (an init pass, then the iterations). The reference's own
    # span is not used: its first iteration also loads the kernel on the workers, and later fits are faster.
    drill.span_s = drill.iterations * drill.iteration_s
    reference = parameters(model_dir)
    if reference["iteration"] != drill.iterations:
        raise RuntimeError(f"the reference fit stopped at iteration {reference['iteration']}, not {drill.iterations}")
    return reference


def drill_fit(drill: Drill, index: int, plan: FitPlan, reference: dict[str, Any]) -> dict[str, Any]:
    """One fit with the fault ``plan``; the fit is then recovered as its kind requires and compared."""
    drill.cluster.wait_ready()
    model_dir = drill.workdir / f"fit-{index:02d}"
    started = time.perf_counter()
    run = Watched(drill.procs, drill.fit_args(model_dir), drill.name("fit"))
    record: dict[str, Any] = {"index": index, "kind": plan.kind, "planned": plan.moment.describe(), "landed": False}
    if plan.kind != "none":
        running, record["moment"] = reach(
            run, plan.moment, iteration_s=drill.iteration_s, span_s=drill.span_s, anchor=CONNECTED_LINE
        )
        record["iterations_seen"] = run.iterations
        if running:
            record["landed"] = True
            if plan.kind == "worker":
                record["killed_pid"] = drill.cluster.kill_worker(plan.victim)
            elif plan.kind == "driver":
                drill.procs.kill(run.proc)
            else:
                record["killed_pid"] = drill.cluster.kill_scheduler()
            killed_at = time.perf_counter()
    timeout = EXIT_AFTER_SCHEDULER_LOSS_S if plan.kind == "scheduler" and record["landed"] else drill.hang_s
    code = run.wait(timeout)
    record["exit"] = code
    record["hung"] = code is None  # still running after ``timeout``: killed
    final_code = code
    if plan.kind == "scheduler" and record["landed"]:
        record["exit_seconds_after_kill"] = round(time.perf_counter() - killed_at, 2)
        record["restart"] = drill.cluster.restart_after_scheduler_loss()
    if plan.kind in ("driver", "scheduler") and (record["landed"] or code != 0):
        resumed, final_code = drill.run_fit(model_dir, "--resume")
        record["resume_exit"] = final_code
        record["resume_hung"] = final_code is None
        if final_code != 0:
            record["resume_tail"] = resumed.tail()
    elif code != 0:
        record["tail"] = run.tail()
    record["finished"] = final_code == 0
    comparison = compare(model_dir, reference)
    record.update(comparison)
    record["finished"] = bool(record["finished"] and comparison["loaded"])
    record["identical"] = bool(record["finished"] and not comparison["different"] and comparison["iteration_equal"])
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def describe_fit(record: dict[str, Any], total: int) -> str:
    what = "control, no fault" if record["kind"] == "none" else f"{record['kind']} killed {record.get('moment')}"
    if record["kind"] != "none" and not record["landed"]:
        what = f"{record['kind']} fault missed (the fit ended first)"
    outcome = "finished" if record["finished"] else "DID NOT FINISH"
    if record.get("hung") or record.get("resume_hung"):
        outcome += f" (HUNG: {'the resumed fit' if record.get('resume_hung') else 'the fit'} was still running, killed)"
    same = "bit-identical" if record["identical"] else f"DIFFERENT ({', '.join(record['different']) or 'iterations'})"
    return f"fit {record['index'] + 1}/{total}: {what}: {outcome}, {same} ({record['seconds']:.1f} s)"


# ------------------------------------------------------------------------------------------ registry


@dataclasses.dataclass
class RegistryWatch:
    """What the registry drills have seen so far."""

    folder: Path
    keep: int
    states: int = 0
    corrupted: int = 0
    latest: int | None = None
    reports: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def lock_holder(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / "lock.json").read_text())
        except (OSError, ValueError):
            return None

    def temp_files(self) -> list[str]:
        """Temporary files of unfinished writes in the registry (``<name>.tmp-<token>``), as relative paths."""
        found = []
        for folder in (self.folder, self.folder / "versions", *self._model_folders()):
            with contextlib.suppress(OSError):
                found += [str(Path(e.path).relative_to(self.folder)) for e in os.scandir(folder) if ".tmp-" in e.name]
        return found

    def _model_folders(self) -> list[Path]:
        with contextlib.suppress(OSError):
            return [Path(e.path) for e in os.scandir(self.folder / "models") if e.is_dir()]
        return []

    def check(self, after: str, *, published: bool = False, extra: list[str] | None = None) -> list[str]:
        """Check the registry's state now; its problems (none: a sound state). Counts the state."""
        found = list(extra or [])
        registry = Registry(str(self.folder))
        latest = None
        try:
            found += registry.problems()
            latest = registry.latest_number()
            if latest is not None:
                registry.load("latest")
            numbers = registry.numbers()
            if self.latest is not None and (latest is None or latest < self.latest):
                found.append(f"latest went from version {self.latest} back to {latest}")
            if published:
                if len(numbers) > self.keep:
                    found.append(f"{len(numbers)} versions after a publishing run with --keep {self.keep}: {numbers}")
                named = {registry.version(n).model_path for n in numbers}
                models = self.folder / "models"
                folders = sorted(models.iterdir()) if models.is_dir() else []
                orphans = [p.name for p in folders if f"models/{p.name}" not in named]
                if orphans:
                    found.append(f"model folders no version names after a publishing run: {orphans}")
        except Exception as exc:  # whatever reading the registry raises, the state is not sound
            if not any(str(exc) in problem for problem in found):
                found.append(f"{type(exc).__name__}: {exc}")
        found = list(dict.fromkeys(found))
        if latest is not None and (self.latest is None or latest > self.latest):
            self.latest = latest
        self.states += 1
        if found:
            self.corrupted += 1
        self.reports.append({"after": after, "latest": latest, "problems": found})
        return found


def retrain_args(drill: Drill, registry: Path, work_dir: Path) -> list[str]:
    return [
        *(DIST_RESPATTN, "retrain", "--registry", str(registry), "--store", drill.store),
        *("--validation", drill.validation, "--keep", str(drill.keep_versions), "--tolerance", repr(drill.tolerance)),
        *("--scheduler", drill.cluster.address, "--max-iter", str(drill.iterations), "--tol", "0"),
        *("--work-dir", str(work_dir)),
    ]


def drill_retrain(drill: Drill, watch: RegistryWatch, index: int, moment: Moment, estimate_s: float) -> dict[str, Any]:
    """One ``retrain``, SIGKILLed at ``moment`` (or not), and the registry's state after it."""
    drill.cluster.wait_ready()
    stale = watch.lock_holder()
    started = time.perf_counter()
    work_dir = drill.workdir / f"retrain-{index + 1:02d}"
    run = Watched(drill.procs, retrain_args(drill, watch.folder, work_dir), drill.name("retrain"))
    record: dict[str, Any] = {
        "index": index,
        "trigger": moment.trigger,
        "planned": moment.describe(),
        "killed": False,
        "stale_lock_before": stale is not None,
    }
    if moment.trigger != "none":
        running, record["moment"] = reach(
            run, moment, iteration_s=drill.iteration_s, span_s=estimate_s, temp_files=watch.temp_files
        )
        record["iterations_seen"] = run.iterations
        if running:
            drill.procs.kill(run.proc)
            record["killed"] = True
    code = run.wait(drill.hang_s)
    record["exit"] = code
    record["hung"] = code is None  # still running after ``hang_s``: killed
    record["seconds"] = round(time.perf_counter() - started, 2)
    extra = []
    if not record["killed"]:
        if record["hung"]:
            extra.append(f"retrain still running after {drill.hang_s:.0f} s (killed): {run.tail(3)}")
        elif code not in (RETRAIN_PUBLISHED, RETRAIN_KEPT):
            what = "another run holds the lock" if code == RETRAIN_LOCKED else "an error"
            extra.append(f"retrain exited {code} ({what}): {run.tail(3)}")
        record["published"] = code == RETRAIN_PUBLISHED
    if stale is not None and not record["hung"]:
        # A lock left by a killed run: this run must have broken it (run to its end, or held the lock when killed).
        if not record["killed"]:
            record["lock_recovered"] = code in (RETRAIN_PUBLISHED, RETRAIN_KEPT)
        else:  # killed: it took the lock over if the lock names it; else it was killed before it tried
            holder = watch.lock_holder()
            record["lock_recovered"] = True if holder is not None and holder.get("pid") == run.proc.pid else None
        if record["lock_recovered"] is False:
            extra.append(f"the stale lock of pid {stale.get('pid')} was not taken over (exit {code})")
    after = f"retrain {index + 1} " + ("killed " + record["moment"] if record["killed"] else f"exited {code}")
    record["problems"] = watch.check(after, published=bool(record.get("published")), extra=extra)
    record["latest"] = watch.latest
    record["lock_left"] = watch.lock_holder() is not None
    return record


def describe_retrain(record: dict[str, Any], total: int | str) -> str:
    if record["hung"]:
        what = "HUNG (still running long after it should have ended; killed)"
    elif record["killed"]:
        what = f"killed {record['moment']}"
    elif record["trigger"] == "none":
        what = f"not killed, exit {record['exit']}"
    else:
        what = f"ended before the kill ({record['planned']}), exit {record['exit']}"
    if record.get("lock_recovered"):
        what += ", took over the stale lock"
    state = "registry sound" if not record["problems"] else f"CORRUPTED: {'; '.join(record['problems'])}"
    seconds = record["seconds"]
    label = f"retrain {record['index'] + 1}/{total}" if isinstance(total, int) else total
    return f"{label}: {what}: {state}, latest {record['latest']} ({seconds:.1f} s)"


def models_check(drill: Drill, registry: Path) -> dict[str, Any]:
    """``dist-respattn models check REGISTRY --json`` (the registry's own verification)."""
    completed = subprocess.run(
        [DIST_RESPATTN, "models", "check", str(registry), "--json"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env=child_env(),
        check=False,
    )
    try:
        report = json.loads(completed.stdout)
    except ValueError:
        report = {"problems": [completed.stderr.strip() or "no JSON report"]}
    return {"exit": completed.returncode, "problems": report.get("problems", []), "versions": report.get("versions")}


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fits", type=int, default=10, help="drilled fits, each with one fault (default 10)")
    parser.add_argument("--retrains", type=int, default=None, help="registry retrain drills (default: --fits)")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the training store (default 200,000)")
    parser.add_argument("--iterations", type=int, default=6, help="EM iterations of every fit (--max-iter, tol 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule (the stores use seed 0)")
    parser.add_argument(
        "--kinds",
        default=",".join(FIT_KINDS),
        help=f"fault kinds to draw from, comma-separated (default {','.join(FIT_KINDS)})",
    )
    parser.add_argument(
        "--retrain-triggers",
        default=",".join(RETRAIN_TRIGGERS),
        help=f"when retrains are killed, comma-separated, of {', '.join(RETRAIN_WEIGHTS)} "
        f"(default {','.join(RETRAIN_TRIGGERS)}; 'write' kills at a temporary file of a registry write)",
    )
    parser.add_argument("--keep-versions", type=int, default=3, help="retrain --keep (default 3)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=100.0,
        help="retrain --tolerance (default 100: a lax gate, so that most runs publish and prune, the writes a kill "
        "must not damage; a warm-started candidate's held-out perplexity is often a little worse than its start's)",
    )
    parser.add_argument("--workdir", default=None, help="where the stores, models and logs go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure instead")
    args = parser.parse_args(argv)
    if args.retrains is None:
        args.retrains = args.fits
    for name in ("fits", "retrains"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0")
    if not args.tolerance >= 0:
        parser.error("--tolerance must be >= 0")
    for name in ("rows", "iterations", "keep_versions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    kinds = tuple(dict.fromkeys(k.strip() for k in args.kinds.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in FIT_KINDS]
    if unknown or not kinds:
        parser.error(f"--kinds {args.kinds}: expected some of {', '.join(FIT_KINDS)}")
    args.kinds = kinds
    triggers = tuple(dict.fromkeys(t.strip() for t in args.retrain_triggers.split(",") if t.strip()))
    if not triggers or any(t not in RETRAIN_WEIGHTS for t in triggers):
        parser.error(f"--retrain-triggers {args.retrain_triggers}: expected some of {', '.join(RETRAIN_WEIGHTS)}")
    args.retrain_triggers = triggers
    return args


def write_stores(workdir: Path, rows: int) -> tuple[str, str]:
    truth = random_distribution(*SHAPE, seed=0)
    train = str(workdir / "train.zarr")
    validation = str(workdir / "validation.zarr")
    write_synthetic(train, rows, model=truth, seed=1, options=STORE_OPTIONS)
    write_synthetic(validation, max(2000, rows // 5), model=truth, seed=2, options=STORE_OPTIONS)
    return train, validation


def on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    started = time.perf_counter()
    rng = random.Random(args.seed)
    fit_plans = plan_fits(rng, args.fits, args.kinds, args.iterations)
    retrain_plans = plan_retrains(rng, args.retrains, args.retrain_triggers, args.iterations)

    parent = args.workdir
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="drill_faults-", dir=parent))
    logs = workdir / "logs"
    logs.mkdir()
    procs = Processes(logs)
    bar = tqdm(total=args.fits + args.retrains, file=sys.stderr, disable=not sys.stderr.isatty(), unit="drill")

    def say(text: str) -> None:
        if bar.disable:
            print(text, file=sys.stderr, flush=True)
        else:
            bar.write(text, file=sys.stderr)

    fits: list[dict[str, Any]] = []
    retrains: list[dict[str, Any]] = []
    watch = RegistryWatch(workdir / "registry", args.keep_versions)
    phases: dict[str, float] = {}
    failure: str | None = None
    closing: dict[str, Any] | None = None
    check_report: dict[str, Any] | None = None
    reference: dict[str, Any] = {}
    try:
        mark = time.perf_counter()
        train, validation = write_stores(workdir, args.rows)
        phases["write_stores"] = time.perf_counter() - mark
        mark = time.perf_counter()
        cluster = Cluster(procs, workdir / "cluster")
        cluster.start()
        phases["start_cluster"] = time.perf_counter() - mark
        drill = Drill(
            procs, cluster, workdir, train, validation, args.iterations, args.keep_versions, args.tolerance, say
        )

        mark = time.perf_counter()
        reference = reference_fit(drill)
        phases["reference_fit"] = time.perf_counter() - mark
        say(
            f"reference fit: {reference['iteration']} iterations in {drill.fit_s:.1f} s "
            f"({drill.iteration_s:.2f} s an iteration) on {cluster.address}"
        )

        mark = time.perf_counter()
        for index, plan in enumerate(fit_plans):
            record = drill_fit(drill, index, plan, reference)
            fits.append(record)
            say(describe_fit(record, args.fits))
            bar.update()
        phases["fits"] = time.perf_counter() - mark

        mark = time.perf_counter()
        durations: list[float] = []  # of the retrains that ran to their end: the span of a random delay
        for index, moment in enumerate(retrain_plans):
            estimate = statistics.median(durations) if durations else drill.fit_s
            record = drill_retrain(drill, watch, index, moment, estimate)
            retrains.append(record)
            if not record["killed"] and record["exit"] in (RETRAIN_PUBLISHED, RETRAIN_KEPT):
                durations.append(record["seconds"])
            say(describe_retrain(record, args.retrains))
            bar.update()
        if retrains and (retrains[-1]["killed"] or retrains[-1]["hung"]):
            # Nothing has followed the last kill: one more run must take the lock over and finish.
            closing = drill_retrain(drill, watch, len(retrains), Moment("none", None, 0.0), drill.fit_s)
            say(describe_retrain(closing, "closing retrain (after the last kill)"))
        if args.retrains:
            check_report = models_check(drill, watch.folder)
            if check_report["exit"] != 0 or check_report["problems"]:
                watch.corrupted += 1
            watch.states += 1
        phases["retrains"] = time.perf_counter() - mark
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
        say(f"drill aborted: {failure}")
    except (KeyboardInterrupt, SystemExit):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        failure = "interrupted"
        say("drill interrupted: stopping every process it started")
    finally:
        bar.close()
        mark = time.perf_counter()
        procs.stop_all()
        phases["stop_cluster"] = time.perf_counter() - mark

    faults = dict.fromkeys(FIT_KINDS, 0)
    for record in fits:
        if record["kind"] == "none" or record["landed"]:
            faults[record["kind"]] += 1
    killed = [r for r in retrains if r["killed"]]
    every_retrain = [*retrains, *([closing] if closing else [])]
    recoveries = [r["lock_recovered"] for r in every_retrain if r.get("lock_recovered") is not None]
    report = {
        "config": {
            "fits": args.fits,
            "retrains": args.retrains,
            "rows": args.rows,
            "validation_rows": max(2000, args.rows // 5),
            "iterations": args.iterations,
            "seed": args.seed,
            "kinds": list(args.kinds),
            "retrain_triggers": list(args.retrain_triggers),
            "keep_versions": args.keep_versions,
            "tolerance": args.tolerance,
            "shape": dict(zip(("symbols", "context", "dim", "targets"), SHAPE, strict=True)),
            "partition_rows": STORE_OPTIONS.partition_rows,
            "chunk_rows": STORE_OPTIONS.chunk_rows,
            "workers": Cluster.WORKERS,
            "dir": str(workdir),
            "dist_respattn": dist_respattn.__version__,
            "distributed": distributed.__version__,
        },
        "reference": {
            "iterations": reference.get("iteration"),
            "state": reference.get("state"),
            "fit_seconds": round(drill.fit_s, 2) if reference else None,
            "iteration_seconds": round(drill.iteration_s, 3) if reference else None,
        },
        "fits_attempted": len(fits),
        "fits_finished": sum(r["finished"] for r in fits),
        "fits_identical": sum(r["identical"] for r in fits),
        "faults": faults,
        "faults_missed": sum(1 for r in fits if r["kind"] != "none" and not r["landed"]),
        # Commands that were still running long after they should have ended, and were killed.
        "fits_hung": sum(1 for r in fits if r.get("hung") or r.get("resume_hung")),
        "hang_seconds": round(drill.hang_s, 1) if reference else None,
        "retrains_attempted": len(retrains),
        "retrains_killed": len(killed),
        "retrains_completed": sum(1 for r in every_retrain if not r["killed"] and not r["hung"]),
        "retrains_hung": sum(1 for r in every_retrain if r["hung"]),
        "retrains_published": sum(1 for r in every_retrain if r.get("published")),
        "lock_recoveries": sum(1 for r in recoveries if r),
        "lock_recovery_failures": sum(1 for r in recoveries if not r),
        "registry_states_checked": watch.states,
        "corrupted_states": watch.corrupted,
        "registry_latest": watch.latest,
        "models_check": check_report,
        "total_seconds": round(time.perf_counter() - started, 1),
        "phase_seconds": {k: round(v, 2) for k, v in phases.items()},
        "failure": failure,
        "fit_records": fits,
        "retrain_records": retrains,
        "closing_run": closing,
        "registry_states": watch.reports,
    }
    report["ok"] = bool(
        failure is None
        and report["fits_attempted"] == args.fits
        and report["fits_finished"] == report["fits_attempted"] == report["fits_identical"]
        and report["retrains_attempted"] == args.retrains
        and report["corrupted_states"] == 0
        and report["retrains_hung"] == 0
    )
    kept = args.keep or not report["ok"]
    report["config"]["kept"] = kept
    if not kept:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report) if args.json else format_report(report))
    return 0 if report["ok"] else 1


def format_report(report: dict[str, Any]) -> str:
    config, reference = report["config"], report["reference"]
    faults = report["faults"]
    lines = [
        f"fault drill: {config['fits']} fits and {config['retrains']} retrains of {config['rows']:,} rows, "
        f"{config['iterations']} iterations, seed {config['seed']}, on a dask scheduler + {config['workers']} workers "
        "(subprocesses on 127.0.0.1)",
        f"reference fit: {reference['iterations']} iterations ({reference['state']}) in {reference['fit_seconds']} s",
        "",
        f"fits attempted                          {report['fits_attempted']:>5}",
        f"fits finished                           {report['fits_finished']:>5}",
        f"parameters bit-identical to reference   {report['fits_identical']:>5}",
        "faults by kind                          "
        + ", ".join(f"{kind} {faults[kind]}" for kind in FIT_KINDS)
        + (f" ({report['faults_missed']} missed: the fit ended first)" if report["faults_missed"] else ""),
        f"retrains attempted                      {report['retrains_attempted']:>5}"
        f"   (killed {report['retrains_killed']}, completed {report['retrains_completed']}, "
        f"published {report['retrains_published']})",
        *(
            [f"fits hung (killed after {report['hang_seconds']} s)       {report['fits_hung']:>5}"]
            if report["fits_hung"]
            else []
        ),
        *([f"retrains hung                           {report['retrains_hung']:>5}"] if report["retrains_hung"] else []),
        f"stale locks taken over                  {report['lock_recoveries']:>5}"
        + (f"   ({report['lock_recovery_failures']} NOT)" if report["lock_recovery_failures"] else ""),
        f"registry states checked                 {report['registry_states_checked']:>5}",
        f"corrupted states found                  {report['corrupted_states']:>5}",
        f"total seconds                           {report['total_seconds']:>7.1f}",
    ]
    bad_fits = [r for r in report["fit_records"] if not r["identical"]]
    for record in bad_fits:
        lines.append(f"  fit {record['index'] + 1}: {json.dumps({k: v for k, v in record.items() if k != 'index'})}")
    for state in report["registry_states"]:
        if state["problems"]:
            lines.append(f"  registry after {state['after']}: {'; '.join(state['problems'])}")
    if report["failure"]:
        lines.append(f"drill aborted: {report['failure']}")
    lines.append(("PASS" if report["ok"] else "FAIL") + (f" (logs kept in {config['dir']})" if config["kept"] else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
