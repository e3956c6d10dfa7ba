"""Whole-file writes and a writer lock, on a local disk or behind any fsspec URL (no dask, no zarr).

The model registry and the stores' writer lock are built on these; see :mod:`dist_respattn.durable.files`
for what each backend guarantees.
"""

from dist_respattn.durable.files import TEMP_PREFIX, AtomicFiles
from dist_respattn.durable.lock import DEFAULT_STALE_AFTER, WriterLock

__all__ = ["DEFAULT_STALE_AFTER", "TEMP_PREFIX", "AtomicFiles", "WriterLock"]
