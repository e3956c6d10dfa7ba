"""Vocabulary and corpus scale: a sparse-emission fit of a large real corpus from a token-stream store.

In one run:

1. **Reference shape** (S = T = 2000, N = 16, D = 32, 1M sampled rows): the dense and the sparse E-step
   kernel on the same rows and model (the sparse one over the pairs the rows hold), rows/s side by side,
   and the largest relative difference of their statistics.
2. **Corpus**: the ``*.c``/``*.h`` files of Debian's ``linux-source-6.1`` (``apt-get download``, unpacked
   once into ``--cache``), or any ``--corpus DIR``; files go to train or test by a hash of their path
   (``--test-fraction``), the vocabulary (``--vocab-size`` words, S = K + 1) is counted on train.
   ``ingest --text --format stream`` as a function call: its tokens/s and bytes a token on disk.
3. **Fit** on a LocalCluster of ``--workers`` single-threaded workers (default 2; ``fit --context 8``, the
   emission sparse by size, its hyperparameters chosen on the fit's own 5% hold-out; ``--m-step-shards K``
   as ``fit``'s): the support's size, per-iteration time against the bare kernel on the same rows (one
   partition timed in this process, scaled to the training rows and divided by the workers; and beside it the
   kernel in as many processes as workers at once, each on its own partition, the cores' shared cache and memory
   counted), the first
   iteration's time, worker and driver peak memory (the driver's also over the iterations after the first).
   Where the wall time went, pass by pass (Dask's task stream; with the sharded M-step, the owners' tasks
   between the passes), and between each iteration's line: the bytes every process wrote to its TCP comms
   by route (driver -> workers, worker -> worker, workers -> driver) and each worker's CPU seconds beside
   its tasks' thread CPU (``cluster_meters.py``).
4. **Quality**: the test store's next-token perplexity, the head beside the Kneser-Ney bigram (``evaluate``).

``--head recipe`` fits what ``fit`` fits on a token stream instead (the single head, the copy head, the
conjunction head and their stack, each stage on the fit's hold-out; at 50,000 words no repeat gate over the stack,
at the smoke run's few words one) and prints, per stage, its parameters, its
median and first iteration and the memory figures, with the test perplexity beside the Kneser-Ney 2-, 3- and
5-grams. Its stage 1 is the single head the default run fits, so the two are compared in the same run.

Targets (PASS/MISS beside the figures): store <= 4.5 bytes a token; ingest >= 5M tokens/s; each worker
<= 6 GiB and the driver <= 4 GiB; an iteration <= 1.3x (kernel time / 2); sparse kernel >= 0.8x the dense
kernel's rows/s at the reference shape, statistics equal to 1e-12; first iteration < 60 s.

Run::

    pip install -e '.[bench]'
    python benchmarks/bench_scale.py                         # 60% of linux-source-6.1: 109M tokens (~8 min)
    python benchmarks/bench_scale.py --corpus DIR --vocab-size 1999 --reference-rows 20000 --iterations 1 --json
    python benchmarks/bench_scale.py --corpus DIR --vocab-size 999 --reference-rows 5000 --reference-repeats 1 --json
    python benchmarks/bench_scale.py --share 0.05 --work DIR --start-pass   # the start pass alone, per partition
    python benchmarks/bench_scale.py --share 0.2 --ingest-only          # the ingest figure alone (~240 MiB of text)
    python benchmarks/bench_scale.py --head recipe --reference-rows 0   # the recipe at 109M tokens, stage by stage
    python benchmarks/bench_scale.py --reference-rows 0 --iterations 3 --m-step-shards 2   # the sharded M-step

Worker processes import this script again (spawned, or forked from the embedded settings' forkserver), so everything
runs under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_meters import ClusterMeters
from measure import peak_rss_bytes, reset_peak_rss

GIB = 2**30
TARGETS = {
    "bytes_per_token": 4.5,
    "ingest_tokens_per_second": 5e6,
    "worker_peak_gib": 6.0,
    "driver_peak_gib": 4.0,
    "iteration_over_kernel": 1.3,
    "sparse_over_dense_kernel": 0.8,
    "statistics_difference": 1e-12,
    "first_iteration_seconds": 60.0,
}


# ------------------------------------------------------------------------------------- the corpus


def linux_source(cache: Path) -> Path:
    """The unpacked ``*.c``/``*.h`` files of Debian's linux-source-6.1 (fetched and unpacked once)."""
    root = cache / "linux"
    done = root / ".unpacked"
    if done.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    debs = sorted(cache.glob("linux-source-6.1_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", "linux-source-6.1"], cwd=cache, check=True)
        debs = sorted(cache.glob("linux-source-6.1_*.deb"))
    tarball = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(debs[-1])], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "--wildcards", "*.tar.xz"], input=tarball, cwd=root, check=True)
    (xz,) = root.glob("usr/src/linux-source-6.1.tar.xz")
    subprocess.run(["tar", "-xJf", str(xz), "--wildcards", "*.c", "*.h"], cwd=root, check=True)
    xz.unlink()
    done.touch()
    return root


def source_files(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and p.suffix in suffixes)


def goes_to_test(path: str, root: Path, fraction: float) -> bool:
    key = os.path.relpath(path, root).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64 < fraction


def take_files(files: list[str], root: Path, share: float) -> list[str]:
    """A deterministic share of the files (by a hash of the path, another hash than the split's)."""
    if share >= 1.0:
        return files
    keep = []
    for path in files:
        key = b"take:" + os.path.relpath(path, root).encode()
        if int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64 < share:
            keep.append(path)
    return keep


# ------------------------------------------------------------------------------------------- parts


