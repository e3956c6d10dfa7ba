"""The deterministic hold-out of a training store: the rows that choose the hyperparameters without a validation store.

Rows are grouped in stripes of consecutive rows, and a stripe is held out when a hash of its index
falls below the fraction. It depends only on the row index (and the store's row count, which sets
the stripe length), never on partitions or workers, so every cluster holds out the same rows. Whole
stripes, rather than scattered rows, keep a held-out row's neighbours (the overlapping windows of a
token stream) mostly held out too, so the choices are made on text the fit has not read.

A staged fit whose stages read a token-stream store at several windows (the recipe's long stages, with short
histories, and its conjunction stage of N = 8, full windows only) numbers the rows as the stream's
(``numbering="stream"``): row ``i`` is the stream's ``i``-th target that has an earlier token in its document (every
token but each document's first), whatever the window and the shortest history the store is read with. So every stage
holds out the same tokens, and a later stage fitted on held-out rows (a stack's gate) never scores a row an earlier
stage was fitted on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_HOLDOUT_FRACTION", "HoldoutRule"]

DEFAULT_HOLDOUT_FRACTION = 0.05

#: The stripe length: about 400 stripes a store, between 16 and 2048 rows each.
_STRIPES_PER_STORE = 400
_MIN_STRIPE_ROWS = 16
_MAX_STRIPE_ROWS = 2048

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

#: How a rule's rows are numbered: the rows as read (``"rows"``), or a token stream's targets (``"stream"``).
NUMBERINGS = ("rows", "stream")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer: a fixed, well-mixed hash of uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class HoldoutRule:
    """Holds out the rows of every stripe whose hash falls below ``fraction``.

    Attributes:
        fraction: the expected share of rows held out, in [0, 1).
        stripe_rows: rows per stripe (see :meth:`for_rows`).
        numbering: ``"rows"``: the row indices given are the rule's; ``"stream"``: a token-stream store's rows are
            numbered as the stream's targets first (the store's ``stream_rows``), so that every window and shortest
            history of the store holds out the same tokens. A rule recorded without one numbers rows.
    """

    fraction: float = DEFAULT_HOLDOUT_FRACTION
    stripe_rows: int = _MAX_STRIPE_ROWS
    numbering: str = "rows"

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.fraction) < 1.0:
            raise ValueError(f"hold-out fraction = {self.fraction!r}: expected a number in [0, 1)")
        if isinstance(self.stripe_rows, bool) or int(self.stripe_rows) < 1:
            raise ValueError(f"stripe_rows = {self.stripe_rows!r}: expected a positive integer")
        if self.numbering not in NUMBERINGS:
            raise ValueError(f"numbering = {self.numbering!r}: expected one of {', '.join(NUMBERINGS)}")

    @classmethod
    def for_rows(
        cls, num_rows: int, fraction: float = DEFAULT_HOLDOUT_FRACTION, *, stripes: bool = True, numbering: str = "rows"
    ) -> HoldoutRule:
        """The rule for a store of ``num_rows`` rows: stripes of ``num_rows / 400`` rows, clipped to [16, 2048].

        ``stripes=False`` holds out single rows: for rows sorted by target (``--row-order target``), where a
        stripe of neighbours would hold one or two targets and the held-out rows would not look like the store.
        ``numbering="stream"``: ``num_rows`` counts a token stream's targets (see :attr:`numbering`).
        """
        if not stripes:
            return cls(float(fraction), 1, numbering)
        stripe = min(_MAX_STRIPE_ROWS, max(_MIN_STRIPE_ROWS, int(num_rows) // _STRIPES_PER_STORE))
        return cls(float(fraction), stripe, numbering)

    def held_out(self, start: int, stop: int) -> np.ndarray:
        """(stop - start,) bool: which of the rows ``[start, stop)`` are held out."""
        if self.fraction <= 0.0 or stop <= start:
            return np.zeros(max(0, stop - start), dtype=bool)
        first, last = start // self.stripe_rows, (stop - 1) // self.stripe_rows
        stripes = np.arange(first, last + 1, dtype=np.uint64)
        # The top 53 bits of the hash as a uniform number in [0, 1).
        uniform = (_splitmix64(stripes) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        chosen = uniform < self.fraction
        # Each stripe's choice repeated over its rows in [start, stop) (no row's stripe computed one by one).
        edges = np.clip(np.arange(first, last + 2, dtype=np.int64) * self.stripe_rows, start, stop)
        return np.repeat(chosen, np.diff(edges))

    def held_out_at(self, rows: np.ndarray) -> np.ndarray:
        """(n,) bool: which of the rows numbered ``rows`` (n,) int are held out (any order)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.fraction <= 0.0 or rows.size == 0:
            return np.zeros(rows.size, dtype=bool)
        stripes = (rows // self.stripe_rows).astype(np.uint64)
        return (_splitmix64(stripes) >> np.uint64(11)).astype(np.float64) * 2.0**-53 < self.fraction

    def count(self, num_rows: int) -> int:
        """How many of rows ``[0, num_rows)`` are held out."""
        total = 0
        step = 1 << 20
        for start in range(0, int(num_rows), step):
            total += int(self.held_out(start, min(start + step, int(num_rows))).sum())
        return total

    def split_weights(self, start: int, num_rows: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``(training weights, held-out weights)`` (n,) float64 of rows ``[start, start + n)``."""
        held = self.held_out(start, start + num_rows)
        w = np.ones(num_rows) if weights is None else np.asarray(weights, dtype=np.float64)
        return np.where(held, 0.0, w), np.where(held, w, 0.0)

    def side_weights(self, start: int, num_rows: int, weights: np.ndarray | None, side: str) -> np.ndarray:
        """One side of :meth:`split_weights` (``"train"`` or ``"heldout"``), the same values, without the other."""
        keep = self.held_out(start, start + num_rows)
        if side == "train":
            keep = ~keep
        if weights is None:
            return keep.astype(np.float64)
        return np.where(keep, np.asarray(weights, dtype=np.float64), 0.0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HoldoutRule:
        return cls(float(data["fraction"]), int(data["stripe_rows"]), str(data.get("numbering", "rows")))
