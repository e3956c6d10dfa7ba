"""The conjunction head's math: its kernel against a per-position NumPy writing of the model (orders 2 and 3), the
single head when the pair strength is infinite and order 2 when the triple strength is, rows that normalize, a
trigram source it learns, and the distributed fit on one and two workers equal to the in-process one."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.cli import build_parser
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.emission.layouts import DenseEmission, PairSupport, SparseEmission
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import Block, TrainerContext
from dist_respattn.model.heads.conj import ConjHead, ConjSpec
from dist_respattn.model.heads.conj import kernels as conj_kernels
from dist_respattn.model.heads.conj.head import TripleRows
from dist_respattn.model.heads.conj.kernels import ConjArrays, conj_estep, conj_score
from dist_respattn.model.heads.conj.kind import (
    ROW_COUNTS,
    cell_tally,
    conj_statistics,
    support_counts,
    support_of,
    triple_tally,
)
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.kernels.per_position import StatisticArrays
from dist_respattn.model.rows import EncodedRows, WindowRows
from tests.model.test_copy import corpus, windows_of


def random_conj_head(shape: tuple[int, int, int, int], rows: WindowRows, depth: int, seed: int, *,
                     strength: float = 1.5, type_strength: float = 0.5, sparse: bool = False,
                     backoff: str = "attended", discount: float = 0.0,
                     triple: tuple[float, float, float] | None = None) -> ConjHead:  # fmt: skip
    """A random single head with the pair rows of ``rows`` (every pair stored) and random counts; with ``triple``
    (beta3, gamma3, D3), order 3 with every triple of ``rows`` stored."""
    rng = np.random.default_rng(seed)
    single = random_distribution(*shape, seed=seed, sigma2=0.8)
    if sparse:
        single = single.with_emission(single.emission_table.restricted(PairSupport.full(shape[0], shape[3])))
    tally = cell_tally(shape[0], shape[3], depth, iter([Block(rows, None)]))
    pair_keys, indptr, targets = support_of(tally, shape[3], 1.0)
    counts = rng.exponential(size=targets.size) * (rng.random(targets.size) < 0.8)  # some cells at 0
    triples = None
    if triple is not None:
        keys3, indptr3, targets3 = support_of(triple_tally(shape[0], shape[3], depth, iter([Block(rows, None)])),
                                              shape[3], 1.0)  # fmt: skip
        counts3 = rng.exponential(size=targets3.size) * (rng.random(targets3.size) < 0.8)
        triples = TripleRows(keys3, indptr3, targets3, counts3, *triple)
    return ConjHead(single, depth, pair_keys, indptr, targets, counts, strength, type_strength, backoff=backoff,
                    discount=discount, triples=triples)  # fmt: skip


def reference_row_rates(head: ConjHead, window: np.ndarray, t: int) -> tuple[np.ndarray, list[int], list[int]]:
    """(m,) each position's ``E_j(t)`` of a window (oldest first) by the hierarchy written out (triple row -> pair
    row -> B), and the stored pair and triple cells each reads (-1: none)."""
    s = head.num_symbols
    emission = head.single.emission_table.to_dense()
    q, m = int(window[-1]), window.shape[0]
    pair_index = {int(key): p for p, key in enumerate(head.pair_keys)}
    triples = head.triples
    triple_index = {} if triples is None else {int(key): u for u, key in enumerate(triples.keys)}
    e, cells, triple_cells = np.empty(m), [-1] * m, [-1] * m
    for j in range(m):
        c = int(window[j])
        p = pair_index.get(c * s + q) if m - 1 - j < head.depth else None
        if p is None:
            e[j] = emission[c, t]
            continue
        lo, hi = head.indptr[p], head.indptr[p + 1]
        stored = list(head.targets[lo:hi])
        n_t = head.counts[lo + stored.index(t)] if t in stored else 0.0
        cells[j] = lo + stored.index(t) if t in stored else -2
        n_p, s_p = head.counts[lo:hi].sum(), head.strength + head.type_strength * (hi - lo)
        lean = q if head.backoff == "current" else c
        moved = np.minimum(head.counts[lo:hi], head.discount).sum()
        e[j] = emission[lean, t]
        if np.isfinite(s_p) and n_p + s_p > 0:
            e[j] = (n_t - min(n_t, head.discount) + (s_p + moved) * emission[lean, t]) / (n_p + s_p)
        u = triple_index.get((int(window[j - 1]) * s + c) * s + q) if triples is not None and j > 0 else None
        if u is None:
            continue
        assert triples is not None
        lo, hi = triples.indptr[u], triples.indptr[u + 1]
        stored = list(triples.targets[lo:hi])
        n3_t = triples.counts[lo + stored.index(t)] if t in stored else 0.0
        triple_cells[j] = lo + stored.index(t) if t in stored else -2
        n_u, s_u = triples.counts[lo:hi].sum(), triples.strength + triples.type_strength * (hi - lo)
        moved3 = np.minimum(triples.counts[lo:hi], triples.discount).sum()
        if np.isfinite(s_u) and n_u + s_u > 0:
            e[j] = (n3_t - min(n3_t, triples.discount) + (s_u + moved3) * e[j]) / (n_u + s_u)
    return e, cells, triple_cells


def reference_statistics(head: ConjHead, rows: WindowRows) -> dict[str, np.ndarray]:
    """The E-step written position by position: responsibilities under the pair rows, the rejected draws."""
    single = head.single
    s, n_pos, d, t_n = head.shape
    n_triple_cells = 0 if head.triples is None else head.triples.targets.size
    out = {"key_sum": np.zeros((s, d)), "key_mass": np.zeros(s), "emission_count": np.zeros((s, t_n)),
           "recency_mass": np.zeros(n_pos), "cell_counts": np.zeros(head.num_cells),
           "triple_counts": np.zeros(n_triple_cells), "log_lik": np.zeros(1)}  # fmt: skip
    for row in range(rows.num_rows):
        window = rows.tokens[rows.begin[row] : rows.end[row]]
        m = window.shape[0]
        y = rows.query_table[rows.query_index[row]].astype(np.float64)
        t = int(rows.target[row])
        recency = np.arange(m)[::-1]
        prior = single.position_prior[n_pos - 1 - recency]
        area = single.position_prior[n_pos - m :].sum()
        gauss = np.exp(-((y - single.key_means[window]) ** 2).sum(axis=1) / (2 * single.sigma2))
        gauss *= (2 * np.pi * single.sigma2) ** (-d / 2)
        e, cells, triple_cells = reference_row_rates(head, window, t)
        joint = prior / area * gauss * e
        r = joint / joint.sum()
        for j in range(m):
            c = int(window[j])
            out["key_sum"][c] += r[j] * y
            out["key_mass"][c] += r[j]
            out["emission_count"][c, t] += r[j]
            if cells[j] >= 0:
                out["cell_counts"][cells[j]] += r[j]
            if triple_cells[j] >= 0:
                out["triple_counts"][triple_cells[j]] += r[j]
            out["recency_mass"][recency[j]] += r[j]
        out["recency_mass"][m:] += single.position_prior[: n_pos - m][::-1] / area
        out["log_lik"] += np.log(joint.sum())
    return out


def kernel_statistics(head: ConjHead, rows: WindowRows) -> dict[str, np.ndarray]:
    value = conj_statistics(head, [Block(rows, None)])
    stats = value.stats
    counts = stats.emission_count
    table = head.single.emission_table
    if isinstance(table, SparseEmission):
        counts = counts.on(table.support)  # type: ignore[attr-defined]
    return {"key_sum": stats.key_sum, "key_mass": stats.key_mass, "emission_count": counts.to_dense(),
            "recency_mass": stats.position_count[::-1], "cell_counts": value.cell_counts,
            "triple_counts": value.triple_counts, "log_lik": np.array([stats.log_lik])}  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), n_pos=st.integers(1, 5), depth=st.integers(1, 5),
       vocab=st.sampled_from([2, 3, 7]), n_docs=st.integers(1, 3), sparse=st.booleans(),
       backoff=st.sampled_from(["attended", "current"]), discount=st.sampled_from([0.0, 0.3, 1.5]),
       triple=st.sampled_from([None, (0.7, 0.5, 0.0), (0.0, 1.0, 0.4), (2.0, 0.0, 1.5)]))  # fmt: skip
def test_kernel_equals_the_per_position_reference(
    seed: int, n_pos: int, depth: int, vocab: int, n_docs: int, sparse: bool, backoff: str, discount: float,
    triple: tuple[float, float, float] | None,
) -> None:  # fmt: skip
    """The E-step's statistics and the scoring pass's per-row densities, at order 2 (``triple`` None) and 3."""
    rng = np.random.default_rng(seed)
    shape = (7, n_pos, 2, 7)
    tokens, starts = corpus(rng, 40, vocab, n_docs)
    rows = windows_of(tokens, starts, n_pos, rng.normal(size=(7, 2)))
    head = random_conj_head(shape, rows, min(depth, n_pos), seed, sparse=sparse, backoff=backoff, discount=discount,
                            triple=triple)  # fmt: skip
    mine, theirs = kernel_statistics(head, rows), reference_statistics(head, rows)
    for name, value in theirs.items():
        np.testing.assert_allclose(mine[name], value, rtol=1e-12, atol=1e-12, err_msg=name)
    assert mine["log_lik"][0] == pytest.approx(head.row_densities(rows).sum(), rel=1e-12)


@pytest.mark.parametrize("backoff", ["attended", "current"])
def test_direct_rows_and_binary_searches_give_the_same_statistics(backoff: str) -> None:
    """A sparse ``B`` read through the direct rows of every target, of none (binary searches) or of every other one:
    the E-step's statistics bit for bit the same."""
    rng = np.random.default_rng(5)
    shape = (7, 4, 2, 7)
    tokens, starts = corpus(rng, 60, 7, 2)
    rows = windows_of(tokens, starts, shape[1], rng.normal(size=(7, 2)))
    head = random_conj_head(shape, rows, 2, 5, sparse=True, backoff=backoff, discount=0.3)
    params = head.parameters
    assert (params.direct_row >= 0).all()  # a full support: every target has its direct row
    some = params.direct_row.copy()
    some[::2] = -1
    results = []
    for variant in (params, replace(params, direct_row=params.direct_row[:0]), replace(params, direct_row=some)):
        stats = StatisticArrays.zeros(*shape, head.single.emission_table.support)
        extra = ConjArrays.zeros(shape[1], head.num_cells)
        conj_estep(rows, variant, stats, extra)
        results.append([stats.key_sum, stats.key_mass, stats.pair_counts, stats.scalars, extra.recency_mass,
                        extra.cell_counts])  # fmt: skip
    assert results[0][5].sum() > 0.0  # the pair rows were read
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("triple", [None, (0.7, 0.5, 0.4)], ids=["order-2", "order-3"])
def test_rows_grouped_by_target_give_the_statistics_of_rows_in_their_order(
    sparse: bool, triple: tuple[float, float, float] | None
) -> None:
    """The E-step visits a block's rows grouped by target (as the single head's does) or in their own order: the same
    statistics up to the order of their sums, and rows no position explains named in row order either way."""
    rng = np.random.default_rng(11)
    shape = (7, 4, 2, 7)
    tokens, starts = corpus(rng, 80, 7, 3)
    rows = windows_of(tokens, starts, shape[1], rng.normal(size=(7, 2)))
    weight = np.ones(rows.num_rows)
    weight[[3, 10]] = 0.0
    rows = rows._replace(weight=weight)
    head = random_conj_head(shape, rows, 2, 11, sparse=sparse, discount=0.3, triple=triple)
    support = head.single.emission_table.support if sparse else None
    results = []
    for grouped in (True, False):
        stats = StatisticArrays.zeros(*shape, support)
        extra = ConjArrays.zeros(shape[1], head.num_cells, head.triples.targets.size if head.triples else 0)
        conj_estep(rows, head.parameters, stats, extra, group_by_target=grouped)
        results.append([stats.key_sum, stats.key_mass, stats.emission_count_ts, stats.pair_counts, stats.scalars,
                        extra.recency_mass, extra.cell_counts, extra.triple_counts])  # fmt: skip
    assert results[0][6].sum() > 0.0  # the pair rows were read
    assert not np.array_equal(np.argsort(rows.target, kind="stable"), np.arange(rows.num_rows))  # another order
    for a, b in zip(*results, strict=True):
        if a is not None:  # the layout's emission counts: a dense table's or a sparse support's
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    # B emits neither target 1 nor 4, and infinite pair strengths make every row B's: rows 2 (target 4) and 9
    # (target 1) are impossible, visited 9 first when grouped.
    target = np.where(np.isin(rows.target, [1, 4]), 0, rows.target).astype(np.int32)
    target[2], target[9] = 4, 1
    rows = rows._replace(target=target, weight=None)
    head = random_conj_head(shape, rows, 2, 11, strength=np.inf)
    probs = head.single.emission_table.to_dense()
    probs[:, [1, 4]] = 0.0
    single = head.single.with_emission(DenseEmission(probs / probs.sum(axis=1, keepdims=True)))
    impossible = ConjHead(single, 2, head.pair_keys, head.indptr, head.targets, head.counts, np.inf, 0.0)
    for grouped in (True, False):
        stats = StatisticArrays.zeros(*shape, None)
        with pytest.raises(ImpossibleEvidenceError, match=r"rows 2, 9 have"):
            conj_estep(rows, impossible.parameters, stats, ConjArrays.zeros(shape[1], impossible.num_cells),
                       group_by_target=grouped)  # fmt: skip


