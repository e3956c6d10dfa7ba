"""``fit --hops H``: the chain of hops picked on the command line, its bad values refused, and a chain fitted,
evaluated and predicted by the real command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.cli import build_parser
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.model.heads.hops import HopsSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from tests.test_cli import COMMAND, run, run_here


def parsed(*flags: str) -> object:
    return build_parser().parse_args(["fit", "train.zarr", "--model-dir", "model", *flags])


def test_hops_makes_a_chain_over_the_single_head_the_other_options_describe() -> None:
    base = SingleHopSpec(sigma2=0.5, position_buckets=4)
    spec = spec_from_args(parsed("--hops", "3"), base, None)
    assert isinstance(spec, HopsSpec) and spec.single == base and spec.hops == 3 and not spec.softmax
    assert spec_from_args(parsed("--hops", "1"), base, None) == base  # one hop: the single head itself


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--hops", "0"), "--hops 0: expected a whole number of hops >= 1"),
        (("--hops", "-2"), "--hops -2: expected a whole number of hops >= 1"),
        (("--hops", "2", "--head", "copy"), "--hops 2 makes a chain of hops: it does not combine with --head copy"),
        (("--hops", "2", "--mixture-components", "2"), "hops and mixture heads were given together"),
    ],
)
def test_bad_hops_are_refused_naming_the_flag(flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        spec_from_args(parsed(*flags), SingleHopSpec(), None)


def test_hops_refuses_a_learned_gate_variance_and_a_non_integer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CommandError, match=r"--hops chooses the gate variance or keeps it fixed: .* --learn-sigma2"):
        spec_from_args(parsed("--hops", "2"), SingleHopSpec(estimate_sigma2=True), None)
    with pytest.raises(SystemExit) as exited:
        parsed("--hops", "two")
    assert exited.value.code == 2
    assert "argument --hops: invalid int value: 'two'" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_hops_are_one_line_before_anything_is_written(tmp_path: Path) -> None:
    result = run("fit", str(tmp_path / "train.zarr"), "--model-dir", str(tmp_path / "model"), "--hops", "0")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "dist-respattn fit: error: --hops 0: expected a whole number of hops >= 1 (1 is the single head)"
    ]
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_fit_hops_then_evaluate_predict_and_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_worker_address: str
) -> None:
    """A token stream of recurring phrases: a chain of two hops fits on a cluster, and evaluate, predict --top and
    predict --stream read the result."""
    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, 40, size=6) for _ in range(5)]
    tokens = np.concatenate([phrases[rng.integers(0, 5)] for _ in range(1500)]).astype(np.int64)
    np.save(tmp_path / "tokens.npy", tokens)
    stores = tmp_path / "split"
    made = run_here(capsys, "split", "--tokens", str(tmp_path / "tokens.npy"), "--context", "8", "--block-tokens",
                    "500", "--dim", "4", str(stores))  # fmt: skip
    assert made.returncode == 0, made.stderr
    model = tmp_path / "model"
    address = one_worker_address  # the cluster the command-line tests share (tests/conftest.py)
    fitted = run_here(capsys, "fit", str(stores / "train.zarr"), "--model-dir", str(model), "--hops", "2",
                      "--sigma2", "0.5", "--max-iter", "3", "--scheduler", address, "--json")  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    report = json.loads(fitted.stdout)
    assert report["kind"] == "hops" and report["n_hops"] == 2, report
    # --sigma2 given stays fixed; the emission's strengths, not given, are chosen on the fit's held-out rows.
    chosen = report["hyperparameters"]
    assert chosen["sigma2"] == 0.5 and {"emission_strength", "type_strength"} <= chosen.keys(), report
    assert "emission prior strength" in report["choice"] and report["heldout"], report
    evaluated = run_here(capsys, "evaluate", str(model), str(stores / "test.zarr"), "--scheduler", address,
                         "--json")  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    scores = json.loads(evaluated.stdout)
    predicted = run_here(capsys, "predict", str(model), str(stores / "test.zarr"), "--top", "2", "--out",
                         str(tmp_path / "top.jsonl"), "--scheduler", address)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    rows = [json.loads(line) for line in (tmp_path / "top.jsonl").read_text().splitlines()]
    assert rows and all(len(row["ids"]) == 2 for row in rows)
    assert scores["model"]["perplexity"] < scores["baselines"]["unigram"]["perplexity"], scores
    history = " ".join(str(t) for t in phrases[0])
    streamed = subprocess.run([COMMAND, "predict", str(model), str(stores / "train.zarr"), "--stream", "--top", "2"],
                              input=history, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert len(lines) == 6 and all(len(line["ids"]) == 2 for line in lines)
