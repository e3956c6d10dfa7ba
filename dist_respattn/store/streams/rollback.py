"""Rolling back a token-stream store whose append was interrupted: cut its arrays back to the committed tokens."""

from __future__ import annotations

import os
from typing import Any

from dist_respattn.store.errors import StoreError
from dist_respattn.store.group import delete_interrupted_writes, delete_shards_from, open_group_at
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.lock import StoreLock, remove_partials
from dist_respattn.store.schema import ATTRIBUTE_KEY, StoreState
from dist_respattn.store.streams.reader import TOKEN_ARRAYS
from dist_respattn.store.streams.validation import validate_stream

__all__ = ["rollback_stream_append", "rollback_stream_locked"]


def rollback_stream_append(
    url: str | os.PathLike[str] | StoreLocation, *, storage_options: dict[str, Any] | None = None
) -> int:
    """Restore a stream store whose append was interrupted to its committed tokens; return that count.

    A complete store is left as it is. The committed tokens and documents are those the append
    recorded when it began; the shards past them are deleted and the arrays cut back. Refused
    (:class:`~dist_respattn.store.lock.StoreLocked`) while a live writer holds the store's lock; a dead
    writer's lock is broken. The staging copies killed writers left beside the store are removed.
    """
    location = StoreLocation.of(url, storage_options).with_window(None)
    with StoreLock.of(location, purpose="repair"):
        remove_partials(location)
        return rollback_stream_locked(location)


def rollback_stream_locked(location: StoreLocation) -> int:
    """:func:`rollback_stream_append` for a caller that holds the store's lock (a writer's abort, ``repair``)."""

    location = location.with_window(None)
    delete_interrupted_writes(location)
    group = open_group_at(location, mode="r+")
    attributes = dict(group.attrs.get(ATTRIBUTE_KEY) or {})
    state = attributes.get("state")
    if state == StoreState.COMPLETE:
        return int(attributes["tokens"])
    if state != StoreState.APPENDING or "committed" not in attributes:
        raise StoreError(
            f"{location}: state {state!r}: only an interrupted append can be rolled back; "
            "write the store again (the same command with --overwrite)"
        )
    committed = attributes.pop("committed")
    tokens, documents = int(committed["tokens"]), int(committed["documents"])
    shards = -(-tokens // int(attributes["partition_tokens"]))
    for name in TOKEN_ARRAYS:
        if name in group:
            if group[name].shape[0] != tokens:
                group[name].resize((tokens,))
            delete_shards_from(location, name, shards)
    for name in ("document_starts", "document_attribute"):
        if name in group and group[name].shape[0] != documents:
            group[name].resize((documents,))
    attributes["state"] = StoreState.COMPLETE
    group.attrs[ATTRIBUTE_KEY] = attributes
    problems, _, _ = validate_stream(location)
    if problems:
        raise StoreError(f"{location}: still damaged after the rollback: " + "; ".join(str(p) for p in problems))
    return tokens
