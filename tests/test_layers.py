"""What each layer may load and reach: the scheduler's monitor loads no engine, the root package loads no model
until asked, the shared event definitions need only the standard library, and ``retrain`` goes through the
engine's public API, and the persistence layer (checkpoints, the registry) loads neither the cluster nor the store
format and has no import cycle. Imports are checked in fresh interpreters, as the scheduler's ``--preload`` does
them."""

from __future__ import annotations

import ast
import graphlib
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import dist_respattn.artifacts
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


#: Every module of the persistence layer, its package first.
ARTIFACTS = ["dist_respattn.artifacts"] + [
    module.name for module in pkgutil.iter_modules(dist_respattn.artifacts.__path__, "dist_respattn.artifacts.")
]


def imported_modules(module: str) -> set[str]:
    """The ``dist_respattn`` modules ``module``'s source imports anywhere (also inside functions), as named."""
    relative = Path(*module.split(".")[1:])
    path = PACKAGE / relative / "__init__.py" if (PACKAGE / relative).is_dir() else PACKAGE / f"{relative}.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from package import name`` imports the submodule ``name`` when there is one.
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.split(".")[0] == "dist_respattn"}


@pytest.mark.slow  # fresh interpreters
def test_the_persistence_layer_loads_neither_the_cluster_nor_the_store_format_nor_the_engine():
    """Checkpoints and the registry are read by the commands, the monitor's pages and a user's own script: all of
    ``dist_respattn.artifacts`` loads only itself, ``durable``, the model layer and the standard-library helpers.
    numba loads exactly when the model modules the checkpoints rebuild heads with load it on their own."""
    loaded = modules_after("import " + ", ".join(ARTIFACTS))
    assert set(ARTIFACTS) <= loaded
    assert sorted(m for m in loaded if m.split(".")[0] in ("zarr", "dask", "distributed", "tornado")) == []
    layers = {".".join(m.split(".")[:2]) for m in loaded if m.startswith("dist_respattn.")}
    assert layers == {
        "dist_respattn.artifacts",
        "dist_respattn.durable",
        "dist_respattn.model",
        "dist_respattn.numba_cache",
        "dist_respattn.text_format",
    }
    model_modules = sorted(
        m
        for module in ARTIFACTS
        for m in imported_modules(module)
        if m.startswith("dist_respattn.model") and m in loaded
    )
    assert model_modules, "the checkpoints rebuild no head?"
    assert ("numba" in loaded) == ("numba" in modules_after("import " + ", ".join(model_modules)))


def test_the_persistence_layer_has_no_import_cycle_and_checkpoints_know_no_registry():
    """The registry builds on checkpoints, never the other way round; ``references`` resolves a model argument
    (a model directory or ``REGISTRY@N``) above both. Imports inside functions count: a cycle hidden in one is
    still a cycle."""
    graph = {module: imported_modules(module) & set(ARTIFACTS) - {module} for module in ARTIFACTS}
    # Only the package's __init__ may import from the package; a module doing so would close a loop through it.
    assert [
        m for m, deps in graph.items() if m != "dist_respattn.artifacts" and "dist_respattn.artifacts" in deps
    ] == []
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert set(order) == set(ARTIFACTS)
    registry_side = ("dist_respattn.artifacts.registry", "dist_respattn.artifacts.references", "dist_respattn.registry")
    assert {m for m in imported_modules("dist_respattn.artifacts.checkpoints") if m.startswith(registry_side)} == set()
    assert "dist_respattn.artifacts.checkpoints" in graph["dist_respattn.artifacts.registry"]
    forbidden = ("dist_respattn.engine", "dist_respattn.store", "dist_respattn.monitor", "dist_respattn.cli")
    assert {(m, d) for m in ARTIFACTS for d in imported_modules(m) if d.startswith(forbidden)} == set()
