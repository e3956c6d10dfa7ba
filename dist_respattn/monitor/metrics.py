"""Prometheus metrics of the fits, served on the scheduler's own ``/metrics`` next to Dask's.

Dask's ``/metrics`` handler renders ``prometheus_client``'s global registry, so a collector
registered there in the scheduler's process appears beside ``dask_scheduler_*``. One collector per
process reads every live :class:`~dist_respattn.monitor.board.FitBoard` (tests run several
schedulers in one process); label cardinality is bounded by the board's size.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from dist_respattn.monitor.board import STATES, FitBoard

__all__ = ["PREFIX", "FitCollector", "track", "untrack"]

#: The prefix of every metric name.
PREFIX = "dist_respattn_fit"

_boards: weakref.WeakSet[FitBoard] = weakref.WeakSet()
_registered = False
_lock = threading.Lock()


def track(board: FitBoard) -> None:
    """Serve ``board``'s fits on ``/metrics`` (registers the collector on first use)."""
    global _registered
    with _lock:
        _boards.add(board)
        if not _registered:
            REGISTRY.register(FitCollector())
            _registered = True


def untrack(board: FitBoard) -> None:
    with _lock:
        _boards.discard(board)


class FitCollector:
    """Yields the gauges of every tracked board's fits, labelled by ``run_id`` and ``store``."""

    def describe(self) -> list[Any]:
        return []  # collected on demand; describing would make the registry collect at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with _lock:
            fits = [fit for board in list(_boards) for fit in board.fits(curves=False)]
        labels = ["run_id", "store"]
        gauges = {
            "iteration": GaugeMetricFamily(f"{PREFIX}_iteration", "Last EM iteration finished", labels=labels),
            "mean_log_likelihood": GaugeMetricFamily(
                f"{PREFIX}_log_likelihood", "Mean log-likelihood per training row after the last E-step", labels=labels
            ),
            "heldout_log_likelihood": GaugeMetricFamily(
                f"{PREFIX}_heldout_log_likelihood", "Mean log-likelihood per validation row", labels=labels
            ),
            "heldout_perplexity": GaugeMetricFamily(
                f"{PREFIX}_heldout_perplexity", "Perplexity of the validation targets", labels=labels
            ),
            "rows_per_second": GaugeMetricFamily(
                f"{PREFIX}_rows_per_second", "Training rows per second in the last iteration", labels=labels
            ),
            "seconds_per_iteration": GaugeMetricFamily(
                f"{PREFIX}_seconds_per_iteration", "Wall time of the last iteration", labels=labels
            ),
        }
        state = GaugeMetricFamily(
            f"{PREFIX}_state", "1 for the fit's current state, 0 for the others", labels=[*labels, "state"]
        )
        counts = dict.fromkeys(STATES, 0)
        for fit in fits:
            values = [fit["run_id"], fit["store"] or ""]
            for name, gauge in gauges.items():
                if fit[name] is not None:
                    gauge.add_metric(values, float(fit[name]))
            for name in STATES:
                state.add_metric([*values, name], 1.0 if fit["state"] == name else 0.0)
            counts[fit["state"]] = counts.get(fit["state"], 0) + 1
        total = GaugeMetricFamily(f"{PREFIX}s", "Fits on the scheduler's board, by state", labels=["state"])
        for name, count in counts.items():
            total.add_metric([name], float(count))
        yield from gauges.values()
        yield state
        yield total
