"""The codebook head as a kind of the head protocol: its spec, additive statistics, trainer and (closed-form) M-step.

A fit starts from a fitted single head (``--codebook-from MODEL``, of any window): its keys, gate variance, near
position prior and emission table become the near part; the codebooks are a k-means of its symbols' keys and
emission rows (:mod:`dist_respattn.model.heads.codebook.quantize`), recorded in every checkpoint; each codeword
starts from its members' mean key and mean emission row. Every EM step is then exact and closed form: the statistics are
responsibility-weighted sums (:mod:`dist_respattn.model.heads.codebook.kernels`), the M-step their ratios, the two
tables MAP estimates under Dirichlet priors centred on the start's tables, their pseudo-counts chosen on held-out rows
unless given.
The gate variance stays the start's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dist_respattn.model.fitting.fixed import PointTotals
from dist_respattn.model.heads.base import (
    Block,
    Candidates,
    Columns,
    Grid,
    Head,
    HeadSpec,
    Passes,
    Trainer,
    TrainerContext,
    sum_into_copy,
)
from dist_respattn.model.heads.codebook.head import CodebookHead
from dist_respattn.model.heads.codebook.kernels import (
    CodebookArrays,
    CodebookParameters,
    NearCounts,
    codebook_estep,
    far_masses,
    near_table,
    take_near_counts,
)
from dist_respattn.model.heads.codebook.quantize import LLOYD_STEPS, codebook_assignment, symbol_features
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.scores import ScoreTotals

__all__ = [
    "CODEBOOK_FROM",
    "CODE_STRENGTHS",
    "MAX_TABLE_CELLS",
    "PRIOR_ARRAYS",
    "STRENGTHS",
    "CodebookCandidates",
    "CodebookChoice",
    "CodebookSpec",
    "CodebookStatistics",
    "CodebookTrainer",
    "codebook_statistics",
    "start_head",
]

#: The option that names the fitted single head a codebook fit starts from (errors name it).
CODEBOOK_FROM = "--codebook-from"
#: The checkpoint arrays of the tables the priors are centred on.
PRIOR_ARRAYS = ("codebook_prior_emission", "codebook_prior_code_emission")
#: The largest near table (S x T cells, dense float64) a codebook fit keeps: 400 MB.
MAX_TABLE_CELLS = 50_000_000


#: The pseudo-counts a fit chooses from on held-out rows, for the near table and for the codeword tables.
STRENGTHS = (3.0, 30.0, 300.0, 3000.0)
CODE_STRENGTHS = (10.0, 100.0, 1000.0)


def _json_float(value: float | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class CodebookSpec(HeadSpec):
    """The settings of a codebook fit.

    Attributes:
        source: the model directory of the fitted single head it starts from (``--codebook-from``).
        near_window: N0, the positions that keep their token's identity (``--near-window``).
        codebooks: B (``--codebooks``); ``codewords``: W, codewords per codebook (``--codewords``).
        seed: the codebooks' k-means seed; ``lloyd_steps``: its Lloyd steps.
        emission_strength: the Dirichlet pseudo-count of each near table row toward that row at the start (0:
            maximum likelihood; ``None``: chosen on held-out rows after every M-step from :data:`STRENGTHS`);
            ``code_strength``: the same for the codeword tables (from :data:`CODE_STRENGTHS`).
        init_far: the far field's prior at the start.
        start: the single head itself, for a fit in this process (``fit_em``); not part of the JSON.
    """

    kind: ClassVar[str] = "codebook"

    source: str = ""
    near_window: int = 8
    codebooks: int = 8
    codewords: int = 16
    seed: int = 0
    lloyd_steps: int = LLOYD_STEPS
    emission_strength: float | None = None
    code_strength: float | None = None
    init_far: float = 0.25
    start: Head | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for flag, value in (("--near-window", self.near_window), ("--codebooks", self.codebooks),
                            ("--codewords", self.codewords)):  # fmt: skip
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{flag} {value}: expected a positive whole number")
        if self.codewords < 2:
            raise ValueError(f"--codewords {self.codewords}: expected at least 2 codewords a codebook")
        if self.lloyd_steps < 0:
            raise ValueError(f"lloyd_steps = {self.lloyd_steps}: expected 0 or more")
        for name, strength in (("emission_strength", self.emission_strength), ("code_strength", self.code_strength)):
            if strength is not None and not (math.isfinite(strength) and strength >= 0.0):
                raise ValueError(f"{name} = {strength!r}: expected a pseudo-count >= 0")
        if not 0.0 < self.init_far < 1.0:
            raise ValueError(f"init_far = {self.init_far!r}: expected a prior in (0, 1)")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "source": self.source, "near_window": int(self.near_window),
            "codebooks": int(self.codebooks), "codewords": int(self.codewords), "seed": int(self.seed),
            "lloyd_steps": int(self.lloyd_steps), "emission_strength": _json_float(self.emission_strength),
            "code_strength": _json_float(self.code_strength), "init_far": float(self.init_far),
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CodebookSpec:
        names = ("source", "near_window", "codebooks", "codewords", "seed", "lloyd_steps", "emission_strength",
                 "code_strength", "init_far")  # fmt: skip
        return cls(**{name: data[name] for name in names if name in data})

    def sources(self) -> tuple[tuple[str, str], ...]:
        """The single head it starts from, named by its option (none for a fit given ``start`` in process)."""
        return ((CODEBOOK_FROM, self.source),) if self.source else ()

    @property
    def short_histories(self) -> bool:
        """A codebook head reads a stream's short histories (the options a row lacks are masked)."""
        return True

    def trainer(self, context: TrainerContext) -> CodebookTrainer:
        """The fit's trainer; refuses a start of another kind or corpus shape, and a window no longer than N0."""
        s, n, d, t = context.shape
        if self.near_window >= n:
            raise ValueError(
                f"--near-window {self.near_window}: the rows' window N = {n} leaves no far field; read the store "
                f"with a longer --context, or give a --near-window below {n}"
            )
        if self.codewords > s:
            raise ValueError(f"--codewords {self.codewords}: more codewords than the S = {s} symbols; give at most {s}")
        if s * t > MAX_TABLE_CELLS:
            raise ValueError(
                f"the near table of S x T = {s:,} x {t:,} cells is too large for a codebook head (dense, at most "
                f"{MAX_TABLE_CELLS:,}): use a smaller vocabulary"
            )
        single = self.start if self.start is not None else (context.sources[0] if context.sources else None)
        if single is not None:
            if not isinstance(single, ResponsibilityAttentionDistribution):
                raise ValueError(f"{CODEBOOK_FROM} {self.source}: a {single.kind} head; expected a single head")
            if (single.num_symbols, single.query_dim, single.num_targets) != (s, d, t):
                raise ValueError(
                    f"{CODEBOOK_FROM} {self.source}: its (S, D, T) = "
                    f"{(single.num_symbols, single.query_dim, single.num_targets)} but the training store's are "
                    f"{(s, d, t)}: it must be fitted on this corpus"
                )
        elif not context.saved_meta:
            raise ValueError(f"a codebook fit starts from a fitted single head: give {CODEBOOK_FROM} MODEL_DIR")
        saved = context.saved_arrays
        centres = (
            (np.asarray(saved[PRIOR_ARRAYS[0]]), np.asarray(saved[PRIOR_ARRAYS[1]]))
            if all(name in saved for name in PRIOR_ARRAYS)
            else None
        )
        return CodebookTrainer(self, context.shape, single, centres)


