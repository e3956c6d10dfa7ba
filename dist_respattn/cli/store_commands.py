"""``dist-respattn synth | ingest | info | validate | repair``: making, inspecting and checking stores."""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from typing import Any

from dist_respattn.cli.common import (
    CommandError,
    check_row_order,
    check_synthetic_size,
    parse_storage_options,
    positive_float,
    positive_int,
    progress_bar,
    say,
    seed,
)
from dist_respattn.text_format import count_text

__all__ = [
    "COMMANDS",
    "add_attribute_options",
    "add_common_options",
    "add_corpus_sources",
    "add_layout_options",
    "attribute_flag_problems",
    "identity_line",
    "out_after_text",
    "write_options",
]


def add_corpus_sources(source: Any) -> None:
    """``--tokens`` and ``--text`` in a group of mutually exclusive sources (``ingest`` and ``split``)."""
    source.add_argument("--tokens", metavar="TOKENS.npy", help="a 1-d array of token ids")
    source.add_argument(
        "--text",
        nargs="*",
        metavar="PATH",
        help="text files, globs, or directories (their .txt/.md/.rst/.py files); none: the stdlib source",
    )


def add_attribute_options(parser: argparse.ArgumentParser, *, split: bool = False) -> None:
    """``--attribute-by``, ``--attributes`` and ``--attribute-names``: an attribute id per row (``ingest``; ``split``,
    which takes no --arrays and writes three stores of one set of names)."""
    from dist_respattn.store.attributes import ATTRIBUTE_BY

    ids_with = "--tokens" if split else "--tokens/--arrays"
    kept = (
        "one set of names, the same ids in every store"
        if split
        else "--like/--append keep those names' ids, new names are added after them"
    )
    group = parser.add_argument_group(f"attributes (who wrote each row: an id in [0, A) with A names; {kept})")
    group.add_argument(
        "--attribute-by",
        choices=ATTRIBUTE_BY,
        help="with --text: each file's attribute is its path under its root (file) or that path's directory "
        "(directory; '.' at the root); names sorted",
    )
    group.add_argument(
        "--attributes",
        metavar="A.npy",
        help=f"with {ids_with}: an integer attribute id per token (--tokens; a row takes its target's) or per "
        "row (--arrays)",
    )
    group.add_argument(
        "--attribute-names",
        metavar="NAMES.txt",
        help="with --attributes: one name a line, line k naming id k (default: the ids themselves, 0..A-1, "
        "for ids up to 99,999; more need their names)",
    )


def attribute_flag_problems(args: argparse.Namespace) -> dict[str, bool]:
    """The attribute flags given with a source they do not go with (``ingest`` and ``split`` share them)."""
    return {
        "--attribute-by": args.attribute_by is not None and args.text is None,
        "--attributes": args.attributes is not None and args.tokens is None and getattr(args, "arrays", None) is None,
        "--attribute-names": args.attribute_names is not None and args.attributes is None,
    }


