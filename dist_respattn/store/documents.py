"""Token streams cut into documents: windows never span two documents.

Documents are given by their starts: an integer array, strictly increasing, ``starts[0] == 0``,
every entry a token index of the stream; document ``k`` is ``tokens[starts[k] : starts[k+1]]``
(the last one runs to the end). A document of fewer than N + 1 tokens gives no rows.

The stream is still read in blocks with the last N tokens carried over; each carried and new
token knows its document, and a window is kept only when its first context token and its target
are of one document. So the rows are those of ``sequence_windows`` applied to each document on its
own, whichever block boundaries fall where, with memory of one block (and one block of starts).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store.npy import load_array, row_blocks
from dist_respattn.text_format import count_text

__all__ = [
    "DocumentRun",
    "DocumentStarts",
    "DocumentWindows",
    "check_document_starts",
    "document_runs",
    "fixed_starts",
    "require_rows",
    "starts_blocks",
]

_STARTS_BLOCK = 1 << 18


def require_rows(rows: int, *, source: str, tokens: int, documents: int, context_length: int) -> None:
    """Refuse a corpus whose windows give no rows (every document shorter than N + 1 tokens): a store of
    0 rows could only fail later, in the fit. Called before a writer closes, so nothing is left behind."""
    if rows > 0:
        return
    raise ValueError(
        f"{source}: {count_text(tokens, 'token')} in {count_text(documents, 'document')} give no rows with a window "
        f"of N = {context_length}: a row needs a document of at least N + 1 = {context_length + 1} tokens; lower "
        "context_length, or give more tokens"
    )


def check_document_starts(documents: Any, num_tokens: int, tokens_name: str) -> tuple[Any, str, int]:
    """Check document starts (an array or ``.npy`` path) against a stream of ``num_tokens`` tokens, in blocks.

    Returns the starts (array, or a reader of the file), the name errors use and the number of
    documents. Raises a ``ValueError`` naming the file and the first bad position.
    """
    starts, name = load_array(documents, "documents")
    if starts.ndim != 1 or starts.dtype.kind not in "iu":
        raise ValueError(
            f"{name}: shape {starts.shape}, dtype {starts.dtype}: expected a 1-d array of integer token indices, "
            f"the first token of each document"
        )
    if starts.shape[0] == 0:
        raise ValueError(f"{name}: empty: expected the first token index of each document, starting with 0")
    previous: int | None = None
    offset = 0
    for block in row_blocks(starts, _STARTS_BLOCK):
        out = (block < 0) | (block >= num_tokens)
        values = np.where(out, 0, block).astype(np.int64)
        before = np.concatenate([[-1 if previous is None else previous], values[:-1]])
        unordered = (values <= before) & ~out
        if offset == 0 and int(block[0]) != 0:
            raise ValueError(
                f"{name}[0] = {int(block[0])}: expected 0: "
                f"the first document starts at the first token of {tokens_name}"
            )
        bad = np.flatnonzero(out | unordered)
        if bad.size:
            i = int(bad[0])
            if out[i]:
                raise ValueError(
                    f"{name}[{offset + i}] = {int(block[i])}: expected a token index in [0, {num_tokens}) "
                    f"({tokens_name} has {num_tokens} tokens)"
                )
            raise ValueError(
                f"{name}[{offset + i}] = {int(block[i])}: expected strictly increasing document starts "
                f"({name}[{offset + i - 1}] = {int(before[i])})"
            )
        previous = int(values[-1])
        offset += block.shape[0]
    return starts, name, int(starts.shape[0])


def starts_blocks(starts: Any) -> Iterator[np.ndarray]:
    """Checked starts (array or file reader) in consecutive int64 blocks."""
    for block in row_blocks(starts, _STARTS_BLOCK):
        yield block.astype(np.int64)


def fixed_starts(num_tokens: int, block_tokens: int) -> Iterator[np.ndarray]:
    """The starts of a stream cut into contiguous documents of ``block_tokens`` tokens (the last may be shorter)."""
    step = _STARTS_BLOCK * block_tokens
    for first in range(0, num_tokens, step):
        yield np.arange(first, min(first + step, num_tokens), block_tokens, dtype=np.int64)


class DocumentRun(NamedTuple):
    """Tokens ``[start, stop)`` of a piece of a stream (offsets into the piece), all of ``document``;
    ``begins``: the run's first token is the document's first one."""

    document: int
    start: int
    stop: int
    begins: bool


def document_runs(starts: np.ndarray, position: int, size: int, document: int) -> list[DocumentRun]:
    """The ``size`` tokens of a stream from ``position`` on, cut where documents start: non-empty runs of one
    document each, in order.

    ``starts`` (n_docs,) every document's first token (strictly increasing); ``document``: the document already
    begun before ``position`` (-1 at the stream's start, so a run begins document 0; 0 when the caller began it).
    The last run's document is the one to pass for the next piece.
    """
    end = position + size
    first = document + 1
    # The documents starting inside the piece: starts[first:last], each < end.
    last = first + int(np.searchsorted(starts[first:], end, side="left"))
    bounds = [position, *(int(s) for s in starts[first:last]), end]
    return [
        DocumentRun(d, a - position, b - position, d != document)
        for d, a, b in zip(range(document, last), bounds[:-1], bounds[1:], strict=True)
        if b > a
    ]


class DocumentStarts:
    """Starts read ahead block by block: :meth:`before` hands out, once, those below a stream position."""

    def __init__(self, blocks: Iterable[np.ndarray]) -> None:
        self._blocks = iter(blocks)
        self._pending = np.zeros(0, dtype=np.int64)
        self._exhausted = False

    def before(self, stop: int) -> np.ndarray:
        """The starts not yet handed out that are < ``stop``, in order."""
        while not self._exhausted and (self._pending.size == 0 or self._pending[-1] < stop):
            block = next(self._blocks, None)
            if block is None:
                self._exhausted = True
            else:
                self._pending = np.concatenate([self._pending, block])
        taken = int(np.searchsorted(self._pending, stop))
        found, self._pending = self._pending[:taken], self._pending[taken:]
        return found


class DocumentWindows:
    """Consecutive pieces of a stream to its rows, no window spanning two documents.

    ``starts``: blocks of checked document starts, or ``None`` for one document. Memory: one piece
    plus N carried tokens. After each :meth:`feed`, :attr:`targets` (m,) int64 holds the stream position of each
    returned row's target (to look up what is kept per token, such as its attribute).
    """

    def __init__(
        self, context_length: int, num_symbols: int, table: np.ndarray, starts: Iterable[np.ndarray] | None = None
    ) -> None:
        self.context_length = context_length
        self.num_symbols = num_symbols
        self.table = table
        self._starts = DocumentStarts(starts if starts is not None else [np.zeros(1, dtype=np.int64)])
        self._offset = 0  # stream position of the next piece's first token
        self._document = -1  # the document of the last token seen
        self._carry = np.zeros(0, dtype=np.int64)
        self._carry_documents = np.zeros(0, dtype=np.int64)
        self.targets = np.zeros(0, dtype=np.int64)

    def feed(self, piece: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows ending in ``piece``: ``context`` (m, N) int64, ``query`` (m, D) float32, ``target`` (m,) int64,
        and ``document`` (m,) int64, the index of each row's document."""
        n = self.context_length
        length = int(piece.shape[0])
        first_target = self._offset - self._carry.size + n  # the stream position of the first window's target
        cuts = self._starts.before(self._offset + length) - self._offset
        # The carry's oldest token is of the current document: then so is everything, and every row is kept.
        one_document = cuts.size == 0 and (
            self._carry_documents.size == 0 or self._carry_documents[0] == self._document
        )
        if cuts.size:
            # Token i of the piece belongs to the document of the last start at or before it.
            documents = self._document + np.searchsorted(cuts, np.arange(length), side="right")
        else:
            documents = np.full(length, self._document, dtype=np.int64)
        self._document += int(cuts.size)
        self._offset += length
        tokens = np.concatenate([self._carry, piece.astype(np.int64, copy=False)])
        owners = np.concatenate([self._carry_documents, documents])
        self._carry, self._carry_documents = tokens[-n:], owners[-n:]
        context, query, target = sequence_windows(
            tokens, n, num_symbols=self.num_symbols, embeddings=self.table, query_dtype=np.float32
        )
        m = target.shape[0]
        document = owners[:m]
        self.targets = first_target + np.arange(m, dtype=np.int64)
        if one_document:
            return context, query, target, document
        keep = document == owners[n : n + m]  # the window's first token and its target share a document
        if not keep.all():
            context, query, target, document = context[keep], query[keep], target[keep], document[keep]
            self.targets = self.targets[keep]
        return context, query, target, document
