"""The EM loop, written once: any E-step (in process here, distributed in the engine) plugs into it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dist_respattn.model.arguments import check_batch
from dist_respattn.model.emission.layouts import SparseEmissionCounts, choose_layout
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.fitting.selection import Hyperparameters, HyperparameterSearch, Selection, score_grid
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator, SufficientStatistics
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.estimator import MStepCandidates, ResponsibilityAttentionEstimator
from dist_respattn.model.kernels import per_position

__all__ = [
    "START_KINDS",
    "EMIteration",
    "EMResult",
    "LocalSearch",
    "Selector",
    "fit_em",
    "heldout_selector",
    "m_step",
    "relative_change",
    "run_em",
]

logger = logging.getLogger(__name__)

#: An E-step: the statistics of the data under a model, or the start's statistics for ``None`` (uniform
#: or random responsibilities).
EStep = Callable[[ResponsibilityAttentionDistribution | None], SufficientStatistics]

#: Chooses an M-step's hyperparameters (on held-out rows).
Selector = Callable[[MStepCandidates], Selection]

#: How the first model is made: the M-step of uniform responsibilities (deterministic), or of random ones.
START_KINDS = ("uniform", "random")


@dataclass(frozen=True)
class EMIteration:
    """One E-step + M-step: the mean log-likelihood per row of the model the E-step used.

    ``hyperparameters`` are those of the M-step's model; ``heldout`` its held-out scores when a selector
    chose them on held-out rows (``mean_log_likelihood``, ``target_log_prob``, ``perplexity``).
    """

    iteration: int
    mean_log_likelihood: float
    change: float
    seconds: float
    n_obs: float
    hyperparameters: Hyperparameters | None = None
    heldout: dict[str, float] | None = None


@dataclass(frozen=True)
class EMResult:
    """Outcome of an EM run: the last M-step's model and the per-iteration record."""

    distribution: ResponsibilityAttentionDistribution
    history: list[EMIteration] = field(default_factory=list)
    converged: bool = False
    stopped_by_callback: bool = False
    initial: Selection | None = None

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


def m_step(
    estimator: ResponsibilityAttentionEstimator,
    stats: SufficientStatistics,
    previous: ResponsibilityAttentionDistribution | None,
    select: Selector | None,
) -> tuple[ResponsibilityAttentionDistribution, Selection]:
    """The estimator's M-step, its open choices made by ``select`` (else the estimator's defaults)."""
    candidates = estimator.candidates(stats, previous=previous)
    selection = select(candidates) if select is not None else Selection(candidates.defaults)
    return candidates.model(selection.hyperparameters), selection


def run_em(
    e_step: EStep,
    estimator: ResponsibilityAttentionEstimator,
    *,
    init: ResponsibilityAttentionDistribution | None = None,
    select: Selector | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    callback: Callable[[EMIteration, ResponsibilityAttentionDistribution], bool | None] | None = None,
    first_iteration: int = 1,
    previous_log_likelihood: float | None = None,
) -> EMResult:
    """Run EM until the relative change of the mean log-likelihood is below ``tol``, or ``max_iter``.

    Without ``init`` the first model is the M-step of the start's statistics (``e_step(None)``).
    Every iteration's log-likelihood comes from its E-step: there is no separate scoring pass.
    ``select`` makes every M-step's open choices (see :func:`heldout_selector`); without it the
    estimator's fixed hyperparameters apply.

    ``callback(record, new_model)`` runs after every M-step; returning ``True`` stops the run (early
    stopping). A run resumed after iteration ``k`` passes ``init`` (the model after ``k``),
    ``first_iteration=k + 1`` and the mean log-likelihood of iteration ``k``: it then takes exactly the
    steps the uninterrupted run would have taken. ``max_iter`` counts from iteration 1.
    """
    if max_iter < 0:
        raise ValueError(f"max_iter = {max_iter}: expected >= 0")
    if first_iteration < 1:
        raise ValueError(f"first_iteration = {first_iteration}: expected >= 1")
    initial = None
    if init is not None:
        model = init
    else:
        model, initial = m_step(estimator, e_step(None), None, select)
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
        model, selection = m_step(estimator, stats, model, select)
        record = EMIteration(
            iteration,
            mean_ll,
            change,
            time.perf_counter() - started,
            stats.n_obs,
            selection.hyperparameters,
            selection.heldout,
        )
        history.append(record)
        logger.info("iteration %d: mean log-likelihood %.6f (change %.3g)", iteration, mean_ll, change)
        if change < tol:
            converged = True
        if callback is not None and callback(record, model) and not converged:
            stopped = True
        if converged or stopped:
            break
        previous_ll = mean_ll
    return EMResult(model, history, converged, stopped, initial)


class LocalSearch:
    """The grid an M-step's held-out pass scores: the whole search the first time, then around the last choice.

    Both the in-process selector and the distributed fit use it, so they score the same points; a resumed
    fit restores :attr:`previous` from its checkpoint.
    """

    def __init__(self, search: HyperparameterSearch, previous: Hyperparameters | None = None) -> None:
        self.search = search
        self.previous = previous

    def grid(self, candidates: MStepCandidates) -> HyperparameterSearch:
        """The points to score for these candidates."""
        if self.previous is None:
            return self.search
        return self.search.around(self.previous, candidates.query_scale)

    def chose(self, selection: Selection) -> Selection:
        """Remember a choice (made with held-out scores) for the next M-step's neighbourhood."""
        if selection.heldout is not None:
            self.previous = selection.hyperparameters
        return selection


