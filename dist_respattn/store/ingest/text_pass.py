"""One tokenizing pass over text files: provisional ids on local disk, then one remap to the final vocabulary.

Files are read in bulk (blocks cut at an ASCII space, so memory is bounded however large a file is) and
tokenized by :mod:`~dist_respattn.store.ingest.byte_tokenizer` into ids of a provisional dictionary, in the
order of the files; the ids go to a scratch file of int32, so the corpus is never held in memory. The
vocabulary is then ranked from the dictionary's counts, and :meth:`TokenizedCorpus.blocks` reads the
scratch file back through one vectorized ``take`` to the final ids.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dist_respattn.store.ingest.byte_tokenizer import TokenDictionary, space_positions, tokenize_bytes
from dist_respattn.store.ingest.text import Vocabulary, tokenize

__all__ = ["TokenizedCorpus", "tokenize_files"]

#: Bytes of a file read at once (a larger file is read in blocks cut at an ASCII space).
_READ_BYTES = 1 << 24
#: Provisional ids gathered before they are written to the scratch file.
_SPILL_TOKENS = 1 << 22
#: Bytes without a space past which a file is refused as not text (a word is never near this long).
_MAX_WORD_BYTES = _READ_BYTES
#: Bytes of consecutive files tokenized as one unit of work, with a dictionary of their own.
_BATCH_BYTES = 1 << 25


def file_blocks(path: str, block: int = _READ_BYTES, *, max_word: int = _MAX_WORD_BYTES) -> Iterator[np.ndarray]:
    """A file's bytes (uint8) in blocks that end at an ASCII space (or the end), so no token is cut.

    ``ValueError`` naming the file when more than ``max_word`` bytes hold no space: no text has such a word, and
    carrying it whole (a 100 MB one-word file peaked at 1.2 GB before it was refused for giving no rows) is refused
    once it passes ``max_word`` instead.
    """
    carry = np.zeros(0, dtype=np.uint8)
    consumed = 0  # bytes of the file before ``carry``
    with open(path, "rb") as handle:
        while True:
            raw = handle.read(block)
            data = np.frombuffer(raw, dtype=np.uint8)
            if carry.size:
                data = np.concatenate([carry, data])
            if len(raw) < block:  # the end: most files are read whole in one go
                if data.size:
                    yield data
                return
            cut = _after_last_space(data)
            if cut:
                yield data[:cut]
            carry = data[cut:]
            consumed += cut
            if carry.size > max_word:
                raise ValueError(
                    f"{path}: more than {carry.size:,} bytes without a space from byte {consumed:,}: not text (give "
                    "--text files of words)"
                )


def _after_last_space(data: np.ndarray, step: int = 1 << 12) -> int:
    """The position after the last ASCII space in ``data`` (0: none), looking back from the end."""
    stop = data.size
    while stop > 0:
        start = max(stop - step, 0)
        spaces = space_positions(data[start:stop])
        if spaces.size:
            return start + int(spaces[-1]) + 1
        stop = start
    return 0


@dataclasses.dataclass(frozen=True)
class _Batch:
    """Consecutive files tokenized together: ids into a dictionary of their own, spilled to ``scratch``.

    ``mapping`` (n_distinct,) int64 takes those ids to the corpus dictionary's.
    """

    scratch: str
    num_tokens: int
    mapping: np.ndarray


@dataclasses.dataclass
class TokenizedCorpus:
    """The provisional ids of a list of files, in file order, batch by batch.

    ``lengths`` (n_files,) tokens per file; ``dictionary`` every distinct token, with its count.
    """

    batches: list[_Batch]
    lengths: np.ndarray
    dictionary: TokenDictionary

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def document_starts(self) -> np.ndarray:
        """The first token of each file that has tokens: (n_docs,) int64 (``[0]`` for an empty corpus)."""
        starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        starts = starts[self.lengths > 0]
        return starts if starts.size else np.zeros(1, dtype=np.int64)

    def vocabulary(self, size: int) -> tuple[Vocabulary, np.ndarray]:
        """The ``size`` most frequent tokens (ties alphabetical), and each provisional id's final id: (len,) int64.

        The same ranking as :func:`~dist_respattn.store.ingest.text.vocabulary_from_counts` of the token counts.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"vocabulary size = {size!r}: expected a positive integer")
        counts = self.dictionary.counts
        seen = np.flatnonzero(counts > 0)
        if seen.size > size:
            # Every token more frequent than the size-th count is kept; rank only those and the ties at it.
            threshold = np.partition(counts[seen], seen.size - size)[seen.size - size]
            candidates = seen[counts[seen] >= threshold]
        else:
            candidates = seen
        # Ties go by the token: UTF-8 bytes sort as code points do, so a bytes sort is the string sort.
        # (Fixed-width bytes drop trailing NULs; only the token "\x00" holds one, and it sorts first either way.)
        names = np.array(self.dictionary.many_token_bytes(candidates), dtype=bytes)
        order = np.lexsort((names, -counts[candidates]))[:size]
        kept = candidates[order]
        total = int(counts.sum())
        kept_counts = tuple(int(c) for c in counts[kept])
        vocabulary = Vocabulary(
            tuple(self.dictionary.tokens(kept)), kept_counts, total - sum(kept_counts), total, int(self.lengths.size)
        )
        remap = np.full(len(self.dictionary), vocabulary.oov_id, dtype=np.int64)
        remap[kept] = np.arange(kept.size)
        return vocabulary, remap

    def remap_to(self, vocabulary: Vocabulary) -> np.ndarray:
        """Each provisional id's id in a given ``vocabulary`` (unknown tokens: its out-of-vocabulary id)."""
        lookup = vocabulary.lookup()
        oov = vocabulary.oov_id
        names = self.dictionary.tokens(np.arange(len(self.dictionary)))
        return np.fromiter((lookup.get(name, oov) for name in names), dtype=np.int64, count=len(names))

    def blocks(self, remap: np.ndarray, dtype: np.dtype, block: int) -> Iterator[np.ndarray]:
        """The final ids (``dtype``) in blocks of at most ``block`` tokens, read from the scratch files."""
        for batch in self.batches:
            if not batch.num_tokens:
                continue
            # One take from the batch's ids to the final ones: its mapping composed with the remap.
            table = remap[batch.mapping].astype(dtype)
            # Read, not mapped: a mapping's pages would stay resident and grow with the corpus.
            with open(batch.scratch, "rb") as handle:
                for start in range(0, batch.num_tokens, block):
                    ids = np.fromfile(handle, dtype=np.int32, count=min(block, batch.num_tokens - start))
                    yield np.take(table, ids)


