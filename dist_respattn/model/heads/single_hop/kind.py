"""The single-hop head as a kind of the head protocol: its spec, its trainer, its M-step's candidates and grid.

The math is in the modules beside this one (the distribution, the accumulator, the estimator); this module only
says how a fit of it runs through :mod:`dist_respattn.model.heads.base`: the start pass (statistics of uniform or
random responsibilities, with the (previous symbol, target) pairs its emission prior is made from, and a sparse
emission's support), the E-step over a partition's blocks (the per-position kernel, or the histogram kernel over
token windows for a tied prior), and the M-step whose gate variance and prior strengths are chosen on held-out rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import (
    DenseEmission,
    PairSupport,
    SparseEmission,
    SparseEmissionCounts,
    choose_layout,
)
from dist_respattn.model.emission.pairs import PairCounts, PairTally, pairs_of_blocks
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.em import START_KINDS
from dist_respattn.model.fitting.selection import (
    DEFAULT_SEARCH,
    GRID_ROW_SLOTS,
    GridRowCache,
    GridRows,
    GridTable,
    GridTotals,
    Hyperparameters,
    HyperparameterSearch,
    PlannedRows,
    plan_grid_rows,
    score_planned,
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
    ShardedMStep,
    ShardedStart,
    Trainer,
    TrainerContext,
)
from dist_respattn.model.heads.single_hop.accumulator import (
    ResponsibilityAttentionAccumulatorFactory,
    SufficientStatistics,
)
from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.estimator import MStepCandidates, ResponsibilityAttentionEstimator
from dist_respattn.model.kernels.histogram import grid_windows
from dist_respattn.model.memory import MemoryEstimate, estimate_single_hop_memory
from dist_respattn.model.rows import WindowRows

__all__ = [
    "SCORE_ONLY",
    "START_KINDS",
    "EStepTrainer",
    "SingleHopCandidates",
    "SingleHopGrid",
    "SingleHopSpec",
    "SingleHopTrainer",
    "StartValue",
    "fixed_single",
]

#: The grid of a fit that chooses nothing: one point, the fixed hyperparameters (the held-out pass only scores).
SCORE_ONLY = HyperparameterSearch(None, None, None)


@dataclass(frozen=True)
class SingleHopSpec(HeadSpec):
    """The settings of a single-hop fit that fix its result (the fit options of :class:`FitSettings` that are
    about the head; see there for each).

    ``position_buckets``: K recency buckets the position prior is tied over (read with the window N of the
    store), or ``None`` for a free prior.
    """

    kind: ClassVar[str] = "single_hop"

    init: str = "uniform"
    seed: int = 0
    estimate_sigma2: bool = False
    sigma2: float | None = None
    min_sigma2: float = 1e-6
    emission_prior: str = "continuation"
    emission_smoothing: float | None = None
    emission_strength: float | None = None
    type_strength: float | None = None
    pseudo_count: float | None = None
    emission_layout: str = "auto"
    position_buckets: int | None = None

    def __post_init__(self) -> None:
        if self.init not in START_KINDS:
            raise ValueError(f"init = {self.init!r}: expected one of {', '.join(START_KINDS)}")
        choose_layout(1, 1, self.emission_layout)  # checks the name

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SingleHopSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def legacy_emission(self) -> bool:
        """Whether the emission is the reference library's additive smoothing (no prior)."""
        return self.emission_smoothing is not None

    def buckets(self, context_length: int) -> PositionBuckets | None:
        """The recency buckets of a fit with window N (``None``: a free prior, per-position kernels)."""
        if self.position_buckets is None:
            return None
        return PositionBuckets.geometric(context_length, self.position_buckets)

    def search(self) -> HyperparameterSearch | None:
        """What is chosen on held-out rows after every M-step (``None``: nothing)."""
        prior_searched = not self.legacy_emission
        search = HyperparameterSearch(
            sigma2_scales=DEFAULT_SEARCH.sigma2_scales if self.sigma2 is None and not self.estimate_sigma2 else None,
            emission_strengths=DEFAULT_SEARCH.emission_strengths
            if prior_searched and self.emission_strength is None
            else None,
            type_strengths=DEFAULT_SEARCH.type_strengths
            if prior_searched and self.type_strength is None and self.emission_prior != "uniform"
            else None,
        )
        return search if search.searches_anything else None

    def layout(self, shape: tuple[int, int, int, int]) -> str:
        """The emission layout of a fit on rows of shape ``(S, N, D, T)``."""
        return choose_layout(shape[0], shape[3], self.emission_layout)

    def estimator(self, shape: tuple[int, int, int, int]) -> ResponsibilityAttentionEstimator:
        """The M-step for rows of shape ``(S, N, D, T)`` (its emission prior still to be made from the rows' pairs)."""
        if self.legacy_emission:
            prior_options: dict[str, Any] = {"emission_smoothing": self.emission_smoothing}
        else:
            no_types = self.emission_prior == "uniform"
            prior_options = {
                "emission_prior": self.emission_prior,
                "emission_strength": 1.0 if self.emission_strength is None else self.emission_strength,
                "type_strength": (0.0 if no_types else 1.0) if self.type_strength is None else self.type_strength,
            }
        s, n, d, t = shape
        return ResponsibilityAttentionEstimator(
            s,
            n,
            d,
            t,
            sigma2=1.0 if self.sigma2 is None else self.sigma2,
            estimate_sigma2=self.estimate_sigma2,
            min_sigma2=self.min_sigma2,
            pseudo_count=self.pseudo_count,
            search=self.search(),
            buckets=self.buckets(n),
            **prior_options,
        )

    def trainer(self, context: TrainerContext) -> SingleHopTrainer:
        estimator = self.estimator(context.shape)
        saved = (context.saved_meta.get("emission_prior") or {}).get("kind")
        if estimator.needs_pairs and saved:
            # A resumed fit's own prior (made from its training rows once): no pass makes it again.
            try:
                prior = EmissionPrior.from_arrays(context.saved_arrays, str(saved))
            except KeyError:  # a checkpoint written before priors were kept: the pairs pass makes it
                prior = None
            if prior is not None:
                estimator = estimator.resolved(prior)
        return SingleHopTrainer(estimator, self.layout(context.shape), self.init, self.seed)


