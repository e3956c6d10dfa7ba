"""``dist_respattn.engine.evaluate`` and ``dist-respattn evaluate`` on a real LocalCluster.

The head's figures are checked against numpy in this process; the n-gram baselines against
``fit_baselines`` (itself checked against a dense reference in ``tests/model/test_ngram.py``) on pair
counts taken straight from the token streams the stores were written from, so what is checked here is
which rows are counted, tuned on and scored; the command line as a subprocess attached to this
module's scheduler.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import distributed
import numpy as np
import pytest

from dist_respattn.baselines.kneser_ney import NGramCounts, fit_kneser_ney
from dist_respattn.baselines.ngram import MODEL_LABELS, MODEL_NAMES, fit_baselines
from dist_respattn.engine import FitError, FitSettings, evaluate, fit, load_model
from dist_respattn.engine.evaluate import DEFAULT_BASELINE_K
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.store import TripleStore, WriteOptions, write_arrays, write_stream_tokens, write_tokens

from .conftest import SMALL, small_truth

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

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
    assert set(expected) <= set(got)
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
    assert evaluation.baseline_counts_from == {
        "store": str(TripleStore.open(path).location), "in_sample": True, "tuned_on": None,
    }  # fmt: skip


def test_evaluate_refuses_a_model_of_another_shape(small_validation_store, client):
    """A head whose (S, N, D, T) differs from the store's is a FitError naming both shapes."""
    from dist_respattn import random_distribution

    with pytest.raises(FitError, match=r"\(30, 4, 5, 13\).*\(30, 4, 5, 12\)"):
        evaluate(random_distribution(30, 4, 5, 13, seed=0), small_validation_store, client=client)


def test_a_token_stream_store_is_named_by_the_window_it_records(client, tmp_path):
    """A token-stream store is read with the model's window whatever N it records: the evaluation says both when they
    differ, and a refused model is told the store's own shape (not the store's S, D and T at the model's N) and
    what differs."""
    from dist_respattn import random_distribution

    path = tmp_path / "six.zarr"
    write_stream_tokens(path, markov_tokens(600, 1), 6, num_symbols=V, dim=D_TOK, seed=0, options=TOKENS)
    evaluation = evaluate(random_distribution(V, N_TOK, D_TOK, V, seed=0), path, client=client)
    assert evaluation.rows == 600 - N_TOK
    assert evaluation.window == {"read_with": N_TOK, "recorded": 6} == evaluation.to_json()["window"]
    assert evaluation.summary().splitlines()[0] == (
        f"{path}: {600 - N_TOK:,} rows, windows of the model's N = {N_TOK} (the store records N = 6, its writer's "
        "default: a token-stream store is read with any window)"
    )
    with pytest.raises(FitError) as caught:
        evaluate(random_distribution(V + 1, N_TOK, D_TOK, V + 1, seed=0), path, client=client)
    assert str(caught.value) == (
        f"the model has (S, N, D, T) = ({V + 1}, {N_TOK}, {D_TOK}, {V + 1}) but the store {path} has "
        f"({V}, 6, {D_TOK}, {V}) (its N = 6 is only a default: a token-stream store is read with any window, here "
        f"N = {N_TOK}): S and T differ, and a model only fits stores of its own S, D and T"
    )


