"""``--cpu-report N``: the tests that spent the most CPU, counting the processes they start, and each module's total."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests import cpu_report

SUITE = """
import subprocess
import sys

import pytest

def test_quick():
    pass

def test_in_a_child_process():
    subprocess.run([sys.executable, "-c", "sum(range(40_000_000))"], check=True)

def test_in_its_fixture(busy):
    pass

@pytest.fixture
def busy():
    sum(range(20_000_000))
"""


def figures(output: str) -> dict[str, float]:
    """Each named test's CPU seconds in the report (module lines too, by path)."""
    report = output.split("costliest test(s) in CPU s", 1)[1]
    return {name: float(seconds) for seconds, name in re.findall(r"^\s+([0-9.]+)  (\S+)$", report, re.MULTILINE)}


def test_the_costliest_tests_are_named_with_their_children_s_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(
        "-p", "no:xdist", "-p", "no:hypothesispytest", "--cpu-report", "2", plugins=[cpu_report]
    )
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*the 2 costliest test(s) in CPU s*of * CPU s in all*", "by module:"])
    spent = figures(result.stdout.str())
    child, fixture = spent["test_suite.py::test_in_a_child_process"], spent["test_suite.py::test_in_its_fixture"]
    assert child > 0.2 and fixture > 0.1, spent  # the child's loop counts (reaped), as does the fixture's setup
    assert "test_suite.py::test_quick" not in spent  # only the two costliest
    assert spent["test_suite.py"] >= child + fixture - 0.02  # each figure is printed rounded to 0.01 s


@pytest.mark.slow
def test_under_xdist_the_workers_figures_reach_the_report(pytester: pytest.Pytester, monkeypatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest("pytest_plugins = ['tests.cpu_report']")
    root = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    result = pytester.runpytest_subprocess("-n", "2", "--cpu-report", "5")
    result.assert_outcomes(passed=3)
    spent = figures(result.stdout.str())
    assert spent["test_suite.py::test_in_a_child_process"] > 0.2, result.stdout.str()
    assert set(spent) >= {"test_suite.py::test_quick", "test_suite.py::test_in_its_fixture", "test_suite.py"}


def test_a_report_of_no_tests_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "no:xdist", "--cpu-report", "0", plugins=[cpu_report])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cpu-report 0: expected a number of tests, 1 or more*"])
