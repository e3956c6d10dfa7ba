"""``dist-respattn sample`` and ``neighbours``: generating text from a head of any kind, and the words whose emission
rows are alike. A kind's own options (an attribute-gated head's ``--attribute``, ``--mix``) reach its predictor and
its emission tables by name."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from dist_respattn.cli.common import CommandError, embedding_table, parse_storage_options, positive_int, seed
from dist_respattn.cli.head_options import add_head_options, head_options, refuse_other_kinds_options

__all__ = ["COMMANDS", "OPENING_TOKENS"]

#: The tokens ``sample`` opens with when no ``--prompt`` is given: the start of a document, no more than this (a
#: repeat gate's window of N = 100,000 would otherwise print a whole file as the opening), nor more than N.
OPENING_TOKENS = 16


def _model_and_store(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model's checkpoint, and the store that gives its vocabulary and embeddings (``--store``, checked to be
    of the model's corpus, else the one it was fitted on)."""
    from dist_respattn.artifacts import load_checkpoint
    from dist_respattn.store import check_model_corpus, open_store

    storage_options = parse_storage_options(getattr(args, "storage_option", None))
    checkpoint = load_checkpoint(args.model, storage_options=storage_options)
    recorded = checkpoint.meta.get("store") or {}
    url = args.store or recorded.get("url")
    if not url:
        raise CommandError(f"{args.model}: no training store recorded: give --store STORE (its vocabulary)")
    store = open_store(url, storage_options=storage_options)
    model_symbols, store_symbols = checkpoint.model.num_symbols, store.schema.num_symbols
    if store_symbols != model_symbols:  # its words and embeddings would be read at the model's ids
        given = f"--store {args.store}" if args.store else f"{url} (the model's training store)"
        raise CommandError(
            f"{given}: S = {store_symbols:,} symbols, the model's is S = {model_symbols:,}: give --store the store "
            "the model was fitted on (or one written from it with ingest --like)"
        )
    if args.store:
        check_model_corpus(recorded, store)
    return checkpoint, store


