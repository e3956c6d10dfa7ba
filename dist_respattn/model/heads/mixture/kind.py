"""The mixture of single-hop heads as a kind of the head protocol: its spec, statistics, trainer and M-step.

Exact EM with nested responsibilities. The E-step gives each row its component responsibilities
``r_k ∝ pi_k p_k(query, target | context)`` (one per-row log-density pass per component, never an (n, T) matrix);
component ``k``'s statistics are then the single-hop accumulator's with every row's weight multiplied by ``r_k``
(the accumulator computes the responsibilities over positions within the component), and the gate's are the
summed ``r_k``. The M-step is the single-hop estimator's for each component, with the hyperparameters the
component settings fix (nothing is chosen on held-out rows, though held-out rows are still scored), and
``pi_k ∝ mass_k + gate_pseudo_count / K``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.emission.layouts import DenseEmission, PairSupport, SparseEmission, SparseEmissionCounts
from dist_respattn.model.emission.pairs import PairCounts, PairTally, pairs_of_blocks
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.heads.base import (
    Block,
    BlockPass,
    Candidates,
    Grid,
    Head,
    HeadSpec,
    Passes,
    Trainer,
    TrainerContext,
    sum_into_copy,
)
from dist_respattn.model.heads.mixture.head import MixtureHead
from dist_respattn.model.heads.single_hop.accumulator import (
    ResponsibilityAttentionAccumulatorFactory,
    SufficientStatistics,
)
from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings
from dist_respattn.model.heads.single_hop.estimator import ResponsibilityAttentionEstimator
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec, start_partition
from dist_respattn.model.memory import (
    BLOCKS_HELD,
    DRIVER_BASELINE_BYTES,
    WORKER_BASELINE_BYTES,
    MemoryEstimate,
    estimate_single_hop_memory,
)
from dist_respattn.model.scores import ScoreTotals

__all__ = [
    "MixtureCandidates",
    "MixtureChoice",
    "MixtureGrid",
    "MixtureSpec",
    "MixtureStatistics",
    "MixtureTrainer",
    "mixture_start_partition",
    "row_assignments",
]

_MASK64 = 0xFFFFFFFFFFFFFFFF


# --------------------------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class MixtureSpec(HeadSpec):
    """The settings of a mixture fit.

    Attributes:
        components: K, the number of component heads (>= 2).
        component: the single-hop settings every component is fitted with (its emission prior, layout, sigma2...);
            its position prior must be free (no ``position_buckets``). Its hyperparameters are used as given (their
            defaults when unset): a mixture fit chooses nothing on held-out rows.
        seed: seeds the start's component responsibilities, drawn per store row (the same on any cluster).
        gate_pseudo_count: a symmetric Dirichlet prior's total strength on the gate, ``pi_k ∝ mass_k + a / K``. A
            component that loses every row would get ``pi_k = 0`` and could never win one back; one row's worth of
            prior keeps every component alive at no visible cost on a real store. 0 is maximum likelihood.
    """

    kind: ClassVar[str] = "mixture"

    components: int = 2
    component: SingleHopSpec = dataclasses.field(default_factory=SingleHopSpec)
    seed: int = 0
    gate_pseudo_count: float = 1.0

    def __post_init__(self) -> None:
        if int(self.components) != self.components or self.components < 2:
            raise ValueError(f"--mixture-components {self.components}: expected an integer K >= 2")
        if not isinstance(self.component, SingleHopSpec):
            raise TypeError(f"component = {type(self.component).__name__}: expected a SingleHopSpec")
        if self.component.position_buckets is not None:
            raise ValueError(
                "a mixture's components have free position priors: drop --position-buckets with --mixture-components"
            )
        if not self.gate_pseudo_count >= 0.0:
            raise ValueError(f"gate_pseudo_count = {self.gate_pseudo_count!r}: expected a number >= 0")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "components": int(self.components),
            "component": self.component.to_json(),
            "seed": int(self.seed),
            "gate_pseudo_count": float(self.gate_pseudo_count),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MixtureSpec:
        return cls(
            components=int(data["components"]),
            component=SingleHopSpec.from_json(data.get("component", {})),
            seed=int(data.get("seed", 0)),
            gate_pseudo_count=float(data.get("gate_pseudo_count", 1.0)),
        )

    def trainer(self, context: TrainerContext) -> MixtureTrainer:
        estimator = self.component.estimator(context.shape)
        saved = (context.saved_meta.get("emission_prior") or {}).get("kind")
        if estimator.needs_pairs and saved:
            # A resumed fit's own prior (made from its training rows once): no pass makes it again.
            estimator = estimator.resolved(EmissionPrior.from_arrays(context.saved_arrays, str(saved)))
        return MixtureTrainer(
            estimator, self.component.layout(context.shape), self.components, self.seed, self.gate_pseudo_count
        )


# --------------------------------------------------------------------------------------------- the statistics


@dataclass(frozen=True)
class MixtureStatistics:
    """Additive statistics of a mixture: each component's single-hop statistics under its responsibilities.

    Attributes:
        components: K :class:`~dist_respattn.model.heads.single_hop.accumulator.SufficientStatistics`, the rows'
            weights multiplied by their responsibility ``r_k`` (their own ``log_lik`` is ``sum w r_k log p_k``).
        gate_mass: (K,) ``sum_n w_n r_nk``.
        log_lik: ``sum_n w_n log p(query, target | context)`` under the mixture the E-step used (0 at the start).
        n_obs: ``sum_n w_n``.
        pairs: the (previous symbol, target) pairs of the rows, in a start pass that counts them (else ``None``).
    """

    components: tuple[SufficientStatistics, ...]
    gate_mass: np.ndarray
    log_lik: float
    n_obs: float
    pairs: PairCounts | None = None

    def copy(self) -> MixtureStatistics:
        return dataclasses.replace(
            self, components=tuple(c.copy() for c in self.components), gate_mass=self.gate_mass.copy()
        )

    def add(self, other: MixtureStatistics) -> MixtureStatistics:
        """``self + other`` into this value's arrays (the caller owns them: see :meth:`copy`)."""
        if len(other.components) != len(self.components):
            raise ValueError(f"cannot add statistics of {len(other.components)} components to {len(self.components)}")
        pairs = None if self.pairs is None or other.pairs is None else self.pairs + other.pairs
        np.add(self.gate_mass, other.gate_mass, out=self.gate_mass)
        return MixtureStatistics(
            tuple(mine.add(theirs) for mine, theirs in zip(self.components, other.components, strict=True)),
            self.gate_mass,
            self.log_lik + other.log_lik,
            self.n_obs + other.n_obs,
            pairs,
        )

    def __add__(self, other: MixtureStatistics) -> MixtureStatistics:
        return self.copy().add(other)

    @classmethod
    def sum_of(cls, values: list[MixtureStatistics]) -> MixtureStatistics:
        """The sum of ``values``, added left to right into one copy of the first (the combine tree's sum)."""
        return sum_into_copy(values)


