"""The compiled pair tallies give the bits of the NumPy formulation they replace (np.unique + np.bincount)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.model.emission.pairs import PairCounts, PairTally, block_pairs
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator
from dist_respattn.model.kernels.pair_keys import (
    ExactWindowCounts,
    PairWordCounts,
    _one_exact_mass,
    equal_mass,
    merge_supports,
    merge_tallies,
    tally_equal_keys,
    tally_keys,
    tally_rows,
)


def numpy_tally(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cells, inverse = np.unique(keys, return_inverse=True)
    return cells, np.bincount(inverse.reshape(-1), weights=weights, minlength=cells.size).astype(np.float64)


def assert_same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    assert got[0].dtype == np.int64 and got[1].dtype == np.float64
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@settings(deadline=None, max_examples=60)
@given(
    n=st.integers(0, 3000),
    # Key ranges of one radix digit, of several, and past 32 bits (S x T of large vocabularies).
    top=st.sampled_from([1, 7, 2048, 2049, 5_000_000, 2_500_000_000, 2**40]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_tally_is_unique_and_bincount_to_the_bit(n, top, seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, top, n)
    weights = rng.exponential(size=n) * 10.0 ** rng.integers(-8, 8, n)  # sums whose order shows in the bits
    assert_same(tally_keys(keys, weights), numpy_tally(keys, weights))


@settings(deadline=None, max_examples=40)
@given(na=st.integers(0, 500), nb=st.integers(0, 500), top=st.sampled_from([3, 600, 2**35]), seed=st.integers(0, 99))
def test_a_merge_is_the_tally_of_both_in_order(na, nb, top, seed):
    rng = np.random.default_rng(seed)
    a = numpy_tally(rng.integers(0, top, na), rng.random(na))
    b = numpy_tally(rng.integers(0, top, nb), rng.random(nb))
    want = numpy_tally(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    assert_same(merge_tallies(a, b), want)


def test_a_block_tally_skips_entries_of_no_mass():
    rng = np.random.default_rng(3)
    context = rng.integers(0, 50, (400, 5)).astype(np.uint16)
    target = rng.integers(0, 30, 400).astype(np.int32)
    mass = rng.random((400, 5))
    mass[::3] = 0.0
    live = mass.reshape(-1) > 0
    cells = (target.astype(np.int64)[:, None] * 50 + context).reshape(-1)
    assert_same(tally_rows(context, target, mass, 50), numpy_tally(cells[live], mass.reshape(-1)[live]))


@settings(deadline=None, max_examples=40)
@given(
    n=st.integers(0, 2000),
    # Keys of 32 bits (S x T < 2^32), of 64 (past it), and blocks whose targets share their high digits.
    symbols=st.sampled_from([3, 5001, 50_000, 70_000]),
    targets=st.sampled_from([1, 2, 5001, 70_000]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_block_tally_is_unique_and_bincount_to_the_bit(n, symbols, targets, seed):
    rng = np.random.default_rng(seed)
    context = rng.integers(0, symbols, (n, 8)).astype(np.int32)
    target = (targets - 1 - rng.integers(0, min(targets, 3), n)).astype(np.int32)  # a few targets, the top ones
    mass = rng.exponential(size=(n, 8)) * 10.0 ** rng.integers(-8, 8, (n, 8))
    mass[rng.random((n, 8)) < 0.2] = 0.0
    live = mass.reshape(-1) > 0
    cells = (target.astype(np.int64)[:, None] * symbols + context).reshape(-1)
    assert_same(tally_rows(context, target, mass, symbols), numpy_tally(cells[live], mass.reshape(-1)[live]))


def test_negative_keys_are_refused():
    with pytest.raises(ValueError, match="keys hold -1: expected non-negative cells"):
        tally_keys(np.array([3, -1]), np.ones(2))


def test_a_collecting_accumulator_adds_its_blocks_pairs_in_row_order():
    """Blocks merged as they come give each pair the sum np.unique and np.bincount over the blocks gave."""
    shape = (40, 3, 2, 25)
    rng = np.random.default_rng(4)
    rows = 3 * 1000
    data = (rng.integers(0, 40, (rows, 3)), rng.normal(size=(rows, 2)), rng.integers(0, 25, rows))
    weights = rng.exponential(size=rows)
    weights[::5] = 0.0
    accumulator = ResponsibilityAttentionAccumulator(*shape, layout="sparse")
    parts = []
    for start in range(0, rows, 1000):
        block = tuple(a[start : start + 1000] for a in data)
        accumulator.seq_initialize_uniform(block, weights[start : start + 1000])
        mass = np.full((1000, 3), 1.0 / 3) * weights[start : start + 1000, None]
        cells = (block[2][:, None] * 40 + block[0]).reshape(-1)
        live = mass.reshape(-1) > 0
        parts.append(numpy_tally(cells[live], mass.reshape(-1)[live]))
    want = numpy_tally(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    counts = accumulator.value().emission_count
    assert_same((counts.support.keys(), counts.counts), want)


@settings(deadline=None, max_examples=40)
@given(
    n=st.integers(0, 2000),
    symbols=st.sampled_from([3, 5001, 50_000, 70_000]),
    # Powers of two (uniform responsibilities 1/N, N = 8, and others; a subnormal), and masses that are not.
    mass=st.sampled_from([0.125, 1.0, 0.5, 2.0**-20, 2.0**-1074, 1.0 / 3.0, 0.1, 0.2]),
    odd=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_block_of_one_mass_is_tallied_by_its_keys_to_the_bit(n, symbols, mass, odd, seed):
    """Entries of one mass (a power of two: its keys sorted alone, each run its length times the mass), of one
    mass that is not, or of one mass but an entry (``odd``): the bits of unique and bincount either way."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, symbols, (n, 8)).astype(np.int32)
    target = rng.integers(0, symbols, n).astype(np.int32)
    masses = np.full((n, 8), mass)
    masses[rng.random((n, 8)) < 0.1] = 0.0  # another side of a hold-out: no pair
    if odd and n:
        masses[rng.integers(0, n), rng.integers(0, 8)] = mass * 3.0
    live = masses.reshape(-1) > 0
    cells = (target.astype(np.int64)[:, None] * symbols + context).reshape(-1)
    assert_same(tally_rows(context, target, masses, symbols), numpy_tally(cells[live], masses.reshape(-1)[live]))


