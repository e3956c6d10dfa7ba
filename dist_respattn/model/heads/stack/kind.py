"""The stack of fitted heads as a kind of the head protocol: its spec, the gate's additive statistics, its trainer.

Only the gate is fitted, by exact EM: a row's responsibility for component ``k`` is ``r_k ∝ pi_k p_k(q, t | c_k)``
(the ``joint`` mode) or ``r_k ∝ pi_k p_k(t | c_k, q)`` (the ``target`` mode), the statistics are ``sum_n w_n r_nk``
and the M-step ``pi_k ∝ sum_n w_n r_nk`` (maximum likelihood). Its E-steps read the fit's held-out rows
(:meth:`~dist_respattn.model.heads.base.Trainer.fits_heldout_rows`), which the components did not see: the
held-out log-likelihood is concave in the gate, so EM climbs to its maximum, at least every single component's.

EM on mixture weights climbs slowly where components overlap or a weight is small (each step moves it by a fraction
of what is left), so the M-step also offers steps past EM's, ``pi ∝ pi_old (pi_EM / pi_old)^alpha`` for each
``alpha`` of :data:`GATE_STEPS`, and Newton's steps on the objective (its curvature is additive too); the held-out
pass scores them all on the rows the E-step read and keeps the best, which is never worse there than EM's own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.fitting.fixed import PointTotals
from dist_respattn.model.heads.base import (
    Block,
    Candidates,
    Columns,
    Grid,
    Head,
    HeadSpec,
    Passes,
    Trainer,
    TrainerContext,
)
from dist_respattn.model.heads.stack.head import GATE_MODES, StackHead, component_view, mix_rows
from dist_respattn.model.scores import ScoreTotals

__all__ = [
    "GATE_STEPS",
    "NEWTON_STEPS",
    "STACK_FROM",
    "StackCandidates",
    "StackChoice",
    "StackGateGrid",
    "StackSpec",
    "StackStatistics",
    "StackTrainer",
    "extrapolated_gate",
    "gate_statistics",
    "newton_gate",
    "resolved_sources",
]

#: The option that names a stack's components (errors name it).
STACK_FROM = "--stack-from"
#: The steps the gate's M-step offers, as multiples of EM's own in log space (1: EM's).
GATE_STEPS = (1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True)
class StackSpec(HeadSpec):
    """The settings of a stack fit: the model directories of its components (``paths``, in order) and the gate's
    ``mode`` (``"joint"`` or ``"target"``). ``components``: the components' heads themselves, for a fit in this
    process (``fit_em``); not part of the JSON (a fit on a cluster loads ``paths``)."""

    kind: ClassVar[str] = "stack"

    paths: tuple[str, ...] = ()
    mode: str = "target"
    components: tuple[Head, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in GATE_MODES:
            raise ValueError(f"--stack-gate {self.mode}: expected one of {', '.join(GATE_MODES)}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "sources": list(self.paths), "mode": self.mode}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackSpec:
        return cls(tuple(str(s) for s in data.get("sources", ())), str(data.get("mode", "target")))

    def sources(self) -> tuple[tuple[str, str], ...]:
        """Each component's model directory, named by the option that gave it."""
        return tuple((STACK_FROM, path) for path in self.paths)

    @property
    def short_histories(self) -> bool:
        """A stack reads a stream's short histories (its components mask the missing positions)."""
        return True

    def trainer(self, context: TrainerContext) -> StackTrainer:
        """The fit's trainer; refuses a component of another kind, corpus shape, or a window longer than the rows'."""
        heads = tuple(self.components) if self.components is not None else tuple(context.sources)
        paths = self.paths or tuple(f"component {k}" for k in range(len(heads)))
        s, n, d, t = context.shape
        for path, head in zip(paths, heads, strict=False):
            try:
                component_view(head)
            except ValueError as exc:
                raise ValueError(f"{STACK_FROM} {path}: {exc}") from None
            if (head.num_symbols, head.query_dim, head.num_targets) != (s, d, t):
                raise ValueError(
                    f"{STACK_FROM} {path}: its (S, D, T) = {(head.num_symbols, head.query_dim, head.num_targets)} "
                    f"but the training store's are {(s, d, t)}: a stack's components are fitted on its corpus"
                )
            if head.context_length > n:
                raise ValueError(
                    f"{STACK_FROM} {path}: its window N = {head.context_length} is longer than the training rows' "
                    f"N = {n}: read the store with --context {head.context_length} or more (a token-stream store "
                    "is read at any window; a triple store's is fixed)"
                )
        if not heads and not context.saved_meta:
            raise ValueError(f"a stack fit needs its components: give {STACK_FROM} MODEL_A,MODEL_B")
        return StackTrainer(heads, self.mode, context.shape)


