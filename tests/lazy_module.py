"""A module imported on its first attribute, not when the test module that names it is collected.

The reference library (mixle) compiles its numba kernels when ``mixle.stats`` is imported: ~14 s of one core on a
fresh numba cache. A test module that imports it at its top pays that in every process that collects it, and under
xdist every test process collects every module, at the same moment: a fresh CI run compiled it twice, side by side,
before its first test. Imported on first use, it is compiled by the process that runs the first test needing it,
while the other goes on with its own tests, and loaded from numba's on-disk cache by any process that needs it later
(two processes that reach such a test at the same moment still both compile it).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["LazyModule"]


class LazyModule:
    """Stands for the module ``name``: the first public attribute read imports it; every such read is the module's
    own. A name with a leading underscore is not looked up (pytest's collection probes every global of a test module
    for such names, ``_mock_name`` among them, and must not import the module by it)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    def __repr__(self) -> str:
        return f"LazyModule({self._name!r})"
