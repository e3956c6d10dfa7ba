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

from dist_respattn.engine.held_tables import held
from dist_respattn.engine.worker_tasks import combine_values

__all__ = [
    "DEFAULT_FAN_IN",
    "fold_subtree",
    "fold_task",
    "reduce_partitions",
    "reduce_scatter_partitions",
    "split_fold_task",
    "split_task",
    "subtree",
    "subtree_partitions",
    "tree_shape",
]

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


def subtree(levels: list[list[list[int]]], level: int, index: int) -> int | list[Any]:
    """Node ``(level, index)`` of the tree ``levels`` (:func:`tree_shape`) as nested lists of its children down to
    its partitions' numbers (a node of level 0 is its partition's number)."""
    if level == 0:
        return index
    return [subtree(levels, level - 1, child) for child in levels[level - 1][index]]


def subtree_partitions(node: int | list[Any]) -> list[int]:
    """The partitions under a :func:`subtree` node, in order."""
    if isinstance(node, int):
        return [node]
    return [part for child in node for part in subtree_partitions(child)]


def fold_subtree(node: int | list[Any], leaf: Callable[[int], Any]) -> Any:
    """A :func:`subtree` node's value: ``leaf(part)`` for its partitions in order, each node's children added left
    to right by :func:`combine_values` as the tree's combine tasks add them (a node of one child is that child),
    so the value is the tree's to the bit. Holds at most ``fan_in`` values a level, as the tree does."""
    if isinstance(node, int):
        return leaf(node)
    values = [fold_subtree(child, leaf) for child in node]
    return values[0] if len(values) == 1 else combine_values(*values)


def fold_task(task: Callable[..., Any], node: int | list[Any], args: dict[int, tuple[Any, ...]]) -> Any:
    """One task for a whole subtree of a pass (run on a worker): ``task(*args[part])`` for every partition under
    ``node``, folded by :func:`fold_subtree`."""
    return fold_subtree(node, lambda part: task(*args[part]))


class _CombineTree:
    """The combine tasks above one level of a pass's tree, each submitted as soon as its last child exists.

    Combine ``(level, index)``'s key is ``f"{prefix}-{level}-{index}-{tag}"``; ``root_on`` places the root combine
    (task options, e.g. a worker). Each node's children are popped once their parent is submitted: a future kept
    would keep its tens-of-MB value on a worker until the whole pass ends.
    """

    def __init__(
        self,
        client: distributed.Client,
        levels: list[list[list[int]]],
        fan_in: int,
        prefix: str,
        tag: str,
        root_on: dict[str, Any] | None = None,
    ) -> None:
        self.client, self.levels, self.fan_in, self.prefix, self.tag = client, levels, fan_in, prefix, tag
        self.root_on = root_on or {}
        # nodes[l][i]: the future of node i at level l (level 0: leaves), held until its parent is submitted.
        self.nodes: list[dict[int, distributed.Future]] = [{} for _ in range(len(levels) + 1)]

    def add(self, level: int, index: int, future: distributed.Future) -> None:
        """Node ``(level, index)`` exists: submit its parent if this was the parent's last child (and so on up)."""
        levels = self.levels
        self.nodes[level][index] = future
        del future
        while level < len(levels):
            parent = index // self.fan_in
            children = levels[level][parent]
            if index != children[-1]:
                return
            inputs = [self.nodes[level].pop(c) for c in children]
            if len(inputs) == 1:  # carried up unchanged
                self.nodes[level + 1][parent] = inputs[0]
            else:
                placed = self.root_on if level + 1 == len(levels) else {}
                self.nodes[level + 1][parent] = self.client.submit(
                    combine_values, *inputs, key=f"{self.prefix}-{level + 1}-{parent}-{self.tag}", pure=False, **placed
                )
            del inputs
            level, index = level + 1, parent

    def root(self) -> distributed.Future:
        return self.nodes[-1].pop(0)


