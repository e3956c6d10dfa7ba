"""The repeat gate: its pass over stream windows against a per-row NumPy reference, its rates, its predictor and its
refusals. (The head contract suite runs the kind's promises on full windows: ``tests/heads/cases.py``.)"""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.repeat import RepeatHead
from dist_respattn.model.heads.repeat import head as repeat_head
from dist_respattn.model.heads.repeat.head import history_buckets
from dist_respattn.model.heads.repeat.kind import chained_rates, repeat_counts
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.heads.stack import StackHead
from dist_respattn.model.rows import WindowRows
from tests.model.test_copy import corpus, windows_of
from tests.model.test_sparse_top import heads_of

S = 12
D = 2


def single_head(n_pos: int, seed: int = 0):
    return random_distribution(S, n_pos, D, S, seed=seed, sigma2=0.8)


def stream_rows(tokens: np.ndarray, starts: list[int], n_pos: int, table: np.ndarray) -> WindowRows:
    """Every target with at least one earlier token of its document, its window the N tokens before it, cut at the
    document's start (what a stream store's reader gives with ``min_context 1``)."""
    bounds = [*starts, tokens.size]
    begin, end = [], []
    for doc, first in enumerate(starts):
        for pos in range(first + 1, bounds[doc + 1]):
            begin.append(max(first, pos - n_pos))
            end.append(pos)
    end_a = np.asarray(end, dtype=np.int64)
    return WindowRows(
        tokens.astype(np.int64), np.asarray(begin, dtype=np.int64), end_a, tokens[end_a].astype(np.int64), table,
        tokens[end_a - 1].astype(np.int64), None, 0,
    )  # fmt: skip


