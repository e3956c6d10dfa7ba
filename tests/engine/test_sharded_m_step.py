"""The sharded M-step (``FitSettings.m_step_shards``): the E-step's statistics reduce-scattered onto the shards' owners,
each running its shard's M-step; the driver gets scalars only; the owners write the checkpoints' parts.

Whatever runs it, the fit is the driver's M-step fit to the bit: on 1, 2 or 3 workers, with a worker SIGKILLed in an
iteration, and killed then resumed from the parts the owners wrote.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dask
import distributed
import numpy as np
import pytest

from dist_respattn.artifacts.checkpoints import ModelDir, parse_checkpoint
from dist_respattn.engine import FitSettings, fit, load_checkpoint, load_model, placement
from dist_respattn.model.heads.base import Trainer
from dist_respattn.model.heads.mixture import MixtureSpec
from dist_respattn.model.heads.single_hop.accumulator import SufficientStatistics
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.single_hop.sharded import CountsShard
from dist_respattn.store import WriteOptions, write_synthetic
from tests.engine.clusters import local_cluster
from tests.engine.test_bad_input import COMMAND, cli_env

ROOT = Path(__file__).resolve().parents[2]
#: Three iterations with the hold-out's choices after every M-step: the second and third E-steps read heads the
#: owners made and wrote.
SETTINGS = FitSettings(max_iter=3, tol=0.0, patience=100)
LAYOUTS = ("dense", "sparse")


def same_head(a: Any, b: Any) -> None:
    ours, meta = a.to_arrays()
    theirs, their_meta = b.to_arrays()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), name
    assert meta == their_meta


def same_history(a: Any, b: Any) -> None:
    for key in ("mean_log_likelihood", "hyperparameters", "heldout", "n_obs", "sigma2", "warnings"):
        assert [e.get(key) for e in a.history] == [e.get(key) for e in b.history], key


@pytest.fixture(scope="module")
def own_cluster() -> Any:
    """A LocalCluster of two single-threaded worker processes of this module's own, and its client: the tests that
    kill a worker or register a plugin on its workers share it (each started a cluster of its own, a scheduler and
    two worker processes, a few seconds each time). Each leaves it as it found it: two live workers
    (:func:`two_workers`), and no plugin. (Not scaled: a worker killed after a scale down and up was not restarted
    by its nanny.)"""
    with local_cluster(2) as (cluster, client):
        yield cluster, client


def two_workers(client: distributed.Client, gone: tuple[int, ...] = ()) -> dict[str, int]:
    """The pids of the cluster's workers once it has exactly two that answer, none of them a pid of ``gone`` (a
    killed worker the scheduler may still list until it notices)."""
    deadline = time.monotonic() + 60
    while True:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        if len(workers) == 2:
            answers = client.run(os.getpid, workers=list(workers), on_error="return")
            pids = {worker: pid for worker, pid in answers.items() if isinstance(pid, int)}
            if len(pids) == 2 and not set(pids.values()) & set(gone):
                return pids
        assert time.monotonic() < deadline, f"the cluster did not get back to two live workers: {workers}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def long_store(tmp_path_factory) -> str:
    """200,000 rows in 13 partitions: a pass runs as several tasks whose parts meet in combine tasks, and long
    enough to kill a worker in."""
    path = tmp_path_factory.mktemp("long") / "long.zarr"
    write_synthetic(
        path, 200_000, num_symbols=30, context_length=4, query_dim=5, num_targets=12, seed=4,
        options=WriteOptions(chunk_rows=8192, partition_rows=16_384),
    )  # fmt: skip
    return str(path)


def ordered_value(part: int) -> np.ndarray:
    """Partition ``part``'s value: numbers of scales far apart, whose sum depends on the order of the additions."""
    rng = np.random.default_rng(part)
    return rng.standard_normal(64) * 10.0 ** rng.integers(-9, 9, 64)


class SliceSharding:
    """Splits a (64,) value into its first 8 entries (the common part) and shards of 16, 24 and 16."""

    n_shards = 3
    bounds = (8, 24, 48, 64)

    def split(self, value: np.ndarray, tables: Any) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        assert tables == "tables"
        return value[:8].copy(), tuple(value[a:b].copy() for a, b in zip(self.bounds, self.bounds[1:], strict=False))


@pytest.mark.slow
@pytest.mark.parametrize("level", [0, 1])
def test_a_reduce_scatter_gives_each_part_of_the_tree_s_sum_on_its_owner(client, level):
    """Over 11 partitions (fan-in 2), each part's root is that part of the whole tree's sum, to the bit (another order
    of the same additions is not), whether a task reads a partition or folds a subtree; each root is on its owner."""
    from dist_respattn.engine.passes import PassRunner
    from dist_respattn.engine.placement import PassPlan

    runner = PassRunner(client, "0a1b2c3d", fan_in=2)
    whole = runner.run("t", "whole", 11, ordered_value, lambda part: (part,))
    assert not np.array_equal(whole, sum(ordered_value(p) for p in range(11)))  # the order shows in the bits
    workers = sorted(client.ncores())
    owners = [workers[j % len(workers)] for j in range(4)]
    tables = client.scatter("tables", broadcast=True)
    with distributed.get_task_stream(client=client) as stream:
        roots = runner.run_scattered(
            "t", f"parts{level}", 11, ordered_value, lambda part: (part,), sharding=SliceSharding(), tables=tables,
            owners=lambda: owners, plan=PassPlan(level, None),
        )  # fmt: skip
    where = client.who_has(roots)
    parts = client.gather(roots)
    expected = [whole[:8], whole[8:24], whole[24:48], whole[48:]]
    for j in range(4):
        assert np.array_equal(parts[j], expected[j]), j
        assert owners[j] in where[roots[j].key], (j, where)
    combines = {str(r["key"]) for r in stream.data if str(r["key"]).startswith("respattn-t-combine-")}
    assert any(key.startswith(f"respattn-t-combine-parts{level}-p3-") for key in combines), combines


