"""A fit whose emission is sparse: the same fit as the dense one, bit-identical however it runs.

The small stores' S×T is tiny, so the sparse layout is forced (``emission_layout="sparse"``); the
support the start pass finds is every (context symbol, target) pair the training rows hold.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time

import distributed
import numpy as np
import pytest

from dist_respattn import fit_em
from dist_respattn.engine import (
    FitSettings,
    estimate_memory,
    evaluate,
    fit,
    kept_rows,
    load_checkpoint,
    load_model,
    worker_tasks,
)
from dist_respattn.engine.memory import InsufficientMemoryError, check_memory
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.memory import SPARSE_MODEL_BYTES_PER_PAIR, SPARSE_VALUE_BYTES_PER_PAIR
from dist_respattn.store import StoreSchema, TripleStore
from tests.engine.clusters import local_cluster

SPARSE = FitSettings(max_iter=3, tol=0.0, emission_layout="sparse")


def read_all(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    store = TripleStore.open(path)
    parts = [store.read_partition(p) for p in range(store.num_partitions)]
    return tuple(np.concatenate([getattr(p, name) for p in parts]) for name in ("context", "query", "target"))


def assert_bit_identical(a, b) -> None:
    ta, tb = a.emission_table, b.emission_table
    assert isinstance(ta, SparseEmission) and isinstance(tb, SparseEmission)
    assert ta.support.same_as(tb.support)
    for name in ("values", "backoff", "base"):
        assert np.array_equal(getattr(ta, name), getattr(tb, name)), name
    assert np.array_equal(a.key_means, b.key_means) and np.array_equal(a.position_prior, b.position_prior)
    assert a.sigma2 == b.sigma2


def relative_error(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.slow
def test_a_sparse_fit_is_the_dense_fit_and_the_in_process_one(small_store, client, tmp_path):
    """Same store and settings: the sparse fit's parameters equal the dense fit's and ``fit_em``'s sparse fit
    to 1e-12 (only the order of float64 sums differs), and its support is the pairs of the training rows."""
    sparse = fit(small_store, model_dir=tmp_path / "sparse", client=client, settings=SPARSE)
    dense = fit(small_store, model_dir=tmp_path / "dense", client=client,
                settings=FitSettings(max_iter=3, tol=0.0, emission_layout="dense"))  # fmt: skip
    table = sparse.model.emission_table
    assert isinstance(table, SparseEmission) and dense.model.emission_table.layout == "dense"
    assert relative_error(sparse.model.emission, dense.model.emission) <= 1e-12
    assert relative_error(sparse.model.key_means, dense.model.key_means) <= 1e-12
    assert sparse.model.sigma2 == pytest.approx(dense.model.sigma2, rel=1e-12)
    np.testing.assert_allclose(
        [h["mean_log_likelihood"] for h in sparse.history], [h["mean_log_likelihood"] for h in dense.history],
        rtol=1e-12,
    )  # fmt: skip
    context, query, target = read_all(small_store)
    rule = HoldoutRule.from_json(load_checkpoint(tmp_path / "sparse").meta["holdout"])
    train = ~rule.held_out(0, target.size)
    keys = np.unique((target[train].astype(np.int64)[:, None] * table.num_symbols + context[train]).ravel())
    assert np.array_equal(table.support.keys(), keys)
    estimator = SPARSE.estimator(TripleStore.open(small_store).schema)
    reference = fit_em((context, query, target), estimator, holdout=rule, layout="sparse", max_iter=3, tol=0.0)
    assert relative_error(sparse.model.emission, reference.distribution.emission) <= 1e-12
    # The checkpoint keeps the sparse arrays, and evaluate scores with them.
    assert load_model(tmp_path / "sparse").emission_table.support.same_as(table.support)
    scores = evaluate(tmp_path / "sparse", small_store, client=client, progress=False)
    assert scores.model["perplexity"] == pytest.approx(
        evaluate(tmp_path / "dense", small_store, client=client, progress=False).model["perplexity"], rel=1e-10
    )


@pytest.mark.slow
def test_sparse_fits_on_one_two_and_three_workers_are_bit_identical(small_store, client, tmp_path):
    # Two iterations: the second E-step runs on the first distributed M-step's parameters.
    settings = dataclasses.replace(SPARSE, max_iter=2)
    two = fit(small_store, model_dir=tmp_path / "w2", client=client, settings=settings)
    with local_cluster(1) as (cluster, other):
        one = fit(small_store, model_dir=tmp_path / "w1", client=other, settings=settings)
        cluster.scale(3)
        other.wait_for_workers(3, timeout=60)
        with distributed.get_task_stream(client=other) as stream:
            three = fit(small_store, model_dir=tmp_path / "w3", client=other, settings=settings)
        assert len({record["worker"] for record in stream.data}) >= 2
    for result in (one, three):
        assert_bit_identical(result.model, two.model)
        for key in ("mean_log_likelihood", "hyperparameters", "heldout"):
            assert [e[key] for e in result.history] == [e[key] for e in two.history], key


@pytest.mark.slow
def test_a_sparse_fit_sends_its_support_once(small_store, client, tmp_path, monkeypatch):
    """The support goes to the workers once a fit, apart: at every iteration's end the cluster holds the same one
    table, and grids that are smaller than the model pickled whole by more than the support's symbols. No E-step's
    parameters are sent: the workers make each head from the grid they chose it on."""
    held: list[dict[str, int]] = []
    sent: dict[str, int] = {}
    grids_sent: dict[str, int] = {}
    done = threading.Event()

    def watch() -> None:
        # The parameters and grids are on the workers while their passes run: seen there, with their size.
        while not done.is_set():
            for key, size in client.nbytes(summary=False).items():
                if str(key).startswith("respattn-params-"):
                    sent[str(key)] = size
                if str(key).startswith("respattn-grid-"):
                    grids_sent[str(key)] = size
            time.sleep(0.002)

    def say(line: str) -> None:
        if line.startswith("iteration "):
            held.append({str(k): v for k, v in client.nbytes(summary=False).items() if str(k).startswith("respattn-")})

    from dist_respattn.model.heads.single_hop import kind

    made: list = []
    make_grid = kind.SingleHopCandidates.grid

    def grid(self, around):
        made.append(make_grid(self, around))
        return made[-1]

    monkeypatch.setattr(kind.SingleHopCandidates, "grid", grid)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = fit(small_store, model_dir=tmp_path / "model", client=client, settings=SPARSE, say=say,
                     progress=False)  # fmt: skip
    finally:
        done.set()
        watcher.join(timeout=30)
    support = result.model.emission_table.support
    assert len(held) == result.iterations == 3
    tables = [{key: size for key, size in keys.items() if key.startswith("respattn-table-")} for keys in held]
    assert all(len(t) == 1 and t == tables[0] for t in tables), tables
    assert not [key for keys in held for key in keys if key.startswith("respattn-params-")], held
    # Every E-step's head was made on the workers from the grid they scored it on (the held-out pass's): none sent.
    assert not sent, sent
    assert len(made) == result.iterations + 1
    for label, grid in enumerate(made):
        whole = len(pickle.dumps(grid, protocol=5))
        grids = [size for key, size in grids_sent.items() if key.startswith(f"respattn-grid-{label}-")]
        # Each grid, without the support: its pairs' counts (8 bytes each) but not their symbols.
        assert len(grids) == 1 and grids[0] < whole - support.symbols.nbytes, (label, grids_sent, whole)


@pytest.mark.slow
def test_a_resumed_or_warm_started_sparse_fit_takes_the_uninterrupted_steps(small_store, client, tmp_path):
    """2 iterations then ``resume`` to 4: bit-identical to 4 uninterrupted iterations. A warm start from it
    (``init_from``, which finds the support again) runs iteration 5's E-step on the very same model.
    (Its first choice searches the whole grid, so later iterations may choose otherwise, as a dense fit's do.)"""
    settings = FitSettings(max_iter=4, tol=0.0, emission_layout="sparse")
    whole = fit(small_store, model_dir=tmp_path / "whole", client=client, settings=settings)
    half = FitSettings(max_iter=2, tol=0.0, emission_layout="sparse")
    fit(small_store, model_dir=tmp_path / "resumed", client=client, settings=half)
    resumed = fit(small_store, model_dir=tmp_path / "resumed", client=client, settings=settings, resume=True)
    assert_bit_identical(resumed.model, whole.model)
    assert [h["mean_log_likelihood"] for h in resumed.history] == [h["mean_log_likelihood"] for h in whole.history]
    lines: list[str] = []
    warm = fit(small_store, model_dir=tmp_path / "warm", client=client, settings=FitSettings(max_iter=1, tol=0.0,
               emission_layout="sparse"), init_from=tmp_path / "resumed", say=lines.append)  # fmt: skip
    assert any(line.startswith("sparse emission over ") for line in lines), lines
    five = fit(small_store, model_dir=tmp_path / "resumed", client=client,
               settings=FitSettings(max_iter=5, tol=0.0, emission_layout="sparse"), resume=True)  # fmt: skip
    assert warm.history[0]["mean_log_likelihood"] == five.history[4]["mean_log_likelihood"]


def test_the_memory_plan_follows_the_pairs_not_s_times_t():
    """At S = T = 50,000 a dense plan needs tens of GB; a sparse one grows with the pairs, by the bytes per
    pair it states, and a refusal names the pairs."""
    schema = StoreSchema(num_symbols=50_000, context_length=8, query_dim=32, num_targets=50_000)
    plan = {"block_rows": 131072, "threads_per_worker": 1, "fan_in": 4}
    dense = estimate_memory(schema, **plan)
    small = estimate_memory(schema, layout="sparse", num_pairs=10_000_000, **plan)
    large = estimate_memory(schema, layout="sparse", num_pairs=20_000_000, **plan)
    assert dense.worker_bytes > 100 * 2**30 > 4 * small.worker_bytes
    assert large.value_bytes - small.value_bytes == SPARSE_VALUE_BYTES_PER_PAIR * 10_000_000
    assert large.model_bytes - small.model_bytes == SPARSE_MODEL_BYTES_PER_PAIR * 10_000_000
    with pytest.raises(InsufficientMemoryError, match=r"sparse emission over 20,000,000 pairs at 32 bytes a pair"):
        check_memory(large, worker_limit=2 * 2**30, shape="(S, N, D, T) = (50000, 8, 32, 50000)")
    with pytest.raises(InsufficientMemoryError, match=r"--emission-layout sparse"):
        check_memory(dense, worker_limit=2 * 2**30, shape="(S, N, D, T) = (50000, 8, 32, 50000)")


@pytest.mark.slow
def test_later_held_out_passes_score_the_rows_each_worker_kept(small_store, client, tmp_path):
    """The first held-out pass keeps each partition's planned rows on the worker that scored it; every later pass
    sends each partition back there and scores it without reading the store; the fit's end drops them all. The fit
    is the one whose held-out rows are read at every pass (the workers given no room to keep them), to the bit."""
    # The cluster is the package's: a fit another module killed (its driver gone, nothing told the workers) may have
    # left rows kept there, which only newer ones push out.
    client.run(kept_rows.forget)
    kept = fit(small_store, model_dir=tmp_path / "kept", client=client, settings=SPARSE, progress=False)
    run = kept.history[-1]["run_id"]
    parts = TripleStore.open(small_store).num_partitions
    served = client.run(kept_rows.served, run)
    assert sum(served.values()) == kept.iterations * parts, (served, parts)
    assert all(size == 0 for size in client.run(kept_rows.kept_bytes).values())
    room = kept_rows.KEPT_BYTES
    client.run(lambda: setattr(kept_rows, "KEPT_BYTES", 0))
    try:
        read = fit(small_store, model_dir=tmp_path / "read", client=client, settings=SPARSE, progress=False)
    finally:
        client.run(lambda: setattr(kept_rows, "KEPT_BYTES", room))
    assert sum(client.run(kept_rows.served, read.history[-1]["run_id"]).values()) == 0
    assert_bit_identical(kept.model, read.model)
    for key in ("mean_log_likelihood", "hyperparameters", "heldout"):
        assert [e[key] for e in kept.history] == [e[key] for e in read.history], key


@pytest.mark.slow
def test_heads_made_on_the_workers_from_the_grid_are_the_heads_sent(small_store, client, tmp_path, monkeypatch):
    """Every E-step's head is made on the workers from the held-out pass's grid (the driver sends none), with the
    driver's function: the fit is the one whose heads the driver sends (its grids made without their candidates),
    to the bit, held-out scores and checkpoint included."""
    from dist_respattn.engine import broadcast
    from dist_respattn.model.heads.single_hop import kind

    scattered: list[str] = []
    scatter = broadcast.scatter_to

    def recording(client_, key, value, workers=None, **kwargs):
        scattered.append(key)
        return scatter(client_, key, value, workers, **kwargs)

    monkeypatch.setattr(broadcast, "scatter_to", recording)
    made = fit(small_store, model_dir=tmp_path / "made", client=client, settings=SPARSE, progress=False)
    made_keys, scattered[:] = list(scattered), []
    grid = kind.SingleHopCandidates.grid
    monkeypatch.setattr(
        kind.SingleHopCandidates, "grid", lambda self, around: dataclasses.replace(grid(self, around), candidates=None)
    )
    sent = fit(small_store, model_dir=tmp_path / "sent", client=client, settings=SPARSE, progress=False)
    assert not [key for key in made_keys if key.startswith("respattn-params-")], made_keys
    assert [key.split("-")[2] for key in scattered if key.startswith("respattn-params-")] == ["1", "2", "3"]
    assert_bit_identical(made.model, sent.model)
    assert_bit_identical(load_model(tmp_path / "made"), load_model(tmp_path / "sent"))
    for key in ("mean_log_likelihood", "hyperparameters", "heldout"):
        assert [e[key] for e in made.history] == [e[key] for e in sent.history], key
    # The fit's end drops what the workers made.
    assert all(n == 0 for n in client.run(worker_tasks.release_chosen, made.history[-1]["run_id"]).values())
