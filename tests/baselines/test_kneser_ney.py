"""Interpolated modified Kneser-Ney: normalization, a brute-force reference, merging, the arg-max."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from dist_respattn.baselines.kneser_ney import NGramCounts, fit_kneser_ney, modified_discounts
from dist_respattn.model.heads.base import Block
from dist_respattn.model.rows import WindowRows

S = T = 6
DEPTH = 4


def _documents(seed: int, n_docs: int = 5) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # A few repeated phrases so higher orders have counts of 2, 3 and more.
    return [
        list(rng.choice(S, size=int(rng.integers(3, 40)), p=[0.4, 0.2, 0.15, 0.1, 0.1, 0.05])) for _ in range(n_docs)
    ]


def _rows(documents: list[list[int]], depth: int = DEPTH) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every target with at least one earlier token of its document: (history (m, depth), lengths, targets)."""
    history, lengths, targets = [], [], []
    for doc in documents:
        for i in range(1, len(doc)):
            past = doc[max(0, i - depth) : i]
            history.append([0] * (depth - len(past)) + past)
            lengths.append(len(past))
            targets.append(doc[i])
    return np.array(history, dtype=np.int64), np.array(lengths), np.array(targets, dtype=np.int64)


def _counts(documents: list[list[int]], order: int) -> NGramCounts:
    h, n, t = _rows(documents)
    return NGramCounts.from_rows(h, n, t, None, order=order, num_symbols=S, num_targets=T)


class BruteForce:
    """The module's formulas with plain dicts of tuples, rows from plain lists."""

    def __init__(self, documents: list[list[int]], order: int) -> None:
        raw: dict[int, dict[tuple, float]] = {k: defaultdict(float) for k in range(1, order + 1)}
        for doc in documents:
            for i in range(1, len(doc)):
                past = doc[max(0, i - (order - 1)) : i]
                raw[len(past) + 1][(*past, doc[i])] += 1.0
        self.order = order
        self.a: dict[int, dict[tuple, float]] = {order: dict(raw[order])}
        for k in range(order - 1, 0, -1):
            a = defaultdict(float, raw[k])
            for gram in self.a[k + 1]:
                a[gram[1:]] += 1.0
            self.a[k] = dict(a)
        self.d = {}
        for k in range(1, order + 1):
            n = [sum(1 for v in self.a[k].values() if v == r) for r in (1, 2, 3, 4)]
            # An undefined discount (no count of 1 and 2, or none of r) is the stated fallback, 0.75.
            y = n[0] / (n[0] + 2 * n[1]) if n[0] + n[1] else None
            ds = [r - (r + 1) * y * n[r] / n[r - 1] if y is not None and n[r - 1] else 0.75 for r in (1, 2, 3)]
            self.d[k] = [min(max(d, 0.01), r) for r, d in zip((1, 2, 3), ds, strict=True)]

    def discount(self, k: int, a: float) -> float:
        return min(a, self.d[k][min(int(a), 3) - 1])

    def p(self, k: int, history: tuple, t: int) -> float:
        if k == 0:
            return 1.0 / T
        rest = history[1:] if history else ()
        grams = {g: v for g, v in self.a[k].items() if g[:-1] == history}
        total = sum(grams.values())
        if total == 0:
            return self.p(k - 1, rest, t)
        a = grams.get((*history, t), 0.0)
        kept = sum(self.discount(k, v) for v in grams.values())
        return (a - (self.discount(k, a) if a else 0.0) + kept * self.p(k - 1, rest, t)) / total

    def prob(self, history: list[int], t: int) -> float:
        h = tuple(history[len(history) - min(len(history), self.order - 1) :])
        return self.p(len(h) + 1, h, t)


def _histories(documents: list[list[int]]) -> list[list[int]]:
    """Seen ones of every length (a document start's short ones), and unseen ones."""
    seen = [documents[0][:1], documents[0][:2], documents[1][3:7], documents[2][-4:]]
    return [*seen, [5, 5, 5, 5], [5], [], [4, 5, 3, 1]]


@pytest.mark.parametrize("order", [2, 3, 5])
def test_every_history_sums_to_one_and_a_document_start_reads_a_short_history(order):
    documents = _documents(order)
    model = fit_kneser_ney(_counts(documents, order))
    for history in _histories(documents):
        rows = np.array([[0] * (DEPTH - len(history)) + history] * T, dtype=np.int64)
        p = np.exp(model.log_prob(rows, np.arange(T), np.full(T, len(history))))
        assert np.all(p > 0.0)
        assert p.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("order", [2, 3])
