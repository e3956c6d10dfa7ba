"""One corpus split into train, validation and test stores that share its vocabulary and embedding table.

A document goes to a split by a hash of the split seed and its key, so the split does not depend on
the machine, the file order or the other documents:
``u = int(sha256(f"split\\n{seed}\\n{key}")[:8]) / 2**64``; train when ``u < f_train``, validation when
``u < f_train + f_validation``, else test. The key of a text file is its path relative to the root
it was found under (:class:`~dist_respattn.store.ingest.text.TextDocument`); that of a token document is its
index. A token stream without document starts is cut into contiguous documents of
``block_tokens`` tokens (default 10,000), so the splits interleave through the stream; no window
spans two of them.

Attributes (:mod:`~dist_respattn.store.attributes`): a text corpus's ``attribute_by`` gives each row its
file's attribute, a token corpus's ``attributes`` (one id per token) each row its target token's; the names
are those of the whole corpus (every file found, or the ids given), so an id names the same author in all
three stores, whichever documents each got.

``max_tokens`` takes documents in the order of a second hash (``"order"`` for ``"split"``) until
at least that many tokens are taken: a deterministic, unbiased slice of a large corpus.

``hold_out="last"`` (leave-one-out, as recommender benchmarks split item sequences; a token corpus with its
document starts): every document goes to all three stores instead, cut at its end. Train gets all its tokens but
the last two, validation all but the last, test all of them; validation and test are weighted, the row whose
target is the document's last token (there) weighing 1 and every other row 0, so each document holds out
exactly one row in each, and that row's window is its own history (the tokens before it are in the store). A
document of fewer than three tokens has no item to train on before its validation target and is skipped,
counted in the provenance (``split.skipped_documents``) and the report. ``fractions`` do not apply.

``store_format`` ``"stream"`` writes token-stream stores (:mod:`~dist_respattn.store.streams.reader`: each
document's token ids, the rows made from them when read); ``"triples"`` writes every window
(:mod:`~dist_respattn.store.triples.reader`). Both hold the same rows in the same order, with the same
queries, targets and attributes, so a fit on either gives the same head.

The vocabulary is counted on the train documents only (held-out words are out of vocabulary, as
they would be for a model trained on the train store), then the three stores are written in one
pass over the documents, with one writer (one partition of rows) each. Text is read twice (count,
write); a token stream once, plus its document starts. Memory: the writers' buffers, the
vocabulary counts, and a few bytes per document (its split, and its length with ``max_tokens``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np

from dist_respattn.store.attributes import attribute_ids, attribute_provenance, text_attribute_ids
from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.documents import (
    DocumentWindows,
    check_document_starts,
    document_runs,
    fixed_starts,
    starts_blocks,
)
from dist_respattn.store.errors import EmptySplitError, store_exists
from dist_respattn.store.identity import identity_provenance
from dist_respattn.store.ingest.tables import embedding_table, id_bound_hint, inferred_num_symbols
from dist_respattn.store.ingest.text import (
    DEFAULT_VOCAB_SIZE,
    TOKENIZER_NAME,
    Vocabulary,
    count_tokens,
    default_corpus,
    iter_text_documents,
    line_pieces,
    vocabulary_from_counts,
    write_text_document,
)
from dist_respattn.store.ingest.to_stream import open_stream_writer
from dist_respattn.store.ingest.tokens import checked_pieces, load_token_stream
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.streams.reader import TokenStreamStore
from dist_respattn.store.streams.writer import StreamWriter
from dist_respattn.store.triples.reader import TripleStore
from dist_respattn.text_format import count_text

__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "DEFAULT_FRACTIONS",
    "HOLD_OUTS",
    "MIN_HOLD_OUT_LAST_TOKENS",
    "SPLIT_FORMATS",
    "SPLIT_NAMES",
    "TextCorpus",
    "TokenCorpus",
    "assign_split",
    "split_locations",
    "write_split",
]

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "validation", "test")
#: What a split writes: token-stream stores (the ids, ~2 bytes a token) or triple stores (every window).
SPLIT_FORMATS = ("stream", "triples")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
#: What a split holds out: whole documents (by their hash), or each document's last tokens (leave-one-out).
HOLD_OUTS = ("documents", "last")
#: Leave-one-out keeps a document of at least this many tokens: one to train on, one to validate, one to test.
MIN_HOLD_OUT_LAST_TOKENS = 3
#: Documents of a token stream given without starts: contiguous blocks of this many tokens.
DEFAULT_BLOCK_TOKENS = 10_000


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """Text files, globs or directories, as ``ingest --text`` takes them; none: the standard library's source.

    ``attribute_by`` (``"file"`` or ``"directory"``): each row carries its file's attribute.
    """

    paths: Sequence[str | os.PathLike[str]] = ()
    attribute_by: str | None = None


@dataclasses.dataclass(frozen=True)
class TokenCorpus:
    """A token stream (an (L,) int array or ``.npy`` path) and its document starts (array or path, or ``None``).

    Without starts, the stream is cut into documents of ``block_tokens`` tokens. ``attributes``: an attribute id
    per token (array or path; a row takes its target's), named by ``attribute_names`` (a ``NAMES.txt`` path or a
    sequence; default ``"0"``..``"A-1"``).
    """

    tokens: Any
    documents: Any = None
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    attributes: Any = None
    attribute_names: Any = None


def _hash_unit(purpose: str, seed: int, key: str) -> float:
    digest = hashlib.sha256(f"{purpose}\n{seed}\n{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(key: str, seed: int, fractions: Sequence[float]) -> int:
    """The split (0 train, 1 validation, 2 test) of the document with ``key``, by the module docstring's hash."""
    u = _hash_unit("split", seed, key)
    if u < fractions[0]:
        return 0
    return 1 if u < fractions[0] + fractions[1] else 2


