"""An attribute-gated fit on the fit page and in ``/metrics`` of a real monitored scheduler: both of its stages (the
shared head, then the gated one) send their start, iteration and end events, and the board shows each as the
checkpoints of its directory record it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dist_respattn.engine import load_checkpoint
from tests.engine.test_cluster import COMMAND, clean_env
from tests.stdlib_packages import PACKAGES, package_corpus

from .conftest import MonitoredCluster, sample_values

pytestmark = pytest.mark.slow  # the tests here share a cluster and start commands

MAX_ITER = 3


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=600, env=clean_env())


@pytest.fixture(scope="module")
def text_stores(tmp_path_factory) -> tuple[str, str]:
    """``(train, validation)``: stdlib text with each file's package as its attribute; the validation store is
    made --like the training store from two of its packages."""
    base = tmp_path_factory.mktemp("gated-page")
    train, validation = str(base / "train.zarr"), str(base / "validation.zarr")
    done = _run(
        "ingest", "--text", package_corpus(base / "corpus"), "--attribute-by", "directory", "--vocab-size", "300",
        "--dim", "6", "--context", "4", train, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    held = package_corpus(base / "held", PACKAGES[:2])
    done = _run("ingest", "--text", held, "--attribute-by", "directory", "--like", train, validation, "--json")
    assert done.returncode == 0, done.stderr
    return train, validation


def test_both_stages_of_a_gated_fit_show_on_the_fit_page_and_in_metrics(
    monitored_cluster: MonitoredCluster, text_stores: tuple[str, str], tmp_path: Path
) -> None:
    train, validation = text_stores
    model_dir = str(tmp_path / "model")
    done = _run(
        "fit", train, "--validation", validation, "--model-dir", model_dir, "--scheduler", monitored_cluster.address,
        "--attribute-factors", "2", "--max-iter", str(MAX_ITER), "--tol", "0", "--patience", str(MAX_ITER + 1),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    web = monitored_cluster.web
    families = web.metrics()
    run_ids = []
    for folder in (os.path.join(model_dir, "shared"), model_dir):
        record = web.fit_of(folder)
        assert record is not None, (folder, [f["model_dir"] for f in web.fits()])
        checkpoint = load_checkpoint(folder, "latest")
        history = checkpoint.meta["history"]
        assert (record["state"], record["iteration"], record["error"]) == ("max_iter", MAX_ITER, None)
        assert (record["store"], record["validation"]) == (train, validation)
        assert record["heldout_rows"] == f"the validation store {validation}"
        assert record["run_id"] == history[-1]["run_id"]
        assert record["log_likelihood_curve"] == [[h["iteration"], h["mean_log_likelihood"]] for h in history]
        assert [p[:3] for p in record["heldout_curve"]] == [
            [h["iteration"], h["heldout"]["mean_log_likelihood"], h["heldout"]["perplexity"]] for h in history
        ]
        labels = {"run_id": record["run_id"], "store": train}
        assert sample_values(families, "dist_respattn_fit_iteration", **labels) == [float(MAX_ITER)]
        assert sample_values(families, "dist_respattn_fit_heldout_perplexity", **labels) == [
            history[-1]["heldout"]["perplexity"]
        ]
        assert sample_values(families, "dist_respattn_fit_state", **labels, state="max_iter") == [1.0]
        run_ids.append(record["run_id"])
    # Two fits, each with its own run: the gated one is a fit of its own on the page, not a part of the shared one's.
    assert len(set(run_ids)) == 2
    assert load_checkpoint(model_dir).model.kind == "gated"
