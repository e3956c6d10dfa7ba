"""The single-hop M-step in shards of the symbol range (:class:`~dist_respattn.model.heads.base.ShardedMStep`).

Shard ``k`` holds the symbols ``[bounds[k], bounds[k + 1])``: their emission counts (dense: the (T, S_k) columns of
the target-major counts; sparse: the counts of their pairs, in the support's order) and, under a choice, their rows
of the emission. The common part is the rest of the statistics (keys, key mass, position counts and the scalars):
its M-step gives the keys, the position prior and the scalars the choice needs. Every operation on a shard is the
whole M-step's on its columns or rows, element by element, in the same order, so a sharded fit is bit-identical to
one whose M-step runs on the driver.
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from dist_respattn.model.emission.layouts import (
    DenseEmissionCounts,
    PairSupport,
    SparseEmission,
    SparseEmissionCounts,
    map_values,
)
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.selection import GridTotals, Hyperparameters, HyperparameterSearch
from dist_respattn.model.heads.base import (
    BlockPass,
    Passes,
    ShardedCandidates,
    ShardedMStep,
    ShardedStart,
    sum_into_copy,
)
from dist_respattn.model.heads.single_hop.accumulator import SufficientStatistics
from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings
from dist_respattn.model.heads.single_hop.estimator import (
    GridPoints,
    ResponsibilityAttentionEstimator,
    estimate_key_means,
    grid_points,
    grid_table_of,
    position_prior_of,
    select_point,
)
from dist_respattn.model.heads.single_hop.kind import StartValue

__all__ = [
    "CommonPart",
    "CountsShard",
    "ShardPart",
    "ShardSummary",
    "ShardTables",
    "SingleHopShardedCandidates",
    "SingleHopSharding",
    "SingleHopStart",
    "StartShard",
    "SymbolCounts",
    "estimated_pairs",
    "join_shards",
    "join_supports",
    "shard_bounds",
    "shard_pairs",
    "support_bounds",
    "symbol_counts_of_blocks",
]

#: The grid of a fit that chooses nothing: one point, the fixed hyperparameters.
_SCORE_ONLY = HyperparameterSearch(None, None, None)


def shard_bounds(num_symbols: int, n_shards: int, work: np.ndarray | None = None) -> tuple[int, ...]:
    """``n + 1`` symbol bounds cutting ``[0, S)`` into ``n = min(n_shards, S)`` ranges, each of at least one symbol:
    of (nearly) equal size, or (``work``: each symbol's (S,), non-negative) each holding about the same work, every
    bound where the work before it is nearest to ``k / n`` of the whole. A function of its arguments alone."""
    n = max(1, min(int(n_shards), int(num_symbols)))
    if work is None or n == 1:
        return tuple(num_symbols * k // n for k in range(n + 1))
    before = np.zeros(num_symbols + 1)
    np.cumsum(np.asarray(work, dtype=np.float64), out=before[1:])
    total = before[-1]
    if not total > 0:
        return shard_bounds(num_symbols, n)
    bounds = [0]
    for k in range(1, n):
        target = total * k / n
        j = int(np.searchsorted(before, target, side="left"))
        if j > 0 and target - before[j - 1] <= before[min(j, num_symbols)] - target:
            j -= 1
        bounds.append(min(max(j, bounds[-1] + 1), num_symbols - (n - k)))
    bounds.append(num_symbols)
    return tuple(int(b) for b in bounds)


def support_bounds(support: PairSupport, n_shards: int) -> tuple[int, ...]:
    """Bounds whose shards hold (nearly) equal numbers of ``support``'s pairs."""
    s = int(support.num_symbols)
    return shard_bounds(s, n_shards, np.bincount(support.symbols, minlength=s)[:s])


@dataclass(frozen=True)
class SymbolCounts:
    """How often each symbol is the previous one of a row (S,), and each target a row's (T,): the counting pass
    that cuts a sparse start's shards (:func:`estimated_pairs`). Integers, so any order of addition gives them."""

    symbols: np.ndarray
    targets: np.ndarray

    def __add__(self, other: SymbolCounts) -> SymbolCounts:
        return SymbolCounts(self.symbols + other.symbols, self.targets + other.targets)

    @classmethod
    def sum_of(cls, values: Sequence[SymbolCounts]) -> SymbolCounts:
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total


def symbol_counts_of_blocks(num_symbols: int, num_targets: int, blocks: Any) -> SymbolCounts:
    """A partition's :class:`SymbolCounts` (the counting pass's partition map): unweighted, block by block."""
    symbols = np.zeros(num_symbols, dtype=np.int64)
    targets = np.zeros(num_targets, dtype=np.int64)
    for block in blocks:
        rows = block.rows
        previous = rows.tokens[rows.end - 1] if hasattr(rows, "tokens") else rows.context[:, -1]
        symbols += np.bincount(np.asarray(previous, dtype=np.int64), minlength=num_symbols)[:num_symbols]
        targets += np.bincount(np.asarray(rows.target, dtype=np.int64), minlength=num_targets)[:num_targets]
    return SymbolCounts(symbols, targets)


#: The points (log-spaced) at which :func:`estimated_pairs` evaluates the expected count of distinct targets.
_GRID_POINTS = 256


def estimated_pairs(counts: SymbolCounts, context_length: int) -> np.ndarray:
    """Each symbol's expected number of (symbol, target) pairs (S,), were its ``N c_s`` places in the rows' windows
    paired with targets drawn independently from their frequencies ``p``: ``sum_t 1 - exp(-N c_s p_t)``, made on a
    log grid of ``N c_s`` and interpolated (at most S; none for an unseen symbol). On a stream of text it puts the
    largest of 8, 64, 256 shards at 1.2x, 1.7x, 2.7x the mean (the pairs' own counts: 1.0x, 1.3x, 2.0x)."""
    total = int(counts.targets.sum())
    places = counts.symbols.astype(np.float64) * max(1, int(context_length))
    estimate = np.zeros(places.shape[0])
    if total == 0 or not places.any():
        return estimate
    p = counts.targets[counts.targets > 0] / total
    seen = places > 0
    grid = np.geomspace(1.0, max(2.0, float(places.max())), _GRID_POINTS)
    expected = np.array([-np.expm1(-m * p).sum() for m in grid])
    estimate[seen] = np.interp(np.log(places[seen]), np.log(grid), expected)
    return estimate


@dataclass(frozen=True)
class _Pairs:
    """A shard's pairs of a support: their indices in it (P_k,) int64, local symbols and targets (P_k,) int64."""

    pairs: np.ndarray
    symbols: np.ndarray
    targets: np.ndarray


_PAIRS: weakref.WeakKeyDictionary[PairSupport, dict[tuple[int, ...], list[_Pairs]]] = weakref.WeakKeyDictionary()
_PAIRS_LOCK = threading.Lock()


def shard_pairs(support: PairSupport, bounds: tuple[int, ...]) -> list[_Pairs]:
    """Each shard's pairs of ``support`` in the support's (target-major) order; made once per support and bounds
    in a process (the support is fixed for the fit)."""
    with _PAIRS_LOCK:
        known = _PAIRS.setdefault(support, {})
        if bounds not in known:
            symbols = support.symbols
            targets = support.targets
            made = []
            for a, b in itertools.pairwise(bounds):
                pairs = np.flatnonzero((symbols >= a) & (symbols < b)).astype(np.int64)
                made.append(_Pairs(pairs, symbols[pairs].astype(np.int64) - a, targets[pairs].astype(np.int64)))
            known[bounds] = made
        return known[bounds]


class _NoCounts:
    """The common part's emission counts: none (copying or adding them does nothing)."""

    nbytes = 0

    def copy(self) -> _NoCounts:
        return self

    def add(self, other: Any) -> None:
        return None


_NO_COUNTS = _NoCounts()


@dataclass(frozen=True)
class CountsShard:
    """One shard's emission counts (dense: (T, S_k); sparse: (P_k,)), additive as the whole counts are."""

    counts: np.ndarray

    def copy(self) -> CountsShard:
        return CountsShard(self.counts.copy())

    def add(self, other: CountsShard) -> CountsShard:
        np.add(self.counts, other.counts, out=self.counts)
        return self

    @classmethod
    def sum_of(cls, values: Sequence[CountsShard]) -> CountsShard:
        return sum_into_copy(values)

    def __add__(self, other: CountsShard) -> CountsShard:
        return self.copy().add(other)


@dataclass(frozen=True)
class ShardTables:
    """What the workers' parts of the M-step read that is fixed for the fit: the emission prior's base (T,) and type
    counts (S,) (the uniform base and none for an additive smoothing), and a sparse emission's support."""

    base: np.ndarray
    types: np.ndarray
    support: PairSupport | None


@dataclass(frozen=True)
class ShardSummary:
    """What the driver receives of a sharded M-step: scalars only."""

    log_lik: float
    n_obs: float
    sigma2: float
    defaults: Hyperparameters
    query_scale: float


@dataclass(frozen=True)
class CommonPart:
    """The common part's M-step (on a worker): keys (S, D), position prior (N,), the key mass (S,) for the warnings,
    and the summary."""

    key_means: np.ndarray
    position_prior: np.ndarray
    key_mass: np.ndarray
    summary: ShardSummary


@dataclass(frozen=True)
class ShardPart:
    """A shard's M-step up to the choice (on its owner): its counts and row totals (S_k,)."""

    index: int
    counts: np.ndarray
    row_totals: np.ndarray


@dataclass(frozen=True)
class SingleHopShardedCandidates(ShardedCandidates):
    """The driver's side of a sharded single-hop M-step: its summary and the search."""

    summary: ShardSummary
    search: HyperparameterSearch | None
    additive: bool
    num_targets: int
    emission_smoothing: float

    def default(self) -> Hyperparameters:
        return self.summary.defaults

    def grid(self, around: Any) -> GridPoints:
        search = self.search or _SCORE_ONLY
        if around is not None:
            search = search.around(around, self.summary.query_scale)
        return grid_points(
            search, self.summary.defaults, self.summary.query_scale, additive=self.additive,
            num_targets=self.num_targets, emission_smoothing=self.emission_smoothing,
        )  # fmt: skip

    def choose(self, points: Any, scores: Any) -> tuple[Hyperparameters, dict[str, float] | None]:
        assert isinstance(points, GridPoints) and isinstance(scores, GridTotals)
        selection = select_point(points.hyperparameters, scores, self.summary.defaults, additive=self.additive)
        return selection.hyperparameters, selection.heldout


class SingleHopSharding(ShardedMStep):
    """A single-hop fit's M-step in shards (see the module's docstring).

    Args:
        estimator: the fit's estimator, its emission prior made (only its settings travel to the workers).
        layout: ``"dense"`` or ``"sparse"``; ``support``: a sparse fit's.
        n_shards: shards wanted (at most S).
    """

    def __init__(
        self,
        estimator: ResponsibilityAttentionEstimator,
        layout: str,
        support: PairSupport | None,
        n_shards: int,
        *,
        bounds: Sequence[int] | None = None,
    ) -> None:
        prior = estimator.emission_prior
        if isinstance(prior, str):
            raise ValueError("the sharded M-step needs the emission prior made from the training rows first")
        #: Whether the driver holds the whole tables (else the support is on the workers alone: a sharded start's).
        self.whole = layout != "sparse" or support is not None
        s, t = estimator.num_symbols, estimator.num_targets
        if bounds is not None:
            self.bounds = tuple(int(b) for b in bounds)
            if self.bounds[0] != 0 or self.bounds[-1] != s or any(a >= b for a, b in itertools.pairwise(self.bounds)):
                raise ValueError(f"shard bounds {list(self.bounds)} do not cut the {s} symbols into ranges")
        elif layout == "sparse" and support is not None:
            # A sparse shard's work is its pairs: cut where they are (symbol ids follow frequency).
            self.bounds = support_bounds(support, n_shards)
        else:  # a dense shard's work is its symbols x T: equal ranges
            self.bounds = shard_bounds(s, n_shards)
        self.n_shards = len(self.bounds) - 1
        self.layout = layout
        self.fixed_names = ("support_indptr", "support_symbols") if layout == "sparse" else ()
        self.additive = prior is None
        used = EmissionPrior.uniform(s, t) if prior is None else prior
        self._tables: ShardTables | None = ShardTables(used.base, used.types, support)
        # The workers need the estimator's settings, not its prior's arrays: its kind stands in for them.
        light = object.__new__(ResponsibilityAttentionEstimator)
        light.__dict__.update(estimator.__dict__)
        light.emission_prior = None if prior is None else prior.kind
        self.estimator = light

    def __getstate__(self) -> dict[str, Any]:
        # The tables go to the workers once a fit (:meth:`tables`), not with every task.
        return {**self.__dict__, "_tables": None}

    @property
    def num_symbols(self) -> int:
        return int(self.estimator.num_symbols)

    def tables(self) -> ShardTables:
        assert self._tables is not None, "the tables stay on the driver"
        return self._tables

    def tables_from(self, tables: Any, common: Any) -> ShardTables:
        if tables.support is not None or self.layout != "sparse":
            return cast("ShardTables", tables)
        support = PairSupport.from_arrays(common, self.num_symbols)
        return ShardTables(tables.base, tables.types, support)

    def _range(self, index: int) -> tuple[int, int]:
        return self.bounds[index], self.bounds[index + 1]

    # -- the E-step's side ------------------------------------------------------------------------------------

    def split(self, statistics: Any, tables: Any) -> tuple[SufficientStatistics, tuple[CountsShard, ...]]:
        assert isinstance(statistics, SufficientStatistics)
        counts = statistics.emission_count
        common = statistics._replace(emission_count=cast("Any", _NO_COUNTS))
        if isinstance(counts, DenseEmissionCounts):
            ts = counts.count_ts
            shards = tuple(CountsShard(np.ascontiguousarray(ts[:, a:b])) for a, b in itertools.pairwise(self.bounds))
        else:
            assert isinstance(counts, SparseEmissionCounts) and tables.support is not None
            shards = tuple(CountsShard(counts.counts[p.pairs]) for p in shard_pairs(tables.support, self.bounds))
        return common, shards

    # -- the M-step's parts ---------------------------------------------------------------------------------------

    def common_m_step(self, common: Any, previous: Any, previous_meta: dict[str, Any] | None) -> CommonPart:
        previous_keys: np.ndarray | None = None
        previous_sigma2: float | None = None
        if isinstance(previous, Mapping):
            previous_keys = np.asarray(previous["key_means"])
            previous_sigma2 = float((previous_meta or {})["sigma2"])
        elif previous is not None:
            previous_keys, previous_sigma2 = previous.key_means, float(previous.sigma2)
        est = self.estimator
        sigma2, defaults, query_scale = est.choice_scalars(common, previous_sigma2)
        return CommonPart(
            key_means=estimate_key_means(common, previous_keys),
            position_prior=position_prior_of(common, est.pseudo_count, est.buckets),
            key_mass=common.key_mass,
            summary=ShardSummary(float(common.log_lik), float(common.n_obs), sigma2, defaults, query_scale),
        )

    def shard_m_step(self, index: int, shard: Any, tables: Any) -> ShardPart:
        a, b = self._range(index)
        if self.layout == "dense":
            row_totals = DenseEmissionCounts(shard.counts).row_totals()
        else:
            pairs = shard_pairs(tables.support, self.bounds)[index]
            row_totals = np.bincount(pairs.symbols, weights=shard.counts, minlength=b - a)
        return ShardPart(index, shard.counts, row_totals)

    def summary(self, common_part: Any) -> ShardSummary:
        return common_part.summary

    def candidates(self, summary: Any) -> SingleHopShardedCandidates:
        est = self.estimator
        return SingleHopShardedCandidates(summary, est.search, self.additive, est.num_targets, est.emission_smoothing)

    # -- what is made from the parts ------------------------------------------------------------------------------

    def _counts(self, shard_parts: Sequence[ShardPart], tables: ShardTables) -> Any:
        if self.layout == "dense":
            return DenseEmissionCounts(np.concatenate([p.counts for p in shard_parts], axis=1))
        support = tables.support
        assert support is not None
        values = np.empty(support.num_pairs)
        for part, pairs in zip(shard_parts, shard_pairs(support, self.bounds), strict=True):
            values[pairs.pairs] = part.counts
        return SparseEmissionCounts(values, support, num_symbols=support.num_symbols, num_targets=support.num_targets)

    def grid(self, points: Any, common_part: Any, shard_parts: list[Any], tables: Any) -> Any:
        from dist_respattn.model.heads.single_hop.kind import SingleHopGrid

        row_totals = np.concatenate([p.row_totals for p in shard_parts])
        table = grid_table_of(
            points, common_part.key_means, common_part.position_prior, self._counts(shard_parts, tables), row_totals,
            tables.base, tables.types, self.estimator.buckets,
        )  # fmt: skip
        return SingleHopGrid(table)

    def head_meta(self, choice: Any) -> dict[str, Any]:
        est = self.estimator
        meta: dict[str, Any] = {
            "kind": "single_hop",
            "sigma2": float(choice.sigma2),
            "name": est.name,
            "num_symbols": int(est.num_symbols),
            "context_length": int(est.context_length),
            "query_dim": int(est.query_dim),
            "num_targets": int(est.num_targets),
            "emission_layout": self.layout,
        }
        if est.buckets is not None:
            meta["position_buckets"] = est.buckets.to_json()
        return meta

    def head(self, meta: dict[str, Any], common: Any, shards: Sequence[Any], tables: Any) -> Any:
        """The head from its parts, on the fit's own support object (whose derived tables a worker keeps)."""
        from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays

        support = tables.support if self.layout == "sparse" else None
        if support is not None and "support_symbols" not in common:  # read without it: the tables hold it
            common = {**common, **support.to_arrays()}
        head = distribution_from_arrays(join_shards(common, shards, support=support), meta)
        if support is not None:
            table = head.emission_table
            assert isinstance(table, SparseEmission)
            head = head.with_emission(SparseEmission(support, table.values, table.backoff, table.base))
        return head

    def common_arrays(self, choice: Any, common_part: Any, tables: Any) -> dict[str, np.ndarray]:
        arrays = {
            "key_means": np.ascontiguousarray(common_part.key_means, dtype=np.float64),
            "position_prior": np.ascontiguousarray(common_part.position_prior, dtype=np.float64),
        }
        if self.layout == "sparse":
            assert tables is not None and tables.support is not None
            arrays.update(tables.support.to_arrays())
            arrays["emission_backoff_target"] = np.ascontiguousarray(tables.base, dtype=np.float64)
        return arrays

    def shard_arrays(self, index: int, choice: Any, shard_part: Any, tables: Any) -> dict[str, np.ndarray]:
        a, b = self._range(index)
        strength = choice.emission_strength + choice.type_strength * tables.types[a:b]
        bounds = np.array([a, b], dtype=np.int64)
        if self.layout == "dense":
            emission = DenseEmissionCounts(shard_part.counts).map_emission(strength, tables.base)
            return {"shard_symbols": bounds, "emission": emission.to_dense()}
        pairs = shard_pairs(tables.support, self.bounds)[index]
        values, backoff = map_values(
            shard_part.counts, shard_part.row_totals, strength, tables.base, pairs.symbols, pairs.targets
        )
        return {"shard_symbols": bounds, "emission_values": values, "emission_backoff_symbol": backoff}

    def warnings(self, choice: Any, common_part: Any) -> list[str]:
        est = self.estimator
        # What the warnings read of a head, without its emission.
        head = types.SimpleNamespace(
            sigma2=float(choice.sigma2),
            position_prior=common_part.position_prior,
            context_length=int(est.context_length),
            num_symbols=int(est.num_symbols),
        )
        return degeneracy_warnings(
            head,  # type: ignore[arg-type]
            key_mass=common_part.key_mass,
            min_sigma2=est.min_sigma2 if est.estimate_sigma2 else None,
        )

    def record(self, choice: Any) -> dict[str, Any]:
        return {"sigma2": float(choice.sigma2)}


# --------------------------------------------------------------------------------------------- the start


@dataclass
class StartShard:
    """A sparse start value's shard: the counts of its symbols' pairs, carrying their own support (the pairs seen
    so far); added as the whole counts are (the union of the pairs, each sum in the same order)."""

    counts: SparseEmissionCounts

    def copy(self) -> StartShard:
        return StartShard(self.counts.copy())

    def add(self, other: StartShard) -> StartShard:
        self.counts.add(other.counts)
        return self

    @classmethod
    def sum_of(cls, values: Sequence[StartShard]) -> StartShard:
        return sum_into_copy(values)

    def __add__(self, other: StartShard) -> StartShard:
        return self.copy().add(other)


def join_supports(supports: Sequence[PairSupport]) -> PairSupport:
    """The support whose pairs are those of ``supports`` (of disjoint, increasing symbol ranges, in that order):
    target by target, each one's pairs after the previous ones', so the symbols stay increasing; linear in the
    pairs."""
    first = supports[0]
    sizes = [np.diff(support.indptr) for support in supports]
    indptr = np.zeros(first.num_targets + 1, dtype=np.int64)
    np.cumsum(np.sum(sizes, axis=0), out=indptr[1:])
    symbols = np.empty(int(indptr[-1]), dtype=np.int32)
    at = indptr[:-1].copy()
    for support, size in zip(supports, sizes, strict=True):
        targets = support.targets
        symbols[at[targets] + (np.arange(support.num_pairs) - support.indptr[targets])] = support.symbols
        at += size
    return PairSupport(first.num_symbols, first.num_targets, indptr, symbols)


class SingleHopStart(ShardedStart):
    """A single-hop fit's start in the shards of its M-step (:class:`~dist_respattn.model.heads.base.ShardedStart`):
    the start pass's statistics split as an E-step's are (a sparse shard keeps the support of its own pairs), its
    emission prior's pairs in the common part. The common part's owner makes the prior (``(S,)`` and ``(T,)``:
    what the driver receives), each shard's owner counts its pairs (a number); the support is joined on a worker.

    Args:
        trainer: the fit's :class:`~dist_respattn.model.heads.single_hop.kind.SingleHopTrainer` (stays on the
            driver: :meth:`prepared` finishes its preparation).
        request: its start pass; ``n_shards``: shards wanted (at most S).
    """

    def __init__(self, trainer: Any, request: BlockPass, n_shards: int) -> None:
        s, n, _, t = trainer.shape
        self.num_symbols, self.num_targets, self.context_length = int(s), int(t), int(n)
        #: Equal ranges until :meth:`cut` (a sparse start's are cut at estimated pairs before its pass).
        self.bounds = shard_bounds(s, n_shards)
        self.n_wanted = n_shards
        self.n_shards = len(self.bounds) - 1
        self.layout = trainer.layout
        kind = trainer.estimator.emission_prior
        #: The prior's kind to make from the pairs (``None``: the estimator's prior needs no pass).
        self.prior_kind: str | None = kind if isinstance(kind, str) else None
        self._trainer, self._request = trainer, request

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_trainer": None, "_request": None}

    def request(self) -> BlockPass:
        return self._request

    def cut(self, passes: Passes) -> None:
        """A sparse start's bounds, before its pass: cut at equal estimated pairs (:func:`estimated_pairs`) from a
        counting pass over the training rows (the same integers on any number of workers, so the same bounds); a
        dense shard's work is its symbols x T, so its ranges stay equal."""
        if self.layout != "sparse" or self.n_shards == 1:
            return
        counts = passes.run(
            BlockPass(
                "symbols", "counting symbols",
                functools.partial(symbol_counts_of_blocks, self.num_symbols, self.num_targets),
                self._request.columns,
            )
        )  # fmt: skip
        self.bounds = shard_bounds(self.num_symbols, self.n_wanted, estimated_pairs(counts, self.context_length))
        self.n_shards = len(self.bounds) - 1

    def split(self, value: Any, tables: Any) -> tuple[StartValue, tuple[Any, ...]]:
        stats = value.stats
        counts = stats.emission_count
        # The common part is a start value without its emission counts (its pairs are the emission prior's).
        common = StartValue(stats._replace(emission_count=cast("Any", _NO_COUNTS)), value.pairs)
        if isinstance(counts, DenseEmissionCounts):
            ts = counts.count_ts
            return common, tuple(
                CountsShard(np.ascontiguousarray(ts[:, a:b])) for a, b in itertools.pairwise(self.bounds)
            )
        assert isinstance(counts, SparseEmissionCounts) and counts.support is not None
        support = counts.support
        keys, symbols = support.keys(), support.symbols
        shards = []
        for a, b in itertools.pairwise(self.bounds):
            mine = (symbols >= a) & (symbols < b)
            shards.append(
                StartShard(
                    SparseEmissionCounts(
                        counts.counts[mine], PairSupport.from_keys(keys[mine], self.num_symbols, self.num_targets),
                        num_symbols=self.num_symbols, num_targets=self.num_targets,
                    )
                )
            )  # fmt: skip
        return common, tuple(shards)

    def common_info(self, common: Any) -> EmissionPrior | None:
        if self.prior_kind is None:
            return None
        return EmissionPrior.from_pairs(common.pairs, self.prior_kind)

    def shard_info(self, index: int, shard: Any) -> int:
        return int(shard.counts.counts.shape[0]) if isinstance(shard, StartShard) else 0

    def prepared(self, common: Any, shards: list[Any], passes: Passes) -> SingleHopSharding:
        trainer = self._trainer
        if common is not None and trainer.prior is None:
            trainer.estimator = trainer.estimator.resolved(common)
        if self.layout == "sparse":
            trainer.found_pairs(int(sum(shards)), passes)
            if len(shards) > 1:
                mean = sum(shards) / len(shards)
                passes.say(
                    f"the {len(shards)} shards hold {min(shards):,} to {max(shards):,} pairs "
                    f"(the largest {max(shards) / mean if mean else 1.0:.2f}x the mean)"
                )
        return SingleHopSharding(trainer.estimator, self.layout, None, self.n_shards, bounds=self.bounds)

    def tables(self, sharding: ShardedMStep, tables: Any, shards: Sequence[Any]) -> ShardTables:
        if self.layout != "sparse":
            return cast("ShardTables", tables)
        support = join_supports([cast("PairSupport", shard.counts.support) for shard in shards])
        return ShardTables(tables.base, tables.types, support)

    def common_statistics(self, common: Any) -> SufficientStatistics:
        return cast("SufficientStatistics", common.stats)

    def shard_statistics(self, index: int, shard: Any) -> CountsShard:
        if isinstance(shard, StartShard):
            return CountsShard(shard.counts.counts)
        return cast("CountsShard", shard)


def join_shards(
    common: Mapping[str, Any], shards: Sequence[Mapping[str, Any]], *, support: PairSupport | None = None
) -> dict[str, np.ndarray]:
    """The arrays :func:`~dist_respattn.model.heads.single_hop.arrays.distribution_to_arrays` gives of the head whose
    parts a sharded M-step wrote (``support``: a sparse head's, when at hand, for its shards' pairs)."""
    arrays = {name: np.asarray(common[name]) for name in common}
    ordered = sorted(shards, key=lambda shard: int(np.asarray(shard["shard_symbols"])[0]))
    if "emission" in ordered[0]:
        arrays["emission"] = np.concatenate([np.asarray(shard["emission"]) for shard in ordered], axis=0)
        return arrays
    symbols = np.asarray(arrays["support_symbols"])
    values = np.empty(symbols.shape[0])
    backoff = []
    bounds = tuple(int(np.asarray(shard["shard_symbols"])[0]) for shard in ordered)
    bounds += (int(np.asarray(ordered[-1]["shard_symbols"])[1]),)
    known = shard_pairs(support, bounds) if support is not None else None
    for k, shard in enumerate(ordered):
        a, b = bounds[k], bounds[k + 1]
        if known is not None:
            values[known[k].pairs] = np.asarray(shard["emission_values"])
        else:  # a mask, not the pairs' indices: a byte a pair where the indices take eight (the driver's final read)
            mine = symbols >= a
            np.logical_and(mine, symbols < b, out=mine)
            values[mine] = np.asarray(shard["emission_values"])
            del mine
        backoff.append(np.asarray(shard["emission_backoff_symbol"]))
    arrays["emission_values"] = values
    arrays["emission_backoff_symbol"] = np.concatenate(backoff)
    return arrays
