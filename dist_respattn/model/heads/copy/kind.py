"""The copy head as a kind of the head protocol: its spec, additive statistics, trainer and M-step candidates.

The E-step is the copy kernel's (:mod:`dist_respattn.model.heads.copy.kernels`); the M-step is the single-hop
M-step of the "own table" share of the responsibilities (its keys, prior and MAP emission unchanged) and, per recency
bucket, ``kappa_b = copy mass / responsibility`` and ``rho_b = induction mass / responsibility``. What the single-hop
M-step leaves open (the gate variance, the emission prior's strengths) is chosen on held-out rows as the single head
chooses it, each candidate scored with the copy terms (:mod:`dist_respattn.model.heads.copy.grid`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.emission.layouts import DenseEmissionCounts, SparseEmission, SparseEmissionCounts
from dist_respattn.model.fitting.selection import GridTable, GridTotals, Hyperparameters
from dist_respattn.model.heads.base import (
    Block,
    Candidates,
    Columns,
    Grid,
    Head,
    HeadSpec,
    Passes,
    Trainer,
    TrainerContext,
    sum_into_copy,
)
from dist_respattn.model.heads.copy.grid import copy_grid
from dist_respattn.model.heads.copy.head import CopyHead, copy_buckets
from dist_respattn.model.heads.copy.histogram import copy_estep_windows
from dist_respattn.model.heads.copy.kernels import CopyArrays, copy_estep
from dist_respattn.model.heads.single_hop.accumulator import SufficientStatistics
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.kind import SingleHopCandidates, SingleHopSpec, SingleHopTrainer
from dist_respattn.model.kernels.per_position import StatisticArrays
from dist_respattn.model.memory import MemoryEstimate

__all__ = [
    "CopyCandidates",
    "CopyGrid",
    "CopySpec",
    "CopyStatistics",
    "CopyTrainer",
    "copy_statistics",
]


@dataclass(frozen=True)
class CopySpec(HeadSpec):
    """The settings of a copy fit: the single-hop head's (``single``; what it leaves open is chosen on held-out rows
    as a single-hop fit chooses it) and the copy and induction weights every bucket starts from (``init_copy`` each;
    0 would keep them 0 for good, EM never leaving a zero weight)."""

    kind: ClassVar[str] = "copy"

    single: SingleHopSpec = field(default_factory=SingleHopSpec)
    init_copy: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.init_copy <= 0.5:
            raise ValueError(f"init_copy = {self.init_copy!r}: expected a weight in [0, 0.5] (copy and induction each)")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "single": self.single.to_json(), "init_copy": float(self.init_copy)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CopySpec:
        return cls(SingleHopSpec.from_json(dict(data["single"])), float(data.get("init_copy", 0.1)))

    def trainer(self, context: TrainerContext) -> CopyTrainer:
        return CopyTrainer(self.single.trainer(context), self.init_copy)


@dataclass(frozen=True)
class CopyStatistics:
    """Additive statistics of a copy head: the single head's (the emission counts of the own-table share only) and
    (K,) arrays per bucket: ``copy_mass``, ``induction_mass`` and ``bucket_mass``, the responsibility that went to the
    copy term, to the induction term, and in all to the bucket's positions."""

    stats: SufficientStatistics
    copy_mass: np.ndarray
    induction_mass: np.ndarray
    bucket_mass: np.ndarray

    @property
    def log_lik(self) -> float:
        return float(self.stats.log_lik)

    @property
    def n_obs(self) -> float:
        return float(self.stats.n_obs)

    def copy(self) -> CopyStatistics:
        return CopyStatistics(
            self.stats.copy(), self.copy_mass.copy(), self.induction_mass.copy(), self.bucket_mass.copy()
        )

    def add(self, other: CopyStatistics) -> CopyStatistics:
        """``self + other`` into this value's arrays (the caller owns them: see :meth:`copy`)."""
        np.add(self.copy_mass, other.copy_mass, out=self.copy_mass)
        np.add(self.induction_mass, other.induction_mass, out=self.induction_mass)
        np.add(self.bucket_mass, other.bucket_mass, out=self.bucket_mass)
        return CopyStatistics(self.stats.add(other.stats), self.copy_mass, self.induction_mass, self.bucket_mass)

    def __add__(self, other: CopyStatistics) -> CopyStatistics:
        return self.copy().add(other)

    @classmethod
    def sum_of(cls, values: list[CopyStatistics]) -> CopyStatistics:
        """The sum of ``values``, added left to right into one copy of the first (the combine tree's sum)."""
        return sum_into_copy(values)


