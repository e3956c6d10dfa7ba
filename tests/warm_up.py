"""The suite's order: the quick tests that compile every kernel first, the slow tests next, the quick rest last.

numba compiles a kernel the first time a process calls it and writes it to its on-disk cache, from which every later
process (the suite's many cluster workers and commands, same user, same checkout) loads it instead of compiling it
again: ~150 s of a run on a fresh clone is compiling. The quick tests of :data:`WARM_UP_PATHS` call every compiled
kernel once, in-process, so they run first; with ``--dist load`` (the suite's default) xdist hands the collection
out in its order, a chunk to each test process in turn, so both start on them and the clusters start after.
Then the tests marked ``slow``, a module's tests together, so the run does not end with one process on a long test
while the others wait; the quick tests of the other paths last, to fill the end. One ``python -m pytest`` runs
every test once: the README's test command is what CI runs.
"""

from __future__ import annotations

import pytest

__all__ = ["WARM_UP_PATHS", "order"]

#: Paths (relative to the repository root) whose quick tests call every compiled kernel once.
WARM_UP_PATHS = (
    "tests/model",
    "tests/heads/test_head_contract.py",
    "tests/store/test_byte_tokenizer.py",
    "tests/store/test_selected_rows.py",
)

_WARM, _SLOW_MODULE, _REST = 0, 1, 2


def _in_warm_paths(nodeid: str) -> bool:
    path = nodeid.split("::", 1)[0]
    return any(path == p or path.startswith(p + "/") for p in WARM_UP_PATHS)


def order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` in the suite's order (a stable sort: the collection's order within each group): the quick tests of
    the warm-up paths, then every other test of a module that holds a slow one, then the rest."""
    slow = {id(item): item.get_closest_marker("slow") is not None for item in items}
    slow_modules = {item.nodeid.split("::", 1)[0] for item in items if slow[id(item)]}

    def group(item: pytest.Item) -> int:
        if _in_warm_paths(item.nodeid) and not slow[id(item)]:
            return _WARM
        return _SLOW_MODULE if item.nodeid.split("::", 1)[0] in slow_modules else _REST

    return sorted(items, key=group)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = order(items)
