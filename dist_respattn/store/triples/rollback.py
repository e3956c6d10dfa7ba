"""Rolling back a triple store whose append was interrupted: cut its row arrays back to the committed rows."""

from __future__ import annotations

import os
from typing import Any

from dist_respattn.store.errors import StoreError
from dist_respattn.store.group import delete_interrupted_writes, delete_shards_from, open_group_at
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.lock import StoreLock, remove_partials
from dist_respattn.store.not_a_store import not_a_store
from dist_respattn.store.problems import structural_problems
from dist_respattn.store.schema import ATTRIBUTE_KEY, StoreSchema, StoreState

__all__ = ["rollback_append", "rollback_locked"]


def rollback_append(
    url: str | os.PathLike[str] | StoreLocation, *, storage_options: dict[str, Any] | None = None
) -> int:
    """Restore a store whose append was interrupted to its committed rows; return that row count.

    A complete store is left as it is. A new store whose writer never finished cannot be restored
    (it has no committed rows) and raises. Refused (:class:`~dist_respattn.store.lock.StoreLocked`) while
    a live writer holds the store's lock; a dead writer's lock is broken. The staging copies killed
    writers left beside the store (``<store>.partial-*``) are removed.
    """
    location = StoreLocation.of(url, storage_options)
    with StoreLock.of(location, purpose="repair"):
        remove_partials(location)
        return rollback_locked(location)


def rollback_locked(location: StoreLocation) -> int:
    """:func:`rollback_append` for a caller that holds the store's lock."""
    delete_interrupted_writes(location)
    group = open_group_at(location, mode="r+")
    attributes = dict(group.attrs.get(ATTRIBUTE_KEY) or {})
    if not attributes:
        raise not_a_store(location)
    state = attributes.get("state")
    if state == StoreState.COMPLETE:
        return int(attributes["rows"])
    if state != StoreState.APPENDING:
        raise StoreError(
            f"{location}: state {state!r}: only an interrupted append can be rolled back; write the store again "
            "(the same command with --overwrite)"
        )
    rows = int(attributes["rows"])
    schema = StoreSchema.from_json(attributes, str(location))
    partitions = -(-rows // int(attributes["partition_rows"]))
    names = list(schema.array_specs())
    if "attribute_names" in attributes and "attribute" in group:
        names.append("attribute")
    for name in names:
        array = group[name]
        if array.shape[0] != rows:
            array.resize((rows, *array.shape[1:]))
        delete_shards_from(location, name, partitions)
    attributes["state"] = StoreState.COMPLETE
    group.attrs[ATTRIBUTE_KEY] = attributes
    _, _, problems = structural_problems(group)
    if problems:
        raise StoreError(f"{location}: still damaged after the rollback: " + "; ".join(str(p) for p in problems))
    return rows
