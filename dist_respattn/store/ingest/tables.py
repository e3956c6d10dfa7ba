"""The (S, D) tables token queries are looked up in: made, loaded, or reused from a store.

Every token and text store keeps its table (``embeddings``), so an append, or a store written
``--like`` another, embeds its queries exactly as the first rows were.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from dist_respattn.store.errors import SchemaMismatchError
from dist_respattn.store.npy import load_array, row_blocks
from dist_respattn.store.triples.reader import TripleStore

__all__ = [
    "DEFAULT_QUERY_DIM",
    "MAX_INFERRED_SYMBOLS",
    "ONE_HOT_MAX_SYMBOLS",
    "embedding_table",
    "first_id_past",
    "id_bound_hint",
    "inferred_num_symbols",
    "store_table_for_append",
]

#: With neither a table nor a dimension, vocabularies up to this size get one-hot queries (D = S).
ONE_HOT_MAX_SYMBOLS = 256
#: Otherwise queries are a random projection of this dimension.
DEFAULT_QUERY_DIM = 32
#: The largest S the token ids alone may imply (without --symbols): S sizes the (S, D) table and every model's
#: tables, so one stray id of 5,000,000 would make a store of hundreds of MiB.
MAX_INFERRED_SYMBOLS = 1 << 20


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
    _check_room_for_table(num_symbols, dim)
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
            f"{store.location}: cannot append: query_dim {requested.shape[1]} (store has {stored.shape[1]}): the "
            "query table asked for (dim or embeddings: --dim, --embeddings) is not the store's; omit them: an append "
            "embeds its rows with the store's own table"
        )
    if not np.array_equal(requested, stored):
        raise SchemaMismatchError(
            f"{store.location}: cannot append: the requested embedding table differs from the store's "
            f"{stored.shape} table, so new queries would not match old ones; omit the embedding options to use it"
        )
    return stored, info


def _check_room_for_table(num_symbols: int, dim: int) -> None:
    """Refuse a random (S, D) table that cannot be drawn in this machine's free memory (float64 draws, then the
    float32 table: 12 bytes an entry), before it is drawn: an explicit ``--symbols`` is not bounded otherwise."""
    import psutil

    needed = int(num_symbols) * int(dim) * 12
    available = int(psutil.virtual_memory().available)
    if needed > available:
        raise MemoryError(
            f"--symbols {num_symbols:,} with --dim {dim:,}: drawing the random (S, D) query table needs about "
            f"{needed / 2**20:,.0f} MiB, more than the {available / 2**20:,.0f} MiB free here: lower --symbols or "
            "--dim, or give the table with --embeddings"
        )


def first_id_past(values: Any, bound: int) -> tuple[int, tuple[int, int] | None]:
    """Scan ``values`` (ids, one row per leading index) in blocks for the largest id: ``(largest, None)`` (-1 when
    empty), or ``(largest so far, (row, id))`` at the first row holding an id of ``bound`` or more."""
    largest, offset = -1, 0
    for block in row_blocks(values):
        if block.size:
            top = int(block.max())
            if top >= bound:
                past = (block >= bound).reshape(block.shape[0], -1)
                row = int(np.argmax(past.any(axis=1)))
                return largest, (offset + row, int(np.asarray(block[row]).max()))
            largest = max(largest, top)
        offset += block.shape[0]
    return largest, None


def id_bound_hint(count: str, bound: int, *, given: bool, reference: str | None = None) -> str:
    """What set ``count`` (``S``, or ``T`` of targets), for the refusal of an id out of [0, ``bound``): the
    ``reference`` store (``--like URL``, ``--append to URL``, whose bound a flag may only repeat), its flag, or the
    largest id. A refusal that named only the range left the flag that moves it to be guessed."""
    flag = "--symbols" if count == "S" else "--targets"
    if reference is not None:
        return f" (the {'symbols' if count == 'S' else 'targets'} of {reference})"
    if given:
        return f" ({count} = {bound:,} from {flag}: give a larger {flag} {count}, or fix the id)"
    return f" ({count} = {bound:,}, the largest id + 1, as {flag} was not given: fix the id)"


def inferred_num_symbols(stream: Any, name: str) -> int:
    """S of a token stream given without it: its largest id + 1 (0 when empty), scanned in blocks. An id of
    :data:`MAX_INFERRED_SYMBOLS` or more is refused, naming its position, before anything is sized by it."""
    largest, past = first_id_past(stream, MAX_INFERRED_SYMBOLS)
    if past is not None:
        position, value = past
        raise ValueError(
            f"{name}[{position}] = {value:,}: a token id that would make S = {value + 1:,} "
            f"symbols (ids alone may imply at most {MAX_INFERRED_SYMBOLS:,}); give S with --symbols S to allow "
            "it (ids are then checked against it), or fix the id"
        )
    return largest + 1