def out_after_text(args: argparse.Namespace, attribute: str, metavar: str) -> None:
    """Find ``OUT`` when ``--text`` took it: ``ingest --text DIR OUT`` gives ``--text`` both paths, as ``nargs="*"``
    takes every word up to the next flag. As with ``cp SOURCE... DEST``, the last path is then ``OUT``, provided it
    is not text (a path that does not exist yet, a URL, or a zarr store); anything else is refused."""
    if getattr(args, attribute) is not None:
        return
    text = args.text or []
    last = text[-1] if len(text) >= 2 else None
    if last is not None and (not os.path.exists(last) or os.path.isfile(os.path.join(last, "zarr.json"))):
        setattr(args, attribute, last)
        args.text = text[:-1]
        return
    if text:
        raise CommandError(
            f"{metavar} is missing: --text took {', '.join(text)} as text; give {metavar} first "
            f"(`{args.command} {metavar} --text PATH...`)"
        )
    raise CommandError(f"{metavar} is missing: give the path or URL to write (`{args.command} {metavar} ...`)")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option", action="append", metavar="KEY=VALUE", help="an fsspec option for a URL (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_layout_options(
    parser: argparse.ArgumentParser, default_order: str = "input", *, append: bool = True, streams: bool = True
) -> None:
    """The layout flags, and ``--append``/``--overwrite`` (``--overwrite`` alone where appending makes no sense).
    ``streams``: the command writes token-stream stores too, whose chunks and shards count tokens."""
    from dist_respattn.store.layout import COMPRESSION_CHOICES
    from dist_respattn.store.streams.reader import DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNKS_PER_PARTITION

    title = "layout (a new store; an appended one keeps its own)" if append else "layout (of every store written)"
    group = parser.add_argument_group(title)
    # A stream store's chunks are tokens, 2**20 of them, and its shards 4 chunks: said beside a triple store's.
    chunk_tokens = f"2**{DEFAULT_CHUNK_TOKENS.bit_length() - 1}"
    group.add_argument(
        "--chunk-rows",
        type=positive_int,
        help="rows per chunk, the unit of a block read (default ~32 MiB of rows"
        + (f"; a token-stream store: tokens, default {chunk_tokens})" if streams else ")"),
    )
    group.add_argument(
        "--partition-rows",
        type=positive_int,
        help="rows per partition/shard, one task (default 2 chunks"
        + (f"; a token-stream store: tokens, default {DEFAULT_CHUNKS_PER_PARTITION} chunks)" if streams else ")"),
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
    if not append:
        parser.add_argument("--overwrite", action="store_true", help="replace existing stores")
        return
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--append", action="store_true", help="add the rows to an existing store of the same schema")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing store at OUT")


def _add_synth(sub: Any) -> None:
    """Add the ``synth`` subcommand."""
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
    synth.add_argument("--seed", type=seed, default=0, help="seed of the head and of the sample (default 0)")
    add_layout_options(synth, default_order="target", streams=False)
    add_common_options(synth)
    synth.set_defaults(handler=_run_synth, printer=_print_written)


def _add_ingest(sub: Any) -> None:
    """Add the ``ingest`` subcommand."""
    ingest = sub.add_parser(
        "ingest",
        help="write a store from arrays, a token stream or text files",
        description=(
            "Write a triple store from .npy arrays (--arrays), or a token-stream store from a .npy token stream "
            "(--tokens, optionally cut into --documents; rows are windows of --context tokens) or text files "
            "(--text; with no path, the Python standard library's source; --format triples stores windows). "
            "With --like STORE the new store is another sample of STORE's corpus: it takes "
            "STORE's vocabulary (a word not in it becomes the out-of-vocabulary id), S, T, window N and embedding "
            "table, so a validation or test store can be scored against a model fitted on STORE."
        ),
    )
    ingest.add_argument(
        "out", metavar="OUT", nargs="?", help="store path or fsspec URL (after --text PATH...: the last path given)"
    )
    source = ingest.add_mutually_exclusive_group(required=True)
    source.add_argument("--arrays", nargs=3, metavar=("CONTEXT.npy", "QUERY.npy", "TARGET.npy"), help="encoded triples")
    add_corpus_sources(source)
    ingest.add_argument(
        "--weights",
        metavar="W.npy",
        help="with --arrays: a weight per row; with --tokens --format stream: a weight per token (of the row it "
        "is the target of; 0 keeps it as context only)",
    )
    ingest.add_argument(
        "--format",
        choices=("stream", "triples"),
        help="with --tokens/--text: store the token ids themselves (stream, the default: ~2 bytes a token, the "
        "window chosen at fit time with fit --context) or each window as a row (triples: ~130 bytes a token; "
        "needed for --row-order target); an --append keeps the store's own format",
    )
    ingest.add_argument(
        "--symbols",
        type=positive_int,
        help="with --arrays/--tokens: S (default: largest id + 1; a token id of 1,048,576 or more needs S given)",
    )
    ingest.add_argument("--targets", type=positive_int, help="with --arrays: T (default: largest target + 1)")
    ingest.add_argument(
        "--context", type=positive_int, help="with --tokens/--text: the window N (with --like: STORE's N)"
    )
    ingest.add_argument(
        "--documents",
        metavar="STARTS.npy",
        help="with --tokens: the first token index of each document (increasing, from 0); no window spans two",
    )
    ingest.add_argument(
        "--like",
        metavar="STORE",
        help="take STORE's vocabulary, S, T, N and embedding table (a validation or test store of its corpus)",
    )
    ingest.add_argument("--embeddings", metavar="E.npy", help="with --tokens: an (S, D) query table")
    ingest.add_argument(
        "--dim",
        type=positive_int,
        help="with --tokens/--text: D of a seeded random projection (default: one-hot up to 256 symbols, else 32)",
    )
    ingest.add_argument("--seed", type=seed, help="with --tokens/--text: seed of the random projection (default 0)")
    ingest.add_argument(
        "--vocab-size", type=positive_int, help="with --text: K most frequent tokens kept (default 2000)"
    )
    add_attribute_options(ingest)
    add_layout_options(ingest)
    add_common_options(ingest)
    ingest.set_defaults(handler=_run_ingest, printer=_print_written)


def _add_info(sub: Any) -> None:
    """Add the ``info`` subcommand."""
    info = sub.add_parser("info", help="describe a store: schema, rows, layout, corpus identity, provenance")
    info.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    add_common_options(info)
    info.set_defaults(handler=_run_info, printer=_print_info)


def _add_validate(sub: Any) -> None:
    """Add the ``validate`` subcommand."""
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
    add_common_options(validate)
    validate.set_defaults(handler=_run_validate, printer=_print_validate)


def _add_repair(sub: Any) -> None:
    """Add the ``repair`` subcommand."""
    repair = sub.add_parser(
        "repair",
        help="roll an interrupted append back to the store's committed rows; remove a killed writer's leftovers",
        description=(
            "Roll an interrupted append (of a triple or a token-stream store) back to the store's committed rows "
            "(a complete store is left alone), and delete the staging copies STORE.partial-* that killed writers "
            "(--overwrite, new token-stream stores) left. "
            "Refused while a live writer holds the store's lock (STORE.lock); a dead writer's lock is broken. "
            "A store that is damaged otherwise (an array of the wrong dtype or chunking, a missing one) is beyond "
            "repair: it is named with what is wrong, left as it is, and the exit status is 2."
        ),
    )
    repair.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    add_common_options(repair)
    repair.set_defaults(handler=_run_repair, printer=_print_repair)


#: Each subcommand this module adds, by name, with the function that adds it to a subparsers action
#: (``build_parser`` adds only the one a command line names).
COMMANDS: dict[str, Callable[[Any], None]] = {
    "synth": _add_synth,
    "ingest": _add_ingest,
    "info": _add_info,
    "validate": _add_validate,
    "repair": _add_repair,
}


def write_options(args: argparse.Namespace, progress: Callable[[int], Any] | None) -> Any:
    """The :class:`~dist_respattn.store.WriteOptions` of the layout flags."""
    from dist_respattn.store import WriteOptions

    return WriteOptions(
        chunk_rows=args.chunk_rows,
        partition_rows=args.partition_rows,
        compression=args.compression,
        row_order=args.row_order,
        query_dtype=args.query_dtype,
        append=getattr(args, "append", False),
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
    from dist_respattn.store import SchemaMismatchError, write_synthetic

    shape = {"--symbols": args.symbols, "--context": args.context, "--dim": args.dim, "--targets": args.targets}
    missing = [flag for flag, value in shape.items() if value is None]
    if missing and not args.append:
        raise CommandError(f"{', '.join(missing)} required for a new store")
    check_synthetic_size(args.symbols, args.targets)
    started = time.perf_counter()
    before = _rows_before(args)
    with progress_bar(args.rows, "rows", "sampling") as bar:
        try:
            store = write_synthetic(
                args.out,
                args.rows,
                num_symbols=args.symbols,
                context_length=args.context,
                query_dim=args.dim,
                num_targets=args.targets,
                sigma2=args.sigma2,
                seed=args.seed,
                options=write_options(args, bar.update),
            )
        except SchemaMismatchError as exc:
            # The requested shape is synth's flags (the others are named by every command's own mapping); here
            # query_dim is --dim, which elsewhere is not always what sets D (an --arrays query's columns do).
            raise CommandError(re.sub(r"(?<![\w'])query_dim(?![\w'])", "--dim", str(exc))) from exc
    return _written(store, started, before)


def _open_like(args: argparse.Namespace) -> Any:
    """The ``--like`` store, opened once (with the ``--storage-option`` flags), or ``None``."""
    if args.like is None:
        return None
    from dist_respattn.store.rows import open_store

    return open_store(args.like, storage_options=parse_storage_options(args.storage_option))


def _rows_before(args: argparse.Namespace) -> int:
    if not args.append:
        return 0
    from dist_respattn.store.rows import open_store

    return open_store(args.out, storage_options=parse_storage_options(args.storage_option)).num_rows


def _ingest_format(args: argparse.Namespace) -> str:
    """``triples`` or ``stream``: --format's, else an appended store's own, else stream for tokens and text."""
    if args.arrays is not None:
        return "triples"
    if args.append:
        from dist_respattn.store import StoreLocation
        from dist_respattn.store.rows import is_stream_store

        location = StoreLocation.of(args.out, parse_storage_options(args.storage_option))
        kind = "stream" if location.exists() and is_stream_store(location) else "triples"
        if args.format is not None and args.format != kind:
            raise CommandError(f"--format {args.format}: {args.out} is a {kind} store, and an append keeps its format")
        return kind
    return args.format or "stream"


def _run_ingest(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import default_corpus, iter_text_files, write_arrays, write_text, write_tokens

    out_after_text(args, "out", "OUT")  # first: the format of an append depends on OUT
    if args.format is not None and args.arrays is not None:
        raise CommandError("--format: not for --arrays, which are always written as triples")
    args.format = _ingest_format(args)
    misplaced = {
        "--weights": args.weights is not None and args.arrays is None and not (args.tokens and args.format == "stream"),
        "--targets": args.targets is not None and args.arrays is None,
        "--embeddings": args.embeddings is not None and args.tokens is None,
        "--documents": args.documents is not None and args.tokens is None,
        "--vocab-size": args.vocab_size is not None and args.text is None,
        "--context": args.context is not None and args.arrays is not None,
        "--dim": args.dim is not None and args.arrays is not None,
        "--seed": args.seed is not None and args.arrays is not None,
        **attribute_flag_problems(args),
    }
    wrong = [flag for flag, bad in misplaced.items() if bad]
    if wrong:
        raise CommandError(f"{', '.join(wrong)}: not for this source: see `dist-respattn ingest --help`")
    if args.like is not None and args.append:
        raise CommandError(
            f"--like {args.like} and --append exclude each other: an append already reuses the vocabulary and "
            f"embedding table of {args.out}"
        )
    if (
        args.arrays is None
        and args.context is None
        and args.like is None
        and not (args.append and args.format == "stream")
    ):
        raise CommandError("--context N is required with --tokens and --text (or --like STORE, to take its N)")
    like = _open_like(args)
    started = time.perf_counter()
    before = _rows_before(args)
    names_before = _names_before(args, like)
    attributes = {"attributes": args.attributes, "attribute_names": args.attribute_names}
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
                like=like,
                options=write_options(args, bar.update),
                **attributes,
            )
    elif args.format == "stream":
        check_row_order(args)
        store = _ingest_stream(args, like)
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
                documents=args.documents,
                like=like,
                options=write_options(args, bar.update),
                **attributes,
            )
    else:
        if args.symbols is not None:
            raise CommandError("--symbols does not apply to --text: the vocabulary size is --vocab-size (S = K + 1)")
        paths = args.text or [default_corpus()]
        if not args.text:
            say(args, f"no --text path given: using the Python standard library's source at {paths[0]}")
        files = iter_text_files(paths)
        passes = "writing" if like is not None else "counting, then writing"
        with progress_bar((1 if like is not None else 2) * len(files), "files", passes, scale=False) as bar:
            options = write_options(args, None)  # the bar counts files here, not rows
            store = write_text(
                args.out,
                paths,
                args.context,
                vocab_size=args.vocab_size,
                dim=args.dim,
                seed=args.seed,
                like=like,
                file_progress=bar.update,
                options=options,
                attribute_by=args.attribute_by,
            )
    report = _written(store, started, before)
    if store.attribute_names is not None and (args.append or like is not None):
        report["attributes_added"] = len(store.attribute_names) - len(names_before or ())
    return report


def _names_before(args: argparse.Namespace, like: Any) -> tuple[str, ...] | None:
    """The attribute names the new rows' names merge with: the appended store's, or the ``--like`` store's (the
    report's ``attributes_added`` counts the names they lacked)."""
    if args.append:
        from dist_respattn.store.rows import open_store

        return open_store(args.out, storage_options=parse_storage_options(args.storage_option)).attribute_names
    return None if like is None else like.attribute_names


def _ingest_stream(args: argparse.Namespace, like: Any) -> Any:
    """``ingest --format stream``: the token ids (of --tokens, or of the --text files) as a token-stream store."""
    from dist_respattn.store import default_corpus, iter_text_files
    from dist_respattn.store.ingest.to_stream import write_stream_text, write_stream_tokens

    options = write_options(args, None)
    if args.tokens is not None:
        return write_stream_tokens(
            args.out, args.tokens, args.context, num_symbols=args.symbols, embeddings=args.embeddings, dim=args.dim,
            seed=args.seed, documents=args.documents, weights=args.weights, like=like, options=options,
            attributes=args.attributes, attribute_names=args.attribute_names,
        )  # fmt: skip
    if args.symbols is not None:
        raise CommandError("--symbols does not apply to --text: the vocabulary size is --vocab-size (S = K + 1)")
    paths = args.text or [default_corpus()]
    files = iter_text_files(paths)
    one_pass = like is not None or args.append  # the vocabulary is the reference's: no counting pass
    with progress_bar(
        (1 if one_pass else 2) * len(files), "files", "writing" if one_pass else "counting, then writing", scale=False
    ) as bar:
        return write_stream_text(
            args.out, paths, args.context, vocab_size=args.vocab_size, dim=args.dim, seed=args.seed, like=like,
            file_progress=bar.update, options=options, attribute_by=args.attribute_by,
        )  # fmt: skip


def _print_written(report: dict[str, Any]) -> None:
    print(
        f"{report['url']}: wrote {report['rows_added']:,} rows in {report['seconds']:.1f} s "
        f"({report['rows_per_second'] or 0:,} rows/s); the store now holds {report['rows']:,} rows"
    )
    _print_info(report)


def _run_info(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store.ingest.text import describe_vocabulary
    from dist_respattn.store.rows import open_store

    store = open_store(args.store, storage_options=parse_storage_options(args.storage_option))
    report = store.describe()
    vocabulary = describe_vocabulary(store.vocabulary(), store.provenance)
    if vocabulary is not None:
        report["vocabulary"] = vocabulary
    return report


def _print_info(report: dict[str, Any]) -> None:
    print(f"store        {report['url']}")
    if report.get("format") == "stream":
        print(
            f"tokens       {report['tokens']:,} in {count_text(report['documents'], 'document')}, "
            f"{_size(report['bytes_on_disk'])} on disk ({report['bytes_per_token']:.2f} bytes a token); "
            f"rows are windows of N={report['context_length']} (fit --context to choose another)"
        )
    # "1 partition of up to 4,194,304 rows": the layout's sizes are bounds, which a small store does not reach.
    print(
        f"rows         {report['rows']:,} in {count_text(report['partitions'], 'partition')} "
        f"of up to {report['partition_rows']:,} rows, in chunks of up to {report['chunk_rows']:,}"
    )
    print(
        f"shape        S={report['num_symbols']} symbols, N={report['context_length']} positions, "
        f"D={report['query_dim']} ({report['query_dtype']}), T={report['num_targets']} targets"
        + (", weighted" if report["has_weight"] else "")
    )
    width = max((len(name) for name in report["arrays"]), default=8)
    for name, array in report["arrays"].items():
        codecs = "+".join(array["compressors"]) or "raw"
        print(
            f"  {name:<{width}} {array['dtype']:<8} {tuple(array['shape'])!s:<16} {codecs:<11} "
            f"{_size(array['bytes'])} uncompressed"
        )
    provenance = report["provenance"]
    print(
        f"made from    {provenance.get('source', '?')} on {provenance.get('created', '?')}"
        + (f", {count_text(len(provenance['appends']), 'append')}" if provenance.get("appends") else "")
    )
    if provenance.get("like"):
        print(f"made like    {provenance['like']} (its vocabulary, N and embedding table)")
    split = provenance.get("split")
    if split and split.get("hold_out") == "last":  # leave-one-out: every document in all three stores, no fractions
        skipped = int(split.get("skipped_documents") or 0)
        documents = count_text(split["documents"], "document")
        print(
            f"split        {split['name']}: leave-one-out (--hold-out last) of {documents}"
            + (f", {count_text(skipped, 'document')} of fewer than 3 tokens skipped" if skipped else "")
        )
    elif split:
        fractions = "/".join(f"{f:g}" for f in split["fractions"])
        # A text split assigns files (an empty one becomes no document), a token split documents.
        unit = "file" if provenance.get("source") == "text" else "document"
        empty = int(provenance.get("empty_files") or 0)
        print(
            f"split        {split['name']}: {count_text(split['documents'], unit)} assigned by a {fractions} split "
            f"(train/validation/test, split seed {split['seed']})"
            + (f"; {count_text(empty, 'empty file')} skipped (no token: no document)" if empty else "")
        )
    if report.get("attributes"):
        _print_attributes(report)
    if report.get("vocabulary"):
        _print_vocabulary(report["vocabulary"])
    if report["has_true_model"]:
        print("true model   kept in the store (truth/)")
    print(f"identity     {identity_line(report['identity'])}")
    for change in report.get("identity_changes", ()):
        print(f"             (computed from the content) does not match the record: {change}")
    print(f"fingerprint  {report['fingerprint']}")


def _size(n_bytes: float) -> str:
    """``812 bytes``, ``10.8 KiB``, ``3.2 MiB``, ``1.5 GiB``: a size in the unit that shows it."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{int(n_bytes):,} bytes"


def _print_attributes(report: dict[str, Any]) -> None:
    """The ``attributes`` line of ``info`` (and of a write): A, per what, the first names, and how many are new."""
    count, shown = report["attributes"], report["attribute_names"]
    per = f"per {report.get('attribute_level', 'row')}"
    names = ", ".join(shown[:10]) + (f", ... ({count - 10} more)" if count > 10 else "")
    added = report.get("attributes_added")
    new = f"; {added} new" if added is not None else ""
    print(f"attributes   {count:,} ({per}{new}): {names}")


def _print_vocabulary(vocabulary: dict[str, Any]) -> None:
    """The vocabulary lines of ``info``: its size, the OOV share here and where it was counted, its top tokens."""
    counted = vocabulary["counted_on"]
    here = (
        f"{vocabulary['oov_share']:.2%} of this store's {vocabulary['tokens']:,} tokens are out of it"
        if vocabulary["oov_share"] is not None
        else "this store's out-of-vocabulary share was not recorded"
    )
    where = (
        f"; {counted['oov_share']:.2%} of the {counted['tokens']:,} tokens it was counted on"
        if counted["oov_share"] is not None
        else ""
    )
    print(f"vocabulary   {vocabulary['size']:,} words + 1 out-of-vocabulary id ({vocabulary['oov_id']}); {here}{where}")
    if vocabulary["top_tokens"]:
        top = ", ".join(
            f"{t['token']!r} {t['share']:.1%}" if t["share"] is not None else repr(t["token"])
            for t in vocabulary["top_tokens"]
        )
        print(f"top tokens   {top}")


def identity_line(identity: dict[str, Any]) -> str:
    """``vocabulary 1a2b3c4d5e6f, embedding table 9f8e7d6c5b4a``: which corpus the ids and queries are of."""
    from dist_respattn.store.identity import short_hash

    if identity.get("vocabulary") is None and identity.get("embeddings") is None:
        return "none (no vocabulary or embedding table: nothing to tell its corpus by)"
    parts = []
    if identity.get("vocabulary") is not None:
        parts.append(f"vocabulary {short_hash(identity['vocabulary'])}")
    parts.append(
        f"embedding table {short_hash(identity['embeddings'])}" if identity.get("embeddings") else "no embedding table"
    )
    return ", ".join(parts)


def _run_validate(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store import StoreLocation, validate

    location = StoreLocation.of(args.store, parse_storage_options(args.storage_option))
    if args.scheduler:  # the partitions are scanned on the cluster's workers, by the engine (its one client user)
        from dist_respattn.engine.validate import scheduler_client, validate_on_cluster

        with (
            scheduler_client(args.scheduler) as client,
            progress_bar(None, "partitions", "scanning", scale=False) as bar,
        ):
            report = validate_on_cluster(
                location, client=client, progress=bar.update, total=lambda n: bar.reset(total=n)
            )
    else:
        with progress_bar(None, "partitions", "scanning", scale=False) as bar:
            report = validate(location, progress=bar.update, total=lambda n: bar.reset(total=n))
    result = report.to_json()
    result["exit_status"] = 0 if report.ok else 1
    result["summary"] = report.summary()
    return result


def _print_validate(report: dict[str, Any]) -> None:
    print(report["summary"])


def _run_repair(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.store.repair import repair_store

    return repair_store(args.store, storage_options=parse_storage_options(args.storage_option)).to_json()


def _print_repair(report: dict[str, Any]) -> None:
    for left in report["removed"]:
        print(f"removed {left} (the staging copy of a killed writer)")
    if report["kind"] == "stream":
        print(f"{report['url']}: complete, {report['rows']:,} rows ({report['tokens']:,} tokens)")
    elif report["kind"] == "triples":
        print(f"{report['url']}: complete, {report['rows']:,} rows")
    else:
        print(f"{report['url']}: no store here")
