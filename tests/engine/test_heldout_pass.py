"""The held-out grid pass over a training store's hold-out reads only the blocks and rows held out.

Its totals must be those of scoring every block with the training rows weighted 0, to the bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionAccumulator, ResponsibilityAttentionEstimator
from dist_respattn.engine import kept_rows, worker_tasks
from dist_respattn.engine.worker_tasks import RowSelection
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.fitting.selection import DEFAULT_SEARCH, GridTotals, score_grid
from dist_respattn.model.heads.single_hop.kind import SingleHopGrid
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.store.helpers import random_rows, write_small


def _candidates(store):
    s = store.schema
    shape = (s.num_symbols, s.context_length, s.query_dim, s.num_targets)
    data = store.read_rows(0, store.num_rows).encoded
    pairs = PairCounts.from_rows(data[0][:, -1], data[2], None, num_symbols=shape[0], num_targets=shape[3])
    estimator = ResponsibilityAttentionEstimator(*shape, emission_prior=EmissionPrior.from_pairs(pairs, "continuation"))

    def statistics(model):
        accumulator = ResponsibilityAttentionAccumulator(*shape)
        if model is None:
            accumulator.seq_initialize_uniform(data, None)
        else:
            accumulator.seq_update(data, None, model)
        return accumulator.value()

    first = estimator.estimate(None, statistics(None))
    return estimator.candidates(statistics(first), previous=first)


@pytest.mark.parametrize("kind", ["stream", "triples"])
def test_the_holdout_pass_equals_scoring_every_block_to_the_bit(tmp_path, kind):
    if kind == "stream":
        rng = np.random.default_rng(2)
        tokens = rng.integers(0, 30, 6000)
        weights = rng.uniform(0.5, 2.0, tokens.size).astype(np.float32)
        store = write_stream_tokens(
            tmp_path / "s.zarr", tokens, 5, num_symbols=30, documents=np.array([0, 1000, 1003, 4000]),
            weights=weights, options=WriteOptions(chunk_rows=128, partition_rows=1024),
        )  # fmt: skip
    else:
        store = write_small(tmp_path / "t.zarr", random_rows(weighted=True))
    # Stripes of 16 rows, a fifth held out: most blocks hold some, a few none.
    rule = HoldoutRule(0.2, 16)
    rows = RowSelection(rule, "heldout")
    table = _candidates(store).grid_table(DEFAULT_SEARCH)
    skipped = 0
    for part in range(store.num_partitions):
        got = worker_tasks.grid_task(store.location, part, SingleHopGrid(table), store.fingerprint(), rows)
        want = GridTotals.zeros(table.shape)
        for block in store.iter_blocks(part):
            skipped += not rule.held_out(block.start, block.start + block.num_rows).any()
            want = want + score_grid(table, block.encoded, rows.weights(block))
        assert got.weight == want.weight > 0.0
        assert np.array_equal(got.target_log_prob, want.target_log_prob)
        assert np.array_equal(got.log_lik, want.log_lik)
    assert kind == "triples" or skipped > 0  # the stream's small blocks include some with nothing held out


# --------------------------------------------------------------------------------------------- kept held-out rows


def _tables(store, layout):
    """Two M-steps' grid tables over one support (the whole first grid, then the neighbourhood of its choice, as a
    fit's first and later held-out passes score), in ``layout``."""
    s = store.schema
    shape = (s.num_symbols, s.context_length, s.query_dim, s.num_targets)
    data = store.read_rows(0, store.num_rows).encoded
    pairs = PairCounts.from_rows(data[0][:, -1], data[2], None, num_symbols=shape[0], num_targets=shape[3])
    estimator = ResponsibilityAttentionEstimator(
        *shape, emission_prior=EmissionPrior.from_pairs(pairs, "continuation"), search=DEFAULT_SEARCH
    )
    factory = estimator.accumulator_factory(layout=layout)
    accumulator = factory.make()
    accumulator.seq_initialize_uniform(data, None)
    candidates = estimator.candidates(accumulator.value())
    first = candidates.grid_table(DEFAULT_SEARCH)
    model = candidates.model(candidates.defaults)
    accumulator = factory.make_for(model)
    accumulator.seq_update(data, None, model)
    later = estimator.candidates(accumulator.value(), previous=model)
    return first, later.grid_table(DEFAULT_SEARCH.around(candidates.defaults, later.query_scale))


