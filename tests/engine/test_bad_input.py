"""``dist-respattn fit`` on bad input, run as real subprocesses: one line on stderr, exit 2, nothing written.

Every case checks what a user sees (the exit status and a single ``dist-respattn fit: error: …`` line naming
the store, array, row, shapes or address at fault) and what is on disk afterwards: no model directory, the
input stores and model directories byte- and mtime-identical, nothing in the command's working directory.

Bad values are found by the workers, so those fits run on a real cluster (``--scheduler`` of this module's
LocalCluster, and once on an embedded cluster); the other cases fail before any cluster is reached, and are
still given ``--scheduler`` so that a missing check shows as a fit that succeeds rather than one that starts
a cluster of its own. Each command is a fresh interpreter (~1 s of imports), so the commands of a group
start together in a module fixture and the tests read their results; the runs that wait for timeouts (the
unreachable schedulers) and the embedded cluster start in the background with the module.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import distributed
import numpy as np
import pytest
import zarr

from dist_respattn.engine import FitSettings, fit
from dist_respattn.store import WriteOptions, validate, write_arrays

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

COMMAND = str(Path(sys.executable).parent / "dist-respattn")
ERROR_PREFIX = "dist-respattn fit: error: "

#: The shape of the stores made here: all four different, so a field mixed up with another shows.
S, N, D, T = 13, 4, 3, 7
#: 1,000 rows in 64-row chunks and 256-row partitions: 4 partitions, 16 chunks.
ROWS = 1000
LAYOUT = WriteOptions(chunk_rows=64, partition_rows=256)
#: How much longer than a command failing right after its imports (started at the same moment) a command
#: that cannot reach its scheduler may take: the engine's connect timeout is 10 s.
UNREACHABLE_EXTRA_SECONDS = 13.0
#: When a background command is taken to hang and killed: far past the ~10 s they take alone, since they run
#: together and beside the other tests' clusters (a loaded 2-core machine has taken over 25 s).
BACKGROUND_DEADLINE = 60.0


# -- helpers (test_failures.py uses them too) -------------------------------------------------------


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a command: this one without ``DASK_SCHEDULER_ADDRESS``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    env.update(extra)
    return env


def start_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``dist-respattn ARGS`` started in the background, stdout and stderr piped."""
    return subprocess.Popen(
        [COMMAND, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=cli_env() if env is None else env,
    )


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``dist-respattn ARGS`` run to the end."""
    return Launched(args, cwd=cwd, env=env, deadline=timeout).wait()


class Launched:
    """A command started now and collected by a thread: its result, and its wall time from start to exit.

    A command still running ``deadline`` seconds after its start is killed (its result then has
    return code -9 and ``timed_out`` is set).
    """

    def __init__(
        self, args: tuple[str, ...], *, cwd: Path | None = None, env: dict[str, str] | None = None, deadline: float
    ) -> None:
        self.deadline = deadline
        self.timed_out = False
        self.started = time.monotonic()
        self.proc = start_cli(*args, cwd=cwd, env=env)
        self._result: subprocess.CompletedProcess[str] | None = None
        self.seconds = float("nan")
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        try:
            out, err = self.proc.communicate(timeout=self.deadline)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.proc.kill()
            out, err = self.proc.communicate()
        self.seconds = time.monotonic() - self.started
        self._result = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def wait(self) -> subprocess.CompletedProcess[str]:
        self._thread.join()
        assert self._result is not None
        return self._result

    def stop(self) -> None:
        """Kill the command if it still runs, and collect it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self._thread.join()


def tree_state(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry under ``root``: relative path -> (sha256 of the content, or ``dir``; mtime in ns)."""
    state = {}
    for path in sorted(root.rglob("*")):
        digest = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        state[str(path.relative_to(root))] = (digest, path.stat().st_mtime_ns)
    return state


def assert_fit_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, empty stdout, and stderr exactly one line ``dist-respattn fit: error: …`` holding ``fragments``."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(ERROR_PREFIX), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def assert_same_parameters(actual, expected) -> None:
    """Bit-identical heads: every array ``np.array_equal`` and the same ``sigma2``."""
    for name in ("key_means", "emission", "position_prior"):
        assert np.array_equal(getattr(actual, name), getattr(expected, name)), name
    assert actual.sigma2 == expected.sigma2


def free_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_small(path: Path, *, seed: int = 0, shape: tuple[int, int, int, int] = (S, N, D, T)) -> str:
    """A valid store of ``ROWS`` random rows of ``shape`` (4 partitions); returns its path."""
    s, n, d, t = shape
    rng = np.random.default_rng(seed)
    write_arrays(
        path,
        rng.integers(0, s, (ROWS, n)),
        rng.standard_normal((ROWS, d)),
        rng.integers(0, t, ROWS),
        num_symbols=s,
        num_targets=t,
        options=LAYOUT,
    )
    return str(path)


def corrupt_store(path: Path, array: str, index: tuple[int, ...], value) -> str:
    """A valid store with one value of ``array`` overwritten through zarr; ``validate`` flags exactly that row."""
    store = write_small(path)
    zarr.open_group(store)[array][index] = value
    problems = validate(store).problems
    assert [(p.array, p.row) for p in problems] == [(array, index[0])], problems
    return store


@dataclass
class Scene:
    """A command's inputs and what it must leave alone: its store, a model directory that must not appear,
    a working directory that must stay empty, and other inputs (model directories, stores) to keep."""

    store: str
    model_dir: Path
    cwd: Path
    before: dict[str, dict[str, tuple[str, int]]]

    @classmethod
    def make(cls, root: Path, store: str, *keep: str) -> Scene:
        cwd = root / "cwd"
        cwd.mkdir()
        return cls(store, root / "model", cwd, {p: tree_state(Path(p)) for p in (store, *keep)})

    def fit(self, *args: str, deadline: float = 120, env: dict[str, str] | None = None) -> Launched:
        """``dist-respattn fit STORE --model-dir MODEL ARGS`` started in the scene's working directory."""
        return Launched(
            ("fit", self.store, "--model-dir", str(self.model_dir), *args), cwd=self.cwd, env=env, deadline=deadline
        )

    def assert_nothing_written(self) -> None:
        assert not self.model_dir.exists(), sorted(os.listdir(self.model_dir))
        assert list(self.cwd.iterdir()) == []
        for path, before in self.before.items():
            assert tree_state(Path(path)) == before, path


# -- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def address(client):
    """The scheduler address of the engine tests' shared LocalCluster (2 single-threaded worker processes)."""
    return client.scheduler.address


#: The tests that read each background run (a run starts only when one of its tests was selected).
BACKGROUND_READERS = {
    "embedded": ("test_embedded_cluster_reports_a_bad_store", "test_embedded_cluster_error_is_the_only_line"),
    "option": ("test_unreachable_scheduler_is_a_one_line_error",),
    "env": ("test_unreachable_scheduler_is_a_one_line_error",),
    "silent": ("test_scheduler_that_never_answers_is_a_one_line_error",),
    "baseline": (
        "test_unreachable_scheduler_is_a_one_line_error",
        "test_scheduler_that_never_answers_is_a_one_line_error",
    ),
}


@pytest.fixture(scope="module", autouse=True)
def background(request, tmp_path_factory):
    """The slow runs, started with the module (those some selected test reads) and read by tests at its end.

    ``embedded``: ``fit --json`` without ``--scheduler`` (an embedded one-worker cluster) on a store with a
    bad id. ``option``/``env``: ``--scheduler`` (or ``DASK_SCHEDULER_ADDRESS``) at a free port nothing
    listens on. ``silent``: ``--scheduler`` at a port that accepts connections but never answers (like a
    dashboard port given by mistake). ``baseline``: a fit of a missing store, which fails right after its
    imports: what starting a command costs on this machine right now. Each is killed ``BACKGROUND_DEADLINE`` s
    after its start.
    """
    root = tmp_path_factory.mktemp("background")
    bad = corrupt_store(root / "bad.zarr", "context", (5, 1), S + 10)
    train = write_small(root / "train.zarr")
    free = f"tcp://127.0.0.1:{free_port()}"
    runs: dict[str, tuple[Scene, Launched]] = {}
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel completes the handshakes; nobody ever reads or writes
        silent = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        cases = {
            "embedded": (bad, ("--workers", "1", "--json"), None),
            "option": (train, ("--scheduler", free), None),
            "env": (train, (), cli_env(DASK_SCHEDULER_ADDRESS=free)),
            "silent": (train, ("--scheduler", silent), None),
            "baseline": (str(root / "missing.zarr"), ("--scheduler", free), None),
        }
        selected = {item.originalname for item in request.session.items if item.module is request.module}
        try:
            for name, (store, extra, env) in cases.items():
                if selected.isdisjoint(BACKGROUND_READERS[name]):
                    continue
                (root / name).mkdir()
                at = Scene.make(root / name, store)
                runs[name] = (at, at.fit(*extra, env=env, deadline=BACKGROUND_DEADLINE))
            yield {"free": free, "silent_address": silent, **runs}
        finally:
            for _, launched in runs.values():
                launched.stop()


# -- a store that fails validation ------------------------------------------------------------------------

#: Bad values and the message naming each: (array, index, value, message fragment).
BAD_VALUES = {
    "context": ("context", (5, 1), S + 10, f"context[5, 1] = {S + 10}: expected a symbol id in [0, {S})"),
    "target": ("target", (5,), T, f"target[5] = {T}: expected a target id in [0, {T})"),
    "query": ("query", (5, 2), np.nan, "query[5, 2] = nan: expected a finite value"),
    "later_chunk": ("context", (600, 1), S + 10, f"= {S + 10}: expected a symbol id in [0, {S})"),
}


@pytest.fixture(scope="module")
def bad_value_runs(tmp_path_factory, address):
    """``fit --json --scheduler`` on a store holding each bad value, all at once; and one in text mode.

    The bad context id is run in text mode (row 5) and, in ``--json``, at row 600 (``later_chunk``): one command
    more for it in ``--json`` at row 5 would take the same path as the second (each command is an interpreter's
    start, ~1.5 CPU s)."""
    root = tmp_path_factory.mktemp("bad-values")
    runs = {}
    for name, (array, index, value, _) in BAD_VALUES.items():
        if name == "context":
            continue
        (root / name).mkdir()
        at = Scene.make(root / name, corrupt_store(root / name / "bad.zarr", array, index, value))
        runs[name] = (at, at.fit("--max-iter", "2", "--scheduler", address, "--json"))
    (root / "text").mkdir()
    at = Scene.make(root / "text", corrupt_store(root / "text" / "bad.zarr", *BAD_VALUES["context"][:3]))
    runs["text"] = (at, at.fit("--scheduler", address))
    return runs


@pytest.mark.parametrize("case", ["target", "query"])
def test_bad_value_is_a_one_line_error(bad_value_runs, case):
    """An id out of range or a NaN query, found by the workers, fails the fit naming the array, cell and value.
    (A bad context id: the text-mode test and the later-chunk test below.)

    Nothing is written: no model directory, the store untouched. (``--json`` keeps the cluster
    announcement off stderr, so the error is its only line.)
    """
    at, launched = bad_value_runs[case]
    assert_fit_error(launched.wait(), BAD_VALUES[case][3])
    at.assert_nothing_written()


def test_bad_value_text_output_is_the_announcement_and_one_error_line(bad_value_runs, address):
    """Without ``--json``, stderr holds the announcements (the cluster, its fit page, where the held-out rows are),
    then the one error line: no traceback."""
    at, launched = bad_value_runs["text"]
    result = launched.wait()
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 4, result.stderr
    assert lines[0].startswith(f"connected to the scheduler at {address}"), lines[0]
    assert lines[1].startswith("fit page: http://"), lines[1]
    assert lines[2].startswith("no validation store: the hyperparameters are chosen on 5% of the training"), lines[2]
    assert lines[3].startswith(ERROR_PREFIX), lines[3]
    assert BAD_VALUES["context"][3] in lines[3], lines[3]
    at.assert_nothing_written()


def test_bad_value_in_a_later_chunk_is_named_by_its_store_row(bad_value_runs):
    """A bad id at store row 600 (partition 2, chunk 9) is reported as row 600 of the named store."""
    at, launched = bad_value_runs["later_chunk"]
    line = assert_fit_error(launched.wait(), BAD_VALUES["later_chunk"][3])
    at.assert_nothing_written()
    assert at.store in line, line
    assert "[600, 1]" in line or "row 600" in line, line


@pytest.fixture(scope="module")
def damaged_runs(tmp_path_factory, address):
    """``fit --json --scheduler`` on stores whose ``query`` shard of partition 2 is missing, empty or garbage."""
    root = tmp_path_factory.mktemp("damaged")
    runs = {}
    for damage in ("missing", "empty", "garbage"):
        (root / damage).mkdir()
        store = write_small(root / damage / "damaged.zarr")
        shard = Path(store) / "query" / "c" / "2" / "0"
        if damage == "missing":
            shard.unlink()
        elif damage == "empty":
            shard.write_bytes(b"")
        else:
            shard.write_bytes(np.random.default_rng(0).bytes(shard.stat().st_size))
        at = Scene.make(root / damage, store)
        runs[damage] = (at, at.fit("--scheduler", address, "--json"))
    return runs


@pytest.mark.parametrize(
    ("damage", "fragments"),
    [
        ("missing", ("array 'query' partition 2", "chunk file 'query/c/2/0' is missing")),
        ("empty", ("array 'query' partition 2", "chunk file 'query/c/2/0' is empty")),
        ("garbage", ("array 'query'", "cannot be read")),
    ],
    ids=["missing", "empty", "garbage"],
)
def test_damaged_chunk_file_is_a_one_line_error(damaged_runs, damage, fragments):
    """A deleted, emptied or overwritten shard file fails the fit naming the store, the array and the file.

    The store was damaged on purpose; it is left as it was damaged, and no model directory appears.
    """
    at, launched = damaged_runs[damage]
    assert_fit_error(launched.wait(), at.store, *fragments)
    at.assert_nothing_written()


def test_embedded_cluster_reports_a_bad_store(background):
    """On an embedded cluster the bad id ends the command with exit 2 and the error as its last line.

    Nothing is written, and the command ends by itself.
    """
    at, launched = background["embedded"]
    result = launched.wait()
    assert not launched.timed_out
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    last = result.stderr.splitlines()[-1]
    assert last.startswith(ERROR_PREFIX), result.stderr
    assert BAD_VALUES["context"][3] in last, last
    at.assert_nothing_written()


def test_embedded_cluster_error_is_the_only_line(background):
    """With ``--json`` on an embedded cluster, the error is the only line on stderr: no worker log, no traceback."""
    _, launched = background["embedded"]
    result = launched.wait()
    assert "Traceback" not in result.stderr
    assert_fit_error(result, BAD_VALUES["context"][3])


# -- a model or validation store whose shape does not match ------------------------------------------------


@pytest.fixture(scope="module")
def shape_runs(tmp_path_factory, address):
    """A store and a model of another shape (S, N, D, T) = (9, 3, 4, 5), and three refused commands at once.

    ``init_from``: ``--init-from`` that model; ``validation``: ``--validation`` that store; ``in_use``: a
    fit into the model's directory without ``--resume`` or ``--overwrite``; ``empty_validation``: ``--validation``
    a store of the training store's corpus with no rows.
    """
    root = tmp_path_factory.mktemp("shapes")
    other = write_small(root / "other.zarr", shape=(9, 3, 4, 5))
    model = root / "other-model"
    with distributed.Client(address, set_as_default=False) as client:
        fit(other, model_dir=model, settings=FitSettings(max_iter=1), client=client, progress=False)
    train = write_small(root / "train.zarr")
    empty = root / "empty.zarr"
    write_arrays(empty, np.zeros((0, N), np.int64), np.zeros((0, D)), np.zeros(0, np.int64), like=train)
    runs = {}
    for name in ("init_from", "validation", "in_use", "empty_validation"):
        (root / name).mkdir()
        at = Scene.make(root / name, train if name != "in_use" else other, other, str(model))
        if name == "init_from":
            launched = at.fit("--init-from", str(model), "--scheduler", address)
        elif name == "validation":
            launched = at.fit("--validation", other, "--scheduler", address)
        elif name == "empty_validation":
            at.before[str(empty)] = tree_state(empty)
            launched = at.fit("--validation", str(empty), "--scheduler", address)
        else:
            at.model_dir = model  # must not change rather than not appear
            launched = at.fit("--scheduler", address)
        runs[name] = (at, launched)
    return {"other": other, "model": str(model), "empty": str(empty), **runs}


def test_init_from_a_model_of_another_shape(shape_runs):
    """``--init-from`` a model fitted on another shape is refused naming the model, the store and both shapes."""
    at, launched = shape_runs["init_from"]
    assert_fit_error(launched.wait(), shape_runs["model"], "(9, 3, 4, 5)", at.store, f"({S}, {N}, {D}, {T})")
    at.assert_nothing_written()


def test_validation_store_of_another_shape(shape_runs):
    """``--validation`` with a store of another shape is refused naming both stores and both shapes."""
    at, launched = shape_runs["validation"]
    assert_fit_error(launched.wait(), shape_runs["other"], "(9, 3, 4, 5)", at.store, f"({S}, {N}, {D}, {T})")
    at.assert_nothing_written()


def test_validation_store_without_rows(shape_runs):
    """``--validation`` with a store that holds no row is refused naming it and the flags that fix it, nothing
    written. Before, the first held-out pass failed with ``there are no partitions to reduce``, naming nothing."""
    at, launched = shape_runs["empty_validation"]
    assert_fit_error(launched.wait(), shape_runs["empty"], "no rows", "--validation", "--holdout-fraction")
    at.assert_nothing_written()


def test_predict_on_a_store_without_rows_is_refused_and_writes_nothing(tmp_path, address):
    """``predict`` into a file of rows or a zarr group, over a store of the model's corpus with no rows: one line
    naming the store, as ``evaluate`` says it. Before, a file said ``ranked first in nan% of rows`` and a group
    failed with ``there are no partitions to reduce``, an empty group left behind."""
    train = write_small(tmp_path / "train.zarr")
    model = tmp_path / "model"
    with distributed.Client(address, set_as_default=False) as client:
        fit(train, model_dir=model, settings=FitSettings(max_iter=1), client=client, progress=False)
    empty = tmp_path / "empty.zarr"
    write_arrays(empty, np.zeros((0, N), np.int64), np.zeros((0, D)), np.zeros(0, np.int64), like=train)
    for out in (tmp_path / "rows.jsonl", tmp_path / "rows.zarr"):
        done = subprocess.run(
            [COMMAND, "predict", str(model), str(empty), "--out", str(out), "--scheduler", address],
            capture_output=True, text=True, timeout=300, env=cli_env(),
        )  # fmt: skip
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "dist-respattn predict: error:" in done.stderr, done.stderr
        assert str(empty) in done.stderr and "no rows to predict" in done.stderr, done.stderr
        assert not out.exists()


def test_model_dir_holding_a_fit_is_left_alone(shape_runs):
    """``fit`` into a directory that holds a fit, without ``--resume``/``--overwrite``, is refused; it is unchanged."""
    at, launched = shape_runs["in_use"]
    assert_fit_error(launched.wait(), shape_runs["model"], "--resume", "--overwrite")
    assert list(at.cwd.iterdir()) == []
    for path, before in at.before.items():
        assert tree_state(Path(path)) == before, path


# -- an unreachable scheduler --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["option", "env"])
def test_unreachable_scheduler_is_a_one_line_error(background, how):
    """An address nothing listens on (``--scheduler`` or ``DASK_SCHEDULER_ADDRESS``) fails in ~10 s.

    One line naming the address, exit 2, no model directory, nothing in the working directory. The time is
    measured against a command started at the same moment that fails right after its imports.
    """
    at, launched = background[how]
    result = launched.wait()
    assert not launched.timed_out
    assert_fit_error(result, background["free"], "cannot reach the Dask scheduler")
    _, baseline = background["baseline"]
    assert_fit_error(baseline.wait(), "no such file or directory")
    assert launched.seconds - baseline.seconds < UNREACHABLE_EXTRA_SECONDS, (launched.seconds, baseline.seconds)
    at.assert_nothing_written()


def test_scheduler_that_never_answers_is_a_one_line_error(background):
    """An address that accepts connections but never answers fails like an unreachable one, in ~10 s."""
    at, launched = background["silent"]
    launched.wait()
    assert not launched.timed_out, f"still running after {launched.seconds:.0f} s"
    _, baseline = background["baseline"]
    baseline.wait()
    assert launched.seconds - baseline.seconds < UNREACHABLE_EXTRA_SECONDS, (launched.seconds, baseline.seconds)
    assert_fit_error(launched.wait(), background["silent_address"], "did not answer")
    at.assert_nothing_written()


# -- not a store ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def not_a_store_runs(tmp_path_factory, address):
    """``fit --scheduler`` on paths that are not triple stores, all at once."""
    root = tmp_path_factory.mktemp("not-a-store")
    paths = {
        "missing": root / "missing.zarr",
        "empty_dir": root / "empty",
        "file": root / "plain.txt",
        "zarr_group": root / "group.zarr",
        "zarr_array": root / "array.zarr",
    }
    paths["empty_dir"].mkdir()
    paths["file"].write_text("not a store\n")
    zarr.open_group(paths["zarr_group"], mode="w").attrs["something"] = "else"
    zarr.create_array(paths["zarr_array"], shape=(10,), dtype="int32")
    before = tree_state(root)
    runs = {}
    for name, path in paths.items():
        (root / f"run-{name}").mkdir()
        at = Scene(str(path), root / f"run-{name}" / "model", root / f"run-{name}" / "cwd", {})
        at.cwd.mkdir()
        runs[name] = (at, at.fit("--scheduler", address))
    return {"root": root, "before": before, **runs}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "no such file or directory"),
        ("empty_dir", "an empty directory, not a store: expected a store written by `dist-respattn ingest`"),
        ("file", "a file, not a store: expected a store written by `dist-respattn ingest`"),
        ("zarr_group", "a zarr group but no store of dist_respattn: expected a store written by"),
    ],
    ids=["missing", "empty_dir", "file", "zarr_group"],
)
def test_not_a_store_is_a_one_line_error(not_a_store_runs, case, expected):
    """A missing path, an empty directory, a plain file, a zarr group without our attributes: one line each.

    The line names the path and says what it is instead of a store; no model directory appears.
    """
    at, launched = not_a_store_runs[case]
    assert_fit_error(launched.wait(), at.store, expected)
    at.assert_nothing_written()


def test_zarr_array_instead_of_a_store_is_named(not_a_store_runs):
    """A zarr array (not a group) given as the store is refused saying it is not a store."""
    at, launched = not_a_store_runs["zarr_array"]
    assert_fit_error(launched.wait(), at.store, "a zarr array, not a store")
    at.assert_nothing_written()


def test_paths_that_are_not_stores_are_left_alone(not_a_store_runs):
    """None of the commands above changed any of the paths it was given (nor created one that was missing)."""
    for case in ("missing", "empty_dir", "file", "zarr_group", "zarr_array"):
        _, launched = not_a_store_runs[case]
        assert launched.wait().returncode == 2, case
    root = not_a_store_runs["root"]
    after = {k: v for k, v in tree_state(root).items() if not k.startswith("run-")}
    assert after == not_a_store_runs["before"]
