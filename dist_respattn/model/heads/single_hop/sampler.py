"""Vectorized sampling of synthetic triples from a head, and random heads to sample from."""

from __future__ import annotations

from typing import Any

import numpy as np

from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.kernels.per_position import block_ranges

__all__ = ["ResponsibilityAttentionSampler", "random_distribution", "random_sparse_distribution"]

#: Rows drawn per block, bounding the temporaries of the context draw.
_SAMPLE_BLOCK_ROWS = 65536


def _distinct_contexts(rng: np.random.Generator, n: int, num_symbols: int, n_pos: int) -> np.ndarray:
    """(n, N) rows of N distinct symbols, each row uniform over ordered N-subsets of [0, S).

    Draws with replacement and redraws the rows that repeat a symbol; when N is a sizeable part of S,
    that would loop, so a random permutation prefix per row is used instead.
    """
    if n_pos * n_pos > num_symbols:  # a row repeats a symbol with probability ~N^2 / 2S
        out = np.empty((n, n_pos), dtype=np.int32)
        for start, stop in block_ranges(n, max(1, 2**22 // num_symbols)):
            keys = rng.random((stop - start, num_symbols))
            smallest = np.argpartition(keys, n_pos - 1, axis=1)[:, :n_pos] if n_pos < num_symbols else None
            if smallest is None:
                out[start:stop] = np.argsort(keys, axis=1)
                continue
            # Order the N chosen symbols by their keys: argpartition leaves them in no random order.
            by_key = np.argsort(np.take_along_axis(keys, smallest, axis=1), axis=1)
            out[start:stop] = np.take_along_axis(smallest, by_key, axis=1)
        return out
    out = rng.integers(0, num_symbols, size=(n, n_pos), dtype=np.int32)
    pending = np.arange(n)
    while pending.size:
        rows = np.sort(out[pending], axis=1)
        repeats = pending[(rows[:, 1:] == rows[:, :-1]).any(axis=1)]
        out[repeats] = rng.integers(0, num_symbols, size=(repeats.size, n_pos), dtype=np.int32)
        pending = repeats
    return out


class ResponsibilityAttentionSampler:
    """Draws iid triples ``(context, query, target)`` from a head.

    Contexts come from a uniform prior: N distinct symbols when S >= N (as the reference library
    does), symbols with repetition otherwise. Then ``z ~ pi``, ``query ~ N(K[c_z], sigma2 I)``,
    ``target ~ B[c_z]``.
    """

    def __init__(
        self, dist: ResponsibilityAttentionDistribution, seed: int | np.random.Generator | None = None
    ) -> None:
        self.dist = dist
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def sample_arrays(self, size: int, *, query_dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``size`` triples straight into arrays.

        Returns:
            ``context`` (size, N) int32, ``query`` (size, D) of ``query_dtype``, ``target`` (size,) int32.
        """
        d = self.dist
        if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"size = {size!r}: expected a whole number of triples")
        if size < 0:
            raise ValueError(f"size = {size}: expected a non-negative number of triples")
        n = int(size)
        context = np.empty((n, d.context_length), dtype=np.int32)
        query = np.empty((n, d.query_dim), dtype=query_dtype)
        target = np.empty(n, dtype=np.int32)
        sd = np.sqrt(d.sigma2)
        for start, stop in block_ranges(n, _SAMPLE_BLOCK_ROWS):
            b = stop - start
            if d.num_symbols >= d.context_length:
                ctx = _distinct_contexts(self.rng, b, d.num_symbols, d.context_length)
            else:
                ctx = self.rng.integers(0, d.num_symbols, size=(b, d.context_length), dtype=np.int32)
            z = self.rng.choice(d.context_length, size=b, p=d.position_prior)
            sym = ctx[np.arange(b), z]
            context[start:stop] = ctx
            query[start:stop] = d.key_means[sym] + sd * self.rng.standard_normal((b, d.query_dim))
            target[start:stop] = d.emission_table.sample(sym, self.rng)
        return context, query, target

    def sample(self, size: int | None = None, *, batched: bool = True) -> Any:
        """One triple ``(context (N,), query (D,), target)``, or a list of ``size`` triples.

        ``batched`` is accepted for the reference library's signature and changes nothing: the
        draws are always vectorized. Use :meth:`sample_arrays` to skip building tuples.
        """
        n = 1 if size is None else size
        context, query, target = self.sample_arrays(n)
        triples = [(context[i].astype(np.int64), query[i], int(target[i])) for i in range(n)]
        return triples[0] if size is None else triples


def random_distribution(
    num_symbols: int,
    context_length: int,
    query_dim: int,
    num_targets: int,
    *,
    seed: int | np.random.Generator | None = None,
    key_scale: float = 3.0,
    emission_concentration: float = 0.5,
    sigma2: float = 1.0,
    name: str | None = None,
) -> ResponsibilityAttentionDistribution:
    """A random head: keys ~ N(0, key_scale^2 I), emission rows ~ Dirichlet(emission_concentration),
    position prior ~ Dirichlet(1). A ``key_scale`` well above ``sqrt(sigma2)`` keeps symbols apart."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    key_means = key_scale * rng.standard_normal((num_symbols, query_dim))
    emission = rng.dirichlet(np.full(num_targets, emission_concentration), size=num_symbols)
    # Dirichlet draws with a small concentration can underflow to exact zeros; keep every target possible.
    emission = np.maximum(emission, 1e-12)
    emission /= emission.sum(axis=1, keepdims=True)
    position_prior = rng.dirichlet(np.ones(context_length))
    return ResponsibilityAttentionDistribution(key_means, emission, position_prior, sigma2, name)


def random_sparse_distribution(
    num_words: int,
    context_length: int,
    query_dim: int,
    *,
    max_pairs: int,
    stored_mass: float = 0.8,
    seed: int | np.random.Generator | None = None,
    key_scale: float = 3.0,
    sigma2: float = 1.0,
) -> ResponsibilityAttentionDistribution:
    """A random head over a vocabulary of S = T = ``num_words`` with a sparse emission shaped like a fitted
    language model's, without ever making an (S, T) table (for heads of tens of thousands of words).

    Symbol ``s`` (by rank) stores about ``max_pairs / sqrt(s + 1)`` targets, drawn towards low ids (the frequent
    words); stored values are small integer counts scaled to ``stored_mass`` of the row, so they tie, and the base
    is a Zipf law of integer counts, so rare targets tie there too. The backoff spreads the rest of the row over
    the base of its targets not stored.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    s = t = int(num_words)
    lengths = np.maximum(1, (max_pairs / np.sqrt(np.arange(1, s + 1))).astype(np.int64))
    symbols = np.repeat(np.arange(s, dtype=np.int64), lengths)
    targets = np.minimum((t * rng.random(symbols.shape[0]) ** 3).astype(np.int64), t - 1)
    keys = np.unique(targets * s + symbols)  # target-major cells, each pair once
    support = PairSupport.from_keys(keys, s, t)
    pair_symbols = support.symbols.astype(np.int64)
    counts = rng.integers(1, 5, size=keys.shape[0]).astype(np.float64)
    values = stored_mass * counts / np.bincount(pair_symbols, weights=counts, minlength=s)[pair_symbols]
    base_counts = np.floor(1000.0 / np.arange(1, t + 1)) + 1.0
    base = base_counts / base_counts.sum()
    off_base = 1.0 - np.bincount(pair_symbols, weights=base[support.targets], minlength=s)
    backoff = (1.0 - stored_mass) / np.maximum(off_base, 1e-300)
    emission = SparseEmission(support, values, backoff, base)
    key_means = key_scale * rng.standard_normal((s, query_dim))
    position_prior = rng.dirichlet(np.ones(context_length))
    return ResponsibilityAttentionDistribution(key_means, emission, position_prior, sigma2)
