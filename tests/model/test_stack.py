"""The stack of fitted heads: its per-row densities are its components' own, its gate's EM climbs the likelihood it
is fitted on (either mode), a one-hot gate is that component, and its predictions are distributions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.heads.base import Columns, TrainerContext
from dist_respattn.model.heads.stack import StackHead, StackSpec
from dist_respattn.model.heads.stack.head import component_view
from dist_respattn.model.heads.stack.kind import StackChoice
from dist_respattn.model.rows import WindowRows
from tests.heads.cases import CASES, KindData, blocks_of, copy_data, stack_components

SHAPE = (10, 5, 2, 10)


@pytest.fixture(scope="module")
def fitted() -> tuple[tuple, KindData, KindData]:
    """Three components (conj N = 2, copy N = 4, single N = 5) fitted on one stream's rows, and other rows of it."""
    data = copy_data(900, SHAPE, seed=31)
    train = KindData(data.context[:600], data.query[:600], data.target[:600])
    held = KindData(data.context[600:], data.query[600:], data.target[600:])
    return stack_components(train, SHAPE), train, held


def window_rows(data: KindData) -> WindowRows:
    return next(blocks_of(data, Columns(windows=True))).rows


def last_columns(data: KindData, n: int) -> KindData:
    return KindData(np.ascontiguousarray(data.context[:, data.context.shape[1] - n :]), data.query, data.target)


def test_the_per_row_densities_sum_to_each_components_own_scores(fitted) -> None:
    components, _, held = fitted
    stack = StackHead(np.full(3, 1 / 3), components)
    densities = stack.densities(window_rows(held))
    for k, head in enumerate(components):
        own = head.score(blocks_of(last_columns(held, head.context_length), head.columns))
        assert densities[:, k, :].sum() == pytest.approx(own.log_lik, rel=1e-12)
        assert densities[:, k, 1].sum() == pytest.approx(own.target_log_prob, rel=1e-12)


def test_a_chain_of_hops_gives_its_per_row_densities_too() -> None:
    case = next(c for c in CASES if c.name == "hops-free-dense")
    spec, data, context = case.make()
    head = fit_em(data.arrays, spec, shape=context.shape, max_iter=2, tol=0.0).distribution
    densities = component_view(head).row_densities(window_rows(data))  # type: ignore[attr-defined]
    own = head.score(blocks_of(data, head.columns))
    assert densities.sum() == pytest.approx(own.log_lik, rel=1e-12)
    assert densities[:, 1].sum() == pytest.approx(own.target_log_prob, rel=1e-12)


@pytest.mark.parametrize("mode", ["joint", "target"])
def test_the_gates_em_never_lowers_the_likelihood_it_fits_and_beats_every_component(fitted, mode: str) -> None:
    components, _, held = fitted
    trainer = StackSpec((), mode, components).trainer(TrainerContext(SHAPE))
    head = StackHead(np.full(3, 1 / 3), components, mode)
    objective = []
    for _ in range(300):  # the optimum may lie at a corner of the simplex, which EM nears slowly
        stats = trainer.statistics(head, blocks_of(held, trainer.columns))
        objective.append(stats.log_lik if mode == "joint" else stats.target_log_prob)
        head = trainer.m_step(stats, head).model(StackChoice(1.0))  # EM's own step
    for before, after in itertools.pairwise(objective):
        assert after >= before - 1e-12 * abs(before), objective
    assert objective[-1] > objective[0]
    for k in range(3):
        alone = trainer.statistics(head.with_gate(np.eye(3)[k]), blocks_of(held, trainer.columns))
        best_alone = alone.log_lik if mode == "joint" else alone.target_log_prob
        assert objective[-1] >= best_alone - 1e-7 * abs(best_alone)

    # The M-step's steps past EM's, kept by the held-out pass as a fit keeps them: never worse than EM's own step,
    # and at EM's 300-iteration optimum within 20 (Newton's steps among them).
    fast = StackHead(np.full(3, 1 / 3), components, mode)
    climbed = []
    for _ in range(20):
        candidates = trainer.m_step(trainer.statistics(fast, blocks_of(held, trainer.columns)), fast)
        grid = candidates.grid(None)
        scores = grid.score(blocks_of(held, grid.columns))
        em_step = candidates.model(StackChoice(1.0))
        em_stats = trainer.statistics(em_step, blocks_of(held, trainer.columns))
        assert scores.totals[0].target_log_prob == pytest.approx(em_stats.target_log_prob, rel=1e-12)
        choice, _ = candidates.choose(grid, scores)
        fast = candidates.model(choice)
        stats = trainer.statistics(fast, blocks_of(held, trainer.columns))
        climbed.append(stats.log_lik if mode == "joint" else stats.target_log_prob)
        em_value = em_stats.log_lik if mode == "joint" else em_stats.target_log_prob
        assert climbed[-1] >= em_value - 1e-12 * abs(em_value)
    assert climbed[-1] >= objective[-1] - 1e-7 * abs(objective[-1]), (climbed[-1], objective[-1])


