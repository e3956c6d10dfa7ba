"""Pieces of M-steps the kinds share: the one candidate of a kind with nothing to choose on held-out rows (the new
head, scored all the same, for early stopping and the fit page), and the held-out totals of a grid of heads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dist_respattn.model.heads.base import Block, Candidates, Choice, Columns, Grid, Head
from dist_respattn.model.scores import ScoreTotals

__all__ = ["HeadGrid", "OneCandidate", "PointTotals"]

#: The held-out figures a fixed choice reports.
_REPORTED = ("mean_log_likelihood", "target_log_prob", "perplexity")


@dataclass(frozen=True)
class PointTotals:
    """Held-out totals at every point of a grid of heads, in the grid's order (additive)."""

    totals: tuple[ScoreTotals, ...]

    @property
    def weight(self) -> float:
        return float(self.totals[0].weight) if self.totals else 0.0

    def __add__(self, other: PointTotals) -> PointTotals:
        return PointTotals(tuple(a + b for a, b in zip(self.totals, other.totals, strict=True)))


@dataclass(frozen=True)
class HeadGrid(Grid):
    """A held-out pass of one point: ``head`` scored without its accuracy (only the likelihoods are read)."""

    head: Head

    @property
    def columns(self) -> Columns:
        return self.head.columns

    def score(self, blocks: Iterable[Block]) -> ScoreTotals:
        # Every kind fitted this way (the window kinds) skips its O(T)-a-row accuracy when asked.
        return self.head.score(blocks, accuracy=False)  # type: ignore[call-arg]

    def nbytes(self) -> int:
        return self.head.nbytes()


@dataclass(frozen=True)
class OneCandidate(Candidates):
    """An M-step whose head is fixed by its statistics: ``head``, with the ``choice`` it records."""

    head: Head
    choice: Choice

    def default(self) -> Choice:
        return self.choice

    def grid(self, around: Any) -> HeadGrid:
        return HeadGrid(self.head)

    def choose(self, grid: Grid, scores: Any) -> tuple[Choice, dict[str, float] | None]:
        if scores is None or scores.weight <= 0.0:
            return self.choice, None
        metrics = scores.metrics()
        return self.choice, {name: metrics[name] for name in _REPORTED}

    def model(self, choice: Any) -> Head:
        return self.head

    def searches(self) -> bool:
        return False