def reference_shape(rows: int, repeats: int) -> dict[str, Any]:
    """The dense and the sparse kernel on the same rows at S = T = 2000, N = 16, D = 32: the best CPU time of
    ``repeats`` interleaved runs of each."""
    from dist_respattn import random_distribution
    from dist_respattn.model.emission.layouts import DenseEmission, PairSupport
    from dist_respattn.model.kernels import per_position

    s, n, d, t = 2000, 16, 32, 2000
    truth = random_distribution(s, n, d, t, seed=0, sigma2=1.0)
    context, query, target = truth.sampler(1).sample_arrays(rows, query_dtype=np.float32)
    keys = np.unique((target.astype(np.int64)[:, None] * s + context).ravel())
    support = PairSupport.from_keys(keys, s, t)
    sparse_model = truth.with_emission(DenseEmission(truth.emission).restricted(support))
    dense_model = truth.with_emission(DenseEmission(sparse_model.emission))
    dense_params, sparse_params = dense_model.kernel_parameters, sparse_model.kernel_parameters

    def run(params: Any, sparse: bool) -> tuple[float, Any]:
        # CPU time of this single-threaded process: on a machine shared with other work, wall time measures the
        # neighbours as much as the kernel.
        out = per_position.StatisticArrays.zeros(s, n, d, t, support if sparse else None)
        start = time.process_time()
        per_position.accumulate_estep(context, query, target, None, params, out)
        return time.process_time() - start, out

    run(dense_params, False)  # compile both before timing
    run(sparse_params, True)
    dense_s = sparse_s = float("inf")
    for _ in range(repeats):  # interleaved, so that a busy spell slows both alike
        seconds, dense_stats = run(dense_params, False)
        dense_s = min(dense_s, seconds)
        seconds, sparse_stats = run(sparse_params, True)
        sparse_s = min(sparse_s, seconds)
    counts = np.zeros((t, s))
    counts[support.targets, support.symbols] = sparse_stats.pair_counts
    diffs = [
        _relative(sparse_stats.key_sum, dense_stats.key_sum),
        _relative(sparse_stats.key_mass, dense_stats.key_mass),
        _relative(counts, dense_stats.emission_count_ts),
        _relative(sparse_stats.position_count, dense_stats.position_count),
        _relative(sparse_stats.scalars, dense_stats.scalars),
    ]
    return {
        "shape": {"S": s, "N": n, "D": d, "T": t, "rows": rows},
        "pairs": support.num_pairs,
        "dense_rows_per_second": rows / dense_s,
        "sparse_rows_per_second": rows / sparse_s,
        "sparse_over_dense_kernel": dense_s / sparse_s,
        "statistics_difference": max(diffs),
    }


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b), initial=0.0) / max(float(np.max(np.abs(b), initial=0.0)), 1e-300))


def ingest(
    train_files: list[str],
    test_files: list[str],
    out: Path,
    vocab_size: int,
    n: int,
    partition_rows: int | None = None,
) -> dict[str, Any]:
    from dist_respattn.store import WriteOptions
    from dist_respattn.store.ingest.to_stream import write_stream_text

    options = WriteOptions(overwrite=True, partition_rows=partition_rows)
    start, cpu_start = time.perf_counter(), time.process_time()
    train = write_stream_text(out / "train.zarr", train_files, n, vocab_size=vocab_size, options=options)
    # CPU seconds of every thread beside the wall time: on a shared machine the wall time counts the others too.
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    test = write_stream_text(out / "test.zarr", test_files, None, like=train.location, options=options)
    info = train.describe()
    return {
        "train": str(train.location),
        "test": str(test.location),
        "files": {"train": len(train_files), "test": len(test_files)},
        "tokens": train.num_tokens,
        "test_tokens": test.num_tokens,
        "vocabulary": train.schema.num_symbols,
        "train_bytes": sum(os.path.getsize(f) for f in train_files),
        "ingest_seconds": seconds,
        "ingest_cpu_seconds": cpu_seconds,
        "ingest_threads": os.cpu_count(),
        "ingest_tokens_per_second": train.num_tokens / seconds,
        "bytes_per_token": info["bytes_per_token"],
        "bytes_on_disk": info["bytes_on_disk"],
    }


def start_pass(train_url: str, n: int, *, partitions: int | None = None) -> dict[str, Any]:
    """A sparse fit's start pass (first counts and support, and the emission prior's pairs) on the training
    store's partitions, one at a time in this process, as ``fit``'s start task runs them on a worker.

    The rows are the training side of the fit's automatic hold-out. Returns the seconds of each partition
    (the first ``partitions`` of them), its rows, and the pairs of the reduced support.
    """
    import functools

    from dist_respattn.engine import FitSettings, worker_tasks
    from dist_respattn.engine.worker_tasks import RowSelection
    from dist_respattn.model.fitting.holdout import HoldoutRule
    from dist_respattn.model.heads.base import Columns
    from dist_respattn.model.heads.single_hop.kind import start_partition
    from dist_respattn.store import open_store

    store = open_store(train_url, window=n)
    settings = FitSettings(context_length=n)
    estimator = settings.estimator(store.schema)
    factory = estimator.accumulator_factory(layout="sparse")
    rows = RowSelection(HoldoutRule.for_rows(store.num_rows, settings.holdout_fraction), "train")
    count = store.num_partitions if partitions is None else min(partitions, store.num_partitions)
    seconds, cpu_seconds, values = [], [], []
    for part in range(count):
        start, cpu = time.perf_counter(), time.process_time()
        start_map = functools.partial(start_partition, factory, "uniform", 0, estimator.needs_pairs, None)
        values.append(worker_tasks.pass_task(store.location, part, start_map, Columns(), store.fingerprint(), rows))
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu)
    start, cpu = time.perf_counter(), time.process_time()
    total = worker_tasks.combine_values(*values)
    combine_seconds, combine_cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    return {
        "partitions": count,
        "of_partitions": store.num_partitions,
        "rows_per_partition": store.partition_rows,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "combine_seconds": combine_seconds,
        "combine_cpu_seconds": combine_cpu_seconds,
        "pairs": total.stats.emission_count.support.num_pairs,
    }


