"""A repeat gate over each document's whole history, beside the fitted models it gates: test perplexity, every row.

The gate is RepeatNet's repeat/explore split (Ren et al., AAAI 2019): the next token is either one of the tokens
already in its document before it (with probability ``r``) or a new one (``1 - r``), each drawn from the model's own
distribution renormalized over its set:

    p'(t) = r p(t) / p(H)              for t in the history H (the document's tokens before the target)
          = (1 - r) p(t) / (1 - p(H))  otherwise,        p(H) = the sum of p over H's distinct tokens

a proper distribution for any model ``p``, whatever the window it reads. ``r``'s maximum-likelihood value is the
share of targets already in their history, a ratio of counts; here one rate, ``(repeats + 1/2) / (targets + 1)`` over
the training store's documents. This benchmark computes the gate in one process from each model's (n, T)
distributions of the rows ``evaluate`` scores (a token-stream test store, with S = T), and prints each model's test
perplexity with and without it, side by side: a second implementation of the gate, and the gate on any fitted model
without a fit. The head kind (``fit --head repeat``, ``docs/guide/repeat-gate.md``) fits a rate per history length,
counted on held-out rows; under this one rate it scores the same rows alike (``tests/test_benchmarks.py`` checks it).

Run::

    dist-respattn demo      # its stores and models under respattn-demo/
    python benchmarks/bench_repeat_gate.py --train respattn-demo/train.zarr --test respattn-demo/test.zarr \\
        respattn-demo/model/single respattn-demo/model/conj respattn-demo/model/copy respattn-demo/model/stack
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: Rows whose (n, T) distributions are held at a time.
PIECE_ROWS = 512


def repeat_rate(train_url: str) -> dict[str, Any]:
    """The gate's ``r``: the share of the training documents' targets (every token after a document's first) already
    in their document before them, add-half: ``(repeats + 1/2) / (targets + 1)``."""
    from dist_respattn.store import open_store

    store = open_store(train_url)
    starts, ends = store.document_starts(), store.document_ends()
    tokens = store.read_tokens(0, int(ends[-1])) if len(ends) else np.zeros(0, dtype=np.int64)
    repeats = targets = 0
    for begin, end in zip(starts.tolist(), ends.tolist(), strict=True):
        document = tokens[begin:end]
        # A target repeats when its value occurred earlier in the document: not the first occurrence of its value.
        _, first = np.unique(document, return_index=True)
        targets += max(document.size - 1, 0)
        repeats += document.size - first.size
    return {"r": (repeats + 0.5) / (targets + 1.0), "repeats": int(repeats), "targets": int(targets)}


def gated(proba: np.ndarray, seen: np.ndarray, r: float) -> np.ndarray:
    """The gate on one row's distribution ``proba`` (T,), ``seen`` (T,) marking its history's tokens (none: the
    row's distribution as it is, nothing to repeat)."""
    if not seen.any():
        return proba
    p_seen = float(proba[seen].sum())
    return np.where(seen, r * proba / max(p_seen, 1e-300), (1.0 - r) * proba / max(1.0 - p_seen, 1e-300))


def _opened(model_dir: str | Path, test_url: str) -> tuple[Any, Any]:
    """The model of ``model_dir`` and ``test_url`` opened as its fit read its stores (window, shortest history)."""
    from dist_respattn.artifacts import load_checkpoint
    from dist_respattn.store import open_store

    checkpoint = load_checkpoint(model_dir)
    record = checkpoint.meta.get("store") or {}
    store = open_store(test_url, window=record.get("window"), min_context=record.get("min_context"))
    if store.schema.num_symbols != store.schema.num_targets:
        raise ValueError(
            f"{test_url}: S = {store.schema.num_symbols} symbols but T = {store.schema.num_targets} targets: the "
            "gate needs a store whose targets are its tokens (a token-stream store)"
        )
    return checkpoint.model, store


def _pieces(head: Any, store: Any, rows: Any) -> Iterator[tuple[Any, np.ndarray]]:
    """``(piece, distributions (n, T))`` for the rows ``rows`` selects, in store order, ``PIECE_ROWS`` at a time."""
    from dist_respattn.engine.worker_tasks import partition_blocks
    from dist_respattn.model.heads.base import Columns
    from dist_respattn.model.ranking import select_block

    columns = head.columns | Columns(documents=True)
    for part in range(store.num_partitions):
        for block in partition_blocks(store, part, rows, columns):
            for first in range(0, block.num_rows, PIECE_ROWS):
                piece = select_block(block, slice(first, min(first + PIECE_ROWS, block.num_rows)))
                yield piece, np.asarray(head.block_proba(piece), dtype=np.float64)


def repeat_gated(model_dir: str | Path, test_url: str, r: float, k: int) -> dict[str, Any]:
    """The gated model on each test document's last target (the rows ``evaluate --ranking`` ranks), its history the
    document's tokens before it: its perplexity and full ranking at ``k`` (ties pessimistic, as ``evaluate``)."""
    from dist_respattn.engine.worker_tasks import LAST_ROWS
    from dist_respattn.model.ranking import RankingTotals, target_ranks

    head, store = _opened(model_dir, test_url)
    starts, ends = store.document_starts(), store.document_ends()
    logs, ranks, num_targets = [], [], 0
    for piece, proba in _pieces(head, store, LAST_ROWS):
        num_targets = proba.shape[1]
        target = np.asarray(piece.rows.target, dtype=np.int64)
        for i, document in enumerate(np.asarray(piece.documents, dtype=np.int64)):
            history = store.read_tokens(int(starts[document]), int(ends[document]) - 1).astype(np.int64)
            seen = np.zeros(num_targets, dtype=bool)
            seen[history] = True
            row = gated(proba[i], seen, r)
            logs.append(math.log(row[target[i]]))
            ranks.append(int(target_ranks(row[None, :], target[i : i + 1])[0]))
    full = RankingTotals.of(np.asarray(ranks, dtype=np.int64), k, len(ranks) * num_targets).metrics()
    return {"r": r, "rows": len(ranks), "perplexity": math.exp(-float(np.mean(logs))), "full": full}


def every_row(model_dir: str | Path, test_url: str, r: float) -> dict[str, Any]:
    """The model and the gated model on the test rows ``evaluate`` scores (the rows of weight above 0, weighted), a
    row's history its document's tokens before its target (its window at the document's first row, then each earlier
    row's target: the rows of a document follow one another, which is checked). Perplexities of both, the rows
    scored, and the seconds taken."""
    from dist_respattn.engine.worker_tasks import ALL_ROWS

    started = time.perf_counter()
    head, store = _opened(model_dir, test_url)
    plain, gate, weights = [], [], []
    document, seen, previous = -1, np.zeros(0, dtype=bool), -1
    for piece, proba in _pieces(head, store, ALL_ROWS):
        rows, target = piece.rows, np.asarray(piece.rows.target, dtype=np.int64)
        weight = np.ones(target.size) if piece.weights is None else np.asarray(piece.weights, dtype=np.float64)
        for i, doc in enumerate(np.asarray(piece.documents, dtype=np.int64).tolist()):
            window = np.asarray(rows.tokens[rows.begin[i] : rows.end[i]], dtype=np.int64)
            if doc != document:
                seen = np.zeros(proba.shape[1], dtype=bool)
                seen[window] = True
                document = doc
            else:
                if window.size == 0 or window[-1] != previous:
                    raise ValueError(f"{test_url}: row {rows.start + i} does not follow the row before it")
                seen[previous] = True
            if weight[i] > 0.0:  # a row the store holds for its history only (a leave-one-out split's) is not scored
                plain.append(math.log(proba[i, target[i]]))
                gate.append(math.log(gated(proba[i], seen, r)[target[i]]))
                weights.append(weight[i])
            previous = int(target[i])
    w = np.asarray(weights)
    return {
        "rows": len(plain),
        "perplexity": math.exp(-float(np.dot(w, plain) / w.sum())),
        "gated_perplexity": math.exp(-float(np.dot(w, gate) / w.sum())),
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model directories fitted on --train's corpus")
    parser.add_argument("--train", required=True, help="the training store (token stream): r from its documents")
    parser.add_argument("--test", required=True, help="the test store (token stream, the same vocabulary)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    args = parser.parse_args(argv)
    rate = repeat_rate(args.train)
    report: dict[str, Any] = {"train": args.train, "test": args.test, "repeat_rate": rate, "models": []}
    print(f"r = {rate['r']:.4f}: {rate['repeats']:,} of the {rate['targets']:,} training targets repeat an earlier "
          f"token of their document")  # fmt: skip
    print(f"{'model':<40}{'rows':>10}{'perplexity':>12}{'gated':>10}{'gated / plain':>15}")
    for model in args.models:
        figures = {"model": model, **every_row(model, args.test, rate["r"])}
        report["models"].append(figures)
        ratio = figures["gated_perplexity"] / figures["perplexity"]
        print(f"{model:<40}{figures['rows']:>10,}{figures['perplexity']:>12.3f}{figures['gated_perplexity']:>10.3f}"
              f"{ratio:>15.3f}")  # fmt: skip
    if args.json:
        print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
