"""Choosing the hyperparameters on held-out rows: every candidate of a grid scored in one pass.

After each M-step the keys, the position prior and the emission counts are fixed; what is left open
is the gate variance ``sigma2`` and the emission prior's strengths (see :mod:`dist_respattn.model.emission.prior`).
One pass over held-out rows scores every combination: per row, the N squared distances and the N
emission counts are read once; each ``sigma2`` gives one softmax over the positions, each strength
pair one MAP emission value per position, and their products give, for every combination, the
predictive log-probability of the target and the joint log-likelihood. The totals are additive over
rows, blocks and partitions like the E-step's statistics, so the pass runs on the cluster and the
driver picks the combination with the best held-out predictive likelihood (Jelinek & Mercer 1980's
held-out estimation, done by grid).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import numba
import numpy as np

from dist_respattn.model.arguments import check_batch
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import DenseEmissionCounts, EmissionCounts, SparseEmissionCounts
from dist_respattn.model.kernels import per_position
from dist_respattn.model.kernels.log_weights import exp_nonpositive_range, log_positive_range, squared_distance
from dist_respattn.model.kernels.prefetch import prefetch_element

__all__ = [
    "DEFAULT_SEARCH",
    "FLAT_GATE_SCALE",
    "GRID_ROW_SLOTS",
    "GridRowCache",
    "GridRows",
    "GridTable",
    "GridTotals",
    "HyperparameterSearch",
    "Hyperparameters",
    "PlannedRows",
    "Selection",
    "as_hyperparameters",
    "coordinate_steps",
    "grid_count_arrays",
    "nearby",
    "plan_grid_rows",
    "score_grid",
    "score_planned",
]

#: A gate variance this many times the query scale makes the gate flat: the attention is the prior.
FLAT_GATE_SCALE = 2.0**20


@dataclass(frozen=True)
class Hyperparameters:
    """The M-step's open choices: gate variance and the emission prior's strengths (``a_s = e + t n_s``)."""

    sigma2: float
    emission_strength: float
    type_strength: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    def describe(self) -> str:
        """The choice in words, as an iteration's line says it."""
        return (
            f"sigma2 {self.sigma2:.3g}, emission prior strength {self.emission_strength:.3g} "
            f"+ {self.type_strength:.3g} per successor type"
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Hyperparameters:
        return cls(float(data["sigma2"]), float(data["emission_strength"]), float(data["type_strength"]))


@dataclass(frozen=True)
class Selection:
    """What an M-step chose: its hyperparameters, and the chosen model's held-out scores (``None`` without)."""

    hyperparameters: Hyperparameters
    heldout: dict[str, float] | None = None


@dataclass(frozen=True)
class HyperparameterSearch:
    """The values tried on held-out rows after every M-step; ``None`` keeps that hyperparameter fixed.

    Attributes:
        sigma2_scales: gate variances as multiples of the query scale ``sum ||y||^2 / (n D)`` of the
            training rows (so the grid follows the embedding's scale); the last, ``FLAT_GATE_SCALE``,
            is a flat gate.
        emission_strengths: values of ``emission_strength`` (pseudo-counts per emission row).
        type_strengths: values of ``type_strength`` (pseudo-counts per distinct successor of a symbol).
    """

    sigma2_scales: tuple[float, ...] | None = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, FLAT_GATE_SCALE)
    emission_strengths: tuple[float, ...] | None = (0.01, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
    type_strengths: tuple[float, ...] | None = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)

    def __post_init__(self) -> None:
        for name in ("sigma2_scales", "emission_strengths", "type_strengths"):
            values = getattr(self, name)
            if values is None:
                continue
            values = tuple(float(v) for v in values)
            if not values or not all(math.isfinite(v) and v >= 0.0 for v in values):
                raise ValueError(f"{name} = {values!r}: expected a non-empty tuple of finite numbers >= 0")
            object.__setattr__(self, name, values)
        if self.sigma2_scales is not None and min(self.sigma2_scales) <= 0.0:
            raise ValueError(f"sigma2_scales = {self.sigma2_scales!r}: expected positive multiples")

    @property
    def searches_anything(self) -> bool:
        return any(v is not None for v in (self.sigma2_scales, self.emission_strengths, self.type_strengths))

    def around(self, previous: Hyperparameters, query_scale: float) -> HyperparameterSearch:
        """The search near a previous choice: on every searched axis, the grid value closest to it and its two
        neighbours (and, for the gate variance, the flat gate too).

        An M-step's best choice moves little from one iteration to the next, so after the first M-step
        (which searches the whole grid) the held-out pass scores up to 4 × 3 × 3 = 36 points instead of
        600, and a choice at the edge of its neighbourhood moves on at the next iteration.
        """

        def near(values: tuple[float, ...] | None, current: float) -> tuple[float, ...] | None:
            if values is None:
                return None
            # Distances in log space (the grids are logarithmic); 0 is nearest to 0 only.
            keys = [abs(math.log(v) - math.log(current)) if v > 0 and current > 0 else abs(v - current) for v in values]
            i = min(range(len(values)), key=keys.__getitem__)
            return values[max(0, i - 1) : i + 2]

        sigma2 = near(self.sigma2_scales, previous.sigma2 / query_scale)
        if sigma2 is not None and self.sigma2_scales is not None and max(self.sigma2_scales) not in sigma2:
            sigma2 = (*sigma2, max(self.sigma2_scales))
        return HyperparameterSearch(
            sigma2,
            near(self.emission_strengths, previous.emission_strength),
            near(self.type_strengths, previous.type_strength),
        )

    def to_json(self) -> dict[str, Any]:
        return {k: None if v is None else list(v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HyperparameterSearch:
        names = ("sigma2_scales", "emission_strengths", "type_strengths")
        return cls(**{k: None if data.get(k) is None else tuple(data[k]) for k in names})


DEFAULT_SEARCH = HyperparameterSearch()


def nearby(values: tuple[float, ...] | None, current: float) -> tuple[float, ...] | None:
    """The value of ``values`` (a logarithmic grid) nearest ``current`` and its two neighbours (``None``: a fixed
    axis). :meth:`HyperparameterSearch.around`'s step on one axis, without the flat gate added."""
    if values is None:
        return None
    keys = [abs(math.log(v) - math.log(current)) if v > 0 and current > 0 else abs(v - current) for v in values]
    i = min(range(len(values)), key=keys.__getitem__)
    return values[max(0, i - 1) : i + 2]


def as_hyperparameters(choice: Any, fallback: Hyperparameters) -> Hyperparameters:
    """A choice as the single head's hyperparameters: its ``sigma2``, ``emission_strength`` and ``type_strength``
    where it has them (``None`` or missing: ``fallback``'s; a choice recorded with the gate variance alone, say)."""

    def value(name: str) -> float:
        v = getattr(choice, name, None)
        return float(getattr(fallback, name)) if v is None else float(v)

    return Hyperparameters(value("sigma2"), value("emission_strength"), value("type_strength"))


def coordinate_steps(
    search: HyperparameterSearch, current: Hyperparameters, query_scale: float
) -> list[Hyperparameters]:
    """The points one step from ``current`` along one searched axis at a time: on each axis the grid values
    :func:`nearby` it (gate variances as multiples of ``query_scale``) other than its own, the other two kept."""
    steps: list[Hyperparameters] = []
    for values, name, scale in ((search.sigma2_scales, "sigma2", query_scale),
                                (search.emission_strengths, "emission_strength", 1.0),
                                (search.type_strengths, "type_strength", 1.0)):  # fmt: skip
        own = float(getattr(current, name))
        for value in nearby(values, own / scale) or ():
            if value * scale != own:
                steps.append(dataclasses.replace(current, **{name: value * scale}))
    return steps


@dataclass(frozen=True)
class GridTable:
    """What the grid pass reads: one M-step's parameters and counts, and the values to try.

    Attributes:
        key_means: (S, D) float64.
        log_prior: (N,) ``log position_prior``.
        counts: the M-step's responsibility-weighted (symbol, target) counts (either layout; sparse
            ones with their support, a pair outside it counting 0).
        row_totals: (S,) ``c[s] = sum_t c[s, t]``.
        base: (T,) the emission prior's backoff ``u``; ``types``: (S,) its type counts ``n_s``.
        sigma2: (G1,) gate variances; ``emission_strengths``: (G2,); ``type_strengths``: (G3,).
        buckets: the recency buckets ``log_prior`` is tied over, or ``None`` (a free prior).
    """

    key_means: np.ndarray
    log_prior: np.ndarray
    counts: EmissionCounts
    row_totals: np.ndarray
    base: np.ndarray
    types: np.ndarray
    sigma2: np.ndarray
    emission_strengths: np.ndarray
    type_strengths: np.ndarray
    buckets: PositionBuckets | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(G1, G2, G3): the grid's size along sigma2, emission strength and type strength."""
        return (self.sigma2.size, self.emission_strengths.size, self.type_strengths.size)

    def hyperparameters(self, index: tuple[int, int, int]) -> Hyperparameters:
        g, h, b = index
        return Hyperparameters(float(self.sigma2[g]), float(self.emission_strengths[h]), float(self.type_strengths[b]))

    @functools.cached_property
    def direct_pair_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Sparse counts' direct symbol -> pair rows
        (:func:`~dist_respattn.model.kernels.per_position.direct_pair_rows`), made once per table where it is
        scored: a held-out row's pairs of a frequent target are then one load each instead of a binary search.
        Empty arrays for dense counts."""
        counts = self.counts
        if not isinstance(counts, SparseEmissionCounts) or counts.support is None:
            return _NO_DIRECT_ROW, _NO_DIRECT_SLOTS
        support = counts.support
        return per_position.direct_pair_rows(support.indptr, support.symbols, support.num_symbols)

    def __getstate__(self) -> dict[str, Any]:
        # The direct rows are made where the table is scored; the table travels without them.
        state = dict(self.__dict__)
        state.pop("direct_pair_rows", None)
        return state


@dataclass(frozen=True)
class GridTotals:
    """Weighted held-out totals for every grid point (add two with ``+``).

    Attributes:
        weight: sum of the scored rows' weights.
        target_log_prob: (G1, G2, G3) sum of ``w log p(target | context, query)``.
        log_lik: (G1, G2, G3) sum of ``w log p(query, target | context)``.
    """

    weight: float
    target_log_prob: np.ndarray
    log_lik: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, int, int]) -> GridTotals:
        return cls(0.0, np.zeros(shape), np.zeros(shape))

    def __add__(self, other: GridTotals) -> GridTotals:
        return GridTotals(
            self.weight + other.weight, self.target_log_prob + other.target_log_prob, self.log_lik + other.log_lik
        )

    def best(self) -> tuple[int, int, int]:
        """The grid point with the highest predictive likelihood (the first in grid order on ties)."""
        flat = np.where(np.isnan(self.target_log_prob), -np.inf, self.target_log_prob).reshape(-1)
        return tuple(int(i) for i in np.unravel_index(int(np.argmax(flat)), self.target_log_prob.shape))  # type: ignore[return-value]

    def metrics(self, index: tuple[int, int, int]) -> dict[str, float]:
        """Means per unit weight at one grid point: ``mean_log_likelihood``, ``target_log_prob``, ``perplexity``."""
        if self.weight <= 0.0:
            nan = float("nan")
            return {"mean_log_likelihood": nan, "target_log_prob": nan, "perplexity": nan}
        mean_target = float(self.target_log_prob[index]) / self.weight
        return {
            "mean_log_likelihood": float(self.log_lik[index]) / self.weight,
            "target_log_prob": mean_target,
            "perplexity": math.exp(-mean_target) if mean_target > -700.0 else float("inf"),
        }


#: Held-out rows the grid pass remembers (a worker's pass, per partition): a row met again (the same context, query
#: and target, as runs of source code often repeat) takes its sums from the row before instead of computing
#: them. The rows kept are chosen knowing each batch (:func:`_plan_rows`): 1024 slots find 27.6% of a 50,000-word
#: code store's held-out rows (29.4% repeat a row before them in their partition; a slot chosen by a row's hash
#: found 21.6%), the slots taking 5 MB at the whole grid's 600 points.
GRID_ROW_SLOTS = 1024

#: How many computed rows ahead the grid kernel prefetches the key rows and pair counts a row reads.
GRID_PREFETCH_ROWS = 4

# A grid point's rows of weight 1 add their logarithms as one running product's (:func:`_grid_planned`), kept in
# [2^-500, 2^500] by exact powers of two: a row's factor, a predictive numerator, is at most N (a sum of N gates
# times emissions, each at most 1), far below 2^500, so the product never leaves the normal range between two
# rescalings. A factor under 2^-500 (or 0) is not multiplied in: its logarithm is added as it is.
_PRODUCT_HIGH = 2.0**500
_PRODUCT_LOW = 2.0**-500
#: The natural logarithm of 2^500: one rescaling of a running product.
_PRODUCT_STEP_LOG = 500.0 * math.log(2.0)


@numba.njit(cache=True, nogil=True, inline="always")
def _row_hash(context, row, t, size):  # pragma: no cover - compiled
    """A row's place in a table of ``size`` (a power of two) by its context ids and target (a multiplicative hash)."""
    h = np.uint64(t) * np.uint64(0x9E3779B97F4A7C15)
    for i in range(context.shape[1]):
        h = (h ^ np.uint64(context[row, i])) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((h >> np.uint64(32)) & np.uint64(size - 1))


@numba.njit(cache=True, nogil=True, inline="always")
def _same_rows(context, query_bits, a, b):  # pragma: no cover - compiled
    """Whether rows ``a`` and ``b`` of a batch hold the same context ids and query bits (their targets compared
    by the caller)."""
    for i in range(context.shape[1]):
        if context[a, i] != context[b, i]:
            return False
    for d in range(query_bits.shape[1]):
        if query_bits[a, d] != query_bits[b, d]:
            return False
    return True


@numba.njit(cache=True, nogil=True, inline="always")
def _same_row(context, query_bits, row, t, slot_context, slot_query, slot_target, s):  # pragma: no cover
    """Whether slot ``s`` holds row ``row``: its context ids, target and the query's bits."""
    if slot_target[s] != t:
        return False
    for i in range(context.shape[1]):
        if slot_context[s, i] != context[row, i]:
            return False
    for d in range(query_bits.shape[1]):
        if slot_query[s, d] != query_bits[row, d]:
            return False
    return True


@numba.njit(cache=True, nogil=True, inline="always")
def _heap_push(heap, size, entry):  # pragma: no cover - compiled
    """Push ``entry`` on the max-heap ``heap[:size]``; returns the new size."""
    j = size
    while j > 0:
        parent = (j - 1) >> 1
        if heap[parent] >= entry:
            break
        heap[j] = heap[parent]
        j = parent
    heap[j] = entry
    return size + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _heap_pop(heap, size):  # pragma: no cover - compiled
    """Remove the largest entry of the max-heap ``heap[:size]`` (not empty); returns the new size."""
    size -= 1
    last = heap[size]
    j = 0
    while True:
        child = 2 * j + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] > heap[child]:
            child += 1
        if heap[child] <= last:
            break
        heap[j] = heap[child]
        j = child
    if size > 0:
        heap[j] = last
    return size


@numba.njit(cache=True, nogil=True)
def _plan_rows(
    context, query_bits, target, weights, slot_context, slot_query, slot_target, hits, plan, counted, fresh
):  # pragma: no cover - compiled  # fmt: skip
    """Which rows of a batch the grid kernel computes and which it reads back from a slot; returns ``(n, m)``.

    The rows of nonzero weight (``n`` of them, their indices in ``counted[:n]``) in order, each with ``plan``: the
    slot ``s`` it is computed into, or ``~s`` (negative) when slot ``s`` holds the same row (the same context ids,
    target and query bits, so the same values), counted in ``hits[0]``. ``fresh[:m]``: the indices of the rows
    computed. A row of weight 0 is neither scored nor kept.

    The slots (``slot_*``: the ids, target and query bits of the row each holds, target -1 when none) are the
    first S of S + 1; a row computed but not kept goes to the last one, which is never read back. Which rows are
    kept is decided knowing the batch: each row's next use in it, and the slots' (rows kept from the batches
    before, found in this one). A computed row takes the slot whose row is used furthest ahead, or not in this
    batch (the least recently used of those first, an empty slot before any), when that is further ahead than
    its own next use; otherwise it is not kept. Within a batch that is the best choice there is (Belady's).
    """
    n_rows = context.shape[0]
    n_slots = slot_target.shape[0] - 1
    n = 0
    for row in range(n_rows):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w != 0.0:
            counted[n] = row
            n += 1
    # The distinct rows of the batch (by their first row), and each row's next use.
    size = 2
    while size < 2 * n:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    first = np.empty(max(n, 1), dtype=np.int64)
    ids = np.empty(max(n, 1), dtype=np.int64)
    u = 0
    for j in range(n):
        row = counted[j]
        t = target[row]
        h = _row_hash(context, row, t, size)
        while True:
            k = table[h]
            if k < 0:
                table[h] = u
                first[u] = j
                ids[j] = u
                u += 1
                break
            r = counted[first[k]]
            if target[r] == t and _same_rows(context, query_bits, r, row):
                ids[j] = k
                break
            h = (h + 1) & (size - 1)
    next_use = np.empty(max(n, 1), dtype=np.int64)
    last = np.full(max(u, 1), -1, dtype=np.int64)
    for j in range(n - 1, -1, -1):
        next_use[j] = last[ids[j]]
        last[ids[j]] = j
    # Slot priorities (the larger, the sooner replaced): the next use in this batch, else past every use: the less
    # recently used the larger, rows of the batches before larger still, empty slots the largest.
    far = 2 * n + 2
    slot_of = np.full(max(u, 1), -1, dtype=np.int64)
    held = np.full(max(n_slots, 1), -1, dtype=np.int64)
    rank = np.empty(max(n_slots, 1), dtype=np.int64)
    heap = np.empty(n_slots + n + 1, dtype=np.int64)
    top = 0
    span = np.int64(n_slots + 1)
    for s in range(n_slots):
        rank[s] = far + n + 2
        t = slot_target[s]
        if t < 0:
            top = _heap_push(heap, top, rank[s] * span + s)
            continue
        rank[s] = far + n + 1
        h = _row_hash(slot_context, s, t, size)
        while True:
            k = table[h]
            if k < 0:
                break
            r = counted[first[k]]
            if _same_row(context, query_bits, r, target[r], slot_context, slot_query, slot_target, s):
                if slot_of[k] < 0:
                    slot_of[k] = s
                    held[s] = k
                    rank[s] = first[k]
                break
            h = (h + 1) & (size - 1)
        top = _heap_push(heap, top, rank[s] * span + s)
    m = 0
    for j in range(n):
        row = counted[j]
        k = ids[j]
        own = next_use[j] if next_use[j] >= 0 else far + (n - j)
        s = slot_of[k]
        if s >= 0:
            hits[0] += 1
            plan[j] = ~s
            rank[s] = own
            top = _heap_push(heap, top, own * span + s)
            continue
        fresh[m] = row
        m += 1
        plan[j] = n_slots  # computed, not kept
        while top > 0:
            entry = heap[0]
            s = entry % span
            if entry // span == rank[s]:
                break
            top = _heap_pop(heap, top)  # a stale priority
        if top == 0 or heap[0] // span <= own:
            continue
        s = heap[0] % span
        top = _heap_pop(heap, top)
        if held[s] >= 0:
            slot_of[held[s]] = -1
        held[s] = k
        slot_of[k] = s
        rank[s] = own
        top = _heap_push(heap, top, own * span + s)
        plan[j] = s
        slot_target[s] = target[row]
        for i in range(context.shape[1]):
            slot_context[s, i] = context[row, i]
        for d in range(query_bits.shape[1]):
            slot_query[s, d] = query_bits[row, d]
    return n, m


@numba.njit(cache=True, nogil=True)
def _fresh_pairs(context, target, indptr, symbols, direct_row, direct_slots, out):  # pragma: no cover - compiled
    """``out[j, i]``: the support's index of the pair (``context[j, i]``, ``target[j]``), -1 off the support: through
    the target's direct row when it has one, else a binary search."""
    for j in range(context.shape[0]):
        t = target[j]
        direct = direct_row[t]
        for i in range(context.shape[1]):
            c = context[j, i]
            out[j, i] = direct_slots[direct, c] if direct >= 0 else per_position.find_pair(indptr, symbols, t, c)


@numba.njit(cache=True, nogil=True)
def _intern_rows(bits, out):  # pragma: no cover - compiled
    """``out[j]``: the index among the distinct rows of ``bits`` (m, W), in order of first appearance, of row ``j``;
    returns the first row of each distinct one (an open-addressing table over their words)."""
    m, width = bits.shape
    size = 1
    while size < 2 * m:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    first = np.empty(m, dtype=np.int64)
    u = 0
    for j in range(m):
        h = np.uint64(0x9E3779B97F4A7C15)
        for d in range(width):
            h = (h ^ np.uint64(bits[j, d])) * np.uint64(0x9E3779B97F4A7C15)
        s = np.int64((h >> np.uint64(32)) & np.uint64(size - 1))
        while True:
            k = table[s]
            if k < 0:
                table[s] = u
                first[u] = j
                out[j] = u
                u += 1
                break
            r = first[k]
            same = True
            for d in range(width):
                if bits[r, d] != bits[j, d]:
                    same = False
                    break
            if same:
                out[j] = k
                break
            s = (s + 1) & (size - 1)
    return first[:u]


@numba.njit(cache=True, nogil=True)
def _grid_planned(
    plan,
    weights,
    context,
    query_row,
    queries,
    target,
    pairs,
    key_means,
    log_prior,
    emission_count_ts,
    pair_counts,
    row_totals,
    base,
    types,
    inv_two_sigma2,
    gate_const,
    strength_k,
    type_k,
    slot_num,
    slot_log_z,
    slot_best,
    out_pred,
    out_joint,
):  # pragma: no cover - compiled
    """Adds every grid point's predictive and joint log-likelihood of planned rows (:func:`_plan_rows`) into
    ``out_*`` (G1, K = G2*G3); returns their weight.

    ``plan`` (n,): each row's slot, computed into it (``s >= 0``, the next of the computed rows: ``context`` (m, N)
    ids, ``queries[query_row]`` (m,) queries, ``target`` (m,), ``pairs`` (m, N) the support's index of each
    position's pair with the target, -1 off it; empty for dense counts, read from the (T, S) ``emission_count_ts``)
    or read back from it (``~s``); ``weights`` (n,), empty for weight 1 each. ``strength_k``, ``type_k`` (K,): each
    strength pair's emission and type strength.

    A row's values are :func:`grid_row`'s: per position the MAP emissions of every strength pair side by side (K
    lanes), per gate variance its softmax and for every pair the sum over the positions in position order; the
    gates' exponentials are the E-step's branch-free ones (within ~1 ulp of ``math.exp``'s), all G1 * N of a row
    at once. A computed row's sums (G1, K), log normalizers and log-gate maxima (G1) go into its slot (``slot_*``),
    from which a row read back takes them as they are.

    What is added up differs from :func:`grid_row`: a row's K sums' logarithms are not taken one by one. Each point's
    sums over the rows of weight 1 are multiplied into a running product, rescaled by exact powers of two (only its
    rescalings counted), and its logarithm is taken once a call; the normalizers and maxima are summed per gate
    variance. The totals so agree with :func:`grid_row`'s to rounding (a product of n factors is within n ulp of the
    exact one, where a sum of n logarithms is within n ulp of its largest partial sum), at a fraction of the cost:
    the K logarithms and 2K additions a row were most of a computed row's time. Rows of another weight add their
    logarithms (:func:`~dist_respattn.model.kernels.log_weights.log_positive_range`) times their weight.
    """
    n_rows = plan.shape[0]
    n_pos = context.shape[1]
    dim = queries.shape[1]
    n_sigma = inv_two_sigma2.shape[0]
    n_k = strength_k.shape[0]
    dist = np.empty(n_pos)
    count = np.empty(n_pos)
    total = np.empty(n_pos)
    typ = np.empty(n_pos)
    emis = np.empty((n_pos, n_k))
    n_gates = n_sigma * n_pos
    shifted = np.empty(n_gates)
    gates = np.empty(n_gates)
    gate_best = np.empty(n_sigma)
    gate_bits = np.empty(n_gates, dtype=np.int64)
    gate_scale = gate_bits.view(np.float64)
    num = np.empty(n_k)
    logs = np.empty(n_k)
    bits = np.empty(n_k, dtype=np.int64)
    scale = bits.view(np.float64)
    y = np.empty(dim)
    # Per point: the running product of its factors, how many times 2^500 was taken out of it (a signed count),
    # and the logarithms added as they are; per gate variance: the weighted sums of log normalizers and maxima.
    product = np.ones((n_sigma, n_k))
    steps = np.zeros((n_sigma, n_k))
    logged = np.zeros((n_sigma, n_k))
    log_z_sum = np.zeros(n_sigma)
    best_sum = np.zeros(n_sigma)
    weight = 0.0
    sparse = pairs.shape[0] > 0
    n_fresh = context.shape[0]
    j = 0
    for row in range(n_rows):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        s = plan[row]
        if s < 0:
            s = ~s
        else:
            ahead = j + GRID_PREFETCH_ROWS
            if ahead < n_fresh:
                # The rows a computed row a few ahead reads at random: its key rows and its pairs' counts.
                for i in range(n_pos):
                    per_position.prefetch_row(key_means, context[ahead, i])
                    if sparse:
                        p = pairs[ahead, i]
                        if p >= 0:
                            prefetch_element(pair_counts, p)
            q = query_row[j]
            for d in range(dim):
                y[d] = np.float64(queries[q, d])
            t = target[j]
            u = base[t]
            for i in range(n_pos):
                c = context[j, i]
                # The distance once for every sigma2 of the grid: the gate below is row_log_weights' expression.
                dist[i] = squared_distance(y, key_means, c)
                if sparse:
                    p = pairs[j, i]
                    count[i] = pair_counts[p] if p >= 0 else 0.0
                else:
                    count[i] = emission_count_ts[t, c]
                total[i] = row_totals[c]
                typ[i] = types[c]
            j += 1
            # map_emissions' values, the strength pairs side by side.
            for i in range(n_pos):
                cnt, tot, ty = count[i], total[i], typ[i]
                for k in range(n_k):
                    a = strength_k[k] + type_k[k] * ty
                    den = tot + a
                    emis[i, k] = (cnt + a * u) / den if den > 0.0 else u
            # Every gate variance's shifted log gates, then their exponentials at once, in lanes.
            for g in range(n_sigma):
                gate_best[g] = shifted_log_gates(n_pos, log_prior, dist, inv_two_sigma2[g], shifted, g * n_pos)
            exp_nonpositive_range(shifted, 0, gates, 0, n_gates, gate_bits, gate_scale)
            # grid_points' values, each pair's sum over the positions in the same order.
            for g in range(n_sigma):
                best = gate_best[g]
                z = 0.0
                for i in range(n_pos):
                    z += gates[g * n_pos + i]
                for k in range(n_k):
                    num[k] = 0.0
                for i in range(n_pos):
                    gi = gates[g * n_pos + i]
                    for k in range(n_k):
                        num[k] += gi * emis[i, k]
                for k in range(n_k):
                    slot_num[s, g, k] = num[k]
                slot_log_z[s, g] = math.log(z)
                slot_best[s, g] = best
        for g in range(n_sigma):
            log_z_sum[g] += w * slot_log_z[s, g]
            best_sum[g] += w * slot_best[s, g]
            if w == 1.0:
                multiply_in(slot_num[s, g], product[g], steps[g], logged[g])
            else:
                log_positive_range(slot_num[s, g], logs, n_k, bits, scale)
                for k in range(n_k):
                    logged[g, k] += w * logs[k]
        weight += w
    for g in range(n_sigma):
        joint_g = best_sum[g] + gate_const[g] * weight
        for k in range(n_k):
            log_num = product_log(product[g, k], steps[g, k], logged[g, k])
            out_pred[g, k] += log_num - log_z_sum[g]
            out_joint[g, k] += log_num + joint_g
    return weight


@numba.njit(cache=True, nogil=True, inline="always")
def multiply_in(factors, product, steps, logged):  # pragma: no cover - compiled
    """Adds ``log(factors[k])`` (>= 0: a zero's is -inf) to running total ``k`` of a sum of logarithms kept as
    ``product_log(product[k], steps[k], logged[k])``: the factor multiplied into the product, which is rescaled by
    2^500 when it leaves [2^-500, 2^500] (exactly: a power of two; a factor under 2^500, as a grid's of at most N
    is, keeps the product normal in between) and the rescaling counted in ``steps``; a factor under 2^-500 has its
    logarithm added to ``logged`` instead. All (K,) float64, starting at 1, 0 and 0."""
    n = factors.shape[0]
    # Branch-free, so that it runs in vector lanes; a factor too small to multiply in is counted and added below
    # (in the grid's rows, never: a factor is a predictive probability's numerator).
    small = 0
    for k in range(n):
        v = factors[k]
        tiny = v < _PRODUCT_LOW
        small += 1 if tiny else 0
        p = product[k] * (1.0 if tiny else v)
        low, high = p < _PRODUCT_LOW, p > _PRODUCT_HIGH
        product[k] = p * (_PRODUCT_HIGH if low else (_PRODUCT_LOW if high else 1.0))
        steps[k] += -1.0 if low else (1.0 if high else 0.0)
    if small:
        for k in range(n):
            v = factors[k]
            if v < _PRODUCT_LOW:
                logged[k] += math.log(v) if v > 0.0 else -np.inf


@numba.njit(cache=True, nogil=True, inline="always")
def product_log(product, steps, logged):  # pragma: no cover - compiled
    """The sum of logarithms :func:`multiply_in` keeps as ``(product, steps, logged)``."""
    return (steps * _PRODUCT_STEP_LOG + math.log(product)) + logged


@numba.njit(cache=True, nogil=True, inline="always")
def grid_count(t, c, emission_count_ts, indptr, symbols, pair_counts, direct_row, direct_slots):  # pragma: no cover
    """The M-step's count of the pair (symbol ``c``, target ``t``): from the dense (T, S) ``emission_count_ts``, or
    when ``indptr`` is not empty from the sparse ``pair_counts`` (through the target's direct row when it has one,
    else a binary search; 0 off the support)."""
    if indptr.shape[0] == 0:
        return emission_count_ts[t, c]
    direct = direct_row[t]
    p = direct_slots[direct, c] if direct >= 0 else per_position.find_pair(indptr, symbols, t, c)
    return pair_counts[p] if p >= 0 else 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def grid_row(
    w, n, log_prior, dist, count, total, typ, base_t, inv_two_sigma2, gate_const, emission_strengths, type_strengths,
    emis, gate, out_pred, out_joint,
):  # pragma: no cover - compiled  # fmt: skip
    """Add one row of weight ``w`` into every grid point's totals ``out_*`` (G1, G2*G3), from its first ``n``
    positions (or a histogram row's terms): their log prior, squared distance to the query, count with the
    target, row total and type count; ``base_t`` is the target's backoff. ``emis`` (G2*G3, N) and ``gate`` (N,)
    are scratch."""
    map_emissions(n, count, total, typ, base_t, emission_strengths, type_strengths, emis)
    grid_points(w, n, log_prior, dist, inv_two_sigma2, gate_const, emis, gate, out_pred, out_joint)


@numba.njit(cache=True, nogil=True, inline="always")
def map_emissions(n, count, total, typ, base_t, emission_strengths, type_strengths, emis):  # pragma: no cover
    """``emis[k, i]``: position ``i``'s MAP emission of the target at strength pair ``k`` (G2*G3 of them, emission
    strength major), ``(count + a base_t) / (total + a)`` with ``a = e + t typ``, for the first ``n`` positions."""
    n_type = type_strengths.shape[0]
    for h in range(emission_strengths.shape[0]):
        for b in range(n_type):
            k = h * n_type + b
            for i in range(n):
                a = emission_strengths[h] + type_strengths[b] * typ[i]
                den = total[i] + a
                emis[k, i] = (count[i] + a * base_t) / den if den > 0.0 else base_t


@numba.njit(cache=True, nogil=True, inline="always")
def gate_softmax(n, log_prior, dist, inv_two_sigma2, gate):  # pragma: no cover - compiled
    """The unnormalized gate of the first ``n`` positions at one gate variance into ``gate``: their log prior less
    the scaled squared distance, shifted by its maximum and exponentiated; returns ``(maximum, sum)``."""
    best = shifted_log_gates(n, log_prior, dist, inv_two_sigma2, gate, 0)
    z = 0.0
    for i in range(n):
        gate[i] = math.exp(gate[i])
        z += gate[i]
    return best, z


@numba.njit(cache=True, nogil=True, inline="always")
def shifted_log_gates(n, log_prior, dist, inv_two_sigma2, out, o0):  # pragma: no cover - compiled
    """``out[o0 + i]``: position ``i``'s log prior less its scaled squared distance, less the largest of the first
    ``n`` (so at most 0, ready to exponentiate); returns that largest."""
    best = -np.inf
    for i in range(n):
        v = log_prior[i] - dist[i] * inv_two_sigma2
        out[o0 + i] = v
        best = max(best, v)
    for i in range(n):
        out[o0 + i] -= best
    return best


@numba.njit(cache=True, nogil=True, inline="always")
def grid_points(w, n, log_prior, dist, inv_two_sigma2, gate_const, emis, gate, out_pred, out_joint):  # pragma: no cover
    """Add one row into ``out_*`` (G1, G2*G3) from its first ``n`` positions' log prior, squared distance and
    emission of the target at every strength pair (``emis`` (G2*G3, N)): one softmax per gate variance."""
    n_sigma = inv_two_sigma2.shape[0]
    for g in range(n_sigma):
        best, z = gate_softmax(n, log_prior, dist, inv_two_sigma2[g], gate)
        log_z = math.log(z)
        for k in range(emis.shape[0]):
            num = 0.0
            for i in range(n):
                num += gate[i] * emis[k, i]
            log_num = math.log(num) if num > 0.0 else -np.inf
            out_pred[g, k] += w * (log_num - log_z)
            out_joint[g, k] += w * (log_num + best + gate_const[g])


_NO_TABLE = np.zeros((0, 0))
_NO_INDEX = np.zeros(0, dtype=np.int64)
_NO_SYMBOLS = np.zeros(0, dtype=np.int32)
_NO_COUNTS = np.zeros(0)
_NO_DIRECT_ROW = np.zeros(0, dtype=np.int32)
_NO_DIRECT_SLOTS = np.zeros((0, 0), dtype=np.int32)


def grid_count_arrays(table: GridTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A grid table's counts as :func:`grid_count` reads them: ``(dense (T, S) counts, support indptr (T + 1,),
    support symbols (P,), pair counts (P,))``, the layout's unused side empty."""
    counts = table.counts
    if isinstance(counts, SparseEmissionCounts):
        support = counts.support
        assert support is not None, "a grid table's sparse counts carry their support"
        return _NO_TABLE, support.indptr, support.symbols, counts.counts
    assert isinstance(counts, DenseEmissionCounts)
    return counts.count_ts, _NO_INDEX, _NO_SYMBOLS, _NO_COUNTS


class GridRowCache:
    """The rows a grid pass remembers (:data:`GRID_ROW_SLOTS` of them; ``slots=0``: none), for one table's points
    and one query width: give the same one to every block of a partition (:func:`score_grid`'s ``rows``)."""

    def __init__(self, table: GridTable, query_dim: int, context_length: int, slots: int = GRID_ROW_SLOTS) -> None:
        if slots < 0 or slots & (slots - 1):
            raise ValueError(f"slots = {slots}: expected 0 or a power of two")
        g1, g2, g3 = table.shape
        m = slots + 1  # and one for the rows computed and not kept, never read back
        self.context = np.zeros((m, context_length), dtype=np.int64)
        self.query = np.zeros((m, query_dim), dtype=np.uint64)
        self.target = np.full(m, -1, dtype=np.int64)
        self.num = np.empty((m, g1, g2 * g3))
        self.log_z = np.empty((m, g1))
        self.best = np.empty((m, g1))
        self.table = table
        self.slots = slots
        #: How many rows were found in a slot (their sums read back).
        self.hits = np.zeros(1, dtype=np.int64)


def _query_bits(query: np.ndarray) -> np.ndarray:
    """A batch's queries as unsigned integers of their own width (their bits, compared by the row cache)."""
    query = np.ascontiguousarray(query)
    return query.view(np.dtype(f"u{query.dtype.itemsize}"))


@dataclass(frozen=True)
class PlannedRows:
    """A batch of rows as the grid kernel scores them (:func:`plan_grid_rows`): what it reads of them, whatever the
    grid's points and the M-step's values, so the rows of a held-out partition can be scored again at the next
    M-step's grid without being read, windowed and looked up in the support again.

    Attributes:
        plan: (n,) int32, the rows of nonzero weight in order, each its slot ``s`` when computed or ``~s`` when read
            back from it (:func:`_plan_rows`).
        weights: (n,) float64 their weights; empty when each is 1.
        context: (m, N) int32, the computed rows' context ids; ``target``: (m,) int32 their targets.
        query_row: (m,) int32, each computed row's query among ``queries`` (u, D) float64 (the distinct ones;
            float32 queries widened, exactly).
        pairs: (m, N) int32, the support's index of each position's pair with the target (-1 off the support);
            (0, N) for dense counts.
        hits: how many rows are read back.
    """

    plan: np.ndarray
    weights: np.ndarray
    context: np.ndarray
    query_row: np.ndarray
    queries: np.ndarray
    target: np.ndarray
    pairs: np.ndarray
    hits: int

    @property
    def nbytes(self) -> int:
        arrays = (self.plan, self.weights, self.context, self.query_row, self.queries, self.target, self.pairs)
        return sum(int(a.nbytes) for a in arrays)


def plan_grid_rows(
    table: GridTable,
    x: tuple[Any, Any, Any],
    weights: Any = None,
    *,
    checked: bool = False,
    rows: GridRowCache,
) -> PlannedRows:
    """An encoded batch ``(context (n, N), query (n, D), target (n,))`` planned for :func:`score_planned` under
    ``table``'s counts (their support's pairs found now), its repeated rows found through ``rows`` (the rows
    remembered from the blocks before; updated). Bad ids or values raise naming the row, unless ``checked`` says the
    caller has checked them."""
    counts = table.counts
    context, query, target, w = check_batch(
        x,
        weights,
        num_symbols=counts.num_symbols,
        context_length=table.log_prior.shape[0],
        query_dim=table.key_means.shape[1],
        num_targets=counts.num_targets,
        values_checked=checked,
    )
    if rows.table is not table:
        raise ValueError("a grid row cache serves the table it was made for")
    weights64 = np.zeros(0) if w is None else w.astype(np.float64, copy=False)
    n_rows = context.shape[0]
    plan = np.empty(n_rows, dtype=np.int32)
    counted = np.empty(n_rows, dtype=np.int64)
    fresh = np.empty(n_rows, dtype=np.int64)
    query_bits = _query_bits(query)
    n, m = _plan_rows(
        context, query_bits, target, weights64, rows.context, rows.query, rows.target, rows.hits,
        plan, counted, fresh,
    )  # fmt: skip
    counted, fresh = counted[:n], fresh[:m]
    kept_weights = weights64[counted] if weights64.shape[0] else weights64
    if kept_weights.shape[0] and bool(np.all(kept_weights == 1.0)):
        kept_weights = np.zeros(0)
    fresh_context = np.ascontiguousarray(context[fresh], dtype=np.int32)
    fresh_target = np.ascontiguousarray(target[fresh], dtype=np.int32)
    query_row = np.empty(m, dtype=np.int32)
    first = _intern_rows(np.ascontiguousarray(query_bits[fresh]), query_row)
    queries = np.ascontiguousarray(query[fresh[first]], dtype=np.float64)  # float32 widened: one build for both
    _, indptr, symbols, _ = grid_count_arrays(table)
    if indptr.shape[0]:
        pairs = np.empty(fresh_context.shape, dtype=np.int32)
        _fresh_pairs(fresh_context, fresh_target, indptr, symbols, *table.direct_pair_rows, pairs)
    else:
        pairs = np.zeros((0, fresh_context.shape[1]), dtype=np.int32)
    return PlannedRows(plan[:n].copy(), kept_weights, fresh_context, query_row, queries, fresh_target, pairs, n - m)


def score_planned(table: GridTable, planned: PlannedRows, rows: GridRowCache) -> GridTotals:
    """Held-out totals of planned rows (:func:`plan_grid_rows`, under counts over the same support as ``table``'s)
    at every point of ``table``; ``rows``: the slots the rows are computed into and read back from (made for
    ``table``, with as many slots as the plan's, given to every batch of a partition in order)."""
    if rows.table is not table:
        raise ValueError("a grid row cache serves the table it was made for")
    dense_ts, indptr, _, pair_counts = grid_count_arrays(table)
    if (planned.pairs.shape[0] > 0) != (indptr.shape[0] > 0) and planned.context.shape[0] > 0:
        raise ValueError("rows planned for one layout of counts are scored against the other")
    g1, g2, g3 = table.shape
    pred = np.zeros((g1, g2 * g3))
    joint = np.zeros((g1, g2 * g3))
    dim = table.key_means.shape[1]
    weight = _grid_planned(
        planned.plan,
        planned.weights,
        planned.context,
        planned.query_row,
        planned.queries,
        planned.target,
        planned.pairs,
        table.key_means,
        table.log_prior,
        dense_ts,
        pair_counts,
        # Counts are whole numbers (exact in float64): one type, so the kernel builds once for dense and sparse tables.
        np.asarray(table.row_totals, dtype=np.float64),
        table.base,
        table.types,
        0.5 / table.sigma2,
        -0.5 * dim * np.log(2.0 * np.pi * table.sigma2),
        # Strength pair k = h * G3 + b: emission strength h, type strength b (grid_row's order).
        np.repeat(table.emission_strengths, g3),
        np.tile(table.type_strengths, g2),
        rows.num,
        rows.log_z,
        rows.best,
        pred,
        joint,
    )
    return GridTotals(float(weight), pred.reshape(g1, g2, g3), joint.reshape(g1, g2, g3))


def score_grid(
    table: GridTable,
    x: tuple[Any, Any, Any],
    weights: Any = None,
    *,
    checked: bool = False,
    rows: GridRowCache | None = None,
) -> GridTotals:
    """Held-out totals of an encoded batch ``(context (n, N), query (n, D), target (n,))`` at every grid point.

    Rows of weight 0 (for instance the training rows of a store whose hold-out is being scored) cost
    nothing. Bad ids or values raise naming the row, unless ``checked`` says the caller has checked them.
    ``rows``: the rows remembered from the blocks before (:class:`GridRowCache`, made for ``table``; ``None``: a
    new one for this batch). The totals are the same bits with or without it.
    """
    if rows is None:
        query_dim, context_length = table.key_means.shape[1], table.log_prior.shape[0]
        rows = GridRowCache(table, query_dim, context_length)
    return score_planned(table, plan_grid_rows(table, x, weights, checked=checked, rows=rows), rows)


class GridRows:
    """A partition's held-out rows planned for the grid kernel, batch by batch (:class:`PlannedRows`), which a
    worker keeps to score the fit's later grids on them (:meth:`score`) without reading them again.

    The plan holds the support's pair indices: it serves tables whose counts lie on the same support (the same
    object, or the same pairs), in the same layout; the support is held weakly, so a plan never keeps a fit's
    support alive nor is taken for another one made at the same address.
    """

    def __init__(self, blocks: tuple[PlannedRows, ...], table: GridTable, slots: int) -> None:
        self.blocks = blocks
        self.slots = slots
        self.query_dim, self.context_length = table.key_means.shape[1], table.log_prior.shape[0]
        support = getattr(table.counts, "support", None)
        self.sparse = isinstance(table.counts, SparseEmissionCounts)
        self._support = None if support is None else weakref.ref(support)

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks)

    def serves(self, table: GridTable) -> bool:
        """Whether ``table`` may be scored from this plan: the same layout, shape and support."""
        if table.buckets is not None or isinstance(table.counts, SparseEmissionCounts) != self.sparse:
            return False
        if (table.key_means.shape[1], table.log_prior.shape[0]) != (self.query_dim, self.context_length):
            return False
        if not self.sparse:
            return True
        mine = None if self._support is None else self._support()
        theirs = getattr(table.counts, "support", None)
        return mine is not None and theirs is not None and mine.same_as(theirs)

    def score(self, table: GridTable) -> GridTotals:
        """The totals :func:`score_grid` gives these rows' blocks in order under ``table`` (which it :meth:`serves`),
        to the bit."""
        if not self.serves(table):
            raise ValueError("these planned rows do not serve this grid table (another support, layout or shape)")
        rows = GridRowCache(table, self.query_dim, self.context_length, self.slots)
        totals = GridTotals.zeros(table.shape)
        for block in self.blocks:
            totals = totals + score_planned(table, block, rows)
        return totals
