"""Validating a store on a Dask cluster: the store's scan, its partitions checked in parallel on the workers."""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import distributed

from dist_respattn.engine.cluster import ClusterError, check_address
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.validate import ScanResult, ValidationReport, scan_partition, validate

__all__ = ["scan_on_cluster", "scheduler_client", "validate_on_cluster"]

#: How long ``validate --scheduler`` waits for the scheduler to answer.
CONNECT_TIMEOUT = "10s"


def scan_on_cluster(
    client: distributed.Client,
    location: StoreLocation,
    partitions: Sequence[int],
    progress: Callable[[int], None] | None = None,
) -> list[ScanResult]:
    """Run :func:`~dist_respattn.store.validate.scan_partition` for each partition as a task on ``client``'s
    workers (which must see ``location``), keys ``respattn-validate-<run>-<partition>``; results in partition
    order, so the report reads as the serial scan's."""
    run = uuid.uuid4().hex[:8]
    futures = client.map(
        scan_partition,
        [location] * len(partitions),
        list(partitions),
        key=[f"respattn-validate-{run}-{p}" for p in partitions],
        pure=False,
    )
    # The client's own loop: as_completed otherwise asks for a default client, which a caller's may not be.
    for _ in distributed.as_completed(futures, loop=client.loop):
        if progress is not None:
            progress(1)
    return list(client.gather(futures))


@contextlib.contextmanager
def scheduler_client(address: str) -> Iterator[distributed.Client]:
    """A client of the scheduler at ``address`` for one scan, closed after; a :class:`ClusterError` when the
    address names no scheduler or it does not answer within 10 s."""
    check_address(address)
    try:
        client = distributed.Client(address, timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise ClusterError(f"cannot reach the scheduler at {address}: {exc}") from exc
    try:
        yield client
    finally:
        client.close()


def validate_on_cluster(
    url: str | os.PathLike[str] | StoreLocation,
    *,
    storage_options: dict[str, Any] | None = None,
    client: distributed.Client | None = None,
    scheduler: str | None = None,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> ValidationReport:
    """:func:`~dist_respattn.store.validate.validate`, a triple store's partitions scanned in parallel on a cluster.

    The cluster is ``client`` (used as is, never closed) or the scheduler at ``scheduler`` (a client of it for
    this scan: :func:`scheduler_client`). With neither, the scan is serial. A token-stream store is scanned in this
    process, chunk by chunk, either way.
    """
    if client is None and scheduler is None:
        return validate(url, storage_options=storage_options, progress=progress, total=total)
    with contextlib.nullcontext(client) if client is not None else scheduler_client(str(scheduler)) as cluster:
        scan = functools.partial(scan_on_cluster, cluster)
        return validate(url, storage_options=storage_options, progress=progress, total=total, scan=scan)
