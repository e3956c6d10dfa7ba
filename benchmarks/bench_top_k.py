"""Top-K prediction on a large sparse head: rows/s at K = 1, 2, 5, the threshold search alone against ours.

A head over a 78,000-word vocabulary with a sparse emission shaped like a fitted language model's
(:func:`~dist_respattn.model.heads.single_hop.sampler.random_sparse_distribution`: frequent symbols store
thousands of targets, ties in the stored values and in the base). For each K it times

- ``before``: Fagin's threshold search alone (the search of ``top_k_threshold`` before it was bounded, copied
  below). When the K-th best target is stored for no position of the row, its score never beats the search's
  bound (the backoff floor), and the search walks every stored entry of the row at N lookups an entry;
- ``after``: :func:`~dist_respattn.model.heads.single_hop.top_k.predict_top_k`, whose search stops at the
  row's worth of lookups and then scores every stored pair once (O(K + row) a row);

checks that both give the same targets (up to targets of equal probability that rounding orders differently:
the two sum a score in another order), and prints rows/s and the ratio after / before.

Run::

    python benchmarks/bench_top_k.py                           # 78,000 words, 2,000 rows
    python benchmarks/bench_top_k.py --words 5000 --rows 200 --max-pairs 300 --json   # a smoke run
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
from measure import best_of  # noqa: E402

from dist_respattn.model.heads.single_hop import scoring  # noqa: E402
from dist_respattn.model.heads.single_hop.sampler import random_sparse_distribution  # noqa: E402
from dist_respattn.model.heads.single_hop.top_k import predict_top_k  # noqa: E402
from dist_respattn.model.kernels import per_position  # noqa: E402
from dist_respattn.model.kernels.log_weights import attention_of, row_log_weights  # noqa: E402


@numba.njit(cache=True, nogil=True)
def _threshold_alone(
    context, row, attention, indptr, symbols, values, backoff, base, ranked_indptr, ranked_targets, ranked_values,
    base_order, top_targets, top_values,
):  # pragma: no cover - compiled  # fmt: skip
    """The threshold search without a bound on its work (the kernel before it was bounded)."""
    n_pos = context.shape[1]
    cap = top_targets.shape[0]
    max_base = base[base_order[0]]
    count = 0
    depth = 0
    while True:
        bound = 0.0
        left = False
        for i in range(n_pos):
            c = context[row, i]
            at = ranked_indptr[c] + depth
            off = backoff[c] * max_base
            if at < ranked_indptr[c + 1]:
                left = True
                bound += attention[i] * max(ranked_values[at], off)
                k = ranked_targets[at]
                v = scoring.mixture_at(context, row, attention, k, indptr, symbols, values, backoff, base)
                count = scoring.insert_ranked(k, v, top_targets, top_values, count)
            else:
                bound += attention[i] * off
        if count == cap and top_values[cap - 1] > bound:
            return count
        if not left:
            break
        depth += 1
    added = 0
    for j in range(base_order.shape[0]):
        if added == cap:
            break
        k = base_order[j]
        stored = False
        for i in range(n_pos):
            if per_position.find_pair(indptr, symbols, k, context[row, i]) >= 0:
                stored = True
                break
        if not stored:
            v = scoring.mixture_at(context, row, attention, k, indptr, symbols, values, backoff, base)
            count = scoring.insert_ranked(k, v, top_targets, top_values, count)
            added += 1
    return count


@numba.njit(cache=True, nogil=True)
def _top_k_before(
    context, query, key_means, log_prior, inv_two_sigma2, indptr, symbols, values, backoff, base, ranked_indptr,
    ranked_targets, ranked_values, base_order, top_targets, top_values,
):  # pragma: no cover - compiled  # fmt: skip
    n_rows, n_pos = context.shape
    gate = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    attention = np.empty(n_pos)
    y = np.empty(query.shape[1])
    for row in range(n_rows):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        gate[:] = 0.0
        row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, gate, gate[:0])
        attention_of(gate, attention, bits)
        _threshold_alone(
            context, row, attention, indptr, symbols, values, backoff, base, ranked_indptr, ranked_targets,
            ranked_values, base_order, top_targets[row], top_values[row],
        )  # fmt: skip


def predict_before(model: Any, context: np.ndarray, query: np.ndarray, k: int, order: np.ndarray) -> np.ndarray:
    """The targets (n, k) of the unbounded threshold search."""
    table = model.emission_table
    params = model.kernel_parameters
    ranked_indptr, ranked_targets, ranked_values = table.ranked_rows
    targets = np.empty((context.shape[0], k), dtype=np.int64)
    values = np.empty((context.shape[0], k))
    _top_k_before(
        context.astype(np.int64), np.asarray(query, dtype=np.float64), params.key_means, params.log_prior,
        params.inv_two_sigma2, table.support.indptr, table.support.symbols, table.values, table.backoff, table.base,
        ranked_indptr, ranked_targets, ranked_values, order, targets, values,
    )  # fmt: skip
    return targets


def same_up_to_rounding(
    model: Any, context: np.ndarray, query: np.ndarray, before: np.ndarray, after: np.ndarray
) -> tuple[bool, int]:
    """Whether both give the same targets, but for targets of equal probability (to 1e-12) that rounding
    ordered differently; and how many rows differ only so. Mathematically tied scores summed in another order
    can differ in the last bit, which decides their order in either search (and in ``predict_proba``)."""
    rows = np.flatnonzero((before != after).any(axis=1))
    if rows.size == 0:
        return True, 0
    proba = model.predict_proba(context[rows], query[rows])
    a = np.take_along_axis(proba, before[rows].astype(np.int64), axis=1)
    b = np.take_along_axis(proba, after[rows].astype(np.int64), axis=1)
    return bool(np.allclose(a, b, rtol=1e-12, atol=0.0)), int(rows.size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", type=int, default=78_000, help="S = T, the vocabulary (default 78,000)")
    parser.add_argument("--context", type=int, default=16, help="N, positions a row")
    parser.add_argument("--dim", type=int, default=32, help="D, the query dimension")
    parser.add_argument("--max-pairs", type=int, default=5000, help="stored targets of the most frequent symbol")
    parser.add_argument("--stored-mass", type=float, default=0.5, help="a row's probability on its stored pairs")
    parser.add_argument("--rows", type=int, default=2000, help="rows predicted at each K")
    parser.add_argument("--before-rows", type=int, default=200, help="rows the unbounded search predicts (slow)")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 5], help="the K measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    model = random_sparse_distribution(
        args.words, args.context, args.dim, max_pairs=args.max_pairs, stored_mass=args.stored_mass, seed=rng
    )
    table = model.emission_table
    # Rows whose symbols are drawn towards the frequent ones, as a text's are.
    context = np.minimum((args.words * rng.random((args.rows, args.context)) ** 3).astype(np.int32), args.words - 1)
    query = rng.standard_normal((args.rows, args.dim))
    order = scoring.base_order(table)
    lengths = np.diff(table.ranked_rows[0])
    results: dict[str, Any] = {
        "words": args.words, "context": args.context, "pairs": int(table.support.num_pairs),
        "mean_row_pairs": float(lengths[context].sum(axis=1).mean()), "rows": args.rows, "k": {},
    }  # fmt: skip
    before_rows = min(args.before_rows, args.rows)
    for k in args.k:
        predict_top_k(model, context[:2], query[:2], k, base_order=order)  # compile
        predict_before(model, context[:2], query[:2], k, order)
        after_s, top = best_of(lambda k=k: predict_top_k(model, context, query, k, base_order=order), args.repeats)
        before_s, before = best_of(
            lambda k=k: predict_before(model, context[:before_rows], query[:before_rows], k, order), args.repeats,
            slow=True,
        )  # fmt: skip
        same, tie_rows = same_up_to_rounding(model, context, query, before, top.targets[:before_rows])
        after_rate, before_rate = args.rows / after_s, before_rows / before_s
        results["k"][str(k)] = {
            "before_rows_per_s": before_rate, "after_rows_per_s": after_rate, "ratio": after_rate / before_rate,
            "same_targets": same, "rounding_tie_rows": tie_rows,
        }  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"S = T = {args.words:,}, N = {args.context}, {results['pairs']:,} stored pairs, "
            f"{results['mean_row_pairs']:,.0f} a row on average"
        )
        print(f"{'K':>3} {'before rows/s':>14} {'after rows/s':>13} {'after/before':>13}  same targets")
        for k, r in results["k"].items():
            ties = f" ({r['rounding_tie_rows']} rows order a rounding tie otherwise)" if r["rounding_tie_rows"] else ""
            print(
                f"{k:>3} {r['before_rows_per_s']:>14,.0f} {r['after_rows_per_s']:>13,.0f} {r['ratio']:>12.1f}x  "
                f"{'yes' if r['same_targets'] else 'NO'}{ties}"
            )
    return 0 if all(r["same_targets"] for r in results["k"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
