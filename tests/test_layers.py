"""What each layer may load: the scheduler's monitor loads no engine, the root package loads no model until
asked, and the shared event definitions need only the standard library. Imports are checked in fresh
interpreters, as the scheduler's ``--preload`` does them."""

from __future__ import annotations

import json
import subprocess
import sys

#: What the scheduler process must not load for the monitor: the JIT, the store format, the engine's layers.
HEAVY = ("numba", "zarr", "dist_respattn.engine", "dist_respattn.model", "dist_respattn.store")


def modules_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_importing_the_monitor_plugin_loads_neither_numba_nor_zarr_nor_the_engine():
    loaded = modules_after("import dist_respattn.monitor.plugin, dist_respattn.monitor")
    assert "dist_respattn.monitor.plugin" in loaded
    assert sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)) == []


def test_the_root_package_loads_the_model_only_when_a_name_is_asked_for():
    assert not {"numpy", "numba", "zarr", "distributed", "dist_respattn.model"} & modules_after("import dist_respattn")
    loaded = modules_after("from dist_respattn import random_distribution; assert callable(random_distribution)")
    assert "dist_respattn.model" in loaded


def test_the_event_definitions_need_only_the_standard_library():
    before = modules_after("")
    added = modules_after("import dist_respattn.events") - before
    assert {m for m in added if m.split(".")[0] not in sys.stdlib_module_names} == {
        "dist_respattn",
        "dist_respattn.events",
    }
