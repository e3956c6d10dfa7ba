"""The stores a worker process has opened, kept from one task to the next while their root metadata is unchanged.

A task reads one partition of a store the pass names by location. Opening the store anew for every task cost
more than its reads of small partitions: zarr parses the root metadata (a text corpus's attributes list its
files: 2.9 MB of JSON for the 32,500 files of linux-source), the reader loads the embedding table and the
document starts, and the pass's fingerprint digests the attributes; then, when the task's rows are done, the
store was opened again to check that nothing replaced it meanwhile. At 109M tokens that was ~110 ms of a
worker's CPU a task, ~1.4 s a pass a worker.

A task now reads the root metadata's bytes alone (``zarr.json``, a millisecond) and compares them with those
the kept store was opened from. The same bytes are the same attributes, hence the same fingerprint the pass
checks (every write and append records new attributes: a rewritten store carries its creation time), so a
replaced store is still seen as before; different or unreadable bytes open the store anew. On a local disk the
file's inode and modification time must match too: a store written again within the same second with attributes
to the byte the same (its creation time is kept to the second) is a new file, and the kept store's embedding table
and document starts are not taken for its. A kept store forgets which shard files it saw present (``renew``), so
a file removed between tasks is still refused by name. At most :data:`KEPT` stores holding at most
:data:`KEPT_BYTES` between them (a stream store holds its embedding table) are kept, the least recently used
dropped first.
"""

from __future__ import annotations

import collections
import os
import threading

from dist_respattn.store import StoreLocation, open_store
from dist_respattn.store.rows import RowStore

__all__ = ["KEPT", "KEPT_BYTES", "ROOT_METADATA", "forget", "open_kept", "unchanged"]

#: The store file whose bytes say whether a kept store is still the one at its location.
ROOT_METADATA = "zarr.json"
#: Stores kept at once (a fit's training and validation stores, an evaluation's test store...).
KEPT = 4
#: The memory kept stores may hold between them; a store holding more is opened for each task as before.
KEPT_BYTES = 256 * 2**20

_lock = threading.Lock()
#: location -> (the root metadata the store was opened from (:func:`_metadata`), the store)
_kept: collections.OrderedDict[StoreLocation, tuple[tuple[object, ...], RowStore]] = collections.OrderedDict()


def _metadata(location: StoreLocation) -> tuple[object, ...] | None:
    """The root metadata's bytes, with the file's inode and modification time on a local disk; ``None`` when they
    cannot be read."""
    data = location.read_key(ROOT_METADATA)
    if data is None:
        return None
    if "://" in location.url:
        return (data,)
    try:
        stat = os.stat(os.path.join(location.url, ROOT_METADATA))
    except OSError:
        return None
    return data, stat.st_ino, stat.st_mtime_ns


def open_kept(location: StoreLocation) -> RowStore:
    """The store at ``location``: the one kept from an earlier task when its root metadata is unchanged, else
    opened now (and kept when its metadata could be read)."""
    metadata = _metadata(location)
    with _lock:
        hit = _kept.get(location)
        if hit is not None and metadata is not None and hit[0] == metadata:
            _kept.move_to_end(location)
            store = hit[1]
            store.renew()
            return store
    store = open_store(location)
    if metadata is not None and store.resident_nbytes() <= KEPT_BYTES:
        with _lock:
            _kept[location] = (metadata, store)
            _kept.move_to_end(location)
            while len(_kept) > KEPT or sum(s.resident_nbytes() for _, s in _kept.values()) > KEPT_BYTES:
                _kept.popitem(last=False)
    return store


def unchanged(store: RowStore) -> bool:
    """Whether ``store`` is kept and its location's root metadata still has the bytes it was opened from (``False``
    says only that this cheap check cannot tell: open the location again to compare)."""
    with _lock:
        entry = next((e for e in _kept.values() if e[1] is store), None)
    if entry is None:
        return False
    return _metadata(store.location) == entry[0]


def forget() -> None:
    """Drop every kept store (tests; a worker keeps them for its life)."""
    with _lock:
        _kept.clear()
