"""``dist-respattn retrain`` and ``dist-respattn models list|show|check`` as real subprocesses, one for each exit
status of each command (the other answers through the command's ``main`` in this process).

The retrain commands run on this module's LocalCluster (``--scheduler``). What is checked is what a user or
a cron job sees: the exit status (0 published, 1 the gate kept the current version, 2 an error, 3 locked),
stdout in text and ``--json``, and the registry's files. Two retrain commands started at the same moment on
one registry: exactly one publishes, the other exits 3 naming the winner's pid.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

from dist_respattn.artifacts.registry_lock import LOCK_FILE
from dist_respattn.engine import FitSettings
from dist_respattn.registry import Registry, RegistryLock, retrain
from tests.engine.test_bad_input import Launched, run_cli, tree_state
from tests.registry.conftest import expected_layout, files_under, run_in_process

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

HOST = socket.gethostname()


def retrain_args(registry: Path, store: str, address: str, *extra: str) -> tuple[str, ...]:
    return ("retrain", "--registry", str(registry), "--store", store, "--scheduler", address, *extra)


def error_line(result, command: str) -> str:
    """Exit 2, nothing on stdout, and one ``dist-respattn COMMAND: error: …`` line ending stderr (after the
    progress lines of a text-mode retrain, if any)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("dist-respattn ")]
    assert errors == lines[-1:], result.stderr
    assert lines[-1].startswith(f"dist-respattn {command}: error: "), lines[-1]
    return lines[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, stores, address):
    """Three retrain commands in a row on a new registry: a first version (``--json``), a candidate trained
    on another head's store that the gate refuses (tolerance 0, text), and a second version (text, ``--keep 1``).
    """
    root = tmp_path_factory.mktemp("cli") / "registry"
    common = ("--validation", stores.validation, "--max-iter", "2")
    # The first in this process (its --json answer is what is tested; the second shows exit 0 as a shell sees it).
    first = run_in_process(*retrain_args(root, stores.train, address, *common, "--json"))
    after_first = tree_state(root)
    first_record = Registry(str(root)).version(1).record if first.returncode == 0 else None
    refused = run_cli(*retrain_args(root, stores.other_head, address, *common, "--tolerance", "0"))
    after_refused = tree_state(root)
    second = run_cli(*retrain_args(root, stores.train, address, *common, "--tolerance", "0.5", "--keep", "1"))
    return {
        "root": root,
        "first": first,
        "refused": refused,
        "second": second,
        "after_first": after_first,
        "after_refused": after_refused,
        "first_record": first_record,
    }


def test_retrain_json_publishes_the_first_version(runs, stores):
    result = runs["first"]
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # --json: no progress lines
    report = json.loads(result.stdout)
    assert set(report) == {
        "published",
        "version",
        "previous",
        "gate",
        "fit",
        "registry",
        "pruned",
        "seconds",
        "exit_status",
    }
    assert (report["published"], report["version"], report["previous"], report["exit_status"]) == (True, 1, None, 0)
    assert report["registry"] == str(runs["root"])
    gate = report["gate"]
    assert (gate["metric"], gate["current"], gate["limit"], gate["passed"]) == ("perplexity", None, None, True)
    assert (gate["store"], gate["in_sample"], gate["tolerance"]) == (stores.validation, False, 0.01)
    assert report["fit"]["iterations"] <= 2 and report["fit"]["state"] in ("max_iter", "early_stopped", "converged")
    record = runs["first_record"]
    assert record["gate"] == gate
    assert record["provenance"]["settings"]["max_iter"] == 2


def test_retrain_refused_by_the_gate_exits_1(runs, stores):
    result = runs["refused"]
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"not published: the gate kept version 1 as latest in {runs['root']}"
    assert lines[1].startswith(f"gate (perplexity, tolerance 0, on {stores.validation}): new ")
    assert lines[1].endswith(f"current {json.loads(runs['first'].stdout)['gate']['candidate']:.6g}")
    assert lines[2].startswith("fit: ")
    assert len(lines) == 3
    assert any(line.startswith("gate failed: perplexity") for line in result.stderr.splitlines()), result.stderr
    assert result.stderr.splitlines()[-1] == f"{runs['root']}: not published; latest stays at version 1"
    assert runs["after_refused"] == runs["after_first"]  # nothing written, no lock left


def test_retrain_text_publishes_and_prunes(runs):
    result = runs["second"]
    assert result.returncode == 0, result.stderr
    root = runs["root"]
    lines = result.stdout.splitlines()
    assert lines[0] == f"published version 2 to {root}"
    assert lines[1].startswith("gate (perplexity, tolerance 0.5, on ")
    assert lines[-1] == "pruned versions: 1"
    said = result.stderr.splitlines()
    assert said[0] == f"{root}: warm start from version 1"
    assert f"{root}: published version 2" in said
    assert said[-1] == f"{root}: pruned version 1 (keeping 1)"
    registry = Registry(str(root))
    assert registry.numbers() == [2] and registry.latest_number() == 2
    assert set(files_under(root)) == expected_layout(root)


