"""What each layer may load and reach: the scheduler's monitor loads no engine, the root package loads no model
until asked, the shared event definitions need only the standard library, and ``retrain`` goes through the
engine's public API. Imports are checked in fresh interpreters, as the scheduler's ``--preload`` does them."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dist_respattn.engine
from dist_respattn.engine import ClusterOptions, evaluate, fit, predict
from dist_respattn.registry import retrain

PACKAGE = Path(dist_respattn.engine.__file__).parent.parent

#: What the scheduler process must not load for the monitor: the JIT, the store format, the engine's layers.
HEAVY = ("numba", "zarr", "dist_respattn.engine", "dist_respattn.model", "dist_respattn.store")


def modules_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.slow  # fresh interpreters
def test_importing_the_monitor_plugin_loads_neither_numba_nor_zarr_nor_the_engine():
    loaded = modules_after("import dist_respattn.monitor.plugin, dist_respattn.monitor")
    assert "dist_respattn.monitor.plugin" in loaded
    assert sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)) == []


@pytest.mark.slow  # fresh interpreters
def test_the_root_package_loads_the_model_only_when_a_name_is_asked_for():
    assert not {"numpy", "numba", "zarr", "distributed", "dist_respattn.model"} & modules_after("import dist_respattn")
    loaded = modules_after("from dist_respattn import random_distribution; assert callable(random_distribution)")
    assert "dist_respattn.model" in loaded


@pytest.mark.slow  # fresh interpreters
def test_the_event_definitions_need_only_the_standard_library():
    before = modules_after("")
    added = modules_after("import dist_respattn.events") - before
    # The root package's numba_cache (where numba will cache, set before anything imports numba) is standard
    # library only too.
    assert {m for m in added if m.split(".")[0] not in sys.stdlib_module_names} == {
        "dist_respattn",
        "dist_respattn.numba_cache",
        "dist_respattn.events",
    }


@pytest.mark.slow  # fresh interpreters
def test_the_count_wording_needs_only_the_standard_library():
    """Engine, store and command line all word their counts with it: it must load nothing of theirs."""
    before = modules_after("")
    added = modules_after("import dist_respattn.text_format") - before
    assert {m for m in added if m.split(".")[0] not in sys.stdlib_module_names} == {
        "dist_respattn",
        "dist_respattn.numba_cache",
        "dist_respattn.text_format",
    }


def test_retrain_uses_only_the_engines_public_names():
    """``registry/retrain.py`` imports from ``dist_respattn.engine`` itself (its ``__all__``), no engine module."""
    tree = ast.parse((PACKAGE / "registry" / "retrain.py").read_text())
    imported = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dist_respattn.engine")
        for alias in node.names
    ]
    assert imported, "retrain imports nothing from the engine?"
    assert {module for module, _ in imported} == {"dist_respattn.engine"}
    assert {name for _, name in imported} <= set(dist_respattn.engine.__all__)


def test_fit_evaluate_predict_and_retrain_take_the_cluster_as_one_options_object():
    for function in (fit, evaluate, predict, retrain):
        parameters = inspect.signature(function).parameters
        assert parameters["cluster"].annotation == "ClusterOptions | None", function.__name__
        assert not {"scheduler", "n_workers", "memory_limit", "security"} & set(parameters), function.__name__
    assert ClusterOptions() == ClusterOptions(scheduler=None, n_workers=None, memory_limit="auto", security=None)
