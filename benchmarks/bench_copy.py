"""E-step throughput per core of the copy head's kernel beside the single head's, on the same rows.

Rows are sampled from a random single-hop head (default shape S = T = 2000, N = 8, D = 32) and run, one core,
through the single head's per-position E-step (``ResponsibilityAttentionAccumulator.seq_update``) and through the
copy kernel (token windows, per position, with copy and induction weights 0.1 in every bucket). The JIT is warmed
up first; each takes the best of ``--repeats`` runs.

Run::

    python benchmarks/bench_copy.py                       # 1,000,000 rows at N = 8
    python benchmarks/bench_copy.py --rows 20000 --json   # a smoke run
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
from dist_respattn.model.heads.copy import CopyHead  # noqa: E402
from dist_respattn.model.heads.copy.kind import copy_statistics  # noqa: E402
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    s, n, d = args.symbols, args.context, args.dim
    truth = random_distribution(s, n, d, s, seed=0, sigma2=1.0)
    context, query, target = truth.sampler(1).sample_arrays(args.rows)
    context = np.ascontiguousarray(context, dtype=np.int32)
    query, target = query.astype(np.float32), target.astype(np.int32)
    model = random_distribution(s, n, d, s, seed=2, sigma2=1.0)  # scored under another head, as EM does
    head = CopyHead(model, np.full(n, 0.1), np.full(n, 0.1))
    rows = WindowRows.from_encoded(context, query, target)

    def single() -> None:
        ResponsibilityAttentionAccumulator(s, n, d, s).seq_update((context, query, target), None, model)

    def copy() -> None:
        copy_statistics(head, [Block(rows, None)])

    small = slice(0, min(1000, args.rows))
    ResponsibilityAttentionAccumulator(s, n, d, s).seq_update(
        (context[small], query[small], target[small]), None, model
    )
    copy_statistics(head, [Block(WindowRows.from_encoded(context[small], query[small], target[small]), None)])
    single_rate = args.rows / best_of(args.repeats, single)
    copy_rate = args.rows / best_of(args.repeats, copy)
    figures = {
        "shape": {"S": s, "N": n, "D": d, "T": s},
        "rows": args.rows,
        "single_rows_per_second": single_rate,
        "copy_rows_per_second": copy_rate,
        "copy_over_single": copy_rate / single_rate,
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"S = T = {s}, N = {n}, D = {d}, {args.rows:,} rows, one core")
    print(f"single head, per-position kernel: {single_rate:12,.0f} rows/s")
    print(f"copy head, per-position kernel:   {copy_rate:12,.0f} rows/s  ({copy_rate / single_rate:.2f}x)")


if __name__ == "__main__":
    main()
