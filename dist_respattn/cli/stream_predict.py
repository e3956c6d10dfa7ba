"""``dist-respattn predict MODEL STORE --stream``: next-token predictions over one history read from stdin.

The history is read as it comes (words tokenized as the store's text was, or token ids when the store has no
vocabulary); after every token one JSON line gives the K most probable next tokens::

    {"position": 3, "token": "def", "top": [["self", 0.31], ["__init__", 0.12]], "ids": [57, 203]}

``top`` pairs each next token (its word, or its id without a vocabulary) with its probability; ``ids`` are the
same tokens' ids. The model keeps its bucket histograms (:class:`~dist_respattn.model.streaming.Predictor`), so a
token costs the same after a hundred tokens as after a million. No cluster is started. The summary reports the
start-up (loading the model and the store, the compiled kernels' first call) apart from the time per token.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from dist_respattn.cli.common import CommandError, embedding_table, parse_storage_options

__all__ = ["run_stream"]


def _token_ids(stream: IO[str], vocabulary: dict[str, Any] | None, num_symbols: int) -> Iterator[tuple[str, int]]:
    """``(as given, id)`` for every token of ``stream``, line by line."""
    if vocabulary is None:
        for number, line in enumerate(stream, 1):
            for text in line.split():
                try:
                    value = int(text)
                except ValueError:
                    raise CommandError(
                        f"stdin line {number}: {text!r} is not a token id (the store has no vocabulary: give ids in "
                        f"[0, {num_symbols}) separated by spaces)"
                    ) from None
                if not 0 <= value < num_symbols:
                    raise CommandError(f"stdin line {number}: token id {value}: expected an id in [0, {num_symbols})")
                yield text, value
        return
    from dist_respattn.store.ingest.text import tokenize

    lookup = {token: i for i, token in enumerate(vocabulary.get("tokens", []))}
    oov = int(vocabulary.get("oov_id", len(lookup)))
    for line in stream:
        for word in tokenize(line):
            yield word, lookup.get(word, oov)


def run_stream(args: argparse.Namespace, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> dict:
    """Predict after every token of stdin; returns the summary (start-up seconds, tokens, seconds and microseconds
    per token after the start-up)."""
    begun = time.perf_counter()
    from dist_respattn.artifacts import load_checkpoint
    from dist_respattn.cli.head_options import head_options, refuse_other_kinds_options
    from dist_respattn.store import check_model_corpus, open_store
    from dist_respattn.store.predictions import target_words

    if stdin is None:
        stdin = sys.stdin
        if isinstance(stdin, io.TextIOWrapper):
            # As ingest reads text: UTF-8, a byte that is not as U+FFFD (the locale's codec could refuse it with a
            # traceback, or pass it on as a lone surrogate that no JSON reader takes).
            stdin.reconfigure(encoding="utf-8", errors="replace")
    stdout = stdout or sys.stdout
    storage_options = parse_storage_options(args.storage_option)
    checkpoint = load_checkpoint(args.model, storage_options=storage_options)
    model = checkpoint.model
    refuse_other_kinds_options(args, "predict", model, args.model)
    store = open_store(args.store, storage_options=storage_options)
    check_model_corpus(checkpoint.meta.get("store"), store)
    table = embedding_table(
        store, model, needed_by="--stream", fix="give the store the model was fitted on, or one made --like it"
    )
    vocabulary = store.vocabulary()
    words = target_words(vocabulary, model.num_targets)
    options = head_options(args, "predict")
    try:
        # The compiled kernels' first call (loaded from numba's cache, or compiled) is start-up, not a token's cost.
        warm = model.predictor(query_table=table, options=options)
        warm.push(0)
        warm.top_k(args.top)
        predictor = model.predictor(words=words, query_table=table, options=options)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    startup = time.perf_counter() - begun
    if stdin.isatty() and not args.json:  # a person at a terminal, not a pipe: say what the command waits for
        what = "words, as the store's text was tokenized" if vocabulary is not None else "token ids"
        print(
            f"ready: type {what}, one or more a line; the top {args.top} next tokens follow each; Ctrl-D ends",
            file=sys.stderr,
            flush=True,
        )

    def name(target: int) -> str | int:
        return target if words is None else words[target]

    count = 0
    spent = 0.0
    for text, token in _token_ids(stdin, vocabulary, model.num_symbols):
        started = time.perf_counter()
        predictor.push(token)
        targets, probs = predictor.top_k(args.top)
        spent += time.perf_counter() - started
        count += 1
        line = {
            "position": count,
            "token": text if words is not None else token,
            "top": [[name(int(t)), round(float(p), 8)] for t, p in zip(targets, probs, strict=True)],
            "ids": [int(t) for t in targets],
        }
        try:
            stdout.write(json.dumps(line) + "\n")
            stdout.flush()
        except BrokenPipeError:  # the reader (e.g. `| head`) left: what it took was all it wanted
            if stdout is sys.stdout:  # so that Python's own flush at exit does not fail on it again
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            break
    return {
        "command": "predict --stream",
        "startup_seconds": round(startup, 6),
        "tokens": count,
        "seconds": round(spent, 6),
        "microseconds_per_token": round(1e6 * spent / count, 2) if count else None,
        "state_counts": predictor.state_size,
        "window": int(model.context_length),
        "buckets": list(getattr(getattr(predictor, "buckets", None), "sizes", ())),
    }


def print_stream_summary(report: dict[str, Any]) -> None:
    """The summary goes to stderr: stdout holds the predictions, one JSON line a token."""
    per_token = report["microseconds_per_token"]
    timing = f", {per_token:.1f} µs a token" if per_token is not None else ""
    startup = report.get("startup_seconds")
    ready = f"ready in {startup:.2f} s (loading the model and the store); " if startup is not None else ""
    print(
        f"{ready}predicted after {report['tokens']:,} tokens{timing}; the history is held as "
        f"{report['state_counts']:,} counts"
        + (f" in {len(report['buckets'])} recency buckets" if report["buckets"] else "")
        + f", within the model's window of {report['window']:,} tokens, whatever its length",
        file=sys.stderr,
    )
