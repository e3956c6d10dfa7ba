"""``dist-respattn demo``: the main job end to end on an embedded cluster, on real text every machine has.

By default it splits a slice of the Python standard library's own source into train, validation and
test stores that share one vocabulary, fits what ``fit`` fits on such a store (the recipe; ``--head single``:
one head) to the train store by exact EM on a Dask cluster (its choices made and its early stopping decided on
the validation store), and prints its test perplexity beside the unigram, add-k, Jelinek-Mercer and Kneser-Ney
2- to 5-grams on the same split.
``--synthetic`` runs the recovery demo instead: stores sampled from a random head, and how close the
fitted head comes to it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dist_respattn.cli.common import CommandError, check_synthetic_size, positive_float, positive_int, seed
from dist_respattn.cli.fit_commands import fit_report, print_fit_summary
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.events import FitState

__all__ = ["COMMANDS"]

#: Rows per chunk and per partition of the demo's stores: small, so the default slice makes several
#: partitions for the workers to share.
DEMO_CHUNK_ROWS = 65536
DEMO_PARTITION_ROWS = 131072

#: The text demo's slice of the standard library, and its vocabulary (S = T = this + 1).
DEMO_TOKENS = 1_000_000
DEMO_VOCAB_SIZE = 2000
#: The window the text demo's rows are read with: long enough for the copy head to find a file's repetitions
#: (on the default slice the recipe's stack is 0.871x the Kneser-Ney 5-gram's test perplexity at 32, and the repeat gate
#: over it 0.797x; at 8, with the conjunction head of order 2 and its rows' counts EM's then, the stack was 1.121x).
DEMO_CONTEXT = 32
#: The recovery demo's window.
SYNTHETIC_CONTEXT = 8


def _add_demo(sub: Any) -> None:
    """Add the ``demo`` subcommand."""
    demo = sub.add_parser(
        "demo",
        help="fit a head to the Python standard library's source and compare it with n-gram baselines",
        description=(
            "Split a slice of the Python standard library's source (real text on every machine with Python) into "
            "train, validation and test stores under --dir, fit the recipe (what fit picks on a token-stream store; "
            "--head single: one head) to the train store by exact EM on a Dask cluster (an embedded local one "
            "unless --scheduler is given), and print its test perplexity beside the unigram, add-k, Jelinek-Mercer "
            "and Kneser-Ney 2- to 5-grams. --synthetic instead samples stores from a random head and reports how "
            "well the fit recovers it."
        ),
    )
    demo.add_argument("--dir", default="respattn-demo", help="where the stores and the model go (./respattn-demo)")
    demo.add_argument("--max-iter", type=positive_int, default=100, help="EM iterations at most (default 100)")
    demo.add_argument("--tol", type=positive_float, default=1e-6, help="relative log-likelihood change to stop")
    demo.add_argument("--seed", type=seed, default=0, help="seed of the split (text) or of the head and samples")
    demo.add_argument(
        "--context",
        type=positive_int,
        help=f"N, context length (default {DEMO_CONTEXT} for text, {SYNTHETIC_CONTEXT} with --synthetic)",
    )
    demo.add_argument("--workers", type=positive_int, help="worker processes of the embedded cluster (one a core)")
    demo.add_argument("--scheduler", metavar="ADDRESS", help="run on this Dask scheduler instead")
    demo.add_argument(
        "--overwrite", action="store_true", help="replace the stores and the model a run left in --dir (else refused)"
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    text = demo.add_argument_group("text (the default)")
    text.add_argument(
        "--head",
        choices=_demo_heads(),
        default=_demo_heads()[0],
        help=f"the kind of head to fit (default {_demo_heads()[0]}, what fit picks on a token-stream store; single: "
        "one head alone, quicker)",
    )
    text.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEMO_TOKENS,
        help=f"tokens of the standard library to take, whole files in a hashed order (default {DEMO_TOKENS})",
    )
    text.add_argument(
        "--vocab-size", type=positive_int, default=DEMO_VOCAB_SIZE, help=f"K (default {DEMO_VOCAB_SIZE}; S = K + 1)"
    )
    synthetic = demo.add_argument_group("--synthetic: recovery of a random head")
    synthetic.add_argument("--synthetic", action="store_true", help="sample the stores from a random head instead")
    synthetic.add_argument("--rows", type=positive_int, default=200_000, help="training triples (default 200000)")
    synthetic.add_argument("--validation-rows", type=positive_int, default=20_000, help="held-out triples (20000)")
    synthetic.add_argument("--symbols", type=positive_int, default=200, help="S, context symbols (default 200)")
    synthetic.add_argument("--dim", type=positive_int, default=16, help="D, query dimension (default 16)")
    synthetic.add_argument("--targets", type=positive_int, default=50, help="T, target vocabulary (default 50)")
    synthetic.add_argument("--sigma2", type=positive_float, default=1.0, help="true gate variance (default 1)")
    demo.set_defaults(handler=_run_demo, printer=_print_demo)


#: Each subcommand this module adds, by name, with the function that adds it to a subparsers action
#: (``build_parser`` adds only the one a command line names).
COMMANDS: dict[str, Callable[[Any], None]] = {"demo": _add_demo}


def _demo_heads() -> list[str]:
    """The heads the text demo fits: the default of ``fit`` on a token-stream store first, then the single head."""
    from dist_respattn.model.heads.base import token_stream_default

    default = token_stream_default()
    return ["single"] if default is None else [default, "single"]


def _say(args: argparse.Namespace) -> Any:
    return (lambda message: None) if args.json else (lambda message: print(message, file=sys.stderr, flush=True))


def _run_demo(args: argparse.Namespace) -> dict[str, Any]:
    if args.context is None:
        args.context = SYNTHETIC_CONTEXT if args.synthetic else DEMO_CONTEXT
    check_demo_dir(Path(args.dir), synthetic=args.synthetic, overwrite=args.overwrite)
    if args.synthetic:
        check_synthetic_size(args.symbols, args.targets)
        return _run_synthetic(args)
    return _run_text(args)


def check_demo_dir(folder: Path, *, synthetic: bool, overwrite: bool) -> None:
    """Refuse a ``--dir`` that holds what the demo writes (its stores, a fit in ``model/``) unless ``overwrite``: a
    second run would replace another run's stores and model without a word."""
    names = ("train.zarr", "validation.zarr") if synthetic else ("train.zarr", "validation.zarr", "test.zarr")
    held = [name for name in names if (folder / name).exists()]
    model = folder / "model"
    if model.exists() and (not model.is_dir() or any(model.iterdir())):
        held.append("model")
    if held and not overwrite:
        raise CommandError(
            f"--dir {folder} holds {', '.join(held)} (stores and a fit of an earlier run): pass --overwrite to "
            "replace them, or give another --dir"
        )


