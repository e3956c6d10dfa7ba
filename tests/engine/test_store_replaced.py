"""A store replaced or removed while a worker task reads it is said to be so, whatever the half-read rows give: not
a bad value sending the user to ``validate`` a store that is fine, and never a total summed over two stores.

The tasks run in this process, as a worker runs them; the head replaces the store between its first block and the
rest, as a second writer would."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dist_respattn import random_distribution
from dist_respattn.engine.worker_tasks import score_task
from dist_respattn.model.heads.base import Block
from dist_respattn.store import StoreError, WriteOptions, open_store, write_synthetic

TRUTH = random_distribution(12, 3, 2, 12, seed=0)  # S, N, D, T
LAYOUT = WriteOptions(chunk_rows=256, partition_rows=1024)


class ReplacesTheStore:
    """The head's scores, with ``replace()`` run once the first block has been read (a head as a task sees it)."""

    def __init__(self, head: Any, replace: Callable[[], None]) -> None:
        self.head, self.replace = head, replace

    @property
    def columns(self) -> Any:
        return self.head.columns

    def score(self, blocks: Iterator[Block]) -> Any:
        first = next(blocks)
        self.replace()
        return self.head.score(itertools.chain([first], blocks))


def _store(path: Path, seed: int) -> str:
    write_synthetic(path, 1024, model=TRUTH, seed=seed, options=LAYOUT)
    return str(path)


def test_a_store_left_alone_scores_as_before(tmp_path):
    path = _store(tmp_path / "train.zarr", 1)
    store = open_store(path)
    totals = score_task(store.location, 0, ReplacesTheStore(TRUTH, lambda: None), store.fingerprint())
    assert totals.weight == 1024


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_store_changed_under_a_task_is_said_to_be(tmp_path, how):
    path = _store(tmp_path / "train.zarr", 1)
    store = open_store(path)

    def replace() -> None:
        shutil.rmtree(path)
        if how == "replaced":  # another store of the same shape: its rows read without an error
            _store(Path(path), 2)

    with pytest.raises(StoreError, match="the store changed while a pass read it") as caught:
        score_task(store.location, 0, ReplacesTheStore(TRUTH, replace), store.fingerprint())
    message = str(caught.value)
    assert path in message and "run the command again on the store as it is now" in message
    assert ("no store can be opened there now" in message) == (how == "removed")
