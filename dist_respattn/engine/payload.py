"""A model or a grid table sent to the workers without the tables fixed for the fit that it holds.

Such a table (a :class:`~dist_respattn.model.fixed.FitConstant`: a sparse emission's support) is pickled as a
reference, by key; the engine sends the table itself once a fit, as a future of its own, and every task reading the
payload is given a reference to it beside it, which a worker resolves once a fit
(:func:`~dist_respattn.engine.held_tables.held`: a worker that lacks it, a replacement worker too, fetches it), so
nothing is recreated or sent again. A worker opens a payload once, on its first task, and its tasks share what it
opened.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dist_respattn.engine.held_tables import held
from dist_respattn.model.fixed import FitConstant

__all__ = ["SharedPayload", "opened", "split_payload"]


class _Pickler(pickle.Pickler):
    """Pickles every :class:`FitConstant` as its key (``key_for(table)``), collecting the tables it met."""

    def __init__(self, file: io.BytesIO, key_for: Callable[[FitConstant], str], buffers: list[Any]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self.key_for = key_for
        self.tables: dict[str, FitConstant] = {}

    def persistent_id(self, obj: Any) -> str | None:
        if isinstance(obj, FitConstant):
            key = self.key_for(obj)
            self.tables[key] = obj
            return key
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tables: Mapping[str, Any], buffers: list[Any]) -> None:
        super().__init__(file, buffers=buffers)
        self.tables = tables

    def persistent_load(self, pid: Any) -> Any:
        return self.tables[pid]


class SharedPayload:
    """A pickled payload whose fit-constant tables are keys (``keys``) into the tables its tasks are given beside it.

    ``data``: the pickle; ``buffers``: its arrays' memory, out of band (Dask sends them as they are, uncopied).
    """

    def __init__(self, data: bytes, buffers: list[Any], keys: tuple[str, ...]) -> None:
        self.data = data
        self.buffers = buffers
        self.keys = keys
        self._opened: Any = None
        self._lock = threading.Lock()

    def open(self, tables: Mapping[str, Any]) -> Any:
        """The payload, its tables those given by key (values, or references a worker resolves:
        :func:`~dist_respattn.engine.held_tables.held`); made once per object (a worker's threads share it)."""
        missing = [key for key in self.keys if key not in tables]
        if missing:
            raise KeyError(f"the payload's tables {missing} were not given to the task")
        # Resolved outside the lock: a fetch waits seceded from the worker's pool, the others must not hold a thread.
        values = {key: held(tables[key]) for key in self.keys} if self._opened is None else {}
        with self._lock:
            if self._opened is None:
                self._opened = _Unpickler(io.BytesIO(self.data), values, list(self.buffers)).load()
            return self._opened

    def __sizeof__(self) -> int:
        """Its pickle and its arrays' bytes (what Dask counts it as on a worker)."""
        return len(self.data) + sum(memoryview(buffer).nbytes for buffer in self.buffers)

    def __getstate__(self) -> dict[str, Any]:
        # What was opened stays where it was opened (a worker spilling this to disk keeps the pickle alone).
        return {"data": self.data, "buffers": self.buffers, "keys": self.keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._opened = None
        self._lock = threading.Lock()


def split_payload(payload: Any, key_for: Callable[[FitConstant], str]) -> tuple[SharedPayload, dict[str, FitConstant]]:
    """``payload`` pickled with each :class:`FitConstant` it holds as ``key_for(table)``, and those tables by key."""
    buffers: list[Any] = []
    file = io.BytesIO()
    pickler = _Pickler(file, key_for, buffers)
    pickler.dump(payload)
    return SharedPayload(file.getvalue(), buffers, tuple(pickler.tables)), pickler.tables


def opened(value: Any) -> Any:
    """A task's payload argument as the payload: a ``(SharedPayload, tables)`` pair opened, anything else as is."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], SharedPayload):
        return value[0].open(value[1])
    return value