def _checked_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    values = tuple(float(f) for f in fractions)
    if len(values) != 3 or not all(math.isfinite(f) and f > 0 for f in values) or not math.isclose(sum(values), 1.0):
        raise ValueError(
            f"fractions = {list(fractions)} (--fractions): expected three numbers > 0, "
            f"for train, validation and test, that sum to 1"
        )
    train, validation, test = values
    return train, validation, test


def split_locations(out_dir: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"train": OUT_DIR/train.zarr, ...}`` as store locations."""
    base = StoreLocation.of(out_dir, storage_options)
    return {name: StoreLocation(f"{base.url}/{name}.zarr", base.storage_options) for name in SPLIT_NAMES}


class _Plan:
    """Which documents go where: ``split`` (int8 per document) and ``taken`` (bool per document)."""

    def __init__(self, keys: Sequence[str], seed: int, fractions: Sequence[float]) -> None:
        self.keys = keys
        self.seed = seed
        self.split = np.fromiter((assign_split(k, seed, fractions) for k in keys), dtype=np.int8, count=len(keys))
        self.taken = np.ones(len(keys), dtype=bool)

    def take_until(self, max_tokens: int, length: Callable[[int], int]) -> None:
        """Keep documents in hashed order until ``max_tokens`` tokens are kept (``length(i)``: document i's tokens)."""
        order = sorted(range(len(self.keys)), key=lambda i: _hash_unit("order", self.seed, self.keys[i]))
        self.taken[:] = False
        total = 0
        for i in order:
            if total >= max_tokens:
                break
            self.taken[i] = True
            total += length(i)

    def documents(self, index: int) -> int:
        return int(np.count_nonzero(self.taken & (self.split == index)))

    def check_every_split_has_documents(self, locations: dict[str, Any], fractions: Sequence[float]) -> None:
        for index, name in enumerate(SPLIT_NAMES):
            if not self.documents(index):
                raise EmptySplitError(
                    f"{locations[name]}: the {name} split gets none of the "
                    f"{count_text(int(self.taken.sum()), 'document')} with "
                    f"fractions {list(fractions)} and split seed {self.seed}: give it a larger fraction "
                    f"(--fractions TRAIN VALIDATION TEST), another --split-seed, or more documents",
                    split=name,
                    documents=int(self.taken.sum()),
                )


def _check_rows(
    locations: dict[str, Any],
    plan: _Plan,
    tokens: dict[str, int],
    rows: dict[str, int],
    n: int,
    *,
    block_tokens: int | None = None,
) -> None:
    """Every split must hold a row: a store of none cannot be fitted or scored. ``block_tokens``: the documents are
    blocks of a stream of that many tokens (none given), which no row can have when they are N tokens or fewer."""
    if block_tokens is not None and block_tokens <= n:
        raise ValueError(
            f"block_tokens = {block_tokens} (--block-tokens): each document is a block of {block_tokens} tokens, "
            f"and a row needs N = {n} tokens of its document before its target: expected more than N tokens a block "
            "(or the documents' starts: --documents STARTS.npy)"
        )
    for index, name in enumerate(SPLIT_NAMES):
        if rows[name] == 0:
            raise ValueError(
                f"{locations[name]}: the {name} split has no rows: its {plan.documents(index)} documents "
                f"({tokens[name]} tokens) have none longer than N = {n} tokens; give it a larger fraction "
                f"(--fractions TRAIN VALIDATION TEST), or a smaller --context"
            )


def _write_stream_document(
    writer: StreamWriter, path: str, vocabulary: Vocabulary, lookup: dict[str, int], attribute: int | None
) -> tuple[int, int]:
    """Write one file's token ids as one document, a piece at a time (tokenized as
    :func:`~dist_respattn.store.ingest.text.write_text_document` does), and return its (tokens,
    out-of-vocabulary tokens).

    A file of no tokens begins no document."""
    tokens = oov = 0
    for piece in line_pieces(path):
        ids = vocabulary.encode(piece, lookup)
        if not ids.size:
            continue
        if not tokens:
            writer.start_document(attribute)
        tokens += int(ids.size)
        oov += int(np.count_nonzero(ids == vocabulary.oov_id))
        writer.write(ids)
    return tokens, oov


def _split_record(
    name: str, fractions: Sequence[float], seed: int, documents: int, max_tokens: int | None
) -> dict[str, Any]:
    return {
        "name": name,
        "fractions": list(fractions),
        "seed": seed,
        "documents": documents,
        "max_tokens": max_tokens,
    }


def write_split(
    out_dir: str | os.PathLike[str],
    source: TextCorpus | TokenCorpus,
    context_length: int,
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    split_seed: int = 0,
    max_tokens: int | None = None,
    vocab_size: int | None = None,
    num_symbols: int | None = None,
    embeddings: Any = None,
    dim: int | None = None,
    seed: int | None = None,
    file_progress: Callable[[int], None] | None = None,
    options: WriteOptions | None = None,
    store_format: str = "stream",
    hold_out: str = "documents",
) -> dict[str, TripleStore | TokenStreamStore]:
    """Split one corpus into ``OUT_DIR/train.zarr``, ``validation.zarr`` and ``test.zarr`` (see the module docstring).

    The three stores share N, S = T, the embedding table (``embeddings``, or ``dim``/``seed`` as
    :func:`~dist_respattn.store.ingest.tokens.embedding_table`) and, for text, the vocabulary of the
    ``vocab_size`` (default :data:`~dist_respattn.store.ingest.text.DEFAULT_VOCAB_SIZE`) most frequent train
    tokens; for tokens S is ``num_symbols`` (default: largest id + 1). Each store records
    ``split`` in its provenance. ``options`` lay out every store (``append`` is refused; with
    ``overwrite`` each replaces its predecessor when it is complete). Every split must get at
    least one row, else nothing is kept and a ``ValueError`` names the split. ``store_format``: ``"stream"``
    (the default, as ``dist-respattn split``'s: the token ids) or ``"triples"`` (every window; the same rows, about
    twenty times the bytes). ``hold_out``: ``"documents"`` (the default: whole documents by their hash) or
    ``"last"`` (leave-one-out: see the module docstring). Returns the stores by name.
    """
    options = options or WriteOptions()
    if hold_out not in HOLD_OUTS:
        raise ValueError(f"hold_out = {hold_out!r} (--hold-out): expected one of {', '.join(HOLD_OUTS)}")
    if store_format not in SPLIT_FORMATS:
        raise ValueError(f"store_format = {store_format!r} (--format): expected one of {', '.join(SPLIT_FORMATS)}")
    if options.append:
        raise ValueError("append=True (--append): a split writes three new stores; write them again, or ingest more")
    if isinstance(context_length, bool) or not isinstance(context_length, (int, np.integer)) or context_length < 1:
        raise ValueError(f"context_length = {context_length!r} (--context): expected a positive integer")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens = {max_tokens!r} (--max-tokens): expected a positive number of tokens")
    fractions = _checked_fractions(fractions)
    locations = split_locations(out_dir, options.storage_options)
    if not options.overwrite:
        for location in locations.values():
            if location.exists():
                raise store_exists(location, appendable=False)
    if isinstance(source, TextCorpus):
        if hold_out == "last":
            raise ValueError(
                "hold_out='last' (--hold-out last) holds out each document's last token: it takes a token corpus "
                "with its document starts (--tokens T.npy --documents STARTS.npy)"
            )
        if embeddings is not None or num_symbols is not None:
            raise ValueError("embeddings and num_symbols (--embeddings, --symbols) are for a token corpus")
    elif vocab_size is not None:
        raise ValueError("vocab_size (--vocab-size) is for a text corpus: a token corpus has S = largest id + 1")
    # The stores' writers make OUT_DIR; a split that fails leaves none of its stores, nor a folder it made for them.
    base = StoreLocation.of(out_dir, options.storage_options)
    made_here = not base.exists()
    try:
        return _write_stores(
            locations, source, int(context_length), fractions, split_seed, max_tokens, vocab_size, num_symbols,
            embeddings, dim, seed, file_progress, options, store_format, hold_out,
        )  # fmt: skip
    except BaseException:
        if made_here:
            _remove_empty_folder(base)
        raise


def _remove_empty_folder(location: StoreLocation) -> None:
    """Remove the folder at ``location`` when it is there and empty (anything in it is kept)."""
    fs, root = location.filesystem()
    try:
        if fs.isdir(root) and not fs.ls(root):
            fs.rmdir(root)
    except OSError:  # the failure being raised says more than this one
        logger.warning("%s: could not remove the empty folder a failed split made", location)


def _write_stores(
    locations: dict[str, Any],
    source: TextCorpus | TokenCorpus,
    context_length: int,
    fractions: Sequence[float],
    split_seed: int,
    max_tokens: int | None,
    vocab_size: int | None,
    num_symbols: int | None,
    embeddings: Any,
    dim: int | None,
    seed: int | None,
    file_progress: Callable[[int], None] | None,
    options: WriteOptions,
    store_format: str,
    hold_out: str,
) -> dict[str, TripleStore | TokenStreamStore]:
    """The three stores of :func:`write_split`, its arguments checked."""
    if isinstance(source, TextCorpus):
        return _split_text(
            locations,
            source,
            context_length,
            fractions,
            split_seed,
            max_tokens,
            vocab_size,
            dim,
            seed,
            file_progress,
            options,
            store_format,
        )
    if hold_out == "last":
        return _split_last(
            locations, source, context_length, split_seed, max_tokens, num_symbols, embeddings, dim, seed,
            options, store_format,
        )  # fmt: skip
    return _split_tokens(
        locations,
        source,
        context_length,
        fractions,
        split_seed,
        max_tokens,
        num_symbols,
        embeddings,
        dim,
        seed,
        options,
        store_format,
    )


def _check_text_splits(
    plan: _Plan, documents: Sequence[Any], locations: dict[str, Any], fractions: Sequence[float]
) -> None:
    """:meth:`_Plan.check_every_split_has_documents`, whose refusal says how many of the files taken are empty (no
    document of any store, though assigned to a split), and, when all are, that there is no text to split."""
    try:
        plan.check_every_split_has_documents(locations, fractions)
    except EmptySplitError as exc:
        taken = np.flatnonzero(plan.taken).tolist()
        empty = sum(1 for i in taken if os.path.getsize(documents[i].path) == 0)
        if taken and empty == len(taken):
            found = ", ".join(str(documents[i].path) for i in taken[:3]) + (", ..." if len(taken) > 3 else "")
            raise ValueError(
                f"{count_text(len(taken), 'file')} found ({found}), every one empty: no text to split; give files "
                "or directories that hold text (--text PATH ...)"
            ) from None
        if empty:
            raise EmptySplitError(
                f"{exc} ({empty} of the {count_text(len(taken), 'file')} are empty: no document of any split)",
                split=exc.split,
                documents=exc.documents,
            ) from None
        raise


def _split_text(
    locations: dict[str, Any],
    source: TextCorpus,
    n: int,
    fractions: Sequence[float],
    split_seed: int,
    max_tokens: int | None,
    vocab_size: int | None,
    dim: int | None,
    seed: int | None,
    file_progress: Callable[[int], None] | None,
    options: WriteOptions,
    store_format: str,
) -> dict[str, TripleStore | TokenStreamStore]:
    paths = [os.fspath(p) for p in source.paths] or [default_corpus()]
    documents = iter_text_documents(paths)
    attributes = text_attribute_ids([d.key for d in documents], source.attribute_by)
    plan = _Plan([d.key for d in documents], split_seed, fractions)
    counts: Counter[str] = Counter()

    def counted(i: int) -> Counter[str]:
        found = count_tokens(documents[i].path)
        if file_progress is not None:
            file_progress(1)
        return found

    if max_tokens is not None:
        # Counting a file tells its length; a train file's counts go to the vocabulary on the way.
        def length(i: int) -> int:
            found = counted(i)
            if plan.split[i] == 0:
                counts.update(found)
            return sum(found.values())

        plan.take_until(max_tokens, length)
        _check_text_splits(plan, documents, locations, fractions)
    else:
        _check_text_splits(plan, documents, locations, fractions)
        for train_document in np.flatnonzero(plan.split == 0).tolist():
            counts.update(counted(train_document))
    size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    vocabulary = vocabulary_from_counts(counts, size, plan.documents(0))
    table, table_info = embedding_table(vocabulary.num_symbols, dim=dim, seed=seed or 0)
    schema = StoreSchema(vocabulary.num_symbols, n, table.shape[1], vocabulary.num_symbols, options.query_dtype)
    common = {
        "source": "text",
        "paths": [os.path.abspath(p) for p in paths],
        "tokenizer": TOKENIZER_NAME,
        "vocabulary": "vocabulary/zarr.json",
        "vocab_size": len(vocabulary.tokens),
        "embedding": table_info,
        **identity_provenance(vocabulary.tokens, table),
        **({} if attributes is None else attribute_provenance(attributes.by, attributes.merged)),
    }
    names = None if attributes is None else attributes.merged.names
    lookup = vocabulary.lookup()
    tokens = dict.fromkeys(SPLIT_NAMES, 0)
    oov = dict.fromkeys(SPLIT_NAMES, 0)
    rows = dict.fromkeys(SPLIT_NAMES, 0)
    # A file of no tokens is assigned to a split but is no document of its store (a stream keeps none): counted
    # apart, so both formats count the documents a store holds and say how many files were skipped.
    held = dict.fromkeys(SPLIT_NAMES, 0)
    empty = dict.fromkeys(SPLIT_NAMES, 0)
    stream = store_format == "stream"
    with ExitStack() as stack:
        writers: dict[str, Any] = {}
        for index, name in enumerate(SPLIT_NAMES):
            record = {
                **common,
                "files": plan.documents(index),
                "documents": plan.documents(index),
                "split": _split_record(name, fractions, split_seed, plan.documents(index), max_tokens),
            }
            if stream:
                writers[name] = stack.enter_context(
                    open_stream_writer(locations[name], options, provenance=record, attribute_names=names,
                                       num_symbols=vocabulary.num_symbols, table=table, context_length=n)
                )  # fmt: skip
            else:
                writers[name] = stack.enter_context(open_writer(locations[name], schema, options, record, names))
                writers[name].write_embeddings(table)
            writers[name].write_vocabulary(vocabulary.to_json())
        for i, document in enumerate(documents):
            if not plan.taken[i]:
                continue
            owner = SPLIT_NAMES[int(plan.split[i])]
            attribute = None if attributes is None else int(attributes.file_ids[i])
            if stream:
                counted_tokens, unknown = _write_stream_document(
                    writers[owner], document.path, vocabulary, lookup, attribute
                )
                rows[owner] += max(counted_tokens - n, 0)
            else:
                counted_tokens, unknown = write_text_document(
                    writers[owner], document.path, vocabulary, lookup, table, attribute
                )
            tokens[owner] += counted_tokens
            oov[owner] += unknown
            held[owner] += counted_tokens > 0
            empty[owner] += counted_tokens == 0
            if file_progress is not None:
                file_progress(1)
        if not stream:
            rows = {name: writer.rows_written for name, writer in writers.items()}
        _check_rows(locations, plan, tokens, rows, n)
        for name, writer in writers.items():
            if stream:  # the token and document counts are the stream's own
                writer.provenance.update({"oov_count": oov[name], "empty_files": empty[name]})
            else:
                writer.add_provenance(
                    {"tokens_count": tokens[name], "oov_count": oov[name], "documents": held[name],
                     "empty_files": empty[name]}
                )  # fmt: skip
        return {name: writer.close() for name, writer in writers.items()}


def _symbols_and_hint(num_symbols: int | None, stream: Any, name: str) -> tuple[int, str]:
    """S (``--symbols``, else the stream's largest id + 1) and what a refusal of an id out of range says set it."""
    given = num_symbols is not None
    bound = int(num_symbols) if num_symbols is not None else inferred_num_symbols(stream, name)
    return bound, id_bound_hint("S", bound, given=given)


def _split_tokens(
    locations: dict[str, Any],
    source: TokenCorpus,
    n: int,
    fractions: Sequence[float],
    split_seed: int,
    max_tokens: int | None,
    num_symbols: int | None,
    embeddings: Any,
    dim: int | None,
    seed: int | None,
    options: WriteOptions,
    store_format: str,
) -> dict[str, TripleStore | TokenStreamStore]:
    stream, name = load_token_stream(source.tokens)
    length = int(stream.shape[0])
    ids = attribute_ids(source.attributes, length, per=f"token of {name}", names=source.attribute_names)
    if source.documents is not None:
        starts, starts_name, count = check_document_starts(source.documents, length, name)

        def blocks() -> Any:
            return starts_blocks(starts)
    else:
        block = source.block_tokens
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
            raise ValueError(f"block_tokens = {block!r} (--block-tokens): expected a positive number of tokens")
        count, starts_name = -(-length // int(block)), ""

        def blocks() -> Any:
            return fixed_starts(length, int(block))

    plan = _Plan([str(i) for i in range(count)], split_seed, fractions)
    # Document lengths, from the starts alone (the stream is read once, when writing).
    firsts = np.concatenate(list(blocks()) or [np.zeros(0, dtype=np.int64)])
    lengths = np.diff(np.append(firsts, length))
    if max_tokens is not None:
        plan.take_until(max_tokens, lambda i: int(lengths[i]))
    plan.check_every_split_has_documents(locations, fractions)
    num_symbols, hint = _symbols_and_hint(num_symbols, stream, name)
    table, table_info = embedding_table(num_symbols, embeddings=embeddings, dim=dim, seed=seed or 0)
    schema = StoreSchema(num_symbols, n, table.shape[1], num_symbols, options.query_dtype)
    common: dict[str, Any] = {
        "source": "tokens",
        "tokens": os.path.abspath(name) if name != "tokens" else "array",
        "embedding": table_info,
        **identity_provenance(None, table),
    }
    if source.documents is not None:
        common["documents_file"] = os.path.abspath(starts_name) if starts_name != "documents" else "array"
    else:
        common["block_tokens"] = int(source.block_tokens)
    if ids is not None:
        common.update(attribute_provenance("ids", ids.merged, ids.source))
    tokens = {split: int(lengths[plan.taken & (plan.split == index)].sum()) for index, split in enumerate(SPLIT_NAMES)}
    rows = {
        split: int(np.maximum(lengths - n, 0)[plan.taken & (plan.split == index)].sum())
        for index, split in enumerate(SPLIT_NAMES)
    }
    names = None if ids is None else ids.merged.names
    # Checked before a store is begun: a split of no rows makes nothing.
    blocked = None if source.documents is not None else int(source.block_tokens)
    _check_rows(locations, plan, tokens, rows, n, block_tokens=blocked)
    with ExitStack() as stack:
        writers: dict[str, Any] = {}
        for index, split in enumerate(SPLIT_NAMES):
            record = {
                **common,
                "tokens_count": tokens[split],
                "documents": plan.documents(index),
                "split": _split_record(split, fractions, split_seed, plan.documents(index), max_tokens),
            }
            if store_format == "stream":
                # A row's attribute is its target token's: kept per token, as ``ingest --tokens`` keeps them.
                writers[split] = stack.enter_context(
                    open_stream_writer(locations[split], options, provenance=record, attribute_names=names,
                                       attribute_level="token", num_symbols=num_symbols, table=table,
                                       context_length=n)
                )  # fmt: skip
            else:
                writers[split] = stack.enter_context(open_writer(locations[split], schema, options, record, names))
                writers[split].write_embeddings(table)
        if store_format == "stream":
            _stream_token_documents(writers, stream, name, num_symbols, hint, firsts, plan, ids, options)
        else:
            windows = DocumentWindows(n, num_symbols, table, blocks())
            position = 0
            for piece in checked_pieces(stream, name, num_symbols, hint):
                context, query, target, document = windows.feed(piece)
                # A row's attribute is its target token's (every target of a piece lies in it).
                row_ids = (
                    None if ids is None else ids.block(position, position + piece.size)[windows.targets - position]
                )
                position += piece.size
                owner = np.where(plan.taken[document], plan.split[document], -1)
                for index, split in enumerate(SPLIT_NAMES):
                    selected = owner == index
                    if selected.any():
                        writers[split].write(context[selected], query[selected], target[selected], source=name,
                                             attribute=None if row_ids is None else row_ids[selected])  # fmt: skip
        return {split: writer.close() for split, writer in writers.items()}


def _stream_token_documents(
    writers: dict[str, StreamWriter],
    stream: Any,
    name: str,
    num_symbols: int,
    hint: str,
    firsts: np.ndarray,
    plan: _Plan,
    ids: Any,
    options: WriteOptions,
) -> None:
    """Write each taken document's tokens (``firsts`` (n_docs,) their first positions) to its split's stream,
    reading the stream once, piece by piece; a piece is cut where a document starts (an id out of range refused,
    with ``hint``: what set S)."""
    position, document = 0, -1
    for piece in checked_pieces(stream, name, num_symbols, hint):
        for run in document_runs(firsts, position, piece.size, document):
            document = run.document
            if not plan.taken[document]:
                continue
            writer = writers[SPLIT_NAMES[int(plan.split[document])]]
            if run.begins:
                writer.start_document()
            a, b = position + run.start, position + run.stop
            writer.write(piece[run.start : run.stop], attribute=None if ids is None else ids.block(a, b))
            if options.progress is not None:
                options.progress(b - a)
        position += piece.size


def _whole_documents(
    stream: Any, name: str, num_symbols: int, hint: str, firsts: np.ndarray, wanted: np.ndarray
) -> Iterator[tuple[int, np.ndarray]]:
    """``(document, its tokens)`` of each ``wanted`` document, in order, reading the stream once piece by piece
    (ids checked, an id out of range refused with ``hint``: what set S); one document's tokens are held at a time."""
    position, document = 0, -1
    held: list[np.ndarray] = []
    for piece in checked_pieces(stream, name, num_symbols, hint):
        for run in document_runs(firsts, position, piece.size, document):
            if run.begins and document >= 0 and wanted[document]:
                yield document, np.concatenate(held)
            if run.begins:
                held = []
            document = run.document
            if wanted[document]:
                held.append(np.asarray(piece[run.start : run.stop]))
        position += piece.size
    if document >= 0 and wanted[document]:
        yield document, np.concatenate(held)


def _split_last(
    locations: dict[str, Any],
    source: TokenCorpus,
    n: int,
    split_seed: int,
    max_tokens: int | None,
    num_symbols: int | None,
    embeddings: Any,
    dim: int | None,
    seed: int | None,
    options: WriteOptions,
    store_format: str,
) -> dict[str, TripleStore | TokenStreamStore]:
    """Leave-one-out (see the module docstring): each document of at least three tokens cut at its end into the
    three stores, validation and test weighting only the row of the held-out token."""
    if source.documents is None:
        raise ValueError(
            "hold_out='last' (--hold-out last) holds out each document's last token: give the document starts "
            "(--documents STARTS.npy)"
        )
    if store_format != "stream":
        raise ValueError(
            "hold_out='last' (--hold-out last) writes token-stream stores, whose held-out rows keep their whole "
            "history: drop --format triples"
        )
    if source.attributes is not None:
        raise ValueError("hold_out='last' (--hold-out last) takes no --attributes")
    stream, name = load_token_stream(source.tokens)
    length = int(stream.shape[0])
    starts, starts_name, count = check_document_starts(source.documents, length, name)
    firsts = np.concatenate(list(starts_blocks(starts)) or [np.zeros(0, dtype=np.int64)])
    lengths = np.diff(np.append(firsts, length))
    plan = _Plan([str(i) for i in range(count)], split_seed, DEFAULT_FRACTIONS)
    if max_tokens is not None:
        plan.take_until(max_tokens, lambda i: int(lengths[i]))
    kept = plan.taken & (lengths >= MIN_HOLD_OUT_LAST_TOKENS)
    skipped = int(np.count_nonzero(plan.taken & ~kept))
    cut = {"train": 2, "validation": 1, "test": 0}  # tokens cut off each document's end
    tokens = {split: int((lengths[kept] - cut[split]).sum()) for split in SPLIT_NAMES}
    # Rows that count at the window N: train every row of its tokens; validation and test the held-out one, when
    # it has N tokens before it (a reader with a shorter --min-context sees those of shorter histories too).
    rows = {
        "train": int(np.maximum(lengths[kept] - 2 - n, 0).sum()),
        "validation": int(np.count_nonzero(lengths[kept] - 2 >= n)),
        "test": int(np.count_nonzero(lengths[kept] - 1 >= n)),
    }
    what = {"train": "a training token", "validation": "its validation token", "test": "its test token"}
    for split in SPLIT_NAMES:
        if rows[split] == 0:
            documents = count_text(int(kept.sum()), "document")
            raise ValueError(
                f"{locations[split]}: the {split} split has no rows: none of the {documents} of at least "
                f"{MIN_HOLD_OUT_LAST_TOKENS} tokens ({skipped} shorter skipped) has N = {n} tokens before "
                f"{what[split]}; give a smaller --context"
            )
    num_symbols, hint = _symbols_and_hint(num_symbols, stream, name)
    table, table_info = embedding_table(num_symbols, embeddings=embeddings, dim=dim, seed=seed or 0)
    common: dict[str, Any] = {
        "source": "tokens",
        "tokens": os.path.abspath(name) if name != "tokens" else "array",
        "documents_file": os.path.abspath(starts_name) if starts_name != "documents" else "array",
        "embedding": table_info,
        **identity_provenance(None, table),
    }
    with ExitStack() as stack:
        writers: dict[str, Any] = {}
        for split in SPLIT_NAMES:
            record = {
                **common,
                "tokens_count": tokens[split],
                "documents": int(kept.sum()),
                "split": {
                    "name": split,
                    "hold_out": "last",
                    "seed": split_seed,
                    "documents": int(kept.sum()),
                    "skipped_documents": skipped,
                    "max_tokens": max_tokens,
                },
            }
            writers[split] = stack.enter_context(
                open_stream_writer(locations[split], options, provenance=record, weighted=split != "train",
                                   num_symbols=num_symbols, table=table, context_length=n)
            )  # fmt: skip
        for _, document in _whole_documents(stream, name, num_symbols, hint, firsts, kept):
            for split in SPLIT_NAMES:
                part = document[: document.size - cut[split]]
                writers[split].start_document()
                if split == "train":
                    writers[split].write(part)
                else:
                    weight = np.zeros(part.size, dtype=np.float32)
                    weight[-1] = 1.0
                    writers[split].write(part, weight=weight)
            if options.progress is not None:
                options.progress(int(document.size))
        return {split: writer.close() for split, writer in writers.items()}
