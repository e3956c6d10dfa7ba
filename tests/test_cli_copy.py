"""``fit --head``: a kind picked by name on the command line, and the copy head fitted, evaluated and predicted by
the real command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.cli import build_parser
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.model.heads.copy import CopySpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from tests.test_cli import COMMAND, run, run_here


def parsed(*flags: str) -> object:
    return build_parser().parse_args(["fit", "train.zarr", "--model-dir", "model", *flags])


def test_head_names_the_kind_and_the_other_options_describe_its_single_head() -> None:
    base = SingleHopSpec(sigma2=0.5, position_buckets=4)
    spec = spec_from_args(parsed("--head", "copy"), base, None)
    assert isinstance(spec, CopySpec) and spec.single == base
    assert spec_from_args(parsed("--head", "single"), base, None) == base
    assert spec_from_args(parsed(), base, None) == base
    kinds = "codebook, conj, copy, recipe, repeat, single, stack"
    with pytest.raises(CommandError, match=f"--head bogus: expected one of {kinds}"):
        spec_from_args(parsed("--head", "bogus"), base, None)
    with pytest.raises(CommandError, match="copy and mixture heads were given together"):
        spec_from_args(parsed("--head", "copy", "--mixture-components", "2"), SingleHopSpec(), None)


@pytest.mark.slow
def test_a_bad_head_is_one_line_before_anything_is_written(tmp_path: Path) -> None:
    result = run("fit", str(tmp_path / "train.zarr"), "--model-dir", str(tmp_path / "model"), "--head", "cpy")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "dist-respattn fit: error: --head cpy: expected one of codebook, conj, copy, recipe, repeat, single, stack "
        "(other kinds by their options: gated --attribute-factors F, hops --hops H, mixture --mixture-components K)"
    ]
    assert not (tmp_path / "model").exists()
    # A kind that its option picks, named with --head: that option.
    hops = run("fit", str(tmp_path / "train.zarr"), "--model-dir", str(tmp_path / "model"), "--head", "hops")
    assert hops.returncode == 2
    assert hops.stderr.splitlines()[-1].endswith("; the hops kind is picked by its option, not by --head: --hops H")
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_fit_head_copy_then_evaluate_predict_and_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_worker_address: str
) -> None:
    """A token stream of recurring phrases: the copy head fits on a cluster, and evaluate, predict --top and
    predict --stream read the result."""
    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, 40, size=6) for _ in range(5)]
    tokens = np.concatenate([phrases[rng.integers(0, 5)] for _ in range(1500)]).astype(np.int64)
    np.save(tmp_path / "tokens.npy", tokens)
    stores = tmp_path / "split"
    made = run_here(capsys, "split", "--tokens", str(tmp_path / "tokens.npy"), "--context", "16", "--block-tokens",
                    "500", "--dim", "4", str(stores))  # fmt: skip
    assert made.returncode == 0, made.stderr
    model = tmp_path / "model"
    address = one_worker_address  # the cluster the command-line tests share (tests/conftest.py)
    fitted = run_here(capsys, "fit", str(stores / "train.zarr"), "--model-dir", str(model), "--head", "copy",
                      "--position-buckets", "5", "--max-iter", "3", "--scheduler", address, "--json")  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    report = json.loads(fitted.stdout)
    assert report["kind"] == "copy" and max(report["copy_kappa"]) + max(report["copy_rho"]) > 0.2, report
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
