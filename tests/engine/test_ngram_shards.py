"""The Kneser-Ney baselines counted, fitted and scored in shards on real workers (``engine.ngram_shards``): the
counts each owner holds are the shards of the counts one process makes, the figures are ``fit_kneser_ney``'s in one
process to the bit, on 1 and 2 workers, and the driver is sent scalars only, never a count table."""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dist_respattn.baselines.kneser_ney import (
    SHARDS,
    NGramCounts,
    PartScore,
    fit_kneser_ney,
    ngrams_of_blocks,
    split_counts,
)
from dist_respattn.engine.fit import open_fit_store
from dist_respattn.engine.ngram_shards import ShardedNGrams
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.worker_tasks import ALL_ROWS, RowSelection, partition_blocks
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import Columns
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.engine.clusters import local_cluster

pytestmark = pytest.mark.slow  # clusters of their own

#: Symbols: enough that every shard holds n-grams (and the ids mod SHARDS are uneven).
V, N = 29, 6


def stream(path: Path, length: int, seed: int) -> str:
    """A token stream with documents (rows near a start have short histories, the first one none) and weights in
    {0, 0.5, 1, 1.5} (fractional counts; weight-0 rows count nothing), from a sparse Markov chain."""
    rng = np.random.default_rng(seed)
    transition = np.random.default_rng(7).dirichlet(np.full(V, 0.1), size=V)
    tokens = np.empty(length, dtype=np.int64)
    tokens[0] = 0
    for i in range(1, length):
        tokens[i] = rng.choice(V, p=transition[tokens[i - 1]])
    documents = np.r_[0, np.sort(rng.choice(np.arange(1, length), size=length // 300, replace=False))]
    weights = rng.choice([0.0, 0.5, 1.0, 1.5], size=length)
    options = WriteOptions(chunk_rows=1024, partition_rows=2048)
    store = write_stream_tokens(path, tokens, N, num_symbols=V, dim=3, seed=0, documents=documents, weights=weights,
                                options=options)  # fmt: skip
    return str(store.location)


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ngram-shards")
    return {name: stream(root / f"{name}.zarr", length, seed)
            for name, length, seed in (("train", 12_000, 1), ("test", 4_000, 3))}  # fmt: skip


def in_process(path: str, order: int, rows: RowSelection = ALL_ROWS) -> NGramCounts:
    """The store's top n-grams counted here, partition by partition."""
    store = open_fit_store(path, None, N, 1)
    columns = Columns(windows=bool(getattr(store, "short_histories", False)))
    total = NGramCounts.empty(order, store.schema.num_symbols, store.schema.num_targets)
    for part in range(store.num_partitions):
        blocks = partition_blocks(store, part, rows, columns, None)
        total = total + ngrams_of_blocks(order, store.schema.num_symbols, store.schema.num_targets, blocks)
    return total


def assert_same_counts(got: NGramCounts, want: NGramCounts) -> None:
    assert (got.order, got.num_symbols, got.num_targets) == (want.order, want.num_symbols, want.num_targets)
    for g, w, cg, cw in zip(got.grams, want.grams, got.counts, want.counts, strict=True):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(cg, cw)


def random_counts(seed: int, m: int = 6000) -> NGramCounts:
    """Rows of histories of 0 to 4 tokens over V symbols, dyadic weights (0 among them)."""
    rng = np.random.default_rng(seed)
    history = (np.arange(4)[None, :] + rng.integers(0, 3, size=(m, 1)) * 5 + rng.integers(0, 2, (m, 4))) % V
    targets = (history[:, -1] * 3 + rng.integers(0, 3, m)) % V
    weights = rng.choice([0.0, 0.5, 1.0, 1.5], size=m)
    return NGramCounts.from_rows(
        history, rng.integers(0, 5, m), targets, weights, order=5, num_symbols=V, num_targets=V
    )


def scatter_parts(client: Any, owners: list[str], counts: NGramCounts) -> list[Any]:
    """The parts of ``counts`` (:func:`split_counts`), each sent to its owner."""
    common, shards = split_counts(counts)
    return [client.scatter(part, workers=[owner]) for part, owner in zip((common, *shards), owners, strict=True)]


def only_scalars(value: Any) -> bool:
    """Whether ``value`` is made of numbers and strings only (no array, no table of counts)."""
    if isinstance(value, PartScore):
        return all(isinstance(getattr(value, f.name), float) for f in dataclasses.fields(value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and only_scalars(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(only_scalars(v) for v in value)
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_shards_are_the_in_process_counts_and_the_figures_fit_kneser_ney_s(stores, workers, request):
    rule = HoldoutRule(0.2, 512)
    train_rows, held_rows = RowSelection(rule, "train"), RowSelection(rule, "heldout")
    expected = {
        "train": in_process(stores["train"], 5, train_rows),
        "held": in_process(stores["train"], 5, held_rows),
        "test": in_process(stores["test"], 5),
    }
    assert all(all(g.shape[0] for g in c.grams[1:]) for c in expected.values())
    # Counts with rows without a history too (a store's rows have at least one token): sent to the owners as parts.
    rows = random_counts(1), random_counts(2), random_counts(3)
    assert all(c.grams[0].shape[0] for c in rows)
    train_store, test_store = (open_fit_store(stores[name], None, N, 1) for name in ("train", "test"))
    # Two workers: the engine tests' shared cluster (the counts' futures are released with the test); one: a cluster
    # of its own.
    shared = contextlib.nullcontext((None, request.getfixturevalue("client"))) if workers == 2 else None
    with shared or local_cluster(workers) as (_, client):
        assert len(client.scheduler_info()["workers"]) == workers
        sharded = ShardedNGrams(PassRunner(client, "5eed1234"))
        parts = {
            "train": sharded.count(5, train_store, train_rows, "1", "train"),
            "held": sharded.count(5, train_store, held_rows, "2", "held"),
            "test": sharded.count(5, test_store, ALL_ROWS, "0", "test"),
        }
        owners = sharded.owners()
        assert len(owners) == SHARDS + 1 and len(set(owners)) == workers
        for name, futures in parts.items():
            # Each part is where its owner is, and is that part of the counts made in one process.
            located = client.who_has(futures)
            assert [located[f.key] for f in futures] == [(owner,) for owner in owners], name
            common, shards = split_counts(expected[name])
            gathered = client.gather(futures)
            assert_same_counts(gathered[0], common)
            for got, want in zip(gathered[1:], shards, strict=True):
                assert_same_counts(got, want)
            assert sum(1 for s in shards if s.num_grams) == SHARDS, "a shard with no n-gram tests less"
            del gathered
        sharded.received.clear()
        tuned = sharded.figures(5, parts["test"], parts["train"], parts["held"])
        stated = sharded.figures(4, parts["test"], parts["train"], None)
        scattered = [scatter_parts(client, owners, counts) for counts in rows]
        short = sharded.figures(5, scattered[2], scattered[0], scattered[1])
    # The figures, the tuned scale and the discounts are those of one process, to the bit.
    for k in (3, 4, 5):
        model = fit_kneser_ney(expected["train"].truncated(k), validation=expected["held"].truncated(k))
        assert tuned[k] == model.score(expected["test"].truncated(k)).to_json(), k
        assert tuned[k]["parameters"]["tuned_on"] == "validation"
        model = fit_kneser_ney(rows[0].truncated(k), validation=rows[1].truncated(k))
        assert short[k] == model.score(rows[2].truncated(k)).to_json(), k
    for k in (3, 4):
        model = fit_kneser_ney(expected["train"].truncated(k))
        assert stated[k] == model.score(expected["test"].truncated(k)).to_json(), k
    assert len(stated) == 2 and stated[3]["parameters"]["tuned_on"] != "validation"
    # What the driver was sent: scalars, a few kilobytes, against counts of many more.
    assert sharded.received and all(only_scalars(value) for value in sharded.received)
    sent = len(pickle.dumps(sharded.received))
    assert sent < 20_000 < expected["train"].nbytes


def test_the_sums_in_parts_are_the_whole_s_sums():
    """The parts of :func:`split_counts` cover the counts once, each sorted, and their sums are the whole's."""
    rng = np.random.default_rng(4)
    history = rng.integers(0, 40, size=(5000, 4))
    counts = NGramCounts.from_rows(history, rng.integers(0, 5, 5000), rng.integers(0, 40, 5000), rng.random(5000),
                                   order=5, num_symbols=40, num_targets=40)  # fmt: skip
    common, shards = split_counts(counts)
    total = common
    for shard in shards:
        assert shard.grams[0].shape[0] == 0
        total = total + shard
    assert_same_counts(total, counts)
    for k in range(2, 6):
        for j, shard in enumerate(shards):
            assert np.all(shard.grams[k - 1][:, -2] % SHARDS == j)
    # Truncating a part is the part of the truncated counts.
    for k in (3, 4):
        for got, want in zip(split_counts(counts.truncated(k))[1], shards, strict=True):
            assert_same_counts(got, want.truncated(k))
