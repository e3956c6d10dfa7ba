"""CI's warm-up step and its main step: two runs that hold every test of the suite once between them.

``.ci/run`` first runs the quick tests (those not marked ``slow``) of :data:`WARM_UP_PATHS`: they call every
compiled kernel once, which writes numba's on-disk cache, so the suite's many processes load the kernels instead
of each compiling them. Its main step then runs ``python -m pytest --after-warm-up``: the whole suite without
those tests, which passed a minute earlier on the same tree (they take about 30 s of the main step's wall time
with the kernels compiled). ``tests/test_warm_up.py`` checks that the warm-up command in ``.ci/run`` names
these paths, so the two steps cannot drift apart. Without the option, ``python -m pytest`` runs everything.
"""

from __future__ import annotations

import pytest

__all__ = ["WARM_UP_PATHS", "warmed_up"]

#: The paths of CI's warm-up command (``python -m pytest -m "not slow" PATHS``), relative to the repository root.
WARM_UP_PATHS = (
    "tests/model",
    "tests/heads/test_head_contract.py",
    "tests/store/test_byte_tokenizer.py",
    "tests/store/test_selected_rows.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--after-warm-up",
        action="store_true",
        default=False,
        help="leave out the quick tests of CI's warm-up step (tests/warm_up.py), which ran them already",
    )


def warmed_up(nodeid: str, slow: bool) -> bool:
    """Whether CI's warm-up step runs the test ``nodeid`` (relative to the repository root)."""
    path = nodeid.split("::", 1)[0]
    return not slow and any(path == p or path.startswith(p + "/") for p in WARM_UP_PATHS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--after-warm-up"):
        return
    kept, left = [], []
    for item in items:
        (left if warmed_up(item.nodeid, item.get_closest_marker("slow") is not None) else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
