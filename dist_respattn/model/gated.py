"""An attribute-gated emission: each row's attribute mixes F shared factor tables, learned by exact EM.

A row also carries an attribute ``a`` (the book, author or site it comes from). Its emission is a mixture
of F factor tables with the attribute's own weights (the attribute's learned representation)::

    B_a[s, t] = sum_f w[a, f] B_f[s, t]
    p(query, target | context, a) = sum_i sum_f pi_i N(query; K[c_i], sigma2) w[a, f] B_f[c_i, t]

so the factor is one more latent variable beside the position (Hofmann's aspect model; an EM counterpart of
the multiplicative attribute-gated language model of Kiros, Zemel & Salakhutdinov 2014). The E-step's
responsibilities are over (position, factor) pairs, ``r_if ∝ pi_i N(q; K[c_i]) w[a, f] B_f[c_i, t]``; the
statistics stay additive (:class:`GatedStatistics`: the shared head's, with the emission counts per factor
and the responsibility mass per (attribute, factor)); the M-step is closed form:

    B_f[s, t] = (c_f[s, t] + alpha u[t]) / (c_f[s] + alpha)      w[a, f] = (m[a, f] + beta / F) / (m[a] + beta)

with the keys, the position prior and the gate variance as for the shared head. With F = 1 the head is the
shared one (``tests/model/test_gated.py`` holds them equal to 1e-12). This module is the model's math, dense
emission tables, in one process; the fit's stores, engine and commands build on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numba
import numpy as np

from dist_respattn.model._checks import check_batch
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.estimator import _key_means, _position_prior
from dist_respattn.model.log_weights import exp_shifted, squared_distance

__all__ = ["GatedHead", "GatedStatistics", "fold_in", "gated_estep", "gated_m_step"]


@dataclass(frozen=True)
class GatedHead:
    """A head whose emission is gated by the row's attribute.

    Attributes:
        key_means: (S, D); ``position_prior``: (N,); ``sigma2``: the gate variance, as in the shared head.
        factors: (F, S, T) the factor emission tables, each row a distribution over targets.
        weights: (A, F) each attribute's mixture of the factors, rows summing to 1.
    """

    key_means: np.ndarray
    position_prior: np.ndarray
    sigma2: float
    factors: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        f, s, _ = self.factors.shape
        if self.key_means.shape[0] != s or self.weights.shape[1] != f:
            raise ValueError(
                f"factors {self.factors.shape}, weights {self.weights.shape} and key_means {self.key_means.shape}: "
                "expected (F, S, T), (A, F) and (S, D)"
            )
        for name, array, axis in (("factors", self.factors, 2), ("weights", self.weights, 1)):
            if not np.all(np.isfinite(array)) or np.any(array < 0.0):
                raise ValueError(f"{name}: expected finite non-negative probabilities")
            off = np.abs(array.sum(axis=axis) - 1.0) > 1e-9
            if np.any(off):
                raise ValueError(f"{name}: a row at {tuple(int(v) for v in np.argwhere(off)[0])} does not sum to 1")

    @property
    def num_factors(self) -> int:
        return int(self.factors.shape[0])

    @property
    def num_attributes(self) -> int:
        return int(self.weights.shape[0])

    def emission_of(self, attribute: int) -> np.ndarray:
        """(S, T) ``B_a = sum_f w[a, f] B_f``."""
        return np.tensordot(self.weights[int(attribute)], self.factors, axes=1)

    def shared(self, attribute: int) -> ResponsibilityAttentionDistribution:
        """The plain head of one attribute (its gated emission as one table)."""
        return ResponsibilityAttentionDistribution(
            self.key_means, self.emission_of(attribute), self.position_prior, self.sigma2
        )


class GatedStatistics(NamedTuple):
    """Additive statistics of the gated E-step (float64 arrays, summed over rows).

    Attributes:
        key_sum: (S, D); ``key_mass``: (S,); ``position_count``: (N,): as the shared head's, the factor summed out.
        factor_count: (F, S, T) ``sum w_n r_nif [c_ni = s][t_n = t]``.
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
    def zeros(cls, head: GatedHead) -> GatedStatistics:
        f, s, t = head.factors.shape
        return cls(
            np.zeros(head.key_means.shape), np.zeros(s), np.zeros(head.position_prior.shape[0]), np.zeros((f, s, t)),
            np.zeros(head.weights.shape), np.zeros(3),
        )  # fmt: skip

    def plus(self, other: GatedStatistics) -> GatedStatistics:
        """These statistics and ``other``'s, added (partitions' values combine this way)."""
        return GatedStatistics(*(a + b for a, b in zip(self, other, strict=True)))