@pytest.mark.parametrize("grouped", [True, False])
def test_float32_queries_give_their_float64_values_statistics_and_scores_from_one_build(grouped: bool) -> None:
    """A store's float32 query table reaches the E-step as it is (read in place, no float64 copy of a block's
    queries) and the scoring kernel widened: both give the numbers of the table's float64 values, to the bit, and
    neither kernel builds a second time for it."""
    rng = np.random.default_rng(5)
    shape = (7, 4, 2, 7)
    tokens, starts = corpus(rng, 60, 7, 3)
    table = rng.normal(size=(7, 2)).astype(np.float32)
    narrow = windows_of(tokens, starts, shape[1], table)
    wide = narrow._replace(query_table=table.astype(np.float64))
    head = random_conj_head(shape, wide, 2, 5)
    results, builds = [], []
    for rows in (wide, narrow):
        stats = StatisticArrays.zeros(*shape, None)
        extra = ConjArrays.zeros(shape[1], head.num_cells)
        conj_estep(rows, head.parameters, stats, extra, group_by_target=grouped)
        log_lik, target_log_prob, _, attention = conj_score(rows, head.parameters)
        results.append([stats.key_sum, stats.key_mass, stats.emission_count_ts, stats.scalars, extra.recency_mass,
                        extra.cell_counts, np.array([log_lik, target_log_prob]), attention])  # fmt: skip
        builds.append((list(conj_kernels._estep.signatures), list(conj_kernels._score.signatures)))
    assert builds[0] == builds[1]  # the float32 rows took the float64 rows' builds
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_infinite_pair_strength_is_the_single_head() -> None:
    """``beta = inf``: the single head's statistics (the cell counts aside), scores and distributions."""
    rng = np.random.default_rng(3)
    shape = (6, 5, 2, 6)
    context = rng.integers(0, 6, size=(300, 5)).astype(np.int32)
    query, target = rng.normal(size=(300, 2)), rng.integers(0, 6, size=300).astype(np.int32)
    rows = WindowRows.from_encoded(context, query, target)
    head = random_conj_head(shape, rows, 5, 4, strength=np.inf)
    mine = conj_statistics(head, [Block(rows, None)])
    accumulator = ResponsibilityAttentionAccumulator(*shape)
    accumulator.seq_update((context, query, target), None, head.single)
    theirs = accumulator.value()
    for a, b in [(mine.stats.key_sum, theirs.key_sum), (mine.stats.key_mass, theirs.key_mass),
                 (mine.stats.emission_count.to_dense(), theirs.emission_count.to_dense()),
                 (mine.stats.position_count, theirs.position_count)]:  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert mine.stats.log_lik == pytest.approx(theirs.log_lik, rel=1e-12)
    assert mine.cell_counts.sum() > 0.0  # the pairs were read: their rows are B's
    ours = head.score([Block(rows, None)])
    single = head.single.score([Block(EncodedRows(context, query, target, None, 0), None)])
    assert ours.target_log_prob == pytest.approx(single.target_log_prob, rel=1e-12)
    assert ours.correct == single.correct
    np.testing.assert_allclose(head.predict_proba(context[:20], query[:20]),
                               head.single.predict_proba(context[:20], query[:20]), rtol=1e-12, atol=1e-15)  # fmt: skip
    # A large finite strength comes near it, a small one does not.
    near = head.with_counts(head.counts, 1e9, 0.0).score([Block(rows, None)]).target_log_prob
    far = head.with_counts(head.counts, 0.1, 0.0).score([Block(rows, None)]).target_log_prob
    assert near == pytest.approx(single.target_log_prob, rel=1e-6) and far != pytest.approx(near, rel=1e-3)