def _batches(files: Sequence[str], batch_bytes: int) -> list[range]:
    """Consecutive runs of files of about ``batch_bytes`` bytes each (by size on disk): the units of work."""
    runs: list[range] = []
    first, size = 0, 0
    for index, path in enumerate(files):
        size += os.path.getsize(path)
        if size >= batch_bytes:
            runs.append(range(first, index + 1))
            first, size = index + 1, 0
    if first < len(files) or not runs:
        runs.append(range(first, len(files)))
    return runs


def _tokenize_batch(files: Sequence[str], scratch: str, lengths: np.ndarray) -> TokenDictionary:
    """Tokenize ``files`` into ids of a dictionary of their own, written to ``scratch``; fills ``lengths``."""
    dictionary = TokenDictionary()
    pending: list[np.ndarray] = []
    buffered = 0
    with open(scratch, "wb") as out:
        for index, path in enumerate(files):
            for data in file_blocks(path):
                ids = tokenize_bytes(data, dictionary, tokenize)
                dictionary.count(ids)
                lengths[index] += ids.size
                pending.append(ids)
                buffered += ids.size
                if buffered >= _SPILL_TOKENS:
                    np.concatenate(pending).tofile(out)
                    pending, buffered = [], 0
        if pending:
            np.concatenate(pending).tofile(out)
    return dictionary


def tokenize_files(
    files: Sequence[str],
    scratch: str,
    progress: Callable[[int], None] | None = None,
    *,
    workers: int | None = None,
) -> TokenizedCorpus:
    """Tokenize ``files`` into provisional ids spilled under the directory ``scratch`` (``progress(k)`` per k files).

    Batches of consecutive files are tokenized by ``workers`` threads (default: one per core; the compiled
    scan and file reads release the GIL) and merged in file order, so the result does not depend on
    ``workers``.
    """
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers = {workers}: expected at least 1")
    lengths = np.zeros(len(files), dtype=np.int64)
    runs = _batches(files, _BATCH_BYTES)
    paths = [os.path.join(scratch, f"batch-{k:06d}.int32") for k in range(len(runs))]

    def work(k: int) -> TokenDictionary:
        run = runs[k]
        return _tokenize_batch(files[run.start : run.stop], paths[k], lengths[run.start : run.stop])

    corpus = TokenDictionary()
    batches: list[_Batch] = []
    with ThreadPoolExecutor(min(workers, len(runs))) as pool:
        # map yields in batch order: the merge, hence the corpus dictionary, is the same for any workers.
        for k, local in enumerate(pool.map(work, range(len(runs)))):
            run = runs[k]
            batches.append(_Batch(paths[k], int(lengths[run.start : run.stop].sum()), corpus.merge(local)))
            if progress is not None:
                progress(len(run))
    return TokenizedCorpus(batches, lengths, corpus)
