"""The responsibility-attention head: one attention head written as a mixture over context positions.

Generative story for one triple ``(context, query, target)`` with context ids ``c_1..c_N``::

    z      ~ Categorical(position_prior)
    query  ~ Normal(key_means[c_z], sigma2 I)
    target ~ Categorical(emission[c_z, :])

so ``p(query, target | context) = sum_i pi_i N(query; K[c_i], sigma2 I) B[c_i, target]`` and the
attention weight on position ``i`` is the posterior responsibility ``p(z = i | query, target, context)``.
Because the gate is generative, every M-step is closed form and EM is exact.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dist_respattn.model.arguments import (
    CheckedBatch,
    as_finite_matrix,
    as_id_array,
    as_positive_float,
    as_positive_int,
    as_row_simplex,
    as_simplex,
    as_sparse_emission,
    check_batch,
)
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import DenseEmission, Emission, SparseEmission
from dist_respattn.model.encoder import ResponsibilityAttentionDataEncoder
from dist_respattn.model.heads.base import Block, Columns, Head
from dist_respattn.model.kernels import per_position
from dist_respattn.model.kernels.log_weights import block_log_weights

if TYPE_CHECKING:
    from dist_respattn.model.heads.single_hop.estimator import ResponsibilityAttentionEstimator
    from dist_respattn.model.heads.single_hop.sampler import ResponsibilityAttentionSampler

__all__ = ["ResponsibilityAttentionDistribution"]

#: Rows per block in prediction, bounding the (block, N, D) gathers.
_PREDICT_BLOCK_ROWS = 8192

#: ``emission`` refuses to materialize a sparse emission of more cells than this (1 GiB of float64).
_DENSE_VIEW_CELLS = 2**27


class ResponsibilityAttentionDistribution(Head):
    """One generative-gate attention head over contexts of N symbols (the head kind ``"single_hop"``).

    Args:
        key_means: (S, D) key mean of every symbol.
        emission: (S, T) target distribution of every symbol (rows are probability vectors), or an
            :class:`~dist_respattn.model.emission.layouts.Emission` of either layout.
        position_prior: (N,) prior over context positions; its length is the context length N.
            When omitted, ``context_length`` must be given and the prior is uniform.
        sigma2: gate variance (> 0), the responsibility temperature.
        name: optional name.
        context_length: N for a uniform prior when ``position_prior`` is omitted.
        buckets: recency buckets the prior is tied over (:class:`~dist_respattn.model.buckets.PositionBuckets`),
            or ``None`` for a free prior. A tied prior is constant within each bucket; rows are then scored
            and fitted by the histogram kernels, and may have fewer than N earlier tokens.

    Every parameter is validated on construction; the error names the parameter, the offending
    entry and what was expected.
    """

    kind: ClassVar[str] = "single_hop"

    def __init__(
        self,
        key_means: Any,
        emission: Any,
        position_prior: Any = None,
        sigma2: float = 1.0,
        name: str | None = None,
        *,
        context_length: int | None = None,
        buckets: PositionBuckets | None = None,
    ) -> None:
        self.key_means = as_finite_matrix(key_means, "key_means")
        self.num_symbols, self.query_dim = self.key_means.shape
        if isinstance(emission, SparseEmission):
            self.emission_table: Emission = as_sparse_emission(emission, "emission")
        else:
            probs = emission.probs if isinstance(emission, DenseEmission) else emission
            self.emission_table = DenseEmission(as_row_simplex(probs, "emission"))
        if self.emission_table.num_symbols != self.num_symbols:
            raise ValueError(
                f"emission has {self.emission_table.num_symbols} rows but key_means has {self.num_symbols}: "
                "expected one emission row per symbol"
            )
        self.num_targets = self.emission_table.num_targets
        if context_length is not None:
            context_length = as_positive_int(context_length, "context_length")
        if position_prior is None:
            if context_length is None:
                raise ValueError(
                    "position_prior is required (its length is the context length N); "
                    "or pass context_length=N for a uniform prior"
                )
            position_prior = np.full(context_length, 1.0 / context_length)
        # The length first: a prior of the wrong length also fails to sum to 1, which would hide the cause.
        if context_length is not None and np.ndim(position_prior) == 1 and len(position_prior) != context_length:
            raise ValueError(f"context_length = {context_length} but position_prior has length {len(position_prior)}")
        self.position_prior = as_simplex(position_prior, "position_prior")
        self.context_length = self.position_prior.shape[0]
        if buckets is not None:
            if buckets.context_length != self.context_length:
                raise ValueError(
                    f"buckets cover N = {buckets.context_length} positions but position_prior has length "
                    f"{self.context_length}"
                )
            if not buckets.is_tied(self.position_prior):
                raise ValueError(f"position_prior is not constant within the {buckets.describe()}: tie it first")
        self.buckets = buckets
        self.sigma2 = as_positive_float(sigma2, "sigma2")
        self.name = name
        with np.errstate(divide="ignore"):
            self.log_position_prior = np.log(self.position_prior)
        self.gate_const = -0.5 * self.query_dim * float(np.log(2.0 * np.pi * self.sigma2))

    def __repr__(self) -> str:
        return (
            f"ResponsibilityAttentionDistribution(S={self.num_symbols}, N={self.context_length}, "
            f"D={self.query_dim}, T={self.num_targets}, sigma2={self.sigma2!r}, name={self.name!r})"
        )

    __str__ = __repr__

    @property
    def emission(self) -> np.ndarray:
        """(S, T) emission probabilities (the reference library's attribute).

        A sparse emission is materialized, up to 2**27 cells; past that, read ``emission_table``.
        """
        table = self.emission_table
        if isinstance(table, SparseEmission) and self.num_symbols * self.num_targets > _DENSE_VIEW_CELLS:
            raise ValueError(
                f"the emission is sparse over {table.support.num_pairs:,} pairs and (S, T) = "
                f"{(self.num_symbols, self.num_targets)} is too large to materialize: read emission_table instead"
            )
        return table.to_dense()

    # -- the head protocol ----------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The head as float64 arrays and JSON (``sigma2``, ``name``, shape, layout, buckets)."""
        from dist_respattn.model.heads.single_hop.arrays import distribution_to_arrays

        return distribution_to_arrays(self)

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> ResponsibilityAttentionDistribution:
        from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays

        return distribution_from_arrays(arrays, meta)

    @classmethod
    def from_shards(cls, common: Any, shards: Any, meta: dict[str, Any]) -> ResponsibilityAttentionDistribution:
        """The head a sharded M-step wrote in parts (:mod:`~dist_respattn.model.heads.single_hop.sharded`)."""
        from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays
        from dist_respattn.model.heads.single_hop.sharded import join_shards

        return distribution_from_arrays(join_shards(common, shards), meta)

    def num_parameters(self) -> int:
        """Keys (S D), the emission's free cells (a sparse one's pairs and backoff), the prior and sigma2."""
        table = self.emission_table
        if isinstance(table, SparseEmission):
            emission = table.support.num_pairs + self.num_symbols + self.num_targets  # pairs, backoff, base
        else:
            emission = self.num_symbols * self.num_targets
        return int(self.key_means.size + emission + self.context_length + 1)

    def nbytes(self) -> int:
        """The emission (either layout) and the keys."""
        return int(self.emission_table.nbytes + self.key_means.nbytes)

    def describe(self) -> str:
        prior = "free prior" if self.buckets is None else f"prior tied over {self.buckets.describe()}"
        return f"single-hop head, {self.emission_table.layout} emission, {prior}"

    @property
    def columns(self) -> Columns:
        """A tied prior reads token windows (the histogram kernels); a free one, encoded rows."""
        return Columns(windows=self.buckets is not None)

    def score(self, blocks: Iterable[Block]) -> Any:
        """Held-out totals (:class:`~dist_respattn.model.heads.scores.ScoreTotals`) of the blocks."""
        from dist_respattn.model.heads.single_hop.scoring import score_rows
        from dist_respattn.model.kernels.histogram import score_windows
        from dist_respattn.model.scores import ScoreTotals

        totals = ScoreTotals()
        for block in blocks:
            rows = block.rows
            if self.buckets is not None:
                weighted = rows if block.weights is rows.weight else rows._replace(weight=block.weights)
                totals = totals + score_windows(self, weighted)
            else:
                totals = totals + score_rows(self, rows.encoded, block.weights)
        return totals

    def top_k(self, block: Block, k: int) -> Any:
        """The top ``k`` targets of a block's rows (:func:`~.top_k.predict_top_k`)."""
        from dist_respattn.model.heads.single_hop.top_k import predict_top_k

        self.check_top_k()
        rows = block.rows
        return predict_top_k(self, rows.context, rows.query, k, base_order=self.base_order)

    def block_proba(self, block: Block) -> np.ndarray:
        """(n, T) ``p(target | row)`` of a block's rows: encoded rows (a free prior) through :meth:`predict_proba`;
        token windows (a tied prior), their missing positions masked as the histogram kernels mask them."""
        from dist_respattn.model.rows import WindowRows

        rows = block.rows
        if not isinstance(rows, WindowRows):
            return np.atleast_2d(self.predict_proba(rows.context, rows.query))
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)
        n_pos = self.context_length
        # Column j of a row holds the token N - j positions back; columns before its window's begin are masked.
        positions = rows.end[:, None] - n_pos + np.arange(n_pos)[None, :]
        present = positions >= rows.begin[:, None]
        context = np.where(present, rows.tokens[np.maximum(positions, 0)], 0).astype(np.int64)
        query = np.asarray(rows.query_table, dtype=np.float64)[rows.query_index]
        diff = query[:, None, :] - self.key_means[context]
        with np.errstate(divide="ignore"):
            log_w = np.log(self.position_prior)[None, :] - np.einsum("nid,nid->ni", diff, diff) * (0.5 / self.sigma2)
        log_w[~present] = -np.inf
        weights = np.exp(log_w - log_w.max(axis=1, keepdims=True))
        attention = weights / weights.sum(axis=1, keepdims=True)
        return self.emission_table.predictive(context, attention)

    def check_top_k(self) -> None:
        if self.buckets is not None:
            raise ValueError(
                f"its position prior is tied over {self.buckets.describe()}: such a head predicts one history at a "
                "time (`dist-respattn predict MODEL STORE --stream`, or dist_respattn.model.streaming.Predictor); "
                "predictions into a store take heads with a free prior"
            )

    def warnings(self, fit_settings: dict[str, Any] | None = None) -> list[str]:
        from dist_respattn.model.heads.single_hop.diagnostics import degeneracy_warnings

        settings = fit_settings or {}
        return degeneracy_warnings(
            self, min_sigma2=settings.get("min_sigma2") if settings.get("estimate_sigma2") else None
        )

    @functools.cached_property
    def base_order(self) -> np.ndarray | None:
        """A sparse emission's targets by backoff probability (a sort of T, made once per head); ``None`` dense."""
        from dist_respattn.model.heads.single_hop.scoring import base_order

        table = self.emission_table
        return base_order(table) if isinstance(table, SparseEmission) else None

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> Any:
        """A :class:`~dist_respattn.model.streaming.Predictor` over one history (another kind's options given to it
        are refused: a single-hop head takes none)."""
        from dist_respattn.model.streaming import Predictor

        for name, value in (options or {}).items():
            if value not in (None, False):
                raise ValueError(
                    f"--{name.replace('_', '-')} {value}: this is a plain head, without attributes (the option is for "
                    "another kind of head): leave it out"
                )
        return Predictor(self, query_table, words=words)

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Emission]]:
        """Its one emission table, named ``"emission"``."""
        return [("emission", self.emission_table)]

    def record(self) -> dict[str, Any]:
        return {"sigma2": float(self.sigma2)}

    def recovery(self, truth: Head) -> tuple[dict[str, Any], list[str]] | None:
        """Keys, prior, emission and gate variance against a single-hop ``truth`` of this shape
        (:func:`~dist_respattn.model.heads.single_hop.diagnostics.recovery_report`)."""
        from dist_respattn.model.heads.single_hop.diagnostics import recovery_report

        if not isinstance(truth, ResponsibilityAttentionDistribution) or truth.shape != self.shape:
            return None
        rec = recovery_report(truth, self)
        return rec, [
            f"keys            RMSE {rec['key_rmse']:.4f} ({100 * rec['key_rmse_relative']:.2f}% of the key scale)",
            f"position prior  L1 distance {rec['prior_l1']:.4f}",
            f"emission        total variation mean {rec['emission_tv_mean']:.4f}, max {rec['emission_tv_max']:.4f}",
            f"gate variance   fitted / true = {rec['sigma2_ratio']:.4f}",
        ]

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        """The gate variance and the three most attended positions."""
        order = sorted(range(self.context_length), key=lambda i: -self.position_prior[i])
        top = [[int(i), float(self.position_prior[i])] for i in order[:3]]
        shown = ", ".join(f"{i} ({p:.1%})" for i, p in top)
        line = f"last model: gate variance sigma2 = {self.sigma2:.4g}; most attended positions: {shown}"
        return {"sigma2": float(self.sigma2), "position_prior_top": top}, [line]

    def __getstate__(self) -> dict[str, Any]:
        # The kernel's layout (an S×T log table) is rebuilt where it is needed, not shipped: pickling
        # a model that has scored rows would otherwise double what a cluster sends to each worker.
        state = self.__dict__.copy()
        state.pop("kernel_parameters", None)
        state.pop("_histogram_parameters", None)
        state.pop("base_order", None)
        return state

    @functools.cached_property
    def kernel_parameters(self) -> per_position.KernelParameters | per_position.SparseKernelParameters:
        """The parameters in the layout the E-step kernel reads (built once per distribution)."""
        return per_position.KernelParameters.from_arrays(
            self.key_means, self.emission_table, self.position_prior, self.sigma2
        )

    # ------------------------------------------------------------------------------------ scoring

    def density(self, x: tuple[Any, Any, int]) -> float:
        """``p(query, target | context)`` of one triple ``(context (N,), query (D,), target)``."""
        return float(np.exp(self.log_density(x)))

    def log_density(self, x: tuple[Any, Any, int]) -> float:
        """``log p(query, target | context)`` of one triple ``(context (N,), query (D,), target)``."""
        encoded = self.dist_to_encoder().seq_encode([x])
        return float(self.seq_log_density(encoded)[0])

    def seq_log_density(self, x: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """``log p(query, target | context)`` of an encoded batch ``(context, query, target)`` -> (n,)."""
        context, query, target, _ = self.check_batch(x)
        return per_position.row_log_likelihood(context, query, target, self.kernel_parameters, checked=True)

    def check_batch(self, x: Any, weights: Any = None) -> CheckedBatch:
        """Check an encoded batch ``(context (n, N), query (n, D), target (n,))`` and weights (n,) or ``None``
        against this head's S, N, D and T (:func:`~dist_respattn.model.arguments.check_batch`)."""
        return check_batch(
            x,
            weights,
            num_symbols=self.num_symbols,
            context_length=self.context_length,
            query_dim=self.query_dim,
            num_targets=self.num_targets,
        )

    # --------------------------------------------------------------------------------- prediction

    def check_context_query(self, context: Any, query: Any) -> tuple[np.ndarray, np.ndarray, bool]:
        """``context`` (n, N) or (N,) and ``query`` (n, D) or (D,) checked as a batch: the (n, N) and (n, D) arrays,
        and whether a single row was given."""
        single = np.ndim(context) == 1
        ctx = np.atleast_2d(np.asarray(context))
        y = np.atleast_2d(np.asarray(query, dtype=np.float64))
        dummy_target = np.zeros(ctx.shape[0], dtype=np.int64)
        ctx, y, _, _ = self.check_batch((ctx, y, dummy_target))
        return ctx, y, single

    def _attention(self, ctx: np.ndarray, y: np.ndarray, target: np.ndarray | None) -> np.ndarray:
        """Attention (n, N) over checked arrays, computed in blocks: the softmax of the rows' log-weights."""
        out = np.empty(ctx.shape, dtype=np.float64)
        inv_two_sigma2 = 0.5 / self.sigma2
        for start, stop in per_position.block_ranges(ctx.shape[0], _PREDICT_BLOCK_ROWS):
            ctx_b = ctx[start:stop]
            log_emission = None
            if target is not None:
                tgt_b = np.broadcast_to(target[start:stop, None], ctx_b.shape)
                log_emission = self.emission_table.log_prob(ctx_b.reshape(-1), tgt_b.reshape(-1)).reshape(ctx_b.shape)
            log_w = block_log_weights(
                ctx_b, y[start:stop], self.key_means, self.log_position_prior, inv_two_sigma2, log_emission
            )
            best = log_w.max(axis=1, keepdims=True)
            best[~np.isfinite(best)] = 0.0
            w = np.exp(log_w - best)
            with np.errstate(invalid="ignore"):
                out[start:stop] = w / w.sum(axis=1, keepdims=True)
        return out

    def attention_weights(self, context: Any, query: Any, target: Any = None) -> np.ndarray:
        """Attention over context positions: (N,) for one example or (n, N) for a batch.

        Without ``target`` this is the predictive gate ``a_i ∝ pi_i N(query; K[c_i])``; with it, the
        posterior responsibility ``r_i = p(z = i | query, target, context)`` that EM uses (NaN on a
        row the model gives zero probability).
        """
        ctx, y, single = self.check_context_query(context, query)
        tgt = None
        if target is not None:
            tgt = as_id_array(np.atleast_1d(np.asarray(target)), "target", 1)
            if tgt.shape != (ctx.shape[0],):
                raise ValueError(
                    f"target has {tgt.shape[0]} ids but there are {ctx.shape[0]} contexts: expected one each"
                )
            ctx, y, tgt, _ = self.check_batch((ctx, y, tgt))
        out = self._attention(ctx, y, tgt)
        return out[0] if single else out

    def predict_proba(self, context: Any, query: Any) -> np.ndarray:
        """Predictive target distribution ``p(target | context, query)``, the target marginalized over z.

        The attention does not see the target: ``a_i ∝ pi_i N(query; K[c_i])`` and
        ``p(target) = sum_i a_i emission[c_i, :]``.

        Returns:
            (T,) for one example (context (N,), query (D,)), or (n, T) for a batch.
        """
        ctx, y, single = self.check_context_query(context, query)
        attention = self._attention(ctx, y, None)
        out = np.empty((ctx.shape[0], self.num_targets))
        for start, stop in per_position.block_ranges(ctx.shape[0], _PREDICT_BLOCK_ROWS):
            out[start:stop] = self.emission_table.predictive(ctx[start:stop], attention[start:stop])
        return out[0] if single else out

    # ----------------------------------------------------------------------------------- factories

    def with_emission(self, emission: Emission) -> ResponsibilityAttentionDistribution:
        """This head with another emission (of the same S and T)."""
        return ResponsibilityAttentionDistribution(
            self.key_means, emission, self.position_prior, self.sigma2, self.name, buckets=self.buckets
        )

    def sampler(self, seed: int | np.random.Generator | None = None) -> ResponsibilityAttentionSampler:
        """A sampler of synthetic triples from this head (with a uniform distinct-symbol context prior)."""
        from dist_respattn.model.heads.single_hop.sampler import ResponsibilityAttentionSampler

        return ResponsibilityAttentionSampler(self, seed)

    def estimator(self, pseudo_count: float | None = None) -> ResponsibilityAttentionEstimator:
        """A closed-form EM estimator for heads of this shape, with this head's fixed ``sigma2``."""
        from dist_respattn.model.heads.single_hop.estimator import ResponsibilityAttentionEstimator

        return ResponsibilityAttentionEstimator(
            self.num_symbols,
            self.context_length,
            self.query_dim,
            self.num_targets,
            sigma2=self.sigma2,
            pseudo_count=pseudo_count,
            name=self.name,
            buckets=self.buckets,
        )

    def dist_to_encoder(self) -> ResponsibilityAttentionDataEncoder:
        """The encoder turning lists of triples into the arrays this head scores."""
        return ResponsibilityAttentionDataEncoder(
            self.num_symbols, self.context_length, self.query_dim, self.num_targets
        )