@pytest.fixture(scope="module")
def references(tmp_path_factory, small_store, client) -> dict[str, Any]:
    """The driver's M-step fits of ``small_store`` (``SETTINGS``), per layout, on the module's two workers."""
    return {
        layout: fit(
            small_store,
            model_dir=tmp_path_factory.mktemp(f"reference-{layout}") / "model",
            client=client,
            settings=dataclasses.replace(SETTINGS, emission_layout=layout),
        )
        for layout in LAYOUTS
    }


@pytest.mark.slow
def test_sharded_fits_on_one_two_and_three_workers_are_the_driver_s_fit(small_store, client, references, tmp_path):
    """Each layout, 3 shards: on 1, 2 and 3 workers the heads, log-likelihoods, choices, held-out scores and warnings
    are the driver's M-step fit's, to the bit; the checkpoints are the owners' parts and load as the same head."""
    results: dict[tuple[str, int], Any] = {}
    said: list[str] = []
    for layout in LAYOUTS:
        settings = dataclasses.replace(SETTINGS, emission_layout=layout, m_step_shards=3)
        results[layout, 2] = fit(
            small_store, model_dir=tmp_path / f"{layout}-w2", client=client, settings=settings, say=said.append
        )
    with local_cluster(1) as (cluster, other):
        for layout in LAYOUTS:
            settings = dataclasses.replace(SETTINGS, emission_layout=layout, m_step_shards=3)
            results[layout, 1] = fit(small_store, model_dir=tmp_path / f"{layout}-w1", client=other, settings=settings)
        cluster.scale(3)
        other.wait_for_workers(3, timeout=60)
        with distributed.get_task_stream(client=other) as stream:
            for layout in LAYOUTS:
                settings = dataclasses.replace(SETTINGS, emission_layout=layout, m_step_shards=3)
                results[layout, 3] = fit(
                    small_store, model_dir=tmp_path / f"{layout}-w3", client=other, settings=settings
                )
        keys = [str(record["key"]) for record in stream.data]
        # The owners' M-steps ran, on more than one worker.
        shard_steps = [r for r in stream.data if str(r["key"]).startswith("respattn-mstep-shard")]
        assert shard_steps and len({r["worker"] for r in shard_steps}) >= 2
        # Each E-step value was split into its common part and 3 shards (a small store's pass folds its whole tree
        # into one task, so the parts' trees have no combine task of their own here); so was the start pass's, whose
        # M-step ran on the owners too.
        assert any(key.startswith("respattn-estep-2-part3-") for key in keys), keys
        assert any(key.startswith("respattn-init-0-part3-") for key in keys), keys
        assert any(key.startswith("respattn-mstep-shard2-0-") for key in keys), keys
    assert any(line.startswith("sharded M-step: 3 shards") for line in said), said
    for layout in LAYOUTS:
        reference = references[layout]
        assert reference.model.emission_table.layout == layout
        for workers in (1, 2, 3):
            result = results[layout, workers]
            same_head(result.model, reference.model)
            same_history(result, reference)
            folder = Path(result.model_dir)
            latest = json.loads((folder / "latest.json").read_text())["checkpoint"]
            meta = json.loads((folder / latest / "meta.json").read_text())
            assert meta["version"] == 2 and len(meta["parts"]["shards"]) == 3
            files = [meta["parts"]["common"], *meta["parts"]["shards"]]
            assert all((folder / latest / file).is_file() for file in files)
            same_head(load_model(folder, "latest"), reference.model)
    # EM moved: the equalities are not those of an untouched start.
    history = references["dense"].history
    assert history[-1]["mean_log_likelihood"] > history[0]["mean_log_likelihood"]


