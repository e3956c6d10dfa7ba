"""Opening any store of rows, one opener for both kinds: a triple store, or a token-stream store read with a window."""

from __future__ import annotations

import os
from typing import Any

from dist_respattn.store.group import open_group_at
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.schema import ATTRIBUTE_KEY
from dist_respattn.store.streams.reader import TokenStreamStore, is_stream_group
from dist_respattn.store.triples.reader import TripleStore

__all__ = ["RowStore", "is_stream_store", "open_rows", "open_store"]

#: What the engine reads rows from: both have ``schema``, ``num_rows``, ``partitions``, ``iter_blocks``,
#: ``fingerprint``, ``identity``, ``provenance``, ``embeddings`` and ``vocabulary``; and, for rows that carry an
#: attribute (:mod:`~dist_respattn.store.attributes`), ``attribute_names`` (``None`` without) and
#: ``read_attributes(start, stop, selected=None)``, the ids of the rows the row readers return. ``read_documents``
#: is a token-stream store's only (a triple store's raises: its rows do not record their documents).
RowStore = TripleStore | TokenStreamStore


def is_stream_store(location: StoreLocation) -> bool:
    """Whether the store at ``location`` is a token-stream store (else a triple store, or not a store)."""
    attributes = dict(open_group_at(location).attrs.get(ATTRIBUTE_KEY) or {})
    return is_stream_group(attributes)


def open_store(
    path_or_url_or_location: str | os.PathLike[str] | StoreLocation | RowStore,
    *,
    storage_options: dict[str, Any] | None = None,
    window: int | None = None,
    min_context: int | None = None,
) -> RowStore:
    """The store at a path, URL or location (or an open store's, opened again): either kind, picked by its schema.

    A token-stream store is read with ``window`` (default: the location's, else its own N) and rows with at
    least ``min_context`` earlier tokens (default: the location's, else N); a triple store's N is fixed (a
    ``window`` other than it is refused with a ``ValueError``; its rows all have N). A path that holds no store
    raises :class:`~dist_respattn.store.StoreError` saying what is there instead.
    """
    url = path_or_url_or_location
    if isinstance(url, (TripleStore, TokenStreamStore)):
        url = url.location
    location = StoreLocation.of(url, storage_options)
    if window is not None:
        location = location.with_window(int(window))
    if min_context is not None:
        location = location.with_min_context(int(min_context))
    if is_stream_store(location):
        return TokenStreamStore.open(location)
    store = TripleStore.open(location.with_window(None))  # a triple store's rows all have N: no short histories
    if location.window is not None and location.window != store.schema.context_length:
        raise ValueError(
            f"{store.location}: a triple store of N = {store.schema.context_length}: the window is fixed when its "
            "rows are written (--context applies to token-stream stores, written by "
            "ingest --tokens/--text --format stream)"
        )
    return store


#: The name :func:`open_store` had first (``dist_respattn.store.rows.open_rows``): the same function.
open_rows = open_store
