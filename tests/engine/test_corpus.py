"""One vocabulary per corpus: ``fit --validation``, ``fit --init-from``, ``evaluate``, ``retrain``, ``sample``,
``neighbours`` and ``predict --stream`` refuse a store
whose vocabulary or embedding table differs from the training store's, as CLI subprocesses, on one line naming both
stores and the fix.

The refusals come before any cluster is reached (the commands are pointed at a port nothing listens on), and
nothing is written: no model directory, no registry version.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dist_respattn import random_distribution
from dist_respattn.engine import ModelDir
from dist_respattn.engine.loop import store_record
from dist_respattn.registry import Registry
from dist_respattn.store import TripleStore, WriteOptions, check_same_corpus, write_text

COMMAND = str(Path(sys.executable).parent / "dist-respattn")
#: Nothing listens here: a command that got past its checks would fail to connect, not succeed.
NOWHERE = "tcp://127.0.0.1:9"
VOCAB, N, DIM = 40, 3, 4
LAYOUT = WriteOptions(chunk_rows=1024, partition_rows=2048)


def text(words: list[str], repeats: int) -> str:
    return " ".join(word for i in range(repeats) for word in words[i % len(words) :] + words[: i % len(words)])


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    """``train``: a text store; ``other``: one made by a second ingest over other text (its own vocabulary of
    the same size, so the same S); ``like``: that other text written with train's vocabulary (``like=``)."""
    root = tmp_path_factory.mktemp("corpora")
    words = [f"w{i}" for i in range(60)]
    (root / "a").mkdir()
    (root / "b").mkdir()
    (root / "a" / "one.txt").write_text(text(words, 30))
    (root / "b" / "two.txt").write_text(text(words[::-1], 30) + " " + " ".join(words[:7] * 50))
    train = write_text(root / "train.zarr", [root / "a"], N, vocab_size=VOCAB, dim=DIM, options=LAYOUT)
    other = write_text(root / "other.zarr", [root / "b"], N, vocab_size=VOCAB, dim=DIM, options=LAYOUT)
    like = write_text(root / "like.zarr", [root / "b"], None, like=train, options=LAYOUT)
    assert train.schema == other.schema == like.schema  # same shape: only the vocabulary tells them apart
    return {"train": str(train.location), "other": str(other.location), "like": str(like.location)}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *args], capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=120, check=False
    )


def assert_refused(result: subprocess.CompletedProcess[str], command: str, *stores: str, remedy: str = "") -> str:
    """Exit 2, nothing on stdout, one line on stderr naming every store and both fixes (or, given, ``remedy``)."""
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"dist-respattn {command}: error: "), line
    for store in stores:
        assert store in line, (store, line)
    assert "the vocabularies differ" in line, line
    if remedy:
        assert line.endswith(remedy) and "--like" not in line, line
    else:
        assert "--like" in line and "dist-respattn split" in line, line
    return line


def test_the_like_store_shares_the_corpus_and_the_other_does_not(corpora):
    train, like, other = (TripleStore.open(corpora[k]) for k in ("train", "like", "other"))
    check_same_corpus(train, like, reference_role="training store", other_role="validation store")
    assert like.vocabulary()["tokens"] == train.vocabulary()["tokens"]
    assert (like.embeddings() == train.embeddings()).all()
    assert train.identity()["vocabulary"] != other.identity()["vocabulary"]


@pytest.mark.slow
def test_fit_refuses_a_validation_store_of_another_vocabulary(corpora, tmp_path):
    model_dir = tmp_path / "model"
    result = run(
        "fit", corpora["train"], "--model-dir", str(model_dir), "--validation", corpora["other"], "--scheduler", NOWHERE
    )
    line = assert_refused(result, "fit", corpora["train"], corpora["other"])
    assert "validation store" in line and "training store" in line
    assert not model_dir.exists()


def checkpoint_of(corpora: dict[str, str], folder: Path) -> Path:
    """A model directory holding one checkpoint of a head fitted (as its JSON says) on the train store."""
    train = TripleStore.open(corpora["train"])
    s = train.schema
    model = random_distribution(s.num_symbols, s.context_length, s.query_dim, s.num_targets, seed=0)
    meta = {"iteration": 1, "state": "max_iter", "store": store_record(train), "validation": None, "history": []}
    ModelDir(folder).commit("ckpt-000001-0000abcd", model, meta, latest={"iteration": 1}, best=None, keep_best=None)
    return folder


@pytest.mark.slow
def test_evaluate_refuses_a_store_of_another_vocabulary(corpora, tmp_path):
    model_dir = checkpoint_of(corpora, tmp_path / "model")
    result = run("evaluate", str(model_dir), corpora["other"], "--scheduler", NOWHERE)
    line = assert_refused(result, "evaluate", corpora["train"], corpora["other"])
    assert f"the store {corpora['other']} is not of the corpus of the model's training store" in line


@pytest.mark.slow
def test_sample_neighbours_and_predict_stream_refuse_a_store_of_another_vocabulary(corpora, tmp_path):
    """Each reads the words of ``--store`` (or of the predicted store): another corpus of the same S would print
    words of the wrong vocabulary. Refused with evaluate's line."""
    model_dir = str(checkpoint_of(corpora, tmp_path / "model"))
    other = corpora["other"]
    for command, args in (
        ("sample", ("sample", model_dir, "--store", other, "--tokens", "3")),
        ("neighbours", ("neighbours", model_dir, "w1", "--store", other)),
        ("predict", ("predict", model_dir, other, "--stream")),
    ):
        line = assert_refused(run(*args), command, corpora["train"], other)
        assert f"the store {other} is not of the corpus of the model's training store" in line


@pytest.mark.slow
def test_fit_refuses_to_warm_start_from_a_model_of_another_vocabulary(corpora, tmp_path):
    """``--init-from`` a model fitted on train, onto a store of another vocabulary: its emission rows would be
    read with other ids. Refused, naming both stores and the fix (another model, not another store); nothing is
    written."""
    warm = checkpoint_of(corpora, tmp_path / "warm")
    model_dir = tmp_path / "model"
    args = ["--model-dir", str(model_dir), "--init-from", str(warm), "--scheduler", NOWHERE]
    result = run("fit", corpora["other"], *args)
    remedy = "give --init-from a model fitted on a store of this corpus (fit one on it first)"
    line = assert_refused(result, "fit", corpora["train"], corpora["other"], remedy=remedy)
    assert f"the training store of --init-from {warm}" in line
    assert not model_dir.exists()


@pytest.mark.slow
def test_retrain_refuses_a_store_of_another_vocabulary_and_publishes_nothing(corpora, tmp_path):
    registry = Registry(str(tmp_path / "registry"))
    model_dir = checkpoint_of(corpora, tmp_path / "model")
    folder = model_dir / "ckpt-000001-0000abcd"
    record = {
        "metrics": {"perplexity": 10.0},
        "provenance": {"store": store_record(TripleStore.open(corpora["train"]))},
    }
    with registry.lock() as lock:
        registry.publish(lock, (folder / "params.npz").read_bytes(), (folder / "meta.json").read_bytes(), record)
    for flag, store in (("--store", corpora["other"]), ("--validation", corpora["other"])):
        args = ["retrain", "--registry", str(registry), "--scheduler", NOWHERE]
        args += ["--store", corpora["like"], flag, store] if flag == "--validation" else [flag, store]
        assert_refused(run(*args), "retrain", corpora["train"], store)
    assert [v.number for v in registry.versions()] == [1]
