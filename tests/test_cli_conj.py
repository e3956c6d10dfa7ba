"""``fit --head conj``: the conjunction head fitted, evaluated and streamed by the real commands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.test_cli import COMMAND, run_here


@pytest.mark.slow
def test_fit_head_conj_then_evaluate_and_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_worker_address: str
) -> None:
    """A token stream whose next token the previous two decide: the conjunction head of order 3 fits on a cluster
    (the pair and triple strengths chosen on the held-out rows), beats the unigram and bigram baselines in
    ``evaluate``, and ``predict --stream`` reads it."""
    rng = np.random.default_rng(0)
    s = 30
    table = rng.dirichlet(np.full(s, 0.05), size=(s, s))
    stream = [0, 1]
    for _ in range(9000):
        stream.append(int(rng.choice(s, p=table[stream[-2], stream[-1]])))
    np.save(tmp_path / "tokens.npy", np.array(stream, dtype=np.int64))
    stores = tmp_path / "split"
    made = run_here(capsys, "split", "--tokens", str(tmp_path / "tokens.npy"), "--context", "4", "--block-tokens",
                    "300", "--dim", "4", str(stores))  # fmt: skip
    assert made.returncode == 0, made.stderr
    model = tmp_path / "model"
    address = one_worker_address  # the cluster the command-line tests share (tests/conftest.py)
    fitted = run_here(capsys, "fit", str(stores / "train.zarr"), "--model-dir", str(model), "--head", "conj",
                      "--conj-depth", "2", "--conj-order", "3", "--sigma2", "1", "--max-iter", "3", "--scheduler",
                      address, "--json")  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    report = json.loads(fitted.stdout)
    assert report["kind"] == "conj" and report["conj_depth"] == 2 and report["conj_pairs"] > 0, report
    assert report["conj_order"] == 3 and report["conj_triples"] > 0, report
    assert report["conj_triple_strength"] in (0.05, 0.2, 0.5, 1.0, 2.0, 5.0), report
    evaluated = run_here(capsys, "evaluate", str(model), str(stores / "test.zarr"), "--scheduler", address,
                         "--json")  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    scores = json.loads(evaluated.stdout)
    perplexity = scores["model"]["perplexity"]
    assert perplexity < scores["baselines"]["kneser_ney"]["perplexity"], scores
    streamed = subprocess.run([COMMAND, "predict", str(model), str(stores / "train.zarr"), "--stream", "--top", "2"],
                              input=" ".join(str(t) for t in stream[:5]), capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert len(lines) == 5 and all(len(line["ids"]) == 2 for line in lines)