def heldout_selector(
    estimator: ResponsibilityAttentionEstimator, data: tuple[np.ndarray, np.ndarray, np.ndarray], weights: Any
) -> Selector:
    """Chooses every M-step's hyperparameters by the estimator's ``search``, scored on these held-out rows
    (the whole grid first, then the neighbourhood of the last choice: :class:`LocalSearch`)."""
    search = estimator.search
    if search is None:
        raise ValueError("the estimator has no search: there is nothing to choose on held-out rows")
    local = LocalSearch(search)

    def select(candidates: MStepCandidates) -> Selection:
        table = candidates.grid_table(local.grid(candidates))
        return local.chose(candidates.select(table, score_grid(table, data, weights)))

    return select


def fit_em(
    data: tuple[Any, Any, Any],
    estimator: ResponsibilityAttentionEstimator,
    *,
    weights: Any = None,
    init: ResponsibilityAttentionDistribution | None = None,
    start: str = "uniform",
    validation: tuple[Any, Any, Any] | None = None,
    validation_weights: Any = None,
    holdout: HoldoutRule | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    seed: int | np.random.Generator | None = 0,
    backend: per_position.Backend = "numba",
    layout: str = "auto",
    callback: Callable[[EMIteration, ResponsibilityAttentionDistribution], bool | None] | None = None,
) -> EMResult:
    """Fit a head by EM in this process on an encoded batch ``(context (n, N), query (n, D), target (n,))``.

    - ``start``: the first model (unless ``init``): the M-step of ``"uniform"`` responsibilities, or of
      ``"random"`` ones drawn from ``seed``.
    - An estimator whose emission prior is a kind (``"continuation"``...) gets it from the training
      rows' (previous symbol, target) pairs.
    - An estimator with a ``search`` chooses its hyperparameters after every M-step on held-out rows:
      ``validation`` when given, else the rows of ``data`` that ``holdout`` (default
      ``HoldoutRule.for_rows(n)``) holds out, which then take no part in the fit. This is the rule
      the distributed fit applies to a store's rows, so both fits take the same steps.
    - ``layout``: the emission's layout (:func:`~dist_respattn.model.emission.layouts.choose_layout`): ``"dense"``
      (S, T), ``"sparse"`` over the pairs the training rows hold, or ``"auto"`` by size. A sparse fit's
      ``init`` is moved onto that support (:meth:`~dist_respattn.model.emission.layouts.Emission.restricted`).
    """
    shape: dict[str, Any] = {
        "num_symbols": estimator.num_symbols,
        "context_length": estimator.context_length,
        "query_dim": estimator.query_dim,
        "num_targets": estimator.num_targets,
    }
    context, query, target, w = check_batch(data, weights, **shape)
    if start not in START_KINDS:
        raise ValueError(f"start = {start!r}: expected one of {', '.join(START_KINDS)}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if estimator.search is None and (validation is not None or holdout is not None):
        raise ValueError(
            "validation= and holdout= are for the choices of an estimator's search, and this estimator has none "
            "(search=DEFAULT_SEARCH makes them)"
        )
    if validation is not None and holdout is not None:
        raise ValueError("give validation= (held-out rows) or holdout= (a rule for the training rows), not both")
    select: Selector | None = None
    if estimator.search is not None:
        if validation is not None:
            checked = check_batch(validation, validation_weights, **shape)
            heldout, heldout_w = (checked.context, checked.query, checked.target), checked.weights
        else:
            rule = holdout or HoldoutRule.for_rows(context.shape[0])
            w, heldout_w = rule.split_weights(0, context.shape[0], w)
            heldout = (context, query, target)
        if heldout_w is None or float(np.sum(heldout_w)) > 0.0:
            select = heldout_selector(estimator, heldout, heldout_w)
        else:
            logger.warning("no held-out rows: the hyperparameters stay at the estimator's values")
    if estimator.needs_pairs:
        pairs = PairCounts.from_rows(
            context[:, -1], target, w, num_symbols=estimator.num_symbols, num_targets=estimator.num_targets
        )
        assert isinstance(estimator.emission_prior, str)
        estimator = estimator.resolved(EmissionPrior.from_pairs(pairs, estimator.emission_prior))
    factory = estimator.accumulator_factory(
        backend=backend, layout=choose_layout(estimator.num_symbols, estimator.num_targets, layout)
    )
    if init is not None and factory.layout == "sparse":
        collector = factory.make()
        collector.seq_initialize_uniform((context, query, target), w)
        counts = collector.value().emission_count
        assert isinstance(counts, SparseEmissionCounts) and counts.support is not None
        support = counts.support
        init = init.with_emission(init.emission_table.restricted(support))

    def e_step(model: ResponsibilityAttentionDistribution | None) -> SufficientStatistics:
        accumulator: ResponsibilityAttentionAccumulator = factory.make() if model is None else factory.make_for(model)
        if model is None and start == "uniform":
            accumulator.seq_initialize_uniform((context, query, target), w)
        elif model is None:
            accumulator.seq_initialize((context, query, target), w, rng)
        else:
            accumulator.seq_update((context, query, target), w, model)
        return accumulator.value()

    return run_em(e_step, estimator, init=init, select=select, max_iter=max_iter, tol=tol, callback=callback)
