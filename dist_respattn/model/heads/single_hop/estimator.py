"""The closed-form M-step of the responsibility-attention head: maximum likelihood, or MAP under the emission prior.

An M-step first fixes what the statistics determine alone (the keys, the position prior, a learned
gate variance) into :class:`MStepCandidates`; the open choices (a held-out gate variance and the
emission prior's strengths, :class:`~dist_respattn.model.fitting.selection.Hyperparameters`) then pick one model
out of them, either fixed by the estimator or chosen on held-out rows by the EM loop.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.model.arguments import as_nonnegative_float, as_positive_float, as_positive_int
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import Emission, EmissionCounts, SparseEmission, SparseEmissionCounts
from dist_respattn.model.emission.prior import BACKOFF_KINDS, EmissionPrior
from dist_respattn.model.fitting.selection import (
    GridTable,
    GridTotals,
    Hyperparameters,
    HyperparameterSearch,
    Selection,
)
from dist_respattn.model.heads.single_hop.accumulator import (
    ResponsibilityAttentionAccumulatorFactory,
    SufficientStatistics,
)
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.kernels import per_position

__all__ = [
    "GridPoints",
    "MStepCandidates",
    "ResponsibilityAttentionEstimator",
    "estimate_key_means",
    "estimate_parameters",
    "grid_points",
    "grid_table_of",
    "position_prior_of",
    "select_point",
]

#: The reference library's additive emission smoothing, used when no emission prior is given.
REFERENCE_EMISSION_SMOOTHING = 1e-6


def estimate_key_means(stats: SufficientStatistics, previous_key_means: np.ndarray | None) -> np.ndarray:
    """``K[s] = key_sum[s] / key_mass[s]``; a symbol with no mass keeps its previous key, else the pooled mean."""
    query_dim = stats.key_sum.shape[1]
    mass = stats.key_mass
    live = mass > 0.0
    key_means = np.empty_like(stats.key_sum)
    key_means[live] = stats.key_sum[live] / mass[live, None]
    if not live.all():
        if previous_key_means is not None:
            key_means[~live] = previous_key_means[~live]
        else:
            total_mass = float(mass.sum())
            pooled = stats.key_sum.sum(axis=0) / total_mass if total_mass > 0.0 else np.zeros(query_dim)
            key_means[~live] = pooled
    return key_means


def position_prior_of(
    stats: SufficientStatistics, pseudo_count: float | None, buckets: PositionBuckets | None = None
) -> np.ndarray:
    """``pi_i ∝ position_count[i] + pseudo_count / N``; uniform when there is no mass.

    Tied over ``buckets``: ``pi_i = pi_b / |b|`` with ``pi_b`` the same expression summed over the bucket.
    """
    if buckets is not None:
        return buckets.tie(stats.position_count, pseudo_count)
    context_length = stats.position_count.shape[0]
    prior_counts = stats.position_count + (0.0 if pseudo_count is None else pseudo_count / context_length)
    prior_total = float(prior_counts.sum())
    return prior_counts / prior_total if prior_total > 0.0 else np.full(context_length, 1.0 / context_length)


def _learned_sigma2(stats: SufficientStatistics, *, kept: float, min_sigma2: float) -> float:
    """The pooled within-symbol variance ``(query_sq - sum ||key_sum||^2 / key_mass) / (D sum key_mass)``, floored."""
    mass = stats.key_mass
    live = mass > 0.0
    total_mass = float(mass[live].sum())
    if total_mass <= 0.0:
        return kept
    explained = float(np.sum(np.einsum("sd,sd->s", stats.key_sum[live], stats.key_sum[live]) / mass[live]))
    return max(min_sigma2, (stats.query_sq - explained) / (stats.key_sum.shape[1] * total_mass))


def estimate_parameters(
    stats: SufficientStatistics,
    *,
    sigma2: float,
    estimate_sigma2: bool,
    min_sigma2: float,
    emission_smoothing: float,
    pseudo_count: float | None,
    previous_key_means: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The M-step on arrays: ``(key_means (S, D), emission (S, T), position_prior (N,), sigma2)``.

    - ``K[s] = key_sum[s] / key_mass[s]``. A symbol with zero mass keeps ``previous_key_means[s]``
      when given, else takes the pooled mean query ``sum_s key_sum[s] / sum_s key_mass[s]`` (zeros
      when there is no mass at all): a defined key, never NaN.
    - ``B[s, t] = (emission_count[s, t] + a) / (sum_t emission_count[s, t] + T a)`` with
      ``a = emission_smoothing``; a row with no mass and ``a = 0`` is uniform.
    - ``pi_i ∝ position_count[i] + pseudo_count / N`` (a symmetric Dirichlet prior of total strength
      ``pseudo_count``; none when ``None``); uniform when there is no mass.
    - With ``estimate_sigma2``: ``sigma2 = max(min_sigma2, (query_sq - sum_s ||key_sum[s]||^2 / key_mass[s])
      / (D sum_s key_mass[s]))``, the pooled within-symbol variance; otherwise ``sigma2`` is kept.
    """
    key_means = estimate_key_means(stats, previous_key_means)
    emission = stats.emission_count.additive_emission(emission_smoothing).to_dense()
    position_prior = position_prior_of(stats, pseudo_count)
    new_sigma2 = _learned_sigma2(stats, kept=sigma2, min_sigma2=min_sigma2) if estimate_sigma2 else sigma2
    return key_means, emission, position_prior, new_sigma2


