"""How a pass is cut into tasks (:mod:`dist_respattn.engine.placement`): a small store's pass runs as one task on one
worker, a large one's as a task a partition on every worker; the workers a run uses are the same for all its passes."""

from __future__ import annotations

import pytest

from dist_respattn.engine.placement import (
    EVERY_PARTITION,
    PassPlan,
    chosen_workers,
    makespan,
    plan_pass,
    subtree_sizes,
)
from dist_respattn.engine.reduction import fold_subtree, subtree, subtree_partitions, tree_shape

WORKERS = ["tcp://127.0.0.1:4001", "tcp://127.0.0.1:4002"]
#: The reference shape's model (S = T = 2000, dense): its bytes.
MODEL_BYTES = 32_512_000


def test_a_store_of_300k_rows_runs_as_one_task_on_one_worker():
    """Partitions of 262,144 and 37,856 rows: a second worker would save the smaller one and pay for its copy of
    32 MB of parameters and the transfer of its statistics, so the whole tree is one task on one worker."""
    plan = plan_pass([262_144, 37_856], 4, WORKERS, payload_bytes=MODEL_BYTES, run_tag="0a1b2c3d")
    assert plan.level == 1 and plan.workers is not None and len(plan.workers) == 1
    # Without a payload worth sending, the second worker's share pays for it.
    assert plan_pass([262_144, 262_144], 4, WORKERS, payload_bytes=0, run_tag="0a1b2c3d") == EVERY_PARTITION


@pytest.mark.parametrize("n_partitions", [4, 5, 13])
def test_a_store_of_many_full_partitions_runs_a_task_a_partition_on_every_worker(n_partitions):
    sizes = [262_144] * n_partitions
    assert plan_pass(sizes, 4, WORKERS, payload_bytes=MODEL_BYTES, run_tag="0a1b2c3d") == EVERY_PARTITION


def test_the_workers_of_a_run_are_fixed_by_its_tag_and_spread_over_runs():
    many = [f"tcp://127.0.0.1:{4000 + i}" for i in range(5)]
    assert chosen_workers(many, 2, "00000003") == chosen_workers(list(reversed(many)), 2, "00000003.1")
    assert chosen_workers(many, 2, "00000003") == [many[3], many[4]]
    assert {chosen_workers(many, 1, f"{tag:08x}")[0] for tag in range(5)} == set(many)
    assert PassPlan().workers is None and PassPlan().level == 0


def test_subtrees_and_their_rows_follow_the_combine_tree():
    levels = tree_shape(6, 2)  # 6 leaves -> 3 -> 2 -> 1
    assert subtree(levels, 1, 2) == [4, 5]
    assert subtree(levels, 2, 1) == [[4, 5]]  # carried up: one child
    assert subtree_partitions(subtree(levels, 3, 0)) == list(range(6))
    assert subtree_sizes([1, 2, 3, 4, 5, 6], 2, 2) == [10.0, 11.0]
    assert makespan([5, 4, 3, 3, 3], 2) == 10.0  # largest first: 5+3+... (the best split, 9, is not the rule's)

    # A folded subtree adds as the tree does: (((0+1)+(2+3))+(4+5)), never ((0+1)+2)+...
    class Term:
        def __init__(self, text: str) -> None:
            self.text = text

        def __add__(self, other: Term) -> Term:
            return Term(f"({self.text}+{other.text})")

    assert fold_subtree(subtree(levels, 3, 0), lambda part: Term(str(part))).text == "(((0+1)+(2+3))+(4+5))"
