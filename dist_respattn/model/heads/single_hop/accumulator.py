"""Additive sufficient statistics of the responsibility-attention head, and their accumulator."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dist_respattn.model.arguments import (
    CheckedBatch,
    ImpossibleEvidenceError,
    as_nonnegative_float,
    check_batch,
    first_where,
    nonfinite_free,
    plain,
)
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import (
    DenseEmissionCounts,
    EmissionCounts,
    PairSupport,
    SparseEmission,
    SparseEmissionCounts,
)
from dist_respattn.model.encoder import ResponsibilityAttentionDataEncoder
from dist_respattn.model.heads.base import sum_into_copy
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.kernels import histogram, per_position
from dist_respattn.model.kernels.aligned import aligned_zeros
from dist_respattn.model.kernels.pair_keys import (
    ExactWindowCounts,
    merge_tallies,
    tally_keys,
    tally_rows,
    tally_uniform_windows,
    window_exact_mass,
)
from dist_respattn.model.rows import WindowArrays, WindowRows

__all__ = [
    "ResponsibilityAttentionAccumulator",
    "ResponsibilityAttentionAccumulatorFactory",
    "SufficientStatistics",
]


def _raise_at_first(array: np.ndarray, bad: np.ndarray, name: str, what: str, expected: str) -> None:
    """Raise a ValueError naming the first entry of ``array`` where ``bad`` holds (there is one)."""
    index = first_where(bad)
    label = ", ".join(str(v) for v in index)
    raise ValueError(f"{name} holds {what}: {name}[{label}] = {plain(array[index])}, expected {expected}")


class SufficientStatistics(NamedTuple):
    """The value of an accumulator: plain float64 arrays and floats, additive over rows.

    The first five fields are those of the reference library's value, in its order, so
    ``key_sum, key_mass, emission_count, position_count, query_sq = value[:5]`` works for both.

    Attributes:
        key_sum: (S, D) ``sum_n sum_i w_n r_ni [c_ni = s] y_n``.
        key_mass: (S,) ``sum_n sum_i w_n r_ni [c_ni = s]``.
        emission_count: ``sum_n sum_i w_n r_ni [c_ni = s][t_n = t]`` per (symbol, target), an
            :class:`~dist_respattn.model.emission.layouts.EmissionCounts` (dense (S, T), or sparse over the
            fit's support; ``.to_dense()`` gives (S, T)).
        position_count: (N,) ``sum_n w_n r_ni``.
        query_sq: ``sum_n w_n ||y_n||^2``.
        n_obs: ``sum_n w_n``.
        log_lik: ``sum_n w_n L_n``, the weighted log-likelihood of the model the E-step used
            (0 for statistics from a random initialization, which has no model).
    """

    key_sum: np.ndarray
    key_mass: np.ndarray
    emission_count: EmissionCounts
    position_count: np.ndarray
    query_sq: float
    n_obs: float
    log_lik: float

    def to_dict(self) -> dict[str, Any]:
        """Field name -> array or float, for ``np.savez`` or a zarr group."""
        return dict(self._asdict())

    @classmethod
    def from_dict(cls, data: Any) -> SufficientStatistics:
        """Inverse of :meth:`to_dict` (accepts any mapping, e.g. a loaded ``npz``)."""
        missing = [f for f in cls._fields if f not in data]
        if missing:
            raise ValueError(f"sufficient statistics are missing field(s) {missing}")
        key_sum, key_mass, emission_count, position_count = (
            np.asarray(data[f], dtype=np.float64) for f in cls._fields[:4]
        )
        query_sq, n_obs, log_lik = (float(data[f]) for f in cls._fields[4:])
        counts = DenseEmissionCounts.from_symbol_major(emission_count)
        return cls(key_sum, key_mass, counts, position_count, query_sq, n_obs, log_lik)

    def copy(self) -> SufficientStatistics:
        """A copy whose arrays can be added into."""
        return self._replace(
            key_sum=self.key_sum.copy(),
            key_mass=self.key_mass.copy(),
            emission_count=self.emission_count.copy(),
            position_count=self.position_count.copy(),
        )

    @classmethod
    def sum_of(cls, values: list[SufficientStatistics]) -> SufficientStatistics:
        """The sum of ``values``, added left to right into one copy of the first (the combine tree's sum). Sparse
        counts that each carry their own support (a start pass's) are merged all at once, with the same sums
        (:meth:`~dist_respattn.model.emission.layouts.SparseEmissionCounts.union`)."""
        counts = [value.emission_count for value in values]
        if len(values) < 2 or not all(isinstance(c, SparseEmissionCounts) and c.support is not None for c in counts):
            return sum_into_copy(values)
        first = counts[0]
        union = SparseEmissionCounts.union(counts, first.num_symbols, first.num_targets)  # type: ignore[arg-type]
        # The rest as :meth:`add` adds it, the counts aside (an empty stand-in: they are the union).
        rest = [value._replace(emission_count=_NO_COUNTS) for value in values]
        return sum_into_copy(rest)._replace(emission_count=union)

    def __add__(self, other: object) -> SufficientStatistics:
        """``self + other`` as a new value (neither changes)."""
        if not isinstance(other, SufficientStatistics):
            return NotImplemented
        return self.copy().add(other)

    def add(self, other: SufficientStatistics) -> SufficientStatistics:
        """``self + other`` into this value's arrays (the caller owns them: see :meth:`copy`)."""
        np.add(self.key_sum, other.key_sum, out=self.key_sum)
        np.add(self.key_mass, other.key_mass, out=self.key_mass)
        self.emission_count.add(other.emission_count)
        np.add(self.position_count, other.position_count, out=self.position_count)
        return self._replace(
            query_sq=self.query_sq + other.query_sq,
            n_obs=self.n_obs + other.n_obs,
            log_lik=self.log_lik + other.log_lik,
        )

    @classmethod
    def checked(cls, value: Any, shape: tuple[int, int, int, int]) -> SufficientStatistics:
        """Validate a 7-field value (or the reference library's 5-field one) against (S, N, D, T)."""
        num_symbols, context_length, query_dim, num_targets = shape
        try:
            fields = list(value)
        except TypeError as exc:
            raise TypeError("sufficient statistics must be a tuple of arrays and floats") from exc
        if len(fields) == 5:
            # The reference library's value carries no count or log-likelihood: the count follows from
            # the position counts (responsibilities sum to one per row); the log-likelihood is unknown.
            fields += [float(np.sum(fields[3])), float("nan")]
        if len(fields) != 7:
            raise ValueError(f"sufficient statistics have {len(fields)} fields: expected 7 (or the reference's 5)")
        expected = {
            "key_sum": (num_symbols, query_dim),
            "key_mass": (num_symbols,),
            "emission_count": (num_symbols, num_targets),
            "position_count": (context_length,),
        }
        arrays: list[Any] = []
        for (name, want), array in zip(expected.items(), fields[:4], strict=True):
            if isinstance(array, EmissionCounts):
                if (array.num_symbols, array.num_targets) != want:
                    raise ValueError(f"{name} has (S, T) = {(array.num_symbols, array.num_targets)}: expected {want}")
                a = array.values_array()
            else:
                a = np.asarray(array, dtype=np.float64)
                if a.shape != want:
                    raise ValueError(f"{name} has shape {a.shape}: expected {want}")
            # Cheap tests first (this runs on every E-step's value); the entry is searched for only when one fails.
            if not nonfinite_free(a):
                _raise_at_first(a, ~np.isfinite(a), name, "a non-finite value", "finite values")
            if name != "key_sum" and a.size and float(a.min()) < 0.0:
                _raise_at_first(a, a < 0.0, name, "a negative value", "non-negative masses")
            if name == "emission_count" and not isinstance(array, EmissionCounts):
                array = DenseEmissionCounts.from_symbol_major(a)
            arrays.append(array if name == "emission_count" else a)
        query_sq = as_nonnegative_float(fields[4], "query_sq")
        n_obs = as_nonnegative_float(fields[5], "n_obs")
        log_lik = float(fields[6])
        if np.isinf(log_lik):
            raise ValueError(f"log_lik = {log_lik!r}: expected a finite number (or nan when unknown)")
        key_sum, key_mass, emission_count, position_count = arrays
        return cls(key_sum, key_mass, emission_count, position_count, query_sq, n_obs, log_lik)


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` starting on a cache line, as the kernels' tables do (see kernels/aligned.py)."""
    out = aligned_zeros(array.shape, array.dtype)
    out[...] = array
    return out


def _owned(array: np.ndarray, copy: bool) -> np.ndarray:
    """``array`` itself, or a copy of it (what ``value(copy=...)`` hands over)."""
    return array.copy() if copy else array


class ResponsibilityAttentionAccumulator:
    """Accumulates the sufficient statistics of the M-step from weighted triples.

    Args:
        num_symbols: S, the number of context symbols.
        context_length: N, the context positions of a row.
        query_dim: D, the query's dimension.
        num_targets: T, the number of targets.
        keys: name under which accumulators are tied (pooled by ``key_merge``, then every member
            replaced by the pool in ``key_replace``); ``None`` ties nothing.
        name: optional name.
        backend: ``"numba"`` (the compiled, fused kernel) or ``"numpy"`` (vectorized blocks).
        layout: ``"dense"`` ((S, T) counts) or ``"sparse"`` (counts per pair).
        support: a sparse accumulator's pairs: the statistics count those pairs only, and the models
            they are updated under must be sparse over the same support. Without one, a sparse
            accumulator only initializes (collecting the pairs its rows hold).

    After an :class:`ImpossibleEvidenceError` the accumulator holds part of the failed update and
    refuses further use.
    """

    def __init__(
        self,
        num_symbols: int,
        context_length: int,
        query_dim: int,
        num_targets: int,
        keys: str | None = None,
        name: str | None = None,
        *,
        backend: per_position.Backend = "numba",
        layout: str = "dense",
        support: PairSupport | None = None,
    ) -> None:
        self.num_symbols = int(num_symbols)
        self.context_length = int(context_length)
        self.query_dim = int(query_dim)
        self.num_targets = int(num_targets)
        self.keys = keys
        self.name = name
        if backend not in ("numba", "numpy"):
            raise ValueError(f"backend = {backend!r}: expected 'numba' or 'numpy'")
        self.backend = backend
        if layout not in ("dense", "sparse"):
            raise ValueError(f"layout = {layout!r}: expected 'dense' or 'sparse'")
        if support is not None and layout != "sparse":
            raise ValueError("a support goes with the sparse layout")
        self.layout = layout
        self.support = support
        # A sparse accumulator without a support collects the pairs of its rows (see _initialize).
        self._collected: list[SparseEmissionCounts] = []
        # The pairs of the rows added since the last value or combine: (cells increasing, counts), merged block by
        # block in row order, so a partition holds O(its pairs), never O(its rows).
        self._row_pairs: tuple[np.ndarray, np.ndarray] | None = None
        #: Blocks of token windows counted at one exact mass, not yet in ``_row_pairs`` (which is empty meanwhile).
        self._exact: ExactWindowCounts | None = None
        self._stats = per_position.StatisticArrays.zeros(
            self.num_symbols, self.context_length, self.query_dim, self.num_targets, support, dense=layout == "dense"
        )
        self._broken: str | None = None

    # The statistics as attributes named like the reference library's.
    @property
    def key_sum(self) -> np.ndarray:
        """(S, D) responsibility-weighted query sum per symbol."""
        return self._stats.key_sum

    @property
    def key_mass(self) -> np.ndarray:
        """(S,) responsibility mass per symbol."""
        return self._stats.key_mass

    @property
    def emission_count(self) -> np.ndarray:
        """(S, T) responsibility mass per (symbol, target): a view of the dense target-major table
        (made from the pairs when sparse)."""
        return self._counts().to_dense()

    def _counts(self) -> EmissionCounts:
        counts = self._emission_value(copy=True)
        return counts if self.support is None else counts.on(self.support)  # type: ignore[attr-defined]

    @property
    def position_count(self) -> np.ndarray:
        """(N,) responsibility mass per position."""
        return self._stats.position_count

    @property
    def query_sq(self) -> float:
        """Weighted sum of squared query norms."""
        return float(self._stats.scalars[0])

    @property
    def n_obs(self) -> float:
        """Weighted number of triples seen."""
        return float(self._stats.scalars[1])

    @property
    def log_lik(self) -> float:
        """Weighted log-likelihood of the triples under the models the E-steps used."""
        return float(self._stats.scalars[2])

    def _shape(self) -> tuple[int, int, int, int]:
        return (self.num_symbols, self.context_length, self.query_dim, self.num_targets)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"this accumulator {self._broken}; make a new one")

    def _checked(self, x: Any, weights: Any, values_checked: bool = False) -> CheckedBatch:
        S, N, D, T = self._shape()
        return check_batch(
            x, weights, num_symbols=S, context_length=N, query_dim=D, num_targets=T, values_checked=values_checked
        )

    # -------------------------------------------------------------------------------- E-step

    def update(self, x: tuple[Any, Any, int], weight: float, estimate: ResponsibilityAttentionDistribution) -> None:
        """Add one weighted triple ``(context (N,), query (D,), target)``."""
        weights = np.array([as_nonnegative_float(weight, "weight")])
        self.seq_update(self.acc_to_encoder().seq_encode([x]), weights, estimate)

    def seq_update(
        self,
        x: tuple[np.ndarray, np.ndarray, np.ndarray],
        weights: Any,
        estimate: ResponsibilityAttentionDistribution,
        *,
        checked: bool = False,
    ) -> None:
        """Add an encoded batch ``(context (n, N), query (n, D), target (n,))`` with weights (n,) or ``None``.

        Runs the E-step under ``estimate`` and adds the responsibility-weighted statistics, the
        weighted count and the weighted log-likelihood. Bad values raise before anything is added,
        unless ``checked`` says the caller has checked them (``EncodedRows.checked``; see ``check_batch``).
        """
        self._check_usable()
        context, query, target, w = self._checked(x, weights, checked)
        if not isinstance(estimate, ResponsibilityAttentionDistribution):
            raise TypeError(f"estimate must be a ResponsibilityAttentionDistribution, got {type(estimate).__name__}")
        got = (estimate.num_symbols, estimate.context_length, estimate.query_dim, estimate.num_targets)
        if got != self._shape():
            raise ValueError(f"estimate has (S, N, D, T) = {got}: expected {self._shape()} like this accumulator")
        table = estimate.emission_table
        if self.layout == "sparse" and self.support is None:
            raise ValueError("a sparse accumulator needs its support before an E-step (it only initializes without)")
        if self.support is None and isinstance(table, SparseEmission):
            raise ValueError(
                "estimate has a sparse emission but this accumulator counts dense: make it with its support"
            )
        if self.support is not None and not (isinstance(table, SparseEmission) and table.support.same_as(self.support)):
            raise ValueError("estimate's emission is not sparse over this accumulator's support")
        try:
            per_position.accumulate_estep(
                context, query, target, w, estimate.kernel_parameters, self._stats, backend=self.backend, checked=True
            )
        except ImpossibleEvidenceError as exc:
            self._broken = f"holds a partial update ({exc})"
            raise

    def seq_update_windows(self, rows: WindowRows, estimate: ResponsibilityAttentionDistribution) -> None:
        """:meth:`seq_update` of rows given as token windows (:class:`~dist_respattn.model.rows.WindowRows`).

        An ``estimate`` that ties its prior over buckets runs the histogram kernel, and windows may be shorter than
        N (short histories; see :mod:`dist_respattn.model.buckets`). A free prior runs :meth:`seq_update`'s kernel
        on the windows where they lie (:func:`~dist_respattn.model.kernels.per_position.accumulate_estep_windows`:
        each query read from the query table by its row, no (n, N) or (n, D) copy), with the same statistics to
        the bit as :meth:`seq_update` of the same rows encoded; every window must then hold N tokens.
        """
        self._check_usable()
        if not isinstance(estimate, ResponsibilityAttentionDistribution):
            raise TypeError(f"estimate must be a ResponsibilityAttentionDistribution, got {type(estimate).__name__}")
        got = (estimate.num_symbols, estimate.context_length, estimate.query_dim, estimate.num_targets)
        if got != self._shape():
            raise ValueError(f"estimate has (S, N, D, T) = {got}: expected {self._shape()} like this accumulator")
        if estimate.buckets is None and self.backend != "numba":
            raise ValueError(
                f"backend = {self.backend!r}: token windows under a free prior run on the compiled kernel ('numba') "
                "only; give encoded rows"
            )
        table = estimate.emission_table
        if self.layout == "sparse" and not (
            self.support is not None and isinstance(table, SparseEmission) and table.support.same_as(self.support)
        ):
            raise ValueError("estimate's emission is not sparse over this accumulator's support")
        if self.layout == "dense" and isinstance(table, SparseEmission):
            raise ValueError(
                "estimate has a sparse emission but this accumulator counts dense: make it with its support"
            )
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)
        try:
            if estimate.buckets is None:
                per_position.accumulate_estep_windows(
                    rows.kernel_arrays(narrow_queries=True), estimate.kernel_parameters, self._stats
                )
            else:
                histogram.accumulate_windows(
                    rows, histogram.histogram_parameters(estimate), self._stats, estimate.buckets
                )
        except ImpossibleEvidenceError as exc:
            self._broken = f"holds a partial update ({exc})"
            raise

    def seq_initialize_windows(self, rows: WindowRows, buckets: PositionBuckets) -> None:
        """:meth:`seq_initialize_uniform` of window rows: ``1/m`` on each of a row's ``m`` positions, and the
        masked positions of a short row counted as rejected draws of a uniform prior (so the first prior is
        uniform over the N positions, as with full windows)."""
        self._check_usable()
        if buckets.context_length != self.context_length:
            raise ValueError(f"buckets cover N = {buckets.context_length} positions: expected {self.context_length}")
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)
        for start, stop in histogram.window_block_ranges(rows, self.context_length):
            block = rows.select(slice(start, stop))
            cells, masses = histogram.initialize_windows(block, buckets, self._stats, self.num_symbols)
            if self.layout == "sparse":
                self._count_cells(cells, masses)

    def _count_cells(self, cells: np.ndarray, masses: np.ndarray) -> None:
        """Add responsibility masses at target-major cells ``t * S + s`` to the sparse counts."""
        if self.support is None:
            self._add_row_pairs(tally_keys(cells, masses))
            return
        at = self.support.locate(cells % self.num_symbols, cells // self.num_symbols)
        if np.any(at < 0):
            raise ValueError("rows hold a (symbol, target) pair outside this accumulator's support")
        assert self._stats.pair_counts is not None
        self._stats.pair_counts += np.bincount(at, weights=masses, minlength=self.support.num_pairs)

    def initialize(self, x: tuple[Any, Any, int], weight: float, rng: Any) -> None:
        """Add one weighted triple with random responsibilities."""
        weights = np.array([as_nonnegative_float(weight, "weight")])
        self.seq_initialize(self.acc_to_encoder().seq_encode([x]), weights, rng)

    def seq_initialize(
        self, x: tuple[np.ndarray, np.ndarray, np.ndarray], weights: Any, rng: Any, *, checked: bool = False
    ) -> None:
        """Add an encoded batch with responsibilities drawn from a flat Dirichlet (breaks the symmetry EM keeps).

        ``rng`` is a ``np.random.Generator``, a ``np.random.RandomState`` or a seed; ``checked`` as in
        :meth:`seq_update`.
        """
        generator = rng if hasattr(rng, "standard_exponential") else np.random.default_rng(rng)

        def draw(rows: int) -> np.ndarray:
            # A flat Dirichlet draw is a row of iid exponentials divided by its sum.
            e = generator.standard_exponential((rows, self.context_length))
            return e / e.sum(axis=1, keepdims=True)

        self._initialize(x, weights, draw, checked)

    def seq_initialize_uniform(
        self, x: tuple[np.ndarray, np.ndarray, np.ndarray], weights: Any, *, checked: bool = False
    ) -> None:
        """Add an encoded batch with uniform responsibilities, ``1/N`` on every position.

        Their M-step is the first model of a uniform start: deterministic (no seed), every context
        position's co-occurrence with the target counted alike. ``checked`` as in :meth:`seq_update`.
        """
        uniform = 1.0 / self.context_length
        self._initialize(x, weights, lambda rows: np.full((rows, self.context_length), uniform), checked)

    def seq_initialize_uniform_windows(self, rows: WindowRows) -> None:
        """:meth:`seq_initialize_uniform` of rows given as full token windows
        (:class:`~dist_respattn.model.rows.WindowRows`), read where they lie: each query from the query table by its
        row, no (n, N) context, (n, D) query or (n, N) responsibilities made. The same statistics, to the bit, as
        :meth:`seq_initialize_uniform` of the same rows encoded (visited in the same blocks, every number added in
        the same order); every window must hold N tokens."""
        self._check_usable()
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)
        if self.layout == "sparse" and self.support is not None:
            # The window tally is the start pass's (which finds the support): counts on a support read encoded rows.
            self.seq_initialize_uniform(_encoded_windows(rows, self.context_length), rows.weight, checked=True)
            return
        arrays = rows.kernel_arrays(narrow_queries=True)
        uniform = 1.0 / self.context_length
        for start, stop in per_position.block_ranges(arrays.begin.shape[0], per_position.DEFAULT_BLOCK_ROWS):
            block = WindowArrays(
                arrays.tokens, arrays.begin[start:stop], arrays.end[start:stop], arrays.target[start:stop],
                arrays.query_table, arrays.query_index[start:stop],
                arrays.weight[start:stop] if arrays.weight.shape[0] else arrays.weight,
            )  # fmt: skip
            per_position.accumulate_uniform_windows(block, uniform, self._stats)
            if self.layout != "sparse":
                continue
            cells = (block.tokens, block.begin, block.target, block.weight, uniform, self.context_length)
            mass = window_exact_mass(block.weight, uniform)
            exact = self._exact
            if mass > 0.0 and self._row_pairs is None and (exact is None or exact.mass == mass):
                # Blocks of one exact mass (a uniform start on unweighted rows) are counted, not sorted, until the
                # value is taken: their sums are the same as the blocks' tallies merged one after the other.
                if exact is None:
                    exact = self._exact = ExactWindowCounts(mass)
                exact.add(*cells, self.num_symbols)
            else:
                self._add_row_pairs(tally_uniform_windows(*cells, self.num_symbols))

    def _initialize(
        self, x: tuple[np.ndarray, np.ndarray, np.ndarray], weights: Any, draw: Any, checked: bool = False
    ) -> None:
        """Add a batch under the responsibilities ``draw(rows)`` gives for each block, (rows, N) rows summing to one.

        A sparse accumulator without a support collects the pairs the rows hold: its value's counts
        carry them as their support (the start pass of a sparse fit finds its support this way).
        """
        self._check_usable()
        context, query, target, w = self._checked(x, weights, checked)
        for start, stop in per_position.block_ranges(context.shape[0], per_position.DEFAULT_BLOCK_ROWS):
            resp = draw(stop - start)
            w_block = None if w is None else w[start:stop]
            ctx_b, t_b = context[start:stop], target[start:stop]
            per_position.accumulate_responsibilities(ctx_b, query[start:stop], t_b, w_block, resp, self._stats)
            if self.layout == "sparse":
                self._count_pairs(ctx_b, t_b, resp if w_block is None else resp * w_block[:, None])

    def _count_pairs(self, context: np.ndarray, target: np.ndarray, mass: np.ndarray) -> None:
        """Add the (n, N) responsibility masses of a block's pairs to the sparse counts."""
        if self.support is None:
            # Rows of weight 0 (another side of a hold-out) hold no pair.
            self._add_row_pairs(tally_rows(context, target, mass, self.num_symbols))
            return
        live = mass.reshape(-1) > 0.0  # rows of weight 0 (another side of a hold-out) hold no pair
        cells = (target.astype(np.int64)[:, None] * self.num_symbols + context).reshape(-1)[live]
        self._count_cells(cells, mass.reshape(-1)[live])

    # ---------------------------------------------------------------------------- reduction

    def combine(self, suff_stat: Any) -> ResponsibilityAttentionAccumulator:
        """Add another accumulator's ``value()`` into this one; returns ``self``."""
        self._check_usable()
        other = SufficientStatistics.checked(suff_stat, self._shape())
        if other.emission_count.layout != self.layout:
            raise ValueError(f"cannot combine {other.emission_count.layout} statistics into {self.layout} ones")
        self._stats.key_sum += other.key_sum
        self._stats.key_mass += other.key_mass
        if self.layout == "dense":
            self._stats.emission_count_ts += other.emission_count.values_array()
        elif self.support is None:
            self._flush_row_pairs()
            self._collected.append(other.emission_count)  # type: ignore[arg-type]
        else:
            assert self._stats.pair_counts is not None
            self._stats.pair_counts += other.emission_count.values_array()
        self._stats.position_count += other.position_count
        self._stats.scalars += (other.query_sq, other.n_obs, other.log_lik)
        return self

    def _add_row_pairs(self, tally: tuple[np.ndarray, np.ndarray]) -> None:
        """Add a block's tally to the rows' pairs, after the blocks before it."""
        self._flush_exact()
        self._row_pairs = tally if self._row_pairs is None else merge_tallies(self._row_pairs, tally)

    def _flush_exact(self) -> None:
        """The blocks counted at one exact mass become the rows' pairs (there were none before them)."""
        if self._exact is not None:
            assert self._row_pairs is None
            self._row_pairs = self._exact.tally()
            self._exact = None

    def _flush_row_pairs(self) -> None:
        """Move the rows' pairs into the collected counts, after those collected before them (a fixed order)."""
        self._flush_exact()
        if self._row_pairs is not None:
            cells, counts = self._row_pairs
            self._collected.append(SparseEmissionCounts.from_tally(cells, counts, self.num_symbols, self.num_targets))
            self._row_pairs = None

    def _emission_value(self, copy: bool) -> EmissionCounts:
        s = self._stats
        if self.layout == "dense":
            return DenseEmissionCounts(_owned(s.emission_count_ts, copy))
        if self.support is None:
            self._flush_row_pairs()
            total = SparseEmissionCounts.union(self._collected, self.num_symbols, self.num_targets)
            self._collected = [total]
            return total.copy() if copy else total
        assert s.pair_counts is not None
        # An E-step's counts lie on the fit's support, which the model carries: they travel without it.
        return SparseEmissionCounts(
            _owned(s.pair_counts, copy), None, num_symbols=self.num_symbols, num_targets=self.num_targets
        )

    def value(self, *, copy: bool = True) -> SufficientStatistics:
        """A snapshot of the statistics (copies: later updates never alias it).

        ``copy=False`` hands over this accumulator's own arrays instead, and the accumulator can no longer
        be used: for a task whose accumulator ends with it (an E-step task's counts are as large as the
        support, and copying them cost about 5% of the task).
        """
        self._check_usable()
        s = self._stats
        query_sq, n_obs, log_lik = (float(v) for v in s.scalars)
        value = SufficientStatistics(
            _owned(s.key_sum, copy),
            _owned(s.key_mass, copy),
            self._emission_value(copy),
            _owned(s.position_count, copy),
            query_sq,
            n_obs,
            log_lik,
        )
        if not copy:
            self._broken = "handed its arrays over with value(copy=False)"
        return value

    def from_value(self, x: Any) -> ResponsibilityAttentionAccumulator:
        """Set the statistics from a ``value()`` (or the reference library's 5-field value); returns ``self``."""
        stats = SufficientStatistics.checked(x, self._shape())
        counts = stats.emission_count
        if counts.layout != self.layout:
            raise ValueError(f"cannot set {counts.layout} statistics on a {self.layout} accumulator")
        self._stats = per_position.StatisticArrays(
            key_sum=_aligned_copy(stats.key_sum),
            key_mass=_aligned_copy(stats.key_mass),
            emission_count_ts=_aligned_copy(counts.values_array()) if self.layout == "dense" else np.zeros((0, 0)),
            position_count=stats.position_count.copy(),
            scalars=np.array([stats.query_sq, stats.n_obs, stats.log_lik]),
            pair_counts=(
                _aligned_copy(counts.values_array()) if self.layout == "sparse" and self.support is not None else None
            ),
            support=self.support,
        )
        self._collected = [counts.copy()] if self.layout == "sparse" and self.support is None else []  # type: ignore[list-item]
        self._row_pairs = None
        self._exact = None
        self._broken = None
        return self

    def key_merge(self, stats_dict: dict[str, Any]) -> None:
        """Pool this accumulator into ``stats_dict[self.keys]`` (the first one seen becomes the pool)."""
        if self.keys is not None:
            if self.keys in stats_dict:
                stats_dict[self.keys].combine(self.value())
            else:
                stats_dict[self.keys] = self

    def key_replace(self, stats_dict: dict[str, Any]) -> None:
        """Replace these statistics by the pool ``stats_dict[self.keys]`` (after every member merged)."""
        if self.keys is not None and self.keys in stats_dict:
            self.from_value(stats_dict[self.keys].value())

    def acc_to_encoder(self) -> ResponsibilityAttentionDataEncoder:
        """The encoder of the triples this accumulator takes."""
        return ResponsibilityAttentionDataEncoder(*self._shape())


class ResponsibilityAttentionAccumulatorFactory:
    """Makes empty accumulators of one shape (S, N, D, T)."""

    def __init__(
        self,
        num_symbols: int,
        context_length: int,
        query_dim: int,
        num_targets: int,
        keys: str | None = None,
        name: str | None = None,
        *,
        backend: per_position.Backend = "numba",
        layout: str = "dense",
    ) -> None:
        self.num_symbols = num_symbols
        self.context_length = context_length
        self.query_dim = query_dim
        self.num_targets = num_targets
        self.keys = keys
        self.name = name
        self.backend = backend
        self.layout = layout

    def make(self, support: PairSupport | None = None) -> ResponsibilityAttentionAccumulator:
        """A new, empty accumulator (sparse ones over ``support``; without it they only initialize)."""
        return ResponsibilityAttentionAccumulator(
            self.num_symbols,
            self.context_length,
            self.query_dim,
            self.num_targets,
            keys=self.keys,
            name=self.name,
            backend=self.backend,
            layout=self.layout,
            support=support,
        )

    def make_for(self, model: ResponsibilityAttentionDistribution) -> ResponsibilityAttentionAccumulator:
        """A new, empty accumulator for E-steps under ``model`` (over its support when its emission is sparse)."""
        table = model.emission_table
        return self.make(table.support if isinstance(table, SparseEmission) else None)


def _encoded_windows(rows: WindowRows, context_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full token windows as an encoded batch ``(context (n, N), query (n, D), target (n,))`` (copies)."""
    begin = np.asarray(rows.begin, dtype=np.int64)
    if np.any(np.asarray(rows.end, dtype=np.int64) - begin != context_length):
        raise ValueError(f"a free position prior reads full windows of N = {context_length} tokens")
    context = np.asarray(rows.tokens)[begin[:, None] + np.arange(context_length)]
    return context, np.asarray(rows.query_table)[np.asarray(rows.query_index)], np.asarray(rows.target)


class _NoCounts:
    """The emission counts of a value whose counts are summed apart (:meth:`SufficientStatistics.sum_of`)."""

    def copy(self) -> _NoCounts:
        return self

    def add(self, other: Any) -> None:
        pass


_NO_COUNTS: Any = _NoCounts()
