"""Interpolated modified Kneser-Ney n-grams (orders 2 to 5) from additive counts of a token store's rows.

A row is a window of earlier tokens, oldest first (its last token the most recent), and a target; windows
never cross a document start, so a row near one has a shorter history. The statistics of a set of rows are
additive (:class:`NGramCounts`, ``a + b``): for each order k, the weighted counts of the k-grams
``(w_1 .. w_{k-1}, t)`` that are their rows' *top* n-grams, the longest a row's history gives (``min(n, L + 1)``
tokens for a history of L). Everything else is derived from the merged counts when the model is fitted
(:func:`fit_kneser_ney`), following Chen & Goodman 1998 ("An empirical study of smoothing techniques for
language modeling", §3 and §4.1.6: interpolated, modified Kneser-Ney)::

    a_n(h t)   = c(h t)                                   the highest order: raw counts
    a_k(g)     = N1+(• g) + c_top(g)                      k < n: distinct left extensions among the (k+1)-grams,
                                                          plus the raw count of rows whose history ends before
                                                          g could be extended (a document start: KenLM's rule
                                                          for n-grams that begin with <s>)
    P_0(t)     = 1 / T                                    uniform: every target keeps a positive probability
    P_k(t | h) = (a_k(h t) - min(a_k(h t), D_k(a))) / A_k(h) + γ_k(h) P_{k-1}(t | h')
    A_k(h)     = Σ_t a_k(h t),  γ_k(h) = Σ_t min(a_k(h t), D_k(a_k(h t))) / A_k(h)
    P_k(t | h) = P_{k-1}(t | h')                          when A_k(h) = 0 (an unseen history)

with h' the history without its oldest token. The discount depends on the count: ``D_k(a) = D_k1, D_k2, D_k3+``
for a (rounded to the nearest integer) of 1, 2, 3 or more, from the counts of counts n_r of the a_k::

    Y = n1 / (n1 + 2 n2),  D_k1 = 1 - 2 Y n2 / n1,  D_k2 = 2 - 3 Y n3 / n2,  D_k3+ = 3 - 4 Y n4 / n3

each clipped to [0.01, r] (a discount larger than the count it takes from would give negative mass); an
undefined one (a zero n_r) falls back to :data:`~dist_respattn.baselines.ngram.FALLBACK_DISCOUNT`. Taking
``min(a, D)`` rather than D keeps every row summing to one for fractional (weighted) counts too. With held-out
counts the discounts are tuned by one scale s on all of them over :data:`SCALE_GRID` (1, the closed form, is
among the candidates and wins ties), maximizing the held-out log-likelihood.

Keys are exact: a history's id is built order by order (the id of ``(w_1 .. w_j)`` is the rank of the pair
``(id of (w_2 .. w_j), w_1)``), so a k-gram is the int64 key ``id(h) * T + t``; every look-up is a
``searchsorted`` over sorted keys, vectorized over rows. Memory: O(distinct n-grams × order) for the counts
and the fitted model (int32 columns, int64 keys, float64 counts); nothing is S×T.

Sums over rows (the log-likelihoods, the correct weight, the weight) are taken in a fixed order of
:data:`SHARDS` parts (:func:`split_counts`): the n-grams whose history's most recent token is ``w`` go to part
``w mod SHARDS``, the rows without a history to part 0; each part's terms are summed exactly (``math.fsum``) and
the parts added in order. Every suffix of a history keeps its most recent token, so a part's n-grams are scored
from that part's counts alone and the unigram level (``T`` numbers): the cluster counts, fits and scores each
part on a worker (:mod:`dist_respattn.engine.ngram_shards`) to the same bits as this module in one process.

Accuracy is the weighted fraction of rows whose target is the first arg-max of ``P_n(· | h)``: that arg-max lies
among h's observed continuations and the arg-max one order down (the rest of the row is ``γ P_{k-1}``), so it is
found per history, order by order, in O(distinct n-grams).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dist_respattn.baselines.ngram import FALLBACK_DISCOUNT, BaselineScore

__all__ = [
    "MAX_ORDER",
    "MIN_ORDER",
    "SCALE_GRID",
    "SHARDS",
    "KneserNey",
    "NGramCounts",
    "PartScore",
    "Unigrams",
    "block_histories",
    "block_ngrams",
    "counts_of_counts",
    "discounts_of_counts",
    "distinct_bigram_targets",
    "fit_kneser_ney",
    "kneser_ney_parameters",
    "modified_discounts",
    "ngrams_of_blocks",
    "scaled_discounts",
    "split_counts",
    "tuned_scale",
    "unigram_level",
]

#: The orders ``--baseline-order`` takes (2 is today's bigrams only).
MIN_ORDER, MAX_ORDER = 2, 5
#: Candidate scales of the closed-form discounts, tried on held-out counts.
SCALE_GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
#: The parts the sums over rows are taken in (and the cluster's shards of the counts): see the module.
SHARDS = 8
_DISCOUNT_FLOOR = 0.01
_INT64_MAX = np.iinfo(np.int64).max


# -- counts -----------------------------------------------------------------------------------------------


def _unique_rows(cols: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lexicographically sorted distinct rows of ``cols`` (m, k) and the sums of their ``values`` (m,).

    The sort is stable, so equal rows are summed in their order in ``cols`` (a fixed tree gives fixed sums).
    """
    if cols.shape[0] == 0:
        return cols, values
    order = np.lexsort(cols.T[::-1])
    cols, values = cols[order], values[order]
    new = np.r_[True, np.any(cols[1:] != cols[:-1], axis=1)]
    starts = np.flatnonzero(new)
    return cols[starts], np.add.reduceat(values, starts)


