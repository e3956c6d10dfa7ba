"""The compiled passes over a sparse emission's pairs: the M-step's MAP values the same bits as NumPy's whole-array
form, the check's row sums equal to a per-pair reference, and a row off the simplex still refused by number."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn.model.arguments import as_sparse_emission
from dist_respattn.model.emission.layouts import PairSupport, SparseEmission, SparseEmissionCounts, map_values
from dist_respattn.model.kernels.emission_rows import pair_row_sums


def _counts(seed: int, num_symbols: int = 40, num_targets: int = 30) -> SparseEmissionCounts:
    rng = np.random.default_rng(seed)
    cells = num_symbols * num_targets
    keys = np.sort(rng.choice(cells, size=cells // 4, replace=False)).astype(np.int64)
    support = PairSupport.from_keys(keys, num_symbols, num_targets)
    counts = np.floor(rng.random(support.num_pairs) * 4) * rng.random(support.num_pairs)
    counts[support.symbols == 3] = 0.0  # a symbol whose pairs never counted
    return SparseEmissionCounts(counts, support, num_symbols=num_symbols, num_targets=num_targets)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_values_are_numpys_to_the_bit(seed):
    counts = _counts(seed)
    rng = np.random.default_rng(seed + 10)
    strength = rng.random(counts.num_symbols) * 5
    strength[3] = 0.0  # no count and no strength: the row is the base
    base = rng.random(counts.num_targets)
    base /= base.sum()
    made = counts.map_emission(strength, base)
    support = counts.support
    symbols, targets = support.symbols, support.targets
    # NumPy's whole-array form of the MAP rows, as map_values computed them before its compiled pass
    den = counts.row_totals() + strength
    empty = den <= 0.0
    safe = np.where(empty, 1.0, den)
    values = np.where(
        empty[symbols], base[targets], (counts.counts + strength[symbols] * base[targets]) / safe[symbols]
    )
    assert np.array_equal(made.values, values)
    assert np.array_equal(made.backoff, np.where(empty, 1.0, strength / safe))
    assert np.array_equal(map_values(counts.counts, den - strength, strength, base, symbols, targets)[0], values)
    assert np.array_equal(made.values[support.symbols == 3], base[support.targets[support.symbols == 3]])
    as_sparse_emission(made, "emission")  # rows sum to 1


def test_row_sums_equal_a_per_pair_reference():
    counts = _counts(5)
    support = counts.support
    rng = np.random.default_rng(6)
    values, base = rng.random(support.num_pairs), rng.random(support.num_targets)
    sums, stored = pair_row_sums(values, base, support.indptr, support.symbols, support.num_symbols)
    expected_sums, expected_stored = np.zeros(support.num_symbols), np.zeros(support.num_symbols)
    for p, (s, t) in enumerate(zip(support.symbols, support.targets, strict=True)):
        expected_sums[s] += values[p]
        expected_stored[s] += base[t]
    np.testing.assert_allclose(sums, expected_sums, rtol=1e-12)
    np.testing.assert_allclose(stored, expected_stored, rtol=1e-12)


def test_a_row_off_the_simplex_is_refused_by_number():
    counts = _counts(7)
    base = np.full(counts.num_targets, 1.0 / counts.num_targets)
    good = counts.map_emission(np.ones(counts.num_symbols), base)
    off = good.values.copy()
    row = int(counts.support.symbols[0])
    off[np.flatnonzero(counts.support.symbols == row)[0]] += 0.5
    with pytest.raises(ValueError, match=f"emission row {row} sums to"):
        as_sparse_emission(SparseEmission(counts.support, off, good.backoff, base), "emission")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_totals_are_bincounts_to_the_bit(seed):
    """The counts' row totals in one compiled pass: ``np.bincount``'s sums, in its order (fractional counts, so a
    different order of additions would show)."""
    counts = _counts(seed, num_symbols=300, num_targets=200)
    counts.counts *= np.random.default_rng(seed).random(counts.support.num_pairs) * 1e3
    want = np.bincount(counts.support.symbols, weights=counts.counts, minlength=counts.num_symbols)
    got = counts.row_totals()
    assert got.shape == (counts.num_symbols,) and got.tobytes() == want.tobytes()
    # The same counts added in another order differ somewhere in their last bits: the order is what is compared.
    order = np.argsort(counts.support.symbols, kind="stable")[::-1]
    other = np.bincount(counts.support.symbols[order], weights=counts.counts[order], minlength=counts.num_symbols)
    assert other.tobytes() != want.tobytes()
