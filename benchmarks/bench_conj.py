"""E-step throughput per core of the conjunction head's kernel beside the single head's, on the same rows.

Rows are sampled from a random single-hop head (default shape S = T = 2000, N = 8, D = 32) and run, one core,
through the single head's per-position E-step (``ResponsibilityAttentionAccumulator.seq_update``) and through the
conjunction kernel (token windows, per position) with the pair rows of every (attended, current, target) cell the
rows hold at the ``--depth`` most recent positions, random counts. Sampled rows repeat few pairs, so the support is
nearly one pair per row and position (a worst case for its binary searches). The JIT is warmed up first; each takes
the best of ``--repeats`` runs.

Run::

    python benchmarks/bench_conj.py                       # 1,000,000 rows at N = 8, depths 2 and 8
    python benchmarks/bench_conj.py --rows 20000 --json   # a smoke run
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from dist_respattn.model.heads.base import Block  # noqa: E402
from dist_respattn.model.heads.conj import ConjHead  # noqa: E402
from dist_respattn.model.heads.conj.kind import cell_tally, conj_statistics, support_of  # noqa: E402
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator  # noqa: E402
from dist_respattn.model.heads.single_hop.sampler import random_distribution  # noqa: E402
from dist_respattn.model.rows import WindowRows  # noqa: E402


def best_of(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--symbols", type=int, default=2000, help="S = T")
    parser.add_argument("--context", type=int, default=8, help="N")
    parser.add_argument("--dim", type=int, default=32, help="D")
    parser.add_argument("--depths", default="2,8", help="comma-separated conjunction depths")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
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

    single_rate = args.rows / best_of(args.repeats, single)
    figures: dict = {"shape": {"S": s, "N": n, "D": d, "T": s}, "rows": args.rows,
                     "single_rows_per_second": single_rate, "conj": {}}  # fmt: skip
    rng = np.random.default_rng(3)
    for depth in (int(v) for v in args.depths.split(",")):
        depth = min(depth, n)
        pair_keys, indptr, targets = support_of(cell_tally(s, s, depth, iter([Block(rows, None)])), s, 1.0)
        head = ConjHead(model, depth, pair_keys, indptr, targets, rng.exponential(size=targets.size), 1.0, 0.5)
        conj_statistics(head, [Block(WindowRows.from_encoded(context[small], query[small], target[small]), None)])
        rate = args.rows / best_of(args.repeats, lambda head=head: conj_statistics(head, [Block(rows, None)]))
        figures["conj"][depth] = {"rows_per_second": rate, "over_single": rate / single_rate,
                                  "pairs": int(pair_keys.size), "cells": int(targets.size)}  # fmt: skip
    if args.json:
        print(json.dumps(figures))
        return
    print(f"S = T = {s}, N = {n}, D = {d}, {args.rows:,} rows, one core")
    print(f"single head, per-position kernel:        {single_rate:12,.0f} rows/s")
    for depth, f in figures["conj"].items():
        print(f"conjunction head, depth {depth} ({f['pairs']:,} pairs): {f['rows_per_second']:12,.0f} rows/s  "
              f"({f['over_single']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
