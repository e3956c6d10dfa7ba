"""MkDocs hook: the command-line reference, rendered from the real parsers at build time.

``reference/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook replaces it with the ``--help`` of
``dist-respattn`` and of every subcommand (and of every action under one, such as ``models list``), from
:func:`dist_respattn.cli.build_parser`. The page therefore lists exactly the flags the installed command takes.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- cli-reference -->"
#: The width argparse wraps help to (it reads $COLUMNS); fixed so the page is the same on every machine.
WIDTH = "100"


def _render(parser: argparse.ArgumentParser, path: list[str], level: int) -> list[str]:
    name = " ".join(path)
    lines = [f"{'#' * level} `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    from dist_respattn.cli import subcommands

    for sub_name, sub, _ in subcommands(parser):
        lines += _render(sub, [*path, sub_name], min(level + 1, 4))
    return lines


def render_reference() -> str:
    """Markdown for every command: a table of the subcommands, then each one's help."""
    from dist_respattn.cli import build_parser, subcommands

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        table = ["| command | what it does |", "|---|---|"]
        for name, _, summary in subcommands(parser):
            table.append(f"| [`{name}`](#dist-respattn-{name}) | {summary} |")
        body = _render(parser, ["dist-respattn"], 2)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join([*table, "", *body])


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replace the marker on the CLI reference page with the rendered help."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_reference())
