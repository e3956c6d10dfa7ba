"""``--cpu-report N``: the N tests that cost the most CPU, their processes' and their children's.

CI's time limit is set by CPU, not by waiting: the suite keeps both cores busy, so a test's cost to the run is the
CPU seconds it and the processes it starts (commands, clusters, servers) spend. Each test process measures, for each
phase of a test, its own CPU and that of the children it reaped meanwhile (``getrusage``); the phases' sums reach
the controller with the reports (under xdist too), which prints the costliest tests, each module's total and the
run's total at the end. A report only: the exit status is the tests' own.

Children count when they are reaped, so a fixture's processes (a module's cluster) count in the test that ends the
fixture, and a process nobody waits for (a grandchild whose parent was killed) does not count at all: compare modules
run alone (``-n 0``), or whole runs, rather than single tests of a shared fixture.
"""

from __future__ import annotations

import resource
from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["CpuReport", "process_cpu_seconds"]

#: The key a report carries its phase's CPU seconds under (``report.user_properties``).
PROPERTY = "cpu_seconds"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        type=int,
        default=None,
        metavar="N",
        help="name, at the end, the N tests that spent the most CPU (their own and their reaped child processes'), "
        "and each module's total",
    )


def pytest_configure(config: pytest.Config) -> None:
    count = config.getoption("--cpu-report")
    if count is not None:
        if count < 1:
            raise pytest.UsageError(f"--cpu-report {count}: expected a number of tests, 1 or more")
        config.pluginmanager.register(CpuReport(count), "cpu-report")


def process_cpu_seconds() -> float:
    """This process's CPU seconds (user and system) and those of the children it has reaped."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


#: Each phase's CPU seconds on the item (``"setup"``, ``"call"``, ``"teardown"``), measured where it runs.
PHASES = pytest.StashKey[dict[str, float]]()


class CpuReport:
    """Measures each phase of each test where it runs, adds the phases up where the reports arrive, and prints the
    ``count`` costliest tests and every module's total."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.totals: dict[str, float] = {}

    @staticmethod
    def _measure(item: pytest.Item, when: str) -> Generator[None, None, None]:
        started = process_cpu_seconds()
        yield
        item.stash.setdefault(PHASES, {})[when] = process_cpu_seconds() - started

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        yield from self._measure(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        yield from self._measure(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        yield from self._measure(item, "teardown")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
        outcome = yield
        outcome.get_result().user_properties.append((PROPERTY, item.stash.get(PHASES, {}).get(call.when, 0.0)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        spent = sum(value for key, value in report.user_properties if key == PROPERTY)
        self.totals[report.nodeid] = self.totals.get(report.nodeid, 0.0) + spent

    def modules(self) -> list[tuple[float, str]]:
        """(CPU seconds, module path) of every module, costliest first."""
        per_module: dict[str, float] = {}
        for test, seconds in self.totals.items():
            module = test.split("::", 1)[0]
            per_module[module] = per_module.get(module, 0.0) + seconds
        return sorted(((seconds, module) for module, seconds in per_module.items()), reverse=True)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.totals:
            return
        costliest = sorted(((seconds, test) for test, seconds in self.totals.items()), reverse=True)[: self.count]
        total = sum(self.totals.values())
        terminalreporter.section(
            f"the {len(costliest)} costliest test(s) in CPU s (their processes' and reaped children's), "
            f"of {total:.1f} CPU s in all"
        )
        for seconds, test in costliest:
            terminalreporter.write_line(f"{seconds:8.2f}  {test}")
        terminalreporter.write_line("by module:")
        for seconds, module in self.modules()[: self.count]:
            terminalreporter.write_line(f"{seconds:8.2f}  {module}")
