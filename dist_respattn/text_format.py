"""Counts in the lines a person reads (``1 worker``, ``2,000 workers``); standard library only, for every layer."""

from __future__ import annotations

__all__ = ["count_text"]


def count_text(n: int, one: str, many: str | None = None) -> str:
    """``n`` with its noun, singular for exactly one: ``count_text(1, "worker")`` is ``1 worker``,
    ``count_text(2000, "worker")`` ``2,000 workers``; ``many`` for a plural that is not ``one + "s"``
    (``count_text(3, "worker process", "worker processes")``)."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
