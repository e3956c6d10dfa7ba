"""Writing a store from text files: tokenize, keep the K most frequent tokens, window each file.

Tokenizer (``words-and-punctuation``): the text is lowercased and split by the regular expression
``\\w+|[^\\w\\s]`` — runs of letters, digits and underscores, and every other non-space character on
its own. The vocabulary holds the K most frequent tokens (ties broken alphabetically) with ids
0..K-1 by rank, and one out-of-vocabulary id K, so S = T = K + 1. It is saved in the store as JSON:
the attributes of the ``vocabulary`` group, i.e. the file ``vocabulary/zarr.json``.

Two passes over the files: one counts tokens (memory grows with the number of distinct tokens,
not with the corpus), the other writes rows. Each file is its own sequence: no window spans two
files.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.tokens import WindowStream, embedding_table, store_table_for_append
from dist_respattn.store.triple_store import TripleStore

__all__ = [
    "DEFAULT_TEXT_SUFFIXES",
    "TOKEN_PATTERN",
    "Vocabulary",
    "build_vocabulary",
    "default_corpus",
    "iter_text_files",
    "tokenize",
    "write_text",
]

TOKEN_PATTERN = r"\w+|[^\w\s]"
TOKENIZER_NAME = "words-and-punctuation"
_TOKEN_RE = re.compile(TOKEN_PATTERN)
#: Files a directory contributes; an explicit file or glob is taken whatever its name.
DEFAULT_TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", ".git"}
_LINES_PER_PIECE = 20_000
VOCABULARY_FORMAT = "dist_respattn.vocabulary"


def tokenize(text: str) -> list[str]:
    """The tokens of ``text``: lowercased words (``\\w+``) and single punctuation characters."""
    return _TOKEN_RE.findall(text.lower())


def default_corpus() -> str:
    """The Python standard library's source directory: real text on every machine with Python."""
    return sysconfig.get_paths()["stdlib"]


