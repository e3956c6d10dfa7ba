"""Writing token-stream stores (:mod:`~dist_respattn.store.streams.reader`) from token ids or text files.

The same inputs as the triple writers (:func:`~dist_respattn.store.ingest.tokens.write_tokens`,
:func:`~dist_respattn.store.ingest.text.write_text`), with the same checks and errors, but the store keeps
the ids, not their windows: N is only the default window readers use.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dist_respattn.store.attributes import TextAttributes, attribute_ids, attribute_provenance, text_attribute_ids
from dist_respattn.store.common import WriteOptions
from dist_respattn.store.documents import check_document_starts, document_runs
from dist_respattn.store.errors import SchemaMismatchError
from dist_respattn.store.identity import identity_provenance
from dist_respattn.store.ingest.like import LikeStore, open_like
from dist_respattn.store.ingest.tables import embedding_table, id_bound_hint, inferred_num_symbols
from dist_respattn.store.ingest.text import (
    DEFAULT_VOCAB_SIZE,
    TOKENIZER_NAME,
    Vocabulary,
    iter_text_documents,
    iter_text_files,
)
from dist_respattn.store.ingest.text_pass import TokenizedCorpus, tokenize_files
from dist_respattn.store.ingest.tokens import checked_pieces, load_token_stream
from dist_respattn.store.npy import load_array
from dist_respattn.store.streams.reader import TokenStreamStore
from dist_respattn.store.streams.writer import StreamWriter

__all__ = ["open_stream_writer", "write_stream_text", "write_stream_tokens"]

_BLOCK = 1 << 20


def _reference(out: Any, like: Any, options: WriteOptions) -> LikeStore | None:
    """The store a writer takes N, S, the vocabulary and the table from: ``like``'s, or OUT itself for an append."""
    if options.append:
        if like is not None:
            open_like(like, options)  # refuses the pair, naming both flags
        store = TokenStreamStore.open(out, storage_options=options.storage_options)
        return LikeStore(store, role="--append to")
    return open_like(like, options)


def open_stream_writer(
    out: Any,
    options: WriteOptions,
    *,
    provenance: dict[str, Any],
    weighted: bool = False,
    attribute_names: Sequence[str] | None = None,
    attribute_level: str = "document",
    **new_store: Any,
) -> StreamWriter:
    """A writer of a new token-stream store at ``out``, laid out per ``options`` (chunks and shards of
    ``options.chunk_rows`` and ``options.partition_rows`` tokens; ``new_store``: its ``num_symbols``, ``table`` and
    ``context_length``; attributes at ``attribute_level``), or, with ``options.append``, of an append to ``out`` (at
    the store's own level; ``new_store`` unused)."""
    if options.append:
        return StreamWriter.append(
            out, weighted=weighted, storage_options=options.storage_options, provenance=provenance,
            attribute_names=attribute_names,
        )  # fmt: skip
    return StreamWriter(
        out, weighted=weighted, chunk_tokens=options.chunk_rows, partition_tokens=options.partition_rows,
        query_dtype=options.query_dtype, overwrite=options.overwrite, storage_options=options.storage_options,
        provenance=provenance, attribute_names=attribute_names, attribute_level=attribute_level, **new_store,
    )  # fmt: skip


def _check_window(context_length: Any) -> int:
    if isinstance(context_length, bool) or not isinstance(context_length, (int, np.integer)) or context_length < 1:
        raise ValueError(f"context_length = {context_length!r}: expected a positive integer")
    return int(context_length)


def _checked_weights(weights: Any, num_tokens: int, tokens_name: str) -> tuple[Any, str]:
    values, name = load_array(weights, "weights")
    if values.ndim != 1 or values.shape[0] != num_tokens or values.dtype.kind not in "fiu":
        raise ValueError(
            f"--weights {name}: shape {values.shape}, dtype {values.dtype}: expected one number per token of "
            f"{tokens_name} ({num_tokens},)"
        )
    return values, name


def _write_cut(
    writer: StreamWriter,
    piece: np.ndarray,
    weight: np.ndarray | None,
    position: int,
    starts: np.ndarray,
    document: int,
    *,
    attribute: np.ndarray | None = None,
    documents: np.ndarray | None = None,
) -> int:
    """Write ``piece`` (tokens from ``position`` on, continuing ``document``), starting a document at each start
    inside it (:func:`~dist_respattn.store.documents.document_runs`).

    Attributes, for a store with them: ``attribute`` the piece's ids per token, or ``documents`` (n_docs,) each
    document's id (given per token to a store with an attribute per token). The caller starts the first document.
    Returns the document the piece ends in.
    """
    per_token = writer.attribute_level == "token"
    for run in document_runs(starts, position, piece.size, document):
        own = None if documents is None else int(documents[run.document])
        if run.begins:
            writer.start_document(None if per_token else own)
        a, b = run.start, run.stop
        ids = attribute[a:b] if attribute is not None else None
        if ids is None and own is not None and per_token:
            ids = np.full(b - a, own, dtype=np.int32)
        writer.write(piece[a:b], None if weight is None else weight[a:b], ids)
        document = run.document
    return document


