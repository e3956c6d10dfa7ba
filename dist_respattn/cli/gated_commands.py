"""The attribute-gated head on the command line: ``fit --attribute-factors``, ``evaluate`` of a gated model,
``sample`` and ``neighbours``."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from dist_respattn.cli.common import CommandError, embedding_table, fit_ended, parse_storage_options, positive_int

__all__ = ["add_fit_options", "register", "run_gated_evaluate", "run_gated_fit"]


def add_fit_options(parser: argparse.ArgumentParser) -> None:
    """``fit``'s options for an attribute-gated head."""
    group = parser.add_argument_group(
        "attribute-gated head (the store's rows carry attributes: ingest --attribute-by / --attributes)",
        "--max-iter, --tol, --patience and --min-improvement, when given, stop both stages; the gated stage's own "
        "defaults are 30 iterations, a tolerance of 1e-6, a patience of 2 and a minimum improvement of 1e-4 "
        "(it starts from a fitted head, so it needs fewer iterations)",
    )
    group.add_argument(
        "--attribute-factors",
        type=int,
        metavar="F",
        help="fit the shared head (into MODEL_DIR/shared), then a head whose emission each attribute mixes from F "
        "shared factor tables; 0: one emission per attribute (the untied baseline)",
    )
    group.add_argument(
        "--per-attribute",
        action="append",
        choices=("position_prior", "emission"),
        default=None,
        help="position_prior: one per attribute instead of shared; emission: each attribute's own table beside "
        "the F shared factors, its share learned (repeatable)",
    )
    group.add_argument(
        "--attribute-prior-scale",
        type=float,
        metavar="KAPPA",
        help="the factors' prior: centred on the shared emission with KAPPA times the shared fit's strengths "
        "(default: KAPPA chosen on the held-out rows every iteration)",
    )
    group.add_argument(
        "--attribute-smoothing",
        type=float,
        metavar="BETA",
        help="Dirichlet pseudo-count spread over each attribute's F weights (default 1)",
    )


def _gated_settings(args: argparse.Namespace, fit_settings: Any, saved: dict[str, Any] | None) -> Any:
    """The gated fit's settings: a resumed fit's own (``saved``) or the defaults, then the options given."""
    from dist_respattn.engine.gated_fit import GatedSettings

    given: dict[str, Any] = dict(saved or {"fan_in": fit_settings.fan_in})
    given["attribute_factors"] = args.attribute_factors
    if args.per_attribute is not None or saved is None:
        given["per_attribute"] = tuple(args.per_attribute or ())
    for name in ("max_iter", "tol", "patience", "min_improvement", "seed"):
        if getattr(args, name, None) is not None:
            given[name] = getattr(args, name)
    if args.attribute_smoothing is not None:
        given["weight_strength"] = args.attribute_smoothing
    if args.attribute_prior_scale is not None:
        given["prior_scale"] = args.attribute_prior_scale
    given["per_attribute"] = tuple(given.get("per_attribute") or ())
    try:
        return GatedSettings(**given)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        for name, flag in (
            ("attribute_factors", "--attribute-factors"),
            ("per_attribute", "--per-attribute"),
            ("weight_strength", "--attribute-smoothing"),
            ("prior_scale", "--attribute-prior-scale"),
            ("max_iter", "--max-iter"),
        ):
            message = message.replace(name, flag)
        raise CommandError(message) from exc


