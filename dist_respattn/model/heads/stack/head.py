"""A stack of fitted heads of different kinds and windows under one gate: the head, its per-row mixing and its
streaming predictor.

Component ``k`` (a single, copy, conjunction or chain-of-hops head of window ``N_k <= N``) reads the last ``N_k``
positions of the stack's window. With the gate ``pi`` (K,), in the ``joint`` mode::

    p(q, t | c) = sum_k pi_k p_k(q, t | c_k),   p(t | c, q) = sum_k w_k p_k(t | c_k, q),   w_k ∝ pi_k p_k(q | c_k)

(a mixture of the components' joint densities); in the ``target`` mode the predictive distributions are interpolated
with the gate itself, the query taken as given: ``p(t | c, q) = sum_k pi_k p_k(t | c_k, q)``, its query density
the mixture's ``sum_k pi_k p_k(q | c_k)``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.heads.base import Block, Columns, Head, head_from_arrays
from dist_respattn.model.heads.sparse_top import top_targets
from dist_respattn.model.heads.windowed import PREDICT_ROWS, TERMS_ROWS, WindowHead
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.scores import ScoreTotals, TopK
from dist_respattn.model.streaming import RankedPredictions, checked_tables

__all__ = [
    "GATE_MODES",
    "StackHead",
    "StackPredictor",
    "component_prefix",
    "component_view",
    "logsumexp_rows",
    "mix_rows",
]

#: How the gate weighs the components: their joint densities, or their predictive distributions.
GATE_MODES = ("joint", "target")


def component_prefix(k: int) -> str:
    """The prefix of component ``k``'s arrays in a stack's checkpoint (``stack_0_key_means``...)."""
    return f"stack_{k}_"


def component_view(head: Head) -> WindowHead:
    """The window head a component is read as: itself (a copy, conjunction or chain-of-hops head), or a single-hop
    head as the copy head with no copy or induction weight (the same densities and predictions, the copy kernels'
    per-row terms). Raises ``ValueError`` for a kind a stack cannot read."""
    from dist_respattn.model.heads.copy import CopyHead
    from dist_respattn.model.heads.copy.head import copy_buckets
    from dist_respattn.model.heads.repeat.head import RepeatHead
    from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution

    if isinstance(head, ResponsibilityAttentionDistribution):
        k = copy_buckets(head).num_buckets
        return CopyHead(head, np.zeros(k), np.zeros(k))
    # A repeat gate reads the history beyond a component's window: it goes over a stack, not into one.
    if isinstance(head, WindowHead) and hasattr(head, "row_densities") and not isinstance(head, StackHead | RepeatHead):
        return head
    raise ValueError(
        f"a stack reads single, copy, conj and hops heads (their per-row densities), not a {head.kind} head"
    )


def logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """(n,) ``log sum_k exp(a[:, k])`` of (n, K), ``-inf`` where every entry is."""
    best = np.max(a, axis=1)
    safe = np.where(np.isfinite(best), best, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.sum(np.exp(a - safe[:, None]), axis=1))


def mix_rows(gate: np.ndarray, densities: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stack's rows from its components' (:meth:`StackHead.densities`, (n, K, 2): ``log p_k(q | c_k)``,
    ``log p_k(t | c_k, q)``): ``(log p(q, t | c) (n,), log p(t | c, q) (n,), log r (n, K))``, ``r`` the
    responsibilities the gate's EM splits each row by (the joint densities' in the ``joint`` mode, the predictive
    ones' in the ``target`` mode)."""
    with np.errstate(divide="ignore"):
        log_gate = np.log(np.asarray(gate, dtype=np.float64))[None, :]
    log_query = densities[:, :, 0]
    log_target = densities[:, :, 1]
    query_part = log_gate + log_query
    log_q = logsumexp_rows(query_part)
    if mode == "joint":
        part = query_part + log_target
        joint = logsumexp_rows(part)
        target = joint - log_q
    else:
        part = log_gate + log_target
        target = logsumexp_rows(part)
        joint = log_q + target
    total = logsumexp_rows(part)
    safe = np.where(np.isfinite(total), total, 0.0)
    return joint, target, part - safe[:, None]


