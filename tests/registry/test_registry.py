"""``Registry`` on a local disk with real checkpoints (no cluster): publish, numbering, prune, orphans, checks.

Every published model is the ``params.npz`` and ``meta.json`` of a checkpoint written by
``ModelDir.write`` (heads of different seeds, so versions differ), published under a real held lock.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts.registry import FORMAT
from dist_respattn.cli import main
from dist_respattn.engine import load_model
from dist_respattn.registry import Registry, RegistryError, RegistryLock, RegistryLocked, gate, retrain
from tests.registry.conftest import checkpoint_bytes, expected_layout, files_under, truth


def publish(registry: Registry, lock: RegistryLock, tmp: Path, seed: int, **record):
    params, meta = checkpoint_bytes(tmp, seed)
    return registry.publish(lock, params, meta, {"metrics": {"perplexity": 5.0 + seed}, **record})


def same_head(a, b) -> bool:
    return (
        np.array_equal(a.key_means, b.key_means)
        and np.array_equal(a.emission, b.emission)
        and np.array_equal(a.position_prior, b.position_prior)
        and a.sigma2 == b.sigma2
    )


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "registry"


@pytest.fixture
def three(root, tmp_path) -> Registry:
    """A registry with versions 1, 2, 3 (heads of seeds 1, 2, 3), latest 3, its lock released."""
    registry = Registry(str(root))
    with registry.lock() as lock:
        for seed in (1, 2, 3):
            publish(registry, lock, tmp_path, seed)
    return registry


def test_publish_numbers_versions_and_records_the_files(root, tmp_path):
    registry = Registry(str(root))
    assert not registry.check_format()
    assert registry.latest() is None and registry.versions() == []
    with registry.lock() as lock:
        first = publish(registry, lock, tmp_path, 1, provenance={"note": "first"})
        assert json.loads((root / "registry.json").read_text())["format"] == FORMAT
        second = publish(registry, lock, tmp_path, 2)
    assert (first.number, second.number) == (1, 2)
    assert registry.numbers() == [1, 2]
    assert registry.latest_number() == 2
    assert json.loads((root / "latest.json").read_text())["version"] == 2

    record = json.loads((root / "versions" / "000001.json").read_text())
    assert record == first.record
    assert (record["format"], record["version"], record["provenance"]) == (FORMAT, 1, {"note": "first"})
    assert record["metrics"] == {"perplexity": 6.0}
    params, meta = checkpoint_bytes(tmp_path, 1)
    folder = root / record["model"]
    assert (folder / "params.npz").read_bytes() == params
    assert (folder / "meta.json").read_bytes() == meta
    assert record["files"] == {
        "params.npz": hashlib.sha256(params).hexdigest(),
        "meta.json": hashlib.sha256(meta).hexdigest(),
    }
    assert first.model_path != second.model_path

    assert same_head(registry.load(1).model, truth(1))
    assert same_head(registry.load().model, truth(2))
    assert registry.load(1).meta["init"] == {"kind": "random", "seed": 1}
    assert registry.problems() == []
    assert set(files_under(root)) == expected_layout(root)  # the lock is gone, nothing else is there


def test_resolve(three):
    assert three.resolve(None).number == 3
    assert three.resolve("latest").number == 3
    assert three.resolve(2).number == 2
    assert three.resolve("1").number == 1
    with pytest.raises(RegistryError, match="'first': expected a version number or 'latest'"):
        three.resolve("first")
    with pytest.raises(RegistryError, match="no version 7"):
        three.version(7)


def test_resolve_of_a_missing_version_names_it(three, root):
    with pytest.raises(RegistryError, match=f"{root}/versions/000007.json: no version 7"):
        three.resolve(7)


def test_damaged_version_record_is_a_problem_naming_the_file(three, root):
    (root / "versions" / "000002.json").write_text('{"version": ')
    problems = three.problems()
    assert len(problems) == 1
    assert problems[0].startswith(f"{root}/versions/000002.json: not valid JSON"), problems


def test_empty_registry_has_nothing_to_resolve(root):
    with pytest.raises(RegistryError, match="the registry has no published version yet"):
        Registry(str(root)).resolve("latest")


def test_publish_needs_the_lock(root, tmp_path):
    """A lock that was never acquired (or was lost) cannot publish, and nothing is written."""
    registry = Registry(str(root))
    params, meta = checkpoint_bytes(tmp_path, 1)
    with pytest.raises(RegistryLocked, match="this run lost the registry lock"):
        registry.publish(registry.lock(), params, meta, {})
    assert not root.exists() or files_under(root) == {}


def test_prune_keeps_the_newest_and_numbering_continues(three, root, tmp_path):
    with three.lock() as lock:
        publish(three, lock, tmp_path, 4)
        assert three.prune(lock, 2) == [1, 2]
        assert three.numbers() == [3, 4]
        assert len(os.listdir(root / "models")) == 2
        assert set(files_under(root)) - {"lock.json"} == expected_layout(root)
        assert publish(three, lock, tmp_path, 5).number == 5
        assert three.prune(lock, 10) == []
        with pytest.raises(ValueError, match="keep = 0"):
            three.prune(lock, 0)
    assert three.numbers() == [3, 4, 5]
    assert three.problems() == []


def test_latest_is_never_pruned(three, root):
    """``latest`` names version 1 (as after a run killed between claiming a version and moving ``latest``):
    ``prune(keep=1)`` removes version 2 only, and version 1 still loads."""
    (root / "latest.json").write_text(json.dumps({"version": 1}))
    with three.lock() as lock:
        assert three.prune(lock, 1) == [2]
    assert three.numbers() == [1, 3]
    assert three.latest_number() == 1
    assert same_head(three.load().model, truth(1))
    assert three.problems() == []
    assert set(files_under(root)) == expected_layout(root)


def test_remove_orphans_removes_only_unnamed_model_folders(three, root):
    (root / "models" / "0123456789ab").mkdir()
    (root / "models" / "0123456789ab" / "params.npz").write_bytes(b"half a checkpoint")
    kept = {p.name for p in (root / "models").iterdir()} - {"0123456789ab"}
    with three.lock() as lock:
        assert three.remove_orphans(lock) == ["models/0123456789ab"]
        assert three.remove_orphans(lock) == []
    assert {p.name for p in (root / "models").iterdir()} == kept
    assert three.problems() == []


def test_remove_orphans_spares_the_lock_claims_of_waiting_runs(three, root):
    """A killed write's temporary goes; a run waiting for the lock writes ``lock.json`` (or its
    ``.broken-`` claim) through a temporary at this very moment, and removing it would fail that run's claim
    with a missing file instead of "locked"."""
    (root / ".tmp-latest.json.0badc0de").write_bytes(b"{")
    (root / "versions" / ".tmp-000009.json.0badc0de").write_bytes(b"{")
    waiting = [".tmp-lock.json.5bb17952", ".tmp-lock.json.broken-abc.5bb17952"]
    for name in waiting:
        (root / name).write_bytes(b"{}")
    with three.lock() as lock:
        removed = three.remove_orphans(lock)
    assert sorted(removed) == [".tmp-000009.json.0badc0de", ".tmp-latest.json.0badc0de"]
    assert not (root / ".tmp-latest.json.0badc0de").exists()
    assert not (root / "versions" / ".tmp-000009.json.0badc0de").exists()
    assert all((root / name).exists() for name in waiting)


def test_sha_mismatch_is_found_by_problems_and_load(three, root, tmp_path):
    """Version 2's params replaced by another valid checkpoint's (same shape, other head)."""
    folder = root / three.version(2).model_path
    other, _ = checkpoint_bytes(tmp_path, 9)
    (folder / "params.npz").write_bytes(other)
    problems = three.problems()
    assert len(problems) == 1
    assert problems[0] == f"{root}/{three.version(2).model_path}/params.npz: SHA-256 differs from version 2's record"
    with pytest.raises(RegistryError, match="SHA-256 differs from version 2's record"):
        three.load(2)
    assert same_head(three.load(1).model, truth(1))
    assert same_head(three.load(3).model, truth(3))


def test_missing_model_file_and_dangling_latest_are_problems(three, root):
    (root / three.version(1).model_path / "meta.json").unlink()
    (root / "latest.json").write_text(json.dumps({"version": 9}))
    problems = three.problems()
    assert problems == [
        f"{root}/latest.json: names version 9, which does not exist: run `dist-respattn models repair {root}` "
        "to point it at the newest version that checks out",
        f"{root}/{three.version(1).model_path}/meta.json: missing (version 1 is damaged)",
    ]
    with pytest.raises(RegistryError, match="no version 9"):
        three.load()


def test_damaged_latest_is_a_problem(three, root):
    repair = f"run `dist-respattn models repair {root}` to point it at the newest version that checks out"
    (root / "latest.json").write_text('{"version": ')
    assert three.problems() == [
        f"{root}/latest.json: not valid JSON (Expecting value: line 1 column 13 (char 12)): {repair}"
    ]
    (root / "latest.json").write_text('{"version": "3"}')
    assert three.problems() == [f"{root}/latest.json: 'version' must be a version number, got '3': {repair}"]


def test_a_directory_that_is_not_a_registry_is_refused(tmp_path, stores):
    """A directory holding other files: ``check_format``, ``publish`` and ``retrain`` refuse it with a message
    naming the directory and what it holds, and nothing is written into it (no lock either)."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "notes.txt").write_text("not a model")
    registry = Registry(str(root))
    message = f"{root}/registry.json: missing, but {root} holds notes.txt: not a model registry"
    with pytest.raises(RegistryError, match="not a model registry") as caught:
        registry.check_format()
    assert str(caught.value) == f"{message} (give an empty or new directory)"
    params, meta = checkpoint_bytes(tmp_path, 1)
    with registry.lock() as lock, pytest.raises(RegistryError, match="not a model registry"):
        registry.publish(lock, params, meta, {})
    with pytest.raises(RegistryError, match="not a model registry"):
        retrain(root, stores.train)  # refused before any cluster is started
    assert sorted(os.listdir(root)) == ["notes.txt"]


