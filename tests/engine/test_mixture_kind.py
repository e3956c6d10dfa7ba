"""The mixture of single-hop heads through the engine, a kind written in the model layer alone: fitted on 1, 2 and
3 workers to the same bits and equal to ``fit_em``, loaded back from its model directory, predicted into a store,
streamed, and published and retrained through the registry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import distributed
import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.engine import FitResult, FitSettings, fit, load_model, predict
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.heads.mixture import MixtureHead, MixtureSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.registry import retrain
from dist_respattn.store import WriteOptions, write_arrays
from dist_respattn.store.predictions import Predictions
from tests.engine.clusters import local_cluster

pytestmark = pytest.mark.slow  # every test runs on the module's cluster

SHAPE = (12, 4, 3, 9)  # S, N, D, T
ROWS = 1500
#: 1,500 rows in 128-row chunks and 256-row partitions: 6 partitions, the last one partial.
OPTIONS = WriteOptions(chunk_rows=128, partition_rows=256)
#: Two iterations: the second E-step runs on the first distributed M-step's parameters (the bits compared), and the
#: likelihood can be seen to rise.
ITERATIONS = 2


def spec_of(layout: str) -> MixtureSpec:
    return MixtureSpec(components=2, component=SingleHopSpec(sigma2=0.5, emission_layout=layout), seed=4)


@pytest.fixture(scope="module")
def rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    truth = MixtureHead([0.6, 0.4], [random_distribution(*SHAPE, seed=s, sigma2=0.5) for s in (1, 2)])
    context, query, target = truth.sample_arrays(ROWS, seed=3)
    # float32 values, which the store keeps exactly: fit_em reads the rows the cluster reads.
    exact = np.asarray(query, dtype=np.float32).astype(np.float64)
    return np.ascontiguousarray(context, dtype=np.int32), exact, target.astype(np.int32)


@pytest.fixture(scope="module")
def store(rows, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mixture") / "train.zarr"
    write_arrays(path, *rows, num_symbols=SHAPE[0], num_targets=SHAPE[3], options=OPTIONS)
    return path


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[distributed.LocalCluster, distributed.Client]]:
    """The module's cluster: one worker until ``fits`` grows it to two, then three (it only grows: distributed's
    close can fail on a worker removed by an earlier scale-down). One cluster instead of one a fit."""
    with local_cluster(1) as made:
        yield made


@pytest.fixture(scope="module")
def fits(store, cluster, tmp_path_factory) -> dict[tuple[str, int], tuple[FitResult, Path]]:
    """``(layout, workers) -> (result, model_dir)``: each layout fitted on exactly 1, 2 and 3 workers."""
    grown, client = cluster
    folder = tmp_path_factory.mktemp("mixture-fits")
    made = {}
    for workers in (1, 2, 3):
        grown.scale(workers)
        client.wait_for_workers(workers, timeout=60)
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == workers
        for layout in ("dense", "sparse"):
            model_dir = folder / f"{layout}-{workers}"
            result = fit(store, model_dir=model_dir, settings=FitSettings(max_iter=ITERATIONS, tol=0.0),
                         head=spec_of(layout), client=client, progress=False)  # fmt: skip
            made[layout, workers] = (result, model_dir)
    return made


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_a_mixture_fit_is_the_same_on_one_two_and_three_workers(fits, rows, layout):
    spec = spec_of(layout)
    fitted = {}
    for workers in (1, 2, 3):
        result, model_dir = fits[layout, workers]
        assert result.state == "max_iter" and len(result.history) == ITERATIONS
        head = load_model(model_dir)
        assert isinstance(head, MixtureHead) and head.num_components == 2
        fitted[workers] = (head.to_arrays(), [entry["mean_log_likelihood"] for entry in result.history])
    (arrays, meta), history = fitted[1]
    assert history[-1] > history[0]
    for workers in (2, 3):
        (other, other_meta), other_history = fitted[workers]
        assert other.keys() == arrays.keys() and other_meta == meta
        for name in arrays:
            assert np.array_equal(other[name], arrays[name]), f"{workers} workers: {name}"
        assert other_history == history
    head = load_model(fits[layout, 1][1])
    assert all(isinstance(c.emission_table, SparseEmission) == (layout == "sparse") for c in head.components)
    # The in-process EM takes the same steps; only the order of the sums differs (per partition, then combined).
    reference = fit_em(rows, spec, shape=SHAPE, max_iter=ITERATIONS, tol=0.0)
    np.testing.assert_allclose(history, reference.log_likelihoods, rtol=1e-12, atol=0)
    theirs, _ = reference.distribution.to_arrays()
    for name in arrays:
        np.testing.assert_allclose(arrays[name], theirs[name], rtol=1e-10, atol=1e-13, err_msg=name)


def test_a_fitted_mixture_predicts_a_store_streams_and_is_retrained_through_the_registry(
    store, rows, cluster, tmp_path
):
    spec = spec_of("dense")
    registry = tmp_path / "registry"
    _, client = cluster
    fit(store, model_dir=tmp_path / "model", settings=FitSettings(max_iter=3, tol=0.0), head=spec, client=client,
        progress=False)  # fmt: skip
    run = predict(tmp_path / "model", store, out=tmp_path / "p.zarr", top_k=3, client=client, progress=False)
    first = retrain(registry, store, head=spec, settings=FitSettings(max_iter=2, tol=0.0), client=client,
                    progress=False)  # fmt: skip
    # Without a spec, a retrain fits the latest version's kind, from that version.
    second = retrain(registry, store, settings=FitSettings(max_iter=2, tol=0.0), tolerance=1.0, client=client,
                     progress=False)  # fmt: skip
    head = load_model(tmp_path / "model")
    assert isinstance(head, MixtureHead)
    context, query, target = rows
    proba = head.predict_proba(context, query)
    order = np.argsort(-proba, kind="stable")[:, :3]
    got = Predictions.open(tmp_path / "p.zarr").read_all()
    assert run.rows == ROWS
    np.testing.assert_array_equal(got.targets, order)
    np.testing.assert_allclose(got.probabilities, np.take_along_axis(proba, order, axis=1), rtol=1e-10)
    assert run.top1_accuracy == pytest.approx(np.mean(order[:, 0] == target), abs=1e-15)
    # The loaded head's streaming predictor: a row's context as the history, its query given.
    predictor = head.predictor()
    for row in (0, 700, ROWS - 1):
        predictor.extend(context[row].tolist())
        np.testing.assert_allclose(predictor.predict(query[row]), proba[row], rtol=1e-10)
    assert predictor.state_size == SHAPE[1]
    assert (first.published, first.version) == (True, 1)
    assert second.published and second.version == 2
    published = load_model(f"{registry}@latest")
    assert isinstance(published, MixtureHead) and published.num_components == 2


def test_a_resumed_mixture_fit_takes_the_steps_of_an_uninterrupted_one(store, cluster, tmp_path):
    """Sparse, with the continuation prior made from the training pairs: a resumed fit reads the prior and the
    support from its checkpoint instead of passes, and ends on the same bits."""
    spec = spec_of("sparse")
    _, client = cluster
    whole = fit(store, model_dir=tmp_path / "whole", settings=FitSettings(max_iter=3, tol=0.0), head=spec,
                client=client, progress=False)  # fmt: skip
    fit(store, model_dir=tmp_path / "parts", settings=FitSettings(max_iter=2, tol=0.0), head=spec, client=client,
        progress=False)  # fmt: skip
    resumed = fit(store, model_dir=tmp_path / "parts", settings=FitSettings(max_iter=3, tol=0.0), head=spec,
                  resume=True, client=client, progress=False)  # fmt: skip
    assert [e["mean_log_likelihood"] for e in resumed.history] == [e["mean_log_likelihood"] for e in whole.history]
    ours, theirs = load_model(tmp_path / "parts").to_arrays()[0], load_model(tmp_path / "whole").to_arrays()[0]
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), name
