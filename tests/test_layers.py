"""What each layer may import and load: every import follows a table of allowed arrows between the layers, no
module takes another's private name, and only the model layer reaches into a head kind. In fresh interpreters, as
the scheduler's ``--preload`` imports them: the monitor loads no engine, the root package loads no model until
asked, the shared event definitions need only the standard library, ``retrain`` goes through the engine's public
API, and the persistence layer (checkpoints, the registry) loads neither the cluster nor the store format and has
no import cycle."""

from __future__ import annotations

import ast
import dataclasses
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
def test_a_light_module_of_the_model_loads_neither_numba_nor_the_heads():
    """The store package needs the model's row records; importing them does not import every head (and numba)
    through the model package's names, which load on first use."""
    loaded = modules_after("import dist_respattn.model.rows")
    assert not {"numba", "dist_respattn.model.heads", "dist_respattn.model.fitting"} & loaded
    loaded = modules_after("from dist_respattn.model import fit_em, SparseEmission; assert callable(fit_em)")
    assert {"numba", "dist_respattn.model.fitting.em", "dist_respattn.model.emission.layouts"} <= loaded


def test_every_public_name_of_the_model_package_loads_from_where_it_lives():
    """``dist_respattn.model`` lists a lazy name in ``__all__`` and ``_EXPORTS`` alike, and each one loads."""
    import dist_respattn.model as model

    assert sorted(model._EXPORTS) == sorted(model.__all__)
    assert all(getattr(model, name) is not None for name in model.__all__)


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


def _help_loads(*argv: str) -> set[str]:
    """The modules a fresh interpreter holds after ``dist-respattn ARGV --help``."""
    command_line = [*argv, "--help"]
    code = f"from dist_respattn.cli import main\ntry:\n    main({command_line!r})\nexcept SystemExit:\n    pass"
    return modules_after(code)


@pytest.mark.slow  # fresh interpreters
def test_a_command_line_builds_the_options_of_its_own_command_only():
    """``models`` and ``info`` take no head kind's options and no store layout's: their parsers load neither the
    head kinds (and numba) nor zarr, as the parser of every command would (~0.5 s of CPU before anything ran);
    ``fit``'s, which takes every kind's options, loads the kinds."""
    for argv in (("models", "list"), ("info",)):
        loaded = _help_loads(*argv)
        assert not {"numba", "zarr", "dist_respattn.model.heads.base"} & loaded, argv
    assert "dist_respattn.model.heads.base" in _help_loads("fit")


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


# ---------------------------------------------------------------------------------------------------------------
# The import table: every import of every module, at module level or inside a function, against the arrows the
# architecture allows. A layer is a top-level subpackage (``model``, ``store``, ...), a top-level module
# (``events``, ``text_format``, ``numba_cache``) or the root package itself.

ROOT = "dist_respattn"

#: Each layer's allowed arrows: the other layers its modules may import. Imports within a layer are free; a
#: layer missing from every row (``cli``) is imported by no module of the package.
ALLOWED: dict[str, frozenset[str]] = {
    # The root package points numba at its cache before anything loads numba, and re-exports the model's
    # public names lazily (on first use).
    ROOT: frozenset({"numba_cache", "model"}),
    # Shared by the scheduler's monitor, the engine and the command line: the standard library only.
    "events": frozenset(),
    "text_format": frozenset(),
    "numba_cache": frozenset(),
    # The math only: arrays in, arrays out, compiled with numba (whose cache the root package set).
    "model": frozenset({"numba_cache"}),
    # The n-gram baselines the head is measured against, on the model's pair layouts and argument checks.
    "baselines": frozenset({"model"}),
    # Atomic files and locks, used by the store's locks, the predictions and the persistence layer.
    "durable": frozenset({"text_format"}),
    # The store formats hold the model's row batches (and a synthetic store its generating head); no cluster.
    "store": frozenset({"model", "durable", "text_format"}),
    # Checkpoints and the registry rebuild heads from files, on durable's atomic writes. Not the store: the
    # commands, the monitor's pages and a user's script read checkpoints without loading zarr.
    "artifacts": frozenset({"model", "durable", "text_format"}),
    # The only ``distributed.Client`` user: runs the model over the store's blocks, writes checkpoints, scores
    # the baselines, sends the events, installs the monitor on its scheduler and names its page, and stamps the
    # package's ``__version__`` into what it writes.
    "engine": frozenset(
        {ROOT, "model", "baselines", "store", "artifacts", "durable", "events", "text_format", "monitor"}
    ),
    # ``retrain``: fits and scores through the engine's public API (see the test above), publishes through the
    # artifacts; never the other way round.
    "registry": frozenset({"engine", "artifacts", "model", "events", "store", "durable", "text_format"}),
    # Runs inside the scheduler process: it must not load the engine, the model, the store, numba or zarr.
    "monitor": frozenset({"events", "text_format"}),
    # The command line sits on top of everything; nothing but its entry point and the tests imports it.
    "cli": frozenset(
        {ROOT, "model", "baselines", "store", "artifacts", "durable", "engine", "registry", "monitor", "events",
         "text_format", "numba_cache"}
    ),
}  # fmt: skip