def test_the_header_counts_the_rows_scored_not_those_of_weight_0(client, tmp_path):
    """A store whose rows of weight 0 are context only (a held-out sequence's history): the figures are of the rows of
    positive weight, and the header counts those, beside the store's rows; a store without such rows, its rows."""
    from dist_respattn import random_distribution

    weights = np.zeros(600, dtype=np.float32)
    weights[::10] = 1.0
    path = tmp_path / "weighted.zarr"
    tokens = markov_tokens(600, 2)
    write_stream_tokens(path, tokens, N_TOK, num_symbols=V, dim=D_TOK, seed=0, weights=weights, options=TOKENS)
    head = random_distribution(V, N_TOK, D_TOK, V, seed=0)
    evaluation = evaluate(head, path, client=client)
    rows, scored = 600 - N_TOK, int(np.count_nonzero(weights[N_TOK:]))
    assert (evaluation.rows, evaluation.scored_rows, evaluation.weight) == (rows, scored, scored)
    assert evaluation.to_json()["scored_rows"] == scored
    assert evaluation.summary().splitlines()[0] == (
        f"{path}: {scored} rows scored, of {rows} (the other {rows - scored} weigh 0: context only)"
    )
    whole = tmp_path / "whole.zarr"
    write_stream_tokens(whole, tokens, N_TOK, num_symbols=V, dim=D_TOK, seed=0, options=TOKENS)
    evaluation = evaluate(head, whole, client=client)
    assert evaluation.scored_rows == evaluation.rows == rows
    assert evaluation.summary().splitlines()[0] == f"{whole}: {rows} rows"


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


def window_pairs(tokens: np.ndarray, rows: np.ndarray | None = None) -> PairCounts:
    """The (previous token, target) pairs of a stream's windows (those where ``rows`` holds, when given).

    Window ``j`` has context ``tok[j : j+N]`` and target ``tok[j+N]``: its previous token is ``tok[j+N-1]``.
    """
    target, previous = tokens[N_TOK:], tokens[N_TOK - 1 : -1]
    if rows is not None:
        target, previous = target[rows], previous[rows]
    return PairCounts.from_rows(previous, target, None, num_symbols=V, num_targets=V)


def window_ngrams(tokens: np.ndarray, rows: np.ndarray | None = None) -> NGramCounts:
    """The 5-grams of a stream's windows (those where ``rows`` holds): N_TOK tokens of history, so their top n-grams
    are (N_TOK + 1)-grams."""
    history = np.lib.stride_tricks.sliding_window_view(tokens[:-1], N_TOK)
    target = tokens[N_TOK:]
    if rows is not None:
        history, target = history[rows], target[rows]
    lengths = np.full(target.size, N_TOK)
    return NGramCounts.from_rows(history, lengths, target, None, order=5, num_symbols=V, num_targets=V)


#: The Kneser-Ney n-grams evaluate adds on token stores by default.
NGRAM_KEYS = ("kneser_ney_3", "kneser_ney_4", "kneser_ney_5")


def ngram_figures(train: NGramCounts, validation: NGramCounts | None, scored: NGramCounts) -> dict:
    return {
        f"kneser_ney_{k}": fit_kneser_ney(
            train.truncated(k), validation=None if validation is None else validation.truncated(k)
        ).score(scored.truncated(k))
        for k in (3, 4, 5)
    }


def baseline_figures(train: np.ndarray, scored: np.ndarray, k: float = DEFAULT_BASELINE_K) -> dict[str, float]:
    """Add-k unigram figures of target counts ``train`` (T,) on counts ``scored`` (T,); accuracy from the
    arg-max guess (first on ties)."""
    probs = (train + k) / (train.sum() + train.shape[-1] * k)
    total = scored.sum()
    log_prob = float(np.sum(scored * np.log(probs)) / total)
    correct = scored[np.argmax(probs)]
    return {"target_log_prob": log_prob, "perplexity": float(np.exp(-log_prob)), "accuracy": float(correct / total)}


def assert_baselines(evaluation, expected: dict) -> None:
    """Every baseline's figures and parameters equal those ``fit_baselines`` gives on the expected pairs (and
    ``fit_kneser_ney`` on the expected n-grams)."""
    assert set(evaluation.baselines) == {*MODEL_NAMES, *NGRAM_KEYS}
    for name in (*MODEL_NAMES, *NGRAM_KEYS):
        got, want = evaluation.baselines[name], expected[name].to_json()
        for key in ("target_log_prob", "perplexity"):
            assert got[key] == pytest.approx(want[key], rel=1e-12), (name, key)
        assert got["accuracy"] == pytest.approx(want["accuracy"], rel=1e-14, abs=0), name
        assert got["parameters"] == want["parameters"], name


