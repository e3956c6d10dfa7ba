"""A worker keeps the stores its tasks open while their root metadata is unchanged: a store written again at the
same location is opened anew and refused by fingerprint, and a shard file removed between two tasks is refused by
name, as when every task opened the store itself.

The tasks run in this process, as a worker runs them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.engine import kept_stores
from dist_respattn.engine.worker_tasks import score_task
from dist_respattn.store import StoreCorruptError, StoreError, StoreLocation, WriteOptions, open_store, write_synthetic
from dist_respattn.store.ingest.to_stream import write_stream_tokens

TRUTH = random_distribution(12, 3, 2, 12, seed=0)  # S, N, D, T
LAYOUT = WriteOptions(chunk_rows=256, partition_rows=1024)


@pytest.fixture(autouse=True)
def nothing_kept():
    kept_stores.forget()
    yield
    kept_stores.forget()


def _store(path: Path, seed: int) -> StoreLocation:
    write_synthetic(path, 2048, model=TRUTH, seed=seed, options=LAYOUT)
    return open_store(path).location


def test_the_tasks_of_a_pass_share_one_opened_store(tmp_path):
    location = _store(tmp_path / "train.zarr", 1)
    first = kept_stores.open_kept(location)
    totals = [score_task(location, part, TRUTH, first.fingerprint()) for part in (0, 1, 0)]
    assert kept_stores.open_kept(location) is first
    assert kept_stores.unchanged(first)
    assert [t.weight for t in totals] == [1024, 1024, 1024]
    assert totals[0] == totals[2] != totals[1]


def test_a_store_written_again_is_opened_anew_and_refused_by_fingerprint(tmp_path):
    path = tmp_path / "train.zarr"
    location = _store(path, 1)
    before = kept_stores.open_kept(location)
    score_task(location, 0, TRUTH, before.fingerprint())
    shutil.rmtree(path)
    _store(path, 2)  # the same shape: its rows would read without an error
    assert not kept_stores.unchanged(before)
    after = kept_stores.open_kept(location)
    assert after is not before and after.fingerprint() != before.fingerprint()
    with pytest.raises(StoreError, match="the store changed while the fit ran"):
        score_task(location, 0, TRUTH, before.fingerprint())


def test_a_shard_removed_between_two_tasks_is_refused_by_name(tmp_path):
    path = tmp_path / "train.zarr"
    location = _store(path, 1)
    fingerprint = open_store(path).fingerprint()
    score_task(location, 1, TRUTH, fingerprint)
    (path / "query" / "c" / "1" / "0").unlink()  # zarr would read the missing shard as fill values
    with pytest.raises(StoreCorruptError, match=r"array 'query' partition 1 .*chunk file 'query/c/1/0' is missing"):
        score_task(location, 1, TRUTH, fingerprint)


def test_an_unreadable_root_metadata_keeps_nothing(tmp_path):
    location = StoreLocation.of(tmp_path / "none.zarr")
    assert location.read_key(kept_stores.ROOT_METADATA) is None
    with pytest.raises(StoreError):
        kept_stores.open_kept(location)


def test_stores_are_kept_within_their_count_and_memory(tmp_path, monkeypatch):
    locations = [_store(tmp_path / f"s{i}.zarr", i) for i in range(kept_stores.KEPT + 1)]
    opened = [kept_stores.open_kept(location) for location in locations]
    assert kept_stores.open_kept(locations[0]) is not opened[0]  # the least recently used went first
    assert all(
        kept_stores.open_kept(location) is store for location, store in zip(locations[2:], opened[2:], strict=True)
    )
    stream = tmp_path / "stream.zarr"
    location = write_stream_tokens(stream, np.arange(4096) % 12, 3, num_symbols=12, dim=4, seed=0).location
    held = kept_stores.open_kept(location).resident_nbytes()
    assert held >= 12 * 4 * 4  # its (S, D) embedding table
    monkeypatch.setattr(kept_stores, "KEPT_BYTES", held - 1)
    kept_stores.forget()
    assert kept_stores.open_kept(location) is not kept_stores.open_kept(location)


def test_a_store_written_again_with_the_same_root_metadata_is_opened_anew(tmp_path):
    path = tmp_path / "train.zarr"
    location = _store(path, 1)
    before = kept_stores.open_kept(location)
    metadata = (path / "zarr.json").read_bytes()
    shutil.rmtree(path)
    _store(path, 2)
    (path / "zarr.json").write_bytes(metadata)  # attributes to the byte the same (written within one second)
    assert not kept_stores.unchanged(before)
    assert kept_stores.open_kept(location) is not before
