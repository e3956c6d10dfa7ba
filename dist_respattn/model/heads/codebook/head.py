"""The codebook head: a single head over the last N0 positions and a far field of codeword histograms beyond them.

For a row with window ``c_1..c_N`` (``c_N`` the most recent; recency ``r = N - i``) and query ``y``::

    p(y, t | c) = sum_{r < N0} pi_r N(y; mu[c], sigma2 I) B[c, t]                       (c the token at recency r)
                + pi_far sum_b omega_b sum_w (n_bw / n_far) N(y; nu[b, w], sigma2 I) E_b[w, t]

where ``n_bw`` counts the far tokens (recency N0..N-1) whose codeword in codebook b is w (``codes[s, b]``), and
``n_far`` is their number. A short window masks the options it lacks and renormalizes the prior over the others.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.heads.base import Block, Columns, Head
from dist_respattn.model.heads.codebook.kernels import (
    CodebookParameters,
    EstepTables,
    codebook_proba,
    codebook_score,
    far_histogram,
    state_proba,
)
from dist_respattn.model.heads.windowed import PREDICT_ROWS
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import ScoreTotals, TopK
from dist_respattn.model.streaming import WindowPredictions

__all__ = ["ARRAY_NAMES", "CodebookHead", "CodebookPredictor"]

#: The arrays a codebook head's checkpoint holds.
ARRAY_NAMES = (
    "codebook_codes", "codebook_key_means", "codebook_prior", "codebook_omega", "codebook_code_means",
    "codebook_emission", "codebook_code_emission",
)  # fmt: skip


def _probabilities(name: str, value: np.ndarray, axis: int = -1) -> None:
    if not (np.isfinite(value).all() and (value >= 0.0).all()):
        raise ValueError(f"codebook head: {name} holds a negative or non-finite value")
    if not np.allclose(value.sum(axis=axis), 1.0, rtol=0, atol=1e-9):
        raise ValueError(f"codebook head: the rows of {name} do not sum to 1")


class CodebookHead(Head):
    """A codebook far-field head (the head kind ``"codebook"``; see the module's docstring for the model).

    Args:
        codes: (S, B) int, each symbol's codeword in each codebook, in [0, W).
        key_means: (S, D) the near positions' keys ``mu``; ``sigma2``: the gate variance.
        prior: (N0 + 1,) the prior of each near recency (most recent first), then of the far field.
        omega: (B,) the codebooks' weights; ``code_means``: (B, W, D) the codewords' keys ``nu``.
        emission: (S, T) the near table ``B``; ``code_emission``: (B, W, T) the codeword tables ``E``.
        context_length: N, the window the head reads (N > N0).
    """

    kind: ClassVar[str] = "codebook"

    def __init__(
        self, codes: Any, key_means: Any, sigma2: float, prior: Any, omega: Any, code_means: Any, emission: Any,
        code_emission: Any, context_length: int,
    ) -> None:  # fmt: skip
        self.codes = np.array(codes, dtype=np.int64)
        self.key_means = np.array(key_means, dtype=np.float64)
        self.sigma2 = float(sigma2)
        self.prior = np.array(prior, dtype=np.float64).reshape(-1)
        self.omega = np.array(omega, dtype=np.float64).reshape(-1)
        self.code_means = np.array(code_means, dtype=np.float64)
        # The tables are not copied: the heads of one M-step's held-out grid share them (they are never written).
        self.emission = np.asarray(emission, dtype=np.float64)
        self.code_emission = np.asarray(code_emission, dtype=np.float64)
        s, d = self.key_means.shape
        n_books, n_words, d2 = self.code_means.shape
        t = self.emission.shape[1]
        self.near_window = self.prior.shape[0] - 1
        self.num_symbols, self.context_length, self.query_dim, self.num_targets = s, int(context_length), d, t
        if not 1 <= self.near_window < self.context_length:
            raise ValueError(f"--near-window {self.near_window}: expected 1 to N - 1 = {self.context_length - 1}")
        if self.codes.shape != (s, n_books) or self.codes.min() < 0 or self.codes.max() >= n_words:
            raise ValueError(f"codebook head: codes of shape {self.codes.shape}: expected (S, B) = {(s, n_books)} "
                             f"ids in [0, {n_words})")  # fmt: skip
        if d2 != d or self.emission.shape[0] != s or self.code_emission.shape != (n_books, n_words, t):
            raise ValueError("codebook head: the arrays' shapes disagree (S, D, T, B, W)")
        if self.omega.shape != (n_books,):
            raise ValueError("codebook head: omega needs one weight per codebook")
        if not (np.isfinite(self.sigma2) and self.sigma2 > 0.0):
            raise ValueError(f"codebook head: sigma2 = {sigma2!r}: expected a positive number")
        for name, value in (("prior", self.prior), ("omega", self.omega), ("emission", self.emission),
                            ("code_emission", self.code_emission)):  # fmt: skip
            _probabilities(name, value)

    @property
    def num_codebooks(self) -> int:
        return int(self.code_means.shape[0])

    @property
    def num_codewords(self) -> int:
        return int(self.code_means.shape[1])

    def __repr__(self) -> str:
        return (
            f"CodebookHead(S={self.num_symbols}, N={self.context_length}, D={self.query_dim}, T={self.num_targets}, "
            f"N0={self.near_window}, B={self.num_codebooks}, W={self.num_codewords}, "
            f"far={self.prior[-1]:.4f})"
        )

    @functools.cached_property
    def parameters(self) -> CodebookParameters:
        """The parameters as the compiled passes read them (built once per head)."""
        return CodebookParameters.build(self)

    @functools.cached_property
    def estep_tables(self) -> EstepTables:
        """The tables as the E-step reads them (built once per head)."""
        return EstepTables.build(self)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("parameters", None)
        state.pop("estep_tables", None)
        return state

    # -- the head protocol -----------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Its arrays (:data:`ARRAY_NAMES`, the codebook assignment among them) and σ², N in the JSON."""
        values = (self.codes, self.key_means, self.prior, self.omega, self.code_means, self.emission,
                  self.code_emission)  # fmt: skip
        arrays = {name: value.copy() for name, value in zip(ARRAY_NAMES, values, strict=True)}
        meta = {"sigma2": self.sigma2, "context_length": self.context_length, "near_window": self.near_window,
                "codebooks": self.num_codebooks, "codewords": self.num_codewords}  # fmt: skip
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> CodebookHead:
        missing = [name for name in ARRAY_NAMES if name not in arrays]
        if missing:
            raise ValueError(f"codebook head: missing array {missing[0]!r}")
        codes, keys, prior, omega, means, emission, code_emission = (np.asarray(arrays[n]) for n in ARRAY_NAMES)
        return cls(codes, keys, float(meta["sigma2"]), prior, omega, means, emission, code_emission,
                   int(meta["context_length"]))  # fmt: skip

    def num_parameters(self) -> int:
        """Keys, prior, codebook weights, codeword keys and both tables (the codes are fixed, not fitted)."""
        return int(self.key_means.size + self.prior.size - 1 + self.omega.size - 1 + self.code_means.size
                   + self.emission.size - self.num_symbols + self.code_emission.size
                   - self.num_codebooks * self.num_codewords)  # fmt: skip

    def describe(self) -> str:
        far = f"positions {self.near_window + 1}..{self.context_length}"
        return (
            f"codebook head: near window {self.near_window}, far field of {self.num_codebooks} codebooks x "
            f"{self.num_codewords} codewords over {far}"
        )

    def record(self) -> dict[str, Any]:
        return {"far_prior": float(self.prior[-1]), "codebook_weight_max": float(self.omega.max())}

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        line = (f"last model: far-field prior {self.prior[-1]:.3f}; codebook weights "
                + ", ".join(f"{v:.3f}" for v in self.omega))  # fmt: skip
        return {"far_prior": float(self.prior[-1]), "codebook_weights": [float(v) for v in self.omega],
                "sigma2": self.sigma2}, [line]  # fmt: skip

    @property
    def columns(self) -> Columns:
        """Token windows: the far counts slide from row to row."""
        return Columns(windows=True)

    def check_rows(self, rows: WindowRows) -> None:
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)

    def row_densities(self, rows: WindowRows) -> np.ndarray:
        """(n, 2) each window row's ``(log p(query | window), log p(target | window, query))``."""
        self.check_rows(rows)
        return codebook_score(rows, self.parameters)

    def score(self, blocks: Iterable[Block], *, accuracy: bool = True) -> ScoreTotals:
        """Held-out totals of the blocks' rows (with ``accuracy``, the arg-max hits: O((N0 + B W) T) a row)."""
        totals = ScoreTotals()
        for block in blocks:
            rows = block.rows
            self.check_rows(rows)
            weight = block.weights_or_ones()
            live = weight > 0.0
            dens = codebook_score(rows, self.parameters)
            joint = float(np.sum(weight[live] * dens[live].sum(axis=1)))
            target = float(np.sum(weight[live] * dens[live, 1]))
            correct = 0.0
            if accuracy:
                for start in range(0, rows.num_rows, PREDICT_ROWS):
                    stop = min(start + PREDICT_ROWS, rows.num_rows)
                    probs = codebook_proba(rows.select(slice(start, stop)), self.parameters)[0]
                    hits = np.argmax(probs, axis=1) == rows.target[start:stop]
                    correct += float(np.sum(weight[start:stop][hits]))
            totals = totals + ScoreTotals(float(weight.sum()), joint, target, correct)
        return totals

    def window_attention(self, rows: WindowRows, near: np.ndarray, cells: np.ndarray) -> np.ndarray:
        """(n, N) each row's predictive attention per position in column order (N - 1 the most recent): a near
        position's own, a far position's share ``sum_b a[b, w_b] / n[b, w_b]`` of its codewords' cells."""
        n = rows.num_rows
        out = np.zeros((n, self.context_length))
        for row in range(n):
            lo, hi = int(rows.begin[row]), int(rows.end[row])
            m0 = min(hi - lo, self.near_window)
            out[row, self.context_length - m0 :] = near[row, :m0][::-1]
            far = np.asarray(rows.tokens[lo : hi - m0], dtype=np.int64)
            if far.size and hi - lo > self.near_window:
                hist = far_histogram(far, self.codes, self.num_codewords)
                books = np.arange(self.num_codebooks)
                share = cells[row][books[None, :], self.codes[far]] / hist[books[None, :], self.codes[far]]
                out[row, self.context_length - (hi - lo) : self.context_length - m0] = share.sum(axis=1)
        return out

    def top_k(self, block: Block, k: int) -> TopK:
        """The ``k`` most probable targets of each row (lower id first on ties), with the predictive attention."""
        if int(k) < 1:
            raise ValueError(f"k = {k}: expected a positive number of targets")
        rows = block.rows
        self.check_rows(rows)
        k = min(int(k), self.num_targets)
        targets = np.empty((rows.num_rows, k), dtype=np.int32)
        probabilities = np.empty((rows.num_rows, k))
        attention = np.empty((rows.num_rows, self.context_length))
        for start in range(0, rows.num_rows, PREDICT_ROWS):
            stop = min(start + PREDICT_ROWS, rows.num_rows)
            part = rows.select(slice(start, stop))
            probs, near, cells = codebook_proba(part, self.parameters)
            order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
            targets[start:stop] = order
            probabilities[start:stop] = np.take_along_axis(probs, order, axis=1)
            attention[start:stop] = self.window_attention(part, near, cells)
        return TopK(targets, probabilities, attention)

    def block_proba(self, block: Block) -> np.ndarray:
        """(n, T) ``p(target | row)`` of a block's token windows."""
        rows = block.rows
        self.check_rows(rows)
        return codebook_proba(rows, self.parameters)[0]

    def predict_proba(self, context: Any, query: Any) -> np.ndarray:
        """``p(target | context, query)`` of full windows: (T,) for one row, (n, T) for a batch."""
        single = np.ndim(context) == 1
        ctx = np.atleast_2d(np.asarray(context))
        y = np.atleast_2d(np.asarray(query, dtype=np.float64))
        rows = WindowRows.from_encoded(ctx, y, np.zeros(ctx.shape[0], dtype=np.int32))
        self.check_rows(rows)
        out = codebook_proba(rows, self.parameters)[0]
        return out[0] if single else out

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> CodebookPredictor:
        """A :class:`CodebookPredictor` over one history."""
        return CodebookPredictor(self, query_table, words=words)


