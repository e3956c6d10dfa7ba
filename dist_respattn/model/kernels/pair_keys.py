"""Weighted tallies of int64 pair keys (cells ``t * S + s``), compiled: the start pass's support in linear time.

``tally_keys`` gives what ``np.unique(keys, return_inverse=True)`` followed by ``np.bincount`` gives (each
distinct key once, increasing, with the sum of its weights added in input order) from a stable LSD radix sort
instead of a comparison sort: O(n) a block instead of O(n log n). ``merge_tallies`` adds two tallies in one
linear pass, each key's sum ``first + second``, as ``np.unique`` and ``np.bincount`` over their concatenation
would. Both therefore give the same bits as the NumPy formulation they replace.

The radix sort makes every digit's histogram in one read of the input, moves keys of 32 bits when the key range
allows (S x T < 2^32: 50,000 words), skips a digit every key shares, and a block of rows is sorted straight from
its ``(context, target, mass)`` arrays without first writing out its cells: half the time of the sort it replaces
(three passes of reading, counting and scattering int64 keys each), on blocks of 131,072 rows of a 50,000-word
token stream (1M cells, about 110,000 distinct pairs).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dist_respattn.model.kernels.prefetch import prefetch_element

__all__ = [
    "ExactWindowCounts",
    "PairWordCounts",
    "equal_mass",
    "merge_supports",
    "merge_tallies",
    "tally_equal_keys",
    "tally_keys",
    "tally_rows",
    "tally_uniform_windows",
    "window_exact_mass",
]

_DIGIT_BITS = 11  # at most 2048 buckets: the counts stay in L1, and a 32-bit key range takes 3 passes


def _digits(top: int) -> tuple[int, int]:
    """``(passes, bits a digit)`` of an LSD radix sort of keys in ``[0, top]``: digits of at most 11 bits, as
    even as the passes allow."""
    bits = max(int(top).bit_length(), 1)
    passes = -(-bits // _DIGIT_BITS)
    return passes, -(-bits // passes)


def _key_dtype(top: int) -> type:
    return np.uint32 if top < 2**32 else np.int64


@numba.njit(cache=True, nogil=True)
def _key_histograms(keys, passes, digit_bits):  # pragma: no cover - compiled
    """Every digit's bucket counts, (passes, 2^digit_bits), in one read of ``keys``."""
    size = 1 << digit_bits
    mask = size - 1
    hist = np.zeros((passes, size), dtype=np.int64)
    for i in range(keys.shape[0]):
        key = np.int64(keys[i])
        for p in range(passes):
            hist[p, (key >> (p * digit_bits)) & mask] += 1
    return hist


@numba.njit(cache=True, nogil=True)
def _row_histograms(context, target, mass, num_symbols, passes, digit_bits):  # pragma: no cover - compiled
    """Every digit's bucket counts of the live cells ``target[n] * S + context[n, i]`` (``mass[n, i] > 0``), and
    how many cells are live, in one read of the rows."""
    n, n_pos = context.shape
    size = 1 << digit_bits
    mask = size - 1
    hist = np.zeros((passes, size), dtype=np.int64)
    live = 0
    for row in range(n):
        base = np.int64(target[row]) * num_symbols
        for i in range(n_pos):
            if mass[row, i] > 0.0:
                key = base + context[row, i]
                for p in range(passes):
                    hist[p, (key >> (p * digit_bits)) & mask] += 1
                live += 1
    return hist, live


@numba.njit(cache=True, nogil=True)
def _one_exact_mass(mass):  # pragma: no cover - compiled
    """The mass every live entry of ``mass`` holds when they all hold one, a power of two (a sum of k of them is
    k times it, exactly, in any order); else 0 (or when no entry is live)."""
    flat = mass.reshape(-1)
    one = 0.0
    for i in range(flat.shape[0]):
        m = flat[i]
        if m > 0.0:
            if one == 0.0:
                one = m
            elif m != one:
                return 0.0
    if one == 0.0 or math.isinf(one) or math.frexp(one)[0] != 0.5:
        return 0.0
    return one


@numba.njit(cache=True, nogil=True)
def _scatter_row_keys(context, target, mass, num_symbols, counts, digit_bits, out_k):  # pragma: no cover
    """:func:`_scatter_rows` of the keys alone (their masses all one)."""
    n, n_pos = context.shape
    mask = (1 << digit_bits) - 1
    at = _starts(counts)
    for row in range(n):
        base = np.int64(target[row]) * num_symbols
        for i in range(n_pos):
            if mass[row, i] > 0.0:
                key = base + context[row, i]
                d = key & mask
                j = at[d]
                out_k[j] = key
                at[d] = j + 1