#: Single imports (importer, imported) that break the table for now, each with why. Every one must still occur.
#: Imports that break the table, each with why it stays (none today).
KNOWN: set[tuple[str, str]] = set()


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name), with its file."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = module_files()


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported module of ours: ``target`` is the submodule when ``from package import submodule``."""

    importer: str
    target: str
    names: tuple[str, ...]  # the names taken from ``target`` (empty for ``import target`` or a submodule)
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.target}" + (
            f" ({', '.join(self.names)})" if self.names else ""
        )


def layer(module: str) -> str:
    """``dist_respattn.store.triples.reader`` -> ``store``; the root package is its own layer."""
    return module.split(".")[1] if "." in module else ROOT


def imports(module: str) -> list[Import]:
    """The imports of our modules in ``module``'s source, anywhere in it (module level or inside functions)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, (), node.lineno) for a in node.names if a.name.split(".")[0] == ROOT]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: ``from . import x`` and ``from ..a import b``
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != ROOT:
                continue
            names = [a.name for a in node.names if f"{source}.{a.name}" not in MODULES]
            found += [
                Import(module, f"{source}.{a.name}", (), node.lineno)
                for a in node.names
                if f"{source}.{a.name}" in MODULES
            ]
            if names:
                found.append(Import(module, source, tuple(names), node.lineno))
    return found


ALL_IMPORTS = [found for module in MODULES for found in imports(module)]


def test_the_layer_table_names_every_layer():
    assert set(ALLOWED) == {layer(module) for module in MODULES}
    assert all(arrows <= set(ALLOWED) for arrows in ALLOWED.values())


def test_every_import_follows_the_layer_table():
    """An import across layers must be an allowed arrow: the model stays math, the monitor stays light, the
    persistence layer knows no store, nothing imports the command line."""
    broken = [
        str(found)
        for found in ALL_IMPORTS
        if layer(found.target) != layer(found.importer)
        and layer(found.target) not in ALLOWED[layer(found.importer)]
        and (found.importer, found.target) not in KNOWN
    ]
    assert broken == []
    assert {(f.importer, f.target) for f in ALL_IMPORTS} >= KNOWN, "a known exception is gone: drop it"


def test_the_layer_arrows_have_no_cycle():
    """The table itself is a stack: no two layers may import each other, even through a third."""
    graph = {name: set(arrows) for name, arrows in ALLOWED.items()}
    graph[ROOT] -= {"model"}  # the root's re-exports load lazily, on first use: not an import at load time
    list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle


#: The head kinds: one package each under ``model/heads/``.
KINDS = sorted(f"{ROOT}.model.heads.{path.parent.name}" for path in (PACKAGE / "model" / "heads").glob("*/__init__.py"))


def test_only_the_model_layer_reaches_into_a_head_kind():
    """Outside ``model/``, code reaches a kind only through the model's public names and the head protocol, so a
    new kind needs no change in the engine, the store, the registry, the monitor or the command line."""
    assert f"{ROOT}.model.heads.single_hop" in KINDS
    reaching = [
        str(found)
        for found in ALL_IMPORTS
        if layer(found.importer) != "model"
        and any(found.target == k or found.target.startswith(k + ".") for k in KINDS)
    ]
    assert reaching == []


def is_private(name: str) -> bool:
    """``_name`` is private to its module; ``__name__`` and the like are not; ``_`` is a throwaway."""
    return name.startswith("_") and not name.startswith("__") and name != "_"


def private_definitions(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, methods, assigned names and attributes."""
    defined = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.id if isinstance(node, ast.Name) else node.attr)
    return {name for name in defined if is_private(name)}


def modules_defining() -> dict[str, set[str]]:
    """Every private name some module of ours defines, with the modules defining it (each file parsed once)."""
    defined_by: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for name in private_definitions(ast.parse(path.read_text())):
            defined_by.setdefault(name, set()).add(module)
    return defined_by


#: Every private name some module of ours defines, with the modules defining it.
DEFINED_BY = modules_defining()


def private_uses(path: Path, module: str | None) -> list[str]:
    """Where the file at ``path`` (the module ``module``, or a test or script) takes another module's private
    name: ``from X import _name``; ``X._name`` on a module of ours it imported; or ``thing._name`` where
    ``_name`` is defined only by other modules of ours (a private method or attribute of their classes)."""
    tree = ast.parse(path.read_text())
    own = private_definitions(tree)
    where = path.relative_to(PACKAGE.parent) if path.is_absolute() else path
    found = []
    bound: dict[str, str] = {}  # a local name -> the module of ours it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == ROOT:  # ``import dist_respattn.x`` binds ``dist_respattn`` itself
                    bound[a.asname or ROOT] = a.name if a.asname else ROOT
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == ROOT:
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
                elif is_private(a.name) and node.module != module:
                    found.append(f"{where}:{node.lineno} from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                owner = ".".join([bound[value.id], *chain])
                if owner in MODULES and owner != module:
                    found.append(f"{where}:{node.lineno} {owner}.{node.attr}")
                    continue
            if node.attr not in own and DEFINED_BY.get(node.attr, set()) - {module}:
                found.append(f"{where}:{node.lineno} .{node.attr} of {', '.join(sorted(DEFINED_BY[node.attr]))}")
    return found


def test_no_module_takes_another_modules_private_name():
    """A name another module needs is public, under a name that says what it is."""
    assert [use for module, path in MODULES.items() for use in private_uses(path, module)] == []
