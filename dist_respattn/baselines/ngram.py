"""N-gram baselines printed beside the head: unigram, add-k, Jelinek-Mercer and Kneser-Ney bigrams.

Every model is a predictive distribution ``P(t | s)`` over the T targets given the previous symbol s,
fitted from a training store's :class:`~dist_respattn.model.emission.pairs.PairCounts`, optionally tuned on a
validation store's pairs, and scored on an evaluated store's pairs (each pair's count is the weight of
its scored rows). With ``c(s, t)`` the training pair counts, ``c(s) = Σ_t c(s, t)``, ``c(t) = Σ_s c(s, t)``
and ``c = Σ c(t)``:

``unigram``
    ``P_uni(t) = (c(t) + k) / (c + k T)`` (add-k; k given, default 0.1, never tuned).
``add_k``
    ``(c(s, t) + k) / (c(s) + k T)``; an unseen symbol gets the uniform distribution. k is tuned on the
    validation pairs over a log grid (1e-4 .. 10, then a finer grid between the best point's neighbours),
    else it is the given k.
``jelinek_mercer``
    Interpolation (Jelinek & Mercer 1980): ``λ c(s, t) / c(s) + (1 - λ) P_uni(t)``, and ``P_uni`` for an
    unseen symbol. λ maximizes the validation log-likelihood *exactly*: the objective is concave in λ and
    its maximizer is the fixed point of deleted-interpolation EM, reached here by a safeguarded Newton
    iteration instead of EM's slow linear convergence. Without validation λ = 0.8, stated (see
    :data:`DEFAULT_JM_LAMBDA`).
``kneser_ney``
    Interpolated Kneser-Ney (Kneser & Ney 1995, in the formulation of Chen & Goodman 1998, "An empirical
    study of smoothing techniques for language modeling"; one discount, not their modified variant's three)::

        P(t | s)  = max(c(s, t) - D, 0) / c(s) + γ(s) P_cont(t),   γ(s) = Σ_t min(c(s, t), D) / c(s)
        P_cont(t) = max(N1+(• t) - D, 0) / N1+(• •) + (Σ_t' min(N1+(• t'), D) / N1+(• •)) / T

    ``γ(s)`` in its min form equals ``D N1+(s •) / c(s)`` for integer counts, and keeps every row summing to
    one when counts are fractional weights. The lower order is itself interpolated with the uniform
    distribution (for D ≤ 1 its weight is ``D · #{t: N1+(• t) > 0} / N1+(• •)``), so a target never seen in
    training keeps a positive probability. An unseen symbol gets ``P_cont``. D is tuned on validation over a
    grid in (0, 1) (then a finer grid around the best), else Ney's estimate ``n1 / (n1 + 2 n2)`` (Ney, Essen &
    Kneser 1994, as used by Chen & Goodman 1998) from the counts of counts of the training pairs, a fractional
    count being rounded to the nearest integer (``[0.5, 1.5)`` counts as 1, ``[1.5, 2.5)`` as 2).

Every tuned parameter's candidates include the untuned default, so tuning never gives a worse validation
perplexity than the default. Tuning reads only the validation pairs' counts, and each grid point is one
vectorized pass over them (the add-k grid is evaluated over the distinct count values only).

Scores: ``target_log_prob`` (mean log P over the evaluated weight), ``perplexity = exp(-mean)``, and
``accuracy``, the weighted fraction of pairs whose target is the first arg-max of ``P(· | s)``; the arg-max
is found per symbol from its observed successors and one backoff candidate (see
:meth:`Baselines.best_targets`), never from a T-long row. Memory is O(pairs + S + T) throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dist_respattn.model.arguments import as_id_array, as_positive_float
from dist_respattn.model.emission.pairs import PairCounts

__all__ = [
    "ADD_K_GRID",
    "DEFAULT_JM_LAMBDA",
    "DEFAULT_K",
    "DISCOUNT_GRID",
    "FALLBACK_DISCOUNT",
    "MODEL_LABELS",
    "MODEL_NAMES",
    "BaselineParameters",
    "BaselineScore",
    "Baselines",
    "fit_baselines",
    "ney_discount",
]

#: The models, in the order they are printed.
MODEL_NAMES = ("unigram", "add_k", "jelinek_mercer", "kneser_ney")
#: How every command prints them (the names above are their JSON keys), and the modified Kneser-Ney n-grams of
#: :mod:`dist_respattn.baselines.kneser_ney` that ``evaluate`` adds beside them.
MODEL_LABELS = {
    "unigram": "unigram",
    "add_k": "add-k bigram",
    "jelinek_mercer": "Jelinek-Mercer",
    "kneser_ney": "Kneser-Ney",
    **{f"kneser_ney_{order}": f"Kneser-Ney {order}-gram" for order in (3, 4, 5)},
}
#: Pseudo-count of the unigram (and of add-k without validation).
DEFAULT_K = 0.1
#: λ without validation. The best λ grows with the training data (more data, more trust in the bigram): on the
#: Python standard library at 5000 words it is 0.56 for 120k training tokens and 0.92 for 5.9M; 0.8 stays within
#: 9% of the tuned test perplexity over that range (0.7 within 7% at the large end, but 0.9 is 24% off at the small).
DEFAULT_JM_LAMBDA = 0.8
#: D when Ney's estimate is undefined (no training pair has a count near 1 or 2): the value Chen & Goodman's
#: experiments find near-optimal for bigrams, and the usual textbook default.
FALLBACK_DISCOUNT = 0.75
#: Coarse grid for add-k's k (8 points a decade), refined between the best point's neighbours.
ADD_K_GRID = np.logspace(-4.0, 1.0, 41)
#: Coarse grid for Kneser-Ney's D, refined to steps of 0.005 around the best point.
DISCOUNT_GRID = np.linspace(0.05, 0.95, 19)
#: Bounds of a tuned λ and D: a λ of 1 or a D of 0 would give the evaluated pairs unseen in training zero probability.
_LAMBDA_BOUNDS = (1e-3, 1.0 - 1e-3)
_DISCOUNT_BOUNDS = (0.01, 0.99)
_REFINE_POINTS = 21
#: Elements of one (grid points × distinct values) block when the add-k objective is evaluated.
_GRID_BLOCK = 1 << 22

_VALIDATION = "validation"


# -- value objects ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaselineScore:
    """One model's score on evaluated pairs.

    Attributes:
        perplexity: ``exp(-target_log_prob)``.
        target_log_prob: ``Σ w log P(t | s) / Σ w`` over the evaluated pairs (w = a pair's count).
        accuracy: weighted fraction of the evaluated pairs whose target is the first arg-max of ``P(· | s)``.
        weight: ``Σ w``, the evaluated weight (the row count for unweighted rows).
        parameters: the model's parameter and how it was set, e.g. ``{"k": 0.01, "tuned_on": "validation"}``.
    """

    perplexity: float
    target_log_prob: float
    accuracy: float
    weight: float
    parameters: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "perplexity": self.perplexity,
            "target_log_prob": self.target_log_prob,
            "accuracy": self.accuracy,
            "weight": self.weight,
            "parameters": dict(self.parameters),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> BaselineScore:
        return cls(
            float(value["perplexity"]),
            float(value["target_log_prob"]),
            float(value["accuracy"]),
            float(value["weight"]),
            dict(value["parameters"]),
        )


@dataclass(frozen=True)
class BaselineParameters:
    """The fitted parameter of each model and how it was set.

    Attributes:
        unigram_k: k of the add-k unigram (also the lower order of Jelinek-Mercer).
        add_k: k of the add-k bigram.
        jm_lambda: λ of Jelinek-Mercer.
        kn_discount: D of Kneser-Ney.
        tuned_on: per model name, ``"validation"`` or ``"stated: <which default>"``.
        details: per model name, further facts: the validation perplexity at the chosen value, Ney's n1 and n2.
    """

    unigram_k: float
    add_k: float
    jm_lambda: float
    kn_discount: float
    tuned_on: dict[str, str]
    details: dict[str, dict[str, Any]] = field(default_factory=dict)

    def for_model(self, name: str) -> dict[str, Any]:
        """The JSON-ready parameters of one model, e.g. ``{"discount": 0.61, "tuned_on": "validation", ...}``."""
        _check_name(name)
        values: dict[str, Any]
        if name == "unigram":
            values = {"k": self.unigram_k}
        elif name == "add_k":
            values = {"k": self.add_k}
        elif name == "jelinek_mercer":
            values = {"lambda": self.jm_lambda, "unigram_k": self.unigram_k}
        else:
            values = {"discount": self.kn_discount}
        values["tuned_on"] = self.tuned_on[name]
        values.update(self.details.get(name, {}))
        return values

    def to_json(self) -> dict[str, Any]:
        return {
            "unigram_k": self.unigram_k,
            "add_k": self.add_k,
            "jm_lambda": self.jm_lambda,
            "kn_discount": self.kn_discount,
            "tuned_on": dict(self.tuned_on),
            "details": {name: dict(d) for name, d in self.details.items()},
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> BaselineParameters:
        return cls(
            float(value["unigram_k"]),
            float(value["add_k"]),
            float(value["jm_lambda"]),
            float(value["kn_discount"]),
            {str(k): str(v) for k, v in value["tuned_on"].items()},
            {str(k): dict(v) for k, v in value.get("details", {}).items()},
        )


def _check_name(name: str) -> None:
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown baseline {name!r}: expected one of {', '.join(MODEL_NAMES)}")


def _check_ids(value: Any, name: str, bound: int) -> np.ndarray:
    ids = as_id_array(value, name, 1)
    bad = np.flatnonzero((ids < 0) | (ids >= bound))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {int(ids[i])}: expected an id in [0, {bound})")
    return ids.astype(np.int64, copy=False)


def _check_like(train: PairCounts, other: PairCounts, what: str) -> None:
    if (other.num_symbols, other.num_targets) != (train.num_symbols, train.num_targets):
        raise ValueError(
            f"{what} pairs have (S, T) = {(other.num_symbols, other.num_targets)}, the training pairs "
            f"{(train.num_symbols, train.num_targets)}: a baseline scores only pairs of the training vocabulary"
        )


# -- the shared pieces of the models ----------------------------------------------------------------------


def _unigram(target_totals: np.ndarray, k: float) -> np.ndarray:
    """(T,) add-k unigram ``(c(t) + k) / (c + k T)``."""
    return (target_totals + k) / (target_totals.sum() + k * target_totals.size)


def _continuation(continuation_types: np.ndarray, discount: float) -> np.ndarray:
    """(T,) Kneser-Ney's lower order: discounted continuation counts interpolated with the uniform distribution.

    ``Σ_t max(N - D, 0) + Σ_t min(N, D) = Σ_t N``, so the result sums to one for any D > 0.
    """
    num_targets = continuation_types.size
    types = continuation_types.sum()
    if types <= 0.0:  # no training pairs: nothing to discount, only the uniform floor remains
        return np.full(num_targets, 1.0 / num_targets)
    floor = np.minimum(continuation_types, discount).sum() / types / num_targets
    return np.maximum(continuation_types - discount, 0.0) / types + floor


def _kneser_ney(
    pair: np.ndarray, total: np.ndarray, backoff: np.ndarray, kept_mass: np.ndarray, discount: float
) -> np.ndarray:
    """(m,) interpolated Kneser-Ney ``P(t | s)`` of m pairs, from their training ``c(s, t)``, ``c(s)``, the lower
    order ``P_cont(t)`` and ``Σ_t' min(c(s, t'), D)``, the mass discounting takes from s's row; an unseen s backs
    off entirely. The fitted model and the tuning of D both score with it."""
    seen = total > 0.0
    safe_total = np.where(seen, total, 1.0)
    return np.where(seen, (np.maximum(pair - discount, 0.0) + kept_mass * backoff) / safe_total, backoff)


def ney_discount(counts: np.ndarray) -> tuple[float, int, int]:
    """Ney's absolute discount ``n1 / (n1 + 2 n2)`` from pair counts: ``(D, n1, n2)``.

    A fractional count is rounded to the nearest integer (``[0.5, 1.5)`` is a 1, ``[1.5, 2.5)`` a 2): rows
    weighted around one behave like the integer counts the estimate was derived for (leave-one-out, Ney, Essen &
    Kneser 1994). Without counts near 1 or 2 the estimate is undefined and :data:`FALLBACK_DISCOUNT` is
    returned; with no near-singletons it would be 0, which gives unseen pairs no mass, so D is kept in [0.01, 0.99].
    """
    rounded = np.floor(np.asarray(counts, dtype=np.float64) + 0.5)
    n1 = int(np.count_nonzero(rounded == 1.0))
    n2 = int(np.count_nonzero(rounded == 2.0))
    if n1 + 2 * n2 == 0:
        return FALLBACK_DISCOUNT, n1, n2
    return float(np.clip(n1 / (n1 + 2 * n2), *_DISCOUNT_BOUNDS)), n1, n2


# -- the fitted models ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Baselines:
    """The four baselines fitted from training pairs: ``Baselines(train, parameters)``.

    The derived arrays (S,) and (T,) are computed once from ``train``; nothing here is S×T.
    Rebuild a fitted set from its JSON with ``Baselines(train, BaselineParameters.from_json(...))``.
    """

    train: PairCounts
    parameters: BaselineParameters
    #: (S,) c(s); (T,) P_uni; (T,) P_cont; (S,) Σ_t min(c(s, t), D), Kneser-Ney's backoff mass γ(s) c(s).
    symbol_totals: np.ndarray = field(init=False, repr=False)
    unigram: np.ndarray = field(init=False, repr=False)
    continuation: np.ndarray = field(init=False, repr=False)
    kn_kept_mass: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        train, params = self.train, self.parameters
        kept_mass = np.bincount(
            train.symbols, weights=np.minimum(train.counts, params.kn_discount), minlength=train.num_symbols
        )
        object.__setattr__(self, "symbol_totals", train.symbol_totals())
        object.__setattr__(self, "unigram", _unigram(train.target_totals(), params.unigram_k))
        object.__setattr__(self, "continuation", _continuation(train.continuation_types(), params.kn_discount))
        object.__setattr__(self, "kn_kept_mass", kept_mass)

    @property
    def num_symbols(self) -> int:
        return self.train.num_symbols

    @property
    def num_targets(self) -> int:
        return self.train.num_targets

    def _probs(self, name: str, symbols: np.ndarray, targets: np.ndarray, pair: np.ndarray | None = None) -> np.ndarray:
        """(m,) ``P(targets | symbols)`` of checked int64 ids; ``pair`` = their training counts when known."""
        if name == "unigram":
            return self.unigram[targets]
        if pair is None:
            pair = self.train.lookup(symbols, targets)
        total = self.symbol_totals[symbols]
        seen = total > 0.0
        safe_total = np.where(seen, total, 1.0)
        params = self.parameters
        if name == "add_k":
            k = params.add_k
            return (pair + k) / (total + k * self.num_targets)
        if name == "jelinek_mercer":
            lam = params.jm_lambda
            backoff = self.unigram[targets]
            return np.where(seen, lam * pair / safe_total + (1.0 - lam) * backoff, backoff)
        return _kneser_ney(pair, total, self.continuation[targets], self.kn_kept_mass[symbols], params.kn_discount)

    def prob(self, name: str, symbols: Any, targets: Any) -> np.ndarray:
        """(m,) ``P(targets[i] | symbols[i])`` under model ``name`` (one of :data:`MODEL_NAMES`)."""
        _check_name(name)
        s = _check_ids(symbols, "symbols", self.num_symbols)
        t = _check_ids(targets, "targets", self.num_targets)
        if s.shape != t.shape:
            raise ValueError(f"symbols {s.shape} and targets {t.shape}: expected two (m,) arrays")
        return self._probs(name, s, t)

    def log_prob(self, name: str, symbols: Any, targets: Any) -> np.ndarray:
        """(m,) ``log P(targets[i] | symbols[i])`` under model ``name``; finite for every pair of valid ids."""
        return np.log(self.prob(name, symbols, targets))

    def _backoff_best(self, name: str) -> int:
        """The first arg-max of the backoff distribution ``g`` that every row of ``name`` mixes in."""
        if name == "add_k":
            return 0  # uniform backoff: every target ties, the first wins
        if name == "kneser_ney":
            return int(np.argmax(self.continuation))
        return int(np.argmax(self.unigram))

    def best_targets(self, name: str) -> np.ndarray:
        """(S,) int64: the first arg-max of ``P(· | s)`` for every symbol s, in O(pairs + S + T).

        Every bigram row here has the form ``P(t | s) = a_s(t) + b_s g(t)`` with ``a_s(t) ≥ 0`` nonzero only on
        s's observed successors, ``b_s ≥ 0`` and ``g`` a backoff shared by all rows (uniform for add-k, P_uni for
        Jelinek-Mercer, P_cont for Kneser-Ney). Let t* be the first arg-max of g. An unobserved t has
        ``P(t|s) = b_s g(t) ≤ b_s g(t*) ≤ P(t*|s)``, so the maximum is attained among the observed successors and
        t*. For the first-on-ties rule: if an unobserved t attains the maximum then ``g(t) = g(t*)`` (b_s > 0 as
        the row sums to one), so ``t* ≤ t`` and t* attains it too; hence the smallest maximizing target lies in
        {observed successors, t*}. The argument survives rounding, which is monotone, since t* is scored with
        the same expression as every other target. A symbol never seen in training has row g: its best is t*.
        """
        _check_name(name)
        t_star = self._backoff_best(name)
        best = np.full(self.num_symbols, t_star, dtype=np.int64)
        train = self.train
        if name == "unigram" or train.num_pairs == 0:
            return best
        symbols, targets = train.symbols, train.targets
        # keys are sorted by s * T + t: each symbol's successors are one run, in increasing t.
        starts = np.flatnonzero(np.r_[True, symbols[1:] != symbols[:-1]])
        owners = symbols[starts]
        p_obs = self._probs(name, symbols, targets, train.counts)
        p_star = self._probs(name, owners, np.full(owners.size, t_star, dtype=np.int64))
        top = np.maximum(np.maximum.reduceat(p_obs, starts), p_star)
        run_length = np.diff(np.r_[starts, symbols.size])
        hit = np.where(p_obs == np.repeat(top, run_length), targets, self.num_targets)
        first_hit = np.minimum.reduceat(hit, starts)  # T when no observed successor attains the maximum
        best[owners] = np.where((p_star == top) & (t_star < first_hit), t_star, first_hit)
        return best

    def score_one(self, name: str, pairs: PairCounts) -> BaselineScore:
        """Model ``name``'s score on the evaluated ``pairs`` (their counts are the rows' weights)."""
        _check_name(name)
        _check_like(self.train, pairs, "evaluated")
        weight = pairs.total
        params = self.parameters.for_model(name)
        if pairs.num_pairs == 0 or weight <= 0.0:
            nan = float("nan")
            return BaselineScore(nan, nan, nan, 0.0, params)
        symbols, targets, w = pairs.symbols, pairs.targets, pairs.counts
        mean = float(w @ np.log(self._probs(name, symbols, targets))) / weight
        correct = float(w @ (self.best_targets(name)[symbols] == targets)) / weight
        perplexity = math.exp(-mean) if mean > -700.0 else float("inf")
        return BaselineScore(perplexity, mean, correct, weight, params)

    def score(self, pairs: PairCounts) -> dict[str, BaselineScore]:
        """Every model's score on the evaluated ``pairs``, keyed by :data:`MODEL_NAMES` in order."""
        return {name: self.score_one(name, pairs) for name in MODEL_NAMES}


