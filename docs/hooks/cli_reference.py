"""MkDocs hook: the command-line reference, rendered from the real parsers.

``reference/cli.md`` is a page of its own in plain Markdown (as GitHub shows it): an introduction and a table of
every command and action with its one-line help, between the markers ``<!-- commands -->`` and
``<!-- /commands -->``, checked in and checked by ``tests/test_docs.py`` against :func:`command_table`. At build
time this hook replaces the marker ``<!-- cli-reference -->`` after it with the ``--help`` of ``dist-respattn`` and
of every subcommand (and of every action under one, such as ``models list``), from
:func:`dist_respattn.cli.build_parser`, so the site lists exactly the flags the installed command takes. Only the
table is checked in, not the help itself: argparse words its help differently from one Python version to the next.

``python docs/hooks/cli_reference.py`` rewrites the table in ``docs/reference/cli.md`` from the parsers.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
#: Around the checked-in table of commands.
TABLE_BEGIN, TABLE_END = "<!-- commands -->", "<!-- /commands -->"
#: The page, from the repository's root.
PAGE = Path("docs") / "reference" / "cli.md"
#: The width argparse wraps help to (it reads $COLUMNS); fixed so the page is the same on every machine.
WIDTH = "100"


def _commands(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[list[str], str]]:
    """``(words, one-line help)`` of every command under ``parser`` (its actions after it), in registered order."""
    from dist_respattn.cli import subcommands

    found = []
    for name, sub, summary in subcommands(parser):
        found.append(([*path, name], summary))
        found += _commands(sub, [*path, name])
    return found


def _anchor(words: list[str]) -> str:
    """The id MkDocs gives the heading of ``dist-respattn WORDS`` (see :func:`_render`)."""
    return "-".join(["dist-respattn", *words])


def command_table() -> str:
    """The Markdown table of every command and action with its one-line help, each linked to its help below."""
    from dist_respattn.cli import build_parser

    rows = ["| command | what it does |", "|---|---|"]
    for words, summary in _commands(build_parser(), []):
        rows.append(f"| [`{' '.join(words)}`](#{_anchor(words)}) | {summary} |")
    return "\n".join(rows)


def _render(parser: argparse.ArgumentParser, path: list[str], level: int) -> list[str]:
    name = " ".join(path)
    lines = [f"{'#' * level} `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    from dist_respattn.cli import subcommands

    for sub_name, sub, _ in subcommands(parser):
        lines += _render(sub, [*path, sub_name], min(level + 1, 4))
    return lines


def render_reference() -> str:
    """Markdown for every command: each one's ``--help``, under a heading of its own."""
    from dist_respattn.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        body = _render(build_parser(), ["dist-respattn"], 2)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(body)


def with_table(markdown: str) -> str:
    """``markdown`` (the page) with the table between its markers made from the parsers."""
    begin, end = markdown.index(TABLE_BEGIN) + len(TABLE_BEGIN), markdown.index(TABLE_END)
    return f"{markdown[:begin]}\n{command_table()}\n{markdown[end:]}"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replace the marker on the CLI reference page with the rendered help."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_reference())


if __name__ == "__main__":
    page = Path(__file__).resolve().parents[2] / PAGE
    text = page.read_text()
    updated = with_table(text)
    page.write_text(updated)
    print(f"{page}: {'table rewritten' if updated != text else 'table already current'}", file=sys.stderr)
