"""E-step throughput per core of the chain-of-hops kernel beside the single head's, and its parity with the
reference library's chained attention.

Rows are sampled from a random single-hop head (default shape S = T = 2000, N = 8, D = 32) and run, one core,
through the single head's per-position E-step (``ResponsibilityAttentionAccumulator.seq_update``) and through the
chain's forward–backward kernel with H = 2 and 3 hops (random later keys and priors). The JIT is warmed up first;
each takes the best of ``--repeats`` runs, in CPU time, the kernels taking turns. With the reference library
installed, the chain's statistics and M-step are also compared with its ``ChainedAttentionEstimator`` on its own
sampler's rows (``--parity-rows``).

With ``--previous FILE`` (another checkout's ``dist_respattn/model/heads/hops/kernels.py``, e.g. main's), that
kernel's E-step is timed on the same rows and parameters, taking turns with the others: a change's before and after
in one run.

With ``--stream`` the rows are instead a synthetic token stream's (each window the previous one's but one token),
and with ``--sparse`` the emission is sparse over the rows' own (symbol, target) pairs.

With ``--store`` and ``--model``, the rows are instead a real store's first ``--rows`` rows and the heads a fitted
chain (``--model``, a model directory of ``fit --head hops``) and its own single head (hop 1's keys, gate and
emission), each E-step as a fit runs it on that store's blocks.

Run::

    python benchmarks/bench_hops.py                       # 1,000,000 rows at N = 8
    python benchmarks/bench_hops.py --rows 20000 --json   # a smoke run
    python benchmarks/bench_hops.py --store train.zarr --model hops-model --rows 300000 --parity-rows 0   # real rows
    python benchmarks/bench_hops.py --rows 30000 --repeats 40 --previous OLD/dist_respattn/model/heads/hops/kernels.py
    python benchmarks/bench_hops.py --rows 300000 --repeats 5 --stream --parity-rows 0   # a token stream's rows
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from dist_respattn.model.emission.layouts import DenseEmission, PairSupport, SparseEmission  # noqa: E402
from dist_respattn.model.heads.base import Block, TrainerContext  # noqa: E402
from dist_respattn.model.heads.hops import HopsHead, HopsSpec  # noqa: E402
from dist_respattn.model.heads.hops.kind import hop_statistics  # noqa: E402
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator  # noqa: E402
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution  # noqa: E402
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec  # noqa: E402
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


def previous_kernels(path: str | None) -> Any:
    """The hops kernels module at ``path`` (another checkout's), or ``None``."""
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("previous_hop_kernels", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench_hops.py: error: --previous {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def previous_run(module: Any, head: HopsHead, rows: WindowRows) -> Callable[[], object]:
    """The E-step of ``module`` (another checkout's hops kernels) over ``rows`` under ``head``, as
    :func:`hop_statistics` runs this checkout's (the rows checked, the arrays new)."""
    table = head.single.emission_table
    num_pairs = table.support.num_pairs if isinstance(table, SparseEmission) else None
    params = head.parameters

    def run() -> None:
        head.check_rows(rows)
        module.hop_estep(rows, params, module.HopArrays.zeros(head.n_hops, head.shape, num_pairs))

    return run


def relative_difference(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The largest ``|ours - theirs|`` relative to the largest ``|theirs|``."""
    scale = max(float(np.abs(theirs).max()), 1e-300)
    return float(np.abs(np.asarray(ours) - np.asarray(theirs)).max() / scale)


def reference_parity(rows: int, seed: int = 0) -> dict[str, Any] | None:
    """The chain against the reference library's ``ChainedAttentionEstimator`` (2 hops, softmax transitions,
    one-hot queries, uniform priors, additive emission smoothing 1e-4) on its own sampler's rows, each position's
    value set to its key (our windows hold one token per position): the largest relative differences of the
    statistics and of the M-step's tables. ``None`` without the library."""
    if importlib.util.find_spec("mixle") is None:
        return None
    from mixle.stats.latent import chained_attention as ref

    n_hops, s, t, sigma2 = 2, 6, 5, 0.3
    rng = np.random.RandomState(seed)
    truth = ref.ChainedAttentionDistribution(
        rng.normal(size=(n_hops, s, s)) * 0.5 + np.eye(s)[None], rng.dirichlet(np.ones(t), size=s), sigma2=sigma2
    )
    data = [(k, k, q, y) for (k, _, q, y) in truth.sampler(seed=seed + 1).sample(rows)]
    enc = truth.dist_to_encoder().seq_encode(data)
    keys, _, q, target = enc
    estimator = ref.ChainedAttentionEstimator(n_hops, s, t, sigma2=sigma2, emission_smoothing=1e-4)
    accumulator = estimator.accumulator_factory().make()
    accumulator.seq_update(enc, np.ones(rows), truth)
    key_num, key_mass, emission_count, _, _ = accumulator.value()
    fitted = estimator.estimate(None, accumulator.value())
    n_pos = keys.shape[1]
    single = ResponsibilityAttentionDistribution(
        truth.key_tables[0], DenseEmission(truth.emission), np.full(n_pos, 1.0 / n_pos), sigma2
    )
    head = HopsHead(single, truth.key_tables[1:], np.full((1, n_pos), 1.0 / n_pos), np.eye(s), softmax=True)
    window = WindowRows.from_encoded(keys.astype(np.int32), np.eye(s)[q], target.astype(np.int32))
    stats = hop_statistics(head, [Block(window, None)])
    spec = HopsSpec(SingleHopSpec(sigma2=sigma2, emission_smoothing=1e-4, emission_layout="dense"), 2, softmax=True)
    ours = spec.trainer(TrainerContext((s, n_pos, s, t))).m_step(stats, head).head
    return {
        "rows": rows,
        "key_statistics": max(
            relative_difference(stats.stats.key_sum, key_num[0]),
            relative_difference(stats.key_sum[0], key_num[1]),
            relative_difference(stats.stats.key_mass, key_mass[0]),
            relative_difference(stats.key_mass[0], key_mass[1]),
        ),
        "emission_counts": relative_difference(stats.stats.emission_count.to_dense(), emission_count),
        "key_tables": max(
            relative_difference(ours.single.key_means, fitted.key_tables[0]),
            relative_difference(ours.keys[0], fitted.key_tables[1]),
        ),
        "emission": relative_difference(ours.single.emission_table.to_dense(), fitted.emission),
    }


def real_rows(args: argparse.Namespace) -> tuple[dict[str, Any], dict[int, float]]:
    """``(figures, {H: rows/s})`` of a fitted chain and its single head on a store's first ``--rows`` rows."""
    from dist_respattn.artifacts.references import load_model
    from dist_respattn.store import open_store

    store = open_store(args.store)
    head = load_model(args.model)
    if not isinstance(head, HopsHead):
        raise SystemExit(f"bench_hops.py: error: --model {args.model} holds a {type(head).__name__}: expected a "
                         "chain of hops (fit --head hops)")  # fmt: skip
    n_rows = min(args.rows, store.num_rows)
    encoded = store.read_rows(0, n_rows)
    rows = store.read_windows(0, n_rows)
    table = head.single.emission_table
    support = table.support if isinstance(table, SparseEmission) else None

    def single(stop: int = n_rows) -> None:
        accumulator = ResponsibilityAttentionAccumulator(
            *head.shape, layout="dense" if support is None else "sparse", support=support
        )
        batch = (encoded.context[:stop], encoded.query[:stop], encoded.target[:stop])
        accumulator.seq_update(batch, None, head.single, checked=encoded.checked)

    small = min(1000, n_rows)
    single(small)
    hop_statistics(head, [Block(store.read_windows(0, small), None)])
    runs: dict[Any, Callable[[], object]] = {
        "single": single, "hops": lambda: hop_statistics(head, [Block(rows, None)])
    }  # fmt: skip
    previous = previous_kernels(args.previous)
    if previous is not None:
        previous_run(previous, head, store.read_windows(0, small))()
        runs["previous"] = previous_run(previous, head, rows)
    times = best_times(args.repeats, runs)
    single_rate, rate = n_rows / times["single"], n_rows / times["hops"]
    s, n, d, t = head.shape
    figures = {"shape": {"S": s, "N": n, "D": d, "T": t}, "rows": n_rows, "store": str(args.store),
               "model": str(args.model), "single_rows_per_second": single_rate}  # fmt: skip
    if previous is not None:
        figures["previous"] = {head.n_hops: n_rows / times["previous"]}
    return figures, {head.n_hops: rate}


def stream_rows(n_rows: int, s: int, n: int, d: int, seed: int = 4) -> WindowRows:
    """The rows of a synthetic token stream (``--stream``): Zipfian tokens over ``s`` symbols, each row's window the
    ``n`` tokens before its target (the next token), its query its last token's row of a random (S, D) embedding
    table, which is also the chain's hop-query table."""
    rng = np.random.default_rng(seed)
    frequency = 1.0 / np.arange(1, s + 1)
    tokens = rng.choice(s, size=n_rows + n, p=frequency / frequency.sum()).astype(np.int32)
    end = np.arange(n, n_rows + n, dtype=np.int64)
    embedding = rng.normal(size=(s, d))
    return WindowRows(tokens, end - n, end, tokens[end], embedding, tokens[end - 1].astype(np.int64), None, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--symbols", type=int, default=2000, help="S = T")
    parser.add_argument("--context", type=int, default=8, help="N")
    parser.add_argument("--dim", type=int, default=32, help="D")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parity-rows", type=int, default=2000, help="rows of the reference comparison (0: none)")
    parser.add_argument(
        "--store", help="a store whose first --rows rows are run (with --model) instead of sampled rows"
    )
    parser.add_argument("--model", help="a fitted chain's model directory (with --store)")
    parser.add_argument(
        "--previous", help="another checkout's hops kernels.py: its E-step timed on the same rows, beside this one's"
    )
    parser.add_argument(
        "--stream", action="store_true", help="the rows of a synthetic token stream instead of sampled rows"
    )
    parser.add_argument(
        "--sparse", action="store_true", help="a sparse emission over the rows' own (symbol, target) pairs"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if (args.store is None) != (args.model is None):
        parser.error("--store and --model go together")
    if args.store is not None:
        figures, rates = real_rows(args)
        report(figures, rates, args)
        return
    s, n, d = args.symbols, args.context, args.dim
    truth = random_distribution(s, n, d, s, seed=0, sigma2=1.0)
    model = random_distribution(s, n, d, s, seed=2, sigma2=1.0)  # scored under another head, as EM does
    if args.stream:
        rows = stream_rows(args.rows, s, n, d)
        hop_queries = np.asarray(rows.query_table)
    else:
        context, query, target = truth.sampler(1).sample_arrays(args.rows)
        context = np.ascontiguousarray(context, dtype=np.int32)
        query, target = query.astype(np.float32), target.astype(np.int32)
        rows = WindowRows.from_encoded(context, query, target)
        hop_queries = np.asarray(truth.key_means)
    support = None
    if args.sparse:
        # The rows' own (symbol, target) pairs, as a fit's start pass finds them.
        pairs = [rows.target[:, None].astype(np.int64) * s + rows.tokens[rows.begin[:, None] + np.arange(n)]]
        support = PairSupport.from_keys(np.unique(np.concatenate(pairs, axis=None)), s, s)
        model = model.with_emission(model.emission_table.restricted(support))
    rng = np.random.default_rng(3)
    chains = {
        h: HopsHead(model, rng.normal(scale=3.0, size=(h - 1, s, d)), np.full((h - 1, n), 1.0 / n), hop_queries)
        for h in (2, 3)
    }
    small = rows.select(slice(0, min(1000, args.rows)))

    def single(batch: WindowRows = rows) -> None:
        accumulator = ResponsibilityAttentionAccumulator(
            s, n, d, s, layout="dense" if support is None else "sparse", support=support
        )
        if args.stream:
            accumulator.seq_update_windows(batch, model)
        else:
            stop = batch.num_rows
            accumulator.seq_update((context[:stop], query[:stop], target[:stop]), None, model)

    single(small)
    for head in chains.values():
        hop_statistics(head, [Block(small, None)])
    runs: dict[Any, Callable[[], object]] = {"single": single}
    runs.update({h: (lambda head=head: hop_statistics(head, [Block(rows, None)])) for h, head in chains.items()})
    previous = previous_kernels(args.previous)
    if previous is not None:
        for h, head in chains.items():
            previous_run(previous, head, small)()
            runs[("previous", h)] = previous_run(previous, head, rows)
    times = best_times(args.repeats, runs)
    single_rate = args.rows / times["single"]
    rates = {h: args.rows / times[h] for h in chains}
    figures: dict[str, Any] = {"shape": {"S": s, "N": n, "D": d, "T": s}, "rows": args.rows,
                               "single_rows_per_second": single_rate}  # fmt: skip
    if previous is not None:
        figures["previous"] = {h: args.rows / times[("previous", h)] for h in chains}
    report(figures, rates, args)


def report(figures: dict[str, Any], rates: dict[int, float], args: argparse.Namespace) -> None:
    single_rate = figures["single_rows_per_second"]
    figures.update(
        {
            **{f"hops_{h}_rows_per_second": rate for h, rate in rates.items()},
            **{f"hops_{h}_over_single": rate / single_rate for h, rate in rates.items()},
            **{f"previous_{h}_rows_per_second": rate for h, rate in figures.pop("previous", {}).items()},
            "reference_parity": reference_parity(args.parity_rows) if args.parity_rows > 0 else None,
        }
    )
    if args.json:
        print(json.dumps(figures))
        return
    shape = figures["shape"]
    where = f" of {figures['store']}" if "store" in figures else ""
    print(f"S = {shape['S']}, T = {shape['T']}, N = {shape['N']}, D = {shape['D']}, {figures['rows']:,} rows{where}, "
          "one core")  # fmt: skip
    print(f"single head, per-position kernel: {single_rate:12,.0f} rows/s")
    previous = {
        h: figures[f"previous_{h}_rows_per_second"] for h in rates if f"previous_{h}_rows_per_second" in figures
    }
    for h, rate in rates.items():
        print(f"chain of {h} hops, forward-backward: {rate:11,.0f} rows/s  ({rate / single_rate:.3f}x)")
        if h in previous:
            was = previous[h]
            print(f"  the previous kernel (--previous): {was:11,.0f} rows/s  ({was / single_rate:.3f}x; this one "
                  f"{rate / was:.3f}x it)")  # fmt: skip
    print(f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
    parity = figures["reference_parity"]
    if parity is not None:
        print(
            f"reference chained attention, {parity['rows']} rows: largest relative difference of the key "
            f"statistics {parity['key_statistics']:.1e}, emission counts {parity['emission_counts']:.1e}, "
            f"key tables {parity['key_tables']:.1e}, emission {parity['emission']:.1e}"
        )


if __name__ == "__main__":
    main()