class StackHead(WindowHead):
    """Fitted heads of different kinds and windows under a gate (the head kind ``"stack"``).

    Args:
        gate: (K,) the components' weights (a probability vector).
        components: K fitted heads (single, copy, conj or hops) of one ``S``, ``D`` and ``T``; the stack's window
            is the longest of theirs.
        mode: ``"joint"`` or ``"target"`` (see the module).
        context_length: the window N of the rows it reads (default: the longest component's; at least that).
    """

    kind: ClassVar[str] = "stack"

    def __init__(
        self, gate: Any, components: Sequence[Head], mode: str = "target", *, context_length: int | None = None
    ) -> None:
        if mode not in GATE_MODES:
            raise ValueError(f"gate mode {mode!r}: expected one of {', '.join(GATE_MODES)}")
        self.components = tuple(components)
        if len(self.components) < 1:
            raise ValueError("a stack needs at least one component")
        for head in self.components:
            component_view(head)  # refuses a kind it cannot read
        self.gate = np.array(gate, dtype=np.float64).reshape(-1)
        if self.gate.shape != (len(self.components),):
            raise ValueError(f"gate has {self.gate.shape[0]} entries: expected one per component, {len(components)}")
        if not (np.isfinite(self.gate).all() and (self.gate >= 0.0).all() and abs(self.gate.sum() - 1.0) < 1e-9):
            raise ValueError(f"gate = {self.gate.tolist()}: expected a probability vector")
        self.mode = mode
        first = self.components[0]
        for k, head in enumerate(self.components):
            if (head.num_symbols, head.query_dim, head.num_targets) != (
                first.num_symbols, first.query_dim, first.num_targets,
            ):  # fmt: skip
                raise ValueError(
                    f"component {k} has (S, D, T) = {(head.num_symbols, head.query_dim, head.num_targets)}, "
                    f"component 0 {(first.num_symbols, first.query_dim, first.num_targets)}: a stack's components "
                    "read one corpus"
                )
        self.num_symbols, self.query_dim, self.num_targets = first.num_symbols, first.query_dim, first.num_targets
        self.windows = tuple(int(head.context_length) for head in self.components)
        self.context_length = max(self.windows) if context_length is None else int(context_length)
        if self.context_length < max(self.windows):
            raise ValueError(
                f"N = {self.context_length}: a stack's window holds its longest component's, {max(self.windows)}"
            )

    def __repr__(self) -> str:
        parts = ", ".join(f"{h.kind} N={n}" for h, n in zip(self.components, self.windows, strict=True))
        return f"StackHead({parts}; mode={self.mode}, gate={np.round(self.gate, 4).tolist()})"

    @functools.cached_property
    def views(self) -> tuple[WindowHead, ...]:
        """Each component as the window head it is read as (:func:`component_view`; built once per head)."""
        return tuple(component_view(head) for head in self.components)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("views", None)
        return state

    def with_gate(self, gate: Any) -> StackHead:
        """The same components under another gate."""
        return StackHead(gate, self.components, self.mode, context_length=self.context_length)

    # -- persistence -----------------------------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``stack_gate`` (K,) and each component's arrays under :func:`component_prefix`; JSON with the mode and
        every component's kind and metadata (so a model directory stands alone)."""
        arrays: dict[str, np.ndarray] = {"stack_gate": self.gate.copy()}
        metas = []
        for k, head in enumerate(self.components):
            own, meta = head.to_arrays()
            arrays.update({component_prefix(k) + name: np.asarray(value) for name, value in own.items()})
            metas.append({"kind": head.kind, "meta": meta})
        return arrays, {
            "mode": self.mode, "components": metas, "num_symbols": self.num_symbols,
            "context_length": self.context_length, "query_dim": self.query_dim, "num_targets": self.num_targets,
        }  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> StackHead:
        if "stack_gate" not in arrays:
            raise ValueError("stack: missing array 'stack_gate'")
        metas = meta.get("components")
        if not isinstance(metas, list) or not metas:
            raise ValueError("stack: metadata needs a 'components' list of each component's kind and metadata")
        names = list(arrays.keys()) if hasattr(arrays, "keys") else list(arrays)
        components = []
        for k, entry in enumerate(metas):
            prefix = component_prefix(k)
            own = {name[len(prefix) :]: np.asarray(arrays[name]) for name in names if name.startswith(prefix)}
            components.append(head_from_arrays(str(entry["kind"]), own, dict(entry["meta"])))
        return cls(
            np.asarray(arrays["stack_gate"]), components, str(meta.get("mode", "target")),
            context_length=int(meta["context_length"]) if "context_length" in meta else None,
        )  # fmt: skip

    def num_parameters(self) -> int:
        """The components' parameters and the gate's K - 1 free ones."""
        return int(sum(h.num_parameters() for h in self.components) + len(self.components) - 1)

    def nbytes(self) -> int:
        return int(sum(h.nbytes() for h in self.components) + self.gate.nbytes)

    def describe(self) -> str:
        parts = " + ".join(f"{h.kind} (N = {n})" for h, n in zip(self.components, self.windows, strict=True))
        return f"stack of {parts}, {self.mode} gate"

    def record(self) -> dict[str, Any]:
        """Each component's gate weight, ``stack_gate_K`` (numbers, as every kind's record holds)."""
        return {f"stack_gate_{k}": float(v) for k, v in enumerate(self.gate)}

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        weights = ", ".join(
            f"{h.kind} N = {n}: {g:.4f}" for h, n, g in zip(self.components, self.windows, self.gate, strict=True)
        )
        return {"stack_gate": [float(v) for v in self.gate], "stack_gate_mode": self.mode}, [
            f"last model: stack gate ({self.mode}) {weights}"
        ]

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        # Each named by its kind and window too: the kinds' own names ("own table", "emission") say nothing of which
        # part they come from.
        return [
            (f"component {k}, {head.kind} N = {window} ({name})", table)
            for k, (head, window) in enumerate(zip(self.components, self.windows, strict=True))
            for name, table in head.emissions(options)
        ]

    # -- reading rows ----------------------------------------------------------------------------------------------

    @property
    def columns(self) -> Columns:
        """Token windows: each component reads the last ``N_k`` tokens of the stack's window."""
        return Columns(windows=True)

    def check_rows(self, rows: WindowRows) -> None:
        rows.check(self.num_symbols, self.num_targets, self.context_length, self.query_dim)

    def component_rows(self, rows: WindowRows, k: int) -> WindowRows:
        """The rows as component ``k`` reads them: the last ``N_k`` tokens of each window."""
        n_k = self.windows[k]
        begin = np.maximum(np.asarray(rows.begin), np.asarray(rows.end) - n_k)
        return rows._replace(begin=begin.astype(np.asarray(rows.begin).dtype, copy=False))

    def densities(self, rows: WindowRows) -> np.ndarray:
        """(n, K, 2) each row's ``(log p_k(q | c_k), log p_k(t | c_k, q))`` under every component (its own kernel's
        per-row terms), whatever the rows' weights."""
        self.check_rows(rows)
        out = np.empty((rows.num_rows, len(self.components), 2))
        for k, view in enumerate(self.views):
            out[:, k, :] = view.row_densities(self.component_rows(rows, k))  # type: ignore[attr-defined]
        return out

    def row_densities(self, rows: WindowRows) -> np.ndarray:
        """(n, 2) each row's ``(log p(q | c), log p(t | c, q))`` under the stack."""
        joint, target, _ = mix_rows(self.gate, self.densities(rows), self.mode)
        return np.stack([joint - target, target], axis=1)

    def prediction_weights(self, densities: np.ndarray) -> np.ndarray:
        """(n, K) the weights each row's prediction mixes the components' with: ``pi_k p_k(q | c_k)`` normalized in the
        joint mode, ``pi`` in the target mode."""
        n = densities.shape[0]
        if self.mode == "target":
            return np.broadcast_to(self.gate[None, :], (n, self.gate.shape[0])).copy()
        with np.errstate(divide="ignore"):
            part = np.log(self.gate)[None, :] + densities[:, :, 0]
        total = logsumexp_rows(part)
        return np.exp(part - np.where(np.isfinite(total), total, 0.0)[:, None])

    def predict_rows(self, rows: WindowRows) -> tuple[np.ndarray, np.ndarray]:
        """``(p(target | row) (n, T), attention (n, N))`` of window rows: the components' predictions and their
        attentions (over their last ``N_k`` columns) mixed with :meth:`prediction_weights`."""
        weights = self.prediction_weights(self.densities(rows))
        probs = np.zeros((rows.num_rows, self.num_targets))
        attention = np.zeros((rows.num_rows, self.context_length))
        for k, view in enumerate(self.views):
            if not self.gate[k] > 0.0:
                continue
            sub = self.component_rows(rows, k)
            att = view.window_attention(sub)
            probs += weights[:, k : k + 1] * view.window_proba(sub, att)
            attention[:, self.context_length - self.windows[k] :] += weights[:, k : k + 1] * att
        return probs, attention

    def score(self, blocks: Iterable[Block], *, accuracy: bool = True) -> ScoreTotals:
        """Held-out totals of the blocks' rows (those of weight > 0): joint and predictive log-likelihoods and, with
        ``accuracy``, the arg-max hits (from the components' sparse terms when :attr:`has_terms`, else O(T) a row in
        NumPy)."""
        totals = ScoreTotals()
        for block in blocks:
            rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
            self.check_rows(rows)
            w = np.ones(rows.num_rows) if rows.weight is None else np.asarray(rows.weight, dtype=np.float64)
            live = np.flatnonzero(w > 0.0)
            if live.size == 0:
                continue
            rows, w = rows.select(live), w[live]
            densities = self.densities(rows)
            joint, target, _ = mix_rows(self.gate, densities, self.mode)
            correct = self.hits(rows, w, densities) if accuracy else 0.0
            totals = totals + ScoreTotals(float(w.sum()), float(w @ joint), float(w @ target), correct)
        return totals

    @property
    def has_terms(self) -> bool:
        """Whether every component of positive weight gives its predictions' terms (sparse emissions): then the
        stack's top-K needs no (n, T) array (:func:`~dist_respattn.model.heads.sparse_top.top_targets`)."""
        return all(view.has_terms for view, g in zip(self.views, self.gate, strict=True) if g > 0.0)

    def mixed_top(self, rows: WindowRows, k: int, densities: np.ndarray | None = None) -> TopK:
        """The ``k`` best targets of each row (lower id first on ties), their probabilities and the mixed attention,
        from the components' sparse terms (:attr:`has_terms`), equal to :meth:`predict_rows`' (n, T) rows' bit for
        bit; ``densities``: :meth:`densities` of the rows when the caller has them."""
        weights = self.prediction_weights(self.densities(rows) if densities is None else densities)
        attention = np.zeros((rows.num_rows, self.context_length))
        parts, mix = [], []
        for j, view in enumerate(self.views):
            if not self.gate[j] > 0.0:
                continue
            sub = self.component_rows(rows, j)
            att = view.window_attention(sub)
            attention[:, self.context_length - self.windows[j] :] += weights[:, j : j + 1] * att
            terms = view.window_terms(sub, att)
            assert terms is not None
            parts.append(terms)
            mix.append(weights[:, j])
        targets, probabilities = top_targets(parts, np.stack(mix, axis=1), k)
        return TopK(targets.astype(np.int32), probabilities, attention)

    def hits(self, rows: WindowRows, w: np.ndarray, densities: np.ndarray | None = None) -> float:
        """``sum w`` over the rows whose target is the arg-max (first on ties) of their prediction (from the sparse
        terms when :attr:`has_terms`, else :meth:`predict_rows`' (n, T) rows)."""
        hits = 0.0
        if self.has_terms:
            for start in range(0, rows.num_rows, TERMS_ROWS):
                stop = min(start + TERMS_ROWS, rows.num_rows)
                part = None if densities is None else densities[start:stop]
                best = self.mixed_top(rows.select(slice(start, stop)), 1, part).targets[:, 0]
                hits += float(w[start:stop][best == rows.target[start:stop]].sum())
            return hits
        for start in range(0, rows.num_rows, PREDICT_ROWS):
            stop = min(start + PREDICT_ROWS, rows.num_rows)
            probs, _ = self.predict_rows(rows.select(slice(start, stop)))
            correct = np.argmax(probs, axis=1) == rows.target[start:stop]
            hits += float(w[start:stop][correct].sum())
        return hits

    def window_attention(self, rows: WindowRows) -> np.ndarray:
        """(n, N) each row's predictive attention: the components', each over its last ``N_k`` columns, mixed."""
        return self.predict_rows(rows)[1]

    def window_proba(self, rows: WindowRows, attention: np.ndarray) -> np.ndarray:
        """(n, T) ``p(target | window, query)`` (the components' own attentions are read; ``attention`` is not)."""
        return self.predict_rows(rows)[0]

    def top_k(self, block: Block, k: int) -> TopK:
        """The ``k`` most probable targets of each row (lower id first on ties), with the mixed attention."""
        if int(k) < 1:
            raise ValueError(f"k = {k}: expected a positive number of targets")
        rows = block.rows
        self.check_rows(rows)
        k = min(int(k), self.num_targets)
        targets = np.empty((rows.num_rows, k), dtype=np.int32)
        probabilities = np.empty((rows.num_rows, k))
        attention = np.empty((rows.num_rows, self.context_length))
        if self.has_terms:
            for start in range(0, rows.num_rows, TERMS_ROWS):
                stop = min(start + TERMS_ROWS, rows.num_rows)
                top = self.mixed_top(rows.select(slice(start, stop)), k)
                targets[start:stop], probabilities[start:stop], attention[start:stop] = (
                    top.targets, top.probabilities, top.attention,
                )  # fmt: skip
            return TopK(targets, probabilities, attention)
        for start in range(0, rows.num_rows, PREDICT_ROWS):
            stop = min(start + PREDICT_ROWS, rows.num_rows)
            probs, attention[start:stop] = self.predict_rows(rows.select(slice(start, stop)))
            order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
            targets[start:stop] = order
            probabilities[start:stop] = np.take_along_axis(probs, order, axis=1)
        return TopK(targets, probabilities, attention)

    def predictor(
        self,
        *,
        words: Sequence[str] | None = None,
        query_table: np.ndarray | None = None,
        options: dict[str, Any] | None = None,
    ) -> StackPredictor:
        """A :class:`StackPredictor` over one history (its state: each component predictor's)."""
        return StackPredictor(self, query_table, words=words)


