"""``dist_respattn.engine.evaluate`` and ``dist-respattn evaluate`` on a real LocalCluster.

The head's figures are checked against numpy in this process; the unigram and add-k bigram baselines
against counts taken straight from the token streams the stores were written from; the command line
as a subprocess attached to this module's scheduler.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import distributed
import numpy as np
import pytest

from dist_respattn.engine import FitError, FitSettings, evaluate, fit, load_model
from dist_respattn.engine.evaluate import DEFAULT_BASELINE_K
from dist_respattn.store import TripleStore, WriteOptions, write_arrays, write_tokens

from .conftest import SMALL, small_truth

COMMAND = str(Path(sys.executable).parent / "dist-respattn")

#: The token stores: a Markov chain over V ids, windows of N_TOK tokens, D_TOK-dimensional queries.
V, N_TOK, D_TOK = 12, 3, 4
TOKENS = WriteOptions(chunk_rows=2048, partition_rows=4096)


def read_all(path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Every row of a store in order: ``(context, query, target, weight or None)``."""
    store = TripleStore.open(path)
    parts = [store.read_partition(p) for p in range(store.num_partitions)]
    weight = None if parts[0].weight is None else np.concatenate([p.weight for p in parts])
    context, query, target = (np.concatenate([getattr(p, n) for p in parts]) for n in ("context", "query", "target"))
    return context, query, target, weight


def head_in_process(model, path) -> dict[str, float]:
    """The head's figures on a store, with numpy: weighted means of the joint log-likelihood and of
    ``log predict_proba[target]``, and the weight of rows whose target is the arg-max (first on ties)."""
    context, query, target, weight = read_all(path)
    w = np.ones(target.shape[0]) if weight is None else weight.astype(np.float64)
    proba = model.predict_proba(context, query)
    log_p = np.log(proba[np.arange(target.shape[0]), target])
    target_log_prob = float(w @ log_p / w.sum())
    return {
        "mean_log_likelihood": float(w @ model.seq_log_density((context, query, target)) / w.sum()),
        "target_log_prob": target_log_prob,
        "perplexity": float(np.exp(-target_log_prob)),
        "accuracy": float(w @ (np.argmax(proba, axis=1) == target) / w.sum()),
    }


def assert_figures(got: dict[str, float], expected: dict[str, float]) -> None:
    assert set(got) == set(expected)
    for key in ("mean_log_likelihood", "target_log_prob", "perplexity"):
        if key in expected:
            assert got[key] == pytest.approx(expected[key], rel=1e-12), key
    assert got["accuracy"] == pytest.approx(expected["accuracy"], rel=1e-14, abs=0), "accuracy"


# ------------------------------------------------------------------------------------- the head


@pytest.mark.parametrize("seed", [0, 3], ids=["true-head", "wrong-head"])
def test_evaluate_equals_numpy_on_the_validation_store(small_validation_store, client, seed):
    """Mean log-likelihood per row, target log-probability, perplexity and accuracy of
    ``predict_proba`` computed on the cluster equal numpy's on all rows, for the head the rows came
    from and for another head (which must score worse)."""
    model = small_truth(seed=seed)
    evaluation = evaluate(model, small_validation_store, client=client)
    assert evaluation.rows == 5_000
    assert evaluation.weight == 5_000.0
    assert evaluation.store == str(TripleStore.open(small_validation_store).location)
    assert_figures(evaluation.model, head_in_process(model, small_validation_store))
    if seed != 0:
        truth = evaluate(small_truth(), small_validation_store, client=client)
        assert evaluation.model["perplexity"] > truth.model["perplexity"]
        assert evaluation.model["mean_log_likelihood"] < truth.model["mean_log_likelihood"]


def test_evaluate_weights_rows(small_validation_store, client, tmp_path):
    """On a weighted store every figure, the head's and the unigram baseline's (counted in-sample),
    is a weighted mean, and the reported weight is the weights' sum."""
    context, query, target, _ = read_all(small_validation_store)
    weight = np.random.default_rng(4).uniform(0.1, 3.0, size=target.shape[0]).astype(np.float32)
    path = tmp_path / "weighted.zarr"
    write_arrays(path, context, query, target, weight, num_symbols=30, num_targets=12, options=SMALL)
    model = small_truth()
    evaluation = evaluate(model, path, client=client)

    w = weight.astype(np.float64)
    assert evaluation.weight == pytest.approx(float(w.sum()), rel=1e-12)
    assert_figures(evaluation.model, head_in_process(model, path))
    counts = np.bincount(target, weights=w, minlength=12)
    assert_figures(evaluation.baselines["unigram"], baseline_figures(counts, counts))
    assert set(evaluation.baselines) == {"unigram"}  # rows not made from tokens: no bigram
    assert evaluation.baseline_counts_from == {"store": str(TripleStore.open(path).location), "in_sample": True}