@dataclass(frozen=True)
class MStepCandidates:
    """An M-step with its open choices left open: every model it can give, one per :class:`Hyperparameters`.

    Attributes:
        key_means: (S, D) the new keys; ``position_prior``: (N,) the new prior.
        emission_count: the E-step's counts the emission is made from (either layout).
        prior: the emission's Dirichlet prior, or ``None`` for the reference's additive smoothing.
        emission_smoothing: the additive smoothing when ``prior`` is ``None``.
        sigma2: the gate variance the estimator gives (learned, or fixed) when it is not chosen.
        query_scale: ``query_sq / (n_obs D)``, the scale a searched gate variance is a multiple of.
        defaults: the hyperparameters used when nothing is chosen on held-out rows.
        name: name of the models made.
    """

    key_means: np.ndarray
    position_prior: np.ndarray
    emission_count: EmissionCounts
    prior: EmissionPrior | None
    emission_smoothing: float
    sigma2: float
    query_scale: float
    defaults: Hyperparameters
    name: str | None = None
    buckets: PositionBuckets | None = None

    def emission(self, hyperparameters: Hyperparameters) -> Emission:
        """The emission under these strengths (the additive smoothing ignores them), in the counts' layout."""
        if self.prior is None:
            return self.emission_count.additive_emission(self.emission_smoothing)
        strengths = self.prior.strengths(hyperparameters.emission_strength, hyperparameters.type_strength)
        return self.emission_count.map_emission(strengths, self.prior.base, self.row_totals)

    @functools.cached_property
    def row_totals(self) -> np.ndarray:
        """(S,) the counts' row totals, computed once for the grid table and the chosen model (a pass over the
        support's pairs: ~0.1 s at 14M pairs)."""
        return self.emission_count.row_totals()

    def model(self, hyperparameters: Hyperparameters | None = None) -> ResponsibilityAttentionDistribution:
        """The head under ``hyperparameters`` (default: :attr:`defaults`)."""
        hp = hyperparameters or self.defaults
        return ResponsibilityAttentionDistribution(
            self.key_means, self.emission(hp), self.position_prior, hp.sigma2, self.name, buckets=self.buckets
        )

    def grid_table(self, search: HyperparameterSearch) -> GridTable:
        """The arrays the held-out grid pass reads, with the values ``search`` tries (the defaults elsewhere)."""
        counts = self.emission_count
        points = grid_points(
            search, self.defaults, self.query_scale, additive=self.prior is None,
            num_targets=counts.num_targets, emission_smoothing=self.emission_smoothing,
        )  # fmt: skip
        prior = EmissionPrior.uniform(counts.num_symbols, counts.num_targets) if self.prior is None else self.prior
        return grid_table_of(
            points, self.key_means, self.position_prior, counts, self.row_totals, prior.base, prior.types,
            self.buckets,
        )  # fmt: skip

    def select(self, table: GridTable, totals: GridTotals) -> Selection:
        """The grid point of ``table`` with the best held-out predictive likelihood in ``totals``.

        Without held-out weight nothing can be chosen: the defaults, with no scores.
        """
        return select_point(table.hyperparameters, totals, self.defaults, additive=self.prior is None)


@dataclass(frozen=True)
class GridPoints:
    """The values a grid tries on each axis (gate variances, emission strengths, type strengths): what the held-out
    pass scores, apart from the M-step's arrays."""

    sigma2: tuple[float, ...]
    emission_strengths: tuple[float, ...]
    type_strengths: tuple[float, ...]

    def hyperparameters(self, index: tuple[int, int, int]) -> Hyperparameters:
        g, h, b = index
        return Hyperparameters(float(self.sigma2[g]), float(self.emission_strengths[h]), float(self.type_strengths[b]))