@pytest.mark.slow
def test_the_driver_receives_no_statistics_array(small_store, client, references, tmp_path, monkeypatch):
    """Every value the driver gathers during a sharded fit, its start included, is a few scalars (a summary,
    warnings, a checkpoint part's size, the held-out grid's totals, a shard's count of pairs): never statistics,
    never an array of S or T entries, but for the emission prior the start's common part makes (its (T,) base and
    (S,) type counts, once); the driver's M-step fit gathers the whole statistics at its start and in every
    iteration (so the check can fail)."""
    from dist_respattn.model.emission.prior import EmissionPrior
    from dist_respattn.model.heads.single_hop.kind import StartValue

    received: list[tuple[str, Any]] = []
    real_result = distributed.Future.result
    real_gather = distributed.Client.gather

    def result(self: distributed.Future, *args: Any, **kwargs: Any) -> Any:
        value = real_result(self, *args, **kwargs)
        received.append((str(self.key), value))
        return value

    def gather(self: distributed.Client, futures: Any, *args: Any, **kwargs: Any) -> Any:
        values = real_gather(self, futures, *args, **kwargs)
        if isinstance(futures, list):
            received.extend((str(f.key), v) for f, v in zip(futures, values, strict=True))
        elif isinstance(futures, distributed.Future):  # a pass's value, taken straight from its worker
            received.append((str(futures.key), values))
        return values

    monkeypatch.setattr(distributed.Future, "result", result)
    monkeypatch.setattr(distributed.Client, "gather", gather)

    sharded = dataclasses.replace(SETTINGS, emission_layout="sparse", m_step_shards=2)
    said: list[str] = []
    fit(small_store, model_dir=tmp_path / "sharded", client=client, settings=sharded, say=said.append)
    priors = [(key, value) for key, value in received if isinstance(value, EmissionPrior)]
    assert len(priors) == 1 and priors[0][0].startswith("respattn-start-info-0-"), priors
    prior = priors[0][1]
    assert prior.base.shape == (references["sparse"].model.num_targets,)
    assert prior.types.shape == (references["sparse"].model.num_symbols,)
    # The shards' counts of pairs add up to the support the driver never holds.
    counts = [value for key, value in received if key.startswith("respattn-start-info") and isinstance(value, int)]
    table = references["sparse"].model.emission_table
    assert len(counts) == 2 and sum(counts) == table.support.num_pairs
    assert f"sparse emission over {table.support.num_pairs:,} (symbol, target) pairs" in " ".join(said)
    gathered = [(key, value) for key, value in received if not isinstance(value, EmissionPrior)]
    assert any(key.startswith("respattn-heldout-0-") for key, _ in gathered)  # the start's choice is covered
    for key, value in gathered:
        assert not isinstance(value, (SufficientStatistics, CountsShard, dict)), key
        size = len(pickle.dumps(value))
        assert size < 32 * 1024, (key, type(value).__name__, size)
        arrays = [v for v in vars(value).values() if isinstance(v, np.ndarray)] if hasattr(value, "__dict__") else []
        # The grid's totals hold one number per grid point; nothing has an entry per symbol or per pair.
        assert all(a.size <= 600 for a in arrays), (key, [a.shape for a in arrays])
    kinds = {type(value).__name__ for _, value in gathered}
    assert {"ShardSummary", "GridTotals"} <= kinds, kinds
    received.clear()
    driver = dataclasses.replace(sharded, m_step_shards=0)
    fit(small_store, model_dir=tmp_path / "driver", client=client, settings=driver)
    assert any(isinstance(value, StartValue) for _, value in received)
    assert any(isinstance(value, SufficientStatistics) for _, value in received)


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory, long_store, client) -> Any:
    """The driver's M-step fit of ``long_store`` (sparse, ``SETTINGS``) that both killed fits of it are compared with,
    made once on the engine tests' shared cluster (a fit's bits do not depend on the workers it runs on, as the
    1/2/3-worker test shows; before, each test made the same fit after its kill)."""
    settings = dataclasses.replace(SETTINGS, emission_layout="sparse", m_step_shards=0)
    return fit(
        long_store, model_dir=tmp_path_factory.mktemp("long-reference") / "model", client=client, settings=settings
    )


def owner_killer(
    client: distributed.Client, pids: dict[str, int], kill: dict[str, Any], *, running: str, held: str
) -> threading.Thread:
    """A thread that, once a task whose key holds ``running`` runs, SIGKILLs the first worker holding a key that
    starts with ``held`` and records it in ``kill`` (``worker``, ``at``); it gives up after 60 s."""

    def kill_an_owner() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(running in str(k) for keys in client.processing().values() for k in keys):
                holders = [w for w, keys in client.has_what().items() if any(str(k).startswith(held) for k in keys)]
                if holders:
                    os.kill(pids[holders[0]], signal.SIGKILL)
                    kill.update(worker=holders[0], at=time.monotonic())
                    return
            time.sleep(0.002)

    return threading.Thread(target=kill_an_owner, daemon=True)


@pytest.mark.slow
@pytest.mark.parametrize("iteration", [1, 2])
def test_a_worker_killed_mid_iteration_gives_the_same_bits(
    long_store, long_reference, own_cluster, tmp_path, iteration
):
    """SIGKILL of the worker holding a part of the head (an owner) while iteration 1's or 2's E-step runs: its tasks
    and the parts it held are made again (the parts read again from the files the owners wrote: the start's head's,
    or iteration 1's checkpoint; the tables from them), and the fit is the same to the bit."""
    _, client = own_cluster
    pids = two_workers(client)
    kill: dict[str, Any] = {}
    killer = owner_killer(client, pids, kill, running=f"estep-{iteration}-", held="respattn-load")
    said: list[tuple[float, str]] = []

    def say(line: str) -> None:
        said.append((time.monotonic(), line))
        if line.startswith("iteration 1:" if iteration == 2 else "sharded M-step:"):
            killer.start()

    settings = dataclasses.replace(SETTINGS, emission_layout="sparse", m_step_shards=2)
    result = fit(long_store, model_dir=tmp_path / "model", client=client, settings=settings, say=say)
    killer.join(timeout=60)
    two_workers(client, gone=(pids[kill["worker"]],) if kill else ())
    assert kill, f"no owner was killed during iteration {iteration}'s E-step"
    assert kill["at"] < next(t for t, line in said if line.startswith(f"iteration {iteration}:"))
    same_head(result.model, long_reference.model)
    same_history(result, long_reference)