def _leaf_nodes(n_partitions: int, fan_in: int, level: int) -> tuple[list[list[list[int]]], list[int]]:
    """The tree over ``n_partitions`` and, for each node of its level ``level`` (the pass's leaves), its first
    partition (which names its task)."""
    if n_partitions < 1:
        raise ValueError("there are no partitions to reduce")
    levels = tree_shape(n_partitions, fan_in)
    if not 0 <= level <= len(levels):
        raise ValueError(f"level = {level}: the tree over {n_partitions} partitions has levels 0 to {len(levels)}")
    width = n_partitions if level == 0 else len(levels[level - 1])
    return levels, [subtree_partitions(subtree(levels, level, node))[0] for node in range(width)]


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
    level: int = 0,
) -> distributed.Future:
    """Submit ``submit_leaf(node, key)`` for every node of the tree's level ``level`` (level 0, the default: every
    partition) and the combine tree above them; return the root.

    A node of a higher level is a whole subtree, whose task folds it itself (:func:`fold_task`, given
    :func:`subtree` of it): fewer, larger tasks, with the same value. Keys are ``f"{key_prefix}-{part}-{tag}"``
    for leaves (``part``: the node's first partition) and ``f"{combine_prefix}-{level}-{i}-{tag}"`` for combines
    (``tag`` keeps concurrent fits on one cluster apart). ``on_leaf`` sees each leaf future (for progress). Only
    the root is kept: the scheduler frees each value as soon as its parent has consumed it, so a worker holds
    O(fan-in × depth) values, not one per partition. A single partition is its own root.
    """
    levels, firsts = _leaf_nodes(n_partitions, fan_in, level)
    tree = _CombineTree(client, levels, fan_in, combine_prefix, tag)
    for node, first in enumerate(firsts):
        future = submit_leaf(node, f"{key_prefix}-{first}-{tag}")
        if on_leaf is not None:
            on_leaf(future)
        tree.add(level, node, future)
        del future
    return tree.root()


def piece(value: tuple[Any, tuple[Any, ...]], index: int) -> Any:
    """Part ``index`` of a split value ``(common, shards)``: 0 the common part, ``k + 1`` shard ``k``."""
    common, shards = value
    return common if index == 0 else shards[index - 1]


def reduce_scatter_partitions(
    client: distributed.Client,
    n_partitions: int,
    submit_leaf: Callable[[int, str], distributed.Future],
    n_shards: int,
    owners: list[str],
    *,
    key_prefix: str,
    combine_prefix: str,
    tag: str,
    fan_in: int = DEFAULT_FAN_IN,
    on_leaf: Callable[[distributed.Future], Any] | None = None,
    level: int = 0,
) -> list[distributed.Future]:
    """:func:`reduce_partitions` of values split into parts (a leaf's value is ``(common, shards)``): each part has a
    tree of its own, of the same shape, its combines adding children in the same order, so each part's root is that
    part of the whole tree's sum, to the bit. Returns the roots: the common part's, then each shard's.

    A leaf's parts are taken out on its worker (``<key_prefix>-part<j>-<part>-<tag>``), so a combine of part ``j``
    moves that part alone; the root combine of part ``j`` runs on ``owners[j]`` (while it is alive: else anywhere),
    where that part's M-step runs. Combine keys are ``<combine_prefix>-p<j>-<level>-<i>-<tag>``.
    """
    levels, firsts = _leaf_nodes(n_partitions, fan_in, level)
    # The root of part j goes to its owner (or anywhere, once that worker is lost).
    on_owner = [{"workers": [owner], "allow_other_workers": True} for owner in owners[: n_shards + 1]]
    trees = [
        _CombineTree(client, levels, fan_in, f"{combine_prefix}-p{j}", tag, on_owner[j]) for j in range(n_shards + 1)
    ]
    for node, first in enumerate(firsts):
        leaf = submit_leaf(node, f"{key_prefix}-{first}-{tag}")
        if on_leaf is not None:
            on_leaf(leaf)
        for part, tree in enumerate(trees):
            tree.add(level, node, client.submit(piece, leaf, part, key=f"{key_prefix}-part{part}-{first}-{tag}",
                                                pure=False))  # fmt: skip
        del leaf
    return [tree.root() for tree in trees]


def split_task(sharding: Any, tables: Any, task: Callable[..., Any], *args: Any) -> Any:
    """A leaf of a reduce-scatter (run on a worker): ``task(*args)`` split into parts by ``sharding`` (``tables``: the
    fit's tables, or a reference to them: :func:`~dist_respattn.engine.held_tables.held`)."""
    return sharding.split(task(*args), held(tables))


def split_fold_task(
    sharding: Any, tables: Any, task: Callable[..., Any], node: int | list[Any], args: dict[int, tuple[Any, ...]]
) -> Any:
    """A leaf of a reduce-scatter that folds a whole subtree (:func:`fold_task`), then splits the sum into parts."""
    return sharding.split(fold_task(task, node, args), held(tables))