def grid_points(
    search: HyperparameterSearch,
    defaults: Hyperparameters,
    query_scale: float,
    *,
    additive: bool,
    num_targets: int,
    emission_smoothing: float,
) -> GridPoints:
    """The values ``search`` tries (the defaults on the axes it does not search); an ``additive`` smoothing ``a`` is
    the uniform base with strength ``T a``, not searched."""
    d = defaults
    scales = search.sigma2_scales
    sigma2 = (d.sigma2,) if scales is None else tuple(query_scale * s for s in scales)
    if additive:
        strengths: tuple[float, ...] = (num_targets * emission_smoothing,)
        type_strengths: tuple[float, ...] = (0.0,)
    else:
        strengths = (d.emission_strength,) if search.emission_strengths is None else search.emission_strengths
        type_strengths = (d.type_strength,) if search.type_strengths is None else search.type_strengths
    return GridPoints(sigma2, strengths, type_strengths)


def grid_table_of(
    points: GridPoints,
    key_means: np.ndarray,
    position_prior: np.ndarray,
    counts: EmissionCounts,
    row_totals: np.ndarray,
    base: np.ndarray,
    types: np.ndarray,
    buckets: PositionBuckets | None,
) -> GridTable:
    """The :class:`GridTable` of an M-step's arrays at ``points`` (``base`` and ``types``: its emission prior's)."""
    with np.errstate(divide="ignore"):
        log_prior = np.log(position_prior)
    return GridTable(
        key_means=np.ascontiguousarray(key_means, dtype=np.float64),
        log_prior=log_prior,
        counts=counts,
        row_totals=row_totals,
        base=base,
        types=types,
        sigma2=np.array(points.sigma2, dtype=np.float64),
        emission_strengths=np.array(points.emission_strengths, dtype=np.float64),
        type_strengths=np.array(points.type_strengths, dtype=np.float64),
        buckets=buckets,
    )


def select_point(hyperparameters: Any, totals: GridTotals, defaults: Hyperparameters, *, additive: bool) -> Selection:
    """The grid point (``hyperparameters(index)``) with the best held-out predictive likelihood in ``totals``; the
    defaults, with no scores, without held-out weight. An additive smoothing keeps its own strength."""
    if totals.weight <= 0.0:
        return Selection(defaults, None)
    index = totals.best()
    hp = hyperparameters(index)
    if additive:
        hp = dataclasses.replace(defaults, sigma2=hp.sigma2)
    return Selection(hp, totals.metrics(index))


