"""The errors a store raises: each names the store, and the array, chunk or row at fault."""

from __future__ import annotations

__all__ = [
    "CorpusMismatchError",
    "EmptySplitError",
    "IncompleteStoreError",
    "SchemaMismatchError",
    "StoreCorruptError",
    "StoreError",
]


class StoreError(ValueError):
    """A store cannot be used as it is (wrong schema, damaged, not finished)."""


class IncompleteStoreError(StoreError):
    """A writer stopped before committing: a new store was never finished, or an append was interrupted."""


class SchemaMismatchError(StoreError):
    """Rows of one shape were offered to a store of another (e.g. an append with a different N)."""


class StoreCorruptError(StoreError):
    """A chunk is missing or cannot be decoded."""


class CorpusMismatchError(StoreError):
    """Two stores that must be of one corpus (train and validation) have different vocabularies or embedding tables."""


class EmptySplitError(ValueError):
    """A split of a corpus (train, validation or test) would get no document: too few documents for its fraction.

    Attributes:
        split: the split's name.
        documents: the documents taken from the corpus.
    """

    def __init__(self, message: str, *, split: str, documents: int) -> None:
        super().__init__(message)
        self.split = split
        self.documents = documents
