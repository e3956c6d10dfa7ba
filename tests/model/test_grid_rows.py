"""The held-out grid kernel (strength pairs side by side, repeated rows read back from their slots, each point's rows
of weight 1 added as one running product's logarithm) against the per-row kernel it replaced, on real rows: the same
choice and every total within 1e-12 of that kernel's (its logarithms ``math.log``'s or, as the grid kernel takes the
weighted rows', within 1 ulp of them), the same bits whatever the slots; and the running products against the
correctly rounded sum of the logarithms."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from dist_respattn import ResponsibilityAttentionEstimator
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.emission.prior import EmissionPrior
from dist_respattn.model.fitting.selection import (
    DEFAULT_SEARCH,
    GridRowCache,
    GridTotals,
    gate_softmax,
    grid_count,
    grid_count_arrays,
    grid_row,
    map_emissions,
    multiply_in,
    product_log,
    score_grid,
)
from dist_respattn.model.kernels.log_weights import log_positive_range, squared_distance
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.text import iter_text_files
from dist_respattn.store.ingest.to_stream import write_stream_text
from tests.stdlib_packages import package_corpus


@numba.njit(cache=True, nogil=True)
def _per_row_grid(
    context, query, target, weights, key_means, log_prior, emission_count_ts, indptr, symbols, pair_counts,
    row_totals, base, types, inv_two_sigma2, gate_const, emission_strengths, type_strengths, direct_row,
    direct_slots, vector_log, out_pred, out_joint,
):  # pragma: no cover - compiled  # fmt: skip
    """The grid pass as it was: every row on its own through ``grid_row`` (each strength pair's emissions, then
    each gate variance's softmax and every pair's sum, logarithm and terms); with ``vector_log`` the same steps,
    the pairs' logarithms by ``log_positive_range`` instead of ``math.log``."""
    n_rows, n_pos = context.shape
    n_emis = emission_strengths.shape[0] * type_strengths.shape[0]
    dist, count, total, typ = np.empty(n_pos), np.empty(n_pos), np.empty(n_pos), np.empty(n_pos)
    emis, gate, y = np.empty((n_emis, n_pos)), np.empty(n_pos), np.empty(query.shape[1])
    num, log_num, bits = np.empty(n_emis), np.empty(n_emis), np.empty(n_emis, dtype=np.int64)
    weight = 0.0
    for row in range(n_rows):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        for d in range(query.shape[1]):
            y[d] = np.float64(query[row, d])
        t = target[row]
        for i in range(n_pos):
            c = context[row, i]
            dist[i] = squared_distance(y, key_means, c)
            count[i] = grid_count(t, c, emission_count_ts, indptr, symbols, pair_counts, direct_row, direct_slots)
            total[i] = row_totals[c]
            typ[i] = types[c]
        if not vector_log:
            grid_row(
                w, n_pos, log_prior, dist, count, total, typ, base[t], inv_two_sigma2, gate_const, emission_strengths,
                type_strengths, emis, gate, out_pred, out_joint,
            )  # fmt: skip
            weight += w
            continue
        map_emissions(n_pos, count, total, typ, base[t], emission_strengths, type_strengths, emis)
        for g in range(inv_two_sigma2.shape[0]):
            best, z = gate_softmax(n_pos, log_prior, dist, inv_two_sigma2[g], gate)
            log_z = math.log(z)
            for k in range(n_emis):
                num[k] = 0.0
                for i in range(n_pos):
                    num[k] += gate[i] * emis[k, i]
            log_positive_range(num, log_num, n_emis, bits, bits.view(np.float64))
            for k in range(n_emis):
                out_pred[g, k] += w * (log_num[k] - log_z)
                out_joint[g, k] += w * (log_num[k] + best + gate_const[g])
        weight += w
    return weight


def per_row_totals(table, x, weights=None, *, vector_log=True) -> GridTotals:
    """The per-row kernel's totals; ``vector_log=False``: its logarithms ``math.log``'s."""
    context, query, target = (np.asarray(a) for a in x)
    g1, g2, g3 = table.shape
    pred, joint = np.zeros((g1, g2 * g3)), np.zeros((g1, g2 * g3))
    weight = _per_row_grid(
        context, query, target, np.zeros(0) if weights is None else np.asarray(weights, np.float64),
        table.key_means, table.log_prior, *grid_count_arrays(table), np.asarray(table.row_totals, np.float64),
        table.base, table.types, 0.5 / table.sigma2, -0.5 * query.shape[1] * np.log(2.0 * np.pi * table.sigma2),
        table.emission_strengths, table.type_strengths, *table.direct_pair_rows, vector_log, pred, joint,
    )  # fmt: skip
    return GridTotals(float(weight), pred.reshape(g1, g2, g3), joint.reshape(g1, g2, g3))


