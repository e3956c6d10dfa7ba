"""Writing a store from a token stream: sliding windows, with queries looked up in an embedding table.

Row ``j`` of a stream ``tok`` is the window of :func:`~dist_respattn.model.encoder.sequence_windows`:
``context = tok[j : j+N]``, ``query = E[tok[j+N-1]]``, ``target = tok[j+N]``. The stream is cut into
blocks and the last N tokens of each block carried into the next, so the rows are the same as one
pass over the whole stream: no window is lost or repeated at a block boundary. With document starts
(:mod:`~dist_respattn.store.documents`) the rows are those of each document on its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store.attributes import attribute_ids, attribute_provenance
from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.documents import DocumentWindows, check_document_starts, require_rows, starts_blocks
from dist_respattn.store.identity import identity_provenance
from dist_respattn.store.ingest.like import open_like
from dist_respattn.store.ingest.tables import (
    DEFAULT_QUERY_DIM,
    ONE_HOT_MAX_SYMBOLS,
    embedding_table,
    id_bound_hint,
    inferred_num_symbols,
    store_table_for_append,
)
from dist_respattn.store.npy import load_array, row_blocks
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.triples.reader import TripleStore

__all__ = [
    "DEFAULT_QUERY_DIM",
    "ONE_HOT_MAX_SYMBOLS",
    "WindowStream",
    "checked_pieces",
    "embedding_table",
    "load_token_stream",
    "store_table_for_append",
    "write_tokens",
]

_TOKEN_BLOCK = 1 << 18


class WindowStream:
    """Turns consecutive pieces of one token sequence into the rows of the whole sequence.

    Carries the last N tokens of what it has seen into the next piece. Memory: one piece plus N tokens.
    """

    def __init__(self, context_length: int, num_symbols: int, table: np.ndarray) -> None:
        self.context_length = context_length
        self.num_symbols = num_symbols
        self.table = table
        self._carry = np.zeros(0, dtype=np.int64)

    def feed(self, piece: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ending in ``piece``: ``context`` (m, N) int64, ``query`` (m, D) float32, ``target`` (m,) int64."""
        tokens = np.concatenate([self._carry, piece.astype(np.int64, copy=False)])
        self._carry = tokens[-self.context_length :]
        return sequence_windows(
            tokens, self.context_length, num_symbols=self.num_symbols, embeddings=self.table, query_dtype=np.float32
        )


def load_token_stream(tokens: Any) -> tuple[Any, str]:
    """The stream (an array, or a block reader of a ``.npy`` file) and the name errors use; 1-d integers only."""
    stream, name = load_array(tokens, "tokens")
    if stream.ndim != 1 or stream.dtype.kind not in "iu":
        raise ValueError(
            f"{name}: shape {stream.shape}, dtype {stream.dtype}: expected a 1-d array of integer token ids"
        )
    return stream, name


def checked_pieces(tokens: Any, name: str, num_symbols: int, hint: str = "") -> Iterator[np.ndarray]:
    """Blocks of the stream, with an out-of-range id named by its position in the whole stream (and ``hint``)."""
    block = _TOKEN_BLOCK  # read once: tests shrink it to put boundaries where they want
    for number, piece in enumerate(row_blocks(tokens, block)):
        bad = np.flatnonzero((piece < 0) | (piece >= num_symbols))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{name}[{number * block + i}] = {int(piece[i])}: expected a token id in [0, {num_symbols}){hint} "
                f"({bad.size} bad ids in this block)"
            )
        yield piece


