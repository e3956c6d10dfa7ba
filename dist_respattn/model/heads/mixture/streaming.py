"""Next-token prediction of a mixture head over a growing history, in state bounded by the window.

Every component has a free position prior, so the last N tokens are all any of them reads: a prediction weighs the
components' predictive distributions over that window by ``w_k ∝ pi_k p_k(query | window)``. A history shorter than
N fills the last columns, the others masked and each prior renormalized over those it has (as a token-stream store
reads a document's first rows, and as :class:`~dist_respattn.model.streaming.Predictor` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dist_respattn.model.streaming import WindowPredictions

if TYPE_CHECKING:
    from dist_respattn.model.heads.mixture.head import MixtureHead

__all__ = ["MixturePredictor"]


class MixturePredictor(WindowPredictions):
    """p(next token | history) of a :class:`~dist_respattn.model.heads.mixture.head.MixtureHead` for one history.

    Args:
        model: the mixture.
        embeddings: (S, D) the query table (the query of the next target is the last token's row); without it every
            prediction takes its ``query`` (D,).
        words: (T,) the word of each target id, for :meth:`top_words`.

    The state is the last N token ids. ``push`` costs O(1); a prediction O(K N D) for the gates plus each
    component's emission part (T a component for a dense one).
    """

    def __init__(
        self, model: MixtureHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None
    ) -> None:
        super().__init__(model, embeddings, words=words)
        with np.errstate(divide="ignore"):
            self.log_gate = np.log(model.gate)

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
        return self.embeddings[self.window[-1]]

    def components(self, query: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(w (K,), p (K, T))``: the components' weights ``w_k ∝ pi_k p_k(query | window)`` and their predictive
        distributions ``p_k(next target | window, query)``."""
        y = self._query(query)
        symbols = np.fromiter(self.window, dtype=np.int64, count=len(self.window))
        n, m = self.model.context_length, symbols.shape[0]
        log_post = np.empty(self.model.num_components)
        probs = np.empty((self.model.num_components, self.model.num_targets))
        for k, component in enumerate(self.model.components):
            prior = component.position_prior[n - m :]  # the columns a history of m tokens fills
            diff = component.key_means[symbols] - y
            with np.errstate(divide="ignore"):
                log_w = np.log(prior / prior.sum()) - np.einsum("ud,ud->u", diff, diff) * (0.5 / component.sigma2)
            norm = np.logaddexp.reduce(log_w)
            log_post[k] = self.log_gate[k] + norm + component.gate_const
            attention = np.exp(log_w - norm)
            probs[k] = component.emission_table.predictive(symbols[None, :], attention[None, :])[0]
        w = np.exp(log_post - log_post.max())
        return w / w.sum(), probs

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)`` (for ``query``, default: the last token's embedding)."""
        weights, probs = self.components(query)
        return weights @ probs
