"""The chain of hops and the conjunction head (asked with ``choose_single``) choose their single head's open
hyperparameters on held-out rows.

Every point of a grid is scored as the head it names scores the same rows (to 1e-10), the choice is the best point,
a value given stays fixed, and the choices round-trip through their JSON (a checkpoint's, today's and older).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np
import pytest

from dist_respattn.model.fitting.fixed import OneCandidate
from dist_respattn.model.fitting.selection import DEFAULT_SEARCH, Hyperparameters
from dist_respattn.model.heads.base import Block, TrainerContext
from dist_respattn.model.heads.conj import ConjSpec
from dist_respattn.model.heads.conj.kind import ConjCandidates, ConjChoice, ConjGrid
from dist_respattn.model.heads.hops import HopsSpec
from dist_respattn.model.heads.hops.grid import HopsCandidates, HopsGrid
from dist_respattn.model.heads.hops.kind import HopsChoice
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.rows import WindowRows
from tests.heads.cases import KindData, blocks_of, copy_data
from tests.heads.test_head_contract import prepared
from tests.model.test_copy import corpus, windows_of

#: Rows fitted on (the rest of a case's rows are not read).
TRAIN = 400


def heldout_block(shape: tuple[int, int, int, int], seed: int) -> Block:
    """Weighted window rows of a few documents (short windows at their starts), some of weight 0."""
    rng = np.random.default_rng(seed)
    s, n_pos, d, _ = shape
    tokens, starts = corpus(rng, 160, s, 3)
    rows: WindowRows = windows_of(tokens, starts, n_pos, rng.normal(size=(s, d)))
    weights = rng.random(rows.num_rows)
    weights[::7] = 0.0
    return Block(rows, weights)


def m_step_of(spec: Any, data: KindData, context: TrainerContext) -> tuple[Any, Any, Any]:
    """``(trainer, head, candidates)``: two EM iterations on the first :data:`TRAIN` rows (no held-out rows: the
    defaults), then the M-step of the statistics of those rows under the head."""
    train = KindData(data.context[:TRAIN], data.query[:TRAIN], data.target[:TRAIN])
    trainer, result = prepared(spec, train, context, 2)
    head = result.distribution
    statistics = trainer.statistics(head, blocks_of(train, trainer.columns))
    return trainer, head, trainer.m_step(statistics, head)


def assert_scores_equal(totals: Any, theirs: Any) -> None:
    assert totals.weight == pytest.approx(theirs.weight, rel=1e-12)
    assert abs(totals.log_lik - theirs.log_lik) <= 1e-10 * max(1.0, abs(theirs.log_lik))
    assert abs(totals.target_log_prob - theirs.target_log_prob) <= 1e-10 * max(1.0, abs(theirs.target_log_prob))


# ----------------------------------------------------------------------------------------------- chains of hops


def hops_case(sparse: bool, **given: Any) -> tuple[HopsSpec, KindData, TrainerContext]:
    shape = (12, 6, 2, 12) if sparse else (10, 5, 2, 10)
    options: dict[str, Any] = {"emission_layout": "sparse", "position_buckets": 3} if sparse else {}
    single = SingleHopSpec(emission_layout="dense", **given) if not sparse else SingleHopSpec(**options, **given)
    return HopsSpec(single, hops=2 if not sparse else 3), copy_data(600, shape, seed=31), TrainerContext(shape)


@pytest.mark.parametrize("sparse", [False, True])
def test_the_chain_grid_scores_every_point_as_its_head_does_and_chooses_the_best(sparse: bool) -> None:
    """Before any choice: the gate variances near the chain's own (3) by every strength pair of the single head's
    grid (60); after one, the neighbourhood of the choice. Each point's totals are its own head's scores."""
    spec, data, context = hops_case(sparse)
    trainer, head, candidates = m_step_of(spec, data, context)
    assert trainer.searches() and isinstance(candidates, HopsCandidates) and candidates.searches()
    block = heldout_block(context.shape, 5)
    for around in (None, Hyperparameters(head.single.sigma2 * 3.0, 3.0, 0.5)):
        grid = candidates.grid(around)
        assert isinstance(grid, HopsGrid)
        g1, g2, g3 = grid.table.shape
        if around is None:
            assert (g2, g3) == (len(DEFAULT_SEARCH.emission_strengths), len(DEFAULT_SEARCH.type_strengths))
        else:
            assert grid.table.emission_strengths.tolist() == [1.0, 3.0, 10.0]
            assert grid.table.type_strengths.tolist() == [0.25, 0.5, 1.0]
        assert 2 <= g1 <= 3  # a step of the gate variance: at most 3 forward passes
        totals = grid.score([block])
        best, best_value = None, -math.inf
        for index in itertools.product(range(g1), range(g2), range(g3)):
            hp = grid.table.hyperparameters(index)
            theirs = candidates.model(hp).score([block], accuracy=False)
            mine = type(theirs)(totals.weight, totals.log_lik[index], totals.target_log_prob[index])
            assert_scores_equal(mine, theirs)
            if theirs.target_log_prob > best_value:
                best, best_value = hp, theirs.target_log_prob
        choice, heldout = candidates.choose(grid, totals)
        assert choice == best
        assert heldout is not None and heldout["target_log_prob"] == pytest.approx(best_value / totals.weight)
        assert candidates.model(choice).single.sigma2 == choice.sigma2


def test_the_chain_keeps_the_values_given_fixed() -> None:
    """``--sigma2`` given: the gate variance is not searched (one forward pass), the strengths are; all three given:
    one candidate, today's, recording all three."""
    spec, data, context = hops_case(False, sigma2=0.7)
    _, _, candidates = m_step_of(spec, data, context)
    grid = candidates.grid(None)
    assert grid.table.sigma2.tolist() == [0.7] and grid.table.shape[1:] == (10, 6)
    choice, _ = candidates.choose(grid, grid.score([heldout_block(context.shape, 6)]))
    assert choice.sigma2 == 0.7
    spec, data, context = hops_case(False, sigma2=0.7, emission_strength=3.0, type_strength=0.5)
    trainer, _, candidates = m_step_of(spec, data, context)
    assert not trainer.searches() and isinstance(candidates, OneCandidate)
    assert candidates.default() == HopsChoice(0.7, 3.0, 0.5)
    assert candidates.default().to_json() == {"sigma2": 0.7, "emission_strength": 3.0, "type_strength": 0.5}
    assert "(fixed)" in candidates.default().describe()