def worker_peak(client: Any) -> int:
    return max(client.run(peak_rss_bytes).values())


#: A staged fit's line that starts a stage: ``stage 2 of 4: copy -> DIR``.
STAGE_LINE = re.compile(r"stage \d+ of \d+: (\w+)")
#: A fit's line at the end of an iteration: ``iteration 3: ...``.
ITERATION_LINE = re.compile(r"iteration \d+:")


class StagePeaks:
    """The driver's and the workers' high-water marks (``VmHWM``) phase by phase: each phase's peak is read, and
    every process's reset (Linux ``clear_refs``), when the next begins. Used as a fit's ``say``: a staged fit's
    ``stage N of M: KIND`` line starts a phase."""

    def __init__(self, client: Any, lines: list[str], first: str, meters: ClusterMeters | None = None) -> None:
        self.client, self.lines, self.phase, self.meters = client, lines, first, meters
        self.peaks: list[dict[str, Any]] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.meters is not None and ITERATION_LINE.match(line):
            self.meters.mark(line.split(":")[0])
            if line.startswith("iteration 1:") and self.phase == "fit":
                self.begin("iterations after the first")  # the driver's and workers' steady peaks, apart
        stage = STAGE_LINE.match(line)
        if stage and self.phase == "fit":
            self.phase = stage.group(1)  # the first stage: the fit's setup is its own
        elif stage:
            self.begin(stage.group(1))

    def begin(self, phase: str) -> None:
        """End the current phase (its peaks recorded, every process's reset) and begin ``phase``."""
        workers = self.client.run(peak_rss_bytes)
        self.peaks.append({"phase": self.phase, "driver_gib": peak_rss_bytes() / GIB,
                           "worker_gib": max(workers.values()) / GIB})  # fmt: skip
        reset_peak_rss()
        self.client.run(reset_peak_rss)
        self.phase = phase


class _KernelRows:
    """One partition's training rows read for the bare kernel, with the fit's model's kernel parameters: what a fit's
    E-step task gives the kernel (the values unscanned when the store checked them, as the fit's tasks do)."""

    def __init__(self, checkpoint: Any, train_url: str, n: int, partition: int) -> None:
        from dist_respattn.engine.worker_tasks import RowSelection
        from dist_respattn.model.fitting.holdout import HoldoutRule
        from dist_respattn.store import open_store

        self.model = model = checkpoint.model
        rule = HoldoutRule.from_json(checkpoint.meta["holdout"]) if checkpoint.meta.get("holdout") else None
        rows = RowSelection(rule, "train") if rule is not None else RowSelection()
        self.n = n
        self.blocks = list(open_store(train_url, window=n).iter_blocks(partition))
        self.weights = [rows.weights(b) for b in self.blocks]
        self.support = getattr(model.emission_table, "support", None)
        self.params = model.kernel_parameters
        # The rows it trains on: the held-out stripes' rows (about 5% of a partition, weight 0) are skipped by the
        # kernel at almost no cost, and the iteration it is set against counts only training rows.
        self.count = sum(
            b.num_rows if w is None else int(np.count_nonzero(w))
            for b, w in zip(self.blocks, self.weights, strict=True)
        )

    def timed_pass(self) -> tuple[float, float]:
        """One pass of the kernel over the rows into fresh statistics: (wall seconds, CPU seconds)."""
        from dist_respattn.model.kernels import per_position

        model = self.model
        stats = per_position.StatisticArrays.zeros(model.num_symbols, self.n, model.query_dim, model.num_targets,
                                                   self.support)  # fmt: skip
        start, cpu = time.perf_counter(), time.process_time()
        for block, w in zip(self.blocks, self.weights, strict=True):
            per_position.accumulate_estep(*block.encoded, w, self.params, stats, checked=block.checked)
        return time.perf_counter() - start, time.process_time() - cpu


def kernel_rows(model_dir: Path, train_url: str, n: int, count: int) -> list[_KernelRows]:
    """Partitions 0, 1, ..., ``count - 1`` of the training store (taken in turn when it has fewer), read for the bare
    kernel with the model of ``model_dir``'s latest checkpoint (read once for all of them)."""
    from dist_respattn.engine import load_checkpoint
    from dist_respattn.store import open_store

    checkpoint = load_checkpoint(model_dir, "latest")
    partitions = open_store(train_url, window=n).num_partitions
    return [_KernelRows(checkpoint, train_url, n, p % partitions) for p in range(count)]


#: Passes a bare kernel figure takes the best of (about 10 s at 109M tokens): a pass slowed by the machine's other
#: work would make the kernel look slower than it is, and the iteration's ratio to it better.
KERNEL_PASSES = 5


def bare_kernel(rows: _KernelRows) -> dict[str, Any]:
    """The sparse kernel alone on ``rows``, in this process, the machine's other cores idle: ``rows``,
    ``rows_per_second`` (wall) and ``rows_per_cpu_second``."""
    passes = [rows.timed_pass() for _ in range(KERNEL_PASSES)]
    best, best_cpu = min(w for w, _ in passes), min(c for _, c in passes)
    # The CPU figure beside the wall time: on a machine shared with other work, the wall time counts the others.
    return {"rows": rows.count, "rows_per_second": rows.count / best, "rows_per_cpu_second": rows.count / best_cpu}