def test_a_uniform_start_on_real_rows_tallies_its_keys_to_the_bit(tmp_path):
    """A uniform start's masses on rows of Python source (1/8 each, 0 on a hold-out's rows) by the keys alone."""
    from dist_respattn.store import WriteOptions
    from dist_respattn.store.ingest.text import iter_text_files
    from dist_respattn.store.ingest.to_stream import write_stream_text
    from tests.stdlib_packages import package_corpus

    files = iter_text_files([package_corpus(tmp_path / "corpus", ("json", "tomllib"))])
    store = write_stream_text(tmp_path / "s.zarr", files, 8, vocab_size=500, dim=4, options=WriteOptions())
    context, _, target = store.read_rows(0, store.num_rows).encoded
    symbols = store.schema.num_symbols
    masses = np.full(context.shape, 0.125)
    masses[np.arange(len(target)) % 20 < 1] = 0.0
    live = masses.reshape(-1) > 0
    cells = (target.astype(np.int64)[:, None] * symbols + context).reshape(-1)
    assert _one_exact_mass(masses) == 0.125  # the keys alone are sorted
    got = tally_rows(context, target, masses, symbols)
    assert_same(got, numpy_tally(cells[live], masses.reshape(-1)[live]))
    assert got[1].max() > 1.0  # pairs met many times: sums of many entries


