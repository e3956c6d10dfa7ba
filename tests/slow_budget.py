"""The ``slow`` marker's budget: ``-m "not slow"`` is the quick loop, so a test that takes longer must say so.

``python -m pytest -m "not slow" --slow-budget 3`` fails the run, naming them, when a test without the
marker spends more than 3 s in its setup, call and teardown together. (Off by default: a shared CI machine's
timings are too noisy to fail a run on.)
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
        help="fail the run when a test not marked slow takes longer than SECONDS (setup, call and teardown)",
    )


def pytest_configure(config: pytest.Config) -> None:
    seconds = config.getoption("--slow-budget")
    if seconds is not None:
        config.pluginmanager.register(SlowBudget(seconds), "slow-budget")


class SlowBudget:
    """Adds up each unmarked test's phases (reports reach the controller under xdist too) and judges them at the end."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.totals: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" not in report.keywords:
            self.totals[report.nodeid] = self.totals.get(report.nodeid, 0.0) + report.duration

    def over(self) -> list[tuple[float, str]]:
        """(seconds, test id) of each unmarked test over the budget, slowest first."""
        return sorted(((total, test) for test, total in self.totals.items() if total > self.seconds), reverse=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: Any) -> None:
        if self.over() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        over = self.over()
        if not over:
            return
        terminalreporter.section(f"tests over the slow budget of {self.seconds:g} s: mark them @pytest.mark.slow")
        for total, test in over:
            terminalreporter.write_line(f"{total:7.2f} s  {test}")