@dataclass(frozen=True)
class StackStatistics:
    """Additive statistics of the gate's E-step: ``mass`` (K,) ``sum_n w_n r_nk``, ``log_lik`` the sum the gate's EM
    climbs (the joint log-likelihood in the joint mode, the predictive one in the target mode: what the convergence
    rule reads), the predictive ``target_log_prob`` sum, and ``n_obs`` (the rows' weight)."""

    mass: np.ndarray
    log_lik: float
    target_log_prob: float
    n_obs: float
    #: (K, K) ``sum_n w_n r_nk r_nj``: with ``mass``, the curvature of the objective in the gate (Newton's step).
    cross: np.ndarray | None = None

    def __add__(self, other: StackStatistics) -> StackStatistics:
        cross = None if self.cross is None or other.cross is None else self.cross + other.cross
        return StackStatistics(
            self.mass + other.mass, self.log_lik + other.log_lik, self.target_log_prob + other.target_log_prob,
            self.n_obs + other.n_obs, cross,
        )  # fmt: skip


def gate_statistics(head: StackHead, blocks: Iterable[Block]) -> StackStatistics:
    """The gate's E-step over the blocks' rows of weight > 0 (each component's per-row densities, mixed)."""
    mass = np.zeros(len(head.components))
    cross = np.zeros((mass.size, mass.size))
    log_lik = target_log_prob = n_obs = 0.0
    for block in blocks:
        rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
        w = np.ones(rows.num_rows) if rows.weight is None else np.asarray(rows.weight, dtype=np.float64)
        live = np.flatnonzero(w > 0.0)
        if live.size == 0:
            continue
        rows, w = rows.select(live), w[live]
        joint, target, log_r = mix_rows(head.gate, head.densities(rows), head.mode)
        r = np.exp(log_r)
        mass += w @ r
        cross += (r * w[:, None]).T @ r
        log_lik += float(w @ (joint if head.mode == "joint" else target))
        target_log_prob += float(w @ target)
        n_obs += float(w.sum())
    return StackStatistics(mass, log_lik, target_log_prob, n_obs, cross)


@dataclass(frozen=True)
class StackChoice:
    """A stack M-step's choice: the gate of EM's step taken ``step`` times (1: EM's own), or with ``newton``, of
    Newton's step on the held-out objective taken ``step`` times."""

    step: float = 1.0
    newton: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"gate_step": float(self.step), "gate_by": "newton" if self.newton else "em"}

    def describe(self) -> str:
        if self.newton:
            return "gate by Newton's step" + ("" if self.step == 1.0 else f" x {self.step:g}")
        return "gate by EM" if self.step == 1.0 else f"gate by EM, {self.step:g}x its step"


#: The Newton steps the gate's M-step offers (fractions of the full step).
NEWTON_STEPS = (1.0, 0.5)


