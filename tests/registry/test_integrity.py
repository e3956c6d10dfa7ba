"""The registry cannot be made to skip its gate: a deleted ``latest.json`` and edited version records are found.

``models check`` reports both, ``retrain`` refuses a registry with versions and no ``latest`` (naming the
repair), and ``models repair`` points ``latest`` back at the newest version that checks out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dist_respattn.artifacts.registry import record_checksum
from dist_respattn.cli import main
from dist_respattn.registry import Registry, RegistryError, retrain
from tests.engine.test_bad_input import run_cli
from tests.registry.conftest import truth
from tests.registry.test_registry import publish, same_head


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
        # --version N on a latest that checks out: refused, saying why and which versions there are.
        with pytest.raises(RegistryError, match=r"names version 1, which checks out: nothing to repair \(--version 2 "
                           r"is for a latest that does not; the registry holds versions 1, 2, 3\)"):  # fmt: skip
            registry.repair_latest(lock, 2)
        with pytest.raises(RegistryError, match=r"there is no version 7, and the registry holds versions 1, 2, 3"):
            registry.repair_latest(lock, 7)
    assert registry.latest_number() == 1 and registry.problems() == [
        f"{root}/versions/000003.json: the record differs from its record_sha256 (edited after it was published)"
    ]


def recompute_checksum(root: Path, number: int, **changes) -> None:
    """Edit version ``number``'s record on disk and give it the checksum a publish would have (an attacker's edit)."""
    path = root / "versions" / f"{number:06d}.json"
    record = {**json.loads(path.read_text()), **changes}
    record["record_sha256"] = record_checksum(record)
    path.write_text(json.dumps(record, indent=2))


def test_models_list_marks_a_record_that_fails_its_checksum(three, capsys):
    """Before: the edited perplexity was listed like any other. Now the version is marked, with the reason."""
    _, root = three
    edit_metrics(root, 2)
    assert main(["models", "list", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    marks = {v["version"]: (v["verified"], v["problem"]) for v in report["versions"]}
    edited = f"{root}/versions/000002.json: the record differs from its record_sha256 (edited after it was published)"
    assert marks == {3: (True, None), 2: (False, edited), 1: (True, None)}
    assert report["versions"][1]["metrics"]["perplexity"] == 1.01  # shown, but marked as not to be trusted

    assert main(["models", "list", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line[1:].split()[0]: line for line in lines[2:5]}
    assert rows["2"].endswith("  (!)") and not rows["1"].endswith("(!)") and not rows["3"].endswith("(!)")
    assert lines[5:7] == ["(* = latest)", f"! version 2: {edited}"]
    assert lines[7].startswith("(!) the record fails its check: its metrics and provenance are not to be trusted")

    assert main(["models", "show", str(root), "2"]) == 0  # shown, for inspection, and marked
    shown = capsys.readouterr()
    assert json.loads(shown.out)["problem"] == edited and json.loads(shown.out)["verified"] is False
    assert shown.err == f"! {edited}: its metrics and provenance are not to be trusted\n"


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"model": "../elsewhere"}, id="model-parent"),
        pytest.param({"model": "ELSEWHERE"}, id="model-absolute"),
        pytest.param({"model": "models/../../elsewhere"}, id="model-through-models"),
    ],
)
def test_a_record_may_name_only_files_inside_the_registry(three, tmp_path, capsys, changes):
    """Version 2's record pointed outside the registry, at a valid copy of its own files, its checksum recomputed.
    Before: ``models check`` said every file checks out (it read the copy) and ``load`` returned it. Now the record
    is refused before any file is read, by every reader, and ``models list`` marks it."""
    registry, root = three
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = root / registry.version(2).model_path
    for name in ("params.npz", "meta.json"):
        (elsewhere / name).write_bytes((folder / name).read_bytes())
    if changes.get("model") == "ELSEWHERE":
        changes = {"model": str(elsewhere)}
    recompute_checksum(root, 2, **changes)
    message = "'model' must name a folder models/<token> inside the registry"
    problems = registry.problems()
    assert len(problems) == 1 and problems[0].startswith(f"{root}/versions/000002.json: {message}"), problems
    with pytest.raises(RegistryError, match=re.escape(message)):
        registry.load(2)
    with pytest.raises(RegistryError, match=re.escape(message)):
        registry.export(2, tmp_path / "exported")
    assert main(["models", "check", str(root)]) == 1
    assert capsys.readouterr().out.startswith(f"problem: {root}/versions/000002.json: {message}")
    assert main(["models", "list", str(root), "--json"]) == 0
    listed = {v["version"]: v["verified"] for v in json.loads(capsys.readouterr().out)["versions"]}
    assert listed == {3: True, 2: False, 1: True}


@pytest.mark.parametrize("damage", ["record", "pointer"])
def test_models_repair_replaces_a_latest_that_does_not_check_out(three, tmp_path, capsys, damage):
    """Before: latest naming an edited version (or a pointer that is not JSON) left the registry stuck: ``retrain``
    refused it, and ``models repair`` said "nothing to repair" (or failed on the pointer). Now ``check`` names the
    repair and ``repair`` points latest at the newest version that checks out."""
    registry, root = three
    if damage == "record":
        edit_metrics(root, 3)
    else:
        (root / "latest.json").write_text('{"version": ')
    problem = registry.missing_latest()
    assert problem is not None and problem.endswith(
        f"run `dist-respattn models repair {root}` to point it at the newest version that checks out"
    )
    assert problem in registry.problems()

    assert main(["models", "repair", str(root), "--json"]) == (1 if damage == "record" else 0)
    report = json.loads(capsys.readouterr().out)
    assert (report["latest"], report["repaired"]) == (2 if damage == "record" else 3, True)
    edited = f"{root}/versions/000003.json: the record differs from its record_sha256 (edited after it was published)"
    assert report["problems"] == ([edited] if damage == "record" else [])
    assert registry.missing_latest() is None
    assert same_head(registry.load("latest").model, truth(2 if damage == "record" else 3))
    assert json.loads((root / "latest.json").read_text())["repaired"] is True