@pytest.mark.slow
def test_a_worker_killed_during_the_sharded_start_gives_the_same_bits(long_store, own_cluster, tmp_path):
    """SIGKILL of an owner of the start's M-step parts while the start's held-out choice runs: the parts it held are
    made again (by Dask from the start's tasks it still knows; else the whole start is made again), and the fit is
    the same to the bit."""
    _, client = own_cluster
    pids = two_workers(client)
    kill: dict[str, Any] = {}
    killer = owner_killer(client, pids, kill, running="heldout-0-", held="respattn-mstep-shard")
    said: list[tuple[float, str]] = []

    def say(line: str) -> None:
        said.append((time.monotonic(), line))
        if line.startswith("sharded M-step:") and not killer.is_alive() and not kill:
            killer.start()

    settings = dataclasses.replace(SETTINGS, emission_layout="sparse", m_step_shards=2, max_iter=1)
    result = fit(long_store, model_dir=tmp_path / "model", client=client, settings=settings, say=say)
    killer.join(timeout=60)
    two_workers(client, gone=(pids[kill["worker"]],) if kill else ())
    reference = fit(long_store, model_dir=tmp_path / "reference", client=client,
                    settings=dataclasses.replace(settings, m_step_shards=0))  # fmt: skip
    assert kill, "no owner was killed during the start's held-out choice"
    assert kill["at"] < next(t for t, line in said if line.startswith("iteration 1:"))
    same_head(result.model, reference.model)
    same_history(result, reference)
    # The start's head was kept beside the checkpoints until the first commit, which removed it.
    assert not [entry.name for entry in (tmp_path / "model").iterdir() if "start-" in entry.name]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_killed_driver_resumes_from_the_owners_parts(small_store, client, tmp_path, layout):
    """The driver SIGKILLed at iteration 2's line: its latest checkpoint is in parts (the owners' files and the
    driver's manifest), and ``--resume`` from it finishes as the uninterrupted fit, to the bit."""
    spec = FitSettings(emission_layout=layout).head_spec()
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_json()))
    # The killed fit's settings (tests/heads/killed_fit.py); the layout is the head spec's.
    settings = FitSettings(max_iter=3, tol=0.0, holdout_fraction=0.0)
    reference = fit(small_store, model_dir=tmp_path / "reference", client=client, settings=settings, head=spec)
    killed = subprocess.run(
        [sys.executable, "-m", "tests.heads.killed_fit", str(tmp_path / "spec.json"), small_store,
         str(tmp_path / "killed"), client.scheduler.address, "3", "2", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    latest = load_checkpoint(tmp_path / "killed", "latest")
    assert latest.iteration == 2 and len(latest.meta["parts"]["shards"]) == 2
    resumed = fit(
        small_store, model_dir=tmp_path / "killed", client=client, head=spec, resume=True,
        settings=dataclasses.replace(settings, m_step_shards=2),
    )  # fmt: skip
    same_head(resumed.model, reference.model)
    assert [e["mean_log_likelihood"] for e in resumed.history] == [e["mean_log_likelihood"] for e in reference.history]


@pytest.mark.slow
def test_a_checkpoint_of_the_previous_format_resumes_sharded_and_parts_copy_as_one_file(
    small_store, client, references, tmp_path
):
    """A fit checkpointed by the driver (one ``params.npz``) resumed with the sharded M-step gives the uninterrupted
    fit; the parts' checkpoint copies (a registry's version) as one ``params.npz`` holding the same head."""
    first = dataclasses.replace(SETTINGS, max_iter=1, emission_layout="dense")
    fit(small_store, model_dir=tmp_path / "model", client=client, settings=first)
    old = load_checkpoint(tmp_path / "model", "latest")
    assert "parts" not in old.meta and old.meta["version"] == 1
    resumed = fit(
        small_store, model_dir=tmp_path / "model", client=client, resume=True,
        settings=dataclasses.replace(SETTINGS, emission_layout="dense", m_step_shards=2),
    )  # fmt: skip
    same_head(resumed.model, references["dense"].model)
    same_history(resumed, references["dense"])
    folder = ModelDir(tmp_path / "model")
    name = folder.pointed("latest")
    assert name is not None and "parts" in load_checkpoint(tmp_path / "model", "latest").meta
    files = folder.read_files(name)
    copy = tmp_path / "copy.npz"
    copy.write_bytes(files.params)
    meta = json.loads(files.meta)
    assert "parts" not in meta and meta["version"] == 1
    single = parse_checkpoint(name, meta, copy, meta_source="meta", params_source=str(copy))
    same_head(single.model, references["dense"].model)


class KeysSeen(distributed.diagnostics.plugin.SchedulerPlugin):
    """Every key the scheduler was given while it is registered (its first transition)."""

    name = "keys-seen"

    def __init__(self) -> None:
        self.keys: list[str] = []

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "released" and finish == "waiting":
            self.keys.append(str(key))


@pytest.mark.slow
def test_more_shards_than_symbols_are_one_a_symbol_said_so_and_the_last_head_is_not_read_again(
    small_store, client, references, tmp_path
):
    """m_step_shards beyond the store's S = 30 symbols: the M-step runs in 30 shards, one a symbol, and the line
    that announces them says why; the fit is the driver's M-step's to the bit (a shard of one column of a dense
    table totals it as the whole table does). The fit's last checkpoint is not read back by a task a part (no pass
    comes after it: the driver reads its head from the files); before, those reads were still running as the
    command's client closed, and the embedded scheduler logged a traceback for each."""
    settings = dataclasses.replace(SETTINGS, emission_layout="dense", m_step_shards=100_000)
    said: list[str] = []
    client.register_plugin(KeysSeen())
    try:
        result = fit(small_store, model_dir=tmp_path / "model", client=client, settings=settings, say=said.append)
        # Through the same stream as the fit's last submissions: the scheduler has been given them all by now.
        client.submit(int, 0, pure=False).result()
        keys = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins[KeysSeen.name].keys))
    finally:
        client.unregister_scheduler_plugin(KeysSeen.name)
    assert (
        "sharded M-step: 30 shards of the symbols on 2 workers (m_step_shards 100000 asks for more shards than the "
        "30 symbols; each shard holds one at least)"
    ) in said, said
    same_head(result.model, references["dense"].model)
    same_history(result, references["dense"])
    last = str(ModelDir(tmp_path / "model").pointed("latest"))
    reads = [key for key in keys if key.startswith("respattn-load")]
    assert any("ckpt-000002" in key for key in reads), reads  # the iterations' heads are read from their checkpoints
    assert [key for key in reads if last in key] == []


