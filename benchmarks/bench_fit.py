"""Distributed EM fit throughput, side by side: our engine on 2 and 1 workers, the bare kernel, mixle's Dask backend.

Measures, in one run on the reference shape (S=2000, N=16, D=32, T=2000; ``--symbols`` / ``--targets`` set a smaller S
and T for a quicker smoke run) and a local synthetic store of
``--rows`` triples (default 1,000,000; default chunking) sampled from ``random_distribution(..., seed=0)``:

- our fit, ``dist_respattn.engine.fit(store, client=..., init=<fixed start>, FitSettings(max_iter, tol=0))``, on a
  ``LocalCluster`` of 2 worker processes x 1 thread and on a fresh one of 1 worker x 1 thread (127.0.0.1; both
  with the embedded cluster's quieter Dask settings and forked workers,
  ``dist_respattn.engine.cluster.embedded_cluster_settings()``):
  rows/s per iteration (the median over the iterations of rows / seconds, the seconds from ``result.history``:
  E-step + gather + M-step; what follows it, the checkpoint hand-off and the log line, is timed apart), and the
  scaling 2 vs 1 workers;
- where an iteration's time goes (2 workers), from the scheduler's task stream and the driver's clock: scatter of
  the parameters + submission, the E-step tasks, the combine tree, gather + M-step, checkpoint hand-off + log line;
- the whole fit on 2 workers against 1, side by side as a ratio: ``result.seconds`` with the cluster up, the same
  with the cluster's start and shutdown, the iterations after the first, and the CPU seconds the fit cost (this
  process, which runs the scheduler and the nannies, and every worker process: ``getrusage`` before and after the
  fit, steadier than wall time when other work shares the host); for the fits above and ``--pairs``
  more pairs on fresh clusters (alternating which goes first), since a 2-core host's figures move from run to run;
- time to the first iteration: ``result.first_iteration_seconds`` with the cluster already up, and the same for
  a ``fit`` that starts its own embedded cluster (``n_workers=2``, one iteration; the cluster start included);
- the bare kernel in this process on the same rows: every partition read into memory (untimed), then
  ``ResponsibilityAttentionAccumulator.seq_update`` a partition at a time (the numba kernel, in its own blocks), and
  the ratio (our seconds per iteration) / (kernel seconds / workers);
- mixle 0.8.2's ``optimize(..., backend='dask')`` with 2 workers on the first ``--mixle-rows`` rows (its Dask
  backend is slow, so a smaller row count is allowed and stated), via ``benchmarks/mixle_dask.py``; and again on
  ``--mixle-rows-large`` rows: its seconds per iteration are a large fixed part plus a part per row, so the two
  points give both, and mixle's rows/s extrapolated to ``--rows`` (the ratio at equal rows, printed beside the
  target's ratio, which is taken at ``--mixle-rows`` as the issue allows);
- peak memory (VmHWM) of this driver (which also runs the LocalCluster's scheduler) during the 2-worker fit and of
  each worker after each fit, and the worker peak of a second 2-worker fit on a store of ``--memory-rows`` rows
  (default 4 x rows, fewer iterations) on a fresh cluster: the worker peak must stay flat as rows grow. The larger
  row count is the default because a store of fewer partitions than the combine tree's fan-in (4) runs a smaller
  combine or none at all: its lower peak would come from the tree's shape, not from the rows.

Targets (measured, not asserted: PASS/MISS beside each): ours >= 30x mixle in rows/s per iteration; 2 workers
>= 1.6x 1 worker; per-iteration time <= 1.3x the kernel's time / workers; first iteration < 10 s; worker
peak flat (the largest worker peak at the larger of ``--rows`` / ``--memory-rows`` at most 1.25x the one at the
smaller); the whole fit on 2 workers no slower than on 1 (the median ratio of the pairs).

Every process runs one thread (the thread-count variables are set to 1 before NumPy is imported; worker
processes inherit them). The host's cores are shared by the workers, the scheduler and this driver, which the
report states; its load average before and after is printed, since other work on the host skews every figure.

Run::

    python benchmarks/bench_fit.py                                  # 1,000,000 rows, 5 iterations
    python benchmarks/bench_fit.py --rows 50000 --iterations 2 --mixle-rows 2000 --json   # a smoke run
    python benchmarks/bench_fit.py --rows 8000 --symbols 300 --targets 300 --json         # a quicker one, S = T = 300
    python benchmarks/bench_fit.py --rows 300000 --skip-mixle --skip-embedded --pairs 2   # a small store: 2 vs 1

Worker processes are spawned, so everything runs under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os

# One thread for every process (the kernel is single-threaded; workers inherit these).
# Must happen before NumPy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import distributed  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
from measure import (  # noqa: E402
    best_of,
    current_rss_bytes,
    max_relative_difference,
    peak_rss_bytes,
    release_free_memory,
    reset_peak_rss,
    time_once,
)

import dist_respattn  # noqa: E402
from dist_respattn import ResponsibilityAttentionDistribution, random_distribution  # noqa: E402
from dist_respattn.engine import ClusterOptions, FitResult, FitSettings, estimate_memory, fit  # noqa: E402
from dist_respattn.engine.cluster import embedded_cluster_settings  # noqa: E402
from dist_respattn.store import TripleStore, WriteOptions, write_synthetic  # noqa: E402

#: The engine's figures are measured with the reference library's M-step (learned sigma2, additive smoothing,
#: no held-out choices), whose iteration is the E-step pass, the reduction and the M-step: the parts every fit
#: has. The default recipe adds one pass over the held-out rows per iteration; bench_quality.py times whole fits.
REFERENCE_OPTIONS: dict[str, Any] = {
    "estimate_sigma2": True,
    "sigma2": 1.0,
    "emission_smoothing": 1e-6,
    "init": "random",
}

MIB = 2**20

#: The reference shape of the issue.
SHAPE = (2000, 16, 32, 2000)

#: Targets of the issue.
TARGET_VS_MIXLE = 30.0
TARGET_SCALING = 1.6
TARGET_OVER_KERNEL = 1.3
TARGET_FIRST_ITERATION_S = 10.0
#: "Worker peak memory flat as rows grow": the largest worker peak at the larger row count over the one at the smaller.
TARGET_MEMORY_GROWTH = 1.25

#: Rows the numba JIT is warmed up on in this process (compile time must not be timed).
WARMUP_ROWS = 256

#: Keys of our fit's tasks: ``respattn-estep-<iter>-<part>-<tag>``, ``respattn-combine-<iter>-<level>-<i>-<tag>``.
KEY_PATTERN = re.compile(r"^respattn-(estep|combine)-(\d+)-(\d+)-(?:(\d+)-)?[0-9a-f]{8}(?:\.\d+)?$")


# ------------------------------------------------------------------------------------------ clusters


def local_cluster(workers: int) -> distributed.LocalCluster:
    """Worker processes x 1 thread on 127.0.0.1; no bokeh dashboard, the scheduler's HTTP server on a free port; the
    embedded cluster's Dask settings and forked workers (``embedded_cluster_settings``), as a fit that starts its own
    cluster has."""
    with embedded_cluster_settings():
        return distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
            silence_logs=logging.ERROR,
        )


@contextlib.contextmanager
def cluster_client(workers: int) -> Iterator[tuple[distributed.Client, float]]:
    """A fresh cluster and its client (closed on exit), and the seconds it took to come up."""
    start = time.perf_counter()
    with local_cluster(workers) as cluster, distributed.Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(workers, timeout=60)
        yield client, time.perf_counter() - start


def process_cpu_seconds() -> float:
    """CPU seconds of the calling process, every thread (run on the workers through ``client.run``)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cluster_cpu_seconds(client: distributed.Client) -> float:
    """CPU seconds of this process and of every worker process so far."""
    return process_cpu_seconds() + sum(client.run(process_cpu_seconds).values())