@pytest.mark.parametrize(("sparse", "backoff"), [(False, "current"), (True, "attended")])
def test_the_distributions_normalize_and_the_hits_are_their_arg_max(sparse: bool, backoff: str) -> None:
    rng = np.random.default_rng(5)
    shape = (5, 4, 2, 5)
    context = rng.integers(0, 3, size=(200, 4)).astype(np.int32)
    query, target = rng.normal(size=(200, 2)), rng.integers(0, 5, size=200).astype(np.int32)
    rows = WindowRows.from_encoded(context, query, target)
    head = random_conj_head(shape, rows, 3, 6, sparse=sparse, backoff=backoff, discount=0.4)
    probs = head.predict_proba(context, query)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    hits = head.score([Block(rows, None)]).correct
    assert hits == float(np.sum(np.argmax(probs, axis=1) == target)) and 0 < hits < 200


def trigram_rows(rng: np.random.Generator, table: np.ndarray, n: int, n_pos: int) -> tuple[np.ndarray, ...]:
    """Rows of a stream drawn from a trigram source ``table[a, b]`` (full windows; the query: the last token's
    embedding, a fixed random table)."""
    s = table.shape[0]
    stream = [0, 1]
    for _ in range(n + n_pos):
        stream.append(int(rng.choice(s, p=table[stream[-2], stream[-1]])))
    x = np.array(stream)
    context = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(x[:-1], n_pos)[:n], dtype=np.int32)
    embeddings = np.random.default_rng(0).normal(size=(s, 2))
    return context, embeddings[context[:, -1]], x[n_pos : n_pos + n].astype(np.int32)