def newton_gate(gate: np.ndarray, mass: np.ndarray, cross: np.ndarray, step: float) -> np.ndarray | None:
    """(K,) the gate after ``step`` times Newton's step on the held-out objective ``sum_n w_n log sum_k pi_k p_nk``
    over the simplex (``None`` where it has no curvature to use), its weights clipped at 0 and renormalized.

    In the gate, the objective's gradient is ``mass_k / pi_k`` and its Hessian ``-cross_kj / (pi_k pi_j)``
    (:class:`StackStatistics`); the step solves the quadratic model under ``sum_k delta_k = 0``. A weight at 0
    stays at 0, as under EM."""
    live = np.flatnonzero(gate > 0.0)
    if live.size < 2:
        return None
    pi = gate[live]
    g = mass[live] / pi
    h = -cross[np.ix_(live, live)] / np.outer(pi, pi)
    k = live.size
    kkt = np.zeros((k + 1, k + 1))
    kkt[:k, :k], kkt[:k, k], kkt[k, :k] = h, 1.0, 1.0
    try:
        delta = np.linalg.solve(kkt, np.concatenate([-g, [0.0]]))[:k]
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(delta)):
        return None
    new = np.zeros_like(gate)
    new[live] = np.maximum(pi + float(step) * delta, 0.0)
    total = new.sum()
    return None if total <= 0.0 else new / total


def extrapolated_gate(old: np.ndarray, em: np.ndarray, step: float) -> np.ndarray:
    """(K,) ``pi ∝ old (em / old)^step``: EM's step (``step = 1``) taken ``step`` times in log space; a weight EM
    sets to 0 stays 0."""
    old, em = np.asarray(old, dtype=np.float64), np.asarray(em, dtype=np.float64)
    live = (old > 0.0) & (em > 0.0)
    log = np.full(old.shape, -np.inf)
    log[live] = np.log(old[live]) + float(step) * (np.log(em[live]) - np.log(old[live]))
    if not live.any():
        return em
    gate = np.exp(log - log[live].max())
    return gate / gate.sum()


@dataclass(frozen=True)
class StackGateGrid(Grid):
    """The held-out pass of a stack M-step: ``head`` under each of ``gates`` (its components' densities of a row are
    read once, then mixed under every gate)."""

    head: StackHead
    gates: tuple[np.ndarray, ...]

    @property
    def columns(self) -> Columns:
        return self.head.columns

    def score(self, blocks: Iterable[Block]) -> PointTotals:
        totals = [ScoreTotals() for _ in self.gates]
        for block in blocks:
            rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
            self.head.check_rows(rows)
            w = np.ones(rows.num_rows) if rows.weight is None else np.asarray(rows.weight, dtype=np.float64)
            live = np.flatnonzero(w > 0.0)
            if live.size == 0:
                continue
            rows, w = rows.select(live), w[live]
            densities = self.head.densities(rows)
            for i, gate in enumerate(self.gates):
                joint, target, _ = mix_rows(gate, densities, self.head.mode)
                totals[i] = totals[i] + ScoreTotals(float(w.sum()), float(w @ joint), float(w @ target))
        return PointTotals(tuple(totals))

    def nbytes(self) -> int:
        return self.head.nbytes()


@dataclass(frozen=True)
class StackCandidates(Candidates):
    """A stack M-step: ``head`` (the previous gate), EM's gate ``em`` taken each step of :data:`GATE_STEPS`, and,
    from the statistics' curvature ``cross``, Newton's steps of :data:`NEWTON_STEPS`."""

    head: StackHead
    em: np.ndarray
    mass: np.ndarray | None = None
    cross: np.ndarray | None = None

    @property
    def points(self) -> tuple[tuple[StackChoice, np.ndarray], ...]:
        points = [(StackChoice(step), extrapolated_gate(self.head.gate, self.em, step)) for step in GATE_STEPS]
        if self.mass is not None and self.cross is not None:
            for step in NEWTON_STEPS:
                gate = newton_gate(self.head.gate, self.mass, self.cross, step)
                if gate is not None:
                    points.append((StackChoice(step, newton=True), gate))
        return tuple(points)

    def default(self) -> StackChoice:
        return StackChoice(GATE_STEPS[0])

    def grid(self, around: Any) -> StackGateGrid:
        return StackGateGrid(self.head, tuple(gate for _, gate in self.points))

    def choose(self, grid: Grid, scores: Any) -> tuple[StackChoice, dict[str, float] | None]:
        if scores is None or scores.weight <= 0.0:
            return self.default(), None
        # What the gate's EM climbs: the predictive log-likelihood in the target mode, the joint one in the joint.
        values = [t.target_log_prob if self.head.mode == "target" else t.log_lik for t in scores.totals]
        best = int(np.argmax(values))  # the first of equals: EM's own step first
        metrics = scores.totals[best].metrics()
        return self.points[best][0], {
            name: metrics[name] for name in ("mean_log_likelihood", "target_log_prob", "perplexity")
        }

    def model(self, choice: Any) -> StackHead:
        for point, gate in self.points:
            if point == choice:
                return self.head.with_gate(gate)
        return self.head.with_gate(self.points[0][1])

    def searches(self) -> bool:
        return False  # the gate is not a setting: without held-out rows there is no gate to fit at all


