"""How a pass is cut into tasks and how many workers it uses: no more than shorten it by more than they cost.

A worker taking part in a pass costs a fixed amount whatever rows it reads: its copy of the pass's payload
(the parameters, a grid table) and its partial sum's transfer into the combine tree. On a small store that
cost exceeds the rows it takes off the others (a store of 300,000 rows has partitions of 262,144 and 37,856
rows: a second worker saves the smaller one and pays for 64 MB of tables, and its first task for loading the
kernels), so such a pass runs as fewer, larger tasks: one task computes a whole subtree of the combine tree,
its partitions one after another and their combines in the tree's own order, on fewer workers. The value is
the same to the bit: the tree and the order of every addition are fixed by the partitions and the fan-in alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dist_respattn.engine.reduction import tree_shape

__all__ = [
    "BYTES_PER_ROW",
    "EVERY_PARTITION",
    "TASK_ROWS",
    "WORKER_ROWS",
    "PassPlan",
    "chosen_workers",
    "makespan",
    "plan_pass",
    "subtree_sizes",
]

#: Payload bytes that cost a worker as much time as one row of the E-step kernel: a worker receives the payload
#: and sends back a partial sum of about its size. Measured at the reference shape (S = T = 2000, a 32 MB
#: model) on a 2-core host: a second worker added 0.045 s an iteration (0.026 s of sending it the model,
#: 0.019 s of moving its statistics), against the kernel's 1.5M rows/s (0.67 µs a row): about 700 bytes a row.
BYTES_PER_ROW = 700.0

#: A worker's cost apart from its payload, in rows: its share of the scheduling and its partial sum's combine.
WORKER_ROWS = 10_000.0

#: A task's own cost in rows (its submission, scheduling and its store's opening and checks: a few ms).
TASK_ROWS = 2_000.0


@dataclass(frozen=True)
class PassPlan:
    """How one pass runs: ``level``, the level of the combine tree whose nodes are its tasks (0: a task a
    partition; 1: a task a combine of ``fan_in`` partitions...); ``workers``, those its payload goes to
    (``None``: every worker)."""

    level: int = 0
    workers: tuple[str, ...] | None = None


#: Today's shape of every pass: a task a partition, the payload on every worker.
EVERY_PARTITION = PassPlan()


def makespan(sizes: Sequence[float], n_workers: int) -> float:
    """The most rows any of ``n_workers`` reads when tasks of ``sizes`` rows go largest first to the least
    loaded worker (the longest-processing-time rule: within 4/3 of the best split)."""
    loads = [0.0] * max(int(n_workers), 1)
    for size in sorted((float(s) for s in sizes), reverse=True):
        loads[loads.index(min(loads))] += size
    return max(loads)


def subtree_sizes(sizes: Sequence[float], fan_in: int, level: int) -> list[float]:
    """The rows under each node of the combine tree's level ``level`` (level 0: the partitions themselves)."""
    groups = [float(s) for s in sizes]
    for nodes in tree_shape(len(sizes), fan_in)[:level]:
        groups = [sum(groups[c] for c in children) for children in nodes]
    return groups


def plan_pass(
    sizes: Sequence[float], fan_in: int, workers: Sequence[str], *, payload_bytes: int, run_tag: str
) -> PassPlan:
    """The plan of a pass over partitions of ``sizes`` rows whose tasks read a payload of ``payload_bytes``, on a
    cluster of ``workers``: the tree level and the number of workers that minimise the estimated time in rows,
    the rows on the critical path plus ``TASK_ROWS`` a task in sequence plus, for every worker beyond the first,
    its cost (``WORKER_ROWS`` and ``payload_bytes / BYTES_PER_ROW``). Ties go to the lower level (more tasks,
    the work spread further when the estimate errs)."""
    if not sizes or not workers:
        return EVERY_PARTITION
    worker_cost = WORKER_ROWS + max(int(payload_bytes), 0) / BYTES_PER_ROW
    best: tuple[float, int, int] | None = None
    for level in range(len(tree_shape(len(sizes), fan_in)) + 1):
        groups = subtree_sizes(sizes, fan_in, level)
        for used in range(1, min(len(workers), len(groups)) + 1):
            rounds = -(-len(groups) // used)
            estimate = makespan(groups, used) + TASK_ROWS * rounds + (used - 1) * worker_cost
            if best is None or estimate < best[0]:
                best = (estimate, level, used)
    assert best is not None
    _, level, used = best
    if level == 0 and used >= len(workers):
        return EVERY_PARTITION
    # Fewer workers than the cluster's: the payload goes to those alone (a store of one partition on two workers
    # sends its parameters to one), and the tasks run where it is.
    return PassPlan(level, None if used >= len(workers) else tuple(chosen_workers(workers, used, run_tag)))


def chosen_workers(workers: Sequence[str], count: int, run_tag: str) -> list[str]:
    """``count`` of the cluster's ``workers``, the same ones for every pass of a run: taken in address order
    from a place fixed by ``run_tag`` (hex digits), so that small fits sharing a cluster do not all pile on its
    first worker."""
    ordered = sorted(workers)
    if not ordered:
        return []
    try:
        first = int(run_tag.split(".")[0], 16) % len(ordered)
    except ValueError:
        first = 0
    return [ordered[(first + i) % len(ordered)] for i in range(min(count, len(ordered)))]