@numba.njit(cache=True, nogil=True)
def _scatter_keys(src_k, counts, shift, digit_bits, dst_k):  # pragma: no cover - compiled
    """:func:`_scatter` of the keys alone."""
    mask = (1 << digit_bits) - 1
    at = _starts(counts)
    for i in range(src_k.shape[0]):
        key = src_k[i]
        d = (np.int64(key) >> shift) & mask
        j = at[d]
        dst_k[j] = key
        at[d] = j + 1


@numba.njit(cache=True, nogil=True)
def _count_runs(sorted_keys, mass):  # pragma: no cover - compiled
    """Each distinct key of sorted ``sorted_keys`` once (int64), with ``k * mass`` for its k entries: their sum
    from 0 in any order when ``mass`` is a power of two."""
    n = sorted_keys.shape[0]
    out_keys = np.empty(n, dtype=np.int64)
    sums = np.empty(n)
    j = -1
    previous = np.int64(-1)
    run = 0
    for i in range(n):
        key = np.int64(sorted_keys[i])
        if j < 0 or key != previous:
            if j >= 0:
                sums[j] = run * mass
            j += 1
            out_keys[j] = key
            previous = key
            run = 0
        run += 1
    if j >= 0:
        sums[j] = run * mass
    return out_keys[: j + 1], sums[: j + 1]


@numba.njit(cache=True, nogil=True, inline="always")
def _starts(counts):  # pragma: no cover - compiled
    starts = np.empty(counts.shape[0], dtype=np.int64)
    at = 0
    for d in range(counts.shape[0]):
        starts[d] = at
        at += counts[d]
    return starts


@numba.njit(cache=True, nogil=True, inline="always")
def _one_bucket(counts, n):  # pragma: no cover - compiled
    for d in range(counts.shape[0]):
        if counts[d] == n:
            return True
    return False


@numba.njit(cache=True, nogil=True)
def _scatter_rows(context, target, mass, num_symbols, counts, digit_bits, out_k, out_w):  # pragma: no cover
    """The live cells and their masses, stably scattered by their lowest digit (in row order when ``counts`` has
    one bucket)."""
    n, n_pos = context.shape
    mask = (1 << digit_bits) - 1
    at = _starts(counts)
    for row in range(n):
        base = np.int64(target[row]) * num_symbols
        for i in range(n_pos):
            w = mass[row, i]
            if w > 0.0:
                key = base + context[row, i]
                d = key & mask
                j = at[d]
                out_k[j] = key
                out_w[j] = w
                at[d] = j + 1


@numba.njit(cache=True, nogil=True)
def _scatter(src_k, src_w, counts, shift, digit_bits, dst_k, dst_w):  # pragma: no cover - compiled
    """``(src_k, src_w)`` stably scattered by the digit at ``shift`` into ``(dst_k, dst_w)``."""
    mask = (1 << digit_bits) - 1
    at = _starts(counts)
    for i in range(src_k.shape[0]):
        key = src_k[i]
        d = (np.int64(key) >> shift) & mask
        j = at[d]
        dst_k[j] = key
        dst_w[j] = src_w[i]
        at[d] = j + 1


@numba.njit(cache=True, nogil=True)
def _sum_runs(sorted_keys, sorted_weights):  # pragma: no cover - compiled
    """Each distinct key of sorted ``sorted_keys`` once (int64), with its weights added from 0 in order."""
    n = sorted_keys.shape[0]
    out_keys = np.empty(n, dtype=np.int64)
    sums = np.empty(n)
    j = -1
    previous = np.int64(-1)
    for i in range(n):
        key = np.int64(sorted_keys[i])
        if j < 0 or key != previous:
            j += 1
            out_keys[j] = key
            sums[j] = 0.0
            previous = key
        sums[j] += sorted_weights[i]  # from 0.0, in input order: np.bincount's sum
    return out_keys[: j + 1], sums[: j + 1]


@numba.njit(cache=True, nogil=True)
def _merge(a_keys, a_sums, b_keys, b_sums, keys, sums):  # pragma: no cover - compiled
    """The union of two tallies into ``keys`` and ``sums`` (of their total size), a key in both getting
    ``(0.0 + a) + b`` (:func:`_union_run` over the whole of both). Returns the union's size."""
    return _union_run(a_keys, a_sums, 0, a_keys.shape[0], b_keys, b_sums, 0, b_keys.shape[0], keys, sums, 0)


def _sorted_tally(src_k, src_w, hist, passes, digit_bits, first_done):
    """Radix passes ``first_done..passes-1`` over ``(src_k, src_w)``, then the runs summed."""
    n = src_k.shape[0]
    dst_k, dst_w = np.empty_like(src_k), np.empty_like(src_w)
    for p in range(first_done, passes):
        if _one_bucket(hist[p], n):  # every key shares this digit: the order stands
            continue
        _scatter(src_k, src_w, hist[p], p * digit_bits, digit_bits, dst_k, dst_w)
        src_k, dst_k = dst_k, src_k
        src_w, dst_w = dst_w, src_w
    return _sum_runs(src_k, src_w)