def test_a_trigram_source_is_learned() -> None:
    """The previous two tokens decide the next: the pair rows learn it (held-out choice of the strengths on the
    fit's own hold-out), the single head, a mixture of skip-bigrams, cannot."""
    rng = np.random.default_rng(7)
    s, n_pos = 12, 3
    table = rng.dirichlet(np.full(s, 0.1), size=(s, s))
    train, test = trigram_rows(rng, table, 3000, n_pos), trigram_rows(rng, table, 1000, n_pos)
    single_spec = SingleHopSpec(sigma2=1.0, emission_strength=1.0, type_strength=1.0, emission_layout="dense")
    conj = fit_em(train, ConjSpec(single_spec), shape=(s, n_pos, 2, s), max_iter=6).distribution
    single = fit_em(train, single_spec, shape=(s, n_pos, 2, s), max_iter=6).distribution
    assert isinstance(conj, ConjHead)
    mine = conj.score([Block(WindowRows.from_encoded(*test), None)]).target_log_prob / 1000
    theirs = single.score([Block(EncodedRows(*test, None, 0), None)]).target_log_prob / 1000
    assert np.exp(-mine) < 0.6 * np.exp(-theirs), (np.exp(-mine), np.exp(-theirs))


def parsed(*flags: str) -> object:
    return build_parser().parse_args(["fit", "train.zarr", "--model-dir", "model", *flags])


def test_the_conj_options_make_the_spec_and_bad_ones_name_their_flag() -> None:
    base = SingleHopSpec(sigma2=0.5)
    spec = spec_from_args(parsed("--head", "conj", "--conj-depth", "3", "--conj-strength", "inf"), base, None)
    assert spec == ConjSpec(base, depth=3, strength=np.inf)
    assert spec_from_args(parsed("--head", "conj"), base, None) == ConjSpec(base)
    current = spec_from_args(parsed("--head", "conj", "--conj-backoff", "current"), base, None)
    assert current == ConjSpec(base, backoff="current")
    resumed = spec_from_args(parsed("--head", "conj"), base, ConjSpec(base, depth=4, type_strength=1.0).to_json())
    assert resumed == ConjSpec(base, depth=4, type_strength=1.0)
    for flags, message in [
        (("--conj-depth", "2"), "--conj-depth sets a conjunction head: add --head conj"),
        (("--head", "conj", "--conj-depth", "0"), "--conj-depth 0: expected at least 1"),
        (("--head", "conj", "--conj-strength", "-1"), "--conj-strength -1.0: expected a strength >= 0"),
        (("--head", "conj", "--conj-min-count", "nan"), "--conj-min-count nan: expected a finite count"),
        (("--head", "conj", "--conj-discount", "-0.5"), "--conj-discount -0.5: expected a finite discount"),
    ]:
        with pytest.raises(CommandError, match=message):
            spec_from_args(parsed(*flags), base, None)


