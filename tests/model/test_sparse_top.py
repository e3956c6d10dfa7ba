"""Predictions of the copy and conjunction heads and of their stacks from their sparse terms: the terms sum to the
dense path's distributions bit for bit, and the top-K found from them (threshold search, no (n, T) row) is the
stable arg-sort of the dense rows, values included, on random heads, supports, bases (with ties) and windows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.conj import ConjHead
from dist_respattn.model.heads.copy import CopyHead
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.heads.sparse_top import densify, top_targets
from dist_respattn.model.heads.stack import StackHead
from tests.model.test_conj import random_conj_head
from tests.model.test_copy import corpus, windows_of


def sparse_table(rng: np.random.Generator, s: int, t: int, density: float, tied: bool) -> SparseEmission:
    """A random normalized sparse emission: a random support, a random base (few distinct values when ``tied``)
    and each row's remaining mass on its other targets by the base."""
    stored = rng.random((s, t)) < density
    keys = np.flatnonzero(stored.T.reshape(-1)).astype(np.int64)  # target-major t * S + s
    support = PairSupport.from_keys(keys, s, t)
    base = rng.integers(1, 3, size=t).astype(np.float64) if tied else rng.random(t) + 0.05
    base /= base.sum()
    values = rng.random(support.num_pairs) * (0.9 / max(1, int(stored.sum(axis=1).max())))
    on = np.bincount(support.symbols, weights=values, minlength=s)
    off_base = np.array([base[~stored[a]].sum() for a in range(s)])
    full = off_base <= 0.0  # every target stored: the row's values alone sum to 1
    values = np.where(full[support.symbols], values / np.where(on > 0, on, 1.0)[support.symbols], values)
    on = np.bincount(support.symbols, weights=values, minlength=s)
    backoff = np.where(off_base > 0, (1.0 - on) / np.where(off_base > 0, off_base, 1.0), 0.0)
    return SparseEmission(support, values, backoff, base)


def single(rng: np.random.Generator, shape: tuple[int, int, int, int], seed: int, tied: bool,
           density: float) -> ResponsibilityAttentionDistribution:  # fmt: skip
    head = random_distribution(*shape, seed=seed, sigma2=0.8)
    return head.with_emission(sparse_table(rng, shape[0], shape[3], density, tied))


