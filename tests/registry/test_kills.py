"""Retraining runs killed with SIGKILL: mid-fit (the CLI), and mid-publish at each of the registry's writes.

Mid-publish kills are injected into a real ``retrain`` run in a child Python process (one a case, all forked by
one process that imported the package once): it wraps ``RegistryFiles.write``/``create`` (and the temporary
file those write first) so that right after the k-th
write of the registry (the lock's own writes are not counted), or right after that write's temporary file
is complete but before it is moved into place, the process SIGKILLs itself. Every kill must leave a
registry whose ``latest`` names a complete version that loads, and the next run on this host must break
the dead run's lock, publish the next number, and leave no orphan behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from dist_respattn.artifacts.registry_lock import LOCK_FILE
from dist_respattn.engine import FitSettings
from dist_respattn.registry import Registry, retrain
from tests.engine.test_bad_input import cli_env, run_cli, start_cli
from tests.registry.conftest import expected_layout, files_under

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command


@pytest.fixture(scope="module")
def base(tmp_path_factory, stores, client) -> Path:
    """A registry at version 1 (copied by each test)."""
    root = tmp_path_factory.mktemp("kills") / "registry"
    retrain(
        root,
        stores.train,
        validation=stores.validation,
        settings=FitSettings(max_iter=1),
        client=client,
        progress=False,
    )
    return root


def registry_files(root: Path) -> set[str]:
    return set(files_under(root))


# -- killed mid-fit -----------------------------------------------------------------------------------------


def test_cli_killed_mid_fit_leaves_the_registry_valid_and_the_next_run_recovers(tmp_path, base, stores, address):
    registry = tmp_path / "registry"
    shutil.copytree(base, registry)
    before = files_under(registry)
    args = (
        "retrain",
        "--registry",
        str(registry),
        "--store",
        stores.train,
        "--validation",
        stores.validation,
        "--scheduler",
        address,
    )
    # Its temporary directory under the test's: the killed run cannot remove its scratch fit (retrain's default work
    # directory), which would otherwise stay in the machine's /tmp for good.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = start_cli(*args, "--max-iter", "30", "--tol", "0", "--patience", "30", env=cli_env(TMPDIR=str(scratch)))
    said: list[str] = []
    assert proc.stderr is not None
    while not (line := proc.stderr.readline()).startswith("iteration 1:"):
        assert line, f"the run ended before its first iteration: {''.join(said)}"
        said.append(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert said[0] == f"{registry}: warm start from version 1\n"
    # A SIGKILLed run cannot remove its scratch fit: it is left where TMPDIR said, not in the machine's /tmp.
    assert any(p.name.startswith("respattn-retrain-") for p in scratch.iterdir())

    reg = Registry(str(registry))
    assert reg.problems() == []
    assert reg.latest_number() == 1 and reg.numbers() == [1]
    lock = json.loads((registry / LOCK_FILE).read_text())
    assert lock["pid"] == proc.pid
    assert {k: v for k, v in files_under(registry).items() if k != LOCK_FILE} == before  # nothing else written
    check = run_cli("models", "check", str(registry))
    assert (check.returncode, check.stdout) == (0, f"{registry}: 1 version, latest 1: every file checks out\n")

    recovered = run_cli(*args, "--max-iter", "1", "--tolerance", "1")
    assert recovered.returncode == 0, recovered.stderr
    assert f"{registry}/{LOCK_FILE}: breaking a stale lock (its process {proc.pid} on this host is gone)" in (
        recovered.stderr.splitlines()
    )
    assert recovered.stdout.startswith(f"published version 2 to {registry}\n")
    assert reg.numbers() == [1, 2] and reg.latest_number() == 2
    assert reg.problems() == []
    assert registry_files(registry) == expected_layout(registry)


# -- killed mid-publish -------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, traceback
    from dist_respattn.engine import ClusterOptions, FitSettings
    from dist_respattn.registry import retrain
    from dist_respattn.artifacts.registry_files import RegistryFiles
    from dist_respattn.artifacts.registry_lock import LOCK_FILE

    store, validation, address, cases = sys.argv[1:]
    writes = 0

    def run_case(registry, where, k):
        def counted(original):
            def wrapper(self, name, data):
                global writes
                if name == LOCK_FILE:
                    return original(self, name, data)
                writes += 1
                done = original(self, name, data)
                if where == "after" and writes == k:
                    print(f"killed after {name}", file=sys.stderr, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                return done
            return wrapper

        def temp_written(original):
            def wrapper(self, path, data):
                temp = original(self, path, data)
                if where == "inside" and writes == k and not path.endswith(LOCK_FILE):
                    print(f"killed inside the write of {path}", file=sys.stderr, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                return temp
            return wrapper

        RegistryFiles.write = counted(RegistryFiles.write)
        RegistryFiles.create = counted(RegistryFiles.create)
        RegistryFiles._write_temp = temp_written(RegistryFiles._write_temp)
        retrain(registry, store, validation=validation, settings=FitSettings(max_iter=1), tolerance=1.0,
                cluster=ClusterOptions(scheduler=address), progress=False)
        print("not killed", file=sys.stderr, flush=True)

    # One process imports the package, then forks a process per case (before any thread or connection exists),
    # each with its own stderr file: the cases run together without each paying for the imports.
    started = {}
    for name, registry, where, k, err in json.loads(cases):
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            try:
                run_case(registry, where, k)
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            os._exit(0)
        started[name] = pid
    ended = {}
    for name, pid in started.items():
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        ended[name] = {"pid": pid, "returncode": code}
    print(json.dumps(ended))
    """
)


