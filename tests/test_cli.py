"""The ``dist-respattn`` command, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dist_respattn

COMMAND = str(Path(sys.executable).parent / "dist-respattn")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_version_and_help():
    version = run("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"dist-respattn {dist_respattn.__version__}"
    helped = run("--help")
    assert helped.returncode == 0
    assert "demo" in helped.stdout


def test_no_command_prints_help():
    result = run()
    assert result.returncode == 0
    assert "usage: dist-respattn" in result.stdout


@pytest.mark.slow
def test_demo_recovers_the_true_head(tmp_path):
    """The main job: stores made on the spot, a fit on an embedded cluster, the truth recovered."""
    result = run(
        "demo", "--dir", str(tmp_path), "--rows", "30000", "--symbols", "40", "--targets", "12", "--seed", "3",
        "--workers", "2", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rows"] == 30000
    assert report["converged"] is True
    assert report["model_dir"] == str(tmp_path / "model")
    assert report["dashboard"].startswith("http://127.0.0.1:")
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
        "demo", "--dir", str(tmp_path), "--rows", "5000", "--symbols", "20", "--targets", "5", "--max-iter", "3"
    )
    assert result.returncode == 0, result.stderr
    assert "started a local cluster" in result.stderr
    assert "iteration 1: log-likelihood" in result.stderr
    assert "recovery of the store's true head" in result.stdout
    assert f"model: {tmp_path / 'model'}" in result.stdout


def test_bad_argument_is_a_one_line_error():
    result = run("demo", "--rows", "0")
    assert result.returncode == 2
    assert "--rows: 0: expected a positive integer" in result.stderr