# --------------------------------------------------------------------------------------------- partition maps


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over uint64 (wrapping arithmetic): a well-mixed hash of each value."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_assignments(seed: int, rows: np.ndarray, num_components: int) -> np.ndarray:
    """(n, K) float64 one-hot: each of the store rows ``rows`` (n,) given to one component, uniformly at random.

    A counter-based draw (a hash of the seed and the row, not a stream), so a row gets the same component whichever
    partition, block or worker reads it: the start is the same on any cluster and in process. Whole rows, not
    soft shares: flat Dirichlet shares average out over many rows into K nearly equal components, which EM is slow
    to pull apart; a random partition starts them further apart (measured: a higher likelihood after 30 iterations
    on two-component data, at every seed tried).
    """
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([int(seed) & _MASK64], dtype=np.uint64))[0]
        bits = _splitmix64(key ^ np.asarray(rows, dtype=np.int64).astype(np.uint64))
    uniform = (bits >> np.uint64(11)).astype(np.float64) / 2.0**53  # in [0, 1)
    chosen = np.minimum((uniform * num_components).astype(np.int64), num_components - 1)
    out = np.zeros((chosen.shape[0], num_components))
    out[np.arange(chosen.shape[0]), chosen] = 1.0
    return out


def mixture_start_partition(
    factory: ResponsibilityAttentionAccumulatorFactory,
    num_components: int,
    seed: int,
    with_pairs: bool,
    support: PairSupport | None,
    blocks: Iterator[Block],
) -> MixtureStatistics:
    """The start's statistics of one partition: uniform responsibilities over the positions, each row given to a
    random component (:func:`row_assignments` of its store row), and the rows' pairs when asked.

    ``support``: a sparse fit's pairs (found by the pass before); ``None`` for a dense fit.
    """
    accumulators = [factory.make(support) for _ in range(num_components)]
    gate_mass = np.zeros(num_components)
    n_obs = 0.0
    s, t = factory.num_symbols, factory.num_targets
    pairs = PairTally(s, t) if with_pairs else None
    for block in blocks:
        rows = block.rows
        w = block.weights_or_ones()
        r = row_assignments(seed, block.start + np.arange(block.num_rows), num_components)
        for k, accumulator in enumerate(accumulators):
            accumulator.seq_initialize_uniform(rows.encoded, w * r[:, k], checked=rows.checked)
        gate_mass += w @ r
        n_obs += float(w.sum())
        if pairs is not None:
            pairs.add(block)
    stats = tuple(a.value(copy=False) for a in accumulators)
    return MixtureStatistics(stats, gate_mass, 0.0, n_obs, None if pairs is None else pairs.value())


