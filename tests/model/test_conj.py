"""The conjunction head's math: its kernel against a per-position NumPy writing of the model, the single head when
the pair strength is infinite, rows that normalize, a trigram source it learns, and the distributed fit on one and
two workers equal to the in-process one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.cli import build_parser
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.conj import ConjHead, ConjSpec
from dist_respattn.model.heads.conj.kernels import ConjArrays, conj_estep
from dist_respattn.model.heads.conj.kind import cell_tally, conj_statistics, support_of
from dist_respattn.model.heads.single_hop.accumulator import ResponsibilityAttentionAccumulator
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.kernels.per_position import StatisticArrays
from dist_respattn.model.rows import EncodedRows, WindowRows
from tests.model.test_copy import corpus, windows_of


def random_conj_head(shape: tuple[int, int, int, int], rows: WindowRows, depth: int, seed: int, *,
                     strength: float = 1.5, type_strength: float = 0.5, sparse: bool = False,
                     backoff: str = "attended", discount: float = 0.0) -> ConjHead:  # fmt: skip
    """A random single head with the pair rows of ``rows`` (every pair stored) and random counts."""
    rng = np.random.default_rng(seed)
    single = random_distribution(*shape, seed=seed, sigma2=0.8)
    if sparse:
        single = single.with_emission(single.emission_table.restricted(PairSupport.full(shape[0], shape[3])))
    tally = cell_tally(shape[0], shape[3], depth, iter([Block(rows, None)]))
    pair_keys, indptr, targets = support_of(tally, shape[3], 1.0)
    counts = rng.exponential(size=targets.size) * (rng.random(targets.size) < 0.8)  # some cells at 0
    return ConjHead(single, depth, pair_keys, indptr, targets, counts, strength, type_strength, backoff=backoff,
                    discount=discount)  # fmt: skip


def reference_statistics(head: ConjHead, rows: WindowRows) -> dict[str, np.ndarray]:
    """The E-step written position by position: responsibilities under the pair rows, the rejected draws."""
    single = head.single
    s, n_pos, d, t_n = head.shape
    emission = single.emission_table.to_dense()
    index = {int(key): p for p, key in enumerate(head.pair_keys)}
    cell_of = {}
    for p in range(head.num_pairs):
        for m in range(head.indptr[p], head.indptr[p + 1]):
            cell_of[(p, int(head.targets[m]))] = m
    out = {"key_sum": np.zeros((s, d)), "key_mass": np.zeros(s), "emission_count": np.zeros((s, t_n)),
           "recency_mass": np.zeros(n_pos), "cell_counts": np.zeros(head.num_cells),
           "log_lik": np.zeros(1)}  # fmt: skip
    for row in range(rows.num_rows):
        window = rows.tokens[rows.begin[row] : rows.end[row]]
        m = window.shape[0]
        y = rows.query_table[rows.query_index[row]].astype(np.float64)
        t, q = int(rows.target[row]), int(window[-1])
        recency = np.arange(m)[::-1]
        prior = single.position_prior[n_pos - 1 - recency]
        area = single.position_prior[n_pos - m :].sum()
        gauss = np.exp(-((y - single.key_means[window]) ** 2).sum(axis=1) / (2 * single.sigma2))
        gauss *= (2 * np.pi * single.sigma2) ** (-d / 2)
        e = np.empty(m)
        cells = [-1] * m
        for j in range(m):
            c = int(window[j])
            p = index.get(c * s + q) if recency[j] < head.depth else None
            if p is None:
                e[j] = emission[c, t]
                continue
            lo, hi = head.indptr[p], head.indptr[p + 1]
            n_p = head.counts[lo:hi].sum()
            s_p = head.strength + head.type_strength * (hi - lo)
            cells[j] = cell_of[(p, t)]
            lean = q if head.backoff == "current" else c
            moved = np.minimum(head.counts[lo:hi], head.discount).sum()
            n_t = head.counts[cells[j]]
            e[j] = (n_t - min(n_t, head.discount) + (s_p + moved) * emission[lean, t]) / (n_p + s_p)
        joint = prior / area * gauss * e
        r = joint / joint.sum()
        for j in range(m):
            c = int(window[j])
            out["key_sum"][c] += r[j] * y
            out["key_mass"][c] += r[j]
            out["emission_count"][c, t] += r[j]
            if cells[j] >= 0:
                out["cell_counts"][cells[j]] += r[j]
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
            "log_lik": np.array([stats.log_lik])}  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), n_pos=st.integers(1, 5), depth=st.integers(1, 5),
       vocab=st.sampled_from([2, 3, 7]), n_docs=st.integers(1, 3), sparse=st.booleans(),
       backoff=st.sampled_from(["attended", "current"]), discount=st.sampled_from([0.0, 0.3, 1.5]))  # fmt: skip
def test_kernel_equals_the_per_position_reference(
    seed: int, n_pos: int, depth: int, vocab: int, n_docs: int, sparse: bool, backoff: str, discount: float
) -> None:
    rng = np.random.default_rng(seed)
    shape = (7, n_pos, 2, 7)
    tokens, starts = corpus(rng, 40, vocab, n_docs)
    rows = windows_of(tokens, starts, n_pos, rng.normal(size=(7, 2)))
    head = random_conj_head(shape, rows, min(depth, n_pos), seed, sparse=sparse, backoff=backoff, discount=discount)
    mine, theirs = kernel_statistics(head, rows), reference_statistics(head, rows)
    for name, value in theirs.items():
        np.testing.assert_allclose(mine[name], value, rtol=1e-12, atol=1e-12, err_msg=name)


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
    in-process fit to 1e-12, and the two distributed fits bit for bit."""
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
                    depth=2, strength=1.0, type_strength=0.5, discount=0.5)  # fmt: skip
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
    assert fitted[0]["conj_counts"].sum() > 0.0


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