# --------------------------------------------------------------------------------------------- partition maps


@dataclass(frozen=True)
class StartValue:
    """A start pass's value: the statistics of the first responsibilities and, when asked for, the pairs."""

    stats: SufficientStatistics
    pairs: PairCounts | None

    def __add__(self, other: StartValue) -> StartValue:
        return StartValue.sum_of([self, other])

    @classmethod
    def sum_of(cls, values: Sequence[StartValue]) -> StartValue:
        stats = type(values[0].stats).sum_of([value.stats for value in values])
        pairs = values[0].pairs
        for value in values[1:]:
            pairs = None if pairs is None or value.pairs is None else pairs + value.pairs
        return StartValue(stats, pairs)


def fixed_single(spec: SingleHopSpec) -> SingleHopSpec:
    """The single-hop settings with every open choice fixed at its value (1 when not given, no type strength for a
    uniform prior): for a kind built on a single head that chooses nothing on held-out rows itself (the conjunction
    kind, chains of hops), started from a fitted single head's choices."""
    no_types = spec.emission_prior == "uniform"
    return dataclasses.replace(
        spec,
        sigma2=1.0 if spec.sigma2 is None and not spec.estimate_sigma2 else spec.sigma2,
        emission_strength=spec.emission_strength if spec.emission_strength is not None or spec.legacy_emission else 1.0,
        type_strength=spec.type_strength
        if spec.type_strength is not None or spec.legacy_emission
        else (0.0 if no_types else 1.0),
    )


def _prior_text(buckets: PositionBuckets | None) -> str:
    return "free (per-position)" if buckets is None else f"tied over {buckets.describe()}"


