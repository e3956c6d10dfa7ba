"""The registry cannot be made to skip its gate: a deleted ``latest.json`` and edited version records are found.

``models check`` reports both, ``retrain`` refuses a registry with versions and no ``latest`` (naming the
repair), and ``models repair`` points ``latest`` back at the newest version that checks out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_respattn.registry import Registry, RegistryError, retrain
from tests.engine.test_bad_input import run_cli
from tests.registry.test_registry import publish


@pytest.fixture
def three(tmp_path) -> tuple[Registry, Path]:
    """A registry with versions 1, 2, 3, latest 3."""
    root = tmp_path / "registry"
    registry = Registry(str(root))
    with registry.lock() as lock:
        for seed in (1, 2, 3):
            publish(registry, lock, tmp_path, seed)
    return registry, root


def edit_metrics(root: Path, number: int) -> None:
    path = root / "versions" / f"{number:06d}.json"
    record = json.loads(path.read_text())
    record["metrics"]["perplexity"] = 1.01  # a better score than the model earned
    path.write_text(json.dumps(record, indent=2))


@pytest.mark.slow
def test_a_deleted_latest_is_a_problem_naming_the_repair(three):
    registry, root = three
    (root / "latest.json").unlink()
    assert registry.problems() == [
        f"{root}/latest.json: missing, but 3 versions exist (1-3): run `dist-respattn models repair {root}` "
        "to point it at the newest version that checks out"
    ]
    check = run_cli("models", "check", str(root))
    assert check.returncode == 1 and "every file checks out" not in check.stdout
    assert check.stdout.startswith(f"problem: {root}/latest.json: missing, but 3 versions exist"), check.stdout


def test_an_edited_version_record_is_a_problem_and_refused_by_load(three):
    registry, root = three
    edit_metrics(root, 2)
    assert registry.problems() == [
        f"{root}/versions/000002.json: the record differs from its record_sha256 (edited after it was published)"
    ]
    with pytest.raises(RegistryError, match="differs from its record_sha256"):
        registry.load(2)
    registry.load(3)  # the others still load
    record = json.loads((root / "versions" / "000001.json").read_text())
    del record["record_sha256"]
    (root / "versions" / "000001.json").write_text(json.dumps(record))
    assert f"{root}/versions/000001.json: no record_sha256: the record is not covered by a checksum" in (
        registry.problems()
    )


def test_retrain_refuses_versions_without_latest_naming_the_repair(three, stores):
    """Before: a fresh fit, published as version 4 with no gate. Now refused before any fit, nothing written."""
    _, root = three
    (root / "latest.json").unlink()
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(RegistryError) as caught:
        retrain(root, stores.train, validation=stores.validation, progress=False)
    assert f"run `dist-respattn models repair {root}`" in str(caught.value)
    assert "retrain refuses to publish without a latest version to gate against" in str(caught.value)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing published, lock released


@pytest.mark.slow
def test_models_repair_points_latest_at_the_newest_version_that_checks_out(three):
    registry, root = three
    (root / "latest.json").unlink()
    edit_metrics(root, 3)
    repaired = run_cli("models", "repair", str(root), "--json")
    report = json.loads(repaired.stdout)
    assert repaired.returncode == 1, repaired.stderr  # version 3's record is still edited: a problem remains
    assert (report["latest"], report["repaired"]) == (2, True)
    assert report["problems"] == [
        f"{root}/versions/000003.json: the record differs from its record_sha256 (edited after it was published)"
    ]
    assert registry.latest_number() == 2 and not (root / "lock.json").exists()

    (root / "latest.json").unlink()
    with registry.lock() as lock:
        assert registry.repair_latest(lock, 1) == 1  # the version asked for
        assert registry.repair_latest(lock) == 1  # a latest that names a version is left alone
        with pytest.raises(RegistryError, match="names version 1: nothing to repair"):
            registry.repair_latest(lock, 2)
    assert registry.latest_number() == 1 and registry.problems() == [
        f"{root}/versions/000003.json: the record differs from its record_sha256 (edited after it was published)"
    ]
