"""A repeat gate over a row's whole history on a fitted head: the head, its gated rows and its streaming predictor.

The next token is either one of the tokens already in the row's history ``H`` (its window of N tokens: up to the
whole document), with probability ``r_b``, or a new one (``1 - r_b``), each drawn from the wrapped head's own
distribution ``p`` renormalized over its side (RepeatNet's repeat/explore split, Ren et al., AAAI 2019), and the
gate is mixed with ``p`` itself, ``m`` of it (``m = 1``: the wrapped head; chosen on held-out rows)::

    p'(t | c, q) = m p(t | c, q) + (1 - m) r_b p(t | c, q) / p(H)              t in H
                 = m p(t | c, q) + (1 - m) (1 - r_b) p(t | c, q) / (1 - p(H))  t not in H

``b`` is the history's length bucket (``floor(log2 |window|)``: a file's tenth token repeats less often than its
thousandth), ``p(H)`` the wrapped distribution's mass on ``H``'s distinct tokens. The wrapped head reads the last
``N_w`` tokens of the window, as a stack's components do; its query density is the gated head's. A proper
distribution for any head, whatever its window: a cache over the whole document at the cost of one (T,) sum a row
(the fit's passes, under a sparse emission: of the row's own terms, :mod:`~dist_respattn.model.heads.repeat.masses`).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from dist_respattn.model.heads.base import Block, Columns, Head, head_from_arrays
from dist_respattn.model.heads.repeat.kernels import UNIFORM, gate_distribution, history_bucket, history_gate, mass_gate
from dist_respattn.model.heads.repeat.masses import HistoryMasses, TargetColumns, has_masses
from dist_respattn.model.heads.windowed import PREDICT_ROWS, TERMS_ROWS, WindowHead, live_rows
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import ScoreTotals, TopK
from dist_respattn.model.streaming import RankedPredictions, checked_tables

__all__ = [
    "BASE_PREFIX",
    "GatedRows",
    "Piece",
    "RepeatHead",
    "RepeatPredictor",
    "base_predictions",
    "base_view",
    "history_buckets",
]

#: The prefix of the wrapped head's arrays in a repeat head's checkpoint.
BASE_PREFIX = "repeat_base_"


def history_buckets(context_length: int) -> int:
    """K, the length buckets of histories of 1 to N tokens: ``floor(log2 N) + 1``."""
    return max(int(context_length), 1).bit_length()


def base_view(head: Head) -> WindowHead:
    """The window head a repeat gate wraps: a stack as it is, any stack component as the stack reads it (a single
    head as a copy head without copy weights). Raises ``ValueError`` for a kind it cannot read."""
    from dist_respattn.model.heads.stack.head import StackHead, component_view

    if isinstance(head, StackHead):
        return head
    try:
        return component_view(head)
    except ValueError:
        raise ValueError(
            f"a repeat gate wraps a single, copy, conj, hops or stack head (their per-row densities), not a "
            f"{head.kind} head"
        ) from None


def base_predictions(view: WindowHead, rows: WindowRows) -> tuple[np.ndarray, np.ndarray]:
    """``(p (n, T), attention (n, N_w))``: the wrapped head's distributions of ``rows`` and its attention, a stack's
    from one pass over its components (its ``window_attention`` and ``window_proba`` would each run them)."""
    predict_rows = getattr(view, "predict_rows", None)
    if predict_rows is not None:
        proba, attention = predict_rows(rows)
        return np.asarray(proba), np.asarray(attention)
    attention = view.window_attention(rows)
    return np.asarray(view.window_proba(rows, attention)), np.asarray(attention)


class Piece(NamedTuple):
    """Rows ``start:stop`` of a block under a repeat head (what :meth:`RepeatHead.pieces` yields).

    Attributes:
        proba: (m, T) the gated distributions; ``attention``: (m, N_w) the wrapped head's (both ``None`` for pieces
            read without distributions: :meth:`RepeatHead.pieces`' ``distributions``).
        flags, buckets: (m,) int64 (:mod:`~dist_respattn.model.heads.repeat.kernels`'s flags, the history buckets);
            ``log_factor``: (m,) float64, the gate's factor of each row's target (its probability where uniform).
        densities: (m, 2) ``(log p(q | c), log p'(t | c, q))``, or ``None`` when not asked for.
    """

    start: int
    stop: int
    proba: np.ndarray | None
    attention: np.ndarray | None
    flags: np.ndarray
    buckets: np.ndarray
    log_factor: np.ndarray
    densities: np.ndarray | None


class GatedRows:
    """Rows of one block gated a piece at a time, in row order: the history counts carry from one piece to the next.

    Attributes (per piece, after :meth:`gate`): ``flags`` (m,) int64 (:mod:`~dist_respattn.model.heads.repeat.kernels`
    flags), ``buckets`` (m,) int64, ``log_factor`` (m,) float64.
    """

    def __init__(self, head: RepeatHead, rows: WindowRows) -> None:
        self.head = head
        self.arrays = rows.kernel_arrays()
        self.counts = np.zeros(head.num_symbols, dtype=np.int64)
        self.state = np.zeros(3, dtype=np.int64)

    def gate(
        self, start: int, stop: int, proba: np.ndarray | None, mix: float | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(flags, buckets, log_factor)`` of rows ``start:stop`` (the next piece), their (m, T) ``proba`` gated in
        place (``None``: only the flags and buckets, no distribution read), keeping ``mix`` of it (default: the
        head's)."""
        a = self.arrays
        m = stop - start
        dense = np.zeros((0, self.head.num_targets)) if proba is None else proba
        flags = np.zeros(m, dtype=np.int64)
        buckets = np.zeros(m, dtype=np.int64)
        log_factor = np.zeros(m)
        history_gate(
            a.tokens, a.begin[start:stop], a.end[start:stop], a.target[start:stop], self.head.rates,
            self.head.mix if mix is None else float(mix), dense,
            self.counts, self.state, flags, buckets, log_factor,
        )  # fmt: skip
        return flags, buckets, log_factor

    def gate_masses(
        self, start: int, stop: int, seen: np.ndarray, total: np.ndarray, mix: float | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`gate`'s ``(flags, buckets, log_factor)`` of rows ``start:stop`` from the wrapped distributions'
        masses on the rows' histories (``seen`` (m,)) and in all (``total`` (m,)) instead of their (m, T) rows."""
        a = self.arrays
        m = stop - start
        flags = np.zeros(m, dtype=np.int64)
        buckets = np.zeros(m, dtype=np.int64)
        log_factor = np.zeros(m)
        mass_gate(
            a.tokens, a.begin[start:stop], a.end[start:stop], a.target[start:stop], self.head.rates,
            self.head.mix if mix is None else float(mix), self.head.num_targets, seen, total,
            self.counts, self.state, flags, buckets, log_factor,
        )  # fmt: skip
        return flags, buckets, log_factor


class RepeatHead(WindowHead):
    """A fitted head under a repeat gate over the row's history (the head kind ``"repeat"``).

    Args:
        base: the wrapped head (single, copy, conj, hops or stack) of a token-stream corpus (``S = T``: its targets
            are its tokens).
        rates: (K,) ``r_b``, the probability of a repeat after a history of bucket ``b`` (:func:`history_buckets`
            of N).
        context_length: N, how far back the history reaches (at least the wrapped head's window).
        mix: ``m`` in [0, 1], the wrapped head's own share: where its own ``p(H)`` says more about a repeat than a
            rate by history length (prose), the gate keeps some of it.
    """

    kind: ClassVar[str] = "repeat"

    def __init__(self, base: Head, rates: Any, *, context_length: int, mix: float = 0.0) -> None:
        base_view(base)  # refuses a kind it cannot read
        if base.num_symbols != base.num_targets:
            raise ValueError(
                f"the wrapped head has S = {base.num_symbols} symbols but T = {base.num_targets} targets: a repeat "
                "gate reads a store whose targets are its tokens (a token-stream store)"
            )
        self.base = base
        self.context_length = int(context_length)
        if self.context_length < base.context_length:
            raise ValueError(
                f"N = {self.context_length}: a repeat gate's history holds the wrapped head's window, "
                f"N = {base.context_length}, at least"
            )
        self.rates = np.array(rates, dtype=np.float64).reshape(-1)
        k = history_buckets(self.context_length)
        if self.rates.shape != (k,):
            raise ValueError(f"{self.rates.shape[0]} repeat rates: expected one per history bucket of N, {k}")
        if not (np.isfinite(self.rates).all() and (self.rates >= 0.0).all() and (self.rates <= 1.0).all()):
            raise ValueError(f"repeat rates {self.rates.tolist()}: expected probabilities")
        self.mix = float(mix)
        if not 0.0 <= self.mix <= 1.0:
            raise ValueError(f"mix = {mix}: expected the wrapped head's share, in [0, 1]")
        self.num_symbols, self.query_dim, self.num_targets = base.num_symbols, base.query_dim, base.num_targets

    def __repr__(self) -> str:
        rates = np.round(self.rates, 4).tolist()
        return f"RepeatHead(N={self.context_length}, rates={rates}, mix={self.mix:g}, base={self.base!r})"

    @functools.cached_property
    def view(self) -> WindowHead:
        """The wrapped head as the window head it is read as (:func:`base_view`; built once per head)."""
        return base_view(self.base)

    @functools.cached_property
    def mass_columns(self) -> dict[int, TargetColumns]:
        """The wrapped head's sparse emissions by target (:class:`~dist_respattn.model.heads.repeat.masses.
        TargetColumns`), by ``id`` of the emission: built once per head, as its first held-out pass reads them."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("view", None)
        state.pop("mass_columns", None)
        return state

    def with_rates(self, rates: Any, mix: float | None = None) -> RepeatHead:
        """The same wrapped head under other rates (and another share ``mix`` of its own, when given)."""
        return RepeatHead(self.base, rates, context_length=self.context_length, mix=self.mix if mix is None else mix)

    @property
    def attention_length(self) -> int:
        """The attention it reports: the wrapped head's, over the last ``N_w`` positions (the gate attends to none)."""
        return int(self.base.context_length)

    # -- persistence -----------------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``repeat_rates`` (K,), ``repeat_mix`` () and the wrapped head's arrays under :data:`BASE_PREFIX`; JSON
        with its kind and metadata (so a model directory stands alone)."""
        own, meta = self.base.to_arrays()
        arrays = {"repeat_rates": self.rates.copy(), "repeat_mix": np.array(self.mix)}
        arrays.update({BASE_PREFIX + name: np.asarray(value) for name, value in own.items()})
        return arrays, {
            "base": {"kind": self.base.kind, "meta": meta}, "num_symbols": self.num_symbols,
            "context_length": self.context_length, "query_dim": self.query_dim, "num_targets": self.num_targets,
        }  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> RepeatHead:
        if "repeat_rates" not in arrays:
            raise ValueError("repeat: missing array 'repeat_rates'")
        base = meta.get("base")
        if not isinstance(base, dict) or "kind" not in base:
            raise ValueError("repeat: metadata needs 'base', the wrapped head's kind and metadata")
        names = list(arrays.keys()) if hasattr(arrays, "keys") else list(arrays)
        own = {name[len(BASE_PREFIX) :]: np.asarray(arrays[name]) for name in names if name.startswith(BASE_PREFIX)}
        head = head_from_arrays(str(base["kind"]), own, dict(base.get("meta") or {}))
        mix = float(np.asarray(arrays["repeat_mix"])) if "repeat_mix" in names else 0.0
        return cls(head, np.asarray(arrays["repeat_rates"]), context_length=int(meta["context_length"]), mix=mix)

    def num_parameters(self) -> int:
        """The wrapped head's parameters, the K rates and the mix."""
        return int(self.base.num_parameters() + self.rates.shape[0] + 1)

    def nbytes(self) -> int:
        return int(self.base.nbytes() + self.rates.nbytes)

    def describe(self) -> str:
        return f"repeat gate over {self.context_length} tokens of history on {self.base.describe()}"

    def record(self) -> dict[str, Any]:
        """Each history bucket's repeat rate, ``repeat_rate_B``, and the mix (numbers, as every kind's record holds)."""
        return {"repeat_mix": self.mix, **{f"repeat_rate_{b}": float(v) for b, v in enumerate(self.rates)}}

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        rates = ", ".join(f"{1 << b}+: {v:.4f}" for b, v in enumerate(self.rates))
        return {"repeat_rates": [float(v) for v in self.rates], "repeat_mix": self.mix}, [
            f"last model: repeat rate by history length (tokens) {rates}; the wrapped head's own share "
            f"{self.mix:g}; wrapped head: {self.base.describe()}"
        ]

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        return self.base.emissions(options)

    # -- reading rows ----------------------------------------------------------------------------------------------

    @property
    def columns(self) -> Columns:
        """Token windows: the history is the window; the wrapped head reads its last ``N_w`` tokens."""
        return Columns(windows=True)

    def check_rows(self, rows: WindowRows) -> None:
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)

    def base_rows(self, rows: WindowRows) -> WindowRows:
        """The rows as the wrapped head reads them: the last ``N_w`` tokens of each window."""
        begin = np.maximum(np.asarray(rows.begin), np.asarray(rows.end) - int(self.base.context_length))
        return rows._replace(begin=begin.astype(np.asarray(rows.begin).dtype, copy=False))

    def pieces(
        self,
        rows: WindowRows,
        *,
        densities: bool = False,
        mix: float | None = None,
        distributions: bool = True,
    ) -> Iterator[Piece]:
        """The rows :data:`PREDICT_ROWS` at a time, in row order (:class:`Piece`): the wrapped head's distributions
        gated (keeping ``mix`` of them; default: the head's), its attention, and with ``densities`` each row's
        ``(log p(q | c), log p'(t | c, q))``.

        Without ``distributions`` only the densities are wanted: a wrapped head whose predictions have sparse terms
        (:func:`~dist_respattn.model.heads.repeat.masses.has_masses`) then gives its masses on the histories instead
        of (m, T) rows, :data:`TERMS_ROWS` at a time, and the pieces carry no distribution or attention.
        """
        self.check_rows(rows)
        gated = GatedRows(self, rows)
        inner = self.base_rows(rows)
        view = self.view
        if not distributions and has_masses(view):
            yield from self._mass_pieces(rows, gated, inner, mix)
            return
        for start in range(0, rows.num_rows, PREDICT_ROWS):
            stop = min(start + PREDICT_ROWS, rows.num_rows)
            sub = inner.select(slice(start, stop))
            proba, attention = base_predictions(view, sub)
            proba = np.array(proba, dtype=np.float64, order="C")
            flags, buckets, log_factor = gated.gate(start, stop, proba, mix)
            own = None
            if densities:
                own = np.array(view.row_densities(sub), dtype=np.float64)  # type: ignore[attr-defined]
                uniform = (flags & UNIFORM) != 0
                own[:, 1] = np.where(uniform, log_factor, own[:, 1] + log_factor)
            yield Piece(start, stop, proba, attention, flags, buckets, log_factor, own)

    def _mass_pieces(self, rows: WindowRows, gated: GatedRows, inner: WindowRows, mix: float | None) -> Iterator[Piece]:
        """:meth:`pieces` with densities and no distributions, from the wrapped head's masses on the histories."""
        a = gated.arrays
        masses = HistoryMasses(self.view, a.tokens, self.mass_columns)
        for start in range(0, rows.num_rows, TERMS_ROWS):
            stop = min(start + TERMS_ROWS, rows.num_rows)
            sub = inner.select(slice(start, stop))
            piece = masses.masses(sub, a.begin[start:stop], a.end[start:stop])
            flags, buckets, log_factor = gated.gate_masses(start, stop, piece.seen, piece.total, mix)
            own = piece.own
            uniform = (flags & UNIFORM) != 0
            own[:, 1] = np.where(uniform, log_factor, own[:, 1] + log_factor)
            yield Piece(start, stop, None, None, flags, buckets, log_factor, own)

    def row_densities(self, rows: WindowRows) -> np.ndarray:
        """(n, 2) each row's ``(log p(q | c), log p'(t | c, q))``: the wrapped head's query density, gated target."""
        out = np.empty((rows.num_rows, 2))
        for piece in self.pieces(rows, densities=True, distributions=False):
            out[piece.start : piece.stop] = piece.densities
        return out

    def window_attention(self, rows: WindowRows) -> np.ndarray:
        """(n, N_w) the wrapped head's predictive attention over the last ``N_w`` positions."""
        return self.view.window_attention(self.base_rows(rows))

    def window_proba(self, rows: WindowRows, attention: np.ndarray) -> np.ndarray:
        """(n, T) ``p'(target | history, query)`` (the wrapped head's own attention is read; ``attention`` is not)."""
        out = np.empty((rows.num_rows, self.num_targets))
        for piece in self.pieces(rows):
            assert piece.proba is not None
            out[piece.start : piece.stop] = piece.proba
        return out

    def block_proba(self, block: Block) -> np.ndarray:
        """(n, T) ``p'(target | row)`` of a block's token windows."""
        return self.window_proba(block.rows, np.zeros((0, 0)))

    def score(self, blocks: Iterable[Block], *, accuracy: bool = True) -> ScoreTotals:
        """Held-out totals of the blocks' rows (those of weight > 0): joint and predictive log-likelihoods and, with
        ``accuracy``, the arg-max hits of the gated distributions (first on ties). Every row's history is counted;
        only the live rows are scored."""
        totals = ScoreTotals()
        for block in blocks:
            found = live_rows(block)  # a row's history is its own window: dropping rows changes no history
            if found is None:
                continue
            rows, w = found
            joint = target = correct = 0.0
            # The arg-max needs each row's (T,) distribution; the densities alone, the masses on the histories.
            for piece in self.pieces(rows, densities=True, distributions=accuracy):
                own, ws = piece.densities, w[piece.start : piece.stop]
                assert own is not None
                joint += float(ws @ (own[:, 0] + own[:, 1]))
                target += float(ws @ own[:, 1])
                if accuracy:
                    assert piece.proba is not None
                    best = np.argmax(piece.proba, axis=1)
                    correct += float(ws[best == np.asarray(rows.target[piece.start : piece.stop])].sum())
            totals = totals + ScoreTotals(float(w.sum()), joint, target, correct)
        return totals

    def top_k(self, block: Block, k: int) -> TopK:
        """The ``k`` most probable targets of each row under the gate (lower id first on ties), with the wrapped
        head's attention (n, N_w)."""
        if int(k) < 1:
            raise ValueError(f"k = {k}: expected a positive number of targets")
        rows = block.rows
        k = min(int(k), self.num_targets)
        targets = np.empty((rows.num_rows, k), dtype=np.int32)
        probabilities = np.empty((rows.num_rows, k))
        attention = np.empty((rows.num_rows, self.attention_length))
        for piece in self.pieces(rows):
            assert piece.proba is not None and piece.attention is not None
            order = np.argsort(-piece.proba, axis=1, kind="stable")[:, :k]
            targets[piece.start : piece.stop] = order
            probabilities[piece.start : piece.stop] = np.take_along_axis(piece.proba, order, axis=1)
            attention[piece.start : piece.stop] = piece.attention
        return TopK(targets, probabilities, attention)

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> RepeatPredictor:
        """A :class:`RepeatPredictor` over one history."""
        return RepeatPredictor(self, query_table, words=words)


class RepeatPredictor(RankedPredictions):
    """p'(next token | history) of a :class:`RepeatHead`: the wrapped head's own predictor, gated by the history's
    last N tokens, whose distinct tokens are counted as they come and go.

    Args:
        model: the head; ``embeddings``: (S, D) the query table (the next target's query is the last token's row),
            or ``None`` (every prediction takes its ``query``); ``words``: (T,) names for :meth:`top_words`.
    """

    def __init__(self, model: RepeatHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None):
        self.model = model
        self.embeddings, self.words = checked_tables(model, embeddings, words)
        self.inner = model.view.predictor(query_table=self.embeddings)
        self.window: deque[int] = deque()  # the history's last N tokens, oldest first
        self.counts = np.zeros(model.num_symbols, dtype=np.int64)
        self.distinct = 0

    def push(self, token: int) -> None:
        """Add the next token of the history (an id in [0, S)); the token N back leaves the history."""
        s = int(token)
        if not 0 <= s < self.model.num_symbols:
            raise ValueError(f"token {token!r}: expected a symbol id in [0, {self.model.num_symbols})")
        self.inner.push(s)
        self.window.append(s)
        self.distinct += int(self.counts[s] == 0)
        self.counts[s] += 1
        if len(self.window) > self.model.context_length:
            old = self.window.popleft()
            self.counts[old] -= 1
            self.distinct -= int(self.counts[old] == 0)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in np.asarray(tokens).reshape(-1):
            self.push(int(token))

    @property
    def state_size(self) -> int:
        """Token ids held: the history's last N (the wrapped predictor holds fewer, and the counts are (S,))."""
        return len(self.window)

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p'(next target | history)`` for ``query`` (default: the last token's embedding)."""
        proba = np.array(self.inner.predict(query), dtype=np.float64)
        if 0 < self.distinct < self.model.num_targets:
            gate_distribution(proba, self.counts, self.distinct, self.repeat_rate(), self.model.mix)
        return proba

    def repeat_rate(self) -> float:
        """The gate's ``r_b`` for the history as it is now."""
        return float(self.model.rates[history_bucket(max(len(self.window), 1), self.model.rates.shape[0])])
