"""A smoke run of the fault drill (benchmarks/drill_faults.py) as a real subprocess: a dask scheduler and two
workers of its own, three fits each hit by a different fault (a worker, the driver, the scheduler SIGKILLed),
a registry retrain killed mid-fit and the run that takes its lock over, and every figure it reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "drill_faults.py"
#: Any seed covers the three fault kinds in the first three fits. With 3 iterations, seed 166 puts each fault after
#: the first iteration line (so that two iterations are left to resume), the worker's half an iteration later
#: (mid-E-step, not while the next parameters are being scattered), and kills the one retrain mid-fit while it
#: holds the registry's lock, so that a closing run must take it over. (One retrain, not one that publishes before
#: the killed one: the closing run publishes, and each retrain is a process start and a fit.)
SMOKE = ("--fits", "3", "--retrains", "1", "--rows", "20000", "--iterations", "3", "--seed", "166")


def run_drill(*args: str, timeout: float = 240) -> tuple[int, str, str]:
    """Run the drill with ``--json``; its exit status, stdout and stderr.

    The drill runs in a process group of its own. On a timeout it gets SIGTERM first, which makes it stop
    the cluster it started (each of its subprocesses leads a group of its own), and SIGKILL only after that.
    """
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-W", "error::RuntimeWarning", str(SCRIPT), *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=SCRIPT.parents[1],
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise
    return proc.returncode, stdout, stderr


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.slow
def test_smoke_drill_covers_every_fault_and_every_fit_ends_bit_identical(tmp_path):
    before = descendants()
    code, stdout, stderr = run_drill(*SMOKE, "--workdir", str(tmp_path))
    assert code == 0, f"drill failed:\n{stdout}\n{stderr}"
    report = json.loads(stdout)

    config = report["config"]
    assert (config["fits"], config["retrains"], config["rows"], config["iterations"]) == (3, 1, 20000, 3)
    assert config["workers"] == 2 and config["keep_versions"] == 3
    assert report["reference"]["iterations"] == 3 and report["reference"]["state"] == "max_iter"

    # Every fit finished, bit-identical to the fault-free reference, and each fault kind landed once.
    assert report["fits_attempted"] == report["fits_finished"] == report["fits_identical"] == 3, stderr
    assert report["faults"] == {"worker": 1, "driver": 1, "scheduler": 1, "none": 0}, report["fit_records"]
    assert report["faults_missed"] == 0 and report["fits_hung"] == 0
    records = {record["kind"]: record for record in report["fit_records"]}
    assert sorted(records) == ["driver", "scheduler", "worker"]
    for record in records.values():
        assert record["landed"] and record["finished"] and record["identical"], record
        assert record["different"] == [] and record["iteration"] == 3 and record["iteration_equal"], record
        assert record["history_equal"] and record["leftovers"] == [], record
    assert records["worker"]["exit"] == 0 and "resume_exit" not in records["worker"]  # it finished on its own
    assert records["driver"]["exit"] == -signal.SIGKILL and records["driver"]["resume_exit"] == 0
    assert records["scheduler"]["exit"] != 0 and records["scheduler"]["resume_exit"] == 0
    assert records["scheduler"]["restart"]["same_port"] is True

    # The registry: the retrains ran, each state after a kill or a completed run was checked, none corrupted.
    assert report["retrains_attempted"] == 1 and report["retrains_hung"] == 0
    assert report["retrains_killed"] == 1
    assert report["registry_states_checked"] >= report["retrains_attempted"] + 1  # + `models check` at the end
    assert report["corrupted_states"] == 0, report["registry_states"]
    assert report["lock_recoveries"] >= 1 and report["lock_recovery_failures"] == 0
    assert report["closing_run"] is not None and report["closing_run"]["lock_recovered"] is True
    assert report["models_check"]["exit"] == 0 and report["models_check"]["problems"] == []
    assert report["registry_latest"] is not None and report["retrains_published"] >= 1
    for state in report["registry_states"]:
        assert state["problems"] == [], state

    assert report["failure"] is None and report["ok"] is True
    assert report["total_seconds"] > 0
    assert not config["kept"] and not Path(config["dir"]).exists()
    # Nothing the drill started outlives it.
    assert descendants() <= before


@pytest.mark.slow
def test_drill_rejects_unknown_fault_kinds():
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--kinds", "worker,disk"], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 2
    assert "--kinds worker,disk: expected some of worker, driver, scheduler, none" in completed.stderr