@pytest.mark.slow
def test_the_distributed_fit_on_one_and_two_workers_equals_fit_em(tmp_path: Path) -> None:
    """One store of three partitions fitted on two workers, then on one (the other retired): the same head as the
    in-process fit to 1e-12, and the two distributed fits bit for bit (order 3: the triple rows' support pass and
    counts with the pair rows')."""
    from dist_respattn.engine import FitSettings, fit
    from dist_respattn.store import WriteOptions, write_arrays
    from tests.engine.clusters import local_cluster

    rng = np.random.default_rng(11)
    s, n_pos = 8, 3
    context, query, target = trigram_rows(rng, rng.dirichlet(np.full(s, 0.2), size=(s, s)), 600, n_pos)
    query = query.astype(np.float32).astype(np.float64)
    store = tmp_path / "train.zarr"
    write_arrays(store, context, query, target, num_symbols=s, num_targets=s,
                 options=WriteOptions(chunk_rows=128, partition_rows=256))  # fmt: skip
    spec = ConjSpec(SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense"),
                    depth=2, strength=1.0, type_strength=0.5, discount=0.5, order=3, triple_strength=0.5,
                    triple_type_strength=1.0, triple_discount=0.5)  # fmt: skip
    settings_ = FitSettings(max_iter=2, tol=0.0, holdout_fraction=0.0)
    reference = fit_em((context, query, target), spec, shape=(s, n_pos, 2, s), holdout=HoldoutRule(0.0), max_iter=2,
                       tol=0.0).distribution  # fmt: skip
    fitted = []
    with local_cluster(2) as (_, client):
        for n_workers in (2, 1):
            if n_workers == 1:
                client.retire_workers([next(iter(client.scheduler_info()["workers"]))])
                client.wait_for_workers(1)
                assert len(client.scheduler_info()["workers"]) == 1
            result = fit(store, model_dir=tmp_path / f"model{n_workers}", settings=settings_, head=spec, client=client)
            assert result.state == "max_iter" and isinstance(result.model, ConjHead)
            fitted.append(result.model.to_arrays()[0])
    theirs = reference.to_arrays()[0]
    for name, value in theirs.items():
        np.testing.assert_allclose(fitted[0][name], value, rtol=1e-12, atol=1e-14, err_msg=name)
        assert np.array_equal(fitted[0][name], fitted[1][name]), name
    assert fitted[0]["conj_counts"].sum() > 0.0 and fitted[0]["conj_triple_counts"].sum() > 0.0


@pytest.mark.parametrize(("sparse", "backoff"), [(False, "attended"), (True, "current")])
def test_the_held_out_grid_scores_every_point_as_its_head_does(sparse: bool, backoff: str) -> None:
    """One pass over the rows at every (beta, gamma, D), an infinite beta among them, equals each point's own head."""
    from dist_respattn.model.heads.conj.kind import ConjGrid

    rng = np.random.default_rng(12)
    shape = (6, 4, 2, 6)
    tokens, starts = corpus(rng, 120, 4, 3)
    rows = windows_of(tokens, starts, 4, rng.normal(size=(6, 2)))
    head = random_conj_head(shape, rows.select(slice(0, 80)), 3, 13, sparse=sparse, backoff=backoff)
    points = ((0.0, 0.0, 0.0), (0.5, 1.0, 0.5), (2.0, 0.0, 0.8), (0.0, 0.5, 0.8), (np.inf, 0.0, 0.5))
    weights = rng.random(rows.num_rows)
    block = Block(rows, weights)  # held-out rows beyond the support's, weighted
    scores = ConjGrid(head, points).score([block])
    for (b, g, d), totals in zip(points, scores.totals, strict=True):
        mine = head.with_counts(head.counts, b, g, d).score([block], accuracy=False)
        assert totals.weight == pytest.approx(mine.weight, rel=1e-12)
        assert totals.log_lik == pytest.approx(mine.log_lik, rel=1e-12)
        assert totals.target_log_prob == pytest.approx(mine.target_log_prob, rel=1e-12)


# ----------------------------------------------------------------------------------------------- order 3


def stream_rows(seed: int, n_pos: int, n_tokens: int = 150, vocab: int = 4) -> tuple[WindowRows, np.ndarray]:
    """Window rows of a few short documents (windows shorter than N at their starts) and the query table."""
    rng = np.random.default_rng(seed)
    tokens, starts = corpus(rng, n_tokens, vocab, 3)
    table = rng.normal(size=(6, 2))
    return windows_of(tokens, starts, n_pos, table), table


@pytest.mark.parametrize(("sparse", "backoff"), [(False, "attended"), (True, "current")])
def test_an_infinite_triple_strength_is_order_two_exactly(sparse: bool, backoff: str) -> None:
    """``beta3 = inf``: order 2's statistics, per-row densities and distributions bit for bit, though the triple
    rows are read (their cells take responsibility); a finite one changes the scores."""
    shape = (6, 4, 2, 6)
    rows, _ = stream_rows(21, shape[1])
    head3 = random_conj_head(shape, rows, 3, 22, sparse=sparse, backoff=backoff, discount=0.4,
                             triple=(np.inf, 0.5, 0.3))  # fmt: skip
    head2 = ConjHead(head3.single, head3.depth, head3.pair_keys, head3.indptr, head3.targets, head3.counts,
                     head3.strength, head3.type_strength, backoff=backoff, discount=0.4)  # fmt: skip
    assert head3.order == 3 and head2.order == 2
    mine, theirs = kernel_statistics(head3, rows), kernel_statistics(head2, rows)
    assert mine.pop("triple_counts").sum() > 0.0 and theirs.pop("triple_counts").size == 0
    for name, value in theirs.items():
        np.testing.assert_array_equal(mine[name], value, err_msg=name)
    np.testing.assert_array_equal(head3.row_densities(rows), head2.row_densities(rows))
    np.testing.assert_array_equal(head3.window_proba(rows, head3.window_attention(rows)),
                                  head2.window_proba(rows, head2.window_attention(rows)))  # fmt: skip
    assert head3.score([Block(rows, None)]) == head2.score([Block(rows, None)])
    finite = head3.with_counts(head3.counts, head3.strength, head3.type_strength,
                               triples=head3.triples.with_counts(head3.triples.counts, 0.2, 0.5, 0.3))  # type: ignore[union-attr]  # fmt: skip
    assert not np.allclose(finite.row_densities(rows)[:, 1], head2.row_densities(rows)[:, 1])


