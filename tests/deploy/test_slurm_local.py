"""fit.sbatch run for real on this machine, with stand-ins for SLURM's sbatch and scancel.

The stand-in sbatch runs the job script dask-jobqueue writes (the real `dask worker` command line,
TLS flags and memory included) as a background process group; scancel ends that group. Everything
else is what a SLURM site runs: the wrapper, respattn_slurm.py, dask-jobqueue's SLURMCluster and the
fit. Needs dask-jobqueue, which is not a dependency of the package.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.deploy import deployfiles as files
from tests.deploy.deployfiles import SLURM
from tests.deploy.processes import BIN, Localizer, end_groups, environment, free_ports, make_certificates, run

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command

pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (not a dependency of the package)")

SBATCH = """#!/bin/sh
# Stand-in for SLURM's sbatch: runs the job script in the background, in a session of its own.
script="$FAKE_SLURM_DIR/job-$$.sh"
cp "$1" "$script"
setsid bash "$script" > "$script.log" 2>&1 < /dev/null &
echo "$!" >> "$FAKE_SLURM_DIR/pids"
echo "Submitted batch job $!"
"""

SCANCEL = """#!/bin/sh
# Stand-in for SLURM's scancel: ends the job's process group.
kill -TERM -- "-$1" 2>/dev/null || true
"""


def _install(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _end_jobs(folder: Path) -> None:
    pids = folder / "pids"
    end_groups([int(pid) for pid in pids.read_text().split()] if pids.exists() else [])


def test_fit_sbatch_fits_on_worker_jobs_over_tls(tmp_path):
    slurm, fake_bin = tmp_path / "slurm", tmp_path / "bin"
    slurm.mkdir()
    fake_bin.mkdir()
    _install(fake_bin, "sbatch", SBATCH)
    _install(fake_bin, "scancel", SCANCEL)
    certs = make_certificates(tmp_path / "certs")
    (dashboard,) = free_ports(1)
    # The README's stores, with the shared filesystem in tmp_path and the sizes shrunk as for compose.
    local = Localizer(
        [
            ("/shared/", f"{tmp_path}/shared/"),
            ("--rows 1000000", "--rows 20000 --chunk-rows 2048"),
            ("--rows 99999", "--rows 3999"),
            ("--symbols 2000", "--symbols 40"),
            ("--targets 2000", "--targets 12"),
        ]
    )
    env = environment(TMPDIR=str(tmp_path))
    synth = [c for c in files.readme_commands() if c.where.startswith("slurm/") and c.argv[1] == "synth"]
    assert len(synth) == 3
    for command in synth:
        made = run(local.argv(command.argv), env=env, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
    local.check_all_used()

    env.update(
        PATH=f"{fake_bin}{os.pathsep}{env['PATH']}",
        HOME=str(tmp_path),
        FAKE_SLURM_DIR=str(slurm),
        SLURM_SUBMIT_DIR=str(SLURM),
        RESPATTN_VENV=str(BIN.parent),
        RESPATTN_CERTS=str(certs["ca"].parent),
        RESPATTN_JOBS="2",
        # This machine's loopback instead of the site's network, a free dashboard port, and 3 EM iterations at most
        # (what is tested is the fit running on the worker jobs, not how many iterations it takes to converge).
        RESPATTN_ARGS=f"--interface lo --dashboard-address 127.0.0.1:{dashboard} --max-iter 3",
    )
    shared = tmp_path / "shared"
    try:
        result = run(
            ["bash", str(SLURM / "fit.sbatch"), f"{shared}/corpus/train.zarr", f"{shared}/models/run1",
             f"{shared}/corpus/validation.zarr"],
            env=env, cwd=tmp_path, timeout=150,
        )  # fmt: skip
    finally:
        _end_jobs(slurm)
    logs = "\n".join(p.read_text() for p in sorted(slurm.glob("*.log")))
    assert result.returncode == 0, f"{result.stderr}\n--- worker jobs ---\n{logs[-3000:]}"
    assert (shared / "models" / "run1" / "latest.json").is_file()
    assert f"dashboard: http://127.0.0.1:{dashboard}/status" in result.stderr
    assert "EM " in result.stdout

    jobs = sorted(slurm.glob("job-*.sh"))
    assert len(jobs) == 2, "one SLURM job per worker"
    for job in jobs:
        text = job.read_text()
        assert "--nthreads 1" in text
        assert "tls://" in text
        for flag in ("--tls-ca-file", "--tls-cert", "--tls-key"):
            assert flag in text
