"""Codebooks of symbols: seeded, deterministic k-means of the symbols' key means, one random subspace per codebook.

Codebook ``b`` projects the (S, D) key means onto a seeded Gaussian subspace of ``ceil(D / B)`` dimensions (at
least 2, at most D) and runs k-means there: k-means++ seeding from ``np.random.default_rng([seed, b])``, then a fixed
number of Lloyd steps. Different subspaces give the codebooks different partitions of the symbols (independent runs
on the same vectors mostly find the same one), each still grouping symbols whose keys are close, as product
quantization's sub-vectors do. Distances are summed per dimension in a fixed order (no BLAS), so the assignment is
the same on any machine and any number of workers.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LLOYD_STEPS", "codebook_assignment", "kmeans"]

#: Lloyd steps of every codebook's k-means.
LLOYD_STEPS = 20


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
    key_means: np.ndarray, *, codebooks: int, codewords: int, seed: int = 0, steps: int = LLOYD_STEPS
) -> np.ndarray:
    """(S, B) int64: the codeword of each symbol in each of B = ``codebooks`` codebooks of W = ``codewords``
    codewords, from the symbols' key means (S, D) (see the module's docstring)."""
    keys = np.asarray(key_means, dtype=np.float64)
    s, d = keys.shape
    if codewords > s:
        raise ValueError(f"--codewords {codewords}: more codewords than the S = {s} symbols; give at most {s}")
    width = min(d, max(2, math.ceil(d / codebooks)))
    codes = np.empty((s, codebooks), dtype=np.int64)
    for b in range(codebooks):
        rng = np.random.default_rng([seed, b])
        projection = rng.normal(size=(d, width)) / math.sqrt(width)
        points = np.zeros((s, width))
        for i in range(d):  # the projection summed in a fixed order (no BLAS)
            points += keys[:, i, None] * projection[None, i, :]
        codes[:, b] = kmeans(points, codewords, rng, steps)
    return codes