@pytest.mark.parametrize("mode", ["joint", "target"])
def test_a_one_hot_gate_scores_as_its_component(fitted, mode: str) -> None:
    components, _, held = fitted
    for k, head in enumerate(components):
        stack = StackHead(np.eye(3)[k], components, mode)
        ours = stack.score(blocks_of(held, stack.columns))
        theirs = head.score(blocks_of(last_columns(held, head.context_length), head.columns))
        assert ours.weight == theirs.weight
        assert ours.log_lik == pytest.approx(theirs.log_lik, rel=1e-12)
        assert ours.target_log_prob == pytest.approx(theirs.target_log_prob, rel=1e-12)
        assert ours.correct == theirs.correct


@pytest.mark.parametrize("mode", ["joint", "target"])
def test_predictions_are_distributions_and_the_stream_equals_them_on_short_histories(fitted, mode: str) -> None:
    components, _, held = fitted
    stack = StackHead([0.5, 0.3, 0.2], components, mode)
    rows = window_rows(held)
    probs, attention = stack.predict_rows(rows)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(attention.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # Exactly the row's likelihood of its target, whichever way it is computed.
    np.testing.assert_allclose(np.log(probs[np.arange(rows.num_rows), rows.target]), stack.row_densities(rows)[:, 1],
                               rtol=1e-9)  # fmt: skip
    tokens = held.context[7]
    for length in (1, 3, 5):  # histories shorter than every window, then than some
        predictor = stack.predictor()
        predictor.extend(tokens[:length].tolist())
        ends = np.array([length])
        short = WindowRows(tokens[:length].astype(np.int64), np.array([0]), ends, np.zeros(1, dtype=np.int64),
                           held.query[7:8], np.zeros(1, dtype=np.int64), None, 0)  # fmt: skip
        np.testing.assert_allclose(predictor.predict(held.query[7]), stack.predict_rows(short)[0][0], rtol=1e-9,
                                   atol=1e-15)  # fmt: skip


def test_a_stack_refuses_a_component_window_longer_than_its_rows_and_a_kind_it_cannot_read(fitted) -> None:
    components, _, _ = fitted
    too_long = (
        r"--stack-from c: its window N = 5 is longer than the training rows' N = 4: read the store with --context 5"
    )
    with pytest.raises(ValueError, match=too_long):
        StackSpec(("a", "b", "c"), "joint", components).trainer(TrainerContext((10, 4, 2, 10)))
    stack = StackHead([0.5, 0.3, 0.2], components)
    with pytest.raises(ValueError, match=r"a stack reads single, copy, conj and hops heads .* not a stack head"):
        StackHead([0.5, 0.5], [components[0], stack])


def test_a_resumed_stack_starts_from_its_checkpoint_without_its_component_directories(fitted) -> None:
    """A resumed fit loads no ``--stack-from`` directory (they may be gone): its checkpoint's head is the start."""
    components, _, held = fitted
    head = StackHead([0.5, 0.3, 0.2], components)
    spec = StackSpec(("gone-a", "gone-b", "gone-c"), "target")
    trainer = spec.trainer(TrainerContext(SHAPE, saved_meta={"iteration": 2}))
    trainer.check_start(head, resumed=True)
    assert trainer.prepare(head, resumed=True, passes=None) is head  # type: ignore[arg-type]
    stats = trainer.statistics(head, blocks_of(held, trainer.columns))
    assert stats.n_obs == held.num_rows
    with pytest.raises(ValueError, match="a stack fit needs its components: give --stack-from MODEL_A,MODEL_B"):
        spec.trainer(TrainerContext(SHAPE))


def test_only_a_gate_that_keeps_one_component_alone_is_warned_of(fitted) -> None:
    components, _, _ = fitted
    trainer = StackSpec((), "target", components).trainer(TrainerContext(SHAPE))
    assert trainer.warnings(StackHead(np.array([0.6, 0.4, 0.0]), components, "target")) == []
    (alone,) = trainer.warnings(StackHead(np.array([0.0, 1.0, 0.0]), components, "target"))
    assert alone.startswith("the stack's gate keeps component 1 (") and "alone" in alone