def test_a_root_holding_only_a_lock_is_an_empty_registry(root, tmp_path):
    registry = Registry(str(root))
    with registry.lock():
        assert not registry.check_format()
        assert registry.problems() == []


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ({"format": "something.else", "version": 1}, "format 'something.else', expected 'dist_respattn.registry'"),
        ({"format": FORMAT, "version": 2}, "registry format version 2 is newer than this release reads"),
    ],
    ids=["other-format", "newer"],
)
def test_a_registry_of_another_format_is_refused(root, marker, message):
    root.mkdir()
    (root / "registry.json").write_text(json.dumps(marker))
    with pytest.raises(RegistryError, match=message):
        Registry(str(root)).check_format()


# -- the gate (a pure function) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "candidate", "current", "tolerance", "passed", "limit"),
    [
        ("perplexity", 10.0, None, 0.0, True, None),  # the first version: nothing to compare with
        ("perplexity", 9.0, 10.0, 0.0, True, 10.0),
        ("perplexity", 10.0, 10.0, 0.0, True, 10.0),  # equal passes at tolerance 0
        ("perplexity", 10.5, 10.0, 0.05, True, 10.5),
        ("perplexity", 10.6, 10.0, 0.05, False, 10.5),
        ("loglik", -8.0, -8.0, 0.0, True, -8.0),
        ("loglik", -8.8, -8.0, 0.1, True, -8.8),
        ("loglik", -8.81, -8.0, 0.1, False, -8.8),
        ("loglik", 2.2, 2.0, 0.1, True, 1.8),  # a positive log-likelihood (a density): the slack is |current|
        ("loglik", 1.7, 2.0, 0.1, False, 1.8),
    ],
)
def test_gate(metric, candidate, current, tolerance, passed, limit):
    decision = gate(metric, candidate, current, tolerance, store="val.zarr", in_sample=False)
    assert decision.passed is passed
    assert decision.limit == (None if limit is None else pytest.approx(limit, rel=1e-12))
    assert decision.to_json()["passed"] is passed