@pytest.mark.parametrize(("sparse", "discount"), [(False, 0.0), (True, 0.6)])
def test_order_three_rows_normalize_and_stream_as_the_kernel_scores(sparse: bool, discount: float) -> None:
    """The hierarchical MAP rows (triple -> pair -> B -> base) sum to 1 over the targets; the NumPy distribution
    at each row's target is the kernel's ``p(target | window, query)``; the streaming predictor over a growing
    history equals both; the hits are the arg-max."""
    shape = (6, 4, 2, 6)
    rows, table = stream_rows(23, shape[1])
    head = random_conj_head(shape, rows, 2, 24, sparse=sparse, discount=discount, triple=(0.3, 0.5, discount))
    probs = head.window_proba(rows, head.window_attention(rows))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    at_target = probs[np.arange(rows.num_rows), rows.target]
    np.testing.assert_allclose(np.log(at_target), head.row_densities(rows)[:, 1], rtol=1e-12)
    hits = head.score([Block(rows, None)]).correct
    assert hits == float(np.sum(np.argmax(probs, axis=1) == rows.target))
    history = rows.tokens[: int(rows.end[6])]  # the first document's first rows: short windows, then full ones
    predictor = head.predictor(query_table=table)
    for k, token in enumerate(history):
        predictor.push(int(token))
        window = np.asarray(history[max(0, k + 1 - shape[1]) : k + 1], dtype=np.int32)
        one = WindowRows(window, np.array([0]), np.array([window.size]), np.zeros(1, dtype=np.int32),
                         table, window[-1:].astype(np.int64), None, 0)  # fmt: skip
        np.testing.assert_allclose(predictor.predict(), head.window_proba(one, head.window_attention(one))[0],
                                   rtol=1e-12)  # fmt: skip
    # The triple rows were read: positions on a stored triple.
    assert head.triples is not None and head.triples.keys.size > 0
    assert (head.triple_of(rows, *_context_and_pairs(head, rows)) >= 0).any()