@pytest.fixture(scope="module")
def reads(runs):
    """``models list|show|check`` on the registry the retrain commands made (version 2 only, after the prune),
    on a copy with a damaged file, on an empty directory and on one holding other files; started together."""
    root = runs["root"]
    damaged = root.parent / "damaged"
    shutil.copytree(root, damaged)
    record = Registry(str(damaged)).version(2).record
    (damaged / record["model"] / "meta.json").write_text("{}")
    empty = root.parent / "empty"
    empty.mkdir()
    other = root.parent / "other"
    other.mkdir()
    (other / "data.csv").write_text("a,b\n")
    commands = {
        "list": ("models", "list", str(root)),
        "list-json": ("models", "list", str(root), "--json"),
        "show": ("models", "show", str(root)),
        "show-2-json": ("models", "show", str(root), "2", "--json"),
        "check": ("models", "check", str(root)),
        "damaged": ("models", "check", str(damaged)),
        "damaged-json": ("models", "check", str(damaged), "--json"),
        "empty": ("models", "list", str(empty)),
        "not-a-registry": ("models", "check", str(other)),
    }
    # A real subprocess for each exit status a shell sees (0, 1 and 2), one at a time: each is ~1 s of imports, and
    # ten at once on two cores take longer than ten in a row. The other answers come from the same main in this
    # process.
    as_subprocess = {"list", "damaged", "empty"}
    results = {
        name: run_cli(*args, timeout=60) if name in as_subprocess else run_in_process(*args)
        for name, args in commands.items()
    }
    return {"root": root, "damaged_dir": damaged, "empty_dir": empty, **results}


def test_models_list(reads, stores):
    root = reads["root"]
    result = reads["list"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{root}: 1 version, latest 2"
    assert lines[1].split() == ["version", "created", "rows", "iter", "perplexity", "loglik", "store"]
    assert lines[2].split()[:2] == ["*", "2"]
    assert lines[2].split()[4] == "20,000" and lines[2].endswith(stores.train)
    assert lines[-1] == "(* = latest)"

    report = json.loads(reads["list-json"].stdout)
    assert (report["registry"], report["latest"]) == (str(root), 2)
    (version,) = report["versions"]
    record = Registry(str(root)).version(2).record
    assert version["version"] == 2 and version["latest"] is True
    assert version["metrics"] == record["metrics"]
    assert (version["store"], version["rows"], version["warm_start_from"]) == (stores.train, 20_000, 1)
    assert version["fingerprint"] == record["provenance"]["store"]["fingerprint"]


def test_models_show(reads):
    root = reads["root"]
    record = Registry(str(root)).version(2).record
    for name in ("show", "show-2-json"):
        result = reads[name]
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {**record, "latest": True, "verified": True, "problem": None}


def test_models_check(reads):
    root = reads["root"]
    assert reads["check"].returncode == 0
    assert reads["check"].stdout == f"{root}: 1 version, latest 2: every file checks out\n"


def test_models_check_finds_a_damaged_file(reads):
    damaged = reads["damaged_dir"]
    model = Registry(str(damaged)).version(2).record["model"]
    problem = f"{damaged}/{model}/meta.json: SHA-256 differs from version 2's record"
    assert reads["damaged"].returncode == 1
    assert reads["damaged"].stdout == f"problem: {problem}\n"
    report = json.loads(reads["damaged-json"].stdout)
    assert reads["damaged-json"].returncode == 1
    assert report == {"registry": str(damaged), "versions": 1, "latest": None, "problems": [problem], "exit_status": 1}


def test_models_on_what_is_no_registry(reads):
    assert len(reads["empty"].stderr.splitlines()) == 1
    line = error_line(reads["empty"], "models")
    assert line.endswith(f"{reads['empty_dir']}: no model registry here (retrain publishes the first version)")
    line = error_line(reads["not-a-registry"], "models")
    assert "not a model registry (give an empty or new directory)" in line


def test_retrain_errors_exit_2(tmp_path, runs, stores, address):
    """A store of another shape than the registry's model, and a directory that is not a registry: one line,
    exit 2, the registry (or directory) untouched."""
    registry = tmp_path / "registry"
    shutil.copytree(runs["root"], registry)
    before = tree_state(registry)
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("a,b\n")
    shape = Launched(retrain_args(registry, stores.other_shape, address), deadline=120)
    # While that process starts: the second error through main in this process (exit 2 as a shell sees it is above).
    not_registry = run_in_process(*retrain_args(other, stores.train, address))
    line = error_line(shape.wait(), "retrain")
    assert line.endswith(
        f"the initial model has (S, N, D, T) = (30, 4, 5, 12) but the store {stores.other_shape} has "
        "(13, 4, 5, 12): a model only fits stores of its own shape"
    )
    assert tree_state(registry) == before
    line = error_line(not_registry, "retrain")
    assert f"missing, but {other} holds data.csv: not a model registry" in line
    assert sorted(os.listdir(other)) == ["data.csv"]


def test_retrain_on_a_registry_held_by_another_run_exits_3(tmp_path, runs, stores, address):
    """The test process holds the lock; the commands (text and ``--json``) exit 3 at once with one line naming
    the holder's pid and host, and the registry is untouched."""
    registry = tmp_path / "registry"
    shutil.copytree(runs["root"], registry)
    with RegistryLock(Registry(str(registry)).files) as held:
        before = tree_state(registry)
        text = Launched(retrain_args(registry, stores.train, address), deadline=60)
        # While that process starts: the --json answer through main in this process.
        json_result = run_in_process(*retrain_args(registry, stores.train, address, "--json"))
        text_result = text.wait()
        held.check()
        assert tree_state(registry) == before
    holder = f"pid {os.getpid()} on {HOST}, last heartbeat"
    assert text_result.returncode == 3, text_result.stderr
    assert text_result.stderr == ""
    lines = text_result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"not run: {registry}/{LOCK_FILE}: the registry is locked by another run (")
    assert holder in lines[0]
    assert lines[0].endswith("it counts as abandoned after 300 s without a heartbeat")
    assert json_result.returncode == 3, json_result.stderr
    report = json.loads(json_result.stdout)
    assert set(report) == {"published", "locked", "error", "exit_status"}
    assert (report["published"], report["locked"], report["exit_status"]) == (False, True, 3)
    ages = re.compile(r"last heartbeat \d+ s ago")
    assert ages.sub("", report["error"]) == ages.sub("", lines[0].removeprefix("not run: "))
    assert not (registry / LOCK_FILE).exists()


