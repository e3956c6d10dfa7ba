"""The start pass of a uniform start reads token windows where they lie, with the statistics, the support's counts
and the emission prior's pairs of the same rows encoded, to the bit."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionEstimator
from dist_respattn.engine.worker_tasks import RowSelection, pass_task
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import Columns
from dist_respattn.model.heads.single_hop.kind import SingleHopTrainer, StartValue, start_partition
from dist_respattn.model.kernels.pair_keys import (
    ExactWindowCounts,
    merge_tallies,
    tally_rows,
    tally_uniform_windows,
    window_exact_mass,
)
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.text import iter_text_files
from dist_respattn.store.ingest.to_stream import write_stream_text
from tests.stdlib_packages import package_corpus


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    """A token-stream store of Python source (standard-library packages, 400 words, N = 8, D = 16, small chunks:
    several blocks a partition)."""
    base = tmp_path_factory.mktemp("window-start")
    files = iter_text_files([package_corpus(base / "corpus")])
    options = WriteOptions(chunk_rows=4096, partition_rows=16384)
    store = write_stream_text(base / "train.zarr", files, 8, vocab_size=400, dim=16, options=options)
    s = store.schema
    estimator = ResponsibilityAttentionEstimator(s.num_symbols, s.context_length, s.query_dim, s.num_targets)
    return store, estimator


def _same_start(a, b) -> bool:
    x, y = a.stats, b.stats
    counts_x, counts_y = x.emission_count, y.emission_count
    same_counts = (
        counts_x.support.same_as(counts_y.support) and np.array_equal(counts_x.counts, counts_y.counts)
        if hasattr(counts_x, "support")
        else np.array_equal(counts_x.count_ts, counts_y.count_ts)
    )
    same_pairs = (a.pairs is None and b.pairs is None) or (
        np.array_equal(a.pairs.keys, b.pairs.keys) and np.array_equal(a.pairs.counts, b.pairs.counts)
    )
    return (
        same_counts
        and same_pairs
        and np.array_equal(x.key_sum, y.key_sum)
        and np.array_equal(x.key_mass, y.key_mass)
        and np.array_equal(x.position_count, y.position_count)
        and (x.query_sq, x.n_obs, x.log_lik) == (y.query_sq, y.n_obs, y.log_lik)
    )


@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("side", ["train", "all", "weighted"])
def test_the_start_task_on_windows_gives_the_encoded_rows_value_to_the_bit(real_store, layout, side):
    """The fit's start task (called in this process) on every partition: the training side of a hold-out (weights 0
    and 1: the tally's one exact mass), all rows (no weights), and rows of real-valued weights (the tally's masses
    sorted with their keys); the emission prior's pairs counted alongside."""
    store, estimator = real_store
    factory = estimator.accumulator_factory(layout=layout)
    start_map = functools.partial(start_partition, factory, "uniform", 0, True, None)
    rows = RowSelection(HoldoutRule.for_rows(store.num_rows), "train") if side == "train" else RowSelection()
    mapping = None
    if side == "weighted":
        # A selection whose weights are not 0 and 1: the rows' own (a weighted store's) are the same to the kernels.
        class Weighted(RowSelection):
            def weights(self, block, store=None):
                return np.random.default_rng(block.start).uniform(0.0, 3.0, block.num_rows) * (
                    np.arange(block.num_rows) % 5 != 0
                )

        rows = Weighted()
    assert store.num_partitions > 1
    for part in range(store.num_partitions):
        args = (store.location, part, start_map)
        got = pass_task(*args, Columns(windows=True), store.fingerprint(), rows, mapping)
        want = pass_task(*args, Columns(), store.fingerprint(), rows, mapping)
        assert got.stats.n_obs > 0 and _same_start(got, want)


def test_a_uniform_start_reads_windows_and_a_random_one_encoded_rows(real_store):
    _, estimator = real_store
    assert SingleHopTrainer(estimator, "sparse", "uniform", 0).start_columns.windows
    assert not SingleHopTrainer(estimator, "sparse", "random", 0).start_columns.windows


