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
"""

from __future__ import annotations

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


@numba.njit(cache=True, nogil=True)
def _mixture_rows(probs, symbols, attention, out):  # pragma: no cover - compiled
    """``out += sum_k attention[k] probs[symbols[k]]``: the emission rows read in place (a gathered copy of the
    (u, T) rows cost twice the time, the mixture being bound by reading them)."""
    for k in range(symbols.shape[0]):
        a = attention[k]
        row = probs[symbols[k]]
        for t in range(out.shape[0]):
            out[t] += a * row[t]


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
        model: the head; its ``buckets`` (a free prior is its N singleton buckets).
        embeddings: (S, D) the query table (a token-stream store's ``embeddings()``): the query of the next
            target is then the row of the last token. Without it, every prediction takes its ``query`` (D,).
        words: (T,) the word of each target id, for :meth:`top_words` (a store's, from
            ``dist_respattn.store.predictions.target_words(store.vocabulary(), T)``).

    ``push(token)`` costs O(K); :meth:`predict` and :meth:`top_k` cost O(distinct symbols in the window × D)
    plus the emission's part (T for a dense one). A history shorter than N is read as a stream store reads a
    document's first rows: the missing positions masked, the prior renormalized over those it has.

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
        self.model = model
        self.embeddings, self.words = checked_tables(model, embeddings, words)
        self.buckets = model.buckets if model.buckets is not None else PositionBuckets.free(model.context_length)
        sizes = np.asarray(self.buckets.sizes, dtype=np.int64)
        self._sizes = sizes
        self._share = self.buckets.bucket_weights(model.position_prior) / sizes
        self._starts = self.buckets.starts
        self._window: deque[int] = deque(maxlen=model.context_length)  # the last N tokens, oldest first
        self._hist: list[dict[int, int]] = [{} for _ in sizes]  # per bucket: symbol -> count
        self.length = 0  # tokens pushed so far
        #: What the predictor writes as, when the head that made it says (a gated head's attributes and their shares
        #: under a mix, and the attribute whose documents a generation opens with).
        self.mix_shares: dict[str, float] | None = None
        self.opening_attribute: str | None = None
        self._dense = model.emission_table.probs if isinstance(model.emission_table, DenseEmission) else None

    # ------------------------------------------------------------------------------------- state

    def push(self, token: int) -> None:
        """Add the next token of the history (an id in [0, S))."""
        s = int(token)
        if not 0 <= s < self.model.num_symbols:
            raise ValueError(f"token {token!r}: expected a symbol id in [0, {self.model.num_symbols})")
        window = self._window
        n = len(window)
        # Recency r = n - 1 - index before the push; each bucket's oldest token moves to the next bucket.
        for b in range(len(self._sizes) - 1, -1, -1):
            r = self._starts[b + 1] - 1  # the bucket's oldest recency
            if r < n:
                moving = window[n - 1 - r]
                self._remove(b, moving)
                if b + 1 < len(self._sizes):
                    self._add(b + 1, moving)
        self._add(0, s)
        window.append(s)
        self.length += 1

    def extend(self, tokens: Any) -> None:
        for token in np.asarray(tokens).reshape(-1):
            self.push(int(token))

    def _add(self, b: int, s: int) -> None:
        hist = self._hist[b]
        hist[s] = hist.get(s, 0) + 1

    def _remove(self, b: int, s: int) -> None:
        hist = self._hist[b]
        left = hist[s] - 1
        if left:
            hist[s] = left
        else:
            del hist[s]

    @property
    def state_size(self) -> int:
        """Counts held: the distinct symbols of each bucket, summed (plus the N window ids)."""
        return sum(len(h) for h in self._hist)

    # -------------------------------------------------------------------------------- prediction

    def _query(self, query: Any) -> np.ndarray:
        if query is not None:
            y = np.asarray(query, dtype=np.float64)
            if y.shape != (self.model.query_dim,) or not np.isfinite(y).all():
                raise ValueError(f"query of shape {y.shape}: expected {self.model.query_dim} finite numbers")
            return y
        if self.embeddings is None:
            raise ValueError("no embeddings were given: pass the query (D,), or make the Predictor with the table")
        return self.embeddings[self._window[-1]]

    def attention(self, query: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(symbols (u,), a (u,))``: the window's distinct symbols and the predictive attention on each, for
        ``query`` (D,) (default: the last token's embedding)."""
        if not self._window:
            raise ValueError("the history is empty: push at least one token before predicting")
        # Every bucket's (symbol, share x count), then summed per distinct symbol.
        keys = [np.fromiter(h.keys(), dtype=np.int64, count=len(h)) for h in self._hist]
        masses = [
            float(share) * np.fromiter(h.values(), dtype=np.float64, count=len(h))
            for share, h in zip(self._share, self._hist, strict=True)
        ]
        symbols, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        rho = np.bincount(inverse, weights=np.concatenate(masses), minlength=symbols.shape[0])
        have = np.clip(len(self._window) - self._starts[:-1], 0, self._sizes)
        mass = float(np.dot(self._share, have))  # A: the prior mass of the positions the history has
        y = self._query(query)
        diff = self.model.key_means[symbols] - y
        with np.errstate(divide="ignore"):
            log_w = np.log(rho / mass) - np.einsum("ud,ud->u", diff, diff) * (0.5 / self.model.sigma2)
        best = float(log_w.max())
        w = np.exp(log_w - best)
        return symbols, w / w.sum()

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)`` (for ``query``, default: the last token's embedding)."""
        symbols, a = self.attention(query)
        if self._dense is not None:
            out = np.zeros(self.model.num_targets)
            _mixture_rows(self._dense, symbols, a, out)
            return out
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