def _run_text(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.engine import ClusterOptions, FitSettings, connect, evaluate, fit
    from dist_respattn.engine.cluster import starts_embedded_cluster
    from dist_respattn.store import TextCorpus, TokenStreamStore, WriteOptions, default_corpus, write_split
    from dist_respattn.store.errors import EmptySplitError

    say = _say(args)
    folder = Path(args.dir)
    options = WriteOptions(chunk_rows=DEMO_CHUNK_ROWS, partition_rows=DEMO_PARTITION_ROWS, overwrite=True)
    started = time.perf_counter()
    try:
        stores = write_split(
            folder,
            TextCorpus(()),
            args.context,
            split_seed=args.seed,
            max_tokens=args.max_tokens,
            vocab_size=args.vocab_size,
            options=options,
            store_format="stream",  # the token ids (~2 bytes a token), the same rows as triples would hold
        )
    except EmptySplitError as exc:  # split's own advice names flags the demo does not take
        raise CommandError(
            f"--max-tokens {args.max_tokens:,} takes {exc.documents:,} files of the standard library, too few for "
            f"the {exc.split} split to get one: take more tokens (--max-tokens; the default is 1,000,000) or "
            "another --seed"
        ) from None
    rows = {name: store.num_rows for name, store in stores.items()}
    # Whole files are taken until --max-tokens is reached, so the last one taken runs past it: the tokens split.
    taken = sum(int(store.num_tokens) for store in stores.values() if isinstance(store, TokenStreamStore))
    say(
        f"split {taken:,} tokens of the Python standard library's source ({default_corpus()}) into "
        f"train, validation and test stores under {folder} ({rows['train']:,} / {rows['validation']:,} / "
        f"{rows['test']:,} windows of {args.context} tokens, a vocabulary of {args.vocab_size:,} words counted on "
        f"train) in {time.perf_counter() - started:.1f} s"
    )
    settings = FitSettings(max_iter=args.max_iter, tol=args.tol, seed=args.seed)
    head = spec_from_args(argparse.Namespace(head=args.head), settings.head_spec(), None)
    cluster = ClusterOptions(scheduler=args.scheduler, n_workers=args.workers)
    with connect(cluster, say=say) as client:
        result = fit(
            stores["train"],
            model_dir=folder / "model",
            settings=settings,
            head=head,
            validation=stores["validation"],
            overwrite=True,
            client=client,
            say=say,
            progress=False if args.json else None,
        )
        tested = evaluate(folder / "model", stores["test"], client=client, progress=False)
    report = fit_report(result, stores["train"], cluster_closed=starts_embedded_cluster(cluster, None))
    report.update(
        corpus="the Python standard library's source",
        rows=rows,
        shape={"S": stores["train"].schema.num_symbols, "N": args.context, "D": stores["train"].schema.query_dim},
        test=tested.to_json(),
    )
    return report


def _run_synthetic(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from dist_respattn.engine import ClusterOptions, FitSettings, connect, evaluate, fit
    from dist_respattn.engine.cluster import starts_embedded_cluster
    from dist_respattn.model import random_distribution
    from dist_respattn.store import WriteOptions, write_synthetic

    say = _say(args)
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
    # Rows sampled from the model itself: its maximum-likelihood gate variance is consistent, and is the
    # parameter the recovery report compares (on text, held-out choice is what keeps it from collapsing).
    settings = FitSettings(max_iter=args.max_iter, tol=args.tol, seed=args.seed, estimate_sigma2=True, sigma2=1.0)
    cluster = ClusterOptions(scheduler=args.scheduler, n_workers=args.workers)
    with connect(cluster, say=say) as client:
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
    report = fit_report(result, train, cluster_closed=starts_embedded_cluster(cluster, None))
    report.update(
        rows=args.rows,
        shape={"S": args.symbols, "N": args.context, "D": args.dim, "T": args.targets},
        converged=result.state == FitState.CONVERGED,
        heldout_scores={"fitted (best)": fitted.model, "true model": true_scores.model, **fitted.baselines},
    )
    return report


def _print_demo(report: dict[str, Any]) -> None:
    from dist_respattn.baselines.ngram import MODEL_LABELS

    print_fit_summary(report)
    if "test" in report:
        test = report["test"]
        head = test["model"]
        print(f"test store {test['store']} ({test['rows']:,} windows), next-token perplexity and accuracy:")
        width = max(16, *(len(MODEL_LABELS.get(name, name)) for name in test["baselines"]))
        print(f"  {'head':<{width}} {head['perplexity']:9.2f}  {head['accuracy']:7.2%}")
        for name, figures in test["baselines"].items():
            label = MODEL_LABELS.get(name, name)
            print(f"  {label:<{width}} {figures['perplexity']:9.2f}  {figures['accuracy']:7.2%}")
        for name in ("kneser_ney", "kneser_ney_5"):  # the bigram it matches, and the n-gram a user would pick
            kn = test["baselines"].get(name)
            if kn:
                label = MODEL_LABELS.get(name, name)
                print(f"  head / {label} perplexity: {head['perplexity'] / kn['perplexity']:.3f}")
        tuned = test["baseline_counts_from"].get("tuned_on")
        print(f"  (baselines counted on the train store, tuned on {tuned or 'nothing: stated defaults'})")
        return
    scores = report["heldout_scores"]
    print("held-out scores (log-likelihood per row, perplexity of the targets):")
    for name, figures in scores.items():
        ll = figures.get("mean_log_likelihood")
        ll_text = f"{ll:10.4f}" if ll is not None else " " * 10
        print(f"  {name:<13} {ll_text}  {figures['perplexity']:9.3f}")
