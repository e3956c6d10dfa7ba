"""The copy head: a single-hop head whose attended position may also copy its token or the token that followed it.

For a row with window ``c_1..c_N`` (``c_N`` the most recent) and query ``y``, position ``i`` of recency bucket ``b``
emits target ``t`` with::

    E_i(t) = (1 - kappa_b - rho_b) B[c_i, t] + kappa_b [t = c_i] + rho_b [t = c_{i+1}]

(its own table, a cache, induction: "what came after this last time"; the most recent position has no successor
in the window, so its induction term is 0), and ``p(y, t | c) = sum_i pi_i N(y; K[c_i], sigma2 I) E_i(t)``. The
attention weights are the single head's; EM splits each position's responsibility over the three sources in
proportion to their terms, so the M-step stays closed form.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.emission.mixture import symbol_mixture
from dist_respattn.model.heads.base import Block, Columns
from dist_respattn.model.heads.copy.kernels import CopyParameters, copy_hits, copy_row_terms, copy_score
from dist_respattn.model.heads.single_hop.arrays import MODEL_ARRAY_NAMES
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.sparse_top import SparseTerms, group_symbols, rows_in_order
from dist_respattn.model.heads.windowed import WindowHead
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import ScoreTotals
from dist_respattn.model.streaming import WindowPredictions

__all__ = ["CopyHead", "CopyPredictor", "copy_buckets"]


def copy_buckets(single: ResponsibilityAttentionDistribution) -> PositionBuckets:
    """The buckets the copy weights are tied over: the single head's, or one per position for a free prior."""
    return single.buckets if single.buckets is not None else PositionBuckets.free(single.context_length)


