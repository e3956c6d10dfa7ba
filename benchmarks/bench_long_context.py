"""Long contexts on real item sequences: the histogram E-step against the per-position one, streaming prediction
latency, and held-out quality of long windows with a bucketed position prior.

Corpus (``--sequences``):

- ``movielens`` (the default): the MovieLens ratings of ``benchmarks/corpora.py`` (one user a document, items
  in time order), split as ``bench_quality.py`` splits them (users to train / validation / test by
  ``assign_split`` of their index, fractions 0.8 / 0.1 / 0.1, split seed 0; the vocabulary is the ``--items``
  most rated train items and one "other" id, S = T = items + 1). Fetched into ``--cache`` on first use.
- ``stdlib``: the Python standard library's source, one file a document, tokens as ``ingest --text`` makes
  them (``dist_respattn.store.ingest.text``); files go to the splits by the same ``assign_split`` of their key (the
  path under the library's directory, as ``dist-respattn split`` keys text files); the vocabulary is the
  ``--items`` most frequent train tokens (ties alphabetical, as ``ingest`` ranks them) and one "other" id.
  Nothing is downloaded. ``--max-tokens M`` keeps it cheap: files are taken in the order of a second hash
  of their key (``"order"`` for ``"split"``, as ``dist-respattn split --max-tokens`` orders them), each while
  its split holds fewer than its fraction of M tokens, the last one cut to fit, so every split gets its share
  and the corpus has at most M tokens.

Queries are ``embedding_table(S, dim=32, seed=0)``. The splits are written as token-stream stores, read with
each window N.

What is measured, in one run:

1. **E-step rows/s per core** for N = 8, 32, 128, 512, 1024 (``--contexts``), in this process on one
   thread, best of ``--repeats``: ``ResponsibilityAttentionAccumulator.seq_update_windows`` (the histogram
   kernel, rows as ``store.read_windows`` gives them) against ``seq_update(..., checked=True)`` (the
   per-position kernel, ``(n, N)`` windows from ``store.read_rows``), on exactly the same rows (full windows:
   the store read with ``min_context = N``) under the same head: ``random_distribution(S, N, 32, T)`` with its
   prior tied over the most geometric buckets, K = ceil(log2 N) + 1, and random bucket weights. Each kernel
   runs with a dense emission and with a sparse one (the dense values on the support of every (window
   symbol, target) pair of the timed rows, as a sparse fit's support is the pairs of its training rows).
   Few users have 1,024 ratings, so this part reads **all train users' tokens concatenated into one
   document** (windows cross user boundaries; the per-user row counts are printed beside). The same is
   timed on the Python standard library's source (one file a document, the ``--items`` most frequent
   tokens and one id for the rest, so the same S; ``--no-stdlib`` skips it): text repeats its symbols within
   a window far more than ratings do. With ``--sequences stdlib`` the train files' tokens are the one
   document (windows cross files; per-file row counts beside), and that second corpus is not timed: it is
   the same text. Rows are the first ``min(--kernel-rows, --kernel-positions / N)``.
   Printed beside: the mean distinct symbols per window (the histogram kernel's terms a row) and per
   bucket, from a sample of the timed windows, and the two kernels' agreement.
2. **Streaming prediction latency** at N = 512 (``--latency-context``) for a history of 100, 1,000, 10,000
   and 100,000 tokens (``--histories``; the train stream repeated): per token, ``Predictor.push(token)`` then
   ``.predict()`` (``dist_respattn.model.streaming``), the median of ``--latency-steps`` steps taken from
   that history on, against recomputing the prediction from scratch per token from the last N tokens (in
   NumPy, and with ``predict_proba`` once the history holds a full window). Without the predictor module,
   its column prints "predictor: not available". Beside it, the **codebook far field**'s predictor
   (``CodebookHead.predictor``: the N0 near tokens and the (B, W) codeword counts) of the head started from
   the same one (``--near-window``, ``--codebooks``, ``--codewords``), timed the same way and checked against
   its ``predict_proba`` on the last full window.
3. **Held-out quality**: the head fitted on a ``--workers``-worker LocalCluster (validation store for early
   stopping, ``--max-iter``) for every (N, K) of ``--grid`` (default N = 8 with the free prior K = 8, and
   N = 32, 64, 128, 512 with several bucket counts), all with ``min_context = 1`` (short histories included and
   masked), so every head and every n-gram baseline (unigram, add-k, Jelinek-Mercer, Kneser-Ney, tuned on
   validation) is scored on the same test targets.

   Beside them, the **codebook far field** (``dist_respattn.model.heads.codebook``) for every N of
   ``--codebook-contexts`` (default 128, 512; ``""`` for none), started from the grid's N = 8 head with
   ``--near-window`` (8), ``--codebooks`` (8) and ``--codewords`` (16), fitted and scored the same way; the kernel
   part times its E-step (``codebook_statistics``) at those of ``--contexts`` longer than the near window.

4. **Ranking on the leave-one-out split**: every document (user, file) cut at its end by
   ``write_split(..., hold_out="last")`` (train all but the last two items, validation the second-to-last,
   test the last; documents of fewer than 3 items skipped). For movielens the items are those rated at least
   5 times in the train parts (all users' histories but their last two items), the others dropped from the
   sequences (no "other" id: it would be an easily ranked popular target), S = T = their number; for stdlib the
   vocabulary of part 1. The head fitted on the train store (validation for early stopping)
   for every (N, K) of ``--ranking-grid`` (default N = 8 with the free prior, N = 32 with 4 buckets), then
   ``evaluate(..., ranking=RankingSettings(k=--ranking-k, negatives=--ranking-negatives))`` on the test store:
   HR, NDCG and MRR at K of each user's last item, full (every target) and sampled (against 100 unseen
   negatives, seed 0), for the head and the most-popular, Markov (Kneser-Ney bigram) and item-KNN baselines
   (item-KNN's window is the head's N), and the head's perplexity on the same held-out targets.
   Beside the single heads, on the same split and by the same protocols: the **recipe** (``fit --head recipe``:
   with few enough items, a repeat gate over its stack, so its history is the user's whole one) at every N of
   ``--ranking-recipes`` (default 8, 32), and the **stacks** of ``--ranking-stacks`` (default
   ``conj+8+32``: the first recipe's conjunction head of N = 8 and the grid's single heads of N = 8 and 32, under
   the ``target`` gate fitted on the validation store, as ``fit --head stack --stack-from`` fits it), each row with
   its gate. ``--ranking-exclude-history`` ranks every model a second time with the items of the user's history
   excluded from the full protocol's candidates (``evaluate --ranking-exclude-history``) and prints those columns
   beside. ``--ranking-repeat-gate`` fits a **repeat gate** on every model (``fit --head repeat --repeat-from
   MODEL --context 100000``: RepeatNet's split, Ren et al., AAAI 2019, into "an item of the user's whole history
   again" and "a new one", each the model's distribution renormalized over its set, the repeat rate by history
   length counted on the validation store) and ranks it as every model, on the row below the model's; a gated
   model reads the whole history, so it counts among the long-history models of the targets (a recipe gated already
   is not gated again).

Targets (printed with PASS/MISS; measured, never asserted):

- predictor latency flat: the slowest of the histories' median latencies at most 1.5x the fastest, for the
  histogram head's predictor and for the codebook far field's (below N = 512 the window itself is shorter, so
  the histogram's ratio over the histories >= N is printed beside);
- long context pays: the best N > 8 head's test perplexity at least 10% below the N = 8 head's (ratio <= 0.90);
- ranking: the best model of a history longer than 8 items (a single head, recipe or stack of a window N > 8, or
  a model under a repeat gate over the whole history, the recipe's own included) at least 10% above the N = 8 head's
  full NDCG@K (ratio >= 1.10), and the lowest perplexity among them at least 10% below its (ratio <= 0.90).

Run::

    python benchmarks/bench_long_context.py --cache /work/qcache                 # about 6 minutes on 2 cores
    python benchmarks/bench_long_context.py --cache /work/qcache --smoke --json  # a smoke run, under a minute
    python benchmarks/bench_long_context.py --sequences stdlib --smoke --json    # the same, no download

``--smoke`` makes its small sizes the defaults; a flag given beside it wins (``--smoke --max-iter 1``). The
MovieLens data is fetched into ``--cache`` on first use (``benchmarks/corpora.py``); ``--sequences stdlib``
reads nothing from ``--cache``. Worker processes are spawned, so everything runs under
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os

# One thread for every in-process path (the kernels are single-threaded; this keeps NumPy on one core too).
# Must happen before NumPy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable  # noqa: E402
from contextlib import ExitStack, nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import max_relative_difference, time_once  # noqa: E402

SEQUENCES = ("movielens", "stdlib")
CONTEXTS = (8, 32, 128, 512, 1024)
HISTORIES = (100, 1_000, 10_000, 100_000)
LATENCY_CONTEXT = 512
#: (N, K) fits of the quality part: N = 8 with the free prior, longer windows with coarser buckets.
GRID = "8:8;32:3,4,5,6;64:5,7;128:4,5,6,8;512:4,5,6,8,10"
#: The ranking part keeps the items rated at least this many times in the leave-one-out train parts.
MIN_ITEM_RATINGS = 5
#: (N, K) fits of the ranking part, on the leave-one-out split.
RANKING_GRID = "8:8;32:6"
#: Windows of the recipes (``fit --head recipe --context N``) the ranking part fits.
RANKING_RECIPES = "8,32"
#: Stacks the ranking part fits: ``conj`` (the recipe's conjunction head of N = 8) and single heads of the grid.
RANKING_STACKS = "conj+8+32"
#: Windows of the codebook heads (near window 8) the quality part fits from its N = 8 head.
CODEBOOK_CONTEXTS = "128,512"
#: The N = 8 head the long windows are measured against.
REFERENCE_CONTEXT = 8
#: The repeat gate's history (``fit --head repeat --context``): longer than any user's, so each reaches its start.
REPEAT_HISTORY = 100_000

DIM = 32
#: Latency flat: slowest / fastest median per-token latency over the histories.
TARGET_LATENCY_FLAT = 1.5
#: The best long-context head's test perplexity over the N = 8 head's.
TARGET_LONG_OVER_SHORT = 0.90
#: The best long-history model's full-ranking NDCG@K over the N = 8 head's.
TARGET_RANKING_OVER_SHORT = 1.10
#: The histogram kernel's rows/s over the per-position kernel's at this N, on the item sequences, dense emission.
TARGET_KERNEL_CONTEXT = 512
TARGET_KERNEL_SPEEDUP = 8.0

SMOKE = {
    "contexts": "8,32",
    "kernel_positions": 200_000,
    "kernel_rows": 20_000,
    "repeats": 1,
    "min_seconds": 0.0,
    "histories": "100,1000",
    "latency_steps": 20,
    "grid": "8:8;32:4",
    "codebook_contexts": "32",
    "ranking_grid": "8:8",
    "ranking_recipes": "32",
    "ranking_stacks": "conj+8",
    "max_iter": 2,
    "max_tokens": 60_000,  # --sequences stdlib only
}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ corpus


def movielens_documents(args: argparse.Namespace) -> dict[str, Any]:
    """The MovieLens users' item sequences in the ``--items`` most rated train items and one "other" id, and the
    split of each user (by its index)."""
    import corpora

    from dist_respattn.store.ingest.split import DEFAULT_FRACTIONS, assign_split

    sequences, info = corpora.movielens_sequences(args.cache)
    side = [assign_split(str(i), 0, DEFAULT_FRACTIONS) for i in range(len(sequences))]
    counts = np.bincount(np.concatenate([s for s, t in zip(sequences, side, strict=True) if t == 0]))
    ranked = np.lexsort((np.arange(counts.size), -counts))[: args.items]
    ranked = ranked[counts[ranked] > 0]
    ids = np.full(max(info["items"], counts.size), ranked.size, dtype=np.int64)  # the rest: one "other" id
    ids[ranked] = np.arange(ranked.size)
    num_symbols = ranked.size + 1
    return {
        "unit": "user",
        "raw": sequences,
        "raw_items": int(info["items"]),
        "documents": [ids[s] for s in sequences],
        "side": side,
        "num_symbols": int(num_symbols),
        "description": (
            f"{info['users']} users, {info['ratings']:,} ratings, {ranked.size} items + other (S = T = "
            f"{num_symbols}, D = {DIM})"
        ),
    }


def hash_unit(purpose: str, seed: int, key: str) -> float:
    """A document's number in [0, 1) for ``purpose`` (the hash of ``dist_respattn.store.ingest.split``)."""
    digest = hashlib.sha256(f"{purpose}\n{seed}\n{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def stdlib_documents(args: argparse.Namespace) -> dict[str, Any]:
    """The standard library's source files as token sequences (the corpus ``stdlib_store`` reads, tokenized as
    ``ingest --text`` does), in the ``--items`` most frequent train tokens and one "other" id, and the split of
    each file (by its key). With ``--max-tokens``, the slice of the module docstring."""
    from dist_respattn.store.ingest.split import DEFAULT_FRACTIONS, assign_split
    from dist_respattn.store.ingest.text import default_corpus, iter_text_documents, line_pieces, vocabulary_from_counts

    def tokens_of(path: str, keep: int | None) -> list[str]:
        return [token for piece in line_pieces(path) for token in piece][:keep]

    files = iter_text_documents([default_corpus()])
    side = [assign_split(f.key, 0, DEFAULT_FRACTIONS) for f in files]
    if args.max_tokens is None:
        order, room = list(range(len(files))), None
    else:
        order = sorted(range(len(files)), key=lambda i: hash_unit("order", 0, files[i].key))
        room = [round(f * args.max_tokens) for f in DEFAULT_FRACTIONS]  # tokens each split may still take
    kept: dict[int, int] = {}  # file index -> tokens kept (its first ones)
    counts: Counter[str] = Counter()
    for i in order:
        if room is not None and max(room) <= 0:
            break
        if room is not None and room[side[i]] <= 0:
            continue
        tokens = tokens_of(files[i].path, None if room is None else room[side[i]])
        if not tokens:
            continue
        kept[i] = len(tokens)
        if room is not None:
            room[side[i]] -= len(tokens)
        if side[i] == 0:
            counts.update(tokens)
    taken = sorted(kept)
    vocabulary = vocabulary_from_counts(counts, args.items, sum(side[i] == 0 for i in taken))
    lookup = vocabulary.lookup()
    documents = [vocabulary.encode(tokens_of(files[i].path, kept[i]), lookup).astype(np.int64) for i in taken]
    total = sum(d.size for d in documents)
    cap = "" if args.max_tokens is None else f" (--max-tokens {args.max_tokens:,})"
    return {
        "unit": "file",
        "documents": documents,
        "side": [side[i] for i in taken],
        "num_symbols": int(vocabulary.num_symbols),
        "description": (
            f"the Python {platform.python_version()} standard library's source, {len(taken):,} of its {len(files):,} "
            f"files{cap}, {total:,} tokens, {len(vocabulary.tokens)} most frequent train tokens + other "
            f"(S = T = {vocabulary.num_symbols}, D = {DIM})"
        ),
    }


def write_stores(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The split of the ``--sequences`` as token-stream stores (one user or file a document), and the train
    documents' tokens as one document (for the kernel timings)."""
    from dist_respattn.store.ingest.tokens import embedding_table
    from dist_respattn.store.streams.writer import write_stream

    made = stdlib_documents(args) if args.sequences == "stdlib" else movielens_documents(args)
    unit, side, num_symbols = made["unit"], made["side"], made["num_symbols"]
    table = embedding_table(num_symbols, dim=DIM, seed=0)[0]
    options = {"num_symbols": num_symbols, "table": table, "overwrite": True, "provenance": {"source": "tokens"}}
    split = {
        name: [d for d, t in zip(made["documents"], side, strict=True) if t == k]
        for k, name in enumerate(("train", "validation", "test"))
    }
    for name, documents in split.items():
        if not documents:
            raise ValueError(f"{args.sequences}: the {name} split has no {unit}s; take more of the corpus")
    stores, counted, tokens = {}, {}, {}
    loo_source = (made.get("raw"), made.get("raw_items"), made["documents"], num_symbols)
    for name, documents in split.items():
        counted[name], tokens[name] = len(documents), int(sum(d.size for d in documents))
        stores[name] = write_stream(
            out / f"{name}.zarr", [(d, None) for d in documents], context_length=REFERENCE_CONTEXT, **options
        )
        if name == "train":
            stream = np.concatenate(documents)
    stores["train_stream"] = write_stream(
        out / "train-one-document.zarr", [(stream, None)], context_length=REFERENCE_CONTEXT, **options
    )
    lengths = np.array([d.size for d in split["train"]])
    return {
        "sequences": args.sequences,
        "unit": unit,
        "stores": stores,
        "stream": stream,
        "table": table,
        "num_symbols": int(num_symbols),
        f"{unit}s": counted,
        "tokens": tokens,
        f"train_{unit}_lengths": {
            "median": int(np.median(lengths)),
            "max": int(lengths.max()),
            f"{unit}s_with_full_windows": {str(n): int((lengths > n).sum()) for n in CONTEXTS},
        },
        "description": made["description"],
        "loo_source": loo_source,
    }


# ------------------------------------------------------------------------------------------ heads


def tied_head(num_symbols: int, context_length: int, seed: int) -> Any:
    """``random_distribution`` with its prior tied over the most geometric buckets (random bucket weights)."""
    from dist_respattn import ResponsibilityAttentionDistribution, random_distribution
    from dist_respattn.model.buckets import PositionBuckets, max_geometric_buckets

    base = random_distribution(num_symbols, context_length, DIM, num_symbols, seed=seed)
    buckets = PositionBuckets.geometric(context_length, max_geometric_buckets(context_length))
    weights = np.random.default_rng(seed + 1).dirichlet(np.ones(buckets.num_buckets))
    return ResponsibilityAttentionDistribution(
        base.key_means, base.emission, buckets.spread(weights), base.sigma2, buckets=buckets
    )


def sparse_head(model: Any, context: np.ndarray, target: np.ndarray) -> Any:
    """``model`` with its dense emission moved onto the support of every (window symbol, target) pair of the rows."""
    from dist_respattn.model.emission.layouts import PairSupport, SparseEmission

    S = model.num_symbols
    keys = []
    block = max(1, (1 << 22) // context.shape[1])
    for start in range(0, context.shape[0], block):
        cells = target[start : start + block, None].astype(np.int64) * S + context[start : start + block]
        keys.append(np.unique(cells))
    support = PairSupport.from_keys(np.unique(np.concatenate(keys)), S, model.num_targets)
    return model.with_emission(SparseEmission.from_dense(model.emission, support)), support


# ------------------------------------------------------------------------------------------ kernels


def best_rate(run: Callable[[], Any], rows: int, repeats: int, min_seconds: float) -> dict[str, Any]:
    """Rows/s of ``run`` (warm): each timed run loops until it lasts ``min_seconds``; the best of ``repeats``."""
    first, _ = time_once(run)
    loops = max(1, math.ceil(min_seconds / max(first, 1e-9))) if min_seconds > 0 else 1
    best = first if loops == 1 else math.inf
    for _ in range(repeats if loops > 1 else repeats - 1):
        started = time.perf_counter()
        for _ in range(loops):
            run()
        best = min(best, (time.perf_counter() - started) / loops)
    return {"rows": rows, "seconds": best, "loops": loops, "rows_per_s": rows / best}


def statistics_of(accumulator: Any, buckets: Any) -> list[np.ndarray]:
    """The fields both kernels fill alike: key sums, key masses, emission counts, bucket masses, scalars."""
    value = accumulator.value()
    emission = value[2]
    counts = emission.count_ts if hasattr(emission, "count_ts") else emission.counts
    return [value[0], value[1], counts, buckets.bucket_weights(value[3]), np.array(value[4:7], dtype=np.float64)]


def distinct_counts(context: np.ndarray, buckets: Any, sample: int) -> dict[str, Any]:
    """Mean distinct symbols per window and per bucket over ``sample`` windows spread over the rows."""
    index = np.unique(np.linspace(0, context.shape[0] - 1, min(sample, context.shape[0])).astype(np.int64))
    windows = context[index]

    def distinct(block: np.ndarray) -> np.ndarray:
        ordered = np.sort(block, axis=1)
        return 1 + np.count_nonzero(np.diff(ordered, axis=1), axis=1)

    of_bucket = buckets.bucket_of_position
    per_bucket = [float(distinct(windows[:, of_bucket == b]).mean()) for b in range(buckets.num_buckets)]
    return {
        "windows_sampled": int(index.size),
        "per_window": float(distinct(windows).mean()),
        "per_bucket": per_bucket,
        "per_bucket_mean": float(np.mean(per_bucket)),
        "bucket_sizes": list(buckets.sizes),
    }


def stdlib_store(args: argparse.Namespace, out: Path) -> Any:
    """The Python standard library's source as a stream store (one file a document), with a vocabulary of the
    ``--items`` most frequent tokens and one id for the rest: S = T as on the ratings."""
    from dist_respattn.store import WriteOptions
    from dist_respattn.store.ingest.text import default_corpus
    from dist_respattn.store.ingest.to_stream import write_stream_text

    return write_stream_text(
        out, [default_corpus()], REFERENCE_CONTEXT, vocab_size=args.items, dim=DIM, seed=0,
        options=WriteOptions(overwrite=True),
    )  # fmt: skip


def kernel_corpora(args: argparse.Namespace, corpus: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    """The stores the kernels are timed on: the sequences as one document (and per user or file, for the row
    counts beside), and the standard library's source (one file a document) unless ``--no-stdlib`` or the
    sequences are that source already."""
    unit = corpus["unit"]
    chosen = [
        {
            "corpus": corpus["sequences"],
            "description": f"train {unit}s' tokens as ONE document (windows cross {unit}s)",
            "location": corpus["stores"]["train_stream"].location,
            "documents_location": corpus["stores"]["train"].location,
            "tokens": int(corpus["stores"]["train_stream"].num_tokens),
        }
    ]
    if not args.no_stdlib and corpus["sequences"] != "stdlib":
        say("writing the standard library's source as a stream store")
        started = time.perf_counter()
        store = stdlib_store(args, work / "stdlib.zarr")
        chosen.append({
            "corpus": "stdlib",
            "description": (
                f"the Python standard library's source, one file a document, {args.items} most frequent tokens + other"
            ),
            "location": store.location,
            "documents_location": store.location,
            "tokens": int(store.num_tokens),
            "num_symbols": int(store.schema.num_symbols),
            "ingest_seconds": time.perf_counter() - started,
        })  # fmt: skip
    return chosen


def kernel_part(args: argparse.Namespace, corpus: dict[str, Any], work: Path) -> dict[str, Any]:
    sources = kernel_corpora(args, corpus, work)
    out = []
    for source in sources:
        for n_pos in args.contexts:
            out.append(kernel_figures(args, source, n_pos))
            gc.collect()
    for source in sources:
        source.pop("location"), source.pop("documents_location")
    return {"corpora": sources, "figures": [f for f in out if f is not None]}


def kernel_figures(args: argparse.Namespace, source: dict[str, Any], n_pos: int) -> dict[str, Any] | None:
    from dist_respattn.store.streams.reader import TokenStreamStore

    name = source["corpus"]
    store = TokenStreamStore.open(source["location"].with_min_context(None), n_pos)  # full windows only
    per_document = TokenStreamStore.open(source["documents_location"].with_min_context(None), n_pos).num_rows
    rows = min(store.num_rows, args.kernel_rows, max(1, args.kernel_positions // n_pos))
    if store.num_rows < 1:
        say(f"kernels {name} N = {n_pos}: no full windows; skipped")
        return None
    encoded = store.read_rows(0, rows)
    windows = store.read_windows(0, rows)
    if not np.array_equal(encoded.target, windows.target) or not np.array_equal(
        windows.end - windows.begin, np.full(rows, n_pos)
    ):
        raise RuntimeError(f"{name} N = {n_pos}: read_rows and read_windows disagree on the rows")
    model = tied_head(store.schema.num_symbols, n_pos, seed=args.seed)
    figures: dict[str, Any] = {
        "corpus": name,
        "context": n_pos,
        "buckets": model.buckets.num_buckets,
        "bucket_sizes": list(model.buckets.sizes),
        "rows": rows,
        "store_rows": store.num_rows,
        "per_document_full_rows": per_document,
        "distinct": distinct_counts(encoded.context, model.buckets, args.stats_rows),
    }
    say(f"kernels {name} N = {n_pos}: {rows:,} rows, K = {model.buckets.num_buckets}")
    heads = {"dense": (model, None)}
    if not args.no_sparse:
        started = time.perf_counter()
        sparse, support = sparse_head(model, encoded.context, encoded.target)
        heads["sparse"] = (sparse, support)
        figures["sparse_support"] = {
            "pairs": support.num_pairs,
            "fraction_of_cells": support.num_pairs / (model.num_symbols * model.num_targets),
            "seconds_to_build": time.perf_counter() - started,
        }
    batch = (encoded.context, encoded.query, encoded.target)
    for layout, (head, support) in heads.items():
        factory = head.estimator().accumulator_factory(layout=layout)

        def per_position(head: Any = head, factory: Any = factory, support: Any = support) -> Any:
            accumulator = factory.make(support)
            accumulator.seq_update(batch, None, head, checked=True)
            return accumulator

        def by_histogram(head: Any = head, factory: Any = factory, support: Any = support) -> Any:
            accumulator = factory.make(support)
            accumulator.seq_update_windows(windows, head)
            return accumulator

        # Compile (or load from numba's cache) and check agreement before anything is timed.
        agreement = max_relative_difference(
            statistics_of(by_histogram(), head.buckets), statistics_of(per_position(), head.buckets)
        )
        gc.collect()
        slow = best_rate(per_position, rows, args.repeats, args.min_seconds)
        fast = best_rate(by_histogram, rows, args.repeats, args.min_seconds)
        figures[layout] = {
            "per_position": slow,
            "histogram": fast,
            "histogram_over_per_position": fast["rows_per_s"] / slow["rows_per_s"],
            "agreement": agreement,
        }
        say(
            f"  {layout}: per-position {slow['rows_per_s']:,.0f} rows/s, histogram {fast['rows_per_s']:,.0f} "
            f"rows/s ({fast['rows_per_s'] / slow['rows_per_s']:.2f}x); agreement {agreement:.1e}"
        )
    if args.codebook_contexts and n_pos > args.near_window:
        figures["codebook"] = codebook_rate(args, model, windows, rows)
    return figures


def codebook_head_for(args: argparse.Namespace, single: Any, n_pos: int) -> Any:
    """A codebook head of window ``n_pos`` started from ``single`` (near window, B, W of the options)."""
    from dist_respattn.model.heads.codebook import CodebookSpec
    from dist_respattn.model.heads.codebook.kind import start_head

    spec = CodebookSpec(near_window=args.near_window, codebooks=args.codebooks, codewords=args.codewords)
    return start_head(single, spec, n_pos)


def codebook_rate(args: argparse.Namespace, single: Any, windows: Any, rows: int) -> dict[str, Any]:
    """Rows/s of the codebook head's E-step (``codebook_statistics``) on the timed windows, the head started from
    the random single head of the kernel timings."""
    from dist_respattn.model.heads.base import Block
    from dist_respattn.model.heads.codebook.kind import codebook_statistics

    head = codebook_head_for(args, single, int((windows.end - windows.begin).max()))

    def run() -> Any:
        return codebook_statistics(head, [Block(windows, None)])

    run()  # compile (or load from numba's cache) before anything is timed
    rate = best_rate(run, rows, args.repeats, args.min_seconds)
    say(f"  codebook (N0 = {args.near_window}, {args.codebooks} x {args.codewords}): {rate['rows_per_s']:,.0f} rows/s")
    return rate


# ------------------------------------------------------------------------------------------ latency


def recompute(model: Any, emission: np.ndarray, window: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``p(target | window, query)`` from scratch: attention over the window's positions (the tied prior, masked
    and renormalized over a short history), gathered per distinct symbol, times their emission rows."""
    m = window.shape[0]
    log_prior = model.log_position_prior[model.context_length - m :]  # columns of recencies m - 1 .. 0
    difference = model.key_means[window] - query
    logits = log_prior - np.einsum("ij,ij->i", difference, difference) / (2.0 * model.sigma2)
    attention = np.exp(logits - logits.max())
    attention /= attention.sum()
    symbols, inverse = np.unique(window, return_inverse=True)
    return np.bincount(inverse, weights=attention, minlength=symbols.size) @ emission[symbols]


def make_predictor(predictor_class: Any, model: Any, table: np.ndarray) -> Any:
    """``Predictor(model)``; with the embedding table too when its signature names one."""
    try:
        parameters = inspect.signature(predictor_class).parameters
    except (TypeError, ValueError):
        parameters = {}
    for name in ("table", "embeddings", "query_table", "embedding_table"):
        if name in parameters:
            return predictor_class(model, **{name: table})
    return predictor_class(model)


def latency_part(args: argparse.Namespace, corpus: dict[str, Any]) -> dict[str, Any]:
    n_pos = args.latency_context
    model = tied_head(corpus["num_symbols"], n_pos, seed=args.seed)
    emission = model.emission
    table = np.asarray(corpus["table"], dtype=np.float64)
    longest = max(args.histories) + args.latency_steps + 1
    stream = np.resize(corpus["stream"], longest).astype(np.int64)  # the train stream, repeated
    try:
        from dist_respattn.model.streaming import Predictor
    except ImportError as exc:
        Predictor, missing = None, f"{type(exc).__name__}: {exc}"
    else:
        missing = None
    figures: dict[str, Any] = {
        "context": n_pos,
        "buckets": model.buckets.num_buckets,
        "steps": args.latency_steps,
        "predictor": None if missing else "dist_respattn.model.streaming.Predictor",
        "predictor_missing": missing,
        "codebook": None,  # the codebook far field's predictor, when the window is longer than its near window
        "histories": [],
    }
    if missing:
        say(f"predictor: not available ({missing})")
    # Warm the package's path (a numba kernel may compile on first use).
    model.predict_proba(stream[:n_pos], table[stream[n_pos - 1]])
    codebook = codebook_head_for(args, model, n_pos) if args.near_window < n_pos else None
    if codebook is not None:
        figures["codebook"] = f"N0 = {args.near_window}, {args.codebooks} x {args.codewords}"
        codebook.predict_proba(stream[:n_pos], table[stream[n_pos - 1]])
    for history in args.histories:
        steps = args.latency_steps
        entry: dict[str, Any] = {"history": history, "steps": steps}
        # From scratch, per token: the window of the last N tokens and the query of the last one.
        scratch, package = [], []
        for j in range(steps):
            stop = history + j + 1
            started = time.perf_counter()
            window = stream[max(0, stop - n_pos) : stop]
            recompute(model, emission, window, table[window[-1]])
            scratch.append(time.perf_counter() - started)
            if stop >= n_pos:
                started = time.perf_counter()
                window = stream[stop - n_pos : stop]
                model.predict_proba(window, table[window[-1]])
                package.append(time.perf_counter() - started)
        entry["recompute_numpy_s"] = float(np.median(scratch))
        entry["recompute_predict_proba_s"] = float(np.median(package)) if package else None
        if Predictor is not None:
            try:
                predictor = make_predictor(Predictor, model, table)
                started = time.perf_counter()
                for token in stream[:history]:
                    predictor.push(int(token))
                entry["fill_s_per_token"] = (time.perf_counter() - started) / history
                latencies, rows_read, predicted = timed_steps(predictor, stream[history : history + steps])
                ends = range(history + 1, history + steps + 1)  # each step's window ends there
                distinct = [np.unique(stream[max(0, end - n_pos) : end]).size for end in ends]
                stop = history + steps
                window = stream[max(0, stop - n_pos) : stop]
                expected = recompute(model, emission, window, table[window[-1]])
                entry["predictor_s"] = float(np.median(latencies))
                entry["predictor_p90_s"] = float(np.quantile(latencies, 0.9))
                entry["predictor_max_abs_difference"] = float(np.max(np.abs(np.asarray(predicted) - expected)))
                entry["distinct_symbols"] = float(np.median(distinct))
                # Emission rows a prediction read, when the predictor says (it may leave unread the rows whose
                # attention cannot move a probability by more than a rounding).
                entry["predictor_rows_read"] = None if None in rows_read else float(np.median(rows_read))
                entry["fewest_rows_exact"] = fewest_rows_at(
                    make_predictor(Predictor, model, table), emission, stream, history, min(steps, FEWEST_ROWS_STEPS)
                )
            except Exception as exc:  # the predictor is new: report what it did, and keep the other figures
                entry["predictor_error"] = f"{type(exc).__name__}: {exc}"
                say(f"predictor at history {history}: {entry['predictor_error']}")
        if codebook is not None:
            entry.update(codebook_latency(codebook, table, stream, history, steps, n_pos))
        figures["histories"].append(entry)
        shown = f"{entry['predictor_s'] * 1e6:,.0f} us" if "predictor_s" in entry else "not available"
        say(f"latency at history {history:,}: predictor {shown}, recompute {entry['recompute_numpy_s'] * 1e6:,.0f} us")
    measured = [e["predictor_s"] for e in figures["histories"] if "predictor_s" in e]
    complete = len(measured) == len(figures["histories"]) and measured
    figures["predictor_flatness"] = max(measured) / min(measured) if complete else None
    # Informational: from the first history that fills the window on (below N the window itself is shorter).
    full = [e["predictor_s"] for e in figures["histories"] if "predictor_s" in e and e["history"] >= n_pos]
    figures["predictor_flatness_full_windows"] = max(full) / min(full) if complete and full else None
    far = [e["codebook_s"] for e in figures["histories"] if "codebook_s" in e]
    figures["codebook_flatness"] = max(far) / min(far) if far else None
    return figures


#: Steps of each history whose fewest exact rows are counted (a pass over a (distinct, T) table a step).
FEWEST_ROWS_STEPS = 50


def fewest_rows(emission: np.ndarray, symbols: np.ndarray, attention: np.ndarray, tolerance: float) -> int:
    """The fewest emission rows a prediction ``attention @ emission[symbols]`` can read, by decreasing attention,
    and still equal the whole mixture to a relative ``tolerance`` on every target: the first r for which the unread
    rows' own sum (not a bound of it) is at most ``tolerance`` times the read rows' on every target. No rule that
    reads rows by attention and stays exact reads fewer."""
    order = np.argsort(-attention, kind="stable")
    rows = attention[order, None] * emission[symbols[order]]  # (u, T)
    read = np.cumsum(rows, axis=0)
    unread = read[-1] - read  # after r + 1 rows
    exact = np.all(unread <= tolerance * read, axis=1)
    return int(np.argmax(exact)) + 1 if exact.any() else int(rows.shape[0])


def fewest_rows_at(predictor: Any, emission: np.ndarray, stream: np.ndarray, history: int, steps: int) -> float | None:
    """The median :func:`fewest_rows` over ``steps`` tokens from ``history`` on (None: a predictor without
    ``attention``)."""
    if not hasattr(predictor, "attention"):
        return None
    try:
        from dist_respattn.model.streaming import UNREAD_TOLERANCE as tolerance
    except ImportError:
        tolerance = 2.0**-53
    for token in stream[:history]:
        predictor.push(int(token))
    counts = []
    for token in stream[history : history + steps]:
        predictor.push(int(token))
        symbols, attention = predictor.attention()
        counts.append(fewest_rows(emission, np.asarray(symbols), np.asarray(attention), tolerance))
    return float(np.median(counts))


def timed_steps(predictor: Any, tokens: np.ndarray) -> tuple[list[float], list[Any], np.ndarray]:
    """Push each token then predict, timed: (each step's seconds, the rows each prediction read when the predictor
    says, else None; the last prediction)."""
    latencies: list[float] = []
    rows_read: list[Any] = []
    predicted = None
    for token in tokens:
        started = time.perf_counter()
        predictor.push(int(token))
        predicted = predictor.predict()
        latencies.append(time.perf_counter() - started)
        rows_read.append(getattr(predictor, "rows_read", None))
    return latencies, rows_read, np.asarray(predicted)


def codebook_latency(
    head: Any, table: np.ndarray, stream: np.ndarray, history: int, steps: int, n_pos: int
) -> dict[str, Any]:
    """The codebook far field's predictor after ``history`` tokens: the median and 90th percentile of ``steps``
    push-and-predict steps, and its largest difference from ``predict_proba`` on the last full window."""
    predictor = head.predictor(query_table=table)
    for token in stream[:history]:
        predictor.push(int(token))
    latencies, _, predicted = timed_steps(predictor, stream[history : history + steps])
    stop = history + steps
    figures: dict[str, Any] = {
        "codebook_s": float(np.median(latencies)),
        "codebook_p90_s": float(np.quantile(latencies, 0.9)),
        "codebook_max_abs_difference": None,
    }
    if stop >= n_pos:  # predict_proba reads full windows only
        window = stream[stop - n_pos : stop]
        expected = head.predict_proba(window, table[window[-1]])
        figures["codebook_max_abs_difference"] = float(np.max(np.abs(np.asarray(predicted) - expected)))
    say(f"  codebook far field's predictor at history {history:,}: {figures['codebook_s'] * 1e6:,.0f} us")
    return figures


# ------------------------------------------------------------------------------------------ quality


def parse_grid(text: str) -> list[tuple[int, int]]:
    """``"8:8;32:4,6"`` -> [(8, 8), (32, 4), (32, 6)]."""
    grid = []
    for part in text.split(";"):
        if not part.strip():
            continue
        n_text, _, ks = part.partition(":")
        n_pos = int(n_text)
        for k in (ks or n_text).split(","):
            grid.append((n_pos, int(k)))
    return grid


def quality_part(args: argparse.Namespace, corpus: dict[str, Any], work: Path, shared: Any = None) -> dict[str, Any]:
    from dist_respattn.engine import ClusterOptions, FitSettings, connect, evaluate, fit

    stores = corpus["stores"]
    heads = []
    baselines: dict[str, float] | None = None
    baseline_rows = None
    same_baselines = True
    # ``shared``: a client the parts share (one cluster started once), else a cluster of this part's own.
    with (
        nullcontext(shared)
        if shared is not None
        else connect(ClusterOptions(n_workers=args.workers), say=say) as client
    ):
        for n_pos, k in args.grid:
            say(f"quality: fitting N = {n_pos}, K = {k}")
            settings = FitSettings(max_iter=args.max_iter, position_buckets=k, context_length=n_pos)
            model_dir = work / "models" / f"n{n_pos}-k{k}"
            started = time.perf_counter()
            result = fit(
                stores["train"], model_dir=model_dir, settings=settings, validation=stores["validation"],
                overwrite=True, client=client, progress=False, say=lambda m: say(f"    {m}"),
            )  # fmt: skip
            seconds = time.perf_counter() - started
            tested = evaluate(model_dir, stores["test"], client=client, progress=False).to_json()
            these = {name: float(v["perplexity"]) for name, v in tested["baselines"].items()}
            if baselines is None:
                baselines, baseline_rows = these, tested["rows"]
            elif these != baselines or tested["rows"] != baseline_rows:
                same_baselines = False
            buckets = result.model.buckets
            heads.append({
                "context": n_pos,
                "buckets": k,
                "bucket_sizes": list(buckets.sizes) if buckets is not None else None,
                "perplexity": float(tested["model"]["perplexity"]),
                "test_rows": tested["rows"],
                "iterations": result.iterations,
                "best_iteration": result.best_iteration,
                "state": str(getattr(result.state, "value", result.state)),
                "seconds": seconds,
                "final_bucket_weights": (
                    [float(v) for v in buckets.bucket_weights(result.model.position_prior)] if buckets else None
                ),
            })  # fmt: skip
            say(f"  test perplexity {heads[-1]['perplexity']:.2f} ({seconds:.1f} s)")
        source = next((n, k) for n, k in args.grid if n == REFERENCE_CONTEXT) if args.codebook_contexts else None
        for n_pos in args.codebook_contexts if source is not None else ():
            heads.append(
                fit_codebook(args, stores, work, client, n_pos, work / "models" / f"n{source[0]}-k{source[1]}")
            )
    reference = next((h for h in heads if h["context"] == REFERENCE_CONTEXT), None)
    longer = [h for h in heads if h["context"] > REFERENCE_CONTEXT]
    best = min(longer, key=lambda h: h["perplexity"]) if longer else None
    for h in heads:
        h["best_long_context"] = h is best
    return {
        "heads": heads,
        "baselines": baselines,
        "test_rows": baseline_rows,
        "same_targets_for_all": same_baselines and all(h["test_rows"] == baseline_rows for h in heads),
        "reference": reference,
        "best_long_context": best,
        "best_over_reference": best["perplexity"] / reference["perplexity"] if best and reference else None,
    }


def fit_codebook(
    args: argparse.Namespace, stores: dict[str, Any], work: Path, client: Any, n_pos: int, single_dir: Path
) -> dict[str, Any]:
    """The codebook head of window ``n_pos`` started from the N = 8 head in ``single_dir``, fitted and tested as the
    quality part's heads are."""
    from dist_respattn.engine import FitSettings, evaluate, fit
    from dist_respattn.model.heads.codebook import CodebookSpec

    say(f"quality: fitting the codebook head N = {n_pos}, N0 = {args.near_window}, {args.codebooks} x {args.codewords}")
    spec = CodebookSpec(
        str(single_dir), near_window=args.near_window, codebooks=args.codebooks, codewords=args.codewords
    )
    model_dir = work / "models" / f"codebook-n{n_pos}"
    started = time.perf_counter()
    result = fit(
        stores["train"], model_dir=model_dir, settings=FitSettings(max_iter=args.max_iter, context_length=n_pos),
        head=spec, validation=stores["validation"], overwrite=True, client=client, progress=False,
        say=lambda m: say(f"    {m}"),
    )  # fmt: skip
    seconds = time.perf_counter() - started
    tested = evaluate(model_dir, stores["test"], client=client, progress=False).to_json()
    say(f"  test perplexity {float(tested['model']['perplexity']):.2f} ({seconds:.1f} s)")
    return {
        "kind": "codebook",
        "context": n_pos,
        "buckets": None,
        "bucket_sizes": None,
        "near_window": args.near_window,
        "codebooks": args.codebooks,
        "codewords": args.codewords,
        "perplexity": float(tested["model"]["perplexity"]),
        "test_rows": tested["rows"],
        "iterations": result.iterations,
        "best_iteration": result.best_iteration,
        "state": str(getattr(result.state, "value", result.state)),
        "seconds": seconds,
        "far_prior": float(result.model.prior[-1]),
    }


# ------------------------------------------------------------------------------------------ ranking


def leave_one_out_stores(args: argparse.Namespace, corpus: dict[str, Any], out: Path) -> dict[str, Any]:
    """The leave-one-out split of every document (``write_split(..., hold_out="last")``), in a vocabulary counted
    on the train parts (movielens; stdlib: part 1's)."""
    from dist_respattn.store import TokenCorpus, WriteOptions, write_split

    raw, raw_items, documents, num_symbols = corpus["loo_source"]
    if raw is not None:
        # As recommender benchmarks filter items (RecBole's ``min_item_inter_num``): items rated fewer than
        # MIN_ITEM_RATINGS times in the train parts (every user's history but its last two items) are dropped from
        # the sequences, not folded into one "other" id, which would be a popular, easily ranked target.
        counts = np.bincount(np.concatenate([s[:-2] for s in raw if s.size >= 3]), minlength=raw_items)
        kept = np.flatnonzero(counts >= MIN_ITEM_RATINGS)
        ranked = kept[np.lexsort((kept, -counts[kept]))]
        ids = np.full(counts.size, -1, dtype=np.int64)
        ids[ranked] = np.arange(ranked.size)
        documents = [ids[s][ids[s] >= 0] for s in raw]
        documents = [d for d in documents if d.size]
        num_symbols = int(ranked.size)
    tokens = np.concatenate(documents).astype(np.int64)
    starts = np.cumsum([0, *(d.size for d in documents[:-1])]).astype(np.int64)
    stores = write_split(
        out, TokenCorpus(tokens, starts), REFERENCE_CONTEXT, num_symbols=num_symbols, dim=DIM, seed=0,
        options=WriteOptions(overwrite=True), hold_out="last",
    )  # fmt: skip
    split = stores["test"].provenance["split"]
    return {
        "stores": {name: str(store.location) for name, store in stores.items()},
        "num_symbols": num_symbols,
        "min_item_ratings": MIN_ITEM_RATINGS if raw is not None else None,
        "documents": int(split["documents"]),
        "skipped_documents": int(split["skipped_documents"]),
    }


def parse_stacks(text: str) -> list[tuple[str, ...]]:
    """``"conj+8+32;conj+8+32+128"`` -> [("conj", "8", "32"), ("conj", "8", "32", "128")]: each stack's parts, ``conj``
    (the recipe's conjunction head of N = 8) or a window N of ``--ranking-grid`` (its single head; ``N:K`` picks
    among several K of one N)."""
    stacks = []
    for part in text.split(";"):
        names = tuple(name.strip() for name in part.split("+") if name.strip())
        if not names:
            continue
        for name in names:
            if name != "conj" and not all(v.isdigit() for v in name.split(":")):
                raise ValueError(
                    f"--ranking-stacks: {name!r} is neither conj nor a window N (or N:K) of --ranking-grid"
                )
        if len(names) < 2:
            raise ValueError(f"--ranking-stacks: {part.strip()!r} stacks fewer than two heads")
        stacks.append(names)
    return stacks


def _ranked(
    model_dir: Path, stores: dict[str, str], settings: Any, client: Any, exclude: bool, repeat: Callable | None = None
) -> dict[str, Any]:
    """``evaluate --ranking`` of ``model_dir`` on the test store: its perplexity, ranking, and with ``exclude`` the
    full protocol with the history excluded (``--ranking-exclude-history``) beside; with ``repeat``
    (``model_dir -> figures``), the model under a fitted repeat gate too (:func:`repeat_gated`)."""
    import dataclasses

    from dist_respattn.engine import evaluate

    started = time.perf_counter()
    tested = evaluate(model_dir, stores["test"], client=client, progress=False, ranking=settings).to_json()
    figures = {
        "perplexity": float(tested["model"]["perplexity"]),
        "heldout_weight": float(tested["weight"]),
        "ranking": tested["ranking"],
        "excluded": None,
        "baseline_perplexity": {
            name: float(tested["baselines"][name]["perplexity"]) for name in ("unigram", "kneser_ney")
        },
    }
    if exclude:
        excluded = dataclasses.replace(settings, exclude_history=True)
        figures["excluded"] = evaluate(
            model_dir, stores["test"], client=client, progress=False, ranking=excluded, baseline_order=2
        ).to_json()["ranking"]
    figures["evaluate_seconds"] = time.perf_counter() - started
    figures["repeat_gate"] = None if repeat is None else repeat(model_dir)
    rk = figures["ranking"]
    shown = f", history excluded {figures['excluded']['full']['ndcg']:.4f}" if exclude else ""
    say(
        f"  full HR@{settings.k} {rk['full']['hit_rate']:.4f}, NDCG {rk['full']['ndcg']:.4f}{shown}; sampled HR "
        f"{rk['sampled']['hit_rate']:.4f}; perplexity {figures['perplexity']:.2f} ({rk['rows']} users)"
    )
    return figures


def repeat_gated(
    model_dir: Path, stores: dict[str, str], settings: Any, client: Any, exclude: bool, fitted: Callable, max_iter: int
) -> dict[str, Any] | None:
    """``fit --head repeat --repeat-from MODEL_DIR --context REPEAT_HISTORY`` (its rates counted on the validation
    store) into ``MODEL_DIR-repeat``, ranked as every model is (:func:`_ranked`): the model under a repeat gate over
    the user's whole history (``None`` for a model that is one: the recipe where the targets are few)."""
    from dist_respattn.artifacts import load_checkpoint
    from dist_respattn.engine import FitSettings
    from dist_respattn.model.heads.repeat import RepeatSpec

    if load_checkpoint(model_dir).model.kind == "repeat":
        return None  # the recipe's own last stage is a repeat gate already
    gated_dir = model_dir.parent / f"{model_dir.name}-repeat"
    say(f"ranking: fitting a repeat gate on {model_dir.name} (its rates on the validation store)")
    result, seconds = fitted(
        gated_dir, FitSettings(max_iter=max_iter, context_length=REPEAT_HISTORY), RepeatSpec(str(model_dir))
    )
    rates = [float(v) for v in load_checkpoint(gated_dir).model.rates]
    return {
        "context": REPEAT_HISTORY, "rates": rates, "iterations": result.iterations, "fit_seconds": seconds,
        **_ranked(gated_dir, stores, settings, client, exclude),
    }  # fmt: skip


def _gate(model_dir: Path) -> list[float] | None:
    """A stack's gate as its checkpoint holds it (``None`` when it cannot be read)."""
    from dist_respattn.artifacts import load_checkpoint

    head = load_checkpoint(model_dir).model
    head = head.base if head.kind == "repeat" else head  # the recipe's stack under its repeat gate
    gate = getattr(head, "gate", None)
    return None if gate is None else [float(v) for v in np.asarray(gate)]


def ranking_part(args: argparse.Namespace, corpus: dict[str, Any], work: Path, shared: Any = None) -> dict[str, Any]:
    from dist_respattn.artifacts import load_checkpoint
    from dist_respattn.engine import ClusterOptions, FitSettings, connect, fit
    from dist_respattn.model.heads.conj.kind import ConjSpec
    from dist_respattn.model.heads.recipe.kind import (
        RECIPE_CONJ_ORDER,
        RECIPE_HISTORY,
        RECIPE_SHORT_CONTEXT,
        RecipeSpec,
    )
    from dist_respattn.model.heads.stack.kind import StackSpec
    from dist_respattn.model.ranking import RankingSettings

    say("ranking: writing the leave-one-out split")
    split = leave_one_out_stores(args, corpus, work / "leave-one-out")
    stores = split["stores"]
    settings = RankingSettings(k=args.ranking_k, negatives=args.ranking_negatives)
    exclude = args.ranking_exclude_history
    heads: list[dict[str, Any]] = []
    recipes: list[dict[str, Any]] = []
    stacks: list[dict[str, Any]] = []
    models = work / "models"

    def fitted(model_dir: Path, fit_settings: Any, head: Any = None) -> tuple[Any, float]:
        started = time.perf_counter()
        result = fit(
            stores["train"], model_dir=model_dir, settings=fit_settings, head=head, validation=stores["validation"],
            overwrite=True, client=client, progress=False, say=lambda m: say(f"    {m}"),
        )  # fmt: skip
        return result, time.perf_counter() - started

    def gate(model_dir: Path) -> dict[str, Any] | None:
        return repeat_gated(model_dir, stores, settings, client, exclude, fitted, args.max_iter)

    repeat = gate if args.ranking_repeat_gate else None

    # ``shared``: a client the parts share (one cluster started once), else a cluster of this part's own.
    with (
        nullcontext(shared)
        if shared is not None
        else connect(ClusterOptions(n_workers=args.workers), say=say) as client
    ):
        single_dirs: dict[str, Path] = {}
        for n_pos, k in args.ranking_grid:
            say(f"ranking: fitting N = {n_pos}, K = {k} on the leave-one-out train store")
            model_dir = models / f"loo-n{n_pos}-k{k}"
            single_dirs.setdefault(str(n_pos), model_dir)
            single_dirs[f"{n_pos}:{k}"] = model_dir
            result, seconds = fitted(
                model_dir, FitSettings(max_iter=args.max_iter, position_buckets=k, context_length=n_pos)
            )
            heads.append({
                "context": n_pos, "buckets": k, "iterations": result.iterations, "fit_seconds": seconds,
                **_ranked(model_dir, stores, settings, client, exclude, repeat),
            })  # fmt: skip
        conj_dir: Path | None = None
        for n_pos in args.ranking_recipes:
            # What `fit --head recipe --context N` fits: the single head of N's geometric buckets, the copy head from
            # it, the conjunction head of N = 8 and their stack, its gate on the validation store.
            say(f"ranking: fitting the recipe at N = {n_pos} on the leave-one-out train store")
            model_dir = models / f"loo-recipe-n{n_pos}"
            fit_settings = FitSettings(max_iter=args.max_iter, context_length=n_pos)
            result, seconds = fitted(model_dir, fit_settings, RecipeSpec(fit_settings.head_spec()))
            conj_dir = conj_dir or model_dir / "conj"
            # Where the items are few enough, the recipe's last stage is a repeat gate over its stack: its history
            # is then the user's whole one.
            gated = load_checkpoint(model_dir).model.kind == "repeat"
            recipes.append({
                "context": n_pos, "history": RECIPE_HISTORY if gated else n_pos, "repeat": gated,
                "iterations": result.iterations, "fit_seconds": seconds, "parts": ["conj", "copy", "single"],
                "gate": _gate(model_dir), **_ranked(model_dir, stores, settings, client, exclude, repeat),
            })  # fmt: skip
        for names in args.ranking_stacks:
            if "conj" in names and conj_dir is None:
                # No recipe fitted: the conjunction head as the recipe fits it (its own start, N = 8, free prior).
                say("ranking: fitting the conjunction head of N = 8 on the leave-one-out train store")
                conj_dir = models / "loo-conj-n8"
                fitted(
                    conj_dir,
                    FitSettings(max_iter=args.max_iter, context_length=RECIPE_SHORT_CONTEXT),
                    ConjSpec(FitSettings().head_spec(), order=RECIPE_CONJ_ORDER),
                )
            missing = [name for name in names if name != "conj" and name not in single_dirs]
            if missing:
                raise ValueError(f"--ranking-stacks: {', '.join(missing)} not a window of --ranking-grid")
            paths = tuple(str(conj_dir if name == "conj" else single_dirs[name]) for name in names)
            window = max(RECIPE_SHORT_CONTEXT if name == "conj" else int(name.split(":")[0]) for name in names)
            say(f"ranking: fitting the stack {' + '.join(names)} (N = {window}), its gate on the validation store")
            model_dir = models / ("loo-stack-" + "-".join(name.replace(":", "k") for name in names))
            result, seconds = fitted(
                model_dir, FitSettings(max_iter=args.max_iter, context_length=window), StackSpec(paths, "target")
            )
            stacks.append({
                "context": window, "parts": list(names), "iterations": result.iterations, "fit_seconds": seconds,
                "gate": _gate(model_dir), **_ranked(model_dir, stores, settings, client, exclude, repeat),
            })  # fmt: skip
    return {**split, "settings": settings.to_json(), "exclude_history": exclude, "repeat_gate": repeat is not None,
            "heads": heads, "recipes": recipes, "stacks": stacks}  # fmt: skip


def _part_label(name: str) -> str:
    return "conj N=8" if name == "conj" else f"N={name.replace(':', ' K=')}"


def ranking_rows(ranking: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, figures) of every fitted model of the ranking part: single heads, recipes, stacks, each followed by the
    repeat gate fitted on it (``--ranking-repeat-gate``)."""
    rows = [(f"head N={h['context']} K={h['buckets']}", h) for h in ranking["heads"]]
    for r in ranking.get("recipes", []):
        gate = "/".join(f"{g:.2f}" for g in r["gate"]) if r.get("gate") else "-"
        rows.append((f"recipe N={r['context']}{' + repeat' if r.get('repeat') else ''} (gate {gate})", r))
    for s in ranking.get("stacks", []):
        gate = "/".join(f"{g:.2f}" for g in s["gate"]) if s.get("gate") else "-"
        rows.append((f"stack {' + '.join(_part_label(n) for n in s['parts'])} (gate {gate})", s))
    with_gates = []
    for label, figures in rows:
        with_gates.append((label, figures))
        if figures.get("repeat_gate") is not None:
            with_gates.append((f"{label} + repeat gate", figures["repeat_gate"]))
    return with_gates


def ranking_best(ranking: dict[str, Any]) -> dict[str, Any] | None:
    """The ranking targets: the best full NDCG@K among the long-history models (single heads, recipes and stacks whose
    window is longer than N = 8), and the lowest perplexity among them, each over the N = 8 head's."""
    reference = next(
        (h for h in ranking["heads"] if h["context"] == REFERENCE_CONTEXT and h["buckets"] == REFERENCE_CONTEXT), None
    )
    others = [(label, f) for label, f in ranking_rows(ranking) if f.get("history", f["context"]) > REFERENCE_CONTEXT]
    if reference is None or not others:
        return None
    ndcg = max(others, key=lambda row: row[1]["ranking"]["full"]["ndcg"])
    perplexity = min(others, key=lambda row: row[1]["perplexity"])
    return {
        "ndcg_model": ndcg[0],
        "ndcg_over_reference": ndcg[1]["ranking"]["full"]["ndcg"] / reference["ranking"]["full"]["ndcg"],
        "perplexity_model": perplexity[0],
        "perplexity_over_reference": perplexity[1]["perplexity"] / reference["perplexity"],
    }


def ranking_report(ranking: dict[str, Any]) -> list[str]:
    k = ranking["settings"]["k"]
    negatives = ranking["settings"]["negatives"]
    excluded = bool(ranking.get("exclude_history"))
    lines = [
        "",
        f"ranking each document's last item at K = {k}, leave-one-out split ({ranking['documents']} documents, "
        f"{ranking['skipped_documents']} of fewer than 3 items skipped; T = {ranking['num_symbols']}"
        + (f", items rated >= {ranking['min_item_ratings']} times" if ranking.get("min_item_ratings") else "")
        + f"); full: every target; sampled: {negatives} unseen negatives; ties pessimistic"
        + ("; excl.: full, the history's items excluded" if excluded else ""),
    ]
    width = max(len(label) for label, _ in ranking_rows(ranking)) + 2
    extra = f"  {'HR':>8}{'NDCG':>8}{'MRR':>8}" if excluded else ""
    header = (
        f"{'':<{width}}{'rows':>6}{'HR':>8}{'NDCG':>8}{'MRR':>8}  {'HR':>8}{'NDCG':>8}{'MRR':>8}{extra}"
        f"{'perplexity':>12}"
    )
    lines += [
        f"{'':<{width + 6}}{'full':>24}  {'sampled':>24}" + (f"  {'full, excl.':>24}" if excluded else ""),
        header,
        "-" * len(header),
    ]

    def cells(figures: dict[str, Any], excl: dict[str, Any] | None) -> str:
        full, sampled = figures["full"], figures["sampled"]
        text = (
            f"{full['rows']:>6}{full['hit_rate']:>8.4f}{full['ndcg']:>8.4f}{full['mrr']:>8.4f}  "
            f"{sampled['hit_rate']:>8.4f}{sampled['ndcg']:>8.4f}{sampled['mrr']:>8.4f}"
        )
        if excluded:
            if excl is None:
                return text + f"  {'-':>24}"
            e = excl["full"]
            text += f"  {e['hit_rate']:>8.4f}{e['ndcg']:>8.4f}{e['mrr']:>8.4f}"
        return text

    for label, f in ranking_rows(ranking):
        excl = f["excluded"] if excluded else None
        lines.append(f"{label:<{width}}{cells(f['ranking'], excl)}{f['perplexity']:>12.2f}")
    # The baselines: most popular and the Markov chain do not depend on the window; item-KNN once per window.
    labels = {"most_popular": "most popular", "markov": "Markov (KN bigram)", "item_knn": "item-KNN"}
    seen: set[tuple[str, int]] = set()
    for label, f in ranking_rows(ranking):
        if label.endswith(" + repeat gate"):
            continue  # its baselines are its wrapped model's (item-KNN over that model's window)
        rk, excl = f["ranking"], f["excluded"] if excluded else None
        window = int(f["context"])
        for name, figures in rk["baselines"].items():
            key = (name, window if name == "item_knn" else 0)
            if key in seen:
                continue
            seen.add(key)
            shown = None
            if name == "markov":
                shown = f["baseline_perplexity"]["kneser_ney"]
            elif name == "most_popular":
                shown = f["baseline_perplexity"]["unigram"]
            tail = f"{shown:>12.2f}" if shown is not None else f"{'-':>12}"
            extra_label = f" (window {window})" if name == "item_knn" else ""
            base_excl = excl["baselines"][name] if excl is not None else None
            lines.append(f"{labels.get(name, name) + extra_label:<{width}}{cells(figures, base_excl)}{tail}")
    lines.append(
        "  perplexity: of the held-out test targets (most popular: the add-k unigram's; Markov: the Kneser-Ney "
        "bigram's); a head's rows are its own window's (min_context 1: every kept user); gates in the order of "
        "the parts (a recipe's: conj, copy, single)"
    )
    if ranking.get("repeat_gate"):
        lines.append(
            "  + repeat gate: the model above it under a fitted repeat gate (fit --head repeat --repeat-from MODEL "
            f"--context {REPEAT_HISTORY:,}): its distribution split into the user's whole history and the rest, each "
            "renormalized, the repeat rate by history length counted on the validation store"
        )
    return lines


# ------------------------------------------------------------------------------------------ report


def targets_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    latency, quality, kernel = report.get("latency"), report.get("quality"), report.get("kernel")
    best = ranking_best(report["ranking"]) if report.get("ranking") else None
    flat = latency.get("predictor_flatness") if latency else None
    far_flat = latency.get("codebook_flatness") if latency else None
    ratio = quality.get("best_over_reference") if quality else None
    corpus = kernel["corpora"][0]["corpus"] if kernel and kernel.get("corpora") else None
    speedup = next(
        (
            f["dense"]["histogram_over_per_position"]
            for f in (kernel or {}).get("figures", [])
            if f["corpus"] == corpus and f["context"] == TARGET_KERNEL_CONTEXT
        ),
        None,
    )
    return [
        {
            "name": f"histogram / per-position rows/s, N = {TARGET_KERNEL_CONTEXT}, {corpus}, dense",
            "target": f">= {TARGET_KERNEL_SPEEDUP:g}",
            "measured": speedup,
            "pass": None if speedup is None else bool(speedup >= TARGET_KERNEL_SPEEDUP),
        },
        {
            "name": "histogram predictor latency, slowest / fastest history",
            "target": f"<= {TARGET_LATENCY_FLAT}",
            "measured": flat,
            "pass": None if flat is None else bool(flat <= TARGET_LATENCY_FLAT),
        },
        {
            "name": "codebook predictor latency, slowest / fastest history",
            "target": f"<= {TARGET_LATENCY_FLAT}",
            "measured": far_flat,
            "pass": None if far_flat is None else bool(far_flat <= TARGET_LATENCY_FLAT),
        },
        {
            "name": f"best N > {REFERENCE_CONTEXT} head / N = {REFERENCE_CONTEXT} head (perplexity)",
            "target": f"<= {TARGET_LONG_OVER_SHORT}",
            "measured": ratio,
            "pass": None if ratio is None else bool(ratio <= TARGET_LONG_OVER_SHORT),
        },
        {
            "name": f"ranking: best N > {REFERENCE_CONTEXT} model / N = {REFERENCE_CONTEXT} head (full NDCG)",
            "target": f">= {TARGET_RANKING_OVER_SHORT}",
            "measured": best["ndcg_over_reference"] if best else None,
            "pass": None if best is None else bool(best["ndcg_over_reference"] >= TARGET_RANKING_OVER_SHORT),
            "model": best["ndcg_model"] if best else None,
        },
        {
            "name": f"ranking: best N > {REFERENCE_CONTEXT} model / N = {REFERENCE_CONTEXT} head (perplexity)",
            "target": f"<= {TARGET_LONG_OVER_SHORT}",
            "measured": best["perplexity_over_reference"] if best else None,
            "pass": None if best is None else bool(best["perplexity_over_reference"] <= TARGET_LONG_OVER_SHORT),
            "model": best["perplexity_model"] if best else None,
        },
    ]


def format_report(report: dict[str, Any]) -> str:
    corpus, host = report["corpus"], report["host"]
    sequences, unit = corpus["sequences"], corpus["unit"]
    lengths = corpus[f"train_{unit}_lengths"]
    lines = [
        f"dist_respattn long contexts on {sequences} {'token' if unit == 'file' else 'item'} sequences",
        f"  corpus     {corpus['description']}; {unit}s train/validation/test {corpus[unit + 's']}",
        f"             train {unit}s' lengths: median {lengths['median']}, max {lengths['max']}; {unit}s with a "
        "full window of N: " + ", ".join(f"{n}: {c}" for n, c in lengths[f"{unit}s_with_full_windows"].items()),
        f"  host       {host['cpu_count']} cores, load average before {host['load_before']:.2f}, "
        f"after {host['load_after']:.2f}; python {host['python']}, numpy {host['numpy']}, numba {host['numba']}",
    ]
    kernel = report.get("kernel")
    if kernel:
        cfg = report["config"]
        lines += [
            "",
            f"E-step rows/s per core (one thread, in-process, best of {cfg['repeats']}); histogram = "
            "seq_update_windows, per-position = seq_update(checked=True), on the same full-window rows",
            "  head: random_distribution(S, N, 32, T), prior tied over K = ceil(log2 N) + 1 geometric buckets; "
            f"rows: at most {cfg['kernel_rows']:,} and {cfg['kernel_positions']:,} / N a window",
        ]
        for source in kernel["corpora"]:
            name = source["corpus"]
            figures = [f for f in kernel["figures"] if f["corpus"] == name]
            lines += ["", f"{name}: {source['description']}; {source['tokens']:,} tokens"]
            header = (
                f"{'N':>5}{'K':>4}{'rows':>9}{'per-doc':>10}{'distinct':>10}{'/bucket':>9}  {'emission':<8}"
                f"{'per-position':>14}{'histogram':>13}{'hist/pos':>10}{'agree':>9}"
            )
            lines += [header, "-" * len(header)]
            for f in figures:
                for i, layout in enumerate(("dense", "sparse")):
                    if layout not in f:
                        continue
                    g = f[layout]
                    lead = (
                        f"{f['context']:>5}{f['buckets']:>4}{f['rows']:>9,}{f['per_document_full_rows']:>10,}"
                        f"{f['distinct']['per_window']:>10.1f}{f['distinct']['per_bucket_mean']:>9.1f}"
                        if i == 0
                        else " " * 47
                    )
                    lines.append(
                        f"{lead}  {layout:<8}{g['per_position']['rows_per_s']:>14,.0f}"
                        f"{g['histogram']['rows_per_s']:>13,.0f}{g['histogram_over_per_position']:>9.2f}x"
                        f"{g['agreement']:>9.1e}"
                    )
            reference = next((f for f in figures if f["context"] == REFERENCE_CONTEXT and "dense" in f), None)
            for f in figures:
                if "codebook" not in f:
                    continue
                rate = f["codebook"]["rows_per_s"]
                versus = (
                    f" ({rate / reference['dense']['per_position']['rows_per_s']:.2f}x the N = 8 head's per-position)"
                    if reference
                    else ""
                )
                lines.append(
                    f"  codebook head N = {f['context']} (N0 = {cfg['codebook'][0]}, {cfg['codebook'][1]} x "
                    f"{cfg['codebook'][2]}): {rate:,.0f} rows/s{versus}"
                )
            for f in figures:
                per = ", ".join(f"{v:.1f}" for v in f["distinct"]["per_bucket"])
                support = f.get("sparse_support")
                extra = (
                    f"; sparse support {support['pairs']:,} pairs ({support['fraction_of_cells']:.1%} of S x T)"
                    if support
                    else ""
                )
                lines.append(
                    f"  N = {f['context']}: buckets {tuple(f['bucket_sizes'])}, distinct a bucket {per}{extra}"
                )
        lines += [
            f"  per-doc: full-window rows the corpus has per document ({sequences}: per {unit}); distinct: mean",
            "  distinct symbols a window (the histogram kernel's terms a row); /bucket: mean over the K buckets of",
            "  the distinct symbols in a bucket; agree: max relative difference of the two kernels' statistics",
            "  (bucket masses summed)",
        ]
        if not cfg["sparse"]:
            lines.append("  sparse emission: skipped (--no-sparse)")
    latency = report.get("latency")
    if latency:
        lines += [
            "",
            f"streaming prediction, N = {latency['context']} (K = {latency['buckets']}), per token, median of "
            f"{latency['steps']} steps from each history on",
        ]
        if latency["predictor_missing"]:
            lines.append(f"  predictor: not available ({latency['predictor_missing']})")
        header = (
            f"{'history':>9}{'predictor':>12}{'p90':>10}{'recompute':>12}{'predict_proba':>15}"
            f"{'recompute/predictor':>21}{'max |diff|':>12}{'distinct':>10}{'rows read':>11}{'fewest':>8}"
        )
        lines += [header, "-" * len(header)]
        for e in latency["histories"]:
            has = "predictor_s" in e
            proba = e["recompute_predict_proba_s"]
            lines.append(
                f"{e['history']:>9,}"
                + (
                    f"{e['predictor_s'] * 1e6:>10,.0f}us{e['predictor_p90_s'] * 1e6:>8,.0f}us"
                    if has
                    else f"{'-':>12}{'-':>10}"
                )
                + f"{e['recompute_numpy_s'] * 1e6:>10,.0f}us"
                + (f"{proba * 1e6:>13,.0f}us" if proba is not None else f"{'-':>15}")
                + (f"{e['recompute_numpy_s'] / e['predictor_s']:>20.1f}x" if has else f"{'-':>21}")
                + (f"{e['predictor_max_abs_difference']:>12.1e}" if has else f"{'-':>12}")
                + (f"{e['distinct_symbols']:>10,.1f}" if has else f"{'-':>10}")
                + (
                    f"{e['predictor_rows_read']:>11,.1f}"
                    if has and e["predictor_rows_read"] is not None
                    else f"{'-':>11}"
                )
                + (f"{e['fewest_rows_exact']:>8,.1f}" if e.get("fewest_rows_exact") is not None else f"{'-':>8}")
            )
            if "predictor_error" in e:
                lines.append(f"  predictor failed: {e['predictor_error']}")
        lines.append(
            "  recompute: from scratch per token in NumPy over the last min(history, N) tokens; predict_proba: the "
            "package's per-window path (full windows only); max |diff|: predictor vs recompute after the last step; "
            "distinct: the window's distinct symbols, rows read: the emission rows a prediction read; fewest: the "
            "fewest rows any prediction exact to the predictor's tolerance could read (the unread rows' own sum, "
            f"over {FEWEST_ROWS_STEPS} steps) (medians)"
        )
        full = latency.get("predictor_flatness_full_windows")
        if full is not None:
            lines.append(f"  informational: slowest / fastest over the histories >= N only: {full:.3f}")
        if latency.get("codebook"):
            lines.append(f"  codebook far field's predictor ({latency['codebook']}), per token, median (p90):")
            for e in latency["histories"]:
                diff = e["codebook_max_abs_difference"]
                lines.append(
                    f"{e['history']:>9,}{e['codebook_s'] * 1e6:>10,.0f}us ({e['codebook_p90_s'] * 1e6:,.0f}us)"
                    + (f"  max |diff| from predict_proba {diff:.1e}" if diff is not None else "")
                )
    quality = report.get("quality")
    if quality:
        ref = quality["reference"]
        kn = quality["baselines"]["kneser_ney"] if quality["baselines"] else None
        lines += [
            "",
            f"test perplexity, {sequences}, min_context = 1 (the same {quality['test_rows']:,} test targets for every "
            f"row: {'yes' if quality['same_targets_for_all'] else 'NO'}), max_iter {report['config']['max_iter']}, "
            "early stopping on validation",
        ]
        header = f"{'':<34}{'perplexity':>11}{'/ N=8':>8}{'/ KN':>8}{'iters':>7}{'seconds':>9}"
        lines += [header, "-" * len(header)]
        names = [
            ("unigram", "unigram"),
            ("add_k", "add-k bigram (k tuned)"),
            ("jelinek_mercer", "Jelinek-Mercer (λ tuned)"),
            ("kneser_ney", "Kneser-Ney, interpolated (D tuned)"),
        ]
        for key, label in names:
            value = quality["baselines"][key]
            over_ref = f"{value / ref['perplexity']:>8.3f}" if ref else f"{'-':>8}"
            lines.append(f"{label:<34}{value:>11.2f}{over_ref}{value / kn:>8.3f}")
        for h in quality["heads"]:
            sizes = h["bucket_sizes"]
            kind = "free" if sizes is not None and len(sizes) == h["context"] else "buckets"
            label = f"head N={h['context']} K={h['buckets']} ({kind})"
            if h.get("kind") == "codebook":
                label = f"codebook N={h['context']} N0={h['near_window']} {h['codebooks']}x{h['codewords']}"
            over_ref = f"{h['perplexity'] / ref['perplexity']:>8.3f}" if ref else f"{'-':>8}"
            mark = "  <- best N > 8" if h["best_long_context"] else ""
            lines.append(
                f"{label:<34}{h['perplexity']:>11.2f}{over_ref}{h['perplexity'] / kn:>8.3f}{h['iterations']:>7}"
                f"{h['seconds']:>9.1f}{mark}"
            )
    ranking = report.get("ranking")
    if ranking:
        lines += ranking_report(ranking)
    lines += ["", "targets (measured, not asserted)"]
    for t in report["targets"]:
        shown = "-" if t["measured"] is None else f"{t['measured']:.3f}"
        verdict = "not measured" if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        model = f" ({t['model']})" if t.get("model") else ""
        lines.append(f"  {t['name']:<62}{t['target']:<9}{shown:>8}  {verdict}{model}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dist-respattn-corpus-cache"))
    parser.add_argument("--work", help="where the stores and models go (default: a temporary directory)")
    parser.add_argument("--sequences", choices=SEQUENCES, default="movielens", help="the corpus (see above)")
    parser.add_argument(
        "--items", type=int, default=2000, help="most rated train items (stdlib: tokens) kept (S = T = items + 1)"
    )
    parser.add_argument("--max-tokens", type=int, help="stdlib: take at most this many tokens of the source")
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="windows N of the kernel timings")
    parser.add_argument("--kernel-positions", type=int, default=1 << 23, help="timed rows a window: at most this / N")
    parser.add_argument("--kernel-rows", type=int, default=500_000, help="timed rows a window: at most this many")
    parser.add_argument("--no-stdlib", action="store_true", help="time the kernels on the sequences only")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each kernel (the best is kept)")
    parser.add_argument("--min-seconds", type=float, default=0.2, help="a timed run loops until it lasts this long")
    parser.add_argument("--stats-rows", type=int, default=2000, help="windows sampled for the distinct-symbol counts")
    parser.add_argument("--no-sparse", action="store_true", help="time the dense emission only")
    parser.add_argument("--latency-context", type=int, default=LATENCY_CONTEXT)
    parser.add_argument("--histories", default=",".join(map(str, HISTORIES)), help="history lengths of the latency")
    parser.add_argument("--latency-steps", type=int, default=200, help="tokens timed from each history on")
    parser.add_argument("--grid", default=GRID, help='fits of the quality part, "N:K,K;N:K" (K = N: the free prior)')
    parser.add_argument(
        "--ranking-grid", default=RANKING_GRID, help='fits of the ranking part on the leave-one-out split, "N:K;N:K"'
    )
    parser.add_argument(
        "--codebook-contexts",
        default=CODEBOOK_CONTEXTS,
        help="windows N of the codebook heads the quality part fits from its N = 8 head, and whose E-step the kernel "
        'part times ("" for none)',
    )
    parser.add_argument("--near-window", type=int, default=8, help="the codebook heads' near window N0")
    parser.add_argument("--codebooks", type=int, default=8, help="the codebook heads' B")
    parser.add_argument("--codewords", type=int, default=16, help="the codebook heads' W")
    parser.add_argument(
        "--ranking-recipes",
        default=RANKING_RECIPES,
        help='windows N of the recipes the ranking part fits ("" for none)',
    )
    parser.add_argument(
        "--ranking-stacks",
        default=RANKING_STACKS,
        help='stacks the ranking part fits, "conj+8+32;8+128": conj (the first recipe\'s conjunction head of '
        'N = 8) and windows N (or N:K) of --ranking-grid, their gate on the validation store ("" for none)',
    )
    parser.add_argument(
        "--ranking-exclude-history",
        action="store_true",
        help="also rank every model with the history's items excluded from the full protocol's candidates",
    )
    parser.add_argument(
        "--ranking-repeat-gate",
        action="store_true",
        help="also fit a repeat gate over the user's whole history on every model (fit --head repeat) and rank it",
    )
    parser.add_argument("--ranking-k", type=int, default=10, help="the ranking part's cut-off K")
    parser.add_argument("--ranking-negatives", type=int, default=100, help="negatives of the sampled protocol")
    parser.add_argument("--max-iter", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random heads")
    parser.add_argument("--skip-kernel", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-ranking", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="small sizes, under a minute (flags given beside it win): " + json.dumps(SMOKE),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object after the table")
    args = parser.parse_args(argv)
    if args.smoke:  # the smoke sizes become the defaults: a flag given beside --smoke still wins
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    args.contexts = [int(v) for v in str(args.contexts).split(",") if v.strip()]
    args.histories = [int(v) for v in str(args.histories).split(",") if v.strip()]
    args.grid = parse_grid(args.grid)
    args.codebook_contexts = [int(v) for v in str(args.codebook_contexts).split(",") if v.strip()]
    args.ranking_grid = parse_grid(args.ranking_grid)
    args.ranking_recipes = [int(v) for v in str(args.ranking_recipes).split(",") if v.strip()]
    try:
        args.ranking_stacks = parse_stacks(str(args.ranking_stacks))
    except ValueError as exc:
        parser.error(str(exc))
    for name in (
        "kernel_positions",
        "kernel_rows",
        "repeats",
        "stats_rows",
        "latency_context",
        "latency_steps",
        "max_iter",
        "ranking_k",
        "ranking_negatives",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")
    if min(args.contexts + args.histories, default=1) < 1:
        parser.error("windows and histories must be positive")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import numba

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-long-context-") as temp:
        work = Path(args.work or temp)
        say(f"writing the {args.sequences} stream stores")
        corpus = write_stores(args, work / "stores")
        report["corpus"] = {k: v for k, v in corpus.items() if k not in ("stores", "stream", "table", "loo_source")}
        # The single-threaded parts first, before any worker process exists.
        report["kernel"] = None if args.skip_kernel else kernel_part(args, corpus, work)
        report["latency"] = None if args.skip_latency else latency_part(args, corpus)
        with ExitStack() as stack:
            shared = None
            if not (args.skip_quality or args.skip_ranking):
                from dist_respattn.engine import ClusterOptions, connect

                shared = stack.enter_context(connect(ClusterOptions(n_workers=args.workers), say=say))
            report["quality"] = None if args.skip_quality else quality_part(args, corpus, work, shared)
            report["ranking"] = None if args.skip_ranking else ranking_part(args, corpus, work, shared)
    report["config"] = {
        "contexts": args.contexts,
        "kernel_positions": args.kernel_positions,
        "kernel_rows": args.kernel_rows,
        "sequences": args.sequences,
        "max_tokens": args.max_tokens if args.sequences == "stdlib" else None,
        "stdlib": not args.no_stdlib and args.sequences != "stdlib",
        "repeats": args.repeats,
        "min_seconds": args.min_seconds,
        "sparse": not args.no_sparse,
        "latency_context": args.latency_context,
        "histories": args.histories,
        "latency_steps": args.latency_steps,
        "grid": [list(p) for p in args.grid],
        "codebook_contexts": args.codebook_contexts,
        "codebook": [args.near_window, args.codebooks, args.codewords],
        "ranking_grid": [list(p) for p in args.ranking_grid],
        "ranking_recipes": args.ranking_recipes,
        "ranking_stacks": ["+".join(names) for names in args.ranking_stacks],
        "ranking_exclude_history": args.ranking_exclude_history,
        "ranking_repeat_gate": args.ranking_repeat_gate,
        "ranking_k": args.ranking_k,
        "ranking_negatives": args.ranking_negatives,
        "max_iter": args.max_iter,
        "workers": args.workers,
        "seed": args.seed,
        "smoke": args.smoke,
    }
    report["host"] = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "wall_seconds": time.perf_counter() - started,
    }
    report["targets"] = targets_of(report)
    print(format_report(report))
    print(f"\nwall time {report['host']['wall_seconds']:.0f} s")
    if args.json:
        print(json.dumps(report, indent=2, default=float))
    return report


if __name__ == "__main__":
    main()
