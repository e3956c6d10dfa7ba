"""The EM loop, written once for every kind of head: where the rows are (this process, or a cluster) plugs into it.

:func:`run_head_em` is the loop: a kind's :class:`~dist_respattn.model.heads.base.Trainer` prepares the first head,
then every iteration is an E-step over the training rows, the kind's M-step with its open choices, the choice made
on held-out rows (the whole grid the first time, then around the last choice: :class:`HeldoutChoice`), and the one
convergence rule: the relative change of the mean log-likelihood per row from the previous iteration below ``tol``.
The rows are reached through :class:`EMPasses`: :class:`InProcessPasses` here (``fit_em``), the cluster's passes in
the engine, which therefore takes the same steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dist_respattn.model.arguments import check_batch
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.fitting.selection import Selection
from dist_respattn.model.heads.base import (
    Block,
    BlockPass,
    Candidates,
    Choice,
    Grid,
    Head,
    HeadSpec,
    Statistics,
    Trainer,
    TrainerContext,
)
from dist_respattn.model.rows import EncodedRows, WindowRows

__all__ = [
    "START_KINDS",
    "EMIteration",
    "EMPasses",
    "EMResult",
    "HeldoutChoice",
    "InProcessPasses",
    "RowsInMemory",
    "fit_em",
    "relative_change",
    "run_em",
    "run_head_em",
]

logger = logging.getLogger(__name__)

#: How the first model is made: the M-step of uniform responsibilities (deterministic), or of random ones.
START_KINDS = ("uniform", "random")


@dataclass(frozen=True)
class EMIteration:
    """One E-step + M-step: the mean log-likelihood per row of the model the E-step used.

    ``hyperparameters`` are the M-step's choice (the kind's :class:`~dist_respattn.model.heads.base.Choice`);
    ``heldout`` the chosen model's held-out scores when it was chosen on held-out rows (``mean_log_likelihood``,
    ``target_log_prob``, ``perplexity``).
    """

    iteration: int
    mean_log_likelihood: float
    change: float
    seconds: float
    n_obs: float
    hyperparameters: Any = None
    heldout: dict[str, float] | None = None


@dataclass(frozen=True)
class EMResult:
    """Outcome of an EM run: the last M-step's model and the per-iteration record."""

    distribution: Any
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


class EMPasses(Protocol):
    """Where a fit's rows are: the passes the loop runs over them."""

    def statistics(self, trainer: Trainer, head: Head, iteration: int) -> Statistics:
        """The E-step: the trainer's statistics of every training row under ``head``, combined."""

    def heldout(self, grid: Grid, label: str) -> Any:
        """The held-out totals of every point of ``grid`` (``label``: the iteration it chooses for), or ``None``:
        there are no held-out rows."""

    def run(self, request: BlockPass) -> Any:
        """A preparation pass over the training rows, combined."""

    def say(self, line: str) -> None:
        """Tell the user."""

    def plan_memory(self) -> None:
        """Check the trainer's memory plan again."""


#: Makes an M-step's choice: ``(candidates, label) -> (head, selection)``.
Chooser = Callable[[Candidates, str], "tuple[Head, Selection]"]


class HeldoutChoice:
    """Chooses every M-step's open choices on held-out rows: the whole grid the first time, then the neighbourhood
    of the last choice (a resumed fit restores :attr:`previous` from its checkpoint). Without held-out rows, or
    with nothing to choose and no rows, the defaults."""

    def __init__(self, passes: EMPasses, previous: Choice | None = None) -> None:
        self.passes = passes
        self.previous = previous

    def __call__(self, candidates: Candidates, label: str) -> tuple[Head, Selection]:
        grid = candidates.grid(self.previous)
        scores = self.passes.heldout(grid, label)
        if scores is None:
            choice: Any = candidates.default()
            return candidates.model(choice), Selection(choice, None)
        choice, heldout = candidates.choose(grid, scores)
        if heldout is not None:
            self.previous = choice
        return candidates.model(choice), Selection(choice, heldout)