class CopyHead(WindowHead):
    """A single-hop head and, per recency bucket, the copy and induction weights (the head kind ``"copy"``).

    Args:
        single: the single-hop head (keys, position prior, gate variance, own emission table B).
        kappa: (K,) copy weight of each bucket; ``rho``: (K,) induction weight; ``kappa + rho <= 1``. K is the
            single head's number of buckets (N for a free prior).
    """

    kind: ClassVar[str] = "copy"

    def __init__(self, single: ResponsibilityAttentionDistribution, kappa: Any, rho: Any) -> None:
        if not isinstance(single, ResponsibilityAttentionDistribution):
            raise TypeError(f"single is a {type(single).__name__}: expected a single-hop head")
        self.single = single
        self.buckets = copy_buckets(single)
        k = self.buckets.num_buckets
        self.kappa = np.array(kappa, dtype=np.float64).reshape(-1)
        self.rho = np.array(rho, dtype=np.float64).reshape(-1)
        for name, value in (("kappa", self.kappa), ("rho", self.rho)):
            if value.shape != (k,):
                raise ValueError(f"{name} has {value.shape[0]} entries: expected one per bucket, K = {k}")
            if not (np.isfinite(value).all() and (value >= 0.0).all()):
                raise ValueError(f"{name} = {value.tolist()}: expected finite weights >= 0")
        if np.any(self.kappa + self.rho > 1.0 + 1e-12):
            raise ValueError("kappa + rho exceeds 1 in some bucket: expected weights of a mixture")
        self.num_symbols, self.context_length = single.num_symbols, single.context_length
        self.query_dim, self.num_targets = single.query_dim, single.num_targets

    def __repr__(self) -> str:
        return (
            f"CopyHead(S={self.num_symbols}, N={self.context_length}, D={self.query_dim}, T={self.num_targets}, "
            f"kappa={np.round(self.kappa, 4).tolist()}, rho={np.round(self.rho, 4).tolist()})"
        )

    @functools.cached_property
    def parameters(self) -> CopyParameters:
        """The parameters as the compiled passes read them (built once per head)."""
        return CopyParameters.build(self.single, self.buckets.bucket_of_recency, self.kappa, self.rho)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("parameters", None)
        return state

    # -- the head protocol -----------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The single head's arrays, ``copy_kappa`` (K,) and ``copy_rho`` (K,); its JSON under ``"single"``."""
        arrays, meta = self.single.to_arrays()
        arrays = {**arrays, "copy_kappa": self.kappa.copy(), "copy_rho": self.rho.copy()}
        return arrays, {"single": meta, "num_symbols": self.num_symbols, "context_length": self.context_length,
                        "query_dim": self.query_dim, "num_targets": self.num_targets}  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> CopyHead:
        from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays

        for name in ("copy_kappa", "copy_rho"):
            if name not in arrays:
                raise ValueError(f"copy head: missing array {name!r}")
        if not isinstance(meta.get("single"), dict):
            raise ValueError("copy head: metadata needs the single head's under 'single'")
        own = {name: np.asarray(arrays[name]) for name in MODEL_ARRAY_NAMES if name in arrays}
        single = distribution_from_arrays(own, meta["single"], source="copy head")
        return cls(single, np.asarray(arrays["copy_kappa"]), np.asarray(arrays["copy_rho"]))

    def num_parameters(self) -> int:
        """The single head's parameters and the 2 K copy weights."""
        return int(self.single.num_parameters() + 2 * self.buckets.num_buckets)

    def nbytes(self) -> int:
        return int(self.single.nbytes() + self.kappa.nbytes + self.rho.nbytes)

    def describe(self) -> str:
        return f"copy head over {self.buckets.describe()}, {self.single.emission_table.layout} emission"

    def record(self) -> dict[str, Any]:
        return {"copy_kappa_max": float(self.kappa.max()), "copy_rho_max": float(self.rho.max())}

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        kappa, rho = [float(v) for v in self.kappa], [float(v) for v in self.rho]
        line = (
            "last model: copy weights per bucket (most recent first) kappa = "
            + ", ".join(f"{v:.3f}" for v in kappa)
            + "; induction rho = "
            + ", ".join(f"{v:.3f}" for v in rho)
        )
        return {"copy_kappa": kappa, "copy_rho": rho, "sigma2": float(self.single.sigma2)}, [line]

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        return [("own table", self.single.emission_table)]

    @property
    def columns(self) -> Columns:
        """Token windows: the induction term reads each position's successor, and short windows are masked."""
        return Columns(windows=True)

    def check_rows(self, rows: WindowRows) -> None:
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)

    def score(self, blocks: Iterable[Block], *, accuracy: bool = True) -> ScoreTotals:
        """Held-out totals of the blocks' rows: joint and predictive log-likelihoods and, with ``accuracy``, the
        arg-max hits (from the sparse terms under a sparse emission, without O(T) a row; compiled, O(T) a row under a
        dense one: the M-step's held-out pass, which reads only the likelihoods, skips them)."""
        totals = ScoreTotals()
        for block in blocks:
            rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
            self.check_rows(rows)
            log_lik, target_log_prob, weight, attention = copy_score(rows, self.parameters)
            correct = 0.0
            if accuracy and self.has_terms:
                correct = self.window_hits(rows, attention)
            elif accuracy:
                correct = copy_hits(rows, attention, self.parameters, self.single.emission_table)
            totals = totals + ScoreTotals(weight, log_lik, target_log_prob, correct)
        return totals

    def window_proba(self, rows: WindowRows, attention: np.ndarray) -> np.ndarray:
        """(n, T) ``p(target | window, query)`` of window rows given their predictive attention (n, N): the own
        table's part weighed by ``1 - kappa_b - rho_b``, then each position's copy and induction mass."""
        context, successor = copy_row_terms(rows, self.context_length)
        bucket = self.buckets.bucket_of_position
        own = attention * (1.0 - self.kappa - self.rho)[bucket][None, :]
        # Per distinct symbol: a long window holds each symbol many times (O(N + distinct symbols' rows) a row).
        probs = symbol_mixture(self.single.emission_table, context, own)
        n = context.shape[0]
        row_of = np.repeat(np.arange(n), self.context_length)
        live = attention.reshape(-1) > 0.0
        np.add.at(probs, (row_of[live], context.reshape(-1)[live]), (attention * self.kappa[bucket]).reshape(-1)[live])
        has_next = live & (successor.reshape(-1) >= 0)
        np.add.at(
            probs,
            (row_of[has_next], successor.reshape(-1)[has_next]),
            (attention * self.rho[bucket]).reshape(-1)[has_next],
        )
        return probs

    @property
    def has_terms(self) -> bool:
        """Under a sparse emission (:meth:`window_terms`)."""
        return isinstance(self.single.emission_table, SparseEmission)

    def window_terms(self, rows: WindowRows, attention: np.ndarray) -> SparseTerms | None:
        """The terms :meth:`window_proba` sums (:class:`~dist_respattn.model.heads.sparse_top.SparseTerms`: the own
        table's backoff part and each distinct symbol's stored pairs, then the copies and the inductions, in that
        order), or ``None`` under a dense emission."""
        table = self.single.emission_table
        if not isinstance(table, SparseEmission):
            return None
        context, successor = copy_row_terms(rows, self.context_length)
        bucket = self.buckets.bucket_of_position
        own = np.ascontiguousarray(attention * (1.0 - self.kappa - self.rho)[bucket][None, :])
        backoff_part = (own * table.backoff[context]).sum(axis=1)
        symbols, weights = group_symbols(context, own)
        n = context.shape[0]
        row_of = np.repeat(np.arange(n), self.context_length)
        entries = []
        # Zero addends (a single head read as a copy head has no copy weights) change no sum: they are left out.
        copies = (attention * self.kappa[bucket]).reshape(-1)
        live = (attention.reshape(-1) > 0.0) & (copies != 0.0)
        entries.append((row_of[live], context.reshape(-1)[live], copies[live]))
        inductions = (attention * self.rho[bucket]).reshape(-1)
        has_next = (attention.reshape(-1) > 0.0) & (successor.reshape(-1) >= 0) & (inductions != 0.0)
        entries.append((row_of[has_next], successor.reshape(-1)[has_next], inductions[has_next]))
        return SparseTerms(table, backoff_part, symbols, weights, *rows_in_order(n, entries))

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> CopyPredictor:
        """A :class:`CopyPredictor` over one history (its state: the last N tokens)."""
        return CopyPredictor(self, query_table, words=words)

    def row_densities(self, rows: WindowRows) -> np.ndarray:
        """(n, 2) each window row's ``(log p(query | window), log p(target | window, query))``, whatever its weight
        (the scoring kernel's own per-row terms: their weighted sums are :meth:`score`'s totals)."""
        self.check_rows(rows)
        out = np.empty((rows.num_rows, 2))
        copy_score(rows, self.parameters, out)
        return out

    def window_attention(self, rows: WindowRows) -> np.ndarray:
        """(n, N) each window row's predictive attention in column order (what :meth:`window_proba` mixes)."""
        return copy_score(rows, self.parameters)[3]


class CopyPredictor(WindowPredictions):
    """p(next token | history) of a :class:`CopyHead` for one history; its state is the last N token ids (the
    copy and induction terms read the window's tokens themselves, so no bucket histogram can stand for it).

    Args:
        model: the copy head; ``embeddings``: (S, D) the query table (the next target's query is the last token's
            row), or ``None`` (every prediction takes its ``query``); ``words``: (T,) names for :meth:`top_words`.
    """

    def __init__(self, model: CopyHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None):
        super().__init__(model, embeddings, words=words)