def _kernel_in_step(index: int, rows: _KernelRows, barrier: Any, out: Any) -> None:
    """A process's share of :func:`bare_kernel_together`: its partition's passes, each started at the barrier."""
    passes = []
    for _ in range(KERNEL_PASSES):
        barrier.wait()
        passes.append(rows.timed_pass())
    out.put((index, rows.count, passes))


def bare_kernel_together(rows: list[_KernelRows]) -> dict[str, Any]:
    """The sparse kernel alone in one process per element of ``rows`` at once, each on its own partition, every pass
    started together at a barrier: the most a fit's workers could do on this machine's cores.

    :func:`bare_kernel` times one process while the other cores idle; processes running at once share the
    machine's last-level cache and memory bandwidth, which a kernel reading a support of millions of pairs at random
    leans on. The difference between the two rates is the hardware's, not the engine's.

    Returns ``rows_per_second``: the processes' best-pass rates summed (the machine's rate, every core busy), and
    ``rows_per_second_each``: each process's."""
    import multiprocessing

    processes = len(rows)
    # Forked, after the rows and the model are read here and the kernel compiled by `bare_kernel`: each process starts
    # at once on memory it shares with this one, and does nothing but run the kernel (no store, no cluster).
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_kernel_in_step, args=(i, r, barrier, out)) for i, r in enumerate(rows)]
    for w in workers:
        w.start()
    # Read before joining: a process with a result in its queue's pipe does not exit until it is read. One that died
    # (out of memory, say) would leave the others waiting at the barrier: they are stopped and the run fails.
    results: list[tuple[int, int, list[tuple[float, float]]]] = []
    while len(results) < processes:
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            failed = [w for w in workers if w.exitcode not in (None, 0)]
            if failed:
                for w in workers:
                    w.terminate()
                raise RuntimeError(f"a bare kernel process exited with {failed[0].exitcode}") from None
    for w in workers:
        w.join()
    results.sort()
    each = [count / min(wall for wall, _ in passes) for _, count, passes in results]
    return {"rows_per_second": float(sum(each)), "rows_per_second_each": each}


def m_step_cost(model_dir: Path) -> dict[str, Any]:
    """The driver's per-iteration work on the fit's support, timed in this process: the MAP normalization of
    counts over the support and the kernel's log tables, and the bytes a model and an E-step value carry."""
    import pickle

    from dist_respattn.engine import load_checkpoint
    from dist_respattn.model.emission.layouts import SparseEmission, SparseEmissionCounts

    checkpoint = load_checkpoint(model_dir, "latest")
    model = checkpoint.model
    table = model.emission_table
    if not isinstance(table, SparseEmission):
        return {"m_step_seconds": None, "model_bytes": len(pickle.dumps(model)), "value_bytes": None}
    counts = SparseEmissionCounts(table.values * 1000.0, table.support, num_symbols=model.num_symbols,
                                  num_targets=model.num_targets)  # fmt: skip
    strength = np.full(model.num_symbols, 1.0)
    start = time.perf_counter()
    emission = counts.map_emission(strength, table.base)
    head = model.with_emission(emission)
    head.kernel_parameters  # noqa: B018 - the log tables every worker builds, timed here once
    seconds = time.perf_counter() - start
    return {
        "m_step_seconds": seconds,
        "m_step_seconds_per_pair": seconds / table.support.num_pairs,
        "model_bytes": len(pickle.dumps(model)),
        "value_bytes": 8 * table.support.num_pairs + 8 * model.num_symbols * (model.query_dim + 1),
    }


