"""One E-step task of the 109M-token fit, in this process, part by part: where a task's time goes beside the kernel's.

Loads the single head of a fitted model directory (its keys, sparse emission and prior; a tied prior is untied, its
per-position prior kept, and its support widened to every pair of the partition at the probability the backoff gave
it, so the free-prior kernel the default fit runs is the one timed) and one partition of its training store, then
times, on that partition's training rows (the fit's hold-out applied as the task applies it), two ways of reading
them side by side, interleaved: encoded rows (each row's N ids and its (D,) query copied into (n, N) and (n, D)
arrays) and token windows (the rows where they lie in the stream, each query read from the embedding table by id):

- ``read``: the token chunks read and decompressed (zarr), and their ids checked;
- ``windows``: the rows made from the tokens (``read+windows+weights`` less the other two);
- ``weights``: the hold-out's training weights of each block;
- ``kernel``: the trainer's E-step on rows already made (the empty statistics, the kernel, the value handed over);
- ``task``: :func:`~dist_respattn.engine.worker_tasks.statistics_task` whole, as a worker runs it (the store
  opened and checked before and after included), and ``rest of the task``: what it spends beyond the parts above.

The process keeps freed blocks for the next as a worker does. Every part is timed ``--repeat`` times, in CPU seconds
of this process (zarr decodes on threads of its own); the best of each is printed, with ns a row, and whether the two
ways gave the same statistics to the bit. Nothing is written anywhere. Run::

    python benchmarks/profile_estep.py --model /work/cache/scale/recipe109/model/single \\
        --store /work/cache/scale/recipe109/train.zarr --partition 3 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np


def best_of(repeat: int, work: Any) -> tuple[float, Any]:
    """The least CPU seconds (of this process: zarr decodes on threads of its own) of ``repeat`` calls of
    ``work()``, and its last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        result = work()
        best = min(best, time.process_time() - start)
    return best, result