class ResponsibilityAttentionEstimator:
    """Estimates a :class:`ResponsibilityAttentionDistribution` by closed-form EM M-steps.

    Args:
        num_symbols: S, the number of context symbols.
        context_length: N, the context positions of a row.
        query_dim: D, the query's dimension.
        num_targets: T, the number of targets.
        sigma2: the gate variance when ``estimate_sigma2`` is False (kept fixed, unless ``search`` chooses
            it on held-out rows); unused otherwise except as the value kept when the statistics carry no mass.
        estimate_sigma2: learn the shared isotropic gate variance by maximum likelihood (see
            :func:`estimate_parameters`). With the query made from the current token this collapses onto
            ``min_sigma2``; choosing it on held-out rows (``search``) does not.
        min_sigma2: floor of the learned variance, against collapse onto single points.
        emission_smoothing: the reference library's additive smoothing of the emission counts (>= 0);
            default 1e-6 when no ``emission_prior`` is given. Not with ``emission_prior``.
        pseudo_count: strength of a symmetric Dirichlet prior on the position prior (>= 0), or None.
            (The reference library accepts and ignores it.)
        name: name given to the estimated distributions.
        keys: tie name handed to the accumulators (see ``ResponsibilityAttentionAccumulator``).
        emission_prior: the emission's Dirichlet prior (:mod:`dist_respattn.model.emission.prior`): an
            :class:`EmissionPrior`, or the name of its kind (``"continuation"``, ``"unigram"``,
            ``"uniform"``), which :meth:`resolved` turns into one from the training rows' pairs
            (``fit_em`` and the engine do this).
        emission_strength: the prior's strength per row, ``a_s = emission_strength + type_strength n_s``, when
            the strengths are not chosen on held-out rows.
        type_strength: the prior's strength per distinct successor ``n_s`` of a symbol, as above.
        search: the hyperparameters an EM loop with held-out rows chooses after every M-step, and the
            values it tries (``None``: nothing is chosen;
            :data:`~dist_respattn.model.fitting.selection.DEFAULT_SEARCH`).
        buckets: recency buckets the position prior is tied over (``None``: a free prior); see
            :mod:`dist_respattn.model.buckets`.
    """

    def __init__(
        self,
        num_symbols: int,
        context_length: int,
        query_dim: int,
        num_targets: int,
        *,
        sigma2: float = 1.0,
        estimate_sigma2: bool = False,
        min_sigma2: float = 1e-6,
        emission_smoothing: float | None = None,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
        emission_prior: EmissionPrior | str | None = None,
        emission_strength: float = 1.0,
        type_strength: float = 1.0,
        search: HyperparameterSearch | None = None,
        buckets: PositionBuckets | None = None,
    ) -> None:
        if not isinstance(estimate_sigma2, (bool, np.bool_)):
            raise TypeError(f"estimate_sigma2 = {estimate_sigma2!r}: expected True or False")
        self.num_symbols = as_positive_int(num_symbols, "num_symbols")
        self.context_length = as_positive_int(context_length, "context_length")
        self.query_dim = as_positive_int(query_dim, "query_dim")
        self.num_targets = as_positive_int(num_targets, "num_targets")
        self.sigma2 = as_positive_float(sigma2, "sigma2")
        self.estimate_sigma2 = bool(estimate_sigma2)
        self.min_sigma2 = as_positive_float(min_sigma2, "min_sigma2")
        if emission_prior is not None and emission_smoothing is not None:
            raise ValueError("give emission_smoothing (additive) or emission_prior (MAP), not both")
        if isinstance(emission_prior, str) and emission_prior not in BACKOFF_KINDS:
            raise ValueError(f"emission_prior = {emission_prior!r}: expected one of {', '.join(BACKOFF_KINDS)}")
        if isinstance(emission_prior, EmissionPrior) and (
            emission_prior.num_symbols,
            emission_prior.num_targets,
        ) != (self.num_symbols, self.num_targets):
            raise ValueError(
                f"emission_prior has (S, T) = {(emission_prior.num_symbols, emission_prior.num_targets)}: "
                f"expected {(self.num_symbols, self.num_targets)}"
            )
        self.emission_prior = emission_prior
        self.emission_smoothing = as_nonnegative_float(
            REFERENCE_EMISSION_SMOOTHING if emission_smoothing is None else emission_smoothing, "emission_smoothing"
        )
        self.emission_strength = as_nonnegative_float(emission_strength, "emission_strength")
        self.type_strength = as_nonnegative_float(type_strength, "type_strength")
        if emission_prior is not None and self.emission_strength == 0.0 and self.type_strength == 0.0:
            raise ValueError("emission_strength and type_strength are both 0: the emission prior would have no weight")
        kind = emission_prior.kind if isinstance(emission_prior, EmissionPrior) else emission_prior
        if kind == "uniform" and self.emission_strength == 0.0:
            raise ValueError("emission_strength is 0 with the uniform prior: it has no type counts, so no weight")
        self.pseudo_count = None if pseudo_count is None else as_nonnegative_float(pseudo_count, "pseudo_count")
        if search is not None and not isinstance(search, HyperparameterSearch):
            raise TypeError(f"search must be a HyperparameterSearch or None, got {type(search).__name__}")
        if search is not None and search.sigma2_scales is not None and self.estimate_sigma2:
            raise ValueError("sigma2 is either learned (estimate_sigma2) or chosen on held-out rows (search), not both")
        if (
            search is not None
            and emission_prior is None
            and (search.emission_strengths is not None or search.type_strengths is not None)
        ):
            raise ValueError("searching the emission strengths needs an emission_prior (additive smoothing has none)")
        self.search = search
        self.name = name
        self.keys = keys
        if buckets is not None and buckets.context_length != self.context_length:
            raise ValueError(f"buckets cover N = {buckets.context_length} positions: expected {self.context_length}")
        self.buckets = buckets

    def __repr__(self) -> str:
        return (
            f"ResponsibilityAttentionEstimator(S={self.num_symbols}, N={self.context_length}, D={self.query_dim}, "
            f"T={self.num_targets}, sigma2={self.sigma2!r}, estimate_sigma2={self.estimate_sigma2})"
        )

    @property
    def needs_pairs(self) -> bool:
        """Whether :meth:`resolved` must be called with the training rows' pairs before estimating."""
        return isinstance(self.emission_prior, str)

    def resolved(self, prior: EmissionPrior) -> ResponsibilityAttentionEstimator:
        """A copy whose emission prior is ``prior`` (made from the training rows' pairs)."""
        copy = object.__new__(ResponsibilityAttentionEstimator)
        copy.__dict__.update(self.__dict__)
        if (prior.num_symbols, prior.num_targets) != (self.num_symbols, self.num_targets):
            raise ValueError(
                f"the emission prior has (S, T) = {(prior.num_symbols, prior.num_targets)}: "
                f"expected {(self.num_symbols, self.num_targets)}"
            )
        copy.emission_prior = prior
        return copy

    def accumulator_factory(
        self, *, backend: per_position.Backend = "numba", layout: str = "dense"
    ) -> ResponsibilityAttentionAccumulatorFactory:
        """A factory of empty accumulators of this estimator's shape and tie name, counting the emission in
        ``layout``."""
        return ResponsibilityAttentionAccumulatorFactory(
            self.num_symbols,
            self.context_length,
            self.query_dim,
            self.num_targets,
            keys=self.keys,
            name=self.name,
            backend=backend,
            layout=layout,
        )

    def candidates(
        self, suff_stat: Any, *, previous: ResponsibilityAttentionDistribution | None = None
    ) -> MStepCandidates:
        """The M-step up to its open choices (see :class:`MStepCandidates`)."""
        stats = SufficientStatistics.checked(
            suff_stat, (self.num_symbols, self.context_length, self.query_dim, self.num_targets)
        )
        if isinstance(self.emission_prior, str):
            raise ValueError(
                f"emission_prior = {self.emission_prior!r} is made from the training rows' (symbol, target) pairs: "
                "fit with fit_em or the engine, or pass estimator.resolved(EmissionPrior.from_pairs(pairs))"
            )
        counts = stats.emission_count
        if isinstance(counts, SparseEmissionCounts) and counts.support is None:
            # An E-step's sparse counts travel without the support: it is the model's.
            table = None if previous is None else previous.emission_table
            if not isinstance(table, SparseEmission):
                raise ValueError("sparse statistics without a support need the sparse model of their E-step (previous)")
            counts = counts.on(table.support)
        sigma2, defaults, query_scale = self.choice_scalars(stats, None if previous is None else previous.sigma2)
        return MStepCandidates(
            key_means=estimate_key_means(stats, None if previous is None else previous.key_means),
            position_prior=position_prior_of(stats, self.pseudo_count, self.buckets),
            emission_count=counts,
            prior=self.emission_prior,
            emission_smoothing=self.emission_smoothing,
            sigma2=sigma2,
            query_scale=query_scale,
            defaults=defaults,
            name=self.name,
            buckets=self.buckets,
        )

    def choice_scalars(
        self, stats: SufficientStatistics, previous_sigma2: float | None
    ) -> tuple[float, Hyperparameters, float]:
        """``(sigma2, defaults, query_scale)`` of an M-step: the gate variance the estimator gives (learned, or kept:
        the previous head's ``previous_sigma2`` when learned), the hyperparameters used when nothing is chosen, and
        ``query_sq / (n_obs D)``, the scale a searched gate variance is a multiple of. Read from the statistics'
        keys, position counts and scalars alone (not the emission counts)."""
        kept = self.sigma2 if previous_sigma2 is None or not self.estimate_sigma2 else previous_sigma2
        sigma2 = _learned_sigma2(stats, kept=kept, min_sigma2=self.min_sigma2) if self.estimate_sigma2 else kept
        if self.emission_prior is None:
            defaults = Hyperparameters(sigma2, self.num_targets * self.emission_smoothing, 0.0)
        else:
            defaults = Hyperparameters(sigma2, self.emission_strength, self.type_strength)
        n_obs = stats.n_obs if stats.n_obs > 0.0 else float(stats.position_count.sum())
        query_scale = stats.query_sq / (n_obs * self.query_dim) if n_obs > 0.0 and stats.query_sq > 0.0 else 1.0
        return sigma2, defaults, query_scale

    def estimate(
        self,
        nobs: float | None,
        suff_stat: Any,
        *,
        previous: ResponsibilityAttentionDistribution | None = None,
    ) -> ResponsibilityAttentionDistribution:
        """The M-step: a new distribution from an accumulator ``value()``, with the fixed hyperparameters.

        ``nobs`` is accepted for the reference protocol; the statistics carry their own count.
        ``previous`` (the model of the E-step) supplies the keys of symbols that received no mass.
        """
        return self.candidates(suff_stat, previous=previous).model()
