"""The n-gram baselines against a plain dense reference: normalization, scores, tuning, Ney's estimate, properties."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.baselines.ngram import (
    DEFAULT_JM_LAMBDA,
    FALLBACK_DISCOUNT,
    MODEL_NAMES,
    BaselineParameters,
    Baselines,
    BaselineScore,
    fit_baselines,
    ney_discount,
)
from dist_respattn.model.emission.pairs import PairCounts

# -- the dense reference: every row written out, S×T, straight from the formulas ------------------------------


def dense_counts(pairs: PairCounts) -> np.ndarray:
    counts = np.zeros((pairs.num_symbols, pairs.num_targets))
    counts.flat[pairs.keys] = pairs.counts
    return counts


def dense_model(counts: np.ndarray, name: str, params: BaselineParameters) -> np.ndarray:
    """(S, T) rows ``P(t | s)`` of one model, computed on the dense count matrix."""
    num_symbols, num_targets = counts.shape
    c_s = counts.sum(axis=1)
    c_t = counts.sum(axis=0)
    seen = c_s > 0
    k = params.unigram_k
    unigram = (c_t + k) / (c_t.sum() + k * num_targets)
    if name == "unigram":
        return np.tile(unigram, (num_symbols, 1))
    if name == "add_k":
        return (counts + params.add_k) / (c_s[:, None] + params.add_k * num_targets)
    if name == "jelinek_mercer":
        lam = params.jm_lambda
        rows = np.tile(unigram, (num_symbols, 1))
        rows[seen] = lam * counts[seen] / c_s[seen, None] + (1.0 - lam) * unigram
        return rows
    d = params.kn_discount
    n_t = (counts > 0).sum(axis=0).astype(np.float64)
    n = n_t.sum()
    cont = np.full(num_targets, 1.0 / num_targets)
    if n > 0:
        cont = np.maximum(n_t - d, 0.0) / n + np.minimum(n_t, d).sum() / n / num_targets
    rows = np.tile(cont, (num_symbols, 1))
    gamma = np.minimum(counts[seen], d).sum(axis=1) / c_s[seen]
    rows[seen] = np.maximum(counts[seen] - d, 0.0) / c_s[seen, None] + gamma[:, None] * cont
    return rows


def dense_score(rows: np.ndarray, pairs: PairCounts) -> tuple[float, float, float]:
    """``(target_log_prob, perplexity, accuracy)`` of dense rows on evaluated pairs."""
    s, t, w = pairs.symbols, pairs.targets, pairs.counts
    mean = float(np.sum(w * np.log(rows[s, t])) / w.sum())
    accuracy = float(np.sum(w * (rows.argmax(axis=1)[s] == t)) / w.sum())
    return mean, math.exp(-mean), accuracy


def random_pairs(
    rng: np.random.Generator, num_symbols: int, num_targets: int, n: int, *, fractional: bool, held_out: int = 2
) -> PairCounts:
    """Pairs whose last ``held_out`` symbols and targets never occur (to exercise unseen s and unseen t)."""
    s = rng.integers(0, num_symbols - held_out, n)
    # Skewed targets that depend on the symbol, so the bigram is informative and rows have clear favourites.
    t = (3 * s + np.minimum(rng.geometric(0.35, n) - 1, num_targets)) % (num_targets - held_out)
    w = rng.uniform(0.05, 2.0, n) if fractional else None
    return PairCounts.from_rows(s, t, w, num_symbols=num_symbols, num_targets=num_targets)


def all_pairs(num_symbols: int, num_targets: int) -> tuple[np.ndarray, np.ndarray]:
    s, t = np.divmod(np.arange(num_symbols * num_targets), num_targets)
    return s, t


@pytest.fixture(params=[False, True], ids=["integer", "fractional"])
def data(request: Any) -> tuple[PairCounts, PairCounts, PairCounts]:
    fractional = request.param
    rng = np.random.default_rng(11 if fractional else 7)
    train = random_pairs(rng, 9, 12, 400, fractional=fractional)
    valid = random_pairs(rng, 9, 12, 150, fractional=fractional, held_out=0)
    test = random_pairs(rng, 9, 12, 150, fractional=fractional, held_out=0)
    return train, valid, test


# -- normalization and the dense reference ---------------------------------------------------------------------


@pytest.mark.parametrize("tuned", [False, True])
def test_rows_sum_to_one_for_seen_and_unseen_symbols_and_targets(data, tuned):
    train, valid, _ = data
    fit = fit_baselines(train, validation=valid if tuned else None)
    s, t = all_pairs(train.num_symbols, train.num_targets)
    assert set(range(train.num_symbols)) - set(train.symbols.tolist()), "the data should leave a symbol unseen"
    assert set(range(train.num_targets)) - set(train.targets.tolist()), "the data should leave a target unseen"
    for name in MODEL_NAMES:
        probs = fit.prob(name, s, t).reshape(train.num_symbols, train.num_targets)
        assert np.all(probs > 0.0), name
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12, err_msg=name)
        assert np.all(np.isfinite(fit.log_prob(name, s, t)))


@pytest.mark.parametrize("tuned", [False, True])
def test_sparse_equals_dense_reference(data, tuned):
    """Log probs of every cell, and perplexity, mean log prob and accuracy on evaluated pairs, to 1e-12."""
    train, valid, test = data
    fit = fit_baselines(train, validation=valid if tuned else None)
    counts = dense_counts(train)
    s, t = all_pairs(train.num_symbols, train.num_targets)
    scores = fit.score(test)
    assert list(scores) == list(MODEL_NAMES)
    for name in MODEL_NAMES:
        rows = dense_model(counts, name, fit.parameters)
        np.testing.assert_allclose(fit.log_prob(name, s, t), np.log(rows).ravel(), rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(fit.best_targets(name), rows.argmax(axis=1), err_msg=name)
        mean, perplexity, accuracy = dense_score(rows, test)
        got = scores[name]
        assert got.target_log_prob == pytest.approx(mean, rel=1e-12, abs=1e-12)
        assert got.perplexity == pytest.approx(perplexity, rel=1e-12)
        assert got.accuracy == pytest.approx(accuracy, rel=1e-12, abs=1e-12)
        assert got.weight == pytest.approx(test.total, rel=1e-12)
        assert got.parameters == fit.parameters.for_model(name)


def test_accuracy_with_many_ties_takes_the_first_target():
    """All counts 1: rows tie among successors and among unseen targets; the first arg-max must still win."""
    rng = np.random.default_rng(3)
    s = rng.integers(0, 6, 60)
    t = rng.integers(0, 10, 60)
    cells = np.unique(s * 10 + t)
    train = PairCounts.from_rows(cells // 10, cells % 10, None, num_symbols=8, num_targets=10)
    assert np.all(train.counts == 1.0)
    evaluated = PairCounts.from_rows(*all_pairs(8, 10), None, num_symbols=8, num_targets=10)
    fit = fit_baselines(train)
    counts = dense_counts(train)
    for name in MODEL_NAMES:
        rows = dense_model(counts, name, fit.parameters)
        np.testing.assert_array_equal(fit.best_targets(name), rows.argmax(axis=1), err_msg=name)
        assert fit.score_one(name, evaluated).accuracy == pytest.approx(dense_score(rows, evaluated)[2], abs=1e-15)


def test_an_observed_successor_tying_with_the_backoff_best_wins_when_it_comes_first():
    """Pairs (0,3), (1,3)×2, (2,2); λ = 1/4, k = 1/2: u = (.5, .5, 1.5, 3.5)/6, so the backoff's best is t* = 3.

    Symbol 2's row: P(2|2) = 1/4 + 3/4 · 1.5/6 = 7/16 and P(3|2) = 3/4 · 3.5/6 = 7/16, exact in binary: the
    observed successor 2 ties with the unobserved t* = 3 and, coming first, is the arg-max.
    """
    train = PairCounts.from_rows(np.array([0, 1, 2, 1]), np.array([3, 3, 2, 3]), None, num_symbols=3, num_targets=4)
    fit = fit_baselines(train, k=0.5, jm_lambda=0.25)
    row = fit.prob("jelinek_mercer", np.full(4, 2), np.arange(4))
    assert row[2] == row[3] == 7 / 16
    assert fit.best_targets("jelinek_mercer")[2] == 2
    evaluated = PairCounts.from_rows(
        np.array([2, 2]), np.array([2, 3]), np.array([1.0, 3.0]), num_symbols=3, num_targets=4
    )
    assert fit.score_one("jelinek_mercer", evaluated).accuracy == 0.25


# -- Kneser-Ney and Ney's estimate -----------------------------------------------------------------------------


def test_kneser_ney_with_integer_counts_is_the_textbook_formula():
    """c(0,0)=3, c(0,1)=1, c(1,1)=2 with D = 1/2, worked by hand (Chen & Goodman 1998, interpolated KN).

    N1+(•0)=1, N1+(•1)=2, N1+(•2)=0, N1+(••)=3, two targets continued: P_cont = (1-D)/3 + D·2/3/3 = 5/18,
    (2-D)/3 + 1/9 = 11/18, 0 + 1/9 = 2/18. γ(0) = D·N1+(0•)/c(0) = 1/4, γ(1) = D·1/2 = 1/4.
    """
    train = PairCounts.from_rows(
        np.array([0, 0, 0, 0, 1, 1]), np.array([0, 0, 0, 1, 1, 1]), None, num_symbols=3, num_targets=3
    )
    fit = fit_baselines(train, discount=0.5)
    cont = np.array([5, 11, 2]) / 18
    expected = np.array(
        [
            [2.5 / 4 + cont[0] / 4, 0.5 / 4 + cont[1] / 4, cont[2] / 4],
            [cont[0] / 4, 1.5 / 2 + cont[1] / 4, cont[2] / 4],
            cont,
        ]
    )
    s, t = all_pairs(3, 3)
    np.testing.assert_allclose(fit.prob("kneser_ney", s, t).reshape(3, 3), expected, rtol=1e-14)
    # The general rule on random integer counts: γ(s) = D N1+(s•)/c(s), P_cont(t) = (N1+(•t) - D)⁺/N + D n/(N T).
    rng = np.random.default_rng(5)
    train = random_pairs(rng, 7, 9, 300, fractional=False)
    d = 0.37
    fit = fit_baselines(train, discount=d)
    counts = dense_counts(train)
    n_t = (counts > 0).sum(axis=0)
    cont = np.maximum(n_t - d, 0) / n_t.sum() + d * np.count_nonzero(n_t) / n_t.sum() / 9
    c_s = counts.sum(axis=1)
    for symbol in range(7):
        row = fit.prob("kneser_ney", np.full(9, symbol), np.arange(9))
        if c_s[symbol] == 0:
            want = cont
        else:
            gamma = d * np.count_nonzero(counts[symbol]) / c_s[symbol]
            want = np.maximum(counts[symbol] - d, 0) / c_s[symbol] + gamma * cont
        np.testing.assert_allclose(row, want, rtol=1e-13)


def test_ney_estimate_on_known_counts():
    assert ney_discount(np.array([1.0, 1, 1, 2, 2, 3, 5])) == (3 / 7, 3, 2)
    # Fractional counts round to the nearest integer: [0.5, 1.5) is a 1, [1.5, 2.5) a 2.
    assert ney_discount(np.array([0.5, 1.49, 1.5, 2.49, 0.49, 2.5])) == (pytest.approx(1 / 3), 2, 2)
    assert ney_discount(np.array([5.0, 7.0])) == (FALLBACK_DISCOUNT, 0, 0)  # undefined: the stated fallback
    assert ney_discount(np.array([2.0, 2.0]))[0] == 0.01  # 0 would leave unseen pairs no mass
    train = PairCounts.from_rows(
        np.array([0, 1, 2, 3, 3, 4, 4, 5, 5, 5]), np.zeros(10, dtype=np.int64), None, num_symbols=6, num_targets=2
    )
    params = fit_baselines(train).parameters.for_model("kneser_ney")
    assert params["discount"] == pytest.approx(3 / 7)
    assert params["tuned_on"] == "stated: Ney's estimate n1/(n1+2n2)"
    assert (params["n1"], params["n2"]) == (3, 2)


# -- tuning ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fractional", [False, True])
def test_tuning_never_worsens_the_validation_perplexity(seed, fractional):
    rng = np.random.default_rng(seed)
    train = random_pairs(rng, 15, 20, 300 + 200 * seed, fractional=fractional)
    valid = random_pairs(rng, 15, 20, 400, fractional=fractional, held_out=0)
    default = fit_baselines(train).score(valid)
    tuned_fit = fit_baselines(train, validation=valid)
    tuned = tuned_fit.score(valid)
    for name in MODEL_NAMES:
        assert tuned[name].perplexity <= default[name].perplexity * (1 + 1e-12), name
        # The fast objective the tuning maximized is the model's own validation score.
        assert tuned[name].parameters["validation_perplexity"] == pytest.approx(tuned[name].perplexity, rel=1e-10)
    for name in ("add_k", "jelinek_mercer", "kneser_ney"):
        assert tuned_fit.parameters.tuned_on[name] == "validation"
    assert tuned_fit.parameters.tuned_on["unigram"] == "stated: given k"
    # λ is the exact maximizer (inside its bounds here, the bigram being informative): a step either way is worse.
    lam = tuned_fit.parameters.jm_lambda
    assert 0.01 < lam < 0.99
    best = tuned["jelinek_mercer"].perplexity
    for other in (lam - 1e-4, lam + 1e-4):
        assert fit_baselines(train, jm_lambda=other).score_one("jelinek_mercer", valid).perplexity >= best * (1 - 1e-12)


@pytest.mark.parametrize("discount", [1.5, 3.0])
def test_a_stated_discount_above_one_is_scored_as_the_model_scores_it(discount):
    """A given D > 1 joins the tuning's candidates; pairs counted 1 <= c < D are clipped by min(c, D) too, so
    the objective the tuning reports must still be the model's validation score (sparse counts of 1 and 2,
    validation mostly unseen pairs: the large D wins)."""
    rng = np.random.default_rng(0)
    train = PairCounts.from_rows(
        rng.integers(0, 20, 300), rng.integers(0, 40, 300), None, num_symbols=20, num_targets=40
    )
    valid = PairCounts.from_rows(
        rng.integers(0, 20, 500), rng.integers(0, 40, 500), None, num_symbols=20, num_targets=40
    )
    fitted = fit_baselines(train, validation=valid, discount=discount)
    assert fitted.parameters.kn_discount == discount
    kn = fitted.score_one("kneser_ney", valid)
    assert fitted.parameters.for_model("kneser_ney")["validation_perplexity"] == pytest.approx(kn.perplexity, rel=1e-10)


def test_untuned_parameters_say_how_they_were_set(data):
    train, _, _ = data
    params = fit_baselines(train, k=0.3).parameters
    assert params.for_model("unigram") == {"k": 0.3, "tuned_on": "stated: given k"}
    assert params.for_model("add_k") == {"k": 0.3, "tuned_on": "stated: given k"}
    assert params.for_model("jelinek_mercer") == {
        "lambda": DEFAULT_JM_LAMBDA,
        "unigram_k": 0.3,
        "tuned_on": f"stated: default {DEFAULT_JM_LAMBDA}",
    }
    empty_validation = PairCounts.empty(train.num_symbols, train.num_targets)
    params = fit_baselines(train, validation=empty_validation, discount=0.4).parameters  # no tuning data
    assert params.kn_discount == 0.4
    assert params.tuned_on["kneser_ney"] == "stated: given discount (the validation pairs weigh nothing)"


# -- edge cases, files and bad input ---------------------------------------------------------------------------


def test_empty_training_gives_finite_uniform_models():
    train = PairCounts.empty(3, 4)
    fit = fit_baselines(
        train, validation=PairCounts.from_rows(np.array([0]), np.array([2]), None, num_symbols=3, num_targets=4)
    )
    evaluated = PairCounts.from_rows(np.array([0, 1, 2]), np.array([0, 3, 1]), None, num_symbols=3, num_targets=4)
    for name, score in fit.score(evaluated).items():
        assert score.perplexity == pytest.approx(4.0), name
        assert score.accuracy == pytest.approx(1 / 3), name  # target 0 is every row's first arg-max


def test_scores_and_parameters_round_trip_through_json(data):
    train, valid, test = data
    fit = fit_baselines(train, validation=valid)
    rebuilt = Baselines(train, BaselineParameters.from_json(fit.parameters.to_json()))
    s, t = all_pairs(train.num_symbols, train.num_targets)
    for name, score in fit.score(test).items():
        np.testing.assert_array_equal(rebuilt.log_prob(name, s, t), fit.log_prob(name, s, t))
        assert BaselineScore.from_json(score.to_json()) == score


def test_bad_input_is_named(data):
    train, _, _ = data
    fit = fit_baselines(train)
    with pytest.raises(ValueError, match="unknown baseline 'trigram'"):
        fit.log_prob("trigram", np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match=r"targets\[1\] = 12"):
        fit.log_prob("add_k", np.array([0, 1]), np.array([0, 12]))
    with pytest.raises(TypeError, match="symbols must be an integer array"):
        fit.log_prob("add_k", np.array([0.5]), np.array([0]))
    with pytest.raises(ValueError, match=r"evaluated pairs have \(S, T\) = \(9, 13\)"):
        fit.score(PairCounts.empty(9, 13))
    with pytest.raises(ValueError, match="validation pairs"):
        fit_baselines(train, validation=PairCounts.empty(8, 12))
    with pytest.raises(ValueError, match=r"k = 0\.0"):
        fit_baselines(train, k=0.0)
    with pytest.raises(ValueError, match="jm_lambda"):
        fit_baselines(train, jm_lambda=1.0)


# -- properties on random small pair sets ----------------------------------------------------------------------


@st.composite
def pair_sets(draw: Any) -> tuple[PairCounts, PairCounts]:
    num_symbols = draw(st.integers(1, 5))
    num_targets = draw(st.integers(1, 6))
    fractional = draw(st.booleans())
    weight = st.floats(0.01, 3.0) if fractional else st.integers(1, 4).map(float)

    def pairs(min_size: int) -> PairCounts:
        rows = draw(
            st.lists(
                st.tuples(st.integers(0, num_symbols - 1), st.integers(0, num_targets - 1), weight),
                min_size=min_size,
                max_size=25,
            )
        )
        s = np.array([r[0] for r in rows], dtype=np.int64)
        t = np.array([r[1] for r in rows], dtype=np.int64)
        w = np.array([r[2] for r in rows], dtype=np.float64)
        return PairCounts.from_rows(s, t, w, num_symbols=num_symbols, num_targets=num_targets)

    return pairs(0), pairs(1)


@settings(deadline=None, max_examples=60)
@given(pair_sets(), st.booleans())
def test_property_models_are_distributions_matching_the_dense_reference(sets, tuned):
    train, other = sets
    fit = fit_baselines(train, validation=other if tuned else None)
    counts = dense_counts(train)
    s, t = all_pairs(train.num_symbols, train.num_targets)
    for name in MODEL_NAMES:
        probs = fit.prob(name, s, t).reshape(counts.shape)
        assert np.all(probs > 0.0)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        rows = dense_model(counts, name, fit.parameters)
        np.testing.assert_allclose(probs, rows, rtol=1e-12, atol=0)
        # The pick is a first arg-max of the dense row up to rounding (hypothesis can build exact mathematical ties
        # that two ways of summing round apart, so bit-equality with argmax is asserted on fixed data above).
        best = fit.best_targets(name)
        for symbol, row in enumerate(rows):
            top = row.max()
            assert row[best[symbol]] >= top * (1 - 1e-12)
            assert np.all(row[: best[symbol]] < top * (1 - 1e-12))
        score = fit.score_one(name, other)
        assert score.weight == pytest.approx(other.total)
        assert score.target_log_prob == pytest.approx(dense_score(rows, other)[0], rel=1e-12, abs=1e-12)
