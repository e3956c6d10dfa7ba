"""The symbols whose emission rows are closest to a symbol's: what follows them is alike (either layout)."""

from __future__ import annotations

import numpy as np

from dist_respattn.model.emission.layouts import Emission, SparseEmission

__all__ = ["emission_neighbours"]


def emission_neighbours(emission: Emission, symbol: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` symbols (other than ``symbol``) whose emission rows ``B[s, :]`` are closest to ``symbol``'s in
    Hellinger distance ``sqrt(1 - sum_t sqrt(B[s, t] B[symbol, t]))``: ``(ids (k,), distances (k,))``, nearest
    first. A sparse table is read over its support's pairs and the backoff, O(P + T), never as an (S, T) table;
    a dense one is (S, T) already."""
    q = emission.rows(np.array([int(symbol)]))[0]
    root_q = np.sqrt(q)
    if isinstance(emission, SparseEmission):
        support = emission.support
        root_base_q = np.sqrt(emission.base) * root_q
        symbols, targets = support.symbols, support.targets
        root_backoff = np.sqrt(emission.backoff)
        # On the pairs: sqrt(v q_t) replaces the backoff's sqrt(b_s u_t q_t) in the all-backoff sum.
        on_pairs = np.sqrt(emission.values) * root_q[targets] - root_backoff[symbols] * root_base_q[targets]
        overlap = root_backoff * float(root_base_q.sum()) + np.bincount(
            symbols, weights=on_pairs, minlength=support.num_symbols
        )
    else:
        overlap = np.sqrt(emission.to_dense()) @ root_q
    distance = np.sqrt(np.clip(1.0 - overlap, 0.0, None))
    distance[int(symbol)] = np.inf
    order = np.argsort(distance, kind="stable")[: int(k)]
    return order, distance[order]
