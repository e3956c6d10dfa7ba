"""E-step throughput per core of the copy head's kernel beside the single head's, on the same rows.

Rows are sampled from a random single-hop head (default shape S = T = 2000, N = 8, D = 32) and run, one core,
through the single head's per-position E-step (``ResponsibilityAttentionAccumulator.seq_update``) and through the
copy kernel (token windows, per position, with copy and induction weights 0.1 in every bucket). The JIT is warmed
up first; each takes the best of ``--repeats`` runs.

With ``--code``, the rows are instead every next-token row of the standard library's source (its first
``--rows`` tokens in file order, tokenized as ``ingest --text`` does, ``--symbols`` most frequent tokens and an
"other" id), windows of ``--context`` tokens within each file, a head whose prior is tied over ``--buckets``
geometric buckets: the copy head's per-position kernel against its histogram kernel (the one a tied prior's fit
runs), the single head's histogram kernel beside them.

Run::

    python benchmarks/bench_copy.py                       # 1,000,000 rows at N = 8
    python benchmarks/bench_copy.py --rows 20000 --json   # a smoke run
    python benchmarks/bench_copy.py --code --rows 300000 --context 512 --buckets 10   # long windows on code
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from dist_respattn.model.buckets import PositionBuckets  # noqa: E402
from dist_respattn.model.heads.base import Block  # noqa: E402
from dist_respattn.model.heads.copy import CopyHead  # noqa: E402
from dist_respattn.model.heads.copy.histogram import copy_estep_windows  # noqa: E402
from dist_respattn.model.heads.copy.kernels import CopyArrays, copy_estep  # noqa: E402
from dist_respattn.model.heads.copy.kind import copy_statistics  # noqa: E402
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator  # noqa: E402
from dist_respattn.model.heads.single_hop.sampler import random_distribution  # noqa: E402
from dist_respattn.model.kernels.per_position import StatisticArrays  # noqa: E402
from dist_respattn.model.rows import WindowRows  # noqa: E402


def best_of(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def code_rows(num_tokens: int, vocabulary_size: int, n_pos: int, dim: int) -> tuple[WindowRows, int]:
    """``(rows, S)``: the next-token rows of the first ``num_tokens`` tokens of the standard library's source, each
    window the (at most ``n_pos``) tokens before its target in the same file, with random queries per symbol."""
    from dist_respattn.store.ingest.text import default_corpus, iter_text_documents, line_pieces, vocabulary_from_counts

    files, left = [], num_tokens
    for document in iter_text_documents([default_corpus()]):
        if left <= 0:
            break
        tokens = [token for piece in line_pieces(document.path) for token in piece][:left]
        if len(tokens) > 1:
            files.append(tokens)
            left -= len(tokens)
    vocabulary = vocabulary_from_counts(Counter(t for f in files for t in f), vocabulary_size, len(files))
    lookup = vocabulary.lookup()
    stream = np.concatenate([vocabulary.encode(f, lookup) for f in files]).astype(np.int32)
    starts = np.cumsum([0] + [len(f) for f in files])
    end = np.concatenate([np.arange(a + 1, b) for a, b in itertools.pairwise(starts)]).astype(np.int64)
    begin = np.maximum(end - n_pos, np.repeat(starts[:-1], np.diff(starts) - 1)).astype(np.int64)
    s = int(vocabulary.num_symbols)
    table = np.random.default_rng(1).normal(size=(s, dim))
    rows = WindowRows(
        stream, begin, end, stream[end].astype(np.int32), table, stream[end - 1].astype(np.int64), None, 0
    )
    return rows, s


def code_main(args: argparse.Namespace) -> None:
    """The per-position and histogram copy kernels on long windows of code (``--code``)."""
    n, d = args.context, args.dim
    rows, s = code_rows(args.rows, args.symbols, n, d)
    buckets = PositionBuckets.geometric(n, args.buckets)
    model = random_distribution(s, n, d, s, seed=2, sigma2=1.0)
    model = type(model)(model.key_means, model.emission_table, buckets.tie(model.position_prior), model.sigma2,
                        buckets=buckets)  # fmt: skip
    head = CopyHead(model, np.full(buckets.num_buckets, 0.1), np.full(buckets.num_buckets, 0.1))
    params = head.parameters

    def arrays() -> tuple[StatisticArrays, CopyArrays]:
        return StatisticArrays.zeros(s, n, d, s, None), CopyArrays.zeros(n, buckets.num_buckets)

    def per_position() -> None:
        copy_estep(rows, params, *arrays())

    def histogram() -> None:
        copy_estep_windows(rows, params, *arrays())

    def single() -> None:
        ResponsibilityAttentionAccumulator(s, n, d, s).seq_update_windows(rows, model)

    warm = WindowRows(rows.tokens, rows.begin[:200], rows.end[:200], rows.target[:200], rows.query_table,
                      rows.query_index[:200], None, 0)  # fmt: skip
    copy_estep(warm, params, *arrays())
    copy_estep_windows(warm, params, *arrays())
    ResponsibilityAttentionAccumulator(s, n, d, s).seq_update_windows(warm, model)
    n_rows = rows.num_rows
    rates = {
        name: n_rows / best_of(args.repeats, run)
        for name, run in (
            ("copy_per_position", per_position),
            ("copy_histogram", histogram),
            ("single_histogram", single),
        )
    }
    figures = {
        "shape": {"S": s, "N": n, "D": d, "T": s, "K": buckets.num_buckets},
        "rows": n_rows,
        **{f"{name}_rows_per_second": rate for name, rate in rates.items()},
        "histogram_over_per_position": rates["copy_histogram"] / rates["copy_per_position"],
        "copy_histogram_over_single_histogram": rates["copy_histogram"] / rates["single_histogram"],
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"standard library source: {n_rows:,} rows, S = T = {s}, N = {n}, D = {d}, K = {buckets.num_buckets} "
          "buckets, one core")  # fmt: skip
    print(f"copy head, per-position kernel: {rates['copy_per_position']:12,.0f} rows/s")
    print(
        f"copy head, histogram kernel:    {rates['copy_histogram']:12,.0f} rows/s  "
        f"({figures['histogram_over_per_position']:.2f}x the per-position kernel)"
    )
    print(
        f"single head, histogram kernel:  {rates['single_histogram']:12,.0f} rows/s  (the copy histogram kernel at "
        f"{figures['copy_histogram_over_single_histogram']:.2f}x)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--symbols", type=int, default=2000, help="S = T")
    parser.add_argument("--context", type=int, default=8, help="N")
    parser.add_argument("--dim", type=int, default=32, help="D")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--code", action="store_true", help="long windows of the standard library's source")
    parser.add_argument("--buckets", type=int, default=10, help="K geometric position buckets (with --code)")
    args = parser.parse_args(argv)
    if args.code:
        code_main(args)
        return
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
