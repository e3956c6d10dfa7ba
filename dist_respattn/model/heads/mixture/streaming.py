"""Next-token prediction of a mixture head over a growing history: the components' predictors, weighed by the gate.

Each component keeps its own :class:`~dist_respattn.model.streaming.Predictor` (state bounded by its window); a
prediction weighs their distributions by ``w_k ∝ pi_k p_k(query | history)``, each component's query density over
the last N tokens (a history shorter than N masked and the prior renormalized, as the component predictors and a
token-stream store read it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dist_respattn.model.streaming import Predictor

if TYPE_CHECKING:
    from dist_respattn.model.heads.mixture.head import MixtureHead

__all__ = ["MixturePredictor"]


class MixturePredictor:
    """p(next token | history) of a :class:`~dist_respattn.model.heads.mixture.head.MixtureHead` for one history.

    Args:
        model: the mixture.
        embeddings: (S, D) the query table (the query of the next target is the last token's row); without it every
            prediction takes its ``query`` (D,).
        words: (T,) the word of each target id, for :meth:`top_words`.

    The state is the components' predictors and the last N token ids: bounded by the model, never by the history.
    """

    def __init__(
        self, model: MixtureHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None
    ) -> None:
        self.model = model
        self.predictors = [Predictor(c, embeddings, words=words) for c in model.components]
        self.embeddings = self.predictors[0].embeddings
        self.words = self.predictors[0].words
        self.window: deque[int] = deque(maxlen=model.context_length)  # the last N tokens, oldest first
        with np.errstate(divide="ignore"):
            self.log_gate = np.log(model.gate)

    def push(self, token: int) -> None:
        """Add the next token of the history (an id in [0, S))."""
        for predictor in self.predictors:
            predictor.push(token)  # checks the id before anything changes (the first one raises)
        self.window.append(int(token))

    def extend(self, tokens: Iterable[int]) -> None:
        for token in np.asarray(tokens).reshape(-1):
            self.push(int(token))

    @property
    def state_size(self) -> int:
        """Counts held: the components' predictors' (see :attr:`Predictor.state_size`)."""
        return sum(p.state_size for p in self.predictors)

    def _query(self, query: Any) -> np.ndarray:
        if not self.window:
            raise ValueError("the history is empty: push at least one token before predicting")
        if query is not None:
            y = np.asarray(query, dtype=np.float64)
            if y.shape != (self.model.query_dim,) or not np.isfinite(y).all():
                raise ValueError(f"query of shape {y.shape}: expected {self.model.query_dim} finite numbers")
            return y
        if self.embeddings is None:
            raise ValueError("no embeddings were given: pass the query (D,), or make the predictor with the table")
        return np.asarray(self.embeddings[self.window[-1]], dtype=np.float64)

    def weights(self, query: Any = None) -> np.ndarray:
        """(K,) ``w_k ∝ pi_k p_k(query | history)``: the components' weights in the next prediction."""
        y = self._query(query)
        symbols = np.fromiter(self.window, dtype=np.int64, count=len(self.window))
        n, m = self.model.context_length, symbols.shape[0]
        log_post = np.empty(self.model.num_components)
        for k, component in enumerate(self.model.components):
            prior = component.position_prior[n - m :]  # the columns a history of m tokens fills
            diff = component.key_means[symbols] - y
            with np.errstate(divide="ignore"):
                log_w = np.log(prior / prior.sum()) - np.einsum("ud,ud->u", diff, diff) * (0.5 / component.sigma2)
            log_post[k] = self.log_gate[k] + np.logaddexp.reduce(log_w) + component.gate_const
        w = np.exp(log_post - log_post.max())
        return w / w.sum()

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)`` (for ``query``, default: the last token's embedding)."""
        weights = self.weights(query)
        out = np.zeros(self.model.num_targets)
        for w, predictor in zip(weights, self.predictors, strict=True):
            if w > 0.0:
                out += w * predictor.predict(query)
        return out

    def top_k(self, k: int, query: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(targets (k,), probabilities (k,))``: the k most probable next targets, best first (lower id on ties)."""
        probs = self.predict(query)
        k = min(int(k), probs.shape[0])
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
