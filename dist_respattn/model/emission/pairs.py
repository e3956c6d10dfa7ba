"""Sparse counts of (symbol, target) pairs: the bigram statistics behind the emission prior and the n-gram baselines.

A row's pair is ``(context[:, -1], target)``: the symbol at the last context position (the previous
token for windows of a token stream, whose writers put the most recent token last) and the target.
Only pairs that occur are stored, as sorted cell keys ``s * T + t`` with their weighted counts, so
the size follows the data, never S×T. Counts are additive: ``a + b`` merges two sets of pairs, adding
in a fixed order (``a``'s count, then ``b``'s), so a fixed reduction tree gives bit-identical sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.model.kernels.pair_keys import (
    PairWordCounts,
    equal_mass,
    merge_tallies,
    tally_equal_keys,
    tally_keys,
)

__all__ = ["PairCounts", "PairTally", "block_pairs", "pairs_of_blocks"]


@dataclass(frozen=True)
class PairCounts:
    """Weighted counts of the (symbol, target) pairs that occur, sorted by cell.

    Attributes:
        num_symbols, num_targets: S and T.
        keys: (P,) int64, strictly increasing cells ``s * T + t``.
        counts: (P,) float64, the summed row weights of each pair (> 0).
    """

    num_symbols: int
    num_targets: int
    keys: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls, num_symbols: int, num_targets: int) -> PairCounts:
        return cls(int(num_symbols), int(num_targets), np.zeros(0, dtype=np.int64), np.zeros(0))

    @classmethod
    def from_rows(
        cls,
        symbols: np.ndarray,
        targets: np.ndarray,
        weights: np.ndarray | None,
        *,
        num_symbols: int,
        num_targets: int,
    ) -> PairCounts:
        """Count the pairs ``(symbols[n], targets[n])`` of checked ids, weighted (rows of weight 0 add nothing)."""
        cells = symbols.astype(np.int64) * num_targets + targets.astype(np.int64)
        w = None
        if weights is not None:
            live = weights > 0
            cells = cells[live]
            w = np.asarray(weights, dtype=np.float64)[live]
        if cells.size == 0:
            return cls.empty(num_symbols, num_targets)
        mass = 1.0 if w is None else equal_mass(w)
        if mass > 0.0:  # every row weighs one power of two (1, or 0 and 1: a hold-out's side): counted, same bits
            keys, counts = tally_equal_keys(cells, mass)
        else:
            keys, counts = tally_keys(cells, w if w is not None else np.ones(cells.shape[0]))
        return cls(int(num_symbols), int(num_targets), keys, counts)

    def __add__(self, other: PairCounts) -> PairCounts:
        if (self.num_symbols, self.num_targets) != (other.num_symbols, other.num_targets):
            raise ValueError(
                f"pair counts of (S, T) = {(self.num_symbols, self.num_targets)} and "
                f"{(other.num_symbols, other.num_targets)} cannot be added"
            )
        if other.keys.size == 0:
            return self
        if self.keys.size == 0:
            return other
        # One linear merge: each cell's count is self's, then other's.
        keys, counts = merge_tallies((self.keys, self.counts), (other.keys, other.counts))
        return PairCounts(self.num_symbols, self.num_targets, keys, counts)

    # -- views ------------------------------------------------------------------------------

    @property
    def num_pairs(self) -> int:
        """P, the number of distinct pairs."""
        return int(self.keys.size)

    @property
    def symbols(self) -> np.ndarray:
        """(P,) int64 symbol of each pair."""
        return self.keys // self.num_targets

    @property
    def targets(self) -> np.ndarray:
        """(P,) int64 target of each pair."""
        return self.keys % self.num_targets

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def symbol_totals(self) -> np.ndarray:
        """(S,) ``c(s) = sum_t c(s, t)``."""
        return np.bincount(self.symbols, weights=self.counts, minlength=self.num_symbols)

    def target_totals(self) -> np.ndarray:
        """(T,) ``c(t) = sum_s c(s, t)``, the target unigram counts."""
        return np.bincount(self.targets, weights=self.counts, minlength=self.num_targets)

    def successor_types(self) -> np.ndarray:
        """(S,) ``N1+(s •)``: how many distinct targets follow symbol s."""
        return np.bincount(self.symbols, minlength=self.num_symbols).astype(np.float64)

    def continuation_types(self) -> np.ndarray:
        """(T,) ``N1+(• t)``: how many distinct symbols precede target t (Kneser-Ney's continuation count)."""
        return np.bincount(self.targets, minlength=self.num_targets).astype(np.float64)

    def lookup(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``c(s, t)`` for arrays of pairs (0 for pairs that do not occur): (m,) float64."""
        cells = np.asarray(symbols, dtype=np.int64) * self.num_targets + np.asarray(targets, dtype=np.int64)
        if self.keys.size == 0:
            return np.zeros(cells.shape)
        at = np.minimum(np.searchsorted(self.keys, cells), self.keys.size - 1)
        return np.where(self.keys[at] == cells, self.counts[at], 0.0)


def _previous_symbols(block: Any) -> np.ndarray:
    """A block's rows' previous symbols: a window's last token, or the context's last id."""
    rows = block.rows
    return rows.tokens[rows.end - 1] if hasattr(rows, "tokens") else rows.context[:, -1]


def block_pairs(block: Any, num_symbols: int, num_targets: int) -> PairCounts:
    """The weighted (previous symbol, target) pairs of a :class:`~dist_respattn.model.heads.base.Block`'s rows (a
    window's last token, or the context's last id, is the previous symbol)."""
    return PairCounts.from_rows(
        _previous_symbols(block), block.rows.target, block.weights, num_symbols=num_symbols, num_targets=num_targets
    )


class PairTally:
    """:func:`block_pairs` of blocks added one after the other, the same counts to the bit, with the pairs of
    consecutive blocks whose rows all weigh one power of two (1, or 0 and 1: a hold-out's side) counted in one hash
    table and sorted once (:class:`~dist_respattn.model.kernels.pair_keys.PairWordCounts`) instead of sorted a block
    at a time and merged: a pair's count is then its number of rows times that weight, what adding the blocks' counts
    one after the other gives (sums of whole multiples of a power of two are exact in any order). Cells past 2^32
    (S × T) and blocks of other weights are added as :func:`block_pairs` adds them, after the counted ones."""

    def __init__(self, num_symbols: int, num_targets: int) -> None:
        self.num_symbols, self.num_targets = int(num_symbols), int(num_targets)
        self.pairs = PairCounts.empty(num_symbols, num_targets)
        self._counted: PairWordCounts | None = None
        self._mass = 0.0

    def add(self, block: Any) -> None:
        rows = block.rows
        n = int(rows.target.shape[0])
        weights = block.weights
        live = np.zeros(0) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        mass = 1.0 if weights is None else equal_mass(live)
        if mass == 0.0 and not bool(np.any(live > 0)):
            return  # no row counts: no pair
        counted = self._counted
        fits = self.num_symbols * self.num_targets <= 2**32 and (counted is None or counted.entries + n < 2**32)
        if mass > 0.0 and fits and (counted is None or mass == self._mass):
            if counted is None:
                counted = self._counted = PairWordCounts()
                self._mass = mass
            counted.add(_previous_symbols(block), rows.target, self.num_targets, live)
            return
        self._flush()
        self.pairs = self.pairs + block_pairs(block, self.num_symbols, self.num_targets)

    def _flush(self) -> None:
        if self._counted is not None:
            keys, counts = self._counted.tally()
            self._counted = None
            if keys.size:
                counts *= self._mass
                self.pairs = self.pairs + PairCounts(self.num_symbols, self.num_targets, keys, counts)

    def value(self) -> PairCounts:
        """The pairs of every block added."""
        self._flush()
        return self.pairs


def pairs_of_blocks(num_symbols: int, num_targets: int, blocks: Iterable[Any]) -> PairCounts:
    """The weighted (previous symbol, target) pairs of blocks' rows, added block by block in order (a pass's
    partition map: the emission prior's counts and the n-gram baselines')."""
    tally = PairTally(num_symbols, num_targets)
    for block in blocks:
        tally.add(block)
    return tally.value()