def test_gate_describes_its_decision():
    first = gate("perplexity", 6.5, None, 0.01, store="val.zarr", in_sample=False)
    assert first.describe() == "perplexity 6.5: the registry's first version, nothing to compare with"
    failed = gate("loglik", -9.0, -8.0, 0.1, store="train.zarr", in_sample=True)
    assert failed.describe() == (
        "gate failed: loglik -9 against the current version's -8 (at least -8.8 allowed at tolerance 0.1) on "
        "train.zarr (in-sample: no validation store)"
    )


def test_export_writes_a_version_as_a_model_directory_bit_for_bit(three, root, tmp_path):
    """``export`` gives a model directory whose latest checkpoint is the version's published files, unchanged;
    it refuses a directory that holds anything, and a damaged version, writing nothing."""
    version, checkpoint = three.export(2, tmp_path / "exported")
    assert version.number == 2 and checkpoint.parent == tmp_path / "exported"
    for name in ("params.npz", "meta.json"):
        assert (checkpoint / name).read_bytes() == (root / three.version(2).model_path / name).read_bytes()
    assert same_head(load_model(tmp_path / "exported"), truth(2))
    with pytest.raises(RegistryError, match="exists and is not an empty directory"):
        three.export("latest", tmp_path / "exported")
    (root / three.version(3).model_path / "params.npz").write_bytes(b"not a checkpoint")
    with pytest.raises(RegistryError, match="SHA-256 differs from version 3's record"):
        three.export("latest", tmp_path / "damaged")
    assert not (tmp_path / "damaged").exists()


def test_models_export_on_the_command_line(three, root, tmp_path, capsys):
    """``dist-respattn models export`` (in-process: an interpreter's start would cost more than the test)."""
    assert main(["models", "export", str(root), "latest", str(tmp_path / "m")]) == 0
    assert capsys.readouterr().out == f"exported version 3 of {root} to the model directory {tmp_path / 'm'}\n"
    assert same_head(load_model(tmp_path / "m"), truth(3))
    assert main(["models", "export", str(root), "7", str(tmp_path / "n")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("dist-respattn models: error: ") and "no version 7" in error
