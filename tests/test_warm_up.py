"""CI's warm-up step and ``--after-warm-up`` hold every test once between them: the warm-up command in ``.ci/run``
names :data:`tests.warm_up.WARM_UP_PATHS`, and ``--after-warm-up`` leaves out exactly the tests that command runs."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests import warm_up

CI_RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"


def ci_pytest_commands() -> list[list[str]]:
    """Each ``python -m pytest`` command of ``.ci/run``, its continuation lines joined, as words."""
    joined = CI_RUN.read_text().replace("\\\n", " ")
    return [shlex.split(line.strip()) for line in joined.splitlines() if line.strip().startswith("python -m pytest")]


def test_ci_runs_the_warm_up_paths_quick_tests_then_every_other_test() -> None:
    warm, main = ci_pytest_commands()
    assert warm[3:] == ["-q", "-m", "not slow", *warm_up.WARM_UP_PATHS]
    assert main[3:] == ["--after-warm-up"]
    root = CI_RUN.parents[1]
    for path in warm_up.WARM_UP_PATHS:
        assert (root / path).exists(), path


SUITE = {
    "tests/model/test_kernels.py": """
import pytest

def test_quick():
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.parametrize("case", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_cases(case):
    pass
""",
    "tests/model_extra/test_near.py": "def test_quick_beside_the_path():\n    pass\n",
    "tests/store/test_selected_rows.py": "def test_quick():\n    pass\n",
    "tests/store/test_selected_rows_more.py": "def test_quick():\n    pass\n",
    "tests/test_top.py": "import pytest\n\npytestmark = pytest.mark.slow\n\ndef test_marked_module():\n    pass\n",
}


def selected(pytester: pytest.Pytester, *args: str) -> set[str]:
    """The test ids a run of the suite above with ``args`` collects, with only the plugin under test."""
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    for name, source in SUITE.items():
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    result = pytester.runpytest(
        "-p", "no:xdist", "-p", "no:hypothesispytest", "--collect-only", "-q", *args, plugins=[warm_up]
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    return {line for line in result.outlines if "::" in line}


def test_after_warm_up_leaves_out_exactly_what_the_warm_up_runs(pytester: pytest.Pytester) -> None:
    everything = selected(pytester)
    warmed = selected(pytester, "-m", "not slow", *(p for p in warm_up.WARM_UP_PATHS if (pytester.path / p).exists()))
    after = selected(pytester, "--after-warm-up")
    assert warmed == {
        "tests/model/test_kernels.py::test_quick",
        "tests/model/test_kernels.py::test_cases[1]",
        "tests/store/test_selected_rows.py::test_quick",
    }
    assert after == everything - warmed
    assert {"tests/model/test_kernels.py::test_slow", "tests/model/test_kernels.py::test_cases[2]"} <= after
    assert {"tests/model_extra/test_near.py::test_quick_beside_the_path"} <= after
