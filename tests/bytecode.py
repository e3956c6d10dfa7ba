"""Compiles the package's modules to bytecode once, before the suite starts its processes.

An editable install leaves no ``__pycache__`` beside the sources, and with ``PYTHONDONTWRITEBYTECODE`` set
(as on CI machines) nothing ever writes one: then every process the suite starts (each CLI command, each
cluster's nanny and worker) compiles every module it imports from source again, about 0.2 s of CPU a
process over the suite's thousands of processes. ``compileall`` writes the files whatever that setting
says, and skips a module whose bytecode is current; a read-only install is left as it is.
"""

from __future__ import annotations

import compileall
import pathlib

import pytest

import dist_respattn


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller compiled before starting it
        return
    compileall.compile_dir(pathlib.Path(dist_respattn.__file__).parent, quiet=2)
