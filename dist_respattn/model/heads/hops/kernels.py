"""The chain-of-hops head's compiled passes over token windows: exact forward–backward over the hops.

For a window of ``m`` present positions the hop latents ``z_1..z_H`` form a chain over the positions; every pass
keeps each row's (H-1, m, m) transition table in scratch (O(H N^2) time and memory a row, never (n, N^H)).
Windows are :class:`~dist_respattn.model.rows.WindowRows` spans, oldest first: position ``x`` of ``tokens[lo:hi]``
has recency ``hi - 1 - x`` and context column ``N - hi + x``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.kernels.lanes import (
    LANES,
    add_weighted_rows,
    add_window_rows_8,
    sq_distances_8,
    transition_dots_8,
)
from dist_respattn.model.kernels.log_weights import (
    NO_ROWS,
    exp_nonpositive_range,
    exp_shifted,
    keep_row,
)
from dist_respattn.model.kernels.per_position import (
    GROUP_BY_TARGET_TABLE_BYTES,
    find_pair,
    prefetch_row,
)
from dist_respattn.model.kernels.prefetch import prefetch_element, prefetch_item
from dist_respattn.model.kernels.row_order import by_target, windows_in_order
from dist_respattn.model.kernels.specialize import njit_with_constants
from dist_respattn.model.rows import WindowRows, split_query_table

__all__ = ["HopArrays", "HopParameters", "hop_estep", "hop_score"]

_NO_VALUES = np.zeros(0)
_NO_INDEX = np.zeros(0, dtype=np.int64)
_NO_SYMBOLS = np.zeros(0, dtype=np.int32)
_NO_TABLE = np.zeros((0, 0))
_NO_ROWS = np.zeros(0, dtype=np.int32)
_NO_SLOTS = np.zeros((0, 0), dtype=np.int32)
_PREFETCH_ROWS = 8  # how many rows ahead the passes prefetch a dense emission's cells
_AHEAD_SLOTS = 16  # rows of pair indices the E-step's prefetch pass keeps (> _PREFETCH_ROWS)
_TINY = 1e-200  # a linear-domain normalizer below this: the E-step redoes the row in the log domain
# A hop whose largest unshifted transition in a window is below this takes its rows shifted (``_scaled_transitions``):
# the unshifted ones would bring its forward vector within this factor of ``_TINY``.
_UNSCALED_FLOOR = 1e-100
_LN2 = math.log(2.0)
# Whether the E-step keeps a stream's pairs from row to row in rings: each compiled copy of ``_estep`` reads its own
# value (:data:`_ESTEPS`); this one is only the plain Python function's.
_RINGS = True


@dataclass(frozen=True)
class HopParameters:
    """A chain-of-hops head's parameters as the kernels read them.

    Attributes:
        key_means: (H, S, D) float64, hop ``h``'s keys (hop 0's are the single head's).
        prior: (H, N) each hop's position prior in column order (``prior[h, N - 1]`` the most recent);
            ``log_prior`` its log.
        hop_queries: (S, D) float64, the query a hop asks from a position holding symbol ``s`` (hops 2..H).
        inv_two_sigma2: ``1 / (2 sigma2)``; ``gate_const``: ``-D/2 log(2 pi sigma2)``.
        softmax: each transition normalized over the positions it goes to (the reference library's chain) rather
            than a joint Gaussian factor.
        log_emission_ts: (T, S) ``log B`` target-major for a dense emission, else (0, 0); a sparse one's
            ``indptr`` (T + 1,), ``symbols`` (P,), ``log_values`` (P,), ``log_backoff`` (S,), ``log_base`` (T,).
        direct_row, direct_slots: a sparse emission's direct symbol -> pair rows of its most frequent targets
            (:func:`~dist_respattn.model.kernels.per_position.direct_pair_rows`), which the E-step reads instead of
            a binary search; empty for a dense one. Not among :meth:`arrays` (the scoring pass does not read them).
        key_norms, query_norms: (H, S) ``|key_means[h, s]|^2`` and (S,) ``|hop_queries[s]|^2``, which the E-step's
            windows of 8 new positions take their transitions' distances from (``|q|^2 + |k|^2 - 2 q.k``, one product
            a pair). Not among :meth:`arrays` either.
        by_symbol: (S, (H + 1) D) each symbol's keys of every hop then its hop query, one after another (the same
            numbers as ``key_means`` and ``hop_queries``): the E-step's vector code reads its keys and hop queries
            through views of it (:meth:`symbol_views`), so that a token's rows are one run of lines, which its
            prefetch pass fetches in one loop. Not among :meth:`arrays`.
    """

    key_means: np.ndarray
    prior: np.ndarray
    log_prior: np.ndarray
    hop_queries: np.ndarray
    inv_two_sigma2: float
    gate_const: float
    softmax: bool
    log_emission_ts: np.ndarray
    indptr: np.ndarray
    symbols: np.ndarray
    log_values: np.ndarray
    log_backoff: np.ndarray
    log_base: np.ndarray
    direct_row: np.ndarray
    direct_slots: np.ndarray
    key_norms: np.ndarray
    query_norms: np.ndarray
    by_symbol: np.ndarray

    @classmethod
    def build(
        cls, single: Any, keys: np.ndarray, priors: np.ndarray, hop_queries: np.ndarray, softmax: bool
    ) -> HopParameters:
        """From the single head of hop 1 (its keys, prior, gate variance, emission), the later hops' ``keys``
        (H-1, S, D) and ``priors`` (H-1, N), and the hop query table (S, D)."""
        params = single.kernel_parameters
        table = single.emission_table
        if isinstance(table, SparseEmission):
            with np.errstate(divide="ignore"):
                log_values, log_backoff, log_base = (np.log(v) for v in (table.values, table.backoff, table.base))
            sparse = (table.support.indptr, table.support.symbols, log_values, log_backoff, log_base)
            dense = _NO_TABLE
            direct = (params.direct_row, params.direct_slots)
        else:
            sparse = (_NO_INDEX, _NO_SYMBOLS, _NO_VALUES, _NO_VALUES, _NO_VALUES)
            dense = params.log_emission_ts
            direct = (_NO_ROWS, _NO_SLOTS)
        key_means = np.ascontiguousarray(np.concatenate([np.asarray(single.key_means)[None], keys]), dtype=np.float64)
        prior = np.ascontiguousarray(np.concatenate([np.asarray(single.position_prior)[None], priors]), np.float64)
        with np.errstate(divide="ignore"):
            log_prior = np.log(prior)
        hop_queries = np.ascontiguousarray(hop_queries, dtype=np.float64)
        key_norms = np.einsum("hsd,hsd->hs", key_means, key_means)
        query_norms = np.einsum("sd,sd->s", hop_queries, hop_queries)
        n_hops, n_symbols, dim = key_means.shape
        by_symbol = np.empty((n_symbols, n_hops + 1, dim))
        by_symbol[:, :n_hops] = key_means.transpose(1, 0, 2)
        by_symbol[:, n_hops] = hop_queries
        return cls(
            key_means, prior, log_prior, hop_queries, float(params.inv_two_sigma2), float(params.gate_const),
            bool(softmax), dense, *sparse, *direct, key_norms, query_norms, by_symbol.reshape(n_symbols, -1),
        )  # fmt: skip

    def symbol_views(self) -> tuple[np.ndarray, np.ndarray]:
        """``(key_means, hop_queries)`` as strided views of :attr:`by_symbol` ((H, S, D) and (S, D)): the fields'
        numbers."""
        n_hops, n_symbols, dim = self.key_means.shape
        tables = self.by_symbol.reshape(n_symbols, n_hops + 1, dim)
        return tables[:, :n_hops].transpose(1, 0, 2), tables[:, n_hops]

    def arrays(self) -> tuple[Any, ...]:
        """The fields in the kernels' argument order."""
        return (
            self.key_means, self.prior, self.log_prior, self.hop_queries, self.inv_two_sigma2, self.gate_const,
            self.softmax, self.log_emission_ts, self.indptr, self.symbols, self.log_values, self.log_backoff,
            self.log_base,
        )  # fmt: skip


@dataclass
class HopArrays:
    """The additive arrays of the chain's E-step.

    Attributes:
        key_sum: (H, S, D) sum of ``w r q`` per hop and symbol (``q`` the query the hop answered: the row's for
            hop 1, the hop query of the previous hop's token for the later ones); ``key_mass``: (H, S) ``w r``.
        recency_mass: (H, N) responsibility per hop and recency (with a short window's rejected draws).
        emission_count_ts: (T, S) the last hop's responsibility per (target, symbol), dense; (0, 0) when sparse.
        pair_counts: (P,) the same per pair of a sparse emission's support, else empty.
        scalars: (3,) ``[query_sq, n_obs, log_lik]``.
    """

    key_sum: np.ndarray
    key_mass: np.ndarray
    recency_mass: np.ndarray
    emission_count_ts: np.ndarray
    pair_counts: np.ndarray
    scalars: np.ndarray

    @classmethod
    def zeros(cls, n_hops: int, shape: tuple[int, int, int, int], num_pairs: int | None) -> HopArrays:
        """Empty arrays for ``n_hops`` hops over rows of ``shape = (S, N, D, T)``; sparse with ``num_pairs``."""
        s, n, d, t = shape
        return cls(
            np.zeros((n_hops, s, d)), np.zeros((n_hops, s)), np.zeros((n_hops, n)),
            np.zeros((t, s)) if num_pairs is None else _NO_TABLE,
            _NO_VALUES if num_pairs is None else np.zeros(num_pairs), np.zeros(3),
        )  # fmt: skip


