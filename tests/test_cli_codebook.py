"""``fit --head codebook``: its options read back, every refusal one line naming its flag (exit status 2, before any
cluster starts or the model directory is written), and a fit that evaluate, predict --top and predict --stream read."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts.checkpoints import ModelDir
from dist_respattn.cli import build_parser, main
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.engine.loop import store_record
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.heads.codebook import CodebookSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.store import WriteOptions, open_store
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.test_cli import COMMAND, run_here


def parsed(*flags: str) -> object:
    return build_parser().parse_args(["fit", "train.zarr", "--model-dir", "model", *flags])


def test_the_codebook_options_read_back_and_are_refused_alone_or_bad() -> None:
    spec = spec_from_args(parsed("--head", "codebook", "--codebook-from", "single", "--codewords", "4"),
                          SingleHopSpec(), None)  # fmt: skip
    assert spec == CodebookSpec(str(Path("single").absolute()), near_window=8, codebooks=8, codewords=4)
    refusals = {
        ("--head", "codebook"): "--head codebook needs --codebook-from MODEL_DIR",
        ("--head", "codebook", "--codebook-from", "m", "--codebooks", "0"): "--codebooks 0: expected a positive",
        ("--head", "codebook", "--codebook-from", "m", "--codewords", "1"): "--codewords 1: expected at least 2",
        ("--head", "codebook", "--codebook-from", "m", "--near-window", "-3"): "--near-window -3: expected a positive",
        ("--codewords", "4"): "--codewords is an option of --head codebook",
    }
    for flags, message in refusals.items():
        with pytest.raises(CommandError, match=message):
            spec_from_args(parsed(*flags), SingleHopSpec(), None)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A stream store of recurring phrases (read at N = 16) and a single head of N = 4 fitted on its rows, recorded
    as fitted on it."""
    root = tmp_path_factory.mktemp("codebook-cli")
    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, 30, size=6) for _ in range(5)]
    tokens = np.concatenate([phrases[rng.integers(0, 5)] for _ in range(300)]).astype(np.int64)
    options = WriteOptions(chunk_rows=256, partition_rows=1024)
    train = write_stream_tokens(root / "train.zarr", tokens, 16, num_symbols=30, dim=3, seed=0, options=options)
    rows = open_store(root / "train.zarr", window=4).read_rows(0, 1500)
    spec = SingleHopSpec(sigma2=1.0, emission_strength=1.0, type_strength=1.0, emission_layout="dense")
    single = fit_em((rows.context, rows.query, rows.target), spec, shape=(30, 4, 3, 30), max_iter=3).distribution
    ModelDir(root / "single").commit("ckpt-000000-test", single, {"iteration": 0, "store": store_record(train)},
                                     latest={"iteration": 0}, best=None, keep_best=None)  # fmt: skip
    return {"train": root / "train.zarr", "single": root / "single", "tokens": tokens, "phrase": phrases[0]}  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--near-window", "16"), "--near-window 16: the rows' window N = 16 leaves no far field"),
        (("--codewords", "31"), "--codewords 31: more codewords than the S = 30 symbols; give at most 30"),
    ],
    ids=["near-window-not-below-N", "more-codewords-than-symbols"],
)
def test_a_fit_the_head_cannot_make_is_refused_before_any_cluster(
    stores: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], message: str
) -> None:
    model = tmp_path / "model"
    status = main(["fit", str(stores["train"]), "--model-dir", str(model), "--head", "codebook", "--codebook-from",
                   str(stores["single"]), *extra])  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("dist-respattn fit: error: " + message), lines
    assert not model.exists()


@pytest.mark.slow
def test_fit_head_codebook_then_evaluate_predict_and_stream(
    stores: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], one_worker_address: str
) -> None:
    model = tmp_path / "model"
    address = one_worker_address  # the cluster the command-line tests share (tests/conftest.py)
    fitted = run_here(capsys, "fit", str(stores["train"]), "--model-dir", str(model), "--head", "codebook",
                      "--codebook-from", str(stores["single"]), "--near-window", "4", "--codebooks", "3",
                      "--codewords", "5", "--max-iter", "1", "--scheduler", address, "--json")  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    report = json.loads(fitted.stdout)
    assert report["kind"] == "codebook" and len(report["codebook_weights"]) == 3, report
    evaluated = run_here(capsys, "evaluate", str(model), str(stores["train"]), "--scheduler", address, "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["model"]["perplexity"] > 1.0
    predicted = run_here(capsys, "predict", str(model), str(stores["train"]), "--top", "2", "--out",
                         str(tmp_path / "top.jsonl"), "--scheduler", address)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    rows = [json.loads(line) for line in (tmp_path / "top.jsonl").read_text().splitlines()]
    assert rows and all(len(row["ids"]) == 2 for row in rows)
    history = " ".join(str(t) for t in stores["tokens"][:40])  # type: ignore[index]
    streamed = subprocess.run([COMMAND, "predict", str(model), str(stores["train"]), "--stream", "--top", "2"],
                              input=history, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert len(lines) == 40 and all(len(line["ids"]) == 2 for line in lines)