class _PreparePasses:
    """The :class:`~dist_respattn.model.heads.base.Passes` a trainer prepares with: the fit's passes, its choice."""

    def __init__(self, passes: EMPasses, choose: Chooser) -> None:
        self.passes, self.choose_with = passes, choose
        self.initial: Selection | None = None

    def run(self, request: BlockPass, *, over: str = "train") -> Any:
        if over != "train":
            raise ValueError(f"a fit's preparation passes run over its training rows, not {over!r}")
        return self.passes.run(request)

    def choose(self, candidates: Candidates) -> Head:
        head, self.initial = self.choose_with(candidates, "0")
        return head

    def say(self, line: str) -> None:
        self.passes.say(line)

    def plan_memory(self) -> None:
        self.passes.plan_memory()


def run_head_em(
    trainer: Trainer,
    passes: EMPasses,
    *,
    start: Head | None = None,
    resumed: bool = False,
    choose: Chooser | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    callback: Callable[[EMIteration, Head], bool | None] | None = None,
    first_iteration: int = 1,
    previous_log_likelihood: float | None = None,
) -> EMResult:
    """Run EM until the relative change of the mean log-likelihood per row is below ``tol``, or ``max_iter``.

    The first head is the trainer's preparation from ``start`` (``None``: its own start; ``resumed``: ``start`` is
    the fit's own checkpoint). Every iteration's log-likelihood comes from its E-step: there is no separate scoring
    pass. ``choose`` makes every M-step's open choices (default: :class:`HeldoutChoice` over ``passes``).

    ``callback(record, new_head)`` runs after every M-step; returning ``True`` stops the run (early stopping). A
    run resumed after iteration ``k`` passes ``start`` (the head after ``k``), ``resumed=True``,
    ``first_iteration=k + 1`` and the mean log-likelihood of iteration ``k``: it then takes exactly the steps the
    uninterrupted run would have taken. ``max_iter`` counts from iteration 1.
    """
    if max_iter < 0:
        raise ValueError(f"max_iter = {max_iter}: expected >= 0")
    if first_iteration < 1:
        raise ValueError(f"first_iteration = {first_iteration}: expected >= 1")
    chooser = choose if choose is not None else HeldoutChoice(passes)
    preparing = _PreparePasses(passes, chooser)
    model = trainer.prepare(start, resumed=resumed, passes=preparing)
    history: list[EMIteration] = []
    previous_ll = previous_log_likelihood
    converged = stopped = False
    for iteration in range(first_iteration, max_iter + 1):
        started = time.perf_counter()
        stats = passes.statistics(trainer, model, iteration)
        if stats.n_obs <= 0.0:
            raise ValueError("the E-step saw no weighted rows: there is nothing to fit")
        mean_ll = stats.log_lik / stats.n_obs
        change = float("inf") if previous_ll is None else relative_change(previous_ll, mean_ll)
        model, selection = chooser(trainer.m_step(stats, model), str(iteration))
        record = EMIteration(
            iteration, mean_ll, change, time.perf_counter() - started, stats.n_obs,
            selection.hyperparameters, selection.heldout,
        )  # fmt: skip
        history.append(record)
        logger.info("iteration %d: mean log-likelihood %.6f (change %.3g)", iteration, mean_ll, change)
        if change < tol:
            converged = True
        if callback is not None and callback(record, model) and not converged:
            stopped = True
        if converged or stopped:
            break
        previous_ll = mean_ll
    return EMResult(model, history, converged, stopped, preparing.initial)


# --------------------------------------------------------------------------------------------- in process


@dataclass(frozen=True)
class RowsInMemory:
    """Encoded rows held in this process, with their weights (after a hold-out) and their attributes."""

    context: np.ndarray
    query: np.ndarray
    target: np.ndarray
    weights: np.ndarray | None
    attribute: np.ndarray | None = None

    def blocks(self, columns: Any) -> Iterator[Block]:
        """The rows as one block with the columns asked for (a store's partition, in one piece)."""
        if columns.windows:
            rows: Any = WindowRows.from_encoded(self.context, self.query, self.target, self.weights)
        else:
            rows = EncodedRows(self.context, self.query, self.target, self.weights, 0)
        attribute = self.attribute if columns.attributes else None
        yield Block(rows, self.weights, attribute)


