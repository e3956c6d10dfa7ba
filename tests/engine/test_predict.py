"""``dist_respattn.engine.predict`` on a real LocalCluster, against ``predict_proba`` in this process.

Triple and token-stream stores, dense and sparse heads, models from a directory and from a registry's
version, the output's refusals, and ``dist-respattn predict`` as a subprocess on this module's scheduler.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionEstimator, fit_em
from dist_respattn.engine import ModelDir, evaluate, load_model, predict
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.registry import Registry
from dist_respattn.store import StoreError, WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from dist_respattn.store.predictions import Predictions
from dist_respattn.store.rows import open_store

from .conftest import ROWS, small_truth

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

COMMAND = str(Path(sys.executable).parent / "dist-respattn")


def all_rows(url):
    """Every row of a store in order: ``(context, query, target)``."""
    store = open_store(url)
    parts = [store.read_partition(p) for p in range(store.num_partitions)]
    return tuple(np.concatenate([getattr(p, n) for p in parts]) for n in ("context", "query", "target"))


def assert_predictions_of(model, url, out, k):
    """The output at ``out`` is the stable top-``k`` of ``predict_proba`` over every row of ``url``, in order."""
    context, query, _ = all_rows(url)
    proba = model.predict_proba(context, query)
    order = np.argsort(-proba, kind="stable")[:, :k]
    got = Predictions.open(out).read_all()
    np.testing.assert_array_equal(got.targets, order)
    np.testing.assert_allclose(got.probabilities, np.take_along_axis(proba, order, axis=1), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(got.attention, model.attention_weights(context, query), rtol=1e-12, atol=1e-300)


def model_dir_of(model, path) -> Path:
    folder = ModelDir(path)
    folder.commit("ckpt-000001-0000abcd", model, {"iteration": 1}, latest={"iteration": 1}, best=None, keep_best=None)
    return Path(path)


def test_predictions_of_a_triple_store_equal_predict_proba(small_store, client, tmp_path):
    """Five partitions, the last one partial: the parts, in order, are every row's top 3 and attention."""
    model = small_truth(seed=4)
    run = predict(model, small_store, out=tmp_path / "p.zarr", top_k=3, client=client, progress=False)
    assert (run.rows, run.partitions, run.top_k) == (ROWS, 5, 3)
    assert_predictions_of(model, small_store, tmp_path / "p.zarr", 3)
    context, query, target = all_rows(small_store)
    top = np.argsort(-model.predict_proba(context, query), kind="stable")[:, :3]
    assert run.top1_accuracy == pytest.approx(np.mean(top[:, 0] == target), abs=1e-15)
    assert run.top_k_accuracy == pytest.approx(np.mean((top == target[:, None]).any(axis=1)), abs=1e-15)
    assert Predictions.open(tmp_path / "p.zarr").header.store_fingerprint == open_store(small_store).fingerprint()


def test_predictions_of_a_stream_store_with_a_sparse_head_equal_predict_proba(client, tmp_path):
    """A stream store's irregular partitions (one of document heads only, with no rows) and a sparse head,
    fitted in this process on the same windows: the threshold search gives predict_proba's top 4."""
    rng = np.random.default_rng(5)
    tokens = (rng.zipf(1.4, 12_000) % 40).astype(np.int64)
    documents = np.array([0, 3_000, 3_002, 8_200, 8_201, 8_202])
    stream = write_stream_tokens(tmp_path / "s.zarr", tokens, 4, num_symbols=40, documents=documents,
                                 options=WriteOptions(chunk_rows=1024, partition_rows=2048))  # fmt: skip
    rows = all_rows(stream.location)
    shape = (40, 4, stream.schema.query_dim, 40)
    estimator = ResponsibilityAttentionEstimator(*shape, emission_prior="continuation")
    model = fit_em(rows, estimator, layout="sparse", max_iter=2).distribution
    assert isinstance(model.emission_table, SparseEmission)
    run = predict(model, stream.location, out=tmp_path / "p.zarr", top_k=4, client=client, progress=False)
    assert run.rows == stream.num_rows == rows[2].shape[0] and run.partitions == stream.num_partitions == 6
    assert_predictions_of(model, stream.location, tmp_path / "p.zarr", 4)


def test_a_registry_version_is_a_model_for_predict_evaluate_and_load_model(small_store, client, tmp_path):
    """``REGISTRY@N`` and ``REGISTRY@latest`` name a published version wherever a model directory goes."""
    registry = Registry(str(tmp_path / "registry"))
    with registry.lock() as lock:
        for seed in (1, 2):
            folder = model_dir_of(small_truth(seed=seed), tmp_path / f"model-{seed}")
            checkpoint = folder / "ckpt-000001-0000abcd"
            registry.publish(
                lock, (checkpoint / "params.npz").read_bytes(), (checkpoint / "meta.json").read_bytes(), {"metrics": {}}
            )
    first, latest = f"{tmp_path}/registry@1", f"{tmp_path}/registry@latest"
    assert np.array_equal(load_model(first).key_means, small_truth(seed=1).key_means)
    assert np.array_equal(load_model(latest).key_means, small_truth(seed=2).key_means)
    run = predict(first, small_store, out=tmp_path / "p.zarr", top_k=2, client=client, progress=False)
    assert run.model == first
    assert_predictions_of(small_truth(seed=1), small_store, tmp_path / "p.zarr", 2)
    assert evaluate(latest, small_store, client=client).model == evaluate(small_truth(seed=2), small_store,
                                                                          client=client).model  # fmt: skip
    with pytest.raises(ValueError, match=r"a model registry, not a model directory: name one of its versions"):
        load_model(tmp_path / "registry")
    with pytest.raises(ValueError, match="no version 3"):
        load_model(f"{tmp_path}/registry@3")


def test_the_output_is_never_written_over_by_mistake(small_store, client, tmp_path):
    """Earlier predictions are replaced only with overwrite; anything else at --out is never touched."""
    model = small_truth()
    out = tmp_path / "p.zarr"
    predict(model, small_store, out=out, top_k=1, client=client, progress=False)
    with pytest.raises(StoreError, match=r"holds predictions already; pass overwrite=True \(--overwrite\)"):
        predict(model, small_store, out=out, top_k=2, client=client, progress=False)
    predict(model, small_store, out=out, top_k=2, overwrite=True, client=client, progress=False)
    assert Predictions.open(out).header.top_k == 2
    with pytest.raises(StoreError, match="is not the output of `dist-respattn predict`; choose another --out"):
        predict(model, small_store, out=tmp_path, top_k=2, overwrite=True, client=client, progress=False)
    with pytest.raises(ValueError, match="is the store being predicted"):
        predict(model, small_store, out=small_store, top_k=2, overwrite=True, client=client, progress=False)
    assert open_store(small_store).num_rows == ROWS


def test_cli_predict_writes_what_predict_does(small_store, client, tmp_path):
    """``dist-respattn predict MODEL STORE --top K --out DIR --json`` on an existing scheduler."""
    model_dir = model_dir_of(small_truth(seed=6), tmp_path / "model")
    out = tmp_path / "p.zarr"
    args = [COMMAND, "predict", str(model_dir), small_store, "--top", "2", "--out", str(out)]
    result = subprocess.run(
        [*args, "--json", "--scheduler", client.scheduler.address], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["rows"], report["top_k"], report["out"]) == (ROWS, 2, str(out))
    assert_predictions_of(small_truth(seed=6), small_store, out, 2)
    again = subprocess.run([*args, "--scheduler", client.scheduler.address], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "pass --overwrite" in again.stderr