def test_the_chain_reads_its_choices_back_and_older_ones() -> None:
    spec, data, context = hops_case(False)
    trainer, _, candidates = m_step_of(spec, data, context)
    chosen = Hyperparameters(0.5, 3.0, 1.0)
    assert trainer.choice_from_json(chosen.to_json()) == chosen
    # A chain fitted before it chose its strengths recorded the gate variance alone: its search centres there.
    old = trainer.choice_from_json({"sigma2": 2.0})
    assert old == HopsChoice(2.0)
    grid = candidates.grid(old)
    assert grid.table.shape[1:] == (3, 3)  # the strengths near the defaults (1, 1)
    assert grid.table.emission_strengths.tolist() == [0.3, 1.0, 3.0]


# ----------------------------------------------------------------------------------------------- conjunctions


def conj_case(order: int, **given: Any) -> tuple[ConjSpec, KindData, TrainerContext]:
    shape = (8, 4, 2, 8)
    single = SingleHopSpec(emission_layout="dense" if order == 2 else "sparse", **given)
    spec = ConjSpec(single, depth=2, order=order, strength=None if order == 2 else 1.0, type_strength=0.5,
                    discount=0.5, choose_single=True)  # fmt: skip
    return spec, copy_data(600, shape, 23), TrainerContext(shape)


def test_the_conj_head_chooses_its_single_heads_values_only_when_asked() -> None:
    """By default the single head's open values are fixed (1 when not given): today's grid over one single head,
    and the spec says so in its JSON; ``choose_single`` opens the search and is read back."""
    spec, data, context = conj_case(2)
    fixed = dataclasses.replace(spec, choose_single=False)
    _, head, candidates = m_step_of(fixed, data, context)
    assert candidates.single is None or not candidates.single.searches()
    grid = candidates.grid(None)
    assert grid.singles == () and grid.single is None
    assert head.single.sigma2 == 1.0
    assert ConjSpec.from_json(fixed.to_json()) == fixed and ConjSpec.from_json(spec.to_json()) == spec
    older = {k: v for k, v in spec.to_json().items() if k != "choose_single"}  # a spec recorded before
    assert ConjSpec.from_json(older).choose_single is False