class InProcessPasses:
    """:class:`EMPasses` over rows held in this process: the training rows, and held-out rows or none."""

    def __init__(self, train: RowsInMemory, heldout: RowsInMemory | None) -> None:
        self.train, self.held = train, heldout

    def statistics(self, trainer: Trainer, head: Head, iteration: int) -> Statistics:
        return trainer.statistics(head, self.train.blocks(trainer.columns))

    def heldout(self, grid: Grid, label: str) -> Any:
        if self.held is None:
            return None
        return grid.score(self.held.blocks(grid.columns))

    def run(self, request: BlockPass) -> Any:
        return request.map_partition(self.train.blocks(request.columns))

    def say(self, line: str) -> None:
        logger.info("%s", line)

    def plan_memory(self) -> None:
        pass


def fit_em(
    data: tuple[Any, Any, Any],
    estimator: Any,
    *,
    weights: Any = None,
    attributes: Any = None,
    attribute_names: tuple[str, ...] | None = None,
    init: Head | None = None,
    init_meta: dict[str, Any] | None = None,
    init_arrays: dict[str, np.ndarray] | None = None,
    shape: tuple[int, int, int, int] | None = None,
    start: str = "uniform",
    validation: tuple[Any, Any, Any] | None = None,
    validation_weights: Any = None,
    validation_attributes: Any = None,
    holdout: HoldoutRule | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    seed: int | np.random.Generator | None = 0,
    backend: str = "numba",
    layout: str = "auto",
    callback: Callable[[EMIteration, Head], bool | None] | None = None,
) -> EMResult:
    """Fit a head by EM in this process on an encoded batch ``(context (n, N), query (n, D), target (n,))``.

    ``estimator`` is a single-hop
    :class:`~dist_respattn.model.heads.single_hop.estimator.ResponsibilityAttentionEstimator` or any kind's
    :class:`~dist_respattn.model.heads.base.HeadSpec` (a kind that reads attributes takes ``attributes`` (n,) int
    and their ``attribute_names``; one that starts from another fit takes ``init`` and that fit's checkpoint JSON
    ``init_meta`` and extra arrays ``init_arrays`` (its emission prior, say); ``shape`` is ``(S, N, D, T)``, else
    ``init``'s). The loop is the distributed fit's (:func:`run_head_em`).

    - ``start``: the first single-hop model (unless ``init``): the M-step of ``"uniform"`` responsibilities, or of
      ``"random"`` ones drawn from ``seed``.
    - A single-hop estimator whose emission prior is a kind (``"continuation"``...) gets it from the training
      rows' (previous symbol, target) pairs.
    - A fit with something to choose chooses it after every M-step on held-out rows: ``validation`` when given,
      else the rows of ``data`` that ``holdout`` (default ``HoldoutRule.for_rows(n)``) holds out, which then take
      no part in the fit. This is the rule the distributed fit applies to a store's rows, so both fits take the
      same steps.
    - ``layout``: a single-hop emission's layout (:func:`~dist_respattn.model.emission.layouts.choose_layout`):
      ``"dense"`` (S, T), ``"sparse"`` over the pairs the training rows hold, or ``"auto"`` by size. A sparse
      fit's ``init`` is moved onto that support.
    """
    from dist_respattn.model.heads.single_hop.estimator import ResponsibilityAttentionEstimator
    from dist_respattn.model.heads.single_hop.kind import SingleHopTrainer

    if start not in START_KINDS:
        raise ValueError(f"start = {start!r}: expected one of {', '.join(START_KINDS)}")
    if isinstance(estimator, ResponsibilityAttentionEstimator):
        shape = (estimator.num_symbols, estimator.context_length, estimator.query_dim, estimator.num_targets)
        from dist_respattn.model.emission.layouts import choose_layout

        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        trainer: Trainer = SingleHopTrainer(
            estimator, choose_layout(shape[0], shape[3], layout), start, rng, backend=backend
        )
        searches = estimator.search is not None
    elif isinstance(estimator, HeadSpec):
        shape = shape or (init.shape if init is not None else None)
        if shape is None:
            raise ValueError("fit_em of a HeadSpec needs shape=(S, N, D, T) (or init=, whose shape it takes)")
        start_context = TrainerContext(shape, attribute_names, init, init_meta or {}, init_arrays or {}, {}, {})
        trainer = estimator.trainer(start_context)
        searches = trainer.searches()
    else:
        raise TypeError(f"estimator = {type(estimator).__name__}: expected an estimator or a HeadSpec")
    names: dict[str, Any] = dict(zip(("num_symbols", "context_length", "query_dim", "num_targets"), shape, strict=True))
    context, query, target, w = check_batch(data, weights, **names)
    attribute = None if attributes is None else np.asarray(attributes, dtype=np.int64)
    if not searches and (validation is not None or (holdout is not None and holdout.fraction > 0.0)):
        raise ValueError(
            "validation= and holdout= are for the choices of an estimator's search, and this estimator has none "
            "(search=DEFAULT_SEARCH makes them)"
        )
    if validation is not None and holdout is not None:
        raise ValueError("give validation= (held-out rows) or holdout= (a rule for the training rows), not both")
    held: RowsInMemory | None = None
    if searches and not (holdout is not None and holdout.fraction <= 0.0):
        if validation is not None:
            checked = check_batch(validation, validation_weights, **names)
            v_attribute = None if validation_attributes is None else np.asarray(validation_attributes, np.int64)
            held = RowsInMemory(checked.context, checked.query, checked.target, checked.weights, v_attribute)
        else:
            rule = holdout or HoldoutRule.for_rows(context.shape[0])
            w, held_w = rule.split_weights(0, context.shape[0], w)
            if float(np.sum(held_w)) > 0.0:
                held = RowsInMemory(context, query, target, held_w, attribute)
            else:
                logger.warning("no held-out rows: the hyperparameters stay at the estimator's values")
    passes = InProcessPasses(RowsInMemory(context, query, target, w, attribute), held)
    return run_head_em(trainer, passes, start=init, max_iter=max_iter, tol=tol, callback=callback)


