"""The chain of hops as a kind of the head protocol: its spec, additive statistics, trainer and M-step.

The E-step is exact forward–backward over the hops (:mod:`dist_respattn.model.heads.hops.kernels`). The M-step is
closed form: hop 1 and the emission are the single-hop M-step of hop 1's responsibilities and the last hop's (its
MAP emission unchanged); each later hop's key of symbol ``s`` is the mean of the hop queries its transitions into
``s`` answered, its position prior the normalized transition mass per position. The single head's open choices (the
gate variance, the emission's strengths) are chosen on held-out rows (:mod:`dist_respattn.model.heads.hops.grid`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.emission.layouts import DenseEmissionCounts, SparseEmission, SparseEmissionCounts
from dist_respattn.model.fitting.fixed import OneCandidate
from dist_respattn.model.fitting.selection import Hyperparameters
from dist_respattn.model.heads.base import (
    Block,
    BlockPass,
    Columns,
    Head,
    HeadSpec,
    Passes,
    Trainer,
    TrainerContext,
)
from dist_respattn.model.heads.hops.grid import HopsCandidates
from dist_respattn.model.heads.hops.head import HopsHead
from dist_respattn.model.heads.hops.kernels import HopArrays, hop_estep
from dist_respattn.model.heads.single_hop.accumulator import SufficientStatistics
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec, SingleHopTrainer
from dist_respattn.model.memory import MemoryEstimate

__all__ = [
    "HopsChoice",
    "HopsSpec",
    "HopsStatistics",
    "HopsTrainer",
    "QuerySums",
    "hop_m_step",
    "hop_queries_of",
    "hop_statistics",
    "query_sums",
]


@dataclass(frozen=True)
class HopsSpec(HeadSpec):
    """The settings of a chain-of-hops fit: the single-hop head's (``single``, hop 1 and the emission; its open
    choices, the gate variance and the emission's strengths not given, chosen on held-out rows as the single head
    chooses them, see :class:`~dist_respattn.model.heads.hops.grid.HopsCandidates`), the number of hops ``hops``
    (H >= 1; 1 is the single head) and ``softmax`` (normalize each later hop over the positions it goes to, as the
    reference library's chained attention does; its M-step is then not exact EM)."""

    kind: ClassVar[str] = "hops"

    single: SingleHopSpec = field(default_factory=SingleHopSpec)
    hops: int = 2
    softmax: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.hops, bool) or not isinstance(self.hops, (int, np.integer)) or self.hops < 1:
            raise ValueError(f"hops = {self.hops!r}: expected a whole number of hops >= 1")
        if self.single.estimate_sigma2:
            raise ValueError(
                "a chain of hops chooses its gate variance on held-out rows or keeps it fixed: it does not estimate "
                "sigma2"
            )

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "single": self.single.to_json(), "hops": int(self.hops),
                "softmax": bool(self.softmax)}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HopsSpec:
        return cls(SingleHopSpec.from_json(dict(data["single"])), int(data["hops"]), bool(data.get("softmax", False)))

    def trainer(self, context: TrainerContext) -> HopsTrainer:
        return HopsTrainer(self.single.trainer(context), int(self.hops), bool(self.softmax))


@dataclass(frozen=True)
class HopsStatistics:
    """Additive statistics of a chain: the single head's (hop 1's keys and prior, the last hop's emission counts,
    the row count and the log-likelihood) and, per later hop, ``key_sum`` (H-1, S, D), ``key_mass`` (H-1, S) and
    ``position_mass`` (H-1, N) in column order."""

    stats: SufficientStatistics
    key_sum: np.ndarray
    key_mass: np.ndarray
    position_mass: np.ndarray

    @property
    def log_lik(self) -> float:
        return float(self.stats.log_lik)

    @property
    def n_obs(self) -> float:
        return float(self.stats.n_obs)

    def copy(self) -> HopsStatistics:
        return HopsStatistics(self.stats.copy(), self.key_sum.copy(), self.key_mass.copy(), self.position_mass.copy())

    def add(self, other: HopsStatistics) -> HopsStatistics:
        """``self + other`` into this value's arrays (the caller owns them: see :meth:`copy`)."""
        np.add(self.key_sum, other.key_sum, out=self.key_sum)
        np.add(self.key_mass, other.key_mass, out=self.key_mass)
        np.add(self.position_mass, other.position_mass, out=self.position_mass)
        return HopsStatistics(self.stats.add(other.stats), self.key_sum, self.key_mass, self.position_mass)

    def __add__(self, other: HopsStatistics) -> HopsStatistics:
        return self.copy().add(other)

    @classmethod
    def sum_of(cls, values: list[HopsStatistics]) -> HopsStatistics:
        total = values[0].copy()
        for value in values[1:]:
            total = total.add(value)
        return total


