"""E-step throughput per core of the conjunction head's kernel beside the single head's, on the same rows.

Rows are sampled from a random single-hop head (default shape S = T = 2000, N = 8, D = 32) and run, one core,
through the single head's per-position E-step (``ResponsibilityAttentionAccumulator.seq_update``) and through the
conjunction kernel (token windows, per position) with the pair rows of every (attended, current, target) cell the
rows hold at the ``--depth`` most recent positions, random counts. Sampled rows repeat few pairs, so the support is
nearly one pair per row and position (a worst case for its binary searches). The JIT is warmed up first; each takes
the best of ``--repeats`` runs, in CPU time, the kernels taking turns.

With ``--store`` and ``--model``, the rows are instead a real store's first ``--rows`` rows and the heads a fitted
conjunction head (``--model``, a model directory of ``fit --head conj``) and its own single head (the same keys,
gate and emission), each E-step as a fit runs it on that store's blocks; a head of order 3 (``--conj-order 3``) runs
beside its order-2 self (the same pair rows without the triple rows) too.

Run::

    python benchmarks/bench_conj.py                       # 1,000,000 rows at N = 8, depths 2 and 8
    python benchmarks/bench_conj.py --rows 20000 --json   # a smoke run
    python benchmarks/bench_conj.py --store train.zarr --model conj-model --rows 300000   # real rows
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from dist_respattn.model.emission.layouts import SparseEmission  # noqa: E402
from dist_respattn.model.heads.base import Block  # noqa: E402
from dist_respattn.model.heads.conj import ConjHead  # noqa: E402
from dist_respattn.model.heads.conj.kind import cell_tally, conj_statistics, support_of  # noqa: E402
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator  # noqa: E402
from dist_respattn.model.heads.single_hop.sampler import random_distribution  # noqa: E402
from dist_respattn.model.rows import WindowRows  # noqa: E402


def best_times(repeats: int, runs: dict[Any, Callable[[], object]]) -> dict[Any, float]:
    """The best of ``repeats`` times (s) of each run, the runs taking turns in every round, measured in this thread's
    CPU time: rows/s per core, which a shared machine's other processes (waits for a core) do not count in, and a
    burst of load then slows each of the runs alike, their ratios measured side by side."""
    best = {name: math.inf for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.thread_time()
            run()
            best[name] = min(best[name], time.thread_time() - started)
    return best


def single_accumulator(head: Any) -> ResponsibilityAttentionAccumulator:
    """An empty accumulator of the single head's E-step for ``head``'s shape and emission layout."""
    table = head.emission_table
    if isinstance(table, SparseEmission):
        return ResponsibilityAttentionAccumulator(*head.shape, layout="sparse", support=table.support)
    return ResponsibilityAttentionAccumulator(*head.shape)


def real_rows(args: argparse.Namespace) -> dict[str, Any]:
    """The figures of a fitted conjunction head and its single head on a store's first ``--rows`` rows."""
    from dist_respattn.artifacts.references import load_model
    from dist_respattn.store import open_store

    head = load_model(args.model)
    if not isinstance(head, ConjHead):
        raise SystemExit(f"bench_conj.py: error: --model {args.model} holds a {type(head).__name__}: expected a "
                         "conjunction head (fit --head conj)")  # fmt: skip
    # A token-stream store is read at the head's window (a store split at N = 128 serves a head fitted at N = 8).
    store = open_store(args.store, window=head.context_length)
    n_rows = min(args.rows, store.num_rows)
    encoded = store.read_rows(0, n_rows)
    rows = store.read_windows(0, n_rows)
    small = min(1000, n_rows)
    single_accumulator(head.single).seq_update(
        (encoded.context[:small], encoded.query[:small], encoded.target[:small]), None, head.single
    )
    conj_statistics(head, [Block(store.read_windows(0, small), None)])

    def single() -> None:
        single_accumulator(head.single).seq_update(
            (encoded.context, encoded.query, encoded.target), None, head.single, checked=encoded.checked
        )

    heads: dict[str, ConjHead] = {str(head.depth) if head.order == 2 else f"{head.depth}, order 3": head}
    if head.order == 3:
        heads[f"{head.depth}, order 2"] = ConjHead(
            head.single, head.depth, head.pair_keys, head.indptr, head.targets, head.counts, head.strength,
            head.type_strength, backoff=head.backoff, discount=head.discount,
        )  # fmt: skip
    # A fit's E-step over its training rows leaves each row out of rows counted from the data: timed beside.
    heads.update({f"{name}, each row left out": each for name, each in list(heads.items())})
    left_out = {name for name in heads if name.endswith("left out")}
    for name, each in heads.items():
        conj_statistics(each, [Block(store.read_windows(0, small), None)], leave_one_out=name in left_out)
    runs: dict[Any, Callable[[], object]] = {"single": single}
    for name, each in heads.items():
        runs[name] = functools.partial(conj_statistics, each, [Block(rows, None)], leave_one_out=name in left_out)
    times = best_times(args.repeats, runs)
    single_rate = n_rows / times["single"]
    s, n, d, t = head.shape
    conj = {}
    for name, each in heads.items():
        rate = n_rows / times[name]
        conj[name] = {"rows_per_second": rate, "over_single": rate / single_rate, "pairs": int(each.pair_keys.size),
                      "cells": int(each.targets.size), "bytes": int(each.nbytes())}  # fmt: skip
        if each.triples is not None:
            conj[name].update(triples=int(each.triples.keys.size), triple_cells=int(each.triples.targets.size))
    return {"shape": {"S": s, "N": n, "D": d, "T": t}, "rows": n_rows, "store": str(args.store),
            "model": str(args.model), "single_rows_per_second": single_rate, "conj": conj}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--symbols", type=int, default=2000, help="S = T")
    parser.add_argument("--context", type=int, default=8, help="N")
    parser.add_argument("--dim", type=int, default=32, help="D")
    parser.add_argument("--depths", default="2,8", help="comma-separated conjunction depths")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--store", help="a store whose first --rows rows are run (with --model) instead of sampled rows"
    )
    parser.add_argument("--model", help="a fitted conjunction head's model directory (with --store)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if (args.store is None) != (args.model is None):
        parser.error("--store and --model go together")
    if args.store is not None:
        report(real_rows(args), args.json)
        return
    s, n, d = args.symbols, args.context, args.dim
    truth = random_distribution(s, n, d, s, seed=0, sigma2=1.0)
    context, query, target = truth.sampler(1).sample_arrays(args.rows)
    context = np.ascontiguousarray(context, dtype=np.int32)
    query, target = query.astype(np.float32), target.astype(np.int32)
    model = random_distribution(s, n, d, s, seed=2, sigma2=1.0)  # scored under another head, as EM does
    rows = WindowRows.from_encoded(context, query, target)
    small = slice(0, min(1000, args.rows))
    ResponsibilityAttentionAccumulator(s, n, d, s).seq_update(
        (context[small], query[small], target[small]), None, model
    )

    def single() -> None:
        ResponsibilityAttentionAccumulator(s, n, d, s).seq_update((context, query, target), None, model)

    rng = np.random.default_rng(3)
    heads = {}
    for depth in (int(v) for v in args.depths.split(",")):
        depth = min(depth, n)
        pair_keys, indptr, targets = support_of(cell_tally(s, s, depth, iter([Block(rows, None)])), s, 1.0)
        heads[depth] = ConjHead(model, depth, pair_keys, indptr, targets, rng.exponential(size=targets.size), 1.0, 0.5)
        conj_statistics(
            heads[depth], [Block(WindowRows.from_encoded(context[small], query[small], target[small]), None)]
        )
    times = best_times(
        args.repeats,
        {
            "single": single,
            **{depth: (lambda head=head: conj_statistics(head, [Block(rows, None)])) for depth, head in heads.items()},
        },
    )
    single_rate = args.rows / times["single"]
    figures: dict = {"shape": {"S": s, "N": n, "D": d, "T": s}, "rows": args.rows,
                     "single_rows_per_second": single_rate, "conj": {}}  # fmt: skip
    for depth, head in heads.items():
        rate = args.rows / times[depth]
        figures["conj"][depth] = {"rows_per_second": rate, "over_single": rate / single_rate,
                                  "pairs": int(head.pair_keys.size), "cells": int(head.targets.size)}  # fmt: skip
    report(figures, args.json)


def report(figures: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(figures))
        return
    shape = figures["shape"]
    where = f" of {figures['store']}" if "store" in figures else ""
    print(f"S = {shape['S']}, T = {shape['T']}, N = {shape['N']}, D = {shape['D']}, {figures['rows']:,} rows{where}, "
          "one core")  # fmt: skip
    print(f"single head, per-position kernel:        {figures['single_rows_per_second']:12,.0f} rows/s")
    for depth, f in figures["conj"].items():
        triples = f", {f['triples']:,} triples" if "triples" in f else ""
        print(f"conjunction head, depth {depth} ({f['pairs']:,} pairs{triples}): {f['rows_per_second']:12,.0f} rows/s"
              f"  ({f['over_single']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