@dataclass(frozen=True)
class CopyGrid(Grid):
    """The held-out pass of a copy M-step: the single-hop candidates' grid, each point scored as the copy head it
    makes with the M-step's copy and induction weights (:func:`~dist_respattn.model.heads.copy.grid.copy_grid`)."""

    table: GridTable
    bucket_of_recency: np.ndarray
    kappa: np.ndarray
    rho: np.ndarray

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    def score(self, blocks: Iterable[Block]) -> GridTotals:
        totals = GridTotals.zeros(self.table.shape)
        for block in blocks:
            rows = _weighted(block.rows, block.weights)
            totals = totals + copy_grid(self.table, rows, self.bucket_of_recency, self.kappa, self.rho)
        return totals

    def nbytes(self) -> int:
        """Its counts (the M-step's, either layout) dominate."""
        return int(self.table.counts.nbytes)


@dataclass(frozen=True)
class CopyCandidates(Candidates):
    """A copy M-step: the single-hop M-step's candidates (one head per gate variance and emission strengths), each
    with the copy and induction weights ``kappa``, ``rho`` (K,) that the statistics alone fix, tied over the
    buckets ``bucket_of_recency`` (N,) gives."""

    single: SingleHopCandidates
    kappa: np.ndarray
    rho: np.ndarray
    bucket_of_recency: np.ndarray

    def default(self) -> Hyperparameters:
        return self.single.default()

    def grid(self, around: Any) -> CopyGrid:
        return CopyGrid(self.single.grid(around).table, self.bucket_of_recency, self.kappa, self.rho)

    def choose(self, grid: Grid, scores: Any) -> tuple[Hyperparameters, dict[str, float] | None]:
        assert isinstance(grid, CopyGrid)
        selection = self.single.candidates.select(grid.table, scores)
        return selection.hyperparameters, selection.heldout

    def model(self, choice: Any) -> CopyHead:
        return CopyHead(self.single.model(choice), self.kappa, self.rho)

    def searches(self) -> bool:
        return self.single.searches()


def _weighted(rows: Any, weights: np.ndarray | None) -> Any:
    return rows if weights is rows.weight else rows._replace(weight=weights)


def copy_statistics(head: CopyHead, blocks: Iterable[Block]) -> CopyStatistics:
    """The copy E-step of ``blocks`` (token windows, in row order) under ``head``: the single head's statistics of
    the own-table share (position counts in column order, a short window's rejected draws included) and the
    per-bucket copy, induction and responsibility masses."""
    s, n, d, t = head.shape
    table = head.single.emission_table
    support = table.support if isinstance(table, SparseEmission) else None
    arrays = StatisticArrays.zeros(s, n, d, t, support)
    extra = CopyArrays.zeros(n, head.buckets.num_buckets)
    params = head.parameters
    # A tied prior's rows go through the window histograms (O(distinct symbols) a row), a free one's per position.
    estep = copy_estep if head.single.buckets is None else copy_estep_windows
    for block in blocks:
        rows = _weighted(block.rows, block.weights)
        head.check_rows(rows)
        estep(rows, params, arrays, extra)
    if support is None:
        counts: Any = DenseEmissionCounts(arrays.emission_count_ts)
    else:
        assert arrays.pair_counts is not None
        counts = SparseEmissionCounts(arrays.pair_counts, None, num_symbols=s, num_targets=t)
    query_sq, n_obs, log_lik = (float(v) for v in arrays.scalars)
    stats = SufficientStatistics(
        arrays.key_sum, arrays.key_mass, counts, extra.recency_mass[::-1].copy(), query_sq, n_obs, log_lik
    )
    return CopyStatistics(stats, extra.copy_mass, extra.induction_mass, extra.bucket_mass)


