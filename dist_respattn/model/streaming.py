"""Next-token prediction over a growing history, in constant state: the bucket histograms, updated as tokens age.

A head whose prior is tied over recency buckets (:mod:`dist_respattn.model.buckets`) attends to a window only
through each bucket's histogram ``h_b``. A new token enters bucket 0; at every bucket boundary one token moves
on to the next bucket, and one leaves the window: K count updates a token, whatever the history's length.
A prediction reads the histograms' distinct symbols, never the history::

    a(s) ∝ rho(s) N(y; K[s], sigma2),   rho(s) = sum_b (pi_b / |b|) h_b(s) / A,   p(t) = sum_s a(s) B[s, t]

with ``y`` the query (the last token's embedding, as a token-stream store makes it) and ``A`` the prior mass
of the positions a short history has (1 once the history holds N tokens). The state is the histograms (one
count per distinct symbol of each bucket) and the last N token ids, which say which token crosses each
boundary next: bounded by the window, never by the history.

**The mixture reads only the rows that count.** With a dense emission the rows are read in decreasing ``a(s)``,
and the reading stops once the attention left unread, ``R = sum of the unread a(s)``, can move no target's
probability by more than a double's rounding: ``R * max_s B[s, t] <= 2**-53 * p_read(t)`` for every target ``t``
(``max_s B[s, t]`` the emission's column maximum, ``p_read`` the rows read so far). The unread rows add at most
``R * max_s B[s, t]`` to ``p(t)``, so each target's probability is the full mixture's to a relative ``2**-53``.
The attention of a window decays with the keys' distance to the query, so a full window's prediction reads a
fraction of its distinct symbols' rows (63 to 80 of 362 to 381 on item sequences at N = 512, against 52 of 178
at a history of 100 to 300 tokens); with a flat gate (a large ``sigma2``) every row is read, as before.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numba
import numpy as np

from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import DenseEmission
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.rows import WindowRows

__all__ = [
    "Predictor",
    "RankedPredictions",
    "WindowPredictions",
    "checked_tables",
    "draw_token",
    "generate",
    "generation_steps",
]


#: Priors of at most this many buckets keep each distinct symbol's bucket counts (a push moves K of them); a prior of
#: more (a free prior over a long window) keeps only the window, and a prediction sums its N positions' shares.
COUNTED_BUCKETS = 64

#: The unread attention may move each target's probability by at most this fraction of it: a double's unit roundoff.
UNREAD_TOLERANCE = 2.0**-53


@numba.njit(cache=True, nogil=True)
def _move(counts, slot_of, slot_symbol, total, meta, s, b_from, b_to):  # pragma: no cover - compiled
    """One occurrence of ``s`` leaves bucket ``b_from`` (-1: none, it enters the window) for ``b_to`` (-1: none, it
    leaves the window). A symbol's slot holds its counts; a symbol leaving the window frees its slot (the last
    slot moves into it). ``meta``: [tokens pushed, slots used, nonzero counts]."""
    i = slot_of[s]
    if i < 0:  # enters the window
        i = meta[1]
        meta[1] += 1
        slot_of[s] = i
        slot_symbol[i] = s
    if b_from >= 0:
        counts[i, b_from] -= 1
        if counts[i, b_from] == 0:
            meta[2] -= 1
    if b_to >= 0:
        if counts[i, b_to] == 0:
            meta[2] += 1
        counts[i, b_to] += 1
        if b_from < 0:
            total[s] += 1
        return
    total[s] -= 1
    if total[s] == 0:  # leaves the window: the last slot takes its place
        last = meta[1] - 1
        if i != last:
            moved = slot_symbol[last]
            for b in range(counts.shape[1]):
                counts[i, b] = counts[last, b]
                counts[last, b] = 0
            slot_symbol[i] = moved
            slot_of[moved] = i
        slot_of[s] = -1
        meta[1] = last


@numba.njit(cache=True, nogil=True)
def _push(s, ring, counts, slot_of, slot_symbol, total, starts, meta):  # pragma: no cover - compiled
    """Push token ``s``: each bucket's oldest token moves on to the next bucket (the last bucket's leaves the
    window), then ``s`` enters bucket 0. ``ring`` (N,) holds the last N tokens, token ``j`` (0-based) at
    ``j % N``."""
    n_pos = ring.shape[0]
    k = starts.shape[0] - 1
    length = meta[0]
    n = min(length, n_pos)
    for b in range(k - 1, -1, -1):
        r = starts[b + 1] - 1  # the bucket's oldest recency
        if r < n:
            moving = ring[(length - 1 - r) % n_pos]
            _move(counts, slot_of, slot_symbol, total, meta, moving, b, b + 1 if b + 1 < k else -1)
    _move(counts, slot_of, slot_symbol, total, meta, s, -1, 0)
    ring[length % n_pos] = s
    meta[0] = length + 1


@numba.njit(cache=True, nogil=True)
def _push_positions(s, ring, slot_of, slot_symbol, total, meta):  # pragma: no cover - compiled
    """:func:`_push` without bucket counts (a prior of many buckets: the prediction sums the positions instead): the
    window's oldest token leaves once N are held, ``s`` enters."""
    n_pos = ring.shape[0]
    length = meta[0]
    if length >= n_pos:
        leaving = ring[length % n_pos]
        total[leaving] -= 1
        if total[leaving] == 0:  # the last slot takes its place
            i, last = slot_of[leaving], meta[1] - 1
            if i != last:
                moved = slot_symbol[last]
                slot_symbol[i] = moved
                slot_of[moved] = i
            slot_of[leaving] = -1
            meta[1] = last
    if slot_of[s] < 0:
        slot_of[s] = meta[1]
        slot_symbol[meta[1]] = s
        meta[1] += 1
    total[s] += 1
    ring[length % n_pos] = s
    meta[0] = length + 1
    meta[2] = min(length + 1, n_pos)  # each position its own bucket: one count a position held


