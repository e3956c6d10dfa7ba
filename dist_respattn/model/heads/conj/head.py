"""The conjunction head: a single-hop head whose emission is keyed by (attended token, current token).

For a row with window ``c_1..c_N`` (``c_N`` the most recent), current token ``q = c_N`` (the token whose embedding
is the query) and query ``y``, the single head's gate attends and position ``i`` emits::

    E_i(t) = (n[a, q, t] + s_aq B[a, t]) / (n[a, q, .] + s_aq),   a = c_i, s_aq = beta + gamma * types(a, q)

when ``i`` lies within the conjunction depth (recency < ``depth``) and the pair ``(a, q)`` is stored, else
``B[a, t]``: a true trigram at the previous position, a skip-trigram further back, a bigram row of its own at the
most recent one. ``n`` are the E-step's responsibility counts of the stored (pair, target) cells, ``B`` the single
head's MAP emission (its own prior toward the continuation base) and ``types(a, q)`` the distinct targets stored for
the pair; ``beta = inf`` gives the single head exactly (MacKay & Peto 1995's hierarchical Dirichlet).

At order 3 the hierarchy has one level more: a position whose triple ``(p, a, q)`` is stored (``p = c_{i-1}`` the
token before the attended one: a 4-gram at the previous position, a skip-4-gram further back) emits
``(n3[p, a, q, t] + s3 E_i(t)) / (n3[p, a, q, .] + s3)``, the triple row leaning toward the pair row above;
``beta3 = inf`` gives order 2 exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.heads.base import Block, Columns
from dist_respattn.model.heads.conj.kernels import ConjParameters, LeaveOneOut, conj_score, pair_of_cells, row_stats
from dist_respattn.model.heads.copy.kernels import copy_row_terms
from dist_respattn.model.heads.single_hop.arrays import MODEL_ARRAY_NAMES
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.sparse_top import CellRows, SparseTerms
from dist_respattn.model.heads.windowed import WindowHead
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import ScoreTotals
from dist_respattn.model.streaming import WindowPredictions

__all__ = ["BACKOFFS", "ORDERS", "ConjHead", "ConjPredictor", "TripleRows", "pair_rows"]

#: The row a pair row's prior leans toward: the attended token's ``B[a]`` (beta = inf: the single head) or the
#: current token's ``B[q]`` (Kneser-Ney's order: the trigram backs off to the bigram of the current token).
BACKOFFS = ("attended", "current")


#: The conjunction's orders: 2, rows keyed by (attended, current token); 3, by (the token before the attended one,
#: attended, current token) too, leaning toward the pair rows.
ORDERS = (2, 3)


@dataclass(frozen=True)
class TripleRows:
    """The triple rows of an order-3 conjunction head and their prior.

    Attributes:
        keys: (U,) int64 the stored triples ``(p * S + a) * S + q``, increasing (``p`` the token before the attended
            ``a``, ``q`` the current token).
        indptr: (U + 1,) int64; ``targets`` (M3,) int32: triple ``u``'s stored targets
            ``targets[indptr[u]:indptr[u + 1]]``, increasing.
        counts: (M3,) float64 ``n3[p, a, q, t]`` of each cell.
        strength, type_strength, discount: ``beta3`` (``inf``: order 2), ``gamma3`` and ``D3`` of the triple rows'
            prior toward the pair row.
    """

    keys: np.ndarray
    indptr: np.ndarray
    targets: np.ndarray
    counts: np.ndarray
    strength: float = math.inf
    type_strength: float = 0.0
    discount: float = 0.0

    def __post_init__(self) -> None:
        for name, dtype in (("keys", np.int64), ("indptr", np.int64), ("targets", np.int32), ("counts", np.float64)):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype).reshape(-1))
        u, m = self.keys.shape[0], self.targets.shape[0]
        if (
            self.indptr.shape != (u + 1,)
            or self.indptr[0] != 0
            or self.indptr[-1] != m
            or np.any(np.diff(self.indptr) < 0)
        ):
            raise ValueError(f"triple indptr: expected {u + 1} non-decreasing offsets from 0 to the {m} cells")
        if self.counts.shape != (m,) or not (np.isfinite(self.counts).all() and (self.counts >= 0.0).all()):
            raise ValueError(f"triple counts: expected {m} finite counts >= 0, one per cell")
        if u and np.any(np.diff(self.keys) <= 0):
            raise ValueError("triple keys: expected increasing triples (p * S + a) * S + q")
        if not (float(self.strength) >= 0.0 and math.isfinite(self.type_strength) and self.type_strength >= 0.0):
            raise ValueError(f"triple strengths {self.strength!r}, {self.type_strength!r}: expected beta3 >= 0 "
                             "(inf: order 2) and a finite gamma3 >= 0")  # fmt: skip
        if not (math.isfinite(self.discount) and self.discount >= 0.0):
            raise ValueError(f"triple discount {self.discount!r}: expected a finite discount >= 0")

    def with_counts(self, counts: np.ndarray, strength: float, type_strength: float, discount: float) -> TripleRows:
        return TripleRows(self.keys, self.indptr, self.targets, counts, strength, type_strength, discount)

    @property
    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(triple_weight (U,), cell_value (M3,))`` (:func:`pair_rows` of the triple rows)."""
        return pair_rows(self.indptr, self.counts, self.strength, self.type_strength, self.discount)

    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.indptr.nbytes + self.targets.nbytes + self.counts.nbytes)