@numba.njit(cache=True, nogil=True, inline="always")
def _window_log_total(prior, h, n_pos, m):  # pragma: no cover - compiled
    """``log`` of hop h's prior mass on a window's m most recent positions (0 for a full window, whose prior sums
    to one): what a short window's prior is renormalized by."""
    if m == n_pos:
        return 0.0
    total = 0.0
    for j in range(m):
        total += prior[h, n_pos - m + j]
    return math.log(total) if total > 0.0 else 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def _forward_hop(h, m, softmax, trans, shift, alpha, work):  # pragma: no cover - compiled
    """Hop h's forward step over a window of m positions, from its transitions' exponentials ``trans[h - 1]`` (m*m,
    each source row shifted by ``shift[h - 1]``): with ``softmax`` each row normalized (its shift then 0), then
    ``alpha[h, j] = log sum_i exp(alpha[h - 1, i] + shift_i) trans(i, j)``; ``work`` (m,) is scratch."""
    if softmax:
        for i in range(m):
            total = 0.0
            for j in range(m):
                total += trans[h - 1, i * m + j]
            if total > 0.0:
                for j in range(m):
                    trans[h - 1, i * m + j] /= total
                shift[h - 1, i] = 0.0
    top = -np.inf
    for i in range(m):
        work[i] = alpha[h - 1, i] + shift[h - 1, i]
        top = max(top, work[i])
    for i in range(m):
        work[i] = math.exp(work[i] - top) if top > -np.inf and work[i] > -np.inf else 0.0
    for j in range(m):
        acc = 0.0
        for i in range(m):
            acc += work[i] * trans[h - 1, i * m + j]
        alpha[h, j] = top + math.log(acc) if acc > 0.0 else -np.inf


@numba.njit(cache=True, nogil=True, inline="always")
def _backward_sums(h, m, trans, vector, v0, sums):  # pragma: no cover - compiled
    """The backward step's sums over hop h's transitions, ``sums[h, i] = sum_j trans[h - 1, i * m + j]
    vector[v0 + j]``: of the scaled backward vector in the E-step's linear domain, of ``exp(beta_h - max beta_h)``
    in its log-domain redo (which adds ``shift_i``, the largest beta and the log)."""
    for i in range(m):
        acc = 0.0
        for j in range(m):
            acc += trans[h - 1, i * m + j] * vector[v0 + j]
        sums[h, i] = acc


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _distance(queries, c_query, key_means, hop, c_key):  # pragma: no cover - compiled
    """``||queries[c_query] - key_means[hop, c_key]||^2`` (the sum reassociated, so that it vectorizes, as the
    single head's ``squared_distance``)."""
    total = 0.0
    for d in range(queries.shape[1]):
        v = queries[c_query, d] - key_means[hop, c_key, d]
        total += v * v
    return total


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _distances4(queries, c_query, key_means, hop, c0, c1, c2, c3):  # pragma: no cover - compiled
    """:func:`_distance` of one query to four keys, in one pass over the query."""
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    for d in range(queries.shape[1]):
        q = queries[c_query, d]
        v0 = q - key_means[hop, c0, d]
        v1 = q - key_means[hop, c1, d]
        v2 = q - key_means[hop, c2, d]
        v3 = q - key_means[hop, c3, d]
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
    return a0, a1, a2, a3


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _key_distances4(queries, c0, c1, c2, c3, key_means, hop, c_key):  # pragma: no cover - compiled
    """:func:`_distance` of four queries to one key, in one pass over the key (a new token's column)."""
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    for d in range(queries.shape[1]):
        k = key_means[hop, c_key, d]
        v0 = queries[c0, d] - k
        v1 = queries[c1, d] - k
        v2 = queries[c2, d] - k
        v3 = queries[c3, d] - k
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
    return a0, a1, a2, a3


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _query_distance(y, key_means, c):  # pragma: no cover - compiled
    """``||y - key_means[0, c]||^2``, hop 1's distance of a query ``y`` (D,) (reassociated, as :func:`_distance`)."""
    total = 0.0
    for d in range(y.shape[0]):
        v = y[d] - key_means[0, c, d]
        total += v * v
    return total


