"""The mixture of single-hop heads: monotone EM, round trips, additive statistics, and its scores, top-K and
streaming predictions held against a mixture written out with NumPy."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionDistribution, random_distribution
from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import (
    Block,
    TrainerContext,
    head_from_arrays,
    head_kind,
    kind_names,
    spec_from_json,
)
from dist_respattn.model.heads.mixture import MixtureHead, MixtureSpec, spec_from_options
from dist_respattn.model.heads.mixture.kind import MixtureStatistics, mixture_start_partition, row_assignments
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.rows import EncodedRows

SHAPE = (12, 4, 3, 8)  # S, N, D, T
TINY = (6, 3, 2, 5)

#: Plain EM: no emission smoothing, no prior on the positions or the gate, a fixed gate variance.
ML = MixtureSpec(components=2, component=SingleHopSpec(sigma2=0.5, emission_smoothing=0.0), gate_pseudo_count=0.0)


def truth(shape=SHAPE, seeds=(1, 2), gate=(0.6, 0.4)) -> MixtureHead:
    return MixtureHead(list(gate), [random_distribution(*shape, seed=s, sigma2=0.5) for s in seeds])


def sparse_truth(shape=TINY) -> MixtureHead:
    """Two components sparse over one support (every symbol keeps about half its targets)."""
    s, _, _, t = shape
    rng = np.random.default_rng(7)
    keep = rng.random((s, t)) < 0.5
    keep[:, 0] = True
    cells = np.flatnonzero(keep.T.reshape(-1))  # target-major keys t * S + s
    support = PairSupport.from_keys(cells.astype(np.int64), s, t)
    heads = []
    for seed in (3, 4):
        dense = random_distribution(*shape, seed=seed, sigma2=0.7)
        table = SparseEmission.from_dense(dense.emission, support)
        base = rng.dirichlet(np.ones(t))
        # A non-uniform base with backoffs that keep every row normalized: values + backoff * base off the support.
        on = np.bincount(support.symbols, weights=table.values, minlength=s)
        off_base = base.sum() - np.bincount(support.symbols, weights=base[support.targets], minlength=s)
        backoff = np.maximum(1.0 - on, 0.0) / off_base
        heads.append(dense.with_emission(SparseEmission(support, table.values, backoff, base)))
    return MixtureHead([0.3, 0.7], heads)


def block(data, start=0, weights=None) -> Block:
    context, query, target = data
    return Block(EncodedRows(context, query, target, weights, start), weights, start=start)


def rows(data, lo, hi):
    return tuple(np.ascontiguousarray(a[lo:hi]) for a in data)


# ----------------------------------------------------------------------------- the mixture in NumPy


def numpy_mixture(head: MixtureHead, context, query):
    """``(p (n, T), w (n, K), attention (n, K, N), log p(y | c) (n,))`` of the mixture, written out densely."""
    n = context.shape[0]
    k_count = head.num_components
    log_q = np.empty((n, k_count))
    attention = np.empty((n, k_count, head.context_length))
    for k, c in enumerate(head.components):
        diff = query[:, None, :] - c.key_means[context]
        log_w = np.log(c.position_prior)[None, :] - (diff**2).sum(axis=2) / (2 * c.sigma2)
        norm = np.log(np.exp(log_w).sum(axis=1))
        attention[:, k] = np.exp(log_w - norm[:, None])
        log_q[:, k] = norm - 0.5 * head.query_dim * np.log(2 * np.pi * c.sigma2)
    joint = np.log(head.gate) + log_q
    log_query = np.log(np.exp(joint).sum(axis=1))
    w = np.exp(joint - log_query[:, None])
    p = np.zeros((n, head.num_targets))
    for k, c in enumerate(head.components):
        emission = c.emission_table.to_dense()
        p += w[:, k, None] * np.einsum("ni,nit->nt", attention[:, k], emission[context])
    return p, w, attention, log_query


# ----------------------------------------------------------------------------- EM


@pytest.mark.parametrize("estimate_sigma2", [False, True], ids=["fixed-sigma2", "learned-sigma2"])
def test_em_never_lowers_the_training_log_likelihood(estimate_sigma2):
    data = truth().sample_arrays(3000, seed=3)
    component = SingleHopSpec(sigma2=0.5, estimate_sigma2=estimate_sigma2, emission_smoothing=0.0)
    spec = MixtureSpec(components=2, component=component, gate_pseudo_count=0.0)
    heads = []
    every_row = HoldoutRule.for_rows(3000, 0.0)  # no hold-out: the E-step sees every row
    result = fit_em(
        data, spec, shape=SHAPE, holdout=every_row, max_iter=25, tol=0.0, callback=lambda _, h: heads.append(h)
    )
    lls = result.log_likelihoods
    assert result.n_iter == 25 and all(np.isfinite(lls))
    for k in range(1, len(lls)):
        assert lls[k] >= lls[k - 1] - 1e-9 * abs(lls[k - 1]), f"iteration {k + 1}: {lls[k]!r} < {lls[k - 1]!r}"
    assert lls[-1] > lls[0] + 1.0, "EM made no progress from its start"
    # The E-step's log-likelihood is the mixture's: iteration k reports the head iteration k - 1 made.
    for k in (1, 10, 24):
        assert float(np.mean(heads[k - 1].seq_log_density(data))) == pytest.approx(lls[k], rel=1e-12)
    # The start broke the components' symmetry: two heads explain two-head data better than one head does.
    one = fit_em(data, SingleHopSpec(sigma2=0.5, emission_smoothing=0.0), shape=SHAPE, holdout=every_row, max_iter=25)
    assert lls[-1] > one.log_likelihoods[-1] + 0.1


def test_a_sparse_map_fit_keeps_one_support_and_scores_held_out_rows():
    data = truth().sample_arrays(2000, seed=4)
    spec = MixtureSpec(components=3, component=SingleHopSpec(sigma2=0.5, emission_layout="sparse"), seed=5)
    result = fit_em(data, spec, shape=SHAPE, max_iter=8, tol=0.0)
    head = result.distribution
    tables = [c.emission_table for c in head.components]
    assert all(isinstance(t, SparseEmission) for t in tables)
    assert all(t.support.same_as(tables[0].support) for t in tables)
    assert np.all(np.diff(result.log_likelihoods) > -1e-9 * abs(result.log_likelihoods[0]))
    # Nothing is chosen, but the M-step's one candidate is scored on held-out rows (early stopping, the fit page).
    trainer = spec.trainer(TrainerContext(SHAPE))
    trainer.support = tables[0].support
    trainer.estimator = trainer.estimator.resolved(EmissionPrior.uniform(SHAPE[0], SHAPE[3]))
    candidates = trainer.m_step(trainer.statistics(head, iter([block(data)])), head)
    held = truth().sample_arrays(500, seed=13)
    grid = candidates.grid(None)
    choice, metrics = candidates.choose(grid, grid.score(iter([block(held)])))
    assert choice == candidates.default() and not candidates.searches() and not trainer.searches()
    expected = candidates.model(choice).score([block(held)]).metrics()
    assert metrics == {name: expected[name] for name in ("mean_log_likelihood", "target_log_prob", "perplexity")}
    assert candidates.choose(grid, grid.score(iter([block(held, 0, np.zeros(500))]))) == (choice, None)
    assert grid.nbytes() == head.nbytes() > 0  # what the held-out pass sends: the candidate head


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("make", [truth, sparse_truth], ids=["dense", "sparse"])
def test_arrays_and_pickle_round_trip_exactly(make):
    head = make()
    arrays, meta = head.to_arrays()
    assert {"gate", "component_0_key_means", "component_1_position_prior"} <= set(arrays)
    again = head_from_arrays("mixture", arrays, meta)
    assert isinstance(again, MixtureHead)
    arrays2, meta2 = again.to_arrays()
    assert meta2 == meta and arrays2.keys() == arrays.keys()
    assert all(np.array_equal(arrays[name], arrays2[name]) for name in arrays)
    _ = head.stacked  # a head that has scored rows pickles without its compiled layout
    unpickled = pickle.loads(pickle.dumps(head))
    assert "stacked" not in unpickled.__dict__
    assert all(np.array_equal(arrays[name], value) for name, value in unpickled.to_arrays()[0].items())
    assert head.num_parameters() == sum(c.num_parameters() for c in head.components) + 1
    assert [(name, table) for name, table in head.emissions()] == [
        (f"component {k}", c.emission_table) for k, c in enumerate(head.components)
    ]


def test_spec_json_registration_and_options():
    spec = MixtureSpec(components=3, component=SingleHopSpec(sigma2=0.25, emission_layout="sparse"), seed=9)
    assert spec_from_json(spec.to_json()) == spec
    assert "mixture" in kind_names() and head_kind("mixture").head is MixtureHead
    base = SingleHopSpec(sigma2=0.25, seed=4)
    assert spec_from_options({"mixture_components": None}, base, None) is None
    made = spec_from_options({"mixture_components": 3}, base, {"kind": "mixture", "gate_pseudo_count": 0.0})
    assert made == MixtureSpec(components=3, component=base, seed=4, gate_pseudo_count=0.0)
    with pytest.raises(ValueError, match="--mixture-components 1"):
        spec_from_options({"mixture_components": 1}, base, None)
    with pytest.raises(ValueError, match="--position-buckets"):
        MixtureSpec(component=SingleHopSpec(position_buckets=2))


# ----------------------------------------------------------------------------- statistics


def _assert_same_statistics(a: MixtureStatistics, b: MixtureStatistics) -> None:
    np.testing.assert_allclose(a.gate_mass, b.gate_mass, rtol=1e-12)
    assert a.n_obs == pytest.approx(b.n_obs, rel=1e-12) and a.log_lik == pytest.approx(b.log_lik, rel=1e-12)
    for x, y in zip(a.components, b.components, strict=True):
        for name in ("key_sum", "key_mass", "position_count"):
            np.testing.assert_allclose(getattr(x, name), getattr(y, name), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(x.emission_count.to_dense(), y.emission_count.to_dense(), rtol=1e-12, atol=1e-12)
        assert x.n_obs == pytest.approx(y.n_obs, rel=1e-12) and x.query_sq == pytest.approx(y.query_sq, rel=1e-12)


def test_statistics_of_a_row_split_add_to_those_of_the_whole():
    head = truth()
    data = head.sample_arrays(1500, seed=6)
    weights = np.random.default_rng(6).uniform(0.0, 2.0, 1500)
    weights[::7] = 0.0
    trainer = ML.trainer(TrainerContext(SHAPE))
    whole = trainer.statistics(head, iter([block(data, 0, weights)]))
    parts = [
        trainer.statistics(head, iter([block(rows(data, lo, hi), lo, weights[lo:hi])]))
        for lo, hi in ((0, 400), (400, 401), (401, 1500))
    ]
    _assert_same_statistics(whole, MixtureStatistics.sum_of(parts))
    assert whole.n_obs == pytest.approx(weights.sum(), rel=1e-12)
    assert float(whole.gate_mass.sum()) == pytest.approx(weights.sum(), rel=1e-12)
    # The start draws each row's responsibilities from its store row: any split (cluster) starts alike.
    start = mixture_start_partition(trainer.factory, 2, 11, True, None, iter([block(data, 0, weights)]))
    starts = [
        mixture_start_partition(
            trainer.factory, 2, 11, True, None, iter([block(rows(data, lo, hi), lo, weights[lo:hi])])
        )
        for lo, hi in ((0, 700), (700, 1500))
    ]
    _assert_same_statistics(start, MixtureStatistics.sum_of(starts))
    assert np.array_equal(row_assignments(11, np.arange(700, 710), 2), row_assignments(11, np.arange(1500), 2)[700:710])


# ----------------------------------------------------------------------------- scores and predictions


@pytest.mark.parametrize("make", [lambda: truth(TINY), sparse_truth], ids=["dense", "sparse"])
def test_scores_equal_the_numpy_mixture(make):
    head = make()
    context, query, target = head.sample_arrays(400, seed=8)
    weights = np.random.default_rng(8).uniform(0.0, 1.0, 400)
    p, _, _, log_query = numpy_mixture(head, context, query)
    totals = head.score([block((context, query, target), 0, weights)])
    picked = p[np.arange(400), target]
    assert totals.weight == pytest.approx(weights.sum(), rel=1e-12)
    assert totals.target_log_prob == pytest.approx(float(weights @ np.log(picked)), rel=1e-10)
    assert totals.log_lik == pytest.approx(float(weights @ (log_query + np.log(picked))), rel=1e-10)
    assert totals.log_lik == pytest.approx(float(weights @ head.seq_log_density((context, query, target))), rel=1e-10)
    hits = np.argmax(p, axis=1) == target
    assert totals.correct == pytest.approx(float(weights[hits].sum()), rel=1e-12)
    np.testing.assert_allclose(head.predict_proba(context, query), p, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("make", [lambda: truth(TINY), sparse_truth], ids=["dense", "sparse"])
def test_top_k_equals_the_sorted_numpy_mixture(make):
    head = make()
    context, query, target = head.sample_arrays(300, seed=9)
    p, w, attention, _ = numpy_mixture(head, context, query)
    top = head.top_k(block((context, query, target)), 3)
    order = np.argsort(-p, axis=1, kind="stable")[:, :3]
    assert np.array_equal(top.targets, order)
    np.testing.assert_allclose(top.probabilities, np.take_along_axis(p, order, axis=1), rtol=1e-10)
    np.testing.assert_allclose(top.attention, np.einsum("nk,nki->ni", w, attention), rtol=1e-10)
    assert head.top_k(block((context, query, target)), 99).targets.shape == (300, TINY[3])


@pytest.mark.parametrize("make", [lambda: truth(TINY), sparse_truth], ids=["dense", "sparse"])
def test_the_streaming_predictor_equals_the_numpy_mixture(make):
    head = make()
    s, n, d, _ = head.shape
    embeddings = np.random.default_rng(10).normal(size=(s, d))
    history = np.random.default_rng(11).integers(0, s, size=9)
    words = [f"w{t}" for t in range(head.num_targets)]
    predictor = head.predictor(words=words, query_table=embeddings)
    for m, token in enumerate(history, start=1):
        predictor.push(int(token))
        if m >= n:  # a full window is an encoded row: the last N tokens, the query the last one's embedding
            context = history[m - n : m][None, :]
            p, _, _, _ = numpy_mixture(head, context, embeddings[history[m - 1]][None, :])
            np.testing.assert_allclose(predictor.predict(), p[0], rtol=1e-10)
            targets, probs = predictor.top_k(2)
            assert np.array_equal(targets, np.argsort(-p[0], kind="stable")[:2])
            np.testing.assert_allclose(probs, p[0][targets], rtol=1e-10)
            assert predictor.top_words(1)[0][0] == words[targets[0]]
        assert predictor.state_size == min(m, n)
    # A short history: the columns it lacks masked and every component's prior renormalized over the rest.
    short = head.predictor(query_table=embeddings)
    short.extend(history[:2])
    masked = []
    for c in head.components:
        prior = np.r_[np.zeros(n - 2), c.position_prior[n - 2 :]]
        masked.append(ResponsibilityAttentionDistribution(c.key_means, c.emission_table, prior / prior.sum(), c.sigma2))
    context = np.r_[np.zeros(n - 2, dtype=np.int64), history[:2]][None, :]
    with np.errstate(divide="ignore"):
        p, _, _, _ = numpy_mixture(MixtureHead(head.gate, masked), context, embeddings[history[1]][None, :])
    np.testing.assert_allclose(short.predict(), p[0], rtol=1e-10)


def test_a_warm_start_moves_the_components_onto_the_fit_layout():
    data = truth().sample_arrays(1500, seed=12)
    dense = fit_em(data, ML, shape=SHAPE, max_iter=3, tol=0.0).distribution
    spec = MixtureSpec(components=2, component=SingleHopSpec(sigma2=0.5, emission_layout="sparse"))
    result = fit_em(data, spec, init=dense, max_iter=2, tol=0.0)
    tables = [c.emission_table for c in result.distribution.components]
    assert all(isinstance(t, SparseEmission) and t.support.same_as(tables[0].support) for t in tables)
    trainer = spec.trainer(TrainerContext(SHAPE))
    with pytest.raises(ValueError, match="--mixture-components 2"):
        MixtureSpec(components=3).trainer(TrainerContext(SHAPE)).check_start(dense, resumed=False)
    with pytest.raises(ValueError, match="starts from a mixture head"):
        trainer.check_start(dense.components[0], resumed=False)


def test_a_collapsed_component_is_reported():
    head = truth()
    assert not head.collapse_warnings()
    collapsed = MixtureHead([1.0 - 1e-5, 1e-5], head.components)
    assert collapsed.collapse_warnings() == [
        "component 1 holds 0.00% of the rows: it has collapsed (fit fewer components)"
    ]
    assert collapsed.warnings()[0] == collapsed.collapse_warnings()[0]
    figures, lines = collapsed.summary()
    assert figures == {"gate": [1.0 - 1e-5, 1e-5], "component_sigma2": [0.5, 0.5]} and len(lines) == 1
