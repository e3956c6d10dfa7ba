"""How a pass is cut into tasks (:mod:`dist_respattn.engine.placement`): a small store's pass runs as one task on one
worker, a large one's as a task a partition on every worker; the workers a run uses are the same for all its passes."""

from __future__ import annotations

import pytest

from dist_respattn.engine.placement import (
    EVERY_PARTITION,
    PassPlan,
    chosen_workers,
    combine_workers,
    makespan,
    plan_pass,
    subtree_sizes,
)
from dist_respattn.engine.reduction import fold_subtree, subtree, subtree_partitions, tree_shape

WORKERS = ["tcp://127.0.0.1:4001", "tcp://127.0.0.1:4002"]
#: The reference shape's model (S = T = 2000, dense): its bytes.
MODEL_BYTES = 32_512_000


def test_a_store_of_300k_rows_runs_its_smaller_partition_beside_the_larger():
    """Partitions of 262,144 and 37,856 rows on 2 workers: the 32 MB parameters go to one worker, which runs the
    larger partition and the combine; the other fetches them from it, runs the smaller one meanwhile and sends its
    statistics back before the larger is done. On one worker the whole tree is one task."""
    plan = plan_pass([262_144, 37_856], 4, WORKERS, payload_bytes=MODEL_BYTES, run_tag="0a1b2c3d")
    holder = chosen_workers(WORKERS, 1, "0a1b2c3d")[0]
    (other,) = set(WORKERS) - {holder}
    assert plan == PassPlan(0, (holder,), (holder, other), ((holder,),))
    # The larger partition runs where the payload is, whichever partition it is; the tag picks the holder.
    flipped = plan_pass([37_856, 262_144], 4, WORKERS, payload_bytes=MODEL_BYTES, run_tag="0a1b2c3e")
    assert flipped == PassPlan(0, (other,), (holder, other), ((other,),))
    alone = plan_pass([262_144, 37_856], 4, WORKERS[:1], payload_bytes=MODEL_BYTES, run_tag="0a1b2c3d")
    assert alone.level == 1 and alone.placed is None
    # Without a payload worth sending, the second worker's share pays for it the usual way.
    assert plan_pass([262_144, 262_144], 4, WORKERS, payload_bytes=0, run_tag="0a1b2c3d") == EVERY_PARTITION


def test_a_small_partition_beside_one_too_small_to_pay_for_the_transfers_is_folded_into_one_task():
    """Where the second worker would get its parameters and return its statistics after the larger task is done,
    the pass stays one task on one worker (a 20,000-row store of partitions of 5,000 rows: a 32 MB payload costs
    more than any of them)."""
    plan = plan_pass([5_000] * 4, 4, WORKERS, payload_bytes=MODEL_BYTES, run_tag="0a1b2c3d")
    assert plan.level == 1 and plan.placed is None and plan.workers is not None and len(plan.workers) == 1
    # More tasks than workers: the scheduler places them, with the payload on every worker.
    assert plan_pass([262_144] * 3, 4, WORKERS, payload_bytes=MODEL_BYTES, run_tag="0a1b2c3d") == EVERY_PARTITION


def test_each_combine_goes_where_its_largest_child_is():
    """Three tasks placed on three workers under a fan-in of 2: the first combine adds tasks 0 and 1 where the
    larger runs; the root adds it to task 2 where the larger of the two subtrees is."""
    workers = ["w0", "w1", "w2"]
    assert combine_workers([10.0, 30.0, 25.0], 2, 0, [10.0, 30.0, 25.0], workers) == (("w1", "w2"), ("w1",))
    assert combine_workers([10.0, 5.0, 25.0], 2, 0, [10.0, 5.0, 25.0], workers) == (("w0", "w2"), ("w2",))


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
