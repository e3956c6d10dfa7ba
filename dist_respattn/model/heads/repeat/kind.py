"""The repeat gate as a kind of the head protocol: its spec, its additive statistics, its trainer.

The rates are fitted in closed form, the wrapped head's share chosen on held-out rows. Under the gate alone the
log-likelihood of a row of bucket ``b`` is ``log r_b`` plus terms free of ``r`` when its target repeats a token of
its history, ``log (1 - r_b)`` plus such terms when not, so the maximum-likelihood rate is a ratio of counts,
whatever the wrapped head; the M-step's, with ``a`` pseudo-rows (the spec's ``prior``, 1 by default; 0 is maximum
likelihood) at the rate of the bucket before::

    r_b = (repeats_b + a r_(b-1)) / (rows_b + a)

(:func:`chained_rates`: a bucket of longer histories than any row had takes the longest's rate, not an even one).
The start counts the rates with a pass that reads no distribution, so EM starts where its M-step lands. The gate is
mixed with the wrapped head's own distribution, ``m p + (1 - m) gate(p)``: on prose the wrapped head's own ``p(H)``
says more of a repeat than a rate by history length does, and the gate alone would lose it. ``m`` is chosen on the
held-out rows from :data:`MIX_GRID` after each M-step (one pass scores every share: a row's gate is computed once),
so a gated model is never worse there than the wrapped head (``m = 1``). Its E-steps read the fit's held-out rows, as a
stack's do: the wrapped head was fitted on the training rows, and the gate is judged on rows it did not see.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.fitting.fixed import PointTotals
from dist_respattn.model.heads.base import (
    Block,
    BlockPass,
    Candidates,
    Columns,
    Grid,
    Head,
    HeadSpec,
    Passes,
    Trainer,
    TrainerContext,
)
from dist_respattn.model.heads.repeat.head import RepeatHead, base_view, history_buckets
from dist_respattn.model.heads.repeat.kernels import ACTIVE, REPEATS, UNIFORM, history_gate
from dist_respattn.model.heads.windowed import live_rows
from dist_respattn.model.scores import ScoreTotals

__all__ = [
    "MIX_GRID",
    "REPEAT_FROM",
    "RepeatCandidates",
    "RepeatChoice",
    "RepeatCounts",
    "RepeatGrid",
    "RepeatSpec",
    "RepeatStatistics",
    "RepeatTrainer",
    "chained_rates",
    "repeat_counts",
    "repeat_statistics",
]

#: The option that names the wrapped model (errors name it).
REPEAT_FROM = "--repeat-from"
#: The rate of histories no row has (a fit of no rows at all): a repeat as likely as a new token.
EVEN_RATE = 0.5


@dataclass(frozen=True)
class RepeatSpec(HeadSpec):
    """The settings of a repeat fit: the wrapped model's directory (``path``), the rates' ``prior`` (pseudo-rows at
    the rate of the bucket before, :func:`chained_rates`) and the wrapped head's own share ``mix`` (``None``: chosen
    on held-out rows from :data:`MIX_GRID`). ``base``: the wrapped head itself, for a fit in this process
    (``fit_em``); not part of the JSON (a fit on a cluster loads ``path``)."""

    kind: ClassVar[str] = "repeat"

    path: str = ""
    prior: float = 1.0
    mix: float | None = None
    base: Head | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.prior) and self.prior >= 0.0):
            raise ValueError(f"--repeat-prior {self.prior}: expected a finite number >= 0")
        if self.mix is not None and not 0.0 <= self.mix <= 1.0:
            raise ValueError(f"--repeat-mix {self.mix}: expected the wrapped head's share, in [0, 1]")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "sources": [self.path] if self.path else [], "prior": float(self.prior),
            "mix": None if self.mix is None else float(self.mix),
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepeatSpec:
        sources = [str(s) for s in data.get("sources", ())]
        mix = data.get("mix")
        return cls(sources[0] if sources else "", float(data.get("prior", 1.0)), None if mix is None else float(mix))

    def sources(self) -> tuple[tuple[str, str], ...]:
        return ((REPEAT_FROM, self.path),) if self.path else ()

    @property
    def short_histories(self) -> bool:
        """A repeat fit reads a stream's short histories (every row's window reaches back to its document's start)."""
        return True

    def trainer(self, context: TrainerContext) -> RepeatTrainer:
        """The fit's trainer; refuses a wrapped head of another kind or corpus shape, or a window longer than the
        rows'."""
        heads = (self.base,) if self.base is not None else tuple(context.sources)
        s, n, d, t = context.shape
        if s != t:
            raise ValueError(
                f"the training store has S = {s} symbols but T = {t} targets: a repeat gate reads a store whose "
                "targets are its tokens (a token-stream store: ingest --tokens or --text)"
            )
        if heads:
            base = heads[0]
            where = f"{REPEAT_FROM} {self.path or 'the wrapped head'}"
            try:
                base_view(base)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if (base.num_symbols, base.query_dim, base.num_targets) != (s, d, t):
                raise ValueError(
                    f"{where}: its (S, D, T) = {(base.num_symbols, base.query_dim, base.num_targets)} but the training "
                    f"store's are {(s, d, t)}: the wrapped head is fitted on the same corpus"
                )
            if base.context_length > n:
                raise ValueError(
                    f"{where}: its window N = {base.context_length} is longer than the training rows' N = {n}: read "
                    f"the store with --context {base.context_length} or more (the history's length: 100000 reaches "
                    "the start of most documents)"
                )
        elif not context.saved_meta and context.init is None:
            raise ValueError(f"a repeat fit needs the model it gates: give {REPEAT_FROM} MODEL")
        return RepeatTrainer(heads[0] if heads else None, float(self.prior), context.shape, self.mix)


