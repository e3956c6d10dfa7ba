"""Watching fits on the Dask dashboard: a page on the scheduler's web server and Prometheus metrics.

Every fit sends its progress to the scheduler as ``dist_respattn.fit`` events. The
:class:`FitMonitor` scheduler plugin folds them into a bounded board, serves it at
``/respattn/fits`` (HTML) and ``/respattn/api/fits.json``, and adds ``dist_respattn_fit_*`` gauges to
the scheduler's ``/metrics``.

Fits install the plugin on the cluster they connect to. To have it from the scheduler's start (for
instance to keep the page up between nightly fits), preload this module::

    dask scheduler --preload dist_respattn.monitor

or set the equivalent config line ``distributed.scheduler.preload: [dist_respattn.monitor]``.
"""

from __future__ import annotations

from typing import Any

from dist_respattn.monitor.board import FINAL_STATES, STATES, FitBoard, FitRecord
from dist_respattn.monitor.plugin import FitMonitor
from dist_respattn.monitor.web import API_PATH, PAGE_PATH

__all__ = ["API_PATH", "FINAL_STATES", "PAGE_PATH", "STATES", "FitBoard", "FitMonitor", "FitRecord", "dask_setup"]


def dask_setup(scheduler: Any) -> None:
    """The ``--preload`` hook: add the monitor to a scheduler as it starts."""
    scheduler.add_plugin(FitMonitor(), name=FitMonitor.name, idempotent=True)
