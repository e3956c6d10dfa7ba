"""The held-out grid pass over a training store's hold-out reads only the blocks and rows held out.

Its totals must be those of scoring every block with the training rows weighted 0, to the bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionAccumulator, ResponsibilityAttentionEstimator
from dist_respattn.engine import worker_tasks
from dist_respattn.engine.worker_tasks import RowSelection
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.fitting.selection import DEFAULT_SEARCH, GridTotals, score_grid
from dist_respattn.model.heads.single_hop.kind import SingleHopGrid
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.store.helpers import random_rows, write_small


def _candidates(store):
    s = store.schema
    shape = (s.num_symbols, s.context_length, s.query_dim, s.num_targets)
    data = store.read_rows(0, store.num_rows).encoded
    pairs = PairCounts.from_rows(data[0][:, -1], data[2], None, num_symbols=shape[0], num_targets=shape[3])
    estimator = ResponsibilityAttentionEstimator(*shape, emission_prior=EmissionPrior.from_pairs(pairs, "continuation"))

    def statistics(model):
        accumulator = ResponsibilityAttentionAccumulator(*shape)
        if model is None:
            accumulator.seq_initialize_uniform(data, None)
        else:
            accumulator.seq_update(data, None, model)
        return accumulator.value()

    first = estimator.estimate(None, statistics(None))
    return estimator.candidates(statistics(first), previous=first)


@pytest.mark.parametrize("kind", ["stream", "triples"])
def test_the_holdout_pass_equals_scoring_every_block_to_the_bit(tmp_path, kind):
    if kind == "stream":
        rng = np.random.default_rng(2)
        tokens = rng.integers(0, 30, 6000)
        weights = rng.uniform(0.5, 2.0, tokens.size).astype(np.float32)
        store = write_stream_tokens(
            tmp_path / "s.zarr", tokens, 5, num_symbols=30, documents=np.array([0, 1000, 1003, 4000]),
            weights=weights, options=WriteOptions(chunk_rows=128, partition_rows=1024),
        )  # fmt: skip
    else:
        store = write_small(tmp_path / "t.zarr", random_rows(weighted=True))
    # Stripes of 16 rows, a fifth held out: most blocks hold some, a few none.
    rule = HoldoutRule(0.2, 16)
    rows = RowSelection(rule, "heldout")
    table = _candidates(store).grid_table(DEFAULT_SEARCH)
    skipped = 0
    for part in range(store.num_partitions):
        got = worker_tasks.grid_task(store.location, part, SingleHopGrid(table), store.fingerprint(), rows)
        want = GridTotals.zeros(table.shape)
        for block in store.iter_blocks(part):
            skipped += not rule.held_out(block.start, block.start + block.num_rows).any()
            want = want + score_grid(table, block.encoded, rows.weights(block))
        assert got.weight == want.weight > 0.0
        assert np.array_equal(got.target_log_prob, want.target_log_prob)
        assert np.array_equal(got.log_lik, want.log_lik)
    assert kind == "triples" or skipped > 0  # the stream's small blocks include some with nothing held out
