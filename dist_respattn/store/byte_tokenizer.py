"""The ``words-and-punctuation`` tokenizer of :mod:`~dist_respattn.store.text`, compiled over a file's bytes.

It gives exactly the tokens of :func:`~dist_respattn.store.text.tokenize` on the file decoded as UTF-8
(undecodable bytes as U+FFFD), but as ids into a :class:`TokenDictionary` that it fills as it goes, one
pass and no Python string per token. ASCII text is scanned by a compiled loop whose byte classes
(word, space, other) are read off the regular expression itself, so they cannot drift from it. A run
of non-space bytes holding any byte >= 0x80 is handed whole to the Python tokenizer: splitting the
text at ASCII spaces is safe because no token holds a space, an ASCII byte always decodes as itself
(an invalid UTF-8 sequence ends before it), and lowercasing never looks across a space (its only
context rule, the final sigma, stops at an uncased character).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numba
import numpy as np

__all__ = ["TokenDictionary", "tokenize_bytes"]

_WORD, _SPACE, _OTHER, _HIGH = 0, 1, 2, 3
_INITIAL_SLOTS = 1 << 16


def _byte_classes(pattern: str) -> np.ndarray:
    """Each byte's class under ``pattern``'s ``\\w``/``\\s`` (bytes >= 0x80 are ``_HIGH``): (256,) uint8."""
    word, space = re.compile(r"\w"), re.compile(r"\s")
    classes = np.full(256, _HIGH, dtype=np.uint8)
    for b in range(128):
        c = chr(b)
        classes[b] = _WORD if word.fullmatch(c) else _SPACE if space.fullmatch(c) else _OTHER
    # The tokenizer's own pattern must be word runs and single others, or this scan is not it.
    assert pattern == r"\w+|[^\w\s]", pattern
    return classes


def _lower_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint8)
    for b in range(128):
        table[b] = ord(chr(b).lower())
    return table


@numba.njit(cache=True, nogil=True)
def _hash(data, start, stop, lower):  # pragma: no cover - compiled
    """FNV-1a over the lowercased bytes ``data[start:stop]``."""
    h = np.uint64(14695981039346656037)
    for i in range(start, stop):
        h = (h ^ np.uint64(lower[data[i]])) * np.uint64(1099511628211)
    return h


@numba.njit(cache=True, nogil=True)
def _intern(data, start, stop, lower, slots, hashes, offsets, arena, meta):  # pragma: no cover - compiled
    """The id of the lowercased token ``data[start:stop]``, added if new (capacity is the caller's)."""
    h = _hash(data, start, stop, lower)
    mask = np.uint64(slots.size - 1)
    i = h & mask
    length = stop - start
    while True:
        e = slots[i]
        if e < 0:
            n = meta[0]
            used = offsets[n]
            for k in range(length):
                arena[used + k] = lower[data[start + k]]
            offsets[n + 1] = used + length
            hashes[n] = h
            slots[i] = n
            meta[0] = n + 1
            return n
        if hashes[e] == h and offsets[e + 1] - offsets[e] == length:
            base = offsets[e]
            same = True
            for k in range(length):
                if arena[base + k] != lower[data[start + k]]:
                    same = False
                    break
            if same:
                return e
        i = (i + np.uint64(1)) & mask


@numba.njit(cache=True, nogil=True)
def _scan(data, classes, lower, slots, hashes, offsets, arena, meta, out, spans):  # pragma: no cover - compiled
    """Tokenize ``data`` into ``out`` (ids); a run holding non-ASCII bytes becomes ``-1 - k`` with span ``k``.

    Returns (tokens written, spans written).
    """
    n_out = 0
    n_spans = 0
    size = data.size
    run_start = 0  # first byte after the last space
    run_out = 0  # tokens written before run_start
    i = 0
    while i < size:
        c = classes[data[i]]
        if c == _SPACE:
            i += 1
            run_start = i
            run_out = n_out
        elif c == _WORD:
            j = i + 1
            while j < size and classes[data[j]] == _WORD:
                j += 1
            if j < size and classes[data[j]] == _HIGH:
                i = j  # the word may go on in non-ASCII letters: the run is the Python tokenizer's
                continue
            out[n_out] = _intern(data, i, j, lower, slots, hashes, offsets, arena, meta)
            n_out += 1
            i = j
        elif c == _OTHER:
            out[n_out] = _intern(data, i, i + 1, lower, slots, hashes, offsets, arena, meta)
            n_out += 1
            i += 1
        else:
            # Give the whole run between ASCII spaces to the Python tokenizer, tokens already made from it too.
            j = i + 1
            while j < size and classes[data[j]] != _SPACE:
                j += 1
            n_out = run_out
            spans[n_spans, 0] = run_start
            spans[n_spans, 1] = j
            out[n_out] = -1 - n_spans
            n_out += 1
            n_spans += 1
            i = j
            run_start = j
            run_out = n_out
    return n_out, n_spans


@numba.njit(cache=True, nogil=True)
def _count(ids, counts):  # pragma: no cover - compiled
    for i in ids:
        counts[i] += 1


@numba.njit(cache=True, nogil=True)
def _rehash(hashes, count, size):  # pragma: no cover - compiled
    slots = np.full(size, -1, dtype=np.int64)
    mask = np.uint64(size - 1)
    for e in range(count):
        i = hashes[e] & mask
        while slots[i] >= 0:
            i = (i + np.uint64(1)) & mask
        slots[i] = e
    return slots


class TokenDictionary:
    """Distinct tokens in order of first sight (ids 0, 1, ...), kept as lowercased UTF-8 bytes in one arena.

    Memory grows with the distinct tokens, not with the text: ~(2 slots + 2) * 8 bytes and the token's
    bytes each.
    """

    def __init__(self) -> None:
        self._slots = np.full(_INITIAL_SLOTS, -1, dtype=np.int64)
        self._hashes = np.zeros(_INITIAL_SLOTS // 2, dtype=np.uint64)
        self._offsets = np.zeros(_INITIAL_SLOTS // 2 + 1, dtype=np.int64)
        self._counts = np.zeros(_INITIAL_SLOTS // 2, dtype=np.int64)
        self._arena = np.zeros(1 << 20, dtype=np.uint8)
        self._meta = np.zeros(1, dtype=np.int64)  # [number of tokens]

    def __len__(self) -> int:
        return int(self._meta[0])

    def reserve(self, tokens: int, arena_bytes: int) -> None:
        """Room for ``tokens`` more tokens of ``arena_bytes`` bytes in all, the slots at most half full."""
        n = len(self)
        need = n + tokens
        if need > self._hashes.size:
            size = max(need, 2 * self._hashes.size)
            self._hashes = np.concatenate([self._hashes[:n], np.zeros(size - n, dtype=np.uint64)])
            self._offsets = np.concatenate([self._offsets[: n + 1], np.zeros(size - n, dtype=np.int64)])
            self._counts = np.concatenate([self._counts[:n], np.zeros(size - n, dtype=np.int64)])
        used = int(self._offsets[n])
        if used + arena_bytes > self._arena.size:
            grown = np.zeros(max(used + arena_bytes, 2 * self._arena.size), dtype=np.uint8)
            grown[:used] = self._arena[:used]
            self._arena = grown
        if 2 * need > self._slots.size:
            size = self._slots.size
            while 2 * need > size:
                size *= 2
            self._slots = _rehash(self._hashes, n, size)

    def intern(self, token: bytes) -> int:
        """The id of a token given as its (lowercased) UTF-8 bytes."""
        data = np.frombuffer(token, dtype=np.uint8)
        self.reserve(1, data.size)
        return int(
            _intern(data, 0, data.size, _IDENTITY, self._slots, self._hashes, self._offsets, self._arena, self._meta)
        )

    def count(self, ids: np.ndarray) -> None:
        """Count ``ids`` (int32) as occurrences."""
        _count(ids, self._counts)

    @property
    def counts(self) -> np.ndarray:
        """How often each token was counted: (len,) int64 (a token seen only in a retracted scan counts 0)."""
        return self._counts[: len(self)]

    def token(self, index: int) -> str:
        start, stop = int(self._offsets[index]), int(self._offsets[index + 1])
        return self._arena[start:stop].tobytes().decode("utf-8")

    def tokens(self, indices: np.ndarray) -> list[str]:
        """The tokens of ``indices`` as strings."""
        return [self.token(int(i)) for i in indices]

    def scan(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Compiled pass over ``data`` (uint8): (ids with span markers, spans (k, 2), tokens written)."""
        # A token is at least one byte, and a new one adds at most its bytes to the arena.
        self.reserve(data.size, data.size)
        out = np.empty(data.size, dtype=np.int32)
        spans = np.empty((data.size // 2 + 1, 2), dtype=np.int64)
        count, n_spans = _scan(
            data, _CLASSES, _LOWER, self._slots, self._hashes, self._offsets, self._arena, self._meta, out, spans
        )
        return out[:count], spans[:n_spans], count


_CLASSES = _byte_classes(r"\w+|[^\w\s]")
_LOWER = _lower_table()
_IDENTITY = np.arange(256, dtype=np.uint8)


def tokenize_bytes(
    data: bytes | np.ndarray, dictionary: TokenDictionary, tokenize: Callable[[str], list[str]]
) -> np.ndarray:
    """The token ids (int32, into ``dictionary``) of one file's bytes, as ``tokenize`` of its UTF-8 text gives them.

    ``tokenize`` is the Python tokenizer, used on the runs that hold non-ASCII bytes.
    """
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
    ids, spans, _ = dictionary.scan(raw)
    if not spans.size:
        return ids
    markers = np.flatnonzero(ids < 0)
    pieces: list[np.ndarray] = []
    previous = 0
    for k, at in enumerate(markers):
        pieces.append(ids[previous:at])
        start, stop = spans[k]
        text = raw[start:stop].tobytes().decode("utf-8", errors="replace")
        found = [dictionary.intern(token.encode("utf-8")) for token in tokenize(text)]
        pieces.append(np.asarray(found, dtype=np.int32))
        previous = int(at) + 1
    pieces.append(ids[previous:])
    return np.concatenate(pieces)
