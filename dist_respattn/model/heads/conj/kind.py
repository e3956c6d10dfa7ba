"""The conjunction head as a kind of the head protocol: its spec, the support pass, additive statistics, trainer
and M-step with the pair rows' strengths, and the single head's open choices (its gate variance and emission
strengths), chosen on held-out rows.

The E-step is the conjunction kernel's (:mod:`dist_respattn.model.heads.conj.kernels`); the M-step is the single-hop
M-step of all the responsibilities (keys, prior, ``B``) and, per stored cell, ``n[a, q, t]`` = the responsibility
it received; the pair rows ``(n + s B) / (n_p + s)`` follow in closed form for each strength scored.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.emission.layouts import DenseEmissionCounts, SparseEmission, SparseEmissionCounts
from dist_respattn.model.fitting.fixed import PointTotals
from dist_respattn.model.fitting.selection import (
    Hyperparameters,
    HyperparameterSearch,
    as_hyperparameters,
    coordinate_steps,
)
from dist_respattn.model.heads.base import (
    Block,
    BlockPass,
    Candidates,
    Columns,
    Grid,
    Head,
    HeadSpec,
    Passes,
    Trainer,
    TrainerContext,
)
from dist_respattn.model.heads.conj.head import BACKOFFS, ORDERS, ConjHead, TripleRows
from dist_respattn.model.heads.conj.kernels import ConjArrays, conj_estep, conj_score_grid
from dist_respattn.model.heads.single_hop.accumulator import SufficientStatistics
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.estimator import MStepCandidates
from dist_respattn.model.heads.single_hop.kind import (
    SingleHopCandidates,
    SingleHopSpec,
    SingleHopTrainer,
    fixed_single,
)
from dist_respattn.model.kernels.pair_keys import merge_tallies, tally_keys
from dist_respattn.model.kernels.per_position import StatisticArrays
from dist_respattn.model.memory import MemoryEstimate
from dist_respattn.model.scores import ScoreTotals

__all__ = [
    "DISCOUNTS",
    "ROW_COUNTS",
    "STRENGTHS",
    "TYPE_STRENGTHS",
    "CellTally",
    "ConjCandidates",
    "ConjChoice",
    "ConjGrid",
    "ConjSpec",
    "ConjStatistics",
    "ConjTrainer",
    "cell_tally",
    "conj_statistics",
    "support_counts",
    "support_of",
    "triple_tally",
]

#: The pair rows' strengths ``beta`` and ``gamma`` the held-out rows choose among (every pair of them).
STRENGTHS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)
TYPE_STRENGTHS = (0.0, 0.5, 1.0, 2.0)
#: The absolute discounts ``D`` the held-out rows choose among (with every pair of strengths).
DISCOUNTS = (0.0, 0.5, 0.8)
#: Where an order-3 search starts: the triple rows' prior the pair grid is first scored with, and the pair rows'
#: the triple grid (the same :data:`STRENGTHS` x :data:`TYPE_STRENGTHS` x :data:`DISCOUNTS`) is first scored with.
START_POINT = (0.5, 0.5, 0.0)
#: Where the pair and triple rows' counts come from: ``"data"``, each occurrence of a cell at a position within the
#: depth counted once (its row weight) in the start pass and kept; ``"responsibilities"``, the responsibility each
#: cell received in the last E-step (an EM parameter of the rows).
ROW_COUNTS = ("data", "responsibilities")
#: What a fit's start says of each.
ROW_COUNT_SAYS = {
    "data": "their counts the data's, each training row explained by the rows without its own",
    "responsibilities": "their counts fitted by EM",
}


@dataclass(frozen=True)
class ConjSpec(HeadSpec):
    """The settings of a conjunction fit.

    Attributes:
        single: the single-hop head's settings. Its open choices (the gate variance and the emission's strengths
            not given) are fixed (see :func:`~dist_respattn.model.heads.single_hop.kind.fixed_single`) unless
            ``choose_single``.
        depth: how many of the most recent positions read the pair rows (at most N; 2: the current token's own row
            and the trigram at the previous position).
        min_count: a pair (attended, current) is stored when it occurs at least this often at those positions in
            the training rows (weighted); the others read ``B`` (bounds the support, see the guide).
        strength, type_strength: ``beta`` and ``gamma`` of the pair rows' prior, or ``None``: chosen on held-out
            rows among :data:`STRENGTHS` and :data:`TYPE_STRENGTHS`. ``strength = inf`` is the single head.
        backoff: the row the pair rows' prior leans toward, the attended token's (``B[a]``) or the current token's
            (``B[q]``) (:data:`~dist_respattn.model.heads.conj.head.BACKOFFS`).
        discount: the absolute discount ``D`` each stored cell gives its pair's prior row, or ``None``: chosen on
            held-out rows among :data:`DISCOUNTS` (0: the Dirichlet posterior mode).
        order: 2, rows keyed by (attended, current token); 3, triple rows keyed by (the token before the attended
            one, attended, current token) too, below the pair rows in the hierarchy, their strengths and discount
            chosen on held-out rows as the pair rows' are (:data:`~dist_respattn.model.heads.conj.head.ORDERS`).
        triple_strength, triple_type_strength, triple_discount: ``beta3``, ``gamma3`` and ``D3`` of the triple
            rows' prior toward the pair rows (order 3), or ``None``: chosen on held-out rows among
            :data:`STRENGTHS`, :data:`TYPE_STRENGTHS` and :data:`DISCOUNTS` (``beta3 = inf``: order 2).
        choose_single: choose the single head's open choices on held-out rows too, a step at a time beside the pair
            rows' (see :class:`ConjCandidates`). Off by default: on the recipe's conjunction head, fitted from the
            data, the walk of its gate variance raised the held-out perplexity from one iteration to the next.
        row_counts: where the pair and triple rows' counts come from (:data:`ROW_COUNTS`): ``"data"``, every
            occurrence of a cell at the depth's positions in the training rows, counted once in the start pass and
            fixed (the rows an n-gram model would count; EM fits the gate, the prior and ``B`` around them);
            ``"responsibilities"``, the E-step's responsibility of each cell (EM fits the rows too, and on its own
            training rows moves the prior toward the positions whose rows remember them).
    """

    kind: ClassVar[str] = "conj"

    single: SingleHopSpec = field(default_factory=SingleHopSpec)
    depth: int = 2
    min_count: float = 1.0
    strength: float | None = None
    type_strength: float | None = None
    backoff: str = "attended"
    discount: float | None = None
    order: int = 2
    triple_strength: float | None = None
    triple_type_strength: float | None = None
    triple_discount: float | None = None
    choose_single: bool = False
    row_counts: str = "data"

    def __post_init__(self) -> None:
        if self.row_counts not in ROW_COUNTS:
            raise ValueError(f"--conj-counts {self.row_counts}: expected one of {', '.join(ROW_COUNTS)}")
        for name, value in (("triple_type_strength", self.triple_type_strength),
                            ("triple_discount", self.triple_discount)):  # fmt: skip
            if value is not None and not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} {value}: expected a finite value >= 0")
        if self.triple_strength is not None and not self.triple_strength >= 0.0:
            raise ValueError(f"triple_strength {self.triple_strength}: expected a strength >= 0 (inf: order 2)")
        if self.order not in ORDERS:
            raise ValueError(
                f"--conj-order {self.order}: expected 2 (rows keyed by the attended and the current token) or 3 (and "
                "by the token before the attended one)"
            )
        if self.discount is not None and not (math.isfinite(self.discount) and self.discount >= 0.0):
            raise ValueError(f"--conj-discount {self.discount}: expected a finite discount >= 0")
        if self.backoff not in BACKOFFS:
            raise ValueError(f"--conj-backoff {self.backoff}: expected one of {', '.join(BACKOFFS)}")
        if int(self.depth) < 1:
            raise ValueError(f"--conj-depth {self.depth}: expected at least 1 recent position")
        if not (math.isfinite(self.min_count) and self.min_count >= 0.0):
            raise ValueError(f"--conj-min-count {self.min_count}: expected a finite count >= 0")
        if self.strength is not None and not self.strength >= 0.0:
            raise ValueError(f"--conj-strength {self.strength}: expected a strength >= 0 (inf: the single head)")
        if self.type_strength is not None and not (math.isfinite(self.type_strength) and self.type_strength >= 0.0):
            raise ValueError(f"--conj-type-strength {self.type_strength}: expected a finite strength >= 0")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "single": self.single.to_json(), "depth": int(self.depth),
                "min_count": float(self.min_count), "strength": self.strength,
                "type_strength": self.type_strength, "backoff": self.backoff,
                "discount": self.discount, "order": int(self.order), "triple_strength": self.triple_strength,
                "triple_type_strength": self.triple_type_strength,
                "triple_discount": self.triple_discount,
                "choose_single": bool(self.choose_single), "row_counts": self.row_counts}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConjSpec:
        def number(value: Any) -> float | None:
            return None if value is None else float(value)

        return cls(
            SingleHopSpec.from_json(dict(data["single"])), int(data.get("depth", 2)),
            float(data.get("min_count", 1.0)), number(data.get("strength")), number(data.get("type_strength")),
            str(data.get("backoff", "attended")), number(data.get("discount", 0.0)), int(data.get("order", 2)),
            number(data.get("triple_strength")), number(data.get("triple_type_strength")),
            number(data.get("triple_discount")), bool(data.get("choose_single", False)),
            # A spec recorded before the choice had the rows' counts from the responsibilities.
            str(data.get("row_counts", "responsibilities")),
        )  # fmt: skip

    def trainer(self, context: TrainerContext) -> ConjTrainer:
        single = (self.single if self.choose_single else fixed_single(self.single)).trainer(context)
        depth, n_pos = int(self.depth), context.shape[1]
        if depth > n_pos:
            raise ValueError(f"--conj-depth {depth}: expected at most the window N = {n_pos} (a row's positions)")
        return ConjTrainer(
            single,
            depth,
            self.min_count,
            self.strength,
            self.type_strength,
            self.backoff,
            self.discount,
            order=self.order,
            triple=(self.triple_strength, self.triple_type_strength, self.triple_discount),
            start=context.init_meta.get("hyperparameters"),
            row_counts=self.row_counts,
        )


# --------------------------------------------------------------------------------------------- the support


@dataclass(frozen=True)
class CellTally:
    """Weighted counts of the (attended, current, target) cells at the conjunction positions of some rows: cell
    keys ``(a * S + q) * T + t`` (int64, increasing) and their summed row weights. Additive (a linear merge)."""

    keys: np.ndarray
    counts: np.ndarray

    def __add__(self, other: CellTally) -> CellTally:
        if other.keys.size == 0:
            return self
        if self.keys.size == 0:
            return other
        return CellTally(*merge_tallies((self.keys, self.counts), (other.keys, other.counts)))

    @classmethod
    def sum_of(cls, values: list[CellTally]) -> CellTally:
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total


def cell_tally(num_symbols: int, num_targets: int, depth: int, blocks: Iterator[Block]) -> CellTally:
    """The cells of one partition's window rows (a pass's partition map): at each row's ``depth`` most recent
    positions, ``(token there, the row's last token, target)``, weighted (rows of weight 0 add nothing)."""
    total = CellTally(np.zeros(0, dtype=np.int64), np.zeros(0))
    for block in blocks:
        rows = block.rows
        weights = block.weights_or_ones()
        begin, end = np.asarray(rows.begin, dtype=np.int64), np.asarray(rows.end, dtype=np.int64)
        current = np.asarray(rows.tokens[end - 1], dtype=np.int64)
        target = np.asarray(rows.target, dtype=np.int64)
        keys, counts = [], []
        for r in range(depth):
            live = (end - 1 - r >= begin) & (weights > 0.0)
            attended = np.asarray(rows.tokens[(end - 1 - r)[live]], dtype=np.int64)
            keys.append((attended * num_symbols + current[live]) * num_targets + target[live])
            counts.append(weights[live])
        cells = np.concatenate(keys)
        if cells.size:
            total = total + CellTally(*tally_keys(cells, np.concatenate(counts)))
    return total


def triple_tally(num_symbols: int, num_targets: int, depth: int, blocks: Iterator[Block]) -> CellTally:
    """The triple cells of one partition's window rows: at each row's ``depth`` most recent positions that have a
    predecessor in the window, ``(token before it, token there, the row's last token, target)`` as the key
    ``((p * S + a) * S + q) * T + t``, weighted (rows of weight 0 add nothing)."""
    total = CellTally(np.zeros(0, dtype=np.int64), np.zeros(0))
    s = np.int64(num_symbols)
    for block in blocks:
        rows = block.rows
        weights = block.weights_or_ones()
        begin, end = np.asarray(rows.begin, dtype=np.int64), np.asarray(rows.end, dtype=np.int64)
        current = np.asarray(rows.tokens[end - 1], dtype=np.int64)
        target = np.asarray(rows.target, dtype=np.int64)
        keys, counts = [], []
        for r in range(depth):
            live = (end - 2 - r >= begin) & (weights > 0.0)
            at = (end - 1 - r)[live]
            attended = np.asarray(rows.tokens[at], dtype=np.int64)
            before = np.asarray(rows.tokens[at - 1], dtype=np.int64)
            keys.append(((before * s + attended) * s + current[live]) * num_targets + target[live])
            counts.append(weights[live])
        cells = np.concatenate(keys)
        if cells.size:
            total = total + CellTally(*tally_keys(cells, np.concatenate(counts)))
    return total


def support_of(tally: CellTally, num_targets: int, min_count: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pair_keys (P,), indptr (P + 1,), targets (M,))`` of the pairs occurring at least ``min_count`` times
    (weighted) in ``tally``, each with every target it was seen with."""
    pair_keys, indptr, kept_cells = _kept_cells(tally, num_targets, min_count)
    return pair_keys, indptr, (tally.keys[kept_cells] % num_targets).astype(np.int32)


def support_counts(tally: CellTally, num_targets: int, min_count: float) -> np.ndarray:
    """(M,) the weighted count of each cell of :func:`support_of`'s support in ``tally``, in its order: the rows'
    counts when they are counted from the data (``row_counts="data"``)."""
    return np.ascontiguousarray(tally.counts[_kept_cells(tally, num_targets, min_count)[2]], dtype=np.float64)


def _kept_cells(tally: CellTally, num_targets: int, min_count: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pair_keys (P,), indptr (P + 1,), kept (C,) bool)``: the pairs seen at least ``min_count`` times and which
    of the tally's cells are theirs."""
    pairs = tally.keys // num_targets
    starts = np.flatnonzero(np.r_[True, pairs[1:] != pairs[:-1]]) if pairs.size else np.zeros(0, dtype=np.int64)
    totals = np.add.reduceat(tally.counts, starts) if pairs.size else np.zeros(0)
    lengths = np.diff(np.r_[starts, pairs.size])
    kept = totals >= min_count
    pair_keys = pairs[starts][kept]
    indptr = np.zeros(pair_keys.size + 1, dtype=np.int64)
    np.cumsum(lengths[kept], out=indptr[1:])
    return pair_keys, indptr, np.repeat(kept, lengths)


# --------------------------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class ConjStatistics:
    """Additive statistics of a conjunction head: the single head's (every position's responsibility),
    ``cell_counts`` (M,), the responsibility each stored cell received, and ``triple_counts`` (M3,) each stored
    triple cell's (order 3; empty at order 2); both empty for rows counted from the data, which keep their counts."""

    stats: SufficientStatistics
    cell_counts: np.ndarray
    triple_counts: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def log_lik(self) -> float:
        return float(self.stats.log_lik)

    @property
    def n_obs(self) -> float:
        return float(self.stats.n_obs)

    def copy(self) -> ConjStatistics:
        return ConjStatistics(self.stats.copy(), self.cell_counts.copy(), self.triple_counts.copy())

    def add(self, other: ConjStatistics) -> ConjStatistics:
        """``self + other`` into this value's arrays (the caller owns them: see :meth:`copy`)."""
        np.add(self.cell_counts, other.cell_counts, out=self.cell_counts)
        np.add(self.triple_counts, other.triple_counts, out=self.triple_counts)
        return ConjStatistics(self.stats.add(other.stats), self.cell_counts, self.triple_counts)

    def __add__(self, other: ConjStatistics) -> ConjStatistics:
        return self.copy().add(other)

    @classmethod
    def sum_of(cls, values: list[ConjStatistics]) -> ConjStatistics:
        total = values[0].copy()
        for value in values[1:]:
            total = total.add(value)
        return total


def _weighted(rows: Any, weights: np.ndarray | None) -> Any:
    return rows if weights is rows.weight else rows._replace(weight=weights)


def conj_statistics(head: ConjHead, blocks: Iterable[Block], leave_one_out: bool = False) -> ConjStatistics:
    """The conjunction E-step of ``blocks`` (token windows, in row order) under ``head``; with ``leave_one_out``,
    each row explained by the pair and triple rows without its own counts (rows counted from these rows' data), and
    no cell's responsibility summed (the statistics' ``cell_counts`` and ``triple_counts`` empty)."""
    s, n, d, t = head.shape
    table = head.single.emission_table
    support = table.support if isinstance(table, SparseEmission) else None
    arrays = StatisticArrays.zeros(s, n, d, t, support)
    # Rows counted from the data keep their counts: no cell's responsibility is summed (nor sent up the tree).
    cells = 0 if leave_one_out else head.num_cells
    triple_cells = 0 if leave_one_out or head.triples is None else head.triples.targets.size
    extra = ConjArrays.zeros(n, cells, triple_cells)
    params = head.parameters
    held_out = head.leave_one_out if leave_one_out else None
    for block in blocks:
        rows = _weighted(block.rows, block.weights)
        head.check_rows(rows)
        conj_estep(rows, params, arrays, extra, held_out)
    if support is None:
        counts: Any = DenseEmissionCounts(arrays.emission_count_ts)
    else:
        assert arrays.pair_counts is not None
        counts = SparseEmissionCounts(arrays.pair_counts, None, num_symbols=s, num_targets=t)
    query_sq, n_obs, log_lik = (float(v) for v in arrays.scalars)
    stats = SufficientStatistics(
        arrays.key_sum, arrays.key_mass, counts, extra.recency_mass[::-1].copy(), query_sq, n_obs, log_lik
    )
    return ConjStatistics(stats, extra.cell_counts, extra.triple_counts)


# --------------------------------------------------------------------------------------------- the M-step


@dataclass(frozen=True)
class ConjChoice:
    """The pair rows' prior of an M-step: ``beta`` (``strength``), ``gamma`` (``type_strength``) and the discount."""

    strength: float
    type_strength: float
    discount: float = 0.0
    triple_strength: float = math.inf
    triple_type_strength: float = 0.0
    triple_discount: float = 0.0
    #: The single head's hyperparameters when the fit chooses them (``None``: its M-step's defaults, all given).
    single: Hyperparameters | None = None

    @property
    def pair(self) -> tuple[float, float, float]:
        return (self.strength, self.type_strength, self.discount)

    @property
    def triple(self) -> tuple[float, float, float]:
        return (self.triple_strength, self.triple_type_strength, self.triple_discount)

    def to_json(self) -> dict[str, Any]:
        data = {"conj_strength": float(self.strength), "conj_type_strength": float(self.type_strength),
                "conj_discount": float(self.discount)}  # fmt: skip
        if math.isfinite(self.triple_strength):  # order 3 (an order-2 choice keeps its three keys)
            data.update(conj_triple_strength=float(self.triple_strength),
                        conj_triple_type_strength=float(self.triple_type_strength),
                        conj_triple_discount=float(self.triple_discount))  # fmt: skip
        if self.single is not None:
            data.update(self.single.to_json())
        return data

    def describe(self) -> str:
        line = "" if self.single is None else f"{self.single.describe()}; "
        line += f"pair strength {self.strength:g} + {self.type_strength:g} x types, discount {self.discount:g}"
        if math.isfinite(self.triple_strength):
            line += (
                f"; triple strength {self.triple_strength:g} + {self.triple_type_strength:g} x types, discount "
                f"{self.triple_discount:g}"
            )
        return line


@dataclass(frozen=True)
class ConjGrid(Grid):
    """The held-out pass of a conjunction M-step: the new head at each (beta, gamma, D) of ``points`` (at order 3,
    each (beta, gamma, D, beta3, gamma3, D3)); with ``singles``, point ``k`` over the single head of the M-step
    ``single`` under ``singles[k]`` (made where the grid is scored), else over ``head``'s own."""

    head: ConjHead
    points: tuple[tuple[float, ...], ...]
    single: MStepCandidates | None = None
    singles: tuple[Hyperparameters, ...] = ()

    @property
    def columns(self) -> Columns:
        return self.head.columns

    def groups(self) -> list[tuple[Hyperparameters | None, np.ndarray]]:
        """The points by the single head they are scored over, in order of first appearance: ``(its
        hyperparameters, or None: the head's own; the points' indices)``."""
        if not self.singles:
            return [(None, np.arange(len(self.points)))]
        order: dict[Hyperparameters, list[int]] = {}
        for k, hp in enumerate(self.singles):
            order.setdefault(hp, []).append(k)
        return [(hp, np.array(ks)) for hp, ks in order.items()]

    def score(self, blocks: Iterable[Block]) -> PointTotals:
        """Every point in one pass over the blocks (:func:`conj_score_grid`, once per single head)."""
        triples = self.head.triples
        points = np.array(self.points, dtype=np.float64).reshape(-1, 3 if triples is None else 6)
        groups = self.groups()
        if self.single is None:
            heads = [self.head for _ in groups]
        else:
            single = self.single
            heads = [self.head if hp is None else self.head.with_single(single.model(hp)) for hp, _ in groups]
        totals = np.zeros((points.shape[0], 3))
        for block in blocks:
            rows = _weighted(block.rows, block.weights)
            self.head.check_rows(rows)
            for head, (_, at) in zip(heads, groups, strict=True):
                totals[at] += conj_score_grid(rows, head.parameters, self.head.counts, points[at],
                                              None if triples is None else triples.counts)  # fmt: skip
        return PointTotals(tuple(ScoreTotals(float(w), float(ll), float(tlp)) for ll, tlp, w in totals))

    def nbytes(self) -> int:
        extra = 0 if self.single is None else int(self.single.emission_count.nbytes)
        return self.head.nbytes() + extra


@dataclass(frozen=True)
class ConjCandidates(Candidates):
    """A conjunction M-step: the single head's M-step and the cell counts, one head per (beta, gamma, D) of
    ``points``; at order 3, per (beta3, gamma3, D3) of ``triple_points`` too, searched a coordinate at a time: each
    grid is the pair points under the last choice's triple prior beside the triple points under its pair prior
    (:data:`START_POINT` before any choice), so successive M-steps climb both.

    With ``single`` (the single head's candidates, when it has open choices) the single head's hyperparameters are
    a third coordinate: those points are scored over the single head of the last choice (before any, ``centre``),
    and beside them the last choice's pair (and triple) point over each single head one step away from it on one
    of its searched axes (:func:`~dist_respattn.model.fitting.selection.coordinate_steps`; each such head costs
    one more scoring of the held-out rows).
    """

    head: ConjHead
    points: tuple[tuple[float, float, float], ...]
    triple_points: tuple[tuple[float, float, float], ...] = ()
    single: SingleHopCandidates | None = None
    centre: Hyperparameters | None = None

    def default(self) -> ConjChoice:
        if not self.triple_points:
            return ConjChoice(*self.points[0])
        return ConjChoice(*self.points[0], *self.triple_points[0])

    def grid(self, around: Any) -> ConjGrid:
        start = START_POINT if START_POINT in self.points else self.points[0]
        points: list[tuple[float, ...]]
        if not self.triple_points:
            points = list(self.points)
            pair: tuple[float, ...] = around.pair if isinstance(around, ConjChoice) else start
        else:
            if isinstance(around, ConjChoice) and math.isfinite(around.triple_strength):
                first, triple = around.pair, around.triple
            else:
                first = start
                triple = START_POINT if START_POINT in self.triple_points else self.triple_points[0]
            points = [(*p, *triple) for p in self.points]
            points += [(*first, *u) for u in self.triple_points if (*first, *u) not in points]
            pair = (*first, *triple)
        if self.single is None or not self.single.searches():
            return ConjGrid(self.head, tuple(points))
        candidates = self.single.candidates
        if isinstance(around, ConjChoice) and around.single is not None:
            current = around.single
        elif isinstance(around, Hyperparameters):  # the single head's own choice at the start
            current = as_hyperparameters(around, candidates.defaults)
        else:
            current = self.centre or candidates.defaults
        search = self.single.search or HyperparameterSearch(None, None, None)
        steps = coordinate_steps(search, current, candidates.query_scale)
        singles = (current,) * len(points) + tuple(steps)
        return ConjGrid(self.head, (*points, *((pair,) * len(steps))), candidates, singles)

    def choose(self, grid: Grid, scores: Any) -> tuple[ConjChoice, dict[str, float] | None]:
        if scores is None or scores.weight <= 0.0:
            return self.default(), None
        values = [totals.target_log_prob for totals in scores.totals]
        best = int(np.argmax(values))  # the first of equals
        metrics = scores.totals[best].metrics()
        assert isinstance(grid, ConjGrid)
        single = grid.singles[best] if grid.singles else None
        point = grid.points[best]
        triple = point[3:6] if len(point) == 6 else (math.inf, 0.0, 0.0)
        return ConjChoice(point[0], point[1], point[2], *triple, single), {
            name: metrics[name] for name in ("mean_log_likelihood", "target_log_prob", "perplexity")
        }

    def model(self, choice: Any) -> ConjHead:
        head = self.head
        if choice.single is not None and self.single is not None:
            head = head.with_single(self.single.model(choice.single))
        triples = head.triples
        if triples is not None:
            triples = triples.with_counts(triples.counts, *choice.triple)
        return head.with_counts(head.counts, choice.strength, choice.type_strength, choice.discount,
                                triples)  # fmt: skip

    def searches(self) -> bool:
        single = self.single is not None and self.single.searches()
        return len(self.points) > 1 or len(self.triple_points) > 1 or single


class ConjTrainer(Trainer):
    """A conjunction fit: the single-hop trainer (its estimator, prior, layout and start), the depth, the support's
    bound, the strengths (fixed, or the grid chosen on held-out rows) and the order (3: triple rows too, their
    strengths and discount always chosen on held-out rows)."""

    def __init__(
        self,
        single: SingleHopTrainer,
        depth: int,
        min_count: float,
        strength: float | None,
        type_strength: float | None,
        backoff: str = "attended",
        discount: float | None = 0.0,
        *,
        order: int = 2,
        triple: tuple[float | None, float | None, float | None] = (None, None, None),
        start: dict[str, Any] | None = None,
        row_counts: str = "data",
    ) -> None:
        self.single = single
        self.row_counts = row_counts
        #: The single head's strengths the fit starts from (its start fit's choice), where its search is centred
        #: before any choice.
        self.start = {k: float(v) for k, v in (start or {}).items()
                      if k in ("emission_strength", "type_strength") and v is not None}  # fmt: skip
        self.order = int(order)
        self.backoff = backoff
        self.depth = int(depth)
        self.min_count = float(min_count)
        strengths = STRENGTHS if strength is None else (float(strength),)
        types = TYPE_STRENGTHS if type_strength is None else (float(type_strength),)
        discounts = DISCOUNTS if discount is None else (float(discount),)
        self.points = tuple((b, g, d) for b in strengths for g in types for d in discounts)
        self.triple_points: tuple[tuple[float, float, float], ...] = ()
        if self.order == 3:
            b3, g3, d3 = ((float(v),) if v is not None else grid for v, grid in
                          zip(triple, (STRENGTHS, TYPE_STRENGTHS, DISCOUNTS), strict=True))  # fmt: skip
            self.triple_points = tuple((b, g, d) for b in b3 for g in g3 for d in d3)

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.single.shape

    def searches(self) -> bool:
        return len(self.points) > 1 or len(self.triple_points) > 1 or self.single.searches()

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if isinstance(head, ResponsibilityAttentionDistribution) and not resumed:
            self.single.check_start(head, resumed=False)
            return
        if not isinstance(head, ConjHead):
            raise ValueError(
                f"a conjunction fit starts from a conjunction head or a single-hop one, not a {head.kind} one"
            )
        if head.backoff != self.backoff:
            raise ValueError(
                f"the starting model's pair rows lean toward the {head.backoff} token's row but the fit asks for the "
                f"{self.backoff} one's: give --conj-backoff {head.backoff}"
            )
        if head.order != self.order:
            raise ValueError(
                f"the starting model is a conjunction head of order {head.order} but the fit asks for order "
                f"{self.order}: give --conj-order {head.order}"
            )
        if head.depth != self.depth:
            raise ValueError(
                f"the starting model reads pair rows at {head.depth} position(s) but the fit asks for {self.depth}: "
                f"give --conj-depth {head.depth}"
            )
        self.single.check_start(head.single, resumed=resumed)

    def start_head(self, single: ResponsibilityAttentionDistribution, passes: Passes) -> ConjHead:
        """The head a fit starts from: ``single`` and the pairs the training rows hold, with their counts in the
        rows (``row_counts="data"``) or every count 0 (so its rows are ``B``'s: the first E-step is the single
        head's)."""
        s, t = self.shape[0], self.shape[3]
        tally = passes.run(
            BlockPass(
                "conj-cells", "finding the conjunctions", functools.partial(cell_tally, s, t, self.depth), self.columns
            )
        )
        pair_keys, indptr, targets = support_of(tally, t, self.min_count)
        counts = support_counts(tally, t, self.min_count) if self.row_counts == "data" else np.zeros(targets.size)
        passes.say(
            f"pair rows over the {self.depth} most recent position(s): {pair_keys.size:,} (attended, current) pairs "
            f"of {tally.keys.size:,} cells seen, {targets.size:,} cells stored (pairs seen at least "
            f"{self.min_count:g} times); {ROW_COUNT_SAYS[self.row_counts]}"
        )
        b, g, d = self.points[0]
        triples = None
        if self.order == 3:
            if float(s) ** 3 * t >= 2.0**63:
                raise ValueError(f"--conj-order 3: S ** 3 * T = {s} ** 3 * {t} overflows the 64-bit cell keys")
            tally3 = passes.run(
                BlockPass(
                    "conj-triples",
                    "finding the triples",
                    functools.partial(triple_tally, s, t, self.depth),
                    self.columns,
                )
            )
            keys3, indptr3, targets3 = support_of(tally3, t, self.min_count)
            data = self.row_counts == "data"
            counts3 = support_counts(tally3, t, self.min_count) if data else np.zeros(targets3.size)
            passes.say(
                f"triple rows over the {self.depth} most recent position(s): {keys3.size:,} (previous, attended, "
                f"current) triples of {tally3.keys.size:,} cells seen, {targets3.size:,} cells stored"
            )
            triples = TripleRows(keys3, indptr3, targets3, counts3, *self.triple_points[0])
        return ConjHead(single, self.depth, pair_keys, indptr, targets, counts, b, g,
                        backoff=self.backoff, discount=d, triples=triples)  # fmt: skip

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if isinstance(start, ConjHead):
            single = self.single.prepare(start.single, resumed=resumed, passes=passes)
            assert isinstance(single, ResponsibilityAttentionDistribution)
            if not resumed and self.row_counts == "data":
                # Another fit's rows (responsibilities, or other rows' data): counted again from these rows.
                return self.start_head(single, passes)
            return ConjHead(single, start.depth, start.pair_keys, start.indptr, start.targets, start.counts,
                            start.strength, start.type_strength, backoff=start.backoff,
                            discount=start.discount, triples=start.triples)  # fmt: skip
        single = self.single.prepare(start, resumed=False, passes=passes)
        assert isinstance(single, ResponsibilityAttentionDistribution)
        return self.start_head(single, passes)

    def statistics(self, head: Head, blocks: Iterator[Block]) -> ConjStatistics:
        """The conjunction E-step of one partition's blocks, in row order (:func:`conj_statistics`): rows counted
        from the data explain each training row without its own counts."""
        assert isinstance(head, ConjHead)
        return conj_statistics(head, blocks, leave_one_out=self.row_counts == "data")

    def m_step(self, statistics: Any, previous: Head | None) -> ConjCandidates:
        assert isinstance(statistics, ConjStatistics) and isinstance(previous, ConjHead)
        candidates = self.single.m_step(statistics.stats, previous.single)
        single = candidates.model(candidates.default())
        b, g, d = self.points[0]
        # Rows counted from the data keep their counts; the others take the responsibilities the cells received.
        fitted = self.row_counts == "responsibilities"
        triples = previous.triples
        if triples is not None:
            counts3 = statistics.triple_counts if fitted else triples.counts
            triples = triples.with_counts(counts3, *self.triple_points[0])
        head = ConjHead(single, previous.depth, previous.pair_keys, previous.indptr, previous.targets,
                        statistics.cell_counts if fitted else previous.counts, b, g, backoff=previous.backoff,
                        discount=d, triples=triples)  # fmt: skip
        if not candidates.searches():
            return ConjCandidates(head, self.points, self.triple_points)
        defaults = candidates.default()
        # Before any choice: the gate variance the head runs with now, the strengths of the fit it started from.
        centre = Hyperparameters(
            previous.single.sigma2,
            self.start.get("emission_strength", defaults.emission_strength),
            self.start.get("type_strength", defaults.type_strength),
        )
        return ConjCandidates(head, self.points, self.triple_points, candidates, centre)

    def choice_from_json(self, data: dict[str, Any]) -> ConjChoice | Hyperparameters | None:
        """A recorded choice: the pair rows' (and the single head's, when chosen; a choice recorded before the
        single head's were has none), or the single head's alone (a start's)."""
        single = None
        if all(k in data for k in ("sigma2", "emission_strength", "type_strength")):
            single = Hyperparameters.from_json(data)
        if "conj_strength" not in data:
            return single
        return ConjChoice(
            float(data["conj_strength"]),
            float(data.get("conj_type_strength", 0.0)),
            float(data.get("conj_discount", 0.0)),
            float(data.get("conj_triple_strength", math.inf)),
            float(data.get("conj_triple_type_strength", 0.0)),
            float(data.get("conj_triple_discount", 0.0)),
            single,
        )

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        assert isinstance(head, ConjHead)
        stats = statistics.stats if isinstance(statistics, ConjStatistics) else None
        return self.single.warnings(head.single, stats)

    def checkpoint_extras(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return self.single.checkpoint_extras()

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> MemoryEstimate:
        return self.single.memory(
            block_rows=block_rows, row_bytes=row_bytes, threads_per_worker=threads_per_worker, fan_in=fan_in
        )
