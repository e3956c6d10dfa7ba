"""Checkpoint files in a model directory, without a cluster: what a commit leaves on disk (byte for byte the
format every release wrote), leftovers of killed writes, copies, and what a model argument resolves to.

Kills are real: a child process sends itself SIGKILL between writing a checkpoint or a pointer under its
temporary name and moving it into place.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.artifacts import CheckpointError, ModelDir, Registry, load_checkpoint, registry_reference
from dist_respattn.artifacts.checkpoints import BEST, LATEST, checkpoint_name
from dist_respattn.model.heads.single_hop.arrays import distribution_to_arrays

S, N, D, T = 9, 3, 4, 6


def head(seed: int):
    return random_distribution(S, N, D, T, seed=seed, sigma2=0.5)


def assert_same_head(a, b) -> None:
    arrays_a, meta_a = distribution_to_arrays(a)
    arrays_b, meta_b = distribution_to_arrays(b)
    assert meta_a == meta_b
    assert arrays_a.keys() == arrays_b.keys()
    for name in arrays_a:
        assert np.array_equal(arrays_a[name], arrays_b[name]), name


def entries(folder: Path) -> list[str]:
    """Every file under ``folder``, relative, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def commit(folder: ModelDir, iteration: int, seed: int, *, best: bool = True, keep_best: str | None = None) -> str:
    name = checkpoint_name(iteration, "0123abcd")
    info = {"iteration": iteration}
    folder.commit(name, head(seed), {"iteration": iteration}, latest=info, best=info if best else None,
                  keep_best=keep_best)  # fmt: skip
    return name


def test_a_commit_leaves_the_checkpoint_its_pointers_and_nothing_else(tmp_path):
    folder = ModelDir(tmp_path / "model")
    commit(folder, 1, seed=1)
    second = commit(folder, 2, seed=2)
    assert entries(folder.path) == ["best.json", f"{second}/meta.json", f"{second}/params.npz", "latest.json"]
    for which in ("auto", LATEST, BEST):
        checkpoint = load_checkpoint(folder.path, which)
        assert checkpoint.name == second and checkpoint.iteration == 2
        assert_same_head(checkpoint.model, head(2))


def test_the_files_are_the_checkpoint_format_byte_for_byte(tmp_path):
    """``params.npz`` is ``np.savez`` of the model's arrays and the prior's, ``meta.json`` and the pointers are
    indented JSON with a newline (a non-finite metric as ``Infinity``): checkpoints of earlier releases and of
    this one are the same files."""
    folder = ModelDir(tmp_path / "model")
    model = head(3)
    rng = np.random.default_rng(0)
    prior = {"emission_base": rng.dirichlet(np.ones(T)), "emission_types": rng.dirichlet(np.ones(T), size=S)}
    meta = {"iteration": 4, "history": [{"iteration": 4, "loglik": -1.5}]}
    name = checkpoint_name(4, "0123abcd")
    folder.write(name, model, meta, prior)
    folder.point(BEST, name, iteration=4, validation_perplexity=float("inf"))

    arrays, model_meta = distribution_to_arrays(model)
    expected_params = io.BytesIO()
    np.savez(expected_params, **{**prior, **arrays})
    assert (folder.path / name / "params.npz").read_bytes() == expected_params.getvalue()
    # The head's kind is recorded by name first in its JSON; the rest is the format as it always was.
    expected_meta = {
        "format": "dist_respattn.checkpoint", "version": 1, "model": {"kind": "single_hop", **model_meta}, **meta
    }  # fmt: skip
    assert (folder.path / name / "meta.json").read_text() == json.dumps(expected_meta, indent=2) + "\n"
    assert (folder.path / "best.json").read_text() == (
        '{\n  "checkpoint": "ckpt-000004-0123abcd",\n  "iteration": 4,\n  "validation_perplexity": Infinity\n}\n'
    )
    checkpoint = load_checkpoint(folder.path, BEST)
    assert_same_head(checkpoint.model, model)
    # Its arrays are all the checkpoint's: the head's, and the fit's others (the prior, for a resumed fit).
    assert checkpoint.arrays.keys() == prior.keys() | distribution_to_arrays(model)[0].keys()


