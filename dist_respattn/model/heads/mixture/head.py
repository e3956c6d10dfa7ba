"""A mixture of single-hop heads: a gate ``pi`` over K component heads, the head kind ``"mixture"``.

Generative story for one row ``(context, query, target)``::

    k                ~ Categorical(pi)
    (query, target)  ~ the single-hop head k given the context

so ``p(query, target | context) = sum_k pi_k p_k(query, target | context)``, and given the query (the target
unseen) the components weigh ``w_k ∝ pi_k p_k(query | context)``: ``p(target | context, query) =
sum_k w_k p_k(target | context, query)``. Every component has a free position prior; their emissions are dense or
sparse as the fit's layout says.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.arguments import as_simplex
from dist_respattn.model.heads.base import Block, Head
from dist_respattn.model.heads.mixture.kernels import (
    StackedComponents,
    mixture_query_log_density,
    mixture_score,
    mixture_top_k,
)
from dist_respattn.model.heads.single_hop.arrays import MODEL_ARRAY_NAMES
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.kernels import per_position
from dist_respattn.model.scores import ScoreTotals, TopK

__all__ = ["COLLAPSED_GATE", "MixtureHead", "component_prefix"]

#: A component whose gate falls below this share of the rows is reported as collapsed.
COLLAPSED_GATE = 1e-3


def component_prefix(k: int) -> str:
    """The prefix of component ``k``'s arrays in a mixture's checkpoint (``component_0_key_means``...)."""
    return f"component_{k}_"


class MixtureHead(Head):
    """K single-hop heads of one shape (S, N, D, T) under a gate ``pi`` (K,).

    Args:
        gate: (K,) the mixing proportions (a probability vector).
        components: K :class:`~dist_respattn.model.heads.single_hop.distribution.ResponsibilityAttentionDistribution`
            of one shape, each with a free position prior.
    """

    kind: ClassVar[str] = "mixture"

    def __init__(self, gate: Any, components: Sequence[ResponsibilityAttentionDistribution]) -> None:
        self.components = tuple(components)
        if not self.components:
            raise ValueError("a mixture needs at least one component head")
        for k, c in enumerate(self.components):
            if not isinstance(c, ResponsibilityAttentionDistribution):
                raise TypeError(f"component {k} is a {type(c).__name__}: expected a single-hop head")
            if c.shape != self.components[0].shape:
                raise ValueError(f"component {k} has (S, N, D, T) = {c.shape}: expected {self.components[0].shape}")
            if c.buckets is not None:
                raise ValueError(f"component {k} ties its prior over buckets: a mixture's components have free priors")
        self.gate = as_simplex(gate, "gate")
        if self.gate.shape != (len(self.components),):
            raise ValueError(f"gate has {self.gate.shape[0]} entries for {len(self.components)} components")
        first = self.components[0]
        self.num_symbols, self.context_length = first.num_symbols, first.context_length
        self.query_dim, self.num_targets = first.query_dim, first.num_targets

    def __repr__(self) -> str:
        return f"MixtureHead(K={self.num_components}, S={self.num_symbols}, N={self.context_length}, " \
            f"D={self.query_dim}, T={self.num_targets}, gate={np.round(self.gate, 4).tolist()})"  # fmt: skip

    @property
    def num_components(self) -> int:
        return len(self.components)

    # -- the head protocol -----------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``gate`` (K,) and each component's arrays under :func:`component_prefix`; JSON with K and every
        component's metadata."""
        arrays: dict[str, np.ndarray] = {"gate": np.ascontiguousarray(self.gate, dtype=np.float64)}
        metas = []
        for k, component in enumerate(self.components):
            own, meta = component.to_arrays()
            arrays.update({component_prefix(k) + name: value for name, value in own.items()})
            metas.append(meta)
        meta_all: dict[str, Any] = {
            "num_components": self.num_components,
            "components": metas,
            "num_symbols": self.num_symbols,
            "context_length": self.context_length,
            "query_dim": self.query_dim,
            "num_targets": self.num_targets,
        }
        return arrays, meta_all

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> MixtureHead:
        from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays

        if "gate" not in arrays:
            raise ValueError("mixture: missing array 'gate'")
        metas = meta.get("components")
        if not isinstance(metas, list) or len(metas) != int(meta.get("num_components", -1)):
            raise ValueError("mixture: metadata needs 'num_components' and one 'components' entry for each")
        components = []
        for k, component_meta in enumerate(metas):
            prefix = component_prefix(k)
            own = {name: np.asarray(arrays[prefix + name]) for name in MODEL_ARRAY_NAMES if prefix + name in arrays}
            components.append(distribution_from_arrays(own, component_meta, source=f"mixture component {k}"))
        return cls(np.asarray(arrays["gate"]), components)

    def num_parameters(self) -> int:
        """The components' parameters and the gate's K - 1 free ones."""
        return int(sum(c.num_parameters() for c in self.components) + self.num_components - 1)

    def describe(self) -> str:
        layout = self.components[0].emission_table.layout
        return f"mixture of {self.num_components} single-hop heads, {layout} emission"

    def record(self) -> dict[str, Any]:
        return {"gate_min": float(self.gate.min())}

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        """Each component's emission, named ``component K`` (what ``neighbours`` compares)."""
        return [(f"component {k}", c.emission_table) for k, c in enumerate(self.components)]

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        """The gate and every component's gate variance."""
        gate = [float(g) for g in self.gate]
        sigma2 = [float(c.sigma2) for c in self.components]
        line = (
            f"last model: {self.num_components} components with gate "
            + ", ".join(f"{g:.1%}" for g in gate)
            + "; gate variances sigma2 = "
            + ", ".join(f"{v:.4g}" for v in sigma2)
        )
        return {"gate": gate, "component_sigma2": sigma2}, [line]

    def warnings(self, fit_settings: dict[str, Any] | None = None) -> list[str]:
        """A collapsed component (a gate under ``COLLAPSED_GATE``), and each component's own signs of degeneracy."""
        from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings

        component = (fit_settings or {}).get("component") or fit_settings or {}
        min_sigma2 = component.get("min_sigma2") if component.get("estimate_sigma2") else None
        out = self.collapse_warnings()
        for k, c in enumerate(self.components):
            out.extend(f"component {k}: {line}" for line in degeneracy_warnings(c, min_sigma2=min_sigma2))
        return out

    def collapse_warnings(self) -> list[str]:
        """One sentence for each component whose gate is under :data:`COLLAPSED_GATE`."""
        return [
            f"component {k} holds {self.gate[k]:.2%} of the rows: it has collapsed (fit fewer components)"
            for k in range(self.num_components)
            if self.gate[k] < COLLAPSED_GATE
        ]

    @functools.cached_property
    def stacked(self) -> StackedComponents:
        """The components' parameters as the compiled passes read them (built once per head)."""
        return StackedComponents.of(self.gate, self.components)

    def __getstate__(self) -> dict[str, Any]:
        # The stacked layout is rebuilt where it is needed, not shipped with the broadcast.
        state = self.__dict__.copy()
        state.pop("stacked", None)
        return state

    def _checked(self, block: Block) -> Any:
        return self.components[0].check_batch(block.rows.encoded, block.weights)

    def score(self, blocks: Iterable[Block]) -> ScoreTotals:
        """Held-out totals of the blocks' rows: the mixture's joint and predictive log-likelihoods, arg-max hits."""
        totals = ScoreTotals()
        for block in blocks:
            context, query, target, weights = self._checked(block)
            ll, lp, correct, weight = mixture_score(self.stacked, self.num_targets, context, query, target, weights)
            totals = totals + ScoreTotals(weight, ll, lp, correct)
        return totals

    def top_k(self, block: Block, k: int) -> TopK:
        """The ``k`` most probable targets of each row of ``block``, with the mixture's attention
        ``sum_k w_k a_k`` (n, N)."""
        if int(k) < 1:
            raise ValueError(f"k = {k}: expected a positive number of targets")
        rows = block.rows
        context, query = self.check_rows(rows.context, rows.query)
        targets, probabilities, attention = mixture_top_k(
            self.stacked, self.num_targets, context, query, min(int(k), self.num_targets)
        )
        return TopK(targets.astype(np.int32), probabilities, attention)

    def block_proba(self, block: Block) -> np.ndarray:
        """(n, T) ``p(target | row)`` of a block's rows (:meth:`predict_proba`)."""
        rows = block.rows
        return np.atleast_2d(self.predict_proba(rows.context, rows.query))

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> Any:
        """A :class:`~dist_respattn.model.heads.mixture.streaming.MixturePredictor` over one history."""
        from dist_respattn.model.heads.mixture.streaming import MixturePredictor

        return MixturePredictor(self, query_table, words=words)

    # -- densities and predictions of a batch (small batches: (n, T) and (n, K) arrays) -----------------------------

    def component_log_densities(self, context: Any, query: Any, target: Any, *, checked: bool = False) -> np.ndarray:
        """(n, K) ``log p_k(query, target | context)`` of an encoded batch, one column per component."""
        out = np.empty((np.shape(target)[0], self.num_components))
        for k, component in enumerate(self.components):
            if not checked:
                context, query, target, _ = component.check_batch((context, query, target))
                checked = True
            out[:, k] = per_position.row_log_likelihood(
                context, query, target, component.kernel_parameters, checked=True
            )
        return out

    def seq_log_density(self, x: tuple[Any, Any, Any]) -> np.ndarray:
        """(n,) ``log p(query, target | context) = log sum_k pi_k p_k(...)`` of an encoded batch."""
        joint = self.component_log_densities(*x)
        with np.errstate(divide="ignore"):
            return np.logaddexp.reduce(np.log(self.gate) + joint, axis=1)

    def query_log_density(self, context: Any, query: Any) -> np.ndarray:
        """(n,) ``log p(query | context)``, the target marginalized out."""
        ctx, y = self.check_rows(context, query)
        return mixture_query_log_density(self.stacked, ctx, y)

    def predict_proba(self, context: Any, query: Any) -> np.ndarray:
        """``p(target | context, query)``: (T,) for one row, (n, T) for a batch (materialized: small batches).

        Written with the components' own ``predict_proba`` and NumPy gates, apart from the compiled passes that
        :meth:`score` and :meth:`top_k` run (the tests hold them equal)."""
        single = np.ndim(context) == 1
        ctx, y = self.check_rows(context, query)
        log_q = np.empty((ctx.shape[0], self.num_components))
        for k, component in enumerate(self.components):
            diff = y[:, None, :] - component.key_means[ctx]
            with np.errstate(divide="ignore"):
                log_w = np.log(component.position_prior)[None, :] - np.einsum("nid,nid->ni", diff, diff) * (
                    0.5 / component.sigma2
                )
            log_q[:, k] = np.logaddexp.reduce(log_w, axis=1) + component.gate_const
        with np.errstate(divide="ignore"):
            log_post = np.log(self.gate) + log_q
        weights = np.exp(log_post - log_post.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out = np.zeros((ctx.shape[0], self.num_targets))
        for k, component in enumerate(self.components):
            out += weights[:, k, None] * component.predict_proba(ctx, y)
        return out[0] if single else out

    def check_rows(self, context: Any, query: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(context (n, N), query (n, D) float64)`` checked against this head's shape (one row becomes a batch)."""
        ctx = np.atleast_2d(np.asarray(context))
        y = np.atleast_2d(np.asarray(query, dtype=np.float64))
        checked = self.components[0].check_batch((ctx, y, np.zeros(ctx.shape[0], dtype=np.int64)))
        return checked.context, checked.query

    def sample_arrays(self, size: int, seed: int | np.random.Generator | None = None) -> tuple[np.ndarray, ...]:
        """``(context (n, N), query (n, D), target (n,))`` drawn from the mixture: each row's component from the
        gate, then the row from that component's sampler (every component draws its contexts alike)."""
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        which = rng.choice(self.num_components, size=int(size), p=self.gate)
        drawn = [c.sampler(rng).sample_arrays(int(size)) for c in self.components]
        context, query, target = (np.array(part) for part in drawn[0])
        for k in range(1, self.num_components):
            mine = which == k
            for out, part in zip((context, query, target), drawn[k], strict=True):
                out[mine] = part[mine]
        return context, query, target
