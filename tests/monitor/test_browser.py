"""The fit page in a real browser: headless Chromium renders ``/respattn/fits`` of a scheduler while a fit
runs there (its script fetches the JSON and draws the SVG curves), screenshots it, and renders it again
after the fit's driver was killed.

Chromium must be installed in CI (``.ci/run`` installs it); elsewhere the test is skipped without it. The
screenshot is kept as ``test-artifacts/fit-page.png`` at the repository root.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image  # pillow comes with bokeh, which the package needs for the dashboard

from dist_respattn.events import FitState, IterationRecord, iteration_event, start_event
from dist_respattn.monitor import PAGE_PATH, FitBoard
from dist_respattn.monitor.web import API_PATH, _page

from .conftest import MonitoredCluster, Stores, start_fit, wait_running, wait_until

pytestmark = pytest.mark.slow  # the tests here share a cluster or start commands

ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "fit-page.png"
WINDOW = (1200, 900)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The page's stroke colours of the two curves (fits.html: path.loglik, path.heldout).
LOGLIK_RGB, HELDOUT_RGB = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)
#: Iterations the fit has done before the page is rendered (so its curves have that many points).
ITERATIONS_BEFORE = 3


def chromium() -> str:
    """The Chromium binary: required in CI, the test is skipped without it elsewhere."""
    binary = shutil.which("chromium")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs it): the fit page cannot be tested in a browser")
        pytest.skip("chromium is not installed (CI installs it)")
    return binary


def run_chromium(profile: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``url`` with 5 s of virtual time (the page's first fetch and a refresh or two)."""
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-proxy-server",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args, url,
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


class Elements(HTMLParser):
    """Every element's tag and attributes, in document order; and the text of the elements with an id."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    handle_startendtag = handle_starttag

    def find(self, tag: str, *classes: str, **attrs: str) -> list[dict[str, str]]:
        wanted = set(classes)
        return [
            a
            for t, a in self.elements
            if t == tag and wanted <= set(a.get("class", "").split()) and all(a.get(k) == v for k, v in attrs.items())
        ]


def card_html(dom: str, run_id: str) -> str:
    """The serialized card of ``run_id`` (from its opening tag to the next card or the end of the list)."""
    start = dom.index(f'id="fit-{run_id}"')
    following = dom.find('<div class="fit"', start)
    return dom[dom.rindex("<div", 0, start) : following if following != -1 else len(dom)]


def path_points(d: str) -> list[tuple[float, float]]:
    """The points of an SVG path made of one ``M x,y`` and ``L x,y`` commands."""
    assert re.fullmatch(r"M-?[\d.]+,-?[\d.]+( L-?[\d.]+,-?[\d.]+)*", d), d
    return [(float(x), float(y)) for x, y in re.findall(r"[ML](-?[\d.]+),(-?[\d.]+)", d)]


@dataclass
class Rendered:
    run_id: str
    iteration_before: int  # the board's iteration just before the running page was rendered
    iteration_after: int  # ... and just after
    running_dom: str
    screenshot: Path
    screenshot_seconds: float
    dom_seconds: float
    failed_dom: str


@pytest.fixture(scope="module")
def rendered(monitored_cluster: MonitoredCluster, stores: Stores, tmp_path_factory) -> Rendered:
    """A long fit on the monitored scheduler: its page rendered (DOM, screenshot) while it runs, then again
    once its driver was SIGKILLed and the board marked it failed."""
    chromium()
    folder = tmp_path_factory.mktemp("browser")
    web = monitored_cluster.web
    url = web.url(PAGE_PATH)
    process = start_fit(monitored_cluster, stores, folder / "model", 1000)
    try:
        before = wait_running(monitored_cluster, process, ITERATIONS_BEFORE)
        started = time.monotonic()
        dom = run_chromium(folder / "profile-dom", url, "--dump-dom").stdout
        dom_seconds = time.monotonic() - started
        after = web.fit_of(process.model_dir)
        assert after is not None and after["state"] == "running", after

        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        ARTIFACT.unlink(missing_ok=True)
        started = time.monotonic()
        run_chromium(
            folder / "profile-shot", url, f"--screenshot={ARTIFACT}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
            "--hide-scrollbars",
        )  # fmt: skip
        screenshot_seconds = time.monotonic() - started
        assert process.process.poll() is None, "the fit ended before its page was screenshot"

        process.kill()
        wait_until(lambda: (web.fit_of(process.model_dir) or {}).get("state") == "failed", 60, "the killed fit to fail")
        failed_dom = run_chromium(folder / "profile-failed", url, "--dump-dom").stdout
    finally:
        process.kill()
    return Rendered(
        before["run_id"], before["iteration"], after["iteration"], dom, ARTIFACT, screenshot_seconds, dom_seconds,
        failed_dom,
    )  # fmt: skip


def test_the_running_fits_card_draws_its_curves(rendered):
    """The DOM Chromium built from the page's script: the fit's card, ``data-state="running"``, its iteration
    figure, and a ``path.curve.loglik`` (and ``path.curve.heldout``) with one point per iteration done, as
    many as its ``data-points`` say, inside the chart."""
    dom = rendered.running_dom
    assert 'id="empty"' not in dom, "the page never filled in the fits"
    card = card_html(dom, rendered.run_id)
    elements = Elements(card)
    (div,) = elements.find("div", "fit", id=f"fit-{rendered.run_id}")
    assert div["data-state"] == "running"
    (badge,) = re.findall(r'<span class="state state-(\w+)">(\w+)</span>', card)
    assert badge == ("running", "running")
    shown = re.search(r'data-name="iteration">iteration: <b>(\d+) / 1000</b>', card)
    assert shown, card[:2000]
    iteration = int(shown.group(1))
    assert rendered.iteration_before <= iteration <= rendered.iteration_after

    for series in ("loglik", "heldout"):
        (path,) = elements.find("path", "curve", series)
        points = path_points(path["d"])
        assert len(points) == int(path["data-points"]) == iteration >= 2, series
        (svg,) = elements.find("svg", **{"data-series": series})
        width, height = float(svg["width"]), float(svg["height"])
        assert all(0 <= x <= width and 0 <= y <= height for x, y in points), points
        xs = [x for x, _ in points]
        assert xs == sorted(xs) and xs[0] < xs[-1], xs  # iterations left to right
        assert len({y for _, y in points}) > 1, f"a flat {series} curve: {points}"


def test_the_screenshot_shows_the_page_with_its_curves(rendered):
    """The screenshot is a WINDOW-sized PNG of some size, with both curves' stroke colours spread over many
    pixel rows (a curve across the chart, not just the blue state badge)."""
    data = rendered.screenshot.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000, f"a {len(data)}-byte screenshot is too small to show the page"
    with Image.open(rendered.screenshot) as image:
        image.verify()
    with Image.open(rendered.screenshot) as image:
        assert image.size == WINDOW
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    for colour in (LOGLIK_RGB, HELDOUT_RGB):
        near = (np.abs(pixels - np.array(colour, dtype=np.int16)) <= 40).all(axis=2)
        rows = int(near.any(axis=1).sum())
        assert rows >= 40, f"colour {colour} is on {rows} pixel rows only: no curve drawn"


def test_the_killed_fits_card_shows_failed(rendered):
    """After the driver was SIGKILLed the page shows the card ``data-state="failed"`` with the board's reason."""
    card = card_html(rendered.failed_dom, rendered.run_id)
    (div,) = Elements(card).find("div", "fit", id=f"fit-{rendered.run_id}")
    assert div["data-state"] == "failed"
    assert '<span class="state state-failed">failed</span>' in card
    assert re.search(r'<div class="error">[^<]*driver left[^<]*</div>', card), card[-1500:]
    (path,) = Elements(card).find("path", "curve", "loglik")
    assert int(path["data-points"]) >= rendered.iteration_after  # the curve it reached stays on the page


