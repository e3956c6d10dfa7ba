"""An attribute-gated head served as any head: ``predict --top K`` writes each row's targets ranked under its own
attribute, ``predict --stream --attribute NAME`` predicts as that attribute, and ``retrain`` publishes gated versions
that the registry then gates against, the second warm-started from the first. Every command is a real subprocess on a
real text store with attributes, on this module's cluster (``--scheduler``): which workers run the tasks does not
change what a command computes, and a command starting a cluster of its own is tested with the single head."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.engine import open_store
from dist_respattn.engine.worker_tasks import attribute_map
from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.gated.head import GatedHead
from dist_respattn.model.streaming import Predictor
from dist_respattn.store.predictions import target_words
from tests.engine.conftest import NEW_PACKAGE
from tests.stdlib_packages import package_corpus

# Every test here starts a command (and the module a cluster).
pytestmark = pytest.mark.slow

COMMAND = str(Path(sys.executable).parent / "dist-respattn")
TOP = 3


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=600, input=stdin)


@pytest.fixture(scope="module")
def stores(package_stores) -> tuple[str, str]:
    """``(train, test)``: stdlib text, each file's package its attribute; the test store holds a package more
    (``package_stores``, shared with the gated fit tests)."""
    return package_stores


@pytest.fixture(scope="module")
def address(client) -> str:
    """The scheduler of the engine tests' shared cluster (two worker processes), which every command joins."""
    return client.scheduler.address