def iter_text_files(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The files named by ``paths`` (files, glob patterns, directories searched recursively), sorted, once each.

    A path that names nothing raises ``FileNotFoundError`` naming it.
    """
    found: list[str] = []
    for raw in paths:
        path = os.fspath(raw)
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
                found.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(DEFAULT_TEXT_SUFFIXES))
        elif os.path.isfile(path):
            found.append(path)
        else:
            matches = sorted(m for m in glob.glob(path, recursive=True) if os.path.isfile(m))
            if not matches:
                raise FileNotFoundError(f"{path}: no such file, directory or matching files")
            found.extend(matches)
    unique = sorted({os.path.abspath(f) for f in found})
    if not unique:
        raise FileNotFoundError(
            f"no text files under {', '.join(os.fspath(p) for p in paths)} "
            f"(looked for {', '.join(DEFAULT_TEXT_SUFFIXES)})"
        )
    return unique


def _line_pieces(path: str) -> Iterator[list[str]]:
    """A file's tokens in pieces of a bounded number of lines (undecodable bytes become U+FFFD)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines: list[str] = []
        for line in handle:
            lines.append(line)
            if len(lines) == _LINES_PER_PIECE:
                yield tokenize("".join(lines))
                lines = []
        if lines:
            yield tokenize("".join(lines))


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The K most frequent tokens (id = rank) and one out-of-vocabulary id K."""

    tokens: tuple[str, ...]
    counts: tuple[int, ...]
    oov_count: int
    total_tokens: int
    documents: int

    @property
    def oov_id(self) -> int:
        return len(self.tokens)

    @property
    def num_symbols(self) -> int:
        return len(self.tokens) + 1

    def lookup(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}

    def encode(self, tokens: Iterable[str], lookup: dict[str, int] | None = None) -> np.ndarray:
        """Token strings to ids (int32), unknown ones to :attr:`oov_id`."""
        table = self.lookup() if lookup is None else lookup
        oov = self.oov_id
        return np.fromiter((table.get(t, oov) for t in tokens), dtype=np.int32)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": VOCABULARY_FORMAT,
            "version": 1,
            "tokenizer": {"name": TOKENIZER_NAME, "pattern": TOKEN_PATTERN, "lowercase": True},
            "size": len(self.tokens),
            "oov_id": self.oov_id,
            "tokens": list(self.tokens),
            "counts": list(self.counts),
            "oov_count": self.oov_count,
            "total_tokens": self.total_tokens,
            "documents": self.documents,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Vocabulary:
        if value.get("format") != VOCABULARY_FORMAT:
            raise ValueError(f"format {value.get('format')!r}: expected {VOCABULARY_FORMAT!r}")
        return cls(
            tuple(value["tokens"]),
            tuple(value["counts"]),
            value["oov_count"],
            value["total_tokens"],
            value["documents"],
        )


def build_vocabulary(files: Sequence[str], size: int, progress: Callable[[int], None] | None = None) -> Vocabulary:
    """Pass one: count every token of ``files`` and keep the ``size`` most frequent."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"vocabulary size = {size!r}: expected a positive integer")
    counts: Counter[str] = Counter()
    for path in files:
        for piece in _line_pieces(path):
            counts.update(piece)
        if progress is not None:
            progress(1)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept = ranked[:size]
    total = sum(counts.values())
    kept_total = sum(c for _, c in kept)
    return Vocabulary(tuple(t for t, _ in kept), tuple(c for _, c in kept), total - kept_total, total, len(files))


def write_text(
    out: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    context_length: int,
    *,
    vocab_size: int,
    dim: int | None = None,
    seed: int = 0,
    file_progress: Callable[[int], None] | None = None,
    options: WriteOptions | None = None,
) -> TripleStore:
    """Tokenize the files under ``paths`` and write the windows of each file (see the module docstring).

    Queries are the :func:`~dist_respattn.store.tokens.embedding_table` of the vocabulary. Appending
    reuses the store's vocabulary and embeddings, so ids keep their meaning (``vocab_size`` is then
    unused, and a ``dim`` that would give another table is refused).
    ``file_progress`` is called once per file in each pass.
    """
    options = options or WriteOptions()
    files = iter_text_files(paths)
    existing = TripleStore.open(out, storage_options=options.storage_options) if options.append else None
    if existing is not None:
        saved = existing.vocabulary()
        if saved is None:
            raise ValueError(
                f"{existing.location}: has no vocabulary: text can only be appended to a store made from text"
            )
        vocabulary = Vocabulary.from_json(saved)
        stored = existing.embeddings()
        assert stored is not None
        table, table_info = store_table_for_append(existing, stored, embeddings=None, dim=dim, seed=seed)
    else:
        vocabulary = build_vocabulary(files, vocab_size, file_progress)
        table, table_info = embedding_table(vocabulary.num_symbols, dim=dim, seed=seed)
    s = vocabulary.num_symbols
    schema = StoreSchema(s, int(context_length), table.shape[1], s, options.query_dtype)
    provenance = {
        "source": "text",
        "paths": [os.path.abspath(os.fspath(p)) for p in paths],
        "files": len(files),
        "tokenizer": TOKENIZER_NAME,
        "vocabulary": "vocabulary/zarr.json",
        "vocab_size": len(vocabulary.tokens),
        "embedding": table_info,
    }
    lookup = vocabulary.lookup()
    with open_writer(out, schema, options, provenance) as writer:
        if existing is None:
            writer.write_embeddings(table)
            writer.write_vocabulary(vocabulary.to_json())
        for path in files:
            windows = WindowStream(int(context_length), s, table)
            for piece in _line_pieces(path):
                context, query, target = windows.feed(vocabulary.encode(piece, lookup))
                if target.size:
                    writer.write(context, query, target, source=path)
            if file_progress is not None:
                file_progress(1)
        return writer.close()