def test_evaluate_refuses_a_model_of_another_shape(small_validation_store, client):
    """A head whose (S, N, D, T) differs from the store's is a FitError naming both shapes."""
    from dist_respattn import random_distribution

    with pytest.raises(FitError, match=r"\(30, 4, 5, 13\).*\(30, 4, 5, 12\)"):
        evaluate(random_distribution(30, 4, 5, 13, seed=0), small_validation_store, client=client)


# ------------------------------------------------------------------------------------ baselines


def markov_tokens(length: int, seed: int) -> np.ndarray:
    """A stream from a fixed sparse Markov chain over V ids (so the previous token predicts the next)."""
    transition = np.random.default_rng(100).dirichlet(np.full(V, 0.2), size=V)
    cumulative = np.cumsum(transition, axis=1)
    rng = np.random.default_rng(seed)
    draws = rng.random(length)
    tokens = np.empty(length, dtype=np.int64)
    tokens[0] = 0
    for i in range(1, length):
        tokens[i] = min(int(np.searchsorted(cumulative[tokens[i - 1]], draws[i], side="right")), V - 1)
    return tokens


def window_counts(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Target counts of a stream's windows: unigram (V,) and by previous token (V, V).

    Window ``j`` has context ``tok[j : j+N]`` and target ``tok[j+N]``: its previous token is ``tok[j+N-1]``.
    """
    target, previous = tokens[N_TOK:], tokens[N_TOK - 1 : -1]
    unigram = np.bincount(target, minlength=V).astype(np.float64)
    bigram = np.zeros((V, V))
    np.add.at(bigram, (previous, target), 1.0)
    return unigram, bigram


def baseline_figures(train: np.ndarray, scored: np.ndarray, k: float = DEFAULT_BASELINE_K) -> dict[str, float]:
    """Add-k predictive figures of counts ``train`` on counts ``scored``: unigram for (T,) counts, bigram
    (rows: previous token) for (S, T) counts; accuracy from the arg-max guess (first on ties)."""
    probs = (train + k) / (train.sum(axis=-1, keepdims=True) + train.shape[-1] * k)
    total = scored.sum()
    log_prob = float(np.sum(scored * np.log(probs)) / total)
    guess = np.argmax(probs, axis=-1)
    correct = scored[guess] if scored.ndim == 1 else scored[np.arange(scored.shape[0]), guess].sum()
    return {"target_log_prob": log_prob, "perplexity": float(np.exp(-log_prob)), "accuracy": float(correct / total)}


@pytest.fixture(scope="module")
def token_fit(client, tmp_path_factory) -> dict:
    """Train and validation token stores from one Markov chain, and a 2-iteration fit on the train store."""
    root = tmp_path_factory.mktemp("tokens")
    train_tokens, val_tokens = markov_tokens(20_000, seed=1), markov_tokens(6_000, seed=2)
    train = write_tokens(root / "train.zarr", train_tokens, N_TOK, num_symbols=V, dim=D_TOK, options=TOKENS)
    val = write_tokens(root / "val.zarr", val_tokens, N_TOK, num_symbols=V, dim=D_TOK, options=TOKENS)
    model_dir = root / "model"
    result = fit(train, model_dir=model_dir, client=client, settings=FitSettings(max_iter=2, tol=0))
    return {
        "train": str(train.location),
        "val": str(val.location),
        "train_counts": window_counts(train_tokens),
        "val_counts": window_counts(val_tokens),
        "model_dir": str(model_dir),
        "result": result,
    }


def test_baselines_count_the_training_store_named_by_the_checkpoint(token_fit, client):
    """Evaluating a model directory on another token store: the unigram and add-k bigram are fitted on
    the training store the checkpoint records and scored on the evaluated store's windows (previous
    token = last context id), exactly as numpy does it from the token streams."""
    evaluation = evaluate(token_fit["model_dir"], token_fit["val"], client=client)
    assert evaluation.baseline_counts_from == {"store": token_fit["train"], "in_sample": False}
    (train_unigram, train_bigram), (val_unigram, val_bigram) = token_fit["train_counts"], token_fit["val_counts"]
    assert evaluation.rows == val_unigram.sum() == 6_000 - N_TOK
    assert set(evaluation.baselines) == {"unigram", "bigram"}
    assert_figures(evaluation.baselines["unigram"], baseline_figures(train_unigram, val_unigram))
    assert_figures(evaluation.baselines["bigram"], baseline_figures(train_bigram, val_bigram))
    # The chain's structure is in the data: the previous token predicts the next better than nothing.
    assert evaluation.baselines["bigram"]["perplexity"] < 0.8 * evaluation.baselines["unigram"]["perplexity"]
    # The head's own figures are those of the checkpoint's model.
    assert_figures(evaluation.model, head_in_process(load_model(token_fit["model_dir"]), token_fit["val"]))


def test_baselines_are_in_sample_without_a_training_store(token_fit, client):
    """A model given as a distribution (no checkpoint, so no training store), or a model directory
    evaluated on its own training store, takes the baseline counts from the evaluated store itself
    and says it is in-sample."""
    val_unigram, val_bigram = token_fit["val_counts"]
    evaluation = evaluate(token_fit["result"].model, token_fit["val"], client=client)
    assert evaluation.baseline_counts_from == {"store": token_fit["val"], "in_sample": True}
    assert_figures(evaluation.baselines["unigram"], baseline_figures(val_unigram, val_unigram))
    assert_figures(evaluation.baselines["bigram"], baseline_figures(val_bigram, val_bigram))

    on_train = evaluate(token_fit["model_dir"], token_fit["train"], client=client)
    assert on_train.baseline_counts_from == {"store": token_fit["train"], "in_sample": True}
    train_unigram, train_bigram = token_fit["train_counts"]
    assert_figures(on_train.baselines["unigram"], baseline_figures(train_unigram, train_unigram))
    assert_figures(on_train.baselines["bigram"], baseline_figures(train_bigram, train_bigram))


def test_synthetic_store_has_no_bigram_baseline(small_store, small_validation_store, client, tmp_path):
    """Rows not cut from a token stream have no previous token: only the unigram baseline is given,
    counted on the training store of the model directory."""
    fit(small_store, model_dir=tmp_path / "model", client=client, settings=FitSettings(max_iter=1))
    evaluation = evaluate(tmp_path / "model", small_validation_store, client=client)
    assert set(evaluation.baselines) == {"unigram"}
    assert evaluation.baseline_counts_from == {"store": str(TripleStore.open(small_store).location), "in_sample": False}
    train_target, val_target = read_all(small_store)[2], read_all(small_validation_store)[2]
    expected = baseline_figures(np.bincount(train_target, minlength=12), np.bincount(val_target, minlength=12))
    assert_figures(evaluation.baselines["unigram"], expected)


# ---------------------------------------------------------------------------------- the command


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
def test_cli_evaluate_runs_on_an_existing_scheduler(token_fit, client):
    """``dist-respattn evaluate MODEL STORE --json --scheduler ADDRESS`` prints the same JSON as
    ``evaluate`` in this process, its tasks run on this module's workers (no cluster of its own), and
    the cluster is still up afterwards; without ``--json`` it prints the table."""
    address = client.scheduler.address
    with distributed.get_task_stream(client=client) as stream:
        result = run("evaluate", token_fit["model_dir"], token_fit["val"], "--json", "--scheduler", address)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == evaluate(token_fit["model_dir"], token_fit["val"], client=client).to_json()
    assert set(report["baselines"]) == {"unigram", "bigram"}
    assert any(str(r["key"]).startswith("respattn-evaluate-0-") for r in stream.data)
    assert client.submit(sum, [1, 2], pure=False).result() == 3
    assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2

    text = run("evaluate", token_fit["model_dir"], token_fit["val"], "--scheduler", address)
    assert text.returncode == 0, text.stderr
    assert f"connected to the scheduler at {address}" in text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"{token_fit['val']}: {report['rows']:,} rows"
    assert [line.split()[0] for line in lines[2:5]] == ["head", "unigram", "bigram"]
    assert f"baseline counts from {token_fit['train']}" in text.stdout


def test_cli_evaluate_shape_mismatch_is_a_one_line_error(token_fit, small_validation_store):
    """A model whose shape does not fit the store: exit status 2 and one line on stderr naming both
    shapes, nothing on stdout (the check comes before any cluster is reached)."""
    result = run(
        "evaluate", token_fit["model_dir"], small_validation_store, "--json", "--scheduler", "tcp://127.0.0.1:9"
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("dist-respattn evaluate: error: the model has (S, N, D, T) = (12, 3, 4, 12)")
    assert "(30, 4, 5, 12)" in result.stderr