@dataclass(frozen=True)
class RepeatStatistics:
    """Additive statistics of the gate's E-step: per history bucket, ``repeats`` (K,) the weight of rows whose target
    is in their history and ``rows`` (K,) the weight of rows the gate acts on; the joint ``log_lik`` and predictive
    ``target_log_prob`` sums under the head; ``n_obs`` (the rows' weight)."""

    repeats: np.ndarray
    rows: np.ndarray
    log_lik: float
    target_log_prob: float
    n_obs: float

    def __add__(self, other: RepeatStatistics) -> RepeatStatistics:
        return RepeatStatistics(
            self.repeats + other.repeats, self.rows + other.rows, self.log_lik + other.log_lik,
            self.target_log_prob + other.target_log_prob, self.n_obs + other.n_obs,
        )  # fmt: skip


def chained_rates(repeats: np.ndarray, rows: np.ndarray, prior: float) -> np.ndarray:
    """(K,) each history bucket's rate, ``r_b = (repeats_b + a m_b) / (rows_b + a)``, pulled toward the bucket
    before it: ``m_b = r_(b-1)``, and ``m_0`` the rate of every row, ``(repeats + 1/2) / (rows + 1)``.

    A bucket without rows takes the rate of the one before it (a history longer than any counted repeats as the
    longest counted did; ``a = 0`` is maximum likelihood elsewhere). Without any row at all, :data:`EVEN_RATE`.
    """
    a = float(prior)
    total_rows = float(np.sum(rows))
    if total_rows <= 0.0:
        return np.full(len(rows), EVEN_RATE)
    mean = (float(np.sum(repeats)) + (0.5 if a > 0.0 else 0.0)) / (total_rows + (1.0 if a > 0.0 else 0.0))
    out = np.empty(len(rows))
    for b in range(len(rows)):
        denominator = float(rows[b]) + a
        out[b] = mean if denominator <= 0.0 else (float(repeats[b]) + a * mean) / denominator
        mean = out[b]
    return out


@dataclass(frozen=True)
class RepeatCounts:
    """The rates' counts alone (the start's pass, which reads no distribution): per history bucket ``repeats`` (K,)
    and ``rows`` (K,), as in :class:`RepeatStatistics`."""

    repeats: np.ndarray
    rows: np.ndarray

    def __add__(self, other: RepeatCounts) -> RepeatCounts:
        return RepeatCounts(self.repeats + other.repeats, self.rows + other.rows)


def repeat_counts(num_targets: int, num_buckets: int, blocks: Iterable[Block]) -> RepeatCounts:
    """Per history bucket, the weight of the rows (of weight > 0) the gate acts on and of those whose target repeats:
    O(the blocks' spans), no distribution read."""
    repeats, rows_of = np.zeros(num_buckets), np.zeros(num_buckets)
    no_rates = np.zeros(num_buckets)
    for block in blocks:
        found = live_rows(block)
        if found is None:
            continue
        a = found[0].kernel_arrays()
        m = a.target.shape[0]
        flags, buckets = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
        num_symbols = max(int(a.tokens.max(initial=0)) + 1, num_targets)
        history_gate(
            a.tokens, a.begin, a.end, a.target, no_rates, 0.0, np.zeros((0, num_targets)),
            np.zeros(num_symbols, dtype=np.int64), np.zeros(3, dtype=np.int64), flags, buckets, np.zeros(m),
        )  # fmt: skip
        active = (flags & ACTIVE) != 0
        ws = found[1][active]
        repeats += np.bincount(buckets[active], weights=ws * ((flags[active] & REPEATS) != 0), minlength=num_buckets)
        rows_of += np.bincount(buckets[active], weights=ws, minlength=num_buckets)
    return RepeatCounts(repeats, rows_of)