def mixture_estep(
    factory: ResponsibilityAttentionAccumulatorFactory, head: MixtureHead, blocks: Iterator[Block]
) -> MixtureStatistics:
    """The E-step statistics of one partition's blocks under ``head``, visited in row order."""
    accumulators = [factory.make_for(c) for c in head.components]
    gate_mass = np.zeros(head.num_components)
    log_lik = n_obs = 0.0
    with np.errstate(divide="ignore"):
        log_gate = np.log(head.gate)
    for block in blocks:
        rows = block.rows
        encoded = rows.encoded
        w = block.weights_or_ones()
        log_post = log_gate + head.component_log_densities(*encoded, checked=rows.checked)  # (n, K)
        row_ll = np.logaddexp.reduce(log_post, axis=1)
        live = w > 0.0
        impossible = np.flatnonzero(live & np.isneginf(row_ll))
        if impossible.size:
            raise ImpossibleEvidenceError(
                f"impossible evidence: row(s) {', '.join(str(block.start + int(i)) for i in impossible[:10])} have "
                "zero probability under every component of the mixture; smooth the emission or drop these rows"
            )
        r = np.zeros_like(log_post)
        r[live] = np.exp(log_post[live] - row_ll[live, None])
        weighted = w[:, None] * r
        for k, (accumulator, component) in enumerate(zip(accumulators, head.components, strict=True)):
            accumulator.seq_update(encoded, weighted[:, k], component, checked=True)
        gate_mass += weighted.sum(axis=0)
        log_lik += float(w[live] @ row_ll[live])
        n_obs += float(w.sum())
    return MixtureStatistics(tuple(a.value(copy=False) for a in accumulators), gate_mass, log_lik, n_obs)


# --------------------------------------------------------------------------------------------- the M-step


@dataclass(frozen=True)
class MixtureChoice:
    """A mixture M-step's (fixed) hyperparameters: each component's gate variance."""

    sigma2: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"sigma2": [float(v) for v in self.sigma2]}

    def describe(self) -> str:
        return "sigma2 " + ", ".join(f"{v:.3g}" for v in self.sigma2) + " (fixed)"


@dataclass(frozen=True)
class MixtureGrid(Grid):
    """The held-out pass of a mixture M-step: one point, the new head, scored (for early stopping and the fit page)."""

    head: MixtureHead

    def score(self, blocks: Iterable[Block]) -> ScoreTotals:
        return self.head.score(blocks)

    def nbytes(self) -> int:
        return self.head.nbytes()