def tally_rows(
    context: np.ndarray, target: np.ndarray, mass: np.ndarray, num_symbols: int
) -> tuple[np.ndarray, np.ndarray]:
    """The tally of a block's (symbol, target) pairs: ``context`` (n, N) and ``target`` (n,) checked ids, ``mass``
    (n, N) float64 per entry (entries of mass 0 hold no pair); the cells are target-major, ``t * S + s``."""
    mass = np.ascontiguousarray(mass, dtype=np.float64)
    context = np.ascontiguousarray(context)
    target = np.ascontiguousarray(target)
    num_symbols = int(num_symbols)
    if target.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    top = (int(target.max()) + 1) * num_symbols - 1
    passes, digit_bits = _digits(top)
    hist, live = _row_histograms(context, target, mass, num_symbols, passes, digit_bits)
    keys = np.empty(live, dtype=_key_dtype(top))
    one = float(_one_exact_mass(mass))
    if one > 0.0:
        # Every live entry holds one mass, a power of two (uniform responsibilities 1/N, N = 8, on unweighted rows):
        # the keys are sorted alone and each run's sum is its length times the mass, the same bits.
        _scatter_row_keys(context, target, mass, num_symbols, hist[0], digit_bits, keys)
        return _count_runs(_sorted_keys(keys, hist, passes, digit_bits), one)
    weights = np.empty(live)
    _scatter_rows(context, target, mass, num_symbols, hist[0], digit_bits, keys, weights)
    return _sorted_tally(keys, weights, hist, passes, digit_bits, 1)


@numba.njit(cache=True, nogil=True)
def _window_histograms(
    tokens, begin, target, weights, uniform, n_pos, num_symbols, passes, digit_bits
):  # pragma: no cover - compiled
    """:func:`_row_histograms` of full windows' cells ``target[r] * S + tokens[begin[r] + i]``, each of mass
    ``uniform * weights[r]`` (``uniform`` when ``weights`` is empty); the live cells are those of positive mass."""
    size = 1 << digit_bits
    mask = size - 1
    hist = np.zeros((passes, size), dtype=np.int64)
    live = 0
    for row in range(begin.shape[0]):
        w = weights[row] if weights.shape[0] > 0 else 1.0
        if not uniform * w > 0.0:
            continue
        base = np.int64(target[row]) * num_symbols
        at = begin[row]
        for i in range(n_pos):
            key = base + tokens[at + i]
            for p in range(passes):
                hist[p, (key >> (p * digit_bits)) & mask] += 1
        live += n_pos
    return hist, live


@numba.njit(cache=True, nogil=True)
def _window_one_exact_mass(weights, uniform):  # pragma: no cover - compiled
    """:func:`_one_exact_mass` of the masses ``uniform * weights[r]`` (``uniform`` each when ``weights`` is empty)."""
    one = 0.0
    if weights.shape[0] == 0:
        one = uniform * 1.0
    for row in range(weights.shape[0]):
        m = uniform * weights[row]
        if m > 0.0:
            if one == 0.0:
                one = m
            elif m != one:
                return 0.0
    if not one > 0.0 or math.isinf(one) or math.frexp(one)[0] != 0.5:
        return 0.0
    return one


@numba.njit(cache=True, nogil=True)
def _scatter_windows(
    tokens, begin, target, weights, uniform, n_pos, num_symbols, counts, digit_bits, out_k, out_w, with_masses
):  # pragma: no cover - compiled
    """:func:`_scatter_rows` (or :func:`_scatter_row_keys`, without ``with_masses``) of full windows' live cells."""
    mask = (1 << digit_bits) - 1
    at = _starts(counts)
    for row in range(begin.shape[0]):
        w = weights[row] if weights.shape[0] > 0 else 1.0
        m = uniform * w
        if not m > 0.0:
            continue
        base = np.int64(target[row]) * num_symbols
        first = begin[row]
        for i in range(n_pos):
            key = base + tokens[first + i]
            d = key & mask
            j = at[d]
            out_k[j] = key
            if with_masses:
                out_w[j] = m
            at[d] = j + 1