@dataclass(frozen=True)
class NGramCounts:
    """Weighted counts of the rows' top n-grams, by order: additive, so partitions' counts merge with ``+``.

    Attributes:
        order: n, the longest n-gram counted.
        num_symbols, num_targets: S (history tokens) and T (targets).
        grams: ``grams[k - 1]`` (m_k, k) int32, the distinct k-grams that are some row's top n-gram: columns
            ``0 .. k-2`` the history, oldest first, column ``k-1`` the target; rows sorted lexicographically.
        counts: ``counts[k - 1]`` (m_k,) float64, their summed row weights (> 0).
    """

    order: int
    num_symbols: int
    num_targets: int
    grams: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]

    @classmethod
    def empty(cls, order: int, num_symbols: int, num_targets: int) -> NGramCounts:
        grams = tuple(np.zeros((0, k), dtype=np.int32) for k in range(1, order + 1))
        return cls(int(order), int(num_symbols), int(num_targets), grams, tuple(np.zeros(0) for _ in grams))

    @classmethod
    def from_rows(
        cls,
        history: np.ndarray,
        lengths: np.ndarray,
        targets: np.ndarray,
        weights: np.ndarray | None,
        *,
        order: int,
        num_symbols: int,
        num_targets: int,
    ) -> NGramCounts:
        """Count rows: ``history`` (m, K) ids, the most recent last, of which the last ``lengths`` (m,) are the
        row's (the rest is ignored); ``targets`` (m,); ``weights`` (m,) or ``None`` (rows of weight 0 add nothing)."""
        if not MIN_ORDER - 1 <= order <= MAX_ORDER:
            raise ValueError(f"order = {order!r}: expected 1 to {MAX_ORDER}")
        history = np.asarray(history)
        m, depth = history.shape
        lengths = np.minimum(np.asarray(lengths, dtype=np.int64), depth)
        targets = np.asarray(targets)
        for name, ids, bound in (("history", history, num_symbols), ("targets", targets, num_targets)):
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= bound):
                raise ValueError(f"{name}: ids outside [0, {bound})")
        live = np.ones(m, dtype=bool) if weights is None else np.asarray(weights) > 0
        w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64)
        top = np.minimum(lengths, order - 1) + 1
        grams, counts = [], []
        for k in range(1, order + 1):
            sel = live & (top == k)
            if not sel.any():
                grams.append(np.zeros((0, k), dtype=np.int32))
                counts.append(np.zeros(0))
                continue
            cols = np.empty((int(sel.sum()), k), dtype=np.int32)
            cols[:, : k - 1] = history[sel, depth - (k - 1) :]
            cols[:, k - 1] = targets[sel]
            g, c = _unique_rows(cols, w[sel])
            grams.append(g)
            counts.append(c)
        return cls(int(order), int(num_symbols), int(num_targets), tuple(grams), tuple(counts))

    def __add__(self, other: NGramCounts) -> NGramCounts:
        shape, other_shape = (
            (self.order, self.num_symbols, self.num_targets),
            (
                other.order,
                other.num_symbols,
                other.num_targets,
            ),
        )
        if shape != other_shape:
            raise ValueError(f"n-gram counts of (n, S, T) = {shape} and {other_shape} cannot be added")
        grams, counts = [], []
        for a, ca, b, cb in zip(self.grams, self.counts, other.grams, other.counts, strict=True):
            if b.shape[0] == 0 or a.shape[0] == 0:
                grams.append(a if b.shape[0] == 0 else b)
                counts.append(ca if b.shape[0] == 0 else cb)
                continue
            g, c = _unique_rows(np.concatenate([a, b]), np.concatenate([ca, cb]))
            grams.append(g)
            counts.append(c)
        return NGramCounts(self.order, self.num_symbols, self.num_targets, tuple(grams), tuple(counts))

    def truncated(self, order: int) -> NGramCounts:
        """The counts the same rows give at a lower ``order`` (top n-grams longer than it lose their oldest tokens)."""
        if not 1 <= order <= self.order:
            raise ValueError(f"order = {order!r}: expected 1 to {self.order}")
        if order == self.order:
            return self
        cols = np.concatenate([g[:, g.shape[1] - order :] for g in self.grams[order - 1 :]])
        top, top_counts = _unique_rows(cols, np.concatenate(self.counts[order - 1 :]))
        grams, counts = (*self.grams[: order - 1], top), (*self.counts[: order - 1], top_counts)
        return NGramCounts(order, self.num_symbols, self.num_targets, grams, counts)

    @property
    def num_grams(self) -> int:
        return int(sum(g.shape[0] for g in self.grams))

    @property
    def total(self) -> float:
        return float(sum(float(c.sum()) for c in self.counts))

    @property
    def nbytes(self) -> int:
        return int(sum(g.nbytes + c.nbytes for g, c in zip(self.grams, self.counts, strict=True)))


