"""The suite's order (tests/warm_up.py): the kernels' quick tests first, slow modules next, the quick rest last;
and CI runs the README's test command, once."""

from __future__ import annotations

import ast
import re
import shlex
from collections import defaultdict
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


def test_a_kernel_family_is_a_kind_s_contract_cases_and_model_tests_else_a_module() -> None:
    contract = "tests/heads/test_head_contract.py::TestHeadContract::test_statistics_add[hops-free-dense-0]"
    assert warm_up.kernel_family(contract) == "hops"
    assert warm_up.kernel_family("tests/heads/test_head_contract.py::test_plain") == "tests/heads/test_head_contract.py"
    assert warm_up.kernel_family("tests/model/test_hops.py::test_chain[2]") == "hops"
    assert warm_up.kernel_family("tests/model/test_gated_kind.py::test_x") == "gated"
    assert warm_up.kernel_family("tests/model/test_lanes.py::test_x") == "tests/model/test_lanes.py"
    assert warm_up.kernel_family("tests/store/test_hops.py::test_x") == "tests/store/test_hops.py"
    assert warm_up.kernel_family("tests/model/test_stack.py::test_a_chain_of_hops_gives_x") == "hops"
    assert warm_up.kernel_family("tests/model/test_stack.py::test_other") == "stack"


@pytest.mark.parametrize("start", sorted(warm_up._TESTS_OF_KIND))
def test_each_test_named_to_join_a_kind_s_family_exists(start: str) -> None:
    """A renamed test would silently leave its kind's family (and build its kernels beside it again)."""
    path, _, prefix = start.partition("::")
    tree = ast.parse((ROOT / path).read_text())
    names = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith(prefix)]
    assert names, f"{path} has no test starting {prefix!r}: rename it in tests/warm_up.py's _TESTS_OF_KIND"
    assert warm_up.kernel_family(f"{path}::{names[0]}[case]") == warm_up._TESTS_OF_KIND[start]


FAMILIES = {
    "tests/heads/test_head_contract.py": """
import pytest

@pytest.mark.parametrize("case", ["hops-a", "conj-a", "hops-b", "conj-b"])
def test_case(case):
    pass
""",
    "tests/model/test_hops.py": "def test_one():\n    pass\n\ndef test_two():\n    pass\n",
    "tests/model/test_conj.py": "def test_one():\n    pass\n",
    "tests/test_rest.py": "".join(f"def test_{n}():\n    pass\n\n" for n in range(6)),
}

#: Each test's worker and id, one a line in ``ran.txt``, as the process that runs it has them.
RECORD_WORKERS = """

import os

def pytest_runtest_call(item):
    with open(item.config.rootpath / "ran.txt", "a") as ran:
        ran.write(os.environ["PYTEST_XDIST_WORKER"] + " " + item.nodeid + "\\n")
"""


def test_two_processes_each_compile_whole_kernel_families(pytester: pytest.Pytester) -> None:
    """Under ``--dist load`` the plugin's scheduler hands each kernel family's warm-up tests to one process, and each
    other module whole to one process (its module fixtures built once). The test processes load the plugin as the
    root's conftest (a plugin object given here stays in this process)."""
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makeconftest(Path(warm_up.__file__).read_text() + RECORD_WORKERS)
    for name, source in FAMILIES.items():
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest", "-n", "2", "--dist", "load")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    workers = defaultdict(set)
    ran = [line.split(" ", 1) for line in (pytester.path / "ran.txt").read_text().splitlines()]
    for worker, nodeid in ran:
        workers["tests/test_rest.py" if "test_rest" in nodeid else warm_up.kernel_family(nodeid)].add(worker)
    assert len(ran) == 13
    assert len(workers["hops"]) == len(workers["conj"]) == len(workers["tests/test_rest.py"]) == 1


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