def run_gated_fit(args: argparse.Namespace, settings: Any, say: Any, cluster: Any) -> dict[str, Any]:
    """The shared fit into ``MODEL_DIR/shared``, then the gated fit into ``MODEL_DIR``, on one cluster."""
    from dist_respattn.artifacts.gated_checkpoints import SHARED_DIR, is_gated_dir, load_gated
    from dist_respattn.engine import connect, fit, open_store
    from dist_respattn.engine.gated_fit import factor_advice, fit_gated
    from dist_respattn.engine.gated_tasks import attribute_names_of

    # A resumed gated fit keeps its settings and the shared head it started from (a finished shared fit is not
    # continued: more --max-iter would move the gated fit's prior under it).
    resuming = bool(args.resume) and is_gated_dir(args.model_dir)
    saved = load_gated(args.model_dir, "latest").meta.get("settings") if resuming else None
    gated = _gated_settings(args, settings, saved)
    options = parse_storage_options(args.storage_option)
    store = open_store(args.store, storage_options=options, window=settings.context_length)
    names = attribute_names_of(store)  # a store without attributes is refused before any fit
    advice = factor_advice(gated, len(names))
    if advice is not None and not resuming:  # said before the shared fit, so it can be stopped and run again
        say(advice)
    shared_dir = os.path.join(args.model_dir, SHARED_DIR)
    progress = None if not args.json else False
    with connect(cluster, say=say) as client:
        if not resuming:
            fit(
                store, model_dir=shared_dir, settings=settings, validation=args.validation,
                init_from=args.init_from, resume=args.resume, overwrite=args.overwrite, client=client,
                storage_options=options, say=say, progress=progress, verbose=args.verbose,
            )  # fmt: skip
        result = fit_gated(
            store, model_dir=args.model_dir, settings=gated, shared_dir=shared_dir, resume=args.resume,
            overwrite=args.overwrite, client=client, storage_options=options, say=say, progress=progress,
            verbose=args.verbose,
        )  # fmt: skip
    best: dict[str, Any] = next((h for h in result.history if h["iteration"] == result.best_iteration), {})
    return {
        "model_dir": result.model_dir,
        "kind": "gated",
        "state": str(result.state),
        "iterations": result.iterations,
        "best_iteration": result.best_iteration,
        "heldout_perplexity": best.get("heldout_perplexity"),
        "shared": _shared_summary(shared_dir),
        "factors": result.head.num_factors,
        "untied": gated.untied,
        "attributes": len(result.attribute_names),
        "parameters": result.head.num_parameters(),
        "settings": gated.to_json(),
        "history": result.history,
        "seconds": round(result.seconds, 3),
    }


def _shared_summary(shared_dir: str) -> dict[str, Any]:
    """The shared head's fit as its checkpoints record it: state, iterations, the best held-out perplexity."""
    from dist_respattn.engine import load_checkpoint

    latest, best = load_checkpoint(shared_dir, "latest"), load_checkpoint(shared_dir)
    history = latest.meta.get("history") or []
    chosen: Any = next((h for h in history if h.get("iteration") == best.iteration), {})
    return {
        "model_dir": shared_dir,
        "state": str(latest.meta.get("state")),
        "iterations": len(history),
        "best_iteration": best.iteration,
        "heldout_perplexity": (chosen.get("heldout") or {}).get("perplexity"),
    }


def print_gated_fit(report: dict[str, Any]) -> None:
    kind = "one emission per attribute" if report["untied"] else f"{report['factors']} tables"
    shared = report["shared"]
    print(f"shared head: {fit_ended(shared['state'], shared['iterations'])} ({shared['model_dir']})")
    print(
        f"gated head ({kind}, {report['attributes']} attributes, {report['parameters']:,} parameters): "
        f"{fit_ended(report['state'], report['iterations'])} in {report['seconds']:.1f} s"
    )
    if report["heldout_perplexity"] is not None and shared["heldout_perplexity"] is not None:
        ratio = report["heldout_perplexity"] / shared["heldout_perplexity"]
        print(
            f"held-out perplexity: gated {report['heldout_perplexity']:.3f} (iteration {report['best_iteration']}), "
            f"shared {shared['heldout_perplexity']:.3f}, ratio {ratio:.3f}"
        )
    best = report["best_iteration"]
    kept = f", the best iteration's head (iteration {best}, by held-out perplexity)" if best is not None else ""
    print(f"model: {report['model_dir']}{kept}")