class CodebookPredictor(WindowPredictions):
    """p(next token | history) of a :class:`CodebookHead`: the last N token ids (which say which token leaves the far
    field next) and the far field's (B, W) codeword counts, updated as tokens age (B updates a token). A prediction
    reads the N0 near tokens and the counts only: O((N0 + B W)(D + T)), whatever N and the history's length.

    Args:
        model: the head; ``embeddings``: (S, D) the query table (the next target's query is the last token's row), or
            ``None`` (every prediction takes its ``query``); ``words``: (T,) names for :meth:`top_words`.
    """

    def __init__(
        self, model: CodebookHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None
    ):
        super().__init__(model, embeddings, words=words)
        self.hist = np.zeros((model.num_codebooks, model.num_codewords))
        self.n_far = 0

    def push(self, token: int) -> None:
        """Add the next token: the token at recency N0 enters the far field, the one at recency N - 1 leaves it."""
        s = int(token)
        model = self.model
        if not 0 <= s < model.num_symbols:
            raise ValueError(f"token {token!r}: expected a symbol id in [0, {model.num_symbols})")
        books = np.arange(model.num_codebooks)
        if len(self.window) == model.context_length:  # the oldest token leaves the window
            self.hist[books, model.codes[self.window[0]]] -= 1.0
            self.n_far -= 1
        self.window.append(s)
        if len(self.window) > model.near_window:  # the token N0 back moves from the near part to the far field
            moved = self.window[len(self.window) - 1 - model.near_window]
            self.hist[books, model.codes[moved]] += 1.0
            self.n_far += 1

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)`` (for ``query``, default: the last token's embedding)."""
        model = self.model
        if not self.window:
            raise ValueError("the history is empty: push at least one token before predicting")
        if query is not None:
            y = np.asarray(query, dtype=np.float64)
            if y.shape != (model.query_dim,) or not np.isfinite(y).all():
                raise ValueError(f"query of shape {y.shape}: expected {model.query_dim} finite numbers")
        elif self.embeddings is None:
            raise ValueError("no embeddings were given: pass the query (D,), or make the predictor with the table")
        else:
            y = self.embeddings[self.window[-1]]
        m0 = min(len(self.window), model.near_window)
        # The near tokens from the window's end (a deque reads its ends in O(1) a step).
        near = np.array([self.window[-m0 + j] for j in range(m0)], dtype=np.int64)
        return state_proba(near, self.hist, self.n_far, y, model.parameters)
