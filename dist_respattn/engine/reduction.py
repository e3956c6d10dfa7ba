"""One pass over a store's partitions as a fresh graph: a task per partition and a fixed tree of combines.

The tree's shape depends only on the number of partitions and the fan-in, and every combine adds
its children in partition order, so the reduced value is bit-identical whatever the number of
workers or the order tasks finish in. Tasks are submitted depth-first (each combine right after its
last child), and Dask runs earlier submissions first, so partial sums are folded as soon as they
exist instead of piling up on the workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import distributed

from dist_respattn.engine.worker_tasks import combine_values

__all__ = ["DEFAULT_FAN_IN", "reduce_partitions", "tree_shape"]

#: Values a combine task adds. Each E-step value holds the dense (S, T) emission counts, so a combine
#: holds fan-in + 1 of them; 4 keeps that at 5 × 32 MB at S = T = 2000 and the tree shallow.
DEFAULT_FAN_IN = 4


def tree_shape(n_leaves: int, fan_in: int) -> list[list[list[int]]]:
    """The combine tree as levels of nodes, each node the indices of its children in the level below.

    Level 0 is the leaves (not listed); a leftover single node is carried up without a task.
    Returns ``levels[l - 1][i]`` = the children of combine ``(l, i)``.
    """
    if fan_in < 2:
        raise ValueError(f"fan_in = {fan_in}: expected at least 2")
    levels: list[list[list[int]]] = []
    width = n_leaves
    while width > 1:
        nodes = [list(range(i, min(i + fan_in, width))) for i in range(0, width, fan_in)]
        levels.append(nodes)
        width = len(nodes)
    return levels


def reduce_partitions(
    client: distributed.Client,
    n_partitions: int,
    submit_leaf: Callable[[int, str], distributed.Future],
    *,
    key_prefix: str,
    combine_prefix: str,
    tag: str,
    fan_in: int = DEFAULT_FAN_IN,
    on_leaf: Callable[[distributed.Future], Any] | None = None,
) -> distributed.Future:
    """Submit ``submit_leaf(part, key)`` for every partition and the combine tree over them; return the root.

    Keys are ``f"{key_prefix}-{part}-{tag}"`` for leaves and ``f"{combine_prefix}-{level}-{i}-{tag}"``
    for combines (``tag`` keeps concurrent fits on one cluster apart). ``on_leaf`` sees each leaf
    future (for progress). Only the root is kept: the scheduler frees each value as soon as its
    parent has consumed it, so a worker holds O(fan-in × depth) values, not one per partition.
    A single partition is its own root.
    """
    if n_partitions < 1:
        raise ValueError("there are no partitions to reduce")
    levels = tree_shape(n_partitions, fan_in)
    # nodes[l][i]: the future of node i at level l (level 0: leaves), filled as submitted.
    nodes: list[dict[int, distributed.Future]] = [{} for _ in range(len(levels) + 1)]

    def submit_ready(level: int, index: int) -> None:
        """After node (level, index) exists, submit its parent if this was the parent's last child."""
        while level < len(levels):
            parent = index // fan_in
            children = levels[level][parent]
            if index != children[-1]:
                return
            # Pop the children: once their parent is submitted nothing here needs them, and a future
            # kept would keep its tens-of-MB value on a worker until the whole pass ends.
            inputs = [nodes[level].pop(c) for c in children]
            if len(inputs) == 1:  # carried up unchanged
                nodes[level + 1][parent] = inputs[0]
            else:
                nodes[level + 1][parent] = client.submit(
                    combine_values, *inputs, key=f"{combine_prefix}-{level + 1}-{parent}-{tag}", pure=False
                )
            del inputs
            level, index = level + 1, parent

    for part in range(n_partitions):
        future = submit_leaf(part, f"{key_prefix}-{part}-{tag}")
        if on_leaf is not None:
            on_leaf(future)
        nodes[0][part] = future
        del future
        submit_ready(0, part)
    return nodes[-1].pop(0)
