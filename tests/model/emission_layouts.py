"""Both emission layouts for a test: the same (S, T) counts dense, or sparse over the pairs they hold."""

from __future__ import annotations

import numpy as np

from dist_respattn.model.emission.layouts import DenseEmissionCounts, EmissionCounts, PairSupport, SparseEmissionCounts

LAYOUTS = ("dense", "sparse")


def support_of(counts: np.ndarray) -> PairSupport:
    """The pairs of an (S, T) array's non-zero cells."""
    s, t = np.nonzero(counts)
    keys = np.sort(t.astype(np.int64) * counts.shape[0] + s)
    return PairSupport.from_keys(keys, counts.shape[0], counts.shape[1])


def counts_in_layout(counts: np.ndarray, layout: str) -> EmissionCounts:
    """(S, T) counts as dense counts, or as sparse counts over their non-zero cells."""
    if layout == "dense":
        return DenseEmissionCounts.from_symbol_major(counts)
    support = support_of(counts)
    values = counts[support.symbols, support.targets]
    return SparseEmissionCounts(values, support, num_symbols=counts.shape[0], num_targets=counts.shape[1])
