"""Running one pass over a store on the cluster and bringing back its single reduced value.

A pass is a fresh graph (see :mod:`reduction`): nothing refers to an earlier pass, and every future
is released when the pass ends, so the scheduler holds no more state after 100 iterations than after
one. Work lost with a worker is recomputed by Dask; if a pass still fails because its inputs were
lost, it is resubmitted whole (under new keys), which gives the same value.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

import distributed

from dist_respattn.engine.cluster import ClusterError
from dist_respattn.engine.reduction import DEFAULT_FAN_IN, reduce_partitions

__all__ = ["LOST_WORK_ERRORS", "PassRunner"]

logger = logging.getLogger(__name__)

#: Failures that mean work was lost with a worker, not that the work itself is wrong.
LOST_WORK_ERRORS: tuple[type[BaseException], ...] = (distributed.KilledWorker, concurrent.futures.CancelledError)

#: How many times a pass is submitted before a lost-work failure is reported.
MAX_ATTEMPTS = 3


class PassRunner:
    """Submits passes for one fit: keys carry the fit's run tag, progress goes to an optional bar.

    Args:
        client: the cluster's client.
        run_tag: 8 hex digits naming this fit, appended to every key so concurrent fits never share one.
        fan_in: the combine tree's fan-in (part of the fit's settings: it fixes the summation order).
        make_bar: ``make_bar(total, description)`` returns a progress bar (``update``/``close``) or ``None``.
    """

    def __init__(
        self,
        client: distributed.Client,
        run_tag: str,
        *,
        fan_in: int = DEFAULT_FAN_IN,
        make_bar: Callable[[int, str], Any] | None = None,
    ) -> None:
        self.client = client
        self.run_tag = run_tag
        self.fan_in = fan_in
        self.make_bar = make_bar

    def run(
        self,
        name: str,
        label: str,
        n_partitions: int,
        task: Callable[..., Any],
        args_for: Callable[[int], tuple[Any, ...]],
        *,
        description: str = "",
        before_attempt: Callable[[int], None] | None = None,
    ) -> Any:
        """Run ``task(*args_for(part))`` on every partition and return the combined value.

        Keys: ``respattn-<name>-<label>-<part>-<tag>`` for the partition tasks and
        ``respattn-<name>-combine-<label>-<level>-<i>-<tag>`` for the combines (the E-step's ``name``
        is ``estep`` with combines ``respattn-combine-…``). ``before_attempt(attempt)`` runs before every
        submission (it may re-scatter inputs a lost worker took with it).
        """
        combine_name = "combine" if name == "estep" else f"{name}-combine"
        for attempt in range(MAX_ATTEMPTS):
            if before_attempt is not None:
                before_attempt(attempt)
            tag = self.run_tag if attempt == 0 else f"{self.run_tag}.{attempt}"
            try:
                return self._run_once(
                    f"respattn-{name}-{label}", f"respattn-{combine_name}-{label}", tag,
                    n_partitions, task, args_for, description,
                )  # fmt: skip
            except LOST_WORK_ERRORS as exc:
                if self.client.status != "running":  # the scheduler went away: nothing to resubmit to
                    raise ClusterError(
                        f"lost the connection to the Dask scheduler during {name} {label} ({self.client.status}); "
                        "the fit can continue from its last checkpoint with --resume once the cluster is back"
                    ) from exc
                if attempt + 1 == MAX_ATTEMPTS:
                    raise
                logger.warning("%s %s lost work with a worker (%s); resubmitting it", name, label, exc)
            except distributed.client.ClosedClientError as exc:
                raise ClusterError(
                    f"lost the connection to the Dask scheduler during {name} {label}; the fit can continue from "
                    "its last checkpoint with --resume once the cluster is back"
                ) from exc
        raise AssertionError("unreachable")

    def _run_once(
        self,
        key_prefix: str,
        combine_prefix: str,
        tag: str,
        n_partitions: int,
        task: Callable[..., Any],
        args_for: Callable[[int], tuple[Any, ...]],
        description: str,
    ) -> Any:
        def submit_leaf(part: int, key: str) -> distributed.Future:
            return self.client.submit(task, *args_for(part), key=key, pure=False)

        bar = self.make_bar(n_partitions, description) if self.make_bar is not None else None
        # Progress holds each leaf only until it has finished and been counted. Bound to this pass's client's
        # loop: without one, as_completed looks for a default client, and ours are never the default.
        completed = distributed.as_completed(loop=self.client.loop) if bar is not None else None
        root = reduce_partitions(
            self.client,
            n_partitions,
            submit_leaf,
            key_prefix=key_prefix,
            combine_prefix=combine_prefix,
            tag=tag,
            fan_in=self.fan_in,
            on_leaf=completed.add if completed is not None else None,
        )
        try:
            if bar is not None and completed is not None:
                for _ in completed:
                    bar.update(1)
            return root.result()
        finally:
            if bar is not None:
                bar.close()
            # Forget the pass: the scheduler drops its tasks and results once no client holds them.
            del root, completed