@pytest.mark.slow
def test_the_command_says_in_one_line_how_many_shards_it_runs_and_closes_its_cluster_without_a_traceback(
    small_store, tmp_path
):
    """``fit --m-step-shards 100000`` on its own cluster (whose scheduler logs into the command's stderr): the
    shards it runs, why, and (30 on one worker) what so many cost in one line, in the command line's words, and no
    traceback as the cluster closes."""
    done = subprocess.run(
        [COMMAND, "fit", small_store, "--model-dir", str(tmp_path / "model"), "--m-step-shards", "100000",
         "--max-iter", "2", "--workers", "1"],
        capture_output=True, text=True, env=cli_env(), timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "sharded M-step: 30 shards of the symbols on 1 worker (--m-step-shards 100000 asks for more shards than the "
        "30 symbols; each shard holds one at least); 30 shards a worker: each shard is a combine tree, a task and a "
        "file every pass, and more than one a worker makes no worker's part smaller (--m-step-shards 1 to 4 suits 1 "
        "worker)"
    ) in done.stderr.splitlines(), done.stderr
    assert "Traceback" not in done.stderr and "CRITICAL" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_kind_without_a_sharded_m_step_keeps_the_driver_s(small_store, client, tmp_path):
    """A kind that does not opt in (the mixture) runs its M-step on the driver with ``m_step_shards`` set, says so,
    and fits as without it; the protocol's default is the driver's."""
    assert Trainer.sharded_m_step(object(), 4) is None  # type: ignore[arg-type]
    spec = MixtureSpec(components=2, component=SingleHopSpec(sigma2=0.5), seed=4)
    settings = FitSettings(max_iter=2, tol=0.0)
    said: list[str] = []
    asked = fit(small_store, model_dir=tmp_path / "asked", client=client, head=spec, say=said.append,
                settings=dataclasses.replace(settings, m_step_shards=2))  # fmt: skip
    plain = fit(small_store, model_dir=tmp_path / "plain", client=client, head=spec, settings=settings)
    assert "this kind's M-step runs on the driver (it has no sharded M-step)" in said
    same_head(asked.model, plain.model)
    assert "parts" not in load_checkpoint(tmp_path / "asked", "latest").meta


def test_the_owners_warnings_are_the_head_s():
    """The warnings a sharded M-step gives from its common part (a collapsed prior, symbols with no mass) are those
    the driver's M-step gives of the whole head."""
    from dist_respattn.model.emission.prior import EmissionPrior
    from dist_respattn.model.fitting.selection import Hyperparameters
    from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings
    from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
    from dist_respattn.model.heads.single_hop.sharded import CommonPart, SingleHopSharding

    s, n, d, t = 30, 4, 5, 12
    estimator = SingleHopSpec(emission_prior="uniform").estimator((s, n, d, t)).resolved(EmissionPrior.uniform(s, t))
    sharding = SingleHopSharding(estimator, "dense", None, 3)
    rng = np.random.default_rng(0)
    key_mass = rng.random(s)
    key_mass[[3, 17]] = 0.0
    prior = np.array([0.997, 0.001, 0.001, 0.001])
    part = CommonPart(rng.standard_normal((s, d)), prior, key_mass, summary=None)  # type: ignore[arg-type]
    choice = Hyperparameters(0.5, 1.0, 0.0)
    head = ResponsibilityAttentionDistribution(part.key_means, np.full((s, t), 1.0 / t), prior, 0.5)
    expected = degeneracy_warnings(head, key_mass=key_mass)
    assert len(expected) == 2
    assert sharding.warnings(choice, part) == expected


