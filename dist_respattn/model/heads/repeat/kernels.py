"""The repeat gate's compiled pass over token windows: each row's history as a set, and its gate on the row's
distribution.

A row's history ``H`` is the set of distinct tokens of its window ``tokens[begin:end]`` (the window reaches as far
back as the head's N: up to the whole document). Rows come in store order, so consecutive windows overlap; the pass
keeps a count of each symbol over the current window and slides it (a token in at the right, one out at the left),
so a block costs O(its span + rows), not O(rows x N). A window that does not follow the last one (another
document, or rows out of order) empties the counts and starts again.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = [
    "ACTIVE",
    "REPEATS",
    "UNIFORM",
    "gate_distribution",
    "history_bucket",
    "history_gate",
    "mass_gate",
]

#: Row flags the pass returns: the gate acts on the row (its history neither empty nor every target); the row's
#: target is in its history; the target's side of the gate had no mass under the wrapped head and was spread evenly
#: (then the row's ``log_factor`` is ``log p'(t)`` itself, not a factor of ``p(t)``).
ACTIVE, REPEATS, UNIFORM = 1, 2, 4


@numba.njit(cache=True, nogil=True)
def history_bucket(length: int, num_buckets: int) -> int:  # pragma: no cover - compiled
    """The bucket of a history of ``length`` tokens (``length >= 1``): ``floor(log2(length))``, at most
    ``num_buckets - 1`` (bucket ``b`` holds histories of ``2**b`` to ``2**(b+1) - 1`` tokens)."""
    b = 0
    while length > 1 and b < num_buckets - 1:
        length >>= 1
        b += 1
    return b


@numba.njit(cache=True, nogil=True)
def _slide(tokens, counts, state, lo, hi):  # pragma: no cover - compiled
    """Move the counted window ``[state[0], state[1])`` to ``[lo, hi)``; ``state[2]``: its distinct symbols."""
    if lo < state[0] or hi < state[1] or lo >= state[1]:
        for x in range(state[0], state[1]):  # every count back to 0
            counts[tokens[x]] -= 1
        state[0] = lo
        state[1] = lo
        state[2] = 0
    while state[1] < hi:
        s = tokens[state[1]]
        if counts[s] == 0:
            state[2] += 1
        counts[s] += 1
        state[1] += 1
    while state[0] < lo:
        s = tokens[state[0]]
        counts[s] -= 1
        if counts[s] == 0:
            state[2] -= 1
        state[0] += 1


@numba.njit(cache=True, nogil=True)
def _next_row(tokens, lo, hi, t, counts, state, num_targets, num_buckets, buckets, row):  # pragma: no cover
    """Slide the history to the next row's window ``[lo, hi)``, set its bucket and return its flags (:data:`ACTIVE`
    where the gate acts, :data:`REPEATS` where its target ``t`` is in the history)."""
    _slide(tokens, counts, state, lo, hi)
    distinct = state[2]
    buckets[row] = history_bucket(hi - lo, num_buckets)
    if not (distinct > 0 and distinct < num_targets):
        return 0
    return ACTIVE | (REPEATS if counts[t] > 0 else 0)


@numba.njit(cache=True, nogil=True)
def _side_values(seen_mass, new_mass, distinct, num_targets, r, mix):  # pragma: no cover - compiled
    """Each side's factor of ``p`` under the gate, or its targets' probability where its mass is 0 (its flag)."""
    seen_uniform = not seen_mass > 0.0
    new_uniform = not new_mass > 0.0
    keep = 1.0 - mix
    seen_value = keep * r / distinct if seen_uniform else mix + keep * (r / seen_mass)
    new_value = keep * (1.0 - r) / (num_targets - distinct) if new_uniform else mix + keep * ((1.0 - r) / new_mass)
    return seen_value, new_value, seen_uniform, new_uniform


@numba.njit(cache=True, nogil=True)
def gate_distribution(proba, counts, distinct, r, mix):  # pragma: no cover - compiled
    """Gate one distribution ``proba`` (T,) in place, the history's ``counts`` (S,) (``distinct`` of them nonzero,
    ``0 < distinct < T``) with repeat rate ``r``, keeping ``mix`` of ``proba`` itself: ``mix p + (1 - mix) gate(p)``.

    Returns ``(seen value, new value, seen uniform, new uniform)``: each side's factor of ``p``,
    ``mix + (1 - mix) r / p(H)`` (or ``(1 - r) / (1 - p(H))``), or, for a side whose mass under ``proba`` is 0
    (spread evenly instead; its flag 1.0), the probability of each of its targets, ``(1 - mix) r / |H|``."""
    num_targets = proba.shape[0]
    seen_mass = 0.0
    new_mass = 0.0
    for s in range(num_targets):
        if counts[s] > 0:
            seen_mass += proba[s]
        else:
            new_mass += proba[s]
    seen_value, new_value, seen_uniform, new_uniform = _side_values(seen_mass, new_mass, distinct, num_targets, r, mix)
    for s in range(num_targets):
        if counts[s] > 0:
            proba[s] = seen_value if seen_uniform else proba[s] * seen_value
        else:
            proba[s] = new_value if new_uniform else proba[s] * new_value
    return seen_value, new_value, 1.0 if seen_uniform else 0.0, 1.0 if new_uniform else 0.0


@numba.njit(cache=True, nogil=True)
def history_gate(  # pragma: no cover - compiled
    tokens, begin, end, target, rates, mix, proba, counts, state, flags, buckets, log_factor
):
    """The gate of every row of a block, in row order.

    Args:
        tokens: (L,) int32 the block's token span; ``begin``, ``end`` (n,) int64: row ``r``'s window (its history).
        target: (n,) int64 each row's target (a token id: the store's targets are its tokens).
        rates: (K,) ``r_b``: the probability that the next token repeats one of a history of bucket ``b``; ``mix``:
            the wrapped head's own share of the gated distribution (:func:`gate_distribution`).
        proba: (n, T) float64 each row's distribution under the wrapped head, gated in place; or (0, T): only the
            flags and buckets are wanted (the counting pass).
        counts: (S,) int64 and ``state`` (3,) int64: the counted window, kept from one call to the next over one
            token span (zeros, for a new span): a block's rows may be gated a few at a time.
        flags: (n,) int64 out: :data:`ACTIVE` | :data:`REPEATS`; ``buckets``: (n,) int64 out: the history's bucket.
        log_factor: (n,) float64 out (when ``proba`` is given): ``log p'(t) - log p(t)`` of the row's own target
            (0 where the gate does not act), or ``log p'(t)`` itself where the flags say :data:`UNIFORM`.

    The gate, for a row of history ``H`` (``r = rates[b]``, ``p(H)`` the wrapped distribution's mass on ``H``)::

        p'(t) = mix p(t) + (1 - mix) r p(t) / p(H)              t in H
              = mix p(t) + (1 - mix) (1 - r) p(t) / (1 - p(H))  t not in H

    It acts only where ``H`` is neither empty nor every target; where ``p(H)`` (or ``1 - p(H)``) is 0 that side's
    mass is spread evenly over its targets instead, so ``p'`` is always a distribution and ``r`` always the
    probability of a repeat.
    """
    n = begin.shape[0]
    num_targets = proba.shape[1]
    dense = proba.shape[0] > 0
    k = rates.shape[0]
    for row in range(n):
        flag = _next_row(tokens, begin[row], end[row], target[row], counts, state, num_targets, k, buckets, row)
        flags[row] = flag
        t = target[row]
        distinct = state[2]
        if not dense:
            continue
        if flag == 0:
            log_factor[row] = 0.0
            continue
        scales = gate_distribution(proba[row], counts, distinct, rates[buckets[row]], mix)
        repeats = counts[t] > 0
        if scales[2 if repeats else 3] > 0.0:
            flags[row] |= UNIFORM
        log_factor[row] = np.log(scales[0] if repeats else scales[1])


@numba.njit(cache=True, nogil=True)
def mass_gate(  # pragma: no cover - compiled
    tokens, begin, end, target, rates, mix, num_targets, seen, total, counts, state, flags, buckets, log_factor
):
    """:func:`history_gate`'s flags, buckets and ``log_factor`` of every row from the wrapped distribution's masses
    instead of its (T,) rows: ``seen`` (n,) its mass on the row's history, ``total`` (n,) its whole mass (the rest's
    is their difference, as :func:`gate_distribution` would sum it up to rounding). The other arguments are
    :func:`history_gate`'s; ``num_targets``: T."""
    n = begin.shape[0]
    k = rates.shape[0]
    for row in range(n):
        flags[row] = _next_row(tokens, begin[row], end[row], target[row], counts, state, num_targets, k, buckets, row)
        log_factor[row] = 0.0
        if flags[row] == 0:
            continue
        repeats = (flags[row] & REPEATS) != 0
        seen_value, new_value, seen_uniform, new_uniform = _side_values(
            seen[row], total[row] - seen[row], state[2], num_targets, rates[buckets[row]], mix
        )
        if seen_uniform if repeats else new_uniform:
            flags[row] |= UNIFORM
        log_factor[row] = np.log(seen_value if repeats else new_value)