def fit_and_score(
    data: dict[str, Any],
    work: Path,
    n: int,
    iterations: int,
    memory_limit: str,
    head: str = "single",
    *,
    workers: int = 2,
    m_step_shards: int = 0,
    dask_defaults: bool = False,
) -> dict[str, Any]:
    import distributed

    from dist_respattn.engine import FitSettings, evaluate, fit
    from dist_respattn.engine.cluster import embedded_cluster_settings
    from dist_respattn.model.heads.recipe import RecipeSpec

    model_dir = work / "model"
    settings = FitSettings(max_iter=iterations, tol=0.0, context_length=n, patience=100, m_step_shards=m_step_shards)
    lines: list[str] = []
    # The settings `fit` starts its own cluster under (the Dask profiler off, slower ticks, values sent whole), unless
    # asked for Dask's defaults: what a worker spends beyond its tasks depends on them.
    with contextlib.nullcontext() if dask_defaults else embedded_cluster_settings(), distributed.LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, memory_limit=memory_limit, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:  # fmt: skip
        # Bytes on the wire and the workers' CPU, read at each iteration's line (the single head's fit).
        meters = ClusterMeters(client) if head == "single" else None
        # The ingest's peak is the driver's so far; the workers start here.
        peaks = StagePeaks(client, lines, "ingest", meters)
        peaks.begin("fit")
        if meters is not None:
            meters.mark("fit called")
        with distributed.get_task_stream(client) as stream:
            called = time.time()
            result = fit(data["train"], model_dir=model_dir, settings=settings, client=client, overwrite=True,
                         head=RecipeSpec() if head == "recipe" else None, say=peaks, progress=False)  # fmt: skip
        if meters is not None:
            meters.mark("fit returned")
        fit_worker_peak = max([worker_peak(client), *(p["worker_gib"] * GIB for p in peaks.peaks[1:])])
        figures = recipe_figures(result) if head == "recipe" else None
        if figures is not None:
            del result  # as a fit command's process ends before an evaluate: no stage's model is held
        peaks.begin("evaluate")
        # The recipe is judged against the 5-gram a user modelling text would pick; the single head the bigram.
        evaluated = time.perf_counter()
        scores = evaluate(model_dir, data["test"], client=client, progress=False, say=lines.append,
                          baseline_order=5 if head == "recipe" else 2)  # fmt: skip
        evaluate_seconds = time.perf_counter() - evaluated
        peaks.begin("end")
    if figures is not None:
        baselines = {name: value["perplexity"] for name, value in scores.baselines.items()
                     if name.startswith("kneser_ney")}  # fmt: skip
        return {
            **figures,
            "worker_peak_gib": max(p["worker_gib"] for p in peaks.peaks),
            "driver_peak_gib": max(p["driver_gib"] for p in peaks.peaks),
            "phase_peaks": peaks.peaks,
            "head_perplexity": scores.model["perplexity"],
            "baselines": baselines,
            "evaluate_seconds": evaluate_seconds,
            "log": lines,
        }
    table = result.model.emission_table
    seconds = [h["seconds"] for h in result.history]
    # The driver's peak before the kernels below are timed in this process (they read partitions and the model here).
    driver_peak_gib = max([peak_rss_bytes() / GIB, *(p["driver_gib"] for p in peaks.peaks)])
    # Both kernel figures from one reading of the model and of a partition a worker: partition 0 alone, then all.
    rows_each = kernel_rows(model_dir, data["train"], n, workers)
    kernel = bare_kernel(rows_each[0])
    together = bare_kernel_together(rows_each)
    del rows_each
    driver = m_step_cost(model_dir)
    train_rows = result.history[-1]["n_obs"]
    kernel_time_per_worker = train_rows / kernel["rows_per_second"] / workers
    kernel_time_together = train_rows / together["rows_per_second"]
    assert meters is not None
    traffic = [meters.between(i, i + 1) for i in range(len(meters.marks) - 1)]
    return {
        "pairs": getattr(getattr(table, "support", None), "num_pairs", None),
        "layout": table.layout,
        "rows": int(train_rows),
        "iteration_seconds": seconds,
        "median_iteration_seconds": float(np.median(seconds)),
        "first_iteration_seconds": result.first_iteration_seconds,
        "kernel_rows_per_second": kernel["rows_per_second"],
        "kernel_rows_per_cpu_second": kernel["rows_per_cpu_second"],
        "kernel_seconds_over_two": kernel_time_per_worker,
        "iteration_over_kernel": float(np.median(seconds)) / kernel_time_per_worker,
        "kernel_together_rows_per_second": together["rows_per_second_each"],
        "kernel_together_seconds": kernel_time_together,
        "iteration_over_kernel_together": float(np.median(seconds)) / kernel_time_together,
        "worker_peak_gib": fit_worker_peak / GIB,
        "driver_peak_gib": driver_peak_gib,
        "phase_peaks": peaks.peaks,
        "head_perplexity": scores.model["perplexity"],
        "kneser_ney_perplexity": scores.baselines["kneser_ney"]["perplexity"],
        "head_over_kneser_ney": scores.model["perplexity"] / scores.baselines["kneser_ney"]["perplexity"],
        **driver,
        "phases": fit_phases(stream.data, called),
        "between_passes": owner_tasks(stream.data, called),
        "traffic": traffic,
        "workers": workers,
        "m_step_shards": m_step_shards,
        "dask_defaults": dask_defaults,
        "heldout_perplexities": [h["heldout"]["perplexity"] for h in result.history],
        "log": lines,
    }


def recipe_figures(result: Any) -> dict[str, Any]:
    """The recipe's figures: per stage (each part's fit, then the stack's) its parameters, median and first
    iteration, and the whole fit's time."""
    stages = []
    for stage in [*result.stages, result]:
        seconds = [h["seconds"] for h in stage.history]
        stages.append({
            "kind": stage.model.kind,
            "directory": os.path.relpath(stage.model_dir, result.model_dir),
            "parameters": int(stage.model.num_parameters()),
            "iterations": len(seconds),
            "median_iteration_seconds": float(np.median(seconds)) if seconds else None,
            "first_iteration_seconds": stage.first_iteration_seconds,
            "seconds": stage.seconds,
        })  # fmt: skip
    return {"head": "recipe", "stages": stages, "fit_seconds": sum(stage["seconds"] for stage in stages)}


def print_recipe(rows: list[tuple[str, str, str | None, float | None]], fitted: dict[str, Any]) -> None:
    """The recipe's report: the store's rows, the memory peaks against their targets, then a line per stage."""
    orders = {name: int(name.rpartition("_")[2]) if name != "kneser_ney" else 2 for name in fitted["baselines"]}
    baselines = ", ".join(
        f"KN {orders[name]} {fitted['baselines'][name]:.2f}" for name in sorted(orders, key=orders.get)
    )
    rows += [
        ("worker peak", f"{fitted['worker_peak_gib']:.2f} GiB", "worker_peak_gib", fitted["worker_peak_gib"]),
        ("driver peak", f"{fitted['driver_peak_gib']:.2f} GiB", "driver_peak_gib", fitted["driver_peak_gib"]),
        ("fit", f"{fitted['fit_seconds']:.0f} s in {len(fitted['stages'])} stages", None, None),
        ("test perplexity", f"recipe {fitted['head_perplexity']:.2f}; {baselines}", None, None),
        ("evaluate", f"{fitted['evaluate_seconds']:.0f} s (the test store, the Kneser-Ney counts included)", None,
         None),
    ]  # fmt: skip
    _print_rows(rows)
    print("  phase       driver peak  worker peak (GiB, VmHWM within the phase)")
    for phase in fitted["phase_peaks"]:
        print(f"  {phase['phase']:<11} {phase['driver_gib']:11.2f}  {phase['worker_gib']:11.2f}")
    print("  stage      directory   parameters  iterations  median s  first s  stage s")
    for stage in fitted["stages"]:
        median = stage["median_iteration_seconds"]
        first = stage["first_iteration_seconds"]
        print(f"  {stage['kind']:<10} {stage['directory']:<10} {stage['parameters']:>11,} {stage['iterations']:>11}"
              f"  {median if median is not None else float('nan'):8.1f} "
              f"{first if first is not None else float('nan'):8.1f} {stage['seconds']:8.1f}")  # fmt: skip