def process_peak_bytes() -> int:
    """This process's VmHWM (run on the workers through ``client.run``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def cluster_peaks(client: distributed.Client) -> dict[str, Any]:
    """VmHWM of every worker, by address. (A LocalCluster's scheduler runs in this process: its peak is ours.)"""
    workers = client.run(process_peak_bytes)
    return {"worker_peak_bytes": [workers[address] for address in sorted(workers)]}


# ------------------------------------------------------------------------------------------- the host


def host_busy_seconds() -> float | None:
    """CPU seconds every process on the host has used since boot (``/proc/stat``), or ``None``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the cluster's workers, once closed)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class HostLoad:
    """How much CPU other processes took while the benchmark ran: other work on the host skews every figure."""

    def __init__(self) -> None:
        self.load_before = os.getloadavg()
        self.wall = time.perf_counter()
        self.busy = host_busy_seconds()
        self.own = own_cpu_seconds()

    def finish(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall
        busy = host_busy_seconds()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        other = None
        if busy is not None and self.busy is not None:
            other = max(0.0, (busy - self.busy) - (own_cpu_seconds() - self.own))
        return {
            "load_before": list(self.load_before),
            "load_after": list(os.getloadavg()),
            "run_seconds": wall,
            "other_cpu_seconds": other,
            "other_cpu_share": None if other is None else other / (wall * cores),
        }


# ---------------------------------------------------------------------------------------------- fits


@dataclasses.dataclass
class FitRun:
    """One of our fits: its result, its stamped progress lines, the call's start (``time.time()``) and, with a
    client, the scheduler's task stream of the fit and every worker's address (also one that ran no task)."""

    result: FitResult
    clock: Clock
    called: float
    records: list[dict[str, Any]]
    workers: list[str]
    #: CPU seconds the fit cost: this process (driver, scheduler, nannies) and every worker process, or ``None``.
    cpu_seconds: float | None = None


class Clock:
    """Receives the fit's progress lines and stamps them (``time.time()``, the task stream's clock)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def __call__(self, text: str) -> None:
        self.lines.append((time.time(), text))

    def iteration_stamps(self) -> list[float]:
        return [stamp for stamp, text in self.lines if text.startswith("iteration ")]


def run_fit(
    store: TripleStore,
    model_dir: str,
    start: ResponsibilityAttentionDistribution,
    iterations: int,
    *,
    client: distributed.Client | None = None,
    n_workers: int | None = None,
) -> FitRun:
    """Our fit from ``start`` on the client's cluster, or on an embedded one of ``n_workers``."""
    clock = Clock()
    settings = FitSettings(max_iter=iterations, tol=0.0, **REFERENCE_OPTIONS)
    kwargs: dict[str, Any] = (
        {"client": client} if client is not None else {"cluster": ClusterOptions(n_workers=n_workers)}
    )
    stream: Any = distributed.get_task_stream(client) if client is not None else contextlib.nullcontext()
    cpu_before = cluster_cpu_seconds(client) if client is not None else 0.0
    with stream as tasks:
        called = time.time()
        result = fit(store, model_dir=model_dir, init=start, settings=settings, say=clock, progress=False, **kwargs)
    if len(clock.iteration_stamps()) != result.iterations:
        raise RuntimeError(f"expected {result.iterations} iteration lines, got {clock.lines}")
    if client is None:
        return FitRun(result, clock, called, [], [])
    cpu = cluster_cpu_seconds(client) - cpu_before
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    return FitRun(result, clock, called, list(tasks.data), workers, cpu)


