"""The ``slow`` marker's budget: ``-m "not slow"`` is the quick loop, so a test that takes longer must say so.

``python -m pytest -m "not slow" --slow-budget 3`` names, at the end of the run, each test without the
marker that spent more than 3 s in its setup, call and teardown together: a report, and the run's exit
status is the tests' own (a busy machine's timings are too noisy to fail a development loop on).
``--slow-budget-strict`` makes a test over the budget fail the run.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["SlowBudget"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="name, at the end, each test not marked slow that takes longer than SECONDS (setup, call and teardown)",
    )
    parser.addoption(
        "--slow-budget-strict",
        action="store_true",
        default=False,
        help="with --slow-budget: a test over the budget fails the run (exit status 1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    seconds = config.getoption("--slow-budget")
    strict = config.getoption("--slow-budget-strict")
    if strict and seconds is None:
        raise pytest.UsageError("--slow-budget-strict needs --slow-budget SECONDS")
    if seconds is not None:
        config.pluginmanager.register(SlowBudget(seconds, strict=strict), "slow-budget")


class SlowBudget:
    """Adds up each unmarked test's phases (reports reach the controller under xdist too) and names those over
    the budget at the end; ``strict``: they fail the run."""

    def __init__(self, seconds: float, *, strict: bool = False) -> None:
        self.seconds = seconds
        self.strict = strict
        self.totals: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" not in report.keywords:
            self.totals[report.nodeid] = self.totals.get(report.nodeid, 0.0) + report.duration

    def over(self) -> list[tuple[float, str]]:
        """(seconds, test id) of each unmarked test over the budget, slowest first."""
        return sorted(((total, test) for test, total in self.totals.items() if total > self.seconds), reverse=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: Any) -> None:
        if self.strict and self.over() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        over = self.over()
        if not over:
            return
        outcome = "they fail the run" if self.strict else "a report: the exit status is the tests' own"
        terminalreporter.section(
            f"{len(over)} test(s) over the slow budget of {self.seconds:g} s: mark them @pytest.mark.slow ({outcome})"
        )
        for total, test in over:
            terminalreporter.write_line(f"{total:7.2f} s  {test}")
        # The first run on a machine (or after a kernel's source changed) also compiles numba's kernels, in
        # whichever tests call them first: those are slow once, not every time.
        terminalreporter.write_line(
            "(a run that compiled numba's kernels, the first after a clone or a kernel change, is slower: run again "
            "before marking a test)"
        )
