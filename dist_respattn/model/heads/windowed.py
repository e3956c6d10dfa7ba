"""Heads scored over token windows (the copy, conjunction and chain-of-hops kinds): their top-K and batch
predictions, made once from each kind's window attention and its distribution given that attention."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from dist_respattn.model.heads.base import Block, Head
from dist_respattn.model.heads.sparse_top import SparseTerms, top_targets
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import TopK

__all__ = ["PREDICT_ROWS", "TERMS_ROWS", "WindowHead", "live_rows"]

#: Rows per sub-block of the NumPy predictions, bounding their (rows, T) arrays.
PREDICT_ROWS = 256

#: Rows per sub-block of the sparse predictions (:mod:`~dist_respattn.model.heads.sparse_top`): no (rows, T) array.
TERMS_ROWS = 4096


def live_rows(block: Block) -> tuple[WindowRows, np.ndarray] | None:
    """The block's token-window rows of weight > 0 and their weights (the block's, else the rows' own, else 1), or
    ``None`` when none weighs anything. A row's window is its own span of the token array: the rows left out change
    no other row's window."""
    rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
    w = np.ones(rows.num_rows) if rows.weight is None else np.asarray(rows.weight, dtype=np.float64)
    live = np.flatnonzero(w > 0.0)
    if live.size == 0:
        return None
    return rows.select(live), w[live]


class WindowHead(Head):
    """A head whose predictions read a row's window of tokens: it gives :meth:`window_attention` and
    :meth:`window_proba`, and gets :meth:`top_k` and :meth:`predict_proba` (and its streaming predictor's
    ``predict``, :class:`~dist_respattn.model.streaming.WindowPredictions`) from them."""

    num_targets: int

    @abc.abstractmethod
    def check_rows(self, rows: WindowRows) -> None:
        """Raise naming the first row the head cannot read."""

    @abc.abstractmethod
    def window_attention(self, rows: WindowRows) -> np.ndarray:
        """(n, N) each row's predictive attention in column order."""

    @abc.abstractmethod
    def window_proba(self, rows: WindowRows, attention: np.ndarray) -> np.ndarray:
        """(n, T) ``p(target | row)`` of rows whose attention (n, N) is ``attention``."""

    @property
    def has_terms(self) -> bool:
        """Whether :meth:`window_terms` gives the terms of its predictions (else they are :meth:`window_proba`'s)."""
        return False

    def window_terms(self, rows: WindowRows, attention: np.ndarray) -> SparseTerms | None:
        """The terms :meth:`window_proba` sums, for predictions without an (n, T) array
        (:class:`~dist_respattn.model.heads.sparse_top.SparseTerms`), or ``None``: the kind (or its dense emission)
        has none (:attr:`has_terms`), and its predictions are :meth:`window_proba`'s."""
        return None

    def window_hits(self, rows: WindowRows, attention: np.ndarray) -> float:
        """``sum w`` over the rows (of weight ``w > 0``) whose target is the arg-max (first on ties) of
        :meth:`window_proba` given their predictive ``attention`` (n, N): from :meth:`window_terms` when the head has
        them (no (n, T) array), else from :meth:`window_proba`."""
        w = np.ones(rows.num_rows) if rows.weight is None else np.asarray(rows.weight, dtype=np.float64)
        hits = 0.0
        step = TERMS_ROWS if self.has_terms else PREDICT_ROWS
        for start in range(0, rows.num_rows, step):
            stop = min(start + step, rows.num_rows)
            live = np.flatnonzero(w[start:stop] > 0.0)
            if live.size == 0:
                continue
            sub = rows.select(live + start)
            att = attention[start:stop][live]
            terms = self.window_terms(sub, att)
            if terms is not None:
                best = top_targets([terms], np.ones((live.size, 1)), 1)[0][:, 0]
            else:
                best = np.argmax(self.window_proba(sub, att), axis=1)
            hits += float(w[start:stop][live][best == np.asarray(sub.target)].sum())
        return hits

    def top_k(self, block: Block, k: int) -> TopK:
        """The ``k`` most probable targets of each row (lower id first on ties), with the predictive attention."""
        if int(k) < 1:
            raise ValueError(f"k = {k}: expected a positive number of targets")
        rows = block.rows
        self.check_rows(rows)
        k = min(int(k), self.num_targets)
        attention = self.window_attention(rows)
        targets = np.empty((rows.num_rows, k), dtype=np.int32)
        probabilities = np.empty((rows.num_rows, k))
        if self.has_terms:
            for start in range(0, rows.num_rows, TERMS_ROWS):
                stop = min(start + TERMS_ROWS, rows.num_rows)
                terms = self.window_terms(rows.select(slice(start, stop)), attention[start:stop])
                assert terms is not None
                best, values = top_targets([terms], np.ones((stop - start, 1)), k)
                targets[start:stop], probabilities[start:stop] = best, values
            return TopK(targets, probabilities, attention)
        for start in range(0, rows.num_rows, PREDICT_ROWS):
            stop = min(start + PREDICT_ROWS, rows.num_rows)
            probs = self.window_proba(rows.select(slice(start, stop)), attention[start:stop])
            order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
            targets[start:stop] = order
            probabilities[start:stop] = np.take_along_axis(probs, order, axis=1)
        return TopK(targets, probabilities, attention)

    def block_proba(self, block: Block) -> np.ndarray:
        """(n, T) ``p(target | row)`` of a block's token windows."""
        rows = block.rows
        self.check_rows(rows)
        return self.window_proba(rows, self.window_attention(rows))

    def predict_proba(self, context: Any, query: Any) -> np.ndarray:
        """``p(target | context, query)`` of full windows (the current token: the window's last): (T,) for one row,
        (n, T) for a batch (small batches)."""
        single = np.ndim(context) == 1
        ctx = np.atleast_2d(np.asarray(context))
        y = np.atleast_2d(np.asarray(query, dtype=np.float64))
        rows = WindowRows.from_encoded(ctx, y, np.zeros(ctx.shape[0], dtype=np.int32))
        self.check_rows(rows)
        out = self.window_proba(rows, self.window_attention(rows))
        return out[0] if single else out
