"""Argument types, errors and the progress bar shared by every subcommand."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CommandError", "parse_storage_options", "positive_float", "positive_int", "progress_bar", "say"]


class CommandError(Exception):
    """An error the user can act on: printed as one line, exit status 2."""


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a positive integer")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"{text}: expected a number > 0")
    return value


def parse_storage_options(pairs: list[str] | None) -> dict[str, Any] | None:
    """``["key=value", ...]`` to a dict; values are JSON when they parse as JSON (``anon=true``), else strings."""
    if not pairs:
        return None
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--storage-option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def say(args: argparse.Namespace, message: str) -> None:
    """A progress message on stderr, kept out of ``--json`` output."""
    if not getattr(args, "json", False):
        print(message, file=sys.stderr, flush=True)


@contextmanager
def progress_bar(total: int | None, unit: str, description: str) -> Iterator[Any]:
    """A tqdm bar on stderr when it is a terminal; silent otherwise (logs and pipes stay clean)."""
    from tqdm import tqdm

    with tqdm(
        total=total, unit=unit, desc=description, disable=None, file=sys.stderr, unit_scale=True, dynamic_ncols=True
    ) as bar:
        yield bar