@pytest.mark.parametrize("weighted", [False, True])
def test_a_window_tally_is_the_rows_tally_to_the_bit(weighted):
    """Windows over one token array, overlapping as a stream's do; their masses one exact power of two (uniform,
    weights 0 and 1), or real-valued."""
    rng = np.random.default_rng(5)
    for symbols, targets in ((50, 30), (50_000, 50_000), (70_000, 70_000)):
        tokens = rng.integers(0, symbols, 3000).astype(np.int32)
        end = np.sort(rng.choice(np.arange(8, 3000), 1200, replace=False)).astype(np.int64)
        begin = end - 8
        target = rng.integers(0, targets, end.shape[0]).astype(np.int64)
        weights = rng.uniform(0.0, 2.0, end.shape[0]) if weighted else (rng.random(end.shape[0]) < 0.8) * 1.0
        weights[::9] = 0.0
        context = tokens[begin[:, None] + np.arange(8)]
        mass = np.full((end.shape[0], 8), 1.0 / 8) * weights[:, None]
        got = tally_uniform_windows(tokens, begin, target, weights, 1.0 / 8, 8, symbols)
        want = tally_rows(context, target.astype(np.int32), mass, symbols)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        unweighted = tally_uniform_windows(tokens, begin, target, np.zeros(0), 1.0 / 8, 8, symbols)
        want = tally_rows(context, target.astype(np.int32), np.full((end.shape[0], 8), 1.0 / 8), symbols)
        assert np.array_equal(unweighted[0], want[0]) and np.array_equal(unweighted[1], want[1])


def test_a_start_on_short_windows_is_refused(real_store):
    store, estimator = real_store
    short = store.with_context(8, min_context=2)
    window = short.read_windows(0, 2000)
    assert (window.end - window.begin < 8).any()
    accumulator = estimator.accumulator_factory(layout="sparse").make()
    with pytest.raises(ValueError, match="full windows of N = 8"):
        accumulator.seq_initialize_uniform_windows(window)


def test_counts_on_a_support_read_the_windows_encoded(real_store):
    """An accumulator over a support (not the start pass's) counts the windows as it counts their encoded rows."""
    store, estimator = real_store
    factory = estimator.accumulator_factory(layout="sparse")
    finder = factory.make()
    rows = store.read_rows(0, store.num_rows)
    finder.seq_initialize_uniform(rows.encoded, None)
    support = finder.value().emission_count.support
    window = store.read_windows(0, store.num_rows)
    weights = np.random.default_rng(1).uniform(0.0, 2.0, rows.num_rows)
    encoded, windows = factory.make(support), factory.make(support)
    encoded.seq_initialize_uniform(rows.encoded, weights, checked=True)
    windows.seq_initialize_uniform_windows(window._replace(weight=weights))
    a, b = encoded.value(), windows.value()
    assert np.array_equal(a.emission_count.counts, b.emission_count.counts) and a.emission_count.counts.sum() > 0
    assert np.array_equal(a.key_sum, b.key_sum) and a.n_obs == b.n_obs


def test_start_values_combine_as_their_pairwise_sum(real_store):
    """The combine of start values (the union of their supports, all parts at once) gives what adding them one
    after the other gives, to the bit: real rows' partitions, weighted (sums whose order shows)."""
    store, estimator = real_store
    factory = estimator.accumulator_factory(layout="sparse")
    start_map = functools.partial(start_partition, factory, "uniform", 0, True, None)

    class Weighted(RowSelection):
        def weights(self, block, store=None):
            return np.random.default_rng(block.start).uniform(0.0, 3.0, block.num_rows)

    values = [
        pass_task(store.location, part, start_map, Columns(windows=True), store.fingerprint(), Weighted())
        for part in range(store.num_partitions)
    ]
    assert len(values) > 2
    got = StartValue.sum_of(values)
    stats = values[0].stats.copy()
    for value in values[1:]:
        stats = stats.add(value.stats)  # SparseEmissionCounts.add: the union of two, each in turn
    want = StartValue(stats, functools.reduce(lambda a, b: a + b, [v.pairs for v in values]))
    assert _same_start(got, want)
    assert got.stats.emission_count.counts.size > max(v.stats.emission_count.counts.size for v in values)