def write_stream_tokens(
    out: str | os.PathLike[str],
    tokens: Any,
    context_length: int | None,
    *,
    num_symbols: int | None = None,
    embeddings: Any = None,
    dim: int | None = None,
    seed: int | None = None,
    documents: Any = None,
    weights: Any = None,
    like: Any = None,
    options: WriteOptions | None = None,
    attributes: Any = None,
    attribute_names: Any = None,
) -> TokenStreamStore:
    """A stream store of a token stream (an (L,) integer array or ``.npy`` path).

    ``documents``: each document's first token index (strictly increasing from 0); ``weights``: one
    finite, non-negative weight per token, the weight of the row whose target it is (0 keeps a token as
    context only). The other arguments are those of :func:`~dist_respattn.store.ingest.tokens.write_tokens`; as there, a
    stream whose windows give no rows (every document shorter than N + 1 tokens) is refused.

    ``attributes``: an attribute id per token (an (L,) integer array or ``.npy`` path), kept per token
    (``token_attribute``); ``attribute_names`` names them (a ``NAMES.txt`` path or a sequence; default
    ``"0"``..``"A-1"``), merged with ``like``'s or the appended store's names (:mod:`~dist_respattn.store.attributes`).
    """
    options = options or WriteOptions()
    reference = _reference(out, like, options)
    stream, name = load_token_stream(tokens)
    num_tokens = int(stream.shape[0])
    given_symbols = num_symbols
    if reference is not None:
        context_length = reference.context_length(context_length)
        num_symbols = reference.num_symbols(num_symbols)
        table, table_info = reference.table(embeddings=embeddings, dim=dim, seed=seed), reference.table_info()
    else:
        num_symbols = inferred_num_symbols(stream, name) if num_symbols is None else int(num_symbols)
        if num_symbols < 1:
            raise ValueError(f"{name}: no tokens: expected a non-empty stream")
        table, table_info = embedding_table(num_symbols, embeddings=embeddings, dim=dim, seed=seed or 0)
    window = _check_window(context_length)
    starts = np.zeros(1, dtype=np.int64)
    starts_name = None
    if documents is not None:
        loaded, starts_name, _ = check_document_starts(documents, num_tokens, name)
        starts = np.asarray(loaded[:], dtype=np.int64)
    weight_values, weights_name = (None, None) if weights is None else _checked_weights(weights, num_tokens, name)
    ids = attribute_ids(
        attributes, num_tokens, per=f"token of {name}", names=attribute_names, appending=options.append,
        reference=None if reference is None else reference.store,
    )  # fmt: skip
    appended_to = reference.store if options.append and reference is not None else None
    if ids is not None and isinstance(appended_to, TokenStreamStore) and appended_to.attribute_level == "document":
        raise SchemaMismatchError(
            f"{appended_to.location}: cannot append: the store has an attribute per document, and --attributes "
            f"{ids.source} gives one per token; append text with --attribute-by, or write a new store"
        )
    provenance: dict[str, Any] = {
        "source": "tokens",
        "tokens": os.path.abspath(name) if name != "tokens" else "array",
        "embedding": table_info,
        **(reference.provenance() if reference is not None else identity_provenance(None, table)),
    }
    if starts_name is not None:
        provenance["documents_file"] = os.path.abspath(starts_name) if starts_name != "documents" else "array"
    if weights_name is not None:
        provenance["weights_file"] = os.path.abspath(weights_name) if weights_name != "weights" else "array"
    if ids is not None:
        provenance.update(attribute_provenance("ids", ids.merged, ids.source))
    hint = id_bound_hint(
        "S", num_symbols, given=given_symbols is not None,
        reference=None if reference is None else f"{reference.role} {reference.url}",
    )  # fmt: skip
    with open_stream_writer(
        out, options, weighted=weight_values is not None, provenance=provenance, num_symbols=num_symbols,
        table=table, context_length=window, attribute_names=None if ids is None else ids.merged.names,
        attribute_level="token",
    ) as writer:  # fmt: skip
        saved = reference.store.vocabulary() if reference is not None and not options.append else None
        if saved is not None:
            writer.write_vocabulary(saved)
        position, document = 0, 0
        for piece in checked_pieces(stream, name, num_symbols, hint):
            w = None
            if weight_values is not None:
                w = np.asarray(weight_values[position : position + piece.size], dtype=np.float64)
                bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
                if bad.size:
                    i = int(bad[0])
                    raise ValueError(f"{weights_name}[{position + i}] = {w[i]}: expected a finite, non-negative weight")
            token_ids = None if ids is None else ids.block(position, position + piece.size)
            document = _write_cut(writer, piece, w, position, starts, document, attribute=token_ids)
            position += piece.size
        if options.progress is not None:
            options.progress(num_tokens)
        return writer.close()