@numba.njit(cache=True, nogil=True)
def _gated_estep_numba(
    context, query, target, attribute, weights, key_means, log_prior, inv_two_sigma2, gate_const,
    log_factors, log_attr, key_sum, key_mass, position_count, factor_count, attribute_count, scalars,
):  # pragma: no cover - compiled  # fmt: skip
    """The E-step over (position, factor) pairs, row by row. Returns the first row with no possible pair, or -1."""
    n_pos = context.shape[1]
    n_fac = log_factors.shape[0]
    dim = query.shape[1]
    logw = np.empty(n_pos * n_fac)
    resp = np.empty(n_pos * n_fac)
    bits = np.empty(n_pos * n_fac, dtype=np.int64)
    y = np.empty(dim)
    for row in range(context.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        yy = 0.0
        for d in range(dim):
            y[d] = np.float64(query[row, d])
            yy += y[d] * y[d]
        t = target[row]
        a = attribute[row]
        best = -np.inf
        for i in range(n_pos):
            c = context[row, i]
            gate = log_prior[i] - squared_distance(y, key_means, c) * inv_two_sigma2
            for f in range(n_fac):
                v = gate + log_attr[a, f] + log_factors[f, c, t]
                logw[i * n_fac + f] = v
                best = max(best, v)
        if best == -np.inf:
            return row
        z = exp_shifted(logw, best, resp, bits)
        scale = w / z
        for i in range(n_pos):
            c = context[row, i]
            mass = 0.0
            for f in range(n_fac):
                r = resp[i * n_fac + f] * scale
                mass += r
                factor_count[f, c, t] += r
                attribute_count[a, f] += r
            key_mass[c] += mass
            position_count[i] += mass
            for d in range(dim):
                key_sum[c, d] += mass * y[d]
        scalars[0] += w * yy
        scalars[1] += w
        scalars[2] += w * (best + math.log(z) + gate_const)
    return -1


def _logs(array: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(array)


def gated_estep(
    head: GatedHead, x: tuple[Any, Any, Any], attribute: Any, weights: Any = None, stats: GatedStatistics | None = None
) -> GatedStatistics:
    """Add the E-step of ``x = (context (n, N), query (n, D), target (n,))`` with ``attribute`` (n,) ids in [0, A)
    (and weights (n,) or ``None``) into ``stats`` (new ones by default); returns them.

    Bad ids or values raise naming the row, before anything is added; a row no (position, factor) pair can
    explain raises after the rows before it were added."""
    s, n_pos, d, t = (
        head.key_means.shape[0],
        head.position_prior.shape[0],
        head.key_means.shape[1],
        head.factors.shape[2],
    )
    context, query, target, w = check_batch(x, weights, num_symbols=s, context_length=n_pos, query_dim=d, num_targets=t)
    attr = np.asarray(attribute)
    if attr.shape != target.shape or not np.issubdtype(attr.dtype, np.integer):
        raise ValueError(f"attribute of shape {attr.shape} and dtype {attr.dtype}: expected {target.shape} integer ids")
    bad = np.flatnonzero((attr < 0) | (attr >= head.num_attributes))
    if bad.size:
        r = int(bad[0])
        raise ValueError(f"attribute[{r}] = {int(attr[r])}: expected an attribute id in [0, {head.num_attributes})")
    stats = GatedStatistics.zeros(head) if stats is None else stats
    failed = _gated_estep_numba(
        context, query, target, attr.astype(np.int64), np.zeros(0) if w is None else w.astype(np.float64),
        head.key_means, _logs(head.position_prior), 0.5 / head.sigma2,
        -0.5 * d * math.log(2.0 * math.pi * head.sigma2), _logs(head.factors), _logs(head.weights),
        *stats[:5], stats.scalars,
    )  # fmt: skip
    if failed >= 0:
        raise ValueError(f"row {failed} has zero probability under the gated head: smooth the factors")
    return stats


def gated_m_step(
    stats: GatedStatistics,
    previous: GatedHead,
    *,
    emission_strength: float,
    base: np.ndarray,
    weight_strength: float = 0.0,
    update: tuple[str, ...] = ("keys", "prior", "factors", "weights"),
) -> GatedHead:
    """The closed-form M-step (the module's formulas); ``update`` names the parameters it re-estimates, the others
    are kept (folding in an attribute re-estimates ``("weights",)`` only). The gate variance is kept."""
    from dist_respattn.model.accumulator import SufficientStatistics
    from dist_respattn.model.emission import DenseEmissionCounts

    key_means, position_prior = previous.key_means, previous.position_prior
    if "keys" in update or "prior" in update:
        shared = SufficientStatistics(
            stats.key_sum, stats.key_mass, DenseEmissionCounts.from_symbol_major(stats.factor_count.sum(axis=0)),
            stats.position_count, *(float(v) for v in stats.scalars),
        )  # fmt: skip
        if "keys" in update:
            key_means = _key_means(shared, previous.key_means)
        if "prior" in update:
            position_prior = _position_prior(shared, None)
    factors = previous.factors
    if "factors" in update:
        counts = stats.factor_count + emission_strength * base
        totals = counts.sum(axis=2, keepdims=True)
        # A (factor, symbol) row with no mass and no prior keeps its previous distribution.
        factors = np.where(totals > 0.0, counts / np.where(totals > 0.0, totals, 1.0), previous.factors)
    weights = previous.weights
    if "weights" in update:
        f = stats.attribute_count.shape[1]
        counts = stats.attribute_count + weight_strength / f
        totals = counts.sum(axis=1, keepdims=True)
        weights = np.where(totals > 0.0, counts / np.where(totals > 0.0, totals, 1.0), previous.weights)
    return GatedHead(key_means, position_prior, previous.sigma2, factors, weights)


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
    uniform; returns the last estimate."""
    f = head.num_factors
    probe = GatedHead(head.key_means, head.position_prior, head.sigma2, head.factors, np.full((1, f), 1.0 / f))
    n = np.asarray(x[2]).shape[0]
    for _ in range(int(iterations)):
        stats = gated_estep(probe, x, np.zeros(n, dtype=np.int64), weights)
        probe = gated_m_step(
            stats, probe, emission_strength=0.0, base=np.zeros(1), weight_strength=weight_strength, update=("weights",)
        )
    return probe.weights[0].copy()