#: A fit's task keys: ``respattn-<pass>-<label>-<part>-<tag>`` and ``respattn-<pass>-combine-<label>-…``.
PHASE_KEY = re.compile(r"respattn-([a-z]+(?:-combine)?)-([0-9.]+)-")


def fit_phases(records: list[dict[str, Any]], called: float) -> list[dict[str, Any]]:
    """Where a fit's wall time went: each pass (its partition tasks and their combines) from the task stream,
    in time order, with its first start and last stop (seconds from the ``fit`` call) and its compute seconds
    summed over the tasks. The gaps between passes are the driver's: M-steps, scatters, checkpoints."""
    phases: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        match = PHASE_KEY.match(str(record["key"]))
        if match is None:
            continue
        kind = match.group(1)
        is_combine = kind.endswith("combine")
        pass_name = "estep" if kind == "combine" else kind.removesuffix("-combine")  # the E-step's are bare
        empty = {"begin": np.inf, "end": -np.inf, "compute": 0.0, "combine": 0.0, "transfer": 0.0, "tasks": 0}
        phase = phases.setdefault((pass_name, match.group(2)), empty)
        for ss in record["startstops"]:
            phase["begin"] = min(phase["begin"], ss["start"] - called)
            phase["end"] = max(phase["end"], ss["stop"] - called)
            seconds = ss["stop"] - ss["start"]
            if ss["action"] == "compute":
                phase["combine" if is_combine else "compute"] += seconds
                phase["tasks"] += not is_combine
            elif ss["action"] == "transfer":
                phase["transfer"] += seconds
    return sorted(({"pass": k[0], "label": k[1], **v} for k, v in phases.items()), key=lambda p: p["begin"])


#: The sharded M-step's tasks (:mod:`dist_respattn.engine.sharded`): ``respattn-<what>-<label>-<n>-<tag>``, the
#: M-step of each part, the summary, the head's parts, its warnings, the checkpoint's part writes and reads.
OWNER_KEY = re.compile(r"respattn-(mstep|summary|head|warnings|write|load)")


def owner_tasks(records: list[dict[str, Any]], called: float) -> list[dict[str, Any]]:
    """The sharded M-step's tasks on the workers (none with the driver's M-step), each with its start (seconds from
    the ``fit`` call), what it is, its compute and transfer seconds: the time between passes they take."""
    tasks = []
    for record in records:
        match = OWNER_KEY.match(str(record["key"]))
        if match is None:
            continue
        compute = sum(ss["stop"] - ss["start"] for ss in record["startstops"] if ss["action"] == "compute")
        transfer = sum(ss["stop"] - ss["start"] for ss in record["startstops"] if ss["action"] == "transfer")
        begin = min(ss["start"] for ss in record["startstops"]) - called
        end = max(ss["stop"] for ss in record["startstops"]) - called
        tasks.append({"what": match.group(1), "begin": begin, "end": end, "compute": compute, "transfer": transfer})
    return sorted(tasks, key=lambda t: t["begin"])


# ------------------------------------------------------------------------------------------ report


def verdict(name: str, value: float) -> str:
    target = TARGETS[name]
    better_high = name in ("ingest_tokens_per_second", "sparse_over_dense_kernel")
    return "PASS" if (value >= target if better_high else value <= target) else "MISS"