def tally_uniform_windows(
    tokens: np.ndarray,
    begin: np.ndarray,
    target: np.ndarray,
    weights: np.ndarray,
    uniform: float,
    n_pos: int,
    num_symbols: int,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`tally_rows` of full token windows under uniform responsibilities: row ``r``'s cells are
    ``target[r] * S + tokens[begin[r] + i]`` for its ``n_pos`` positions, each of mass ``uniform * weights[r]``
    (``weights`` (0,): every row weighs 1). The same tally, to the bit, as :func:`tally_rows` of the rows'
    ``(n, N)`` contexts and masses (the cells in the same order, sorted the same way), without making them."""
    n_pos, num_symbols = int(n_pos), int(num_symbols)
    if target.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    top = (int(target.max()) + 1) * num_symbols - 1
    passes, digit_bits = _digits(top)
    uniform = float(uniform)
    hist, live = _window_histograms(tokens, begin, target, weights, uniform, n_pos, num_symbols, passes, digit_bits)
    keys = np.empty(live, dtype=_key_dtype(top))
    one = float(_window_one_exact_mass(weights, uniform))
    if one > 0.0:
        _scatter_windows(
            tokens, begin, target, weights, uniform, n_pos, num_symbols, hist[0], digit_bits, keys, _NO_MASSES, False
        )
        return _count_runs(_sorted_keys(keys, hist, passes, digit_bits), one)
    masses = np.empty(live)
    _scatter_windows(
        tokens, begin, target, weights, uniform, n_pos, num_symbols, hist[0], digit_bits, keys, masses, True
    )
    return _sorted_tally(keys, masses, hist, passes, digit_bits, 1)


_NO_MASSES = np.zeros(0)


def _sorted_keys(src_k: np.ndarray, hist: np.ndarray, passes: int, digit_bits: int) -> np.ndarray:
    """:func:`_sorted_tally`'s radix passes (after the first) of the keys alone."""
    n = src_k.shape[0]
    dst_k = np.empty_like(src_k)
    for p in range(1, passes):
        if _one_bucket(hist[p], n):
            continue
        _scatter_keys(src_k, hist[p], p * digit_bits, digit_bits, dst_k)
        src_k, dst_k = dst_k, src_k
    return src_k


def tally_keys(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct (P,) int64 increasing, sums (P,) float64)`` of non-negative int64 ``keys`` (n,) and ``weights`` (n,):
    each key's weights added in input order, from 0."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    if keys.shape != weights.shape or keys.ndim != 1:
        raise ValueError(f"keys {keys.shape} and weights {weights.shape}: expected two arrays of one shape (n,)")
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if int(keys.min()) < 0:
        raise ValueError(f"keys hold {int(keys.min())}: expected non-negative cells")
    top = int(keys.max())
    passes, digit_bits = _digits(top)
    hist = _key_histograms(keys, passes, digit_bits)
    return _sorted_tally(keys.astype(_key_dtype(top)), weights.copy(), hist, passes, digit_bits, 0)


def merge_tallies(
    first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The union of two tallies ``(keys increasing, sums)``: a key in both gets ``first's + second's``."""
    a_keys, b_keys = (np.ascontiguousarray(x[0], dtype=np.int64) for x in (first, second))
    a_sums, b_sums = (np.ascontiguousarray(x[1], dtype=np.float64) for x in (first, second))
    keys = np.empty(a_keys.shape[0] + b_keys.shape[0], dtype=np.int64)
    sums = np.empty(keys.shape[0])
    m = _merge(a_keys, a_sums, b_keys, b_sums, keys, sums)
    return _cut(keys, m), _cut(sums, m)


def _cut(array: np.ndarray, size: int) -> np.ndarray:
    """``array[:size]`` as an array of its own, cut in place (its pages past ``size``, never written, were never
    mapped: no copy)."""
    array.resize(size, refcheck=False)
    return array


@numba.njit(cache=True, nogil=True, inline="always")
def _union_run(a_s, a_c, i, a_end, b_s, b_c, j, b_end, out_s, out_c, m):  # pragma: no cover - compiled
    """The union of the increasing runs ``a_s[i:a_end]`` and ``b_s[j:b_end]`` written from ``out_s[m]``, a symbol
    in both getting ``(0.0 + a) + b`` (:func:`merge_tallies`' sum), one alone ``0.0 + its count``: selects instead
    of branches, the same additions either way (``x + 0.0`` is ``x`` for every ``x = 0.0 + y``). Returns the end."""
    while i < a_end and j < b_end:
        x = a_s[i]
        y = b_s[j]
        take_a = x <= y
        take_b = y <= x
        out_s[m] = x if take_a else y
        out_c[m] = (0.0 + (a_c[i] if take_a else 0.0)) + (b_c[j] if take_b else 0.0)
        i += take_a
        j += take_b
        m += 1
    while i < a_end:
        out_s[m] = a_s[i]
        out_c[m] = 0.0 + a_c[i]
        i += 1
        m += 1
    while j < b_end:
        out_s[m] = b_s[j]
        out_c[m] = 0.0 + b_c[j]
        j += 1
        m += 1
    return m


@numba.njit(cache=True, nogil=True)
def _merge_supports(indptrs, symbols, counts, out_indptr, out_symbols, out_counts):  # pragma: no cover
    """The union of :func:`merge_supports`, target by target: part 0's pairs of a target merged with part 1's, that
    with part 2's, ... (each run in a scratch pair of the target's size, the last into the output), so a pair's sum
    is the parts' counts folded in part order from 0, what the chain of :func:`merge_tallies` gives. ``indptrs``,
    ``symbols`` and ``counts`` are tuples of the parts' arrays (none copied or concatenated). Returns the pairs."""
    k = len(indptrs)
    width = out_indptr.shape[0]
    longest = 0
    for t in range(width - 1):
        size = 0
        for q in range(k):
            size += indptrs[q][t + 1] - indptrs[q][t]
        longest = max(longest, size)
    scratch_s = np.empty((2, longest), dtype=out_symbols.dtype)
    scratch_c = np.empty((2, longest))
    m = 0
    out_indptr[0] = 0
    for t in range(width - 1):
        a_s = symbols[0]
        a_c = counts[0]
        i, a_end = indptrs[0][t], indptrs[0][t + 1]
        for q in range(1, k):
            b_s = symbols[q]
            b_c = counts[q]
            j, b_end = indptrs[q][t], indptrs[q][t + 1]
            if q == k - 1:
                m = _union_run(a_s, a_c, i, a_end, b_s, b_c, j, b_end, out_symbols, out_counts, m)
            else:
                into = q & 1
                end = _union_run(a_s, a_c, i, a_end, b_s, b_c, j, b_end, scratch_s[into], scratch_c[into], 0)
                a_s = scratch_s[into]
                a_c = scratch_c[into]
                i, a_end = 0, end
        out_indptr[t + 1] = m
    return m


def merge_supports(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of ``k`` sparse counts given target-major, each ``(indptr (T + 1,), symbols (P,), counts (P,))``
    (symbols increasing within a target), as one ``(indptr, symbols int32, counts)``: a pair's count is the parts'
    counts added in list order, as :func:`merge_tallies` of the parts' tallies, one after the other, gives it to the
    bit, in one pass over the targets (and no cell keys made or divided back). The parts' arrays are read where
    they lie; the union is written once into arrays of the parts' total size, cut to its own in place."""
    if not parts:
        raise ValueError("merge_supports of no parts: expected at least one")
    indptrs = tuple(np.ascontiguousarray(p[0], dtype=np.int64) for p in parts)
    symbols = tuple(np.ascontiguousarray(p[1], dtype=np.int32) for p in parts)
    counts = tuple(np.ascontiguousarray(p[2], dtype=np.float64) for p in parts)
    width = indptrs[0].shape[0]
    sizes_differ = any(s.shape != c.shape for s, c in zip(symbols, counts, strict=True))
    if sizes_differ or any(i.shape != (width,) for i in indptrs):
        raise ValueError("merge_supports: parts of different targets, or symbols and counts of different sizes")
    if len(parts) == 1:
        return indptrs[0].copy(), symbols[0].copy(), 0.0 + counts[0]
    total = sum(int(s.shape[0]) for s in symbols)
    out_indptr = np.empty(width, dtype=np.int64)
    out_symbols = np.empty(total, dtype=np.int32)
    out_counts = np.empty(total)
    m = _merge_supports(indptrs, symbols, counts, out_indptr, out_symbols, out_counts)
    return out_indptr, _cut(out_symbols, m), _cut(out_counts, m)


@numba.njit(cache=True, nogil=True)
def _count_windows(
    tokens, begin, target, weights, uniform, n_pos, num_symbols, slots, counts, bits, out_keys, out_counts
):  # pragma: no cover - compiled
    """Count the live cells of full windows (:func:`tally_uniform_windows`'s) in an open-addressing table of
    ``2^bits`` slots (``slots`` -1 when empty), then move each distinct cell and its count to ``out_keys`` and
    ``out_counts`` (unsorted), leaving the table empty. Returns how many, or -1 when the table filled past 3/4 (it
    is emptied, nothing counted: count again in a larger one)."""
    size = np.int64(1) << bits
    mask = size - 1
    shift = np.uint64(64 - bits)
    limit = (size >> 1) + (size >> 2)
    used = 0
    full = False
    for row in range(begin.shape[0]):
        w = weights[row] if weights.shape[0] > 0 else 1.0
        if not uniform * w > 0.0:
            continue
        base = np.int64(target[row]) * num_symbols
        first = begin[row]
        for i in range(n_pos):
            key = base + tokens[first + i]
            h = np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
            while True:
                k = slots[h]
                if k == key:
                    counts[h] += 1
                    break
                if k < 0:
                    slots[h] = key
                    counts[h] = 1
                    used += 1
                    break
                h = (h + 1) & mask
            if used > limit:
                full = True
                break
        if full:
            break
    m = 0
    for slot in range(size):
        if slots[slot] >= 0:
            if not full:
                out_keys[m] = slots[slot]
                out_counts[m] = counts[slot]
                m += 1
            slots[slot] = -1
    return -1 if full else m


@numba.njit(cache=True, nogil=True, inline="always")
def _count_word(table, key, h, mask):  # pragma: no cover - compiled
    """Count cell ``key`` (below 2^32) once in a word table (a word: the cell in its high half, its count in the low
    half; 0 empty), probing from slot ``h`` on; returns 1 when the cell is new to the table, else 0."""
    high = np.uint64(32)
    while True:
        word = table[h]
        if word == 0:
            table[h] = (key << high) | np.uint64(1)
            return 1
        if (word >> high) == key:
            table[h] = word + np.uint64(1)
            return 0
        h = (h + 1) & mask


#: How many rows ahead :func:`_count_window_words` prefetches the slots of a row's cells (the table is larger than
#: L2 once it holds a partition's cells).
_COUNT_PREFETCH_ROWS = 2


@numba.njit(cache=True, nogil=True)
def _count_window_words(
    tokens, begin, target, weights, uniform, n_pos, num_symbols, row, slots, bits, used
):  # pragma: no cover - compiled  # fmt: skip
    """Count the live cells of full windows (:func:`tally_uniform_windows`'s) from row ``row`` on into an
    open-addressing table of ``2^bits`` words that persists from one block to the next, the cell in a word's high
    half and its count in the low half (0: empty; a cell's count is at least 1), for cells below 2^32: one load a
    probe. ``used[0]``: the table's cells, updated. Returns the row after the last one counted: the block's end, or
    a row whose cells could take the table past 3/4 (empty it, or a larger one, and count on from there)."""
    size = np.int64(1) << bits
    mask = size - 1
    shift = np.uint64(64 - bits)
    limit = (size >> 1) + (size >> 2)
    u = used[0]
    n = begin.shape[0]
    while row < n:
        if u + n_pos > limit:
            break
        ahead = row + _COUNT_PREFETCH_ROWS
        if ahead < n:
            base_ahead = np.uint64(target[ahead]) * np.uint64(num_symbols)
            first_ahead = begin[ahead]
            for i in range(n_pos):
                key = base_ahead + np.uint64(tokens[first_ahead + i])
                prefetch_element(slots, np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> shift))
        w = weights[row] if weights.shape[0] > 0 else 1.0
        if uniform * w > 0.0:
            base = np.uint64(target[row]) * np.uint64(num_symbols)
            first = begin[row]
            for i in range(n_pos):
                key = base + np.uint64(tokens[first + i])
                u += _count_word(slots, key, np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> shift), mask)
        row += 1
    used[0] = u
    return row


def window_exact_mass(weights: np.ndarray, uniform: float) -> float:
    """The one mass every live cell of full windows holds under uniform responsibilities ``uniform`` and row
    ``weights`` (float64 (n,), or (0,): every row weighs 1), when it is one power of two; else 0."""
    return float(_window_one_exact_mass(weights, float(uniform)))


#: The word table of :class:`ExactWindowCounts`: 2^18 slots (2 MB) to start with, grown a slot bit at a time when
#: it fills, to 2^20 at most (8 MB; a 4.2M-row partition of a 50,000-word store holds 1.37M distinct cells).
_WORD_TABLE_BITS = 18
_WORD_TABLE_MAX_BITS = 20


class ExactWindowCounts:
    """The tally of full windows' cells that all hold one mass ``mass``, a power of two (:func:`window_exact_mass`),
    counted in a hash table and sorted once at the end (:meth:`tally`). Each cell's sum is its count times
    ``mass``: exactly what :func:`tally_uniform_windows` of each block, merged block after block by
    :func:`merge_tallies`, gives (a sum of k × mass is exact in any order).

    Cells below 2^32 (S × T < 2^32: 50,000 words) are counted with the cell and its count in one 64-bit word of a
    table kept from one block to the next (:func:`_count_window_words`), emptied into a list of such words only
    when it fills (and then grown, up to ``2^_WORD_TABLE_MAX_BITS`` slots), and the words sorted once
    (:func:`_tally_words`): a cell met in many blocks is sorted about once, not once a block. Larger cells are
    counted block by block as a key and a count."""

    def __init__(self, mass: float) -> None:
        self.mass = float(mass)
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.words: list[np.ndarray] = []
        self.bits = 16
        self.slots = np.full(1 << self.bits, -1, dtype=np.int64)
        self.counts = np.zeros(1 << self.bits, dtype=np.int64)
        self.word_bits = _WORD_TABLE_BITS
        self.word_slots = np.zeros(1 << self.word_bits, dtype=np.uint64)
        self.word_used = np.zeros(1, dtype=np.int64)
        self.word_entries = 0  # cells counted into the word table since it was last emptied (< 2^32)

    def add(
        self,
        tokens: np.ndarray,
        begin: np.ndarray,
        target: np.ndarray,
        weights: np.ndarray,
        uniform: float,
        n_pos: int,
        num_symbols: int,
    ) -> None:
        """Count one block's live cells (its rows' masses ``uniform * weights``, each this tally's ``mass``)."""
        live = int(begin.shape[0]) * int(n_pos)
        if live == 0:
            return
        if live < 2**32 and (int(target.max()) + 1) * int(num_symbols) <= 2**32:
            if self.word_entries + live >= 2**32:  # a count must stay below 2^32
                self._drain_words()
            self.word_entries += live
            row, n = 0, int(begin.shape[0])
            while row < n:
                while 3 * (1 << self.word_bits) < 4 * int(n_pos) and not self.word_used[0]:
                    self._grow_words()
                row = _count_window_words(
                    tokens, begin, target, weights, float(uniform), int(n_pos), int(num_symbols), row,
                    self.word_slots, self.word_bits, self.word_used,
                )  # fmt: skip
                if row < n:
                    self._drain_words()
                    if self.word_bits < _WORD_TABLE_MAX_BITS:
                        self._grow_words()
            return
        while True:
            size = 1 << self.bits
            out_keys = np.empty(min(live, size), dtype=np.int64)
            out_counts = np.empty(min(live, size), dtype=np.int64)
            m = _count_windows(
                tokens, begin, target, weights, float(uniform), int(n_pos), int(num_symbols), self.slots,
                self.counts, self.bits, out_keys, out_counts,
            )  # fmt: skip
            if m >= 0:
                self.parts.append((out_keys[:m].copy(), out_counts[:m].copy()))
                return
            self.bits += 2  # four times the slots, and count the block again
            self.slots = np.full(1 << self.bits, -1, dtype=np.int64)
            self.counts = np.zeros(1 << self.bits, dtype=np.int64)

    def _drain_words(self) -> None:
        """Move the word table's cells to :attr:`words`, leaving it empty."""
        if self.word_used[0]:
            out = np.empty(int(self.word_used[0]), dtype=np.uint64)
            _drain_words(self.word_slots, out)
            self.words.append(out)
            self.word_used[0] = 0
        self.word_entries = 0

    def _grow_words(self) -> None:
        """A word table of twice the slots (the current one empty)."""
        self.word_bits += 1
        self.word_slots = np.zeros(1 << self.word_bits, dtype=np.uint64)

    def tally(self) -> tuple[np.ndarray, np.ndarray]:
        """``(cells (P,) int64 increasing, sums (P,) float64)`` of every block counted."""
        self._drain_words()
        if not self.parts and not self.words:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        if self.parts:  # cells past 2^32: every part as a key and a count
            parts = self.parts + [(_high_halves(w), _low_halves(w)) for w in self.words]
            keys = np.concatenate([p[0] for p in parts])
            counts = np.concatenate([p[1] for p in parts]).astype(np.float64)  # integers below 2^53: exact sums
            cells, sums = tally_keys(keys, counts)
        else:
            cells, sums = _tally_words(np.concatenate(self.words))  # a copy: the sort reuses its input
        sums *= self.mass
        return cells, sums


class PairWordCounts:
    """Counts of cells below 2^32 (``s * T + t``, S × T ≤ 2^32), each with its count in one 64-bit slot of an
    open-addressing table (the cell in the high half; 0: empty) that persists from one call of :meth:`add` to the
    next and is emptied into a list of such words when it fills past 3/4 (at most ``2^32 - 1`` entries in all).
    :meth:`tally` sorts the words once and adds each cell's counts: whole numbers, the same in any order."""

    def __init__(self, bits: int = 18) -> None:
        self.bits = bits
        self.table = np.zeros(1 << bits, dtype=np.uint64)
        self.used = np.zeros(1, dtype=np.int64)
        self.words: list[np.ndarray] = []
        self.entries = 0

    def add(self, symbols: np.ndarray, targets: np.ndarray, num_targets: int, live: np.ndarray) -> None:
        """Count the cells ``symbols * num_targets + targets`` ((n,) ids each, the cells below 2^32) where ``live``
        (n,) float64 is positive (empty: every one)."""
        self.entries += int(targets.shape[0])
        row, n = 0, int(targets.shape[0])
        while row < n:
            row = _count_words(symbols, targets, num_targets, live, row, self.table, self.bits, self.used)
            if row < n:
                self._drain()

    def _drain(self) -> None:
        out = np.empty(int(self.used[0]), dtype=np.uint64)
        _drain_words(self.table, out)
        self.words.append(out)
        self.used[0] = 0

    def tally(self) -> tuple[np.ndarray, np.ndarray]:
        """``(cells (P,) int64 increasing, counts (P,) float64)``; the table is left empty."""
        if self.used[0]:
            self._drain()
        words, self.words = self.words, []
        if not words:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return _tally_words(words[0] if len(words) == 1 else np.concatenate(words))


@numba.njit(cache=True, nogil=True)
def _count_words(symbols, targets, num_targets, live, row, table, bits, used):  # pragma: no cover - compiled
    """Count the cells of rows ``row, row + 1, ...`` (those of positive ``live``, or all when it is empty) into
    ``table``; returns the row after the last one counted: ``n``, or sooner when the table filled past 3/4."""
    size = np.int64(1) << bits
    mask = size - 1
    shift = np.uint64(64 - bits)
    limit = (size >> 1) + (size >> 2)
    n = targets.shape[0]
    while row < n:
        if live.shape[0] > 0 and not live[row] > 0.0:
            row += 1
            continue
        key = np.uint64(symbols[row]) * np.uint64(num_targets) + np.uint64(targets[row])
        used[0] += _count_word(table, key, np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> shift), mask)
        row += 1
        if used[0] > limit:
            break
    return row