def reference_gate(head: RepeatHead, rows: WindowRows) -> np.ndarray:
    """(n, T) each row's wrapped distribution gated by its window's distinct tokens, in plain NumPy."""
    base = head.base_rows(rows)
    probs = head.view.window_proba(base, head.view.window_attention(base))
    out = probs.copy()
    for i in range(rows.num_rows):
        window = rows.tokens[rows.begin[i] : rows.end[i]]
        seen = np.zeros(S, dtype=bool)
        seen[window] = True
        distinct = int(seen.sum())
        if distinct in (0, S):
            continue
        r = head.rates[min(math.floor(math.log2(window.size)), head.rates.size - 1)]
        out[i, seen] = r * probs[i, seen] / probs[i, seen].sum()
        out[i, ~seen] = (1.0 - r) * probs[i, ~seen] / probs[i, ~seen].sum()
        out[i] = head.mix * probs[i] + (1.0 - head.mix) * out[i]
    return out


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=2, max_value=40), min_size=1, max_size=5),
    n_pos=st.sampled_from([4, 8, 64]),
    vocabulary=st.integers(min_value=3, max_value=S),
    mix=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_the_gate_equals_a_per_row_reference_across_document_starts(
    lengths: list[int], n_pos: int, vocabulary: int, mix: float, seed: int
) -> None:
    """Windows that slide, are cut at document starts and (at N = 64) hold whole documents; few symbols, so some
    histories hold every one (the gate then does not act); pieces of the block carry the counts."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocabulary, size=sum(lengths))
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    rates = rng.uniform(0.05, 0.95, history_buckets(n_pos))
    head = RepeatHead(single_head(3), rates, context_length=n_pos, mix=mix)
    rows = stream_rows(tokens, starts, n_pos, rng.normal(size=(S, D)))
    got = head.block_proba(Block(rows, None))
    np.testing.assert_allclose(got, reference_gate(head, rows), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # The joint scores are the wrapped head's query density and the gated target's probability.
    densities = head.row_densities(rows)
    np.testing.assert_allclose(densities[:, 1], np.log(got[np.arange(rows.num_rows), rows.target]), rtol=1e-12)


def test_a_side_without_mass_is_spread_evenly() -> None:
    """A wrapped distribution with no mass on the history (or off it) still gives a distribution whose repeat
    probability is the rate."""
    tokens = np.array([0, 1, 0, 1, 2], dtype=np.int64)
    rows = WindowRows(tokens, np.array([0]), np.array([4]), np.array([2]), np.zeros((S, D)), np.array([3]), None, 0)
    head = RepeatHead(single_head(3), np.full(history_buckets(4), 0.25), context_length=4)
    proba = np.zeros((1, S))
    proba[0, 5] = 1.0  # all of it off the history {0, 1}
    from dist_respattn.model.heads.repeat.head import GatedRows
    from dist_respattn.model.heads.repeat.kernels import UNIFORM

    flags, _, log_factor = GatedRows(head, rows).gate(0, 1, proba)
    np.testing.assert_allclose(proba[0, [0, 1]], [0.125, 0.125])
    assert proba[0, 5] == 0.75 and proba.sum() == pytest.approx(1.0, abs=1e-15)
    assert not flags[0] & UNIFORM and log_factor[0] == pytest.approx(math.log(0.75))


def test_rates_are_counts_pulled_toward_the_bucket_before() -> None:
    repeats, rows = np.array([1.0, 6.0, 0.0, 0.0]), np.array([4.0, 8.0, 0.0, 2.0])
    mean = (7.0 + 0.5) / (14.0 + 1.0)
    r0 = (1.0 + mean) / 5.0
    r1 = (6.0 + r0) / 9.0
    r3 = (0.0 + r1) / 3.0
    np.testing.assert_allclose(chained_rates(repeats, rows, 1.0), [r0, r1, r1, r3], rtol=1e-15)
    # Maximum likelihood where there are rows; a bucket without any takes the one before's.
    np.testing.assert_allclose(chained_rates(repeats, rows, 0.0), [0.25, 0.75, 0.75, 0.0])
    np.testing.assert_array_equal(chained_rates(np.zeros(3), np.zeros(3), 1.0), [0.5, 0.5, 0.5])


def test_the_counting_pass_counts_what_the_gate_reads() -> None:
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 6, size=300)
    rows = stream_rows(tokens, [0, 100, 180], 16, rng.normal(size=(S, D)))
    weights = rng.integers(0, 2, size=rows.num_rows).astype(np.float64)  # a hold-out's side
    counts = repeat_counts(S, history_buckets(16), [Block(rows, weights)])
    expected_repeats, expected_rows = np.zeros(history_buckets(16)), np.zeros(history_buckets(16))
    for i in range(rows.num_rows):
        window = rows.tokens[rows.begin[i] : rows.end[i]]
        b = min(math.floor(math.log2(window.size)), history_buckets(16) - 1)
        expected_rows[b] += weights[i]
        expected_repeats[b] += weights[i] * (rows.target[i] in window)
    np.testing.assert_array_equal(counts.rows, expected_rows)
    np.testing.assert_array_equal(counts.repeats, expected_repeats)


def test_the_predictor_slides_its_history_over_n_tokens() -> None:
    """After a history longer than N, the predictor's distribution is the block's for the last N tokens."""
    rng = np.random.default_rng(2)
    n_pos = 6
    table = rng.normal(size=(S, D))
    head = RepeatHead(single_head(3), rng.uniform(0.1, 0.9, history_buckets(n_pos)), context_length=n_pos, mix=0.4)
    history = rng.integers(0, 8, size=40)
    predictor = head.predictor(query_table=table)
    for length in range(1, history.size + 1):
        predictor.push(int(history[length - 1]))
        window = history[max(0, length - n_pos) : length]
        rows = WindowRows(window, np.array([0]), np.array([window.size]), np.array([0]), table,
                          np.array([window[-1]]), None, 0)  # fmt: skip
        np.testing.assert_allclose(predictor.predict(), head.block_proba(Block(rows, None))[0], rtol=1e-12,
                                   atol=1e-16)  # fmt: skip
        assert predictor.state_size == min(length, n_pos)


def test_bad_heads_are_refused() -> None:
    single = single_head(4)
    with pytest.raises(ValueError, match="history holds the wrapped head's window, N = 4"):
        RepeatHead(single, [0.5, 0.5], context_length=2)
    with pytest.raises(ValueError, match="expected one per history bucket of N, 4"):
        RepeatHead(single, [0.5], context_length=8)
    with pytest.raises(ValueError, match="expected probabilities"):
        RepeatHead(single, [0.5, 1.5, 0.5, 0.5], context_length=8)
    items = random_distribution(S, 4, D, S + 1, seed=0)
    with pytest.raises(ValueError, match="S = 12 symbols but T = 13 targets: a repeat gate reads a store whose"):
        RepeatHead(items, [0.5, 0.5, 0.5], context_length=4)
    gated_twice = RepeatHead(single, [0.5, 0.5, 0.5], context_length=4)
    with pytest.raises(ValueError, match=r"wraps a single, copy, conj, hops or stack head .* not a repeat head"):
        RepeatHead(gated_twice, [0.5, 0.5, 0.5], context_length=4)


def test_the_held_out_pass_scores_every_share_as_the_head_under_it_scores() -> None:
    """One pass over the rows gives each share's totals; each equals the head's own score under that share, and the
    shares 0 and 1 are the gate alone and the wrapped head alone."""
    from dist_respattn.model.heads.repeat.kind import MIX_GRID, RepeatGrid

    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 7, size=400)
    rows = stream_rows(tokens, [0, 150, 260], 32, rng.normal(size=(S, D)))
    head = RepeatHead(single_head(3), rng.uniform(0.2, 0.9, history_buckets(32)), context_length=32)
    scores = RepeatGrid(head, MIX_GRID).score([Block(rows, None)])
    for mix, totals in zip(MIX_GRID, scores.totals, strict=True):
        own = head.with_rates(head.rates, mix).score([Block(rows, None)], accuracy=False)
        assert totals.weight == own.weight == rows.num_rows
        assert totals.target_log_prob == pytest.approx(own.target_log_prob, rel=1e-12)
        assert totals.log_lik == pytest.approx(own.log_lik, rel=1e-12)
    plain = head.view.score([Block(head.base_rows(rows), None)])
    assert scores.totals[-1].target_log_prob == pytest.approx(plain.target_log_prob, rel=1e-12)


def test_top_k_reports_the_wrapped_heads_attention() -> None:
    """``predict``'s attention of a gated row is the wrapped head's, over its own window (N_w columns)."""
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, 9, size=120)
    rows = stream_rows(tokens, [0, 70], 64, rng.normal(size=(S, D)))
    head = RepeatHead(single_head(3), rng.uniform(0.2, 0.9, history_buckets(64)), context_length=64, mix=0.2)
    top = head.top_k(Block(rows, None), 3)
    assert top.attention.shape == (rows.num_rows, 3) == (rows.num_rows, head.attention_length)
    expected = head.view.window_attention(head.base_rows(rows))
    np.testing.assert_allclose(top.attention, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(top.probabilities[:, 0], head.block_proba(Block(rows, None)).max(axis=1), rtol=1e-12)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    n_pos=st.integers(1, 4),
    vocab=st.sampled_from([3, 7, 20]),
    history=st.sampled_from([8, 64]),
    mix=st.sampled_from([0.0, 0.3]),
    piece=st.sampled_from([5, 4096]),
)
def test_sparse_heads_are_gated_from_their_masses_as_from_their_dense_rows(
    seed: int, n_pos: int, vocab: int, history: int, mix: float, piece: int
) -> None:
    """A wrapped head with sparse terms (copy, conjunction, single, their stack) is scored from its masses on the
    histories: the same densities as its (T,) rows give (to rounding), in pieces that carry the histories (5
    rows); the fit's passes (its E-step, the held-out pass) read them the same way."""
    from dist_respattn.model.heads.repeat.kind import MIX_GRID, RepeatGrid, repeat_statistics

    short, copy, conj, plain = heads_of(seed, n_pos, vocab, seed % 3 == 0, 0.2, 2 + seed % 2)
    rng = np.random.default_rng(seed)
    tokens, starts = corpus(rng, 120, vocab, 3)  # heads_of's corpus, read with the history's window
    rows = windows_of(tokens, starts, history, np.asarray(short.query_table))
    stack = StackHead(np.array([0.5, 0.3, 0.2]), [conj, copy, plain], "joint")
    for wrapped in (copy, conj, plain, stack):
        head = RepeatHead(wrapped, rng.uniform(0.1, 0.9, history_buckets(history)), context_length=history, mix=mix)
        assert head.view.has_terms
        dense = np.concatenate([p.densities for p in head.pieces(rows, densities=True)])
        with mock.patch.object(repeat_head, "TERMS_ROWS", piece):
            pieces = list(head.pieces(rows, densities=True, distributions=False))
            totals = head.score([Block(rows, None)], accuracy=False)
            statistics = repeat_statistics(head, [Block(rows, None)])
            grid = RepeatGrid(head, MIX_GRID).score([Block(rows, None)])
        assert all(p.proba is None for p in pieces) and len(pieces) == -(-rows.num_rows // piece)
        got = np.concatenate([p.densities for p in pieces])
        np.testing.assert_array_equal(got[:, 0], dense[:, 0])
        np.testing.assert_allclose(got[:, 1], dense[:, 1], rtol=1e-10, atol=1e-12)
        assert totals.target_log_prob == pytest.approx(float(dense[:, 1].sum()), rel=1e-10)
        assert statistics.target_log_prob == pytest.approx(float(dense[:, 1].sum()), rel=1e-10)
        dense_mixes = [head.with_rates(head.rates, m).pieces(rows, densities=True) for m in MIX_GRID]
        for totals_at, mixed in zip(grid.totals, dense_mixes, strict=True):
            want = float(np.concatenate([p.densities for p in mixed])[:, 1].sum())
            assert totals_at.target_log_prob == pytest.approx(want, rel=1e-10)
