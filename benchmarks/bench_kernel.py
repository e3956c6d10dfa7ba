"""E-step throughput per core, side by side: our fused numba kernel, our NumPy backend, and mixle 0.8.2.

Measures, in one run on the same sampled triples (default shape S=2000, N=16, D=32, T=2000, sigma2=1),
scored under a different random model than the one that generated them (as EM does):

- triples/second of ``ResponsibilityAttentionAccumulator.seq_update`` with the numba backend (the default),
  on the rows as sampled and on the same rows grouped by target, and with the emission tables laid out
  symbol-major instead of target-major: the (T, S) tables are ~32 MB each, so layout and row order decide
  how often a lookup or a scatter misses cache (the kernel also groups each block of rows by target);
- the same for our vectorized NumPy backend and for mixle's accumulator (both much slower, so they run on
  a prefix of the rows: ``--numpy-rows``, ``--mixle-rows``), and the ratios against them, with PASS/MISS
  beside each target (measured, never asserted: machines are noisy);
- the peak memory our kernel adds above its input arrays, which must not grow with ``--rows``.

Every path runs on one core (the thread-count variables are set to 1 before NumPy is imported).
The numba JIT is warmed up before anything is timed; ours takes the best of ``--repeats`` runs.

Run::

    python benchmarks/bench_kernel.py                 # 1,000,000 rows, the reference shape
    python benchmarks/bench_kernel.py --rows 20000 --symbols 300 --targets 300 --json   # a smoke run

mixle is only imported here, never by the package; when it is not installed its column is skipped.
"""

from __future__ import annotations

import os

# One thread for every path (our kernel is single-threaded; this keeps NumPy and mixle on one core too).
# Must happen before NumPy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

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

from dist_respattn import ResponsibilityAttentionDistribution, random_distribution  # noqa: E402
from dist_respattn.model.kernels import per_position  # noqa: E402

MIB = 2**20

#: Targets from the issue: ratios on the rows as sampled, absolute throughput per core.
TARGET_VS_MIXLE = 25.0
TARGET_VS_NUMPY = 3.0
TARGET_PER_CORE = 2.0e6

#: Rows drawn per sampler call while filling the inputs: keeps the sampler's temporaries (a few MB)
#: far below the inputs, so the high-water mark after sampling is the inputs themselves.
SAMPLE_BLOCK_ROWS = 8192

#: Rows the numba JIT is warmed up on (compile time must not be timed).
WARMUP_ROWS = 256


# ---------------------------------------------------------------------------------------- sampling


