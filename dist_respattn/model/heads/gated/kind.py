"""The attribute-gated head as a kind of the head protocol: its spec (a shared single-hop fit, then the gated one),
its trainer, and its M-step's candidates: one head per scale of the factors' prior, chosen on held-out rows.

The gated fit starts where the shared head ended (:mod:`dist_respattn.model.heads.gated.head`): its keys, position
prior and gate variance; every factor a copy of its emission on the training rows' pairs; each attribute's weights
seeded at random (the identity for the untied baseline, F = 0), so the first E-step splits the shared counts
between the factors by attribute.

The factors' MAP prior is centred on the shared head's emission (``B_f = (c_f + kappa a_s B_shared) /
(c_f[s] + kappa a_s)``, ``a_s`` the strengths the shared fit chose on its held-out rows): a factor, or an attribute
with few rows, backs off to what the whole corpus says after that context rather than to a unigram. ``kappa`` is
given, or chosen on held-out rows: at the first iteration over a wide grid (4^-4 .. 4^2), then among the last
choice and its neighbours (x/2, x, 2x); the M-step is run for each, each candidate scored, the best kept.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.arguments import as_nonnegative_float, as_positive_float
from dist_respattn.model.emission.layouts import PairSupport, SparseEmission, SparseEmissionCounts
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.selection import Hyperparameters
from dist_respattn.model.heads.base import (
    Block,
    BlockPass,
    Candidates,
    Columns,
    Grid,
    Head,
    HeadSpec,
    Option,
    Passes,
    Stage,
    Trainer,
    TrainerContext,
)
from dist_respattn.model.heads.gated.head import (
    FactorTables,
    GatedHead,
    GatedStatistics,
    gated_estep,
    gated_log_likelihoods,
    gated_m_step,
)
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.memory import MemoryEstimate, estimate_gated_memory

__all__ = [
    "FIRST_SCALES",
    "GROUP_DESCRIPTION",
    "OPTIONS",
    "OWN_SHARE",
    "PER_ATTRIBUTE_PARAMETERS",
    "SCALE_STEP",
    "STAGE_DEFAULTS",
    "SUMMARY",
    "GatedCandidates",
    "GatedGrid",
    "GatedGridScores",
    "GatedSpec",
    "GatedTrainer",
    "PriorScale",
    "SupportValue",
    "shared_on_support",
    "shared_strengths",
    "spec_from_options",
    "start_head",
    "support_partition",
]

#: An attribute's starting weight on its own table, beside shared factors (the rest is spread over them).
#: Near the untied baseline's start (measured on 12 stdlib packages, held-out perplexity after the best
#: iteration with F = 4: 43.09 at 0.9, 43.15 at 0.98, 43.57 at 0.5; untied 43.25).
OWN_SHARE = 0.9

#: What ``--per-attribute`` can untie from the shared head.
PER_ATTRIBUTE_PARAMETERS = ("emission", "position_prior")

#: The prior scales the first iteration tries (a wide grid: the best scale is far from 1 for an untied head),
#: and the factor between the last choice and the neighbours every later iteration tries.
FIRST_SCALES = tuple(4.0**k for k in range(-4, 3))
SCALE_STEP = 2.0

#: The gated stage's own loop settings (it starts from a fitted head, so it needs fewer iterations), by their
#: ``FitSettings`` names; ``--max-iter``, ``--tol``, ``--patience`` and ``--min-improvement``, when given, replace them.
STAGE_DEFAULTS: dict[str, Any] = {"max_iter": 30, "tol": 1e-6, "patience": 2, "min_improvement": 1e-4}


# --------------------------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class GatedSpec(HeadSpec):
    """The settings that fix a gated fit's result (saved with every checkpoint, checked on resume).

    Attributes:
        attribute_factors: F >= 1 shared factor tables; 0: one emission per attribute (the untied baseline).
        per_attribute: parameters held per attribute: ``"position_prior"`` (instead of shared), ``"emission"``
            (each attribute's own table beside the F shared ones, its share learned; with F = 0, the untied
            baseline).
        weight_strength: ``beta``, the Dirichlet pseudo-count spread over each attribute's F weights.
        prior_scale: ``kappa``: the factors' prior is centred on the shared emission with strengths ``kappa a_s``
            (the shared fit's ``a_s``); ``None`` chooses ``kappa`` on held-out rows every iteration.
        seed: seeds the attributes' starting weights.
        shared: the single-hop fit the gated one starts from (its first stage; a free position prior).
        stage_settings: the gated stage's loop settings (:data:`STAGE_DEFAULTS`, or what the user gave).
    """

    kind: ClassVar[str] = "gated"

    attribute_factors: int
    per_attribute: tuple[str, ...] = ()
    weight_strength: float = 1.0
    prior_scale: float | None = None
    seed: int = 0
    shared: SingleHopSpec = field(default_factory=SingleHopSpec)
    stage_settings: dict[str, Any] = field(default_factory=lambda: dict(STAGE_DEFAULTS))

    def __post_init__(self) -> None:
        if isinstance(self.attribute_factors, bool) or int(self.attribute_factors) < 0:
            raise ValueError(
                f"attribute_factors = {self.attribute_factors}: expected F >= 1 factors, or 0 for one emission per "
                "attribute"
            )
        object.__setattr__(self, "attribute_factors", int(self.attribute_factors))
        unknown = sorted(set(self.per_attribute) - set(PER_ATTRIBUTE_PARAMETERS))
        if unknown:
            raise ValueError(
                f"per_attribute = {', '.join(unknown)}: expected one of {', '.join(PER_ATTRIBUTE_PARAMETERS)} (keys "
                "and the gate variance stay shared)"
            )
        object.__setattr__(self, "per_attribute", tuple(sorted(set(self.per_attribute))))
        as_nonnegative_float(self.weight_strength, "weight_strength")
        if self.prior_scale is not None:
            as_positive_float(self.prior_scale, "prior_scale")
        if self.shared.position_buckets is not None:
            raise ValueError("--attribute-factors with --position-buckets: a gated head's prior is per position (free)")
        unknown = sorted(set(self.stage_settings) - set(STAGE_DEFAULTS))
        if unknown:
            raise ValueError(f"stage_settings: {', '.join(unknown)}: expected some of {', '.join(STAGE_DEFAULTS)}")
        object.__setattr__(self, "stage_settings", {**STAGE_DEFAULTS, **self.stage_settings})

    @property
    def untied(self) -> bool:
        return self.attribute_factors == 0

    @property
    def own_emission(self) -> bool:
        """Each attribute has its own table (the untied baseline, or beside F shared factors)."""
        return self.untied or "emission" in self.per_attribute

    def describe_tables(self) -> str:
        """The head's tables in words (``"F = 4 shared factors beside each attribute's own"``)."""
        if self.untied:
            return "one emission per attribute"
        own = " beside each attribute's own" if self.own_emission else ""
        return f"F = {self.attribute_factors} shared factors{own}"

    def check_attributes(self, attribute_names: tuple[str, ...] | None) -> None:
        """Refuse more factor tables than the store has attributes, before the shared stage runs.

        With F = A factors each attribute can already have a table of its own, so tables beyond A add no capacity,
        only memory (F tables over the support; F = 100,000 asked for 65.8 GiB): refused whatever the workers
        hold, with the largest F that means something.
        """
        num_attributes = len(attribute_names or ())
        if num_attributes and self.attribute_factors > num_attributes:
            raise ValueError(
                f"--attribute-factors {self.attribute_factors} with {num_attributes} attributes: more factor tables "
                f"than attributes add nothing (with F = {num_attributes} each attribute can have a table of its "
                f"own); use --attribute-factors {num_attributes} or fewer, or 0 for one emission per attribute"
            )

    def notes(self, attribute_names: tuple[str, ...] | None) -> list[str]:
        """:meth:`advice` for the store's attributes, when there is any."""
        advice = self.advice(len(attribute_names or ()))
        return [advice] if advice else []

    def advice(self, num_attributes: int) -> str | None:
        """What to say when a gated fit starts with fewer factor tables than attributes and no table per attribute.

        Each attribute's weights then end near one-hot: the attributes are clustered into F groups, each group
        sharing one table, which is rarely what asking for a head per attribute meant. Measured on six novels as
        attributes (F = 4): 0.4% held-out gain over the shared head and 75% of held-out passages classified,
        against 2.3% and all of them with each attribute's own table beside the factors. ``None`` when there is
        nothing to say.
        """
        factors = self.attribute_factors
        if self.own_emission or factors >= num_attributes:
            return None
        return (
            f"note: --attribute-factors {factors} with {num_attributes} attributes: fewer tables than attributes, so "
            f"each attribute's weights end near one-hot and the {num_attributes} attributes are clustered into "
            f"{factors} groups that share a table each; for a table per attribute beside the {factors} shared ones, "
            "add --per-attribute emission (six novels, F = 4: a 0.4% gain over the shared head and 75% of held-out "
            "passages classified, against 2.3% and 100% with it)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "attribute_factors": self.attribute_factors,
            "per_attribute": list(self.per_attribute),
            "weight_strength": float(self.weight_strength),
            "prior_scale": None if self.prior_scale is None else float(self.prior_scale),
            "seed": int(self.seed),
            "shared": self.shared.to_json(),
            "stage_settings": dict(self.stage_settings),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GatedSpec:
        """The spec :meth:`to_json` wrote, or an old checkpoint's ``settings`` (its loop settings at the top level, and
        no ``shared``: the shared fit's own settings are then the single-hop defaults unless given in ``"shared"``)."""
        shared = data.get("shared")
        stage = data.get("stage_settings")
        if stage is None:
            stage = {name: data[name] for name in STAGE_DEFAULTS if data.get(name) is not None}
        return cls(
            int(data["attribute_factors"]),
            tuple(data.get("per_attribute") or ()),
            float(data.get("weight_strength", 1.0)),
            None if data.get("prior_scale") is None else float(data["prior_scale"]),
            int(data.get("seed", 0)),
            SingleHopSpec() if shared is None else SingleHopSpec.from_json(shared),
            dict(stage),
        )

    def differences(self, other: HeadSpec, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """As any spec's, but the gated stage's ``max_iter`` may change: a resumed fit may run more iterations, as
        the loop's own ``max_iter`` may."""
        found = super().differences(other, ignore=(*ignore, "stage_settings"))
        if "stage_settings" in ignore:
            return found
        mine, theirs = self.to_json()["stage_settings"], other.to_json().get("stage_settings") or {}
        return found + [
            f"stage_settings.{name}: {mine.get(name)!r} -> {theirs.get(name)!r}"
            for name in sorted(set(mine) | set(theirs))
            if name != "max_iter" and mine.get(name) != theirs.get(name)
        ]

    @property
    def columns(self) -> Columns:
        """Every row's attribute (a store without them is refused before the shared stage runs)."""
        return Columns(attributes=True)

    def stages(self) -> list[Stage]:
        """The shared single-hop fit into ``shared/``, then the gated fit into the model directory itself."""
        return [Stage(self.shared, "shared"), Stage(self, ".", settings=dict(self.stage_settings))]

    @property
    def continues_from_init(self) -> bool:
        return True

    def trainer(self, context: TrainerContext) -> GatedTrainer:
        shared = context.init
        if not isinstance(shared, ResponsibilityAttentionDistribution):
            raise ValueError("a gated fit starts from a fitted shared (single-hop) head: give it as the fit's init")
        strength, base = shared_strengths(
            context.init_meta, context.init_arrays, shared.num_symbols, shared.num_targets
        )
        return GatedTrainer(self, context.shape, context.attribute_names, shared, strength, base)


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> GatedSpec | None:
    """The gated spec a ``fit`` asks for: ``None`` without ``--attribute-factors``; a resumed fit's own settings
    (``saved``) or the defaults, then the options given (a resumed gated fit needs no ``--attribute-factors``: its
    own is kept, and ``--max-iter`` and the other loop options given stop both stages, as in the fit it continues).
    A bad value raises ``ValueError`` naming its flag."""
    factors = options.get("attribute_factors")
    if factors is None and saved is not None:
        factors = saved.get("attribute_factors")
    if factors is None:
        if options.get("per_attribute") or any(
            options.get(name) is not None for name in ("attribute_smoothing", "attribute_prior_scale")
        ):
            raise ValueError(
                "--per-attribute, --attribute-smoothing and --attribute-prior-scale go with --attribute-factors F"
            )
        return None
    given: dict[str, Any] = dict(saved or {})
    given.pop("kind", None)
    given["attribute_factors"] = factors
    if options.get("per_attribute") is not None or saved is None:
        given["per_attribute"] = list(options.get("per_attribute") or ())
    if options.get("seed") is not None:
        given["seed"] = options["seed"]
    if options.get("attribute_smoothing") is not None:
        given["weight_strength"] = options["attribute_smoothing"]
    if options.get("attribute_prior_scale") is not None:
        given["prior_scale"] = options["attribute_prior_scale"]
    if saved is None:
        if not isinstance(base, SingleHopSpec):
            raise ValueError(f"a gated fit starts from a single-hop fit, not a {base.kind} one")
        given["shared"] = base.to_json()
    stage = dict(given.get("stage_settings") or STAGE_DEFAULTS)
    for name in STAGE_DEFAULTS:
        if options.get(name) is not None:
            stage[name] = options[name]
    given["stage_settings"] = stage
    try:
        return GatedSpec.from_json(given)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        for name, flag in (
            ("attribute_factors", "--attribute-factors"),
            ("per_attribute", "--per-attribute"),
            ("weight_strength", "--attribute-smoothing"),
            ("prior_scale", "--attribute-prior-scale"),
            ("max_iter", "--max-iter"),
        ):
            message = message.replace(name, flag)
        raise ValueError(message) from exc


# --------------------------------------------------------------------------------------------- the start


def shared_strengths(
    meta: dict[str, Any], arrays: dict[str, np.ndarray], num_symbols: int, num_targets: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(a_s (S,), u (T,))``: the emission prior the shared fit chose on its held-out rows, from its checkpoint's
    JSON (``emission_prior``, ``last_choice`` or its history's last choice) and arrays (``emission_base``,
    ``emission_types``); uniform and 1 for an older checkpoint that recorded none."""
    record = meta.get("emission_prior")
    prior = None
    if record and all(name in arrays for name in ("emission_base", "emission_types")):
        prior = EmissionPrior.from_arrays(arrays, record["kind"])
    choice = None
    if meta.get("last_choice"):
        choice = Hyperparameters.from_json(meta["last_choice"])
    else:
        for entry in reversed(meta.get("history", [])):
            if entry.get("heldout") is not None and entry.get("hyperparameters"):
                choice = Hyperparameters.from_json(entry["hyperparameters"])
                break
    if prior is None or choice is None:
        return np.ones(num_symbols), np.full(num_targets, 1.0 / num_targets)
    return prior.strengths(choice.emission_strength, choice.type_strength), prior.base


def shared_on_support(
    model: ResponsibilityAttentionDistribution, support: PairSupport, base: np.ndarray
) -> SparseEmission:
    """The shared head's emission as a sparse table on ``support`` with backoff base ``u``: exact for a MAP table
    over that base whose pairs with counts are the support's (a dense table's off-support cells are then
    ``a_s u_t / (c_s + a_s)``, one scale per row)."""
    emission = model.emission_table
    if isinstance(emission, SparseEmission) and emission.support.same_as(support):
        return emission
    probs = emission.to_dense()
    values = probs[support.symbols, support.targets]
    on_values = np.bincount(support.symbols, weights=values, minlength=support.num_symbols)
    on_base = np.bincount(support.symbols, weights=base[support.targets], minlength=support.num_symbols)
    off_base = 1.0 - on_base
    backoff = np.where(
        off_base > 1e-12, np.maximum(1.0 - on_values, 0.0) / np.where(off_base > 1e-12, off_base, 1.0), 0.0
    )
    return SparseEmission(support, values, backoff, base)


def start_head(
    shared: ResponsibilityAttentionDistribution, center: SparseEmission, spec: GatedSpec, names: tuple[str, ...]
) -> GatedHead:
    """The gated head a fit starts from (see the module): F copies of the shared emission ``center`` (on the fit's
    support), the attributes ``names``, and ``shared`` as its reference."""
    num_attributes = len(names)
    own = num_attributes if spec.own_emission else 0
    f = own + spec.attribute_factors
    factors = FactorTables(
        center.support, np.repeat(center.values[:, None], f, axis=1), np.repeat(center.backoff[None, :], f, axis=0),
        center.base,
    )  # fmt: skip
    if spec.untied:
        weights = np.eye(num_attributes)
    else:
        weights = np.zeros((num_attributes, f))
        shared_factors = np.random.default_rng(spec.seed).dirichlet(np.ones(f - own), size=num_attributes)
        # With own tables: OWN_SHARE on the attribute's own, the rest spread over the shared factors.
        weights[:, own:] = shared_factors * (1.0 - OWN_SHARE if own else 1.0)
        weights[np.arange(own), np.arange(own)] = OWN_SHARE
    prior = shared.position_prior[None, :]
    if "position_prior" in spec.per_attribute:
        prior = np.repeat(prior, num_attributes, axis=0)
    return GatedHead(
        shared.key_means, prior, shared.sigma2, factors, weights, fixed_weights=spec.untied, names=names,
        reference=shared,
    )  # fmt: skip


@dataclass(frozen=True)
class SupportValue:
    """The (symbol, target) pairs the selected rows hold at any position, as counts carrying their support."""

    counts: SparseEmissionCounts

    def __add__(self, other: SupportValue) -> SupportValue:
        c = self.counts
        return SupportValue(SparseEmissionCounts.union([c, other.counts], c.num_symbols, c.num_targets))


def support_partition(num_symbols: int, num_targets: int, blocks: Iterator[Block]) -> SupportValue:
    """The pairs ``(context[n, i], target[n])`` of one partition's rows of weight > 0."""
    s, t = num_symbols, num_targets
    total = SupportValue(SparseEmissionCounts.empty(s, t))
    for block in blocks:
        rows = block.rows
        live = slice(None) if block.weights is None else np.asarray(block.weights) > 0
        context, target = np.asarray(rows.context)[live], np.asarray(rows.target)[live]
        keys = np.repeat(target.astype(np.int64), context.shape[1]) * s + context.reshape(-1)
        total = total + SupportValue(SparseEmissionCounts.from_cells(keys, None, s, t))  # type: ignore[arg-type]
    return total


# --------------------------------------------------------------------------------------------- the M-step


@dataclass(frozen=True)
class PriorScale:
    """The M-step's choice: the scale ``kappa`` of the factors' prior (``given``: ``--attribute-prior-scale``)."""

    scale: float
    given: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"prior_scale": float(self.scale)}

    def describe(self) -> str:
        return f"prior scale {self.scale:.3g}" + (" (given)" if self.given else "")


@dataclass(frozen=True)
class GatedGridScores:
    """Held-out totals per candidate and attribute: ``target_log_prob`` and ``log_lik`` (K, A) the summed
    ``log p(target | context, query, a)`` and ``log p(query, target | context, a)``, ``weights`` (K, A)."""

    target_log_prob: np.ndarray
    log_lik: np.ndarray
    weights: np.ndarray

    @property
    def weight(self) -> float:
        return float(self.weights[0].sum()) if self.weights.shape[0] else 0.0

    def __add__(self, other: GatedGridScores) -> GatedGridScores:
        return GatedGridScores(
            self.target_log_prob + other.target_log_prob, self.log_lik + other.log_lik, self.weights + other.weights
        )

    def perplexity(self, k: int) -> float:
        """Candidate ``k``'s held-out perplexity (NaN without held-out weight)."""
        weight = float(self.weights[k].sum())
        return math.exp(-float(self.target_log_prob[k].sum()) / weight) if weight > 0 else math.nan


def known_rows(block: Block) -> tuple[np.ndarray, np.ndarray | None]:
    """A block's ``(attribute (n,) int64, weights)`` for the gated kernels: rows of attribute ``-1`` (an attribute
    the head does not know) read as attribute 0 at weight 0; the block's own weights when every row is known."""
    if block.attribute is None:
        raise ValueError("a gated head reads each row's attribute: the block carries none")
    attribute = np.asarray(block.attribute, dtype=np.int64)
    known = attribute >= 0
    if known.all():
        return attribute, block.weights
    return np.where(known, attribute, 0), np.where(known, block.weights_or_ones(), 0.0)


@dataclass(frozen=True)
class GatedGrid(Grid):
    """The held-out pass of a gated M-step: one head per prior scale, each row scored under its own attribute."""

    scales: tuple[float, ...]
    heads: tuple[GatedHead, ...]
    given: bool = False

    @property
    def columns(self) -> Columns:
        return Columns(attributes=True)

    def score(self, blocks: Iterable[Block]) -> GatedGridScores:
        k, a = len(self.heads), self.heads[0].num_attributes
        target_log_prob, log_lik, weights = np.zeros((k, a)), np.zeros((k, a)), np.zeros((k, a))
        for block in blocks:
            attribute, w = known_rows(block)
            w = block.weights_or_ones() if w is None else np.asarray(w, dtype=np.float64)
            live = w > 0
            for j, head in enumerate(self.heads):
                lines, joint = gated_log_likelihoods(head, block.rows.encoded, attribute, values_checked=block.checked)
                target_log_prob[j] += np.bincount(attribute[live], weights=w[live] * lines[live], minlength=a)
                log_lik[j] += np.bincount(attribute[live], weights=w[live] * joint[live], minlength=a)
                weights[j] += np.bincount(attribute[live], weights=w[live], minlength=a)
        return GatedGridScores(target_log_prob, log_lik, weights)


class GatedCandidates(Candidates):
    """A gated M-step's candidates: the closed-form M-step of the statistics at every prior scale."""

    def __init__(
        self, stats: GatedStatistics, previous: GatedHead, *, strength: np.ndarray, center: SparseEmission,
        weight_strength: float, prior_scale: float | None,
    ) -> None:  # fmt: skip
        self.stats, self.previous = stats, previous
        self.strength, self.center, self.weight_strength = strength, center, weight_strength
        self.prior_scale = prior_scale
        self._heads: dict[float, GatedHead] = {}

    def default(self) -> PriorScale:
        given = self.prior_scale is not None
        return PriorScale(float(self.prior_scale) if given else 1.0, given)  # type: ignore[arg-type]

    def scales(self, around: PriorScale | None) -> tuple[float, ...]:
        """The given scale; else :data:`FIRST_SCALES` first, then the last choice and its neighbours."""
        if self.prior_scale is not None:
            return (float(self.prior_scale),)
        if around is None:
            return FIRST_SCALES
        return (around.scale / SCALE_STEP, around.scale, around.scale * SCALE_STEP)

    def grid(self, around: Any) -> GatedGrid:
        scales = self.scales(around)
        return GatedGrid(scales, tuple(self.head_at(s) for s in scales), self.prior_scale is not None)

    def choose(self, grid: Grid, scores: Any) -> tuple[PriorScale, dict[str, float] | None]:
        """The scale of the lowest held-out perplexity (the first of equals), and its metrics:
        ``mean_log_likelihood`` the held-out mean joint log-likelihood per row ``log p(query, target | context, a)``,
        ``target_log_prob`` the mean ``log p(target | context, query, a)``, ``perplexity``. Held-out rows none of
        whose attributes the head knows raise (a validation store of other attributes)."""
        assert isinstance(grid, GatedGrid) and isinstance(scores, GatedGridScores)
        best = 0
        for k in range(1, len(grid.scales)):
            if scores.perplexity(k) < scores.perplexity(best):
                best = k
        weight = float(scores.weights[best].sum())
        if weight <= 0.0:
            raise ValueError(
                "no held-out rows of the attributes the fit trains on: a validation store needs rows of the "
                "training store's attributes (ingest it --like the training store)"
            )
        metrics = {
            "mean_log_likelihood": float(scores.log_lik[best].sum()) / weight,
            "target_log_prob": float(scores.target_log_prob[best].sum()) / weight,
            "perplexity": scores.perplexity(best),
        }
        return PriorScale(grid.scales[best], grid.given), metrics

    def head_at(self, scale: float) -> GatedHead:
        """The M-step with the prior at ``scale`` (made once)."""
        if scale not in self._heads:
            self._heads[scale] = gated_m_step(
                self.stats, self.previous, strength=scale * self.strength, center=self.center,
                weight_strength=self.weight_strength,
            )  # fmt: skip
        return self._heads[scale]

    def model(self, choice: Any) -> GatedHead:
        return self.head_at(float(choice.scale))

    def searches(self) -> bool:
        return self.prior_scale is None


# --------------------------------------------------------------------------------------------- the trainer


class GatedTrainer(Trainer):
    """A gated fit from a shared head: its spec, the store's attribute names, the shared head and its prior."""

    def __init__(
        self,
        spec: GatedSpec,
        shape: tuple[int, int, int, int],
        names: tuple[str, ...] | None,
        shared: ResponsibilityAttentionDistribution,
        strength: np.ndarray,
        base: np.ndarray,
    ) -> None:
        if not names:
            raise ValueError(
                "the store has no attribute per row; an attribute-gated head needs one: ingest it with "
                "--attribute-by {file,directory} (text) or --attributes A.npy (tokens, arrays)"
            )
        spec.check_attributes(tuple(names))
        self.spec, self.shape, self.names = spec, shape, tuple(names)
        self.shared, self.strength, self.base = shared, strength, base
        #: The factors' prior centre (the shared emission on the fit's support), once the support is known.
        self.center: SparseEmission | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The workers run the E-step alone: the shared head, its prior and the centre stay on the driver.
        return {**self.__dict__, "shared": None, "strength": None, "base": None, "center": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def columns(self) -> Columns:
        return Columns(attributes=True)

    def attribute_names(self) -> tuple[str, ...]:
        return self.names

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if resumed:
            if not isinstance(head, GatedHead):
                raise ValueError(f"a resumed gated fit continues a gated head, not a {head.kind} one")
            if head.names and head.names != self.names:
                raise ValueError("the store's attribute names differ from the gated fit's")
            return
        if not isinstance(head, ResponsibilityAttentionDistribution):
            raise ValueError(f"a gated fit starts from a fitted shared (single-hop) head, not a {head.kind} one")
        if head.buckets is not None:
            raise ValueError("--attribute-factors with --position-buckets: a gated head's prior is per position (free)")

    def searches(self) -> bool:
        # The held-out rows choose the scale and, given or not, keep the best iteration and stop early.
        return True

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if resumed:
            assert isinstance(start, GatedHead)
            self.center = shared_on_support(self.shared, start.factors.support, self.base)
            head = start
            if not head.names or head.reference is None:  # a checkpoint written before either was kept
                head = head.with_parameters(names=head.names or self.names, reference=head.reference or self.shared)
        else:
            shared = self.shared if start is None else start
            assert isinstance(shared, ResponsibilityAttentionDistribution)
            self.shared = shared
            emission = shared.emission_table
            if isinstance(emission, SparseEmission):
                support = emission.support
            else:
                s, t = self.shape[0], self.shape[3]
                value = passes.run(
                    BlockPass(
                        "gated-support", "collecting the training pairs", functools.partial(support_partition, s, t)
                    )
                )
                support = value.counts.support
                assert support is not None  # counts made from cells carry their pairs
            self.center = shared_on_support(shared, support, self.base)
            # The tables' size is known from the support now: a plan the workers cannot hold is refused before
            # start_head makes the tables (numpy's bare "Unable to allocate" otherwise).
            passes.plan_memory()
            head = start_head(shared, self.center, self.spec, self.names)
            passes.say(
                f"gated head: {self.spec.describe_tables()} over {support.num_pairs:,} pairs, {len(self.names)} "
                f"attributes, from the shared head ({head.num_parameters():,} parameters)"
            )
        self.tables = head.num_factors
        passes.plan_memory()
        return head

    def statistics(self, head: Head, blocks: Iterator[Block]) -> GatedStatistics:
        """The gated E-step statistics of one partition's blocks, in row order."""
        assert isinstance(head, GatedHead)
        stats = GatedStatistics.zeros(head)
        for block in blocks:
            attribute, weights = known_rows(block)
            gated_estep(head, block.rows.encoded, attribute, weights, stats, values_checked=block.checked)
        return stats

    def m_step(self, statistics: Any, previous: Head) -> GatedCandidates:
        assert isinstance(previous, GatedHead) and isinstance(statistics, GatedStatistics)
        assert self.center is not None, "prepare() makes the prior's centre"
        return GatedCandidates(
            statistics, previous, strength=self.strength, center=self.center,
            weight_strength=self.spec.weight_strength, prior_scale=self.spec.prior_scale,
        )  # fmt: skip

    def choice_from_json(self, data: dict[str, Any]) -> PriorScale | None:
        if not data or data.get("prior_scale") is None:
            return None
        return PriorScale(float(data["prior_scale"]), self.spec.prior_scale is not None)

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> MemoryEstimate | None:
        """The gated plan once the support is known (a sparse shared emission's, or the support pass's)."""
        if self.center is not None:
            num_pairs = self.center.support.num_pairs
        elif isinstance(self.shared.emission_table, SparseEmission):
            num_pairs = self.shared.emission_table.support.num_pairs
        else:
            return None
        num_attributes = len(self.names)
        tables = (num_attributes if self.spec.own_emission else 0) + self.spec.attribute_factors
        return estimate_gated_memory(
            self.shape, row_bytes=row_bytes, num_pairs=num_pairs, num_tables=tables, num_attributes=num_attributes,
            block_rows=block_rows, threads_per_worker=threads_per_worker, fan_in=fan_in,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------- the options


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a positive integer")
    return value


#: The option group's title on the command line.
SUMMARY = "attribute-gated head (the store's rows carry attributes: ingest --attribute-by / --attributes)"

#: The option group's description under ``fit``.
GROUP_DESCRIPTION = (
    "--max-iter, --tol, --patience and --min-improvement, when given, stop both stages; the gated stage's own "
    "defaults are 30 iterations, a tolerance of 1e-6, a patience of 2 and a minimum improvement of 1e-4 "
    "(it starts from a fitted head, so it needs fewer iterations)"
)

OPTIONS = (
    Option(
        ("--attribute-factors",),
        {
            "type": int,
            "metavar": "F",
            "help": "fit the shared head (into MODEL_DIR/shared), then a head whose emission each attribute mixes "
            "from F shared factor tables; 0: one emission per attribute (the untied baseline)",
        },
    ),
    Option(
        ("--per-attribute",),
        {
            "action": "append",
            "choices": ("position_prior", "emission"),
            "default": None,
            "help": "position_prior: one per attribute instead of shared; emission: each attribute's own table beside "
            "the F shared factors, its share learned (repeatable)",
        },
    ),
    Option(
        ("--attribute-prior-scale",),
        {
            "type": float,
            "metavar": "KAPPA",
            "help": "the factors' prior: centred on the shared emission with KAPPA times the shared fit's strengths "
            "(default: KAPPA chosen on the held-out rows every iteration)",
        },
    ),
    Option(
        ("--attribute-smoothing",),
        {
            "type": float,
            "metavar": "BETA",
            "help": "Dirichlet pseudo-count spread over each attribute's F weights (default 1)",
        },
    ),
    Option(
        ("--classify-attributes",),
        {
            "action": "store_true",
            "help": "classify every document of STORE by attribute from the head's likelihood (JSON: "
            "attribute_accuracy)",
        },
        ("evaluate",),
    ),
    Option(
        ("--fold-in",),
        {
            "action": "store_true",
            "help": "fold in STORE's attributes the model lacks: EM on their weights over half their rows, the rest "
            "scored",
        },
        ("evaluate",),
    ),
    Option(
        ("--fold-in-iterations",),
        {"type": _positive_int, "default": 20, "help": "EM iterations of a fold-in (20)"},
        ("evaluate",),
    ),
    Option(
        ("--attribute",),
        {
            "metavar": "NAME",
            "help": "a gated head: the attribute to write as (sample, predict --stream), or to compare emission rows "
            "under (neighbours; default: each in turn)",
        },
        ("sample", "predict", "neighbours"),
    ),
    Option(
        ("--mix",),
        {
            "metavar": "NAME=SHARE,...",
            "help": "a gated head: a mix of attributes to write as instead (sample, predict --stream), e.g. "
            "a=0.5,b=0.5",
        },
        ("sample", "predict"),
    ),
)
