"""``dist-respattn demo``: the main job end to end on an embedded cluster.

Samples a training and a validation store from a random head, fits a new head to the training
store by exact EM on a Dask cluster (validating every iteration), and reports what was learned,
how close it is to the true head, and where the model and the dashboard are.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from dist_respattn.cli.common import positive_float, positive_int
from dist_respattn.cli.fit_commands import fit_report, print_fit_summary

__all__ = ["register"]

#: Rows per chunk and per partition of the demo's stores: small, so even the default 200,000 rows
#: make several partitions for the workers to share.
DEMO_CHUNK_ROWS = 16384
DEMO_PARTITION_ROWS = 32768


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand."""
    demo = sub.add_parser(
        "demo",
        help="make synthetic stores, fit a head to them on a local Dask cluster, report the recovery",
        description=(
            "Sample a training and a validation store from a random responsibility-attention head into --dir, "
            "fit a new head to the training store by exact EM on a Dask cluster (an embedded local one unless "
            "--scheduler is given; random start, learned gate variance), and print how well the true parameters "
            "were recovered, where the model is and where the dashboard is."
        ),
    )
    demo.add_argument("--dir", default="respattn-demo", help="where the stores and the model go (./respattn-demo)")
    demo.add_argument("--rows", type=positive_int, default=200_000, help="training triples (default 200000)")
    demo.add_argument("--validation-rows", type=positive_int, default=20_000, help="held-out triples (20000)")
    demo.add_argument("--symbols", type=positive_int, default=200, help="S, context symbols (default 200)")
    demo.add_argument("--context", type=positive_int, default=8, help="N, context length (default 8)")
    demo.add_argument("--dim", type=positive_int, default=16, help="D, query dimension (default 16)")
    demo.add_argument("--targets", type=positive_int, default=50, help="T, target vocabulary (default 50)")
    demo.add_argument("--sigma2", type=positive_float, default=1.0, help="true gate variance (default 1)")
    demo.add_argument("--max-iter", type=positive_int, default=100, help="EM iterations at most (default 100)")
    demo.add_argument("--tol", type=positive_float, default=1e-6, help="relative log-likelihood change to stop")
    demo.add_argument("--seed", type=int, default=0, help="seed of the true model, the samples and the start")
    demo.add_argument("--workers", type=positive_int, help="worker processes of the embedded cluster (one a core)")
    demo.add_argument("--scheduler", metavar="ADDRESS", help="run on this Dask scheduler instead")
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    demo.set_defaults(handler=_run_demo, printer=_print_demo)


def _run_demo(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from dist_respattn.engine import FitSettings, connect, evaluate, fit
    from dist_respattn.model import random_distribution
    from dist_respattn.store import WriteOptions, write_synthetic

    say = (lambda message: None) if args.json else (lambda message: print(message, file=sys.stderr, flush=True))
    folder = Path(args.dir)
    seeds = np.random.SeedSequence(args.seed).generate_state(3)
    truth = random_distribution(
        args.symbols, args.context, args.dim, args.targets, seed=int(seeds[0]), sigma2=args.sigma2
    )
    options = WriteOptions(chunk_rows=DEMO_CHUNK_ROWS, partition_rows=DEMO_PARTITION_ROWS, overwrite=True)
    started = time.perf_counter()
    train = write_synthetic(folder / "train.zarr", args.rows, model=truth, seed=int(seeds[1]), options=options)
    held_out = folder / "validation.zarr"
    write_synthetic(held_out, args.validation_rows, model=truth, seed=int(seeds[2]), options=options)
    say(
        f"sampled {args.rows:,} training and {args.validation_rows:,} validation triples from a random head "
        f"{truth} into {folder} in {time.perf_counter() - started:.1f} s"
    )
    settings = FitSettings(max_iter=args.max_iter, tol=args.tol, seed=args.seed)
    with connect(args.scheduler, n_workers=args.workers, say=say) as client:
        result = fit(
            train,
            model_dir=folder / "model",
            settings=settings,
            validation=held_out,
            overwrite=True,
            client=client,
            say=say,
            progress=False if args.json else None,
        )
        fitted = evaluate(folder / "model", held_out, client=client, progress=False)
        true_scores = evaluate(truth, held_out, client=client, progress=False)
    report = fit_report(result, train)
    report.update(
        rows=args.rows,
        shape={"S": args.symbols, "N": args.context, "D": args.dim, "T": args.targets},
        converged=result.state == "converged",
        heldout_scores={"fitted (best)": fitted.model, "true model": true_scores.model, **fitted.baselines},
    )
    return report


def _print_demo(report: dict[str, Any]) -> None:
    print_fit_summary(report)
    scores = report["heldout_scores"]
    print("held-out scores (log-likelihood per row, perplexity of the targets):")
    for name, figures in scores.items():
        ll = figures.get("mean_log_likelihood")
        ll_text = f"{ll:10.4f}" if ll is not None else " " * 10
        print(f"  {name:<13} {ll_text}  {figures['perplexity']:9.3f}")
