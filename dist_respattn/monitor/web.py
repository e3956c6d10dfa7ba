"""The fit page and its JSON, served by the scheduler's own web server (the dashboard's port).

``/respattn/fits`` is a self-contained HTML page that polls ``/respattn/api/fits.json``. The
handlers find the board through the scheduler's :class:`~dist_respattn.monitor.plugin.FitMonitor`
plugin, so the routes can be installed either by the plugin itself or by listing this module in
Dask's ``distributed.scheduler.http.routes`` config (then a fit installs the plugin on connect).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Any

from tornado import web

__all__ = ["API_PATH", "PAGE_PATH", "FitsJSONHandler", "FitsPageHandler", "page_url", "routes"]

#: Where the page and its JSON live on the scheduler's web server.
PAGE_PATH = "/respattn/fits"
API_PATH = "/respattn/api/fits.json"


def page_url(dashboard: str) -> str:
    """The fit page's URL beside a dashboard link (``http://host:8787/status`` → ``http://host:8787/respattn/fits``)."""
    base = dashboard.removesuffix("/status").rstrip("/")
    return base + PAGE_PATH


@functools.cache
def _page() -> bytes:
    return importlib.resources.files("dist_respattn.monitor").joinpath("fits.html").read_bytes()


class _MonitorHandler(web.RequestHandler):
    def initialize(self, dask_server: Any = None) -> None:
        self.scheduler = dask_server

    def board_fits(self) -> list[dict[str, Any]] | None:
        from dist_respattn.monitor.plugin import FitMonitor

        plugin = getattr(self.scheduler, "plugins", {}).get(FitMonitor.name)
        return None if plugin is None or plugin.board is None else plugin.board.fits()


class FitsPageHandler(_MonitorHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(_page())


class FitsJSONHandler(_MonitorHandler):
    def get(self) -> None:
        fits = self.board_fits()
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        # A scheduler listing this module in its routes shows the page before any fit installed the plugin.
        self.write(json.dumps({"installed": fits is not None, "fits": fits or []}, allow_nan=False))


#: Read by Dask when this module is listed under ``distributed.scheduler.http.routes``.
routes: list[tuple[str, type, dict[str, Any]]] = [
    (PAGE_PATH, FitsPageHandler, {}),
    (API_PATH, FitsJSONHandler, {}),
]