def _weighted(rows: Any, weights: np.ndarray | None) -> Any:
    return rows if weights is rows.weight else rows._replace(weight=weights)


def start_partition(
    factory: ResponsibilityAttentionAccumulatorFactory,
    start: str,
    seed: int | np.random.Generator,
    with_pairs: bool,
    buckets: PositionBuckets | None,
    blocks: Iterator[Block],
) -> StartValue:
    """Statistics of one partition's blocks under the first responsibilities, and their pairs when asked.

    A sparse fit's statistics count the pairs the rows hold and carry them as their support. ``start`` is
    ``"uniform"`` (1/N each) or ``"random"`` (drawn from ``(seed, partition)``): either way the first model is the
    same on any cluster. With ``buckets`` (a tied prior) the rows are token windows, uniform over the positions
    each one has.
    """
    accumulator = factory.make()
    s, t = factory.num_symbols, factory.num_targets
    pairs = PairTally(s, t) if with_pairs else None
    rng: np.random.Generator | None = None
    for block in blocks:
        rows = block.rows
        if buckets is not None:
            accumulator.seq_initialize_windows(_weighted(rows, block.weights), buckets)
        elif start == "uniform" and isinstance(rows, WindowRows):
            accumulator.seq_initialize_uniform_windows(_weighted(rows, block.weights))
        elif start == "uniform":
            accumulator.seq_initialize_uniform(rows.encoded, block.weights, checked=rows.checked)
        else:
            if rng is None:
                rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng([seed, block.partition])
            accumulator.seq_initialize(rows.encoded, block.weights, rng, checked=rows.checked)
        if pairs is not None:
            pairs.add(block)
    return StartValue(accumulator.value(copy=False), None if pairs is None else pairs.value())


# --------------------------------------------------------------------------------------------- the M-step


@dataclass(frozen=True)
class SingleHopGrid(Grid):
    """The held-out pass of a single-hop M-step: its :class:`GridTable` (every candidate scored in one pass).

    ``candidates``: the M-step's candidates the table was made from (``None``: the grid makes no heads). They hold
    the table's own arrays (its keys, counts, row totals and prior), pickled once with it, and the position prior:
    the grid adds a few kB and makes the chosen head where it was scored (:meth:`model`).
    """

    table: GridTable
    candidates: MStepCandidates | None = field(default=None, compare=False, repr=False)

    @property
    def columns(self) -> Columns:
        return Columns(windows=self.table.buckets is not None)

    def nbytes(self) -> int:
        """Its counts (the M-step's, either layout) dominate."""
        return int(self.table.counts.nbytes)

    def score(self, blocks: Iterable[Block]) -> GridTotals:
        return self.score_keeping(blocks, 0)[0]

    def score_keeping(self, blocks: Iterable[Block], budget: int) -> tuple[GridTotals, GridRows | None]:
        """The totals, and the rows planned block by block (:class:`GridRows`: their windows, queries and pairs
        with the support, what the next M-step's grid reads again) when they hold at most ``budget`` bytes."""
        table = self.table
        totals = GridTotals.zeros(table.shape)
        # The rows remembered from one block to the next (repeated rows cost their additions only).
        remembered: GridRowCache | None = None
        planned: list[PlannedRows] | None = [] if table.buckets is None else None
        size = 0
        for block in blocks:
            if table.buckets is not None:
                totals = totals + grid_windows(table, _weighted(block.rows, block.weights))
                continue
            x = block.rows.encoded
            if remembered is None:
                remembered = GridRowCache(table, x[1].shape[1], x[0].shape[1])
            rows = plan_grid_rows(table, x, block.weights, checked=block.rows.checked, rows=remembered)
            totals = totals + score_planned(table, rows, remembered)
            if planned is not None:
                size += rows.nbytes
                if size <= budget:
                    planned.append(rows)
                else:
                    planned = None  # more than the budget: scored, not kept
        if planned is None:
            return totals, None
        return totals, GridRows(tuple(planned), table, GRID_ROW_SLOTS)

    def score_kept(self, kept: Any) -> GridTotals | None:
        if not isinstance(kept, GridRows) or not kept.serves(self.table):
            return None
        return kept.score(self.table)

    @property
    def makes_heads(self) -> bool:
        return self.candidates is not None

    def model(self, choice: Any) -> ResponsibilityAttentionDistribution:
        """The head under ``choice``: :meth:`MStepCandidates.model`, as the driver makes it."""
        if self.candidates is None:
            raise NotImplementedError("this grid was made without its candidates: it makes no heads")
        return self.candidates.model(choice)