@dataclass(frozen=True)
class CodebookStatistics:
    """Additive statistics of a codebook head (responsibility-weighted sums over rows).

    Attributes:
        key_sum: (S, D), ``key_mass``: (S,), ``emission_count``: (S, T): the near positions' query sums,
            responsibilities and (symbol, target) counts (:class:`NearCounts`: the nonzero cells in order while
            they are at most half the table, else the dense table; ``np.asarray`` gives the (S, T) table).
        code_sum: (B, W, D), ``code_mass``: (B, W), ``code_count``: (T, B, W): the same per far cell, the counts
            target-major as the E-step adds them (a row adds one contiguous row of them).
        prior_mass: (N0 + 1,) per near recency and the far field (with a short window's rejected draws).
        omega_mass: (B,) the far field's responsibility per codebook.
        scalars: (2,) the rows' weight and their log-likelihood.
    """

    key_sum: np.ndarray
    key_mass: np.ndarray
    emission_count: NearCounts
    code_sum: np.ndarray
    code_mass: np.ndarray
    code_count: np.ndarray
    prior_mass: np.ndarray
    omega_mass: np.ndarray
    scalars: np.ndarray

    @property
    def log_lik(self) -> float:
        return float(self.scalars[1])

    @property
    def n_obs(self) -> float:
        return float(self.scalars[0])

    def arrays(self) -> tuple[Any, ...]:
        """The fields in order (``emission_count`` a :class:`NearCounts`, the others arrays)."""
        return (self.key_sum, self.key_mass, self.emission_count, self.code_sum, self.code_mass, self.code_count,
                self.prior_mass, self.omega_mass, self.scalars)  # fmt: skip

    def copy(self) -> CodebookStatistics:
        return CodebookStatistics(*(a.copy() for a in self.arrays()))

    def add(self, other: CodebookStatistics) -> CodebookStatistics:
        """``self + other`` into this value's arrays (the caller owns them: see :meth:`copy`)."""
        for mine, theirs in zip(self.arrays(), other.arrays(), strict=True):
            if isinstance(mine, NearCounts):
                mine.add(theirs)
            else:
                np.add(mine, theirs, out=mine)
        return self

    def __add__(self, other: CodebookStatistics) -> CodebookStatistics:
        return self.copy().add(other)

    @classmethod
    def sum_of(cls, values: list[CodebookStatistics]) -> CodebookStatistics:
        """The sum of ``values``, added left to right into one copy of the first (the combine tree's sum)."""
        return sum_into_copy(values)


