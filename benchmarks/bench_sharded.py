"""The sharded M-step against the driver's: the driver's memory at two support sizes, and the iteration time.

One LocalCluster of ``--workers`` single-threaded workers; every fit's driver is a process of its own (so its
memory is its own), connected to that cluster. Per window N (``--contexts``: a longer window holds more
(symbol, target) pairs, so the sparse emission's support grows) a single-head fit with a sparse emission runs
``--iterations`` iterations with its M-step on the driver (``--m-step-shards 0``) and in ``--shards`` shards on the
workers. Printed side by side: the support's pairs; the driver's peak RSS over the fit itself (its start and its
iterations, up to the last iteration's line: with the sharded M-step the start too runs in shards), over the whole
process (the read of the final head that ``fit`` returns included) and over the iterations after the first (sampled
every 20 ms, that read included); the peak of what the driver
allocates in those iterations, up to the last one's line (``tracemalloc``, numpy's arrays included: what the
process keeps from the start does not count, nor the sharded fit's one read of its final head); the median
iteration's seconds after the first; and whether the two fits' held-out perplexities are identical.

Run::

    python benchmarks/bench_sharded.py                       # the standard library's 1.5M-token store, N = 8, 32
    python benchmarks/bench_sharded.py --store DIR --contexts 4,16 --iterations 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import current_rss_bytes, peak_rss_bytes

MIB = 2**20
DEFAULT_STORE = "/work/cache/hops/stdlib-1.5M/train.zarr"


def child(args: argparse.Namespace) -> None:
    """One fit, its driver this process: print its figures as JSON."""
    import distributed

    from dist_respattn.engine import FitSettings, fit
    from dist_respattn.model.heads.single_hop.kind import SingleHopSpec

    samples: list[tuple[float, int]] = []
    lines: list[tuple[float, str]] = []
    traced: list[int] = []
    fit_peak: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss = current_rss_bytes()
            if rss is not None:
                samples.append((time.monotonic(), rss))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    settings = FitSettings(
        max_iter=args.iterations, tol=0.0, patience=100, context_length=args.context, emission_layout="sparse",
        m_step_shards=args.shards,
    )  # fmt: skip
    spec = SingleHopSpec(emission_layout="sparse")

    def said(line: str) -> None:
        lines.append((time.monotonic(), line))
        if line.startswith("iteration 1:"):
            # From here on, what the driver allocates (numpy's arrays included) is traced: the iterations after
            # the first, without what the start left in the process, up to the last iteration's line (after
            # it the driver of a sharded fit reads the final head from its checkpoint, once).
            tracemalloc.start()
        elif line.startswith(f"iteration {args.iterations}:") and tracemalloc.is_tracing():
            traced.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            # The driver's high-water mark over the fit itself: its start and its iterations, before the read of
            # the final head that fit() returns.
            fit_peak.append(peak_rss_bytes())

    with (
        tempfile.TemporaryDirectory(dir=args.work) as model_dir,
        distributed.Client(args.scheduler, set_as_default=False) as client,
    ):
        result = fit(
            args.store, model_dir=model_dir, settings=settings, head=spec, client=client, progress=False,
            say=said,
        )  # fmt: skip

    done.set()
    sampler.join()
    first_done = next(t for t, line in lines if line.startswith("iteration 1:"))
    steady = max((rss for t, rss in samples if t > first_done), default=0)
    pairs = next((line.split()[3] for _, line in lines if line.startswith("sparse emission over")), "?")
    print(
        json.dumps(
            {
                "context": args.context,
                "shards": args.shards,
                "pairs": pairs.replace(",", ""),
                "driver_peak_mib": peak_rss_bytes() / MIB,
                "driver_fit_peak_mib": (fit_peak[0] if fit_peak else 0) / MIB,
                "driver_steady_peak_mib": steady / MIB,
                "driver_allocated_after_1_mib": (traced[0] if traced else 0) / MIB,
                "iteration_seconds": [e["seconds"] for e in result.history],
                "perplexities": [e["heldout"]["perplexity"] for e in result.history],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default=DEFAULT_STORE, help="a token-stream store (default: %(default)s)")
    parser.add_argument("--contexts", default="8,32", help="windows N, comma-separated (two support sizes)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2, help="shards of the sharded runs")
    parser.add_argument("--work", default=None, help="where the model directories go (default: the system's temp)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scheduler", help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.work:  # made here, once, so each child's model directory has a parent
        Path(args.work).mkdir(parents=True, exist_ok=True)

    import distributed

    rows = []
    with distributed.LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        for context in (int(c) for c in args.contexts.split(",")):
            for shards in (0, args.shards):
                command = [
                    sys.executable, __file__, "--child", "--scheduler", cluster.scheduler_address, "--store",
                    args.store, "--context", str(context), "--iterations", str(args.iterations), "--shards",
                    str(shards), *(["--work", args.work] if args.work else []),
                ]  # fmt: skip
                out = subprocess.run(command, capture_output=True, text=True, check=True)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"rows": rows, "load": load}, indent=2))
        return
    print(f"store {args.store}, {args.workers} workers, {args.iterations} iterations, load {load[0]:.2f}")
    print(
        f"{'N':>3} {'pairs':>10} {'M-step':>10} {'fit peak':>12} {'driver peak':>12} {'after it. 1':>12} "
        f"{'allocated':>10} {'iteration':>10}  same"
    )
    by_context: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_context.setdefault(row["context"], []).append(row)
    for context, pair in by_context.items():
        for row in pair:
            where = "driver" if row["shards"] == 0 else f"{row['shards']} shards"
            later = row["iteration_seconds"][1:] or row["iteration_seconds"]
            same = pair[0]["perplexities"] == row["perplexities"]
            print(
                f"{context:>3} {int(row['pairs']):>10,} {where:>10} {row['driver_fit_peak_mib']:>9.0f} MiB "
                f"{row['driver_peak_mib']:>9.0f} MiB "
                f"{row['driver_steady_peak_mib']:>9.0f} MiB {row['driver_allocated_after_1_mib']:>6.1f} MiB "
                f"{statistics.median(later):>9.2f}s  {same}"
            )


if __name__ == "__main__":
    main()