def print_report(report: dict[str, Any]) -> None:
    ref = report.get("reference")
    if ref is not None:
        print(f"reference shape S=T=2000, N=16, D=32, {ref['shape']['rows']:,} rows, {ref['pairs']:,} pairs")
        print(f"  dense kernel   {ref['dense_rows_per_second'] / 1e6:8.3f} M rows/s")
        print(f"  sparse kernel  {ref['sparse_rows_per_second'] / 1e6:8.3f} M rows/s   "
              f"sparse/dense {ref['sparse_over_dense_kernel']:.2f}x (target >= 0.8) "
              f"{verdict('sparse_over_dense_kernel', ref['sparse_over_dense_kernel'])}")  # fmt: skip
        print(f"  statistics     max relative difference {ref['statistics_difference']:.2e} (target <= 1e-12) "
              f"{verdict('statistics_difference', ref['statistics_difference'])}")  # fmt: skip
    data = report["corpus"]
    files = data["files"]
    print(f"corpus {report['source']}: {files['train']:,} train files, {data['tokens']:,} tokens, "
          f"S = T = {data['vocabulary']:,}; test {files['test']:,} files, {data['test_tokens']:,} tokens")  # fmt: skip
    rows = [
        ("ingest", f"{data['ingest_tokens_per_second'] / 1e6:.2f} M tokens/s ({data['ingest_seconds']:.1f} s; "
         f"{data['tokens'] / data['ingest_cpu_seconds'] / 1e6:.2f} M a CPU second on {data['ingest_threads']} "
         f"threads; {data['train_bytes'] / 2**20:,.0f} MiB of text)", "ingest_tokens_per_second",
         data["ingest_tokens_per_second"]),
        ("store", f"{data['bytes_per_token']:.2f} bytes a token ({data['bytes_on_disk'] / 2**20:,.0f} MiB)",
         "bytes_per_token", data["bytes_per_token"]),
    ]  # fmt: skip
    fitted = report.get("fit")
    if fitted is None:  # --ingest-only
        _print_rows(rows)
        return
    if fitted.get("head") == "recipe":
        print_recipe(rows, fitted)
        return
    rows += [
        ("support", f"{fitted['pairs'] or 0:,} pairs ({fitted['layout']})", None, None),
        ("M-step", "on the driver" if not fitted.get("m_step_shards") else
         f"{fitted['m_step_shards']} shards on the workers", None, None),
        ("cluster", "Dask's default settings" if fitted.get("dask_defaults") else
         "the settings fit starts its own cluster with (Dask's profiler off, values sent whole)", None, None),
        ("iteration", f"{fitted['median_iteration_seconds']:.1f} s median over {len(fitted['iteration_seconds'])} "
         f"({', '.join(f'{s:.1f}' for s in fitted['iteration_seconds'])}); "
         f"kernel {fitted['kernel_rows_per_second'] / 1e6:.2f} M rows/s -> {fitted['kernel_seconds_over_two']:.1f} s "
         f"on {fitted.get('workers', 2)} workers; ratio {fitted['iteration_over_kernel']:.2f}x",
         "iteration_over_kernel", fitted["iteration_over_kernel"]),
        ("kernel CPU", f"{fitted['kernel_rows_per_cpu_second'] / 1e6:.2f} M rows a CPU second (the kernel's CPU "
         f"time, beside the wall time above)", None, None),
        ("kernel together", f"{', '.join(f'{r / 1e6:.2f}' for r in fitted['kernel_together_rows_per_second'])} M "
         f"rows/s in {len(fitted['kernel_together_rows_per_second'])} processes at once -> "
         f"{fitted['kernel_together_seconds']:.1f} s; iteration {fitted['iteration_over_kernel_together']:.2f}x "
         f"(the cores' shared cache and memory counted)", None, None),
        ("first iteration", f"{fitted['first_iteration_seconds']:.1f} s", "first_iteration_seconds",
         fitted["first_iteration_seconds"]),
        ("worker peak", f"{fitted['worker_peak_gib']:.2f} GiB", "worker_peak_gib", fitted["worker_peak_gib"]),
        ("driver peak", f"{fitted['driver_peak_gib']:.2f} GiB", "driver_peak_gib", fitted["driver_peak_gib"]),
        ("test perplexity", f"head {fitted['head_perplexity']:.2f}, Kneser-Ney {fitted['kneser_ney_perplexity']:.2f}, "
         f"ratio {fitted['head_over_kneser_ney']:.3f}", None, None),
    ]  # fmt: skip
    if fitted.get("m_step_seconds") is not None:
        per_pair_ns = fitted["m_step_seconds_per_pair"] * 1e9
        model_mib, value_mib = fitted["model_bytes"] / 2**20, fitted["value_bytes"] / 2**20
        sizes = f"a model {model_mib:,.0f} MiB, an E-step value {value_mib:,.0f} MiB"
        rows.append(
            ("driver M-step", f"{fitted['m_step_seconds']:.2f} s ({per_pair_ns:.0f} ns a pair); {sizes}", None, None)
        )
    _print_rows(rows)
    print("  where the fit's wall time went (seconds from the fit call; compute summed over the pass's tasks):")
    previous_end = 0.0
    owners = fitted.get("between_passes", [])
    for phase in fitted.get("phases", []):
        print(f"    {phase['pass']:<8} {phase['label']:>4}  {phase['begin']:7.1f} -> {phase['end']:7.1f}  "
              f"(driver before it {phase['begin'] - previous_end:5.1f})  {phase['tasks']:3d} tasks, "
              f"compute {phase['compute']:7.1f}, combines {phase['combine']:5.1f}, "
              f"transfers {phase['transfer']:5.1f}")  # fmt: skip
        inside = [t for t in owners if previous_end <= t["begin"] < phase["begin"]]
        if inside:
            print("      " + _owner_line(inside))
        previous_end = phase["end"]
    after = [t for t in owners if t["begin"] >= previous_end]
    if after:
        print("      after the last pass: " + _owner_line(after))
    print_traffic(fitted)
    perplexities = ", ".join(f"{p:.6f}" for p in fitted.get("heldout_perplexities", []))
    print(f"  held-out perplexity by iteration: {perplexities}")


def _owner_line(tasks: list[dict[str, Any]]) -> str:
    """The sharded M-step's tasks in a gap between passes: their count, compute and transfer seconds by kind."""
    kinds: dict[str, list[float]] = {}
    for task in tasks:
        kind = kinds.setdefault(task["what"], [0, 0.0, 0.0])
        kind[0] += 1
        kind[1] += task["compute"]
        kind[2] += task["transfer"]
    parts = [f"{what} {int(n)}: {c:.2f} s (transfers {t:.2f})" for what, (n, c, t) in kinds.items()]
    span = max(t["end"] for t in tasks) - min(t["begin"] for t in tasks)
    return f"owners' tasks over {span:.1f} s: " + "; ".join(parts)