@numba.njit(cache=True, nogil=True)
def _attention(
    counts, ring, slot_of, slot_symbol, used, share, by_recency, sizes, starts, length, key_means, y, inv_2s2, rho, a
):  # pragma: no cover
    """``a[:used]``: the predictive attention on each slot's symbol, ``a(s) ∝ rho(s) exp(-|K[s] - y|^2 / (2 sigma2))``
    normalized (``rho`` (>= used,) work space). ``rho`` from the slots' bucket counts, or, without them (``counts``
    of no rows: many buckets), summed over the window's positions (``by_recency`` (N,) the share of each recency).
    One exponential a symbol, scaled by the largest exponent; should the weights all be tiny (the prior's shares
    near the smallest doubles), the logarithms' form instead."""
    counted = counts.shape[0] > 0
    if not counted:
        for i in range(used):
            rho[i] = 0.0
        n_pos = ring.shape[0]
        for age in range(min(length, n_pos)):
            rho[slot_of[ring[(length - 1 - age) % n_pos]]] += by_recency[age]
    best = -np.inf
    for i in range(used):
        s = slot_symbol[i]
        r = 0.0
        if counted:
            for b in range(share.shape[0]):
                c = counts[i, b]
                if c != 0:
                    r += share[b] * c
        else:
            r = rho[i]
        d = 0.0
        for j in range(y.shape[0]):
            diff = key_means[s, j] - y[j]
            d += diff * diff
        x = -d * inv_2s2
        rho[i] = r
        a[i] = x
        if r > 0.0:
            best = max(best, x)
    total = 0.0
    for i in range(used):
        w = rho[i] * np.exp(a[i] - best)
        a[i] = w
        total += w
    if not 1e-280 <= total < np.inf:  # every weight near underflow: the logarithms' form
        mass = 0.0  # A: the prior mass of the positions the history has
        for b in range(share.shape[0]):
            mass += share[b] * min(max(length - starts[b], 0), sizes[b])
        best = -np.inf
        for i in range(used):
            s = slot_symbol[i]
            d = 0.0
            for j in range(y.shape[0]):
                diff = key_means[s, j] - y[j]
                d += diff * diff
            lw = np.log(rho[i] / mass) - d * inv_2s2
            a[i] = lw
            best = max(best, lw)
        total = 0.0
        for i in range(used):
            w = np.exp(a[i] - best)
            a[i] = w
            total += w
    for i in range(used):
        a[i] = a[i] / total