@pytest.fixture
def stream_store(tmp_path):
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 40, 8000)
    # Repeated runs, so rows repeat and the plan reads some back from their slots.
    tokens[4000:6000] = np.tile(tokens[:200], 10)
    return write_stream_tokens(
        tmp_path / "s.zarr", tokens, 4, num_symbols=40, documents=np.array([0, 3000]),
        options=WriteOptions(chunk_rows=256, partition_rows=2048),
    )  # fmt: skip


def _same(a, b) -> bool:
    return (
        a.weight == b.weight
        and np.array_equal(a.target_log_prob, b.target_log_prob)
        and np.array_equal(a.log_lik, b.log_lik)
    )


@pytest.fixture(autouse=True)
def _nothing_kept():
    kept_rows.forget()
    yield
    kept_rows.forget()


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_kept_rows_score_the_next_grid_to_the_bit_without_reading_the_store(stream_store, layout, monkeypatch):
    store = stream_store
    rows = RowSelection(HoldoutRule(0.25, 16), "heldout")
    first, later = _tables(store, layout)
    assert first.shape != later.shape and later.shape[0] > 1
    if layout == "sparse":
        assert later.counts.support is first.counts.support
    args = (store.fingerprint(), rows)
    cold = [worker_tasks.grid_task(store.location, p, SingleHopGrid(later), *args) for p in range(store.num_partitions)]
    for part in range(store.num_partitions):
        got = worker_tasks.grid_task(store.location, part, SingleHopGrid(first), *args, run="r1")
        assert _same(got, worker_tasks.grid_task(store.location, part, SingleHopGrid(first), *args))
    assert kept_rows.held_parts("r1", store.fingerprint()) == list(range(store.num_partitions))
    kept = [kept_rows.find("r1", worker_tasks._rows_key(store.location, p, *args, None)) for p in range(4)]
    assert sum(block.hits for k in kept for block in k.blocks) > 0  # rows read back from their slots too

    def unread(*_args, **_kwargs):
        raise AssertionError("the kept rows were read again")

    monkeypatch.setattr(worker_tasks, "partition_blocks", unread)
    for part in range(store.num_partitions):
        assert _same(worker_tasks.grid_task(store.location, part, SingleHopGrid(later), *args, run="r1"), cold[part])
    # Another fit's tasks are not served what this one kept.
    with pytest.raises(AssertionError, match="read again"):
        worker_tasks.grid_task(store.location, 0, SingleHopGrid(later), *args, run="r2")
    assert kept_rows.release_run("r1") == store.num_partitions
    assert kept_rows.kept_bytes() == 0


def test_kept_rows_do_not_serve_another_support(stream_store):
    """A grid over another support (another fit, or a support made again) plans the rows anew: its pairs' indices
    are not those kept."""
    store = stream_store
    rows = RowSelection(HoldoutRule(0.25, 16), "heldout")
    first, _ = _tables(store, "sparse")
    other, _ = _tables(write_stream_tokens(
        store.location.url + "-other", np.random.default_rng(9).integers(0, 40, 3000), 4, num_symbols=40,
        options=WriteOptions(chunk_rows=256, partition_rows=2048),
    ), "sparse")  # fmt: skip
    assert not other.counts.support.same_as(first.counts.support)
    args = (store.fingerprint(), rows)
    worker_tasks.grid_task(store.location, 0, SingleHopGrid(first), *args, run="r1")
    kept = kept_rows.find("r1", worker_tasks._rows_key(store.location, 0, store.fingerprint(), rows, None))
    assert kept.serves(first) and not kept.serves(other) and SingleHopGrid(other).score_kept(kept) is None
    got = worker_tasks.grid_task(store.location, 0, SingleHopGrid(other), *args, run="r1")
    assert _same(got, worker_tasks.grid_task(store.location, 0, SingleHopGrid(other), *args))
    # The rows kept now are those planned for the other support.
    kept = kept_rows.find("r1", worker_tasks._rows_key(store.location, 0, store.fingerprint(), rows, None))
    assert kept.serves(other) and not kept.serves(first)


def test_kept_rows_hold_no_support_alive(stream_store):
    """The plan holds its support weakly: once the fit's support is gone, it serves no table, even one whose
    support has the same pairs (it could not tell it from a support made at the same address)."""
    import gc

    store = stream_store
    rows = RowSelection(HoldoutRule(0.25, 16), "heldout")
    first, _ = _tables(store, "sparse")
    worker_tasks.grid_task(store.location, 0, SingleHopGrid(first), store.fingerprint(), rows, run="r1")
    kept = kept_rows.find("r1", worker_tasks._rows_key(store.location, 0, store.fingerprint(), rows, None))
    again, _ = _tables(store, "sparse")
    assert again.counts.support is not first.counts.support and kept.serves(again)  # the same pairs
    del first
    gc.collect()
    assert not kept.serves(again)