def test_lock_timeout_breaks_a_lock_without_heartbeat(tmp_path, runs, stores, address):
    """A lock left by a run on another host (its pid cannot be checked) that names no ``stale_after`` of its own
    and last beat 60 s ago: respected with the default ``--lock-timeout`` (300 s), broken with 30."""
    registry = tmp_path / "registry"
    shutil.copytree(runs["root"], registry)

    def leave_stale_lock() -> None:
        stale = {
            "token": "0" * 32,
            "host": "elsewhere.example",
            "pid": 1,
            "command": "dist-respattn retrain",
            "acquired": time.time() - 600,
            "heartbeat": time.time() - 60,
        }
        (registry / LOCK_FILE).write_text(json.dumps(stale))

    args = retrain_args(registry, stores.train, address, "--max-iter", "2", "--tolerance", "1")
    leave_stale_lock()
    respected = run_in_process(*args)  # exit 3 as a shell sees it: the test above
    assert respected.returncode == 3, respected.stderr
    said = re.search(
        r"pid 1 on elsewhere\.example, last heartbeat (\d+) s ago\); it counts as abandoned after 300 s",
        respected.stdout,
    )
    # The lock's heartbeat is 60 s old when written; a loaded machine may take seconds more to read it.
    assert said and 60 <= int(said[1]) < 120, respected.stdout
    leave_stale_lock()
    broken = run_cli(*args, "--lock-timeout", "30")
    assert broken.returncode == 0, broken.stderr
    said = re.search(
        rf"{re.escape(str(registry))}/lock\.json: breaking a stale lock \(no heartbeat for (\d+) s\)", broken.stderr
    )
    assert said and 60 <= int(said[1]) < 120, broken.stderr
    assert broken.stdout.startswith(f"published version 3 to {registry}")
    assert Registry(str(registry)).numbers() == [2, 3]
    assert not (registry / LOCK_FILE).exists()


def test_two_runs_at_once_one_publishes_the_other_exits_3(tmp_path, stores, client, address):
    """Two ``retrain`` commands started at the same moment on a registry at version 1, each a fit of ~4 s (30
    iterations, tol 0): one publishes version 2 (exit 0); the other finds the lock held, exits 3 while the
    winner still runs, and names the winner's pid. Exactly one new version, no lock left."""
    registry = tmp_path / "registry"
    retrain(registry, stores.train, settings=FitSettings(max_iter=3), client=client, progress=False)
    args = retrain_args(
        registry, stores.train, address, "--max-iter", "30", "--tol", "0", "--patience", "100", "--tolerance", "1",
        "--json",
    )  # fmt: skip
    runs = [Launched(args, deadline=180) for _ in range(2)]
    results = [run.wait() for run in runs]
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 3], [(r.returncode, r.stderr) for r in results]
    winner, loser = (runs[0], runs[1]) if results[0].returncode == 0 else (runs[1], runs[0])
    won, lost = json.loads(winner.wait().stdout), json.loads(loser.wait().stdout)
    assert (won["published"], won["version"], won["previous"]) == (True, 2, 1)
    assert won["fit"]["iterations"] == 30
    assert lost["locked"] is True and lost["exit_status"] == 3
    assert f"pid {winner.proc.pid} on {HOST}" in lost["error"]
    assert loser.seconds < winner.seconds, "the runs did not overlap"
    reg = Registry(str(registry))
    assert reg.numbers() == [1, 2] and reg.latest_number() == 2
    assert reg.problems() == []
    assert set(files_under(registry)) == expected_layout(registry)