def repeat_statistics(head: RepeatHead, blocks: Iterable[Block]) -> RepeatStatistics:
    """The gate's E-step over the blocks' rows of weight > 0."""
    k = head.rates.shape[0]
    repeats, rows_of = np.zeros(k), np.zeros(k)
    log_lik = target_log_prob = n_obs = 0.0
    for block in blocks:
        found = live_rows(block)
        if found is None:
            continue
        rows, w = found
        for piece in head.pieces(rows, densities=True, distributions=False):
            ws, flags, buckets, own = w[piece.start : piece.stop], piece.flags, piece.buckets, piece.densities
            assert own is not None
            active = (flags & ACTIVE) != 0
            repeats += np.bincount(buckets[active], weights=ws[active] * ((flags[active] & REPEATS) != 0), minlength=k)
            rows_of += np.bincount(buckets[active], weights=ws[active], minlength=k)
            log_lik += float(ws @ (own[:, 0] + own[:, 1]))
            target_log_prob += float(ws @ own[:, 1])
        n_obs += float(w.sum())
    return RepeatStatistics(repeats, rows_of, log_lik, target_log_prob, n_obs)


@dataclass(frozen=True)
class RepeatChoice:
    """A repeat M-step's choice: the wrapped head's own share ``mix`` (the rates are counts, under ``prior``)."""

    prior: float
    mix: float

    def to_json(self) -> dict[str, Any]:
        return {"repeat_prior": float(self.prior), "repeat_mix": float(self.mix)}

    def describe(self) -> str:
        return f"repeat rates by count (prior {self.prior:g}), the wrapped head's own share {self.mix:g}"


#: The wrapped head's own shares a repeat M-step offers the held-out pass: 0 (the gate alone) to 1 (no gate).
MIX_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True)
class RepeatGrid(Grid):
    """The held-out pass of a repeat M-step: ``head`` (the new rates) under each of ``mixes``. A row's gate is
    computed once: its target's probability under a share ``m`` is ``p(t) (m + (1 - m) s)``, ``s`` the gate's factor
    of the target's side (or ``(1 - m) u`` where that side was spread evenly)."""

    head: RepeatHead
    mixes: tuple[float, ...]

    @property
    def columns(self) -> Columns:
        return self.head.columns

    def score(self, blocks: Iterable[Block]) -> PointTotals:
        mixes = np.asarray(self.mixes, dtype=np.float64)[None, :]
        totals = [ScoreTotals() for _ in self.mixes]
        for block in blocks:
            found = live_rows(block)
            if found is None:
                continue
            rows, w = found
            # The gate alone (mix 0): each row's own target log-probability and its side's factor.
            for piece in self.head.pieces(rows, densities=True, mix=0.0, distributions=False):
                ws, flags, log_factor, own = w[piece.start : piece.stop], piece.flags, piece.log_factor, piece.densities
                assert own is not None
                uniform = ((flags & UNIFORM) != 0)[:, None]
                plain = (own[:, 1] - log_factor)[:, None]  # log p(t): the wrapped head's (own: the gated one)
                factor = np.exp(log_factor)[:, None]
                with np.errstate(divide="ignore"):
                    target = np.where(
                        uniform, np.log(1.0 - mixes) + log_factor[:, None],
                        plain + np.log(mixes + (1.0 - mixes) * factor),
                    )  # fmt: skip
                joint = own[:, 0:1] + target
                for i in range(len(self.mixes)):
                    totals[i] = totals[i] + ScoreTotals(
                        float(ws.sum()), float(ws @ joint[:, i]), float(ws @ target[:, i])
                    )
        return PointTotals(tuple(totals))

    def nbytes(self) -> int:
        return self.head.nbytes()


