"""The ``words-and-punctuation`` tokenizer of :mod:`~dist_respattn.store.ingest.text`, compiled over a file's bytes.

It gives exactly the tokens of :func:`~dist_respattn.store.ingest.text.tokenize` on the file decoded as UTF-8
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

__all__ = ["TokenDictionary", "space_positions", "tokenize_bytes"]

_WORD, _SPACE, _OTHER, _HIGH = 0, 1, 2, 3
_INITIAL_SLOTS = 1 << 16
_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


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
    h = _FNV_OFFSET
    for i in range(start, stop):
        h = (h ^ np.uint64(lower[data[i]])) * _FNV_PRIME
    return h


@numba.njit(cache=True, nogil=True)
def _intern(data, start, stop, h, lower, slots, offsets, arena, meta):  # pragma: no cover - compiled
    """The id of the lowercased token ``data[start:stop]`` (of :func:`_hash` ``h``), added if new.

    Room is the caller's to make. ``slots`` (size, 2) int64 holds (hash, id) side by side (id -1: empty),
    so a probe touches one cache line.
    """
    key = np.int64(h)
    mask = np.uint64(slots.shape[0] - 1)
    i = h & mask
    length = stop - start
    while True:
        e = slots[i, 1]
        if e < 0:
            n = meta[0]
            used = offsets[n]
            for k in range(length):
                arena[used + k] = lower[data[start + k]]
            offsets[n + 1] = used + length
            slots[i, 0] = key
            slots[i, 1] = n
            meta[0] = n + 1
            return n
        if slots[i, 0] == key and offsets[e + 1] - offsets[e] == length:
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
def _intern_whole(data, lower, slots, offsets, arena, meta):  # pragma: no cover - compiled
    return _intern(data, 0, data.size, _hash(data, 0, data.size, lower), lower, slots, offsets, arena, meta)


@numba.njit(cache=True, nogil=True)
def _has_room(length, slots, offsets, arena, meta):  # pragma: no cover - compiled
    n = meta[0]
    return n + 1 < offsets.size and 2 * (n + 1) <= slots.shape[0] and offsets[n] + length <= arena.size


@numba.njit(cache=True, nogil=True)
def _scan(data, classes, lower, single, slots, offsets, arena, meta, out, spans, state):  # pragma: no cover
    """Tokenize ``data`` into ``out`` (ids); a run holding non-ASCII bytes becomes ``-1 - k`` with span ``k``.

    ``single`` (256,) caches the id of each one-byte token (-1: not yet seen). ``state`` = (byte, run start,
    tokens before the run, tokens written, spans written) on entry and exit. Returns False when the
    dictionary needs room (the caller grows it and calls again), True when ``data`` is done.
    """
    i, run_start, run_out, n_out, n_spans = state[0], state[1], state[2], state[3], state[4]
    size = data.size
    done = True
    while i < size:
        c = classes[data[i]]
        if c == _SPACE:
            i += 1
            run_start = i
            run_out = n_out
            continue
        if c == _HIGH:
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
            continue
        # FNV-1a of the lowercased token, as _hash computes it, made while the word is scanned.
        h = (_FNV_OFFSET ^ np.uint64(lower[data[i]])) * _FNV_PRIME
        j = i + 1
        if c == _WORD:
            while j < size and classes[data[j]] == _WORD:
                h = (h ^ np.uint64(lower[data[j]])) * _FNV_PRIME
                j += 1
            if j < size and classes[data[j]] == _HIGH:
                i = j  # the word may go on in non-ASCII letters: the run is the Python tokenizer's
                continue
        if j == i + 1 and single[data[i]] >= 0:
            out[n_out] = single[data[i]]
        else:
            if not _has_room(j - i, slots, offsets, arena, meta):
                done = False
                break
            e = _intern(data, i, j, h, lower, slots, offsets, arena, meta)
            if j == i + 1:
                single[data[i]] = e
            out[n_out] = e
        n_out += 1
        i = j
    state[0], state[1], state[2], state[3], state[4] = i, run_start, run_out, n_out, n_spans
    return done


@numba.njit(cache=True, nogil=True)
def _merge(other_offsets, other_arena, count, identity, slots, offsets, arena, meta):  # pragma: no cover
    """The ids in this dictionary of another's first ``count`` tokens (added if new): (count,) int64."""
    mapping = np.empty(count, dtype=np.int64)
    for e in range(count):
        a, b = other_offsets[e], other_offsets[e + 1]
        h = _hash(other_arena, a, b, identity)
        mapping[e] = _intern(other_arena, a, b, h, identity, slots, offsets, arena, meta)
    return mapping


@numba.njit(cache=True, nogil=True)
def _count(ids, counts):  # pragma: no cover - compiled
    for i in ids:
        counts[i] += 1


@numba.njit(cache=True, nogil=True)
def _rehash(slots, size):  # pragma: no cover - compiled
    grown = np.full((size, 2), -1, dtype=np.int64)
    mask = np.uint64(size - 1)
    for k in range(slots.shape[0]):
        if slots[k, 1] < 0:
            continue
        i = np.uint64(slots[k, 0]) & mask
        while grown[i, 1] >= 0:
            i = (i + np.uint64(1)) & mask
        grown[i, 0] = slots[k, 0]
        grown[i, 1] = slots[k, 1]
    return grown


