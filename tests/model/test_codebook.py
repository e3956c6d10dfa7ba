"""The codebook head's math: its compiled E-step, scores and predictions against a per-position NumPy writing of the
model, EM's monotone likelihood, the codebooks' determinism, and the streaming predictor's state."""

from __future__ import annotations

import itertools
import math
import pickle
import sys
import threading

import numpy as np
import pytest

from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.codebook import CodebookHead, CodebookSpec, spec_from_options
from dist_respattn.model.heads.codebook.kernels import CodebookArrays, NearCounts, _query_sums, take_near_counts
from dist_respattn.model.heads.codebook.kind import CodebookTrainer, codebook_statistics, start_head
from dist_respattn.model.heads.codebook.quantize import codebook_assignment
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.rows import WindowRows

FIELDS = ("key_sum", "key_mass", "emission_count", "code_sum", "code_mass", "code_count", "prior_mass",
          "omega_mass", "scalars")  # fmt: skip


def field(stats: object, name: str) -> np.ndarray:
    """A statistic as the reference writes it: the codeword counts (T, B, W) as (B, W, T)."""
    value = getattr(stats, name)
    return value.transpose(1, 2, 0) if name == "code_count" else value


def stream_rows(tokens: np.ndarray, starts: list[int], n_pos: int, query_table: np.ndarray,
                weight: np.ndarray | None = None) -> WindowRows:  # fmt: skip
    """Every next-token row of ``tokens`` cut into documents at ``starts`` (windows shorter than N at a document's
    start), the query the previous token's row of ``query_table``."""
    begin, end = [], []
    for lo, hi in itertools.pairwise([*starts, tokens.shape[0]]):
        for x in range(lo + 1, hi):
            begin.append(max(lo, x - n_pos))
            end.append(x)
    b, e = np.array(begin, dtype=np.int64), np.array(end, dtype=np.int64)
    w = None if weight is None else weight[: b.shape[0]]
    return WindowRows(tokens, b, e, tokens[e].astype(np.int32), query_table, tokens[e - 1].astype(np.int64), w, 0)


