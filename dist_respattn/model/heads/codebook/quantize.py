"""Codebooks of symbols: seeded, deterministic k-means of the symbols' features, one random subspace per codebook.

Codebook ``b`` projects the (S, F) features (the codebook head's: each symbol's key and emission row, see
:func:`symbol_features`) onto a seeded Gaussian subspace of ``ceil(F / B)`` dimensions (at least 2, at most
:data:`MAX_WIDTH` and F) and runs k-means there: k-means++ seeding from ``np.random.default_rng([seed, b])``,
then a fixed number of Lloyd steps. Different subspaces give the codebooks different partitions of the symbols
(independent runs on the same vectors mostly find the same one), each still grouping symbols whose features are
close, as product quantization's sub-vectors do. Distances are summed per dimension in a fixed order (no BLAS),
so the assignment is the same on any machine and any number of workers.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LLOYD_STEPS", "MAX_WIDTH", "codebook_assignment", "kmeans", "symbol_features"]

#: Lloyd steps of every codebook's k-means.
LLOYD_STEPS = 20
#: The most dimensions a codebook's subspace has.
MAX_WIDTH = 32


def symbol_features(key_means: np.ndarray, sigma2: float, emission: np.ndarray) -> np.ndarray:
    """(S, D + T) each symbol's key over ``sqrt(2 sigma2)`` beside the square root of its emission row: squared
    distances between them add the gate's log-ratio scale and the emission rows' Hellinger distance, so symbols
    share a codeword when they are attended alike and predict alike (with a flat gate, a large σ², the emission
    rows alone decide)."""
    keys = np.asarray(key_means, dtype=np.float64) / math.sqrt(2.0 * sigma2)
    return np.concatenate([keys, np.sqrt(np.asarray(emission, dtype=np.float64))], axis=1)


def _distances(points: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """(n, k) squared distances, summed over the dimensions in order."""
    out = np.zeros((points.shape[0], centres.shape[0]))
    for d in range(points.shape[1]):
        out += (points[:, d, None] - centres[None, :, d]) ** 2
    return out


def kmeans(points: np.ndarray, k: int, rng: np.random.Generator, steps: int = LLOYD_STEPS) -> np.ndarray:
    """(n,) int64 cluster of each of ``points`` (n, d): k-means++ seeding, then ``steps`` Lloyd steps (a cluster
    left empty keeps its centre). ``k`` at most n."""
    n = points.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k = {k}: expected 1 to {n} clusters of {n} points")
    centres = np.empty((k, points.shape[1]))
    centres[0] = points[int(rng.integers(n))]
    nearest = _distances(points, centres[:1])[:, 0]
    for j in range(1, k):
        total = float(nearest.sum())
        if total > 0.0:
            pick = int(np.searchsorted(np.cumsum(nearest), rng.random() * total, side="right"))
            pick = min(pick, n - 1)
        else:  # every point sits on a centre already: any other point
            pick = int(rng.integers(n))
        centres[j] = points[pick]
        nearest = np.minimum(nearest, _distances(points, centres[j : j + 1])[:, 0])
    labels = np.argmin(_distances(points, centres), axis=1)
    for _ in range(steps):
        for j in range(k):
            members = labels == j
            if members.any():
                centres[j] = points[members].mean(axis=0)
        labels = np.argmin(_distances(points, centres), axis=1)
    return labels.astype(np.int64)


def codebook_assignment(
    features: np.ndarray, *, codebooks: int, codewords: int, seed: int = 0, steps: int = LLOYD_STEPS
) -> np.ndarray:
    """(S, B) int64: the codeword of each symbol in each of B = ``codebooks`` codebooks of W = ``codewords``
    codewords, from the symbols' features (S, F) (see the module's docstring)."""
    keys = np.asarray(features, dtype=np.float64)
    s, d = keys.shape
    if codewords > s:
        raise ValueError(f"--codewords {codewords}: more codewords than the S = {s} symbols; give at most {s}")
    width = min(d, MAX_WIDTH, max(2, math.ceil(d / codebooks)))
    codes = np.empty((s, codebooks), dtype=np.int64)
    for b in range(codebooks):
        rng = np.random.default_rng([seed, b])
        projection = rng.normal(size=(d, width)) / math.sqrt(width)
        points = np.zeros((s, width))
        for i in range(d):  # the projection summed in a fixed order (no BLAS)
            points += keys[:, i, None] * projection[None, i, :]
        codes[:, b] = kmeans(points, codewords, rng, steps)
    return codes