def codebook_statistics(head: CodebookHead, blocks: Iterable[Block]) -> CodebookStatistics:
    """The E-step of ``blocks`` (token windows, in row order) under ``head``."""
    s, _, d, t = head.shape
    params, tables = head.parameters, head.estep_tables
    with near_table(s, t) as table:  # the thread's table, kept zeroed from pass to pass
        arrays = CodebookArrays.zeros(s, d, t, head.near_window, head.num_codebooks, head.num_codewords, table.counts)
        for block in blocks:
            rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
            head.check_rows(rows)
            codebook_estep(rows, params, tables, arrays)
        far_masses(arrays)
        counts = take_near_counts(arrays, table)
    fields = arrays.fields()
    return CodebookStatistics(fields[0], fields[1], counts, *fields[3:])


def _smoothed(counts: np.ndarray, strength: float, centre: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Rows ``(counts + strength centre) / (row total + strength)``: the MAP table under a Dirichlet prior of
    ``strength`` pseudo-counts a row, spread as that row of ``centre``; a row with nothing to go by keeps
    ``previous``'s."""
    totals = counts.sum(axis=-1, keepdims=True) + strength
    seen = totals > 0.0
    return np.where(seen, (counts + strength * centre) / np.where(seen, totals, 1.0), previous)


def _means(sums: np.ndarray, mass: np.ndarray, previous: np.ndarray) -> np.ndarray:
    seen = mass[..., None] > 0.0
    return np.where(seen, sums / np.where(seen, mass[..., None], 1.0), previous)


def start_head(single: ResponsibilityAttentionDistribution, spec: CodebookSpec, context_length: int) -> CodebookHead:
    """The codebook head a fit starts from: ``single``'s keys, σ², emission and (recency-ordered) prior for the N0
    near positions, the far field at ``spec.init_far``; the codebooks a k-means of its symbols' keys and emission
    rows (``quantize.symbol_features``), every codeword starting from its members' mean key and mean emission row,
    the codebooks weighed alike."""
    n0 = spec.near_window
    emission = np.asarray(single.emission_table.to_dense(), dtype=np.float64)
    features = symbol_features(single.key_means, single.sigma2, emission)
    codes = codebook_assignment(features, codebooks=spec.codebooks, codewords=spec.codewords, seed=spec.seed,
                                steps=spec.lloyd_steps)  # fmt: skip
    base = emission.mean(axis=0)  # a codeword without members (it keeps its start): the mean row
    by_recency = np.asarray(single.position_prior, dtype=np.float64)[::-1]
    near = np.resize(by_recency, n0) if by_recency.shape[0] < n0 else by_recency[:n0].copy()
    if by_recency.shape[0] < n0:  # positions the single head had not: the oldest one's prior
        near[by_recency.shape[0] :] = by_recency[-1]
    near = near / near.sum() if near.sum() > 0.0 else np.full(n0, 1.0 / n0)
    prior = np.append((1.0 - spec.init_far) * near, spec.init_far)
    keys = np.asarray(single.key_means, dtype=np.float64)
    means = np.empty((spec.codebooks, spec.codewords, keys.shape[1]))
    tables = np.empty((spec.codebooks, spec.codewords, emission.shape[1]))
    for b in range(spec.codebooks):
        for w in range(spec.codewords):
            members = codes[:, b] == w
            means[b, w] = keys[members].mean(axis=0) if members.any() else keys.mean(axis=0)
            tables[b, w] = emission[members].mean(axis=0) if members.any() else base
    tables /= tables.sum(axis=2, keepdims=True)
    omega = np.full(spec.codebooks, 1.0 / spec.codebooks)
    return CodebookHead(codes, keys, single.sigma2, prior, omega, means, emission, tables, context_length)


@dataclass(frozen=True)
class CodebookChoice:
    """A codebook M-step's open choice: the two tables' pseudo-counts (σ² is the start's, fixed)."""

    sigma2: float
    emission_strength: float
    code_strength: float

    def to_json(self) -> dict[str, Any]:
        return {"sigma2": float(self.sigma2), "emission_strength": float(self.emission_strength),
                "code_strength": float(self.code_strength)}  # fmt: skip

    def describe(self) -> str:
        return (f"sigma2 {self.sigma2:.3g} (fixed), near table strength {self.emission_strength:g}, codeword "
                f"tables {self.code_strength:g}")  # fmt: skip


@dataclass(frozen=True)
class CodebookGrid(Grid):
    """The held-out pass of a codebook M-step: every point's head scored (the chosen one also gives early stopping
    and the fit page their held-out curve)."""

    heads: tuple[CodebookHead, ...]

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    def score(self, blocks: Iterable[Block]) -> PointTotals:
        # The points share their tables (one near table per pseudo-count, one set of codeword tables per other), and
        # so their logs: the grid holds 4 + 3 tables, not 12 heads' worth.
        logs: dict[int, np.ndarray] = {}
        for head in self.heads:
            if "parameters" not in head.__dict__:
                head.__dict__["parameters"] = CodebookParameters.build(head, logs)
        totals = [ScoreTotals() for _ in self.heads]
        for block in blocks:
            for k, head in enumerate(self.heads):
                totals[k] = totals[k] + head.score([block], accuracy=False)
        return PointTotals(tuple(totals))

    def nbytes(self) -> int:
        return int(sum(head.nbytes() for head in self.heads))


@dataclass(frozen=True)
class CodebookCandidates(Candidates):
    """A codebook M-step: the head of every choice of the tables' pseudo-counts in ``points`` (one point when the
    spec fixes both), from the statistics ``stats`` and the previous head; ``centres``: the (S, T) and (B, W, T)
    tables the priors are centred on (the start's)."""

    stats: CodebookStatistics
    previous: CodebookHead
    points: tuple[CodebookChoice, ...]
    centres: tuple[np.ndarray, np.ndarray]

    def default(self) -> CodebookChoice:
        return self.points[len(self.points) // 2]

    def grid(self, around: Any) -> CodebookGrid:
        return CodebookGrid(tuple(self.model(point) for point in self.points))

    @functools.cached_property
    def _near_counts(self) -> np.ndarray:
        """The (S, T) near counts, made once for every pseudo-count's table."""
        return self.stats.emission_count.toarray()

    @functools.cached_property
    def _tables(self) -> dict[tuple[str, float], np.ndarray]:
        """The tables made so far, by (``"near"`` or ``"code"``, pseudo-count): the points' heads share them."""
        return {}

    def _table(self, which: str, strength: float) -> np.ndarray:
        key = (which, float(strength))
        if key not in self._tables:
            st, previous = self.stats, self.previous
            if which == "near":
                self._tables[key] = _smoothed(self._near_counts, strength, self.centres[0], previous.emission)
            else:
                counts = np.ascontiguousarray(st.code_count.transpose(1, 2, 0))  # (T, B, W) -> (B, W, T)
                self._tables[key] = _smoothed(counts, strength, self.centres[1], previous.code_emission)
        return self._tables[key]

    def choose(self, grid: Grid, scores: Any) -> tuple[CodebookChoice, dict[str, float] | None]:
        if scores is None or scores.weight <= 0.0:
            return self.default(), None
        # The best predictive likelihood p(target | window, query), what perplexity reports (first on ties).
        values = [t.target_log_prob for t in scores.totals]
        best = int(np.argmax(values))
        metrics = scores.totals[best].metrics()
        return self.points[best], {k: metrics[k] for k in ("mean_log_likelihood", "target_log_prob", "perplexity")}

    def model(self, choice: Any) -> CodebookHead:
        st, previous = self.stats, self.previous
        prior = st.prior_mass / st.prior_mass.sum() if st.prior_mass.sum() > 0.0 else previous.prior
        omega = st.omega_mass / st.omega_mass.sum() if st.omega_mass.sum() > 0.0 else previous.omega
        return CodebookHead(
            previous.codes,
            _means(st.key_sum, st.key_mass, previous.key_means),
            previous.sigma2,
            prior,
            omega,
            _means(st.code_sum, st.code_mass, previous.code_means),
            self._table("near", choice.emission_strength),
            self._table("code", choice.code_strength),
            previous.context_length,
        )

    def searches(self) -> bool:
        return len(self.points) > 1


class CodebookTrainer(Trainer):
    """A codebook fit: its spec, the rows' shape, the single head it starts from and, once it has started, the tables
    the priors are centred on (the driver's alone: the M-step runs there)."""

    def __init__(
        self,
        spec: CodebookSpec,
        shape: tuple[int, int, int, int],
        single: Head | None,
        centres: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.spec = spec
        self.shape = shape
        self.single = single
        self.centres = centres

    def __getstate__(self) -> dict[str, Any]:
        # The workers run the E-step from the head alone: the start and the priors' tables stay on the driver.
        spec = self.spec.__class__.from_json(self.spec.to_json())
        return {"spec": spec, "shape": self.shape, "single": None, "centres": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    def searches(self) -> bool:
        return self.spec.emission_strength is None or self.spec.code_strength is None

    def check_start(self, head: Head, *, resumed: bool) -> None:
        if not isinstance(head, CodebookHead):
            raise ValueError(
                f"a codebook fit starts from a codebook head (a resumed fit) or from {CODEBOOK_FROM} SINGLE_MODEL, "
                f"not from a {head.kind} head given as its start"
            )
        if (head.near_window, head.num_codebooks, head.num_codewords) != (
            self.spec.near_window, self.spec.codebooks, self.spec.codewords,
        ):  # fmt: skip
            raise ValueError("the starting codebook head has another --near-window, --codebooks or --codewords")

    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        if isinstance(start, CodebookHead):
            if self.centres is None:  # a checkpoint without them: centred on the head it resumes
                self.centres = (start.emission.copy(), start.code_emission.copy())
            return start
        if not isinstance(self.single, ResponsibilityAttentionDistribution):
            raise ValueError(f"a codebook fit starts from a fitted single head: give {CODEBOOK_FROM} MODEL_DIR")
        # The k-means reads the model alone (S x (D + T) numbers, a second or two), not the rows: the driver runs it.
        head = start_head(self.single, self.spec, self.shape[1])
        self.centres = (head.emission.copy(), head.code_emission.copy())
        used = [len(np.unique(head.codes[:, b])) for b in range(head.num_codebooks)]
        passes.say(
            f"codebooks: {head.num_codebooks} x {head.num_codewords} codewords from the single head's keys and rows "
            f"(k-means, seed {self.spec.seed}); codewords in use per codebook {min(used)}..{max(used)}"
        )
        return head

    def statistics(self, head: Head, blocks: Iterator[Block]) -> CodebookStatistics:
        """The E-step of one partition's blocks, in row order (:func:`codebook_statistics`)."""
        assert isinstance(head, CodebookHead)
        return codebook_statistics(head, blocks)

    def m_step(self, statistics: Any, previous: Head | None) -> CodebookCandidates:
        assert isinstance(statistics, CodebookStatistics) and isinstance(previous, CodebookHead)
        near = STRENGTHS if self.spec.emission_strength is None else (float(self.spec.emission_strength),)
        code = CODE_STRENGTHS if self.spec.code_strength is None else (float(self.spec.code_strength),)
        points = tuple(CodebookChoice(previous.sigma2, a, c) for a in near for c in code)
        centres = self.centres if self.centres is not None else (previous.emission, previous.code_emission)
        return CodebookCandidates(statistics, previous, points, centres)

    def choice_from_json(self, data: dict[str, Any]) -> CodebookChoice | None:
        if not data or "emission_strength" not in data:
            return None
        return CodebookChoice(float(data["sigma2"]), float(data["emission_strength"]), float(data["code_strength"]))

    def checkpoint_extras(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The tables the priors are centred on, so a resumed fit keeps its prior."""
        if self.centres is None:
            return {}, {}
        return {PRIOR_ARRAYS[0]: self.centres[0], PRIOR_ARRAYS[1]: self.centres[1]}, {}

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        assert isinstance(head, CodebookHead)
        if head.prior[-1] < 1e-4:
            return [f"the far field's prior is {head.prior[-1]:.2e}: the far positions do not help on these rows"]
        return []