def random_head(seed: int, s: int = 9, n_pos: int = 12, d: int = 3, t: int = 9, n0: int = 3, books: int = 3,
                words: int = 4) -> CodebookHead:  # fmt: skip
    """A codebook head with every parameter drawn at random (a far prior well away from 0)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, words, size=(s, books))
    prior = rng.dirichlet(np.ones(n0 + 1))
    return CodebookHead(
        codes, rng.normal(size=(s, d)), 0.5 + rng.random(), prior, rng.dirichlet(np.ones(books)),
        rng.normal(size=(books, words, d)), rng.dirichlet(np.ones(t), size=s),
        rng.dirichlet(np.ones(t), size=(books, words)), n_pos,
    )  # fmt: skip


def reference_terms(
    head: CodebookHead, window: np.ndarray, y: np.ndarray
) -> list[tuple[str, tuple, float, np.ndarray]]:
    """Every term of ``p(y, t | window)`` written position by position, before the emission: ``(where, index,
    log prior x gate, emission row (T,))`` for each near position (``("near", (r, c))``) and each (far position,
    codebook) pair (``("far", (b, w))``, the position's codeword), renormalized over the options the window has."""
    n0, m = head.near_window, window.shape[0]
    m0 = min(m, n0)
    far = window[: m - m0]
    mass = head.prior[:m0].sum() + (head.prior[-1] if far.size else 0.0)
    const = -0.5 * head.query_dim * math.log(2 * math.pi * head.sigma2)
    terms = []
    for r in range(m0):
        c = int(window[m - 1 - r])
        gate = -((y - head.key_means[c]) ** 2).sum() / (2 * head.sigma2) + const
        terms.append(("near", (r, c), math.log(head.prior[r] / mass) + gate, head.emission[c]))
    for i in range(far.size):
        for b in range(head.num_codebooks):
            w = int(head.codes[far[i], b])
            gate = -((y - head.code_means[b, w]) ** 2).sum() / (2 * head.sigma2) + const
            share = head.prior[-1] * head.omega[b] / far.size / mass
            terms.append(("far", (b, w), math.log(share) + gate, head.code_emission[b, w]))
    return terms


def reference_statistics(head: CodebookHead, rows: WindowRows) -> dict[str, np.ndarray]:
    """The E-step written term by term (:func:`reference_terms`), with a short window's rejected draws."""
    s, _, d, t_n = head.shape
    n0, nb, nw = head.near_window, head.num_codebooks, head.num_codewords
    out = {"key_sum": np.zeros((s, d)), "key_mass": np.zeros(s), "emission_count": np.zeros((s, t_n)),
           "code_sum": np.zeros((nb, nw, d)), "code_mass": np.zeros((nb, nw)), "code_count": np.zeros((nb, nw, t_n)),
           "prior_mass": np.zeros(n0 + 1), "omega_mass": np.zeros(nb), "scalars": np.zeros(2)}  # fmt: skip
    for row in range(rows.num_rows):
        wt = 1.0 if rows.weight is None else float(rows.weight[row])
        if wt == 0.0:
            continue
        window = rows.tokens[rows.begin[row] : rows.end[row]]
        y = rows.query_table[rows.query_index[row]].astype(np.float64)
        t = int(rows.target[row])
        terms = reference_terms(head, window, y)
        with np.errstate(divide="ignore"):
            logs = np.array([lw + math.log(e[t]) if e[t] > 0 else -np.inf for _, _, lw, e in terms])
        log_p = float(np.logaddexp.reduce(logs))
        out["scalars"] += [wt, wt * log_p]
        resp = wt * np.exp(logs - log_p)
        for (where, index, _, _), a in zip(terms, resp, strict=True):
            if where == "near":
                r, c = index
                out["key_sum"][c] += a * y
                out["key_mass"][c] += a
                out["emission_count"][c, t] += a
                out["prior_mass"][r] += a
            else:
                b, w = index
                out["code_sum"][b, w] += a * y
                out["code_mass"][b, w] += a
                out["code_count"][b, w, t] += a
                out["omega_mass"][b] += a
                out["prior_mass"][n0] += a
        m = window.shape[0]
        m0 = min(m, n0)
        mass = head.prior[:m0].sum() + (head.prior[-1] if m > n0 else 0.0)
        for r in range(m0, n0):
            out["prior_mass"][r] += wt * head.prior[r] / mass
        if m <= n0:
            out["prior_mass"][n0] += wt * head.prior[n0] / mass
    return out


def reference_proba(head: CodebookHead, window: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(T,) ``p(t | window, y)`` term by term."""
    terms = reference_terms(head, window, y)
    logs = np.array([lw for _, _, lw, _ in terms])
    a = np.exp(logs - np.logaddexp.reduce(logs))
    return sum(w * e for w, (_, _, _, e) in zip(a, terms, strict=True))


def case_rows(seed: int, head: CodebookHead, weighted: bool) -> WindowRows:
    """A token stream of a few documents (some shorter than N0, some longer than N), repeats within windows."""
    rng = np.random.default_rng(seed + 100)
    tokens = rng.integers(0, head.num_symbols, size=90).astype(np.int32)
    starts = sorted({0, *rng.choice(np.arange(1, 88), size=4, replace=False).tolist()})
    # A query table of more rows than a block (odd seeds) makes every row compute its own codeword distances.
    table = rng.normal(size=(head.num_symbols if seed % 2 == 0 else 200, head.query_dim)).astype(np.float32)
    weight = None
    if weighted:
        weight = rng.random(90) * 2
        weight[rng.random(90) < 0.2] = 0.0
    return stream_rows(tokens, starts, head.context_length, table, weight)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("weighted", [False, True])
def test_the_estep_equals_the_per_position_reference(seed: int, weighted: bool) -> None:
    head = random_head(seed, n0=1 + seed % 4, books=1 + seed % 3, words=2 + seed % 4)
    rows = case_rows(seed, head, weighted)
    expected = reference_statistics(head, rows)
    # In one block and cut in three (the far counts rebuilt where a block starts).
    cuts = [0, rows.num_rows // 3, 2 * rows.num_rows // 3, rows.num_rows]
    for blocks in ([rows], [rows.select(slice(a, b)) for a, b in itertools.pairwise(cuts)]):
        got = codebook_statistics(head, (Block(r, r.weight) for r in blocks))
        for name in FIELDS:
            want = expected[name]
            scale = max(float(np.abs(want).max()), 1.0)
            np.testing.assert_allclose(field(got, name), want, rtol=0, atol=1e-12 * scale, err_msg=name)


@pytest.mark.parametrize("cached", [True, False])
def test_far_terms_far_below_the_nearest_codeword_are_kept(cached: bool) -> None:
    """Every query sits on codeword 0 of each codebook, which no symbol uses, and at a squared distance of about 2,700
    (2 sigma2 = 1) from the codewords in use and from every key: the far cells' terms relative to the nearest codeword
    underflow (exp(-2700)), yet the far field holds a fair share of each row against the near positions, and the
    E-step must still count it."""
    rng = np.random.default_rng(7)
    s, n_pos, d, t, n0, books, words = 9, 12, 3, 9, 3, 2, 4
    codes = rng.integers(1, words, size=(s, books))
    code_means = rng.normal(size=(books, words, d)) * 0.1 + 30.0
    code_means[:, 0] = 0.0
    head = CodebookHead(
        codes, rng.normal(size=(s, d)) * 0.1 + 30.0, 0.5, rng.dirichlet(np.ones(n0 + 1)),
        rng.dirichlet(np.ones(books)), code_means, rng.dirichlet(np.ones(t), size=s),
        rng.dirichlet(np.ones(t), size=(books, words)), n_pos,
    )  # fmt: skip
    tokens = rng.integers(0, s, size=60).astype(np.int32)
    table = rng.normal(size=(s if cached else 100, d)) * 0.01
    rows = stream_rows(tokens, [0, 25], n_pos, table)
    expected = reference_statistics(head, rows)
    got = codebook_statistics(head, [Block(rows, None)])
    assert expected["omega_mass"].sum() > 0.05 * expected["scalars"][0]  # the far field matters
    for name in FIELDS:
        want = expected[name]
        scale = max(float(np.abs(want).max()), 1.0)
        np.testing.assert_allclose(field(got, name), want, rtol=0, atol=1e-12 * scale, err_msg=name)


@pytest.mark.parametrize("seed", range(4))
def test_scores_and_predictions_equal_the_reference(seed: int) -> None:
    head = random_head(seed + 10, n0=2 + seed % 3)
    rows = case_rows(seed, head, weighted=False)
    dens = head.row_densities(rows)
    probs = head.block_proba(Block(rows, None))
    stats = codebook_statistics(head, [Block(rows, None)])
    assert float(dens.sum()) == pytest.approx(stats.log_lik, rel=1e-12)
    for row in range(rows.num_rows):
        window = rows.tokens[rows.begin[row] : rows.end[row]]
        want = reference_proba(head, window, rows.query_table[rows.query_index[row]].astype(np.float64))
        np.testing.assert_allclose(probs[row], want, rtol=0, atol=1e-12)
        assert dens[row, 1] == pytest.approx(math.log(want[rows.target[row]]), abs=1e-12)
    top = head.top_k(Block(rows, None), 3)
    np.testing.assert_allclose(top.probabilities, np.sort(probs, axis=1)[:, ::-1][:, :3], atol=1e-15)
    # The attention per position sums to 1 over the window (its far positions share their cells').
    np.testing.assert_allclose(top.attention.sum(axis=1), 1.0, atol=1e-12)


def test_the_streaming_predictor_equals_the_window_and_its_state_does_not_grow() -> None:
    head = random_head(3, n_pos=10, n0=3)
    rng = np.random.default_rng(0)
    history = rng.integers(0, head.num_symbols, size=60)
    table = rng.normal(size=(head.num_symbols, head.query_dim))
    predictor = head.predictor(query_table=table)
    sizes = []
    for x, token in enumerate(history):
        predictor.push(int(token))
        sizes.append(predictor.state_size)
        window = history[max(0, x + 1 - head.context_length) : x + 1]
        want = reference_proba(head, window, table[token])
        np.testing.assert_allclose(predictor.predict(), want, rtol=0, atol=1e-12)
    assert max(sizes) == head.context_length
    assert predictor.n_far == head.context_length - head.near_window
    assert predictor.hist.sum() == head.num_codebooks * predictor.n_far


def single_start(seed: int = 0):
    shape = (10, 4, 2, 10)
    truth = random_distribution(*shape, seed=seed, sigma2=0.5)
    context, query, target = truth.sampler(seed + 1).sample_arrays(400)
    spec = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense")
    return fit_em((context, query, target), spec, shape=shape, max_iter=3, tol=0.0).distribution


def test_maximum_likelihood_em_never_lowers_the_likelihood_on_short_windows_and_weights() -> None:
    single = single_start()
    spec = CodebookSpec(near_window=3, codebooks=2, codewords=3, emission_strength=0.0, code_strength=0.0,
                        start=single)  # fmt: skip
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 10, size=500).astype(np.int32)
    table = rng.normal(size=(10, 2)).astype(np.float32)
    rows = stream_rows(tokens, [0, 40, 41, 200, 330], 12, table, rng.random(500) * 2)
    trainer = CodebookTrainer(spec, (10, 12, 2, 10), single)

    class Quiet:
        def say(self, line: str) -> None:
            pass

    head = trainer.prepare(None, resumed=False, passes=Quiet())  # type: ignore[arg-type]
    history = []
    for _ in range(15):
        stats = trainer.statistics(head, iter([Block(rows, rows.weight)]))
        history.append(stats.log_lik / stats.n_obs)
        candidates = trainer.m_step(stats, head)
        head = candidates.model(candidates.default())
    for before, after in itertools.pairwise(history):
        assert after >= before - 1e-12 * abs(before), history
    assert history[-1] > history[0] + 1e-3


def test_fit_em_of_the_codebook_head_rises_and_is_deterministic() -> None:
    single = single_start(1)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 10, size=900)
    context = np.lib.stride_tricks.sliding_window_view(tokens[:-1], 12)[:800].astype(np.int32)
    target = tokens[12:812].astype(np.int32)
    query = rng.normal(size=(800, 2)).astype(np.float32).astype(np.float64)
    spec = CodebookSpec(near_window=4, codebooks=2, codewords=3, emission_strength=0.0, code_strength=0.0,
                        start=single)  # fmt: skip
    first = fit_em((context, query, target), spec, shape=(10, 12, 2, 10), max_iter=8, tol=0.0)
    again = fit_em((context, query, target), spec, shape=(10, 12, 2, 10), max_iter=8, tol=0.0)
    history = first.log_likelihoods
    assert all(b >= a - 1e-12 * abs(a) for a, b in itertools.pairwise(history)), history
    assert history[-1] > history[0]
    assert first.log_likelihoods == again.log_likelihoods
    assert np.array_equal(first.distribution.codes, again.distribution.codes)


def test_the_codebooks_are_deterministic_and_use_every_codeword() -> None:
    keys = np.random.default_rng(0).normal(size=(200, 8))
    codes = codebook_assignment(keys, codebooks=4, codewords=16, seed=3)
    assert codes.shape == (200, 4)
    assert np.array_equal(codes, codebook_assignment(keys.copy(), codebooks=4, codewords=16, seed=3))
    assert not np.array_equal(codes, codebook_assignment(keys, codebooks=4, codewords=16, seed=4))
    assert all(len(np.unique(codes[:, b])) == 16 for b in range(4))
    # Different codebooks partition the symbols differently (their subspaces differ).
    assert not np.array_equal(codes[:, 0], codes[:, 1])


def test_the_start_head_keeps_the_single_heads_near_part() -> None:
    single = single_start()
    head = start_head(single, CodebookSpec(near_window=3, codebooks=2, codewords=4), 12)
    np.testing.assert_array_equal(head.key_means, single.key_means)
    np.testing.assert_allclose(head.emission, single.emission_table.to_dense())
    by_recency = single.position_prior[::-1][:3]
    np.testing.assert_allclose(head.prior[:3], 0.75 * by_recency / by_recency.sum())
    assert head.prior[3] == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"near_window": 0}, "--near-window 0: expected a positive whole number"),
        ({"codebooks": -1}, "--codebooks -1: expected a positive whole number"),
        ({"codewords": 1}, "--codewords 1: expected at least 2"),
        ({"codebook_from": None}, "--head codebook needs --codebook-from MODEL_DIR"),
    ],
)
def test_bad_options_are_refused_naming_the_flag(options: dict, message: str) -> None:
    given = {"head": "codebook", "codebook_from": "model", **options}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        spec_from_options(given, SingleHopSpec(), None)


def test_codebook_options_without_the_head_are_refused() -> None:
    with pytest.raises(ValueError, match="--codebooks is an option of --head codebook"):
        spec_from_options({"head": None, "codebooks": 4}, SingleHopSpec(), None)
    assert spec_from_options({"head": None}, SingleHopSpec(), None) is None


def test_a_resumed_fit_keeps_the_priors_centres_from_its_checkpoint() -> None:
    from dist_respattn.model.heads.base import TrainerContext

    single = single_start()
    spec = CodebookSpec(near_window=3, codebooks=2, codewords=4, start=single)
    trainer = spec.trainer(TrainerContext((10, 12, 2, 10)))

    class Quiet:
        def say(self, line: str) -> None:
            pass

    head = trainer.prepare(None, resumed=False, passes=Quiet())  # type: ignore[arg-type]
    extras, _ = trainer.checkpoint_extras()
    saved = CodebookSpec(near_window=3, codebooks=2, codewords=4)  # a resumed fit: no start, its checkpoint's arrays
    resumed = saved.trainer(TrainerContext((10, 12, 2, 10), saved_meta={"iteration": 1}, saved_arrays=extras))
    assert resumed.centres is not None
    np.testing.assert_array_equal(resumed.centres[0], head.emission)
    np.testing.assert_array_equal(resumed.centres[1], head.code_emission)


def _exact_fields(stats: object) -> list[np.ndarray]:
    return [np.array(field(stats, name)) for name in FIELDS]


def _fresh_thread(run):  # type: ignore[no-untyped-def]
    """``run()`` on a new thread, whose E-step tables start empty."""
    out: list = []
    worker = threading.Thread(target=lambda: out.append(run()))
    worker.start()
    worker.join()
    return out[0]


def test_the_tables_kept_from_pass_to_pass_give_the_same_statistics() -> None:
    """A thread keeps its near count table and query responsibilities between passes, and a head its gates: a pass
    after passes of other shapes, of another query table, or one that failed halfway gives, bit for bit, the
    statistics of a pass on new tables, which equal the reference."""
    head = random_head(3, n0=2, books=2, words=3)
    rows = case_rows(2, head, weighted=True)  # a query table of S rows: the gates and query sums kept per table row
    other = random_head(5, s=7, t=11, n0=3, books=3, words=2)
    other_rows = case_rows(4, other, weighted=False)
    fresh = _exact_fields(_fresh_thread(lambda: codebook_statistics(head, [Block(rows, rows.weight)])))
    expected = reference_statistics(head, rows)
    for name, got in zip(FIELDS, fresh, strict=True):
        scale = max(float(np.abs(expected[name]).max()), 1.0)
        np.testing.assert_allclose(got, expected[name], rtol=0, atol=1e-12 * scale, err_msg=name)

    def again() -> None:
        for name, a, b in zip(FIELDS, _exact_fields(codebook_statistics(head, [Block(rows, rows.weight)])), fresh,
                              strict=True):  # fmt: skip
            np.testing.assert_array_equal(a, b, err_msg=name)

    def failing():  # type: ignore[no-untyped-def]
        yield Block(rows, rows.weight)
        raise RuntimeError("the block reader failed")

    again()
    again()  # the thread's tables now hold the last pass's stamps and have been cleared once
    codebook_statistics(other, [Block(other_rows, None)])  # other shapes: S, T, N0 and B W
    again()
    moved = rows._replace(query_table=rows.query_table + np.float32(0.5))  # the same shapes, another query table
    codebook_statistics(head, [Block(moved, rows.weight)])
    again()
    with pytest.raises(RuntimeError, match="block reader"):
        codebook_statistics(head, failing())
    again()
    rows.query_table[0] += np.float32(1.0)  # a table changed in place is not taken for the one whose gates are kept
    changed = _exact_fields(_fresh_thread(lambda: codebook_statistics(head, [Block(rows, rows.weight)])))
    for name, a, b in zip(FIELDS, _exact_fields(codebook_statistics(head, [Block(rows, rows.weight)])), changed,
                          strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert not np.array_equal(changed[FIELDS.index("code_sum")], fresh[FIELDS.index("code_sum")])
    expected = reference_statistics(head, rows)
    for name, got in zip(FIELDS, changed, strict=True):
        scale = max(float(np.abs(expected[name]).max()), 1.0)
        np.testing.assert_allclose(got, expected[name], rtol=0, atol=1e-12 * scale, err_msg=name)


def _form(counts: NearCounts) -> dict[str, np.ndarray]:
    """What a value holds, by attribute (``None`` left out): its form and its numbers."""
    return {name: np.array(value) for name, value in vars(counts).items() if value is not None}


def test_near_counts_add_as_the_dense_tables_do() -> None:
    """The near counts of several passes, summed in any grouping of the same order, equal the dense tables' sums bit
    for bit and hold the same form (the nonzero cells in order while at most half the table, then the table), and
    neither adding nor reading an operand changes it."""
    rng = np.random.default_rng(11)
    shape = (5, 7)
    parts, dense = [], []
    for n in (3, 8, 0, 12, 9):
        table = np.zeros(35)
        table[rng.choice(35, size=n, replace=False)] = rng.random(n) * 10.0 ** rng.integers(-8, 8, size=n)
        dense.append(table.reshape(shape))
        parts.append(NearCounts.from_dense(dense[-1]))
    before = [_form(part) for part in parts]
    want = dense[0].copy()
    total = parts[0].copy()
    for part, table in zip(parts[1:], dense[1:], strict=True):
        total.add(part)
        want = want + table
        np.testing.assert_array_equal(np.asarray(total), want)
        assert (total.dense is not None) == (np.count_nonzero(want) > 17)  # more than half the 35 cells
        if total.dense is None:
            assert total.keys is not None
            np.testing.assert_array_equal(total.keys, np.flatnonzero(want))
    assert total.dense is not None
    for grouping in (
        lambda a, b, c, d, e: a.copy().add(b.copy().add(c).add(d)).add(e),
        lambda a, b, c, d, e: a.copy().add(b).add(c.copy().add(d).add(e)),
        lambda a, b, c, d, e: NearCounts.from_dense(np.asarray(a.copy().add(b).add(c))).add(d.copy().add(e)),
    ):
        again = grouping(*parts)
        assert _form(again).keys() == _form(total).keys()
        np.testing.assert_array_equal(np.asarray(again), want)
    first = parts[0].copy().add(parts[1])
    assert first.dense is None and first.keys is not None and first.nbytes == 16 * first.keys.shape[0]
    assert sys.getsizeof(first) >= first.nbytes
    np.testing.assert_array_equal(np.asarray(pickle.loads(pickle.dumps(first))), dense[0] + dense[1])
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(total)[0, 0] = 1.0  # the dense form is lent read-only
    for part, saved in zip(parts, before, strict=True):
        got = _form(part)
        assert got.keys() == saved.keys()
        for name in got:
            np.testing.assert_array_equal(got[name], saved[name])
    with pytest.raises(ValueError, match="shape"):
        total.add(NearCounts.from_dense(np.zeros((7, 5))))


def test_a_pass_takes_its_near_counts_in_the_tables_order_and_leaves_the_table_zero() -> None:
    """The cells a pass listed (in the order the rows reached them, one listed twice: it was at 0 again after an
    add of 0, and one still at 0) come out once each, increasing, with their counts; the cells at 0 are left out and
    the thread's table is zero again."""
    arrays = CodebookArrays.zeros(3, 2, 4, 2, 1, 2)
    flat = arrays.emission_count.reshape(-1)
    flat[[9, 2, 5]] = [0.25, 3.0, 1e-300]
    arrays.touched.extend([np.array([9, 5, 7], dtype=np.uint32), np.array([2, 9], dtype=np.uint32)])
    counts = take_near_counts(arrays)
    assert counts.dense is None and counts.keys is not None and counts.values is not None
    np.testing.assert_array_equal(counts.keys, [2, 5, 9])
    np.testing.assert_array_equal(counts.values, [3.0, 1e-300, 0.25])
    assert not arrays.emission_count.any() and arrays.touched == []
    assert counts.keys.dtype == np.int64


@pytest.mark.parametrize("dim", [7, 8, 32, 40])
def test_query_sums_add_four_query_rows_at_a_time_in_order(dim):
    """The query sums over the used query-table rows: four rows' terms summed, then added, in row order, the rest one
    at a time (NumPy's numbers in that order, bit for bit, with D a multiple of 8 or not); the rows read cleared."""
    rng = np.random.default_rng(dim)
    v, cells = 23, 12
    done = rng.random(v) < 0.6
    done[[0, 22]] = True
    code_query = rng.random((v, cells)) * done[:, None]
    query_table = rng.normal(size=(v, dim)).astype(np.float32)
    code_sum = rng.normal(size=(cells, dim))
    expected = code_sum.copy()
    used = np.flatnonzero(done)
    ys = query_table.astype(np.float64)
    full = used.shape[0] - used.shape[0] % 4
    for i in range(0, full, 4):
        a, y = code_query[used[i : i + 4]], ys[used[i : i + 4]]
        expected += ((a[0][:, None] * y[0] + a[1][:, None] * y[1]) + a[2][:, None] * y[2]) + a[3][:, None] * y[3]
    for i in range(full, used.shape[0]):
        expected += code_query[used[i]][:, None] * ys[used[i]]
    _query_sums(code_query, done, query_table, code_sum)
    np.testing.assert_array_equal(code_sum, expected)
    assert not code_query.any()
