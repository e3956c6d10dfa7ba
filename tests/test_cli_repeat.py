"""``fit --head repeat``: its options read back and refused with the flag named, and a gate fitted on a cluster over a
fitted head, read by ``evaluate``, ``predict`` and ``predict --stream``, resumed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.cli import build_parser
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.model.heads.repeat import RepeatSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from tests.test_cli import COMMAND, run, run_here


def context():
    from dist_respattn.model.heads.base import TrainerContext
    from dist_respattn.model.heads.single_hop.sampler import random_distribution

    return TrainerContext((6, 4, 2, 6), sources=(random_distribution(6, 4, 2, 6, seed=0),))


def parsed(*flags: str) -> object:
    return build_parser().parse_args(["fit", "train.zarr", "--model-dir", "model", *flags])


def test_the_repeat_options_read_back_and_are_refused_alone_or_bad() -> None:
    spec = spec_from_args(parsed("--head", "repeat", "--repeat-from", "base"), SingleHopSpec(), None)
    assert spec == RepeatSpec(str(Path("base").absolute()), 1.0)
    ml = spec_from_args(parsed("--head", "repeat", "--repeat-from", "base", "--repeat-prior", "0"), SingleHopSpec(),
                        None)  # fmt: skip
    assert isinstance(ml, RepeatSpec) and ml.prior == 0.0 and ml.mix is None
    fixed = spec_from_args(parsed("--head", "repeat", "--repeat-from", "base", "--repeat-mix", "0.3"), SingleHopSpec(),
                           None)  # fmt: skip
    assert isinstance(fixed, RepeatSpec) and fixed.mix == 0.3 and not fixed.trainer(context()).searches()
    assert spec.trainer(context()).searches()  # the wrapped head's share chosen on held-out rows
    refusals = {
        ("--head", "repeat"): "--head repeat needs --repeat-from MODEL",
        ("--head", "repeat", "--repeat-from", "a,b"): "--head repeat needs --repeat-from MODEL",
        ("--repeat-from", "a"): "--repeat-from is an option of --head repeat",
        ("--head", "copy", "--repeat-prior", "2"): "--repeat-prior is an option of --head repeat",
        ("--repeat-mix", "0.5"): "--repeat-mix is an option of --head repeat",
    }
    for flags, message in refusals.items():
        with pytest.raises(CommandError, match=message):
            spec_from_args(parsed(*flags), SingleHopSpec(), None)


def test_a_bad_prior_is_one_line_of_the_real_command(tmp_path: Path) -> None:
    result = run("fit", str(tmp_path / "train.zarr"), "--model-dir", str(tmp_path / "model"), "--head", "repeat",
                 "--repeat-from", "a", "--repeat-prior", "-1")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "dist-respattn fit: error: argument --repeat-prior: '-1': expected a finite number >= 0 (pseudo-rows)"
    )
    assert not (tmp_path / "model").exists()
    share = run("fit", str(tmp_path / "train.zarr"), "--model-dir", str(tmp_path / "model"), "--head", "repeat",
                "--repeat-from", "a", "--repeat-mix", "2")  # fmt: skip
    assert share.returncode == 2
    assert share.stderr.splitlines()[-1] == (
        "dist-respattn fit: error: argument --repeat-mix: '2': expected the wrapped head's share of the prediction, "
        "in [0, 1]"
    )


@pytest.mark.slow
def test_fit_head_repeat_on_a_fitted_head_then_evaluate_predict_stream_and_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_worker_address: str
) -> None:
    """Documents that each repeat a few tokens of their own: the gate, fitted over a single head of N = 4 with a
    history of whole documents, scores the test documents better than the head; its predictions and stream read it."""
    rng = np.random.default_rng(0)
    documents = [rng.choice(60, size=5, replace=False)[rng.integers(0, 5, size=int(rng.integers(40, 120)))]
                 for _ in range(60)]  # fmt: skip
    np.save(tmp_path / "tokens.npy", np.concatenate(documents).astype(np.int64))
    np.save(tmp_path / "starts.npy", np.cumsum([0, *(d.size for d in documents[:-1])]).astype(np.int64))
    stores = tmp_path / "split"
    made = run_here(capsys, "split", "--tokens", str(tmp_path / "tokens.npy"), "--documents",
                    str(tmp_path / "starts.npy"), "--context", "4", "--dim", "4", str(stores))  # fmt: skip
    assert made.returncode == 0, made.stderr
    address = one_worker_address  # the cluster the command-line tests share (tests/conftest.py)
    base, gated = tmp_path / "base", tmp_path / "gated"
    fitted = run_here(capsys, "fit", str(stores / "train.zarr"), "--model-dir", str(base), "--head", "single",
                      "--position-buckets", "4", "--min-context", "1", "--max-iter", "3",
                      "--scheduler", address)  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    # A window shorter than the wrapped head's is refused before any pass.
    short = run_here(capsys, "fit", str(stores / "train.zarr"), "--model-dir", str(tmp_path / "short"), "--head",
                     "repeat", "--repeat-from", str(base), "--context", "2", "--scheduler", address)  # fmt: skip
    assert short.returncode == 2
    assert f"--repeat-from {base}: its window N = 4 is longer than the training rows' N = 2" in short.stderr
    assert not (tmp_path / "short").exists()

    args = ("fit", str(stores / "train.zarr"), "--validation", str(stores / "validation.zarr"), "--model-dir",
            str(gated), "--head", "repeat", "--repeat-from", str(base), "--context", "1000",
            "--scheduler", address)  # fmt: skip
    repeated = run_here(capsys, *args, "--json")
    assert repeated.returncode == 0, repeated.stderr
    report = json.loads(repeated.stdout)
    # The rates are counted before iteration 1, under the gate alone; its held-out pass chooses the wrapped head's
    # share (none, here: these documents repeat five tokens each), and an iteration under the same head confirms it.
    assert report["kind"] == "repeat" and report["repeat_mix"] == 0.0, report
    assert report["iterations"] == 2 and report["state"] == "converged", report
    head = load_checkpoint(gated).model
    assert head.kind == "repeat" and head.context_length == 1000 and head.base.context_length == 4
    assert head.rates.shape == (10,) and max(head.rates) > 0.9, head.rates  # documents repeat their five tokens
    again = run_here(capsys, *args, "--resume")  # a converged fit resumed: its checkpoint as it was
    assert again.returncode == 0, again.stderr
    assert np.array_equal(load_checkpoint(gated).model.rates, head.rates)

    scores = {}
    for name, model in (("base", base), ("gated", gated)):
        evaluated = run_here(capsys, "evaluate", str(model), str(stores / "test.zarr"), "--scheduler", address,
                             "--json")  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stderr
        scores[name] = json.loads(evaluated.stdout)
    assert scores["gated"]["weight"] == scores["base"]["weight"] > 0
    assert scores["gated"]["model"]["perplexity"] < 0.9 * scores["base"]["model"]["perplexity"], scores

    # predict: the top targets, and the attention the wrapped head reads (N = 4 columns, not the history's 1000).
    predicted = run_here(capsys, "predict", str(gated), str(stores / "test.zarr"), "--top", "2", "--out",
                         str(tmp_path / "top.zarr"), "--scheduler", address)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    from dist_respattn.store.predictions import Predictions

    top = Predictions.open(str(tmp_path / "top.zarr")).read_all()
    assert top.targets.shape[1] == 2 and top.attention.shape[1] == 4
    history = " ".join(str(int(t)) for t in documents[0][:30])
    streamed = subprocess.run([COMMAND, "predict", str(gated), str(stores / "train.zarr"), "--stream", "--top", "1"],
                              input=history, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    # Past its first tokens, each prediction is a token the document has had: what the gate learned to expect.
    seen = [set(documents[0][: line["position"]].tolist()) for line in lines]
    assert len(lines) == 30 and all(line["ids"][0] in s for line, s in zip(lines[10:], seen[10:], strict=True)), lines
