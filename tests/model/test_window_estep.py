"""The free-prior E-step on token windows (each query read from the embedding table by id) against the same rows
encoded (each query a copied (D,) row): the same statistics to the bit, on real rows of a token-stream store."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionEstimator
from dist_respattn.engine.worker_tasks import RowSelection, statistics_task
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import Columns
from dist_respattn.model.heads.single_hop.kind import SingleHopTrainer
from dist_respattn.model.kernels import per_position
from dist_respattn.model.rows import WindowRows
from dist_respattn.store import WriteOptions, open_store
from dist_respattn.store.ingest.text import iter_text_files
from dist_respattn.store.ingest.to_stream import write_stream_text
from tests.stdlib_packages import package_corpus


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    """A token-stream store of Python source (standard-library packages, 400 words, N = 8, D = 16, small chunks:
    several blocks a partition), and a model after one EM step from a uniform start, in both emission layouts."""
    base = tmp_path_factory.mktemp("window-estep")
    files = iter_text_files([package_corpus(base / "corpus")])
    options = WriteOptions(chunk_rows=4096, partition_rows=16384)
    store = write_stream_text(base / "train.zarr", files, 8, vocab_size=400, dim=16, options=options)
    data = store.read_rows(0, store.num_rows).encoded
    s = store.schema
    shape = (s.num_symbols, s.context_length, s.query_dim, s.num_targets)
    pairs = PairCounts.from_rows(data[0][:, -1], data[2], None, num_symbols=shape[0], num_targets=shape[3])
    estimator = ResponsibilityAttentionEstimator(*shape, emission_prior=EmissionPrior.from_pairs(pairs, "continuation"))
    models = {}
    for layout in ("sparse", "dense"):
        accumulator = estimator.accumulator_factory(layout=layout).make()
        accumulator.seq_initialize_uniform(data, None)
        models[layout] = estimator.candidates(accumulator.value()).model()
    return store, estimator, models


def _counts(value) -> np.ndarray:
    counts = value.emission_count
    return counts.counts if hasattr(counts, "counts") else counts.count_ts


def _same_bits(a, b) -> bool:
    return (
        np.array_equal(a.key_sum, b.key_sum)
        and np.array_equal(a.key_mass, b.key_mass)
        and np.array_equal(a.position_count, b.position_count)
        and np.array_equal(_counts(a), _counts(b))
        and (a.query_sq, a.n_obs, a.log_lik) == (b.query_sq, b.n_obs, b.log_lik)
    )


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_windows_give_the_encoded_rows_statistics_to_the_bit(real_store, layout):
    store, estimator, models = real_store
    model = models[layout]
    rule = HoldoutRule.for_rows(store.num_rows)
    selection = RowSelection(rule, "train")
    factory = estimator.accumulator_factory(layout=layout)
    encoded, windows = factory.make_for(model), factory.make_for(model)
    blocks = store.block_ranges(0)
    assert len(blocks) > 1
    for begin, end in blocks:
        rows = store.read_rows(begin, end)
        weights = selection.weights(rows)
        encoded.seq_update(rows.encoded, weights, model, checked=True)
        window = store.read_windows(begin, end)
        assert isinstance(window, WindowRows) and window.query_table.shape == (store.schema.num_symbols, 16)
        windows.seq_update_windows(window._replace(weight=weights), model)
    assert _same_bits(encoded.value(), windows.value())


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_the_kernel_on_windows_in_small_blocks_and_grouped(real_store, layout):
    store, _, models = real_store
    model = models[layout]
    params = model.kernel_parameters
    rows = store.read_rows(0, store.num_rows)
    window = store.read_windows(0, store.num_rows)
    weights = np.random.default_rng(0).uniform(0.0, 2.0, rows.num_rows)
    weights[::7] = 0.0
    support = getattr(model.emission_table, "support", None)
    s, n, d, t = model.num_symbols, model.context_length, model.query_dim, model.num_targets
    for group in (False, True) if layout == "dense" else (None,):
        want = per_position.StatisticArrays.zeros(s, n, d, t, support)
        got = per_position.StatisticArrays.zeros(s, n, d, t, support)
        per_position.accumulate_estep(
            *rows.encoded, weights, params, want, checked=True, block_rows=1000, group_by_target=group
        )
        per_position.accumulate_estep_windows(
            window._replace(weight=weights).kernel_arrays(), params, got, block_rows=1000, group_by_target=group
        )
        for name in ("key_sum", "key_mass", "position_count", "scalars", "pair_counts", "emission_count_ts"):
            a, b = getattr(want, name, None), getattr(got, name, None)
            assert (a is None) == (b is None), name
            if a is not None:
                assert np.array_equal(a, b), name
        # A window read one token off (its query the token before the previous one) changes the statistics.
        shifted = per_position.StatisticArrays.zeros(s, n, d, t, support)
        off = window._replace(weight=weights, query_index=window.tokens[window.end - 2].astype(np.int64))
        per_position.accumulate_estep_windows(
            off.kernel_arrays(), params, shifted, block_rows=1000, group_by_target=group
        )
        assert not np.array_equal(shifted.key_sum, want.key_sum)


def test_a_free_prior_refuses_short_windows(real_store):
    store, estimator, models = real_store
    model = models["sparse"]
    short = store.with_context(8, min_context=2)
    window = short.read_windows(0, 2000)
    assert (window.end - window.begin < 8).any()
    accumulator = estimator.accumulator_factory(layout="sparse").make_for(model)
    with pytest.raises(ValueError, match="full windows of N = 8"):
        accumulator.seq_update_windows(window, model)


def test_the_e_step_task_reads_windows_and_gives_the_encoded_statistics(real_store):
    """The fit's E-step task (called in this process) on a store partition: the trainer now reads token windows;
    the same trainer given encoded rows gives the same value to the bit."""
    store, estimator, models = real_store
    model = models["sparse"]

    class EncodedTrainer(SingleHopTrainer):
        @property
        def columns(self) -> Columns:
            return Columns()

    trainer = SingleHopTrainer(estimator, "sparse", "uniform", 0)
    assert trainer.columns.windows and trainer.start_columns.windows  # a uniform start reads windows too
    selection = RowSelection(HoldoutRule.for_rows(store.num_rows), "train")
    for part in range(store.num_partitions):
        args = (store.location, part)
        got = statistics_task(*args, trainer, model, store.fingerprint(), selection)
        want = statistics_task(*args, EncodedTrainer(estimator, "sparse", "uniform", 0), model, store.fingerprint(),
                               selection)  # fmt: skip
        assert got.n_obs > 0 and _same_bits(got, want)
    assert open_store(store.location).fingerprint() == store.fingerprint()