@contextlib.contextmanager
def serving(board: FitBoard) -> Iterator[str]:
    """The fit page's own HTML and ``board``'s JSON served on 127.0.0.1 as the scheduler serves them; yields
    the page's URL."""
    body = json.dumps({"installed": True, "fits": board.fits()}, allow_nan=False).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            content, kind = {PAGE_PATH: (_page(), "text/html"), API_PATH: (body, "application/json")}.get(
                self.path.split("?")[0], (b"", "")
            )
            self.send_response(200 if content else 404)
            self.send_header("Content-Type", kind or "text/plain")
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{PAGE_PATH}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_fit_without_held_out_rows_says_no_validation_store(tmp_path):
    """A fit whose driver said it has no held-out rows shows "no validation store" in its held-out chart after
    its iterations; a fit with held-out rows that has not finished one says "no iteration yet"."""
    chromium()

    def start(run_id: str, validation: str | None) -> dict:
        heldout = None if validation is None else f"the validation store {validation}"
        return dict(
            start_event(
                run_id, client="c", store="/t.zarr", validation=validation, heldout_rows=heldout, rows=100,
                max_iter=5, model_dir=f"/{run_id}", first_iteration=1,
            )
        )  # fmt: skip

    board = FitBoard()
    board.record(start("aaaa0001", None))
    for i in (1, 2):
        record = IterationRecord(
            iteration=i, mean_log_likelihood=-3.0 + i, change=None, seconds=0.5, rows_per_second=200.0,
            n_obs=100.0, sigma2=1.0, hyperparameters=None, heldout=None, state=FitState.RUNNING, warnings=[],
            run_id="aaaa0001",
        )  # fmt: skip
        board.record(dict(iteration_event(record)))
    board.record(start("bbbb0002", "/v.zarr"))
    with serving(board) as url:
        dom = run_chromium(tmp_path / "profile", url, "--dump-dom").stdout

    def chart_text(run_id: str, series: str) -> str:
        card = card_html(dom, run_id)
        svg = card[card.index(f'data-series="{series}"') :]
        return re.search(r'<text[^>]*class="axis"[^>]*>([^<]*)</text>', svg[: svg.index("</svg>")]).group(1)

    assert int(Elements(card_html(dom, "aaaa0001")).find("path", "curve", "loglik")[0]["data-points"]) == 2
    assert chart_text("aaaa0001", "heldout") == "no validation store"
    assert chart_text("bbbb0002", "heldout") == "no iteration yet"
    assert chart_text("bbbb0002", "loglik") == "no iteration yet"