@numba.njit(cache=True, nogil=True)
def _prefetch_rows(key_rows, hop_queries, c, n_symbols):  # pragma: no cover - compiled
    """Prefetch symbol ``c``'s key in every hop and its hop query, a cache line (8 numbers) at a time."""
    dim = hop_queries.shape[1]
    for h in range(key_rows.shape[0] // n_symbols):
        for d in range(0, dim, 8):
            prefetch_item(key_rows, h * n_symbols + c, d)
    if key_rows.shape[0] > n_symbols:  # a single hop reads no hop queries
        for d in range(0, dim, 8):
            prefetch_item(hop_queries, c, d)


@numba.njit(cache=True, nogil=True, inline="always")
def _binary_exponent(top, bits, scale):  # pragma: no cover - compiled
    """``(e, 2^-e)`` with ``top = f 2^e``, ``0.5 <= f < 1``, for a normal positive ``top``: a vector whose largest is
    ``top`` scaled by ``2^-e`` (exactly) has its largest in [0.5, 1), and its log scale grows by ``e log 2``, no
    ``log`` taken. ``bits`` int64 scratch (>= 2) and ``scale`` its float64 view."""
    scale[0] = top
    e = ((bits[0] >> 52) & 0x7FF) - 1022
    bits[1] = (1023 - e) << 52
    return e, scale[1]


@numba.njit(cache=True, nogil=True)
def _log_sum(values, m):  # pragma: no cover - compiled
    """``log sum exp values[:m]`` (``-inf`` when every one is)."""
    best = -np.inf
    for i in range(m):
        best = max(best, values[i])
    if best == -np.inf:
        return best
    total = 0.0
    for i in range(m):
        total += math.exp(values[i] - best)
    return best + math.log(total)


@numba.njit(cache=True, nogil=True)
def _chain(
    tokens, lo, hi, t, y, key_means, prior, log_prior, hop_queries, inv_two_sigma2, softmax, log_emission_ts,
    indptr, symbols, log_values, log_backoff, log_base, with_target, alpha, trans, shift, log_e, pair, work,
    flat, bits,
):  # pragma: no cover - compiled  # fmt: skip
    """The forward pass of one window (scoring needs no backward pass). Fills ``alpha[h, j]`` (log forward),
    ``trans[h - 1, i * m + j]`` (linear transition scaled by ``exp(-shift[h - 1, i])``), ``log_e[j]``
    (``log B[c_j, t]``, 0 without the target) and ``pair[j]``. Returns ``(log Z, log Z without the target)``: the
    path sum with and without the last hop's emission (the predictive's normalizer)."""
    n_hops = key_means.shape[0]
    n_pos = prior.shape[1]
    m = hi - lo
    dense = indptr.shape[0] == 0
    # Hop 1: the single head's joint gate log-weights (the prior renormalized over a short window's positions).
    log_total = _window_log_total(prior, 0, n_pos, m)
    for j in range(m):
        c = tokens[lo + j]
        d = 0.0
        for k in range(y.shape[0]):
            v = y[k] - key_means[0, c, k]
            d += v * v
        alpha[0, j] = log_prior[0, n_pos - m + j] - log_total - d * inv_two_sigma2
    # Later hops: the transitions, each row i shifted by its largest log-value so that its exponentials are <= 1.
    for h in range(1, n_hops):
        log_total = _window_log_total(prior, h, n_pos, m)
        # All m * m log-values first, each row shifted by its largest, then one vectorized exponential of them all.
        for i in range(m):
            ci = tokens[lo + i]
            best = -np.inf
            for j in range(m):
                cj = tokens[lo + j]
                lv = (
                    log_prior[h, n_pos - m + j]
                    - log_total
                    - _distance(hop_queries, ci, key_means, h, cj) * inv_two_sigma2
                )
                flat[i * m + j] = lv
                best = max(best, lv)
            shift[h - 1, i] = best
            for j in range(m):
                # A row no position reaches stays all -inf (its exponentials 0), whatever its shift.
                flat[i * m + j] = flat[i * m + j] - best if best > -np.inf else -np.inf
        exp_shifted(flat[: m * m], 0.0, trans[h - 1, : m * m], bits[: m * m])
        _forward_hop(h, m, softmax, trans, shift, alpha, work)
    last = n_hops - 1
    for j in range(m):
        c = tokens[lo + j]
        pair[j] = -1
        if not with_target:
            log_e[j] = 0.0
        elif dense:
            log_e[j] = log_emission_ts[t, c]
        else:
            p = find_pair(indptr, symbols, t, c)
            pair[j] = p
            log_e[j] = log_values[p] if p >= 0 else log_backoff[c] + log_base[t]
    for j in range(m):
        work[j] = alpha[last, j]
    log_z_gate = _log_sum(work, m)
    for j in range(m):
        work[j] = alpha[last, j] + log_e[j]
    log_z = _log_sum(work, m)
    return log_z, log_z_gate


@numba.njit(cache=True, nogil=True)
def _log_domain_row(
    tokens, lo, m, t, w, y, hop_queries, sparse, alpha, trans, shift, log_e, pair, beta, work, back, sums, post,
    gamma, incoming, mass, key_sum, key_mass, recency_mass, emission_count_ts, pair_counts,
):  # pragma: no cover - compiled  # fmt: skip
    """One row's forward–backward and statistics in the log domain, from hop 1's log-weights ``alpha[0]``, the
    transitions (``trans``, ``shift``; a softmax's rows already normalized) and the emission ``log_e``, ``pair``:
    the rows :func:`_estep`'s linear-domain pass cannot scale (a normalizer it would take below ``_TINY``), or
    whose last hop may fall on a pair off a sparse support. Returns ``(status, log Z)``: status 0 when the
    statistics were added, 1 when no path explains the row, 2 when a pair off the support does."""
    n_hops, n_pos = alpha.shape
    last = n_hops - 1
    dim = y.shape[0]
    for h in range(1, n_hops):
        _forward_hop(h, m, False, trans, shift, alpha, work)
    for j in range(m):
        work[j] = alpha[last, j] + log_e[j]
    log_z = _log_sum(work, m)
    for j in range(m):
        beta[last, j] = log_e[j]
    for h in range(last, 0, -1):
        top = -np.inf
        for j in range(m):
            top = max(top, beta[h, j])
        for j in range(m):
            back[h * n_pos + j] = math.exp(beta[h, j] - top) if top > -np.inf and beta[h, j] > -np.inf else 0.0
        _backward_sums(h, m, trans, back, h * n_pos, sums)
        for i in range(m):
            acc = sums[h, i]
            beta[h - 1, i] = shift[h - 1, i] + top + math.log(acc) if acc > 0.0 else -np.inf
    if log_z == -np.inf:
        return 1, log_z
    if sparse:
        for j in range(m):
            if pair[j] < 0 and alpha[last, j] + log_e[j] > -np.inf:
                return 2, log_z
    # Each hop h: gamma_h(j) = exp(alpha_h + beta_h - log Z), the posterior of its position.
    for h in range(n_hops):
        for j in range(m):
            a = alpha[h, j] + beta[h, j]
            post[h, j] = math.exp(a - log_z) if a > -np.inf else 0.0
            gamma[j] = w * post[h, j]
        if h == 0:
            for j in range(m):
                rj = gamma[j]
                c = tokens[lo + j]
                key_mass[0, c] += rj
                for d in range(dim):
                    key_sum[0, c, d] += rj * y[d]
                recency_mass[0, m - 1 - j] += rj
        else:
            # xi(i, j) = gamma_{h-1}(i) trans(i, j) e^beta_j / sum_j' trans(i, j') e^beta_j': every factor
            # bounded (shifted by the largest beta), so no exponential overflows however far the keys lie.
            top = -np.inf
            for j in range(m):
                top = max(top, beta[h, j])
            if top == -np.inf:
                continue
            for i in range(m):
                g = post[h - 1, i]
                s = sums[h, i]
                work[i] = w * g / s if g > 0.0 and s > 0.0 else 0.0
            for j in range(m):
                mass[j] = 0.0
                for d in range(dim):
                    incoming[j, d] = 0.0
            for i in range(m):
                wi = work[i]
                if wi == 0.0:
                    continue
                ci = tokens[lo + i]
                for j in range(m):
                    x = wi * trans[h - 1, i * m + j] * back[h * n_pos + j]
                    if x != 0.0:
                        mass[j] += x
                        for d in range(dim):
                            incoming[j, d] += x * hop_queries[ci, d]
            for j in range(m):
                if back[h * n_pos + j] == 0.0:
                    continue
                cj = tokens[lo + j]
                key_mass[h, cj] += mass[j]
                for d in range(dim):
                    key_sum[h, cj, d] += incoming[j, d]
                recency_mass[h, m - 1 - j] += mass[j]
        if h == last:
            for j in range(m):
                rj = gamma[j]
                if rj != 0.0:
                    if sparse:
                        pair_counts[pair[j]] += rj
                    else:
                        emission_count_ts[t, tokens[lo + j]] += rj
    return 0, log_z


@numba.njit(cache=True, nogil=True)
def _new_pairs(
    hop_queries, query_rows, key_means, key_rows, h, tokens, lo, m, f, f_exps, by_block, inv_two_sigma2, neg, exps,
    at, width, ring_rows, new_at, new_neg, new_exp, bits, scale, block,
):  # pragma: no cover - compiled  # fmt: skip
    """Hop ``h``'s transition factors of the pairs of a window ``tokens[lo : lo + m]`` that the ring does not hold
    yet: every pair with a position at or past ``lo + f``. Pair ``(x, y)`` of stream positions is at
    ``at + (x % ring_rows) * width + y - x + N - 1`` of the flat rings (``at`` hop h's start, ``width = 2N - 1``):
    ``neg`` receives ``-||Q[c_x] - K_h[c_y]||^2 / (2 sigma2)``, ``exps`` its exponential. The distances 8 keys a pass
    (:func:`~dist_respattn.model.kernels.lanes.sq_distances_8`) with ``by_block`` (D a multiple of 8, most of the
    window new): a new position's row, then a new position's column (its key against 8 hop queries a pass: the same
    numbers, ``(a - b)^2 = (b - a)^2`` lane by lane); else pair by pair, a new row four keys a pass. The
    exponentials of the pairs with a position at or past ``lo + f_exps`` (none when it is negative) in one
    vectorized pass (``new_*`` (N * N + 15,) scratch)."""
    n_symbols = key_means.shape[1]
    n_pos = (width + 1) // 2
    mask = ring_rows - 1
    for i in range(f, m):
        x = lo + i
        ci = tokens[x]
        row0 = at + (x & mask) * width + n_pos - 1 - i  # pair (x, lo + j) at row0 + j
        first = 0
        if by_block:
            for jb in range(0, m, LANES):
                nb = min(LANES, m - jb)
                sq_distances_8(hop_queries, ci, key_means, h, tokens, lo + jb, nb, block, 0, inv_two_sigma2)
                for k in range(nb):
                    neg[row0 + jb + k] = -block[k]
            first = m
        while first + 4 <= m:
            k = lo + first
            d0, d1, d2, d3 = _distances4(
                hop_queries, ci, key_means, h, tokens[k], tokens[k + 1], tokens[k + 2], tokens[k + 3]
            )
            neg[row0 + first] = -(d0 * inv_two_sigma2)
            neg[row0 + first + 1] = -(d1 * inv_two_sigma2)
            neg[row0 + first + 2] = -(d2 * inv_two_sigma2)
            neg[row0 + first + 3] = -(d3 * inv_two_sigma2)
            first += 4
        for j in range(first, m):
            neg[row0 + j] = -(_distance(hop_queries, ci, key_means, h, tokens[lo + j]) * inv_two_sigma2)
    # The old positions' pairs with the new ones.
    if by_block and f > 0:
        for j in range(f, m):
            cj = tokens[lo + j]
            for ib in range(0, f, LANES):
                nb = min(LANES, f - ib)
                sq_distances_8(key_rows, h * n_symbols + cj, query_rows, 0, tokens, lo + ib, nb, block, 0,
                               inv_two_sigma2)  # fmt: skip
                for k in range(nb):
                    x = lo + ib + k
                    neg[at + (x & mask) * width + n_pos - 1 - (ib + k) + j] = -block[k]
    else:
        # A new position's column, four old positions' hop queries a pass over its key.
        for j in range(f, m):
            cj = tokens[lo + j]
            i = 0
            while i + 4 <= f:
                x = lo + i
                d0, d1, d2, d3 = _key_distances4(
                    hop_queries, tokens[x], tokens[x + 1], tokens[x + 2], tokens[x + 3], key_means, h, cj
                )
                neg[at + (x & mask) * width + n_pos - 1 - i + j] = -(d0 * inv_two_sigma2)
                neg[at + ((x + 1) & mask) * width + n_pos - 2 - i + j] = -(d1 * inv_two_sigma2)
                neg[at + ((x + 2) & mask) * width + n_pos - 3 - i + j] = -(d2 * inv_two_sigma2)
                neg[at + ((x + 3) & mask) * width + n_pos - 4 - i + j] = -(d3 * inv_two_sigma2)
                i += 4
            while i < f:
                x = lo + i
                neg[at + (x & mask) * width + n_pos - 1 - i + j] = -(
                    _distance(hop_queries, tokens[x], key_means, h, cj) * inv_two_sigma2
                )
                i += 1
    # Their exponentials, gathered into one vectorized pass.
    if f_exps < 0:
        return
    count = 0
    for i in range(m):
        x = lo + i
        row0 = at + (x & mask) * width + n_pos - 1 - i
        for j in range(0 if i >= f_exps else f_exps, m):
            new_at[count] = row0 + j
            new_neg[count] = neg[row0 + j]
            count += 1
    # Padded to 16, the vectorized loop's step: fewer would run one at a time.
    padded = min((count + 15) & ~15, new_neg.shape[0])
    for k in range(count, padded):
        new_neg[k] = 0.0
    exp_nonpositive_range(new_neg, 0, new_exp, 0, padded, bits, scale)
    for k in range(count):
        exps[new_at[k]] = new_exp[k]


@numba.njit(cache=True, nogil=True, inline="always")
def _scaled_transitions(
    h, lo, m, log_prior, log_total, softmax, neg, at, width, ring_rows, flat, trans_flat, trans, shift, bits, scale
):  # pragma: no cover - compiled  # fmt: skip
    """Hop h's transitions of a window from the ring of its pairs' ``-d / (2 sigma2)`` (``neg``, as
    :func:`_new_pairs` lays it out), each source row ``i`` shifted by its largest log-value ``shift[h - 1, i]`` so that
    its exponentials are <= 1 (with ``softmax`` each row then normalized, its shift 0): ``trans[h - 1, i * m + j]``,
    ``trans`` a (H - 1, N * N) view of ``trans_flat``."""
    n_pos = (width + 1) // 2
    mask = ring_rows - 1
    # All m * m log-values first, each row shifted by its largest, then one vectorized exponential of them all.
    for i in range(m):
        row0 = at + ((lo + i) & mask) * width + n_pos - 1 - i
        best = -np.inf
        for j in range(m):
            lv = log_prior[h, n_pos - m + j] - log_total + neg[row0 + j]
            flat[i * m + j] = lv
            best = max(best, lv)
        shift[h - 1, i] = best
        for j in range(m):
            # A row no position reaches stays all -inf (its exponentials 0), whatever its shift.
            flat[i * m + j] = flat[i * m + j] - best if best > -np.inf else -np.inf
    exp_nonpositive_range(flat, 0, trans_flat, (h - 1) * n_pos * n_pos, m * m, bits, scale)
    if softmax:
        _normalize_rows(h, m, trans, shift)


@numba.njit(cache=True, nogil=True, inline="always")
def _normalize_rows(h, m, trans, shift):  # pragma: no cover - compiled
    """A softmax's transitions: each source row of ``trans[h - 1]`` (m * m) divided by its sum, its shift 0."""
    for i in range(m):
        total = 0.0
        for j in range(m):
            total += trans[h - 1, i * m + j]
        if total > 0.0:
            for j in range(m):
                trans[h - 1, i * m + j] /= total
            shift[h - 1, i] = 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def _unscaled_transitions(h, lo, m, window_prior, exps, at, width, ring_rows, trans, shift, col_max):
    """Hop h's transitions of a window unshifted, ``trans[h - 1, i * m + j] = pi'_j exp(-d_ij / (2 sigma2))`` from the
    ring of its pairs' exponentials (``pi'`` the prior renormalized over the window, ``window_prior[h, m]``), its
    shifts 0: no exponential a row, the pairs the previous window held keep theirs. Returns the largest."""
    n_pos = (width + 1) // 2
    mask = ring_rows - 1
    for j in range(m):
        col_max[j] = 0.0
    for i in range(m):
        row0 = at + ((lo + i) & mask) * width + n_pos - 1 - i
        for j in range(m):
            v = window_prior[h, m, j] * exps[row0 + j]
            trans[h - 1, i * m + j] = v
            col_max[j] = v if v > col_max[j] else col_max[j]
        shift[h - 1, i] = 0.0
    best = 0.0
    for j in range(m):
        best = max(best, col_max[j])
    return best


@numba.njit(cache=True, nogil=True, inline="always")
def _forward_sums(h, m, n_pos, src_weight, trans, fwd):  # pragma: no cover - compiled
    """``fwd[h * N + j] = sum_i src_weight[h, i] trans[h - 1, i * m + j]``, the linear forward step's products."""
    for j in range(m):
        fwd[h * n_pos + j] = 0.0
    for i in range(m):
        u = src_weight[h, i]
        if u != 0.0:
            for j in range(m):
                fwd[h * n_pos + j] += u * trans[h - 1, i * m + j]


@numba.njit(cache=True, nogil=True, inline="always")
def _pair_weights(h, m, n_pos, inv, src_weight, trans, bwd, coef):  # pragma: no cover - compiled
    """``coef[i * m + j] = inv src_weight[h, i] trans[h - 1, i * m + j] bwd[h * N + j]``: hop h's pair posteriors."""
    for i in range(m):
        u = src_weight[h, i] * inv
        for j in range(m):
            coef[i * m + j] = u * trans[h - 1, i * m + j] * bwd[h * n_pos + j]


@numba.njit(cache=True, nogil=True, inline="always")
def _ring_add(h, lo, m, n_pos, ring_mask, coef, ring):  # pragma: no cover - compiled
    """The pair weights of a stream's window into the ring by stream position: ``ring[h - 1, (lo + i) % R,
    j - i + N - 1] += coef[i * m + j]``."""
    for i in range(m):
        slot = (lo + i) & ring_mask
        for j in range(m):
            ring[h - 1, slot, j - i + n_pos - 1] += coef[i * m + j]


@numba.njit(cache=True, nogil=True)
def _find_pairs(indptr, symbols, t, tokens, lo, m, out):  # pragma: no cover - compiled
    """``out[k]`` = the index of pair ``(tokens[lo + k], t)`` in a sparse support, or -1, for ``k < m``: the
    :func:`~dist_respattn.model.kernels.per_position.find_pair` of each, as branch-free lower bounds taken in step
    (each halving done for every symbol before the next), so that their loads overlap."""
    start = indptr[t]
    end = indptr[t + 1]
    for k in range(m):
        out[k] = start
    n = end - start
    while n > 1:
        half = n >> 1
        for k in range(m):
            b = out[k]
            out[k] = b + half if symbols[b + half] < tokens[lo + k] else b
        n -= half
    for k in range(m):
        b = out[k]
        c = tokens[lo + k]
        if n > 0 and symbols[b] < c:
            b += 1
        out[k] = b if b < end and symbols[b] == c else -1


@numba.njit(cache=True, nogil=True, inline="always")
def _distinct(tokens, at, n):  # pragma: no cover - compiled
    """Whether ``tokens[at : at + n]`` are all different."""
    for a in range(1, n):
        for b in range(a):
            if tokens[at + a] == tokens[at + b]:
                return False
    return True


@numba.njit(cache=True, nogil=True)
def _flush_sources(ring, x_lo, x_hi, tokens, hop_queries, key_sum, n_pos):  # pragma: no cover - compiled
    """The pair weights ``ring[h - 1, x % R, y - x + N - 1]`` of the sources ``x`` in ``[x_lo, x_hi)`` (stream
    positions) into the key sums, ``key_sum[h, c_y] += weight * Q[c_x]``; their slots emptied."""
    mask = ring.shape[1] - 1
    dim = hop_queries.shape[1]
    for x in range(x_lo, x_hi):
        slot = x & mask
        cx = tokens[x]
        for g in range(ring.shape[0]):
            for off in range(ring.shape[2]):
                v = ring[g, slot, off]
                if v != 0.0:
                    cy = tokens[x + off - (n_pos - 1)]
                    for d in range(dim):
                        key_sum[g + 1, cy, d] += v * hop_queries[cx, d]
                    ring[g, slot, off] = 0.0


def _estep(
    tokens, begin, end, target, query_table, query_index, weights, narrow_table,
    key_means, prior, log_prior, hop_queries, inv_two_sigma2, gate_const, softmax, log_emission_ts, indptr,
    symbols, log_values, log_backoff, log_base, direct_row, direct_slots, key_norms, query_norms, by_symbol,
    key_view, query_view, key_sum, key_mass, recency_mass, emission_count_ts, pair_counts, scalars, impossible,
):  # pragma: no cover - compiled  # fmt: skip
    """The E-step over the rows in order. Returns ``(n_impossible, n_outside, n_log_domain)``: rows no path
    explains (the first written to ``impossible``), rows whose last hop falls on a pair off a sparse support, and
    rows redone in the log domain. Compiled twice (:data:`_ESTEPS`): with the rings below (``_RINGS``) and without.

    The forward–backward of :func:`_chain`, in the linear domain: each hop's forward and backward vectors scaled by
    one number (the power of two at their largest, exactly), so that a row takes one ``log`` and its exponentials in
    vectorized batches (hop 1's log-weights, each hop's transitions and row shifts, the emission) instead of some
    fifty scalar ``exp`` and ``log`` calls. Every factor is then <= 1, so a path term that underflows is below
    1e-308 and a row whose normalizers all exceed ``_TINY`` loses nothing measurable; any other row (and a row whose
    last hop may fall off a sparse support) is redone in the log domain by :func:`_log_domain_row`. With ``u_h(i) =
    F_{h-1}(i) exp(shift_h(i) - max shift_h)`` (``F`` the scaled forward vector), ``s_h(i) = sum_j trans_h(i, j)
    G_h(j)`` (``G`` the scaled backward vector) and ``D_h = sum_i u_h(i) s_h(i)``: ``gamma_{h-1}(i) = u_h(i) s_h(i)
    / D_h``, ``xi_h(i, j) = u_h(i) trans_h(i, j) G_h(j) / D_h``, and the last hop's ``gamma(j) = F(j) G(j) / sum_j
    F(j) G(j)``.

    A joint Gaussian factor's transitions are taken unshifted, ``trans_h(i, j) = pi'_j exp(-d_ij / (2 sigma2))``
    (``pi'`` the prior renormalized over the window, shifts 0), from rings of each pair of stream positions' ``-d /
    (2 sigma2)`` and its exponential: a stream's window (N - 1 tokens the previous one's) computes the distances and
    exponentials of its new token's 2m - 1 pairs a hop and no other exponential of its transitions. The same path
    terms as the shifted ones up to one factor ``exp(max shift)`` a hop, so a hop whose largest transition in the
    window is below ``_UNSCALED_FLOOR`` (or a softmax's) is shifted as before, and a row redone in the log domain
    gets shifted transitions first. A window none of whose pairs the previous one held (sampled rows, a document's
    first) takes its transitions shifted too: all m * m exponentials either way, in one pass (a joint factor's
    window of 8 such positions shifted by the hop's largest log-value, one number for every source, as unshifted
    ones are; its rows each by their own before a log-domain redo); with D a multiple of 8 and the next row's window
    not sliding into it, its distances go straight into a plain table, past the rings (whose writes and reads made
    sampled rows of 3 hops ~12% slower), the rings then holding none. On a stream the hop-query sums go through a
    ring of pair weights by stream position (:func:`_flush_sources`); a sparse emission is read through its direct
    rows, a target without one searched in the prefetch pass. A window of 8 positions runs its m * m loops with a
    literal 8 (vector code). The vector code (kernels.lanes) reads the keys and hop queries through ``key_view`` and
    ``query_view``, views of ``by_symbol`` (S, (H + 1) D), each symbol's keys of every hop and its hop query in one
    run of lines, which the prefetch pass fetches in one loop for a window that does not slide (on a stream, whose
    distances are pair by pair, the tables' rows).

    The rings pay only where the vector code cannot run: :func:`hop_estep` takes the copy without them when D is a
    multiple of 8, and every window then takes the vector path, sliding or not (a stream's window recomputes its 64
    pairs a hop in vector code rather than take its new token's 15 from the rings, and adds its own pair weights
    into the key sums). That copy is faster on every kind of row, the more so on a stream's: ``bench_hops.py``, ns a
    row with and without the rings, 2 hops 1264 against 870 on a stream's rows and 1253 against 1088 on sampled
    ones; 3 hops 2130 against 1403 and 1802 against 1646."""
    n_hops = key_means.shape[0]
    n_pos = prior.shape[1]
    dim = key_means.shape[2]
    sparse = indptr.shape[0] > 0
    with_direct = direct_row.shape[0] > 0
    wide = narrow_table.shape[0] == 0  # the queries in query_table (float64), else in narrow_table (float32)
    later = max(n_hops - 1, 1)
    alpha = np.empty((n_hops, n_pos))
    beta = np.empty((n_hops, n_pos))
    trans_flat = np.empty(later * n_pos * n_pos)
    trans = trans_flat.reshape(later, n_pos * n_pos)
    flat = np.empty(n_pos * n_pos)
    shift_flat = np.empty(later * n_pos)
    shift = shift_flat.reshape(later, n_pos)
    log_e = np.empty(n_pos)
    pair = np.empty(n_pos, dtype=np.int64)
    work = np.empty(n_pos)
    bits = np.empty(n_pos * n_pos + 15, dtype=np.int64)
    scale = bits.view(np.float64)
    gamma = np.empty(n_pos)
    post = np.empty((n_hops, n_pos))
    back = np.empty(n_hops * n_pos)
    sums = np.empty((n_hops, n_pos))
    incoming = np.empty((n_pos, dim))
    mass = np.empty(n_pos)
    # The linear-domain vectors: F (forward), G (backward), u (forward weight of each transition's source).
    # (flat, hop h at h * N: the exponentials are written at offsets, no view made a row)
    fwd = np.empty(n_hops * n_pos)
    bwd = np.empty(n_hops * n_pos)
    src_weight = np.empty((n_hops, n_pos))
    exp_shift = np.empty(n_hops * n_pos)
    sums_lin = np.empty((n_hops, n_pos))
    norm = np.empty(n_hops)
    tmp = np.empty(n_pos)
    coef = np.empty(n_pos * n_pos)
    y = np.empty(dim)
    # With D a multiple of 8 the distances and the hop-query sums run as 8-lane vector code (kernels.lanes).
    lanes = dim % LANES == 0
    block = np.empty(LANES)
    bias_of = np.empty((n_hops, LANES))  # each later hop's log prior over a window of 8 positions
    query_rows = hop_queries.reshape(1, hop_queries.shape[0], dim)  # the hop queries as a one-hop key table
    y_row = y.reshape(1, dim)  # the row's query as a table of one
    ahead_pairs = np.empty((_AHEAD_SLOTS, n_pos), dtype=np.int64)  # the pairs the prefetch pass found, by row
    # A stream's windows slide: the pair weights xi_h(x, y) of stream positions x (source) and y are summed over
    # the rows that hold both, and each source's hop query is added into the key sums once, when no later row
    # can hold it (``pend_lo..pend_hi``: the sources still in the ring).
    ring_rows = 1
    while ring_rows < 2 * n_pos:
        ring_rows *= 2
    ring = np.zeros((later, ring_rows, 2 * n_pos - 1))
    ring_mask = ring_rows - 1
    pend_lo = 0
    pend_hi = 0
    prev_lo = -1
    prev_hi = -1
    # Each later hop's transition factors of the pairs of stream positions of the windows, laid out as ``ring``
    # (flat, hop h's from (h - 1) * ring_rows * width): ``-d / (2 sigma2)`` and its exponential. A stream's next window
    # computes its new token's pairs only (2m - 1 a hop, not m^2); ``held_lo..held_hi`` the positions they hold.
    width = 2 * n_pos - 1
    neg_ring = np.zeros(later * ring_rows * width)
    exp_ring = np.zeros(later * ring_rows * width)
    held_lo = -1
    held_hi = -1
    exps_held = False  # whether exp_ring holds the exponentials of the pairs of held_lo..held_hi too
    new_at = np.empty(n_pos * n_pos, dtype=np.int64)
    plain = np.empty(n_pos * (width - 1) + LANES)  # a fresh window's -d / (2 sigma2), pair (i, j) at i * (2N - 2) + j
    new_neg = np.empty(n_pos * n_pos + 15)
    new_exp = np.empty(n_pos * n_pos + 15)
    unscaled = np.zeros(n_hops, dtype=np.bool_)  # whose transitions this row have one shift for every source
    # Each hop's position prior renormalized over a window of m positions: window_prior[h, m, j].
    window_prior = np.zeros((n_hops, n_pos + 1, n_pos))
    for h in range(n_hops):
        for mm in range(1, n_pos + 1):
            log_total = _window_log_total(prior, h, n_pos, mm)
            for j in range(mm):
                window_prior[h, mm, j] = math.exp(log_prior[h, n_pos - mm + j] - log_total)
    # The Gaussian normalizers in the log-likelihood: hop 1's, and each later hop's unless it is a softmax.
    consts = gate_const * (1 if softmax else n_hops)
    n_impossible = 0
    n_outside = 0
    n_log_domain = 0
    query_sq = 0.0
    n_obs = 0.0
    log_lik = 0.0
    n_rows = target.shape[0]
    n_symbols = key_means.shape[1]
    key_rows = key_means.reshape(n_hops * n_symbols, dim)  # every hop's keys as rows, for the prefetches
    symbol_lines = by_symbol.shape[1] if n_hops > 1 else dim  # a single hop reads no hop queries
    sum_rows = key_sum.reshape(n_hops * n_symbols, dim)
    last = n_hops - 1
    for row in range(n_rows):
        ahead = row + _PREFETCH_ROWS
        if ahead < n_rows:
            # The emission cells a later row reads and updates, scattered over tables larger than cache, and its
            # tokens' keys and hop queries (those its predecessor's window did not hold: they were fetched for
            # it): their misses then overlap with this row's work. A sparse emission's direct row cells of the row
            # twice as far, then, here, the values and counts their pair indices name.
            lo_a = begin[ahead]
            hi_a = end[ahead]
            t_a = target[ahead]
            r_a = direct_row[t_a] if with_direct else -1
            lo_p = begin[ahead - 1] if ahead > 0 else 0
            m_p = end[ahead - 1] - lo_p if ahead > 0 else 0
            offset = m_p - (hi_a - lo_a - 1)
            slides_ahead = ahead > 0 and lo_p < lo_a < lo_p + m_p
            if sparse and r_a < 0:
                # A target without a direct row: the binary searches of all its window's symbols now, in step (their
                # loads overlap, no branch on a comparison), the pairs' cells' misses with this row's work.
                _find_pairs(indptr, symbols, t_a, tokens, lo_a, hi_a - lo_a, ahead_pairs[ahead % _AHEAD_SLOTS])
            for x in range(lo_a, hi_a):
                c = tokens[x]
                if not sparse:
                    prefetch_item(log_emission_ts, t_a, c)
                    prefetch_item(emission_count_ts, t_a, c)
                else:
                    if r_a >= 0:
                        p_a = max(direct_slots[r_a, c], 0)  # -1: off the support
                    else:
                        p_a = max(ahead_pairs[ahead % _AHEAD_SLOTS, x - lo_a], 0)
                    prefetch_element(log_values, p_a)
                    prefetch_element(pair_counts, p_a)
                k = x - lo_a + offset
                if not (0 <= k < m_p and tokens[lo_p + k] == c):
                    if not (_RINGS and slides_ahead):
                        # Its keys of every hop and its hop query, as the vector code reads them: one run of lines.
                        for d in range(0, symbol_lines, 8):
                            prefetch_item(by_symbol, c, d)
                    else:
                        _prefetch_rows(key_rows, hop_queries, c, n_symbols)
                    if slides_ahead:
                        # On a stream, the one new token's rows of the sums too (for every token of a sampled
                        # window, that many lines at once would wait on each other).
                        for g in range(n_hops):
                            for d in range(0, dim, 8):
                                prefetch_item(sum_rows, g * n_symbols + c, d)
                            prefetch_item(key_mass, g, c)
            far = row + 2 * _PREFETCH_ROWS
            if far < n_rows:
                # Its query, widened when the row comes.
                if wide:
                    prefetch_row(query_table, query_index[far])
                else:
                    prefetch_row(narrow_table, query_index[far])
            if with_direct and far < n_rows:
                r_f = direct_row[target[far]]
                if r_f >= 0:
                    for x in range(begin[far], end[far]):
                        prefetch_item(direct_slots, r_f, tokens[x])
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        t = target[row]
        q = query_index[row]
        if pend_hi > pend_lo:
            if lo < pend_lo or lo >= pend_hi:
                _flush_sources(ring, pend_lo, pend_hi, tokens, hop_queries, key_sum, n_pos)
                pend_hi = pend_lo
            elif lo > pend_lo:
                _flush_sources(ring, pend_lo, lo, tokens, hop_queries, key_sum, n_pos)
                pend_lo = lo
        sliding = _RINGS and prev_lo < lo < prev_hi  # the window moved forward within the previous one's tokens
        prev_lo = lo
        prev_hi = hi
        yy = 0.0
        for d in range(dim):
            v = query_table[q, d] if wide else np.float64(narrow_table[q, d])
            y[d] = v
            yy += v * v
        # -- hop 1's log-weights, the transitions, the emission --
        # The pairs of stream positions the rings hold: the previous row's window's, when this one starts inside it (a
        # stream's next window, a document's first ones growing); the first ``held`` positions have theirs.
        held = 0
        fresh = False
        if n_hops > 1:
            if _RINGS and held_lo <= lo < held_hi:
                held = min(held_hi, hi) - lo
            # Without the rings every window, with them a window of new pairs that the next row's does not slide into
            # (sampled rows): its distances go straight into ``plain`` (pair (i, j) at i * (2N - 2) + j), or for 8
            # positions into registers, the rings untouched and no longer holding a window.
            fresh = lanes and (not _RINGS or (held == 0 and not (row + 1 < n_rows and lo <= begin[row + 1] < hi)))
            held_lo = -1 if fresh else lo
            held_hi = -1 if fresh else hi
        # Hop 1's and the transitions' distances 8 keys a pass when most of the window's tokens are new (on a
        # stream, one is: its 15 new distances a hop are cheaper pair by pair).
        block_rows = lanes and 2 * (m - held) > m
        log_total = _window_log_total(prior, 0, n_pos, m)
        if block_rows:
            for jb in range(0, m, LANES):
                nb = min(LANES, m - jb)
                sq_distances_8(y_row, 0, key_view, 0, tokens, lo + jb, nb, block, 0, inv_two_sigma2)
                for k in range(nb):
                    alpha[0, jb + k] = log_prior[0, n_pos - m + jb + k] - log_total - block[k]
        else:
            for j in range(m):
                d2 = _query_distance(y, key_means, tokens[lo + j])
                alpha[0, j] = log_prior[0, n_pos - m + j] - log_total - d2 * inv_two_sigma2
        # A joint Gaussian factor's transitions unshifted when the window holds pairs the previous one's did (their
        # exponentials kept), unless a hop's are all too small for it; a window of new pairs takes them shifted, its
        # m * m exponentials in one pass either way (the next window then computes all of its pairs' if it slides).
        with_exps = not softmax and held > 0
        f_exps = (held if exps_held else 0) if with_exps else -1
        for h in range(1, n_hops):
            at = (h - 1) * ring_rows * width
            if fresh and m == LANES:
                # Each source's 8 distances, log-values, largest and shifted exponentials in registers, one pass of
                # vector code for the window (what the distances into ``plain`` and _scaled_transitions below give to
                # rounding: each distance |q|^2 + |k|^2 - 2 q.k from the symbols' norms, one product a pair).
                log_total = _window_log_total(prior, h, n_pos, LANES)
                bias = bias_of[h]
                for j in range(LANES):
                    bias[j] = log_prior[h, n_pos - LANES + j] - log_total
                # A joint factor's rows all shifted by the hop's largest log-value (one factor for the hop, as unshifted
                # transitions are: no exponential of the row shifts in the forward pass); a softmax's each by its own.
                transition_dots_8(
                    query_view, query_norms, key_view, key_norms, h, tokens, lo, -inv_two_sigma2, bias, not softmax,
                    trans_flat, (h - 1) * n_pos * n_pos, shift_flat, (h - 1) * n_pos,
                )  # fmt: skip
                if softmax:
                    _normalize_rows(h, LANES, trans, shift)
                unscaled[h] = not softmax
                continue
            if fresh:
                # Row i's distances 8 keys a pass, scaled by -1 / (2 sigma2) (the ring's numbers exactly).
                for i in range(m):
                    for jb in range(0, m, LANES):
                        sq_distances_8(query_view, tokens[lo + i], key_view, h, tokens, lo + jb, min(LANES, m - jb),
                                       plain, i * (width - 1) + jb, -inv_two_sigma2)  # fmt: skip
            elif held < m or f_exps == 0:
                _new_pairs(
                    hop_queries, query_rows, key_means, key_rows, h, tokens, lo, m, held, f_exps, block_rows,
                    inv_two_sigma2, neg_ring, exp_ring, at, width, ring_rows, new_at, new_neg, new_exp, bits, scale,
                    block,
                )  # fmt: skip
            # (A window of 8 positions passes a literal 8: the inlined loops then run as vector code.)
            largest = 0.0
            if with_exps and m == LANES:
                largest = _unscaled_transitions(
                    h, lo, LANES, window_prior, exp_ring, at, width, ring_rows, trans, shift, work
                )  # fmt: skip
            elif with_exps:
                largest = _unscaled_transitions(
                    h, lo, m, window_prior, exp_ring, at, width, ring_rows, trans, shift, work
                )  # fmt: skip
            unscaled[h] = with_exps and largest >= _UNSCALED_FLOOR
            if not unscaled[h]:
                # ``plain`` read through the rings' indexing: window start 0 and offset 1 - N put pair (i, j) at
                # i * (width - 1) + j.
                _scaled_transitions(
                    h, 0 if fresh else lo, m, log_prior, _window_log_total(prior, h, n_pos, m), softmax,
                    plain if fresh else neg_ring, 1 - n_pos if fresh else at, width, ring_rows, flat, trans_flat, trans,
                    shift, bits, scale,
                )  # fmt: skip
        exps_held = with_exps
        t_row = direct_row[t] if with_direct else -1
        searched = row >= _PREFETCH_ROWS  # the prefetch pass found this row's pairs (a target without a direct row)
        off_support = False
        for j in range(m):
            c = tokens[lo + j]
            pair[j] = -1
            if not sparse:
                log_e[j] = log_emission_ts[t, c]
            else:
                if t_row >= 0:
                    p = np.int64(direct_slots[t_row, c])
                elif searched:
                    p = ahead_pairs[row % _AHEAD_SLOTS, j]
                else:
                    p = find_pair(indptr, symbols, t, c)
                pair[j] = p
                if p >= 0:
                    log_e[j] = log_values[p]
                else:
                    log_e[j] = log_backoff[c] + log_base[t]
                    off_support = True
        # -- the forward-backward in the linear domain --
        ok = not off_support
        log_scale = -np.inf
        exponent = 0  # the forward vector's powers of two (log_scale's other part, exponent log 2)
        if ok:
            top = -np.inf
            for j in range(m):
                top = max(top, alpha[0, j])
            ok = top > -np.inf
            log_scale = top
        if ok:
            for j in range(m):
                tmp[j] = alpha[0, j] - top
            exp_nonpositive_range(tmp, 0, fwd, 0, m, bits, scale)
        for h in range(1, n_hops):
            if not ok:
                break
            if unscaled[h]:
                # One shift for every source (0 when unshifted): the sources' weights are the forward vector.
                for i in range(m):
                    exp_shift[h * n_pos + i] = 1.0
                    src_weight[h, i] = fwd[(h - 1) * n_pos + i]
                log_scale += shift[h - 1, 0]
            else:
                top = -np.inf
                for i in range(m):
                    top = max(top, shift[h - 1, i])
                if top == -np.inf:
                    ok = False
                    break
                for i in range(m):
                    tmp[i] = shift[h - 1, i] - top
                exp_nonpositive_range(tmp, 0, exp_shift, h * n_pos, m, bits, scale)
                for i in range(m):
                    src_weight[h, i] = fwd[(h - 1) * n_pos + i] * exp_shift[h * n_pos + i]
                log_scale += top
            if m == LANES:
                _forward_sums(h, LANES, n_pos, src_weight, trans, fwd)
            else:
                _forward_sums(h, m, n_pos, src_weight, trans, fwd)
            if h < last:
                top = 0.0
                for j in range(m):
                    top = max(top, fwd[h * n_pos + j])
                if not top > _TINY:
                    ok = False
                    break
                # Scaled by a power of two (exactly): its exponent counted, no log taken a hop.
                e, factor = _binary_exponent(top, bits, scale)
                for j in range(m):
                    fwd[h * n_pos + j] *= factor
                exponent += e
        log_z = -np.inf
        if ok:
            top = -np.inf
            for j in range(m):
                top = max(top, log_e[j])
            ok = top > -np.inf
            if ok:
                for j in range(m):
                    tmp[j] = log_e[j] - top
                exp_nonpositive_range(tmp, 0, bwd, last * n_pos, m, bits, scale)
                total = 0.0
                for j in range(m):
                    total += fwd[last * n_pos + j] * bwd[last * n_pos + j]
                ok = total > _TINY
                norm[last] = total
                log_z = log_scale + exponent * _LN2 + top + math.log(total) if ok else -np.inf
        if ok:
            for h in range(last, 0, -1):
                # (No literal 8 here: a sum a source, its 8-term loop would be unrolled into scalar code.)
                _backward_sums(h, m, trans, bwd, h * n_pos, sums_lin)
                total = 0.0
                for i in range(m):
                    total += src_weight[h, i] * sums_lin[h, i]
                if not total > _TINY:
                    ok = False
                    break
                norm[h - 1] = total
                if h > 1:
                    top = 0.0
                    for i in range(m):
                        bwd[(h - 1) * n_pos + i] = exp_shift[h * n_pos + i] * sums_lin[h, i]
                        top = max(top, bwd[(h - 1) * n_pos + i])
                    if not top > _TINY:
                        ok = False
                        break
                    e, factor = _binary_exponent(top, bits, scale)
                    for i in range(m):
                        bwd[(h - 1) * n_pos + i] *= factor
        if not ok:
            n_log_domain += 1
            # The log domain from shifted transitions: unshifted ones may have lost a path's factor below 1e-308.
            for h in range(1, n_hops):
                if unscaled[h] and fresh and m == LANES:
                    # Each source's row shifted by its own largest log-value, as a softmax's are.
                    transition_dots_8(
                        query_view, query_norms, key_view, key_norms, h, tokens, lo, -inv_two_sigma2, bias_of[h],
                        False, trans_flat, (h - 1) * n_pos * n_pos, shift_flat, (h - 1) * n_pos,
                    )  # fmt: skip
                elif unscaled[h]:
                    _scaled_transitions(
                        h, lo, m, log_prior, _window_log_total(prior, h, n_pos, m), softmax, neg_ring,
                        (h - 1) * ring_rows * width, width, ring_rows, flat, trans_flat, trans, shift, bits, scale,
                    )  # fmt: skip
            status, log_z = _log_domain_row(
                tokens, lo, m, t, w, y, hop_queries, sparse, alpha, trans, shift, log_e, pair, beta, work, back,
                sums, post, gamma, incoming, mass, key_sum, key_mass, recency_mass, emission_count_ts, pair_counts,
            )  # fmt: skip
            if status == 1:
                if n_impossible < impossible.shape[0]:
                    impossible[n_impossible] = row
                n_impossible += 1
                continue
            if status == 2:
                n_outside += 1
                continue
        else:
            # -- the statistics --
            for h in range(n_hops):
                if h == last:
                    inv = w / norm[last]
                    for j in range(m):
                        gamma[j] = inv * fwd[last * n_pos + j] * bwd[last * n_pos + j]
                else:
                    inv = w / norm[h]
                    for i in range(m):
                        gamma[i] = inv * src_weight[h + 1, i] * sums_lin[h + 1, i]
                if h == 0:
                    for j in range(m):
                        rj = gamma[j]
                        c = tokens[lo + j]
                        key_mass[0, c] += rj
                        for d in range(dim):
                            key_sum[0, c, d] += rj * y[d]
                        recency_mass[0, m - 1 - j] += rj
                else:
                    for j in range(m):
                        rj = gamma[j]
                        key_mass[h, tokens[lo + j]] += rj
                        recency_mass[h, m - 1 - j] += rj
                    # key_sum_h[c_j] += sum_i xi_h(i, j) Q[c_i]: each source's hop query once, into every j.
                    inv = w / norm[h - 1]
                    if m == LANES:
                        _pair_weights(h, LANES, n_pos, inv, src_weight, trans, bwd, coef)
                    else:
                        _pair_weights(h, m, n_pos, inv, src_weight, trans, bwd, coef)
                    if sliding and m == LANES:
                        _ring_add(h, lo, LANES, n_pos, ring_mask, coef, ring)
                    elif sliding:
                        _ring_add(h, lo, m, n_pos, ring_mask, coef, ring)
                    elif lanes:
                        # A window of 8 distinct tokens: its 8 j's rows in one pass over the sources (each source's
                        # hop query loaded once for all 8), 16 dimensions of each held in registers; else each j's
                        # row 8 dimensions a vector, the m sources added into them in registers.
                        j = 0
                        while j + 8 <= m and _distinct(tokens, lo + j, 8):
                            add_window_rows_8(key_sum, h, query_view, tokens, lo, m, coef, j, m)
                            j += 8
                        while j < m:
                            add_weighted_rows(key_sum, h, tokens[lo + j], query_view, tokens, lo, m, coef, j, m)
                            j += 1
                    else:
                        # Four sources at a time into each j's row: a quarter of the read-modify-writes of the row.
                        for j in range(m):
                            cj = tokens[lo + j]
                            i = 0
                            while i + 4 <= m:
                                x0 = coef[i * m + j]
                                x1 = coef[(i + 1) * m + j]
                                x2 = coef[(i + 2) * m + j]
                                x3 = coef[(i + 3) * m + j]
                                c0 = tokens[lo + i]
                                c1 = tokens[lo + i + 1]
                                c2 = tokens[lo + i + 2]
                                c3 = tokens[lo + i + 3]
                                for d in range(dim):
                                    key_sum[h, cj, d] += (x0 * hop_queries[c0, d] + x1 * hop_queries[c1, d]) + (
                                        x2 * hop_queries[c2, d] + x3 * hop_queries[c3, d]
                                    )
                                i += 4
                            while i < m:
                                x = coef[i * m + j]
                                ci = tokens[lo + i]
                                for d in range(dim):
                                    key_sum[h, cj, d] += x * hop_queries[ci, d]
                                i += 1
                if h == last:
                    for j in range(m):
                        rj = gamma[j]
                        if rj != 0.0:
                            if sparse:
                                pair_counts[pair[j]] += rj
                            else:
                                emission_count_ts[t, tokens[lo + j]] += rj
        if ok and sliding and n_hops > 1:
            pend_hi = max(pend_hi, hi) if pend_hi > pend_lo else hi
            pend_lo = lo
        if m < n_pos:
            # The masked positions are draws each hop rejected (see dist_respattn.model.buckets).
            for h in range(n_hops):
                total = 0.0
                for j in range(m):
                    total += prior[h, n_pos - m + j]
                if total > 0.0:
                    for r in range(m, n_pos):
                        recency_mass[h, r] += w * prior[h, n_pos - 1 - r] / total
        query_sq += w * yy
        n_obs += w
        log_lik += w * (log_z + consts)
    _flush_sources(ring, pend_lo, pend_hi, tokens, hop_queries, key_sum, n_pos)
    scalars[0] += query_sq
    scalars[1] += n_obs
    scalars[2] += log_lik
    return n_impossible, n_outside, n_log_domain


#: The E-step compiled with the rings (``True``: for D not a multiple of 8) and without, by that setting.
_ESTEPS = {
    rings: njit_with_constants(
        _estep,
        "_estep_with_rings" if rings else "_estep",
        {"_RINGS": rings},
        cache=True,
        nogil=True,
        fastmath={"contract"},
    )
    for rings in (False, True)
}


@numba.njit(cache=True, nogil=True)
def _score(
    tokens, begin, end, target, query_table, query_index, weights,
    key_means, prior, log_prior, hop_queries, inv_two_sigma2, gate_const, softmax, log_emission_ts, indptr,
    symbols, log_values, log_backoff, log_base, attention, per_row,
):  # pragma: no cover - compiled  # fmt: skip
    """Weighted ``(log_lik, target_log_prob, weight)`` of the rows; ``attention`` (n, N) receives each row's last
    hop's predictive attention in column order (zero on masked columns), ``per_row`` (n, 2) each row's
    ``(log p(query | window), log p(target | window, query))`` unweighted (:func:`keep_row`; (0, 2): none)."""
    n_hops = key_means.shape[0]
    n_pos = prior.shape[1]
    dim = key_means.shape[2]
    alpha = np.empty((n_hops, n_pos))
    trans = np.empty((max(n_hops - 1, 1), n_pos * n_pos))
    flat = np.empty(n_pos * n_pos)
    shift = np.empty((max(n_hops - 1, 1), n_pos))
    log_e = np.empty(n_pos)
    pair = np.empty(n_pos, dtype=np.int64)
    work = np.empty(n_pos)
    bits = np.empty(n_pos * n_pos, dtype=np.int64)
    y = np.empty(dim)
    consts = gate_const * (1 if softmax else n_hops)
    log_lik = 0.0
    target_log_prob = 0.0
    weight = 0.0
    n_rows = target.shape[0]
    dense = indptr.shape[0] == 0
    n_symbols = key_means.shape[1]
    key_rows = key_means.reshape(n_hops * n_symbols, dim)  # every hop's keys as rows, for the prefetches
    for row in range(n_rows):
        ahead = row + _PREFETCH_ROWS
        if ahead < n_rows:
            t_ahead = target[ahead]
            for x in range(begin[ahead], end[ahead]):
                if dense:
                    prefetch_item(log_emission_ts, t_ahead, tokens[x])
                _prefetch_rows(key_rows, hop_queries, tokens[x], n_symbols)
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        lo = begin[row]
        hi = end[row]
        m = hi - lo
        q = query_index[row]
        for d in range(dim):
            y[d] = np.float64(query_table[q, d])
        log_z, log_z_gate = _chain(
            tokens, lo, hi, target[row], y, key_means, prior, log_prior, hop_queries, inv_two_sigma2, softmax,
            log_emission_ts, indptr, symbols, log_values, log_backoff, log_base, True, alpha, trans, shift,
            log_e, pair, work, flat, bits,
        )  # fmt: skip
        for i in range(n_pos):
            attention[row, i] = 0.0
        if log_z_gate > -np.inf:
            for j in range(m):
                a = alpha[n_hops - 1, j]
                attention[row, n_pos - m + j] = math.exp(a - log_z_gate) if a > -np.inf else 0.0
        keep_row(per_row, row, log_z_gate + consts, log_z - log_z_gate)
        if w == 0.0:
            continue
        log_lik += w * (log_z + consts)
        target_log_prob += w * (log_z - log_z_gate)
        weight += w
    return log_lik, target_log_prob, weight


def _sampled_order(rows: WindowRows, params: HopParameters) -> np.ndarray | None:
    """The order in which the E-step visits rows that are not a token stream's: grouped by target (a stable
    counting sort, the single head's), so that the rows of one target read and update one row of the emission
    tables, or one target's run of a sparse support, while it is in cache; ``None`` (row order) for a stream's rows
    (most windows sliding from the previous row's: their pairs are kept from row to row) or a small emission."""
    begin, end = np.asarray(rows.begin), np.asarray(rows.end)
    n = begin.shape[0]
    if n < 2 or _emission_bytes(params) < GROUP_BY_TARGET_TABLE_BYTES:
        return None
    sliding = np.count_nonzero((begin[1:] > begin[:-1]) & (begin[1:] < end[:-1]))
    return None if 2 * sliding >= n - 1 else _by_target(rows, params)


def _by_target(rows: WindowRows, params: HopParameters) -> np.ndarray:
    """The rows' indices stably sorted by target."""
    num_targets = params.log_emission_ts.shape[0] if params.indptr.shape[0] == 0 else params.indptr.shape[0] - 1
    return by_target(rows, num_targets)


def _emission_bytes(params: HopParameters) -> int:
    """The bytes of the emission tables the E-step reads and updates (a dense one's (T, S) log table; a sparse one's
    pair values and direct rows)."""
    if params.indptr.shape[0] == 0:
        return int(params.log_emission_ts.nbytes)
    return int(params.log_values.nbytes + params.direct_slots.nbytes)


def hop_estep(
    rows: WindowRows,
    params: HopParameters,
    arrays: HopArrays,
    group_by_target: bool | None = None,
    rings: bool | None = None,
) -> int:
    """The chain's E-step over ``rows`` (checked), added into ``arrays``; returns how many rows it redid in the log
    domain (their path weights too far apart for the linear-domain pass to scale: the same statistics, slower).
    Rows no path explains raise ``ImpossibleEvidenceError`` after the others were added; a pair off a sparse
    support raises a ValueError. Rows that are not a token stream's are visited grouped by target when the emission
    is large (:func:`_sampled_order`; ``group_by_target`` True or False decides instead): a fixed order for the
    same rows, whatever the worker. ``rings``: whether a stream's windows keep their pairs from row to row (None: only
    where the vector code cannot run, D not a multiple of 8); the same statistics to rounding either way."""
    if group_by_target is None:
        order = _sampled_order(rows, params)
    else:
        order = _by_target(rows, params) if group_by_target and rows.num_rows > 1 else None
    visited = (
        rows.kernel_arrays(narrow_queries=True) if order is None else windows_in_order(rows, order, narrow_queries=True)
    )
    window, narrow = split_query_table(visited)
    # Room for every row when they are visited out of order: the message lists the first ones in row order.
    found = np.empty(min(rows.num_rows, 64) if order is None else rows.num_rows, dtype=np.int64)
    if rings is None:
        rings = params.key_means.shape[2] % LANES != 0
    n_impossible, n_outside, n_log_domain = _ESTEPS[rings](
        *window, narrow,
        *params.arrays(), params.direct_row, params.direct_slots, params.key_norms, params.query_norms,
        params.by_symbol, *params.symbol_views(), arrays.key_sum, arrays.key_mass, arrays.recency_mass,
        arrays.emission_count_ts, arrays.pair_counts, arrays.scalars, found,
    )  # fmt: skip
    if order is not None:
        found = np.sort(order[found[: min(n_impossible, found.shape[0])]])
    if n_outside:
        raise ValueError(
            f"{n_outside} row(s) hold a (symbol, target) pair outside the sparse emission's support: the support "
            "must come from these rows (a fit finds it in its start pass); refit, or use --emission-layout dense"
        )
    if n_impossible:
        shown = ", ".join(str(int(r)) for r in found[: min(n_impossible, 10)])
        raise ImpossibleEvidenceError(
            f"impossible evidence: rows {shown} have zero probability under the chain of hops (no path of "
            "positions reaches a token that can emit the row's target)"
        )
    return int(n_log_domain)


def hop_score(
    rows: WindowRows, params: HopParameters, per_row: np.ndarray = NO_ROWS
) -> tuple[float, float, float, np.ndarray]:
    """``(log_lik, target_log_prob, weight, attention (n, N))`` of ``rows`` (checked) under the chain: the last
    hop's predictive attention is what ``p(target | row)`` weighs the emission rows by. With ``per_row`` (n, 2),
    also each row's ``(log p(query | window), log p(target | window, query))`` into it."""
    attention = np.empty((rows.num_rows, params.prior.shape[1]))
    log_lik, target_log_prob, weight = _score(  # type: ignore[call-arg]
        *rows.kernel_arrays(),
        *params.arrays(), attention, per_row,
    )  # fmt: skip
    return float(log_lik), float(target_log_prob), float(weight), attention
