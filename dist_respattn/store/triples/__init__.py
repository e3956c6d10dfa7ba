"""The triple format: a row per (context, query, target), read by :mod:`.reader`, written by :mod:`.writer`,
an interrupted append undone by :mod:`.rollback`."""

from __future__ import annotations

__all__: list[str] = []