def block_histories(block: Any, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """``(history (n, depth) int64, lengths (n,), targets (n,), weights)`` of a block's rows: the last ``depth``
    tokens of each window, most recent last (a window of fewer tokens, cut at its document's start or shorter
    than depth, is left-padded with 0 and its length says so). ``weights``: the block's, or ``None``."""
    rows = block.rows
    steps = np.arange(depth, dtype=np.int64)
    if hasattr(rows, "tokens"):
        end = np.asarray(rows.end, dtype=np.int64)
        lengths = np.minimum(end - np.asarray(rows.begin, dtype=np.int64), depth)
        at = end[:, None] - depth + steps[None, :]
        valid = at >= (end - lengths)[:, None]
        tokens = np.asarray(rows.tokens)
        history = np.where(valid, tokens[np.where(valid, at, 0)] if tokens.size else 0, 0).astype(np.int64)
    else:
        context = np.asarray(rows.context)
        n, width = context.shape
        history = np.zeros((n, depth), dtype=np.int64)
        used = min(width, depth)
        if used:
            history[:, depth - used :] = context[:, width - used :]
        lengths = np.full(n, used, dtype=np.int64)
    return history, lengths, np.asarray(rows.target, dtype=np.int64), block.weights


def block_ngrams(block: Any, order: int, num_symbols: int, num_targets: int) -> NGramCounts:
    """The top n-grams (up to ``order``) of a :class:`~dist_respattn.model.heads.base.Block`'s weighted rows."""
    history, lengths, targets, weights = block_histories(block, order - 1)
    return NGramCounts.from_rows(
        history, lengths, targets, weights, order=order, num_symbols=num_symbols, num_targets=num_targets
    )


def ngrams_of_blocks(order: int, num_symbols: int, num_targets: int, blocks: Iterable[Any]) -> NGramCounts:
    """The top n-grams of blocks' rows, added block by block in order (a pass's partition map)."""
    counts = NGramCounts.empty(order, num_symbols, num_targets)
    for block in blocks:
        counts = counts + block_ngrams(block, order, num_symbols, num_targets)
    return counts


def split_counts(counts: NGramCounts, n_shards: int = SHARDS) -> tuple[NGramCounts, tuple[NGramCounts, ...]]:
    """``(common, shards)``: the counts of the rows without a history (the 1-grams), and ``n_shards`` counts of
    the n-grams whose history's most recent token is ``w``, in shard ``w mod n_shards`` (order kept: each part is
    sorted). Additive part by part: the parts of a sum are the sums of the parts."""
    empty = NGramCounts.empty(counts.order, counts.num_symbols, counts.num_targets)
    common = dataclasses.replace(
        empty, grams=(counts.grams[0], *empty.grams[1:]), counts=(counts.counts[0], *empty.counts[1:])
    )
    owner = [np.zeros(0, dtype=np.int64)] + [g[:, -2] % n_shards for g in counts.grams[1:]]
    shards = []
    for j in range(n_shards):
        grams, values = [empty.grams[0]], [empty.counts[0]]
        for g, c, o in zip(counts.grams[1:], counts.counts[1:], owner[1:], strict=True):
            mine = o == j
            grams.append(g[mine])
            values.append(c[mine])
        shards.append(dataclasses.replace(counts, grams=tuple(grams), counts=tuple(values)))
    return common, tuple(shards)


def _canonical_parts(counts: NGramCounts) -> list[NGramCounts]:
    """The :data:`SHARDS` parts the sums over ``counts``' rows are taken in: shard 0 with the rows without a
    history, then shards 1, 2, ..."""
    common, shards = split_counts(counts)
    return [common + shards[0], *shards[1:]]


def distinct_bigram_targets(counts: NGramCounts) -> np.ndarray:
    """(T,) int64: for each target t, the distinct bigrams ``(v, t)`` that end some counted n-gram of order 2 or
    more (its last two tokens): the bigram level's n-grams, so their number by target is ``N1+(• t)``, the left
    extensions of the unigram t. Disjoint shards' (:func:`split_counts`) add up to the whole's."""
    pairs = [g[:, -2:].astype(np.int64) for g in counts.grams[1:] if g.shape[0]]
    if not pairs:
        return np.zeros(counts.num_targets, dtype=np.int64)
    keys = np.unique(np.concatenate([p[:, 0] * counts.num_targets + p[:, 1] for p in pairs]))
    return np.bincount(keys % counts.num_targets, minlength=counts.num_targets).astype(np.int64)


@dataclass(frozen=True)
class Unigrams:
    """The unigram level of a model: ``grams`` (m, 1) int32 the targets, sorted; ``adjusted`` (m,) a_1 of each
    (``N1+(• t) + c_top(t)``). Shared by every shard's model."""

    grams: np.ndarray
    adjusted: np.ndarray


def unigram_level(common: NGramCounts, *bigram_targets: np.ndarray) -> Unigrams:
    """The unigram level from the 1-gram counts ``common`` and the shards' :func:`distinct_bigram_targets`:
    added as the whole model adds them (each bigram's 1, then the 1-gram's count), so to the same bits."""
    per_target = np.sum(np.stack(bigram_targets), axis=0) if bigram_targets else np.zeros(common.num_targets, int)
    targets = np.repeat(np.arange(common.num_targets, dtype=np.int32), per_target)
    cols = np.concatenate([targets[:, None], common.grams[0]])
    values = np.concatenate([np.ones(targets.size), common.counts[0]])
    grams, adjusted = _unique_rows(cols, values)
    return Unigrams(grams, adjusted)


# -- the model --------------------------------------------------------------------------------------------


def counts_of_counts(adjusted: np.ndarray) -> dict[str, int]:
    """The n_r (r = 1 to 4) of one order's (adjusted) counts, rounded to the nearest integer first (``[0.5, 1.5)``
    is a 1, ...): additive over disjoint sets of n-grams."""
    rounded = np.floor(np.asarray(adjusted, dtype=np.float64) + 0.5)
    return {f"n{r}": int(np.count_nonzero(rounded == float(r))) for r in (1, 2, 3, 4)}


def discounts_of_counts(n: dict[str, int]) -> tuple[float, float, float]:
    """Chen & Goodman's closed-form ``(D1, D2, D3+)`` from one order's counts of counts (:func:`counts_of_counts`)."""
    n1, n2, n3, n4 = (int(n[f"n{r}"]) for r in (1, 2, 3, 4))
    fallback = FALLBACK_DISCOUNT
    y = n1 / (n1 + 2 * n2) if n1 + 2 * n2 else None
    d1 = 1.0 - 2.0 * y * n2 / n1 if y is not None and n1 else fallback
    d2 = 2.0 - 3.0 * y * n3 / n2 if y is not None and n2 else fallback
    d3 = 3.0 - 4.0 * y * n4 / n3 if y is not None and n3 else fallback
    clipped = tuple(float(np.clip(d, _DISCOUNT_FLOOR, r)) for r, d in ((1, d1), (2, d2), (3, d3)))
    return clipped[0], clipped[1], clipped[2]


def modified_discounts(adjusted: np.ndarray) -> tuple[tuple[float, float, float], dict[str, int]]:
    """Chen & Goodman's closed-form ``(D1, D2, D3+)`` from one order's (adjusted) counts, and the n_r used.

    Counts are rounded to the nearest integer before they are counted (``[0.5, 1.5)`` is a 1, ...).
    """
    n = counts_of_counts(adjusted)
    return discounts_of_counts(n), n


def _taken(a: np.ndarray, discounts: np.ndarray) -> np.ndarray:
    """(m,) ``min(a, D(a))``: what discounting takes from counts ``a`` with ``discounts`` (D1, D2, D3+)."""
    rounded = np.floor(a + 0.5)
    d = np.where(rounded <= 1.0, discounts[0], np.where(rounded == 2.0, discounts[1], discounts[2]))
    return np.minimum(a, d)


def _find(keys: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(found (m,) bool, position (m,) int64)`` of ``query`` in the sorted ``keys`` (position 0 when absent)."""
    if keys.size == 0:
        return np.zeros(query.shape, dtype=bool), np.zeros(query.shape, dtype=np.int64)
    at = np.minimum(np.searchsorted(keys, query), keys.size - 1)
    found = keys[at] == query
    return found, np.where(found, at, 0)


@dataclass(frozen=True)
class _Level:
    """Order k's n-grams: ``keys`` (m,) sorted ``id(h) * T + t``, ``adjusted`` a_k, ``history`` id(h) of each,
    ``totals`` (H,) A_k(h) over the H histories of level k - 1."""

    keys: np.ndarray
    adjusted: np.ndarray
    history: np.ndarray
    totals: np.ndarray


@dataclass(frozen=True)
class _Lookup:
    """Rows seen through the model, per order k: whether their history of k - 1 tokens is known, its id, a_k."""

    found: list[np.ndarray]
    ids: list[np.ndarray]
    adjusted: list[np.ndarray]


@dataclass(frozen=True, eq=False)
class KneserNey:
    """Interpolated modified Kneser-Ney of order n, fitted from merged :class:`NGramCounts` (see the module).

    ``discounts`` (n + 1, 3): row k holds order k's ``(D1, D2, D3+)`` (row 0 unused). Build with
    :func:`fit_kneser_ney`. ``unigrams``: the unigram level made elsewhere (:func:`unigram_level`), for the model
    of one shard of the counts (:func:`split_counts`): it scores that shard's rows as the whole model does.
    """

    train: NGramCounts
    discounts: np.ndarray
    parameters: dict[str, Any]
    unigrams: Unigrams | None = field(default=None, repr=False)
    #: trie[j]: (H_j,) sorted keys ``id(h[1:]) * S + h[0]`` of the histories of j tokens (trie[0]: the empty one).
    trie: list[np.ndarray] = field(init=False, repr=False)
    levels: list[_Level] = field(init=False, repr=False)
    gammas: list[np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        order, s, t = self.train.order, self.train.num_symbols, self.train.num_targets
        # The n-grams of every order and their adjusted counts, from the top order down.
        grams: list[np.ndarray] = [np.zeros((0, 0), dtype=np.int32)] * (order + 1)
        adjusted: list[np.ndarray] = [np.zeros(0)] * (order + 1)
        grams[order], adjusted[order] = self.train.grams[order - 1], self.train.counts[order - 1]
        for k in range(order - 1, 0, -1):
            if k == 1 and self.unigrams is not None:
                grams[k], adjusted[k] = self.unigrams.grams, self.unigrams.adjusted
                continue
            upper = grams[k + 1]
            cols = np.concatenate([upper[:, 1:], self.train.grams[k - 1]])
            values = np.concatenate([np.ones(upper.shape[0]), self.train.counts[k - 1]])
            grams[k], adjusted[k] = _unique_rows(cols, values)
        trie: list[np.ndarray] = [np.zeros(1 if grams[1].shape[0] else 0, dtype=np.int64)]
        object.__setattr__(self, "trie", trie)
        for j in range(1, order):
            cols = grams[j + 1][:, :j]  # sorted rows: their distinct histories are the runs
            if cols.shape[0]:
                cols = cols[np.r_[True, np.any(cols[1:] != cols[:-1], axis=1)]]
            parents = self._history_ids(cols[:, 1:])[-1]
            if cols.shape[0] and int(parents.max()) >= (_INT64_MAX - s) // max(s, 1):
                raise OverflowError("too many distinct histories for int64 keys")
            trie.append(np.sort(parents * s + cols[:, 0]))
        levels = [_Level(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), np.zeros(0))]
        for k in range(1, order + 1):
            ids = self._history_ids(grams[k][:, : k - 1])[-1]
            keys = ids * t + grams[k][:, k - 1]
            by_key = np.argsort(keys, kind="stable")
            ids = ids[by_key]
            values = adjusted[k][by_key]
            totals = np.bincount(ids, weights=values, minlength=trie[k - 1].size)
            levels.append(_Level(keys[by_key], values, ids, totals))
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "gammas", self._gammas(self.discounts))

    # -- structure ------------------------------------------------------------------------------

    @property
    def order(self) -> int:
        return self.train.order

    @property
    def num_targets(self) -> int:
        return self.train.num_targets

    @property
    def num_grams(self) -> int:
        return int(sum(level.keys.size for level in self.levels))

    def _history_ids(self, history: np.ndarray) -> list[np.ndarray]:
        """Ids of the histories' suffixes of 0 .. j tokens (``history`` (m, j), most recent last): j + 1 arrays
        (m,) int64, -1 where the suffix never occurred in training."""
        m, j = history.shape
        ids = [np.full(m, 0 if self.trie[0].size else -1, dtype=np.int64)]
        s = self.train.num_symbols
        for i in range(1, j + 1):
            previous = ids[-1]
            if i >= len(self.trie):
                ids.append(np.full(m, -1, dtype=np.int64))
                continue
            found, at = _find(self.trie[i], np.maximum(previous, 0) * s + history[:, j - i])
            ids.append(np.where(found & (previous >= 0), at, -1))
        return ids

    def _gammas(self, discounts: np.ndarray) -> list[np.ndarray]:
        """Per order k, (H,) ``Σ_t min(a, D(a))`` of each history of k - 1 tokens: γ_k(h) A_k(h)."""
        out: list[np.ndarray] = [np.zeros(0)]
        for k in range(1, self.order + 1):
            level = self.levels[k]
            taken = _taken(level.adjusted, discounts[k])
            out.append(np.bincount(level.history, weights=taken, minlength=level.totals.size))
        return out

    def _lookup(self, history: np.ndarray, targets: np.ndarray) -> _Lookup:
        """The rows' histories (m, j) and targets (m,) through the model, for orders 1 .. j + 1."""
        ids = self._history_ids(history)
        t = self.num_targets
        found, safe, adjusted = [], [], []
        for k in range(1, min(history.shape[1] + 1, self.order) + 1):
            level = self.levels[k]
            known = ids[k - 1] >= 0
            at = np.where(known, ids[k - 1], 0)
            hit, where = _find(level.keys, at * t + targets)
            found.append(known)
            safe.append(at)
            adjusted.append(np.where(hit & known, level.adjusted[where] if level.keys.size else 0.0, 0.0))
        return _Lookup(found, safe, adjusted)

    def _probs(self, lookup: _Lookup, discounts: np.ndarray, gammas: list[np.ndarray]) -> np.ndarray:
        """(m,) P of the looked-up rows, interpolated from the uniform distribution up."""
        m = lookup.found[0].shape[0] if lookup.found else 0
        p = np.full(m, 1.0 / self.num_targets)
        for k, (known, at, a) in enumerate(zip(lookup.found, lookup.ids, lookup.adjusted, strict=True), start=1):
            if not known.any():
                continue
            totals, gamma = self.levels[k].totals[at], gammas[k][at]
            safe_totals = np.where(known, totals, 1.0)
            p = np.where(known, (a - _taken(a, discounts[k]) + gamma * p) / safe_totals, p)
        return p

    # -- scoring --------------------------------------------------------------------------------

    def log_prob(self, history: Any, targets: Any, lengths: Any = None) -> np.ndarray:
        """(m,) ``log P(targets[i] | history[i])``: ``history`` (m, K) token ids, most recent last, of which the
        last ``lengths[i]`` are row i's (default all K; the model reads at most its n - 1)."""
        history = np.asarray(history, dtype=np.int64)
        targets = np.asarray(targets, dtype=np.int64)
        m, depth = history.shape
        lengths = np.full(m, depth) if lengths is None else np.minimum(np.asarray(lengths, dtype=np.int64), depth)
        lengths = np.minimum(lengths, self.order - 1)
        out = np.empty(m)
        for j in np.unique(lengths):
            rows = np.flatnonzero(lengths == j)
            lookup = self._lookup(history[rows, depth - int(j) :], targets[rows])
            out[rows] = np.log(self._probs(lookup, self.discounts, self.gammas))
        return out

    def best_targets(self) -> list[np.ndarray]:
        """Per order k (index k), (H,) the first arg-max of ``P_k(· | h)`` for each known history of k - 1 tokens."""
        t = self.num_targets
        best = [np.zeros(1, dtype=np.int64)]
        best_p = [np.full(1, 1.0 / t)]
        values = [np.zeros(0)]
        s = self.train.num_symbols
        for k in range(1, self.order + 1):
            level, disc, gamma = self.levels[k], self.discounts[k], self.gammas[k]
            if level.keys.size == 0:
                break
            targets = level.keys % t
            parents = self.trie[k - 1] // s if k > 1 else np.zeros(1, dtype=np.int64)
            if k == 1:
                lower = np.full(level.keys.size, 1.0 / t)
            else:
                _, at = _find(self.levels[k - 1].keys, parents[level.history] * t + targets)
                lower = values[k - 1][at]  # every n-gram's suffix is an n-gram one order down
            a = level.adjusted
            p = (a - _taken(a, disc) + gamma[level.history] * lower) / level.totals[level.history]
            values.append(p)
            backoff = best[k - 1][parents]
            hit, at = _find(level.keys, np.arange(parents.size, dtype=np.int64) * t + backoff)
            a_b = np.where(hit, a[at], 0.0)
            p_b = (a_b - _taken(a_b, disc) + gamma * best_p[k - 1][parents]) / level.totals
            starts = np.flatnonzero(np.r_[True, level.history[1:] != level.history[:-1]])
            top = np.maximum(np.maximum.reduceat(p, starts), p_b)
            runs = np.diff(np.r_[starts, level.history.size])
            first = np.minimum.reduceat(np.where(p == np.repeat(top, runs), targets, t), starts)
            best.append(np.where((p_b == top) & (backoff < first), backoff, first))
            best_p.append(top)
        return best

    def _predicted(self, history: np.ndarray, best: list[np.ndarray]) -> np.ndarray:
        """(m,) the first arg-max for rows of histories (m, j): the one of their longest known suffix."""
        ids = self._history_ids(history)
        out = np.zeros(history.shape[0], dtype=np.int64)
        for level in range(min(len(ids), len(best) - 1)):
            known = ids[level] >= 0
            out = np.where(known, best[level + 1][np.where(known, ids[level], 0)], out)
        return out

    def with_discounts(self, discounts: np.ndarray, parameters: dict[str, Any] | None = None) -> KneserNey:
        """This model (its n-grams shared, not copied) with other discounts (n + 1, 3) and parameters."""
        model = copy.copy(self)
        object.__setattr__(model, "discounts", np.asarray(discounts, dtype=np.float64))
        object.__setattr__(model, "gammas", self._gammas(model.discounts))
        if parameters is not None:
            object.__setattr__(model, "parameters", dict(parameters))
        return model

    def part_score(self, counts: NGramCounts, best: list[np.ndarray] | None = None) -> PartScore:
        """The sums of :meth:`score` over ``counts``' rows as they are (one part: see the module); ``best``: the
        model's :meth:`best_targets`, when made already."""
        if (counts.num_symbols, counts.num_targets) != (self.train.num_symbols, self.num_targets):
            raise ValueError("the evaluated counts are of another vocabulary than the training counts")
        if counts.total <= 0.0:
            return PartScore(0.0, 0.0, 0.0)
        best = self.best_targets() if best is None else best
        sum_log, correct, weight = [], [], []
        for grams, w in zip(counts.grams, counts.counts, strict=True):
            if grams.shape[0] == 0:
                continue
            j = min(grams.shape[1] - 1, self.order - 1)
            history = grams[:, grams.shape[1] - 1 - j : -1].astype(np.int64)
            targets = grams[:, -1].astype(np.int64)
            sum_log.append(
                math.fsum(w * np.log(self._probs(self._lookup(history, targets), self.discounts, self.gammas)))
            )
            correct.append(math.fsum(w[self._predicted(history, best) == targets]))
            weight.append(math.fsum(w))
        return PartScore(math.fsum(sum_log), math.fsum(correct), math.fsum(weight))

    def score(self, counts: NGramCounts) -> BaselineScore:
        """The model's score on an evaluated store's counts (each top n-gram weighted by its count)."""
        parts = _canonical_parts(counts)
        best = self.best_targets() if any(part.total > 0.0 for part in parts) else None
        return PartScore.total([self.part_score(part, best) for part in parts], self.parameters)

    def part_sum_log_prob(self, counts: NGramCounts, candidates: list[np.ndarray]) -> list[float]:
        """:meth:`sum_log_prob` over ``counts``' rows as they are (one part: see the module)."""
        lookups = []
        for grams, w in zip(counts.grams, counts.counts, strict=True):
            if grams.shape[0]:
                j = min(grams.shape[1] - 1, self.order - 1)
                history = grams[:, grams.shape[1] - 1 - j : -1].astype(np.int64)
                lookups.append((self._lookup(history, grams[:, -1]), w))
        totals = []
        for discounts in candidates:
            gammas = self._gammas(discounts)
            totals.append(
                math.fsum([math.fsum(w * np.log(self._probs(lookup, discounts, gammas))) for lookup, w in lookups])
            )
        return totals

    def sum_log_prob(self, counts: NGramCounts, candidates: list[np.ndarray]) -> list[float]:
        """``Σ w log P`` of ``counts`` under these n-grams with each of other ``candidates`` discounts (n + 1, 3):
        the rows are looked up once, only the discounting is redone per candidate."""
        parts = [self.part_sum_log_prob(part, candidates) for part in _canonical_parts(counts)]
        return [_added([part[i] for part in parts]) for i in range(len(candidates))]

    def counts_of_counts(self) -> dict[str, dict[str, int]]:
        """Each order's n_r (:func:`counts_of_counts`) of this model's n-grams (a shard's: its own)."""
        return {str(k): counts_of_counts(self.levels[k].adjusted) for k in range(1, self.order + 1)}


def _added(values: list[float]) -> float:
    """The parts' sums added in order (the fixed order of the module)."""
    total = 0.0
    for value in values:
        total += value
    return total


@dataclass(frozen=True)
class PartScore:
    """One part's sums for a :class:`~dist_respattn.baselines.ngram.BaselineScore`: ``Σ w log P``, the weight of
    the rows whose target is the arg-max, ``Σ w``."""

    sum_log: float
    correct: float
    weight: float

    @staticmethod
    def total(parts: list[PartScore], parameters: dict[str, Any]) -> BaselineScore:
        """The score of the parts, added in order."""
        weight = _added([p.weight for p in parts])
        if weight <= 0.0:
            nan = float("nan")
            return BaselineScore(nan, nan, nan, 0.0, dict(parameters))
        mean = _added([p.sum_log for p in parts]) / weight
        perplexity = math.exp(-mean) if mean > -700.0 else float("inf")
        return BaselineScore(perplexity, mean, _added([p.correct for p in parts]) / weight, weight, dict(parameters))


def scaled_discounts(closed: np.ndarray, scale: float) -> np.ndarray:
    """The closed-form discounts (n + 1, 3) times ``scale``, clipped to [0.01, r]."""
    return np.clip(closed * scale, _DISCOUNT_FLOOR, np.array([1.0, 2.0, 3.0]))


def tuned_scale(objective: dict[float, float]) -> float:
    """The scale of :data:`SCALE_GRID` of the largest held-out log-likelihood (1, the closed form, wins ties)."""
    best = max(objective.values())
    return 1.0 if objective[1.0] >= best else max(objective, key=lambda x: objective[x])


def kneser_ney_parameters(
    order: int,
    closed: np.ndarray,
    counts: dict[str, dict[str, int]],
    num_grams: int,
    objective: dict[float, float] | None,
    weight: float,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The fitted discounts and the parameters' description, from the closed-form discounts, the counts of counts
    and, when tuned, the held-out objective by scale and the held-out weight."""
    scale, tuned_on, details = 1.0, "stated: Chen & Goodman's closed form from counts of counts", {}
    discounts = closed
    if objective is not None:
        scale = tuned_scale(objective)
        tuned_on = "validation"
        details["validation_perplexity"] = math.exp(-objective[scale] / weight)
        discounts = scaled_discounts(closed, scale)
    parameters = {
        "order": order,
        "discounts": {str(k): [float(v) for v in discounts[k]] for k in range(1, order + 1)},
        "discount_scale": scale,
        "tuned_on": tuned_on,
        "counts_of_counts": counts,
        "ngrams": num_grams,
        **details,
    }
    return discounts, parameters


def fit_kneser_ney(train: NGramCounts, *, validation: NGramCounts | None = None) -> KneserNey:
    """Interpolated modified Kneser-Ney of ``train.order`` from merged counts; with ``validation`` counts (of
    the same order and vocabulary) one scale on the closed-form discounts is tuned on them over
    :data:`SCALE_GRID`."""
    closed = np.zeros((train.order + 1, 3))
    model = KneserNey(train, closed, {})
    counts = model.counts_of_counts()
    for k in range(1, train.order + 1):
        closed[k] = discounts_of_counts(counts[str(k)])
    objective, weight = None, 0.0
    if validation is not None and validation.total > 0.0:
        if (validation.order, validation.num_symbols, validation.num_targets) != (
            train.order,
            train.num_symbols,
            train.num_targets,
        ):
            raise ValueError("the validation counts are of another order or vocabulary than the training counts")
        weight = _added([math.fsum([math.fsum(c) for c in part.counts]) for part in _canonical_parts(validation)])
        sums = model.sum_log_prob(validation, [scaled_discounts(closed, x) for x in SCALE_GRID])
        objective = dict(zip(SCALE_GRID, sums, strict=True))
    discounts, parameters = kneser_ney_parameters(train.order, closed, counts, model.num_grams, objective, weight)
    # The n-grams are counted once: the fitted model is this one with its discounts and their description set.
    return model.with_discounts(discounts, parameters)