def write_tokens(
    out: str | os.PathLike[str],
    tokens: Any,
    context_length: int | None,
    *,
    num_symbols: int | None = None,
    embeddings: Any = None,
    dim: int | None = None,
    seed: int | None = None,
    documents: Any = None,
    like: TripleStore | str | os.PathLike[str] | None = None,
    options: WriteOptions | None = None,
    attributes: Any = None,
    attribute_names: Any = None,
) -> TripleStore:
    """Write the windows of a token stream (an (L,) integer array or ``.npy`` path) as a store.

    S = T = ``num_symbols`` (default: largest id + 1). Queries come from :func:`embedding_table`
    (``seed`` defaults to 0), which is saved in the store (:meth:`TripleStore.embeddings`).

    ``documents``: the first token index of each document (an int array or ``.npy`` path; strictly
    increasing, starting with 0); windows never span two documents, so a document of fewer than
    N + 1 tokens gives no rows. Without it the stream is one document (L - N rows). A stream that gives no
    rows at all is refused (``ValueError``) and nothing is written.

    ``like``: a token or text store (or its URL) whose N, S = T, embedding table and vocabulary the
    new store takes (see :mod:`~dist_respattn.store.ingest.like`); ``context_length`` may then be ``None``,
    and a conflicting option is refused.

    ``attributes``: an attribute id per token (an (L,) integer array or ``.npy`` path); each row takes its
    target token's. ``attribute_names`` names them as for :func:`~dist_respattn.store.ingest.from_arrays.write_arrays`.
    """
    options = options or WriteOptions()
    reference = open_like(like, options)
    stream, name = load_token_stream(tokens)
    given_symbols = num_symbols
    if reference is not None:
        context_length = reference.context_length(context_length)
    if isinstance(context_length, bool) or not isinstance(context_length, (int, np.integer)) or context_length < 1:
        raise ValueError(f"context_length = {context_length!r}: expected a positive integer")
    starts, starts_name, num_documents = None, "", 1
    if documents is not None:
        starts, starts_name, num_documents = check_document_starts(documents, int(stream.shape[0]), name)
    existing = TripleStore.open(out, storage_options=options.storage_options) if options.append else None
    ids = attribute_ids(
        attributes, int(stream.shape[0]), per=f"token of {name}", names=attribute_names, appending=options.append,
        reference=existing if existing is not None else None if reference is None else reference.store,
    )  # fmt: skip
    if reference is not None:
        num_symbols = reference.num_symbols(num_symbols)
        table, table_info = reference.table(embeddings=embeddings, dim=dim, seed=seed), reference.table_info()
    else:
        if num_symbols is None:
            num_symbols = existing.schema.num_symbols if existing is not None else inferred_num_symbols(stream, name)
        if num_symbols < 1:
            raise ValueError(f"{name}: no tokens: expected a non-empty stream")
        stored_table = existing.embeddings() if existing is not None else None
        if existing is not None and stored_table is not None:
            table, table_info = store_table_for_append(
                existing, stored_table, embeddings=embeddings, dim=dim, seed=0 if seed is None else seed
            )
        else:
            table, table_info = embedding_table(num_symbols, embeddings=embeddings, dim=dim, seed=seed or 0)
    schema = StoreSchema(num_symbols, int(context_length), table.shape[1], num_symbols, options.query_dtype)
    provenance: dict[str, Any] = {
        "source": "tokens",
        "tokens": os.path.abspath(name) if name != "tokens" else "array",
        "tokens_count": int(stream.shape[0]),
        "documents": num_documents,
        "embedding": table_info,
    }
    if starts is not None:
        provenance["documents_file"] = os.path.abspath(starts_name) if starts_name != "documents" else "array"
    if reference is not None:
        provenance.update(reference.provenance())
    elif not options.append:
        provenance.update(identity_provenance(None, table))
    if ids is not None:
        provenance.update(attribute_provenance("ids", ids.merged, ids.source))
    hint = id_bound_hint(
        "S",
        num_symbols,
        given=given_symbols is not None,
        reference=f"--like {reference.url}" if reference is not None
        else f"--append to {existing.location}" if existing is not None else None,
    )  # fmt: skip
    with open_writer(out, schema, options, provenance, None if ids is None else ids.merged.names) as writer:
        if reference is not None:
            reference.copy_into(writer)
        elif not options.append:
            writer.write_embeddings(table)
        windows = DocumentWindows(
            int(context_length), num_symbols, table, None if starts is None else starts_blocks(starts)
        )
        position = 0
        for piece in checked_pieces(stream, name, num_symbols, hint):
            context, query, target, _ = windows.feed(piece)
            # A row's attribute is its target token's, and every target of a piece lies in it.
            row_ids = None if ids is None else ids.block(position, position + piece.size)[windows.targets - position]
            writer.write(context, query, target, attribute=row_ids, source=name)
            position += piece.size
        require_rows(
            writer.rows_written, source=name, tokens=int(stream.shape[0]), documents=num_documents,
            context_length=int(context_length),
        )  # fmt: skip
        return writer.close()