@numba.njit(cache=True, nogil=True)
def _add_rows(probs, symbols, a, order, start, stop, out):  # pragma: no cover - compiled
    """``out += sum_{k in [start, stop)} a[order[k]] probs[symbols[order[k]]]``, eight rows a pass over ``out`` (then
    four, then one): the emission rows read in place, the mixture being bound by reading them."""
    k = start
    while k + 8 <= stop:
        i0, i1, i2, i3 = order[k], order[k + 1], order[k + 2], order[k + 3]
        i4, i5, i6, i7 = order[k + 4], order[k + 5], order[k + 6], order[k + 7]
        r0, r1, r2, r3 = probs[symbols[i0]], probs[symbols[i1]], probs[symbols[i2]], probs[symbols[i3]]
        r4, r5, r6, r7 = probs[symbols[i4]], probs[symbols[i5]], probs[symbols[i6]], probs[symbols[i7]]
        a0, a1, a2, a3, a4, a5, a6, a7 = a[i0], a[i1], a[i2], a[i3], a[i4], a[i5], a[i6], a[i7]
        for t in range(out.shape[0]):
            first = (a0 * r0[t] + a1 * r1[t]) + (a2 * r2[t] + a3 * r3[t])
            out[t] += first + ((a4 * r4[t] + a5 * r5[t]) + (a6 * r6[t] + a7 * r7[t]))
        k += 8
    if k + 4 <= stop:
        i0, i1, i2, i3 = order[k], order[k + 1], order[k + 2], order[k + 3]
        r0, r1, r2, r3 = probs[symbols[i0]], probs[symbols[i1]], probs[symbols[i2]], probs[symbols[i3]]
        a0, a1, a2, a3 = a[i0], a[i1], a[i2], a[i3]
        for t in range(out.shape[0]):
            out[t] += (a0 * r0[t] + a1 * r1[t]) + (a2 * r2[t] + a3 * r3[t])
        k += 4
    while k < stop:
        i = order[k]
        w = a[i]
        row = probs[symbols[i]]
        for t in range(out.shape[0]):
            out[t] += w * row[t]
        k += 1


#: Attention is binned by its power of two (bin e holds [2**-(e+1), 2**-e)); the last bin takes all below.
ATTENTION_BINS = 256


@numba.njit(cache=True, nogil=True)
def _read_mixture(probs, column_max, symbols, a, tolerance, binned, picked, mass, out):  # pragma: no cover - compiled
    """``out = sum_k a[k] probs[symbols[k]]`` to a relative ``tolerance`` on every target: the rows read by
    decreasing powers of two of ``a``, until the unread attention ``R`` has ``R * column_max[t] <= tolerance *
    out[t]`` for every ``t`` (the unread rows add at most ``R * column_max[t]``). Rows of zero attention are never
    read. ``binned``, ``picked`` (>= u,) and ``mass`` (ATTENTION_BINS + 1,) are work space. Returns the rows read."""
    u = symbols.shape[0]
    last = mass.shape[0] - 2
    for e in range(mass.shape[0]):
        mass[e] = 0.0
    for k in range(u):
        if a[k] > 0.0:
            e = min(max(-math.frexp(a[k])[1], 0), last)  # a in [2**-(e+1), 2**-e)
            binned[k] = e
            mass[e] += a[k]
        else:
            binned[k] = -1
    for e in range(last, -1, -1):  # mass[e]: the attention in bins e and after (smallest first)
        mass[e] += mass[e + 1]
    for t in range(out.shape[0]):
        out[t] = 0.0
    read = 0
    done = 0  # bins [0, done) are read; the unread attention is mass[done]
    bound = 1.0  # min_t out[t] / column_max[t], at most 1 (out[t] <= column_max[t])
    while True:
        stop = done
        while stop <= last and mass[stop] > tolerance * bound:
            stop += 1
        n = 0
        for k in range(u):
            if done <= binned[k] < stop:
                picked[n] = k
                n += 1
        _add_rows(probs, symbols, a, picked, 0, n, out)
        read += n
        done = stop
        if mass[done] == 0.0:
            return read
        bound = np.inf
        for t in range(out.shape[0]):
            c = column_max[t]
            if c > 0.0:
                bound = min(bound, out[t] / c)
        if mass[done] <= tolerance * bound:
            return read