def test_blocks_of_one_exact_mass_are_counted_as_their_tallies_merge():
    """Blocks whose cells all hold 1/8 (weights 0 and 1), counted in a hash table that grows (a block of more
    distinct cells than its first slots), then sorted once: the tallies of the blocks merged in turn, to the bit."""
    rng = np.random.default_rng(11)
    counter = ExactWindowCounts(1.0 / 8)
    want = None
    for rows, symbols, num_symbols in ((5000, 50_000, 50_000), (40_000, 50_000, 50_000), (3000, 7, 50_000)):
        tokens = rng.integers(0, symbols, rows + 8).astype(np.int32)
        begin = np.arange(rows, dtype=np.int64)
        target = rng.integers(0, 50_000, rows).astype(np.int64)
        weights = (rng.random(rows) < 0.9) * 1.0
        assert window_exact_mass(weights, 1.0 / 8) == 1.0 / 8
        counter.add(tokens, begin, target, weights, 1.0 / 8, 8, num_symbols)
        tally = tally_uniform_windows(tokens, begin, target, weights, 1.0 / 8, 8, num_symbols)
        want = tally if want is None else merge_tallies(want, tally)
    assert counter.word_bits > 18 and counter.words  # the 40,000 rows' cells filled the first table: emptied, grown
    got = counter.tally()
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    again = counter.tally()  # taking the tally leaves the counts as they were
    assert np.array_equal(again[0], want[0]) and np.array_equal(again[1], want[1])
    # A small table, emptied many times in the middle of blocks (and grown), then more blocks after a tally.
    small = ExactWindowCounts(1.0 / 8)
    small.word_bits, small.word_slots = 6, np.zeros(1 << 6, dtype=np.uint64)
    want = None
    for rows in (700, 2000, 50, 3000):
        tokens = (rng.integers(0, 3000, rows + 8) // rng.integers(1, 30, rows + 8)).astype(np.int32)
        begin = np.arange(rows, dtype=np.int64)
        target = (rng.integers(0, 3000, rows) // rng.integers(1, 30, rows)).astype(np.int64)
        small.add(tokens, begin, target, np.zeros(0), 1.0 / 8, 8, 3000)
        tally = tally_uniform_windows(tokens, begin, target, np.zeros(0), 1.0 / 8, 8, 3000)
        want = tally if want is None else merge_tallies(want, tally)
        got = small.tally()
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert len(small.words) > 5 and small.word_bits > 6
    # Cells past 2^32 (S x T of 100,000 words) are counted as keys and counts, after and among the others.
    wide = ExactWindowCounts(1.0 / 8)
    want = None
    for rows, targets in ((3000, 40_000), (3000, 50_000), (2000, 40_000)):  # (40,000 + 1) x 100,000 < 2^32
        tokens = rng.integers(0, 100_000, rows + 8).astype(np.int32)
        begin = np.arange(rows, dtype=np.int64)
        target = rng.integers(0, targets, rows).astype(np.int64)
        wide.add(tokens, begin, target, np.zeros(0), 1.0 / 8, 8, 100_000)
        tally = tally_uniform_windows(tokens, begin, target, np.zeros(0), 1.0 / 8, 8, 100_000)
        want = tally if want is None else merge_tallies(want, tally)
    assert wide.parts and wide.word_used[0] > 0  # both kinds, the small cells still in the word table
    got = wide.tally()
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert window_exact_mass(np.array([1.0, 0.5]), 1.0 / 8) == 0.0
    assert window_exact_mass(np.array([0.0, 3.0]), 1.0 / 8) == 0.0  # 3/8: not a power of two
    assert window_exact_mass(np.zeros(0), 1.0 / 8) == 1.0 / 8


def test_a_start_over_blocks_of_other_masses_gives_the_encoded_value(real_store):
    """Blocks of one exact mass, then one of real-valued weights, one of another exact mass (weights 2), one with no
    live row, and exact ones again: the counted blocks end where the others begin, with the encoded rows' value."""
    store, estimator = real_store
    factory = estimator.accumulator_factory(layout="sparse")
    start_map = functools.partial(start_partition, factory, "uniform", 0, True, None)
    kinds = {}

    class Mixed(RowSelection):
        def weights(self, block, store=None):
            index = kinds.setdefault(block.start, len(kinds))  # blocks in order of first reading: every kind
            rng = np.random.default_rng(block.start)
            kind = index % 6
            if kind == 2:
                return rng.uniform(0.0, 3.0, block.num_rows)
            if kind == 3:
                return np.full(block.num_rows, 2.0)
            if kind == 4:
                return np.zeros(block.num_rows)
            return (rng.random(block.num_rows) < 0.7) * 1.0

    rows = Mixed()
    for part in range(store.num_partitions):
        args = (store.location, part, start_map)
        got = pass_task(*args, Columns(windows=True), store.fingerprint(), rows)
        want = pass_task(*args, Columns(), store.fingerprint(), rows)  # the same blocks: the same weights
        assert _same_start(got, want)
    assert len(kinds) >= 6 and len(store.block_ranges(0)) >= 4