@numba.njit(cache=True, nogil=True)
def _drain_words(table, out):  # pragma: no cover - compiled
    m = 0
    for slot in range(table.shape[0]):
        word = table[slot]
        if word != 0:
            out[m] = word
            m += 1
            table[slot] = 0


@numba.njit(cache=True, nogil=True)
def _high_halves(words):  # pragma: no cover - compiled
    out = np.empty(words.shape[0], dtype=np.int64)
    for i in range(words.shape[0]):
        out[i] = np.int64(words[i] >> np.uint64(32))
    return out


@numba.njit(cache=True, nogil=True)
def _low_halves(words):  # pragma: no cover - compiled
    out = np.empty(words.shape[0], dtype=np.int64)
    for i in range(words.shape[0]):
        out[i] = np.int64(words[i] & np.uint64(0xFFFFFFFF))
    return out


def _tally_words(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`tally_keys` of cells below 2^32 with whole counts below 2^32 given as one 64-bit word each (the cell in
    the high half): the words sorted by the high half's digits (8 bytes moved an entry a pass instead of a 4-byte
    key and an 8-byte weight) and each cell's counts added up. The sums are whole numbers (below 2^53 here), so the
    same as adding them as float64 in any order."""
    cells = _high_halves(words)
    top = int(cells.max())
    passes, digit_bits = _digits(top)
    hist = _key_histograms(cells, passes, digit_bits)
    src = words
    dst = np.empty_like(src)
    for p in range(passes):
        if _one_bucket(hist[p], src.shape[0]):
            continue
        _scatter_words(src, hist[p], 32 + p * digit_bits, digit_bits, dst)
        src, dst = dst, src
    return _sum_packed_runs(src)


@numba.njit(cache=True, nogil=True)
def _scatter_words(src, counts, shift, digit_bits, dst):  # pragma: no cover - compiled
    """:func:`_scatter_keys` of uint64 words by the digit at ``shift`` (an unsigned shift: a digit may reach past
    the word's top bit, where the cell's bits end)."""
    mask = np.uint64((1 << digit_bits) - 1)
    at = _starts(counts)
    ushift = np.uint64(shift)
    for i in range(src.shape[0]):
        word = src[i]
        d = np.int64((word >> ushift) & mask)
        j = at[d]
        dst[j] = word
        at[d] = j + 1


@numba.njit(cache=True, nogil=True)
def _sum_packed_runs(words):  # pragma: no cover - compiled
    """Each distinct high half of sorted ``words`` once (int64), with the sum of its low halves (float64)."""
    n = words.shape[0]
    out_keys = np.empty(n, dtype=np.int64)
    sums = np.empty(n)
    j = -1
    previous = np.int64(-1)
    run = np.int64(0)
    low = np.uint64(0xFFFFFFFF)
    for i in range(n):
        word = words[i]
        key = np.int64(word >> np.uint64(32))
        if j < 0 or key != previous:
            if j >= 0:
                sums[j] = np.float64(run)
            j += 1
            out_keys[j] = key
            previous = key
            run = np.int64(0)
        run += np.int64(word & low)
    if j >= 0:
        sums[j] = np.float64(run)
    return out_keys[: j + 1], sums[: j + 1]


def equal_mass(weights: np.ndarray) -> float:
    """The one weight every positive entry of ``weights`` holds when it is one power of two (a sum of k of them is k
    times it, exactly, in any order); else 0 (or when none is positive)."""
    return float(_one_exact_mass(np.ascontiguousarray(weights, dtype=np.float64)))


def tally_equal_keys(keys: np.ndarray, mass: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`tally_keys` of ``keys`` whose weights all equal ``mass``, a power of two (:func:`equal_mass`): the keys
    sorted alone, each run's sum its length times ``mass``, the same bits."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if int(keys.min()) < 0:
        raise ValueError(f"keys hold {int(keys.min())}: expected non-negative cells")
    top = int(keys.max())
    passes, digit_bits = _digits(top)
    hist = _key_histograms(keys, passes, digit_bits)
    src: np.ndarray = keys.astype(_key_dtype(top))
    if not _one_bucket(hist[0], src.shape[0]):
        first = np.empty_like(src)
        _scatter_keys(src, hist[0], 0, digit_bits, first)
        src = first
    return _count_runs(_sorted_keys(src, hist, passes, digit_bits), float(mass))