def _context_and_pairs(head: ConjHead, rows: WindowRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from dist_respattn.model.heads.conj.kernels import pair_of_cells
    from dist_respattn.model.heads.copy.kernels import copy_row_terms

    context, _ = copy_row_terms(rows, head.context_length)
    current = np.asarray(rows.tokens[rows.end - 1], dtype=np.int64)
    pair = np.full(context.shape, -1, dtype=np.int64)
    cols = slice(head.context_length - head.depth, head.context_length)
    pair[:, cols] = pair_of_cells(head.pair_keys, context[:, cols] * head.num_symbols + current[:, None])
    pair[head.window_attention(rows) <= 0.0] = -1
    return context, current, pair


@pytest.mark.parametrize("sparse", [False, True])
def test_the_order_three_grid_scores_every_point_as_its_head_does(sparse: bool) -> None:
    """One pass at every (beta, gamma, D, beta3, gamma3, D3), infinite strengths among them, equals each point's
    own head on weighted held-out rows beyond the support's."""
    from dist_respattn.model.heads.conj.kind import ConjGrid

    shape = (6, 4, 2, 6)
    rows, _ = stream_rows(25, shape[1], n_tokens=200)
    head = random_conj_head(shape, rows.select(slice(0, 120)), 3, 26, sparse=sparse, triple=(1.0, 0.0, 0.0))
    assert head.triples is not None
    points = ((0.5, 1.0, 0.5, 0.0, 0.0, 0.0), (2.0, 0.0, 0.8, 0.5, 1.0, 0.8), (np.inf, 0.0, 0.5, 0.2, 0.5, 0.5),
              (0.5, 0.5, 0.0, np.inf, 0.0, 0.0), (0.0, 0.5, 0.8, 5.0, 2.0, 0.5))  # fmt: skip
    block = Block(rows, np.random.default_rng(27).random(rows.num_rows))
    scores = ConjGrid(head, points).score([block])
    for point, totals in zip(points, scores.totals, strict=True):
        triples = head.triples.with_counts(head.triples.counts, *point[3:])
        mine = head.with_counts(head.counts, *point[:3], triples=triples).score([block], accuracy=False)
        assert totals.log_lik == pytest.approx(mine.log_lik, rel=1e-12)
        assert totals.target_log_prob == pytest.approx(mine.target_log_prob, rel=1e-12)


def test_order_three_maximum_likelihood_em_never_lowers_the_likelihood() -> None:
    """Every strength and discount 0 (maximum likelihood) and the rows' own supports: the training likelihood never
    falls. The positions of the ``depth`` most recent read their triple rows (their own counts) or, without a
    predecessor, the pair rows; with ``depth = N`` and full windows only the oldest position reads a pair row."""
    rng = np.random.default_rng(28)
    s, n_pos = 5, 3
    table = rng.dirichlet(np.full(s, 0.3), size=(s, s))
    context, query, target = trigram_rows(rng, table, 500, n_pos)
    # The rows' counts EM's own (responsibilities): rows counted from the data leave each row out, and at strength 0
    # a target a pair held once has nothing left without it.
    spec = ConjSpec(SingleHopSpec(sigma2=1.0, emission_smoothing=0.0, emission_layout="dense"), depth=n_pos,
                    strength=0.0, type_strength=0.0, discount=0.0, order=3, triple_strength=0.0,
                    triple_type_strength=0.0, triple_discount=0.0, row_counts="responsibilities")  # fmt: skip
    lls: list[float] = []
    result = fit_em((context, query, target), spec, shape=(s, n_pos, 2, s), holdout=HoldoutRule(0.0), max_iter=8,
                    tol=0.0, callback=lambda it, head: lls.append(it.mean_log_likelihood))  # fmt: skip
    assert isinstance(result.distribution, ConjHead)
    assert result.distribution.triples is not None and result.distribution.triples.strength == 0.0
    assert len(lls) == 8 and lls[-1] > lls[0]
    assert all(b >= a - 1e-12 * abs(a) for a, b in itertools.pairwise(lls)), lls


def test_order_three_round_trips_and_old_checkpoints_load_as_order_two() -> None:
    shape = (6, 4, 2, 6)
    rows, _ = stream_rows(29, shape[1])
    head = random_conj_head(shape, rows, 2, 30, triple=(0.4, 0.5, 0.2))
    arrays, meta = head.to_arrays()
    again = ConjHead.from_arrays(arrays, meta)
    assert again.order == 3 and again.triples is not None and head.triples is not None
    np.testing.assert_array_equal(again.row_densities(rows), head.row_densities(rows))
    old_meta = {k: v for k, v in meta.items() if not k.startswith(("order", "triple_"))}
    old = ConjHead.from_arrays({k: v for k, v in arrays.items() if "triple" not in k}, old_meta)
    assert old.order == 2 and old.triples is None
    assert head.summary()[0]["conj_triples"] == head.triples.keys.size


def test_the_conj_order_option_makes_the_spec_and_a_bad_one_names_its_flag() -> None:
    base = SingleHopSpec(sigma2=0.5)
    assert spec_from_args(parsed("--head", "conj", "--conj-order", "3"), base, None) == ConjSpec(base, order=3)
    assert spec_from_args(parsed("--head", "conj"), base, None).order == 2  # type: ignore[union-attr]
    old = ConjSpec(base).to_json()
    del old["order"]
    assert ConjSpec.from_json(old).order == 2
    for flags, message in [
        (("--head", "conj", "--conj-order", "4"), "--conj-order 4: expected 2 .* or 3"),
        (("--conj-order", "3"), "--conj-order sets a conjunction head: add --head conj"),
    ]:
        with pytest.raises(CommandError, match=message):
            spec_from_args(parsed(*flags), base, None)


def rows_at(rows: WindowRows, keep: np.ndarray) -> WindowRows:
    """The rows ``keep`` (indices or a mask) of ``rows``, over the same tokens."""
    return WindowRows(rows.tokens, rows.begin[keep], rows.end[keep], rows.target[keep], rows.query_table,
                      rows.query_index[keep], None, 0)  # fmt: skip


def data_counted_head(single: object, rows: WindowRows, depth: int, pair: tuple[float, float, float],
                      triple: tuple[float, float, float] | None, backoff: str) -> ConjHead:  # fmt: skip
    """A head over ``single`` whose pair (and triple) rows are ``rows``' own counts, as a fit with
    ``row_counts="data"`` starts: every cell the rows hold, each occurrence counted once."""
    s, t = single.num_symbols, single.num_targets  # type: ignore[attr-defined]
    tally = cell_tally(s, t, depth, iter([Block(rows, None)]))
    triples = None
    if triple is not None:
        tally3 = triple_tally(s, t, depth, iter([Block(rows, None)]))
        triples = TripleRows(*support_of(tally3, t, 1.0), support_counts(tally3, t, 1.0), *triple)
    return ConjHead(single, depth, *support_of(tally, t, 1.0), support_counts(tally, t, 1.0), *pair[:2],  # type: ignore[arg-type]
                    backoff=backoff, discount=pair[2], triples=triples)  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), n_pos=st.integers(1, 5), depth=st.integers(1, 5),
       vocab=st.sampled_from([2, 3, 7]), n_docs=st.integers(1, 3), sparse=st.booleans(),
       backoff=st.sampled_from(["attended", "current"]),
       pair=st.sampled_from([(1.5, 0.5, 0.0), (0.0, 1.0, 0.4), (0.2, 0.0, 1.5)]),
       triple=st.sampled_from([None, (0.7, 0.5, 0.0), (0.0, 1.0, 0.4), (2.0, 0.0, 1.5)]))  # fmt: skip