def _run_sample(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.model.streaming import generate
    from dist_respattn.store.ingest.text import tokenize
    from dist_respattn.store.predictions import target_words

    checkpoint, store = _model_and_store(args)
    model, vocabulary = checkpoint.model, store.vocabulary()
    refuse_other_kinds_options(args, "sample", model, args.model)
    if model.num_targets != model.num_symbols:  # each drawn target is fed back as the next symbol
        raise CommandError(
            f"{args.model}: sample needs a head fitted on a token stream (T = S); this head has "
            f"S = {model.num_symbols}, T = {model.num_targets}"
        )
    table = embedding_table(store, model, needed_by="sample", fix="give --store the store the head was fitted on")
    options = head_options(args, "sample")
    try:
        predictor = model.predictor(query_table=table, options=options)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    words = list(target_words(vocabulary, model.num_targets) or ())
    n_pos = model.context_length
    rng = np.random.default_rng(args.seed)
    if args.prompt is not None:  # an empty one too (`--prompt "$TEXT"` with TEXT unset): it holds no token
        if not words:
            raise CommandError(f"{store.location}: no vocabulary, so a --prompt cannot be read")
        known = list((vocabulary or {}).get("tokens", []))
        lookup = {w: i for i, w in enumerate(known)}
        oov = int((vocabulary or {}).get("oov_id", len(known)))
        prompt = np.array([lookup.get(w, oov) for w in tokenize(args.prompt)], dtype=np.int64)
        if prompt.shape[0] == 0:
            raise CommandError(f"--prompt {args.prompt!r} holds no token: give some text to start from")
    else:  # a document of the predictor's attribute (the first of a mix), for a head that reads one
        opening = min(n_pos, OPENING_TOKENS)
        prompt = _opening(store, opening, rng, attribute=getattr(predictor, "opening_attribute", None))
    tokens = generate(model, table, prompt, args.tokens, rng, options=options)

    def word(t: int) -> str:
        return words[t] if words else str(t)

    return {
        **{name: value for name, value in options.items()},
        # What the predictor writes as (a gated head's attributes and their shares), when it says.
        "mix": getattr(predictor, "mix_shares", None),
        "seed": args.seed,
        "prompt": [word(int(t)) for t in prompt[-n_pos:]],
        "tokens": [word(int(t)) for t in tokens],
        "ids": [int(t) for t in tokens],
        "text": " ".join(word(int(t)) for t in tokens),
    }


def _opening(store: Any, n_tokens: int, rng: Any, *, attribute: str | None = None) -> np.ndarray:
    """A prompt from the store, seeded: the first ``n_tokens`` tokens of a document of a token-stream store (fewer
    for a shorter one: generation pads a short prompt), of ``attribute``'s documents when given; or, without
    ``attribute``, the last ``n_tokens`` tokens of the window of a row of a triple store."""
    of = "" if attribute is None else f" of {attribute!r}"
    if getattr(store, "kind", None) != "stream":
        if attribute is not None:
            raise CommandError(f"{store.location}: no document{of} to open with: give --prompt TEXT")
        if store.num_rows == 0:
            raise CommandError(f"{store.location}: holds no rows to open with: give --prompt TEXT")
        row = int(rng.integers(store.num_rows))
        return np.asarray(store.read_rows(row, row + 1).context[0][-n_tokens:], dtype=np.int64)
    starts = store.document_starts()
    ends = np.append(starts[1:], store.num_tokens)
    wanted = ends > starts
    if attribute is not None:
        names = tuple(store.attribute_names or ())
        ids = store.document_attributes()
        if ids is None or attribute not in names:
            raise CommandError(f"{store.location}: no document{of} to open with: give --prompt TEXT")
        wanted &= ids == names.index(attribute)
    documents = np.flatnonzero(wanted)
    if documents.size == 0:
        raise CommandError(f"{store.location}: no document{of} holds a token to open with: give --prompt TEXT")
    d = int(rng.choice(documents))
    first = int(starts[d])
    return np.asarray(store.read_tokens(first, min(first + n_tokens, int(ends[d]))), dtype=np.int64)


def _print_sample(report: dict[str, Any]) -> None:
    if report["mix"] is not None:
        shares = ", ".join(f"{k} {v:g}" for k, v in report["mix"].items())
        print(f"[{shares}] {' '.join(report['prompt'])} ...")
    else:
        print(f"{' '.join(report['prompt'])} ...")
    print(report["text"])


def _run_neighbours(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.model.emission.neighbours import emission_neighbours
    from dist_respattn.store.predictions import target_words

    checkpoint, store = _model_and_store(args)
    refuse_other_kinds_options(args, "neighbours", checkpoint.model, args.model)
    vocabulary = store.vocabulary()
    known = list((vocabulary or {}).get("tokens", []))
    # Every symbol's word, the out-of-vocabulary id's included (it may be a neighbour like any other).
    words = list(target_words(vocabulary, checkpoint.model.num_symbols) or ()) if known else []
    if words:
        if args.word not in known:
            raise CommandError(f"{args.word!r} is not in the model's vocabulary of {len(known):,} words")
        symbol = known.index(args.word)
    else:
        try:
            symbol = int(args.word)
        except ValueError:
            raise CommandError(f"{args.word!r}: the store has no vocabulary, so give a symbol id") from None
    if not 0 <= symbol < checkpoint.model.num_symbols:
        raise CommandError(f"{args.word!r}: expected a symbol id in [0, {checkpoint.model.num_symbols})")
    try:
        tables = checkpoint.model.emissions(head_options(args, "neighbours"))
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if not tables:
        raise CommandError(f"{args.model}: a {checkpoint.model.kind} head has no emission rows to compare")
    out = {}
    for name, emission in tables:
        ids, distances = emission_neighbours(emission, symbol, args.top)
        out[name] = [
            [words[int(i)] if words else int(i), round(float(d), 6)]
            for i, d in zip(ids, distances, strict=True)
            if np.isfinite(d)
        ]
    return {"word": args.word, "distance": "hellinger", "kind": checkpoint.model.kind, "neighbours": out}


def _print_neighbours(report: dict[str, Any]) -> None:
    rows = "B_a[s, :]" if report.get("kind") == "gated" else "B[s, :]"  # an attribute's table, or the head's
    print(f"nearest to {report['word']!r} by the Hellinger distance between emission rows {rows}:")
    for name, items in report["neighbours"].items():
        print(f"  {name}: " + ", ".join(f"{w} ({d:.3f})" for w, d in items))


def _add_sample(sub: Any) -> None:
    """Add the ``sample`` subcommand."""
    sample = sub.add_parser(
        "sample",
        help="generate text token by token from a fitted head (an attribute-gated one as one attribute or a mix)",
        description=(
            "Generate tokens one at a time from a head fitted on a token stream (T = S): each is drawn from "
            "p(t | last N tokens, query = the last token's embedding), then appended to the history, whose bucket "
            "histograms are updated in O(K) a token. A prompt shorter than N tokens is a short history, read as a "
            "stream store reads a document's first rows (the missing positions masked). A gated head writes as "
            "--attribute (or under --mix's weights). The vocabulary and embeddings come from the model's training "
            "store (or --store). The same --seed gives the same text."
        ),
    )
    sample.add_argument(
        "model", help="a model directory (plain or attribute-gated), or a registry's version: REGISTRY@7"
    )
    sample.add_argument("--tokens", type=positive_int, default=200, help="tokens to generate (200)")
    sample.add_argument("--seed", type=seed, default=0, help="the draws' seed (0): the same seed, the same text")
    sample.add_argument(
        "--prompt",
        metavar="TEXT",
        help=f"text to start from, any length from one token (default: the first {OPENING_TOKENS} tokens, at most "
        "N, of one of the store's documents chosen by --seed, of the attribute for a gated head)",
    )
    sample.add_argument("--store", metavar="STORE", help="the store of the vocabulary and embeddings")
    sample.add_argument("--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option (repeatable)")
    add_head_options(sample, "sample")
    sample.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    sample.set_defaults(handler=_run_sample, printer=_print_sample)


def _add_neighbours(sub: Any) -> None:
    """Add the ``neighbours`` subcommand."""
    neighbours = sub.add_parser(
        "neighbours",
        help="the words whose emission rows are closest to a word's (under an attribute, for a gated head)",
        description=(
            "List the words s whose emission rows B[s, :] (what follows them) are closest to WORD's, by the "
            "Hellinger distance sqrt(1 - sum_t sqrt(p_t q_t)): the head's emission, or for an attribute-gated head "
            "each attribute's B_a (every attribute without --attribute)."
        ),
    )
    neighbours.add_argument("model", help="a model directory, or a registry's version: REGISTRY@7")
    neighbours.add_argument("word", help="a word of the vocabulary (or a symbol id)")
    neighbours.add_argument("--top", type=positive_int, default=10, help="neighbours listed (10)")
    neighbours.add_argument("--store", metavar="STORE", help="the store of the vocabulary")
    neighbours.add_argument("--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option")
    add_head_options(neighbours, "neighbours")
    neighbours.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    neighbours.set_defaults(handler=_run_neighbours, printer=_print_neighbours)


#: Each subcommand this module adds, by name, with the function that adds it to a subparsers action
#: (``build_parser`` adds only the one a command line names).
COMMANDS: dict[str, Callable[[Any], None]] = {"sample": _add_sample, "neighbours": _add_neighbours}
