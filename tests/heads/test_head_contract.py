"""The head protocol's contract, run once per kind of head (every case of :data:`tests.heads.cases.CASES`).

Through the protocol only (a kind's trainer, statistics, M-step, candidates and head, the kind registry): statistics
add over any split of the rows, ``combine`` sums in the order given, maximum-likelihood EM never lowers the training
likelihood, a head survives its arrays and pickle, the M-step's probability tables normalize, the head's scores,
top-K and streaming predictions equal an independent ``predict_proba``, and ``fit_em`` is deterministic.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pickle
from typing import Any

import numpy as np
import pytest

from dist_respattn.model.fitting.em import InProcessPasses, RowsInMemory, fit_em, run_head_em
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import (
    Head,
    HeadSpec,
    Trainer,
    TrainerContext,
    combine,
    head_from_arrays,
    head_kind,
    kind_names,
    spec_from_json,
)
from tests.heads.cases import CASES, KindCase, KindData, blocks_of, case_ids

#: Iterations of the fits the suites start from (enough to leave the start behind).
ITERATIONS = 3


# ----------------------------------------------------------------------------------------------- helpers


def leaves(value: Any, name: str = "") -> dict[str, np.ndarray]:
    """Every number a value holds (statistics, score totals...), by path: arrays, floats, and the fields of
    named tuples, dataclasses and plain objects, recursively (so two values of any kind can be compared)."""
    if value is None or isinstance(value, str):
        return {}
    if isinstance(value, (bool, int, float, np.number, np.ndarray)):
        return {name: np.asarray(value, dtype=np.float64)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        items: Any = zip(value._fields, value, strict=True)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    elif hasattr(value, "__dict__"):
        items = sorted(vars(value).items())
    elif hasattr(type(value), "__slots__"):
        items = ((slot, getattr(value, slot, None)) for slot in type(value).__slots__)
    else:
        raise TypeError(f"{name}: cannot compare a {type(value).__name__}")
    out: dict[str, np.ndarray] = {}
    for key, item in items:
        out.update(leaves(item, f"{name}.{key}"))
    return out


def assert_close(a: Any, b: Any, rtol: float) -> None:
    """Every leaf of ``a`` within ``rtol`` of ``b``'s, relative to the norm of ``b``'s leaf (sums in another order
    differ by rounding; a leaf near zero is compared to the size of the leaf, not entry by entry)."""
    left, right = leaves(a), leaves(b)
    assert left.keys() == right.keys()
    assert left, "nothing to compare"
    for key in left:
        assert left[key].shape == right[key].shape, key
        scale = max(float(np.linalg.norm(right[key])), 1e-300)
        assert float(np.linalg.norm(left[key] - right[key])) <= rtol * scale, key


def assert_identical(a: Any, b: Any) -> None:
    left, right = leaves(a), leaves(b)
    assert left.keys() == right.keys()
    for key in left:
        assert np.array_equal(left[key], right[key]), key


def assert_same_head(a: Head, b: Head) -> None:
    """Same kind, same arrays bit for bit, same JSON."""
    assert a.kind == b.kind
    arrays_a, meta_a = a.to_arrays()
    arrays_b, meta_b = b.to_arrays()
    assert arrays_a.keys() == arrays_b.keys()
    for key in arrays_a:
        assert np.array_equal(np.asarray(arrays_a[key]), np.asarray(arrays_b[key])), key
    assert meta_a == meta_b


@dataclasses.dataclass
class Fitted:
    """A case after a few EM iterations in process: its prepared trainer, the head, the statistics under it."""

    case: KindCase
    spec: HeadSpec
    data: KindData
    context: TrainerContext
    trainer: Trainer
    head: Head


def prepared(spec: HeadSpec, data: KindData, context: TrainerContext, iterations: int) -> tuple[Trainer, Any]:
    """A trainer of ``spec`` prepared on every row of ``data`` and the result of ``iterations`` EM iterations."""
    trainer = spec.trainer(context)
    rows = RowsInMemory(data.context, data.query, data.target, None, data.attribute)
    result = run_head_em(trainer, InProcessPasses(rows, None), start=context.init, max_iter=iterations, tol=0.0)
    return trainer, result


def fit_in_process(spec: HeadSpec, data: KindData, context: TrainerContext, iterations: int) -> Any:
    """``fit_em`` of ``spec`` on every row (no hold-out: the spec chooses nothing)."""
    return fit_em(
        data.arrays, spec, attributes=data.attribute, attribute_names=context.attribute_names, init=context.init,
        init_meta=context.init_meta, shape=context.shape, holdout=HoldoutRule(0.0), max_iter=iterations, tol=0.0,
    )  # fmt: skip


@pytest.fixture(scope="module", params=CASES, ids=case_ids)
def fitted(request: pytest.FixtureRequest) -> Fitted:
    case: KindCase = request.param
    spec, data, context = case.make()
    trainer, result = prepared(spec, data, context, ITERATIONS)
    return Fitted(case, spec, data, context, trainer, result.distribution)


def random_cuts(rng: np.random.Generator, n: int, parts: int) -> list[int]:
    """``0 = c_0 < c_1 < ... < c_parts = n``: a split of n rows into ``parts`` non-empty runs."""
    inner = np.sort(rng.choice(np.arange(1, n), size=parts - 1, replace=False))
    return [0, *map(int, inner), n]


def statistics_of(fitted: Fitted, start: int, stop: int) -> Any:
    return fitted.trainer.statistics(fitted.head, blocks_of(fitted.data, fitted.trainer.columns, start, stop))


# ----------------------------------------------------------------------------------------------- the suite


class TestHeadContract:
    """What every kind of head promises the engine."""

    # -- statistics --------------------------------------------------------------------------------------------

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_statistics_add_over_any_split_of_the_rows(self, fitted: Fitted, seed: int) -> None:
        n = fitted.data.num_rows
        whole = statistics_of(fitted, 0, n)
        assert whole.n_obs == n
        assert np.isfinite(whole.log_lik) and whole.log_lik < 0.0
        rng = np.random.default_rng(seed)
        cuts = random_cuts(rng, n, int(rng.integers(2, 7)))
        parts = [statistics_of(fitted, a, b) for a, b in itertools.pairwise(cuts)]
        total = combine(parts)
        assert_close(total, whole, 1e-12)
        assert total.n_obs == n
        assert total.log_lik == pytest.approx(whole.log_lik, rel=1e-12)

    def test_statistics_of_a_partition_of_several_blocks_are_those_of_one(self, fitted: Fitted) -> None:
        """A partition's blocks are visited in order and summed into one value."""
        n, columns = fitted.data.num_rows, fitted.trainer.columns
        cuts = random_cuts(np.random.default_rng(9), n, 4)
        blocks = (b for a, z in itertools.pairwise(cuts) for b in blocks_of(fitted.data, columns, a, z))
        assert_close(fitted.trainer.statistics(fitted.head, blocks), statistics_of(fitted, 0, n), 1e-12)

    def test_combine_adds_in_the_order_given_and_changes_no_operand(self, fitted: Fitted) -> None:
        cuts = random_cuts(np.random.default_rng(4), fitted.data.num_rows, 3)
        a, b, c = (statistics_of(fitted, x, y) for x, y in itertools.pairwise(cuts))
        before = [{k: v.copy() for k, v in leaves(s).items()} for s in (a, b, c)]
        left = combine([a, b, c])
        # The same additions in the same order give the same bits: ((a + b) + c).
        assert_identical(combine([combine([a, b]), c]), left)
        # Another grouping is the same sum to rounding.
        assert_close(combine([a, combine([b, c])]), left, 1e-12)
        assert_identical(combine([a]), a)
        for value, saved in zip((a, b, c), before, strict=True):
            assert_identical(leaves(value), saved)

    def test_a_pickled_trainer_and_head_give_the_same_statistics(self, fitted: Fitted) -> None:
        """What the workers compute: the trainer and the head travel pickled."""
        trainer, head = pickle.loads(pickle.dumps((fitted.trainer, fitted.head)))
        n = fitted.data.num_rows
        assert_identical(trainer.statistics(head, blocks_of(fitted.data, trainer.columns, 0, n)),
                         statistics_of(fitted, 0, n))  # fmt: skip

    def test_float32_queries_give_what_their_float64_values_give(self, fitted: Fitted) -> None:
        """A store may keep its queries, and a token stream its embedding table, as float32: the statistics, the
        scores and the held-out grid's totals are those of the same numbers in float64. (In CI's first pass this
        also builds every kind's float32 kernels once, before the suite's worker processes would each build them.)"""
        trainer, head, n = fitted.trainer, fitted.head, fitted.data.num_rows
        low = dataclasses.replace(fitted.data, query=fitted.data.query.astype(np.float32))
        high = dataclasses.replace(fitted.data, query=low.query.astype(np.float64))
        assert low.query.dtype == np.float32
        assert_close(trainer.statistics(head, blocks_of(low, trainer.columns, 0, n)),
                     trainer.statistics(head, blocks_of(high, trainer.columns, 0, n)), 1e-13)  # fmt: skip
        assert_close(head.score(blocks_of(low, head.columns)), head.score(blocks_of(high, head.columns)), 1e-13)
        candidates = trainer.m_step(statistics_of(fitted, 0, n), head)
        grid = candidates.grid(None)
        assert_close(grid.score(blocks_of(low, grid.columns)), grid.score(blocks_of(high, grid.columns)), 1e-13)

    # -- the M-step ------------------------------------------------------------------------------------------

    def test_the_m_steps_probability_tables_normalize(self, fitted: Fitted) -> None:
        stats = statistics_of(fitted, 0, fitted.data.num_rows)
        candidates = fitted.trainer.m_step(stats, fitted.head)
        for head in (fitted.head, candidates.model(candidates.default())):
            tables = fitted.case.tables(head)
            assert tables
            for name, table in tables.items():
                assert table.ndim == 2 and table.size, name
                assert np.all(table >= 0.0), name
                np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=0, atol=1e-12, err_msg=name)

    def test_maximum_likelihood_em_never_lowers_the_likelihood(self, fitted: Fitted) -> None:
        ml = fitted.case.ml_spec(fitted.spec)
        _, result = prepared(ml, fitted.data, fitted.context, 12)
        history = result.log_likelihoods
        assert len(history) == 12
        for before, after in itertools.pairwise(history):
            assert after >= before - 1e-12 * abs(before), history
        # EM moved: the check is not over a fixed point.
        assert history[-1] > history[0]

    # -- persistence -----------------------------------------------------------------------------------------

    def test_the_head_round_trips_through_arrays_and_the_kind_registry(self, fitted: Fitted) -> None:
        head = fitted.head
        assert head.kind in kind_names()
        assert head_kind(head.kind).head is type(head)
        arrays, meta = head.to_arrays()
        assert all(isinstance(a, np.ndarray) for a in arrays.values())
        meta = json.loads(json.dumps(meta))  # JSON, never pickles
        again = head_from_arrays(head.kind, arrays, meta)
        assert type(again) is type(head)
        assert_same_head(again, head)
        assert again.shape == head.shape == fitted.context.shape
        assert again.num_parameters() == head.num_parameters()
        self.assert_same_scores(again, head, fitted)

    def test_the_head_round_trips_through_pickle(self, fitted: Fitted) -> None:
        head = fitted.head
        head.score(blocks_of(fitted.data, head.columns))  # caches of a head that has scored are not shipped wrong
        again = pickle.loads(pickle.dumps(head))
        assert_same_head(again, head)
        self.assert_same_scores(again, head, fitted)

    @staticmethod
    def assert_same_scores(a: Head, b: Head, fitted: Fitted) -> None:
        assert_identical(a.score(blocks_of(fitted.data, a.columns)), b.score(blocks_of(fitted.data, b.columns)))

    def test_the_spec_round_trips_through_json(self, fitted: Fitted) -> None:
        spec = fitted.spec
        data = json.loads(json.dumps(spec.to_json()))
        assert data["kind"] == spec.kind
        assert head_kind(spec.kind).spec is type(spec)
        again = spec_from_json(data)
        assert type(again) is type(spec)
        assert again.to_json() == spec.to_json()
        assert again.differences(spec) == []

    # -- scoring and prediction ------------------------------------------------------------------------------

    def reference(self, fitted: Fitted) -> np.ndarray:
        data = fitted.data
        probs = fitted.case.reference_predict_proba(fitted.head, data.context, data.query, data.attribute)
        assert probs.shape == (data.num_rows, fitted.head.num_targets)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        return probs

    def test_scores_equal_predict_proba(self, fitted: Fitted) -> None:
        data, head = fitted.data, fitted.head
        totals = head.score(blocks_of(data, head.columns))
        probs = self.reference(fitted)
        expected = float(np.sum(np.log(probs[np.arange(data.num_rows), data.target])))
        assert totals.weight == data.num_rows
        assert totals.target_log_prob == pytest.approx(expected, rel=1e-9)
        # The joint likelihood is the E-step's: scoring and fitting read the rows alike (a kind that leaves each
        # training row out of the rows explaining it, through the fit that does not).
        trainer = fitted.trainer
        if fitted.case.scoring_spec is not None:
            trainer = fitted.case.scoring_spec(fitted.spec).trainer(fitted.context)
        stats = trainer.statistics(head, blocks_of(data, trainer.columns))
        assert totals.log_lik == pytest.approx(stats.log_lik, rel=1e-9)

    def test_top_k_equals_the_order_of_predict_proba(self, fitted: Fitted) -> None:
        data, head, k = fitted.data, fitted.head, 4
        block = next(blocks_of(data, head.columns))
        if not fitted.case.batch_top_k:
            with pytest.raises(ValueError, match="one history at a time"):
                head.top_k(block, k)
            return
        top = head.top_k(block, k)
        probs = self.reference(fitted)
        rows = np.arange(data.num_rows)[:, None]
        np.testing.assert_allclose(top.probabilities, probs[rows, top.targets], rtol=1e-9, atol=1e-15)
        expected = np.sort(probs, axis=1)[:, ::-1][:, :k]
        np.testing.assert_allclose(top.probabilities, expected, rtol=1e-9, atol=1e-15)
        # Ties aside, the targets themselves: rows whose k-th and (k+1)-th probabilities are well apart.
        ordered = np.sort(probs, axis=1)[:, ::-1]
        gaps = np.diff(ordered[:, : k + 1], axis=1)
        clear = np.all(np.abs(gaps) > 1e-9, axis=1)
        assert clear.sum() > data.num_rows // 2
        np.testing.assert_array_equal(top.targets[clear], np.argsort(-probs, axis=1, kind="stable")[clear, :k])

    def test_block_proba_equals_predict_proba(self, fitted: Fitted) -> None:
        """What ``evaluate --ranking`` ranks: every target's probability for each row of a block."""
        data, head = fitted.data, fitted.head
        if type(head).block_proba is Head.block_proba:
            pytest.skip(f"a {head.kind} head gives no block_proba (evaluate --ranking refuses it)")
        block = next(blocks_of(data, head.columns, 3, 40))  # a few rows, not from the first: starts are kept
        got = head.block_proba(block)
        assert got.shape == (37, head.num_targets)
        np.testing.assert_allclose(got, self.reference(fitted)[3:40], rtol=1e-9, atol=1e-15)

    def test_the_streaming_predictor_equals_predict_proba_on_a_full_window(self, fitted: Fitted) -> None:
        data, head = fitted.data, fitted.head
        probs = self.reference(fitted)
        for row in (0, 1, data.num_rows // 2, data.num_rows - 1):
            options = fitted.case.predictor_options(data, row) if fitted.case.predictor_options else None
            predictor = head.predictor(options=options)
            # A longer history first: the state keeps the last N tokens only.
            predictor.extend(data.context[(row + 1) % data.num_rows].tolist())
            predictor.extend(data.context[row].tolist())
            np.testing.assert_allclose(predictor.predict(data.query[row]), probs[row], rtol=1e-9, atol=1e-15)

    def test_the_streaming_state_is_bounded_by_the_model(self, fitted: Fitted) -> None:
        """``state_size`` (the protocol's property) does not grow with the history."""
        data, head = fitted.data, fitted.head
        options = fitted.case.predictor_options(data, 0) if fitted.case.predictor_options else None
        predictor = head.predictor(options=options)
        sizes = []
        for row in range(20):
            predictor.extend(data.context[row].tolist())
            sizes.append(predictor.state_size)
        assert 0 < max(sizes) <= head.context_length

    def test_fit_em_holds_out_rows_only_for_a_choice(self, fitted: Fitted) -> None:
        """A fit with nothing to choose on held-out rows trains on every row, as the engine's fit does."""
        data, context = fitted.data, fitted.context
        assert not fitted.spec.trainer(context).searches()
        result = fit_em(
            data.arrays, fitted.spec, attributes=data.attribute, attribute_names=context.attribute_names,
            init=context.init, init_meta=context.init_meta, shape=context.shape, max_iter=1,
        )  # fmt: skip
        assert result.history[0].n_obs == data.num_rows

    # -- determinism -----------------------------------------------------------------------------------------

    def test_fit_em_is_deterministic(self, fitted: Fitted) -> None:
        first = fit_in_process(fitted.spec, fitted.data, fitted.context, ITERATIONS)
        second = fit_in_process(fitted.spec, fitted.data, fitted.context, ITERATIONS)
        assert_same_head(first.distribution, second.distribution)
        assert first.log_likelihoods == second.log_likelihoods
        assert len(first.log_likelihoods) == ITERATIONS
        # fit_em is the loop the suite's own fits ran.
        assert_same_head(first.distribution, fitted.head)
