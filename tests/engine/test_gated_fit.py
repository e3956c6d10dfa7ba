"""The attribute-gated head on the cluster, through the generic engine: the distributed fit is the in-process EM
(``fit_em`` of a :class:`GatedSpec`), bit-identical on 1, 2 and 3 workers, resumable, and every gated command runs
end to end on a real text store with attributes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.cli import main
from dist_respattn.engine import FitSettings, fit, open_store
from dist_respattn.engine.fit import FitError
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.gated.head import GatedHead
from dist_respattn.model.heads.gated.kind import GatedSpec
from dist_respattn.store import WriteOptions, write_arrays
from dist_respattn.store.predictions import target_words
from tests.engine.clusters import local_cluster
from tests.engine.conftest import NEW_PACKAGE
from tests.stdlib_packages import PACKAGES, package_corpus

# Every test here starts a cluster or a command.
pytestmark = pytest.mark.slow

#: The shared stage's loop settings in these tests.
SHARED = FitSettings(max_iter=3, seed=0)


COMMAND = str(Path(sys.executable).parent / "dist-respattn")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=600)


def _here(*args: str) -> subprocess.CompletedProcess:
    """``dist-respattn ARGS`` by the command's own ``main`` in this process, as :func:`_cli` gives it: for the steps
    whose answers are tested, not their process (each process start loads the package again)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    return subprocess.CompletedProcess(["dist-respattn", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def stores(package_stores):
    """``(train, test)`` token-stream stores of stdlib text with the package as each file's attribute; the test
    store is made --like the training store and holds one more package (``package_stores``, shared with the
    serving tests)."""
    return package_stores


@pytest.fixture(scope="module")
def cluster():
    """One worker at first; the bit-identity test adds the others (a cluster only grows: distributed's close
    can fail on a worker removed by an earlier scale-down)."""
    with local_cluster(1) as (c, client):
        yield c, client


def _gated(factors: int, *, max_iter: int, **options) -> GatedSpec:
    """A gated spec whose stage runs ``max_iter`` (at most 4) iterations without stopping early (its patience beyond
    them)."""
    return GatedSpec(factors, stage_settings={"max_iter": max_iter, "patience": 5}, **options)


def _arrays(head: GatedHead) -> dict[str, np.ndarray]:
    arrays, _ = head.to_arrays()
    return arrays


def test_the_cluster_fit_is_the_in_process_em(stores, cluster, tmp_path):
    """Both stages on the cluster, then ``fit_em`` of the same spec in this process from the shared stage's head, on
    the training rows its hold-out leaves: the same prior scales chosen, the same heads and log-likelihoods."""
    train, _ = stores
    _, client = cluster
    spec = _gated(2, per_attribute=("position_prior",), max_iter=3)
    model_dir = tmp_path / "gated"
    result = fit(train, model_dir=model_dir, settings=SHARED, head=spec, client=client)
    assert result.iterations == 3 and result.model.kind == "gated"
    (shared_result,) = result.stages
    assert shared_result.model_dir == str(model_dir / "shared") and shared_result.iterations == 3
    # The same EM, in this process, over the same rows: the shared fit's, its hold-out choosing the prior scale.
    shared = load_checkpoint(model_dir / "shared", "latest")
    store = open_store(train, window=shared.model.context_length)
    rows = store.read_rows(0, store.num_rows).encoded
    attribute = store.read_attributes(0, store.num_rows)
    reference = fit_em(
        rows, spec, attributes=attribute,
        attribute_names=tuple(store.attribute_names), init=shared.model, init_meta=shared.meta,
        init_arrays=dict(shared.arrays), holdout=HoldoutRule.from_json(shared.meta["holdout"]), max_iter=3,
    )  # fmt: skip
    history = result.history
    assert [h["hyperparameters"] for h in history] == [it.hyperparameters.to_json() for it in reference.history]
    np.testing.assert_allclose([h["mean_log_likelihood"] for h in history], reference.log_likelihoods, rtol=1e-9)
    np.testing.assert_allclose(
        [h["heldout"]["perplexity"] for h in history], [it.heldout["perplexity"] for it in reference.history],
        rtol=1e-9,
    )  # fmt: skip
    fitted = load_checkpoint(model_dir, "latest").model
    assert isinstance(fitted, GatedHead) and fitted.names == tuple(store.attribute_names)
    ours, theirs = _arrays(fitted), _arrays(reference.distribution)
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-9, atol=1e-300, err_msg=name)


def test_bit_identical_on_one_two_and_three_workers_and_resumable(stores, cluster, tmp_path):
    train, _ = stores
    c, client = cluster
    # Own tables beside 3 shared factors: the widest head, its structural zeros kept on the cluster too; the prior
    # scale chosen on the held-out rows every iteration.
    spec = _gated(3, per_attribute=("emission",), max_iter=2)
    heads = []
    for workers in (1, 2, 3):
        c.scale(max(workers, len(client.scheduler_info()["workers"])))
        client.wait_for_workers(workers)
        assert len(client.scheduler_info()["workers"]) == workers
        folder = tmp_path / f"gated-{workers}"
        fit(train, model_dir=folder, settings=SHARED, head=spec, client=client)
        heads.append(_arrays(load_checkpoint(folder, "latest").model))
    for other in heads[1:]:
        assert other.keys() == heads[0].keys()
        for name in other:
            assert np.array_equal(other[name], heads[0][name]), name
    # Two more iterations of the 3-worker fit equal a 4-iteration fit from the start (the shared stage is not
    # continued: the gated stage started from it).
    longer = _gated(3, per_attribute=("emission",), max_iter=4)
    resumed_result = fit(
        train, model_dir=tmp_path / "gated-3", settings=SHARED, head=longer, client=client, resume=True
    )
    assert [s.iterations for s in resumed_result.stages] == [3]
    fit(train, model_dir=tmp_path / "whole", settings=SHARED, head=longer, client=client)
    resumed, whole = load_checkpoint(tmp_path / "gated-3", "latest"), load_checkpoint(tmp_path / "whole", "latest")
    assert resumed.iteration == whole.iteration == 4
    ours, theirs = _arrays(resumed.model), _arrays(whole.model)
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), name
    assert [h["hyperparameters"] for h in resumed.meta["history"]] == [
        h["hyperparameters"] for h in whole.meta["history"]
    ]
    with pytest.raises(FitError, match=r"other settings.*attribute_factors"):
        fit(train, model_dir=tmp_path / "whole", settings=SHARED, head=_gated(2, max_iter=5), client=client,
            resume=True)  # fmt: skip
    # A fit into a directory that holds one is refused before any stage runs (its shared stage's directory too).
    for taken in ("whole", "whole/shared"):
        with pytest.raises(FitError, match="already holds a fit"):
            fit(train, model_dir=tmp_path / taken, settings=SHARED, head=longer, client=client)
    # Checkpoints of any kind load by the kind they record.
    assert load_checkpoint(tmp_path / "whole").model.kind == "gated"
    assert load_checkpoint(tmp_path / "whole" / "shared").model.kind != "gated"
    # A shared head that moved on since the gated fit started is not resumed from silently.
    fit(train, model_dir=tmp_path / "whole" / "shared", settings=FitSettings(max_iter=4, seed=0), client=client,
        resume=True)  # fmt: skip
    with pytest.raises(FitError, match="would change under it"):
        fit(train, model_dir=tmp_path / "whole", settings=SHARED, head=longer, client=client, resume=True)