def sample_inputs(
    truth: ResponsibilityAttentionDistribution, rows: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` triples from ``truth``: context (rows, N) int32, query (rows, D) float32, target (rows,) int32.

    Filled a block at a time so the sampler's float64 temporaries stay small next to the inputs.
    """
    sampler = truth.sampler(seed)
    context = np.empty((rows, truth.context_length), dtype=np.int32)
    query = np.empty((rows, truth.query_dim), dtype=np.float32)
    target = np.empty(rows, dtype=np.int32)
    for start in range(0, rows, SAMPLE_BLOCK_ROWS):
        stop = min(start + SAMPLE_BLOCK_ROWS, rows)
        context[start:stop], query[start:stop], target[start:stop] = sampler.sample_arrays(
            stop - start, query_dtype=np.float32
        )
    return context, query, target


# ------------------------------------------------------------------------------------------- paths


def ours_run(model: ResponsibilityAttentionDistribution, data: tuple, backend: str = "numba") -> Callable[[], Any]:
    """A call that runs our ``seq_update`` (unweighted, as ``fit_em`` does) into a fresh accumulator."""
    factory = model.estimator().accumulator_factory(backend=backend)

    def run() -> Any:
        accumulator = factory.make()
        accumulator.seq_update(data, None, model)
        return accumulator

    return run


def ungrouped_run(model: ResponsibilityAttentionDistribution, data: tuple) -> Callable[[], Any]:
    """Our kernel reading every block's rows in their own order instead of grouped by target."""
    S, N, D, T = model.num_symbols, model.context_length, model.query_dim, model.num_targets

    def run() -> Any:
        stats = per_position.StatisticArrays.zeros(S, N, D, T)
        per_position.accumulate_estep(*data, None, model.kernel_parameters, stats, group_by_target=False)
        return stats

    return run


def symbol_major_run(model: ResponsibilityAttentionDistribution, data: tuple) -> Callable[[], Any]:
    """Our kernel with the emission tables laid out symbol-major, (S, T), instead of (T, S).

    The same compiled code reads a transposed view, so only the memory layout differs: a row's
    cells ``[c_i, t]`` then sit T apart, and grouping rows by target no longer shares cache lines.
    """
    params = model.kernel_parameters
    with np.errstate(divide="ignore"):
        log_emission_st = np.log(model.emission)  # (S, T), C order
    params_st = per_position.KernelParameters(
        params.key_means, log_emission_st.T, params.log_prior, params.inv_two_sigma2, params.gate_const
    )
    S, N, D, T = model.num_symbols, model.context_length, model.query_dim, model.num_targets

    def run() -> Any:
        stats = per_position.StatisticArrays.zeros(S, N, D, T)
        stats.emission_count_ts = np.zeros((S, T)).T
        per_position.accumulate_estep(*data, None, params_st, stats)
        return stats

    return run


def path_figures(rows: int, seconds: float) -> dict[str, float]:
    return {"rows": rows, "seconds": seconds, "triples_per_s": rows / seconds}


# ------------------------------------------------------------------------------------------- report


def ratio(numerator: dict | None, denominator: dict | None) -> float | None:
    if numerator is None or denominator is None:
        return None
    return numerator["triples_per_s"] / denominator["triples_per_s"]


def target_line(name: str, measured: float | None, threshold: float, unit: str) -> dict[str, Any]:
    """One target of the issue, PASS (``True``) when ``measured >= threshold``; ``None`` when not measured."""
    goal = f">= {threshold:g}x" if unit == "x" else f">= {threshold / 1e6:g} M/s"
    return {
        "name": name,
        "target": goal,
        "threshold": threshold,
        "measured": measured,
        "unit": unit,
        "pass": None if measured is None else bool(measured >= threshold),
    }


def format_report(report: dict[str, Any]) -> str:
    """The human-readable table."""
    cfg, host, res, mem = report["config"], report["host"], report["results"], report["memory"]
    lines = [
        "dist_respattn E-step kernel benchmark (fused numba kernel vs NumPy backend vs mixle)",
        f"  shape      S={cfg['symbols']} N={cfg['context']} D={cfg['dim']} T={cfg['targets']} "
        f"sigma2={cfg['sigma2']:g}; {cfg['rows']:,} rows, seed {cfg['seed']}, best of {cfg['repeats']} for ours",
        f"  host       os.cpu_count()={host['cpu_count']}, one thread per path; python {host['python']}, "
        f"numpy {host['numpy']}, numba {host['numba']}, mixle {host['mixle'] or 'not installed'}",
        "  inputs     context int32, query float32, target int32 (mixle gets the same values as int64/float64);",
        "             scored under a different random model than the one that generated them",
    ]
    if res["numpy"] is not None and res["numpy"]["rows"] < cfg["rows"]:
        lines.append(
            f"  note       the NumPy backend is timed on the first {res['numpy']['rows']:,} rows (--numpy-rows)"
        )
    if res["mixle"] is not None and res["mixle"]["rows"] < cfg["rows"]:
        lines.append(f"  note       mixle is timed on the first {res['mixle']['rows']:,} rows (--mixle-rows)")
    if host["mixle"] is None:
        lines.append("  note       mixle is not installed: its column is skipped")
    lines.append("")

    def fmt_ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}x"

    rows_out = [
        ("ours, numba    (rows as sampled)", res["ours_sampled"], "ours_sampled"),
        ("ours, numba    (grouped by target)", res["ours_grouped"], "ours_grouped"),
        ("ours, numba, (S, T) layout (sampled)", res["ours_symbol_major"], "ours_symbol_major"),
        ("ours, numba, no in-block grouping", res["ours_ungrouped"], "ours_ungrouped"),
        ("ours, NumPy backend (as sampled)", res["numpy"], "numpy"),
        (f"mixle {host['mixle'] or ''} seq_update (as sampled)", res["mixle"], "mixle"),
    ]
    header = f"{'path':<38}{'rows timed':>12}{'seconds':>10}{'triples/s':>13}{'vs numpy':>10}{'vs mixle':>10}"
    lines += [header, "-" * len(header)]
    for label, fig, key in rows_out:
        if fig is None:
            lines.append(f"{label:<38}{'skipped':>12}")
            continue
        vs_numpy = ratio(fig, res["numpy"]) if key != "numpy" else None
        vs_mixle = ratio(fig, res["mixle"]) if key != "mixle" else None
        lines.append(
            f"{label:<38}{fig['rows']:>12,}{fig['seconds']:>10.3f}{fig['triples_per_s']:>13,.0f}"
            f"{fmt_ratio(vs_numpy):>10}{fmt_ratio(vs_mixle):>10}"
        )
    lines += ["", "targets (ratios on the rows as sampled; measured, not asserted)"]
    for t in report["targets"]:
        if t["measured"] is None:
            shown, verdict = "-", "skipped"
        elif t["unit"] == "x":
            shown, verdict = f"{t['measured']:.1f}x", "PASS" if t["pass"] else "MISS"
        else:
            shown, verdict = f"{t['measured'] / 1e6:.2f} M/s", "PASS" if t["pass"] else "MISS"
        lines.append(f"  {t['name']:<38}{t['target']:<14}{shown:>12}  {verdict}")
    lines += ["", "memory (our kernel, measured before the NumPy and mixle paths run)"]
    lines.append(f"  input arrays: {mem['input_bytes'] / MIB:.1f} MiB ({cfg['rows']:,} rows)")
    rss = mem["rss_before_bytes"]
    how = [
        "free heap pages released" if mem["free_memory_released"] else "free heap pages NOT released",
        "peak reset to it" if mem["peak_reset"] else f"peak NOT reset: {mem['peak_before_bytes'] / MIB:.1f} MiB",
    ]
    shown = "unknown" if rss is None else f"{rss / MIB:.1f} MiB"
    lines.append(f"  RSS before the kernel run: {shown} ({'; '.join(how)})")
    if not (mem["free_memory_released"] and mem["peak_reset"]):
        lines.append("  (without both, growth the allocator can absorb in memory it already holds does not show)")
    lines.append(f"  kernel peak memory above inputs: {mem['kernel_peak_growth_bytes'] / MIB:.1f} MiB")
    lines.append(
        f"  (it includes the accumulator's statistics arrays, {mem['statistics_bytes'] / MIB:.1f} MiB, "
        "a size fixed by S, N, D, T)"
    )
    agreement = report["agreement"]
    shown = ", ".join(f"{k} {v:.1e}" for k, v in agreement.items() if v is not None)
    if shown:
        lines += ["", f"agreement of ours with the other paths on their rows (max relative difference): {shown}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="triples our kernel is timed on")
    parser.add_argument("--symbols", type=int, default=2000, help="S, the number of symbols")
    parser.add_argument("--context", type=int, default=16, help="N, the context length")
    parser.add_argument("--dim", type=int, default=32, help="D, the query dimension")
    parser.add_argument("--targets", type=int, default=2000, help="T, the number of targets")
    parser.add_argument("--sigma2", type=float, default=1.0, help="gate variance of both models")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models and the rows")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of ours (the best is kept)")
    parser.add_argument(
        "--numpy-rows", type=int, default=None, help="rows the NumPy backend is timed on (default min(rows, 100000))"
    )
    parser.add_argument(
        "--mixle-rows", type=int, default=None, help="rows mixle is timed on (default min(rows, 200000))"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure instead")
    args = parser.parse_args(argv)
    for name in ("rows", "symbols", "context", "dim", "targets", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not (math.isfinite(args.sigma2) and args.sigma2 > 0):
        parser.error("--sigma2 must be a finite number > 0")
    for name, default in (("numpy_rows", 100_000), ("mixle_rows", 200_000)):
        value = getattr(args, name)
        if value is not None and value < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0 (0 skips that path)")
        setattr(args, name, min(args.rows, default if value is None else value))
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    shape = (args.symbols, args.context, args.dim, args.targets)
    truth = random_distribution(*shape, seed=args.seed, sigma2=args.sigma2)
    # A different model than the generating one, as an EM iteration scores the data; built once.
    model = random_distribution(*shape, seed=args.seed + 1, sigma2=args.sigma2)

    # Compile (or load from numba's cache) before anything is timed, and before the inputs exist, so
    # neither compile time nor compiler memory lands in the figures.
    warm = sample_inputs(truth, min(WARMUP_ROWS, args.rows), seed=args.seed + 3)
    ours_run(model, warm)()
    symbol_major_run(model, warm)()
    del warm

    data = sample_inputs(truth, args.rows, seed=args.seed + 2)
    context, query, target = data
    input_bytes = context.nbytes + query.nbytes + target.nbytes
    statistics_bytes = 8 * (args.symbols * args.dim + args.symbols + args.targets * args.symbols + args.context + 3)

    # Memory first: the NumPy and mixle paths allocate O(rows) temporaries that would raise the peak.
    trimmed = release_free_memory()
    peak_reset = reset_peak_rss()
    rss_before = current_rss_bytes()
    peak_before = peak_rss_bytes()
    run_sampled = ours_run(model, data)
    seconds, _ = time_once(run_sampled)  # the first of the timed runs
    growth = max(0, peak_rss_bytes() - peak_before)
    for _ in range(args.repeats - 1):
        seconds = min(seconds, time_once(run_sampled)[0])
    results: dict[str, Any] = {"ours_sampled": path_figures(args.rows, seconds)}

    order = np.argsort(target, kind="stable")  # not timed
    grouped = (context[order], query[order], target[order])
    del order
    seconds, _ = best_of(ours_run(model, grouped), args.repeats)
    results["ours_grouped"] = path_figures(args.rows, seconds)
    del grouped

    seconds, _ = best_of(symbol_major_run(model, data), args.repeats)
    results["ours_symbol_major"] = path_figures(args.rows, seconds)
    seconds, _ = best_of(ungrouped_run(model, data), args.repeats)
    results["ours_ungrouped"] = path_figures(args.rows, seconds)

    agreement: dict[str, float | None] = {"numpy": None, "mixle": None}
    results["numpy"] = None
    if args.numpy_rows > 0:
        prefix = tuple(a[: args.numpy_rows] for a in data)
        seconds, theirs = best_of(ours_run(model, prefix, backend="numpy"), args.repeats, slow=True)
        results["numpy"] = path_figures(args.numpy_rows, seconds)
        agreement["numpy"] = max_relative_difference(ours_run(model, prefix)().value(), theirs.value(), fields=5)

    results["mixle"] = None
    mixle_version = None
    try:
        import mixle

        if args.mixle_rows > 0:  # its statistics modules take seconds to import; with 0 rows only the version shows
            from mixle.stats.latent import responsibility_attention as mixle_ra
    except ImportError:
        # On stderr, so that --json output stays one JSON object.
        print("mixle is not installed: skipping its column (pip install mixle==0.8.2)", file=sys.stderr)
    else:
        mixle_version = getattr(mixle, "__version__", None) or "installed"
        if args.mixle_rows > 0:
            n = args.mixle_rows
            # mixle's encoder yields int64 ids and float64 queries: give it those, converted outside the timing.
            encoded = (context[:n].astype(np.int64), query[:n].astype(np.float64), target[:n].astype(np.int64))
            weights = np.ones(n)
            their_model = mixle_ra.ResponsibilityAttentionDistribution(
                model.key_means, model.emission, model.position_prior, model.sigma2
            )
            factory = their_model.estimator().accumulator_factory()

            def run_mixle() -> Any:
                accumulator = factory.make()
                accumulator.seq_update(encoded, weights, their_model)
                return accumulator

            seconds, theirs = best_of(run_mixle, args.repeats, slow=True)
            results["mixle"] = path_figures(n, seconds)
            ours_prefix = tuple(a[:n] for a in data)
            agreement["mixle"] = max_relative_difference(
                ours_run(model, ours_prefix)().value(), theirs.value(), fields=5
            )

    sampled = results["ours_sampled"]
    report = {
        "config": {
            "rows": args.rows,
            "symbols": args.symbols,
            "context": args.context,
            "dim": args.dim,
            "targets": args.targets,
            "sigma2": args.sigma2,
            "seed": args.seed,
            "repeats": args.repeats,
            "numpy_rows": args.numpy_rows,
            "mixle_rows": args.mixle_rows,
        },
        "host": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
            "mixle": mixle_version,
        },
        "results": results,
        "ratios": {
            "ours_over_numpy": ratio(sampled, results["numpy"]),
            "ours_over_mixle": ratio(sampled, results["mixle"]),
            "ours_grouped_over_numpy": ratio(results["ours_grouped"], results["numpy"]),
            "ours_grouped_over_mixle": ratio(results["ours_grouped"], results["mixle"]),
            "grouped_over_sampled": ratio(results["ours_grouped"], sampled),
            "target_major_over_symbol_major": ratio(sampled, results["ours_symbol_major"]),
            "in_block_grouping_gain": ratio(sampled, results["ours_ungrouped"]),
        },
        "targets": [
            target_line("ours / mixle", ratio(sampled, results["mixle"]), TARGET_VS_MIXLE, "x"),
            target_line("ours / NumPy backend", ratio(sampled, results["numpy"]), TARGET_VS_NUMPY, "x"),
            target_line("ours per core, rows as sampled", sampled["triples_per_s"], TARGET_PER_CORE, "triples/s"),
            target_line(
                "ours per core, grouped by target",
                results["ours_grouped"]["triples_per_s"],
                TARGET_PER_CORE,
                "triples/s",
            ),
        ],
        "memory": {
            "input_bytes": input_bytes,
            "statistics_bytes": statistics_bytes,
            "free_memory_released": trimmed,
            "peak_reset": peak_reset,
            "rss_before_bytes": rss_before,
            "peak_before_bytes": peak_before,
            "kernel_peak_growth_bytes": growth,
        },
        "agreement": agreement,
    }
    print(json.dumps(report) if args.json else format_report(report))
    return report


if __name__ == "__main__":
    main()