def iteration_breakdown(run: FitRun) -> list[dict[str, Any]]:
    """Per iteration, where the wall time went (seconds), from the task stream and the driver's stamps.

    An iteration starts when the previous one's line was logged (the first: at the ``fit`` call, so its
    ``scatter_submit`` includes opening the store and the memory check) and ends with its own line.
    """
    spans: dict[int, dict[str, list[Any]]] = {}
    for record in run.records:
        match = KEY_PATTERN.match(str(record["key"]))
        if match is None:
            continue
        kind, iteration = match.group(1), int(match.group(2))
        entry = spans.setdefault(
            iteration, {"estep": [], "combine": [], "estep_compute": [], "transfer": [], "estep_workers": []}
        )
        if kind == "estep":
            entry["estep_workers"].append(record["worker"])
        for ss in record["startstops"]:
            if ss["action"] == "compute":
                entry[kind].append((ss["start"], ss["stop"]))
                if kind == "estep":
                    entry["estep_compute"].append(ss["stop"] - ss["start"])
            elif ss["action"] == "transfer":
                entry["transfer"].append(ss["stop"] - ss["start"])
    stamps = run.clock.iteration_stamps()
    out = []
    for index, entry in enumerate(run.result.history):
        iteration = int(entry["iteration"])
        begin = run.called if index == 0 else stamps[index - 1]
        end = stamps[index]
        tasks = spans.get(iteration)
        if not tasks or not tasks["estep"]:
            out.append({"iteration": iteration, "wall": end - begin, "fit_seconds": entry["seconds"]})
            continue
        first_start = min(s for s, _ in tasks["estep"])
        last_estep = max(e for _, e in tasks["estep"])
        root_stop = max(e for _, e in tasks["estep"] + tasks["combine"])
        out.append(
            {
                "iteration": iteration,
                "wall": end - begin,
                "fit_seconds": entry["seconds"],
                "scatter_submit": first_start - begin,
                "estep_span": last_estep - first_start,
                "estep_compute_sum": float(sum(tasks["estep_compute"])),
                "estep_tasks": len(tasks["estep_compute"]),
                # E-step tasks each worker ran (workers in address order): how evenly the scheduler placed them.
                "estep_tasks_per_worker": [tasks["estep_workers"].count(a) for a in run.workers],
                "combine": root_stop - last_estep,
                "combine_compute_sum": float(sum(e - s for s, e in tasks["combine"])),
                "transfer_sum": float(sum(tasks["transfer"])),
                # run_em's clock stops after the M-step; the checkpoint and the line come after it.
                "gather_mstep": (begin + entry["seconds"]) - root_stop,
                "after_mstep": end - (begin + entry["seconds"]),
            }
        )
    return out


def median_of(parts: list[dict[str, Any]], name: str) -> float | None:
    values = [p[name] for p in parts if name in p]
    return float(statistics.median(values)) if values else None


def fit_figures(rows: int, workers: int, run: FitRun) -> dict[str, Any]:
    """rows/s per iteration (median over the iterations of rows / history seconds) and the rest of a fit's figures."""
    result = run.result
    seconds = [float(h["seconds"]) for h in result.history]
    rates = [rows / s for s in seconds]
    breakdown = iteration_breakdown(run)
    later = breakdown[1:]
    return {
        "rows": rows,
        "workers": workers,
        "iterations": result.iterations,
        "iteration_seconds": seconds,
        "seconds_per_iteration": float(statistics.median(seconds)),
        "rows_per_s": float(statistics.median(rates)),
        "wall_seconds": [b["wall"] for b in breakdown],
        "wall_seconds_per_iteration": median_of(later or breakdown, "wall"),
        "first_iteration_seconds": result.first_iteration_seconds,
        "fit_seconds": result.seconds,
        "cpu_seconds": run.cpu_seconds,
        "mean_log_likelihoods": [float(h["mean_log_likelihood"]) for h in result.history],
        "breakdown": breakdown,
        "breakdown_median_after_first": {
            name: median_of(later, name)
            for name in (
                "wall",
                "fit_seconds",
                "scatter_submit",
                "estep_span",
                "estep_compute_sum",
                "combine",
                "gather_mstep",
                "after_mstep",
            )
        }
        if later
        else None,
    }


def whole_fit_pair(two: dict[str, Any], one: dict[str, Any], two_wall: float, one_wall: float) -> dict[str, Any]:
    """One fit on 2 workers beside the same fit on 1: the whole call (``result.seconds``, cluster up), the same
    with the cluster's start and shutdown (``*_wall``), the iterations after the first, and their ratios 2/1."""
    later_two = float(sum(two["iteration_seconds"][1:]))
    later_one = float(sum(one["iteration_seconds"][1:]))
    return {
        "fit_seconds": {"2": two["fit_seconds"], "1": one["fit_seconds"]},
        "with_cluster_seconds": {"2": two_wall, "1": one_wall},
        "later_iterations_seconds": {"2": later_two, "1": later_one},
        "first_iteration_seconds": {"2": two["first_iteration_seconds"], "1": one["first_iteration_seconds"]},
        "cpu_seconds": {"2": two["cpu_seconds"], "1": one["cpu_seconds"]},
        "fit_ratio": ratio(two["fit_seconds"], one["fit_seconds"]),
        "cpu_ratio": ratio(two["cpu_seconds"], one["cpu_seconds"]),
        "with_cluster_ratio": ratio(two_wall, one_wall),
        "later_iterations_ratio": ratio(later_two, later_one) if later_one > 0 else None,
    }


# -------------------------------------------------------------------------------------------- kernel


def kernel_figures(store: TripleStore, model: ResponsibilityAttentionDistribution, repeats: int) -> dict[str, Any]:
    """The bare kernel in this process: ``seq_update`` a whole partition at a time into a fresh accumulator,
    the partitions read into memory beforehand (untimed); the best of ``repeats`` passes."""
    factory = model.estimator().accumulator_factory()
    parts = [store.read_partition(part) for part in store.partitions()]
    # Compile (or load from numba's cache) and build the model's kernel tables before timing.
    factory.make().seq_update(tuple(a[:WARMUP_ROWS] for a in parts[0].encoded), None, model)
    best: float | None = None
    value: Any = None
    for _ in range(repeats):
        total = 0.0
        accumulators = [factory.make() for _ in parts]  # made untimed, as a task makes its own
        for accumulator, part in zip(accumulators, parts, strict=True):
            seconds, _ = time_once(lambda a=accumulator, p=part: a.seq_update(p.encoded, None, model))
            total += seconds
        if best is None or total < best:
            best = total
            value = accumulators
    assert best is not None
    total_acc = value[0]
    for other in value[1:]:
        total_acc = total_acc.combine(other.value())
    return {
        "rows": store.num_rows,
        "seconds": best,
        "rows_per_s": store.num_rows / best,
        "repeats": repeats,
        "statistics": total_acc.value(),
    }


def mstep_seconds(store: TripleStore, value: Any, previous: ResponsibilityAttentionDistribution) -> float:
    """Best of 3: what the fit's driver does with the reduced E-step value (pool it, then the M-step)."""
    estimator = FitSettings(**REFERENCE_OPTIONS).estimator(store.schema)
    factory = estimator.accumulator_factory()

    def run() -> ResponsibilityAttentionDistribution:
        accumulator = factory.make().from_value(value)
        pool: dict[str, Any] = {}
        accumulator.key_merge(pool)
        accumulator.key_replace(pool)
        stats = accumulator.value()
        return estimator.estimate(stats.n_obs, stats, previous=previous)

    return best_of(run, 3)[0]