def test_leftovers_of_killed_writes_are_skipped_by_readers_and_removed_by_the_next_commit(tmp_path):
    folder = ModelDir(tmp_path / "model")
    first = commit(folder, 1, seed=1)
    params = (folder.path / first / "params.npz").read_bytes()
    (folder.path / ".tmp-ckpt-000002-0123abcd.deadbeef").mkdir()
    (folder.path / ".tmp-ckpt-000002-0123abcd.deadbeef" / "params.npz").write_bytes(params[: len(params) // 2])
    (folder.path / ".tmp-latest.json.0badf00d").write_text('{"checkpoint": "ckpt-0000')
    assert load_checkpoint(folder.path, LATEST).name == first
    assert folder.foreign_entries() == []
    second = commit(folder, 2, seed=2)
    assert entries(folder.path) == ["best.json", f"{second}/meta.json", f"{second}/params.npz", "latest.json"]


KILLED_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from dist_respattn import random_distribution
    from dist_respattn.artifacts import checkpoints
    from dist_respattn.durable import files

    model_dir, where = sys.argv[1:]

    def killed(original):
        def wrapper(temp, path, **kwargs):
            if where in os.path.basename(os.fspath(path)):
                os.kill(os.getpid(), signal.SIGKILL)  # the temporary copy is complete, its rename not done
            return original(temp, path, **kwargs)
        return wrapper

    checkpoints.place_directory = killed(checkpoints.place_directory)
    files.place_file = killed(files.place_file)
    info = {"iteration": 2}
    checkpoints.ModelDir(model_dir).commit(
        "ckpt-000002-0123abcd", random_distribution(9, 3, 4, 6, seed=2, sigma2=0.5), info, latest=info, best=info,
        keep_best=None,
    )
    """
)


@pytest.mark.slow  # a child process
@pytest.mark.parametrize("where", ["ckpt-000002", "latest.json", "best.json"])
def test_a_commit_killed_before_a_rename_leaves_readers_on_complete_checkpoints(tmp_path, where):
    """Killed before the checkpoint's directory, ``latest.json`` or ``best.json`` is moved into place: each pointer
    names the checkpoint it named before or the new complete one, and the next commit cleans up."""
    folder = ModelDir(tmp_path / "model")
    first = commit(folder, 1, seed=1)
    child = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, str(folder.path), where], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert [n for n in os.listdir(folder.path) if n.startswith(".tmp-")], "the kill left no temporary copy?"
    moved = {"ckpt-000002": [], "latest.json": [], "best.json": [LATEST]}[where]
    for pointer in (LATEST, BEST):
        checkpoint = load_checkpoint(folder.path, pointer)
        assert checkpoint.iteration == (2 if pointer in moved else 1), pointer
        assert_same_head(checkpoint.model, head(2 if pointer in moved else 1))
    assert folder.foreign_entries() == []
    third = commit(folder, 3, seed=3)
    assert first != third and entries(folder.path) == [
        "best.json",
        f"{third}/meta.json",
        f"{third}/params.npz",
        "latest.json",
    ]


def test_a_rewrite_of_a_checkpoint_replaces_it_and_a_copy_is_bit_for_bit(tmp_path):
    folder, copy = ModelDir(tmp_path / "model"), ModelDir(tmp_path / "copy")
    name = commit(folder, 1, seed=1)
    folder.write(name, head(5), {"iteration": 1})
    assert_same_head(load_checkpoint(folder.path).model, head(5))
    files = folder.read_files(name)
    copy.write_files(name, {"params.npz": files.params, "meta.json": files.meta})
    copy.point(LATEST, name, iteration=1)
    assert copy.read_files(name) == files
    assert_same_head(load_checkpoint(copy.path).model, head(5))


def test_a_failed_write_leaves_no_temporary_directory(tmp_path):
    folder = ModelDir(tmp_path / "model")
    folder.path.mkdir()
    (folder.path / "ckpt-000001-0123abcd").write_text("a file where the checkpoint's directory goes")
    with pytest.raises(NotADirectoryError):
        folder.write("ckpt-000001-0123abcd", head(1), {"iteration": 1})
    assert os.listdir(folder.path) == ["ckpt-000001-0123abcd"]


# -- what a model argument names ------------------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path) -> Registry:
    """A registry with two versions, of ``head(1)`` and ``head(2)``."""
    registry = Registry(str(tmp_path / "registry"))
    for seed in (1, 2):
        folder = ModelDir(tmp_path / f"model-{seed}")
        name = commit(folder, seed, seed=seed)
        files = folder.read_files(name)
        with registry.lock() as lock:
            registry.publish(lock, files.params, files.meta, {"metrics": {}})
    return registry


def test_a_registry_version_loads_where_a_model_directory_is_expected(registry):
    assert_same_head(load_checkpoint(f"{registry}@1").model, head(1))
    assert_same_head(load_checkpoint(f"{registry}@latest").model, head(2))
    with pytest.raises(CheckpointError, match="a registry version has one checkpoint, not a 'best' one"):
        load_checkpoint(f"{registry}@1", BEST)


def test_a_registry_given_as_a_model_directory_is_refused_naming_its_versions(registry):
    with pytest.raises(CheckpointError, match=f"a model registry, not a model directory: .* {registry}@latest or"):
        load_checkpoint(str(registry))


def test_a_directory_whose_name_ends_like_a_version_is_a_model_directory(tmp_path):
    folder = ModelDir(tmp_path / "model@1")
    commit(folder, 1, seed=4)
    assert registry_reference(folder.path) is None
    assert registry_reference(tmp_path / "missing@latest") == (str(tmp_path / "missing"), "latest")
    assert_same_head(load_checkpoint(folder.path).model, head(4))