@pytest.fixture(scope="module")
def token_fit(client, tmp_path_factory) -> dict:
    """Train, validation and test token stores from one Markov chain (one embedding table), a 2-iteration fit
    on the train store validated on the validation store, and one without a validation store."""
    root = tmp_path_factory.mktemp("tokens")
    streams = {"train": markov_tokens(20_000, 1), "val": markov_tokens(6_000, 2), "test": markov_tokens(6_000, 3)}
    stores = {
        name: write_tokens(root / f"{name}.zarr", tokens, N_TOK, num_symbols=V, dim=D_TOK, options=TOKENS)
        for name, tokens in streams.items()
    }
    settings = FitSettings(max_iter=2, tol=0)
    result = fit(stores["train"], model_dir=root / "model", client=client, settings=settings, validation=stores["val"])
    fit(stores["train"], model_dir=root / "model-holdout", client=client, settings=settings)
    return {
        **{name: str(store.location) for name, store in stores.items()},
        "streams": streams,
        "model_dir": str(root / "model"),
        "holdout_model_dir": str(root / "model-holdout"),
        "result": result,
    }


def test_baselines_count_the_training_store_and_tune_on_its_validation_store(token_fit, client):
    """Evaluating a model directory on another token store: the baselines are fitted on the training store the
    checkpoint records, tuned on its validation store, and scored on the evaluated store's windows (previous
    token = last context id), exactly as from the token streams."""
    evaluation = evaluate(token_fit["model_dir"], token_fit["test"], client=client)
    assert evaluation.baseline_counts_from == {
        "store": token_fit["train"], "in_sample": False, "tuned_on": token_fit["val"],
    }  # fmt: skip
    streams = token_fit["streams"]
    assert evaluation.rows == 6_000 - N_TOK
    expected = fit_baselines(window_pairs(streams["train"]), validation=window_pairs(streams["val"]))
    ngrams = ngram_figures(*(window_ngrams(streams[name]) for name in ("train", "val", "test")))
    assert_baselines(evaluation, {**expected.score(window_pairs(streams["test"])), **ngrams})
    assert all(b["parameters"]["tuned_on"] == "validation" for k, b in evaluation.baselines.items() if k != "unigram")
    # A window of N_TOK = 3 tokens: the 5-gram sees no more than the 4-gram.
    assert evaluation.baselines["kneser_ney_5"]["perplexity"] == evaluation.baselines["kneser_ney_4"]["perplexity"]
    # The chain's structure is in the data: the previous token predicts the next better than nothing.
    assert evaluation.baselines["kneser_ney"]["perplexity"] < 0.8 * evaluation.baselines["unigram"]["perplexity"]
    # The head's own figures are those of the checkpoint's model.
    assert_figures(evaluation.model, head_in_process(load_model(token_fit["model_dir"]), token_fit["test"]))


def test_baselines_of_a_fit_without_validation_use_its_hold_out(token_fit, client):
    """A model fitted on the training store's hold-out is compared with baselines counted on the same training
    rows and tuned on the same held-out rows."""
    evaluation = evaluate(token_fit["holdout_model_dir"], token_fit["test"], client=client)
    assert evaluation.baseline_counts_from == {
        "store": token_fit["train"], "in_sample": False, "tuned_on": "the training store's hold-out",
    }  # fmt: skip
    streams = token_fit["streams"]
    windows = streams["train"].shape[0] - N_TOK
    held = HoldoutRule.for_rows(windows).held_out(0, windows)
    assert 0 < held.sum() < windows
    expected = fit_baselines(window_pairs(streams["train"], ~held), validation=window_pairs(streams["train"], held))
    train, tune = window_ngrams(streams["train"], ~held), window_ngrams(streams["train"], held)
    ngrams = ngram_figures(train, tune, window_ngrams(streams["test"]))
    assert_baselines(evaluation, {**expected.score(window_pairs(streams["test"])), **ngrams})


