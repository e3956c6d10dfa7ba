"""Shared fixtures and helpers of the registry tests: small synthetic stores, real checkpoint bytes, one
cluster for the package's modules, and what a registry directory holds.

The stores are small (S, N, D, T = 30, 4, 5, 12; 20,000 training rows in 5 partitions): a fit iteration
takes ~0.1 s on two single-threaded workers, so the tests can retrain many times.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dist_respattn import random_distribution
from dist_respattn.cli import main
from dist_respattn.engine import ModelDir
from dist_respattn.registry import Registry
from dist_respattn.store import WriteOptions, write_synthetic
from tests.engine.clusters import local_cluster

#: The head of the stores: S symbols, context length N, query dim D, T targets.
S, N, D, T = 30, 4, 5, 12
ROWS = 20_000
VALIDATION_ROWS = 5_000
LAYOUT = WriteOptions(chunk_rows=2048, partition_rows=4096)


def truth(seed: int = 0):
    """A head of the stores' shape (``seed`` 0: the one the training and validation stores are sampled from)."""
    return random_distribution(S, N, D, T, seed=seed, sigma2=0.5)


@dataclass(frozen=True)
class Stores:
    """Read-only stores: ``train``/``validation`` sampled from ``truth(0)``, ``other_head`` (same shape) from
    ``truth(7)``, and ``other_shape`` with 13 symbols instead of 30."""

    train: str
    validation: str
    other_head: str
    other_shape: str


@pytest.fixture(scope="session")
def stores(tmp_path_factory) -> Stores:
    folder = tmp_path_factory.mktemp("registry-stores")
    paths = Stores(*(str(folder / f"{name}.zarr") for name in ("train", "validation", "other_head", "other_shape")))
    write_synthetic(paths.train, ROWS, model=truth(0), seed=1, options=LAYOUT)
    write_synthetic(paths.validation, VALIDATION_ROWS, model=truth(0), seed=2, options=LAYOUT)
    write_synthetic(paths.other_head, ROWS, model=truth(7), seed=3, options=LAYOUT)
    write_synthetic(
        paths.other_shape, 4000, num_symbols=13, context_length=N, query_dim=D, num_targets=T, seed=4, options=LAYOUT
    )
    return paths


@pytest.fixture(scope="package")
def client():
    """A client of a LocalCluster (two single-threaded worker processes on 127.0.0.1) shared by the registry modules
    that run one after another in a test process: their retrains and fits only submit work to it."""
    with local_cluster(2) as (_, c):
        yield c


@pytest.fixture(scope="module")
def address(client) -> str:
    """The scheduler address of the module's cluster, for ``--scheduler`` and child processes."""
    return client.scheduler.address


def checkpoint_bytes(tmp: Path, seed: int = 0, *, iteration: int = 1, **meta: Any) -> tuple[bytes, bytes]:
    """The ``params.npz`` and ``meta.json`` bytes of a real checkpoint of ``truth(seed)`` written by ``ModelDir``."""
    folder = ModelDir(tmp / f"model-{seed}-{iteration}")
    name = f"ckpt-{iteration:06d}-0000abcd"
    folder.write(name, truth(seed), {"iteration": iteration, "init": {"kind": "random", "seed": seed}, **meta})
    return (folder.path / name / "params.npz").read_bytes(), (folder.path / name / "meta.json").read_bytes()


def files_under(root: str | Path) -> dict[str, str]:
    """Every file under ``root``: relative path -> SHA-256 of its content (directories are left out)."""
    root = Path(root)
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def expected_layout(registry: str | Path) -> set[str]:
    """The files a clean registry holds: its marker, ``latest.json``, every version's record and model files."""
    reg = Registry(str(registry))
    names = {"registry.json"}
    if reg.latest_number() is not None:
        names.add("latest.json")
    for version in reg.versions():
        names.add(f"versions/{version.number:06d}.json")
        names.update(f"{version.model_path}/{name}" for name in version.record["files"])
    return names


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def dead_pid() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not os.path.exists(f"/proc/{proc.pid}"), "the pid was reused at once"
    return proc.pid


def run_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``dist-respattn ARGS`` through the command's own ``main`` in this process: its exit status and what it printed.

    For commands whose answers are what is tested, not the process boundary: a process for each would only load the
    package again. The exit statuses as a shell sees them are tested with real subprocesses in test_cli.py.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    return subprocess.CompletedProcess(["dist-respattn", *args], code, out.getvalue(), err.getvalue())