def test_leaving_one_out_explains_each_row_by_the_rows_counted_without_it(
    seed: int, n_pos: int, depth: int, vocab: int, n_docs: int, sparse: bool, backoff: str,
    pair: tuple[float, float, float], triple: tuple[float, float, float] | None,
) -> None:  # fmt: skip
    """Rows counted from the data: the E-step with ``leave_one_out`` over all rows equals, row by row, the
    per-position reference of the head whose rows were counted from every other row (a cell only that row held, and
    its type, gone; windows with repeats count a cell once for each of its positions). Some strength keeps every
    row possible: under maximum likelihood a target a pair held once has no probability left without it."""
    rng = np.random.default_rng(seed)
    shape = (7, n_pos, 2, 7)
    tokens, starts = corpus(rng, 30, vocab, n_docs)
    rows = windows_of(tokens, starts, n_pos, rng.normal(size=(7, 2)))
    single = random_distribution(*shape, seed=seed, sigma2=0.8)
    if sparse:
        single = single.with_emission(single.emission_table.restricted(PairSupport.full(shape[0], shape[3])))
    depth = min(depth, n_pos)
    head = data_counted_head(single, rows, depth, pair, triple, backoff)
    value = conj_statistics(head, [Block(rows, None)], leave_one_out=True)
    stats = value.stats
    counts = stats.emission_count
    if sparse:
        counts = counts.on(single.emission_table.support)  # type: ignore[attr-defined]
    theirs: dict[str, np.ndarray] = {}
    for i in range(rows.num_rows):
        others = data_counted_head(single, rows_at(rows, np.arange(rows.num_rows) != i), depth, pair, triple, backoff)
        for name, v in reference_statistics(others, rows_at(rows, np.array([i]))).items():
            if name not in ("cell_counts", "triple_counts"):  # each head of its own support
                theirs[name] = theirs[name] + v if name in theirs else v
    mine = {"key_sum": stats.key_sum, "key_mass": stats.key_mass, "emission_count": counts.to_dense(),
            "recency_mass": stats.position_count[::-1], "log_lik": np.array([stats.log_lik])}  # fmt: skip
    for name, v in mine.items():
        np.testing.assert_allclose(v, theirs[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_rows_counted_from_the_data_stay_the_tally_and_beat_fitted_rows_on_held_out_rows() -> None:
    """The default rows (``row_counts="data"``): the fitted head's pair and triple counts are the training rows'
    tally, every occurrence once, unchanged by EM; and on a trigram source its held-out perplexity is below that of
    rows whose counts EM fits (the responsibilities), which remember their own training rows."""
    rng = np.random.default_rng(31)
    s, n_pos = 12, 4
    table = rng.dirichlet(np.full(s, 0.2), size=(s, s))
    train, test = trigram_rows(rng, table, 1500, n_pos), trigram_rows(rng, table, 1000, n_pos)
    single_spec = SingleHopSpec(sigma2=1.0, emission_strength=1.0, type_strength=1.0, emission_layout="dense")
    fixed = ConjSpec(single_spec, strength=0.5, type_strength=0.5, discount=0.5, order=3, triple_strength=0.5,
                     triple_type_strength=0.5, triple_discount=0.5)  # fmt: skip
    head = fit_em(train, fixed, shape=(s, n_pos, 2, s), holdout=HoldoutRule(0.0), max_iter=3, tol=0.0).distribution
    assert isinstance(head, ConjHead) and head.triples is not None
    rows = WindowRows.from_encoded(*train)
    np.testing.assert_array_equal(head.counts, support_counts(cell_tally(s, s, 2, iter([Block(rows, None)])), s, 1.0))
    tally3 = triple_tally(s, s, 2, iter([Block(rows, None)]))
    np.testing.assert_array_equal(head.triples.counts, support_counts(tally3, s, 1.0))
    perplexity = {}
    for row_counts in ROW_COUNTS:  # the strengths chosen on the fit's held-out rows
        spec = ConjSpec(single_spec, order=3, row_counts=row_counts)
        fitted = fit_em(train, spec, shape=(s, n_pos, 2, s), max_iter=5, tol=0.0).distribution
        assert isinstance(fitted, ConjHead)
        score = fitted.score([Block(WindowRows.from_encoded(*test), None)])
        perplexity[row_counts] = float(np.exp(-score.target_log_prob / score.weight))
    assert perplexity["data"] < perplexity["responsibilities"], perplexity


def test_the_conj_counts_option_makes_the_spec_and_old_specs_keep_fitted_rows() -> None:
    base = SingleHopSpec(sigma2=0.5)
    assert spec_from_args(parsed("--head", "conj"), base, None).row_counts == "data"  # type: ignore[union-attr]
    fitted = spec_from_args(parsed("--head", "conj", "--conj-counts", "responsibilities"), base, None)
    assert fitted == ConjSpec(base, row_counts="responsibilities")
    assert ConjSpec.from_json(fitted.to_json()) == fitted  # type: ignore[union-attr]
    old = ConjSpec(base).to_json()
    del old["row_counts"]
    assert ConjSpec.from_json(old).row_counts == "responsibilities"  # a fit recorded before the choice resumes so
    with pytest.raises(ValueError, match="--conj-counts hard: expected one of data, responsibilities"):
        ConjSpec(base, row_counts="hard")
    with pytest.raises(CommandError, match="--conj-counts sets a conjunction head: add --head conj"):
        spec_from_args(parsed("--conj-counts", "data"), base, None)


def test_a_depth_beyond_the_window_is_refused_with_its_flag_and_the_window_named() -> None:
    """``--conj-depth 100`` on rows of N = 8 positions was read as 8 without a word."""
    spec = spec_from_args(parsed("--head", "conj", "--conj-depth", "5"), SingleHopSpec(sigma2=0.5), None)
    assert spec is not None
    with pytest.raises(ValueError, match=r"--conj-depth 5: expected at most the window N = 4"):
        spec.trainer(TrainerContext((7, 4, 2, 7)))
    assert spec.trainer(TrainerContext((7, 5, 2, 7))).depth == 5  # type: ignore[attr-defined]
