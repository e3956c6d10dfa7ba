"""The chain-of-hops head: H Gaussian attention hops, each hop's query the embedding of the token the last one found.

For a window ``c_1..c_N`` and query ``y`` the hop latents ``z_1..z_H`` (positions) form a chain::

    phi_1(z_1)        = pi^1_{z_1} N(y; K^1[c_{z_1}], sigma2 I)
    phi_h(z_{h-1}, z_h) = pi^h_{z_h} N(Q[c_{z_{h-1}}]; K^h[c_{z_h}], sigma2 I)        (h = 2..H)
    L(y, t | c)       = sum_z phi_1(z_1) prod_h phi_h(z_{h-1}, z_h) B[c_{z_H}, t]

``Q`` (S, D) is the hop query table (the query a token asks with: a token store's embedding of it), ``B`` the single
head's emission. Hop 1 is the single head's gate; H = 1 is the single head. The predictive is
``p(t | y, c) = sum_j a_j B[c_j, t]`` with ``a`` the last hop's marginal without the target. With ``softmax`` every
later hop's factor is normalized over the positions it goes to (the reference library's chained attention).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.heads.base import Block, Columns
from dist_respattn.model.heads.copy.head import copy_buckets
from dist_respattn.model.heads.copy.kernels import CopyParameters, copy_hits, copy_row_terms
from dist_respattn.model.heads.hops.kernels import HopParameters, hop_score
from dist_respattn.model.heads.single_hop.arrays import MODEL_ARRAY_NAMES
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.windowed import WindowHead
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import ScoreTotals
from dist_respattn.model.streaming import WindowPredictions

__all__ = ["HopsHead", "HopsPredictor"]


class HopsHead(WindowHead):
    """A chain of H attention hops (the head kind ``"hops"``).

    Args:
        single: hop 1 and the emission: the single-hop head (keys, position prior, gate variance, table B).
        keys: (H-1, S, D) the later hops' keys; ``priors``: (H-1, N) their position priors (column order).
        hop_queries: (S, D) the query a hop asks from a position holding symbol ``s``.
        softmax: normalize each later hop over the positions it goes to (the reference library's chain).
    """

    kind: ClassVar[str] = "hops"

    def __init__(
        self,
        single: ResponsibilityAttentionDistribution,
        keys: Any,
        priors: Any,
        hop_queries: Any,
        *,
        softmax: bool = False,
    ) -> None:
        if not isinstance(single, ResponsibilityAttentionDistribution):
            raise TypeError(f"single is a {type(single).__name__}: expected a single-hop head")
        self.single = single
        self.num_symbols, self.context_length = single.num_symbols, single.context_length
        self.query_dim, self.num_targets = single.query_dim, single.num_targets
        s, n, d = self.num_symbols, self.context_length, self.query_dim
        self.keys = np.array(keys, dtype=np.float64).reshape(-1, s, d)
        self.priors = np.array(priors, dtype=np.float64).reshape(-1, n)
        self.hop_queries = np.array(hop_queries, dtype=np.float64)
        if self.keys.shape[0] != self.priors.shape[0]:
            raise ValueError(f"{self.keys.shape[0]} key tables but {self.priors.shape[0]} priors: one each per hop")
        if self.hop_queries.shape != (s, d):
            raise ValueError(f"hop_queries of shape {self.hop_queries.shape}: expected (S, D) = ({s}, {d})")
        for name, value in (("keys", self.keys), ("hop_queries", self.hop_queries)):
            if not np.isfinite(value).all():
                raise ValueError(f"{name} holds a non-finite value: expected finite numbers")
        if not (np.isfinite(self.priors).all() and (self.priors >= 0).all()):
            raise ValueError("priors: expected finite weights >= 0")
        if self.priors.size and not np.allclose(self.priors.sum(axis=1), 1.0, atol=1e-9):
            raise ValueError("priors: every hop's position prior must sum to 1")
        self.softmax = bool(softmax)

    @property
    def n_hops(self) -> int:
        """H, the number of hops (1 + the later hops)."""
        return int(self.keys.shape[0] + 1)

    def __repr__(self) -> str:
        return (
            f"HopsHead(H={self.n_hops}, S={self.num_symbols}, N={self.context_length}, D={self.query_dim}, "
            f"T={self.num_targets}{', softmax' if self.softmax else ''})"
        )

    @functools.cached_property
    def parameters(self) -> HopParameters:
        """The parameters as the compiled passes read them (built once per head)."""
        return HopParameters.build(self.single, self.keys, self.priors, self.hop_queries, self.softmax)

    @functools.cached_property
    def ranking_parameters(self) -> CopyParameters:
        """The last hop's emission laid out for the copy head's compiled arg-max pass, with no copy or induction
        weight: its distribution is then ``sum_j a_j B[c_j, :]``, this head's, summed in the same order."""
        n_buckets = copy_buckets(self.single).num_buckets
        return CopyParameters.build(
            self.single, copy_buckets(self.single).bucket_of_recency, np.zeros(n_buckets), np.zeros(n_buckets)
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("parameters", None)
        state.pop("ranking_parameters", None)
        return state

    # -- the head protocol -----------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The single head's arrays, ``hop_keys`` (H-1, S, D), ``hop_priors`` (H-1, N), ``hop_queries`` (S, D)."""
        arrays, meta = self.single.to_arrays()
        arrays = {
            **arrays,
            "hop_keys": self.keys.copy(),
            "hop_priors": self.priors.copy(),
            "hop_queries": self.hop_queries.copy(),
        }
        return arrays, {"single": meta, "n_hops": self.n_hops, "softmax": self.softmax,
                        "num_symbols": self.num_symbols, "context_length": self.context_length,
                        "query_dim": self.query_dim, "num_targets": self.num_targets}  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> HopsHead:
        from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays

        for name in ("hop_keys", "hop_priors", "hop_queries"):
            if name not in arrays:
                raise ValueError(f"chain of hops: missing array {name!r}")
        if not isinstance(meta.get("single"), dict):
            raise ValueError("chain of hops: metadata needs the single head's under 'single'")
        own = {name: np.asarray(arrays[name]) for name in MODEL_ARRAY_NAMES if name in arrays}
        single = distribution_from_arrays(own, meta["single"], source="chain of hops")
        return cls(
            single, np.asarray(arrays["hop_keys"]), np.asarray(arrays["hop_priors"]),
            np.asarray(arrays["hop_queries"]), softmax=bool(meta.get("softmax", False)),
        )  # fmt: skip

    def num_parameters(self) -> int:
        """The single head's parameters and each later hop's keys and prior (the fixed hop queries not counted)."""
        return int(self.single.num_parameters() + self.keys.size + self.priors.size)

    def nbytes(self) -> int:
        return int(self.single.nbytes() + self.keys.nbytes + self.priors.nbytes + self.hop_queries.nbytes)

    def describe(self) -> str:
        return f"chain of {self.n_hops} hops, {self.single.emission_table.layout} emission"

    def record(self) -> dict[str, Any]:
        # How peaked each later hop's prior is: its largest position weight.
        return {f"hop_{h + 2}_prior_max": float(p.max()) for h, p in enumerate(self.priors)}

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        line = f"last model: a chain of {self.n_hops} hops, sigma2 = {self.single.sigma2:.3g}"
        return {"n_hops": self.n_hops, "sigma2": float(self.single.sigma2)}, [line]

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        return [("last hop's table", self.single.emission_table)]

    @property
    def columns(self) -> Columns:
        """Token windows: the later hops read the tokens of the positions the earlier ones found."""
        return Columns(windows=True)

    def check_rows(self, rows: WindowRows) -> None:
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)

    def score(self, blocks: Iterable[Block], *, accuracy: bool = True) -> ScoreTotals:
        """Held-out totals of the blocks' rows: joint and predictive log-likelihoods and, with ``accuracy``, the
        arg-max hits."""
        totals = ScoreTotals()
        for block in blocks:
            rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
            self.check_rows(rows)
            log_lik, target_log_prob, weight, attention = hop_score(rows, self.parameters)
            correct = self.hits(rows, attention) if accuracy else 0.0
            totals = totals + ScoreTotals(weight, log_lik, target_log_prob, correct)
        return totals

    def hits(self, rows: WindowRows, attention: np.ndarray) -> float:
        """``sum w`` over the rows whose target is the arg-max (lower id first on ties) of their prediction, from the
        last hop's ``attention`` (n, N): compiled, O(T) scratch a row (the copy head's pass, its weights 0)."""
        return copy_hits(rows, attention, self.ranking_parameters, self.single.emission_table)

    def window_proba(self, rows: WindowRows, attention: np.ndarray) -> np.ndarray:
        """(n, T) ``p(target | window, query)`` of window rows given their last hop's attention (n, N)."""
        context, _ = copy_row_terms(rows, self.context_length)
        return self.single.emission_table.predictive(context, attention)

    def seq_log_density(self, data: Any) -> np.ndarray:
        """(n,) the log of the chain's path sum ``L(y, t | c)`` of encoded rows ``(context, query, target)``."""
        context, query, target = data
        out = np.empty(len(target))
        for r in range(len(target)):
            rows = WindowRows.from_encoded(
                np.asarray(context)[r : r + 1], np.asarray(query, dtype=np.float64)[r : r + 1],
                np.asarray(target)[r : r + 1],
            )  # fmt: skip
            out[r] = hop_score(rows, self.parameters)[0]
        return out

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> HopsPredictor:
        """A :class:`HopsPredictor` over one history (its state: the last N tokens)."""
        return HopsPredictor(self, query_table, words=words)

    def row_densities(self, rows: WindowRows) -> np.ndarray:
        """(n, 2) each window row's ``(log p(query | window), log p(target | window, query))``, whatever its weight
        (the scoring kernel's own per-row terms: their weighted sums are :meth:`score`'s totals)."""
        self.check_rows(rows)
        out = np.empty((rows.num_rows, 2))
        hop_score(rows, self.parameters, out)
        return out

    def window_attention(self, rows: WindowRows) -> np.ndarray:
        """(n, N) each window row's predictive attention in column order (what :meth:`window_proba` mixes)."""
        return hop_score(rows, self.parameters)[3]


class HopsPredictor(WindowPredictions):
    """p(next token | history) of a :class:`HopsHead` for one history; its state is the last N token ids (the later
    hops read the window's tokens themselves).

    Args:
        model: the head; ``embeddings``: (S, D) the query table (the next target's query is the last token's row),
            or ``None`` (every prediction takes its ``query``); ``words``: (T,) names for :meth:`top_words`.
    """

    def __init__(self, model: HopsHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None):
        super().__init__(model, embeddings, words=words)
