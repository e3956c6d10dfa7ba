"""Writing a store from a token stream: sliding windows, with queries looked up in an embedding table.

Row ``j`` of a stream ``tok`` is the window of :func:`~dist_respattn.model.encoder.sequence_windows`:
``context = tok[j : j+N]``, ``query = E[tok[j+N-1]]``, ``target = tok[j+N]``. The stream is cut into
blocks and the last N tokens of each block carried into the next, so the rows are the same as one
pass over the whole stream: no window is lost or repeated at a block boundary.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.errors import SchemaMismatchError
from dist_respattn.store.from_arrays import load_array, max_id, row_blocks
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.triple_store import TripleStore

__all__ = ["DEFAULT_QUERY_DIM", "ONE_HOT_MAX_SYMBOLS", "WindowStream", "embedding_table", "write_tokens"]

#: With neither a table nor a dimension, vocabularies up to this size get one-hot queries (D = S).
ONE_HOT_MAX_SYMBOLS = 256
#: Otherwise queries are a random projection of this dimension.
DEFAULT_QUERY_DIM = 32
_TOKEN_BLOCK = 1 << 18


def embedding_table(
    num_symbols: int, *, embeddings: Any = None, dim: int | None = None, seed: int = 0
) -> tuple[np.ndarray, dict[str, Any]]:
    """The (S, D) float32 query table and how it was made.

    ``embeddings`` (an array or ``.npy`` path) is used as given; else ``dim`` gives a seeded random
    projection ``N(0, 1/D)`` of that dimension; with neither, one-hot rows when S <=
    :data:`ONE_HOT_MAX_SYMBOLS`, or a random projection of dimension :data:`DEFAULT_QUERY_DIM`.
    """
    if embeddings is not None:
        if dim is not None:
            raise ValueError("give an embedding table or a dimension, not both")
        table, name = load_array(embeddings, "embeddings")
        if table.ndim != 2 or table.shape[0] < num_symbols:
            raise ValueError(f"{name}: shape {table.shape}: expected ({num_symbols} or more, D) rows, one per token id")
        table = np.ascontiguousarray(table[:num_symbols], dtype=np.float32)
        bad = np.argwhere(~np.isfinite(table))
        if bad.size:
            raise ValueError(f"{name}: entry [{bad[0][0]}, {bad[0][1]}] is not finite: expected finite embeddings")
        info: dict[str, Any] = {"kind": "file", "dim": int(table.shape[1])}
        if isinstance(embeddings, (str, os.PathLike)):
            info["path"] = os.path.abspath(os.fspath(embeddings))
            info["sha256"] = hashlib.sha256(table.tobytes()).hexdigest()
        return table, info
    if dim is None and num_symbols <= ONE_HOT_MAX_SYMBOLS:
        return np.eye(num_symbols, dtype=np.float32), {"kind": "one-hot", "dim": num_symbols}
    dim = DEFAULT_QUERY_DIM if dim is None else int(dim)
    if dim < 1:
        raise ValueError(f"dim = {dim}: expected a positive query dimension")
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((num_symbols, dim)) / np.sqrt(dim)).astype(np.float32)
    return table, {"kind": "random", "dim": dim, "seed": int(seed)}


def store_table_for_append(
    store: TripleStore, stored: np.ndarray, *, embeddings: Any, dim: int | None, seed: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """The table appended rows are embedded with: the store's own, so old and new queries agree.

    A table the caller asked for (``embeddings``, or ``dim`` with ``seed``) must equal the stored one.
    """
    info = {"kind": "store", "dim": int(stored.shape[1])}
    if embeddings is None and dim is None:
        return stored, info
    requested, _ = embedding_table(stored.shape[0], embeddings=embeddings, dim=dim, seed=seed)
    if requested.shape[1] != stored.shape[1]:
        raise SchemaMismatchError(
            f"{store.location}: cannot append: query_dim {requested.shape[1]} (store has {stored.shape[1]})"
        )
    if not np.array_equal(requested, stored):
        raise SchemaMismatchError(
            f"{store.location}: cannot append: the requested embedding table differs from the store's "
            f"{stored.shape} table, so new queries would not match old ones; omit the embedding options to use it"
        )
    return stored, info


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


def _checked_pieces(tokens: Any, name: str, num_symbols: int) -> Iterator[np.ndarray]:
    """Blocks of the stream, with an out-of-range id named by its position in the whole stream."""
    for number, piece in enumerate(row_blocks(tokens, _TOKEN_BLOCK)):
        bad = np.flatnonzero((piece < 0) | (piece >= num_symbols))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{name}[{number * _TOKEN_BLOCK + i}] = {int(piece[i])}: expected a token id in [0, {num_symbols}) "
                f"({bad.size} bad ids in this block)"
            )
        yield piece


def write_tokens(
    out: str | os.PathLike[str],
    tokens: Any,
    context_length: int,
    *,
    num_symbols: int | None = None,
    embeddings: Any = None,
    dim: int | None = None,
    seed: int = 0,
    options: WriteOptions | None = None,
) -> TripleStore:
    """Write the windows of a token stream (an (L,) integer array or ``.npy`` path) as a store of L - N rows.

    S = T = ``num_symbols`` (default: largest id + 1). Queries come from :func:`embedding_table`,
    which is saved in the store (:meth:`TripleStore.embeddings`).
    """
    options = options or WriteOptions()
    stream, name = load_array(tokens, "tokens")
    if stream.ndim != 1 or stream.dtype.kind not in "iu":
        raise ValueError(
            f"{name}: shape {stream.shape}, dtype {stream.dtype}: expected a 1-d array of integer token ids"
        )
    if isinstance(context_length, bool) or not isinstance(context_length, (int, np.integer)) or context_length < 1:
        raise ValueError(f"context_length = {context_length!r}: expected a positive integer")
    existing = TripleStore.open(out, storage_options=options.storage_options) if options.append else None
    if num_symbols is None:
        if existing is not None:
            num_symbols = existing.schema.num_symbols
        else:
            num_symbols = max_id(stream) + 1
    if num_symbols < 1:
        raise ValueError(f"{name}: no tokens: expected a non-empty stream")
    stored_table = existing.embeddings() if existing is not None else None
    if existing is not None and stored_table is not None:
        table, table_info = store_table_for_append(existing, stored_table, embeddings=embeddings, dim=dim, seed=seed)
    else:
        table, table_info = embedding_table(num_symbols, embeddings=embeddings, dim=dim, seed=seed)
    schema = StoreSchema(num_symbols, int(context_length), table.shape[1], num_symbols, options.query_dtype)
    provenance = {
        "source": "tokens",
        "tokens": os.path.abspath(name) if name != "tokens" else "array",
        "tokens_count": int(stream.shape[0]),
        "embedding": table_info,
    }
    with open_writer(out, schema, options, provenance) as writer:
        if not options.append:
            writer.write_embeddings(table)
        windows = WindowStream(int(context_length), num_symbols, table)
        for piece in _checked_pieces(stream, name, num_symbols):
            context, query, target = windows.feed(piece)
            writer.write(context, query, target, source=name)
        return writer.close()
