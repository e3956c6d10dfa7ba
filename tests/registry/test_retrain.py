"""``retrain`` through the API on a real cluster (one LocalCluster for the module, passed as ``client=``).

The scores the gate compares are checked against ``evaluate`` of the same models on the same store, the
warm start against the training store's log-likelihood under the published model, and every refused or
failed run against the registry's files before it (content and mtimes: nothing written, no lock left).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from dist_respattn.engine import FitError, FitSettings, evaluate, load_checkpoint
from dist_respattn.registry import Registry, RegistryLocked, retrain
from dist_respattn.registry.retrain import WORK_DIR_MARK, claim_work_dir
from tests.engine.test_bad_input import tree_state
from tests.registry.conftest import expected_layout

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

SETTINGS = FitSettings(max_iter=5)


def run(registry: Path, store: str, client, **kwargs):
    kwargs.setdefault("settings", SETTINGS)
    return retrain(registry, store, client=client, progress=False, **kwargs)


def score(client, model, store: str) -> dict:
    return evaluate(model, store, client=client).model


@pytest.fixture(scope="module")
def base(tmp_path_factory, stores, client):
    """A registry whose first version was fitted on ``train`` (validated on ``validation``), and that run's result;
    tests copy the registry before writing to it."""
    root = tmp_path_factory.mktemp("base") / "registry"
    said: list[str] = []
    result = run(root, stores.train, client, validation=stores.validation, say=said.append)
    return root, result, said


@pytest.fixture
def registry(tmp_path, base) -> Path:
    """A copy of the base registry (version 1)."""
    root = tmp_path / "registry"
    shutil.copytree(base[0], root)
    return root


def test_first_run_publishes_version_1(base, stores, client):
    root, result, said = base
    assert (result.published, result.version, result.previous, result.exit_status) == (True, 1, None, 0)
    gate = result.gate
    assert (gate.metric, gate.current, gate.limit) == ("perplexity", None, None)
    assert gate.passed and not gate.in_sample
    assert gate.store == stores.validation
    assert result.to_json()["gate"]["current"] is None
    assert said[0] == f"{root}: no published version yet; a fresh fit (uniform start)"
    assert f"perplexity {gate.candidate:.6g}: the registry's first version, nothing to compare with" in said
    assert said[-1] == f"{root}: published version 1"

    registry = Registry(str(root))
    assert registry.numbers() == [1] and registry.latest_number() == 1
    assert registry.problems() == []
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == expected_layout(root)
    record = registry.version(1).record
    checkpoint = registry.load(1)
    assert checkpoint.meta["init"] == {"kind": "uniform"}
    assert checkpoint.iteration == result.fit["checkpoint_iteration"] == result.fit["best_iteration"]
    assert record["gate"] == gate.to_json()
    assert record["previous_metrics"] is None
    assert record["metrics"]["gate_store"] == stores.validation
    assert record["metrics"]["perplexity"] == gate.candidate
    # The gate's score is the published model's score on the validation store.
    assert math.isclose(score(client, checkpoint.model, stores.validation)["perplexity"], gate.candidate, rel_tol=1e-12)
    provenance = record["provenance"]
    assert provenance["store"]["url"] == stores.train and provenance["store"]["rows"] == 20_000
    assert provenance["validation"]["url"] == stores.validation
    assert provenance["warm_start_from"] is None
    assert provenance["settings"] == SETTINGS.to_json()
    assert provenance["iterations"] == result.fit["iterations"]


def test_second_run_warm_starts_from_latest(registry, stores, client):
    v1 = Registry(str(registry)).load(1)
    said: list[str] = []
    result = run(registry, stores.train, client, validation=stores.validation, tolerance=0.5, say=said.append)
    assert (result.published, result.version, result.previous) == (True, 2, 1)
    assert said[0] == f"{registry}: warm start from version 1"
    reg = Registry(str(registry))
    assert reg.latest_number() == 2 and reg.numbers() == [1, 2]
    v2 = reg.load(2)
    assert v2.meta["init"] == {"kind": "given"}
    record = reg.version(2).record
    assert record["provenance"]["warm_start_from"] == 1

    # The current version was scored on the same store: its score is version 1's own.
    v1_metrics = reg.version(1).record["metrics"]
    assert math.isclose(result.gate.current, v1_metrics["perplexity"], rel_tol=1e-12)
    assert record["previous_metrics"]["perplexity"] == result.gate.current

    # Iteration 1's E-step ran under version 1's model: its log-likelihood is the training store's under it,
    # at least the last one of version 1's own fit (EM never goes down), far above a random start's.
    first = v2.meta["history"][0]["mean_log_likelihood"]
    assert math.isclose(first, score(client, v1.model, stores.train)["mean_log_likelihood"], rel_tol=1e-9)
    assert first >= v1.meta["history"][-1]["mean_log_likelihood"] - 1e-9
    assert first > v1.meta["history"][0]["mean_log_likelihood"] + 1.0
    assert reg.problems() == []


def test_keep_prunes_old_versions(registry, stores, client):
    # What is tested is which versions each publish prunes: one iteration a retrain shows it.
    one = FitSettings(max_iter=1)
    second = run(registry, stores.train, client, validation=stores.validation, tolerance=0.5, keep=2, settings=one)
    assert (second.version, second.pruned) == (2, [])
    third = run(registry, stores.train, client, validation=stores.validation, tolerance=0.5, keep=2, settings=one)
    assert (third.version, third.pruned, third.previous) == (3, [1], 2)
    assert third.to_json()["pruned"] == [1]
    reg = Registry(str(registry))
    assert reg.numbers() == [2, 3] and reg.latest_number() == 3
    assert len(list((registry / "models").iterdir())) == 2
    assert {p.relative_to(registry).as_posix() for p in registry.rglob("*") if p.is_file()} == expected_layout(registry)
    fourth = run(registry, stores.train, client, validation=stores.validation, tolerance=0.5, keep=1, settings=one)
    assert (fourth.version, fourth.pruned) == (4, [2, 3])
    assert reg.numbers() == [4] and reg.problems() == []


def test_gate_rejects_a_worse_candidate_and_leaves_the_registry_alone(registry, stores, client, tmp_path):
    """Trained on a store sampled from another head, the candidate's held-out perplexity is far worse: with
    tolerance 0 it is not published. The registry is exactly as before (no version, no model files, no
    lock); the candidate stays in the work directory only."""
    before = tree_state(registry)
    said: list[str] = []
    work = tmp_path / "work"
    result = run(
        registry,
        stores.other_head,
        client,
        validation=stores.validation,
        tolerance=0.0,
        work_dir=work,
        say=said.append,
    )
    assert (result.published, result.version, result.previous, result.exit_status) == (False, None, 1, 1)
    gate = result.gate
    assert not gate.passed
    assert gate.limit == gate.current == Registry(str(registry)).version(1).record["metrics"]["perplexity"]
    assert gate.candidate > 1.2 * gate.current
    candidate = load_checkpoint(work / "model")
    assert candidate.meta["init"] == {"kind": "given"}
    assert math.isclose(score(client, candidate.model, stores.validation)["perplexity"], gate.candidate, rel_tol=1e-12)
    assert said[-2].startswith(f"gate failed: perplexity {gate.candidate:.6g} against the current version's")
    assert said[-1] == f"{registry}: not published; latest stays at version 1"
    assert tree_state(registry) == before
    assert Registry(str(registry)).problems() == []


def test_gate_on_loglik(registry, stores, client, tmp_path):
    """A fixed, far too large gate variance makes the held-out log-likelihood far worse: rejected on ``loglik``
    at tolerance 0. A normal fit whose early stopping metric is ``loglik`` is gated on it by default."""
    before = tree_state(registry)
    worse = run(
        registry,
        stores.train,
        client,
        validation=stores.validation,
        tolerance=0.0,
        gate_metric="loglik",
        settings=FitSettings(max_iter=3, estimate_sigma2=False, sigma2=50.0),
        work_dir=tmp_path / "work",
    )
    gate = worse.gate
    assert (worse.published, gate.metric, gate.passed) == (False, "loglik", False)
    # The version's record holds what the scoring pass gave it as a candidate, the gate's current what the same pass
    # gives it now: the same figure (to the order the tasks' sums are combined in), as the candidate's below.
    recorded = Registry(str(registry)).version(1).record["metrics"]["mean_log_likelihood"]
    assert math.isclose(gate.current, recorded, rel_tol=1e-12)
    assert gate.candidate < gate.current - 1.0
    candidate = load_checkpoint(tmp_path / "work" / "model").model
    assert candidate.sigma2 == 50.0
    assert math.isclose(
        score(client, candidate, stores.validation)["mean_log_likelihood"], gate.candidate, rel_tol=1e-12
    )
    assert tree_state(registry) == before

    better = run(
        registry,
        stores.train,
        client,
        validation=stores.validation,
        tolerance=0.01,
        settings=FitSettings(max_iter=5, early_stop_metric="loglik"),
    )
    gate = better.gate
    assert (better.published, better.version, gate.metric, gate.passed) == (True, 2, "loglik", True)
    assert gate.limit == pytest.approx(gate.current - 0.01 * abs(gate.current), rel=1e-12)
    assert gate.candidate >= gate.limit
    record = Registry(str(registry)).version(2).record
    assert record["metrics"]["mean_log_likelihood"] == gate.candidate
    assert record["gate"]["metric"] == "loglik"


def test_in_sample_gate_without_validation(tmp_path, stores, client):
    root = tmp_path / "registry"
    first = run(root, stores.train, client)
    assert (first.published, first.gate.in_sample, first.gate.store) == (True, True, stores.train)
    said: list[str] = []
    second = run(root, stores.train, client, tolerance=0.01, say=said.append)
    gate = second.gate
    assert gate.in_sample and gate.store == stores.train
    assert gate.current is not None and gate.passed and second.version == 2
    assert any(line.endswith("(in-sample: no validation store)") for line in said), said
    reg = Registry(str(root))
    record = reg.version(2).record
    assert record["metrics"]["gate_store"] == stores.train
    assert record["provenance"]["validation"] is None
    assert math.isclose(score(client, reg.load(1).model, stores.train)["perplexity"], gate.current, rel_tol=1e-12)
    # Without validation the published checkpoint is the fit's last one.
    assert reg.load(2).iteration == second.fit["iterations"]


@pytest.mark.parametrize("which", ["store", "validation"])
def test_shape_mismatch_is_a_clear_error_and_leaves_the_registry_alone(registry, stores, client, which):
    before = tree_state(registry)
    if which == "store":
        with pytest.raises(FitError) as caught:
            run(registry, stores.other_shape, client)
        assert str(caught.value) == (
            f"the initial model has (S, N, D, T) = (30, 4, 5, 12) but the store {stores.other_shape} has "
            "(13, 4, 5, 12): a model only fits stores of its own shape"
        )
    else:
        with pytest.raises(FitError, match=r"the validation store .* has \(S, N, D, T\) = \(13, 4, 5, 12\)"):
            run(registry, stores.train, client, validation=stores.other_shape)
    assert tree_state(registry) == before


def test_a_locked_registry_is_refused_before_any_work(registry, stores):
    before = tree_state(registry)
    with Registry(str(registry)).lock() as held:
        with pytest.raises(RegistryLocked, match="the registry is locked by another run"):
            retrain(registry, stores.train, validation=stores.validation)  # no cluster is reached
        held.check()
    assert tree_state(registry) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gate_metric": "accuracy"}, "gate metric 'accuracy': expected one of perplexity, loglik"),
        ({"tolerance": -0.1}, "tolerance = -0.1: expected a fraction >= 0"),
        ({"tolerance": math.nan}, "tolerance = nan"),
        ({"keep": 0}, "keep = 0: expected at least 1"),
    ],
    ids=["metric", "tolerance", "nan", "keep"],
)
def test_bad_arguments_are_refused_before_any_work(tmp_path, stores, kwargs, message):
    root = tmp_path / "registry"
    with pytest.raises(ValueError, match=message):
        retrain(root, stores.train, **kwargs)
    assert not root.exists()


def test_a_work_dir_holding_someone_elses_fit_is_refused_before_anything_runs(stores, tmp_path):
    """``--work-dir DIR`` whose ``DIR/model`` is a fit retrain did not write (no mark): refused with the flag named,
    before any cluster or lock, the fit untouched. A work directory retrain marked is reused, as scheduled
    retrains do."""
    work = tmp_path / "mine"
    (work / "model").mkdir(parents=True)
    (work / "model" / "latest.json").write_text("{}")
    before = tree_state(work)
    with pytest.raises(ValueError, match=r"--work-dir .*holds a fit that retrain did not write"):
        retrain(tmp_path / "registry", stores.train, work_dir=work)  # no client: refused before one would start
    assert tree_state(work) == before and not (tmp_path / "registry").exists()

    ours = tmp_path / "ours"
    claim_work_dir(ours)
    (ours / "model").mkdir()
    (ours / "model" / "latest.json").write_text("{}")
    claim_work_dir(ours)  # marked by the first use: its model/ is retrain's to replace
    assert (ours / WORK_DIR_MARK).is_file()