def extrapolate_mixle(small: dict[str, Any] | None, large: dict[str, Any] | None, rows: int) -> dict[str, Any] | None:
    """mixle's seconds per iteration as ``fixed + per_row * rows`` through its two measured points, at ``rows``."""
    if small is None or large is None or large["rows"] <= small["rows"]:
        return None
    per_row = (large["seconds_per_iteration"] - small["seconds_per_iteration"]) / (large["rows"] - small["rows"])
    fixed = small["seconds_per_iteration"] - per_row * small["rows"]
    if per_row <= 0:  # noise swamped the per-row part: no line to extend
        return None
    seconds = fixed + per_row * rows
    return {
        "rows": rows,
        "fixed_seconds": fixed,
        "seconds_per_row": per_row,
        "seconds_per_iteration": seconds,
        "rows_per_s": rows / seconds,
    }


# ------------------------------------------------------------------------------------------- report


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def target_line(name: str, measured: float | None, goal: str, passed: bool | None, shown: str) -> dict[str, Any]:
    return {"name": name, "target": goal, "measured": measured, "shown": shown, "pass": passed}


def build_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    ratios, res = report["ratios"], report["results"]
    first = res["ours_2"]["first_iteration_seconds"]
    growth = report["memory"]["worker_peak_growth"]
    whole = ratios["whole_fit_2_over_1"]

    def at_least(value: float | None, threshold: float) -> bool | None:
        return None if value is None else bool(value >= threshold)

    def at_most(value: float | None, threshold: float) -> bool | None:
        return None if value is None else bool(value <= threshold)

    def x(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}x"

    return [
        target_line(
            "ours (2 workers) / mixle dask (2 workers)",
            ratios["ours_over_mixle"],
            f">= {TARGET_VS_MIXLE:g}x",
            at_least(ratios["ours_over_mixle"], TARGET_VS_MIXLE),
            x(ratios["ours_over_mixle"], 1),
        ),
        target_line(
            "ours 2 workers / 1 worker (rows/s)",
            ratios["scaling_2_over_1"],
            f">= {TARGET_SCALING:g}x",
            at_least(ratios["scaling_2_over_1"], TARGET_SCALING),
            x(ratios["scaling_2_over_1"]),
        ),
        target_line(
            "per-iteration / (kernel / 2 workers)",
            ratios["iteration_over_kernel_share"],
            f"<= {TARGET_OVER_KERNEL:g}x",
            at_most(ratios["iteration_over_kernel_share"], TARGET_OVER_KERNEL),
            x(ratios["iteration_over_kernel_share"]),
        ),
        target_line(
            "first iteration (cluster up)",
            first,
            f"< {TARGET_FIRST_ITERATION_S:g} s",
            None if first is None else bool(first < TARGET_FIRST_ITERATION_S),
            "-" if first is None else f"{first:.2f} s",
        ),
        target_line(
            "worker peak flat as rows grow",
            growth,
            f"<= {TARGET_MEMORY_GROWTH:g}x",
            at_most(growth, TARGET_MEMORY_GROWTH),
            x(growth),
        ),
        target_line(
            "whole fit, 2 workers / 1 worker (median)",
            whole,
            "<= 1x",
            at_most(whole, 1.0),
            x(whole),
        ),
    ]


def how_at_all_rows(report: dict[str, Any]) -> str:
    """Whether mixle's figure at ``--rows`` was measured there or extended from two smaller row counts."""
    large = report["results"]["mixle_large"]
    return "measured" if large is not None and large["rows"] == report["config"]["rows"] else "extrapolated"


def other_cpu(host: dict[str, Any]) -> str:
    if host["other_cpu_seconds"] is None:
        return "an unknown share (no /proc/stat)"
    return f"{host['other_cpu_share']:.0%} ({host['other_cpu_seconds']:.0f} core-seconds)"


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:,.0f}"


