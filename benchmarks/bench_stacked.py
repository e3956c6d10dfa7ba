"""The stacked heads on real public corpora, side by side: each kind, their stack and the n-gram baselines on one split.

For every corpus, in one run, on one split of token-stream stores read with the long window ``--long-context``
(rows with at least one earlier token in their document: the rows the long heads score):

1. the split as ``bench_quality.py`` makes it (documents to train / validation / test by a hash of their key,
   the vocabulary counted on train), written as stream stores;
2. the heads, each fitted by the command line (``dist-respattn fit ... --json``, run in this process on one local
   cluster of ``--workers`` processes of one thread) with its choices made on the validation store:
   - ``single, N = short``: today's single head at the short window (``--context SHORT``);
   - ``single, N = long``: the single head at the long window with ``--position-buckets`` recency buckets;
   - ``copy, N = long``: the copy head (cache and induction) started from that single head;
   - ``conj, N = short``: the conjunction head at the short window;
   - ``chain of 2 hops, N = short`` with ``--hops 2`` (``--hops 0`` skips it);
   - ``stack``: the conjunction and copy heads under a gate learned on the validation store, for each gate mode of
     ``--stack-gates`` (only when this version has ``fit --head stack``);
3. every model scored on the test store by ``evaluate --baseline-order 5``: perplexity, and the Kneser-Ney
   2-, 3-, 4- and 5-grams on the rows each model reads (their counts from train, tuned on validation);
4. the 5-gram interpolated with two caches of the document so far (``bench_quality.py``'s), on the long
   window's rows.

Per head: test perplexity, its ratio to the KN 5-gram on the same rows, parameters stored, the fit's time and its
last iteration's rows/s per core (the E-step and its held-out pass, per worker process of one thread).

Run::

    pip install -e '.[bench]'
    python benchmarks/bench_stacked.py                                  # all three corpora (hours on 2 cores)
    python benchmarks/bench_stacked.py --corpora stdlib --max-tokens 1000000   # the first 1M stdlib tokens
    python benchmarks/bench_stacked.py --corpora stdlib --max-tokens 30000 --vocab-size 200 \\
        --long-context 32 --max-iter 2 --json                          # smoke
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_quality  # the split and the cache baseline are bench_quality's

CORPORA = bench_quality.CORPORA
#: The n-gram baselines evaluate reports, by JSON key.
NGRAMS = (("kneser_ney", "KN 2-gram"), ("kneser_ney_3", "KN 3-gram"), ("kneser_ney_5", "KN 5-gram"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated, of {', '.join(CORPORA)}")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dist-respattn-corpus-cache"))
    parser.add_argument("--work", help="where the stores and models go (default: a temporary directory)")
    parser.add_argument("--vocab-size", type=int, default=5000, help="text vocabulary K (S = T = K + 1)")
    parser.add_argument("--items", type=int, default=2000, help="movielens: most rated train items kept")
    parser.add_argument("--max-tokens", type=int, help="take at most this many tokens of each text corpus")
    parser.add_argument("--long-context", type=int, default=512, help="the long window N (default 512)")
    parser.add_argument("--short-context", type=int, default=8, help="the short window N (default 8)")
    parser.add_argument("--buckets", type=int, default=10, help="recency buckets of the long heads (default 10)")
    parser.add_argument("--max-iter", type=int, default=15, help="iterations at most of every fit (default 15)")
    parser.add_argument("--hops", type=int, default=2, help="hops of the chain (0: no chain; default 2)")
    parser.add_argument(
        "--stack-gates", default="joint,target", help="the stack's gate modes to fit, comma-separated ('': none)"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes of every command (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args(argv)
    args.context = args.long_context  # bench_quality's split reads these two
    args.items_context = None
    return args


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def command(scheduler: str, *argv: str) -> dict[str, Any]:
    """Run ``dist-respattn ARGV --json --scheduler SCHEDULER`` in this process and return its JSON; a failure stops
    the benchmark with the command's message."""
    from dist_respattn.cli import main as cli

    full = [*argv, "--json", "--scheduler", scheduler]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli(full)
    if status:
        raise SystemExit(f"dist-respattn {' '.join(full)} failed ({status}); its message is above")
    return json.loads(out.getvalue())


def has_stack_kind() -> bool:
    """Whether this version fits ``--head stack``."""
    from dist_respattn.model.heads.base import head_names

    return "stack" in head_names()


