"""The suite's order: the quick tests that compile every kernel first, the slow tests next, the quick rest last.

numba compiles a kernel the first time a process calls it and writes it to its on-disk cache, from which every later
process (the suite's many cluster workers and commands, same user, same checkout) loads it instead of compiling it
again: ~150 s of a run on a fresh clone is compiling. The quick tests of :data:`WARM_UP_PATHS` call every compiled
kernel once, in-process, so they run first, and the clusters start after. Then the tests marked ``slow``, a
module's tests together, so the run does not end with one process on a long test while the others wait; the quick
tests of the other paths last, to fill the end. One ``python -m pytest`` runs every test once: the README's test
command is what CI runs.

Under the suite's ``--dist load`` this plugin hands the tests out (:class:`KernelFamilyScheduling`), in the
collection's order, a unit at a time to whichever test process has fewest waiting: the warm-up tests of one kernel
family (:func:`kernel_family`: a kind's contract cases and its own model tests, or one module) together, then every
other module whole. xdist's own ``load`` hands out neighbouring tests to each process in turn, so both processes
called the same new kernels at once and both compiled each of them (~300 CPU s of warm-up instead of ~210), and
both built a module's shared stores, clusters and reference fits (its ``scope="module"`` fixtures). (xdist's
``loadgroup`` would group marked tests, but with pytest 9 the mark no longer reaches the test id it groups by.)
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["WARM_UP_PATHS", "kernel_family", "order"]

#: Paths (relative to the repository root) whose quick tests call every compiled kernel once.
WARM_UP_PATHS = (
    "tests/model",
    "tests/heads/test_head_contract.py",
    "tests/store/test_byte_tokenizer.py",
    "tests/store/test_selected_rows.py",
)

#: The kernel contract's module, whose cases (``[<kind>-...]``) join their kind's family.
_CONTRACT_PATH = "tests/heads/test_head_contract.py"

#: The kind whose compiled passes a module ``tests/model/test_<name>.py`` exercises, as the contract's cases of that
#: kind do (``gated`` and ``gated_kind`` are one kind's two modules).
_KIND_MODULES = {
    "codebook": "codebook",
    "conj": "conj",
    "copy": "copy",
    "gated": "gated",
    "gated_kind": "gated",
    "hops": "hops",
    "mixture": "mixture",
    "repeat": "repeat",
    "stack": "stack",
}

#: Tests of another module that call a kind's compiled passes (by the start of their ids), which join that kind's
#: family: as a family of their own they may run beside it in the other test process, and both build its kernels at
#: once (a stack's chain of hops 16-18 s in CI runs, 0.05 s from a built cache).
_TESTS_OF_KIND = {
    "tests/model/test_inner_choices.py::test_the_chain_": "hops",
    "tests/model/test_inner_choices.py::test_the_conj_": "conj",
    "tests/model/test_stack.py::test_a_chain_of_hops_": "hops",
}

_WARM, _SLOW_MODULE, _REST = 0, 1, 2


def _in_warm_paths(nodeid: str) -> bool:
    path = nodeid.split("::", 1)[0]
    return any(path == p or path.startswith(p + "/") for p in WARM_UP_PATHS)


def kernel_family(nodeid: str) -> str:
    """The group a warm-up test compiles its kernels in: a contract case's kind (``hops`` for
    ``...test_head_contract.py::TestHeadContract::test_x[hops-free-dense-0]``), the kind a module
    ``tests/model/test_<kind>.py`` is about or a test of :data:`_TESTS_OF_KIND` calls, else the test's own module
    path."""
    path, _, name = nodeid.partition("::")
    for start, kind in _TESTS_OF_KIND.items():
        if nodeid.startswith(start):
            return kind
    if path == _CONTRACT_PATH and "[" in name:
        return name[name.index("[") + 1 :].split("-", 1)[0]
    stem = path.rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    if path.startswith("tests/model/") and stem in _KIND_MODULES:
        return _KIND_MODULES[stem]
    return path


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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The suite's scheduler under ``--dist load`` (:class:`KernelFamilyScheduling`); xdist's own under any other."""
    if config.getvalue("dist") != "load":
        return None
    return _kernel_family_scheduling()(config, log)


def _kernel_family_scheduling() -> type:
    from xdist.scheduler import LoadScopeScheduling  # only where xdist runs the suite

    class KernelFamilyScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling: the warm-up tests a scope a kernel family, the others a scope a module.

        The controller knows the tests by id only: the warm-up tests are the collection's leading run of tests in
        :data:`WARM_UP_PATHS` (:func:`order` puts them first). Scopes go out in the collection's order, never
        sorted by size (xdist's ``--loadscope-reorder``): the slow modules before the quick ones, so the run ends on
        short work.
        """

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False  # read by schedule(); the order is the collection's
            self.families: dict[str, str] = {}  # a warm-up test's id -> its kernel family's scope

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:
                collection = next(iter(self.registered_collections.values()))
                for nodeid in collection:
                    if not _in_warm_paths(nodeid):
                        break
                    self.families[nodeid] = f"kernels of {kernel_family(nodeid)}"
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            family = self.families.get(nodeid)
            return family if family is not None else nodeid.split("::", 1)[0]

    return KernelFamilyScheduling
