"""A position prior tied over recency buckets, and what a row's window looks like under it.

Context positions are counted by recency: in a window ``c_1..c_N`` (``c_N`` the most recent, the last
column of a context array), position ``i`` (0-based) has recency ``r = N - 1 - i``. ``K`` buckets tie
the positions into spans that grow geometrically from the most recent:

- ``K = N``: every position its own bucket (the free prior);
- ``1 <= K <= ceil(log2 N) + 1``: bucket 0 is recency ``{0}``, bucket ``k`` (``1 <= k < K - 1``) is
  ``[2**(k-1), 2**k)``, and the last bucket takes the rest, ``[2**(K-2), N)`` (``[0, N)`` for ``K = 1``).
  Sizes 1, 1, 2, 4, 8, ..., and whatever is left; N = 512, K = 10: 1, 1, 2, 4, ..., 128, 256.

Every other K is refused (a bucket would be empty). Each bucket ``b`` has one weight ``pi_b``, split
evenly over its ``|b|`` positions: ``pi_i = pi_b / |b|``. When the positions of a span share one weight,
attention over it depends only on how many times each symbol occurs in it (its histogram ``h_b``)::

    sum_{i in b} pi_i N(q; K[c_i]) B[c_i, t]  =  (pi_b / |b|) sum_s h_b(s) N(q; K[s]) B[s, t]

so a row costs one distance and one emission lookup per distinct symbol of its window
(:mod:`dist_respattn.model.kernels.histogram`).

**Short histories.** A row with only ``m < N`` earlier tokens (the first targets of a document) has the
recencies ``0..m-1``; the others are masked and the prior renormalizes over what exists:
``p(i) = pi_i / A`` with ``A = sum_b pi_b a_b``, ``a_b`` the fraction of bucket ``b``'s positions the row
has. EM stays exact: the masked positions are draws the row rejected (a truncated categorical), and
the expected number of rejected draws landing in bucket ``b``, ``pi_b (1 - a_b) / A`` per unit of row
weight, joins the bucket's responsibility mass, so the M-step ``pi_b ∝ mass_b`` stays closed form and
the likelihood never decreases (Dempster, Laird & Rubin 1977, section 4.5's truncated distributions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PositionBuckets", "max_geometric_buckets"]


def max_geometric_buckets(context_length: int) -> int:
    """The most geometric buckets N positions hold with none empty: ``ceil(log2 N) + 1``."""
    return (
        (int(context_length) - 1).bit_length() + 1 if context_length > 1 else 1
    )  # (N - 1).bit_length() = ceil(log2 N)


@dataclass(frozen=True)
class PositionBuckets:
    """K recency buckets over N positions (see the module's docstring for the rule).

    Attributes:
        context_length: N.
        sizes: (K,) positions per bucket, the most recent bucket first; they sum to N.
    """

    context_length: int
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = tuple(int(v) for v in self.sizes)
        if not sizes or min(sizes) < 1 or sum(sizes) != self.context_length:
            raise ValueError(
                f"position buckets {sizes}: expected positive sizes summing to the window N = {self.context_length}"
            )
        object.__setattr__(self, "sizes", sizes)

    @classmethod
    def geometric(cls, context_length: int, num_buckets: int) -> PositionBuckets:
        """K buckets over N positions: singletons when ``K = N``, else 1, 1, 2, 4, ... and the rest."""
        n, k = int(context_length), int(num_buckets)
        if n < 1:
            raise ValueError(f"context_length = {n}: expected a positive window")
        if k == n:
            return cls(n, (1,) * n)
        most = max_geometric_buckets(n)
        if not 1 <= k <= most:
            raise ValueError(
                f"--position-buckets {k} with a window of N = {n}: expected K = N (the free prior) or "
                f"1 <= K <= {most} (buckets of 1, 1, 2, 4, ... positions from the most recent, the last taking "
                "the rest; more would leave one empty)"
            )
        if k == 1:
            return cls(n, (n,))
        sizes = [1] + [1 << (b - 1) for b in range(1, k - 1)]
        sizes.append(n - sum(sizes))
        return cls(n, tuple(sizes))

    @classmethod
    def free(cls, context_length: int) -> PositionBuckets:
        return cls.geometric(context_length, context_length)

    @property
    def num_buckets(self) -> int:
        return len(self.sizes)

    @property
    def is_free(self) -> bool:
        return self.num_buckets == self.context_length

    @property
    def starts(self) -> np.ndarray:
        """(K + 1,) int64: bucket ``b`` is recencies ``[starts[b], starts[b + 1])``."""
        out = np.zeros(self.num_buckets + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=out[1:])
        return out

    @property
    def bucket_of_recency(self) -> np.ndarray:
        """(N,) int64: the bucket of recency ``r``."""
        return np.repeat(np.arange(self.num_buckets, dtype=np.int64), self.sizes)

    @property
    def bucket_of_position(self) -> np.ndarray:
        """(N,) int64: the bucket of context column ``i`` (recency ``N - 1 - i``)."""
        return self.bucket_of_recency[::-1].copy()

    def bucket_weights(self, position_prior: np.ndarray) -> np.ndarray:
        """(K,) ``pi_b``: a per-position prior (N,) summed over each bucket."""
        return np.add.reduceat(np.asarray(position_prior, dtype=np.float64)[::-1], self.starts[:-1])

    def tie(self, position_mass: np.ndarray, pseudo_count: float | None = None) -> np.ndarray:
        """The tied M-step: (N,) ``pi_i = pi_b / |b|`` with ``pi_b ∝ sum_{i in b} mass_i + pseudo_count |b| / N``.

        Uniform when there is no mass. ``position_mass`` is (N,) in column order.
        """
        n = self.context_length
        sizes = np.asarray(self.sizes, dtype=np.float64)
        mass = self.bucket_weights(position_mass) + (0.0 if pseudo_count is None else pseudo_count * sizes / n)
        total = float(mass.sum())
        weights = mass / total if total > 0.0 else sizes / n
        return self.spread(weights)

    def spread(self, bucket_values: np.ndarray) -> np.ndarray:
        """(N,) in column order: each bucket's value split evenly over its positions."""
        per_position = np.repeat(np.asarray(bucket_values, dtype=np.float64) / np.asarray(self.sizes), self.sizes)
        return per_position[::-1].copy()

    def is_tied(self, position_prior: np.ndarray, rtol: float = 1e-9) -> bool:
        """Whether ``position_prior`` (N,) is constant within every bucket (to ``rtol``)."""
        tied = self.spread(self.bucket_weights(position_prior))
        return bool(np.allclose(position_prior, tied, rtol=rtol, atol=0.0))

    def to_json(self) -> dict[str, Any]:
        return {"context_length": self.context_length, "sizes": list(self.sizes)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PositionBuckets:
        return cls(int(data["context_length"]), tuple(int(v) for v in data["sizes"]))

    def describe(self) -> str:
        if self.is_free:
            return f"{self.num_buckets} buckets (the free prior)"
        return f"{self.num_buckets} buckets of {', '.join(str(s) for s in self.sizes)} positions"