def checked_tables(
    model: Any, embeddings: np.ndarray | None, words: Sequence[str] | None
) -> tuple[np.ndarray | None, tuple[str, ...] | None]:
    """A streaming predictor's ``(embeddings (S, D) float64, words (T,))`` for ``model`` (any head with
    ``num_symbols``, ``query_dim`` and ``num_targets``), each ``None`` when not given; a table of another shape is
    refused, naming the shape the model needs."""
    table = None if embeddings is None else np.asarray(embeddings, dtype=np.float64)
    if table is not None and table.shape != (model.num_symbols, model.query_dim):
        raise ValueError(
            f"embeddings of shape {table.shape}: expected (S, D) = {(model.num_symbols, model.query_dim)}, "
            "the query table of the model's store"
        )
    if words is not None and len(words) != model.num_targets:
        raise ValueError(f"{len(words)} words: expected one for each of the model's T = {model.num_targets} targets")
    return table, None if words is None else tuple(str(w) for w in words)


class RankedPredictions:
    """``top_k`` and ``top_words`` of any streaming predictor's :meth:`predict` (the one ranking every kind's
    predictors share). A subclass sets ``words`` ((T,) names, or ``None``) and defines ``predict``."""

    words: tuple[str, ...] | None = None

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)``."""
        raise NotImplementedError

    def top_k(self, k: int, query: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(targets (k,), probabilities (k,))``: the k most probable next targets, best first (lower id on ties)."""
        probs = self.predict(query)
        k = min(int(k), probs.shape[0])
        # The k-th largest value, then every target at least as probable, sorted (ties by the lower id).
        kth = np.partition(probs, probs.shape[0] - k)[probs.shape[0] - k]
        candidates = np.flatnonzero(probs >= kth)
        order = candidates[np.lexsort((candidates, -probs[candidates]))][:k]
        return order, probs[order]

    def top_words(self, k: int, query: Any = None) -> list[tuple[str, float]]:
        """``[(word, probability), ...]``: :meth:`top_k` in words (the predictor needs ``words``)."""
        if self.words is None:
            raise ValueError("no words were given: make the predictor with words=... (the store's vocabulary)")
        targets, probs = self.top_k(k, query)
        return [(self.words[int(t)], float(p)) for t, p in zip(targets, probs, strict=True)]


