"""A fit's settings: what fixes its result, saved with every checkpoint and checked on ``resume``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dist_respattn.engine.reduction import DEFAULT_FAN_IN
from dist_respattn.model._checks import as_nonnegative_float, as_positive_float, as_positive_int
from dist_respattn.model.estimator import ResponsibilityAttentionEstimator
from dist_respattn.store import StoreSchema

__all__ = ["EARLY_STOP_METRICS", "FitSettings"]

#: Held-out metrics early stopping can watch: predictive perplexity (lower is better) or mean joint
#: log-likelihood (higher is better).
EARLY_STOP_METRICS = ("perplexity", "loglik")


@dataclass(frozen=True)
class FitSettings:
    """Everything that decides a fit's parameters, bit for bit (besides the data and the start).

    Attributes:
        max_iter: EM iterations at most (counted from the first, also across a resume).
        tol: stop when the relative change of the mean log-likelihood per row falls below it.
        seed: seeds the random first responsibilities, per partition: ``(seed, partition index)``.
        estimate_sigma2: learn the gate variance (else keep ``sigma2``).
        sigma2: the fixed gate variance, or the start of a learned one.
        min_sigma2: floor of a learned variance.
        emission_smoothing: additive smoothing of the emission counts.
        pseudo_count: Dirichlet strength on the position prior, or ``None``.
        fan_in: children of each combine task; it fixes the order sums are taken in.
        early_stop_metric: ``"perplexity"`` or ``"loglik"`` on the validation store; ``None`` picks
            perplexity when there is a validation store.
        patience: iterations without improvement of that metric before stopping.
    """

    max_iter: int = 100
    tol: float = 1e-6
    seed: int = 0
    estimate_sigma2: bool = True
    sigma2: float = 1.0
    min_sigma2: float = 1e-6
    emission_smoothing: float = 1e-6
    pseudo_count: float | None = None
    fan_in: int = DEFAULT_FAN_IN
    early_stop_metric: str | None = None
    patience: int = 3

    def __post_init__(self) -> None:
        if self.max_iter < 0 or isinstance(self.max_iter, bool):
            raise ValueError(f"max_iter = {self.max_iter}: expected an integer >= 0")
        as_nonnegative_float(self.tol, "tol")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed = {self.seed!r}: expected an integer >= 0")
        as_positive_float(self.sigma2, "sigma2")
        as_positive_float(self.min_sigma2, "min_sigma2")
        as_nonnegative_float(self.emission_smoothing, "emission_smoothing")
        if self.pseudo_count is not None:
            as_nonnegative_float(self.pseudo_count, "pseudo_count")
        if as_positive_int(self.fan_in, "fan_in") < 2:
            raise ValueError(f"fan_in = {self.fan_in}: expected at least 2")
        if self.early_stop_metric not in (None, *EARLY_STOP_METRICS):
            raise ValueError(f"early_stop_metric = {self.early_stop_metric!r}: expected one of {EARLY_STOP_METRICS}")
        as_positive_int(self.patience, "patience")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FitSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def differences(self, other: FitSettings, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """``"name: self -> other"`` for every setting that differs (except those in ``ignore``)."""
        return [
            f"{f.name}: {getattr(self, f.name)!r} -> {getattr(other, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name not in ignore and getattr(self, f.name) != getattr(other, f.name)
        ]

    def estimator(self, schema: StoreSchema) -> ResponsibilityAttentionEstimator:
        """The M-step for a store of this schema."""
        return ResponsibilityAttentionEstimator(
            schema.num_symbols,
            schema.context_length,
            schema.query_dim,
            schema.num_targets,
            sigma2=self.sigma2,
            estimate_sigma2=self.estimate_sigma2,
            min_sigma2=self.min_sigma2,
            emission_smoothing=self.emission_smoothing,
            pseudo_count=self.pseudo_count,
        )