def test_a_sharded_start_s_parts_add_up_to_the_whole_start_s():
    """The start values of three partitions, split by symbol range (a sparse shard keeps the support of its own
    pairs) and summed part by part, are the split of their sum to the bit: the common part's statistics and pairs,
    each shard's counts in the whole support's order; the shards' supports join into the whole support."""
    import functools

    from dist_respattn.model.emission.layouts import PairSupport
    from dist_respattn.model.emission.pairs import PairCounts
    from dist_respattn.model.heads.base import combine
    from dist_respattn.model.heads.single_hop.kind import StartValue
    from dist_respattn.model.heads.single_hop.sharded import SingleHopStart, join_supports, shard_pairs

    s, n, d, t = 60, 4, 3, 40  # 1,200 draws a partition over 2,400 cells: each partition has pairs of its own
    spec = SingleHopSpec(emission_layout="sparse")
    trainer = spec.trainer(_context((s, n, d, t)))
    begin = SingleHopStart(trainer, trainer.start_request(), 3)
    rng = np.random.default_rng(7)
    values = []
    for _ in range(3):
        context = rng.integers(0, s, (300, n)).astype(np.int32)
        target = rng.integers(0, t, 300).astype(np.int32)
        weights = rng.random(300) * 10.0 ** rng.integers(-3, 3, 300)
        accumulator = trainer.factory.make()
        accumulator.seq_initialize_uniform((context, rng.standard_normal((300, d)), target), weights)
        pairs = PairCounts.from_rows(context[:, -1], target, weights, num_symbols=s, num_targets=t)
        values.append(StartValue(accumulator.value(copy=True), pairs))
    whole = combine(values)
    sizes = {v.stats.emission_count.support.num_pairs for v in values}
    assert len(sizes) > 1 and whole.stats.emission_count.support.num_pairs > max(sizes)
    parts = [begin.split(v, None) for v in values]
    common = combine([p[0] for p in parts])
    shards = [combine([p[1][k] for p in parts]) for k in range(3)]
    for name in ("key_sum", "key_mass", "position_count"):
        assert np.array_equal(getattr(common.stats, name), getattr(whole.stats, name)), name
    assert (common.stats.query_sq, common.stats.n_obs) == (whole.stats.query_sq, whole.stats.n_obs)
    assert np.array_equal(common.pairs.keys, whole.pairs.keys)
    assert np.array_equal(common.pairs.counts, whole.pairs.counts)
    support = whole.stats.emission_count.support
    joined = join_supports([shard.counts.support for shard in shards])
    assert np.array_equal(joined.indptr, support.indptr) and np.array_equal(joined.symbols, support.symbols)
    assert isinstance(joined, PairSupport) and joined.symbols.dtype == support.symbols.dtype
    for k, pairs in enumerate(shard_pairs(support, begin.bounds)):
        assert np.array_equal(
            begin.shard_statistics(k, shards[k]).counts, whole.stats.emission_count.counts[pairs.pairs]
        )
    # The order of the additions shows in the bits (so the equalities above can fail).
    reversed_sum = functools.reduce(lambda a, b: a + b, values[::-1])
    assert not np.array_equal(reversed_sum.stats.emission_count.to_dense(), whole.stats.emission_count.to_dense())


def _context(shape: tuple[int, int, int, int]) -> Any:
    from dist_respattn.model.heads.base import TrainerContext

    return TrainerContext(shape, None, None, {}, {}, {}, {})


def test_a_driver_s_part_of_the_tables_is_made_whole_from_a_head_s_common_part():
    """After a sharded start the driver holds the tables' part of a fixed size (the prior's base and type counts);
    a worker makes them whole from a head's common arrays (its checkpoint's common file): the support of the whole
    tables, the same base and types. A dense fit's, and whole tables, are as they are."""
    from dist_respattn.model.emission.layouts import PairSupport
    from dist_respattn.model.emission.prior import EmissionPrior
    from dist_respattn.model.fitting.selection import Hyperparameters
    from dist_respattn.model.heads.single_hop.sharded import CommonPart, SingleHopSharding

    s, n, d, t = 30, 4, 5, 12
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, s * t, 150))
    support = PairSupport.from_keys(keys, s, t)
    base = rng.random(t) + 0.1
    prior = EmissionPrior("continuation", base / base.sum(), rng.integers(1, 5, s).astype(np.float64))
    estimator = SingleHopSpec().estimator((s, n, d, t)).resolved(prior)
    whole = SingleHopSharding(estimator, "sparse", support, 2)
    part = SingleHopSharding(estimator, "sparse", None, 2)
    assert part.tables().support is None and whole.tables().support is support
    common = CommonPart(rng.standard_normal((s, d)), np.full(n, 1.0 / n), rng.random(s), summary=None)  # type: ignore[arg-type]
    arrays = whole.common_arrays(Hyperparameters(0.5, 1.0, 1.0), common, whole.tables())
    made = part.tables_from(part.tables(), arrays)
    assert np.array_equal(made.support.indptr, support.indptr) and np.array_equal(made.support.symbols, support.symbols)
    assert made.base is part.tables().base and made.types is part.tables().types
    assert np.array_equal(made.base, prior.base) and np.array_equal(made.types, prior.types)
    assert whole.tables_from(whole.tables(), arrays) is whole.tables()
    dense = SingleHopSharding(estimator, "dense", None, 2)
    assert dense.tables_from(dense.tables(), arrays) is dense.tables()