def run_gated_evaluate(args: argparse.Namespace, say: Any, cluster: Any) -> dict[str, Any]:
    from dist_respattn.engine.gated_evaluate import evaluate_gated

    return evaluate_gated(
        args.model, args.store, classify=args.classify_attributes, fold_in=args.fold_in,
        fold_in_iterations=args.fold_in_iterations, cluster=cluster,
        storage_options=parse_storage_options(args.storage_option), say=say,
        progress=None if not args.json else False,
    )  # fmt: skip


def print_gated_evaluate(report: dict[str, Any]) -> None:
    shared = report["shared"]
    kn = shared["baselines"].get("kneser_ney", {}).get("perplexity")
    print(f"{report['store']}: {report['model']['rows']:,.0f} rows of known attributes")
    model = report["model"]
    print(
        f"perplexity: gated {model['perplexity']:.3f}, shared {model['perplexity_shared_same_rows']:.3f}"
        + (f", Kneser-Ney bigram {kn:.3f} (all rows)" if kn else "")
    )
    print(f"{'attribute':<28} {'rows':>9} {'gated':>9} {'shared':>9} {'KN (own)':>9}")
    for name, row in report["by_attribute"].items():

        def cell(value: Any) -> str:
            return f"{value:>9.2f}" if value is not None else f"{'-':>9}"

        print(
            f"{name[:28]:<28} {row['rows']:>9,.0f} {cell(row['perplexity'])} {cell(row['perplexity_shared'])} "
            f"{cell(row['perplexity_kneser_ney'])}"
        )
    if "attribute_accuracy" in report:
        accuracy = report["attribute_accuracy"]
        shown = "n/a" if accuracy is None else f"{accuracy:.1%}"
        print(f"attribute classification: {shown} of {report['classified_documents']:,} documents")
    for name, row in (report.get("fold_in") or {}).items():
        print(
            f"folded in {name}: perplexity {row['perplexity']:.3f} (uniform weights "
            f"{row['perplexity_uniform_weights']:.3f}, shared {row['perplexity_shared']:.3f}) on "
            f"{row['rows_scored']:,.0f} held rows"
        )


# ------------------------------------------------------------------------------------------ sample / neighbours


