"""An attribute-gated emission: each row's attribute mixes F shared factor tables, learned by exact EM.

A row also carries an attribute ``a`` (the book, author or package it comes from). Its emission is a
mixture of F factor tables with the attribute's own weights (the attribute's learned representation)::

    B_a[s, t] = sum_f w[a, f] B_f[s, t]
    p(query, target | context, a) = sum_i sum_f pi_a,i N(query; K[c_i], sigma2) w[a, f] B_f[c_i, t]

so the factor is one more latent variable beside the position (Hofmann's aspect model; an EM counterpart of
the multiplicative attribute-gated language model of Kiros, Zemel & Salakhutdinov 2014). The E-step's
responsibilities are over (position, factor) pairs, ``r_if ∝ pi_a,i N(q; K[c_i]) w[a, f] B_f[c_i, t]``; the
statistics stay additive (:class:`GatedStatistics`); the M-step is closed form, with the shared head's MAP
smoothing on every factor (strengths ``a_s``, base ``u``, see :mod:`dist_respattn.model.emission.prior`)::

    B_f[s, t] = (c_f[s, t] + a_s u[t]) / (c_f[s] + a_s)      w[a, f] = (m[a, f] + beta / F) / (m[a] + beta)

Keys and the gate variance are shared; the position prior is shared or one per attribute
(``per_attribute_prior``). The factor tables live on one support of (symbol, target) pairs, as a sparse
emission does (:class:`FactorTables`): a factor's pair outside it is ``backoff_f[s] u[t]``, so memory
follows P × F, never S × T × F, and every mixture ``B_a`` is itself a sparse emission on that support.

Two special cases: F = 1 is the shared head (``tests/model/test_gated.py`` holds them equal to 1e-12), and
F = A with the identity as fixed weights is one separate emission per attribute, the fully untied baseline.
A weight that is 0 stays 0 (the M-step smooths only the weights an attribute has), so a head can give each
attribute its own table beside F shared ones: ``B_a = w[a, own] B_own(a) + sum_f w[a, f] B_f``, the untied
baseline with learned sharing (``fit --per-attribute emission``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, cast

import numba
import numpy as np

from dist_respattn.model.arguments import check_batch
from dist_respattn.model.emission.layouts import PairSupport, SparseEmission, map_values
from dist_respattn.model.heads.base import Block, Columns, Head, Passes
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.estimator import estimate_key_means
from dist_respattn.model.kernels.log_weights import exp_shifted, squared_distance
from dist_respattn.model.kernels.per_position import direct_pair_rows, find_pair, target_order

__all__ = [
    "REFERENCE_PREFIX",
    "FactorTables",
    "GatedHead",
    "GatedStatistics",
    "fold_in",
    "gated_estep",
    "gated_log_likelihood",
    "gated_log_likelihoods",
    "gated_m_step",
]


#: The prefix of the reference head's arrays among a gated head's.
REFERENCE_PREFIX = "reference."


@dataclass(frozen=True, eq=False)
class FactorTables:
    """F emission tables on one support of pairs, each with the MAP backoff off it.

    Attributes:
        support: the P (symbol, target) pairs stored.
        values: (P, F) float64, ``B_f`` at each pair (pair-major: a row's lookups read F adjacent values).
        backoff: (F, S) float64, factor ``f``'s scale of the pairs of symbol ``s`` outside the support.
        base: (T,) float64, the backoff distribution every factor shares.
    """

    support: PairSupport
    values: np.ndarray
    backoff: np.ndarray
    base: np.ndarray

    def __post_init__(self) -> None:
        values = np.ascontiguousarray(self.values, dtype=np.float64)
        backoff = np.ascontiguousarray(self.backoff, dtype=np.float64)
        base = np.ascontiguousarray(self.base, dtype=np.float64)
        p, s, t = self.support.num_pairs, self.support.num_symbols, self.support.num_targets
        if values.ndim != 2 or values.shape[0] != p or backoff.shape != (values.shape[1], s) or base.shape != (t,):
            raise ValueError(
                f"factor tables: values {values.shape}, backoff {backoff.shape}, base {base.shape}: "
                f"expected (P, F) = ({p}, F), (F, {s}) and ({t},)"
            )
        for name, array in (("values", values), ("backoff", backoff), ("base", base)):
            if not np.all(np.isfinite(array)) or np.any(array < 0.0):
                raise ValueError(f"factor tables: {name} must be finite and non-negative")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "backoff", backoff)
        object.__setattr__(self, "base", base)

    @classmethod
    def from_dense(cls, probs: np.ndarray) -> FactorTables:
        """Dense tables (F, S, T) on the full support (tests and tiny heads)."""
        probs = np.asarray(probs, dtype=np.float64)
        f, s, t = probs.shape
        support = PairSupport.full(s, t)
        values = probs[:, support.symbols, support.targets].T
        return cls(support, values, np.zeros((f, s)), np.full(t, 1.0 / t))

    @property
    def num_factors(self) -> int:
        return int(self.values.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.backoff.nbytes + self.base.nbytes + self.support.nbytes)

    def mixed(self, weights: np.ndarray) -> SparseEmission:
        """``sum_f weights[f] B_f`` (weights (F,)): a sparse emission on the same support and base."""
        w = np.asarray(weights, dtype=np.float64)
        return SparseEmission(self.support, self.values @ w, w @ self.backoff, self.base)

    def to_dense(self) -> np.ndarray:
        """(F, S, T) every factor's table."""
        return np.stack([self.mixed(np.eye(self.num_factors)[f]).to_dense() for f in range(self.num_factors)])

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "factor_values": self.values,
            "factor_backoff": self.backoff,
            "factor_base": self.base,
            **self.support.to_arrays(),
        }

    @classmethod
    def from_arrays(cls, arrays: Any, num_symbols: int) -> FactorTables:
        support = PairSupport.from_arrays(arrays, num_symbols)
        return cls(
            support, np.asarray(arrays["factor_values"]), np.asarray(arrays["factor_backoff"]),
            np.asarray(arrays["factor_base"]),
        )  # fmt: skip