def test_kept_rows_stay_within_their_bytes(stream_store, monkeypatch):
    store = stream_store
    rows = RowSelection(HoldoutRule(0.25, 16), "heldout")
    first, later = _tables(store, "sparse")
    args = (store.fingerprint(), rows)
    worker_tasks.grid_task(store.location, 0, SingleHopGrid(first), *args, run="r1")
    one = kept_rows.kept_bytes()
    assert one > 0
    # Room for one partition: the least recently used goes first.
    monkeypatch.setattr(kept_rows, "KEPT_BYTES", int(one * 1.5))
    for part in range(store.num_partitions):
        worker_tasks.grid_task(store.location, part, SingleHopGrid(first), *args, run="r1")
        assert kept_rows.held_parts("r1", store.fingerprint()) == [part]
    # A partition larger than the room is scored, the same bits, and not kept.
    monkeypatch.setattr(kept_rows, "KEPT_BYTES", 16)
    kept_rows.forget()
    got = worker_tasks.grid_task(store.location, 0, SingleHopGrid(later), *args, run="r1")
    assert _same(got, worker_tasks.grid_task(store.location, 0, SingleHopGrid(later), *args))
    assert kept_rows.kept_bytes() == 0


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_a_grid_makes_the_chosen_head_where_it_is_scored_to_the_bit(stream_store, layout):
    """A single-hop grid carries its candidates for a few bytes (they hold the table's own arrays): sent apart from
    the fit's tables and opened on a worker, it makes the head under any of its points with the driver's function,
    the same bits; a worker makes it once per key, and the fit's next held-out pass drops it."""
    from dist_respattn.engine.payload import split_payload
    from dist_respattn.model.heads.single_hop.kind import SingleHopCandidates

    store = stream_store
    s = store.schema
    shape = (s.num_symbols, s.context_length, s.query_dim, s.num_targets)
    data = store.read_rows(0, store.num_rows).encoded
    pairs = PairCounts.from_rows(data[0][:, -1], data[2], None, num_symbols=shape[0], num_targets=shape[3])
    estimator = ResponsibilityAttentionEstimator(
        *shape, emission_prior=EmissionPrior.from_pairs(pairs, "continuation"), search=DEFAULT_SEARCH
    )
    accumulator = estimator.accumulator_factory(layout=layout).make()
    accumulator.seq_initialize_uniform(data, None)
    candidates = SingleHopCandidates(estimator.candidates(accumulator.value()), DEFAULT_SEARCH)
    grid = candidates.grid(None)
    assert grid.makes_heads and not SingleHopGrid(grid.table).makes_heads
    keys: dict[int, str] = {}
    shared, tables = split_payload(grid, lambda table: keys.setdefault(id(table), f"t{len(keys)}"))
    bare, _ = split_payload(SingleHopGrid(grid.table), lambda table: keys.setdefault(id(table), f"t{len(keys)}"))
    size = len(shared.data) + sum(memoryview(b).nbytes for b in shared.buffers)
    bare_size = len(bare.data) + sum(memoryview(b).nbytes for b in bare.buffers)
    assert size - bare_size < 2048 + 8 * s.context_length, (size, bare_size)  # the arrays go once
    table = grid.table
    points = [table.hyperparameters((g, h, b)) for g in (0, table.sigma2.size - 1) for h in (0, 1) for b in (0, 1)]
    for n, choice in enumerate(points):
        argument = worker_tasks.chosen_argument("r1", str(n), (shared, tables), choice)
        made = worker_tasks.built(argument)
        assert worker_tasks.built(argument) is made
        driver = candidates.model(choice)
        assert made.sigma2 == driver.sigma2
        assert np.array_equal(made.key_means, driver.key_means)
        assert np.array_equal(made.position_prior, driver.position_prior)
        assert np.array_equal(made.emission, driver.emission)
    held = worker_tasks.chosen_argument("r1", "held", (shared, tables), points[0])
    worker_tasks.built(held)
    assert worker_tasks.release_chosen("r2") == 0
    worker_tasks.grid_task(store.location, 0, grid, store.fingerprint(), RowSelection(HoldoutRule(0.25, 16), "heldout"),
                           run="r1")  # fmt: skip
    assert worker_tasks.release_chosen("r1") == 0