def _model_and_store(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The gated checkpoint, and the store that gives its vocabulary and embeddings (``--store``, else the one it
    was fitted on)."""
    from dist_respattn.artifacts.gated_checkpoints import load_gated

    checkpoint = load_gated(args.model)
    url = args.store or (checkpoint.meta.get("store") or {}).get("url")
    if not url:
        raise CommandError(f"{args.model}: no training store recorded: give --store STORE (its vocabulary)")
    from dist_respattn.store import open_store

    store = open_store(url, storage_options=parse_storage_options(getattr(args, "storage_option", None)))
    return checkpoint, store, store.vocabulary()


def _attribute_id(checkpoint: Any, name: str) -> int:
    names = checkpoint.attribute_names
    if name not in names:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise CommandError(f"--attribute {name!r}: the model has no such attribute (it has {shown})")
    return names.index(name)


def _mix(checkpoint: Any, args: argparse.Namespace) -> dict[int, float]:
    if args.mix:
        mix: dict[int, float] = {}
        for part in args.mix.split(","):
            name, _, share = part.rpartition("=")
            try:
                value = float(share)
            except ValueError:
                raise CommandError(f"--mix {args.mix!r}: expected NAME=SHARE,NAME=SHARE (shares > 0)") from None
            if not name or value <= 0:
                raise CommandError(f"--mix {args.mix!r}: expected NAME=SHARE,NAME=SHARE (shares > 0)")
            mix[_attribute_id(checkpoint, name)] = mix.get(_attribute_id(checkpoint, name), 0.0) + value
        return mix
    if not args.attribute:
        raise CommandError("sample needs --attribute NAME or --mix NAME=SHARE,NAME=SHARE")
    return {_attribute_id(checkpoint, args.attribute): 1.0}


def _sample_head(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[int, float] | None, list[str]]:
    """``(head, store, vocabulary, mix, attribute names)`` of ``sample``: a gated model's head of ``--attribute`` or
    ``--mix``, or a plain model's head (``mix`` ``None``; neither flag is taken)."""
    from dist_respattn.artifacts import load_checkpoint
    from dist_respattn.artifacts.gated_checkpoints import is_gated_dir
    from dist_respattn.model.heads.gated.use import mixed_head
    from dist_respattn.store import check_recorded_corpus
    from dist_respattn.store.rows import open_store

    if is_gated_dir(args.model):
        checkpoint, store, vocabulary = _model_and_store(args)
        mix = _mix(checkpoint, args)
        return mixed_head(checkpoint.head, mix), store, vocabulary, mix, list(checkpoint.attribute_names)
    storage_options = parse_storage_options(getattr(args, "storage_option", None))
    plain = load_checkpoint(args.model, storage_options=storage_options)
    for flag, value in (("--attribute", args.attribute), ("--mix", args.mix)):
        if value:
            raise CommandError(
                f"{flag} {value}: {args.model} is a plain head, without attributes (they take a model fitted with "
                "--attribute-factors): leave it out"
            )
    recorded = plain.meta.get("store") or {}
    url = args.store or recorded.get("url")
    if not url:
        raise CommandError(f"{args.model}: no training store recorded: give --store STORE (its vocabulary)")
    store = open_store(url, storage_options=storage_options)
    if args.store:
        check_recorded_corpus(
            recorded, store, reference_role="the model's training store", other_role=f"--store {args.store}"
        )
    return plain.model, store, store.vocabulary(), None, []


def _run_sample(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.model.streaming import generate
    from dist_respattn.store.ingest.text import tokenize
    from dist_respattn.store.predictions import target_words

    model, store, vocabulary, mix, names = _sample_head(args)
    if model.num_targets != model.num_symbols:  # each drawn target is fed back as the next symbol
        raise CommandError(
            f"{args.model}: sample needs a head fitted on a token stream (T = S); this head has "
            f"S = {model.num_symbols}, T = {model.num_targets}"
        )
    table = embedding_table(store, model, needed_by="sample", fix="give --store the store the head was fitted on")
    words = list(target_words(vocabulary, model.num_targets) or ())
    n_pos = model.context_length
    rng = np.random.default_rng(args.seed)
    if args.prompt:
        if not words:
            raise CommandError(f"{store.location}: no vocabulary, so a --prompt cannot be read")
        known = list((vocabulary or {}).get("tokens", []))
        lookup = {w: i for i, w in enumerate(known)}
        oov = int((vocabulary or {}).get("oov_id", len(known)))
        prompt = np.array([lookup.get(w, oov) for w in tokenize(args.prompt)], dtype=np.int64)
        if prompt.shape[0] == 0:
            raise CommandError(f"--prompt {args.prompt!r} holds no token: give some text to start from")
    else:  # a document of the mix's first attribute, for a gated head
        prompt = _opening(store, n_pos, rng, attribute=None if mix is None else names[next(iter(mix))])
    tokens = generate(model, table, prompt, args.tokens, rng)

    def word(t: int) -> str:
        return words[t] if words else str(t)

    report: dict[str, Any] = {
        "attribute": args.attribute,
        "mix": None if mix is None else {names[a]: share for a, share in mix.items()},
        "seed": args.seed,
        "prompt": [word(int(t)) for t in prompt[-n_pos:]],
        "tokens": [word(int(t)) for t in tokens],
        "ids": [int(t) for t in tokens],
        "text": " ".join(word(int(t)) for t in tokens),
    }
    return report


def _opening(store: Any, n_pos: int, rng: Any, *, attribute: str | None = None) -> np.ndarray:
    """A prompt from the store, seeded: the first N tokens of a document of a token-stream store (fewer for a
    shorter one: generation pads a short prompt), of ``attribute``'s documents when given; or, without
    ``attribute``, the window of a row of a triple store."""
    of = "" if attribute is None else f" of {attribute!r}"
    if getattr(store, "kind", None) != "stream":
        if attribute is not None:
            raise CommandError(f"{store.location}: no document{of} to open with: give --prompt TEXT")
        if store.num_rows == 0:
            raise CommandError(f"{store.location}: holds no rows to open with: give --prompt TEXT")
        row = int(rng.integers(store.num_rows))
        return np.asarray(store.read_rows(row, row + 1).context[0], dtype=np.int64)
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
    return np.asarray(store.read_tokens(first, min(first + n_pos, int(ends[d]))), dtype=np.int64)


def _print_sample(report: dict[str, Any]) -> None:
    if report["mix"] is not None:
        shares = ", ".join(f"{k} {v:g}" for k, v in report["mix"].items())
        print(f"[{shares}] {' '.join(report['prompt'])} ...")
    else:
        print(f"{' '.join(report['prompt'])} ...")
    print(report["text"])


def _run_neighbours(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.model.heads.gated.use import emission_neighbours

    checkpoint, _, vocabulary = _model_and_store(args)
    words = list((vocabulary or {}).get("tokens", []))
    if words:
        if args.word not in words:
            raise CommandError(f"{args.word!r} is not in the model's vocabulary of {len(words):,} words")
        symbol = words.index(args.word)
    else:
        try:
            symbol = int(args.word)
        except ValueError:
            raise CommandError(f"{args.word!r}: the store has no vocabulary, so give a symbol id") from None
    attributes = [args.attribute] if args.attribute else list(checkpoint.attribute_names)
    out = {}
    for name in attributes:
        a = _attribute_id(checkpoint, name)
        ids, distances = emission_neighbours(checkpoint.head.emission_of(a), symbol, args.top)
        out[name] = [
            [words[int(i)] if words else int(i), round(float(d), 6)] for i, d in zip(ids, distances, strict=True)
        ]
    return {"word": args.word, "distance": "hellinger", "neighbours": out}


def _print_neighbours(report: dict[str, Any]) -> None:
    print(f"nearest to {report['word']!r} by the Hellinger distance between emission rows B_a[s, :]:")
    for name, items in report["neighbours"].items():
        print(f"  {name}: " + ", ".join(f"{w} ({d:.3f})" for w, d in items))


def register(sub: Any) -> None:
    """Add the ``sample`` and ``neighbours`` subcommands."""
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
    sample.add_argument("--attribute", metavar="NAME", help="a gated head: the attribute to write as")
    sample.add_argument(
        "--mix", metavar="NAME=SHARE,...", help="a gated head: a mix of attributes instead, e.g. a=0.5,b=0.5"
    )
    sample.add_argument("--tokens", type=positive_int, default=200, help="tokens to generate (200)")
    sample.add_argument("--seed", type=int, default=0, help="the draws' seed (0): the same seed, the same text")
    sample.add_argument(
        "--prompt",
        metavar="TEXT",
        help="text to start from, any length from one token (default: the opening of one of the store's documents, "
        "of the attribute for a gated head)",
    )
    sample.add_argument("--store", metavar="STORE", help="the store of the vocabulary and embeddings")
    sample.add_argument("--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option (repeatable)")
    sample.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    sample.set_defaults(handler=_run_sample, printer=_print_sample)

    neighbours = sub.add_parser(
        "neighbours",
        help="the words whose emission rows are closest to a word's under an attribute",
        description=(
            "List the words s whose emission rows B_a[s, :] (what follows them, under attribute a) are closest to "
            "WORD's, by the Hellinger distance sqrt(1 - sum_t sqrt(p_t q_t)); every attribute without --attribute."
        ),
    )
    neighbours.add_argument("model", help="a gated model directory (fit --attribute-factors)")
    neighbours.add_argument("word", help="a word of the vocabulary (or a symbol id)")
    neighbours.add_argument("--attribute", metavar="NAME", help="the attribute (default: each in turn)")
    neighbours.add_argument("--top", type=positive_int, default=10, help="neighbours listed (10)")
    neighbours.add_argument("--store", metavar="STORE", help="the store of the vocabulary")
    neighbours.add_argument("--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option")
    neighbours.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    neighbours.set_defaults(handler=_run_neighbours, printer=_print_neighbours)