class CopyTrainer(Trainer):
    """A copy fit: the single-hop trainer (its estimator, prior, layout and start) and the copy weights' start."""

    def __init__(self, single: SingleHopTrainer, init_copy: float) -> None:
        self.single = single
        self.init_copy = float(init_copy)

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.single.shape

    def searches(self) -> bool:
        return self.single.searches()

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if isinstance(head, ResponsibilityAttentionDistribution) and not resumed:
            # A fitted single head: the copy fit starts from it, every bucket's weights at the start's.
            self.single.check_start(head, resumed=False)
            return
        if not isinstance(head, CopyHead):
            raise ValueError(f"a copy fit starts from a copy head or a single-hop one, not a {head.kind} one")
        self.single.check_start(head.single, resumed=resumed)

    def start_head(self, single: ResponsibilityAttentionDistribution) -> CopyHead:
        """The copy head a fit starts from: ``single`` with every bucket's copy and induction weights at the start's."""
        n_buckets = copy_buckets(single).num_buckets
        return CopyHead(single, np.full(n_buckets, self.init_copy), np.full(n_buckets, self.init_copy))

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if start is None:
            single = self.single.prepare(None, resumed=False, passes=passes)
            assert isinstance(single, ResponsibilityAttentionDistribution)
            return self.start_head(single)
        if isinstance(start, ResponsibilityAttentionDistribution):  # a warm start from a single head
            single = self.single.prepare(start, resumed=False, passes=passes)
            assert isinstance(single, ResponsibilityAttentionDistribution)
            return self.start_head(single)
        assert isinstance(start, CopyHead)
        single = self.single.prepare(start.single, resumed=resumed, passes=passes)
        assert isinstance(single, ResponsibilityAttentionDistribution)
        return CopyHead(single, start.kappa, start.rho)

    def statistics(self, head: Head, blocks: Iterator[Block]) -> CopyStatistics:
        """The copy E-step of one partition's blocks, in row order (:func:`copy_statistics`)."""
        assert isinstance(head, CopyHead)
        return copy_statistics(head, blocks)

    def m_step(self, statistics: Any, previous: Head | None) -> CopyCandidates:
        assert isinstance(statistics, CopyStatistics) and isinstance(previous, CopyHead)
        candidates = self.single.m_step(statistics.stats, previous.single)
        mass = statistics.bucket_mass
        seen = mass > 0.0
        # A bucket no responsibility reached keeps its weights (nothing says otherwise).
        kappa = np.where(seen, statistics.copy_mass / np.where(seen, mass, 1.0), previous.kappa)
        rho = np.where(seen, statistics.induction_mass / np.where(seen, mass, 1.0), previous.rho)
        # Each share is at most the responsibility it came from; rounding may leave kappa + rho a hair above 1.
        over = np.maximum(kappa + rho, 1.0)
        return CopyCandidates(candidates, kappa / over, rho / over, previous.buckets.bucket_of_recency)

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        assert isinstance(head, CopyHead)
        stats = statistics.stats if isinstance(statistics, CopyStatistics) else None
        return self.single.warnings(head.single, stats)

    def choice_from_json(self, data: dict[str, Any]) -> Hyperparameters | None:
        # A checkpoint of a fit that chose nothing records the gate variance alone: nothing to centre a search on.
        if not data or "emission_strength" not in data:
            return None
        return self.single.choice_from_json(data)

    def checkpoint_extras(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return self.single.checkpoint_extras()

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> MemoryEstimate:
        return self.single.memory(
            block_rows=block_rows, row_bytes=row_bytes, threads_per_worker=threads_per_worker, fan_in=fan_in
        )
