"""Writing a store ``like`` another: the same vocabulary, S and T, window N and embedding table.

The store written like a reference is another sample of the reference's corpus (a validation or
test store), so its ids and queries mean what the reference's do and its identity equals the
reference's. An option that would make it differ (another N, vocabulary size, S, T, query
dimension, table file or projection seed) is refused naming the flag; one equal to the
reference's is accepted.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from dist_respattn.store.common import WriteOptions
from dist_respattn.store.errors import SchemaMismatchError
from dist_respattn.store.identity import identity_provenance
from dist_respattn.store.ingest.tables import embedding_table
from dist_respattn.store.triples.writer import StoreWriter

if TYPE_CHECKING:
    from dist_respattn.store.rows import RowStore

__all__ = ["LikeStore", "open_like"]

_WHAT_IS_TAKEN = "a store written like it takes N, S, T, the vocabulary and the embedding table from it"
_WHAT_AN_APPEND_TAKES = "an append takes N, S, T, the vocabulary and the embedding table from the store"


def open_like(like: RowStore | str | os.PathLike[str] | None, options: WriteOptions) -> LikeStore | None:
    """The reference a writer copies, or ``None``; a path or URL is opened with ``options.storage_options``."""
    if like is None:
        return None
    if options.append:
        raise ValueError(
            "like= (--like) and append=True (--append) exclude each other: "
            "an append already reuses the store's own vocabulary and embedding table"
        )
    from dist_respattn.store.rows import open_store  # a triple or a token-stream store

    return LikeStore(open_store(like, storage_options=options.storage_options))


class LikeStore:
    """A reference store, and the checks that what a writer was asked for agrees with it."""

    def __init__(self, store: RowStore, role: str = "--like") -> None:
        self.store = store
        self.url = str(store.location)
        #: How messages name the reference: ``--like`` it, or ``--append`` to it (an append takes the same).
        self.role = role

    # Read once: the checks, the provenance and the copy all use them.
    @functools.cached_property
    def _table(self) -> np.ndarray | None:
        return self.store.embeddings()

    @functools.cached_property
    def _vocabulary(self) -> dict[str, Any] | None:
        return self.store.vocabulary()

    def conflict(self, flag: str, keyword: str, value: Any, theirs: str) -> ValueError:
        """The one-line refusal of an option that disagrees with the reference."""
        return ValueError(
            f"{self.role} {self.url}: {flag} {value} ({keyword}={value!r}) conflicts with that store's {theirs}; "
            f"omit {flag}: {_WHAT_IS_TAKEN if self.role == '--like' else _WHAT_AN_APPEND_TAKES}"
        )

    def context_length(self, requested: int | None) -> int:
        """N: the reference's, or ``requested`` when it is the same."""
        n = self.store.schema.context_length
        if requested is not None and int(requested) != n:
            raise self.conflict("--context", "context_length", requested, f"window N = {n}")
        return n

    def num_symbols(self, requested: int | None) -> int:
        s = self.store.schema.num_symbols
        if requested is not None and int(requested) != s:
            raise self.conflict("--symbols", "num_symbols", requested, f"S = {s} symbols")
        return s

    def num_targets(self, requested: int | None) -> int:
        t = self.store.schema.num_targets
        if requested is not None and int(requested) != t:
            raise self.conflict("--targets", "num_targets", requested, f"T = {t} targets")
        return t

    def check_dimension(self, source: str, what: str, actual: int, expected: int, label: str) -> None:
        """Rows of arrays written like the reference must have its N (context) and D (query)."""
        if actual != expected:
            raise SchemaMismatchError(
                f"{source}: {what} {label} = {actual}, but {self.role} {self.url} has {label} = {expected}: "
                f"expected rows of that store's shape"
            )

    def vocabulary(self, vocab_size: int | None) -> dict[str, Any]:
        """The reference's vocabulary JSON, as it is (text written like it maps its words with it)."""
        saved = self._vocabulary
        if saved is None:
            raise ValueError(
                f"{self.role} {self.url}: has no vocabulary (it was not made from text): "
                f"text can only be written like a store made from text"
            )
        size = len(saved.get("tokens", []))
        if vocab_size is not None and int(vocab_size) != size:
            raise self.conflict("--vocab-size", "vocab_size", vocab_size, f"vocabulary of {size} tokens")
        return saved

    def table(self, *, embeddings: Any = None, dim: int | None = None, seed: int | None = None) -> np.ndarray:
        """The reference's (S, D) table; ``embeddings``, ``dim`` or ``seed`` given must describe that very table."""
        table = self._table
        if table is None:
            raise ValueError(
                f"{self.role} {self.url}: has no embedding table (it was not made from tokens or text): "
                f"tokens and text can only be written like a token or text store"
            )
        s, d = table.shape
        shape = f"({s}, {d}) embedding table"
        if embeddings is not None:
            name = os.fspath(embeddings) if isinstance(embeddings, (str, os.PathLike)) else "array"
            requested, _ = embedding_table(s, embeddings=embeddings, dim=dim)
            if requested.shape != table.shape or not np.array_equal(requested, table):
                raise self.conflict("--embeddings", "embeddings", name, shape)
        if dim is not None and int(dim) != d:
            raise self.conflict("--dim", "dim", dim, f"{shape} (D = {d})")
        if seed is not None and embeddings is None:
            requested, _ = embedding_table(s, dim=d, seed=int(seed))
            if not np.array_equal(requested, table):
                raise self.conflict("--seed", "seed", seed, f"{shape}, which is not the projection of that seed")
        return table

    def provenance(self) -> dict[str, Any]:
        """What a store written like the reference records: ``like`` and the identity of what it copies."""
        if self.role != "--like":
            return {}  # an append is more of the store's own corpus: its identity is the store's
        # Hashed from the vocabulary and table copied, not taken from the reference's provenance: a reference edited
        # since it was written gives its edited table, and the new store must say so.
        saved = self._vocabulary
        return {
            "like": self.url,
            **identity_provenance(None if saved is None else saved.get("tokens", []), self._table),
        }

    def table_info(self) -> dict[str, Any]:
        table = self._table
        return {"kind": "like", "dim": None if table is None else int(table.shape[1]), "store": self.url}

    def copy_into(self, writer: StoreWriter) -> None:
        """Give a new store the reference's vocabulary and embedding table, whichever it has."""
        table = self._table
        if table is not None:
            writer.write_embeddings(table)
        saved = self._vocabulary
        if saved is not None:
            writer.write_vocabulary(saved)
