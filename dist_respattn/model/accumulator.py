"""Additive sufficient statistics of the responsibility-attention head, and their accumulator."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dist_respattn.model import kernels
from dist_respattn.model._checks import ImpossibleEvidenceError, as_encoded, as_nonnegative_float, as_weights, plain
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.encoder import ResponsibilityAttentionDataEncoder

__all__ = [
    "ResponsibilityAttentionAccumulator",
    "ResponsibilityAttentionAccumulatorFactory",
    "SufficientStatistics",
]


def _raise_at_first(array: np.ndarray, bad: np.ndarray, name: str, what: str, expected: str) -> None:
    """Raise a ValueError naming the first entry of ``array`` where ``bad`` holds."""
    where = np.argwhere(bad)
    if where.size:
        index = tuple(int(v) for v in where[0])
        label = ", ".join(str(v) for v in index)
        raise ValueError(f"{name} holds {what}: {name}[{label}] = {plain(array[index])}, expected {expected}")


class SufficientStatistics(NamedTuple):
    """The value of an accumulator: plain float64 arrays and floats, additive over rows.

    The first five fields are those of the reference library's value, in its order, so
    ``key_sum, key_mass, emission_count, position_count, query_sq = value[:5]`` works for both.

    Attributes:
        key_sum: (S, D) ``sum_n sum_i w_n r_ni [c_ni = s] y_n``.
        key_mass: (S,) ``sum_n sum_i w_n r_ni [c_ni = s]``.
        emission_count: (S, T) ``sum_n sum_i w_n r_ni [c_ni = s][t_n = t]``.
        position_count: (N,) ``sum_n w_n r_ni``.
        query_sq: ``sum_n w_n ||y_n||^2``.
        n_obs: ``sum_n w_n``.
        log_lik: ``sum_n w_n L_n``, the weighted log-likelihood of the model the E-step used
            (0 for statistics from a random initialization, which has no model).
    """

    key_sum: np.ndarray
    key_mass: np.ndarray
    emission_count: np.ndarray
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
        return cls(key_sum, key_mass, emission_count, position_count, query_sq, n_obs, log_lik)

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
        arrays = []
        for (name, want), array in zip(expected.items(), fields[:4], strict=True):
            a = np.asarray(array, dtype=np.float64)
            if a.shape != want:
                raise ValueError(f"{name} has shape {a.shape}: expected {want}")
            _raise_at_first(a, ~np.isfinite(a), name, "a non-finite value", "finite values")
            if name != "key_sum":
                _raise_at_first(a, a < 0.0, name, "a negative value", "non-negative masses")
            arrays.append(a)
        query_sq = as_nonnegative_float(fields[4], "query_sq")
        n_obs = as_nonnegative_float(fields[5], "n_obs")
        log_lik = float(fields[6])
        if np.isinf(log_lik):
            raise ValueError(f"log_lik = {log_lik!r}: expected a finite number (or nan when unknown)")
        key_sum, key_mass, emission_count, position_count = arrays
        return cls(key_sum, key_mass, emission_count, position_count, query_sq, n_obs, log_lik)


class ResponsibilityAttentionAccumulator:
    """Accumulates the sufficient statistics of the M-step from weighted triples.

    Args:
        num_symbols, context_length, query_dim, num_targets: S, N, D, T.
        keys: name under which accumulators are tied (pooled by ``key_merge``, then every member
            replaced by the pool in ``key_replace``); ``None`` ties nothing.
        name: optional name.
        backend: ``"numba"`` (the compiled, fused kernel) or ``"numpy"`` (vectorized blocks).

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
        backend: kernels.Backend = "numba",
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
        self._stats = kernels.StatisticArrays.zeros(
            self.num_symbols, self.context_length, self.query_dim, self.num_targets
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
        """(S, T) responsibility mass per (symbol, target): a view of the target-major table."""
        return self._stats.emission_count_ts.T

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
            raise RuntimeError(f"this accumulator holds a partial update ({self._broken}); make a new one")

    def _encoded(self, x: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return as_encoded(x, context_length=self.context_length, query_dim=self.query_dim)

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
    ) -> None:
        """Add an encoded batch ``(context (n, N), query (n, D), target (n,))`` with weights (n,) or ``None``.

        Runs the E-step under ``estimate`` and adds the responsibility-weighted statistics, the
        weighted count and the weighted log-likelihood. Bad values raise before anything is added.
        """
        self._check_usable()
        context, query, target = self._encoded(x)
        w = as_weights(weights, context.shape[0])
        if not isinstance(estimate, ResponsibilityAttentionDistribution):
            raise TypeError(f"estimate must be a ResponsibilityAttentionDistribution, got {type(estimate).__name__}")
        got = (estimate.num_symbols, estimate.context_length, estimate.query_dim, estimate.num_targets)
        if got != self._shape():
            raise ValueError(f"estimate has (S, N, D, T) = {got}: expected {self._shape()} like this accumulator")
        try:
            kernels.accumulate_estep(
                context, query, target, w, estimate.kernel_parameters, self._stats, backend=self.backend
            )
        except ImpossibleEvidenceError as exc:
            self._broken = str(exc)
            raise

    def initialize(self, x: tuple[Any, Any, int], weight: float, rng: Any) -> None:
        """Add one weighted triple with random responsibilities."""
        weights = np.array([as_nonnegative_float(weight, "weight")])
        self.seq_initialize(self.acc_to_encoder().seq_encode([x]), weights, rng)

    def seq_initialize(self, x: tuple[np.ndarray, np.ndarray, np.ndarray], weights: Any, rng: Any) -> None:
        """Add an encoded batch with responsibilities drawn from a flat Dirichlet (breaks the symmetry EM keeps).

        ``rng`` is a ``np.random.Generator``, a ``np.random.RandomState`` or a seed.
        """
        self._check_usable()
        context, query, target = self._encoded(x)
        w = as_weights(weights, context.shape[0])
        kernels.scan_values(context, query, target, w, num_symbols=self.num_symbols, num_targets=self.num_targets)
        generator = rng if hasattr(rng, "standard_exponential") else np.random.default_rng(rng)
        for start, stop in kernels.block_ranges(context.shape[0], kernels.DEFAULT_BLOCK_ROWS):
            # A flat Dirichlet draw is a row of iid exponentials divided by its sum.
            e = generator.standard_exponential((stop - start, self.context_length))
            e /= e.sum(axis=1, keepdims=True)
            kernels.accumulate_responsibilities(
                context[start:stop],
                query[start:stop],
                target[start:stop],
                None if w is None else w[start:stop],
                e,
                self._stats,
            )

    def seq_initialize_uniform(self, x: tuple[np.ndarray, np.ndarray, np.ndarray], weights: Any) -> None:
        """Add an encoded batch with uniform responsibilities, ``1/N`` on every position.

        Their M-step is the first model of a uniform start: deterministic (no seed), every context
        position's co-occurrence with the target counted alike.
        """
        self._check_usable()
        context, query, target = self._encoded(x)
        w = as_weights(weights, context.shape[0])
        kernels.scan_values(context, query, target, w, num_symbols=self.num_symbols, num_targets=self.num_targets)
        for start, stop in kernels.block_ranges(context.shape[0], kernels.DEFAULT_BLOCK_ROWS):
            uniform = np.full((stop - start, self.context_length), 1.0 / self.context_length)
            kernels.accumulate_responsibilities(
                context[start:stop],
                query[start:stop],
                target[start:stop],
                None if w is None else w[start:stop],
                uniform,
                self._stats,
            )

    # ---------------------------------------------------------------------------- reduction

    def combine(self, suff_stat: Any) -> ResponsibilityAttentionAccumulator:
        """Add another accumulator's ``value()`` into this one; returns ``self``."""
        self._check_usable()
        other = SufficientStatistics.checked(suff_stat, self._shape())
        self._stats.key_sum += other.key_sum
        self._stats.key_mass += other.key_mass
        self._stats.emission_count_ts += other.emission_count.T
        self._stats.position_count += other.position_count
        self._stats.scalars += (other.query_sq, other.n_obs, other.log_lik)
        return self

    def value(self) -> SufficientStatistics:
        """A snapshot of the statistics (copies: later updates never alias it)."""
        self._check_usable()
        s = self._stats
        query_sq, n_obs, log_lik = (float(v) for v in s.scalars)
        # ``order="K"`` keeps the target-major memory order (an (S, T) array in Fortran order), so
        # combining it back is a contiguous add.
        return SufficientStatistics(
            s.key_sum.copy(),
            s.key_mass.copy(),
            s.emission_count_ts.T.copy(order="K"),
            s.position_count.copy(),
            query_sq,
            n_obs,
            log_lik,
        )

    def from_value(self, x: Any) -> ResponsibilityAttentionAccumulator:
        """Set the statistics from a ``value()`` (or the reference library's 5-field value); returns ``self``."""
        stats = SufficientStatistics.checked(x, self._shape())
        self._stats = kernels.StatisticArrays(
            key_sum=stats.key_sum.copy(),
            key_mass=stats.key_mass.copy(),
            emission_count_ts=np.array(stats.emission_count.T, order="C"),  # always a copy
            position_count=stats.position_count.copy(),
            scalars=np.array([stats.query_sq, stats.n_obs, stats.log_lik]),
        )
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
        backend: kernels.Backend = "numba",
    ) -> None:
        self.num_symbols = num_symbols
        self.context_length = context_length
        self.query_dim = query_dim
        self.num_targets = num_targets
        self.keys = keys
        self.name = name
        self.backend = backend

    def make(self) -> ResponsibilityAttentionAccumulator:
        """A new, empty accumulator."""
        return ResponsibilityAttentionAccumulator(
            self.num_symbols,
            self.context_length,
            self.query_dim,
            self.num_targets,
            keys=self.keys,
            name=self.name,
            backend=self.backend,
        )