class WindowPredictions(RankedPredictions):
    """A streaming predictor whose state is the history's last N token ids (the kinds whose prediction reads the
    window's tokens themselves: a mixture, a copy head). Its ``predict`` is the head's ``window_proba`` under its
    ``window_attention`` of the history's row (:meth:`history_rows`); a subclass may define another.

    Args:
        model: the head (its ``context_length`` N, ``num_symbols`` S and ``num_targets`` T).
        embeddings: (S, D) the query table, or ``None``; ``words``: (T,) names for :meth:`top_words` (both checked
            by :func:`checked_tables`).
    """

    def __init__(self, model: Any, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None):
        self.model = model
        self.embeddings, self.words = checked_tables(model, embeddings, words)
        self.window: deque[int] = deque(maxlen=model.context_length)  # the last N tokens, oldest first

    def push(self, token: int) -> None:
        """Add the next token of the history (an id in [0, S))."""
        s = int(token)
        if not 0 <= s < self.model.num_symbols:
            raise ValueError(f"token {token!r}: expected a symbol id in [0, {self.model.num_symbols})")
        self.window.append(s)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in np.asarray(tokens).reshape(-1):
            self.push(int(token))

    @property
    def state_size(self) -> int:
        """Token ids held: the window's (at most N), whatever the history's length."""
        return len(self.window)

    def history_rows(self, query: Any = None) -> WindowRows:
        """The history as one window row (its target 0) whose query is ``query`` (D,), default the last token's
        embedding."""
        if not self.window:
            raise ValueError("the history is empty: push at least one token before predicting")
        if query is not None:
            y = np.asarray(query, dtype=np.float64)
            if y.shape != (self.model.query_dim,) or not np.isfinite(y).all():
                raise ValueError(f"query of shape {y.shape}: expected {self.model.query_dim} finite numbers")
        elif self.embeddings is None:
            raise ValueError("no embeddings were given: pass the query (D,), or make the predictor with the table")
        else:
            y = self.embeddings[self.window[-1]]
        tokens = np.fromiter(self.window, dtype=np.int64, count=len(self.window))
        m = tokens.shape[0]
        return WindowRows(
            tokens, np.array([0]), np.array([m]), np.zeros(1, dtype=np.int64), y[None, :],
            np.zeros(1, dtype=np.int64), None, 0,
        )  # fmt: skip

    def log_query_density(self, query: Any = None) -> float:
        """``log p(query | history)`` (``query``, default: the last token's embedding) under a head that gives its
        rows' densities (``row_densities``: the copy, conjunction and chain kinds); what a stack of heads weighs
        their predictions by."""
        return float(self.model.row_densities(self.history_rows(query))[0, 0])

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)`` (for ``query``, default: the last token's embedding): the head's
        ``window_proba`` of the history's row under its ``window_attention`` (a kind whose prediction is not that
        overrides this)."""
        rows = self.history_rows(query)
        return self.model.window_proba(rows, self.model.window_attention(rows))[0]


class Predictor(RankedPredictions):
    """p(next token | history) for one growing history.

    Args:
        model: a single-hop head; its ``buckets`` (a free prior is its N singleton buckets). Every kind's streaming
            predictor, this one for a single-hop head, is ``model.predictor(query_table=embeddings, words=words)``;
            a head of another kind is refused here with a ``TypeError`` saying so.
        embeddings: (S, D) the query table (a token-stream store's ``embeddings()``): the query of the next
            target is then the row of the last token. Without it, every prediction takes its ``query`` (D,).
        words: (T,) the word of each target id, for :meth:`top_words` (a store's, from
            ``dist_respattn.store.predictions.target_words(store.vocabulary(), T)``).

    ``push(token)`` costs O(K); :meth:`predict` and :meth:`top_k` cost O(distinct symbols in the window × (K + D))
    plus the emission's part: T for each row read of a dense one (the rows that count, see the module's docstring;
    :attr:`rows_read` says how many the last prediction read). A history shorter than N is read as a stream store
    reads a document's first rows: the missing positions masked, the prior renormalized over those it has.

    The state: the last N token ids, and each distinct symbol of the window's K bucket counts (a slot of K
    int32, at most min(N, S) slots), compiled: a push or a prediction allocates nothing the size of the window. A
    prior of more than :data:`COUNTED_BUCKETS` buckets (a free prior over a long window) keeps no counts: a push
    costs O(1) and a prediction sums the window's N positions' shares instead of reading K counts a symbol.

    Example::

        predictor = Predictor(model, store.embeddings(), words=target_words(store.vocabulary(), model.num_targets))
        predictor.extend(ids)
        predictor.top_words(5)  # [("the", 0.21), ("a", 0.08), ...]
    """

    def __init__(
        self,
        model: ResponsibilityAttentionDistribution,
        embeddings: np.ndarray | None = None,
        *,
        words: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(model, ResponsibilityAttentionDistribution):
            # Other kinds keep other states (a copy head's last positions, a repeat gate's whole document): each
            # gives its own predictor, and the one call that works for all is the head's.
            kind = getattr(model, "kind", type(model).__name__)
            raise TypeError(
                f"Predictor streams a single-hop head, and this is a {kind} head: use "
                "model.predictor(query_table=embeddings, words=words), every kind's streaming predictor (what "
                "predict --stream uses)"
            )
        self.model = model
        self.embeddings, self.words = checked_tables(model, embeddings, words)
        self.buckets = model.buckets if model.buckets is not None else PositionBuckets.free(model.context_length)
        sizes = np.asarray(self.buckets.sizes, dtype=np.int64)
        self._sizes = sizes
        self._share = np.ascontiguousarray(self.buckets.bucket_weights(model.position_prior) / sizes, dtype=np.float64)
        self._starts = np.asarray(self.buckets.starts, dtype=np.int64)
        n_pos, num_symbols = model.context_length, model.num_symbols
        slots = min(n_pos, num_symbols)
        self._ring = np.zeros(n_pos, dtype=np.int64)  # the last N tokens: token j (0-based) at j % N
        # A slot's K bucket counts; a prior of more buckets (a free prior's N) sums the window's positions instead.
        self._counted = sizes.shape[0] <= COUNTED_BUCKETS
        self._counts = np.zeros((slots if self._counted else 0, sizes.shape[0]), dtype=np.int32)
        self._by_recency = np.repeat(self._share, sizes)
        self._slot_of = np.full(num_symbols, -1, dtype=np.int64)  # symbol -> its slot, -1 outside the window
        self._slot_symbol = np.zeros(slots, dtype=np.int64)
        self._total = np.zeros(num_symbols, dtype=np.int64)  # occurrences in the window
        self._meta = np.zeros(3, dtype=np.int64)  # tokens pushed, slots used, nonzero counts
        self._a = np.empty(slots)
        self._rho = np.empty(slots)
        self._work = np.empty((2, slots), dtype=np.int64)  # the mixture's work space
        self._mass = np.empty(ATTENTION_BINS + 1)
        self._key_means = np.ascontiguousarray(model.key_means, dtype=np.float64)
        self._inv_two_sigma2 = 0.5 / float(model.sigma2)
        #: Emission rows the last :meth:`predict` read (with a dense emission; else every distinct symbol's).
        self.rows_read = 0
        #: What the predictor writes as, when the head that made it says (a gated head's attributes and their shares
        #: under a mix, and the attribute whose documents a generation opens with).
        self.mix_shares: dict[str, float] | None = None
        self.opening_attribute: str | None = None
        table = model.emission_table
        self._dense = table if isinstance(table, DenseEmission) else None

    # ------------------------------------------------------------------------------------- state

    def push(self, token: int) -> None:
        """Add the next token of the history (an id in [0, S))."""
        s = int(token)
        if not 0 <= s < self.model.num_symbols:
            raise ValueError(f"token {token!r}: expected a symbol id in [0, {self.model.num_symbols})")
        if self._counted:
            _push(s, self._ring, self._counts, self._slot_of, self._slot_symbol, self._total, self._starts, self._meta)
        else:
            _push_positions(s, self._ring, self._slot_of, self._slot_symbol, self._total, self._meta)

    def extend(self, tokens: Any) -> None:
        for token in np.asarray(tokens).reshape(-1):
            self.push(int(token))

    @property
    def length(self) -> int:
        """Tokens pushed so far."""
        return int(self._meta[0])

    @property
    def state_size(self) -> int:
        """Counts held: the distinct symbols of each bucket, summed (plus the N window ids)."""
        return int(self._meta[2])

    # -------------------------------------------------------------------------------- prediction

    def _query(self, query: Any) -> np.ndarray:
        if query is not None:
            y = np.asarray(query, dtype=np.float64)
            if y.shape != (self.model.query_dim,) or not np.isfinite(y).all():
                raise ValueError(f"query of shape {y.shape}: expected {self.model.query_dim} finite numbers")
            return y
        if self.embeddings is None:
            raise ValueError("no embeddings were given: pass the query (D,), or make the Predictor with the table")
        length = int(self._meta[0])
        return self.embeddings[self._ring[(length - 1) % self._ring.shape[0]]]

    def _slot_attention(self, query: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(symbols (u,), a (u,))`` in slot order (views of the state: read before the next push)."""
        if self._meta[0] == 0:
            raise ValueError("the history is empty: push at least one token before predicting")
        y = self._query(query)
        used = int(self._meta[1])
        a = self._a[:used]
        _attention(
            self._counts, self._ring, self._slot_of, self._slot_symbol, used, self._share, self._by_recency,
            self._sizes, self._starts, self._meta[0], self._key_means, y, self._inv_two_sigma2, self._rho, a,
        )  # fmt: skip
        return self._slot_symbol[:used], a

    def attention(self, query: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(symbols (u,), a (u,))``: the window's distinct symbols (increasing) and the predictive attention on
        each, for ``query`` (D,) (default: the last token's embedding)."""
        symbols, a = self._slot_attention(query)
        order = np.argsort(symbols)
        return symbols[order], a[order]

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)`` (for ``query``, default: the last token's embedding); with a dense
        emission each target's probability is the full mixture's to a relative ``2**-53`` (the module's
        docstring)."""
        symbols, a = self._slot_attention(query)
        if self._dense is not None:
            out = np.empty(self.model.num_targets)
            dense, work = self._dense, self._work
            self.rows_read = int(
                _read_mixture(
                    dense.probs, dense.column_max, symbols, a, UNREAD_TOLERANCE, work[0], work[1], self._mass, out
                )
            )
            return out
        self.rows_read = int(symbols.shape[0])
        return self.model.emission_table.predictive(symbols[None, :], a[None, :])[0]


def draw_token(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One id drawn from ``probs`` (T,) by a cumulative draw: one uniform from ``rng``, the same token on every
    platform (``rng.choice`` may consume the generator differently across NumPy versions)."""
    token = int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"))
    return min(token, probs.shape[0] - 1)


def generation_steps(
    model: Any,
    embeddings: np.ndarray,
    prompt: Any,
    rng: np.random.Generator,
    *,
    options: dict[str, Any] | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """``(token, p (T,))`` forever: each token drawn from ``p = p(t | last N tokens, query = E[last token])`` (the
    distribution it was drawn from), then appended to the history (a token stream's windows: targets are symbols).

    ``prompt`` (>= 1,) ids start it; one shorter than N is a short history, read as a token-stream store reads
    a document's first rows (the missing positions masked, the prior renormalized over those it has). The
    history is a :class:`Predictor`'s bucket histograms: a token costs O(K) updates, never a recomputed window.
    ``model`` is a head of any kind: its own streaming predictor (``model.predictor``, given ``options``) is used.
    """
    if model.num_targets != model.num_symbols:
        raise ValueError("generation feeds targets back as symbols: the head needs T = S (a token stream's head)")
    start = np.asarray(prompt).reshape(-1)
    if start.shape[0] == 0:
        raise ValueError("an empty prompt: give at least one token to start from")
    predictor = model.predictor(query_table=embeddings, options=options)
    predictor.extend(start[-model.context_length :])
    while True:
        probs = predictor.predict()
        token = draw_token(probs, rng)
        yield token, probs
        predictor.push(token)


def generate(
    model: Any,
    embeddings: np.ndarray,
    prompt: Any,
    num_tokens: int,
    rng: np.random.Generator,
    *,
    options: dict[str, Any] | None = None,
) -> np.ndarray:
    """(num_tokens,) int64 ids drawn one at a time by :func:`generation_steps` from ``prompt`` (>= 1,) ids."""
    out = np.empty(int(num_tokens), dtype=np.int64)
    steps = generation_steps(model, embeddings, prompt, rng, options=options)
    for k in range(out.shape[0]):
        out[k] = next(steps)[0]
    return out