def test_bounds_cut_at_equal_work_are_ranges_of_about_equal_work():
    """Cut at a skewed work (ids in frequency order, as a vocabulary's): every shard at least one symbol, the largest
    near the mean (or the heaviest symbol's), where equal ranges put most of the work in the first; no work gives
    equal ranges."""
    from dist_respattn.model.heads.single_hop.sharded import shard_bounds

    work = 1000.0 / np.arange(1, 2001) ** 0.8
    for n in (2, 8, 64):
        bounds = shard_bounds(2000, n, work)
        assert bounds[0] == 0 and bounds[-1] == 2000 and len(bounds) == n + 1
        assert all(a < b for a, b in itertools.pairwise(bounds))
        held = [work[a:b].sum() for a, b in itertools.pairwise(bounds)]
        equal = shard_bounds(2000, n)
        even = [work[a:b].sum() for a, b in itertools.pairwise(equal)]
        # No cut does better than the mean or the heaviest symbol alone.
        assert max(held) < 1.1 * max(np.mean(held), work.max()) and max(even) / np.mean(even) > 1.5, (n, held, even)
    assert shard_bounds(5, 3, np.array([100.0, 0, 0, 0, 0])) == (0, 1, 2, 5)  # one symbol a shard at least
    assert shard_bounds(10, 3, np.zeros(10)) == shard_bounds(10, 3)


@pytest.fixture(scope="module")
def skewed_store(tmp_path_factory) -> str:
    """A token stream of 400 symbols whose ids follow frequency (a Zipf law): equal ranges of ids hold very unequal
    numbers of (symbol, target) pairs."""
    from dist_respattn.store.ingest.to_stream import write_stream_tokens

    rng = np.random.default_rng(7)
    tokens = np.minimum(rng.zipf(1.3, 60_000) - 1, 399).astype(np.int64)
    path = tmp_path_factory.mktemp("skewed") / "skewed.zarr"
    write_stream_tokens(path, tokens, 4, num_symbols=400, options=WriteOptions(chunk_rows=8192, partition_rows=16_384))
    return str(path)


def _shard_pairs(folder: Path) -> tuple[list[int], list[int]]:
    """The bounds a checkpoint's manifest records and each shard's count of pairs (its part's emission values)."""
    latest = load_checkpoint(folder, "latest")
    name = ModelDir(folder).pointed("latest")
    assert name is not None
    pairs = []
    for file in latest.meta["parts"]["shards"]:
        with np.load(folder / name / file) as part:
            pairs.append(int(part["emission_values"].shape[0]))
    return latest.meta["parts"]["bounds"], pairs


@pytest.mark.slow
def test_a_sparse_fit_s_shards_hold_about_equal_pairs_and_a_resumed_fit_keeps_their_bounds(
    skewed_store, client, tmp_path
):
    """On a skewed store the sharded start cuts its 4 shards at about equal pairs (where equal ranges of ids put most
    in the first); the manifest records the bounds; a resumed fit, whose driver holds the support and would cut it
    otherwise, keeps them; both fits are the driver's M-step's to the bit."""
    from dist_respattn.model.heads.single_hop.sharded import shard_bounds, support_bounds

    settings = FitSettings(max_iter=1, tol=0.0, patience=100, emission_layout="sparse", m_step_shards=4)
    said: list[str] = []
    fit(skewed_store, model_dir=tmp_path / "model", client=client, settings=settings, say=said.append)
    bounds, pairs = _shard_pairs(tmp_path / "model")
    assert len(bounds) == 5 and max(pairs) / np.mean(pairs) < 1.35, (bounds, pairs)
    assert any(line.startswith("the 4 shards hold") for line in said), said
    support = load_checkpoint(tmp_path / "model", "latest").model.emission_table.support
    equal = shard_bounds(400, 4)
    by_range = [int(np.count_nonzero((support.symbols >= a) & (support.symbols < b))) for a, b in
                itertools.pairwise(equal)]  # fmt: skip
    assert sum(by_range) == sum(pairs) and max(by_range) / np.mean(by_range) > 2.0, by_range
    assert list(support_bounds(support, 4)) != bounds  # what a resumed fit would cut without the record
    longer = dataclasses.replace(settings, max_iter=3)
    resumed = fit(skewed_store, model_dir=tmp_path / "model", client=client, settings=longer, resume=True)
    assert _shard_pairs(tmp_path / "model")[0] == bounds
    reference = fit(skewed_store, model_dir=tmp_path / "reference", client=client,
                    settings=dataclasses.replace(longer, m_step_shards=0))  # fmt: skip
    same_head(resumed.model, reference.model)
    same_history(resumed, reference)


def _holds_support(value: Any) -> bool:
    """Whether a task's value carries a sparse support: a common part's arrays, or the tables."""
    if isinstance(value, dict):
        return "support_symbols" in value
    return getattr(value, "support", None) is not None


class SupportWatch(distributed.WorkerPlugin):
    """Records, on each worker, every value holding the support that arrives: read by a task of the checkpoints'
    parts (``respattn-load``) or fetched from another worker."""

    name = "support-watch"

    def setup(self, worker: Any) -> None:
        self.worker = worker
        worker.support_arrivals = []

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish != "memory":
            return
        value = self.worker.data.get(key) if key in self.worker.data else None
        read = start == "executing" and str(key).startswith("respattn-load")
        if (read or start == "flight") and _holds_support(value):
            self.worker.support_arrivals.append((str(key), start))