@dataclass(frozen=True, eq=False)
class GatedHead(Head):
    """A head whose emission is gated by the row's attribute (the head kind ``"gated"``).

    Attributes:
        key_means: (S, D) and ``sigma2``, the gate's keys and variance, shared by every attribute.
        position_prior: (A', N), A' = 1 (one prior shared by every attribute) or A (one per attribute).
        factors: the F factor tables.
        weights: (A, F) each attribute's mixture of the factors, rows summing to 1.
        fixed_weights: the weights are not learned (the untied baseline's identity).
        names: the A attributes' names (a row's attribute id is a position here), or ``()`` for a head made in
            code without them (it then cannot read a store's attributes).
        reference: the shared head the fit started from (its first stage), which ``evaluate`` compares it with;
            ``None`` when unknown.
    """

    kind: ClassVar[str] = "gated"

    key_means: np.ndarray
    position_prior: np.ndarray
    sigma2: float
    factors: FactorTables
    weights: np.ndarray
    fixed_weights: bool = False
    names: tuple[str, ...] = ()
    reference: ResponsibilityAttentionDistribution | None = None

    def __post_init__(self) -> None:
        prior = np.atleast_2d(np.asarray(self.position_prior, dtype=np.float64))
        object.__setattr__(self, "position_prior", prior)
        object.__setattr__(self, "names", tuple(str(name) for name in self.names))
        if self.key_means.shape[0] != self.factors.support.num_symbols or self.weights.shape[1] != self.num_factors:
            raise ValueError(
                f"factors ({self.factors.support.num_symbols} symbols, {self.num_factors} factors), "
                f"weights {self.weights.shape} and key_means {self.key_means.shape}: expected (A, F) weights and "
                "(S, D) keys"
            )
        if prior.shape[0] not in (1, self.num_attributes):
            raise ValueError(f"position_prior {prior.shape}: expected (1, N) or (A, N) with A = {self.num_attributes}")
        if self.names and len(self.names) != self.num_attributes:
            raise ValueError(f"names: {len(self.names)} attribute names for A = {self.num_attributes} attributes")
        for name, array in (("weights", self.weights), ("position_prior", prior)):
            if not np.all(np.isfinite(array)) or np.any(array < 0.0):
                raise ValueError(f"{name}: expected finite non-negative probabilities")
            off = np.abs(array.sum(axis=1) - 1.0) > 1e-9
            if np.any(off):
                raise ValueError(f"{name}: row {int(np.flatnonzero(off)[0])} does not sum to 1")

    @classmethod
    def from_dense(
        cls, key_means: np.ndarray, position_prior: np.ndarray, sigma2: float, factors: np.ndarray, weights: np.ndarray
    ) -> GatedHead:
        """A head with dense factor tables (F, S, T), held on the full support."""
        return cls(key_means, position_prior, sigma2, FactorTables.from_dense(factors), np.asarray(weights, float))

    @classmethod
    def from_shared(cls, model: ResponsibilityAttentionDistribution, num_attributes: int) -> GatedHead:
        """The shared head as a gated one of F = 1 (every attribute the same): scored and compared alike."""
        emission = model.emission_table
        if isinstance(emission, SparseEmission):
            factors = FactorTables(emission.support, emission.values[:, None], emission.backoff[None, :], emission.base)
        else:
            factors = FactorTables.from_dense(emission.to_dense()[None])
        return cls(model.key_means, model.position_prior, model.sigma2, factors, np.ones((num_attributes, 1)))

    @property
    def num_factors(self) -> int:
        return self.factors.num_factors

    @property
    def num_attributes(self) -> int:
        return int(self.weights.shape[0])

    @property
    def context_length(self) -> int:  # type: ignore[override]
        return int(self.position_prior.shape[1])

    @property
    def per_attribute_prior(self) -> bool:
        return self.position_prior.shape[0] > 1

    def prior_of(self, attribute: int) -> np.ndarray:
        """(N,) the position prior of one attribute."""
        return self.position_prior[int(attribute) if self.per_attribute_prior else 0]

    def emission_of(self, attribute: int) -> SparseEmission:
        """``B_a = sum_f w[a, f] B_f``, a sparse emission."""
        return self.factors.mixed(self.weights[int(attribute)])

    def shared(self, attribute: int) -> ResponsibilityAttentionDistribution:
        """The plain head of one attribute (its gated emission as one table, its prior)."""
        return ResponsibilityAttentionDistribution(
            self.key_means, self.emission_of(attribute), self.prior_of(attribute), self.sigma2
        )

    def attribute_head(self, attribute: int) -> ResponsibilityAttentionDistribution:
        """:meth:`shared` of ``attribute``, made once per head (scoring and ranking blocks ask for it again)."""
        cache = self.__dict__.get("_attribute_heads")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_attribute_heads", cache)
        a = int(attribute)
        if a not in cache:
            cache[a] = self.shared(a)
        return cache[a]

    def with_weights(self, weights: np.ndarray) -> GatedHead:
        """The head with other attribute weights (A'', F), and the prior shared (folding in new attributes)."""
        prior = self.position_prior if not self.per_attribute_prior else self.position_prior.mean(axis=0)
        return GatedHead(self.key_means, prior, self.sigma2, self.factors, np.asarray(weights, dtype=np.float64))

    def with_parameters(self, **changes: Any) -> GatedHead:
        """The head with some parameters replaced, its names and reference kept (what an M-step returns)."""
        fields = {
            "key_means": self.key_means, "position_prior": self.position_prior, "sigma2": self.sigma2,
            "factors": self.factors, "weights": self.weights, "fixed_weights": self.fixed_weights,
            "names": self.names, "reference": self.reference,
        }  # fmt: skip
        return GatedHead(**{**fields, **changes})

    def __getstate__(self) -> dict[str, Any]:
        # The kernels' logs and the attributes' heads are rebuilt where they are used, not shipped to the workers.
        return {k: v for k, v in self.__dict__.items() if k not in ("_kernel_cache", "_attribute_heads")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- shape -----------------------------------------------------------------------------------------------------

    @property
    def num_symbols(self) -> int:  # type: ignore[override]
        return int(self.key_means.shape[0])

    @property
    def query_dim(self) -> int:  # type: ignore[override]
        return int(self.key_means.shape[1])

    @property
    def num_targets(self) -> int:  # type: ignore[override]
        return int(self.factors.support.num_targets)

    # -- persistence -------------------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The head as float/int arrays for an npz (never a pickle) and the JSON that goes with them.

        Arrays: ``key_means`` (S, D), ``position_prior`` (A', N), ``weights`` (A, F), the factor tables'
        (``factor_values`` (P, F), ``factor_backoff`` (F, S), ``factor_base`` (T,), the support's), and the
        reference head's under ``reference.``; JSON: ``sigma2``, ``fixed_weights``, ``attribute_names`` and the
        reference head's own JSON under ``reference`` (``None`` without one).
        """
        arrays = {
            "key_means": self.key_means, "position_prior": self.position_prior, "weights": self.weights,
            **self.factors.to_arrays(),
        }  # fmt: skip
        meta: dict[str, Any] = {
            "sigma2": float(self.sigma2), "fixed_weights": bool(self.fixed_weights),
            "attribute_names": list(self.names), "reference": None,
        }  # fmt: skip
        if self.reference is not None:
            reference_arrays, meta["reference"] = self.reference.to_arrays()
            arrays.update({REFERENCE_PREFIX + name: array for name, array in reference_arrays.items()})
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> GatedHead:
        """The head :meth:`to_arrays` wrote; a missing array or a bad shape raises ``ValueError`` naming it.

        A checkpoint written before gated heads were a kind of the head protocol has neither ``attribute_names``
        nor ``reference`` in this JSON: its ``meta.json`` kept the names beside it (``meta`` may be that whole
        ``meta.json``: the head's own JSON is then its ``model``), and the reference is its ``shared/`` fit
        (:meth:`with_parameters` ``(reference=...)``); without them the head is read without them.
        """
        missing = [k for k in ("key_means", "position_prior", "weights", "factor_values") if k not in arrays]
        if missing:
            raise ValueError(f"a gated head needs the arrays {', '.join(missing)}")
        if "sigma2" not in meta and isinstance(meta.get("model"), dict):  # an old checkpoint's whole meta.json
            meta = {**meta["model"], "attribute_names": meta.get("attribute_names")}
        key_means = np.asarray(arrays["key_means"], dtype=np.float64)
        reference = None
        if meta.get("reference") is not None:
            from dist_respattn.model.heads.single_hop.arrays import distribution_from_arrays

            inner = {k[len(REFERENCE_PREFIX) :]: arrays[k] for k in arrays if k.startswith(REFERENCE_PREFIX)}
            reference = distribution_from_arrays(inner, meta["reference"], source="the gated head's reference")
        return cls(
            key_means, np.asarray(arrays["position_prior"]), float(meta["sigma2"]),
            FactorTables.from_arrays(arrays, key_means.shape[0]), np.asarray(arrays["weights"], dtype=np.float64),
            bool(meta.get("fixed_weights", False)), tuple(meta.get("attribute_names") or ()), reference,
        )  # fmt: skip

    def num_parameters(self) -> int:
        """Parameters stored: keys, priors, the factor values and backoffs, the weights an attribute can move."""
        return int(
            self.key_means.size + self.position_prior.size + self.factors.values.size + self.factors.backoff.size
            + (0 if self.fixed_weights else np.count_nonzero(self.weights))
        )  # fmt: skip

    def describe(self) -> str:
        return f"gated head, {self.num_factors} tables, {self.num_attributes} attributes"

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        """A fit report's ``factors`` (F, the tables), ``untied`` (one fixed table per attribute) and ``attributes``
        (A), and a line saying them."""
        tables = "one emission per attribute" if self.fixed_weights else f"{self.num_factors} tables"
        figures = {"factors": self.num_factors, "untied": bool(self.fixed_weights), "attributes": self.num_attributes}
        line = f"gated head: {tables}, {self.num_attributes} attributes, {self.num_parameters():,} parameters"
        return figures, [line]

    # -- reading rows ------------------------------------------------------------------------------------------------

    @property
    def columns(self) -> Columns:
        """Every row's attribute, beside the encoded rows."""
        return Columns(attributes=True)

    def attribute_names(self) -> tuple[str, ...]:
        if not self.names:
            raise ValueError(
                "this gated head has no attribute names, so a store's attributes cannot be matched to its own: give "
                "them (GatedHead(..., names=...)), or read an old checkpoint with its meta.json's attribute_names"
            )
        return self.names

    def _live(self, block: Block) -> tuple[np.ndarray, np.ndarray]:
        """``(attribute (n,) int64 with -1 read as 0, weight (n,) float64 with rows of attribute -1 at 0)``."""
        if block.attribute is None:
            raise ValueError("a gated head reads each row's attribute: the block carries none")
        attribute = np.asarray(block.attribute, dtype=np.int64)
        known = attribute >= 0
        return np.where(known, attribute, 0), np.where(known, block.weights_or_ones(), 0.0)

    def score(self, blocks: Iterable[Block]) -> Any:
        """Held-out totals (:class:`~dist_respattn.model.heads.scores.ScoreTotals`) of the blocks' rows,
        each under its own attribute; a row of attribute ``-1`` (one the head does not know) weighs 0.

        ``log_lik`` and ``target_log_prob`` are the gated kernel's (:func:`gated_log_likelihoods`), ``correct`` the
        rows whose target is the arg-max of their attribute's head (:meth:`shared`)."""
        from dist_respattn.model.heads.single_hop.scoring import score_rows
        from dist_respattn.model.scores import ScoreTotals

        totals = ScoreTotals()
        for block in blocks:
            attribute, weight = self._live(block)
            encoded = block.rows.encoded
            target_log_prob, joint = gated_log_likelihoods(self, encoded, attribute, values_checked=block.checked)
            live = weight > 0.0
            correct = 0.0
            for a in np.unique(attribute[live]):
                mine = live & (attribute == a)
                rows = tuple(np.asarray(column)[mine] for column in encoded)
                correct += score_rows(self.attribute_head(int(a)), rows, weight[mine]).correct
            totals = totals + ScoreTotals(
                float(weight.sum()), float(np.sum(weight[live] * joint[live])),
                float(np.sum(weight[live] * target_log_prob[live])), float(correct),
            )  # fmt: skip
        return totals

    def top_k(self, block: Block, k: int) -> Any:
        """The top ``k`` targets of each row under its attribute's head (:meth:`shared`), rows grouped by attribute;
        a row of attribute ``-1`` is ranked by the reference head (the shared head the fit started from)."""
        from dist_respattn.model.heads.single_hop.top_k import predict_top_k
        from dist_respattn.model.scores import TopK

        if block.attribute is None:
            raise ValueError("a gated head ranks each row under its attribute: the block carries none")
        attribute = np.asarray(block.attribute, dtype=np.int64)
        context, query = np.asarray(block.rows.context), np.asarray(block.rows.query)
        n = attribute.shape[0]
        kept = min(int(k), self.num_targets)
        targets = np.zeros((n, kept), dtype=np.int32)
        probabilities = np.zeros((n, kept))
        attention = np.zeros((n, self.context_length))
        for a in np.unique(attribute):
            if a < 0 and self.reference is None:
                raise ValueError(
                    "rows of an attribute the gated head does not know, and no shared head to rank them with"
                )
            head = self.reference if a < 0 else self.attribute_head(int(a))
            assert head is not None
            mine = attribute == a
            ranked = predict_top_k(head, context[mine], query[mine], kept, base_order=head.base_order)
            targets[mine], probabilities[mine], attention[mine] = ranked.targets, ranked.probabilities, ranked.attention
        return TopK(targets, probabilities, attention)

    def block_proba(self, block: Block) -> np.ndarray:
        """(n, T) ``p(target | row)`` of each row under its attribute's head (a row of attribute ``-1``: the
        reference head's), as :meth:`top_k` ranks them."""
        if block.attribute is None:
            raise ValueError("a gated head ranks each row under its attribute: the block carries none")
        attribute = np.asarray(block.attribute, dtype=np.int64)
        context, query = np.asarray(block.rows.context), np.asarray(block.rows.query)
        out = np.zeros((attribute.shape[0], self.num_targets))
        for a in np.unique(attribute):
            head = self.reference if a < 0 else self.attribute_head(int(a))
            if head is None:
                raise ValueError(
                    "rows of an attribute the gated head does not know, and no shared head to rank them with"
                )
            mine = attribute == a
            out[mine] = np.atleast_2d(head.predict_proba(context[mine], query[mine]))
        return out

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> Any:
        """A :class:`~dist_respattn.model.streaming.Predictor` of the head of ``options["attribute"]`` (a name) or of
        the mix ``options["mix"]`` (``"NAME=SHARE,NAME=SHARE"``, shares > 0), as
        :func:`~dist_respattn.model.heads.gated.use.mixed_head` makes it."""
        from dist_respattn.model.heads.gated.use import mixed_head
        from dist_respattn.model.streaming import Predictor

        mix = self.mix_of(options or {})
        predictor = Predictor(mixed_head(self, mix), query_table, words=words)
        # What it writes as, for the commands that say it: the attributes and their shares, the first to open with.
        predictor.mix_shares = (
            {self.names[a]: share for a, share in mix.items()} if options and options.get("mix") else None
        )
        predictor.opening_attribute = self.names[next(iter(mix))] if self.names else None
        return predictor

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        """Each attribute's emission ``B_a`` by its name (only ``options["attribute"]``'s when given)."""
        name = (options or {}).get("attribute")
        chosen = [self.attribute_id(name, "--attribute")] if name else range(self.num_attributes)
        return [(self.names[a] if self.names else str(a), self.emission_of(a)) for a in chosen]

    def stage_heads(self) -> dict[str, Head]:
        """The shared head its fit started from (the ``"shared"`` stage), when it carries it."""
        return {} if self.reference is None else {"shared": self.reference}

    def completed(self, directory: str, meta: dict[str, Any], load: Any) -> GatedHead:
        """An older gated checkpoint does not hold its shared head: read it from the model directory's ``shared/``
        fit, else from the directory its fit recorded."""
        if self.reference is not None:
            return self
        import os

        for candidate in (os.path.join(directory, "shared"), (meta.get("shared") or {}).get("dir")):
            if candidate and os.path.isfile(os.path.join(candidate, "latest.json")):
                return self.with_parameters(reference=load(candidate))
        return self

    def mix_of(self, options: dict[str, Any]) -> dict[int, float]:
        """``{attribute id: share}`` of the options ``attribute`` (a name) or ``mix`` (``"NAME=SHARE,..."``);
        ``ValueError`` naming the flag for a name the head lacks or a malformed mix, or when neither or both are
        given."""
        mix_text, name = options.get("mix"), options.get("attribute")
        if mix_text and name:
            raise ValueError(
                f"--mix {mix_text!r} and --attribute {name!r}: give one (--attribute NAME writes as one attribute, "
                "--mix NAME=SHARE,... as a mix)"
            )
        if mix_text:
            mix: dict[int, float] = {}
            for part in str(mix_text).split(","):
                label, _, share = part.rpartition("=")
                try:
                    value = float(share)
                except ValueError:
                    value = math.nan
                if not label or not value > 0 or not math.isfinite(value):
                    raise ValueError(f"--mix {mix_text!r}: expected NAME=SHARE,NAME=SHARE (shares > 0)")
                a = self.attribute_id(label, "--mix")
                mix[a] = mix.get(a, 0.0) + value
            return mix
        if not name:
            raise ValueError(
                "a gated head writes as an attribute: give --attribute NAME or --mix NAME=SHARE,NAME=SHARE"
            )
        return {self.attribute_id(str(name), "--attribute"): 1.0}

    def attribute_id(self, name: str, flag: str = "--attribute") -> int:
        """The id of attribute ``name``; ``ValueError`` naming ``flag`` and some known names when there is none."""
        names = self.attribute_names()
        if name not in names:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ValueError(f"{flag} {name!r}: the model has no such attribute (it has {shown})")
        return names.index(name)

    def report(self, passes: Passes, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Per-attribute perplexities beside the reference head and each attribute's Kneser-Ney bigram, and with
        ``classify_attributes`` / ``fold_in`` the classification of documents and folded-in attributes
        (:func:`~dist_respattn.model.heads.gated.report.gated_report`)."""
        from dist_respattn.model.heads.gated.report import ReportPasses, gated_report

        return gated_report(self, cast(ReportPasses, passes), options)


class GatedStatistics(NamedTuple):
    """Additive statistics of the gated E-step (float64 arrays, summed over rows).

    Attributes:
        key_sum: (S, D); ``key_mass``: (S,): as the shared head's, the factor summed out.
        position_count: (A', N) per prior row (A' = 1 shared, A per attribute).
        factor_count: (P, F) ``sum w_n r_nif [(c_ni, t_n) = pair p]``; (0, F) when the pass skips them.
        attribute_count: (A, F) ``sum w_n r_nif [a_n = a]``.
        scalars: (3,) ``[query_sq, n_obs, log_lik]``.
    """

    key_sum: np.ndarray
    key_mass: np.ndarray
    position_count: np.ndarray
    factor_count: np.ndarray
    attribute_count: np.ndarray
    scalars: np.ndarray

    @classmethod
    def zeros(cls, head: GatedHead, *, factor_counts: bool = True) -> GatedStatistics:
        p = head.factors.support.num_pairs if factor_counts else 0
        return cls(
            np.zeros(head.key_means.shape), np.zeros(head.key_means.shape[0]), np.zeros(head.position_prior.shape),
            np.zeros((p, head.num_factors)), np.zeros(head.weights.shape), np.zeros(3),
        )  # fmt: skip

    def plus(self, other: GatedStatistics) -> GatedStatistics:
        """These statistics and ``other``'s, added (partitions' values combine this way)."""
        return GatedStatistics(*(a + b for a, b in zip(self, other, strict=True)))

    def __add__(self, other: object) -> GatedStatistics:
        if not isinstance(other, GatedStatistics):
            return NotImplemented
        return self.plus(other)

    @property
    def log_lik(self) -> float:
        return float(self.scalars[2])

    @property
    def n_obs(self) -> float:
        return float(self.scalars[1])


# ------------------------------------------------------------------------------------------ kernels


@numba.njit(cache=True, nogil=True, inline="always")
def _row_terms(
    context, row, y, t, key_means, inv_two_sigma2, indptr, symbols, table, use_map, gate, pair
):  # pragma: no cover - compiled  # fmt: skip
    """For one row: ``gate[i] = -||y - K[c_i]||^2 / (2 sigma2)`` and ``pair[i]``, the index of ``(c_i, t)`` in the
    support or -1, found in ``table`` (a symbol -> pair map of target ``t``) when ``use_map``, else by binary
    search."""
    for i in range(context.shape[1]):
        c = context[row, i]
        pair[i] = table[c] if use_map else find_pair(indptr, symbols, t, c)
        gate[i] = -squared_distance(y, key_means, c) * inv_two_sigma2


@numba.njit(cache=True, nogil=True, inline="always")
def _log_emission(log_values, log_backoff, log_base, p, c, t, f):  # pragma: no cover - compiled
    """``log B_f[c, t]``: the pair's value on the support, else the factor's backoff times the base."""
    if p >= 0:
        return log_values[p, f]
    return log_backoff[f, c] + log_base[t]


@numba.njit(cache=True, nogil=True)
def _gated_estep_numba(
    context, query, target, attribute, weights, key_means, log_prior, inv_two_sigma2, gate_const,
    indptr, symbols, log_values, log_backoff, log_base, log_attr, attr_indptr, attr_factors, direct_row,
    direct_slots, key_sum, key_mass, position_count, factor_count, attribute_count, scalars,
):  # pragma: no cover - compiled  # fmt: skip
    """The E-step over (position, factor) pairs. Returns an impossible row (no possible pair), or -1.

    Rows are visited grouped by target (a counting sort), as the shared sparse kernel does: a target's pairs
    are found through its direct row (``direct_slots``), else a symbol -> pair map filled for the group when it
    has enough rows, else by binary search; all give the same pair. A row visits only the factors its
    attribute weighs (``attr_factors[attr_indptr[a]:attr_indptr[a + 1]]``): an attribute's own table and the
    shared ones, not the other attributes' tables. Factor counts are scattered only when ``factor_count`` has
    rows (a fold-in pass needs the attribute mass alone).
    """
    n = context.shape[0]
    n_pos = context.shape[1]
    n_fac = log_values.shape[1]
    dim = query.shape[1]
    scatter = factor_count.shape[0] > 0
    shared_prior = log_prior.shape[0] == 1
    logw = np.empty(n_pos * n_fac)
    resp = np.empty(n_pos * n_fac)
    bits = np.empty(n_pos * n_fac, dtype=np.int64)
    gate = np.empty(n_pos)
    pair = np.empty(n_pos, dtype=np.int64)
    y = np.empty(dim)
    slot = np.full(key_means.shape[0], -1, dtype=np.int32)
    order = target_order(target, log_base.shape[0])
    k0 = 0
    while k0 < n:
        t = target[order[k0]]
        end = k0 + 1
        while end < n and target[order[end]] == t:
            end += 1
        lo, hi = indptr[t], indptr[t + 1]
        row_index = direct_row[t]
        fill = False
        if row_index >= 0:
            table = direct_slots[row_index]
        else:
            # A map costs 2 writes per pair of the target; a search ~log2(degree) steps per lookup.
            fill = (end - k0) * n_pos * (np.log2(hi - lo + 1.0) + 1.0) > 2.0 * (hi - lo)
            table = slot
        if fill:
            for j in range(lo, hi):
                slot[symbols[j]] = j
        use_map = fill or row_index >= 0
        for kk in range(k0, end):
            row = order[kk]
            w = 1.0 if weights.shape[0] == 0 else weights[row]
            if w == 0.0:
                continue
            yy = 0.0
            for d in range(dim):
                y[d] = np.float64(query[row, d])
                yy += y[d] * y[d]
            a = attribute[row]
            k = 0 if shared_prior else a
            first, m = attr_indptr[a], attr_indptr[a + 1] - attr_indptr[a]
            every = m == n_fac  # all factors: no indirection (measured 10-20% of rows/s at F = 4 to 16)
            _row_terms(context, row, y, t, key_means, inv_two_sigma2, indptr, symbols, table, use_map, gate, pair)
            # The same loop as the scoring kernel's, written out: an inline helper taking row views was 11-14%
            # slower here.
            best = -np.inf
            for i in range(n_pos):
                c = context[row, i]
                g = log_prior[k, i] + gate[i]
                for j in range(m):
                    f = j if every else attr_factors[first + j]
                    v = (g + log_attr[a, f]) + _log_emission(log_values, log_backoff, log_base, pair[i], c, t, f)
                    logw[i * m + j] = v
                    best = max(best, v)
            if best == -np.inf:
                return row
            size = n_pos * m
            z = exp_shifted(logw[:size], best, resp[:size], bits[:size])
            scale = w / z
            for i in range(n_pos):
                c = context[row, i]
                p = pair[i]
                mass = 0.0
                for j in range(m):
                    f = j if every else attr_factors[first + j]
                    r = resp[i * m + j] * scale
                    mass += r
                    attribute_count[a, f] += r
                    if scatter and p >= 0:
                        factor_count[p, f] += r
                key_mass[c] += mass
                position_count[k, i] += mass
                for d in range(dim):
                    key_sum[c, d] += mass * y[d]
            scalars[0] += w * yy
            scalars[1] += w
            scalars[2] += w * (best + math.log(z) + gate_const)
        if fill:
            for j in range(lo, hi):
                slot[symbols[j]] = -1
        k0 = end
    return -1


@numba.njit(cache=True, nogil=True)
def _gated_loglik_numba(
    context, query, target, candidates, own, given_query, key_means, log_prior, inv_two_sigma2, gate_const,
    indptr, symbols, log_values, log_backoff, log_base, log_attr, attr_indptr, attr_factors, out, joint,
):  # pragma: no cover - compiled  # fmt: skip
    """``out[n, k] = log p(row n | attribute candidates[k])``, or with ``candidates`` empty ``out[n, 0]`` under
    the row's own attribute ``own[n]``. ``-inf`` for an impossible row. ``given_query``: the target's log-probability
    given the context and the query, ``log p(q, t | c, a) - log p(q | c, a)``, instead of the joint, and ``joint``
    (the shape of ``out``, or (0, 0): not asked for) the joint beside it."""
    n_pos = context.shape[1]
    n_fac = log_values.shape[1]
    dim = query.shape[1]
    shared_prior = log_prior.shape[0] == 1
    logw = np.empty(n_pos * n_fac)
    resp = np.empty(n_pos * n_fac)
    bits = np.empty(n_pos * n_fac, dtype=np.int64)
    gate = np.empty(n_pos)
    pair = np.empty(n_pos, dtype=np.int64)
    marginal = np.empty(n_pos)
    y = np.empty(dim)
    no_table = np.zeros(0, dtype=np.int32)
    n_cand = candidates.shape[0]
    for row in range(context.shape[0]):
        for d in range(dim):
            y[d] = np.float64(query[row, d])
        t = target[row]
        _row_terms(context, row, y, t, key_means, inv_two_sigma2, indptr, symbols, no_table, False, gate, pair)
        for k in range(max(n_cand, 1)):
            a = own[row] if n_cand == 0 else candidates[k]
            prior_row = 0 if shared_prior else a
            first, m = attr_indptr[a], attr_indptr[a + 1] - attr_indptr[a]
            every = m == n_fac
            best = -np.inf
            for i in range(n_pos):
                c = context[row, i]
                g = log_prior[prior_row, i] + gate[i]
                for j in range(m):
                    f = j if every else attr_factors[first + j]
                    v = (g + log_attr[a, f]) + _log_emission(log_values, log_backoff, log_base, pair[i], c, t, f)
                    logw[i * m + j] = v
                    best = max(best, v)
            if best == -np.inf:
                out[row, k] = -np.inf
                if joint.shape[0] > 0:
                    joint[row, k] = -np.inf
                continue
            size = n_pos * m
            value = best + math.log(exp_shifted(logw[:size], best, resp[:size], bits[:size])) + gate_const
            if joint.shape[0] > 0:
                joint[row, k] = value
            if given_query:
                # log p(q | context, a) = logsumexp_i (log pi_a,i + gate_i) + the Gaussian's constant.
                top = -np.inf
                for i in range(n_pos):
                    marginal[i] = log_prior[prior_row, i] + gate[i]
                    top = max(top, marginal[i])
                value -= top + math.log(exp_shifted(marginal, top, resp[:n_pos], bits[:n_pos])) + gate_const
            out[row, k] = value
    return out


def _logs(array: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(array)


def _weighed_factors(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr (A + 1,), factors (nnz,))`` int64: the factors each attribute gives a positive weight, CSR."""
    rows, factors = np.nonzero(weights > 0.0)
    indptr = np.zeros(weights.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=weights.shape[0]), out=indptr[1:])
    return indptr, factors.astype(np.int64)


def _kernel_arrays(head: GatedHead) -> tuple[Any, ...]:
    """The head's parameters as the kernels take them (logs computed once per call)."""
    d = head.key_means.shape[1]
    tables = head.factors
    cached = getattr(head, "_kernel_cache", None)
    if cached is None:
        cached = (
            np.ascontiguousarray(head.key_means, dtype=np.float64), _logs(head.position_prior), 0.5 / head.sigma2,
            -0.5 * d * math.log(2.0 * math.pi * head.sigma2), tables.support.indptr, tables.support.symbols,
            _logs(tables.values), _logs(tables.backoff), _logs(tables.base), _logs(head.weights),
            *_weighed_factors(head.weights),
            *direct_pair_rows(tables.support.indptr, tables.support.symbols, tables.support.num_symbols),
        )  # fmt: skip
        object.__setattr__(head, "_kernel_cache", cached)
    return cached


def _checked(
    head: GatedHead, x: tuple[Any, Any, Any], attribute: Any, weights: Any, *, values_checked: bool = False
) -> tuple[Any, ...]:
    s, d, t = head.key_means.shape[0], head.key_means.shape[1], head.factors.support.num_targets
    context, query, target, w = check_batch(
        x, weights, num_symbols=s, context_length=head.context_length, query_dim=d, num_targets=t,
        values_checked=values_checked,
    )  # fmt: skip
    attr = np.asarray(attribute)
    if attr.shape != target.shape or not np.issubdtype(attr.dtype, np.integer):
        raise ValueError(f"attribute of shape {attr.shape} and dtype {attr.dtype}: expected {target.shape} integer ids")
    bad = np.flatnonzero((attr < 0) | (attr >= head.num_attributes))
    if bad.size:
        r = int(bad[0])
        raise ValueError(f"attribute[{r}] = {int(attr[r])}: expected an attribute id in [0, {head.num_attributes})")
    return context, query, target, attr.astype(np.int64), w


def gated_estep(
    head: GatedHead,
    x: tuple[Any, Any, Any],
    attribute: Any,
    weights: Any = None,
    stats: GatedStatistics | None = None,
    *,
    factor_counts: bool = True,
    values_checked: bool = False,
) -> GatedStatistics:
    """Add the E-step of ``x = (context (n, N), query (n, D), target (n,))`` with ``attribute`` (n,) ids in [0, A)
    (and weights (n,) or ``None``) into ``stats`` (new ones by default); returns them.

    ``factor_counts=False`` leaves the (P, F) factor counts out (a fold-in needs the attribute mass alone).
    Bad ids or values raise naming the row, before anything is added; a row no (position, factor) pair can
    explain raises after the rows before it were added."""
    context, query, target, attr, w = _checked(head, x, attribute, weights, values_checked=values_checked)
    stats = GatedStatistics.zeros(head, factor_counts=factor_counts) if stats is None else stats
    failed = _gated_estep_numba(  # type: ignore[call-arg]
        context, query, target, attr, np.zeros(0) if w is None else w.astype(np.float64), *_kernel_arrays(head),
        *stats[:5], stats.scalars,
    )  # fmt: skip
    if failed >= 0:
        raise ValueError(f"row {failed} has zero probability under the gated head: smooth the factors")
    return stats


def gated_log_likelihood(
    head: GatedHead,
    x: tuple[Any, Any, Any],
    attribute: Any = None,
    *,
    candidates: Any = None,
    given_query: bool = False,
    values_checked: bool = False,
) -> np.ndarray:
    """Per row ``log p(query, target | context, a)``: (n,) under each row's own ``attribute`` (n,), or (n, K)
    under every attribute of ``candidates`` (K,) (classifying rows by attribute). ``-inf`` where impossible.

    ``given_query``: ``log p(target | context, query, a)`` instead, the target's log-probability behind
    perplexities (the query is the previous token's embedding in a token stream, so the product over a
    document's rows is its likelihood)."""
    return _log_likelihoods(head, x, attribute, candidates, given_query, values_checked, joint=False)[0]


def gated_log_likelihoods(
    head: GatedHead, x: tuple[Any, Any, Any], attribute: Any, *, values_checked: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(log p(target | context, query, a), log p(query, target | context, a))`` (n,) each under each row's own
    ``attribute`` (n,), from one kernel pass (each equal to :func:`gated_log_likelihood`'s)."""
    target_log_prob, joint = _log_likelihoods(head, x, attribute, None, True, values_checked, joint=True)
    assert joint is not None
    return target_log_prob, joint


def _log_likelihoods(
    head: GatedHead, x: tuple[Any, Any, Any], attribute: Any, candidates: Any, given_query: bool,
    values_checked: bool, *, joint: bool,
) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
    n = np.asarray(x[2]).shape[0]
    own = np.zeros(n, dtype=np.int64) if attribute is None else attribute
    context, query, target, attr, _ = _checked(head, x, own, None, values_checked=values_checked)
    query = np.ascontiguousarray(query, dtype=np.float64)  # float32 queries widened (exactly): one build for both
    cand = np.zeros(0, dtype=np.int64) if candidates is None else np.asarray(candidates, dtype=np.int64)
    if cand.size and (cand.min() < 0 or cand.max() >= head.num_attributes):
        raise ValueError(f"candidates: expected attribute ids in [0, {head.num_attributes})")
    out = np.empty((n, max(cand.shape[0], 1)))
    joint_out = np.empty(out.shape) if joint else np.empty((0, 0))
    _gated_loglik_numba(  # type: ignore[call-arg]
        context, query, target, cand, attr, bool(given_query), *_kernel_arrays(head)[:-2], out, joint_out
    )
    if candidates is None:
        return out[:, 0], joint_out[:, 0] if joint else None
    return out, joint_out if joint else None


# ------------------------------------------------------------------------------------------ M-step


def _normalized_rows(counts: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Rows of ``counts`` normalized; a row with no mass keeps ``previous``'s."""
    totals = counts.sum(axis=1, keepdims=True)
    return np.where(totals > 0.0, counts / np.where(totals > 0.0, totals, 1.0), previous)


def gated_m_step(
    stats: GatedStatistics,
    previous: GatedHead,
    *,
    strength: np.ndarray,
    base: np.ndarray | None = None,
    center: SparseEmission | None = None,
    weight_strength: float = 0.0,
    prior_pseudo_count: float = 0.0,
    update: tuple[str, ...] = ("keys", "prior", "factors", "weights"),
) -> GatedHead:
    """The closed-form M-step (the module's formulas). ``strength`` (S,) ``a_s`` and ``base`` (T,) ``u`` are the
    emission's MAP prior (``base`` defaults to the factors' own).

    ``center``: a sparse emission on the factors' support that every factor's prior is centred on instead of
    ``u`` (the shared head's emission: a factor, or an attribute of few rows, then backs off to the shared head,
    not to a unigram): ``B_f[s, t] = (c_f[s, t] + a_s C[s, t]) / (c_f[s] + a_s)``, which is again a sparse table
    with the backoff ``a_s C_backoff[s] / (c_f[s] + a_s)`` times ``C``'s base. ``update`` names the parameters
    it re-estimates, the others are kept (folding in an attribute re-estimates ``("weights",)`` only). The gate
    variance is kept."""
    key_means, prior = previous.key_means, previous.position_prior
    if "keys" in update:
        key_means = estimate_key_means(stats, previous.key_means)  # type: ignore[arg-type]
    if "prior" in update:
        n_pos = prior.shape[1]
        prior = _normalized_rows(stats.position_count + prior_pseudo_count / n_pos, prior)
    factors = previous.factors
    if "factors" in update:
        factors = _factor_m_step(stats.factor_count, factors, strength, base, center)
    weights = previous.weights
    if "weights" in update and not previous.fixed_weights:
        # The prior's pseudo-count goes to the weights an attribute has: a weight at 0 (another attribute's own
        # table) stays 0, as the E-step gives it no mass.
        allowed = previous.weights > 0.0
        pseudo = weight_strength / np.maximum(allowed.sum(axis=1, keepdims=True), 1)
        weights = _normalized_rows(stats.attribute_count + np.where(allowed, pseudo, 0.0), previous.weights)
    return previous.with_parameters(key_means=key_means, position_prior=prior, factors=factors, weights=weights)


def _factor_m_step(
    factor_count: np.ndarray,
    factors: FactorTables,
    strength: np.ndarray,
    base: np.ndarray | None,
    center: SparseEmission | None,
) -> FactorTables:
    """Every factor's MAP table from its pair counts (P, F) (see :func:`gated_m_step`)."""
    support = factors.support
    symbols = support.symbols
    a_s = np.broadcast_to(np.asarray(strength, dtype=np.float64), (support.num_symbols,))
    if center is not None:
        if not center.support.same_as(support):
            raise ValueError("the prior's centre lies on another support than the factors")
        u = center.base
    else:
        u = factors.base if base is None else np.asarray(base, dtype=np.float64)
    values = np.empty_like(factors.values)
    backoff = np.empty_like(factors.backoff)
    for f in range(factors.num_factors):
        counts = np.ascontiguousarray(factor_count[:, f])
        totals = np.bincount(symbols, weights=counts, minlength=support.num_symbols)
        if center is None:
            values[:, f], backoff[f] = map_values(counts, totals, a_s, u, symbols, support.targets)
        else:
            den = np.where(totals + a_s > 0.0, totals + a_s, 1.0)
            values[:, f] = (counts + a_s[symbols] * center.values) / den[symbols]
            backoff[f] = a_s * center.backoff / den
        # A (factor, symbol) row with no mass and no prior keeps its previous distribution.
        dead = (totals + a_s) <= 0.0
        if dead.any():
            values[:, f] = np.where(dead[symbols], factors.values[:, f], values[:, f])
            backoff[f] = np.where(dead, factors.backoff[f], backoff[f])
    return FactorTables(support, values, backoff, u)


def fold_in(
    head: GatedHead,
    x: tuple[Any, Any, Any],
    weights: Any = None,
    *,
    iterations: int = 20,
    weight_strength: float = 0.0,
) -> np.ndarray:
    """The weight vector (F,) of an attribute unseen in training, from its rows ``x``: EM on that vector alone,
    every other parameter fixed (the EM counterpart of inferring a new attribute's representation). Starts
    uniform; returns the last estimate. A per-attribute prior is replaced by the attributes' mean."""
    f = head.num_factors
    probe = head.with_weights(np.full((1, f), 1.0 / f))
    n = np.asarray(x[2]).shape[0]
    zeros = np.zeros(n, dtype=np.int64)
    for _ in range(int(iterations)):
        stats = gated_estep(probe, x, zeros, weights, factor_counts=False)
        probe = fold_in_step(probe, stats.attribute_count[0], weight_strength)
    return probe.weights[0].copy()


def fold_in_step(probe: GatedHead, attribute_mass: np.ndarray, weight_strength: float) -> GatedHead:
    """One fold-in M-step: the probe's attributes' weights from their factor mass (A', F) (or (F,) for one)."""
    counts = np.atleast_2d(np.asarray(attribute_mass, dtype=np.float64)) + weight_strength / probe.num_factors
    return GatedHead(
        probe.key_means, probe.position_prior, probe.sigma2, probe.factors, _normalized_rows(counts, probe.weights)
    )
