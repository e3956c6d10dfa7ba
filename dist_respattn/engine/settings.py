"""A fit's settings: what fixes its result, saved with every checkpoint and checked on ``resume``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dist_respattn.engine.reduction import DEFAULT_FAN_IN
from dist_respattn.events import Metric
from dist_respattn.model import START_KINDS, ResponsibilityAttentionEstimator, SingleHopSpec
from dist_respattn.model.arguments import as_nonnegative_float, as_positive_float, as_positive_int
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import choose_layout
from dist_respattn.model.emission.prior import BACKOFF_KINDS
from dist_respattn.model.fitting.holdout import DEFAULT_HOLDOUT_FRACTION
from dist_respattn.model.fitting.selection import HyperparameterSearch
from dist_respattn.store import StoreSchema

__all__ = ["EARLY_STOP_METRICS", "FitSettings"]

#: Held-out metrics early stopping can watch (see :class:`~dist_respattn.events.Metric`).
EARLY_STOP_METRICS = tuple(metric.value for metric in Metric)


@dataclass(frozen=True)
class FitSettings:
    """Everything that decides a fit's parameters, bit for bit (besides the data and the start).

    The defaults are the recipe for real data: a uniform start, a MAP emission shrunk toward the
    continuation distribution of the targets, and the gate variance and the prior's strengths chosen
    on held-out rows after every M-step (the validation store, else a deterministic hold-out of the
    training store), with early stopping on held-out perplexity.

    Attributes:
        max_iter: EM iterations at most (counted from the first, also across a resume).
        tol: stop when the relative change of the mean log-likelihood per row falls below it.
        seed: seeds a random start, per partition: ``(seed, partition index)``.
        init: the first model: the M-step of ``"uniform"`` responsibilities or of ``"random"`` ones.
        estimate_sigma2: learn the gate variance by maximum likelihood (it collapses when the query is
            the current token's embedding; the default chooses it on held-out rows instead).
        sigma2: a fixed gate variance (or the start of a learned one); ``None``: chosen on held-out rows.
        min_sigma2: floor of a learned variance.
        emission_prior: the backoff of the emission's Dirichlet prior: ``"continuation"``, ``"unigram"``
            or ``"uniform"`` (see :mod:`dist_respattn.model.emission.prior`).
        emission_smoothing: the reference library's additive smoothing instead of the prior (fixed).
        emission_strength, type_strength: the prior's strengths ``a_s = emission_strength + type_strength n_s``;
            ``None``: chosen on held-out rows.
        pseudo_count: Dirichlet strength on the position prior, or ``None``.
        holdout_fraction: the share of the training store held out for those choices when there is no
            validation store (0: none; the open choices then take their default values).
        fan_in: children of each combine task; it fixes the order sums are taken in.
        context_length: the window N a token-stream store is read with (``None``: the store's; a triple
            store's N is fixed when it is written).
        emission_layout: ``"dense"`` (S, T), ``"sparse"`` (the pairs the training rows hold) or ``"auto"``
            (dense up to ``DENSE_CELL_LIMIT`` cells): see :mod:`dist_respattn.model.emission.layouts`.
        early_stop_metric: ``"perplexity"`` or ``"loglik"`` on the held-out rows; ``None`` picks
            perplexity when there are held-out rows.
        patience: iterations without an improvement of at least ``min_improvement`` (relative) of that
            metric before stopping.
        min_improvement: the relative improvement that counts (the best checkpoint follows any improvement).
        position_buckets: K recency buckets the position prior is tied over (K = N: the free prior, fitted by
            the histogram kernel); ``None``: a free prior and the per-position kernel. See
            :mod:`dist_respattn.model.buckets`.
        min_context: the fewest earlier tokens a token-stream row has (1 to N); ``None``: 1 with buckets
            (short histories, the missing positions masked), N without (full windows only).
        m_step_shards: K >= 1 runs the M-step in K shards of the symbol range on the workers (a kind that has
            one; see ``docs/guide/fitting.md``), 0 (the default) on the driver. A shard holds one symbol at least:
            a K above the S symbols runs S shards, and the fit says so. The parameters are the same to the
            bit either way (so a resume may change it); the owners write their parts of every checkpoint, so the
            model directory must be on a filesystem every worker can write.
    """

    max_iter: int = 100
    tol: float = 1e-6
    seed: int = 0
    init: str = "uniform"
    estimate_sigma2: bool = False
    sigma2: float | None = None
    min_sigma2: float = 1e-6
    emission_prior: str = "continuation"
    emission_smoothing: float | None = None
    emission_strength: float | None = None
    type_strength: float | None = None
    pseudo_count: float | None = None
    holdout_fraction: float = DEFAULT_HOLDOUT_FRACTION
    fan_in: int = DEFAULT_FAN_IN
    emission_layout: str = "auto"
    context_length: int | None = None
    early_stop_metric: str | None = None
    patience: int = 3
    min_improvement: float = 1e-3
    position_buckets: int | None = None
    min_context: int | None = None
    m_step_shards: int = 0

    def __post_init__(self) -> None:
        if self.max_iter < 0 or isinstance(self.max_iter, bool):
            raise ValueError(f"max_iter = {self.max_iter}: expected an integer >= 0")
        as_nonnegative_float(self.tol, "tol")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed = {self.seed!r}: expected an integer >= 0")
        if self.init not in START_KINDS:
            raise ValueError(f"init = {self.init!r}: expected one of {', '.join(START_KINDS)}")
        if self.sigma2 is not None:
            as_positive_float(self.sigma2, "sigma2")
        as_positive_float(self.min_sigma2, "min_sigma2")
        if self.emission_prior not in BACKOFF_KINDS:
            raise ValueError(f"emission_prior = {self.emission_prior!r}: expected one of {', '.join(BACKOFF_KINDS)}")
        if self.emission_smoothing is not None:
            as_nonnegative_float(self.emission_smoothing, "emission_smoothing")
            if self.emission_strength is not None or self.type_strength is not None:
                raise ValueError(
                    "emission_smoothing (additive) replaces the emission prior: give it or the prior's strengths"
                )
        for name in ("emission_strength", "type_strength", "pseudo_count"):
            if getattr(self, name) is not None:
                as_nonnegative_float(getattr(self, name), name)
        if self.emission_strength == 0.0 and self.type_strength == 0.0:
            raise ValueError("emission_strength and type_strength are both 0: the emission prior would have no weight")
        if not 0.0 <= as_nonnegative_float(self.holdout_fraction, "holdout_fraction") < 0.5:
            raise ValueError(f"holdout_fraction = {self.holdout_fraction!r}: expected a number in [0, 0.5)")
        if as_positive_int(self.fan_in, "fan_in") < 2:
            raise ValueError(f"fan_in = {self.fan_in}: expected at least 2")
        choose_layout(1, 1, self.emission_layout)  # checks the name
        if self.context_length is not None:
            as_positive_int(self.context_length, "context_length")
        if self.early_stop_metric not in (None, *EARLY_STOP_METRICS):
            raise ValueError(f"early_stop_metric = {self.early_stop_metric!r}: expected one of {EARLY_STOP_METRICS}")
        if self.position_buckets is not None:
            as_positive_int(self.position_buckets, "position_buckets")
            if self.init != "uniform":
                raise ValueError(
                    f"init = {self.init!r} with position buckets: a tied prior starts uniform (--init uniform)"
                )
            if self.context_length is not None:
                PositionBuckets.geometric(self.context_length, self.position_buckets)  # refuses a bad K here
        if self.min_context is not None:
            as_positive_int(self.min_context, "min_context")
            if self.context_length is not None and self.min_context > self.context_length:
                raise ValueError(
                    f"min_context = {self.min_context}: expected at most the window N = {self.context_length}"
                )
        if isinstance(self.m_step_shards, bool) or not isinstance(self.m_step_shards, int) or self.m_step_shards < 0:
            raise ValueError(f"m_step_shards = {self.m_step_shards!r}: expected an integer >= 0 (0: on the driver)")
        as_positive_int(self.patience, "patience")
        as_nonnegative_float(self.min_improvement, "min_improvement")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FitSettings:
        """Settings from a checkpoint's JSON.

        A checkpoint written before a setting existed ran as it did then: a random start, no hold-out,
        patience reset by any improvement, and a dense emission.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if data:
            then_values = (
                ("init", "random"),
                ("holdout_fraction", 0.0),
                ("min_improvement", 0.0),
                ("emission_layout", "dense"),
            )
            for name, then in then_values:
                values.setdefault(name, then)
        return cls(**values)

    def differences(self, other: FitSettings, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """``"name: self -> other"`` for every setting that differs (except those in ``ignore``)."""
        return [
            f"{f.name}: {getattr(self, f.name)!r} -> {getattr(other, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name not in ignore and getattr(self, f.name) != getattr(other, f.name)
        ]

    def min_context_for(self, context_length: int, *, short_histories: bool | None = None) -> int:
        """The fewest earlier tokens a row of a token-stream store read with window N has (see ``min_context``).

        ``short_histories``: whether the head reads histories shorter than N whatever its buckets (a kind's
        :attr:`~dist_respattn.model.heads.base.HeadSpec.short_histories`); ``None``: when it has buckets."""
        short = self.position_buckets is not None if short_histories is None else short_histories
        if self.min_context is not None:
            if self.min_context > context_length:
                raise ValueError(f"min_context = {self.min_context}: expected at most the window N = {context_length}")
            if self.min_context < context_length and not short:
                raise ValueError(
                    f"--min-context {self.min_context} < N = {context_length}: short histories are fitted by the "
                    "histogram kernel; add --position-buckets K (K = N keeps a free prior)"
                )
            return self.min_context
        return 1 if short else context_length

    def head_spec(self) -> SingleHopSpec:
        """The single-hop head these settings describe (the head's own settings: its start, gate, emission and
        position prior), as the head protocol's spec."""
        return SingleHopSpec(
            init=self.init,
            seed=self.seed,
            estimate_sigma2=self.estimate_sigma2,
            sigma2=self.sigma2,
            min_sigma2=self.min_sigma2,
            emission_prior=self.emission_prior,
            emission_smoothing=self.emission_smoothing,
            emission_strength=self.emission_strength,
            type_strength=self.type_strength,
            pseudo_count=self.pseudo_count,
            emission_layout=self.emission_layout,
            position_buckets=self.position_buckets,
        )

    def buckets(self, context_length: int) -> PositionBuckets | None:
        """The recency buckets of a fit with window N (``None``: a free prior, per-position kernels)."""
        return self.head_spec().buckets(context_length)

    @property
    def legacy_emission(self) -> bool:
        """Whether the emission is the reference library's additive smoothing (no prior)."""
        return self.emission_smoothing is not None

    def search(self) -> HyperparameterSearch | None:
        """What is chosen on held-out rows after every M-step (``None``: nothing)."""
        return self.head_spec().search()

    def layout(self, schema: StoreSchema) -> str:
        """The emission layout of a fit on a store of this schema."""
        return self.head_spec().layout(_shape(schema))

    def estimator(self, schema: StoreSchema) -> ResponsibilityAttentionEstimator:
        """The M-step for a store of this schema (its emission prior still to be made from the store's pairs)."""
        return self.head_spec().estimator(_shape(schema))


def _shape(schema: StoreSchema) -> tuple[int, int, int, int]:
    return (schema.num_symbols, schema.context_length, schema.query_dim, schema.num_targets)
