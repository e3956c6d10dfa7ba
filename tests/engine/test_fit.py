"""``dist_respattn.engine.fit`` on a real LocalCluster and real stores on disk.

What is checked: the distributed fit is the in-process EM (to rounding) and is bit-identical on 1, 2
and 3 workers; its tasks, spans and events are named per iteration and the scheduler's state stays
flat; checkpoints, ``best``/early stopping, refusing or overwriting a used model directory; warm
starts; degenerate fits being reported; and the memory check refusing a shape the workers cannot hold.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import distributed
import numpy as np
import pytest

import dist_respattn
from dist_respattn import ResponsibilityAttentionDistribution, fit_em
from dist_respattn.engine import (
    EVENT_TOPIC,
    ClusterOptions,
    FitError,
    FitSettings,
    InsufficientMemoryError,
    estimate_memory,
    evaluate,
    fit,
    load_checkpoint,
    load_model,
)
from dist_respattn.engine.loop import EarlyStopping
from dist_respattn.engine.memory import check_memory
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.placement import PassPlan
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.store import StoreSchema, TripleStore, WriteOptions, write_arrays, write_synthetic
from tests.engine.clusters import local_cluster

from .conftest import SMALL, D, N, S, T, small_truth

PARAMS = ("key_means", "emission", "position_prior")
#: ``small_store`` has 5 partitions; with the default fan-in 4 the combine tree is
#: level 1: (0..3) -> combine 1-0, (4) carried up; level 2: (c1-0, p4) -> combine 2-0.
PARTITIONS = 5
COMBINES = ("1-0", "2-0")


# ------------------------------------------------------------------------------------------ helpers


def read_all(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every row of a store, in order, as ``(context, query, target)`` (read in this process)."""
    store = TripleStore.open(path)
    parts = [store.read_partition(p) for p in range(store.num_partitions)]
    return tuple(np.concatenate([getattr(p, name) for p in parts]) for name in ("context", "query", "target"))