def test_a_store_without_attributes_is_refused_naming_the_flags(small_store, cluster, tmp_path):
    _, client = cluster
    with pytest.raises(FitError, match="--attribute-by") as raised:
        fit(small_store, model_dir=tmp_path / "g", settings=FitSettings(max_iter=1), head=_gated(2, max_iter=1),
            client=client)  # fmt: skip
    assert "--attributes" in str(raised.value)
    # Refused before the shared stage: nothing was fitted or written.
    assert not (tmp_path / "g").exists()


def test_the_commands_end_to_end(stores, cluster, tmp_path):
    train, test = stores
    # fit and evaluate join the module's cluster: what they compute does not depend on whose workers run it (the
    # bit-identity test above), and starting a cluster of their own is tested with the single head's commands. The
    # fit is a real process, as a shell runs it; the commands after it run by the same main in this process.
    address = cluster[1].scheduler.address
    model = str(tmp_path / "model")
    done = _cli(
        "fit", train, "--model-dir", model, "--attribute-factors", "2", "--per-attribute", "position_prior",
        "--max-iter", "3", "--scheduler", address, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "gated" and report["factors"] == 2 and report["attributes"] == len(PACKAGES)
    assert os.path.isdir(os.path.join(model, "shared"))

    done = _here("evaluate", model, test, "--classify-attributes", "--fold-in", "--scheduler", address, "--json")
    assert done.returncode == 0, done.stderr
    evaluation = json.loads(done.stdout)
    assert set(evaluation["by_attribute"]) == {*PACKAGES[:2], NEW_PACKAGE}
    for name in PACKAGES[:2]:
        row = evaluation["by_attribute"][name]
        assert row["perplexity"] > 1 and row["perplexity_shared"] > 1 and row["perplexity_kneser_ney"] > 1
    assert not evaluation["by_attribute"][NEW_PACKAGE]["known"]
    assert 0.0 <= evaluation["attribute_accuracy"] <= 1.0
    folded = evaluation["fold_in"][NEW_PACKAGE]
    assert abs(sum(folded["weights"]) - 1.0) < 1e-6 and folded["perplexity"] > 1
    # Folding in never does worse on the rows it was folded on than where it started; on the held half it is
    # measured, not assumed.
    assert folded["perplexity_uniform_weights"] > 1

    texts = [_here("sample", model, "--attribute", "json", "--tokens", "30", "--seed", s, "--json") for s in "112"]
    for done in texts:
        assert done.returncode == 0, done.stderr
    first, again, other = (json.loads(t.stdout)["tokens"] for t in texts)
    assert first == again and first != other and len(first) == 30
    done = _here("sample", model, "--mix", "json=0.5,tomllib=0.5", "--tokens", "10", "--json")
    assert done.returncode == 0, done.stderr
    done = _here("sample", model, "--attribute", "nosuch", "--tokens", "10")
    assert done.returncode != 0 and "nosuch" in done.stderr and "json" in done.stderr
    # A document shorter than N opens a sample as well as a long one (a short prompt is padded): here json's only
    # document is one line of three tokens.
    short = package_corpus(tmp_path / "short", ("tomllib",))
    (tmp_path / "short" / "json").mkdir()
    (tmp_path / "short" / "json" / "one.py").write_text("x = 1\n", encoding="utf-8")
    short_store = str(tmp_path / "short.zarr")
    done = _here("ingest", "--text", short, "--attribute-by", "directory", "--like", train, short_store, "--json")
    assert done.returncode == 0, done.stderr
    done = _here("sample", model, "--store", short_store, "--attribute", "json", "--tokens", "5", "--json")
    assert done.returncode == 0, done.stderr
    opened = open_store(short_store)
    ids = opened.document_attributes()
    assert ids is not None
    json_documents = np.flatnonzero(ids == opened.attribute_names.index("json"))
    assert json_documents.size == 1
    starts = opened.document_starts()
    first = int(starts[json_documents[0]])
    assert int(np.append(starts, opened.num_tokens)[json_documents[0] + 1]) - first == 3
    words = target_words(opened.vocabulary(), opened.schema.num_targets)
    assert words is not None
    expected = [words[int(t)] for t in opened.read_tokens(first, first + 3)]
    sampled = json.loads(done.stdout)
    assert sampled["prompt"] == expected and len(expected) < opened.schema.context_length and len(sampled["ids"]) == 5

    done = _here("neighbours", model, "def", "--attribute", "json", "--top", "5", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed["distance"] == "hellinger" and len(listed["neighbours"]["json"]) == 5

    # Resuming the finished fit is a no-op that reports the same model: its settings are its own, not repeated. On
    # the module's cluster too: a cluster of the command's own adds nothing to what is checked here.
    done = _here("fit", train, "--model-dir", model, "--attribute-factors", "2", "--scheduler", address, "--resume",
                 "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    resumed = json.loads(done.stdout)
    assert resumed["iterations"] == report["iterations"] and resumed["settings"] == report["settings"]
    assert resumed["settings"]["kind"] == "gated" and resumed["settings"]["per_attribute"] == ["position_prior"]
    assert resumed["shared"] == {**report["shared"], "heldout_perplexity": resumed["shared"]["heldout_perplexity"]}
    assert resumed["shared"]["heldout_perplexity"] == report["shared"]["heldout_perplexity"]


def test_tables_the_workers_cannot_hold_are_refused_before_the_first_e_step(cluster, tmp_path):
    from dist_respattn.engine.memory import InsufficientMemoryError

    _, client = cluster
    # 2,000 attributes, so that 2,000 factor tables are a meaningful request (more than A are refused up front).
    rng = np.random.default_rng(0)
    rows, attributes = 6_000, 2_000
    store = write_arrays(
        tmp_path / "many.zarr", rng.integers(0, 300, (rows, 4)), rng.normal(size=(rows, 2)),
        rng.integers(0, 300, rows), num_symbols=300, num_targets=300, attributes=np.arange(rows) % attributes,
        options=WriteOptions(partition_rows=2_000, chunk_rows=1_000),
    )  # fmt: skip
    spec = _gated(attributes, max_iter=1)
    # The shared stage on the ordinary cluster; the gated stage on workers of 400 MiB.
    fit(store, model_dir=tmp_path / "big" / "shared", settings=SHARED, head=spec.shared, client=client)
    with local_cluster(1, memory_limit="400MiB") as (_, small):
        with pytest.raises(
            InsufficientMemoryError, match=r"attribute-gated emission tables, 2000 tables.*--attribute-factors"
        ):
            fit(store, model_dir=tmp_path / "big", settings=SHARED, head=spec, client=small, resume=True)
    assert not (tmp_path / "big" / "latest.json").exists()  # nothing was written


def test_more_factor_tables_than_attributes_are_refused_before_the_shared_stage(stores, tmp_path):
    """F = A already lets each attribute have its own table: F > A is refused before any stage runs or any
    directory is written (numpy's "Unable to allocate 65.8 GiB" for F = 100,000 once, after the shared fit)."""
    train, _ = stores
    model = tmp_path / "huge"
    done = _cli("fit", train, "--model-dir", str(model), "--attribute-factors", "100000", "--workers", "1")
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip()
    assert message.count("\n") == 0 and message.startswith("dist-respattn fit: error:"), message
    assert f"--attribute-factors 100000 with {len(PACKAGES)} attributes" in message
    assert f"use --attribute-factors {len(PACKAGES)} or fewer" in message
    assert "started a local cluster" not in done.stderr  # refused before any cluster started
    assert not model.exists()
