"""The attribute-gated head on the cluster: the distributed fit is the in-process EM, bit-identical on 1, 2 and 3
workers, resumable, and every gated command runs end to end on a real text store with attributes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dist_respattn.artifacts.gated_checkpoints import load_gated
from dist_respattn.engine.gated_fit import GatedSettings, _strengths, fit_gated, shared_on_support, start_head

from dist_respattn.artifacts import CheckpointError, load_checkpoint
from dist_respattn.engine import FitSettings, fit, open_store
from dist_respattn.engine.fit import FitError
from dist_respattn.model.emission.layouts import PairSupport
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.gated.head import gated_estep, gated_m_step
from dist_respattn.store.predictions import target_words
from tests.engine.clusters import local_cluster
from tests.model.test_kernel_parity import assert_close
from tests.stdlib_packages import PACKAGES, package_corpus

# Every test here starts a cluster or a command.
pytestmark = pytest.mark.slow

#: A package left out of training, folded in at evaluation.
NEW_PACKAGE = "html"


COMMAND = str(Path(sys.executable).parent / "dist-respattn")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """``(train, test)`` token-stream stores of stdlib text with the package as each file's attribute; the test
    store is made --like the training store and holds one more package."""
    base = tmp_path_factory.mktemp("gated")
    train, test = str(base / "train.zarr"), str(base / "test.zarr")
    corpus = package_corpus(base / "corpus")
    done = _cli(
        "ingest", "--text", corpus, "--attribute-by", "directory", "--vocab-size", "300", "--dim", "6",
        "--context", "4", train, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    held = package_corpus(base / "held", (*PACKAGES[:2], NEW_PACKAGE))
    done = _cli("ingest", "--text", held, "--attribute-by", "directory", "--like", train, test, "--json")
    assert done.returncode == 0, done.stderr
    return train, test


@pytest.fixture(scope="module")
def cluster():
    """One worker at first; the bit-identity test adds the others (a cluster only grows: distributed's close
    can fail on a worker removed by an earlier scale-down)."""
    with local_cluster(1) as (c, client):
        yield c, client


def _shared(tmp_path, train, client):
    settings = FitSettings(max_iter=3, seed=0)
    fit(train, model_dir=str(tmp_path / "shared"), settings=settings, client=client)
    return str(tmp_path / "shared")


def test_the_cluster_fit_is_the_in_process_em(stores, cluster, tmp_path):
    train, _ = stores
    _, client = cluster
    shared_dir = _shared(tmp_path, train, client)
    settings = GatedSettings(2, per_attribute=("position_prior",), max_iter=3, patience=5, prior_scale=0.5)
    result = fit_gated(
        train, model_dir=str(tmp_path / "gated"), settings=settings, shared_dir=shared_dir, client=client
    )
    assert result.iterations == 3
    # The same EM, in this process, over the same training rows.
    shared = load_checkpoint(shared_dir)
    store = open_store(train, window=shared.model.context_length)
    rule = HoldoutRule.from_json(shared.meta["holdout"])
    block = store.read_rows(0, store.num_rows)
    attribute = store.read_attributes(0, store.num_rows)
    weights = rule.split_weights(0, store.num_rows, None)[0]
    strength, base = _strengths(shared)
    emission = shared.model.emission_table
    # The support: the pairs of the training rows (the fit's own, when its shared head is sparse).
    live = weights > 0
    s_count = shared.model.num_symbols
    keys = np.repeat(block.target[live].astype(np.int64), block.context.shape[1]) * s_count
    keys += block.context[live].reshape(-1)
    support = getattr(emission, "support", None) or PairSupport.from_keys(np.unique(keys), s_count, s_count)
    center = shared_on_support(shared.model, support, base)
    head = start_head(shared.model, center, settings, len(store.attribute_names))
    for _ in range(3):
        stats = gated_estep(head, block.encoded, attribute, weights)
        head = gated_m_step(stats, head, strength=0.5 * strength, center=center, weight_strength=1.0)
    fitted = load_gated(tmp_path / "gated", "latest").head
    assert_close(fitted.factors.values, head.factors.values, rtol=1e-9, label="factor values")
    assert_close(fitted.weights, head.weights, rtol=1e-9, label="weights")
    assert_close(fitted.position_prior, head.position_prior, rtol=1e-9, label="priors")
    assert_close(fitted.key_means, head.key_means, rtol=1e-9, label="keys")


def test_bit_identical_on_one_two_and_three_workers_and_resumable(stores, cluster, tmp_path):
    train, _ = stores
    c, client = cluster
    shared_dir = _shared(tmp_path, train, client)
    # Own tables beside 3 shared factors: the widest head, its structural zeros kept on the cluster too.
    settings = GatedSettings(3, per_attribute=("emission",), max_iter=2, patience=5)
    heads = []
    for workers in (1, 2, 3):
        c.scale(max(workers, len(client.scheduler_info()["workers"])))
        client.wait_for_workers(workers)
        assert len(client.scheduler_info()["workers"]) == workers
        folder = str(tmp_path / f"gated-{workers}")
        fit_gated(train, model_dir=folder, settings=settings, shared_dir=shared_dir, client=client)
        heads.append(load_gated(folder, "latest").head)
    for other in heads[1:]:
        assert np.array_equal(other.factors.values, heads[0].factors.values)
        assert np.array_equal(other.weights, heads[0].weights)
    # Two more iterations of the 3-worker fit equal a 4-iteration fit from the start.
    longer = dict(settings.to_json(), max_iter=4, per_attribute=("emission",))
    fit_gated(train, model_dir=str(tmp_path / "gated-3"), settings=GatedSettings(**longer), shared_dir=shared_dir,
              client=client, resume=True)  # fmt: skip
    fit_gated(train, model_dir=str(tmp_path / "whole"), settings=GatedSettings(**longer), shared_dir=shared_dir,
              client=client)  # fmt: skip
    resumed, whole = load_gated(tmp_path / "gated-3", "latest"), load_gated(tmp_path / "whole", "latest")
    assert resumed.iteration == whole.iteration == 4
    assert np.array_equal(resumed.head.factors.values, whole.head.factors.values)
    with pytest.raises(FitError, match="other settings"):
        fit_gated(train, model_dir=str(tmp_path / "whole"), settings=GatedSettings(2, max_iter=5),
                  shared_dir=shared_dir, client=client, resume=True)  # fmt: skip
    with pytest.raises(FitError, match="holds a gated fit"):
        fit_gated(train, model_dir=str(tmp_path / "whole"), settings=GatedSettings(**longer), shared_dir=shared_dir,
                  client=client)  # fmt: skip
    # A plain head's commands refuse the gated checkpoint by name, and a gated fit never replaces a plain one
    # without --overwrite.
    with pytest.raises(CheckpointError, match="attribute-gated head"):
        load_checkpoint(tmp_path / "whole")
    with pytest.raises(FitError, match="holds the fit of a plain head"):
        fit_gated(train, model_dir=shared_dir, settings=GatedSettings(2), shared_dir=shared_dir, client=client)
    # A shared head that moved on since the gated fit started is not resumed from silently.
    fit(train, model_dir=shared_dir, settings=FitSettings(max_iter=4, seed=0), client=client, resume=True)
    with pytest.raises(FitError, match="its prior would change"):
        fit_gated(train, model_dir=str(tmp_path / "whole"), settings=GatedSettings(**longer), shared_dir=shared_dir,
                  client=client, resume=True)  # fmt: skip


def test_a_store_without_attributes_is_refused_naming_the_flags(small_store, cluster, tmp_path):
    _, client = cluster
    fit(small_store, model_dir=str(tmp_path / "shared"), settings=FitSettings(max_iter=1), client=client)
    with pytest.raises(Exception, match="--attribute-by"):
        fit_gated(small_store, model_dir=str(tmp_path / "g"), settings=GatedSettings(2),
                  shared_dir=str(tmp_path / "shared"), client=client)  # fmt: skip


def test_the_commands_end_to_end(stores, tmp_path):
    train, test = stores
    model = str(tmp_path / "model")
    done = _cli(
        "fit", train, "--model-dir", model, "--attribute-factors", "2", "--per-attribute", "position_prior",
        "--max-iter", "3", "--workers", "2", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "gated" and report["factors"] == 2 and report["attributes"] == len(PACKAGES)
    assert os.path.isdir(os.path.join(model, "shared"))

    done = _cli("evaluate", model, test, "--classify-attributes", "--fold-in", "--workers", "2", "--json")
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

    texts = [_cli("sample", model, "--attribute", "json", "--tokens", "30", "--seed", s, "--json") for s in "112"]
    for done in texts:
        assert done.returncode == 0, done.stderr
    first, again, other = (json.loads(t.stdout)["tokens"] for t in texts)
    assert first == again and first != other and len(first) == 30
    done = _cli("sample", model, "--mix", "json=0.5,tomllib=0.5", "--tokens", "10", "--json")
    assert done.returncode == 0, done.stderr
    done = _cli("sample", model, "--attribute", "nosuch", "--tokens", "10")
    assert done.returncode != 0 and "nosuch" in done.stderr and "json" in done.stderr
    # A document shorter than N opens a sample as well as a long one (a short prompt is padded): here json's only
    # document is one line of three tokens.
    short = package_corpus(tmp_path / "short", ("tomllib",))
    (tmp_path / "short" / "json").mkdir()
    (tmp_path / "short" / "json" / "one.py").write_text("x = 1\n", encoding="utf-8")
    short_store = str(tmp_path / "short.zarr")
    done = _cli("ingest", "--text", short, "--attribute-by", "directory", "--like", train, short_store, "--json")
    assert done.returncode == 0, done.stderr
    done = _cli("sample", model, "--store", short_store, "--attribute", "json", "--tokens", "5", "--json")
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

    done = _cli("neighbours", model, "def", "--attribute", "json", "--top", "5", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed["distance"] == "hellinger" and len(listed["neighbours"]["json"]) == 5

    # Resuming the finished fit is a no-op that reports the same model: its settings are its own, not repeated.
    done = _cli("fit", train, "--model-dir", model, "--attribute-factors", "2", "--workers", "2", "--resume", "--json")
    assert done.returncode == 0, done.stderr
    resumed = json.loads(done.stdout)
    assert resumed["iterations"] == report["iterations"] and resumed["settings"] == report["settings"]


def test_tables_the_workers_cannot_hold_are_refused_before_the_first_e_step(stores, cluster, tmp_path):
    from dist_respattn.engine.memory import InsufficientMemoryError

    train, _ = stores
    _, client = cluster
    shared_dir = _shared(tmp_path, train, client)
    with local_cluster(1, memory_limit="400MiB") as (_, small):
        with pytest.raises(
            InsufficientMemoryError, match=r"attribute-gated emission tables, 2000 tables.*--attribute-factors"
        ):
            fit_gated(train, model_dir=str(tmp_path / "big"), settings=GatedSettings(2000, max_iter=1),
                      shared_dir=shared_dir, client=small)  # fmt: skip
    assert not (tmp_path / "big" / "latest.json").exists()  # nothing was written
