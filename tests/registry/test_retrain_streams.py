"""``dist-respattn retrain`` on a token-stream store, where the default fit is the recipe: the gate scores the
candidate and the current version as ``evaluate`` scores each (the recipe's repeat gate reads whole documents and
short histories, not the training store's window), so a worse candidate is refused; and ``--head`` picks what is
fitted, ``single`` too, on an empty registry and on one whose latest version is a recipe.

The commands run through the command's ``main`` in this process, on the registry modules' cluster (``--scheduler``).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.engine import evaluate, load_checkpoint, open_store, score
from dist_respattn.model.heads.repeat import RepeatHead
from dist_respattn.registry import Registry
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.registry.conftest import run_in_process

pytestmark = pytest.mark.slow  # the tests here share a cluster and run commands

#: The stores' window N: the recipe's last stage, a repeat gate over whole documents, reads 100,000 tokens.
WINDOW = 8


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> tuple[str, str]:
    """A training and a validation token stream of 10 symbols, with repeats for the copy head to find."""
    folder = tmp_path_factory.mktemp("streams")
    tokens = np.random.default_rng(1).integers(0, 10, 3000)
    tokens[1::5] = tokens[::5][: tokens[1::5].size]
    options = WriteOptions(chunk_rows=512, partition_rows=1024)
    paths = []
    for name, part in (("train", tokens[:2400]), ("validation", tokens[2400:])):
        path = folder / f"{name}.zarr"
        write_stream_tokens(path, part, WINDOW, num_symbols=10, dim=2, seed=0, options=options)
        paths.append(str(path))
    return paths[0], paths[1]


def retrain(registry: Path, streams: tuple[str, str], address: str, *extra: str):
    """``retrain --json`` of ``registry`` on the training stream, validated on the other; its exit status and report."""
    train, validation = streams
    result = run_in_process(
        "retrain", "--registry", str(registry), "--store", train, "--validation", validation,
        "--scheduler", address, "--json", *extra,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.fixture(scope="module")
def recipe_registry(tmp_path_factory, streams, address) -> Path:
    """A registry whose version 1 is the recipe (what retrain fits on a token stream when nothing picks a kind), its
    parts fitted 3 iterations; tests copy it before writing to it."""
    root = tmp_path_factory.mktemp("recipe") / "registry"
    status, report = retrain(root, streams, address, "--max-iter", "3")
    assert (status, report["version"]) == (0, 1)
    version = Registry(str(root)).load(1)
    assert version.meta["fit_head"]["kind"] == "recipe" and isinstance(version.model, RepeatHead)
    return root


def test_the_gate_scores_both_models_as_evaluate_does_and_refuses_a_worse_candidate(
    recipe_registry, streams, address, client, tmp_path
):
    """One iteration a part from version 1 (its conjunction part from the data) is worse than version 1 on the
    validation store by more than the tolerance: refused. The gate's two figures are ``evaluate``'s perplexities of
    the two models on that store, not the current version's on the training store's windows of N = 8 (on which it
    had looked worse than the candidate, and the candidate passed)."""
    registry = tmp_path / "registry"
    shutil.copytree(recipe_registry, registry)
    work = tmp_path / "work"
    status, report = retrain(registry, streams, address, "--max-iter", "1", "--work-dir", str(work))
    gate = report["gate"]
    _, validation = streams
    current = evaluate(f"{registry}@1", validation, client=client).model["perplexity"]
    candidate = evaluate(work / "model", validation, client=client).model["perplexity"]
    assert math.isclose(gate["current"], current, rel_tol=1e-12), (gate, current)
    assert math.isclose(gate["candidate"], candidate, rel_tol=1e-12), (gate, candidate)
    assert candidate > current * 1.01  # worse by more than the default tolerance
    assert (status, report["published"], gate["passed"]) == (1, False, False)
    assert Registry(str(registry)).numbers() == [1]


def test_head_single_fits_one_head_on_an_empty_registry(streams, address, tmp_path):
    """``--head single`` on a token stream: the first version is one single-hop head, not the recipe."""
    registry = tmp_path / "registry"
    status, report = retrain(registry, streams, address, "--head", "single", "--max-iter", "2")
    assert (status, report["version"]) == (0, 1)
    version = Registry(str(registry)).load(1)
    assert version.model.kind == "single_hop" and "fit_head" not in version.meta
    assert version.model.context_length == WINDOW


def test_head_single_over_a_recipe_fits_one_head_from_the_data_gated_on_the_same_rows(
    recipe_registry, streams, address, client, tmp_path
):
    """``--head single`` over a recipe version fits a single head (a recipe is no start for one: from the data), and
    the gate scores both on the rows the single head scores, those with a whole window, each model with its own."""
    registry = tmp_path / "registry"
    shutil.copytree(recipe_registry, registry)
    work = tmp_path / "work"
    status, report = retrain(registry, streams, address, "--head", "single", "--max-iter", "2", "--work-dir", str(work))
    candidate = load_checkpoint(work / "model")
    assert candidate.model.kind == "single_hop" and candidate.meta["init"] == {"kind": "uniform"}
    _, validation = streams
    full_windows = open_store(validation)
    version = Registry(str(registry)).load(1)
    recipe_rows = open_store(validation, window=version.model.context_length, min_context=WINDOW)
    assert recipe_rows.num_rows == full_windows.num_rows
    gate = report["gate"]
    assert math.isclose(gate["current"], score(version.model, recipe_rows, client=client)["perplexity"], rel_tol=1e-12)
    assert math.isclose(gate["candidate"], score(candidate.model, full_windows, client=client)["perplexity"],
                        rel_tol=1e-12)  # fmt: skip
    assert status == (0 if gate["passed"] else 1)