class StackPredictor(RankedPredictions):
    """p(next token | history) of a :class:`StackHead`: every token goes to each component's own predictor, whose
    predictions the gate mixes (weighed by each one's ``log p(query | history)`` in the joint mode).

    Args:
        model: the stack; ``embeddings``: (S, D) the query table (the next target's query is the last token's row),
            or ``None`` (every prediction takes its ``query``); ``words``: (T,) names for :meth:`top_words`.
    """

    def __init__(self, model: StackHead, embeddings: np.ndarray | None = None, *, words: Sequence[str] | None = None):
        self.model = model
        self.embeddings, self.words = checked_tables(model, embeddings, words)
        self.parts = [view.predictor(query_table=self.embeddings) for view in model.views]

    def push(self, token: int) -> None:
        """Add the next token of the history (an id in [0, S)) to every component's predictor."""
        for part in self.parts:
            part.push(token)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in np.asarray(tokens).reshape(-1):
            self.push(int(token))

    @property
    def state_size(self) -> int:
        """The largest of the components' states (each bounded by its own model, the last N_k tokens at most)."""
        return max(part.state_size for part in self.parts)

    def predict(self, query: Any = None) -> np.ndarray:
        """(T,) ``p(next target | history)`` for ``query`` (default: the last token's embedding)."""
        gate = self.model.gate
        live = [k for k in range(len(self.parts)) if gate[k] > 0.0]
        if self.model.mode == "joint":
            log_q = np.array([self.parts[k].log_query_density(query) for k in live])  # type: ignore[attr-defined]
            part = np.log(gate[live]) + log_q
            weights = np.exp(part - part.max())
            weights /= weights.sum()
        else:
            weights = gate[live]
        out = np.zeros(self.model.num_targets)
        for w, k in zip(weights, live, strict=True):
            out += w * self.parts[k].predict(query)
        return out
