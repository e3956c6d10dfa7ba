"""``dist-respattn synth | ingest | info | validate | repair``: making, inspecting and checking stores."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from dist_respattn.cli.common import (
    CommandError,
    parse_storage_options,
    positive_float,
    positive_int,
    progress_bar,
    say,
)

__all__ = ["register"]


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option", action="append", metavar="KEY=VALUE", help="an fsspec option for a URL (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _add_layout(parser: argparse.ArgumentParser, default_order: str = "input") -> None:
    from dist_respattn.store.layout import COMPRESSION_CHOICES

    group = parser.add_argument_group("layout (a new store; an appended one keeps its own)")
    group.add_argument(
        "--chunk-rows", type=positive_int, help="rows per chunk, the unit of a block read (default ~32 MiB of rows)"
    )
    group.add_argument(
        "--partition-rows", type=positive_int, help="rows per partition/shard, one task (default 2 chunks)"
    )
    group.add_argument(
        "--compression", choices=COMPRESSION_CHOICES, default="auto", help="auto: ids lz4+bitshuffle, floats raw"
    )
    group.add_argument(
        "--row-order",
        choices=("input", "target"),
        default=default_order,
        help=f"rows as given, or each partition sorted by target (faster E-step); default {default_order}",
    )
    group.add_argument(
        "--query-dtype", choices=("float32", "float64"), default="float32", help="dtype of the stored queries"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--append", action="store_true", help="add the rows to an existing store of the same schema")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing store at OUT")


def register(sub: Any) -> None:
    """Add the store subcommands."""
    synth = sub.add_parser(
        "synth",
        help="write a store of triples sampled from a random head (kept in the store)",
        description=(
            "Sample triples from a random head of shape S, N, D, T (seeded) and write them to a store, the head "
            "kept in the store's truth/ group. With --append, more rows are sampled from the store's own head "
            "(the shape flags may then be omitted; given, they must match)."
        ),
    )
    synth.add_argument("out", metavar="OUT", help="store path or fsspec URL")
    synth.add_argument("--rows", type=positive_int, required=True, help="triples to sample")
    synth.add_argument("--symbols", type=positive_int, help="S, context symbols (required unless --append)")
    synth.add_argument("--context", type=positive_int, help="N, context length (required unless --append)")
    synth.add_argument("--dim", type=positive_int, help="D, query dimension (required unless --append)")
    synth.add_argument("--targets", type=positive_int, help="T, target vocabulary (required unless --append)")
    synth.add_argument(
        "--sigma2", type=positive_float, default=1.0, help="gate variance of the random head (default 1)"
    )
    synth.add_argument("--seed", type=int, default=0, help="seed of the head and of the sample (default 0)")
    _add_layout(synth, default_order="target")
    _add_common(synth)
    synth.set_defaults(handler=_run_synth, printer=_print_written)

    ingest = sub.add_parser(
        "ingest",
        help="write a store from arrays, a token stream or text files",
        description=(
            "Write a triple store from .npy arrays (--arrays), a .npy token stream (--tokens, windows of --context "
            "tokens) or text files (--text; with no path, the Python standard library's source)."
        ),
    )
    ingest.add_argument("out", metavar="OUT", help="store path or fsspec URL")
    source = ingest.add_mutually_exclusive_group(required=True)
    source.add_argument("--arrays", nargs=3, metavar=("CONTEXT.npy", "QUERY.npy", "TARGET.npy"), help="encoded triples")
    source.add_argument("--tokens", metavar="TOKENS.npy", help="a 1-d array of token ids")
    source.add_argument(
        "--text",
        nargs="*",
        metavar="PATH",
        help="text files, globs, or directories (their .txt/.md/.rst/.py files); none: the stdlib source",
    )
    ingest.add_argument("--weights", metavar="W.npy", help="with --arrays: a weight per row")
    ingest.add_argument("--symbols", type=positive_int, help="with --arrays/--tokens: S (default: largest id + 1)")
    ingest.add_argument("--targets", type=positive_int, help="with --arrays: T (default: largest target + 1)")
    ingest.add_argument("--context", type=positive_int, help="with --tokens/--text: the window N")
    ingest.add_argument("--embeddings", metavar="E.npy", help="with --tokens: an (S, D) query table")
    ingest.add_argument(
        "--dim",
        type=positive_int,
        help="with --tokens/--text: D of a seeded random projection (default: one-hot up to 256 symbols, else 32)",
    )
    ingest.add_argument(
        "--seed", type=int, default=0, help="with --tokens/--text: seed of the random projection (default 0)"
    )
    ingest.add_argument(
        "--vocab-size", type=positive_int, default=2000, help="with --text: K most frequent tokens kept (default 2000)"
    )
    _add_layout(ingest)
    _add_common(ingest)
    ingest.set_defaults(handler=_run_ingest, printer=_print_written)

    info = sub.add_parser("info", help="describe a store: schema, rows, layout, provenance")
    info.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    _add_common(info)
    info.set_defaults(handler=_run_info, printer=_print_info)

    validate = sub.add_parser(
        "validate",
        help="scan every chunk of a store and report each problem (exit 1 when there is one)",
        description=(
            "Scan every chunk of a store and report each problem with its array, chunk and row. "
            "Exit status: 0 valid, 1 problems found, 2 not a store or another error."
        ),
    )
    validate.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    validate.add_argument("--scheduler", metavar="ADDRESS", help="scan in parallel on this Dask scheduler's workers")
    _add_common(validate)
    validate.set_defaults(handler=_run_validate, printer=_print_validate)

    repair = sub.add_parser(
        "repair",
        help="roll an interrupted append back to the store's committed rows",
        description="Roll an interrupted append back to the store's committed rows; a complete store is left alone.",
    )
    repair.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    _add_common(repair)
    repair.set_defaults(handler=_run_repair, printer=lambda r: print(f"{r['url']}: complete, {r['rows']:,} rows"))


def _write_options(args: argparse.Namespace, progress: Callable[[int], Any] | None) -> Any:
    from dist_respattn.store import WriteOptions

    return WriteOptions(
        chunk_rows=args.chunk_rows,
        partition_rows=args.partition_rows,
        compression=args.compression,
        row_order=args.row_order,
        query_dtype=args.query_dtype,
        append=args.append,
        overwrite=args.overwrite,
        storage_options=parse_storage_options(args.storage_option),
        progress=progress,
    )


def _written(store: Any, started: float, before: int) -> dict[str, Any]:
    seconds = time.perf_counter() - started
    added = store.num_rows - before
    report = store.describe()
    report["rows_added"] = added
    report["seconds"] = round(seconds, 3)
    report["rows_per_second"] = round(added / seconds) if seconds > 0 else None
    return report


def _run_synth(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import write_synthetic

    shape = {"--symbols": args.symbols, "--context": args.context, "--dim": args.dim, "--targets": args.targets}
    missing = [flag for flag, value in shape.items() if value is None]
    if missing and not args.append:
        raise CommandError(f"{', '.join(missing)} required for a new store")
    started = time.perf_counter()
    before = _rows_before(args)
    with progress_bar(args.rows, "rows", "sampling") as bar:
        store = write_synthetic(
            args.out,
            args.rows,
            num_symbols=args.symbols,
            context_length=args.context,
            query_dim=args.dim,
            num_targets=args.targets,
            sigma2=args.sigma2,
            seed=args.seed,
            options=_write_options(args, bar.update),
        )
    return _written(store, started, before)


def _rows_before(args: argparse.Namespace) -> int:
    if not args.append:
        return 0
    from dist_respattn.store import TripleStore

    return TripleStore.open(args.out, storage_options=parse_storage_options(args.storage_option)).num_rows


def _run_ingest(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import default_corpus, iter_text_files, write_arrays, write_text, write_tokens

    misplaced = {
        "--weights": args.weights is not None and args.arrays is None,
        "--targets": args.targets is not None and args.arrays is None,
        "--embeddings": args.embeddings is not None and args.tokens is None,
        "--context": args.context is not None and args.arrays is not None,
        "--dim": args.dim is not None and args.arrays is not None,
    }
    wrong = [flag for flag, bad in misplaced.items() if bad]
    if wrong:
        raise CommandError(f"{', '.join(wrong)}: not for this source: see `dist-respattn ingest --help`")
    if args.arrays is None and args.context is None:
        raise CommandError("--context N is required with --tokens and --text")
    started = time.perf_counter()
    before = _rows_before(args)
    if args.arrays is not None:
        with progress_bar(None, "rows", "ingesting") as bar:
            context, query, target = args.arrays
            store = write_arrays(
                args.out,
                context,
                query,
                target,
                args.weights,
                num_symbols=args.symbols,
                num_targets=args.targets,
                options=_write_options(args, bar.update),
            )
    elif args.tokens is not None:
        with progress_bar(None, "rows", "windowing") as bar:
            store = write_tokens(
                args.out,
                args.tokens,
                args.context,
                num_symbols=args.symbols,
                embeddings=args.embeddings,
                dim=args.dim,
                seed=args.seed,
                options=_write_options(args, bar.update),
            )
    else:
        if args.symbols is not None:
            raise CommandError("--symbols does not apply to --text: the vocabulary size is --vocab-size (S = K + 1)")
        paths = args.text or [default_corpus()]
        if not args.text:
            say(args, f"no --text path given: using the Python standard library's source at {paths[0]}")
        files = iter_text_files(paths)
        with progress_bar(2 * len(files), "files", "counting, then writing") as bar:
            options = _write_options(args, None)  # the bar counts files here, not rows
            store = write_text(
                args.out,
                paths,
                args.context,
                vocab_size=args.vocab_size,
                dim=args.dim,
                seed=args.seed,
                file_progress=bar.update,
                options=options,
            )
    return _written(store, started, before)


def _print_written(report: dict[str, Any]) -> None:
    print(
        f"{report['url']}: wrote {report['rows_added']:,} rows in {report['seconds']:.1f} s "
        f"({report['rows_per_second'] or 0:,} rows/s); the store now holds {report['rows']:,} rows"
    )
    _print_info(report)


def _run_info(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import TripleStore

    return TripleStore.open(args.store, storage_options=parse_storage_options(args.storage_option)).describe()


def _print_info(report: dict[str, Any]) -> None:
    print(f"store        {report['url']}")
    print(
        f"rows         {report['rows']:,} in {report['partitions']} partition{'s' * (report['partitions'] != 1)} "
        f"of {report['partition_rows']:,} rows, "
        f"chunks of {report['chunk_rows']:,}"
    )
    print(
        f"shape        S={report['num_symbols']} symbols, N={report['context_length']} positions, "
        f"D={report['query_dim']} ({report['query_dtype']}), T={report['num_targets']} targets"
        + (", weighted" if report["has_weight"] else "")
    )
    for name, array in report["arrays"].items():
        codecs = "+".join(array["compressors"]) or "raw"
        print(
            f"  {name:<8} {array['dtype']:<8} {tuple(array['shape'])!s:<16} {codecs:<11} "
            f"{array['bytes'] / 2**20:,.1f} MiB uncompressed"
        )
    provenance = report["provenance"]
    print(
        f"made from    {provenance.get('source', '?')} on {provenance.get('created', '?')}"
        + (f", {len(provenance['appends'])} append(s)" if provenance.get("appends") else "")
    )
    if report["has_true_model"]:
        print("true model   kept in the store (truth/)")
    print(f"fingerprint  {report['fingerprint']}")


def _run_validate(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import StoreLocation, validate

    location = StoreLocation.of(args.store, parse_storage_options(args.storage_option))
    client = None
    if args.scheduler:
        from distributed import Client

        try:
            client = Client(args.scheduler, timeout="10s")
        except OSError as exc:
            raise CommandError(f"cannot reach the scheduler at {args.scheduler}: {exc}") from exc
    try:
        with progress_bar(None, "partitions", "scanning") as bar:
            report = validate(location, client=client, progress=bar.update)
    finally:
        if client is not None:
            client.close()
    result = report.to_json()
    result["exit_status"] = 0 if report.ok else 1
    result["summary"] = report.summary()
    return result


def _print_validate(report: dict[str, Any]) -> None:
    print(report["summary"])


def _run_repair(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import StoreLocation, rollback_append

    location = StoreLocation.of(args.store, parse_storage_options(args.storage_option))
    rows = rollback_append(location)
    return {"url": str(location), "rows": rows}