@pytest.fixture(scope="module")
def model(stores, address, tmp_path_factory) -> str:
    """A gated head (two factors beside each attribute's own table) fitted by ``fit --attribute-factors``."""
    train, _ = stores
    folder = str(tmp_path_factory.mktemp("gated-model") / "model")
    done = _cli(
        "fit", train, "--model-dir", folder, "--attribute-factors", "2", "--per-attribute", "emission",
        "--max-iter", "2", "--scheduler", address, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kind"] == "gated"
    return folder


def test_predict_top_k_ranks_every_row_under_its_own_attribute(stores, model, address, tmp_path):
    """The file of rows holds, for every row of the test store, the head's top K under the row's attribute (the
    shared head's for the package it never saw), and the accuracies it reports are those of the file."""
    _, test = stores
    out = tmp_path / "top.jsonl"
    done = _cli("predict", model, test, "--out", str(out), "--top", str(TOP), "--scheduler", address, "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    store = open_store(test)
    assert run["rows"] == len(rows) == store.num_rows and run["top_k"] == TOP and run["format"] == "jsonl"
    head = load_checkpoint(model).model
    assert isinstance(head, GatedHead)
    mapping = attribute_map(tuple(store.attribute_names), head.attribute_names())
    assert mapping is not None
    attribute = mapping[store.read_attributes(0, store.num_rows)]
    assert (attribute == -1).any() and (attribute >= 0).any()  # both kinds of rows are ranked
    encoded = store.read_rows(0, store.num_rows)
    ranked = head.top_k(Block(encoded, None, attribute), TOP)
    assert [r["row"] for r in rows] == list(range(store.num_rows))
    assert np.array_equal(np.array([r["ids"] for r in rows]), ranked.targets)
    np.testing.assert_allclose(np.array([r["probabilities"] for r in rows]), ranked.probabilities, rtol=1e-12)
    words = target_words(store.vocabulary(), head.num_targets)
    assert words is not None and rows[0]["words"] == [words[i] for i in rows[0]["ids"]]
    first = np.mean([r["ids"][0] == r["target"] for r in rows])
    among = np.mean([r["target"] in r["ids"] for r in rows])
    assert run["top1_accuracy"] == pytest.approx(first, rel=1e-12)
    assert run["top_k_accuracy"] == pytest.approx(among, rel=1e-12)


def test_predict_of_a_store_refuses_the_attribute_options_which_go_with_stream(stores, model, tmp_path):
    """Predicting a store, a gated head ranks each row under its own attribute: ``--attribute`` and ``--mix`` say
    what one history read by ``--stream`` is predicted as, and were ignored without it. Refused in one line naming
    the flags and ``--stream``, before anything is written or started."""
    _, test = stores
    out = tmp_path / "top.jsonl"
    for given, named, what, it in (
        (("--attribute", "json"), "--attribute json", "an option", "it"),
        (("--mix", "json=0.5,tomllib=0.5"), "--mix json=0.5,tomllib=0.5", "an option", "it"),
        (("--attribute", "json", "--mix", "json=1"), "--attribute json, --mix json=1", "options", "them"),
    ):
        done = _cli("predict", model, test, "--out", str(out), *given, "--workers", "1")
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr.splitlines() == [
            f"dist-respattn predict: error: {named}: {what} of gated heads for --stream (one history read from "
            "stdin); predicting a store, each row is predicted as the store holds it: give --stream, or leave "
            f"{it} out"
        ]
    assert not out.exists()


def test_predict_stream_predicts_as_the_attribute_asked_for(stores, model):
    """Every line is the plain head of that attribute's prediction after the tokens so far; without an attribute
    the command says what to give, naming both flags."""
    _, test = stores
    text = "def encode(self, o):\n    return json.dumps(o, indent=4)\n"
    head = load_checkpoint(model).model
    assert isinstance(head, GatedHead)
    store = open_store(test)
    words = target_words(store.vocabulary(), head.num_targets)
    assert words is not None
    lookup = {w: i for i, w in enumerate(words[:-1])}
    printed = {}
    for name in ("json", "tomllib"):
        done = _cli("predict", model, test, "--stream", "--attribute", name, "--top", str(TOP), stdin=text)
        assert done.returncode == 0, done.stderr
        printed[name] = done.stdout
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(lines) > 10
        predictor = Predictor(head.shared(head.attribute_id(name, "--attribute")), store.embeddings(), words=words)
        for line in lines:
            predictor.push(lookup.get(line["token"], len(words) - 1))
            ids, probs = predictor.top_k(TOP)
            assert line["ids"] == ids.tolist(), (name, line)
            np.testing.assert_allclose([p for _, p in line["top"]], probs, rtol=0, atol=1e-8)  # printed to 8 places
    # The two attributes predict differently somewhere (their probabilities are printed to 8 places): the attribute
    # given is the one used.
    assert printed["json"] != printed["tomllib"]
    refused = _cli("predict", model, test, "--stream", stdin=text)
    assert refused.returncode == 2 and "--attribute NAME" in refused.stderr and "--mix" in refused.stderr


def test_retrain_publishes_a_gated_version_and_gates_the_next_against_it(stores, address, tmp_path):
    """The first retrain publishes a gated version; the second warm-starts its shared stage from that version's
    shared head (its first E-step's training log-likelihood is that head's, on the training rows) and is gated
    against the version's score on the validation store; both versions serve ``predict``."""
    train, test = stores
    registry = tmp_path / "registry"
    common = ("--registry", str(registry), "--store", train, "--validation", test, "--attribute-factors", "2")
    common += ("--max-iter", "2", "--scheduler", address, "--json")
    first = _cli("retrain", *common)
    assert first.returncode == 0, first.stderr
    published = json.loads(first.stdout)
    assert published["published"] and published["version"] == 1 and published["gate"]["current"] is None
    head = load_checkpoint(f"{registry}@1").model
    assert isinstance(head, GatedHead) and head.reference is not None

    work = tmp_path / "work"
    second = _cli("retrain", *common, "--tolerance", "0.5", "--work-dir", str(work))
    assert second.returncode == 0, second.stderr
    gated = json.loads(second.stdout)
    assert gated["published"] and gated["version"] == 2 and gated["previous"] == 1
    # The gate scored the current version, the gated one, on the validation store: the score it was published with
    # (summed in another order).
    assert gated["gate"]["current"] == pytest.approx(published["gate"]["candidate"], rel=1e-12)
    assert gated["gate"]["store"] == test and not gated["gate"]["in_sample"]
    assert load_checkpoint(f"{registry}@2").model.kind == "gated"
    # The shared stage started from the version's shared head: its first E-step scored the training rows under it.
    shared = load_checkpoint(work / "model" / "shared", "latest")
    store = open_store(train, window=head.context_length)
    totals = head.reference.score([Block(store.read_rows(0, store.num_rows), None)])
    first_iteration = shared.meta["history"][0]
    assert first_iteration["n_obs"] == store.num_rows
    assert first_iteration["mean_log_likelihood"] == pytest.approx(totals.log_lik / totals.weight, rel=1e-9)
    for ref in (f"{registry}@1", f"{registry}@latest"):
        done = _cli(
            "predict", ref, test, "--out", str(tmp_path / f"{ref[-1]}.jsonl"), "--top", "2", "--scheduler", address
        )
        assert done.returncode == 0, done.stderr


def test_evaluate_of_a_store_of_attributes_the_head_lacks_folds_them_in(stores, model, address, tmp_path):
    """A store whose every row is of a package the head never saw has no gated figures: ``evaluate`` says n/a for
    them (in text and as null in JSON) and folds the package in."""
    train, _ = stores
    new = str(tmp_path / "new.zarr")
    corpus = package_corpus(tmp_path / "new", (NEW_PACKAGE,))
    done = _cli("ingest", "--text", corpus, "--attribute-by", "directory", "--like", train, new, "--json")
    assert done.returncode == 0, done.stderr
    options = ("--fold-in", "--fold-in-iterations", "3", "--scheduler", address)
    done = _cli("evaluate", model, new, *options, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"]["perplexity"] is None and report["model"]["rows"] == 0
    assert not report["by_attribute"][NEW_PACKAGE]["known"]
    assert report["fold_in"][NEW_PACKAGE]["perplexity"] > 1
    done = _cli("evaluate", model, new, *options)
    assert done.returncode == 0, done.stderr
    (head_line,) = [line for line in done.stdout.splitlines() if line.startswith("head ")]
    assert head_line.split()[1:] == ["n/a", "n/a", "n/a"], head_line
    assert "perplexity: gated n/a, shared n/a" in done.stdout
    assert f"folded in {NEW_PACKAGE}: perplexity " in done.stdout
