"""The K most probable targets of each row, their probabilities and the attention, without an (n, T) matrix.

``predict_proba`` materializes an (n, T) matrix; a prediction pass over a store needs per row only its
K best targets. The compiled passes here keep O(T) scratch memory for a dense emission (each row's
mixture, then a running top-K) and visit only the rows' stored pairs for a sparse one (the exact
threshold search of :mod:`dist_respattn.model.heads.single_hop.scoring`, for K targets). Ties go to the lower id, as a
stable sort of ``predict_proba`` orders them.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from dist_respattn.model.emission.layouts import SparseEmission
from dist_respattn.model.heads.single_hop import scoring
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.kernels import per_position
from dist_respattn.model.kernels.log_weights import attention_of, row_log_weights
from dist_respattn.model.scores import TopK

__all__ = ["predict_top_k"]


@numba.njit(cache=True, nogil=True)
def _row_attention(context, row, y, key_means, log_prior, inv_two_sigma2, gate, bits, attention):  # pragma: no cover
    """``attention[i] = a_i`` of one row: the softmax of its log-weights without an emission (``gate``, ``bits``:
    scratch of N)."""
    gate[:] = 0.0
    row_log_weights(context, row, y, key_means, log_prior, inv_two_sigma2, gate, gate[:0])
    attention_of(gate, attention, bits)


@numba.njit(cache=True, nogil=True)
def _top_k_dense(
    context, query, key_means, emission, log_prior, inv_two_sigma2, top_targets, top_values, attention
):  # pragma: no cover - compiled
    """Fills ``top_targets``/``top_values`` (n, K) and ``attention`` (n, N) for a dense (S, T) emission."""
    n_rows, n_pos = context.shape
    num_targets = emission.shape[1]
    gate = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    probs = np.empty(num_targets)
    y = np.empty(query.shape[1])
    for row in range(n_rows):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        _row_attention(context, row, y, key_means, log_prior, inv_two_sigma2, gate, bits, attention[row])
        probs[:] = 0.0
        for i in range(n_pos):
            a = attention[row, i]
            row_b = emission[context[row, i]]
            for k in range(num_targets):
                probs[k] += a * row_b[k]
        count = 0
        for k in range(num_targets):
            count = scoring.insert_ranked(k, probs[k], top_targets[row], top_values[row], count)


@numba.njit(cache=True, nogil=True)
def _top_k_sparse(
    context,
    query,
    key_means,
    log_prior,
    inv_two_sigma2,
    indptr,
    symbols,
    values,
    backoff,
    base,
    ranked_indptr,
    ranked_targets,
    ranked_values,
    base_order,
    top_targets,
    top_values,
    attention,
):  # pragma: no cover - compiled
    """:func:`_top_k_dense` for a sparse emission: a threshold search per row, never O(T) work or memory."""
    n_rows, n_pos = context.shape
    gate = np.empty(n_pos)
    bits = np.empty(n_pos, dtype=np.int64)
    y = np.empty(query.shape[1])
    scores, seen, touched = scoring.top_k_scratch(base.shape[0])
    for row in range(n_rows):
        for d in range(query.shape[1]):
            y[d] = query[row, d]
        _row_attention(context, row, y, key_means, log_prior, inv_two_sigma2, gate, bits, attention[row])
        scoring.top_k_threshold(
            context, row, attention[row], indptr, symbols, values, backoff, base, ranked_indptr, ranked_targets,
            ranked_values, base_order, top_targets[row], top_values[row], scores, seen, touched,
        )  # fmt: skip


def predict_top_k(
    model: ResponsibilityAttentionDistribution,
    context: Any,
    query: Any,
    k: int,
    *,
    base_order: np.ndarray | None = None,
) -> TopK:
    """The ``k`` most probable targets of each row of ``context`` (n, N) and ``query`` (n, D).

    Equal to ``np.argsort(-model.predict_proba(context, query), kind="stable")[:, :k]`` and those
    probabilities (to rounding), with the predictive attention. ``k`` above T gives all T targets.
    ``base_order`` is :func:`dist_respattn.model.heads.single_hop.scoring.base_order` of a sparse emission,
    when the caller predicts many blocks with one model (it is a sort of T).
    """
    if int(k) < 1:
        raise ValueError(f"k = {k}: expected a positive number of targets")
    ctx, y, _ = model.check_context_query(context, query)
    top = min(int(k), model.num_targets)
    n_rows = ctx.shape[0]
    targets = np.empty((n_rows, top), dtype=np.int64)
    probabilities = np.empty((n_rows, top), dtype=np.float64)
    attention = np.empty((n_rows, model.context_length), dtype=np.float64)
    params = model.kernel_parameters
    table = model.emission_table
    if isinstance(table, SparseEmission):
        ranked_indptr, ranked_targets, ranked_values = table.ranked_rows
        _top_k_sparse(
            ctx, y, params.key_means, params.log_prior, params.inv_two_sigma2, table.support.indptr,
            table.support.symbols, table.values, table.backoff, table.base, ranked_indptr, ranked_targets,
            ranked_values, scoring.base_order(table) if base_order is None else base_order, targets, probabilities,
            attention,
        )  # fmt: skip
    else:
        assert isinstance(params, per_position.KernelParameters)
        _top_k_dense(
            ctx, y, params.key_means, table.to_dense(), params.log_prior, params.inv_two_sigma2, targets,
            probabilities, attention,
        )  # fmt: skip
    return TopK(targets.astype(np.int32), probabilities, attention)
