"""``FitMonitor``: the scheduler plugin that keeps the fit board and serves it.

It listens to the ``dist_respattn.fit`` events every fit sends (``SchedulerPlugin.log_event``),
marks a running fit failed when its driver's client leaves, adds the page's routes to the
scheduler's web server, and registers the board with the ``/metrics`` collector.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from dist_respattn.events import EVENT_TOPIC
from dist_respattn.monitor import metrics, web
from dist_respattn.monitor.board import FitBoard

__all__ = ["FitMonitor"]

logger = logging.getLogger(__name__)


class FitMonitor(SchedulerPlugin):
    """Keeps the scheduler's :class:`FitBoard`; installed once per scheduler (its name is fixed).

    Pickled to the scheduler by ``Client.register_plugin``, so it carries no state until ``start``.
    """

    name = "dist_respattn-monitor"
    idempotent = True

    def __init__(self) -> None:
        self.board: FitBoard | None = None

    async def start(self, scheduler: Any) -> None:
        self.board = FitBoard()
        # Events logged before the plugin arrived (a fit that installed it, or a monitor added mid-fit).
        for when, event in scheduler.get_events(EVENT_TOPIC):
            self.board.record(event, when)
        _add_routes(scheduler)
        metrics.track(self.board)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == EVENT_TOPIC and self.board is not None:
            self.board.record(msg)

    def remove_client(self, scheduler: Any, client: str) -> None:
        if self.board is not None:
            self.board.client_left(client)

    async def close(self) -> None:
        if self.board is not None:
            metrics.untrack(self.board)


def _add_routes(scheduler: Any) -> None:
    """Serve the page on the scheduler's web server, once per scheduler.

    A scheduler that also lists :mod:`dist_respattn.monitor.web` in its routes config serves the same
    handlers twice; the first match answers, and both read the same plugin.
    """
    application = getattr(scheduler, "http_application", None)
    if application is None or getattr(scheduler, "_respattn_routes", False):
        return
    application.add_handlers(r".*$", [(path, cls, {"dask_server": scheduler}) for path, cls, _ in web.routes])
    scheduler._respattn_routes = True