class TokenDictionary:
    """Distinct tokens in order of first sight (ids 0, 1, ...), kept as lowercased UTF-8 bytes in one arena.

    Memory grows with the distinct tokens, not with the text: ~48 bytes and the token's bytes each.
    """

    def __init__(self) -> None:
        self._slots = np.full((_INITIAL_SLOTS, 2), -1, dtype=np.int64)
        self._offsets = np.zeros(_INITIAL_SLOTS // 2 + 1, dtype=np.int64)
        self._counts = np.zeros(_INITIAL_SLOTS // 2, dtype=np.int64)
        self._arena = np.zeros(1 << 20, dtype=np.uint8)
        self._meta = np.zeros(1, dtype=np.int64)  # [number of tokens]
        self._single = np.full(256, -1, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._meta[0])

    def reserve(self, tokens: int, arena_bytes: int) -> None:
        """Room for ``tokens`` more tokens of ``arena_bytes`` bytes in all, the slots at most half full."""
        n = len(self)
        need = n + tokens
        if need + 1 > self._offsets.size:
            size = max(need + 1, 2 * self._offsets.size)
            self._offsets = np.concatenate([self._offsets[: n + 1], np.zeros(size - n - 1, dtype=np.int64)])
            self._counts = np.concatenate([self._counts[:n], np.zeros(size - 1 - n, dtype=np.int64)])
        used = int(self._offsets[n])
        if used + arena_bytes > self._arena.size:
            grown = np.zeros(max(used + arena_bytes, 2 * self._arena.size), dtype=np.uint8)
            grown[:used] = self._arena[:used]
            self._arena = grown
        if 2 * need > self._slots.shape[0]:
            size = self._slots.shape[0]
            while 2 * need > size:
                size *= 2
            self._slots = _rehash(self._slots, size)

    def intern(self, token: bytes) -> int:
        """The id of a token given as its (lowercased) UTF-8 bytes."""
        data = np.frombuffer(token, dtype=np.uint8)
        self.reserve(1, data.size)
        return int(_intern_whole(data, _IDENTITY, self._slots, self._offsets, self._arena, self._meta))

    def merge(self, other: TokenDictionary) -> np.ndarray:
        """Add ``other``'s tokens and counts; returns each of its ids' id here: (len(other),) int64."""
        n = len(other)
        self.reserve(n, int(other._offsets[n]))
        mapping = _merge(other._offsets, other._arena, n, _IDENTITY, self._slots, self._offsets, self._arena,
                         self._meta)  # fmt: skip
        self._counts[mapping] += other.counts  # distinct ids: a plain scatter is exact
        return mapping

    def count(self, ids: np.ndarray) -> None:
        """Count ``ids`` (int32) as occurrences."""
        _count(ids, self._counts)

    @property
    def counts(self) -> np.ndarray:
        """How often each token was counted: (len,) int64 (a token seen only in a retracted scan counts 0)."""
        return self._counts[: len(self)]

    def token_bytes(self, index: int) -> bytes:
        start, stop = int(self._offsets[index]), int(self._offsets[index + 1])
        return self._arena[start:stop].tobytes()

    def token(self, index: int) -> str:
        return self.token_bytes(index).decode("utf-8")

    def many_token_bytes(self, indices: np.ndarray) -> list[bytes]:
        """The tokens of ``indices`` as bytes: slices of one copy of the arena, not a call per token."""
        arena = self._arena[: int(self._offsets[len(self)])].tobytes()
        indices = np.asarray(indices, dtype=np.int64)
        starts, stops = self._offsets[indices].tolist(), self._offsets[indices + 1].tolist()
        return [arena[a:b] for a, b in zip(starts, stops, strict=True)]

    def tokens(self, indices: np.ndarray) -> list[str]:
        """The tokens of ``indices`` as strings."""
        return [token.decode("utf-8") for token in self.many_token_bytes(indices)]

    def scan(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Compiled pass over ``data`` (uint8): (ids with span markers (int32), spans (k, 2) int64)."""
        # A token is at least one byte, and runs are parted by a space: these bound what the scan writes.
        out = np.empty(data.size, dtype=np.int32)
        spans = np.empty((data.size // 2 + 1, 2), dtype=np.int64)
        state = np.zeros(5, dtype=np.int64)
        while not _scan(data, _CLASSES, _LOWER, self._single, self._slots, self._offsets, self._arena, self._meta,
                        out, spans, state):  # fmt: skip
            # Grow by half what is left to scan, or double: amortized, and never the whole block for a small one.
            left = data.size - int(state[0])
            self.reserve(max(len(self), 1024, left // 8), max(self._arena.size, left))
        # Copied: a view would keep the whole (bytes,) buffer alive while the ids wait to be spilled.
        return out[: state[3]].copy(), spans[: state[4]].copy()


_CLASSES = _byte_classes(r"\w+|[^\w\s]")
_LOWER = _lower_table()
_IDENTITY = np.arange(256, dtype=np.uint8)


def space_positions(data: np.ndarray) -> np.ndarray:
    """The positions of ``data`` (uint8 bytes, (n,)) whose byte the tokenizer reads as a space: (k,) int64."""
    return np.flatnonzero(_CLASSES[data] == _SPACE)


def tokenize_bytes(
    data: bytes | np.ndarray, dictionary: TokenDictionary, tokenize: Callable[[str], list[str]]
) -> np.ndarray:
    """The token ids (int32, into ``dictionary``) of one file's bytes, as ``tokenize`` of its UTF-8 text gives them.

    ``tokenize`` is the Python tokenizer, used on the runs that hold non-ASCII bytes.
    """
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
    ids, spans = dictionary.scan(raw)
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