def format_report(report: dict[str, Any]) -> str:
    """The human-readable tables."""
    cfg, host, res, mem = report["config"], report["host"], report["results"], report["memory"]
    ours2, ours1, kernel, mixle = res["ours_2"], res["ours_1"], res["kernel"], res["mixle"]
    lines = [
        "dist_respattn distributed EM fit benchmark: our engine on a LocalCluster vs the bare kernel vs mixle's dask",
        f"  shape      S={cfg['symbols']} N={cfg['context']} D={cfg['dim']} T={cfg['targets']}; {cfg['rows']:,} rows "
        f"in a local store ({cfg['partitions']} partition(s) of {cfg['partition_rows']:,} rows, chunks of "
        f"{cfg['chunk_rows']:,}; {cfg['disk_bytes'] / MIB:,.0f} MiB on disk, written in {cfg['write_seconds']:.1f} s)",
        f"  fit        from a fixed random start (seed {cfg['seed'] + 1}), FitSettings(max_iter={cfg['iterations']}, "
        "tol=0) with the reference's M-step (no held-out pass); one thread a worker process, workers on 127.0.0.1",
        f"  host       os.cpu_count()={host['cpu_count']} (usable {host['usable_cores']}): the 2 workers, the "
        f"scheduler and this driver share them; load average {host['load_before'][0]:.2f} before, "
        f"{host['load_after'][0]:.2f} after (1 min)",
        f"             other processes took {other_cpu(host)} of the host's CPU during the "
        f"{host['run_seconds']:.0f} s run",
        f"             python {host['python']}, numpy {host['numpy']}, numba {host['numba']}, distributed "
        f"{host['distributed']}, dist_respattn {host['dist_respattn']}, mixle {host['mixle'] or 'not installed'}",
    ]
    extrapolated = res["mixle_extrapolated"]
    if mixle is not None and mixle["rows"] < cfg["rows"]:
        lines.append(
            f"  note       mixle runs on the first {mixle['rows']:,} rows (--mixle-rows; the target's ratio is taken "
            "there): its iterations have a large fixed part (the ~31 MiB model pickled into every task, twice an "
            f"iteration), so its rows/s at this row count understates what it reaches at {cfg['rows']:,} rows"
        )
        if extrapolated is not None:
            lines.append(
                f"             measured again on {res['mixle_large']['rows']:,} rows: "
                f"{extrapolated['fixed_seconds']:.2f} s fixed + {extrapolated['seconds_per_row'] * 1e6:.2f} us a row "
                "per iteration, i.e. "
                f"{extrapolated['rows_per_s']:,.0f} rows/s at {cfg['rows']:,} rows ({how_at_all_rows(report)})"
            )
    elif mixle is None:
        lines.append(f"  note       mixle not measured: {report['mixle_status']}")
    lines.append("")

    def fig(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    def times(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec) + "x"

    head = (
        f"{'path':<44}{'rows':>11}{'workers':>9}{'s/iter':>9}{'rows/s':>12}"
        f"{'vs 1 worker':>13}{'vs kernel':>11}{'vs mixle':>10}"
    )
    lines += [head, "-" * len(head)]
    kernel_rate = kernel["rows_per_s"]
    mixle_rate = mixle["rows_per_s"] if mixle is not None else None

    def row(
        label: str, figures: dict[str, Any] | None, workers: str, seconds: float | None, rate: float | None
    ) -> None:
        if figures is None:
            lines.append(f"{label:<44}{'skipped':>11}")
            return
        lines.append(
            f"{label:<44}{figures['rows']:>11,}{workers:>9}{fig(seconds, '.3f'):>9}{fig(rate, ',.0f'):>12}"
            f"{times(ratio(rate, ours1['rows_per_s']), '.2f'):>13}{times(ratio(rate, kernel_rate), '.2f'):>11}"
            f"{times(ratio(rate, mixle_rate), ',.1f'):>10}"
        )

    row("ours, fit, 2 workers x 1 thread", ours2, "2", ours2["seconds_per_iteration"], ours2["rows_per_s"])
    row("ours, fit, 1 worker x 1 thread", ours1, "1", ours1["seconds_per_iteration"], ours1["rows_per_s"])
    row("bare kernel, seq_update, this process", kernel, "1 core", kernel["seconds"], kernel_rate)
    row(
        "bare kernel / 2 (ideal 2 workers)",
        kernel,
        "2 cores",
        kernel["seconds"] / 2,
        2 * kernel_rate,
    )
    if mixle is not None:
        label = f"mixle {mixle['mixle']} optimize(backend='dask')"
        row(label, mixle, str(mixle["workers"]), mixle["seconds_per_iteration"], mixle_rate)
        at_all_rows = extrapolated if res["mixle_large"] and res["mixle_large"]["rows"] < cfg["rows"] else None
        for label, figures in (
            ("  the same, more rows", res["mixle_large"]),
            ("  the same, extrapolated", at_all_rows),
        ):
            if figures is not None:
                row(label, figures, "2", figures["seconds_per_iteration"], figures["rows_per_s"])
    else:
        lines.append(f"{'mixle optimize(backend=dask)':<44}{'skipped':>11}")
    lines += [
        "  ours: s/iter = median over the iterations of result.history seconds (E-step on the workers + gather +",
        "        M-step on the driver; what follows it is below); rows/s = median of rows / those",
        "        seconds",
        f"        2 workers, per iteration: {', '.join(f'{s:.2f}' for s in ours2['iteration_seconds'])} s; "
        f"1 worker: {', '.join(f'{s:.2f}' for s in ours1['iteration_seconds'])} s",
        "        wall per iteration, from one iteration's line to the next (median after the first): 2 workers "
        f"{fig(ours2['wall_seconds_per_iteration'], '.3f')} s, "
        f"1 worker {fig(ours1['wall_seconds_per_iteration'], '.3f')} s",
        f"  kernel: best of {kernel['repeats']}, a partition at a time on rows read into memory beforehand; "
        f"agreement with our 2-worker fit's first E-step: see below",
    ]
    if mixle is not None:
        lines.append(
            f"  mixle: mean of iterations 2..{mixle['iterations']} (E-step + M-step + its scoring pass) over "
            f"{mixle['partitions']} partitions; cluster start {mixle['cluster_start_seconds']:.1f} s, row ingest "
            f"{mixle['ingest_seconds']:.1f} s, first iteration {mixle['first_iteration_seconds']:.2f} s not included"
        )

    lines += [
        "",
        "time to the first iteration (result.first_iteration_seconds: from the fit call to iteration 1's line)",
    ]
    lines.append(
        f"  cluster already up (2 workers):            {fig(ours2['first_iteration_seconds'], '.2f')} s   "
        f"(the cluster itself took {res['cluster_start_seconds']:.2f} s to start)"
    )
    lines.append(f"  cluster already up (1 worker):             {fig(ours1['first_iteration_seconds'], '.2f')} s")
    embedded = res["embedded"]
    if embedded is not None:
        lines.append(
            f"  embedded cluster (fit(n_workers=2)):       {fig(embedded['first_iteration_seconds'], '.2f')} s   "
            f"(starting the cluster included; the whole call {embedded['fit_seconds']:.2f} s, shutdown included)"
        )
    else:
        lines.append("  embedded cluster: skipped (--skip-embedded)")

    lines += [
        "",
        "the whole fit, 2 workers against 1 (s; result.seconds with the cluster up; the cluster's start and",
        "shutdown added; iterations 2.. only); pair 1 is the fits above, the others on fresh clusters, alternating",
        "which ran first",
        f"{'pair':<6}{'fit 2w':>9}{'fit 1w':>9}{'2/1':>8}{'+cluster 2w':>13}{'1w':>8}{'2/1':>8}"
        f"{'iter 2.. 2w':>13}{'1w':>8}{'2/1':>8}{'CPU 2w':>9}{'1w':>7}{'2/1':>8}",
    ]
    for index, pair in enumerate(res["pairs"], start=1):
        fits, walls, later = pair["fit_seconds"], pair["with_cluster_seconds"], pair["later_iterations_seconds"]
        lines.append(
            f"{index:<6}{fits['2']:>9.2f}{fits['1']:>9.2f}{times(pair['fit_ratio'], '.2f'):>8}"
            f"{walls['2']:>13.2f}{walls['1']:>8.2f}{times(pair['with_cluster_ratio'], '.2f'):>8}"
            f"{later['2']:>13.2f}{later['1']:>8.2f}{times(pair['later_iterations_ratio'], '.2f'):>8}"
            f"{fig(pair['cpu_seconds']['2'], '.2f'):>9}{fig(pair['cpu_seconds']['1'], '.2f'):>7}"
            f"{times(pair['cpu_ratio'], '.2f'):>8}"
        )
    lines.append(
        f"median  fit 2/1 {times(report['ratios']['whole_fit_2_over_1'], '.2f')}, CPU 2/1 "
        f"{times(report['ratios']['whole_fit_cpu_2_over_1'], '.2f')} (CPU: this process, which runs the scheduler, "
        "and every worker process)"
    )

    parts = ours2["breakdown_median_after_first"]
    lines += [
        "",
        "where an iteration goes, 2 workers (s; from the scheduler's task stream and the driver's clock)",
    ]
    head = (
        f"{'iteration':<12}{'wall':>7}{'scatter':>9}{'E-step':>8}{'(sum)':>10}{'combine':>9}"
        f"{'gather+M':>10}{'after M':>9}{'tasks/worker':>14}"
    )
    lines += [head, "-" * len(head)]

    def part_line(label: str, b: dict[str, Any]) -> str:
        return (
            f"{label:<12}{fig(b.get('wall'), '.3f'):>7}{fig(b.get('scatter_submit'), '.3f'):>9}"
            f"{fig(b.get('estep_span'), '.3f'):>8}{fig(b.get('estep_compute_sum'), '.3f'):>10}"
            f"{fig(b.get('combine'), '.3f'):>9}{fig(b.get('gather_mstep'), '.3f'):>10}"
            f"{fig(b.get('after_mstep'), '.3f'):>9}"
            f"{'+'.join(str(n) for n in b.get('estep_tasks_per_worker', [])):>14}"
        )

    for b in ours2["breakdown"]:
        lines.append(part_line(str(b["iteration"]), b))
    if parts is not None:
        lines.append(part_line("median 2..", parts))
    if ours1["breakdown_median_after_first"] is not None:
        lines.append(part_line("1 worker", ours1["breakdown_median_after_first"]) + "   (median 2..)")
    lines += [
        "  scatter = from the iteration's start (the previous line; the fit call for iteration 1) to the first",
        "  E-step task starting: the new parameters sent from the driver to every worker, one after another,",
        "  + submission; E-step = first E-step start to last E-step end, (sum) = the E-step tasks'",
        "  run times (wall) added up; combine = last E-step end to the root's end (transfers + combine); gather+M =",
        "  root's end to the M-step's end on the driver; after M = the rest until the iteration's line: checks, the",
        "  checkpoint handed to a background thread that writes it during the next iteration (the last one waited",
        "  for), the log line. tasks/worker = E-step tasks each worker ran (an idle worker shows as 0).",
        f"  The kernel on the same rows: {kernel['seconds']:.3f} s ({kernel['seconds'] / 2:.3f} s a worker at 2); the "
        "driver's pooling + M-step",
        f"  alone, timed apart on the first E-step's statistics: {res['mstep_seconds']:.3f} s (the rest of gather+M is "
        "the gather)",
    ]

    lines += ["", "peak memory (VmHWM, MiB)"]
    estimate = mem["estimate"]
    lines.append(
        f"  driver during the 2-worker fit: {mib(mem['driver_peak_bytes'])} (RSS before it "
        f"{mib(mem['driver_rss_before_bytes'])}; the engine's plan: {mib(estimate['driver_bytes'])}); this process "
        "also runs the LocalCluster's scheduler"
    )
    for label, figures in (
        (f"2 workers, {cfg['rows']:,} rows", ours2),
        (f"1 worker,  {cfg['rows']:,} rows", ours1),
        (f"2 workers, {cfg['memory_rows']:,} rows", res["ours_memory"]),
    ):
        peaks = ", ".join(mib(p) for p in figures["worker_peak_bytes"])
        lines.append(f"  {label:<30} workers {peaks}")
    small, large = sorted((cfg["rows"], cfg["memory_rows"]))
    lines.append(
        f"  the engine's plan per worker (1 thread): {mib(estimate['worker_bytes'])}. Largest worker peak at "
        f"{large:,} rows / at {small:,} rows = {fig(mem['worker_peak_growth'], '.2f')}x as rows grow "
        f"x{large / small:.1f} ({cfg['partitions']} partition(s) and {cfg['iterations']} iterations at {cfg['rows']:,} "
        f"rows, {cfg['memory_partitions']} and {cfg['memory_iterations']} at {cfg['memory_rows']:,})"
    )

    agreement = report["agreement"]
    lines += [
        "",
        "agreement: kernel statistics vs our 2-worker fit's first E-step (same start model), max relative difference "
        f"of the mean log-likelihood {fig(agreement['first_mean_log_likelihood'], '.1e')}",
        "",
        "targets (measured, not asserted)",
    ]
    for t in report["targets"]:
        verdict = "skipped" if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        lines.append(f"  {t['name']:<44}{t['target']:<10}{t['shown']:>10}  {verdict}")
        if "mixle" in t["name"] and mixle is not None:
            equal = report["ratios"]["ours_over_mixle_equal_rows"]
            at_equal = (
                ""
                if equal is None
                else f"; at {cfg['rows']:,} rows for both (mixle {how_at_all_rows(report)}): {equal:.1f}x"
            )
            lines.append(f"      (mixle measured on {mixle['rows']:,} rows{at_equal})")
    lines.append(
        f"  (this host has {host['usable_cores']} cores: 2 workers + scheduler + driver share them; figures move with "
        "the load average above)"
    )
    shown = ", ".join(f"{name} {seconds:.1f}" for name, seconds in report["phase_seconds"].items())
    lines += ["", f"wall seconds of this run's steps (cluster starts and shutdowns included): {shown}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the store our fit runs on")
    parser.add_argument("--iterations", type=int, default=5, help="EM iterations of our fits (tol=0)")
    parser.add_argument(
        "--symbols", type=int, default=SHAPE[0], help=f"S of the model and store (default {SHAPE[0]}: the reference)"
    )
    parser.add_argument(
        "--targets", type=int, default=SHAPE[3], help=f"T of the model and store (default {SHAPE[3]}: the reference)"
    )
    parser.add_argument(
        "--mixle-rows", type=int, default=20_000, help="rows mixle's dask backend runs on (the first ones)"
    )
    parser.add_argument(
        "--mixle-rows-large",
        type=int,
        default=100_000,
        help="a second, larger row count for mixle, to extrapolate its rows/s to --rows (0 skips it)",
    )
    parser.add_argument("--mixle-iterations", type=int, default=3, help="mixle iterations (>= 2 to time one)")
    parser.add_argument("--skip-mixle", action="store_true", help="do not run mixle")
    parser.add_argument(
        "--mixle-one-cluster",
        action="store_true",
        help="run both mixle row counts on one cluster (a quicker smoke run; their cluster_start_seconds are 0)",
    )
    parser.add_argument(
        "--memory-rows",
        type=int,
        default=None,
        help="rows of the second 2-worker fit whose worker peak is compared with the first's (default 4 x rows)",
    )
    parser.add_argument("--memory-iterations", type=int, default=2, help="iterations of that fit (default 2)")
    parser.add_argument("--skip-embedded", action="store_true", help="do not time a fit that starts its own cluster")
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="more whole fits on 2 and on 1 workers (fresh clusters, alternating which goes first), side by side",
    )
    parser.add_argument("--kernel-repeats", type=int, default=3, help="timed kernel passes (the best is kept)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the true model; the start model uses seed + 1")
    parser.add_argument("--workdir", default=None, help="where the stores and models go (default: a temp directory)")
    parser.add_argument("--keep", action="store_true", help="keep the stores and model directories")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure instead")
    args = parser.parse_args(argv)
    for name in ("rows", "iterations", "symbols", "targets", "mixle_iterations", "memory_iterations", "kernel_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.pairs < 0:
        parser.error("--pairs must be >= 0")
    if args.memory_rows is None:
        args.memory_rows = 4 * args.rows
    if args.memory_rows < 1 or args.memory_rows == args.rows:
        parser.error("--memory-rows must be at least 1 and differ from --rows")
    if args.mixle_rows < 0:
        parser.error("--mixle-rows must be >= 0 (0 skips mixle)")
    args.mixle_rows = min(args.mixle_rows, args.rows)
    if args.mixle_rows_large < 0:
        parser.error("--mixle-rows-large must be >= 0 (0 skips it)")
    args.mixle_rows_large = min(args.mixle_rows_large, args.rows)
    if args.mixle_rows_large <= args.mixle_rows:
        args.mixle_rows_large = 0  # no second, larger point to extrapolate from
    return args


def run_mixle(
    store: TripleStore,
    start: ResponsibilityAttentionDistribution,
    rows_used: int,
    args: argparse.Namespace,
    client: Any | None = None,
) -> dict[str, Any]:
    """mixle's dask backend on the first ``rows_used`` rows of the store, from the same start model (on a fresh
    cluster of 2 workers, or on ``client``'s, a ``mixle_cluster(2, 1)``)."""
    from mixle_dask import mixle_dask_seconds_per_iteration

    rows = store.read_rows(0, rows_used)
    with warnings.catch_warnings():
        # Its cluster's scheduler takes port 8787 for its HTTP server when free, and says so when it is not.
        warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
        figures = mixle_dask_seconds_per_iteration(
            rows.context,
            rows.query,
            rows.target,
            num_symbols=store.schema.num_symbols,
            num_targets=store.schema.num_targets,
            sigma2=start.sigma2,
            iterations=args.mixle_iterations,
            workers=2,
            threads_per_worker=1,
            init=start,
            client=client,
        )
    figures = {k: v for k, v in figures.items() if k != "log_likelihoods"}
    figures["rows_per_s"] = figures["rows_per_second"]
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    host_load = HostLoad()
    shape = (args.symbols, SHAPE[1], SHAPE[2], args.targets)
    truth = random_distribution(*shape, seed=args.seed)
    parent = args.workdir
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="bench_fit-", dir=parent)
    results: dict[str, Any] = {}
    phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        """Wall seconds of one step of this run, cluster starts and shutdowns included (``phase_seconds``)."""
        started = time.perf_counter()
        yield
        phases[name] = time.perf_counter() - started

    try:
        path = os.path.join(workdir, "train.zarr")
        with phase("write_store"):
            store = write_synthetic(path, args.rows, model=truth, seed=args.seed + 1, options=WriteOptions())
        memory_path = os.path.join(workdir, "memory.zarr")
        with phase("write_memory_store"):
            memory_store = write_synthetic(
                memory_path, args.memory_rows, model=truth, seed=args.seed + 2, options=WriteOptions()
            )
        del truth

        def start_model() -> ResponsibilityAttentionDistribution:
            # A fresh object each time: a model caches its kernel tables, which would then travel with it.
            return random_distribution(*shape, seed=args.seed + 1)

        # Our fit on 2 workers; the driver's peak is this fit's (reset after writing the stores).
        release_free_memory()
        peak_reset = reset_peak_rss()
        rss_before = current_rss_bytes()
        with phase("ours_2"), cluster_client(2) as (client, cluster_seconds):
            fitted = run_fit(store, os.path.join(workdir, "model-2"), start_model(), args.iterations, client=client)
            driver_peak = peak_rss_bytes()
            results["ours_2"] = {**fit_figures(args.rows, 2, fitted), **cluster_peaks(client)}
            first_fit = fitted.result
        results["cluster_start_seconds"] = cluster_seconds

        with phase("ours_1"), cluster_client(1) as (client, _):
            fitted = run_fit(store, os.path.join(workdir, "model-1"), start_model(), args.iterations, client=client)
            results["ours_1"] = {**fit_figures(args.rows, 1, fitted), **cluster_peaks(client)}

        # The whole fit on 2 workers against 1, side by side: the pair above, then --pairs more on fresh clusters.
        results["pairs"] = [whole_fit_pair(results["ours_2"], results["ours_1"], phases["ours_2"], phases["ours_1"])]
        for index in range(args.pairs):
            timed: dict[int, tuple[FitRun, float]] = {}
            for workers in (1, 2) if index % 2 == 0 else (2, 1):
                started = time.perf_counter()
                with cluster_client(workers) as (client, _):
                    run = run_fit(
                        store, os.path.join(workdir, f"model-p{index}-{workers}"), start_model(), args.iterations,
                        client=client,
                    )  # fmt: skip
                timed[workers] = (run, time.perf_counter() - started)
            results["pairs"].append(
                whole_fit_pair(
                    fit_figures(args.rows, 2, timed[2][0]),
                    fit_figures(args.rows, 1, timed[1][0]),
                    timed[2][1],
                    timed[1][1],
                )
            )

        with phase("ours_memory"), cluster_client(2) as (client, _):
            fitted = run_fit(
                memory_store, os.path.join(workdir, "model-m"), start_model(), args.memory_iterations, client=client
            )
            results["ours_memory"] = {**fit_figures(args.memory_rows, 2, fitted), **cluster_peaks(client)}

        results["embedded"] = None
        if not args.skip_embedded:
            with phase("embedded"):
                result = run_fit(store, os.path.join(workdir, "model-e"), start_model(), 1, n_workers=2).result
            results["embedded"] = {
                "workers": 2,
                "first_iteration_seconds": result.first_iteration_seconds,
                "fit_seconds": result.seconds,
            }

        # The bare kernel, with no cluster running, under the same start model as the fits' first E-step.
        with phase("kernel"):
            kernel = kernel_figures(store, start_model(), args.kernel_repeats)
        kernel_statistics = kernel.pop("statistics")
        results["kernel"] = kernel
        # The driver's M-step alone, on those statistics (the fit's first E-step value): pooling + estimate.
        results["mstep_seconds"] = mstep_seconds(store, kernel_statistics, start_model())

        results["mixle"] = results["mixle_large"] = None
        mixle_version = None
        if args.skip_mixle:
            mixle_status = "skipped (--skip-mixle)"
        elif args.mixle_rows == 0:
            mixle_status = "skipped (--mixle-rows 0)"
        else:
            try:
                import mixle
            except ImportError:
                mixle_status = "mixle is not installed (pip install mixle==0.8.2)"
                print(f"{mixle_status}: skipping its column", file=sys.stderr)
            else:
                mixle_version = getattr(mixle, "__version__", None) or "installed"
                with contextlib.ExitStack() as shared:
                    client = None
                    if args.mixle_one_cluster:
                        from mixle_dask import mixle_cluster

                        with phase("mixle_cluster"):
                            client = shared.enter_context(mixle_cluster(2, 1))
                    with phase("mixle"):
                        results["mixle"] = run_mixle(store, start_model(), args.mixle_rows, args, client)
                    if args.mixle_rows_large:
                        with phase("mixle_large"):
                            results["mixle_large"] = run_mixle(
                                store, start_model(), args.mixle_rows_large, args, client
                            )
                mixle_status = "measured"
        config = {
            "rows": args.rows,
            "symbols": shape[0],
            "context": shape[1],
            "dim": shape[2],
            "targets": shape[3],
            "iterations": args.iterations,
            "seed": args.seed,
            "mixle_rows": args.mixle_rows,
            "mixle_rows_large": args.mixle_rows_large,
            "mixle_iterations": args.mixle_iterations,
            "mixle_one_cluster": args.mixle_one_cluster,
            "memory_rows": args.memory_rows,
            "memory_iterations": args.memory_iterations,
            "memory_partitions": memory_store.num_partitions,
            "partitions": store.num_partitions,
            "partition_rows": store.partition_rows,
            "chunk_rows": store.chunk_rows,
            "write_seconds": phases["write_store"],
            "disk_bytes": sum(
                os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names
            ),
            "dir": workdir,
            "kept": args.keep,
        }
        block_rows = min(store.chunk_rows, store.num_rows)  # as the fit plans it
        estimate = estimate_memory(store.schema, block_rows=block_rows, threads_per_worker=1, fan_in=4)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    ours2, ours1, kernel, mixle_figures = results["ours_2"], results["ours_1"], results["kernel"], results["mixle"]
    mixle_extrapolation = extrapolate_mixle(mixle_figures, results["mixle_large"], args.rows)
    results["mixle_extrapolated"] = mixle_extrapolation
    peak_main = max(ours2["worker_peak_bytes"])
    peak_other = max(results["ours_memory"]["worker_peak_bytes"])
    peak_small, peak_large = (peak_main, peak_other) if args.memory_rows > args.rows else (peak_other, peak_main)
    first_ll = first_fit.history[0]["mean_log_likelihood"]
    kernel_ll = kernel_statistics.log_lik / kernel_statistics.n_obs
    report = {
        "config": config,
        "host": {
            "cpu_count": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            **host_load.finish(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
            "distributed": distributed.__version__,
            "dist_respattn": dist_respattn.__version__,
            "mixle": mixle_version,
        },
        "results": results,
        "mixle_status": mixle_status,
        "phase_seconds": phases,
        "ratios": {
            "ours_over_mixle": ratio(ours2["rows_per_s"], mixle_figures and mixle_figures["rows_per_s"]),
            "ours_over_mixle_equal_rows": ratio(
                ours2["rows_per_s"], mixle_extrapolation and mixle_extrapolation["rows_per_s"]
            ),
            "scaling_2_over_1": ratio(ours2["rows_per_s"], ours1["rows_per_s"]),
            "iteration_over_kernel_share": ratio(ours2["seconds_per_iteration"], kernel["seconds"] / 2),
            "iteration_over_kernel_share_1_worker": ratio(ours1["seconds_per_iteration"], kernel["seconds"]),
            "ours_2_over_kernel": ratio(ours2["rows_per_s"], kernel["rows_per_s"]),
            "whole_fit_2_over_1": float(statistics.median(p["fit_ratio"] for p in results["pairs"])),
            # The CPU the whole fit cost (driver + workers), 2 workers over 1: steadier than wall time on a busy host.
            "whole_fit_cpu_2_over_1": float(statistics.median(p["cpu_ratio"] for p in results["pairs"])),
        },
        "memory": {
            "driver_peak_bytes": driver_peak,
            "driver_rss_before_bytes": rss_before,
            "driver_peak_reset": peak_reset,
            "worker_peak_growth": peak_large / peak_small,
            "estimate": {"worker_bytes": estimate.worker_bytes, "driver_bytes": estimate.driver_bytes},
        },
        "agreement": {
            "first_mean_log_likelihood": max_relative_difference([first_ll], [kernel_ll]),
        },
    }
    report["targets"] = build_targets(report)
    print(json.dumps(report) if args.json else format_report(report))
    return report


if __name__ == "__main__":
    main()