def assert_bit_identical(a: ResponsibilityAttentionDistribution, b: ResponsibilityAttentionDistribution) -> None:
    for name in PARAMS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.sigma2 == b.sigma2


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def run_id(result) -> str:
    ids = {entry["run_id"] for entry in result.history}
    assert len(ids) == 1
    return ids.pop()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def scheduler_task_count(client: distributed.Client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def settled_task_count(client: distributed.Client, tag: str, timeout: float = 10.0) -> int:
    """The scheduler's task count once it holds no task of run ``tag`` (releases are asynchronous)."""

    def ours(dask_scheduler, tag=tag):
        return [str(k) for k in dask_scheduler.tasks if tag in str(k)]

    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(ours) and time.monotonic() < deadline:
        time.sleep(0.05)
    return scheduler_task_count(client)


# ------------------------------------------------------------------- the fit is the in-process EM


@pytest.mark.slow
@pytest.mark.parametrize("fan_in", [4, 2])
def test_distributed_fit_equals_in_process_em(small_store, client, tmp_path, fan_in):
    """From the same start and settings, the cluster's EM and ``fit_em`` on all rows in one process
    give the same parameters and per-iteration log-likelihoods to 1e-12 relative (only the summation
    order differs: per partition and through the combine tree, whose shape the fan-in sets)."""
    init = small_truth(seed=5)
    settings = FitSettings(max_iter=6, tol=0, fan_in=fan_in)
    result = fit(small_store, model_dir=tmp_path / "model", client=client, init=init, settings=settings)
    estimator = settings.estimator(TripleStore.open(small_store).schema)
    reference = fit_em(read_all(small_store), estimator, init=init, max_iter=6, tol=0)

    assert result.state == "max_iter"
    assert result.iterations == reference.n_iter == 6
    for name in PARAMS:
        assert relative_error(getattr(result.model, name), getattr(reference.distribution, name)) < 1e-12, name
    assert result.model.sigma2 == pytest.approx(reference.distribution.sigma2, rel=1e-12)
    ours = [entry["mean_log_likelihood"] for entry in result.history]
    np.testing.assert_allclose(ours, reference.log_likelihoods, rtol=1e-12, atol=0)
    # EM from this start really moved: the test is not comparing two copies of the start.
    assert ours[-1] > ours[0] + 1.0
    # Without a validation store the fit trains on all but the hold-out's rows, which make its choices.
    held = HoldoutRule.for_rows(20_000).count(20_000)
    assert 0 < held < 2_000
    assert [entry["n_obs"] for entry in result.history] == [20_000.0 - held] * 6
    assert all(entry["hyperparameters"] is not None for entry in result.history)


@pytest.mark.slow
def test_fits_on_one_two_and_three_workers_are_bit_identical(small_store, client, tmp_path):
    """The default fit (uniform start, the pairs pass, the hold-out's choices after every M-step) and a random
    start (seeded per partition) give bit-identical parameters, log-likelihoods and choices whether 1, 2 or 3
    workers ran the tasks."""
    # Two iterations: the second E-step runs on parameters the first distributed M-step made.
    cases = {
        "default": FitSettings(max_iter=2, tol=0),
        "random": FitSettings(max_iter=2, tol=0, init="random", seed=11),
    }
    results = {(name, 2): fit(small_store, model_dir=tmp_path / f"{name}-w2", client=client, settings=settings)
               for name, settings in cases.items()}  # fmt: skip
    with local_cluster(1) as (cluster, other):
        for name, settings in cases.items():
            results[name, 1] = fit(small_store, model_dir=tmp_path / f"{name}-w1", client=other, settings=settings)
        cluster.scale(3)  # cheaper than a second cluster
        other.wait_for_workers(3, timeout=60)
        with distributed.get_task_stream(client=other) as stream:
            for name, settings in cases.items():
                results[name, 3] = fit(small_store, model_dir=tmp_path / f"{name}-w3", client=other, settings=settings)
        # The three workers did share the partitions, so the tasks finished in varied orders.
        assert len({record["worker"] for record in stream.data}) >= 2
    for name in cases:
        for workers in (1, 3):
            assert_bit_identical(results[name, workers].model, results[name, 2].model)
            for key in ("mean_log_likelihood", "hyperparameters", "heldout"):
                assert [e[key] for e in results[name, workers].history] == [e[key] for e in results[name, 2].history], (
                    name,
                    key,
                )
    # The starts differ, and another seed is another random start: the equalities above are not constants.
    first = {name: results[name, 2].history[0]["mean_log_likelihood"] for name in cases}
    assert first["default"] != first["random"]
    reseeded = FitSettings(max_iter=1, init="random", seed=12)
    other_seed = fit(small_store, model_dir=tmp_path / "seed12", client=client, settings=reseeded)
    assert other_seed.history[0]["mean_log_likelihood"] != first["random"]


def ordered_value(part: int) -> np.ndarray:
    """Partition ``part``'s value for :func:`test_a_pass_folded_into_fewer_tasks_gives_the_same_bits`: numbers of
    scales far apart, whose sum depends on the order of the additions."""
    rng = np.random.default_rng(part)
    return rng.standard_normal(256) * 10.0 ** rng.integers(-9, 9, 256)


@pytest.mark.slow
def test_a_pass_folded_into_fewer_tasks_gives_the_same_bits(client):
    """A pass over 11 partitions run a task a partition, or a task a subtree of the combine tree (levels 1 to 3,
    on one worker or both), gives the same bits; another order of the same additions does not."""
    runner = PassRunner(client, "0a1b2c3d", fan_in=2)
    everywhere = runner.run("t", "0", 11, ordered_value, lambda part: (part,))
    values = [ordered_value(part) for part in range(11)]
    assert not np.array_equal(everywhere, functools.reduce(np.add, values))  # the order shows in the bits
    workers = sorted(client.ncores())
    with distributed.get_task_stream(client=client) as stream:
        for level in (1, 2, 3, 4):
            for chosen in (tuple(workers[:1]), None):
                folded = runner.run(
                    "t", str(level), 11, ordered_value, lambda part: (part,), plan=PassPlan(level, chosen)
                )
                assert np.array_equal(folded, everywhere), (level, chosen)
    leaves = sorted({str(r["key"]) for r in stream.data if str(r["key"]).startswith("respattn-t-4-")})
    assert leaves == ["respattn-t-4-0-0a1b2c3d"]  # level 4 is the root: one task for the whole pass
    level_1 = {str(r["key"]) for r in stream.data if str(r["key"]).startswith("respattn-t-1-")}
    assert level_1 == {f"respattn-t-1-{first}-0a1b2c3d" for first in range(0, 11, 2)}


@pytest.mark.slow
def test_a_pass_value_comes_straight_from_its_worker(client):
    """The driver takes a pass's value from the worker holding it: the scheduler (here in the driver's process)
    gathers nothing, as it does for a future's value asked for the default way."""
    scheduler = client.cluster.scheduler
    handler = scheduler.handlers["gather"]
    gathered: list = []

    async def gather(*args, **kwargs):
        gathered.append(kwargs.get("keys"))
        return await handler(*args, **kwargs)

    scheduler.handlers["gather"] = gather
    try:
        value = PassRunner(client, "0a1b2c3e", fan_in=2).run("t", "0", 5, ordered_value, lambda part: (part,))
        assert not gathered, gathered
        assert value.shape == (256,) and np.all(np.isfinite(value))
        assert np.array_equal(client.submit(ordered_value, 3, pure=False).result(), ordered_value(3))
        assert gathered  # the default way
    finally:
        scheduler.handlers["gather"] = handler


# -------------------------------------------------------------------- keys, spans, events, no leaks


@pytest.mark.slow
def test_tasks_spans_and_events_are_named_per_iteration(small_store, small_validation_store, client, tmp_path):
    """Every task that runs is ``respattn-init-…``, ``respattn-estep-<iter>-<part>``,
    ``respattn-combine-<iter>-<level>-<i>`` or the held-out pass's, suffixed by the run's tag; each
    iteration has its own span holding exactly its own tasks; one event per iteration is published."""
    settings = FitSettings(max_iter=2, tol=0, patience=5)
    with distributed.get_task_stream(client=client) as stream:
        result = fit(
            small_store, model_dir=tmp_path / "model", client=client, settings=settings,
            validation=small_validation_store,
        )  # fmt: skip
    tag = run_id(result)
    keys = [str(record["key"]) for record in stream.data]
    assert all(key.endswith(f"-{tag}") for key in keys), keys
    names = sorted(key.removesuffix(f"-{tag}") for key in keys)
    expected = [f"respattn-init-0-{p}" for p in range(PARTITIONS)]
    expected += [f"respattn-init-combine-0-{c}" for c in COMBINES]
    # The start's M-step makes its choices on the validation store too.
    # The passes that read the parameters or a grid are small enough here to run as one task each, which folds
    # the whole combine tree itself (named by its first partition; see engine/placement.py).
    expected += ["respattn-heldout-0-0"]
    for k in (1, 2):
        expected += [f"respattn-estep-{k}-0", f"respattn-heldout-{k}-0"]
    assert names == sorted(expected)

    def spans_of_run(dask_scheduler, tag=tag):
        found = {}
        for span in dask_scheduler.extensions["spans"].spans.values():
            if any(tag in part for part in span.name):
                found[span.name] = {group.name: sum(group.states.values()) for group in span.groups}
        return found

    spans = client.run_on_scheduler(spans_of_run)
    per_iteration = {"respattn-estep": 1, "respattn-heldout": 1}
    assert spans == {
        (f"respattn-init-{tag}",): {"respattn-init": 5, "respattn-init-combine": 2, "respattn-heldout": 1},
        (f"respattn-iteration-1-{tag}",): per_iteration,
        (f"respattn-iteration-2-{tag}",): per_iteration,
    }

    stream = [msg for _, msg in client.get_events(EVENT_TOPIC) if msg.get("run_id") == tag]
    assert [e["event"] for e in stream] == ["start", "iteration", "iteration", "end"]
    events = stream[1:-1]
    assert [e["iteration"] for e in events] == [1, 2]
    assert [e["mean_log_likelihood"] for e in events] == [e["mean_log_likelihood"] for e in result.history]
    assert [e["heldout"]["perplexity"] for e in events] == [e["heldout"]["perplexity"] for e in result.history]


@pytest.mark.slow
def test_scheduler_state_stays_flat_over_iterations(small_store, client, tmp_path):
    """Nothing is chained or kept across iterations: during a fit the scheduler never holds more than
    one iteration's tasks plus the parameters, and after 10 iterations it settles to no more tasks
    than after 2 (anything kept per iteration would leave five times as much)."""
    counts: dict[int, list[int]] = {}
    settled: dict[int, int] = {}
    for iterations in (2, 10):
        seen = counts.setdefault(iterations, [])
        result = fit(
            small_store, model_dir=tmp_path / f"model{iterations}", client=client,
            settings=FitSettings(max_iter=iterations, tol=0, patience=100),
            say=lambda line, seen=seen: line.startswith("iteration") and seen.append(scheduler_task_count(client)),
        )  # fmt: skip
        assert result.iterations == iterations
        assert len(seen) == iterations  # one line per iteration, each with a count
        settled[iterations] = settled_task_count(client, run_id(result))
    one_iteration = PARTITIONS + len(COMBINES) + 2  # its tasks, and at most two parameter futures
    assert max(counts[10]) <= one_iteration, counts[10]
    assert settled[10] <= settled[2]
    assert settled[10] == 0


# ---------------------------------------------------------------------------------------- checkpoints


@pytest.mark.slow
def test_checkpoint_is_npz_and_json_and_load_model_returns_the_fit(small_store, client, tmp_path):
    """Without a validation store (the hold-out of the training store makes the choices), the model directory
    holds ``latest.json``, ``best.json`` and the checkpoints they name: ``params.npz`` readable without pickles
    (the model and the fit's emission prior), and ``meta.json`` with the iteration, the settings, the store
    fingerprint, the hold-out, the chosen hyperparameters, the package version and the history; ``load_model``
    gives the best head bit for bit."""
    settings = FitSettings(max_iter=3, tol=0, seed=2, patience=5)
    model_dir = tmp_path / "model"
    result = fit(small_store, model_dir=model_dir, client=client, settings=settings)
    tag = run_id(result)
    name = f"ckpt-000003-{tag}"
    best = f"ckpt-{result.best_iteration:06d}-{tag}"
    assert sorted(p.name for p in model_dir.iterdir()) == sorted({name, best, "latest.json", "best.json", "fit.json"})
    recorded = json.loads((model_dir / "fit.json").read_text())  # what a resume continues with, at any moment
    assert recorded["settings"] == settings.to_json() and recorded["head"] == settings.head_spec().to_json()
    assert json.loads((model_dir / "latest.json").read_text()) == {
        "checkpoint": name, "iteration": 3, "state": "max_iter",
    }  # fmt: skip
    assert json.loads((model_dir / "best.json").read_text())["checkpoint"] == best

    with np.load(model_dir / name / "params.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted((*PARAMS, "emission_base", "emission_types"))
        arrays = {key: npz[key] for key in npz.files}
    assert arrays["key_means"].shape == (S, D)
    assert arrays["emission"].shape == (S, T)
    assert arrays["position_prior"].shape == (N,)
    assert arrays["emission_base"].shape == (T,) and arrays["emission_types"].shape == (S,)
    for key in PARAMS:
        assert arrays[key].dtype == np.float64
        assert np.array_equal(arrays[key], getattr(result.model, key))

    meta = json.loads((model_dir / name / "meta.json").read_text())
    assert meta["iteration"] == 3
    assert meta["state"] == "max_iter"
    assert meta["settings"] == settings.to_json()
    assert meta["store"]["fingerprint"] == TripleStore.open(small_store).fingerprint()
    assert meta["store"]["rows"] == 20_000
    assert meta["package_version"] == dist_respattn.__version__
    assert meta["model"]["sigma2"] == result.model.sigma2
    assert [h["mean_log_likelihood"] for h in meta["history"]] == [h["mean_log_likelihood"] for h in result.history]
    assert [h["iteration"] for h in meta["history"]] == [1, 2, 3]
    assert meta["init"] == {"kind": "uniform"}
    assert meta["holdout"] == HoldoutRule.for_rows(20_000).to_json()
    assert meta["emission_prior"] == {"kind": "continuation"}
    assert meta["hyperparameters"] == result.history[-1]["hyperparameters"]
    assert meta["hyperparameters"]["sigma2"] == result.model.sigma2
    assert meta["warnings"] == [] == result.warnings  # a healthy fit reports nothing

    assert_bit_identical(load_model(model_dir), load_checkpoint(model_dir, "best").model)
    assert_bit_identical(load_checkpoint(model_dir, "latest").model, result.model)


def _heldout_in_process(model: ResponsibilityAttentionDistribution, path: str) -> dict[str, float]:
    """Held-out figures of ``model`` on a store, computed with numpy in this process."""
    context, query, target = read_all(path)
    proba = model.predict_proba(context, query)
    target_log_prob = float(np.mean(np.log(proba[np.arange(target.shape[0]), target])))
    return {
        "mean_log_likelihood": float(np.mean(model.seq_log_density((context, query, target)))),
        "target_log_prob": target_log_prob,
        "perplexity": float(np.exp(-target_log_prob)),
        "accuracy": float(np.mean(np.argmax(proba, axis=1) == target)),
    }


@pytest.mark.slow
@pytest.mark.parametrize(("metric", "patience"), [("perplexity", 1), ("loglik", 2)])
def test_validation_keeps_the_best_checkpoint_and_stops_early(
    small_store, small_validation_store, client, tmp_path, metric, patience
):
    """With a validation store, the fit stops ``patience`` iterations after the held-out metric last
    improved (on this data both metrics peak at iteration 3, long before max_iter); ``best.json``
    names that iteration's checkpoint, which survives pruning and is what ``load_model`` returns,
    and its recorded held-out figures are the model's, recomputed here."""
    model_dir = tmp_path / "model"
    settings = FitSettings(max_iter=30, tol=0, early_stop_metric=metric, patience=patience, min_improvement=0.0)
    result = fit(small_store, model_dir=model_dir, client=client, settings=settings, validation=small_validation_store)
    tag = run_id(result)

    assert result.state == "early_stopped"
    values = [h["heldout"]["perplexity" if metric == "perplexity" else "mean_log_likelihood"] for h in result.history]
    sign = 1.0 if metric == "perplexity" else -1.0  # lower perplexity, higher log-likelihood is better
    best = result.best_iteration
    assert best is not None
    assert best == 1 + int(np.argmin([sign * v for v in values]))
    assert result.iterations == best + patience < settings.max_iter
    assert all(sign * v >= sign * values[best - 1] for v in values[best:])  # nothing after best improved
    assert all(sign * v > sign * values[best - 1] for v in values[: best - 1])

    assert json.loads((model_dir / "best.json").read_text())["checkpoint"] == f"ckpt-{best:06d}-{tag}"
    last = f"ckpt-{result.iterations:06d}-{tag}"
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(
        [f"ckpt-{best:06d}-{tag}", last, "best.json", "fit.json", "latest.json"]
    )
    best_checkpoint = load_checkpoint(model_dir, "best")
    assert best_checkpoint.iteration == best
    assert best_checkpoint.meta["early_stopping"]["metric"] == metric
    assert_bit_identical(load_model(model_dir), best_checkpoint.model)
    assert_bit_identical(load_model(model_dir, "latest"), result.model)
    assert not np.array_equal(load_model(model_dir).emission, result.model.emission)

    recorded = result.history[best - 1]["heldout"]
    expected = _heldout_in_process(best_checkpoint.model, small_validation_store)
    for key in ("mean_log_likelihood", "target_log_prob", "perplexity"):
        assert recorded[key] == pytest.approx(expected[key], rel=1e-12), key
    # The held-out pass scores the M-step's candidates, not an arg-max over T per row: `evaluate` gives accuracy.
    assert "accuracy" not in recorded


def test_patience_counts_iterations_that_do_not_improve_by_min_improvement():
    """Creeping forward by less than ``min_improvement`` (relative) uses up the patience, yet the best checkpoint
    still follows every improvement."""
    stopping = EarlyStopping("perplexity", 2, min_improvement=0.01)
    for iteration, value in enumerate([100.0, 95.0, 94.9, 94.8, 94.7], start=1):
        improved = stopping.update({"perplexity": value}, iteration, f"ckpt-{iteration}")
        assert improved
        assert stopping.exhausted == (iteration == 4)
        if stopping.exhausted:
            break
    assert (stopping.best, stopping.best_iteration) == (94.8, 4)
    assert stopping.reference == 95.0
    restored = EarlyStopping("perplexity", 2, stopping.to_json(), min_improvement=0.01)
    assert (restored.best, restored.reference, restored.since_best) == (94.8, 95.0, 2)
    loglik = EarlyStopping("loglik", 1, min_improvement=0.0)
    assert loglik.update({"mean_log_likelihood": -10.0}, 1, "a") and not loglik.exhausted
    assert not loglik.update({"mean_log_likelihood": -10.5}, 2, "b") and loglik.exhausted


@pytest.mark.slow
def test_a_used_model_dir_is_refused_untouched_and_overwrite_replaces_it(
    small_store, small_validation_store, client, tmp_path
):
    """Fitting into a directory that holds a fit, without resume or overwrite, raises FitError and
    leaves every file as it was; with overwrite, the new fit replaces it: its checkpoint is loaded,
    the old run's checkpoints are gone, and the old validated fit's ``best.json`` does not shadow a
    new fit without validation."""
    model_dir = tmp_path / "model"
    first = fit(
        small_store, model_dir=model_dir, client=client, validation=small_validation_store,
        settings=FitSettings(max_iter=2, tol=0),
    )  # fmt: skip
    assert (model_dir / "best.json").is_file()
    before = snapshot(model_dir)

    with pytest.raises(FitError, match="already holds a fit"):
        fit(small_store, model_dir=model_dir, client=client, settings=FitSettings(max_iter=2, tol=0, seed=1))
    assert snapshot(model_dir) == before

    # Nothing held out: the choices keep their defaults, and there is no best checkpoint.
    second = fit(
        small_store, model_dir=model_dir, client=client, overwrite=True,
        settings=FitSettings(max_iter=2, tol=0, holdout_fraction=0.0),
    )  # fmt: skip
    old, new = run_id(first), run_id(second)
    assert old != new
    assert not (model_dir / "best.json").exists()
    assert sorted(p.name for p in model_dir.iterdir()) == [f"ckpt-000002-{new}", "fit.json", "latest.json"]
    assert_bit_identical(load_model(model_dir), second.model)
    assert not np.array_equal(second.model.emission, first.model.emission)
    assert {h["run_id"] for h in load_checkpoint(model_dir).meta["history"]} == {new}


@pytest.mark.slow
def test_overwrite_with_no_iterations_does_not_leave_the_old_fit(small_store, client, tmp_path):
    """After ``fit(..., overwrite=True)`` returns, the model directory holds that fit, even when it
    ran no iteration (``max_iter=0``: the model is the initial M-step)."""
    model_dir = tmp_path / "model"
    fit(small_store, model_dir=model_dir, client=client, settings=FitSettings(max_iter=2, tol=0))
    new = fit(small_store, model_dir=model_dir, client=client, overwrite=True, settings=FitSettings(max_iter=0, seed=3))
    assert_bit_identical(load_model(model_dir), new.model)
    assert load_checkpoint(model_dir).meta["iteration"] == 0


# ------------------------------------------------------------------------------- the automatic hold-out


@pytest.mark.slow
def test_a_fit_resumed_from_its_start_takes_the_uninterrupted_fit_s_steps(small_store, client, tmp_path):
    """``max_iter=0`` leaves an iteration-0 checkpoint with no history; it records the start's held-out choice,
    so the resumed search centres on it as the uninterrupted fit's does: bit-identical, choices included.
    A validation store cannot be added to it: its prior and its choices were made with the hold-out."""
    settings = FitSettings(max_iter=3, tol=0.0)
    whole = fit(small_store, model_dir=tmp_path / "whole", client=client, settings=settings)
    model_dir = tmp_path / "resumed"
    fit(small_store, model_dir=model_dir, client=client, settings=FitSettings(max_iter=0, tol=0.0))
    start = load_checkpoint(model_dir).meta
    assert start["iteration"] == 0 and start["holdout"] is not None
    assert start["last_choice"] == start["hyperparameters"] is not None
    with pytest.raises(FitError, match="without a validation store"):
        fit(small_store, model_dir=model_dir, client=client, settings=settings, resume=True, validation=small_store)
    resumed = fit(small_store, model_dir=model_dir, client=client, settings=settings, resume=True)
    assert_bit_identical(resumed.model, whole.model)
    assert [h["hyperparameters"] for h in resumed.history] == [h["hyperparameters"] for h in whole.history]


@pytest.mark.slow
def test_a_store_sorted_by_target_holds_out_single_rows_of_every_target(client, tmp_path):
    """Stripes of a target-sorted store would hold one or two targets each; its hold-out is single rows, and
    the held-out rows' targets look like the store's."""
    store = write_synthetic(
        tmp_path / "sorted.zarr", 20_000, model=small_truth(), seed=1,
        options=WriteOptions(chunk_rows=2048, partition_rows=4096, row_order="target"),
    )  # fmt: skip
    fit(store, model_dir=tmp_path / "model", client=client, settings=FitSettings(max_iter=0))
    rule = HoldoutRule.from_json(load_checkpoint(tmp_path / "model").meta["holdout"])
    assert rule.stripe_rows == 1
    targets = read_all(str(store.location))[2]
    held = targets[rule.held_out(0, targets.size)]
    share = np.bincount(targets, minlength=T) / targets.size
    held_share = np.bincount(held, minlength=T) / held.size
    assert 0.5 * np.abs(share - held_share).sum() < 0.1


@pytest.mark.slow
def test_early_stopping_with_every_choice_fixed_still_holds_out_rows(small_store, client, tmp_path):
    """Nothing to choose, but an early-stopping metric asked for and no validation store: the fit holds out
    rows to score it on, and each iteration has held-out scores."""
    settings = FitSettings(
        max_iter=2, tol=0.0, sigma2=1.0, emission_strength=1.0, type_strength=1.0, early_stop_metric="perplexity"
    )
    result = fit(small_store, model_dir=tmp_path / "model", client=client, settings=settings)
    assert load_checkpoint(tmp_path / "model").meta["holdout"] is not None
    assert all(h["heldout"] is not None and h["heldout"]["perplexity"] > 1.0 for h in result.history)


# ---------------------------------------------------------------------------------------- warm start


@pytest.mark.slow
def test_warm_start_continues_the_previous_fit_exactly(small_store, client, tmp_path):
    """``init_from`` starts from the saved model: 3 iterations, then 3 more from its directory, equal
    6 uninterrupted iterations bit for bit (log-likelihoods included), and the checkpoint records it."""
    settings = FitSettings(max_iter=3, tol=0)
    first = fit(small_store, model_dir=tmp_path / "first", client=client, settings=settings)
    warm = fit(small_store, model_dir=tmp_path / "warm", client=client, settings=settings, init_from=tmp_path / "first")
    whole = fit(small_store, model_dir=tmp_path / "whole", client=client, settings=FitSettings(max_iter=6, tol=0))

    lls = [h["mean_log_likelihood"] for h in whole.history]
    assert [h["mean_log_likelihood"] for h in first.history] == lls[:3]
    assert [h["mean_log_likelihood"] for h in warm.history] == lls[3:]
    assert warm.history[0]["mean_log_likelihood"] > first.history[-1]["mean_log_likelihood"]
    assert_bit_identical(warm.model, whole.model)
    assert load_checkpoint(tmp_path / "warm").meta["init"] == {
        "kind": "model", "source": str(tmp_path / "first"), "iteration": 3,
    }  # fmt: skip


@pytest.mark.slow
def test_warm_start_from_a_model_of_another_shape_is_refused(small_store, client, tmp_path):
    """A model directory (or a given model) of another (S, N, D, T) is a FitError naming both shapes,
    raised before anything is written."""
    other_store = write_synthetic(
        tmp_path / "other.zarr", 500, num_symbols=10, context_length=3, query_dim=2, num_targets=4, seed=1,
        options=WriteOptions(chunk_rows=256, partition_rows=256),
    )  # fmt: skip
    fit(other_store, model_dir=tmp_path / "other", client=client, settings=FitSettings(max_iter=1))

    message = r"\(10, 3, 2, 4\).*\(30, 4, 5, 12\)"
    with pytest.raises(FitError, match=message):
        fit(small_store, model_dir=tmp_path / "model", client=client, init_from=tmp_path / "other")
    with pytest.raises(FitError, match=message):
        fit(small_store, model_dir=tmp_path / "model", client=client, init=load_model(tmp_path / "other"))
    assert not (tmp_path / "model").exists()


# ------------------------------------------------------------------------------------- degenerate fits


@pytest.mark.slow
def test_sigma2_on_its_floor_is_reported_everywhere(small_store, small_validation_store, client, tmp_path):
    """With ``min_sigma2`` above the data's within-symbol variance (the truth's is 0.5), the learned
    sigma2 sits on the floor, and the result, every iteration's record, the checkpoint's metadata and ``evaluate``
    on the model directory all say so; the log lines say it once, on the first iteration's (the second's is the
    same warning)."""
    lines: list[str] = []
    model_dir = tmp_path / "model"
    learned = FitSettings(max_iter=2, tol=0, estimate_sigma2=True, sigma2=1.0, min_sigma2=10.0)
    result = fit(
        small_store, model_dir=model_dir, client=client, settings=learned,
        say=lambda line: line.startswith("iteration") and lines.append(line),
    )  # fmt: skip
    assert result.model.sigma2 == 10.0

    def on_floor(warnings) -> bool:
        return any("sits on min_sigma2" in w for w in warnings)

    assert on_floor(result.warnings)
    assert all(on_floor(h["warnings"]) for h in result.history)
    assert on_floor(load_checkpoint(model_dir).meta["warnings"])
    assert len(lines) == 2 and "warning: sigma2 = 10 sits on min_sigma2" in lines[0]
    assert "warning" not in lines[1] and result.history[1]["warnings"] == result.history[0]["warnings"]
    assert on_floor(evaluate(model_dir, small_validation_store, client=client).warnings)


@pytest.mark.slow
def test_collapsed_prior_and_dead_symbols_are_reported(client, tmp_path):
    """Rows whose target always comes from context position 0, and whose contexts never hold the
    last symbol: the fit says the prior collapsed onto position 0 and that 1 of 30 symbols got no mass."""
    truth = small_truth()
    rng = np.random.default_rng(7)
    rows = 6000
    context = np.array([rng.choice(S - 1, size=N, replace=False) for _ in range(rows)])
    query = (truth.key_means[context[:, 0]] + np.sqrt(truth.sigma2) * rng.standard_normal((rows, D))).astype(np.float32)
    cumulative = np.cumsum(truth.emission[context[:, 0]], axis=1)
    target = np.minimum((cumulative < rng.random((rows, 1))).sum(axis=1), T - 1)
    path = tmp_path / "collapsed.zarr"
    store = write_arrays(path, context, query, target, num_symbols=S, num_targets=T, options=SMALL)

    # Maximum-likelihood EM (the reference's options) drives the prior onto position 0 within 8 iterations.
    reference_options = FitSettings(
        max_iter=8, tol=0, init="random", estimate_sigma2=True, sigma2=1.0, emission_smoothing=1e-6
    )
    lines: list[str] = []
    result = fit(
        store, model_dir=tmp_path / "model", client=client, settings=reference_options,
        say=lambda line: line.startswith("iteration") and lines.append(line),
    )  # fmt: skip
    assert result.model.position_prior[0] >= 0.99
    assert any("on position 0" in w for w in result.warnings), result.warnings
    assert any(w.startswith(f"1 of {S} symbols received no responsibility mass") for w in result.warnings)
    assert load_checkpoint(tmp_path / "model").meta["warnings"] == result.warnings
    # Each iteration's line gives the warnings its record has and the previous record had not: none twice in a row.
    said = [{w.removeprefix("  warning: ") for w in line.split("\n")[1:]} for line in lines]
    for record, before, line in zip(result.history, [[], *(h["warnings"] for h in result.history)], said, strict=False):
        assert line == set(record["warnings"]) - set(before), (line, record["warnings"], before)
    assert sum(f"1 of {S} symbols received no responsibility mass" in " ".join(line) for line in said) < len(lines)


# -------------------------------------------------------------------------------------------- memory


@pytest.mark.slow
def test_memory_estimate_grows_with_the_emission_and_check_refuses_it():
    """The estimate is dominated by S×T: a small head fits a 400 MiB worker, an S = T = 1500 head does
    not, and the refusal names the shape, both sizes and what to change."""
    limit = 400 * 2**20
    little = estimate_memory(StoreSchema(S, N, D, T), block_rows=256, threads_per_worker=1, fan_in=4)
    large = estimate_memory(StoreSchema(1500, 2, 2, 1500), block_rows=256, threads_per_worker=1, fan_in=4)
    assert large.value_bytes >= 8 * 1500 * 1500 > little.value_bytes
    assert large.worker_bytes - little.worker_bytes >= 8 * 1500 * 1500 * 4
    check_memory(little, worker_limit=limit, shape="small")  # fits: no exception
    with pytest.raises(InsufficientMemoryError, match=r"needs about \d+ MiB on each worker.*400 MiB.*--memory-limit"):
        check_memory(large, worker_limit=limit, shape="large")


@pytest.mark.slow
def test_fit_is_refused_when_the_emission_cannot_fit_the_workers(tmp_path):
    """On an embedded cluster of one 400 MiB worker (``ClusterOptions(n_workers=1, memory_limit=...)``), a store
    with S = T = 1500 is refused with InsufficientMemoryError naming the shape and the limit, before
    the cluster starts (its limit is known from the arguments) and before any checkpoint is written."""
    store = write_synthetic(
        tmp_path / "wide.zarr", 200, num_symbols=1500, context_length=2, query_dim=2, num_targets=1500, seed=3,
        options=WriteOptions(chunk_rows=256, partition_rows=256),
    )  # fmt: skip
    lines: list[str] = []
    with pytest.raises(InsufficientMemoryError) as refused:
        fit(
            store,
            model_dir=tmp_path / "model",
            cluster=ClusterOptions(n_workers=1, memory_limit="400MiB"),
            say=lines.append,
        )
    message = str(refused.value)
    assert "(S, N, D, T) = (1500, 2, 2, 1500)" in message
    assert "smallest worker memory limit is 400 MiB" in message
    assert not any("started a local cluster" in line for line in lines), lines
    assert not (tmp_path / "model").exists()
