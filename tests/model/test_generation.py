"""Generation from any head (free or bucketed prior, dense or sparse emission) through the streaming predictor, and
the predictor's answers in words."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import PositionBuckets, random_distribution
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.streaming import Predictor, generate, generation_steps

from .emission_layouts import counts_in_layout

S, N, D = 9, 6, 3


def head(prior: str, layout: str, seed: int = 0) -> ResponsibilityAttentionDistribution:
    """A head with T = S (a token stream's): a free or bucketed prior, a dense or sparse emission."""
    base = random_distribution(S, N, D, S, seed=seed, key_scale=1.5, sigma2=1.3)
    rng = np.random.default_rng(seed)
    buckets = PositionBuckets.geometric(N, 3) if prior == "bucketed" else None
    position_prior = base.position_prior if buckets is None else buckets.spread(rng.dirichlet(np.ones(3)))
    emission = base.emission
    if layout == "sparse":  # a few pairs per symbol, the rest backed off
        counts = np.where(rng.random((S, S)) < 0.3, rng.integers(1, 5, size=(S, S)), 0).astype(np.float64)
        emission = counts_in_layout(counts, "sparse").map_emission(rng.uniform(0.5, 2.0, size=S), np.full(S, 1 / S))
    return ResponsibilityAttentionDistribution(base.key_means, emission, position_prior, base.sigma2, buckets=buckets)


def reference(model, embeddings, history):
    """p(next | history), position by position: the last N tokens (fewer for a short history, the prior
    renormalized over the positions it has, as a stream store reads a document's first rows)."""
    window = np.asarray(history[-N:])
    m = window.shape[0]
    if m == N:  # a full window is a row of predict_proba
        return model.predict_proba(window[None, :], embeddings[window[-1]][None, :])[0]
    prior = model.position_prior[N - m :] / model.position_prior[N - m :].sum()  # columns are oldest first
    dist = ((model.key_means[window] - embeddings[window[-1]]) ** 2).sum(axis=1)
    logw = np.log(prior) - dist / (2 * model.sigma2)
    a = np.exp(logw - logw.max())
    return (a / a.sum()) @ model.emission[window]


KINDS = [(p, layout) for p in ("free", "bucketed") for layout in ("dense", "sparse")]


@pytest.mark.parametrize(("prior", "layout"), KINDS)
@pytest.mark.parametrize("prompt_length", [1, 4, N, 15])
def test_every_draw_comes_from_the_heads_predictive_distribution(prior, layout, prompt_length):
    model = head(prior, layout, seed=prompt_length)
    embeddings = np.random.default_rng(7).normal(size=(S, D))
    prompt = list(np.random.default_rng(prompt_length).integers(0, S, size=prompt_length))
    seed = 11
    replay = np.random.default_rng(seed)  # the same uniforms, to check each token is the draw from p
    history = list(prompt)
    steps = generation_steps(model, embeddings, prompt, np.random.default_rng(seed))
    for _ in range(3 * N):
        token, probs = next(steps)
        np.testing.assert_allclose(probs, reference(model, embeddings, history), rtol=1e-12, atol=1e-15)
        assert token == int(np.searchsorted(np.cumsum(probs), replay.random() * probs.sum(), side="right"))
        assert 0 <= token < S
        history.append(token)


@pytest.mark.parametrize(("prior", "layout"), KINDS)
def test_the_first_tokens_frequencies_over_many_seeds_are_predict_proba(prior, layout):
    model = head(prior, layout, seed=3)
    embeddings = np.random.default_rng(8).normal(size=(S, D))
    prompt = np.array([4, 1, 1, 7, 0, 2, 5])
    draws = 4000
    first = np.array([generate(model, embeddings, prompt, 1, np.random.default_rng(seed))[0] for seed in range(draws)])
    p = model.predict_proba(prompt[None, -N:], embeddings[prompt[-1]][None, :])[0]
    frequency = np.bincount(first, minlength=S) / draws
    # Within 5 standard errors of each probability (a binomial share of 4000 draws).
    assert np.all(np.abs(frequency - p) <= 5 * np.sqrt(p * (1 - p) / draws) + 1e-12), (frequency, p)


def test_generation_is_reproducible_by_seed_and_refuses_what_it_cannot_run():
    model = head("free", "dense")
    embeddings = np.random.default_rng(1).normal(size=(S, D))
    one = generate(model, embeddings, [3], 40, np.random.default_rng(5))
    assert np.array_equal(one, generate(model, embeddings, [3], 40, np.random.default_rng(5)))
    assert not np.array_equal(one, generate(model, embeddings, [3], 40, np.random.default_rng(6)))
    with pytest.raises(ValueError, match="an empty prompt"):
        generate(model, embeddings, [], 3, np.random.default_rng(0))
    other = random_distribution(S, N, D, S + 1, seed=0)
    with pytest.raises(ValueError, match="the head needs T = S"):
        generate(other, embeddings, [1, 2], 3, np.random.default_rng(0))


def test_the_predictor_gives_its_answers_in_words():
    model = head("bucketed", "dense")
    embeddings = np.random.default_rng(2).normal(size=(S, D))
    words = [f"w{i}" for i in range(S)]
    predictor = Predictor(model, embeddings, words=words)
    predictor.extend([1, 5, 5, 2])
    ids, probs = predictor.top_k(4)
    assert predictor.top_words(4) == [(words[int(i)], float(p)) for i, p in zip(ids, probs, strict=True)]
    with pytest.raises(ValueError, match="no words were given"):
        Predictor(model, embeddings).top_words(2)
    with pytest.raises(ValueError, match=r"3 words: expected one for each of the model's T = 9"):
        Predictor(model, embeddings, words=words[:3])