def stable_top(probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(probs, order, axis=1)


def heads_of(seed: int, n_pos: int, vocab: int, tied: bool, density: float, order: int):
    rng = np.random.default_rng(seed)
    shape = (vocab, n_pos, 2, vocab)
    tokens, starts = corpus(rng, 120, vocab, 3)
    rows = windows_of(tokens, starts, n_pos, rng.normal(size=(vocab, 2)))
    kappa = rng.random(n_pos) * 0.5
    rho = rng.random(n_pos) * 0.4
    copy = CopyHead(single(rng, shape, seed + 1, tied, density), kappa, rho)
    conj = random_conj_head(shape, rows, min(2, n_pos), seed + 2, sparse=True, discount=0.3,
                            backoff="current" if seed % 2 else "attended",
                            triple=(0.4, 0.5, 0.2) if order == 3 else None)  # fmt: skip
    conj = ConjHead(single(rng, shape, seed + 3, tied, density), conj.depth, conj.pair_keys, conj.indptr,
                    conj.targets, conj.counts, conj.strength, conj.type_strength, backoff=conj.backoff,
                    discount=conj.discount, triples=conj.triples)  # fmt: skip
    plain = single(rng, shape, seed + 4, tied, density)
    return rows, copy, conj, plain


CASES = dict(
    seed=st.integers(0, 2**16),
    n_pos=st.integers(1, 5),
    vocab=st.sampled_from([3, 7, 20]),
    tied=st.booleans(),
    density=st.sampled_from([0.0, 0.2, 0.7, 1.0]),
    order=st.sampled_from([2, 3]),
)


@settings(max_examples=40, deadline=None)
@given(**CASES)
def test_the_terms_sum_to_the_dense_rows_and_the_top_k_is_their_stable_sort(
    seed: int, n_pos: int, vocab: int, tied: bool, density: float, order: int
) -> None:
    rows, copy, conj, _ = heads_of(seed, n_pos, vocab, tied, density, order)
    for head in (copy, conj):
        attention = head.window_attention(rows)
        dense = head.window_proba(rows, attention)
        terms = head.window_terms(rows, attention)
        assert terms is not None
        np.testing.assert_array_equal(densify(terms), dense)
        for k in (1, 3, vocab):
            targets, values = top_targets([terms], np.ones((rows.num_rows, 1)), k)
            want_targets, want_values = stable_top(dense, min(k, vocab))
            np.testing.assert_array_equal(targets, want_targets)
            np.testing.assert_array_equal(values, want_values)
        top = head.top_k(Block(rows, None), 2)
        np.testing.assert_array_equal(top.targets, stable_top(dense, min(2, vocab))[0])
        hits = float(np.sum(np.argmax(dense, axis=1) == rows.target))
        assert head.score([Block(rows, None)]).correct == hits


@settings(max_examples=40, deadline=None)
@given(**CASES, mode=st.sampled_from(["joint", "target"]), zero=st.booleans())
def test_a_stacks_top_k_is_the_stable_sort_of_its_dense_rows(
    seed: int, n_pos: int, vocab: int, tied: bool, density: float, order: int, mode: str, zero: bool
) -> None:
    rows, copy, conj, plain = heads_of(seed, n_pos, vocab, tied, density, order)
    gate = np.array([0.5, 0.0 if zero else 0.3, 0.2])
    stack = StackHead(gate / gate.sum(), [conj, copy, plain], mode)
    assert stack.has_terms
    probs, attention = stack.predict_rows(rows)
    for k in (1, 4, vocab):
        top = stack.mixed_top(rows, k)
        want_targets, want_values = stable_top(probs, min(k, vocab))
        np.testing.assert_array_equal(top.targets, want_targets)
        np.testing.assert_array_equal(top.probabilities, want_values)
        np.testing.assert_array_equal(top.attention, attention)
    w = np.random.default_rng(seed).random(rows.num_rows) * (np.arange(rows.num_rows) % 3 > 0)
    weighted = rows._replace(weight=w)
    want = float(w[np.argmax(probs, axis=1) == rows.target].sum())
    assert stack.score([Block(weighted, w)]).correct == pytest.approx(want, rel=1e-12, abs=0.0)


def test_a_dense_emission_keeps_the_dense_path() -> None:
    rng = np.random.default_rng(3)
    shape = (5, 3, 2, 5)
    tokens, starts = corpus(rng, 60, 5, 2)
    rows = windows_of(tokens, starts, 3, rng.normal(size=(5, 2)))
    head = CopyHead(random_distribution(*shape, seed=4, sigma2=0.8), [0.2, 0.1, 0.0], [0.1, 0.0, 0.3])
    assert not head.has_terms and head.window_terms(rows, head.window_attention(rows)) is None
    stack = StackHead([0.5, 0.5], [head, single(rng, shape, 5, False, 0.5)])
    assert not stack.has_terms
    probs, _ = stack.predict_rows(rows)
    np.testing.assert_array_equal(stack.top_k(Block(rows, None), 2).targets, stable_top(probs, 2)[0])


def test_a_large_vocabulary_needs_no_dense_row() -> None:
    """T = 200,000 words, 3,000 rows: the threshold search visits a few targets a row (a dense row each would be
    4.8 GB), and its arg-max is each row's dense one, checked on the first rows."""
    rng = np.random.default_rng(11)
    s = t = 200_000
    n_pos = 4
    frequent = 50
    keys = []
    for a in range(frequent):  # frequent symbols with long rows, the rest short
        cols = np.unique(rng.integers(0, t, size=2000))
        keys.append(cols * s + a)
    keys_all = np.unique(np.concatenate(keys))
    support = PairSupport.from_keys(keys_all, s, t)
    base = rng.random(t) ** 4 + 1e-9
    base /= base.sum()
    values = rng.random(support.num_pairs) / 4000
    table = SparseEmission(support, values, np.full(s, 0.5), base)
    head = random_distribution(200, n_pos, 2, 200, seed=1, sigma2=0.8)
    head = head.with_emission(head.emission_table.restricted(PairSupport.full(200, 200)))
    tokens = rng.integers(0, frequent, size=3000 + n_pos).astype(np.int32)
    rows = windows_of(tokens, [0], n_pos, rng.normal(size=(s, 2)))
    copy = CopyHead(head, np.full(n_pos, 0.1), np.full(n_pos, 0.1))
    attention = copy.window_attention(rows._replace(tokens=np.minimum(rows.tokens, 199)))
    terms = copy.window_terms(rows._replace(tokens=np.minimum(rows.tokens, 199)), attention)
    assert terms is not None
    big_terms = terms._replace(table=table)
    targets, values = top_targets([big_terms], np.ones((rows.num_rows, 1)), 1)
    dense = densify(big_terms._replace(scale=terms.scale[:20], symbols=terms.symbols[:20],
                                       weights=terms.weights[:20], indptr=terms.indptr[:21]))  # fmt: skip
    want, want_values = stable_top(dense, 1)
    np.testing.assert_array_equal(targets[:20], want)
    np.testing.assert_array_equal(values[:20], want_values)