@dataclass(frozen=True)
class SingleHopCandidates(Candidates):
    """A single-hop M-step's candidates: one head per (gate variance, prior strengths) of the estimator's search."""

    candidates: MStepCandidates
    search: HyperparameterSearch | None

    def default(self) -> Hyperparameters:
        return self.candidates.defaults

    def grid(self, around: Any) -> SingleHopGrid:
        search = self.search or SCORE_ONLY
        if around is not None:
            search = search.around(around, self.candidates.query_scale)
        return SingleHopGrid(self.candidates.grid_table(search), self.candidates)

    def choose(self, grid: Grid, scores: Any) -> tuple[Hyperparameters, dict[str, float] | None]:
        assert isinstance(grid, SingleHopGrid)
        selection = self.candidates.select(grid.table, scores)
        return selection.hyperparameters, selection.heldout

    def model(self, choice: Any) -> ResponsibilityAttentionDistribution:
        return self.candidates.model(choice)

    def searches(self) -> bool:
        return self.search is not None


# --------------------------------------------------------------------------------------------- the trainer


class SingleHopTrainer(Trainer):
    """A single-hop fit: the estimator (with its emission prior once made), the emission layout and the start."""

    def __init__(
        self,
        estimator: ResponsibilityAttentionEstimator,
        layout: str,
        start: str,
        seed: int | np.random.Generator,
        *,
        backend: str = "numba",
    ) -> None:
        self.estimator = estimator
        self.layout = layout
        self.start = start
        # An int seeds each partition's draws by (seed, partition); a generator (in process) is drawn from as is.
        self.seed = seed
        self.factory = estimator.accumulator_factory(backend=backend, layout=layout)  # type: ignore[arg-type]
        #: A sparse fit's support, once the start pass (or the support pass of a warm start) found it (on the driver:
        #: a sharded start leaves it on the workers, its size alone in :attr:`num_pairs`).
        self.support: PairSupport | None = None
        #: The number of pairs of a sparse fit's support, once found.
        self.num_pairs: int | None = None
        #: A tied prior's recency buckets (``None``: a free prior). Kept apart from the estimator, which is not
        #: pickled: a worker's E-step task reads its blocks' columns from them.
        self.buckets: PositionBuckets | None = estimator.buckets

    @property
    def columns(self) -> Columns:
        """The E-step reads token windows: a tied prior's histogram kernel, or a free prior's compiled kernel reading a
        token stream's rows where they lie and each query from its embedding table by id (no (n, D) copy a block);
        the NumPy backend reads encoded rows."""
        return Columns(windows=self.buckets is not None or self.factory.backend == "numba")

    @property
    def start_columns(self) -> Columns:
        """What the passes before iteration 1 read: token windows for a tied prior or a uniform start (whose kernel
        reads a token stream's rows where they lie, each query from its embedding table by id), else encoded rows."""
        return Columns(windows=self.buckets is not None or self.start == "uniform")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        e = self.estimator
        return (e.num_symbols, e.context_length, e.query_dim, e.num_targets)

    @property
    def prior(self) -> EmissionPrior | None:
        """The emission prior in use (once made from the training rows)."""
        prior = self.estimator.emission_prior
        return prior if isinstance(prior, EmissionPrior) else None

    def __getstate__(self) -> dict[str, Any]:
        # The workers need the factory and the start only: the estimator's prior is an (S,)/(T,) table set the
        # driver alone uses.
        return {"factory": self.factory, "start": self.start, "seed": self.seed, "estimator": None,
                "layout": self.layout, "support": None, "num_pairs": None, "buckets": self.buckets}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def searches(self) -> bool:
        return self.estimator.search is not None

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if not isinstance(head, ResponsibilityAttentionDistribution):
            raise ValueError(f"a single-hop fit starts from a single-hop head, not a {head.kind} one")
        if head.buckets != self.buckets:
            raise ValueError(
                f"the starting model's position prior is {_prior_text(head.buckets)} but the fit asks for "
                f"{_prior_text(self.buckets)}: give --position-buckets to match it, or start from the data"
            )

    # -- the passes before iteration 1 ---------------------------------------------------------------------------

    def _resolve_prior(self, pairs: PairCounts) -> None:
        kind = self.estimator.emission_prior
        assert isinstance(kind, str)
        self.estimator = self.estimator.resolved(EmissionPrior.from_pairs(pairs, kind))

    def _found_support(self, stats: SufficientStatistics, passes: Passes) -> PairSupport | None:
        counts = stats.emission_count
        if not isinstance(counts, SparseEmissionCounts) or counts.support is None:
            return None
        self.support = counts.support
        self.found_pairs(counts.support.num_pairs, passes)
        return counts.support

    def found_pairs(self, num_pairs: int, passes: Passes) -> None:
        """Say how many pairs a sparse fit's support holds, and check the memory plan again with them."""
        self.num_pairs = num_pairs
        s, t = self.shape[0], self.shape[3]
        passes.say(f"sparse emission over {num_pairs:,} (symbol, target) pairs ({num_pairs / (s * t):.2%} of S x T)")
        passes.plan_memory()

    def start_request(self) -> BlockPass:
        """The start pass: the statistics of the first responsibilities (and the pairs of the emission prior)."""
        return BlockPass(
            "init", "initializing",
            functools.partial(
                start_partition, self.factory, self.start, self.seed, self.estimator.needs_pairs, self.buckets
            ),
            self.start_columns,
        )  # fmt: skip

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        s, t = self.shape[0], self.shape[3]
        needs_pairs = self.estimator.needs_pairs
        if start is None:
            value = passes.run(self.start_request())
            if needs_pairs:
                self._resolve_prior(value.pairs)
            self._found_support(value.stats, passes)
            return passes.choose(self.m_step(value.stats, None))
        assert isinstance(start, ResponsibilityAttentionDistribution)
        if resumed:
            # A resumed fit's own model lies on this store's support already; its prior is its checkpoint's.
            table = start.emission_table
            if isinstance(table, SparseEmission):
                self.support, self.num_pairs = table.support, table.support.num_pairs
        elif self.layout == "sparse":
            value = passes.run(
                BlockPass(
                    "support", "finding the pairs",
                    functools.partial(start_partition, self.factory, "uniform", 0, False, self.buckets),
                    self.start_columns,
                )
            )  # fmt: skip
            support = self._found_support(value.stats, passes)
            assert support is not None
            start = start.with_emission(start.emission_table.restricted(support))
        elif isinstance(start.emission_table, SparseEmission):
            start = start.with_emission(DenseEmission(start.emission_table.to_dense()))
        if needs_pairs and self.prior is None:
            pairs = passes.run(
                BlockPass("pairs", "counting pairs", functools.partial(pairs_of_blocks, s, t), self.start_columns)
            )
            self._resolve_prior(pairs)
        return start

    # -- the iterations ------------------------------------------------------------------------------------------

    def statistics(self, head: Head, blocks: Iterator[Block]) -> SufficientStatistics:
        """The E-step statistics of one partition's blocks, visited in row order (one block held at a time)."""
        assert isinstance(head, ResponsibilityAttentionDistribution)
        accumulator = self.factory.make_for(head)
        for block in blocks:
            rows = block.rows
            if isinstance(rows, WindowRows):  # token windows: a tied prior's histogram kernel, or a free prior's
                accumulator.seq_update_windows(_weighted(rows, block.weights), head)
            else:
                accumulator.seq_update(rows.encoded, block.weights, head, checked=rows.checked)
        return accumulator.value(copy=False)

    def m_step(self, statistics: Any, previous: Head | None) -> SingleHopCandidates:
        stats = statistics.stats if isinstance(statistics, StartValue) else statistics
        if previous is not None and self.factory.keys is not None:
            # Pool the heads tied by `keys` (the reference's protocol; a fit of one head pools only itself).
            assert isinstance(previous, ResponsibilityAttentionDistribution)
            accumulator = self.factory.make_for(previous).from_value(stats)
            pool: dict[str, Any] = {}
            accumulator.key_merge(pool)
            accumulator.key_replace(pool)
            stats = accumulator.value()
        assert previous is None or isinstance(previous, ResponsibilityAttentionDistribution)
        candidates = self.estimator.candidates(stats, previous=previous)
        return SingleHopCandidates(candidates, self.estimator.search)

    def sharded_m_step(self, n_shards: int, *, bounds: Sequence[int] | None = None) -> ShardedMStep | None:
        """The M-step in shards of the symbol range (:mod:`~dist_respattn.model.heads.single_hop.sharded`); none for
        heads tied by ``keys`` (their pool is summed over every head)."""
        if n_shards < 1 or self.factory.keys is not None:
            return None
        from dist_respattn.model.heads.single_hop.sharded import SingleHopSharding

        return SingleHopSharding(self.estimator, self.layout, self.support, n_shards, bounds=bounds)

    def sharded_start(self, n_shards: int) -> ShardedStart | None:
        """The start in the M-step's shards (:class:`~dist_respattn.model.heads.single_hop.sharded.SingleHopStart`),
        when the M-step runs in shards (:meth:`sharded_m_step`)."""
        if n_shards < 1 or self.factory.keys is not None:
            return None
        from dist_respattn.model.heads.single_hop.sharded import SingleHopStart

        return SingleHopStart(self, self.start_request(), n_shards)

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        assert isinstance(head, ResponsibilityAttentionDistribution)
        if statistics is None:  # a fit of no iterations: the starting model as it is
            return degeneracy_warnings(head)
        stats = statistics.stats if isinstance(statistics, StartValue) else statistics
        e = self.estimator
        return degeneracy_warnings(
            head, key_mass=stats.key_mass, min_sigma2=e.min_sigma2 if e.estimate_sigma2 else None
        )

    def choice_from_json(self, data: dict[str, Any]) -> Hyperparameters | None:
        return Hyperparameters.from_json(data) if data else None

    def checkpoint_extras(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        prior = self.prior
        if prior is None:
            return {}, {"emission_prior": None}
        return prior.to_arrays(), {"emission_prior": {"kind": prior.kind}}

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> MemoryEstimate:
        return estimate_single_hop_memory(
            self.shape, block_rows=block_rows, row_bytes=row_bytes, threads_per_worker=threads_per_worker,
            fan_in=fan_in, layout=self.layout, num_pairs=self.num_pairs,
        )  # fmt: skip


class EStepTrainer(Trainer):
    """A single-hop fit whose E-step is written by hand (``e_step(model)``: the statistics of the data under
    ``model``, or the start's for ``None``): :func:`~dist_respattn.model.fitting.em.run_em`'s trainer."""

    def __init__(self, estimator: ResponsibilityAttentionEstimator, e_step: Any) -> None:
        self.estimator, self.e_step = estimator, e_step

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if start is not None:
            return start
        return passes.choose(self.m_step(self.e_step(None), None))

    def statistics(self, head: Head, blocks: Iterator[Block]) -> SufficientStatistics:
        raise TypeError("a hand-written E-step reads no blocks")

    def m_step(self, statistics: Any, previous: Head | None) -> SingleHopCandidates:
        assert previous is None or isinstance(previous, ResponsibilityAttentionDistribution)
        return SingleHopCandidates(self.estimator.candidates(statistics, previous=previous), self.estimator.search)