class StackTrainer(Trainer):
    """A stack fit: the components (``()`` for a resumed fit, whose checkpoint holds them), the gate's mode, and the
    shape ``(S, N, D, T)`` of the rows."""

    def __init__(self, components: tuple[Head, ...], mode: str, shape: tuple[int, int, int, int]) -> None:
        self.components = components
        self.mode = mode
        self.shape = shape

    def __getstate__(self) -> dict[str, Any]:
        # The tasks carry the trainer to the workers, and the head they are given holds the components already:
        # the start's copy of them (tens of MB) stays on the driver.
        state = self.__dict__.copy()
        state["components"] = ()
        return state

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    def searches(self) -> bool:
        return False

    def fits_heldout_rows(self) -> bool:
        """The gate is learned on rows the components were not fitted on."""
        return True

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if not isinstance(head, StackHead):
            raise ValueError(f"a stack fit starts from its components ({STACK_FROM}), not from a {head.kind} head")
        if head.mode != self.mode:
            raise ValueError(f"the stack to start from has a {head.mode} gate, this fit a {self.mode} one")

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if start is not None:
            assert isinstance(start, StackHead)
            return start
        k = len(self.components)
        head = StackHead(np.full(k, 1.0 / k), self.components, self.mode, context_length=self.shape[1])
        windows = ", ".join(f"{h.kind} N = {n}" for h, n in zip(head.components, head.windows, strict=True))
        passes.say(f"stack of {k} heads ({windows}), {self.mode} gate fitted by EM from a uniform start")
        return head

    def statistics(self, head: Head, blocks: Iterator[Block]) -> StackStatistics:
        """The gate's E-step over one partition's blocks, in row order (:func:`gate_statistics`)."""
        assert isinstance(head, StackHead)
        return gate_statistics(head, blocks)

    def m_step(self, statistics: Any, previous: Head) -> StackCandidates:
        assert isinstance(statistics, StackStatistics) and isinstance(previous, StackHead)
        total = float(statistics.mass.sum())
        em = previous.gate if total <= 0.0 else statistics.mass / total
        return StackCandidates(previous, np.asarray(em, dtype=np.float64), statistics.mass, statistics.cross)

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        """A stack whose gate keeps one component alone: it is that component, at the cost of all of them. (A part
        the gate leaves out beside others is no fault: the recipe's single head on text, say; the gate line shows
        it.)"""
        assert isinstance(head, StackHead)
        kept = [k for k, g in enumerate(head.gate) if g >= 1e-4]
        if len(kept) != 1 or len(head.components) < 2:
            return []
        k = kept[0]
        return [
            f"the stack's gate keeps component {k} ({head.components[k].kind}, N = {head.windows[k]}) alone: the "
            "others add nothing on the held-out rows, and that component's own model predicts as well, more cheaply"
        ]


def resolved_sources(text: str) -> tuple[str, ...]:
    """``--stack-from A,B`` as absolute directories (a resumed fit compares them), in order."""
    paths = tuple(part.strip() for part in str(text).split(",") if part.strip())
    return tuple(os.path.abspath(p) for p in paths)