class _EStepPasses:
    """The passes of a hand-written E-step: the statistics it gives, nothing else."""

    def __init__(self, e_step: Callable[[Any], Statistics]) -> None:
        self.e_step = e_step

    def statistics(self, trainer: Trainer, head: Head, iteration: int) -> Statistics:
        return self.e_step(head)

    def heldout(self, grid: Grid, label: str) -> None:
        return None

    def run(self, request: BlockPass) -> Any:
        raise TypeError("a hand-written E-step has no preparation passes")

    def say(self, line: str) -> None:
        logger.info("%s", line)

    def plan_memory(self) -> None:
        pass


def run_em(
    e_step: Callable[[Any], Statistics],
    estimator: Any,
    *,
    init: Head | None = None,
    select: Callable[[Any], Selection] | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    callback: Callable[[EMIteration, Head], bool | None] | None = None,
    first_iteration: int = 1,
    previous_log_likelihood: float | None = None,
) -> EMResult:
    """:func:`run_head_em` for a single-hop estimator and a hand-written E-step: ``e_step(model)`` gives the
    statistics of the data under ``model``, or the start's statistics for ``None``; ``select(candidates)`` makes
    every M-step's open choices from its :class:`~dist_respattn.model.heads.single_hop.estimator.MStepCandidates`
    (without it the estimator's fixed hyperparameters apply)."""
    from dist_respattn.model.heads.single_hop.kind import EStepTrainer

    trainer = EStepTrainer(estimator, e_step)
    passes = _EStepPasses(e_step)

    def choose(candidates: Candidates, label: str) -> tuple[Head, Selection]:
        inner = candidates.candidates  # type: ignore[attr-defined]
        selection = select(inner) if select is not None else Selection(inner.defaults)
        return inner.model(selection.hyperparameters), selection

    return run_head_em(
        trainer, passes, start=init, choose=choose, max_iter=max_iter, tol=tol, callback=callback,
        first_iteration=first_iteration, previous_log_likelihood=previous_log_likelihood,
    )  # fmt: skip
