"""``dist-respattn split``: one corpus into train, validation and test stores of one vocabulary and table."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

from dist_respattn.cli.common import CommandError, check_row_order, positive_int, progress_bar, say, seed
from dist_respattn.cli.store_commands import (
    add_attribute_options,
    add_common_options,
    add_corpus_sources,
    add_layout_options,
    attribute_flag_problems,
    identity_line,
    out_after_text,
    write_options,
)
from dist_respattn.text_format import count_text

__all__ = ["COMMANDS"]


def _fraction(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise argparse.ArgumentTypeError(f"{text}: expected a fraction in (0, 1)")
    return value


def _add_split(sub: Any) -> None:
    """Add the ``split`` subcommand."""
    split = sub.add_parser(
        "split",
        help="split one corpus into OUT_DIR/{train,validation,test}.zarr sharing one vocabulary and table",
        description=(
            "Split one corpus into OUT_DIR/train.zarr, validation.zarr and test.zarr, which share one vocabulary "
            "(text: counted on the train documents only), S, T, window N and embedding table, so a model fitted "
            "on the train store can be validated and tested on the others. Each document (a text file; a token "
            "document of --documents, else a block of --block-tokens tokens) goes to a split by a sha256 of "
            "--split-seed and its key (a file's path relative to the root it was found under, so the split is the "
            "same on every machine; a token document's index)."
        ),
    )
    split.add_argument(
        "out_dir",
        metavar="OUT_DIR",
        nargs="?",
        help="directory (or fsspec URL) the three stores go in (after --text PATH...: the last path given)",
    )
    source = split.add_mutually_exclusive_group(required=True)
    add_corpus_sources(source)
    split.add_argument("--context", type=positive_int, required=True, help="the window N")
    split.add_argument(
        "--documents", metavar="STARTS.npy", help="with --tokens: the first token index of each document"
    )
    split.add_argument(
        "--block-tokens",
        type=positive_int,
        help="with --tokens and no --documents: tokens per document the stream is cut into (default 10000)",
    )
    split.add_argument(
        "--vocab-size", type=positive_int, help="with --text: K most frequent train tokens kept (default 2000)"
    )
    split.add_argument(
        "--symbols",
        type=positive_int,
        help="with --tokens: S (default: largest id + 1; a token id of 1,048,576 or more needs S given)",
    )
    split.add_argument("--embeddings", metavar="E.npy", help="with --tokens: an (S, D) query table")
    split.add_argument(
        "--dim", type=positive_int, help="D of a seeded random projection (default: one-hot up to 256 symbols, else 32)"
    )
    split.add_argument("--seed", type=seed, help="seed of the random projection (default 0)")
    split.add_argument(
        "--fractions",
        nargs=3,
        type=_fraction,
        metavar=("TRAIN", "VALIDATION", "TEST"),
        help="shares of the documents, each > 0, summing to 1 (default 0.8 0.1 0.1)",
    )
    split.add_argument(
        "--hold-out",
        choices=("documents", "last"),
        default="documents",
        help="documents (the default): whole documents go to train, validation or test by their hash; last "
        "(leave-one-out, with --tokens and --documents): every document goes to all three, train all its tokens but "
        "the last two, validation and test each one held-out row (its second-to-last and last token) whose window "
        "is its own history; documents of fewer than 3 tokens are skipped and counted",
    )
    split.add_argument("--split-seed", type=int, default=0, help="seed of the document hash (default 0)")
    split.add_argument(
        "--format",
        choices=("stream", "triples"),
        default="stream",
        help="stream (the default): token-stream stores, the token ids themselves (a few bytes a token); triples: "
        "every window stored (over 100 bytes a token at N = 8), as split wrote before. Both hold the same rows, so "
        "a fit on either gives the same head",
    )
    split.add_argument(
        "--max-tokens",
        type=positive_int,
        help="take documents in a seeded hashed order until this many tokens are taken (a slice of a large corpus)",
    )
    add_attribute_options(split, split=True)
    add_layout_options(split, append=False)
    add_common_options(split)
    split.set_defaults(handler=_run_split, printer=_print_split)


#: Each subcommand this module adds, by name, with the function that adds it to a subparsers action
#: (``build_parser`` adds only the one a command line names).
COMMANDS: dict[str, Callable[[Any], None]] = {"split": _add_split}


def _check_hold_out_last(args: argparse.Namespace) -> None:
    """Refuse what leave-one-out cannot take, naming the flag."""
    problems = {
        "needs --tokens T.npy and --documents STARTS.npy (a document a user, items in time order)": (
            args.tokens is None or args.documents is None
        ),
        "puts every document in all three stores: drop --fractions": args.fractions is not None,
        "writes token-stream stores (a held-out row keeps its whole history): drop --format triples": (
            args.format == "triples"
        ),
        "takes no --attributes": getattr(args, "attributes", None) is not None,
    }
    for problem, found in problems.items():
        if found:
            raise CommandError(f"--hold-out last {problem}")


def _run_split(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import TextCorpus, TokenCorpus, default_corpus, write_split

    out_after_text(args, "out_dir", "OUT_DIR")
    misplaced = {
        "--documents": args.documents is not None and args.tokens is None,
        "--block-tokens": args.block_tokens is not None and (args.tokens is None or args.documents is not None),
        "--symbols": args.symbols is not None and args.tokens is None,
        "--embeddings": args.embeddings is not None and args.tokens is None,
        "--vocab-size": args.vocab_size is not None and args.text is None,
        **attribute_flag_problems(args),
    }
    if args.hold_out == "last":
        _check_hold_out_last(args)
    check_row_order(args)
    if args.fractions is None:
        args.fractions = [0.8, 0.1, 0.1]
    wrong = [flag for flag, bad in misplaced.items() if bad]
    if wrong:
        raise CommandError(f"{', '.join(wrong)}: not for this source: see `dist-respattn split --help`")
    if not math.isclose(sum(args.fractions), 1.0):
        given = " ".join(f"{f:g}" for f in args.fractions)
        raise CommandError(f"--fractions {given}: expected shares that sum to 1 (e.g. 0.8 0.1 0.1)")
    source: Any
    if args.tokens is not None:
        source = TokenCorpus(
            args.tokens, args.documents, args.block_tokens or 10_000, args.attributes, args.attribute_names
        )
    else:
        if not args.text:
            say(args, f"no --text path given: using the Python standard library's source at {default_corpus()}")
        source = TextCorpus(args.text, args.attribute_by)
    started = time.perf_counter()
    # What the bar counts: text files; else the tokens a stream writer writes, or the rows of a triple writer.
    unit = "files" if args.tokens is None else "tokens" if args.format == "stream" else "rows"
    with progress_bar(None, unit, "splitting", scale=unit != "files") as bar:
        stores = write_split(
            args.out_dir,
            source,
            args.context,
            fractions=args.fractions,
            split_seed=args.split_seed,
            max_tokens=args.max_tokens,
            vocab_size=args.vocab_size,
            num_symbols=args.symbols,
            embeddings=args.embeddings,
            dim=args.dim,
            seed=args.seed,
            file_progress=bar.update if args.tokens is None else None,
            options=write_options(args, bar.update if args.tokens is not None else None),
            store_format=args.format,
            hold_out=args.hold_out,
        )
    seconds = time.perf_counter() - started
    described = {name: store.describe() for name, store in stores.items()}
    train = described["train"]
    return {
        "out_dir": args.out_dir,
        "fractions": list(args.fractions),
        "split_seed": args.split_seed,
        "max_tokens": args.max_tokens,
        "format": args.format,
        "hold_out": args.hold_out,
        **({"skipped_documents": train["provenance"]["split"]["skipped_documents"]} if args.hold_out == "last" else {}),
        "identity": train["identity"],
        **{k: train[k] for k in ("num_symbols", "context_length", "query_dim", "num_targets")},
        "seconds": round(seconds, 3),
        "stores": {
            name: {
                **report,
                # The documents a store holds, in either format: a text file with no token is none, and is counted
                # apart (a stream store counts its own; a triple store, what its provenance records).
                "documents": report.get(
                    "documents", report["provenance"].get("documents", report["provenance"]["split"]["documents"])
                ),
                "empty_files": int(report["provenance"].get("empty_files", 0)),
                "tokens": report["provenance"].get("tokens_count"),
            }
            for name, report in described.items()
        },
    }


def _print_split(report: dict[str, Any]) -> None:
    for name, store in report["stores"].items():
        skipped = store.get("empty_files", 0)
        print(
            f"{name:<11}  {store['url']}: {count_text(store['rows'], 'row')}, "
            f"{count_text(store['documents'], 'document')}, {count_text(store['tokens'], 'token')}"
            + (f" ({count_text(skipped, 'empty file')} skipped)" if skipped else "")
        )
    train = report["stores"]["train"]
    if train.get("attributes"):
        print(f"attributes   {train['attributes']:,} names, the same ids in every store")
    print(
        f"shared       S={report['num_symbols']}, N={report['context_length']}, D={report['query_dim']}, "
        f"T={report['num_targets']}; identity {identity_line(report['identity'])}"
    )
    kind = "token-stream stores" if report.get("format") == "stream" else "triple stores"
    if report.get("hold_out") == "last":
        print(
            f"held out     each document's last token (test) and the one before (validation), one row each; "
            f"{count_text(report.get('skipped_documents', 0), 'document')} of fewer than 3 tokens skipped"
        )
        print(f"written in   {report['seconds']:.1f} s as {kind}")
        return
    print(f"written in   {report['seconds']:.1f} s as {kind} (split seed {report['split_seed']})")