@pytest.mark.parametrize("order", [2, 3])
def test_the_conj_grid_scores_every_point_over_its_single_head_and_chooses_the_best(order: int) -> None:
    """The pair (and triple) points over the last choice's single head, and the last pair point over each single
    head one step from it on one axis: each point's totals are those of the head it names."""
    spec, data, context = conj_case(order)
    trainer, head, candidates = m_step_of(spec, data, context)
    assert trainer.searches() and isinstance(candidates, ConjCandidates) and candidates.single is not None
    block = heldout_block(context.shape, 7)
    last = ConjChoice(0.5, 0.5, 0.5, *((2.0, 0.5, 0.0) if order == 3 else ()),
                      single=Hyperparameters(head.single.sigma2, 3.0, 1.0))  # fmt: skip
    for around in (None, Hyperparameters(head.single.sigma2, 0.3, 0.25), last):
        grid = candidates.grid(around)
        assert isinstance(grid, ConjGrid) and len(grid.singles) == len(grid.points)
        current = grid.singles[0]
        steps = set(grid.singles) - {current}
        # one step on each of the three axes, both ways (none below the smallest type strength, 0)
        assert 5 <= len(steps) <= 6
        for step in steps:
            assert sum(getattr(step, n) != getattr(current, n) for n in ("sigma2", "emission_strength",
                                                                        "type_strength")) == 1  # fmt: skip
        if isinstance(around, ConjChoice):
            assert current == around.single
        totals = grid.score([block])
        values = []
        for point, hp, mine in zip(grid.points, grid.singles, totals.totals, strict=True):
            triple = point[3:] if len(point) == 6 else (math.inf, 0.0, 0.0)
            choice = ConjChoice(*point[:3], *triple, single=hp)
            theirs = candidates.model(choice).score([block], accuracy=False)
            assert_scores_equal(mine, theirs)
            values.append(theirs.target_log_prob)
        choice, heldout = candidates.choose(grid, totals)
        best = int(np.argmax(values))
        assert (
            choice.single == grid.singles[best]
            and (*choice.pair, *choice.triple)[: len(grid.points[best])] == (grid.points[best])
        )
        assert heldout is not None and heldout["target_log_prob"] == pytest.approx(values[best] / totals.weight)
        assert candidates.model(choice).single.sigma2 == choice.single.sigma2


def test_the_conj_head_keeps_the_values_given_fixed() -> None:
    spec, data, context = conj_case(2, sigma2=0.7, type_strength=0.5)
    _, _, candidates = m_step_of(spec, data, context)
    grid = candidates.grid(None)
    assert {hp.sigma2 for hp in grid.singles} == {0.7} and {hp.type_strength for hp in grid.singles} == {0.5}
    assert len(set(grid.singles)) == 3  # the emission strength a step either way
    spec, data, context = conj_case(2, sigma2=0.7, emission_strength=3.0, type_strength=0.5)
    _, _, candidates = m_step_of(spec, data, context)
    assert candidates.single is None or not candidates.single.searches()
    grid = candidates.grid(None)
    assert grid.singles == () and grid.single is None  # today's grid, over the one single head
    choice, _ = candidates.choose(grid, grid.score([heldout_block(context.shape, 8)]))
    assert choice.single is None and "sigma2" not in choice.to_json()


def test_the_conj_head_reads_its_choices_back_and_older_ones() -> None:
    spec, data, context = conj_case(3)
    trainer, _, candidates = m_step_of(spec, data, context)
    choice = ConjChoice(0.5, 1.0, 0.0, 2.0, 0.5, 0.8, Hyperparameters(0.25, 3.0, 1.0))
    data_json = choice.to_json()
    assert data_json["sigma2"] == 0.25 and data_json["emission_strength"] == 3.0
    assert "sigma2 0.25, emission prior strength 3 + 1 per successor type; pair strength" in choice.describe()
    assert trainer.choice_from_json(data_json) == choice
    # Recorded before the single head's were chosen: no single choice, so the search starts at its centre.
    old = {k: v for k, v in data_json.items() if k.startswith("conj_")}
    read = trainer.choice_from_json(old)
    assert read == ConjChoice(0.5, 1.0, 0.0, 2.0, 0.5, 0.8)
    assert candidates.grid(read).singles[0] == candidates.centre
    # A start's own choice (an iteration-0 checkpoint's) is the single head's alone.
    assert trainer.choice_from_json(Hyperparameters(0.25, 3.0, 1.0).to_json()) == Hyperparameters(0.25, 3.0, 1.0)


def test_the_conj_search_starts_at_the_choice_of_the_fit_it_starts_from() -> None:
    spec, data, context = conj_case(2)
    context = TrainerContext(context.shape, init_meta={"hyperparameters": {"sigma2": 9.0, "emission_strength": 0.01,
                                                                           "type_strength": 2.0}})  # fmt: skip
    _, head, candidates = m_step_of(spec, data, context)
    assert candidates.centre == Hyperparameters(head.single.sigma2, 0.01, 2.0)