def fit_and_test(
    label: str, stores: dict[str, Any], model_dir: Path, args: argparse.Namespace, *options: str
) -> dict[str, Any]:
    """``fit`` on train (choices on validation), then ``evaluate`` on test, on the benchmark's cluster
    (``args.scheduler``); the figures of both."""
    say(f"  fitting {label}")
    started = time.perf_counter()
    fitted = command(
        args.scheduler,
        "fit", str(stores["train"].location), "--validation", str(stores["validation"].location),
        "--model-dir", str(model_dir), "--max-iter", str(args.max_iter), "--overwrite", *options,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    tested = command(args.scheduler, "evaluate", str(model_dir), str(stores["test"].location), "--baseline-order", "5")
    rows_per_second = fitted.get("rows_per_second")
    result = {
        "perplexity": tested["model"]["perplexity"],
        "accuracy": tested["model"]["accuracy"],
        "rows": tested["rows"],
        "baselines": {key: tested["baselines"][key]["perplexity"] for key, _ in NGRAMS},
        "parameters": fitted.get("parameters"),
        "iterations": fitted.get("iterations"),
        "state": fitted.get("state"),
        "choice": fitted.get("choice"),
        "seconds": round(seconds, 1),
        "rows_per_second_per_core": rows_per_second / args.workers if rows_per_second else None,
    }
    kn5 = result["baselines"]["kneser_ney_5"]
    say(f"    test perplexity {result['perplexity']:.2f} (KN 5-gram {kn5:.2f}), {seconds:.0f} s")
    return result


def run_corpus(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    say(f"{name}: splitting (stream stores, N = {args.long_context})")
    started = time.perf_counter()
    folder = work / name
    if name == "movielens":
        made = bench_quality.split_items(args, folder, context=args.long_context, store_format="stream")
    else:
        made = bench_quality.split_text(name, args, folder, context=args.long_context, store_format="stream")
    stores = made["stores"]
    rows = {k: s.num_rows for k, s in stores.items()}
    say(f"{name}: {made['description']}; {rows} rows; {time.perf_counter() - started:.1f} s")
    short, long = str(args.short_context), str(args.long_context)
    buckets = ("--position-buckets", str(args.buckets))
    heads: dict[str, dict[str, Any]] = {}
    heads[f"single, N = {short}"] = fit_and_test("the single head, short", stores, folder / "single-short", args,
                                                 "--head", "single", "--context", short)  # fmt: skip
    heads[f"single, N = {long}"] = fit_and_test(
        "the single head, long", stores, folder / "single-long", args, "--head", "single", *buckets
    )
    heads[f"copy, N = {long}"] = fit_and_test(
        "the copy head", stores, folder / "copy-long", args, "--head", "copy", "--init-from",
        str(folder / "single-long"), *buckets,
    )  # fmt: skip
    heads[f"conj, N = {short}"] = fit_and_test(
        "the conjunction head", stores, folder / "conj-short", args, "--head", "conj", "--context", short
    )
    if args.hops:
        heads[f"chain of {args.hops} hops, N = {short}"] = fit_and_test(
            "the chain of hops", stores, folder / "hops-short", args, "--hops", str(args.hops), "--context", short
        )
    gates = [g.strip() for g in args.stack_gates.split(",") if g.strip()]
    if gates and not has_stack_kind():
        say(f"{name}: this version has no `fit --head stack`: no stack rows")
        gates = []
    for gate in gates:
        heads[f"stack (conj + copy), gate {gate}"] = fit_and_test(
            f"the stack, gate {gate}", stores, folder / f"stack-{gate}", args, "--head", "stack",
            "--stack-from", f"{folder / 'conj-short'},{folder / 'copy-long'}", "--stack-gate", gate,
        )  # fmt: skip
    say(f"{name}: the 5-gram with document caches")
    started = time.perf_counter()
    caches = bench_quality.cache_interpolated(stores, read=bench_quality.stream_tokens)
    caches["seconds"] = round(time.perf_counter() - started, 1)
    return {"corpus": name, "description": made["description"], "rows": rows, "heads": heads, "caches": caches}


def print_table(result: dict[str, Any], stream: Any = None) -> None:
    out = stream or sys.stdout

    def print(*parts: Any) -> None:
        builtins.print(*parts, file=out, flush=True)

    caches = result["caches"]
    print()
    print(f"{result['corpus']}: {result['description']}; rows {result['rows']}")
    header = f"{'':<40}{'test ppl':>10}{'/ KN5':>8}{'KN2':>9}{'KN3':>9}{'KN5':>9}{'params':>12}{'fit s':>8}"
    print(header + f"{'rows/s/core':>13}{'rows':>10}")
    for label, head in result["heads"].items():
        kn = head["baselines"]
        rate = head["rows_per_second_per_core"]
        print(
            f"{label:<40}{head['perplexity']:>10.2f}{head['perplexity'] / kn['kneser_ney_5']:>8.3f}"
            + "".join(f"{kn[key]:>9.2f}" for key, _ in NGRAMS)
            + f"{head['parameters'] or 0:>12,}{head['seconds']:>8.0f}"
            + (f"{rate:>13,.0f}" if rate else f"{'-':>13}")
            + f"{head['rows']:>10,}"
        )
    print(
        f"{'KN 5-gram + document caches':<40}{caches['kneser_ney_5_caches']:>10.2f}"
        f"{caches['kneser_ney_5_caches'] / caches['kneser_ney_5_library']:>8.3f}"
        f"  (the library's KN 5-gram on these rows {caches['kneser_ney_5_library']:.2f}; cache weights "
        f"{caches['cache_weights']}; {caches['test_targets_seen_earlier_in_document']:.0%} of the test targets "
        "occur earlier in their document)"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = [c.strip() for c in args.corpora.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CORPORA]
    if unknown:
        raise SystemExit(f"unknown corpora {unknown}: expected some of {', '.join(CORPORA)}")
    load = os.getloadavg()
    results = []
    from dist_respattn.engine import ClusterOptions, connect

    with tempfile.TemporaryDirectory(prefix="bench-stacked-") as temp:
        work = Path(args.work or temp)
        # One cluster for every command (its workers keep their compiled kernels): each runs with --scheduler.
        with connect(ClusterOptions(n_workers=args.workers, threads_per_worker=1), say=say) as client:
            args.scheduler = client.scheduler.address
            for name in chosen:
                results.append(run_corpus(name, args, work))
                print_table(results[-1], stream=sys.stderr)  # each corpus as soon as it is measured
    for result in results:
        print_table(result)
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, {args.workers} worker(s) of one thread; "
        f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        print(json.dumps({"results": results}, indent=2))


if __name__ == "__main__":
    main()