@dataclass(frozen=True)
class MixtureCandidates(Candidates):
    """A mixture M-step: one head, its hyperparameters fixed by the component settings."""

    head: MixtureHead
    choice: MixtureChoice

    def default(self) -> MixtureChoice:
        return self.choice

    def grid(self, around: Any) -> MixtureGrid:
        return MixtureGrid(self.head)

    def choose(self, grid: Grid, scores: Any) -> tuple[MixtureChoice, dict[str, float] | None]:
        if scores is None or scores.weight <= 0.0:
            return self.choice, None
        metrics = scores.metrics()
        return self.choice, {name: metrics[name] for name in ("mean_log_likelihood", "target_log_prob", "perplexity")}

    def model(self, choice: Any) -> MixtureHead:
        return self.head

    def searches(self) -> bool:
        return False


# --------------------------------------------------------------------------------------------- the trainer


class MixtureTrainer(Trainer):
    """A mixture fit: the components' estimator (with its emission prior once made), layout, K, seed, gate prior."""

    def __init__(
        self,
        estimator: ResponsibilityAttentionEstimator,
        layout: str,
        num_components: int,
        seed: int,
        gate_pseudo_count: float,
    ) -> None:
        self.estimator = estimator
        self.layout = layout
        self.num_components = int(num_components)
        self.seed = int(seed)
        self.gate_pseudo_count = float(gate_pseudo_count)
        self.factory = estimator.accumulator_factory(layout=layout)
        #: A sparse fit's support, once the start pass (or the support pass of a warm start) found it.
        self.support: PairSupport | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        e = self.estimator
        return (e.num_symbols, e.context_length, e.query_dim, e.num_targets)

    @property
    def prior(self) -> EmissionPrior | None:
        prior = self.estimator.emission_prior
        return prior if isinstance(prior, EmissionPrior) else None

    def __getstate__(self) -> dict[str, Any]:
        # The workers run the E-step (the factory) only: the estimator's prior tables stay on the driver.
        state = self.__dict__.copy()
        state.update(estimator=None, support=None)
        return state

    def searches(self) -> bool:
        return False

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if not isinstance(head, MixtureHead):
            raise ValueError(f"a mixture fit starts from a mixture head, not a {head.kind} one")
        if head.num_components != self.num_components:
            raise ValueError(
                f"the starting model mixes {head.num_components} heads but the fit asks for {self.num_components}: "
                f"give --mixture-components {head.num_components}, or start from the data"
            )

    # -- the passes before iteration 1 ---------------------------------------------------------------------------

    def _found_support(self, stats: SufficientStatistics, passes: Passes) -> PairSupport:
        counts = stats.emission_count
        assert isinstance(counts, SparseEmissionCounts) and counts.support is not None
        support = counts.support
        self.support = support
        passes.say(
            f"sparse emission over {support.num_pairs:,} (symbol, target) pairs "
            f"({support.num_pairs / (support.num_symbols * support.num_targets):.2%} of S x T)"
        )
        passes.plan_memory()
        return support

    def _resolve_prior(self, pairs: PairCounts) -> None:
        kind = self.estimator.emission_prior
        assert isinstance(kind, str)
        self.estimator = self.estimator.resolved(EmissionPrior.from_pairs(pairs, kind))

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        s, t = self.shape[0], self.shape[3]
        needs_pairs = self.estimator.needs_pairs
        pairs: PairCounts | None = None
        if start is None:
            if self.layout == "sparse":
                # The single-hop start pass finds the pairs the rows hold (and counts them for the prior).
                found = passes.run(
                    BlockPass(
                        "support", "finding the pairs",
                        functools.partial(start_partition, self.factory, "uniform", 0, needs_pairs, None),
                    )
                )  # fmt: skip
                self._found_support(found.stats, passes)
                pairs = found.pairs
            value = passes.run(
                BlockPass(
                    "init", "initializing",
                    functools.partial(
                        mixture_start_partition, self.factory, self.num_components, self.seed,
                        needs_pairs and pairs is None, self.support,
                    ),
                )
            )  # fmt: skip
            if needs_pairs:
                self._resolve_prior(pairs if pairs is not None else value.pairs)
            return passes.choose(self.m_step(value, None))
        assert isinstance(start, MixtureHead)
        components = list(start.components)
        if resumed:
            table = components[0].emission_table
            if isinstance(table, SparseEmission):
                self.support = table.support
        elif self.layout == "sparse":
            found = passes.run(
                BlockPass(
                    "support", "finding the pairs",
                    functools.partial(start_partition, self.factory, "uniform", 0, needs_pairs, None),
                )
            )  # fmt: skip
            support = self._found_support(found.stats, passes)
            pairs = found.pairs
            components = [c.with_emission(c.emission_table.restricted(support)) for c in components]
        else:
            components = [
                c.with_emission(DenseEmission(c.emission_table.to_dense()))
                if isinstance(c.emission_table, SparseEmission)
                else c
                for c in components
            ]
        if needs_pairs and self.prior is None:
            if pairs is None:
                pairs = passes.run(BlockPass("pairs", "counting pairs", functools.partial(pairs_of_blocks, s, t)))
            self._resolve_prior(pairs)
        return MixtureHead(start.gate, components)

    # -- the iterations ------------------------------------------------------------------------------------------

    def statistics(self, head: Head, blocks: Iterator[Block]) -> MixtureStatistics:
        assert isinstance(head, MixtureHead)
        return mixture_estep(self.factory, head, blocks)

    def m_step(self, statistics: Any, previous: Head | None) -> MixtureCandidates:
        assert isinstance(statistics, MixtureStatistics)
        assert previous is None or isinstance(previous, MixtureHead)
        components = []
        for k, stats in enumerate(statistics.components):
            counts = stats.emission_count
            if isinstance(counts, SparseEmissionCounts) and counts.support is None and previous is None:
                # The start's sparse counts lie on the support the pass before found.
                assert self.support is not None
                stats = stats._replace(emission_count=counts.on(self.support))
            before = None if previous is None else previous.components[k]
            components.append(self.estimator.candidates(stats, previous=before).model())
        mass = statistics.gate_mass + self.gate_pseudo_count / self.num_components
        total = float(mass.sum())
        gate = mass / total if total > 0.0 else np.full(self.num_components, 1.0 / self.num_components)
        head = MixtureHead(gate, components)
        return MixtureCandidates(head, MixtureChoice(tuple(float(c.sigma2) for c in components)))

    def choice_from_json(self, data: dict[str, Any]) -> MixtureChoice | None:
        return MixtureChoice(tuple(float(v) for v in data["sigma2"])) if data else None

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        assert isinstance(head, MixtureHead)
        if statistics is None:  # a fit of no iterations: the starting model as it is
            return head.warnings()
        e = self.estimator
        out = head.collapse_warnings()
        for k, component in enumerate(head.components):
            said = degeneracy_warnings(
                component,
                key_mass=statistics.components[k].key_mass,
                min_sigma2=e.min_sigma2 if e.estimate_sigma2 else None,
            )
            out.extend(f"component {k}: {line}" for line in said)
        return out

    def checkpoint_extras(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        prior = self.prior
        if prior is None:
            return {}, {"emission_prior": None}
        return prior.to_arrays(), {"emission_prior": {"kind": prior.kind}}

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> MemoryEstimate:
        """K single-hop plans' values and models, plus the E-step's (rows, K) responsibilities per block."""
        one = estimate_single_hop_memory(
            self.shape, block_rows=block_rows, row_bytes=row_bytes, threads_per_worker=threads_per_worker,
            fan_in=fan_in, layout=self.layout, num_pairs=None if self.support is None else self.support.num_pairs,
        )  # fmt: skip
        k = self.num_components
        value, model = k * one.value_bytes + 8 * k, k * one.model_bytes
        # log-densities, responsibilities and their weighted copy: three (rows, K) float64 arrays per block.
        per_thread = 2 * value + BLOCKS_HELD * one.block_bytes + (fan_in + 1) * value + 3 * 8 * k * block_rows
        worker = WORKER_BASELINE_BYTES + 2 * model + threads_per_worker * per_thread
        driver = DRIVER_BASELINE_BYTES + k * (one.driver_bytes - DRIVER_BASELINE_BYTES)
        return MemoryEstimate(worker, driver, value, model, one.block_bytes, one.layout, one.num_pairs)