def print_traffic(fitted: dict[str, Any]) -> None:
    """Bytes on the wire by route, the driver's CPU and each worker's CPU (all of it, its tasks', and beyond them)
    between the fit's marks (its call, each iteration's line, its return)."""
    traffic = fitted.get("traffic") or []
    if not traffic:
        return
    print("  bytes on the wire (MiB, by route) and CPU seconds, between the fit's marks:")
    for span in traffic:
        routes = ", ".join(f"{route} {n / 2**20:,.1f}" for route, n in sorted(span["bytes"].items())
                           if n >= 2**16)  # fmt: skip
        print(f"    {span['from']} -> {span['to']} ({span['seconds']:.1f} s): {routes}; driver CPU "
              f"{span['driver_cpu']:.1f}")  # fmt: skip
        by_prefix = sorted(span.get("fetched_by_prefix", {}).items())
        fetched = ", ".join(f"{prefix.removeprefix('respattn-')} {n / 2**20:,.1f}" for prefix, n in by_prefix
                            if n >= 2**16)  # fmt: skip
        if fetched:
            print(f"      fetched worker to worker, by task prefix (MiB, as Dask sizes them): {fetched}")
        for address, cpu in sorted(span["workers"].items()):
            tasks = ", ".join(f"{k.removeprefix('respattn-')} {v:.1f}" for k, v in sorted(cpu["tasks"].items())
                              if v >= 0.05)  # fmt: skip
            print(f"      worker {address.rsplit(':', 1)[-1]}: CPU {cpu['process']:.1f} s, tasks "
                  f"{sum(cpu['tasks'].values()):.1f} ({tasks}), beyond tasks {cpu['beyond_tasks']:.1f}")  # fmt: skip


def _print_rows(rows: list[tuple[str, str, str | None, float | None]]) -> None:
    for label, text, key, value in rows:
        mark = f"  (target {TARGETS[key]:g}) {verdict(key, value)}" if key is not None and value is not None else ""
        print(f"  {label:<16} {text}{mark}")


def print_start_pass(data: dict[str, Any], timed: dict[str, Any]) -> None:
    seconds, cpu = np.asarray(timed["seconds"]), np.asarray(timed["cpu_seconds"])
    print(f"start pass of {data['train']}: {data['tokens']:,} tokens, {timed['of_partitions']} partitions of "
          f"{timed['rows_per_partition']:,} rows, {timed['pairs']:,} pairs")  # fmt: skip
    print(f"  per partition  median {np.median(seconds):.2f} s wall, {np.median(cpu):.2f} s CPU "
          f"({timed['partitions']} timed); combine {timed['combine_seconds']:.2f} s wall, "
          f"{timed['combine_cpu_seconds']:.2f} s CPU")  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="a directory of text files (default: linux-source-6.1's *.c/*.h)")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "respattn-bench-cache"))
    parser.add_argument("--work", help="where the stores and the model go (default: a temporary directory)")
    parser.add_argument(
        "--share", type=float, default=0.6, help="the share of the corpus's files used, by hash (default 0.6)"
    )
    parser.add_argument("--test-fraction", type=float, default=0.02)
    parser.add_argument("--vocab-size", type=int, default=49_999, help="K words kept (S = K + 1)")
    parser.add_argument("--context", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--reference-rows", type=int, default=1_000_000, help="0: no reference-shape kernels")
    parser.add_argument(
        "--reference-repeats", type=int, default=3,
        help="timed runs of each reference-shape kernel, the best kept (default 3; 1 for a smoke run)",
    )  # fmt: skip
    parser.add_argument("--memory-limit", default="10GiB", help="each worker's limit")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of one thread each (default 2)")
    parser.add_argument("--partition-rows", type=int, help="the stores' rows a partition (default: the ingest's)")
    parser.add_argument(
        "--m-step-shards", type=int, default=0,
        help="the fit's --m-step-shards: K >= 1 runs the M-step in K shards on the workers (default 0: the driver)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    parser.add_argument(
        "--start-pass", action="store_true", help="after ingest, time the sparse start pass per partition and stop"
    )
    parser.add_argument("--ingest-only", action="store_true", help="only the corpus's ingest: no kernels, no fit")
    parser.add_argument(
        "--head", choices=("single", "recipe"), default="single",
        help="fit the single head (default) or the recipe, stage by stage",
    )  # fmt: skip
    parser.add_argument(
        "--dask-defaults", action="store_true",
        help="start the fit's cluster with Dask's default settings, not the quieter ones `fit` starts its own with",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.reference_repeats < 1:
        parser.error("--reference-repeats must be at least 1")

    skip_reference = args.start_pass or args.ingest_only
    skip_reference = skip_reference or args.reference_rows == 0
    report: dict[str, Any] = {}
    if not skip_reference:
        report["reference"] = reference_shape(args.reference_rows, args.reference_repeats)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if args.corpus:
        root, suffixes, report["source"] = Path(args.corpus), (".py", ".txt", ".c", ".h"), args.corpus
    else:
        root, suffixes, report["source"] = linux_source(cache), (".c", ".h"), "linux-source-6.1 (*.c, *.h)"
    files = take_files(source_files(root, suffixes), root, args.share)
    train_files = [f for f in files if not goes_to_test(f, root, args.test_fraction)]
    test_files = [f for f in files if goes_to_test(f, root, args.test_fraction)]
    work = Path(args.work or tempfile.mkdtemp(prefix="respattn-scale-"))
    report["corpus"] = ingest(train_files, test_files, work, args.vocab_size, args.context, args.partition_rows)
    if args.start_pass:
        timed = start_pass(report["corpus"]["train"], args.context)
        print_start_pass(report["corpus"], timed)
        return {**report, "start_pass": timed}
    if not args.ingest_only:
        report["fit"] = fit_and_score(
            report["corpus"], work, args.context, args.iterations, args.memory_limit, head=args.head,
            workers=args.workers, m_step_shards=args.m_step_shards, dask_defaults=args.dask_defaults,
        )  # fmt: skip
    print_report(report)
    if args.json:
        print(json.dumps({k: v for k, v in report.items()}, default=float))
    return report


if __name__ == "__main__":
    main()