def pair_rows(
    indptr: np.ndarray, counts: np.ndarray, strength: float, type_strength: float, discount: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """``(pair_weight (P,), cell_value (M,))`` of stored pairs: ``(s_p + d_p) / (n_p + s_p)`` and
    ``(n[p, t] - min(n[p, t], D)) / (n_p + s_p)`` with ``s_p = strength + type_strength * types_p`` (``types_p`` the
    pair's stored targets) and ``d_p = sum_t min(n[p, t], D)``, the mass the discount ``D`` moves to the prior row
    (Kneser-Ney's absolute discount; 0: the Dirichlet posterior mode). An infinite strength, or a pair with neither
    counts nor strength, is ``B``'s row alone (weight 1, no cell values)."""
    n_pairs = indptr.shape[0] - 1
    if np.isinf(strength):
        return np.ones(n_pairs), np.zeros(counts.shape[0])
    totals, types, moved = row_stats(indptr, counts, discount).T
    s = strength + type_strength * types
    denominator = totals + s
    empty = denominator <= 0.0
    safe = np.where(empty, 1.0, denominator)
    weight = np.where(empty, 1.0, (s + moved) / safe)
    owner = np.repeat(np.arange(n_pairs), np.diff(indptr))
    value = np.where(empty[owner], 0.0, (counts - np.minimum(counts, discount)) / safe[owner])
    return weight, value


class ConjHead(WindowHead):
    """A single-hop head and the (attended, current) pair rows of its emission (the head kind ``"conj"``).

    Args:
        single: the single-hop head (keys, position prior, gate variance, emission ``B``).
        depth: positions of recency ``< depth`` read the pair rows (1: only the most recent; 2: a trigram at the
            previous position too; N: every position).
        pair_keys: (P,) int64, the stored pairs ``a * S + q``, increasing.
        indptr: (P + 1,) int64; ``targets`` (M,) int32: pair ``p``'s stored targets ``targets[indptr[p]:indptr[p+1]]``,
            increasing (the cells that occur in the training rows).
        counts: (M,) float64 ``n[a, q, t]`` of each cell (the last E-step's responsibilities).
        strength, type_strength: ``beta >= 0`` (``inf``: the single head) and ``gamma >= 0`` of the pair rows' prior.
        discount: the absolute discount ``D`` each stored cell gives its pair's prior row (0: none).
        backoff: the row the pair rows' prior leans toward (:data:`BACKOFFS`): ``"attended"`` (``B[a]``, the default)
            or ``"current"`` (``B[q]``).
        triples: the triple rows of an order-3 head (:class:`TripleRows`), or ``None``: order 2.
    """

    kind: ClassVar[str] = "conj"

    def __init__(
        self,
        single: ResponsibilityAttentionDistribution,
        depth: int,
        pair_keys: Any,
        indptr: Any,
        targets: Any,
        counts: Any,
        strength: float,
        type_strength: float,
        *,
        backoff: str = "attended",
        discount: float = 0.0,
        triples: TripleRows | None = None,
    ) -> None:
        if not isinstance(single, ResponsibilityAttentionDistribution):
            raise TypeError(f"single is a {type(single).__name__}: expected a single-hop head")
        self.single = single
        self.num_symbols, self.context_length = single.num_symbols, single.context_length
        self.query_dim, self.num_targets = single.query_dim, single.num_targets
        if not 1 <= int(depth) <= self.context_length:
            raise ValueError(f"depth = {depth}: expected 1 to N = {self.context_length} recent positions")
        self.depth = int(depth)
        self.pair_keys = np.ascontiguousarray(pair_keys, dtype=np.int64).reshape(-1)
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64).reshape(-1)
        self.targets = np.ascontiguousarray(targets, dtype=np.int32).reshape(-1)
        self.counts = np.ascontiguousarray(counts, dtype=np.float64).reshape(-1)
        p, m = self.pair_keys.shape[0], self.targets.shape[0]
        if (
            self.indptr.shape != (p + 1,)
            or self.indptr[0] != 0
            or self.indptr[-1] != m
            or np.any(np.diff(self.indptr) < 0)
        ):
            raise ValueError(f"indptr: expected {p + 1} non-decreasing offsets from 0 to the {m} cells")
        if self.counts.shape != (m,) or not (np.isfinite(self.counts).all() and (self.counts >= 0.0).all()):
            raise ValueError(f"counts: expected {m} finite counts >= 0, one per cell")
        if p and (np.any(np.diff(self.pair_keys) <= 0) or self.pair_keys[0] < 0 or
                  self.pair_keys[-1] >= self.num_symbols * self.num_symbols):  # fmt: skip
            raise ValueError("pair_keys: expected increasing pairs a * S + q in [0, S * S)")
        if m and (self.targets.min() < 0 or self.targets.max() >= self.num_targets):
            raise ValueError(f"targets: expected ids in [0, {self.num_targets})")
        if backoff not in BACKOFFS:
            raise ValueError(f"backoff = {backoff!r}: expected one of {', '.join(BACKOFFS)}")
        self.backoff = backoff
        self.discount = float(discount)
        if not (np.isfinite(self.discount) and self.discount >= 0.0):
            raise ValueError(f"discount = {discount!r}: expected a finite discount >= 0")
        self.strength, self.type_strength = float(strength), float(type_strength)
        if not (self.strength >= 0.0 and np.isfinite(self.type_strength) and self.type_strength >= 0.0):
            raise ValueError(
                f"strengths {self.strength!r}, {self.type_strength!r}: expected beta >= 0 (inf: the single head) "
                "and a finite gamma >= 0"
            )
        if triples is not None:
            s = self.num_symbols
            if triples.keys.size and (triples.keys[0] < 0 or triples.keys[-1] >= s * s * s):
                raise ValueError("triple keys: expected triples (p * S + a) * S + q in [0, S ** 3)")
            if triples.targets.size and (triples.targets.min() < 0 or triples.targets.max() >= self.num_targets):
                raise ValueError(f"triple targets: expected ids in [0, {self.num_targets})")
        self.triples = triples

    def __repr__(self) -> str:
        return (
            f"ConjHead(S={self.num_symbols}, N={self.context_length}, D={self.query_dim}, T={self.num_targets}, "
            f"depth={self.depth}, pairs={self.num_pairs}, cells={self.num_cells}, beta={self.strength:g}, "
            f"gamma={self.type_strength:g}, backoff={self.backoff}, order={self.order})"
        )

    @property
    def num_pairs(self) -> int:
        return int(self.pair_keys.shape[0])

    @property
    def num_cells(self) -> int:
        return int(self.targets.shape[0])

    @property
    def order(self) -> int:
        """2: pair rows; 3: triple rows too (:data:`ORDERS`)."""
        return 2 if self.triples is None else 3

    def with_counts(
        self, counts: np.ndarray, strength: float, type_strength: float, discount: float | None = None,
        triples: TripleRows | None = None,
    ) -> ConjHead:  # fmt: skip
        """The same support and single head with other cell counts, strengths and discount (``None``: its own), and
        other triple rows (``None``: its own)."""
        return ConjHead(self.single, self.depth, self.pair_keys, self.indptr, self.targets, counts, strength,
                        type_strength, backoff=self.backoff,
                        discount=self.discount if discount is None else discount,
                        triples=self.triples if triples is None else triples)  # fmt: skip

    def with_single(self, single: ResponsibilityAttentionDistribution) -> ConjHead:
        """The same pair rows over another single head (its gate and ``B``: a candidate of its M-step)."""
        return ConjHead(single, self.depth, self.pair_keys, self.indptr, self.targets, self.counts, self.strength,
                        self.type_strength, backoff=self.backoff, discount=self.discount,
                        triples=self.triples)  # fmt: skip

    @functools.cached_property
    def pair_values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(pair_weight (P,), cell_value (M,))`` (:func:`pair_rows`)."""
        return pair_rows(self.indptr, self.counts, self.strength, self.type_strength, self.discount)

    @functools.cached_property
    def triple_values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(triple_weight (U,), cell_value (M3,))`` of the triple rows (:func:`pair_rows`; empty at order 2)."""
        if self.triples is None:
            return np.zeros(0), np.zeros(0)
        return self.triples.values

    @functools.cached_property
    def cell_rows(self) -> tuple[CellRows, CellRows | None]:
        """The pair rows' and the triple rows' cells with their values, ranked (the sparse predictions' lists; built
        once per head)."""
        _, value = self.pair_values
        triples = None
        if self.triples is not None:
            triples = CellRows.build(self.triples.indptr, self.triples.targets, self.triple_values[1])
        return CellRows.build(self.indptr, self.targets, value), triples

    @functools.cached_property
    def leave_one_out(self) -> LeaveOneOut:
        """The counts and strengths by which the E-step explains each of its training rows without its own counts
        (rows counted from the data; built once per head)."""
        triples = None
        if self.triples is not None:
            rows = self.triples
            triples = (rows.indptr, rows.counts, (rows.strength, rows.type_strength, rows.discount))
        strengths = (self.strength, self.type_strength, self.discount)
        return LeaveOneOut.of_rows(self.indptr, self.counts, strengths, triples)

    @functools.cached_property
    def parameters(self) -> ConjParameters:
        """The parameters as the compiled passes read them (built once per head)."""
        weight, value = self.pair_values
        triples = None
        if self.triples is not None:
            rows = self.triples
            triples = (rows.keys, rows.indptr, rows.targets, *self.triple_values)
        return ConjParameters.build(
            self.single,
            self.depth,
            self.backoff == "current",
            self.pair_keys,
            self.indptr,
            self.targets,
            weight,
            value,
            triples,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("parameters", None)
        state.pop("leave_one_out", None)
        state.pop("pair_values", None)
        state.pop("triple_values", None)
        state.pop("cell_rows", None)
        return state

    # -- the head protocol -----------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The single head's arrays and the pair rows' ``conj_pair_keys``, ``conj_indptr``, ``conj_targets``,
        ``conj_counts`` (at order 3 the triple rows' ``conj_triple_*`` too); the single head's JSON under
        ``"single"``."""
        arrays, meta = self.single.to_arrays()
        arrays = {**arrays, "conj_pair_keys": self.pair_keys, "conj_indptr": self.indptr,
                  "conj_targets": self.targets, "conj_counts": self.counts}  # fmt: skip
        meta = {"single": meta, "depth": self.depth, "strength": self.strength, "type_strength": self.type_strength,
                "backoff": self.backoff, "discount": self.discount}  # fmt: skip
        if self.triples is not None:
            t = self.triples
            arrays.update(conj_triple_keys=t.keys, conj_triple_indptr=t.indptr, conj_triple_targets=t.targets,
                          conj_triple_counts=t.counts)  # fmt: skip
            meta.update(order=3, triple_strength=t.strength, triple_type_strength=t.type_strength,
                        triple_discount=t.discount)  # fmt: skip
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> ConjHead:
        from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays

        for name in ("conj_pair_keys", "conj_indptr", "conj_targets", "conj_counts"):
            if name not in arrays:
                raise ValueError(f"conjunction head: missing array {name!r}")
        if not isinstance(meta.get("single"), dict):
            raise ValueError("conjunction head: metadata needs the single head's under 'single'")
        own = {name: np.asarray(arrays[name]) for name in MODEL_ARRAY_NAMES if name in arrays}
        single = distribution_from_arrays(own, meta["single"], source="conjunction head")
        triples = None
        # A checkpoint written before order 3 existed holds no order: it is an order-2 head.
        if int(meta.get("order", 2)) == 3:
            names = ("conj_triple_keys", "conj_triple_indptr", "conj_triple_targets", "conj_triple_counts")
            for name in names:
                if name not in arrays:
                    raise ValueError(f"conjunction head of order 3: missing array {name!r}")
            keys, indptr, targets, counts = (np.asarray(arrays[name]) for name in names)
            triples = TripleRows(keys, indptr, targets, counts, float(meta["triple_strength"]),
                                 float(meta["triple_type_strength"]), float(meta["triple_discount"]))  # fmt: skip
        return cls(
            single, int(meta["depth"]), np.asarray(arrays["conj_pair_keys"]), np.asarray(arrays["conj_indptr"]),
            np.asarray(arrays["conj_targets"]), np.asarray(arrays["conj_counts"]), float(meta["strength"]),
            float(meta["type_strength"]), backoff=str(meta.get("backoff", "attended")),
            discount=float(meta.get("discount", 0.0)), triples=triples,
        )  # fmt: skip

    def num_parameters(self) -> int:
        """The single head's parameters and one count per stored cell (pair and triple)."""
        triple_cells = 0 if self.triples is None else int(self.triples.targets.shape[0])
        return int(self.single.num_parameters() + self.num_cells + triple_cells)

    def nbytes(self) -> int:
        return int(
            self.single.nbytes() + self.pair_keys.nbytes + self.indptr.nbytes + self.targets.nbytes + self.counts.nbytes
            + (0 if self.triples is None else self.triples.nbytes())
        )  # fmt: skip

    def describe(self) -> str:
        triples = ""
        if self.triples is not None:
            triples = f", {self.triples.keys.size:,} triples, {self.triples.targets.size:,} triple cells"
        return (
            f"conjunction head over the {self.depth} most recent position(s), {self.num_pairs:,} pairs, "
            f"{self.num_cells:,} cells{triples}, {self.single.emission_table.layout} emission"
        )

    def record(self) -> dict[str, Any]:
        record = {
            "conj_strength": self.strength,
            "conj_type_strength": self.type_strength,
            "conj_discount": self.discount,
        }
        if self.triples is not None:
            record.update(conj_triple_strength=self.triples.strength,
                          conj_triple_type_strength=self.triples.type_strength,
                          conj_triple_discount=self.triples.discount)  # fmt: skip
        return record

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        line = (
            f"last model: pair rows (attended, current token) over the {self.depth} most recent position(s): "
            f"{self.num_pairs:,} pairs, {self.num_cells:,} cells; strength beta {self.strength:g} + gamma "
            f"{self.type_strength:g} x types, discount {self.discount:g}, toward the {self.backoff} token's row"
        )
        values = {"conj_depth": self.depth, "conj_backoff": self.backoff, "conj_pairs": self.num_pairs,
                  "conj_cells": self.num_cells, "conj_strength": self.strength,
                  "conj_type_strength": self.type_strength, "conj_discount": self.discount,
                  "sigma2": float(self.single.sigma2), "conj_order": self.order}  # fmt: skip
        lines = [line]
        if self.triples is not None:
            t = self.triples
            values.update(conj_triples=int(t.keys.size), conj_triple_cells=int(t.targets.size),
                          conj_triple_strength=t.strength, conj_triple_type_strength=t.type_strength,
                          conj_triple_discount=t.discount)  # fmt: skip
            lines.append(
                f"triple rows (previous, attended, current token): {t.keys.size:,} triples, {t.targets.size:,} "
                f"cells; strength beta3 {t.strength:g} + gamma3 {t.type_strength:g} x types, discount "
                f"{t.discount:g}, toward the pair row"
            )
        return values, lines

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        return [("attended token's table B", self.single.emission_table)]

    @property
    def columns(self) -> Columns:
        """Token windows: the pair rows read the window's tokens and the current token."""
        return Columns(windows=True)

    def check_rows(self, rows: WindowRows) -> None:
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)

    def score(self, blocks: Iterable[Block], *, accuracy: bool = True) -> ScoreTotals:
        """Held-out totals of the blocks' rows: joint and predictive log-likelihoods and, with ``accuracy``, the
        arg-max hits (from the sparse terms under a sparse emission, else O(T) a row in NumPy; the M-step's held-out
        pass skips them)."""
        totals = ScoreTotals()
        for block in blocks:
            rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
            self.check_rows(rows)
            log_lik, target_log_prob, weight, attention = conj_score(rows, self.parameters)
            correct = self.hits(rows, attention) if accuracy else 0.0
            totals = totals + ScoreTotals(weight, log_lik, target_log_prob, correct)
        return totals

    def hits(self, rows: WindowRows, attention: np.ndarray) -> float:
        """The weighted arg-max hits (first on ties) of ``rows`` given their predictive ``attention`` (n, N)
        (:meth:`window_hits`)."""
        return self.window_hits(rows, attention)

    def window_proba(self, rows: WindowRows, attention: np.ndarray) -> np.ndarray:
        """(n, T) ``p(target | window, query)`` of window rows given their predictive attention (n, N): ``B``'s
        rows weighed by each position's ``s / (n + s)`` (1 off the pair rows), then the pair rows' stored cells."""
        n_pos = self.context_length
        context, _ = copy_row_terms(rows, n_pos)
        current = np.asarray(rows.tokens[rows.end - 1], dtype=np.int64)
        weight, value = self.pair_values
        pair = np.full(context.shape, -1, dtype=np.int64)
        conj = slice(n_pos - self.depth, n_pos)
        pair[:, conj] = pair_of_cells(self.pair_keys, context[:, conj] * self.num_symbols + current[:, None])
        pair[attention <= 0.0] = -1
        # At order 3 a position on a stored triple weighs its pair row by the triple row's w3 (1 off the triples),
        # then adds the triple's own cells: E3 = v3 + w3 (v2 + w2 B).
        triple = self.triple_of(rows, context, current, pair)
        scale = np.ones(context.shape)
        if self.triples is not None and self.triples.keys.size:
            weight3, _ = self.triple_values
            scale = np.where(triple >= 0, weight3[np.maximum(triple, 0)], 1.0)
        own = attention * scale * np.where(pair >= 0, weight[np.maximum(pair, 0)], 1.0)
        # The row each position's prior part reads: B[a], or B[q] on a stored pair when the rows lean toward it.
        leaning = np.where(pair >= 0, current[:, None], context) if self.backoff == "current" else context
        probs = self.single.emission_table.predictive(leaning, own)
        row_of, col_of = np.nonzero(pair >= 0)
        p = pair[row_of, col_of]
        lengths = self.indptr[p + 1] - self.indptr[p]
        at = np.repeat(self.indptr[p] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        np.add.at(probs, (np.repeat(row_of, lengths), self.targets[at]),
                  np.repeat((attention * scale)[row_of, col_of], lengths) * value[at])  # fmt: skip
        if self.triples is not None:
            _, value3 = self.triple_values
            row_of, col_of = np.nonzero(triple >= 0)
            u = triple[row_of, col_of]
            indptr3 = self.triples.indptr
            lengths = indptr3[u + 1] - indptr3[u]
            at = np.repeat(indptr3[u] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
            np.add.at(probs, (np.repeat(row_of, lengths), self.triples.targets[at]),
                      np.repeat(attention[row_of, col_of], lengths) * value3[at])  # fmt: skip
        return probs

    @property
    def has_terms(self) -> bool:
        """Under a sparse emission (:meth:`window_terms`)."""
        return isinstance(self.single.emission_table, SparseEmission)

    def window_terms(self, rows: WindowRows, attention: np.ndarray) -> SparseTerms | None:
        """The terms :meth:`window_proba` sums (:class:`~dist_respattn.model.heads.sparse_top.SparseTerms`: the
        emission's backoff part and each position's stored pairs, then the pair rows' and the triple rows' cells, in
        that order), or ``None`` under a dense emission."""
        table = self.single.emission_table
        if not isinstance(table, SparseEmission):
            return None
        n_pos = self.context_length
        context, _ = copy_row_terms(rows, n_pos)
        current = np.asarray(rows.tokens[rows.end - 1], dtype=np.int64)
        weight, _ = self.pair_values
        pair = np.full(context.shape, -1, dtype=np.int64)
        conj = slice(n_pos - self.depth, n_pos)
        pair[:, conj] = pair_of_cells(self.pair_keys, context[:, conj] * self.num_symbols + current[:, None])
        pair[attention <= 0.0] = -1
        triple = self.triple_of(rows, context, current, pair)
        scale = np.ones(context.shape)
        if self.triples is not None and self.triples.keys.size:
            weight3, _ = self.triple_values
            scale = np.where(triple >= 0, weight3[np.maximum(triple, 0)], 1.0)
        own = attention * scale * np.where(pair >= 0, weight[np.maximum(pair, 0)], 1.0)
        leaning = np.where(pair >= 0, current[:, None], context) if self.backoff == "current" else context
        backoff_part = (own * table.backoff[leaning]).sum(axis=1)
        # Each position on a stored pair adds its pair row's cells (times attention * w3), then each on a stored
        # triple its triple row's (times attention): lists the threshold search walks by decreasing value.
        n = rows.num_rows
        row_of, col_of = np.nonzero(pair >= 0)
        lists = [
            (row_of, np.zeros(row_of.size, dtype=np.int64), pair[row_of, col_of], (attention * scale)[row_of, col_of])
        ]
        pair_cells, triple_cells = self.cell_rows
        cells = [pair_cells]
        if triple_cells is not None:
            row_of, col_of = np.nonzero(triple >= 0)
            lists.append(
                (row_of, np.ones(row_of.size, dtype=np.int64), triple[row_of, col_of], attention[row_of, col_of])
            )
            cells.append(triple_cells)
        row = np.concatenate([x[0] for x in lists])
        order = np.argsort(row, kind="stable")
        list_indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(row, minlength=n), out=list_indptr[1:])
        no_entries = np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
        return SparseTerms(table, backoff_part, leaning, own, *no_entries, tuple(cells), list_indptr,
                           np.concatenate([x[1] for x in lists])[order], np.concatenate([x[2] for x in lists])[order],
                           np.concatenate([x[3] for x in lists])[order])  # fmt: skip

    def triple_of(self, rows: WindowRows, context: np.ndarray, current: np.ndarray, pair: np.ndarray) -> np.ndarray:
        """(n, N) int64 each position's stored triple (-1: none; order 2: none) given
        the window rows' ``context`` (n, N) in column order, their ``current`` tokens (n,) and each position's
        stored ``pair`` (n, N) (a triple is read only on a stored pair, at a position with a predecessor in the
        window)."""
        triple = np.full(context.shape, -1, dtype=np.int64)
        if self.triples is None:
            return triple
        n_pos = self.context_length
        length = np.asarray(rows.end, dtype=np.int64) - np.asarray(rows.begin, dtype=np.int64)
        s = np.int64(self.num_symbols)
        for col in range(max(n_pos - self.depth, 1), n_pos):
            live = (pair[:, col] >= 0) & (col - 1 >= n_pos - length)
            keys = (context[live, col - 1] * s + context[live, col]) * s + current[live]
            triple[live, col] = pair_of_cells(self.triples.keys, keys)
        return triple

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> ConjPredictor:
        """A :class:`ConjPredictor` over one history (its state: the last N tokens)."""
        return ConjPredictor(self, query_table, words=words)

    def row_densities(self, rows: WindowRows) -> np.ndarray:
        """(n, 2) each window row's ``(log p(query | window), log p(target | window, query))``, whatever its weight
        (the scoring kernel's own per-row terms: their weighted sums are :meth:`score`'s totals)."""
        self.check_rows(rows)
        out = np.empty((rows.num_rows, 2))
        conj_score(rows, self.parameters, out)
        return out

    def window_attention(self, rows: WindowRows) -> np.ndarray:
        """(n, N) each window row's predictive attention in column order (what :meth:`window_proba` mixes)."""
        return conj_score(rows, self.parameters)[3]


class ConjPredictor(WindowPredictions):
    """p(next token | history) of a :class:`ConjHead` for one history; its state is the last N token ids.

    Args:
        model: the conjunction head; ``embeddings``: (S, D) the query table (the next target's query is the last
            token's row), or ``None`` (every prediction takes its ``query``); ``words``: (T,) names for
            :meth:`top_words`.
    """

    def __init__(self, model: ConjHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None):
        super().__init__(model, embeddings, words=words)
