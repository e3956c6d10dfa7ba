"""The attribute-gated head as a kind of the head protocol: fitted in process by ``fit_em`` from a shared head,
scored, ranked and predicted like any head, its arrays and spec round-tripped."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.heads.base import Block, head_from_arrays, head_kind, spec_from_json
from dist_respattn.model.heads.gated.head import GatedHead, gated_log_likelihood, gated_log_likelihoods
from dist_respattn.model.heads.gated.kind import (
    FIRST_SCALES,
    STAGE_DEFAULTS,
    GatedSpec,
    PriorScale,
    shared_strengths,
    spec_from_options,
)
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.rows import EncodedRows

SHAPE = (10, 4, 3, 8)
NAMES = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def corpus():
    """Rows whose targets depend on their attribute (what the factors are for), and a shared head fitted on them."""
    truth = random_distribution(*SHAPE, seed=11, key_scale=1.5, sigma2=0.7)
    context, query, target = truth.sampler(12).sample_arrays(1500)
    attribute = np.random.default_rng(13).integers(0, len(NAMES), size=1500)
    target = np.where(attribute == 1, (target * 3 + 1) % SHAPE[3], target).astype(target.dtype)
    data = (context, query, target)
    shared = fit_em(data, SingleHopSpec(emission_layout="sparse"), shape=SHAPE, max_iter=5).distribution
    return data, attribute, shared


def fit_gated(corpus, spec, **kw):
    data, attribute, shared = corpus
    return fit_em(data, spec, attributes=attribute, attribute_names=NAMES, init=shared, init_meta={}, **kw)


def block_of(data, attribute, weights=None):
    return Block(EncodedRows(*data, weights, 0), weights, attribute)


def test_em_never_lowers_the_training_likelihood_at_a_fixed_scale(corpus):
    # A prior scale near 0 and no pseudo-count on the weights: the M-step is maximum likelihood.
    spec = GatedSpec(2, weight_strength=0.0, prior_scale=1e-9)
    result = fit_gated(corpus, spec, max_iter=8, tol=0.0)
    means = result.log_likelihoods
    assert len(means) == 8
    for before, after in itertools.pairwise(means):
        assert after >= before - 1e-9 * abs(before), (before, after)
    head = result.distribution
    assert isinstance(head, GatedHead) and head.attribute_names() == NAMES
    assert head.num_factors == 2 and head.reference is corpus[2]
    # The scale was given: every iteration records it, chosen on nothing.
    assert {it.hyperparameters for it in result.history} == {PriorScale(1e-9, given=True)}
    assert result.history[0].hyperparameters.describe() == "prior scale 1e-09 (given)"
    # Attribute 1 draws on another factor mix than attributes 0 and 2.
    w = head.weights
    assert abs(w[0] - w[2]).max() < abs(w[0] - w[1]).max()


def test_the_scale_is_chosen_on_the_wide_grid_then_around_the_last_choice(corpus):
    result = fit_gated(corpus, GatedSpec(1, per_attribute=("emission",)), max_iter=3, tol=0.0)
    first, second = (it.hyperparameters for it in result.history[:2])
    assert first.scale in FIRST_SCALES and not first.given
    assert second.scale in (first.scale / 2, first.scale, first.scale * 2)
    heldout = result.history[0].heldout
    assert heldout is not None and np.isclose(heldout["perplexity"], np.exp(-heldout["target_log_prob"]))
    # The joint likelihood of a row is below its target's given the query only by log p(query | context) < 0 or not;
    # both are finite means over the held-out rows.
    assert np.isfinite(heldout["mean_log_likelihood"])


def test_score_adds_the_rows_gated_log_likelihoods_and_unknown_attributes_weigh_nothing(corpus):
    head = fit_gated(corpus, GatedSpec(2, prior_scale=0.5), max_iter=2).distribution
    data, attribute, _ = corpus
    attribute = attribute.copy()
    attribute[::7] = -1  # an attribute the head does not know
    weights = np.random.default_rng(1).uniform(0.5, 2.0, size=attribute.shape[0])
    blocks = [block_of(tuple(c[:700] for c in data), attribute[:700], weights[:700]),
              block_of(tuple(c[700:] for c in data), attribute[700:], weights[700:])]  # fmt: skip
    totals = head.score(blocks)
    known = attribute >= 0
    own = np.where(known, attribute, 0)
    lines = gated_log_likelihood(head, data, own, given_query=True)
    joint = gated_log_likelihood(head, data, own)
    assert np.isclose(totals.weight, weights[known].sum(), rtol=1e-12)
    assert np.isclose(totals.target_log_prob, np.sum(weights[known] * lines[known]), rtol=1e-12)
    assert np.isclose(totals.log_lik, np.sum(weights[known] * joint[known]), rtol=1e-12)
    correct = 0.0
    for a in range(len(NAMES)):
        mine = attribute == a
        predicted = np.argmax(head.shared(a).predict_proba(data[0][mine], data[1][mine]), axis=1)
        correct += weights[mine][predicted == data[2][mine]].sum()
    assert np.isclose(totals.correct, correct, rtol=1e-12)
    # One kernel pass gives both figures, each exactly as the single-figure call does.
    both = gated_log_likelihoods(head, data, own)
    assert np.array_equal(both[0], lines) and np.array_equal(both[1], joint)


def test_top_k_ranks_each_row_under_its_attribute_and_unknown_ones_under_the_shared_head(corpus):
    head = fit_gated(corpus, GatedSpec(2, prior_scale=0.5), max_iter=2).distribution
    data, attribute, shared = corpus
    attribute = attribute[:300].copy()
    attribute[::5] = -1
    context, query = data[0][:300], data[1][:300]
    ranked = head.top_k(block_of((context, query, data[2][:300]), attribute), 3)
    for a in (-1, 0, 1, 2):
        mine = attribute == a
        model = shared if a < 0 else head.shared(a)
        probs = model.predict_proba(context[mine], query[mine])
        expected = np.argsort(-probs, axis=1, kind="stable")[:, :3]
        assert np.array_equal(ranked.targets[mine], expected)
        assert np.allclose(ranked.probabilities[mine], np.take_along_axis(probs, expected, axis=1), rtol=1e-10)


def test_a_head_survives_its_arrays_and_a_pickle_with_its_names_and_reference(corpus):
    head = fit_gated(corpus, GatedSpec(0, per_attribute=("position_prior",), prior_scale=2.0), max_iter=2).distribution
    arrays, meta = head.to_arrays()
    assert meta["attribute_names"] == list(NAMES) and meta["reference"]["sigma2"] == head.reference.sigma2
    data, attribute, _ = corpus
    block = block_of(data, attribute)
    for copy in (head_from_arrays("gated", arrays, meta), pickle.loads(pickle.dumps(head))):
        assert isinstance(copy, GatedHead) and copy.names == NAMES and copy.fixed_weights
        assert copy.score([block]) == head.score([block])
        assert np.array_equal(copy.reference.emission_table.to_dense(), head.reference.emission_table.to_dense())
    # A head file written before the names and the reference were kept reads without them.
    old = {k: v for k, v in arrays.items() if not k.startswith("reference.")}
    legacy = GatedHead.from_arrays(old, {"sigma2": meta["sigma2"], "fixed_weights": True})
    assert legacy.reference is None and legacy.names == ()
    with pytest.raises(ValueError, match="no attribute names"):
        legacy.attribute_names()


def test_the_predictor_writes_as_an_attribute_or_a_mix(corpus):
    head = fit_gated(corpus, GatedSpec(2, prior_scale=0.5), max_iter=1).distribution
    history = [1, 2, 3, 4, 5]
    alone = head.predictor(options={"attribute": "beta"})
    alone.extend(history)
    query = np.zeros(SHAPE[2])
    from dist_respattn.model.streaming import Predictor

    expected = Predictor(head.shared(1))
    expected.extend(history)
    assert np.allclose(alone.predict(query), expected.predict(query), rtol=1e-12)
    mixed = head.predictor(options={"mix": "alpha=1,gamma=3"})
    mixed.extend(history)
    assert np.isclose(mixed.predict(query).sum(), 1.0)
    for options, flag in (
        ({"attribute": "delta"}, "--attribute 'delta'"),
        ({"mix": "alpha=0"}, "--mix"),
        ({}, "--attribute NAME or --mix"),
    ):
        with pytest.raises(ValueError, match=flag):
            head.predictor(options=options)


def test_the_spec_round_trips_stages_the_shared_fit_and_names_flags():
    spec = GatedSpec(4, ("emission",), 0.5, None, 3, SingleHopSpec(sigma2=2.0), {"max_iter": 5})
    assert spec_from_json(spec.to_json()) == spec
    assert spec.stage_settings == {**STAGE_DEFAULTS, "max_iter": 5}
    shared, gated = spec.stages()
    assert (shared.spec, shared.directory) == (SingleHopSpec(sigma2=2.0), "shared")
    assert gated.spec is spec and gated.directory == "." and gated.settings["max_iter"] == 5
    assert spec.continues_from_init
    assert GatedSpec(2).advice(6) is not None and GatedSpec(2, ("emission",)).advice(6) is None
    with pytest.raises(ValueError, match="--position-buckets"):
        GatedSpec(2, shared=SingleHopSpec(position_buckets=4))
    base = SingleHopSpec(seed=0)
    assert spec_from_options({"attribute_factors": None}, base, None) is None
    made = spec_from_options(
        {"attribute_factors": 2, "per_attribute": ["emission"], "attribute_prior_scale": 0.5, "max_iter": 7}, base, None
    )
    assert made == GatedSpec(2, ("emission",), prior_scale=0.5, shared=base, stage_settings={"max_iter": 7})
    # A resumed fit keeps its own settings but for the options given again.
    resumed = spec_from_options({"attribute_factors": 2, "max_iter": 40}, SingleHopSpec(seed=9), made.to_json())
    assert (
        resumed.per_attribute == ("emission",) and resumed.shared == base and resumed.stage_settings["max_iter"] == 40
    )
    for options, flag in (
        ({"attribute_factors": -1}, "--attribute-factors"),
        ({"attribute_factors": 2, "attribute_prior_scale": 0.0}, "--attribute-prior-scale"),
        ({"attribute_factors": 2, "attribute_smoothing": -1.0}, "--attribute-smoothing"),
        ({"attribute_smoothing": 1.0}, "go with --attribute-factors"),
    ):
        with pytest.raises(ValueError, match=flag):
            spec_from_options(options, base, None)
    kind = head_kind("gated")
    assert kind.spec is GatedSpec and {o.flags[0] for o in kind.options} >= {
        "--attribute-factors",
        "--fold-in",
        "--mix",
    }


def test_the_shared_fits_prior_gives_the_strengths():
    from dist_respattn.model.emission.prior import EmissionPrior

    prior = EmissionPrior("continuation", np.full(8, 1 / 8), np.arange(10.0))
    meta = {"emission_prior": {"kind": "continuation"},
            "last_choice": {"sigma2": 1.0, "emission_strength": 2.0, "type_strength": 0.5}}  # fmt: skip
    strength, base = shared_strengths(meta, prior.to_arrays(), 10, 8)
    assert np.array_equal(strength, 2.0 + 0.5 * np.arange(10.0)) and np.array_equal(base, prior.base)
    strength, base = shared_strengths({}, {}, 10, 8)
    assert np.array_equal(strength, np.ones(10)) and np.array_equal(base, np.full(8, 1 / 8))


class RowsPasses:
    """The passes of a report over stores held in memory: ``{over: (data, attribute ids, names, documents)}``, each
    cut into two partitions whose values are added (blocks carry the store's own attribute ids)."""

    def __init__(self, stores):
        self.stores = stores
        self.said = []

    def run(self, request, *, over="train"):
        from dist_respattn.model.heads.base import combine

        if over not in self.stores:
            return None
        data, attribute, _names, documents = self.stores[over]
        n = attribute.shape[0]
        values = []
        for lo, hi in ((0, n // 3), (n // 3, n)):
            rows = EncodedRows(*(np.asarray(c)[lo:hi] for c in data), None, lo)
            block = Block(rows, None, attribute[lo:hi], None if documents is None else documents[lo:hi], 0, lo)
            values.append(request.map_partition(iter([block])))
        return combine(values)

    def attribute_names(self, over):
        if over not in self.stores:
            raise LookupError(over)
        return self.stores[over][2]

    def num_rows(self, over):
        return int(self.stores[over][1].shape[0])

    def baseline(self, name, train, validation, scored):
        from dist_respattn.baselines.ngram import fit_baselines

        return fit_baselines(train, validation=validation).score_one(name, scored).to_json()

    def say(self, line):
        self.said.append(line)

    def choose(self, candidates):
        raise AssertionError("a report chooses nothing")

    def plan_memory(self):
        pass


def test_the_report_scores_each_attribute_classifies_documents_and_folds_in_new_ones(corpus):
    from dist_respattn.model.fitting.holdout import HoldoutRule
    from dist_respattn.model.heads.gated.head import fold_in
    from dist_respattn.model.heads.gated.report import FOLD_IN_FRACTION

    head = fit_gated(corpus, GatedSpec(1, per_attribute=("emission",), prior_scale=0.5), max_iter=3).distribution
    data, attribute, shared = corpus
    # The scored store numbers its attributes its own way and has one the head never saw ("delta").
    names = ("gamma", "delta", "alpha", "beta")
    store_ids = np.array([2, 3, 0])[attribute]
    store_ids[1000:] = np.where(store_ids[1000:] == 0, 1, store_ids[1000:])
    documents = np.arange(attribute.shape[0]) // 50
    stores = {"train": (data, store_ids, names, documents), "training_store": (data, attribute, NAMES, None)}
    passes = RowsPasses(stores)
    options = {"classify_attributes": True, "fold_in": True, "fold_in_iterations": 4, "store": "memory://rows",
               "baselines": {"kneser_ney": {"perplexity": 9.5}}}  # fmt: skip
    report, lines = head.report(passes, options)
    head_ids = np.array([2, -1, 0, 1])[store_ids]
    for a, name in enumerate(names):
        mine = store_ids == a
        row = report["by_attribute"][name]
        assert row["rows"] == mine.sum() and row["known"] == (name != "delta")
        plain = gated_log_likelihood(GatedHead.from_shared(shared, 1), data, np.zeros(1500, np.int64), given_query=True)
        assert np.isclose(row["perplexity_shared"], np.exp(-plain[mine].mean()), rtol=1e-12)
        if name == "delta":
            assert row["perplexity"] is None
            continue
        lines_a = gated_log_likelihood(head, tuple(c[mine] for c in data), head_ids[mine], given_query=True)
        assert np.isclose(row["perplexity"], np.exp(-lines_a.mean()), rtol=1e-12)
        assert row["perplexity_kneser_ney"] is not None and row["perplexity_kneser_ney"] > 1.0
    known = head_ids >= 0
    assert report["model"]["rows"] == known.sum()
    assert np.isclose(report["model"]["perplexity_shared_same_rows"], np.exp(-plain[known].mean()), rtol=1e-12)
    assert report["shared"]["model"]["perplexity"] == pytest.approx(np.exp(-plain.mean()), rel=1e-9)
    # Every document whose attribute (its first row's, in this store) the head knows is classified.
    assert report["classified_documents"] == int(known[::50].sum())
    assert 0.0 <= report["attribute_accuracy"] <= 1.0 and len(report["documents"]) == documents.max() + 1
    # Folding in "delta": its weights are fold_in's on the training half of its rows.
    rule = HoldoutRule.for_rows(1500, FOLD_IN_FRACTION)
    train_w, held_w = rule.split_weights(0, 1500, None)
    delta = store_ids == 1
    rows_delta = tuple(c[delta & (train_w > 0)] for c in data)
    expected = fold_in(head, rows_delta, iterations=4)
    folded = report["fold_in"]["delta"]
    assert np.allclose(folded["weights"], expected, atol=2e-6)
    assert folded["rows_scored"] == (delta & (held_w > 0)).sum()
    assert lines[0] == f"memory://rows: {known.sum():,.0f} rows of known attributes"
    assert lines[1].endswith(", Kneser-Ney bigram 9.500 (all rows)")
    assert any(line.startswith("folded in delta: perplexity ") for line in lines)
    assert any(line.startswith("attribute classification: ") for line in lines)


def test_an_old_gated_checkpoint_reads_with_its_names_settings_and_last_scale(corpus):
    head = fit_gated(corpus, GatedSpec(2, prior_scale=0.5), max_iter=1).distribution
    arrays, _ = head.to_arrays()
    old_arrays = {k: v for k, v in arrays.items() if not k.startswith("reference.")}
    # meta.json as the gated fit wrote it before gated heads were a kind (engine/gated_checkpoint.py).
    settings = {
        "attribute_factors": 2, "per_attribute": [], "max_iter": 12, "tol": 1e-6, "patience": 3,
        "min_improvement": 1e-4, "weight_strength": 1.0, "prior_scale": None, "seed": 0, "fan_in": 8,
    }  # fmt: skip
    record = {
        "format": "dist_respattn.checkpoint", "version": 1, "kind": "gated",
        "model": {"sigma2": head.sigma2, "fixed_weights": False}, "attribute_names": list(NAMES),
        "settings": settings, "history": [{"iteration": 1, "prior_scale": 0.25, "heldout_perplexity": 7.0}],
    }  # fmt: skip
    old = head_from_arrays("gated", old_arrays, record)
    assert old.names == NAMES and old.reference is None
    data, attribute, shared = corpus
    block = block_of(data, attribute)
    assert old.with_parameters(reference=shared).score([block]) == head.score([block])
    spec = spec_from_json({"kind": "gated", **settings})
    assert spec == GatedSpec(2, stage_settings={"max_iter": 12, "patience": 3})
    trainer = spec.trainer(_context(shared))
    assert trainer.choice_from_json(record["history"][-1]) == PriorScale(0.25)


def _context(shared):
    from dist_respattn.model.heads.base import TrainerContext

    return TrainerContext(SHAPE, NAMES, shared)


def test_the_statistics_add_over_partitions(corpus):
    from dist_respattn.model.heads.base import combine

    data, attribute, shared = corpus
    head = fit_gated(corpus, GatedSpec(1, per_attribute=("emission",), prior_scale=0.5), max_iter=1).distribution
    trainer = GatedSpec(1, per_attribute=("emission",), prior_scale=0.5).trainer(_context(shared))
    attribute = attribute.copy()
    attribute[::9] = -1  # rows of an attribute the fit does not know count for nothing
    whole = trainer.statistics(head, iter([block_of(data, attribute)]))
    cuts = (0, 400, 401, 1500)
    parts = [
        trainer.statistics(head, iter([block_of(tuple(c[lo:hi] for c in data), attribute[lo:hi])]))
        for lo, hi in itertools.pairwise(cuts)
    ]
    summed = combine(parts)
    for name in whole._fields:
        assert np.allclose(getattr(summed, name), getattr(whole, name), rtol=1e-12, atol=1e-12), name
    assert whole.n_obs == (attribute >= 0).sum()


def test_fit_em_takes_the_steps_of_the_gated_fit_it_replaces_bit_for_bit(corpus):
    """The loop engine/gated_fit.py ran (support of the training rows, the shared emission on it, the start head, then
    per iteration the E-step, the M-step at every scale and the lowest held-out perplexity), written out by hand with
    the kernels it called: fit_em of a GatedSpec gives the same heads to the last bit."""
    from dist_respattn.model.emission.layouts import SparseEmissionCounts
    from dist_respattn.model.fitting.holdout import HoldoutRule
    from dist_respattn.model.heads.gated.head import gated_estep, gated_m_step
    from dist_respattn.model.heads.gated.kind import SCALE_STEP, shared_on_support, start_head

    data, attribute, shared = corpus
    spec = GatedSpec(2, per_attribute=("emission",), weight_strength=0.5, seed=4)
    iterations = 3
    result = fit_gated(corpus, spec, max_iter=iterations, tol=0.0)

    n = attribute.shape[0]
    train_w, held_w = HoldoutRule.for_rows(n).split_weights(0, n, None)
    s, t = SHAPE[0], SHAPE[3]
    live = train_w > 0
    keys = np.repeat(data[2][live].astype(np.int64), SHAPE[1]) * s + data[0][live].reshape(-1)
    support = SparseEmissionCounts.from_cells(keys, None, s, t).support
    strength, base = np.ones(s), np.full(t, 1.0 / t)
    center = shared_on_support(shared, support, base)
    head = start_head(shared, center, spec, NAMES)
    held = held_w > 0
    scale = None
    for _ in range(iterations):
        stats = gated_estep(head, data, attribute, train_w)
        scales = FIRST_SCALES if scale is None else (scale / SCALE_STEP, scale, scale * SCALE_STEP)
        best = None
        for k in scales:
            candidate = gated_m_step(stats, head, strength=k * strength, center=center, weight_strength=0.5)
            lines = gated_log_likelihood(candidate, data, attribute, given_query=True)
            log_lik = np.bincount(attribute[held], weights=held_w[held] * lines[held], minlength=3)
            weight = np.bincount(attribute[held], weights=held_w[held], minlength=3)
            perplexity = np.exp(-float(log_lik.sum()) / float(weight.sum()))
            if best is None or perplexity < best[0]:
                best = (perplexity, k, candidate)
        assert best is not None
        _, scale, head = best
    assert result.history[-1].hyperparameters == PriorScale(scale)
    mine, theirs = result.distribution.to_arrays()[0], head.to_arrays()[0]
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert np.array_equal(mine[name], theirs[name]), name