@dataclass(frozen=True)
class RepeatCandidates(Candidates):
    """A repeat M-step: ``head`` under the counted rates, and the wrapped head's own shares ``mixes`` to choose from
    on held-out rows (one: fixed)."""

    head: RepeatHead
    prior: float
    mixes: tuple[float, ...]

    def default(self) -> RepeatChoice:
        return RepeatChoice(self.prior, self.head.mix if self.head.mix in self.mixes else self.mixes[0])

    def grid(self, around: Any) -> RepeatGrid:
        return RepeatGrid(self.head, self.mixes)

    def choose(self, grid: Grid, scores: Any) -> tuple[RepeatChoice, dict[str, float] | None]:
        if scores is None or scores.weight <= 0.0:
            return self.default(), None
        values = [t.target_log_prob for t in scores.totals]
        best = int(np.argmax(values))  # the first of equals: the smaller share of the wrapped head
        metrics = scores.totals[best].metrics()
        return RepeatChoice(self.prior, self.mixes[best]), {
            name: metrics[name] for name in ("mean_log_likelihood", "target_log_prob", "perplexity")
        }

    def model(self, choice: Any) -> RepeatHead:
        return self.head.with_rates(self.head.rates, float(choice.mix))

    def searches(self) -> bool:
        return len(self.mixes) > 1


class RepeatTrainer(Trainer):
    """A repeat fit: the wrapped head (``None`` for a resumed fit, whose checkpoint holds it), the rates' prior, and
    the shape ``(S, N, D, T)`` of the rows."""

    def __init__(
        self, base: Head | None, prior: float, shape: tuple[int, int, int, int], mix: float | None = None
    ) -> None:
        self.base = base
        self.prior = prior
        self.shape = shape
        #: The wrapped head's own share, fixed; ``None``: chosen on held-out rows from :data:`MIX_GRID`.
        self.mix = mix

    def __getstate__(self) -> dict[str, Any]:
        # The tasks carry the trainer to the workers, and the head they are given holds the wrapped head already.
        state = self.__dict__.copy()
        state["base"] = None
        return state

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    def searches(self) -> bool:
        """Whether the wrapped head's share is chosen on held-out rows (not fixed)."""
        return self.mix is None

    def fits_heldout_rows(self) -> bool:
        """The gate is learned on rows the wrapped head was not fitted on."""
        return True

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if not isinstance(head, RepeatHead):
            raise ValueError(
                f"a repeat fit starts from the model it gates ({REPEAT_FROM}), not from a {head.kind} head"
            )

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if start is not None:
            assert isinstance(start, RepeatHead)
            return start
        assert self.base is not None
        n, t = self.shape[1], self.shape[3]
        k = history_buckets(n)
        # The rates are counts: one pass that reads no distribution finds them, so EM starts where its M-steps land
        # (the first iteration's held-out pass then chooses the share). It reads the E-steps' rows: the held-out ones.
        count = BlockPass("repeats", "counting repeats", functools.partial(repeat_counts, t, k), Columns(windows=True))
        counts = passes.run(count)
        # The gate alone to start: the first M-step's held-out pass chooses the wrapped head's share, unless fixed.
        head = RepeatHead(self.base, self.rates(counts), context_length=n, mix=0.0 if self.mix is None else self.mix)
        passes.say(
            f"repeat gate over the last {n} tokens of each row's history ({k} length buckets) on "
            f"{self.base.describe()}: its rates counted on {float(counts.rows.sum()):,.0f} rows"
        )
        return head

    def statistics(self, head: Head, blocks: Iterator[Block]) -> RepeatStatistics:
        """The gate's E-step over one partition's blocks, in row order (:func:`repeat_statistics`)."""
        assert isinstance(head, RepeatHead)
        return repeat_statistics(head, blocks)

    def rates(self, counts: RepeatCounts | RepeatStatistics) -> np.ndarray:
        """(K,) the rates of these counts (:func:`chained_rates` under the spec's prior)."""
        return chained_rates(counts.repeats, counts.rows, self.prior)

    def m_step(self, statistics: Any, previous: Head) -> RepeatCandidates:
        """The rates of the statistics' counts (:meth:`rates`), the wrapped head's share left to the held-out pass
        (unless fixed)."""
        assert isinstance(statistics, RepeatStatistics) and isinstance(previous, RepeatHead)
        mixes = MIX_GRID if self.mix is None else (float(self.mix),)
        return RepeatCandidates(previous.with_rates(self.rates(statistics)), self.prior, mixes)

    def choice_from_json(self, data: dict[str, Any]) -> RepeatChoice | None:
        if "repeat_mix" not in data:
            return None
        return RepeatChoice(float(data.get("repeat_prior", self.prior)), float(data["repeat_mix"]))

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        """Rows the gate cannot act on: histories of every target (never on text), or no rows in any bucket."""
        if not isinstance(statistics, RepeatStatistics) or statistics.n_obs <= 0.0:
            return []
        if float(statistics.rows.sum()) <= 0.0:
            return [
                "the repeat gate acted on no row: every history was empty or held every target (read the store "
                "with --min-context 1 and a longer --context)"
            ]
        return []
