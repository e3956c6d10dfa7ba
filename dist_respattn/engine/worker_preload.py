"""What an embedded cluster's forkserver imports before it forks a worker process (see
:data:`~dist_respattn.engine.cluster.WORKER_MODULES`): the module of a worker's tasks, and every built-in head kind,
each with its kernels' module, and numba's CPU target ready to run them. A kernel's machine code still loads from
numba's on-disk cache at its first call, in each worker."""

from __future__ import annotations

from numba.core.registry import cpu_target

import dist_respattn.engine.worker_tasks  # noqa: F401  (imported for what it loads)
from dist_respattn.model.heads.base import kind_names

__all__ = ["KINDS", "ready_numba_target"]

#: The registered head kinds: asking loads every built-in one.
KINDS = kind_names()


def ready_numba_target() -> None:
    """Make numba's CPU target and load its implementations (its ``refresh``), which numba otherwise does at a
    process's first kernel call, cached kernel or not: ~0.5 s of CPU that each forked worker then starts without.
    Measured on 2 cores, five clusters of 2 workers in one process, each fitting a 20,000-row store for 2
    iterations: 6.0-7.6 CPU s against 7.7-9.7 without it (4.2-5.2 s of wall time against 6.0-7.9; four runs each).
    The server is single-threaded when it forks, so each worker starts with a copy of the ready target."""
    cpu_target.target_context.refresh()


ready_numba_target()