def write_stream_text(
    out: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    context_length: int | None,
    *,
    vocab_size: int | None = None,
    dim: int | None = None,
    seed: int | None = None,
    like: Any = None,
    file_progress: Callable[[int], None] | None = None,
    workers: int | None = None,
    options: WriteOptions | None = None,
    attribute_by: str | None = None,
) -> TokenStreamStore:
    """A stream store of text files, one document each, tokenized as
    :func:`~dist_respattn.store.ingest.text.write_text`.

    One tokenizing pass (:mod:`~dist_respattn.store.ingest.text_pass`) by ``workers`` threads (default: one per
    core); the store is the same for any number of them.

    ``attribute_by`` (``"file"`` or ``"directory"``): each document carries its file's attribute (kept per
    document, ``document_attribute``; appended to a store with an attribute per token, per token), named as
    :mod:`~dist_respattn.store.attributes` says.
    """
    options = options or WriteOptions()
    reference = _reference(out, like, options)
    found = iter_text_documents(paths) if attribute_by is not None else None
    files = [d.path for d in found] if found is not None else iter_text_files(paths)
    attributes = text_attribute_ids(
        [d.key for d in found or ()], attribute_by, appending=options.append,
        reference=None if reference is None else reference.store,
    )  # fmt: skip
    given: Vocabulary | None = None
    if reference is not None:
        context_length = reference.context_length(context_length)
        given = Vocabulary.from_json(reference.vocabulary(vocab_size))
        table, table_info = reference.table(dim=dim, seed=seed), reference.table_info()
        identity = reference.provenance()
    elif vocab_size is not None:
        _check_vocab_size(vocab_size)
    window = _check_window(context_length)
    with tempfile.TemporaryDirectory(prefix="respattn-ingest-") as scratch:
        # One tokenizing pass; the vocabulary, ranked from its counts, is one remap of its ids.
        corpus = tokenize_files(files, scratch, file_progress, workers=workers)
        if given is not None:
            vocabulary, remap = given, corpus.remap_to(given)
        else:
            vocabulary, remap = corpus.vocabulary(DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size)
            table, table_info = embedding_table(vocabulary.num_symbols, dim=dim, seed=seed or 0)
            identity = identity_provenance(vocabulary.tokens, table)
        return _write_corpus(out, paths, files, corpus, vocabulary, remap, window, table, table_info, identity,
                             reference, file_progress, options, attributes)  # fmt: skip


def _check_vocab_size(size: Any) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"vocabulary size = {size!r}: expected a positive integer")


def _write_corpus(
    out: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    files: list[str],
    corpus: TokenizedCorpus,
    vocabulary: Vocabulary,
    remap: np.ndarray,
    window: int,
    table: np.ndarray,
    table_info: dict[str, Any],
    identity: dict[str, Any],
    reference: Any,
    file_progress: Callable[[int], None] | None,
    options: WriteOptions,
    attributes: TextAttributes | None = None,
) -> TokenStreamStore:
    """Write a tokenized corpus's final ids, one document per file that has tokens (with its file's attribute)."""
    provenance = {
        "source": "text",
        "paths": [os.path.abspath(os.fspath(p)) for p in paths],
        "files": len(files),
        "tokenizer": TOKENIZER_NAME,
        "vocabulary": "vocabulary/zarr.json",
        "vocab_size": len(vocabulary.tokens),
        "embedding": table_info,
        **identity,
    }
    documents = None
    if attributes is not None:
        provenance.update(attribute_provenance(attributes.by, attributes.merged))
        documents = attributes.file_ids[corpus.lengths > 0]  # a file without tokens is no document
    with open_stream_writer(
        out, options, weighted=False, provenance=provenance, num_symbols=vocabulary.num_symbols, table=table,
        context_length=window, attribute_names=None if attributes is None else attributes.merged.names,
    ) as writer:  # fmt: skip
        if not options.append:
            writer.write_vocabulary(vocabulary.to_json())
        if documents is not None and documents.size and writer.attribute_level == "document":
            writer.start_document(int(documents[0]))
        starts, document, position, oov = corpus.document_starts(), 0, 0, 0
        for ids in corpus.blocks(remap, writer.dtype, writer.partition_tokens):
            oov += int(np.count_nonzero(ids == vocabulary.oov_id))
            document = _write_cut(writer, ids, None, position, starts, document, documents=documents)
            position += ids.size
        if file_progress is not None and reference is None:
            file_progress(len(files))  # the second of the two passes the caller counts
        writer.provenance["oov_count"] = oov
        return writer.close()