def test_baselines_are_in_sample_without_a_training_store(token_fit, client):
    """A model given as a distribution (no checkpoint, so no training store, nothing to tune on), or a model
    directory evaluated on its own training store, takes the baseline counts from the evaluated store itself
    and says it is in-sample."""
    streams = token_fit["streams"]
    evaluation = evaluate(token_fit["result"].model, token_fit["val"], client=client)
    assert evaluation.baseline_counts_from == {"store": token_fit["val"], "in_sample": True, "tuned_on": None}
    val = window_ngrams(streams["val"])
    expected = fit_baselines(window_pairs(streams["val"])).score(window_pairs(streams["val"]))
    assert_baselines(evaluation, {**expected, **ngram_figures(val, None, val)})
    assert evaluation.baselines["kneser_ney"]["parameters"]["tuned_on"].startswith("stated")

    on_train = evaluate(token_fit["model_dir"], token_fit["train"], client=client)
    assert on_train.baseline_counts_from == {
        "store": token_fit["train"],
        "in_sample": True,
        "tuned_on": token_fit["val"],
    }
    expected = fit_baselines(window_pairs(streams["train"]), validation=window_pairs(streams["val"]))
    train = window_ngrams(streams["train"])
    ngrams = ngram_figures(train, window_ngrams(streams["val"]), train)
    assert_baselines(on_train, {**expected.score(window_pairs(streams["train"])), **ngrams})


def test_synthetic_store_has_no_bigram_baseline(small_store, small_validation_store, client, tmp_path):
    """Rows not cut from a token stream have no previous token: only the unigram baseline is given, counted
    on the training rows of the model directory's training store (its hold-out left out, as in the fit)."""
    fit(small_store, model_dir=tmp_path / "model", client=client, settings=FitSettings(max_iter=1))
    evaluation = evaluate(tmp_path / "model", small_validation_store, client=client)
    assert set(evaluation.baselines) == {"unigram"}
    assert evaluation.baseline_counts_from["store"] == str(TripleStore.open(small_store).location)
    assert not evaluation.baseline_counts_from["in_sample"]
    train_target, val_target = read_all(small_store)[2], read_all(small_validation_store)[2]
    held = HoldoutRule.for_rows(train_target.shape[0]).held_out(0, train_target.shape[0])
    expected = baseline_figures(
        np.bincount(train_target[~held], minlength=12).astype(float), np.bincount(val_target, minlength=12)
    )
    assert_figures(evaluation.baselines["unigram"], expected)


# ---------------------------------------------------------------------------------- the command


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=timeout, check=False)


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
    assert set(report["baselines"]) == {*MODEL_NAMES, *NGRAM_KEYS}
    assert any(str(r["key"]).startswith("respattn-evaluate-0-") for r in stream.data)
    assert client.submit(sum, [1, 2], pure=False).result() == 3
    assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2

    text = run("evaluate", token_fit["model_dir"], token_fit["val"], "--scheduler", address, "--baseline-order", "3")
    assert text.returncode == 0, text.stderr
    assert f"connected to the scheduler at {address}" in text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"{token_fit['val']}: {report['rows']:,} rows"
    labels = ["head", *(MODEL_LABELS[name] for name in MODEL_NAMES), "Kneser-Ney 3-gram"]
    assert [line[:17].strip() for line in lines[2:8]] == labels
    three = report["baselines"]["kneser_ney_3"]
    assert lines[7].split()[2:4] == [f"{three['perplexity']:.4f}", f"{three['accuracy']:.2%}"]
    assert lines[8].startswith("head / Kneser-Ney perplexity: ")
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