def test_agrees_with_the_formulas_written_out(order):
    documents = _documents(10 + order)
    model = fit_kneser_ney(_counts(documents, order))
    reference = BruteForce(documents, order)
    for k in range(1, order + 1):
        assert model.discounts[k] == pytest.approx(reference.d[k], abs=1e-14)
        assert modified_discounts(np.array(list(reference.a[k].values())))[0] == pytest.approx(reference.d[k])
    h, n, t = _rows(documents)
    got = np.exp(model.log_prob(h, t, n))
    want = [reference.prob(list(row[DEPTH - m :]) if m else [], int(tt)) for row, m, tt in zip(h, n, t, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for history in _histories(documents):
        rows = np.array([[0] * (DEPTH - len(history)) + history] * T, dtype=np.int64)
        got = np.exp(model.log_prob(rows, np.arange(T), np.full(T, len(history))))
        np.testing.assert_allclose(got, [reference.prob(history, x) for x in range(T)], rtol=1e-12)


def test_merging_two_partitions_equals_counting_them_together():
    documents = _documents(3, n_docs=8)
    weights_rng = np.random.default_rng(4)
    h, n, t = _rows(documents)
    w = weights_rng.integers(0, 3, size=t.size).astype(np.float64)  # 0: a held-out row, not counted
    cut = t.size // 3

    def count(rows: slice) -> NGramCounts:
        return NGramCounts.from_rows(h[rows], n[rows], t[rows], w[rows], order=4, num_symbols=S, num_targets=T)

    merged, whole = count(slice(0, cut)) + count(slice(cut, None)), count(slice(None))
    for a, b, ca, cb in zip(merged.grams, whole.grams, merged.counts, whole.counts, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ca, cb)
    assert merged.total == w.sum()
    empty = NGramCounts.empty(4, S, T)
    assert all(np.array_equal(a, b) for a, b in zip((empty + whole).grams, whole.grams, strict=True))


def test_window_blocks_count_what_the_rows_say():
    """Token windows cut at a document start give the short histories the rows above have."""
    documents = _documents(5, n_docs=3)
    tokens = np.concatenate(documents)
    starts = np.cumsum([0] + [len(d) for d in documents[:-1]])
    begin, end = [], []
    for s, doc in zip(starts, documents, strict=True):
        for i in range(1, len(doc)):
            begin.append(s + max(0, i - 6))
            end.append(s + i)
    end_a = np.array(end)
    rows = WindowRows(
        tokens, np.array(begin), end_a, tokens[end_a], np.zeros((1, 1)), np.zeros(end_a.size, np.int64), None, 0
    )
    from dist_respattn.baselines.kneser_ney import block_ngrams

    got = block_ngrams(Block(rows, None), 5, S, T)
    want = _counts(documents, 5)
    for a, b in zip(got.grams, want.grams, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("order", [2, 3, 5])
def test_the_accuracy_takes_the_first_arg_max_of_the_whole_distribution(order):
    documents = _documents(20 + order, n_docs=6)
    counts = _counts(documents, order)
    model = fit_kneser_ney(counts)
    scored = _counts(_documents(99, n_docs=4), order)
    hits = weight = 0.0
    for grams, w in zip(scored.grams, scored.counts, strict=True):
        for gram, c in zip(grams, w, strict=True):
            j = len(gram) - 1
            rows = np.array([list(gram[:-1])] * T, dtype=np.int64).reshape(T, j)
            p = model.log_prob(rows, np.arange(T))
            hits += c * (int(np.argmax(p)) == int(gram[-1]))
            weight += c
    assert model.score(scored).accuracy == pytest.approx(hits / weight, abs=1e-12)


def test_tuning_on_held_out_counts_never_loses_to_the_closed_form():
    documents = _documents(7, n_docs=12)
    train, held = _counts(documents[:8], 3), _counts(documents[8:], 3)
    tuned = fit_kneser_ney(train, validation=held)
    plain = fit_kneser_ney(train)
    assert tuned.parameters["tuned_on"] == "validation"
    assert tuned.score(held).perplexity <= plain.score(held).perplexity + 1e-12
    assert tuned.parameters["discount_scale"] in {0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5}