# -- tuning on the validation pairs -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows:
    """The validation pairs seen through the training counts: all (m,) over the validation pairs."""

    symbols: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    pair: np.ndarray  # c(s, t) in training
    total: np.ndarray  # c(s) in training

    @property
    def weight(self) -> float:
        return float(self.weights.sum())


def _perplexity(sum_log: float, weight: float) -> float:
    mean = sum_log / weight
    return math.exp(-mean) if mean > -700.0 else float("inf")


def _sum_weighted_log(base: np.ndarray, weights: np.ndarray, xs: np.ndarray, scale: float) -> np.ndarray:
    """(G,) ``Σ_i weights_i log(base_i + scale xs_g)``, in blocks of grid points so memory stays bounded."""
    out = np.empty(xs.size)
    step = max(1, _GRID_BLOCK // max(1, base.size))
    for lo in range(0, xs.size, step):
        block = xs[lo : lo + step]
        out[lo : lo + step] = np.log(base[None, :] + scale * block[:, None]) @ weights
    return out


def _refined(grid: np.ndarray, best: int, *, log: bool) -> np.ndarray:
    """Points between the neighbours of ``grid[best]`` (a sorted grid), evenly spaced (in log if ``log``)."""
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    if log:
        return np.logspace(math.log10(lo), math.log10(hi), _REFINE_POINTS)
    # Rounded so a reported D reads 0.765, not 0.7649999999999999.
    return np.round(np.linspace(lo, hi, _REFINE_POINTS), 12)


def _pick(candidates: np.ndarray, objective: np.ndarray, default: float) -> float:
    """The candidate of the highest objective; the default wins ties (a tuned value must earn its place)."""
    best = float(objective.max())
    at_default = objective[candidates == default]
    if at_default.size and at_default.max() >= best:
        return default
    return float(candidates[int(np.argmax(objective))])


def _tune_add_k(rows: _Rows, num_targets: int, default: float) -> tuple[float, float]:
    """k maximizing ``Σ w log((c(s,t) + k) / (c(s) + k T))`` over a log grid and its refinement: ``(k, Σ w log P)``.

    The objective splits into ``Σ w log(c(s,t) + k) - Σ w log(c(s) + k T)``; each sum runs over the distinct
    training counts met in validation (a few thousand for integer counts), not over the validation pairs.
    """
    pair_values, inverse = np.unique(rows.pair, return_inverse=True)
    pair_weights = np.bincount(inverse.ravel(), weights=rows.weights, minlength=pair_values.size)
    total_values, inverse = np.unique(rows.total, return_inverse=True)
    total_weights = np.bincount(inverse.ravel(), weights=rows.weights, minlength=total_values.size)

    def objective(ks: np.ndarray) -> np.ndarray:
        return _sum_weighted_log(pair_values, pair_weights, ks, 1.0) - _sum_weighted_log(
            total_values, total_weights, ks, float(num_targets)
        )

    coarse = objective(ADD_K_GRID)
    fine_grid = _refined(ADD_K_GRID, int(np.argmax(coarse)), log=True)
    candidates = np.concatenate([ADD_K_GRID, fine_grid, [default]])
    values = np.concatenate([coarse, objective(fine_grid), objective(np.array([default]))])
    k = _pick(candidates, values, default)
    return k, float(values[candidates == k].max())


def _tune_lambda(rows: _Rows, unigram: np.ndarray, default: float) -> tuple[float, float]:
    """λ maximizing the validation log-likelihood of Jelinek-Mercer: ``(λ, Σ w log P)``.

    ``f(λ) = Σ w log(b + λ (a - b))`` with ``a = c(s,t)/c(s)``, ``b = P_uni(t) > 0`` is concave, so its maximizer
    on the bounds is the root of the decreasing ``f'`` (or a bound). Deleted-interpolation EM (Jelinek & Mercer
    1980) converges to the same point linearly; Newton's steps, kept inside a shrinking bracket, take a handful
    of passes over the validation pairs.
    """
    seen = rows.total > 0.0
    w = rows.weights[seen]
    a = rows.pair[seen] / rows.total[seen]
    b = unigram[rows.targets[seen]]
    # Validation pairs of unseen symbols get P_uni whatever λ is: a constant term.
    constant = float(rows.weights[~seen] @ np.log(unigram[rows.targets[~seen]]))
    d = a - b

    def value(lam: float) -> float:
        return float(w @ np.log(b + lam * d)) + constant

    lo, hi = _LAMBDA_BOUNDS
    lam = default
    if w.size:

        def slope(x: float) -> tuple[float, float]:
            ratio = d / (b + x * d)
            return float(w @ ratio), -float(w @ (ratio * ratio))

        if slope(lo)[0] <= 0.0:
            lam = lo
        elif slope(hi)[0] >= 0.0:
            lam = hi
        else:
            lam = 0.5 * (lo + hi)
            for _ in range(200):
                g, h = slope(lam)
                if g > 0.0:
                    lo = lam
                else:
                    hi = lam
                step = lam - g / h if h < 0.0 else math.nan
                new = step if lo < step < hi else 0.5 * (lo + hi)
                if abs(new - lam) <= 1e-14 or hi - lo <= 1e-14:
                    lam = new
                    break
                lam = new
    tuned, at_default = value(lam), value(default)
    return (lam, tuned) if tuned > at_default else (default, at_default)


def _tune_discount(rows: _Rows, train: PairCounts, default: float) -> tuple[float, float]:
    """D maximizing the validation log-likelihood of Kneser-Ney over a grid in (0, 1) refined around its best.

    One vectorized pass over the validation pairs per grid point. ``Σ_t min(c(s,t), D) = D N1+(s•) -
    Σ_{c(s,t) < D} (D - c(s,t))``: the correction touches only the training pairs counted below the largest
    candidate (none for integer counts and D <= 1), so a grid point costs O(validation pairs + S + T), not
    O(training pairs).
    """
    cont = train.continuation_types()
    successors = train.successor_types()[rows.symbols]
    # Every candidate is at most max(1, default): the pairs counted below it are the only ones min(c, D) clips.
    small = train.counts < max(1.0, default)
    small_symbols, small_counts = train.symbols[small], train.counts[small]

    def value(discount: float) -> float:
        kept_mass = discount * successors
        if small_counts.size:
            below = small_counts < discount
            shortfall = np.bincount(
                small_symbols[below], weights=discount - small_counts[below], minlength=train.num_symbols
            )
            kept_mass = kept_mass - shortfall[rows.symbols]
        backoff = _continuation(cont, discount)[rows.targets]
        return float(rows.weights @ np.log(_kneser_ney(rows.pair, rows.total, backoff, kept_mass, discount)))

    def values(grid: np.ndarray) -> np.ndarray:
        return np.array([value(float(x)) for x in grid])

    coarse = values(DISCOUNT_GRID)
    fine_grid = np.clip(_refined(DISCOUNT_GRID, int(np.argmax(coarse)), log=False), *_DISCOUNT_BOUNDS)
    candidates = np.concatenate([DISCOUNT_GRID, fine_grid, [default]])
    objective = np.concatenate([coarse, values(fine_grid), [value(default)]])
    discount = _pick(candidates, objective, default)
    return discount, float(objective[candidates == discount].max())


# -- fitting ----------------------------------------------------------------------------------------------


def fit_baselines(
    train: PairCounts,
    *,
    validation: PairCounts | None = None,
    k: float = DEFAULT_K,
    jm_lambda: float = DEFAULT_JM_LAMBDA,
    discount: float | None = None,
) -> Baselines:
    """Fit the four baselines from ``train``'s pairs; tune add-k's k, λ and D on ``validation``'s pairs if given.

    Args:
        train: training pair counts (S, T).
        validation: held-out pair counts of the same (S, T); their counts weight the tuning objective. Without
            them (or when they weigh nothing) the stated defaults below are used.
        k: the unigram's pseudo-count (never tuned), and add-k's k without validation.
        jm_lambda: Jelinek-Mercer's λ without validation, in (0, 1).
        discount: Kneser-Ney's D without validation; ``None`` for Ney's estimate ``n1 / (n1 + 2 n2)``.

    Tuning includes the untuned value among its candidates, so the validation perplexity of a tuned model is
    never worse than the default's.
    """
    k = as_positive_float(k, "k")
    jm_lambda = as_positive_float(jm_lambda, "jm_lambda")
    if jm_lambda >= 1.0:
        raise ValueError(f"jm_lambda = {jm_lambda!r}: expected a number in (0, 1)")
    details: dict[str, dict[str, Any]] = {"unigram": {}, "add_k": {}, "jelinek_mercer": {}, "kneser_ney": {}}
    tuned_on = {"unigram": "stated: given k", "add_k": "stated: given k"}
    tuned_on["jelinek_mercer"] = (
        f"stated: default {DEFAULT_JM_LAMBDA}" if jm_lambda == DEFAULT_JM_LAMBDA else "stated: given lambda"
    )
    if discount is None:
        discount, n1, n2 = ney_discount(train.counts)
        details["kneser_ney"].update(ney_estimate=discount, n1=n1, n2=n2)
        tuned_on["kneser_ney"] = (
            "stated: Ney's estimate n1/(n1+2n2)"
            if n1 + 2 * n2
            else f"stated: {FALLBACK_DISCOUNT} (no pair count near 1 or 2: Ney's estimate undefined)"
        )
    else:
        discount = as_positive_float(discount, "discount")
        tuned_on["kneser_ney"] = "stated: given discount"
    unigram = _unigram(train.target_totals(), k)
    add_k = k

    if validation is not None:
        _check_like(train, validation, "validation")
    if validation is not None and validation.num_pairs and validation.total > 0.0:
        symbols = validation.symbols
        rows = _Rows(
            symbols,
            validation.targets,
            validation.counts,
            train.lookup(symbols, validation.targets),
            train.symbol_totals()[symbols],
        )
        weight = rows.weight
        details["unigram"]["validation_perplexity"] = _perplexity(
            float(rows.weights @ np.log(unigram[rows.targets])), weight
        )
        add_k, sum_log = _tune_add_k(rows, train.num_targets, k)
        details["add_k"]["validation_perplexity"] = _perplexity(sum_log, weight)
        jm_lambda, sum_log = _tune_lambda(rows, unigram, jm_lambda)
        details["jelinek_mercer"]["validation_perplexity"] = _perplexity(sum_log, weight)
        discount, sum_log = _tune_discount(rows, train, discount)
        details["kneser_ney"]["validation_perplexity"] = _perplexity(sum_log, weight)
        tuned_on.update(add_k=_VALIDATION, jelinek_mercer=_VALIDATION, kneser_ney=_VALIDATION)
    elif validation is not None:
        for name in ("add_k", "jelinek_mercer", "kneser_ney"):
            tuned_on[name] += " (the validation pairs weigh nothing)"

    params = BaselineParameters(
        unigram_k=k,
        add_k=float(add_k),
        jm_lambda=float(jm_lambda),
        kn_discount=float(discount),
        tuned_on=tuned_on,
        details={name: d for name, d in details.items() if d},
    )
    return Baselines(train, params)