@dataclass(frozen=True)
class QuerySums:
    """What the hop query table is made from: per symbol the sum of the queries of the rows whose most recent
    token it is (``sums`` (S, D), ``counts`` (S,)), and all rows' (``total`` (D,), ``n``). Additive."""

    sums: np.ndarray
    counts: np.ndarray
    total: np.ndarray
    n: float

    def __add__(self, other: QuerySums) -> QuerySums:
        return QuerySums(self.sums + other.sums, self.counts + other.counts, self.total + other.total, self.n + other.n)


def query_sums(num_symbols: int, blocks: Iterable[Block]) -> QuerySums:
    """The :class:`QuerySums` of token-window blocks (every row weighs 1: the table describes the tokens)."""
    sums: np.ndarray | None = None
    total: np.ndarray | None = None
    counts = np.zeros(num_symbols)
    for block in blocks:
        rows = block.rows
        y = np.asarray(rows.query_table[rows.query_index], dtype=np.float64)
        if sums is None or total is None:
            sums, total = np.zeros((num_symbols, y.shape[1])), np.zeros(y.shape[1])
        last = np.asarray(rows.tokens[np.asarray(rows.end) - 1], dtype=np.int64)
        np.add.at(sums, last, y)
        counts += np.bincount(last, minlength=num_symbols)
        total += y.sum(axis=0)
    if sums is None or total is None:
        return QuerySums(np.zeros((num_symbols, 0)), counts, np.zeros(0), 0.0)
    return QuerySums(sums, counts, total, float(counts.sum()))


def hop_queries_of(value: QuerySums, num_symbols: int, query_dim: int) -> np.ndarray:
    """(S, D) the query a token asks: the mean query of the rows it ends (a token store's embedding of it, exactly),
    the mean of every row's query for a token no row ends with."""
    if value.n <= 0.0 or value.sums.shape != (num_symbols, query_dim):
        return np.zeros((num_symbols, query_dim))
    mean = value.total / value.n
    seen = value.counts > 0
    out = np.tile(mean, (num_symbols, 1))
    out[seen] = value.sums[seen] / value.counts[seen, None]
    return out


@dataclass(frozen=True)
class HopsChoice:
    """A chain's M-step's hyperparameters when it has none to choose (every one given): the gate variance and the
    emission's strengths (``None``: the reference library's additive smoothing, or a choice recorded with the gate
    variance alone)."""

    sigma2: float
    emission_strength: float | None = None
    type_strength: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"sigma2": float(self.sigma2)}
        if self.emission_strength is not None and self.type_strength is not None:
            data.update(emission_strength=float(self.emission_strength), type_strength=float(self.type_strength))
        return data

    def describe(self) -> str:
        if self.emission_strength is None or self.type_strength is None:
            return f"sigma2 {self.sigma2:.3g} (fixed)"
        return f"{Hyperparameters(self.sigma2, self.emission_strength, self.type_strength).describe()} (fixed)"


def hop_statistics(head: HopsHead, blocks: Iterable[Block]) -> HopsStatistics:
    """The chain's E-step of ``blocks`` (token windows, in row order) under ``head``."""
    s, _, _, t = head.shape
    table = head.single.emission_table
    support = table.support if isinstance(table, SparseEmission) else None
    arrays = HopArrays.zeros(head.n_hops, head.shape, None if support is None else support.num_pairs)
    params = head.parameters
    for block in blocks:
        rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
        head.check_rows(rows)
        hop_estep(rows, params, arrays)
    if support is None:
        counts: Any = DenseEmissionCounts(arrays.emission_count_ts)
    else:
        counts = SparseEmissionCounts(arrays.pair_counts, None, num_symbols=s, num_targets=t)
    query_sq, n_obs, log_lik = (float(v) for v in arrays.scalars)
    # Recency (most recent first) to column order (most recent last).
    positions = arrays.recency_mass[:, ::-1].copy()
    stats = SufficientStatistics(arrays.key_sum[0], arrays.key_mass[0], counts, positions[0], query_sq, n_obs, log_lik)
    return HopsStatistics(stats, arrays.key_sum[1:].copy(), arrays.key_mass[1:].copy(), positions[1:].copy())


def hop_m_step(statistics: HopsStatistics, previous: HopsHead) -> tuple[np.ndarray, np.ndarray]:
    """The later hops' ``(keys (H-1, S, D), priors (H-1, N))``: the mean query each key answered (a symbol no
    transition reached keeps its key) and the normalized transition mass per position (a hop no mass reached
    keeps its prior)."""
    mass = statistics.key_mass
    seen = mass > 0.0
    keys = np.where(seen[..., None], statistics.key_sum / np.where(seen, mass, 1.0)[..., None], previous.keys)
    totals = statistics.position_mass.sum(axis=1, keepdims=True)
    priors = np.where(totals > 0.0, statistics.position_mass / np.where(totals > 0.0, totals, 1.0), previous.priors)
    return keys, priors


