"""The errors a store raises: each names the store, and the array, chunk or row at fault."""

from __future__ import annotations

__all__ = [
    "CorpusMismatchError",
    "EmptySplitError",
    "IncompleteStoreError",
    "SchemaMismatchError",
    "StoreCorruptError",
    "StoreError",
    "store_exists",
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


def store_exists(location: object, *, appendable: bool = True) -> StoreError:
    """The refusal to write a new store at ``location``, where one is already.

    It names what the public writers (the ``write_*`` functions) take, ``options=WriteOptions(overwrite=True)``, and
    with ``appendable`` ``options=WriteOptions(append=True)``; each with its command line flag, which is all the
    command line shows (see ``dist_respattn.cli.common.in_flags``).
    """
    message = f"{location}: already exists: pass options=WriteOptions(overwrite=True) (--overwrite) to replace it"
    if appendable:
        message += ", or options=WriteOptions(append=True) (--append) to add to it"
    return StoreError(message)
