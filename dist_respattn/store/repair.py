"""``repair``: under the store's writer lock, remove what killed writers left and roll an interrupted append back."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dist_respattn.store.errors import StoreError
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.lock import StoreLock, remove_partials

__all__ = ["RepairReport", "repair_store"]


@dataclasses.dataclass(frozen=True)
class RepairReport:
    """What :func:`repair_store` found and did.

    ``kind``: ``"triples"``, ``"stream"`` or ``None`` (no store at the URL, only a killed writer's
    leftovers); ``rows``: the store's rows after the repair (for a stream store, the windows of its
    recorded N); ``tokens``: a stream store's tokens after the repair (``None`` for a triple store);
    ``removed``: the staging copies (``<store>.partial-<id>``) deleted.
    """

    url: str
    kind: str | None
    rows: int | None
    removed: tuple[str, ...]
    tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "kind": self.kind, "rows": self.rows, "tokens": self.tokens,
                "removed": list(self.removed)}  # fmt: skip


def repair_store(
    url: str | os.PathLike[str] | StoreLocation, *, storage_options: dict[str, Any] | None = None
) -> RepairReport:
    """Repair the store at ``url``: take its writer lock (refused while a live writer holds it; a dead
    writer's lock is broken), delete the staging copies killed writers left beside it, and roll an
    interrupted append back to the committed rows (of a triple store) or tokens (of a stream store).

    A complete store is left as it is. Raises :class:`StoreError` when there is neither a store nor
    anything left beside it, and when the store, rolled back or complete, still does not open (an array of
    the wrong dtype or chunking, a missing one): repair cannot mend that, and must not call it complete.
    """
    from dist_respattn.store.rows import is_stream_store
    from dist_respattn.store.streams.reader import TokenStreamStore
    from dist_respattn.store.streams.rollback import rollback_stream_locked
    from dist_respattn.store.triples.reader import TripleStore
    from dist_respattn.store.triples.rollback import rollback_locked

    location = StoreLocation.of(url, storage_options).with_window(None)
    with StoreLock.of(location, purpose="repair"):
        removed = tuple(remove_partials(location))
        if not location.exists():
            if removed:
                return RepairReport(str(location), None, None, removed)
            raise StoreError(f"{location}: no store here (and nothing a killed writer left beside it)")
        if is_stream_store(location):
            tokens = rollback_stream_locked(location)
            rows = TokenStreamStore.open(location).num_rows
            return RepairReport(str(location), "stream", rows, removed, tokens=tokens)
        rows = rollback_locked(location)
        try:  # a complete store is left as it was found: one that does not open (a wrong dtype) is beyond repair
            TripleStore.open(location)
        except StoreError as exc:
            raise StoreError(
                f"{exc}: repair only rolls back an interrupted append and cannot mend this; restore the store from a "
                "copy, or write it again (the same command with --overwrite)"
            ) from None
        return RepairReport(str(location), "triples", rows, removed)
