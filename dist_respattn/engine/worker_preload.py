"""What an embedded cluster's forkserver imports before it forks a worker process (see
:data:`~dist_respattn.engine.cluster.WORKER_MODULES`): the module of a worker's tasks, and every built-in head kind,
each with its kernels' module. A kernel's machine code still loads from numba's on-disk cache at its first call, in
each worker."""

from __future__ import annotations

import dist_respattn.engine.worker_tasks  # noqa: F401  (imported for what it loads)
from dist_respattn.model.heads.base import kind_names

__all__ = ["KINDS"]

#: The registered head kinds: asking loads every built-in one.
KINDS = kind_names()
