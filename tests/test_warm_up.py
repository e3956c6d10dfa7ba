"""The suite's order (tests/warm_up.py): the kernels' quick tests first, slow modules next, the quick rest last;
and CI runs the README's test command, once."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests import warm_up

ROOT = Path(__file__).resolve().parents[1]

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
    "tests/engine/test_fit.py": """
import pytest

def test_quick_beside_a_slow_one():
    pass

@pytest.mark.slow
def test_slow_fit():
    pass
""",
    "tests/model_extra/test_near.py": "def test_quick_beside_the_path():\n    pass\n",
    "tests/store/test_selected_rows.py": "def test_quick():\n    pass\n",
    "tests/test_top.py": "import pytest\n\npytestmark = pytest.mark.slow\n\ndef test_marked_module():\n    pass\n",
}


def test_the_kernels_quick_tests_run_first_then_slow_modules_then_the_rest(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    for name, source in SUITE.items():
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    result = pytester.runpytest(
        "-p", "no:xdist", "-p", "no:hypothesispytest", "--collect-only", "-q", plugins=[warm_up]
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert [line for line in result.outlines if "::" in line] == [
        "tests/model/test_kernels.py::test_quick",
        "tests/model/test_kernels.py::test_cases[1]",
        "tests/store/test_selected_rows.py::test_quick",
        "tests/engine/test_fit.py::test_quick_beside_a_slow_one",
        "tests/engine/test_fit.py::test_slow_fit",
        "tests/model/test_kernels.py::test_slow",
        "tests/model/test_kernels.py::test_cases[2]",
        "tests/test_top.py::test_marked_module",
        "tests/model_extra/test_near.py::test_quick_beside_the_path",
    ]


def test_ci_runs_the_readme_s_test_command_and_the_suite_hands_tests_out_in_order() -> None:
    """The order above only holds with xdist's ``load`` scheduling (``worksteal`` splits the collection in halves);
    and ``.ci/run`` runs the README's ``python -m pytest`` as it is, once."""
    addopts = re.search(r"^addopts = (.*)$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert addopts is not None and '"--dist", "load"' in addopts.group(1)
    readme = (ROOT / "README.md").read_text()
    assert "&& python -m pytest\n" in readme
    joined = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    commands = [shlex.split(line.strip()) for line in joined.splitlines() if "python -m pytest" in line]
    assert commands == [["python", "-m", "pytest"]]
