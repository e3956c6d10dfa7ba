"""Dropping what a head built from its parameters on first use (its ``functools.cached_property`` values: kernel
tables, log tables, sorted rows), so a head kept after its fit holds its parameters alone; each is built again when
next used."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["release_caches"]


def _cached_names(cls: type) -> list[str]:
    return [name for klass in cls.__mro__ for name, attr in vars(klass).items()
            if isinstance(attr, functools.cached_property)]  # fmt: skip


def release_caches(obj: Any, _seen: set[int] | None = None) -> None:
    """Drop the cached properties of ``obj`` and of the project's objects it holds (its components, single head,
    emission table, pair support...), in place."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for item in obj:
            release_caches(item, seen)
        return
    state = getattr(obj, "__dict__", None)
    if not isinstance(state, dict) or not type(obj).__module__.startswith("dist_respattn."):
        return
    for name in _cached_names(type(obj)):
        state.pop(name, None)
    for value in list(state.values()):
        release_caches(value, seen)