@pytest.fixture(scope="module")
def real_rows(tmp_path_factory):
    """Rows of Python source (standard-library packages, 400 words, N = 8, D = 16) and the whole first grid of a
    uniform start over them (600 points), sparse and dense."""
    base = tmp_path_factory.mktemp("grid-rows")
    files = iter_text_files([package_corpus(base / "corpus")])
    store = write_stream_text(base / "train.zarr", files, 8, vocab_size=400, dim=16, options=WriteOptions())
    data = store.read_rows(0, store.num_rows).encoded
    s = store.schema
    shape = (s.num_symbols, s.context_length, s.query_dim, s.num_targets)
    pairs = PairCounts.from_rows(data[0][:, -1], data[2], None, num_symbols=shape[0], num_targets=shape[3])
    estimator = ResponsibilityAttentionEstimator(
        *shape, emission_prior=EmissionPrior.from_pairs(pairs, "continuation"), search=DEFAULT_SEARCH
    )
    tables = {}
    for layout in ("sparse", "dense"):
        accumulator = estimator.accumulator_factory(layout=layout).make()
        accumulator.seq_initialize_uniform(data, None)
        tables[layout] = estimator.candidates(accumulator.value()).grid_table(DEFAULT_SEARCH)
    return data, tables


def _same(a: GridTotals, b: GridTotals) -> bool:
    return (
        a.weight == b.weight
        and np.array_equal(a.target_log_prob, b.target_log_prob)
        and np.array_equal(a.log_lik, b.log_lik)
    )


def _close(a: GridTotals, b: GridTotals, rtol: float = 1e-12) -> bool:
    """Every point's totals within ``rtol`` of ``b``'s, relatively, and the same weight."""
    return (
        a.weight == b.weight
        and bool(np.all(np.abs(a.target_log_prob - b.target_log_prob) <= rtol * np.abs(b.target_log_prob)))
        and bool(np.all(np.abs(a.log_lik - b.log_lik) <= rtol * np.abs(b.log_lik)))
    )


def _repeated_rows(x) -> int:
    context, query, target = x
    rows = np.concatenate(
        [context.astype(np.int64).view(np.uint8).reshape(len(target), -1),
         np.ascontiguousarray(query).view(np.uint8).reshape(len(target), -1),
         target.astype(np.int64).view(np.uint8).reshape(len(target), -1)], axis=1,
    )  # fmt: skip
    return len(target) - len(np.unique(rows, axis=0))


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_the_grid_kernel_agrees_with_the_per_row_one_and_its_slots_change_no_bit(real_rows, layout):
    data, tables = real_rows
    table = tables[layout]
    assert table.shape == (10, 10, 6)
    repeated = _repeated_rows(data)
    assert repeated > len(data[2]) // 10  # source code repeats itself: the slots have rows to find
    per_row = per_row_totals(table, data)
    with_libm = per_row_totals(table, data, vector_log=False)
    want = score_grid(table, data, rows=GridRowCache(table, data[1].shape[1], data[0].shape[1], 0))
    assert _close(want, per_row) and _close(want, with_libm) and want.best() == with_libm.best()
    assert not _same(want, with_libm)  # the order of the sums differs: the comparison is not of one code with itself
    for slots in (1, 16, 1024):
        rows = GridRowCache(table, data[1].shape[1], data[0].shape[1], slots)
        assert _same(score_grid(table, data, rows=rows), want), slots  # a row read back adds what it computed
        assert rows.hits[0] > 0
    # 1024 slots find most repeated rows.
    assert rows.hits[0] > repeated // 2
    if layout == "sparse":  # the direct rows and the binary searches both met
        direct_row, _ = table.direct_pair_rows
        assert (direct_row >= 0).any() and (direct_row[data[2]] < 0).any()


def _lru_hits(x, slots: int) -> int:
    """How many rows a least-recently-used cache of ``slots`` rows would find, the batch's rows in order."""
    context, query, target = x
    cache: dict[bytes, None] = {}
    hits = 0
    for j in range(len(target)):
        key = context[j].tobytes() + np.ascontiguousarray(query[j]).tobytes() + int(target[j]).to_bytes(8, "little")
        if key in cache:
            hits += 1
            cache[key] = cache.pop(key)
        else:
            cache[key] = None
            if len(cache) > slots:
                del cache[next(iter(cache))]
    return hits