class HopsTrainer(Trainer):
    """A chain-of-hops fit: the single-hop trainer (hop 1, the emission's estimator, prior, layout and start), the
    number of hops and the transitions' normalization."""

    def __init__(self, single: SingleHopTrainer, hops: int, softmax: bool) -> None:
        self.single = single
        self.hops = int(hops)
        self.softmax = bool(softmax)

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
            self.single.check_start(head, resumed=False)  # a fitted single head: the chain's hop 1 starts from it
            return
        if not isinstance(head, HopsHead):
            raise ValueError(f"a chain of hops starts from a chain or a single-hop head, not a {head.kind} one")
        if head.n_hops != self.hops:
            raise ValueError(f"the start is a chain of {head.n_hops} hops: this fit asks for {self.hops}")
        self.single.check_start(head.single, resumed=resumed)

    def start_head(self, single: ResponsibilityAttentionDistribution, passes: Passes) -> HopsHead:
        """The chain a fit starts from: ``single`` as hop 1, every later hop with its keys and a uniform prior, the
        hop queries from a pass over the training rows."""
        s, n, d, _ = single.shape
        value = passes.run(
            BlockPass("hop-queries", "reading the hop queries", functools.partial(query_sums, s), self.columns)
        )
        queries = hop_queries_of(value, s, d)
        later = self.hops - 1
        keys = np.repeat(np.asarray(single.key_means)[None], later, axis=0)
        return HopsHead(single, keys, np.full((later, n), 1.0 / n), queries, softmax=self.softmax)

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if start is None or isinstance(start, ResponsibilityAttentionDistribution):
            single = self.single.prepare(start, resumed=False, passes=passes)
            assert isinstance(single, ResponsibilityAttentionDistribution)
            return self.start_head(single, passes)
        assert isinstance(start, HopsHead)
        single = self.single.prepare(start.single, resumed=resumed, passes=passes)
        assert isinstance(single, ResponsibilityAttentionDistribution)
        return HopsHead(single, start.keys, start.priors, start.hop_queries, softmax=start.softmax)

    def statistics(self, head: Head, blocks: Iterator[Block]) -> HopsStatistics:
        """The chain's E-step of one partition's blocks, in row order (:func:`hop_statistics`)."""
        assert isinstance(head, HopsHead)
        return hop_statistics(head, blocks)

    def m_step(self, statistics: Any, previous: Head | None) -> HopsCandidates | OneCandidate:
        """The closed-form M-step; the single head's open choices (if any) left to :class:`HopsCandidates`."""
        assert isinstance(statistics, HopsStatistics) and isinstance(previous, HopsHead)
        candidates = self.single.m_step(statistics.stats, previous.single)
        keys, priors = hop_m_step(statistics, previous)
        if not candidates.searches():
            # Every value given: the one head, scored as it is.
            single = candidates.model(candidates.default())
            head = HopsHead(single, keys, priors, previous.hop_queries, softmax=previous.softmax)
            chosen = candidates.default()
            legacy = candidates.candidates.prior is None
            return OneCandidate(head, HopsChoice(head.single.sigma2, None if legacy else chosen.emission_strength,
                                                 None if legacy else chosen.type_strength))  # fmt: skip
        defaults = candidates.default()
        # Before any choice, the gate variances are searched around the one the chain runs with now.
        centre = Hyperparameters(previous.single.sigma2, defaults.emission_strength, defaults.type_strength)
        return HopsCandidates(candidates, keys, priors, previous.hop_queries, previous.softmax, centre)

    def choice_from_json(self, data: dict[str, Any]) -> Hyperparameters | HopsChoice | None:
        """A recorded choice: the single head's hyperparameters, or (a chain fitted before it chose them) the gate
        variance alone."""
        if not data or "sigma2" not in data:
            return None
        if "emission_strength" in data and "type_strength" in data:
            return Hyperparameters.from_json(data)
        return HopsChoice(float(data["sigma2"]))

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        assert isinstance(head, HopsHead)
        stats = statistics.stats if isinstance(statistics, HopsStatistics) else None
        return self.single.warnings(head.single, stats)

    def checkpoint_extras(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return self.single.checkpoint_extras()

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> MemoryEstimate:
        return self.single.memory(
            block_rows=block_rows, row_bytes=row_bytes, threads_per_worker=threads_per_worker, fan_in=fan_in
        )
