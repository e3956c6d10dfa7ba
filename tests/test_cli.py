"""The ``dist-respattn`` command, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dist_respattn
from dist_respattn.artifacts import load_checkpoint
from dist_respattn.cli import main

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command

COMMAND = str(Path(sys.executable).parent / "dist-respattn")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=timeout, check=False)


def run_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``dist-respattn ARGS`` as :func:`run` gives it, by the command's own ``main`` in this process: for the steps
    of a test that checks what a command does, not its process (each subprocess start re-imports the package)."""
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["dist-respattn", *args], status, out, err)


def test_version_and_help():
    version = run("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"dist-respattn {dist_respattn.__version__}"
    helped = run("--help")
    assert helped.returncode == 0
    assert "demo" in helped.stdout


@pytest.mark.slow
def test_demo_fits_the_standard_library_and_compares_it_with_the_baselines(tmp_path):
    """The main job: a slice of the Python standard library's source split into train, validation and test stores
    of one vocabulary, a fit on an embedded cluster, and the head's test perplexity beside every baseline's."""
    # Three iterations a stage (early stopping takes 8, 18, 6 and 5 here): the head's margins below stay wide (test
    # perplexity 11.6 fitted to the end, against 21 for Kneser-Ney and 40 for the unigram), most of it the
    # conjunction part's, whose counts are near their best after its first iterations.
    result = run(
        "demo", "--dir", str(tmp_path), "--max-tokens", "150000", "--vocab-size", "300", "--max-iter", "3",
        "--workers", "1", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["rows"]) == {"train", "validation", "test"} and min(report["rows"].values()) > 0
    assert report["model_dir"] == str(tmp_path / "model")
    assert report["state"] in ("early_stopped", "converged", "max_iter")
    assert report["heldout_rows"].startswith("the validation store")
    # What fit picks on a token-stream store: the recipe, its parts fitted first, then their stack's gate, and over
    # the stack a repeat gate (300 words: few enough targets) in the model directory.
    assert report["kind"] == "repeat" and {"single", "copy", "conj", "stack"} <= set(report)
    assert report["stack"]["model_dir"] == str(tmp_path / "model" / "stack")
    # Code repeats itself: the longer the file so far, the likelier its next token is one it has had.
    rates = report["repeat_rates"]
    assert len(rates) == 17 and rates[2] < 0.8 and rates[-1] > 0.9, rates
    # Code: the conjunction and copy heads share the stack's gate (the long single head is there for item sequences).
    gate = load_checkpoint(tmp_path / "model" / "stack").model.gate
    assert sum(gate) == pytest.approx(1.0) and gate[0] > 0 and gate[1] > 0
    test = report["test"]
    assert test["store"].endswith("test.zarr")
    bigrams = {"unigram", "add_k", "jelinek_mercer", "kneser_ney"}
    assert set(test["baselines"]) == bigrams | {"kneser_ney_3", "kneser_ney_4", "kneser_ney_5"}
    assert test["baseline_counts_from"]["tuned_on"].endswith("validation.zarr")
    head, baselines = test["model"]["perplexity"], {k: v["perplexity"] for k, v in test["baselines"].items()}
    # Real text: the recipe is far better than a unigram, and than a good bigram (its conjunction part sees the last
    # two tokens); the longer n-grams see more than the last token, and each order does better than the one below.
    assert head < 0.6 * baselines["unigram"]
    assert head < baselines["add_k"] and head < baselines["kneser_ney"], (head, baselines)
    assert baselines["kneser_ney"] > baselines["kneser_ney_3"] > baselines["kneser_ney_4"] > baselines["kneser_ney_5"]
    # The demo's text output (its split line, the table and the head / baseline ratios): the text run of
    # tests/test_cli_newcomer.py::test_the_demo_names_its_fit_page_and_prints_the_baselines_as_evaluate_does.


def test_demo_recovers_the_true_head(tmp_path):
    """``--synthetic``: stores sampled from a random head, a fit on an embedded cluster, the truth recovered."""
    result = run(
        "demo", "--synthetic", "--dir", str(tmp_path), "--rows", "30000", "--symbols", "40", "--targets", "12",
        "--seed", "3", "--workers", "1", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rows"] == 30000
    assert report["converged"] is True
    assert report["model_dir"] == str(tmp_path / "model")
    assert report["dashboard"] is None  # the embedded cluster's, shut with the demo (said at its start)
    recovery = report["recovery"]
    # 30k rows over 40 symbols: ~750 attended rows per symbol, so keys are within a few percent
    # and 12-way emission rows within ~0.1 total variation.
    assert recovery["key_rmse_relative"] < 0.05
    assert recovery["prior_l1"] < 0.05
    assert recovery["emission_tv_mean"] < 0.1
    assert abs(recovery["sigma2_ratio"] - 1.0) < 0.05
    scores = report["heldout_scores"]
    # The last model's held-out likelihood is the true head's, within noise; the best checkpoint (by
    # perplexity) predicts the targets about as well as the truth and far better than a unigram.
    assert report["heldout"]["mean_log_likelihood"] >= scores["true model"]["mean_log_likelihood"] - 0.05
    assert scores["fitted (best)"]["perplexity"] < 1.02 * scores["true model"]["perplexity"]
    assert scores["fitted (best)"]["perplexity"] < 0.8 * scores["unigram"]["perplexity"]


def test_demo_text_output_reports_progress_and_recovery(tmp_path):
    result = run(
        "demo", "--synthetic", "--dir", str(tmp_path), "--rows", "5000", "--symbols", "20", "--targets", "5",
        "--max-iter", "3", "--workers", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "started a local cluster" in result.stderr
    assert "iteration 1: held-out perplexity" in result.stderr
    assert "recovery of the store's true head" in result.stdout
    assert f"model: {tmp_path / 'model'}" in result.stdout


def test_bad_argument_is_a_one_line_error():
    result = run("demo", "--rows", "0")
    assert result.returncode == 2
    assert "--rows: 0: expected a positive integer" in result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--holdout-fraction", "0.7"), "--holdout-fraction = 0.7: expected a number in [0, 0.5)"),
        (
            ("--emission-strength", "0", "--type-strength", "0"),
            "--emission-strength and --type-strength are both 0",
        ),
    ],
    ids=["holdout-fraction", "strengths"],
)
def test_a_bad_fit_setting_is_named_by_its_flag(tmp_path, flags, message):
    """Settings are checked before any store or cluster is touched, and the error names the flag to change."""
    result = run("fit", str(tmp_path / "missing.zarr"), "--model-dir", str(tmp_path / "model"), *flags)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "model").exists()