@dataclass(frozen=True)
class Case:
    """A kill: on a registry at version 1 (``fresh``: an empty one), right ``after`` the k-th registry write or
    ``inside`` it (its temporary file complete, not yet moved into place); what the registry holds after it."""

    fresh: bool
    where: str
    k: int
    numbers: list[int]
    latest: int | None
    orphans: int  # model folders no version names


CASES = {
    # The writes of a publish on a registry at version 1: params, meta, the version claim, latest.
    "params-written": Case(False, "after", 1, [1], 1, 1),
    "meta-written": Case(False, "after", 2, [1], 1, 1),
    "version-claimed": Case(False, "after", 3, [1, 2], 1, 0),
    "latest-written": Case(False, "after", 4, [1, 2], 2, 0),
    # The first publish on an empty registry starts with the marker registry.json.
    "marker-written": Case(True, "after", 1, [], None, 0),
    # Killed between writing a file's temporary copy and moving it into place.
    "inside-params": Case(False, "inside", 1, [1], 1, 1),
    "inside-version-claim": Case(False, "inside", 3, [1], 1, 1),
    "inside-latest": Case(False, "inside", 4, [1, 2], 1, 0),
    "inside-marker": Case(True, "inside", 1, [], None, 0),
}


@pytest.fixture(scope="module")
def killed(tmp_path_factory, base, stores, address):
    """Every case's process, started together (each on its own copy of the registry, forked by one process that
    imported the package) and collected: ``name -> (registry, pid, return code, stderr)``."""
    root = tmp_path_factory.mktemp("killed")
    cases = []
    for name, case in CASES.items():
        registry = root / name
        if not case.fresh:
            shutil.copytree(base, registry)
        cases.append([name, str(registry), case.where, case.k, str(root / f"{name}.err")])
    argv = [sys.executable, "-c", CHILD, stores.train, stores.validation, address, json.dumps(cases)]
    scratch = root / "tmp"  # the killed runs' scratch fits (retrain's default work directory) stay under the test's
    scratch.mkdir()
    done = subprocess.run(argv, capture_output=True, text=True, env=cli_env(TMPDIR=str(scratch)), timeout=240)
    assert done.returncode == 0, done.stderr
    ended = json.loads(done.stdout)
    return {
        name: (root / name, ended[name]["pid"], ended[name]["returncode"], (root / f"{name}.err").read_text())
        for name in CASES
    }


def killed_case(killed, name: str) -> tuple[Path, int, Case]:
    registry, pid, returncode, err = killed[name]
    assert returncode == -signal.SIGKILL, err
    assert "killed " in err.splitlines()[-1], err
    return registry, pid, CASES[name]


def orphans(registry: Path) -> list[str]:
    named = {v.model_path for v in Registry(str(registry)).versions()}
    folder = registry / "models"
    return sorted(p.name for p in folder.iterdir() if f"models/{p.name}" not in named) if folder.is_dir() else []


@pytest.mark.slow  # the children of every case start together: ~20 s
@pytest.mark.parametrize("name", list(CASES))
def test_killed_publish_leaves_a_valid_registry(killed, name):
    registry, pid, case = killed_case(killed, name)
    reg = Registry(str(registry))
    assert reg.problems() == []
    assert reg.numbers() == case.numbers
    assert reg.latest_number() == case.latest
    if case.latest is not None:
        checkpoint = reg.load()  # every file there, and as hashed in the version's record
        assert checkpoint.meta["format"] == "dist_respattn.checkpoint"
    assert len(orphans(registry)) == case.orphans
    assert json.loads((registry / LOCK_FILE).read_text())["pid"] == pid  # the dead run's lock is left


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_next_run_recovers(killed, name, stores, client):
    """The next run breaks the dead run's lock, warm-starts from ``latest``, publishes the number after the
    highest (a claimed version is never reused), and leaves exactly a clean registry: no orphan folder,
    no temporary file, no lock."""
    registry, _, case = killed_case(killed, name)
    result = retrain(
        registry,
        stores.train,
        validation=stores.validation,
        settings=FitSettings(max_iter=1),
        tolerance=1.0,
        client=client,
        progress=False,
    )
    expected = max(case.numbers, default=0) + 1
    assert (result.published, result.version, result.previous) == (True, expected, case.latest)
    reg = Registry(str(registry))
    assert reg.numbers() == [*case.numbers, expected]
    assert reg.latest_number() == expected
    assert reg.problems() == []
    assert orphans(registry) == []
    assert registry_files(registry) == expected_layout(registry)