def free_prior(model: Any, blocks: list[Any]) -> Any:
    """The model with its prior untied (the same per-position prior): the free-prior head a default fit runs; its
    support widened to every pair of ``blocks`` (a tied prior's fit finds its pairs in its own windows), each new
    pair's value the backoff's ``backoff[s] base[t]``, so it is the same distribution."""
    from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
    from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution

    table = model.emission_table
    s = model.num_symbols
    old = table.support.keys()
    rows = [(b.target.astype(np.int64)[:, None] * s + b.context.astype(np.int64)).reshape(-1) for b in blocks]
    keys = np.union1d(old, np.unique(np.concatenate(rows)))
    support = PairSupport.from_keys(keys, s, model.num_targets)
    values = table.backoff[keys % s] * table.base[keys // s]
    values[np.searchsorted(keys, old)] = table.values
    emission = SparseEmission(support, values, table.backoff, table.base)
    prior = np.exp(model.kernel_parameters.log_prior)
    return ResponsibilityAttentionDistribution(model.key_means, emission, prior / prior.sum(), model.sigma2)


def same_bits(a: Any, b: Any) -> bool:
    """Whether two E-step values hold the same numbers to the bit."""
    arrays = ("key_sum", "key_mass", "position_count")
    if not all(np.array_equal(getattr(a, n), getattr(b, n)) for n in arrays):
        return False
    if not np.array_equal(a.emission_count.counts, b.emission_count.counts):
        return False
    return (a.query_sq, a.n_obs, a.log_lik) == (b.query_sq, b.n_obs, b.log_lik)


def profile(model_dir: str, store_url: str, part: int, repeat: int) -> dict[str, Any]:
    import distributed.protocol

    from dist_respattn.engine import load_checkpoint
    from dist_respattn.engine.worker_tasks import RowSelection, _keep_freed_blocks, partition_blocks, statistics_task
    from dist_respattn.model.fitting.holdout import HoldoutRule
    from dist_respattn.model.heads.base import Columns
    from dist_respattn.model.heads.single_hop.estimator import ResponsibilityAttentionEstimator
    from dist_respattn.model.heads.single_hop.kind import SingleHopTrainer
    from dist_respattn.model.rows import WindowRows
    from dist_respattn.store import open_store

    class EncodedRowsTrainer(SingleHopTrainer):
        """The trainer as it read a free prior's rows before: encoded, each query a copy of its table row."""

        @property
        def columns(self) -> Columns:
            return Columns()

    _keep_freed_blocks()  # as a worker does: one block's arrays reused by the next, not mapped afresh
    checkpoint = load_checkpoint(model_dir, "latest")
    rule = HoldoutRule.from_json(checkpoint.meta["holdout"])
    selection = RowSelection(rule, "train")
    n_pos = checkpoint.model.context_length
    store = open_store(store_url, window=n_pos)
    model = free_prior(checkpoint.model, list(store.iter_blocks(part)))
    del checkpoint
    s, d, t = model.num_symbols, model.query_dim, model.num_targets
    estimator = ResponsibilityAttentionEstimator(s, n_pos, d, t)
    trainers = {
        "encoded": EncodedRowsTrainer(estimator, "sparse", "uniform", 0),
        "windows": SingleHopTrainer(estimator, "sparse", "uniform", 0),
    }
    ranges = store.block_ranges(part)
    rows = ranges[-1][1] - ranges[0][0]
    fingerprint = store.fingerprint()
    figures: dict[str, dict[str, float]] = {name: {} for name in trainers}
    values: dict[str, Any] = {}

    def keep(path: str, name: str, seconds: float) -> None:
        figures[path][name] = min(figures[path].get(name, float("inf")), seconds)

    def read() -> None:
        for begin, end in ranges:
            pos = store._rows.positions(begin, end)
            store._checked_span(max(int(pos[0]) - n_pos, 0), int(pos[-1]) + 1)

    for _ in range(repeat):  # the two paths interleaved, so the machine's load falls on both alike
        for path, trainer in trainers.items():
            keep(path, "read", best_of(1, read)[0])
            seconds, made = best_of(1, lambda tr=trainer: list(partition_blocks(store, part, selection, tr.columns)))
            keep(path, "read+windows+weights", seconds)
            keep(path, "weights", best_of(1, lambda m=made: [selection.weights(b.rows) for b in m])[0])

            def estep(tr: Any = trainer, m: Any = made) -> Any:
                return tr.statistics(model, iter(m))

            keep(path, "kernel (the trainer's statistics)", best_of(1, estep)[0])
            del made
            seconds, values[path] = best_of(
                1, lambda tr=trainer: statistics_task(store.location, part, tr, model, fingerprint, selection)
            )
            keep(path, "task", seconds)
    for path in trainers:
        f = figures[path]
        f["windows"] = f["read+windows+weights"] - f["read"] - f["weights"]
        f["rest of the task"] = f["task"] - f["read+windows+weights"] - f["kernel (the trainer's statistics)"]
    value = values["windows"]
    serialised, nbytes = best_of(
        repeat, lambda: sum(memoryview(f).nbytes for f in distributed.protocol.serialize(value)[1])
    )
    first = next(iter(partition_blocks(store, part, selection, Columns(windows=True))))
    assert isinstance(first.rows, WindowRows)
    return {
        "partition": part,
        "rows": rows,
        "training_rows": float(value.n_obs),
        "blocks": len(ranges),
        "value_bytes": nbytes,
        "serialise_seconds": serialised,
        "seconds": figures,
        "ns_per_row": {p: {k: 1e9 * v / rows for k, v in f.items()} for p, f in figures.items()},
        "same_bits": same_bits(values["encoded"], values["windows"]),
        "log_lik": float(value.log_lik),
        "load": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="/work/cache/scale/recipe109/model/single")
    parser.add_argument("--store", default="/work/cache/scale/recipe109/train.zarr")
    parser.add_argument("--partition", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = profile(args.model, args.store, args.partition, args.repeat)
    if args.json:
        print(json.dumps(report))
        return
    print(f"partition {report['partition']}: {report['rows']:,} rows in {report['blocks']} blocks, "
          f"{report['training_rows']:,.0f} training rows; value {report['value_bytes'] / 2**20:.0f} MiB "
          f"(serialised in {report['serialise_seconds']:.3f} s); statistics the same to the bit: "
          f"{report['same_bits']}; load {report['load'][0]:.2f}")  # fmt: skip
    heading = f"CPU s, best of {args.repeat}"
    print(f"  {heading:36s} {'encoded (n, D) queries':>24s} {'windows, queries by id':>24s}")
    seconds, per_row = report["seconds"], report["ns_per_row"]
    for name in seconds["encoded"]:
        cells = [f"{seconds[p][name]:7.3f} s {per_row[p][name]:6.1f} ns" for p in seconds]
        print(f"  {name:36s} {cells[0]:>24s} {cells[1]:>24s}")


if __name__ == "__main__":
    main()
