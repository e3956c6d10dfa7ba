"""A plain, obviously-correct NumPy reference of the E-step and M-step (docs/math.md), for parity tests.

Written for clarity, not speed: one row at a time, straight from the formulas.
"""

from __future__ import annotations

import numpy as np


def reference_statistics(context, query, target, weights, key_means, emission, position_prior, sigma2):
    """The seven sufficient statistics of docs/math.md, row by row.

    Returns a dict with key_sum (S, D), key_mass (S,), emission_count (S, T), position_count (N,),
    query_sq, n_obs, log_lik.
    """
    n, n_pos = context.shape
    num_symbols, dim = key_means.shape
    num_targets = emission.shape[1]
    key_sum = np.zeros((num_symbols, dim))
    key_mass = np.zeros(num_symbols)
    emission_count = np.zeros((num_symbols, num_targets))
    position_count = np.zeros(n_pos)
    query_sq = n_obs = log_lik = 0.0
    for row in range(n):
        w = 1.0 if weights is None else float(weights[row])
        y = np.asarray(query[row], dtype=np.float64)
        log_terms = np.empty(n_pos)
        for i in range(n_pos):
            c = context[row, i]
            log_terms[i] = (
                np.log(position_prior[i])
                - np.sum((y - key_means[c]) ** 2) / (2.0 * sigma2)
                - dim / 2.0 * np.log(2.0 * np.pi * sigma2)
                + np.log(emission[c, target[row]])
            )
        total = np.logaddexp.reduce(log_terms)
        r = np.exp(log_terms - total)
        for i in range(n_pos):
            c = context[row, i]
            key_sum[c] += w * r[i] * y
            key_mass[c] += w * r[i]
            emission_count[c, target[row]] += w * r[i]
            position_count[i] += w * r[i]
        query_sq += w * float(y @ y)
        n_obs += w
        log_lik += w * total
    return {
        "key_sum": key_sum,
        "key_mass": key_mass,
        "emission_count": emission_count,
        "position_count": position_count,
        "query_sq": query_sq,
        "n_obs": n_obs,
        "log_lik": log_lik,
    }


def reference_m_step(stats, *, sigma2, estimate_sigma2, min_sigma2, emission_smoothing):
    """The maximum-likelihood M-step of docs/math.md, assuming every symbol received mass."""
    key_means = stats["key_sum"] / stats["key_mass"][:, None]
    counts = stats["emission_count"] + emission_smoothing
    emission = counts / counts.sum(axis=1, keepdims=True)
    prior = stats["position_count"] / stats["position_count"].sum()
    if estimate_sigma2:
        dim = stats["key_sum"].shape[1]
        explained = sum(
            float(stats["key_sum"][s] @ stats["key_sum"][s]) / stats["key_mass"][s]
            for s in range(stats["key_sum"].shape[0])
        )
        sigma2 = max(min_sigma2, (stats["query_sq"] - explained) / (dim * stats["key_mass"].sum()))
    return key_means, emission, prior, sigma2


def reference_row_statistics(context, query, target, model, row):
    """The reference statistics of the single row ``row`` (weight 1) under ``model``."""
    return reference_statistics(
        context[row : row + 1],
        query[row : row + 1],
        target[row : row + 1],
        None,
        model.key_means,
        model.emission,
        model.position_prior,
        model.sigma2,
    )
