"""``--slow-budget``: the quick loop (``-m "not slow"``) names each test that is slow and not marked so; the
run fails on one only with ``--slow-budget-strict``."""

from __future__ import annotations

import pytest

from tests import slow_budget

SUITE = """
import time
import pytest

def test_quick():
    pass

@pytest.mark.slow
def test_marked_and_slow():
    time.sleep(0.4)

def test_slow_in_its_fixture(sleepy):
    pass

@pytest.fixture
def sleepy():
    time.sleep(0.4)
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The suite above in this process, with only the plugin under test (no xdist, no hypothesis)."""
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest("-p", "no:xdist", "-p", "no:hypothesispytest", *args, plugins=[slow_budget])


def test_an_unmarked_slow_test_is_named_and_the_run_still_passes(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--slow-budget", "0.2")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*1 test(s) over the slow budget of 0.2 s*(a report: the exit status is the tests' own)*",
            "*s  test_suite.py::test_slow_in_its_fixture",
            "*compiled numba's kernels*run again before marking a test*",
        ]
    )
    assert "test_marked_and_slow" not in result.stdout.str().split("slow budget", 1)[1]


def test_strict_an_unmarked_slow_test_fails_the_run(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--slow-budget", "0.2", "--slow-budget-strict")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*1 test(s) over the slow budget of 0.2 s*(they fail the run)*", "*s  test_suite.py::test_slow_in_its_fixture"]
    )


def test_within_the_budget_nothing_is_named(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--slow-budget", "5", "--slow-budget-strict")
    assert result.ret == pytest.ExitCode.OK
    assert "slow budget" not in result.stdout.str()


def test_strict_without_a_budget_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--slow-budget-strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--slow-budget-strict needs --slow-budget SECONDS*"])
