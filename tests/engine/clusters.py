"""The local clusters the engine tests start: worker processes on 127.0.0.1, one thread each."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import distributed

from dist_respattn.engine.cluster import embedded_cluster_settings


@contextlib.contextmanager
def local_cluster(n_workers: int = 2, **kwargs: Any) -> Iterator[tuple[distributed.LocalCluster, distributed.Client]]:
    """A LocalCluster of ``n_workers`` single-threaded worker processes (each with a nanny) and a client of it.

    The scheduler's HTTP server takes a free port: with ``dashboard_address=None`` it still binds 8787
    and warns when another cluster holds it, which the warnings-as-errors config turns into a cluster
    that fails to start. ``kwargs`` go to ``LocalCluster`` (e.g. ``memory_limit``). It starts as ``fit``'s
    embedded cluster does (``embedded_cluster_settings``): under quieter Dask settings (a module's cluster mostly sits
    idle between tests, and Dask's profiler and ticks would spend a share of the cores the other tests run on), its
    workers forked from a server process that imported what they run.
    """
    options: dict[str, Any] = {
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": logging.ERROR,
    }
    options.update(kwargs)
    with embedded_cluster_settings():
        cluster = distributed.LocalCluster(n_workers=n_workers, **options)
    with (
        cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        yield cluster, client