@pytest.mark.slow
def test_the_head_s_parts_read_each_iteration_leave_the_support_out(small_store, references, own_cluster, tmp_path):
    """A sparse sharded fit of 3 iterations on 2 workers: the checkpoints hold the support, but no read of a
    checkpoint's common part for the next passes brings it (the tables hold it), and the only values holding it that
    Dask moves between the workers are the tables; the fit is the driver's to the bit."""
    settings = dataclasses.replace(SETTINGS, emission_layout="sparse", m_step_shards=2)
    _, client = own_cluster
    two_workers(client)
    client.register_plugin(SupportWatch())  # its setup starts each worker's record afresh
    try:
        said: list[str] = []
        result = fit(small_store, model_dir=tmp_path / "model", client=client, settings=settings, say=said.append)
        arrivals = client.run(lambda dask_worker: dask_worker.support_arrivals)
    finally:
        client.unregister_worker_plugin(SupportWatch.name)
    assert sum(line.startswith("iteration ") for line in said) == 3
    folder = tmp_path / "model"
    latest = load_checkpoint(folder, "latest")
    with np.load(folder / str(ModelDir(folder).pointed("latest")) / latest.meta["parts"]["common"]) as common:
        assert "support_symbols" in common.files
    got = [(key, start) for keys in arrivals.values() for key, start in keys]
    assert [key for key, start in got if start == "executing"] == [], got
    assert all(key.startswith("respattn-shard-tables") for key, _ in got), got
    same_head(result.model, references["sparse"].model)
    same_history(result, references["sparse"])


def _fixed_table(key: str) -> bool:
    """Whether ``key`` is a table fixed for a fit (the driver's sparse support, the sharded M-step's tables or their
    driver's part), not a task reading or digesting one."""
    words = key.split("-")
    return key.startswith(("respattn-table-", "respattn-shard-table")) and words[-1] not in ("read", "digest")


class TableServes(distributed.WorkerPlugin):
    """Records, on each worker, every fixed table of a fit it sends to another process (its key, its pickle's bytes,
    the peer): the transfers Dask makes to a worker whose task needs it and the fetches of a task alike go through the
    worker's ``get_data``; and the fixed tables the driver's scatter sends it (through its ``update_data``)."""

    name = "table-serves"

    def setup(self, worker: Any) -> None:
        worker.table_serves = []
        worker.tables_scattered = set()
        original = worker.handlers["get_data"]
        original_update = worker.handlers["update_data"]

        async def get_data(comm: Any, keys: Any, who: Any = None, serializers: Any = None) -> Any:
            for key in keys:
                if _fixed_table(str(key)) and key in worker.data:
                    size = len(pickle.dumps(worker.data[key], protocol=5))
                    worker.table_serves.append((str(key), size, str(comm.peer_address)))
            return await original(comm, keys=keys, who=who, serializers=serializers)

        def update_data(data: Any, stimulus_id: Any = None) -> Any:
            worker.tables_scattered.update(str(key) for key in data if _fixed_table(str(key)))
            return original_update(data=data, stimulus_id=stimulus_id)

        worker.handlers["get_data"] = get_data
        worker.handlers["update_data"] = update_data


def _tables_met(dask_worker: Any) -> tuple[list[tuple[str, int, str]], set[str], list[str]]:
    """A worker's meters (:class:`TableServes`), then cleared: the tables it served, those the driver sent it, and
    those its tasks fetched from another worker (:data:`~dist_respattn.engine.held_tables.FETCHED`)."""
    from dist_respattn.engine import held_tables

    met = (list(dask_worker.table_serves), set(dask_worker.tables_scattered), [k for _, k, _ in held_tables.FETCHED])
    dask_worker.table_serves.clear()
    dask_worker.tables_scattered.clear()
    held_tables.FETCHED.clear()
    return met


@pytest.mark.slow
def test_the_fit_s_tables_reach_each_worker_once(long_store, tmp_path, monkeypatch):
    """A sparse fit of 3 iterations on 2 workers, its M-step on the driver and in 2 shards, under a memory manager
    that drops the spare copies of every value no task waits for every 20 ms (Dask's default: 2 s): no worker the
    driver sent a table to fetches it from another (each keeps it as it arrives; a worker often lost its copy before
    its first task read it, and fetched it then), and a table goes from one worker to another at most once (one the
    driver sent only to the workers of a small pass, or one made on a worker; each worker fetched them again for
    each pass before); the fits are the same to the bit. Every pass runs on both workers, as on a large store (a small
    pass on this store would run on one, and its tables go to that one alone)."""
    monkeypatch.setattr(placement, "WORKER_ROWS", 0.0)
    monkeypatch.setattr(placement, "BYTES_PER_ROW", float("inf"))
    serves: dict[int, list[tuple[str, int, str]]] = {}
    results = {}
    with (
        dask.config.set({"distributed.scheduler.active-memory-manager.interval": "20ms"}),
        local_cluster(2) as (_, client),
    ):
        client.register_plugin(TableServes())
        for shards in (0, 2):
            settings = dataclasses.replace(SETTINGS, emission_layout="sparse", m_step_shards=shards)
            results[shards] = fit(long_store, model_dir=tmp_path / f"model-{shards}", client=client, settings=settings)
            got = client.run(_tables_met)
            serves[shards] = [serve for values, _, _ in got.values() for serve in values]
            assert any(scattered for _, scattered, _ in got.values()), got  # the meter sees what the driver sends
            for _, scattered, fetched in got.values():
                assert not scattered & set(fetched), (shards, got)  # kept as they arrived
    for shards, served in serves.items():
        keys = [key for key, _, _ in served]
        assert all(keys.count(key) == 1 for key in keys), (shards, served)  # 2 workers: one fetch at most
        assert len(set(keys)) <= 2, (shards, served)  # the tables (and a sharded start's driver's part), made once
    same_head(results[2].model, results[0].model)
    same_history(results[2], results[0])