def test_the_slots_keep_the_rows_used_again_soonest(real_rows):
    """The rows a batch keeps are chosen knowing it: with a slot for every distinct row each repeated row is found,
    in one batch or in blocks; with fewer, at least what a least-recently-used cache finds; the same bits."""
    data, tables = real_rows
    table = tables["sparse"]
    repeated = _repeated_rows(data)
    want = score_grid(table, data, rows=GridRowCache(table, data[1].shape[1], data[0].shape[1], 0))
    many = 1 << (len(data[2]) - repeated).bit_length()
    rows = GridRowCache(table, data[1].shape[1], data[0].shape[1], many)
    assert _same(score_grid(table, data, rows=rows), want)
    assert rows.hits[0] == repeated
    rows = GridRowCache(table, data[1].shape[1], data[0].shape[1], many)
    got = GridTotals.zeros(table.shape)
    for start in range(0, len(data[2]), 3000):
        got = got + score_grid(table, tuple(a[start : start + 3000] for a in data), checked=True, rows=rows)
    assert rows.hits[0] == repeated  # rows kept from the blocks before are found
    assert _close(got, want)  # each block's products' logarithms taken on their own
    for slots in (1, 16, 256):
        rows = GridRowCache(table, data[1].shape[1], data[0].shape[1], slots)
        assert _same(score_grid(table, data, rows=rows), want), slots
        assert rows.hits[0] >= _lru_hits(data, slots) > 0, slots


def test_weighted_rows_in_blocks_with_one_cache(real_rows):
    """Weights (a hold-out's zeros and ones among them) and blocks sharing the cache, as a partition's grid pass
    scores them: the per-row kernel's totals block by block to 1e-12, and a row of weight 0 neither scored nor
    kept."""
    data, tables = real_rows
    table = tables["sparse"]
    rng = np.random.default_rng(7)
    weights = rng.uniform(0.5, 2.0, len(data[2]))
    weights[rng.random(len(weights)) < 0.3] = 0.0
    weights[rng.random(len(weights)) < 0.3] = 1.0  # rows of weight 1 go by the products, the others by logarithms
    rows = GridRowCache(table, data[1].shape[1], data[0].shape[1])
    got = want = GridTotals.zeros(table.shape)
    for start in range(0, len(weights), 5000):
        block = tuple(a[start : start + 5000] for a in data)
        got = got + score_grid(table, block, weights[start : start + 5000], checked=True, rows=rows)
        want = want + per_row_totals(table, block, weights[start : start + 5000])
    assert _close(got, want) and rows.hits[0] > 0 and got.best() == want.best()
    libm = GridTotals.zeros(table.shape)
    for start in range(0, len(weights), 5000):
        block = tuple(a[start : start + 5000] for a in data)
        libm = libm + per_row_totals(table, block, weights[start : start + 5000], vector_log=False)
    assert _close(got, libm)


def test_a_cache_serves_its_own_table(real_rows):
    data, tables = real_rows
    rows = GridRowCache(tables["sparse"], data[1].shape[1], data[0].shape[1])
    with pytest.raises(ValueError, match="the table it was made for"):
        score_grid(tables["dense"], data, rows=rows)
    with pytest.raises(ValueError, match="a power of two"):
        GridRowCache(tables["sparse"], data[1].shape[1], data[0].shape[1], 1000)


def test_running_products_give_the_sum_of_the_logarithms_to_rounding():
    """Factors from 0 and 1e-300 (under 2^-500: added as logarithms) to 8, in runs that push the product past 2^-500
    and past 2^500, against ``math.fsum`` of their ``math.log``'s: within a rounding a factor (a product of n factors is
    within n ulp of the exact one); a zero factor makes its total -inf and no other."""
    rng = np.random.default_rng(3)
    n, k = 20_000, 6
    factors = np.exp(rng.uniform(-12.0, 2.0, (n, k)))
    factors[:, 1] = rng.uniform(1.0, 8.0, n)  # large factors: the product rescaled downwards
    factors[3000:6000, 2] = rng.uniform(1e-40, 1e-30, 3000)  # and of small ones: rescaled upwards, many times
    factors[rng.integers(0, n, 50), 3] = 1e-300
    factors[1234, 4] = 0.0
    product, steps, logged = np.ones(k), np.zeros(k), np.zeros(k)
    for row in factors:
        multiply_in(row, product, steps, logged)
    assert steps[1] > 0 and steps[2] < -100 and logged[3] < 0.0  # every path taken
    got = np.array([product_log(product[j], steps[j], logged[j]) for j in range(k)])
    for j in range(k):
        if j == 4:
            assert got[j] == -np.inf
            continue
        want = math.fsum(math.log(v) for v in factors[:, j])
        assert abs(got[j] - want) <= n * 2.0**-52 + 4 * np.spacing(abs(want)), (j, got[j], want)