@settings(deadline=None, max_examples=40)
@given(
    k=st.integers(1, 6),
    size=st.integers(0, 400),
    shape=st.sampled_from([(3, 2), (50, 40), (50_000, 50_000)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_k_way_merge_of_supports_is_the_chain_of_merges_to_the_bit(k, size, shape, seed):
    """Counts whose sums show their order in the bits, each part's pairs target-major; the union is the parts'
    tallies merged one after the other, in list order."""
    rng = np.random.default_rng(seed)
    symbols, targets = shape
    top = min(symbols * targets, 3 * size + 1)  # pairs that the parts share, often
    parts, tallies = [], []
    for _ in range(k):
        n = int(rng.integers(0, size + 1))
        keys = np.unique(rng.integers(0, symbols * targets, n) % max(top, 1) * (symbols * targets // max(top, 1)))
        counts = rng.exponential(size=keys.size) * 10.0 ** rng.integers(-8, 8, keys.size)
        t, s = keys // symbols, keys % symbols
        indptr = np.zeros(targets + 1, dtype=np.int64)
        np.cumsum(np.bincount(t, minlength=targets), out=indptr[1:])
        parts.append((indptr, s.astype(np.int32), counts))
        tallies.append((keys, counts))
    want = tallies[0]
    for tally in tallies[1:]:
        want = merge_tallies(want, tally)
    indptr, got_symbols, got_counts = merge_supports(parts)
    got_keys = np.repeat(np.arange(targets, dtype=np.int64), np.diff(indptr)) * symbols + got_symbols
    assert got_symbols.dtype == np.int32 and indptr[-1] == got_symbols.size
    assert np.array_equal(got_keys, want[0]) and np.array_equal(got_counts, want[1])


@settings(deadline=None, max_examples=40)
@given(
    n=st.integers(0, 3000),
    top=st.sampled_from([1, 7, 2048, 2049, 5_000_000, 2_500_000_000, 2**40]),
    mass=st.sampled_from([1.0, 0.125, 2.0**-60, 2.0**40]),
    seed=st.integers(0, 2**32 - 1),
)
def test_keys_of_one_power_of_two_weight_tally_as_their_weighted_tally(n, top, mass, seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, top, n) // rng.integers(1, 3)  # repeats, and sometimes one digit all keys share
    weights = np.full(n, mass)
    assert n == 0 or equal_mass(weights) == mass
    assert_same(tally_equal_keys(keys, mass), tally_keys(keys, weights))


def test_pair_counts_of_unit_weights_are_the_weighted_tally():
    """Rows of weight 1, of weights 0 and 1 (a hold-out's side), and of other weights: the same counts as the tally
    of every row's weight."""
    rng = np.random.default_rng(8)
    symbols, targets = rng.integers(0, 5000, 20_000), rng.integers(0, 5000, 20_000)
    cells = symbols * 5000 + targets
    for weights in (None, (rng.random(20_000) < 0.9) * 1.0, rng.uniform(0.0, 2.0, 20_000)):
        got = PairCounts.from_rows(symbols, targets, weights, num_symbols=5000, num_targets=5000)
        w = np.ones(20_000) if weights is None else weights
        live = w > 0
        want = tally_keys(cells[live], w[live])
        assert np.array_equal(got.keys, want[0]) and np.array_equal(got.counts, want[1])
    assert equal_mass(np.array([0.0, 1.0, 0.5])) == 0.0


@pytest.mark.parametrize("top", [7, 2049, 2_500_000_000, 2**32 - 1, 2**40])
def test_counted_blocks_tally_as_their_counts_tallied(top):
    """The counted blocks' cells with their whole counts, kept as one 64-bit word each (cells below 2^32: past 2^31
    too), as a key and a count (past 2^32), or some each way, sorted once: :func:`tally_keys` of the counts times the
    mass, to the bit."""
    rng = np.random.default_rng(top)
    parts = []
    for size in (5000, 0, 3000):
        keys = rng.integers(0, top, size, endpoint=True) // rng.integers(1, 3, size)
        parts.append((keys, rng.integers(1, 2**32, size) // rng.integers(1, 2**22, size)))
    keys = np.concatenate([p[0] for p in parts])
    want = tally_keys(keys, np.concatenate([p[1] for p in parts]).astype(np.float64))
    words = [(k.astype(np.uint64) << np.uint64(32)) | c.astype(np.uint64) for k, c in parts]
    for split in ([], [0], [0, 1, 2]) if top < 2**32 else ([0, 1, 2],):
        counted = ExactWindowCounts(0.125)
        counted.parts = [parts[i] for i in split]
        counted.words = [words[i] for i in range(3) if i not in split]
        assert_same(counted.tally(), (want[0], want[1] * 0.125))


def test_a_pair_tally_is_its_blocks_pairs_added_in_order():
    """Blocks of weight 1, of 0 and 1, of another power of two, of none, of other weights, on windows and on
    encoded rows, cells below and past 2^32: counted once in runs, the bits of adding each block's pairs in order."""
    rng = np.random.default_rng(11)
    n = 3000

    def block(weights: np.ndarray | None, s: int, t: int, windows: bool) -> SimpleNamespace:
        target = rng.integers(0, t, n) // rng.integers(1, 4, n)  # repeated pairs
        if windows:
            tokens = (rng.integers(0, s, n + 4) // rng.integers(1, 4, n + 4)).astype(np.int32)
            rows = SimpleNamespace(tokens=tokens, begin=np.arange(n), end=np.arange(n) + 4, target=target)
        else:
            rows = SimpleNamespace(context=rng.integers(0, s, (n, 4)).astype(np.int32), target=target.astype(np.int32))
        return SimpleNamespace(rows=rows, weights=weights)

    unit, side = None, (rng.random(n) < 0.8) * 1.0
    for masses in (
        [unit, side, unit, unit],
        [unit, np.full(n, 0.5), unit, rng.uniform(0.0, 2.0, n), side, np.zeros(n), unit, side * 0.25, side * 0.25],
        [rng.uniform(0.0, 2.0, n), unit],
        [],
    ):
        for s, t, windows in ((300, 200, True), (300, 200, False), (100_000, 50_000, True)):
            blocks = [block(w, s, t, windows) for w in masses]
            tally, want = PairTally(s, t), PairCounts.empty(s, t)
            for b in blocks:
                tally.add(b)
                want = want + block_pairs(b, s, t)
            got = tally.value()
            assert np.array_equal(got.keys, want.keys) and np.array_equal(got.counts, want.counts)
            assert got.counts.dtype == np.float64 and got.keys.dtype == np.int64
    table = PairTally(300, 200)
    table.add(block(None, 300, 200, True))
    assert table._counted is not None and table._counted.entries == n  # the counted way was taken


def test_pair_word_counts_empty_a_full_table_and_count_on():
    """A table of 2^6 slots filled past 3/4 many times over: its words emptied and counted on, the counts whole."""
    rng = np.random.default_rng(3)
    symbols, targets = rng.integers(0, 40, 5000), rng.integers(0, 30, 5000)
    live = (rng.random(5000) < 0.7) * 1.0
    counts = PairWordCounts(bits=6)
    counts.add(symbols[:2000], targets[:2000], 30, live[:2000])
    counts.add(symbols[2000:], targets[2000:], 30, live[2000:])
    assert len(counts.words) > 5
    keys = symbols * 30 + targets
    assert_same(counts.tally(), tally_keys(keys[live > 0], np.ones(int((live > 0).sum()))))
