"""The EM loop, written once: any E-step (in process here, distributed in the engine) plugs into it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dist_respattn.model import kernels
from dist_respattn.model._checks import as_encoded, as_weights
from dist_respattn.model.accumulator import ResponsibilityAttentionAccumulator, SufficientStatistics
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.estimator import ResponsibilityAttentionEstimator

__all__ = ["EMIteration", "EMResult", "fit_em", "relative_change", "run_em"]

logger = logging.getLogger(__name__)

#: An E-step: the statistics of the data under a model, or under random responsibilities for ``None``.
EStep = Callable[[ResponsibilityAttentionDistribution | None], SufficientStatistics]


@dataclass(frozen=True)
class EMIteration:
    """One E-step + M-step: the mean log-likelihood per row of the model the E-step used."""

    iteration: int
    mean_log_likelihood: float
    change: float
    seconds: float
    n_obs: float


@dataclass(frozen=True)
class EMResult:
    """Outcome of an EM run: the last M-step's model and the per-iteration record."""

    distribution: ResponsibilityAttentionDistribution
    history: list[EMIteration] = field(default_factory=list)
    converged: bool = False
    stopped_by_callback: bool = False

    @property
    def n_iter(self) -> int:
        """Number of E-step + M-step iterations after initialization."""
        return len(self.history)

    @property
    def log_likelihoods(self) -> list[float]:
        """Mean log-likelihood per row at each iteration."""
        return [it.mean_log_likelihood for it in self.history]


def relative_change(previous: float, current: float) -> float:
    """``|current - previous| / max(|previous|, 1e-300)``: the convergence measure."""
    return abs(current - previous) / max(abs(previous), 1e-300)


def run_em(
    e_step: EStep,
    estimator: ResponsibilityAttentionEstimator,
    *,
    init: ResponsibilityAttentionDistribution | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    callback: Callable[[EMIteration, ResponsibilityAttentionDistribution], bool | None] | None = None,
    first_iteration: int = 1,
    previous_log_likelihood: float | None = None,
) -> EMResult:
    """Run EM until the relative change of the mean log-likelihood is below ``tol``, or ``max_iter``.

    Without ``init`` the first model is the M-step of random responsibilities (``e_step(None)``).
    Every iteration's log-likelihood comes from its E-step: there is no separate scoring pass.

    ``callback(record, new_model)`` runs after every M-step; returning ``True`` stops the run (early
    stopping). A run resumed after iteration ``k`` passes ``init`` (the model after ``k``),
    ``first_iteration=k + 1`` and the mean log-likelihood of iteration ``k``: it then takes exactly the
    steps the uninterrupted run would have taken. ``max_iter`` counts from iteration 1.
    """
    if max_iter < 0:
        raise ValueError(f"max_iter = {max_iter}: expected >= 0")
    if first_iteration < 1:
        raise ValueError(f"first_iteration = {first_iteration}: expected >= 1")
    model = init if init is not None else estimator.estimate(None, e_step(None))
    history: list[EMIteration] = []
    previous_ll = previous_log_likelihood
    converged = False
    stopped = False
    for iteration in range(first_iteration, max_iter + 1):
        started = time.perf_counter()
        stats = e_step(model)
        if stats.n_obs <= 0.0:
            raise ValueError("the E-step saw no weighted rows: there is nothing to fit")
        mean_ll = stats.log_lik / stats.n_obs
        change = float("inf") if previous_ll is None else relative_change(previous_ll, mean_ll)
        model = estimator.estimate(stats.n_obs, stats, previous=model)
        record = EMIteration(iteration, mean_ll, change, time.perf_counter() - started, stats.n_obs)
        history.append(record)
        logger.info("iteration %d: mean log-likelihood %.6f (change %.3g)", iteration, mean_ll, change)
        if change < tol:
            converged = True
        if callback is not None and callback(record, model) and not converged:
            stopped = True
        if converged or stopped:
            break
        previous_ll = mean_ll
    return EMResult(model, history, converged, stopped)


def fit_em(
    data: tuple[Any, Any, Any],
    estimator: ResponsibilityAttentionEstimator,
    *,
    weights: Any = None,
    init: ResponsibilityAttentionDistribution | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    seed: int | np.random.Generator | None = 0,
    backend: kernels.Backend = "numba",
    callback: Callable[[EMIteration, ResponsibilityAttentionDistribution], bool | None] | None = None,
) -> EMResult:
    """Fit a head by EM in this process on an encoded batch ``(context (n, N), query (n, D), target (n,))``.

    The random initialization draws its responsibilities from ``seed``.
    """
    context, query, target = as_encoded(data, context_length=estimator.context_length, query_dim=estimator.query_dim)
    w = as_weights(weights, context.shape[0])
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    factory = estimator.accumulator_factory(backend=backend)

    def e_step(model: ResponsibilityAttentionDistribution | None) -> SufficientStatistics:
        accumulator: ResponsibilityAttentionAccumulator = factory.make()
        if model is None:
            accumulator.seq_initialize((context, query, target), w, rng)
        else:
            accumulator.seq_update((context, query, target), w, model)
        return accumulator.value()

    return run_em(e_step, estimator, init=init, max_iter=max_iter, tol=tol, callback=callback)
