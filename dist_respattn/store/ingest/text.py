"""Writing a store from text files: tokenize, keep the K most frequent tokens, window each file.

Tokenizer (``words-and-punctuation``): the text is lowercased and split by the regular expression
``\\w+|[^\\w\\s]`` — runs of letters, digits and underscores, and every other non-space character on
its own. The vocabulary holds the K most frequent tokens (ties broken alphabetically) with ids
0..K-1 by rank, and one out-of-vocabulary id K, so S = T = K + 1. It is saved in the store as JSON:
the attributes of the ``vocabulary`` group, i.e. the file ``vocabulary/zarr.json``.

Two passes over the files: one counts tokens (memory grows with the number of distinct tokens,
not with the corpus), the other writes rows. Each file is its own sequence (a document): no window
spans two files. A document's key is its path relative to the root it was found under (the
directory searched, a named file's own directory, or a glob's fixed leading directories), so it is
the same on every machine; :mod:`~dist_respattn.store.ingest.split` hashes it.

Written ``like`` a text store, the files are encoded with that store's vocabulary (an unknown word
is its out-of-vocabulary id) and embedded with its table, and no counting pass is needed.
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

from dist_respattn.store.attributes import attribute_provenance, text_attribute_ids
from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.documents import require_rows
from dist_respattn.store.identity import identity_provenance
from dist_respattn.store.ingest.like import open_like
from dist_respattn.store.ingest.tokens import WindowStream, embedding_table, store_table_for_append
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.triples.reader import TripleStore
from dist_respattn.store.triples.writer import StoreWriter

__all__ = [
    "DEFAULT_TEXT_SUFFIXES",
    "DEFAULT_VOCAB_SIZE",
    "MAX_LINE_CHARS",
    "TOKEN_PATTERN",
    "TextDocument",
    "Vocabulary",
    "build_vocabulary",
    "count_tokens",
    "default_corpus",
    "describe_vocabulary",
    "iter_text_documents",
    "iter_text_files",
    "tokenize",
    "vocabulary_from_counts",
    "write_text",
    "write_text_document",
]

TOKEN_PATTERN = r"\w+|[^\w\s]"
TOKENIZER_NAME = "words-and-punctuation"
_TOKEN_RE = re.compile(TOKEN_PATTERN)
#: Files a directory contributes; an explicit file or glob is taken whatever its name.
DEFAULT_TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", ".git"}
_LINES_PER_PIECE = 20_000
#: Characters a line may hold before a line-by-line reader refuses the file as not text (16 Mi).
MAX_LINE_CHARS = 1 << 24
VOCABULARY_FORMAT = "dist_respattn.vocabulary"
#: K when none is given: the most frequent tokens kept.
DEFAULT_VOCAB_SIZE = 2000


def tokenize(text: str) -> list[str]:
    """The tokens of ``text``: lowercased words (``\\w+``) and single punctuation characters."""
    return _TOKEN_RE.findall(text.lower())


def default_corpus() -> str:
    """The Python standard library's source directory: real text on every machine with Python."""
    return sysconfig.get_paths()["stdlib"]


@dataclasses.dataclass(frozen=True)
class TextDocument:
    """A text file: its absolute ``path``, and its ``key``, the path relative to the root it was found under."""

    path: str
    key: str


def _glob_root(pattern: str) -> str:
    """The fixed leading directories of a glob pattern (``notes/**/*.md`` -> ``notes``)."""
    parts = pattern.split(os.sep)
    fixed: list[str] = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or (os.sep if pattern.startswith(os.sep) else os.curdir)


def iter_text_documents(paths: Sequence[str | os.PathLike[str]]) -> list[TextDocument]:
    """The files named by ``paths`` (files, glob patterns, directories searched recursively), sorted by path, once each.

    A directory, named or matched by a glob, contributes its files ending in ``DEFAULT_TEXT_SUFFIXES``; a file
    named or matched is taken whatever its name.

    A file found under two roots keeps the key of the first. A path that names nothing raises
    ``FileNotFoundError`` naming it.
    """
    found = _found_files(paths)
    return [TextDocument(path, os.path.relpath(file, root).replace(os.sep, "/")) for path, (file, root) in found]


def iter_text_files(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The absolute paths of :func:`iter_text_documents`: sorted, once each."""
    return [path for path, _ in _found_files(paths)]


def _found_files(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[str, tuple[str, str]]]:
    """``(absolute path, (path as found, its root))`` of each file, sorted by absolute path, once each.

    The key (the path relative to its root) is made only by :func:`iter_text_documents`: ``relpath`` costs
    more than the rest of the search, and a list of 50,000 files given by name would pay it for nothing.
    """
    found: dict[str, tuple[str, str]] = {}

    def add(file: str, root: str) -> None:
        found.setdefault(os.path.abspath(file), (file, root))

    def add_directory(directory: str, root: str) -> None:
        for folder, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
            for name in sorted(files):
                if name.endswith(DEFAULT_TEXT_SUFFIXES):
                    add(os.path.join(folder, name), root)

    for raw in paths:
        path = os.fspath(raw)
        if os.path.isdir(path):
            add_directory(path, path)
        elif os.path.isfile(path):
            add(path, os.path.dirname(path) or os.curdir)
        else:
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise FileNotFoundError(f"{path}: no such file, directory or matching files")
            for match in matches:
                # A matched directory is read as a directory is (its text files, by suffix).
                if os.path.isdir(match):
                    add_directory(match, _glob_root(path))
                elif os.path.isfile(match):
                    add(match, _glob_root(path))
    if not found:
        raise FileNotFoundError(
            f"no text files under {', '.join(os.fspath(p) for p in paths)} "
            f"(looked for {', '.join(DEFAULT_TEXT_SUFFIXES)})" + _other_files_hint(paths)
        )
    return sorted(found.items())


def _other_files_hint(paths: Sequence[str | os.PathLike[str]]) -> str:
    """For directories that hold files of other names (``README``, ``chapter1``): a glob that takes them too.

    A file matched by a glob (or named) is read whatever its name; only a directory's search goes by suffix.
    """
    others: list[str] = []
    globs: list[str] = []
    for raw in paths:
        directory = os.fspath(raw)
        if not os.path.isdir(directory):
            continue
        nested = False
        for folder, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
            names = [n for n in sorted(files) if not n.startswith(".")]
            others.extend(os.path.join(folder, n) for n in names)
            nested = nested or (bool(names) and folder != directory)
        if others:
            globs.append(f"'{os.path.join(directory, '**', '*') if nested else os.path.join(directory, '*')}'")
    if not others:
        return ""
    shown = ", ".join(os.path.relpath(o) for o in others[:3]) + (", ..." if len(others) > 3 else "")
    return (
        f"; {len(others):,} {'file of another name' if len(others) == 1 else 'files of other names'} ({shown}) "
        "are read when a glob names them: "
        f"--text {' '.join(globs)} (quoted, so that the command expands it)"
    )


def line_pieces(path: str, *, max_line: int = MAX_LINE_CHARS) -> Iterator[list[str]]:
    """A file's tokens in pieces of a bounded number of lines (undecodable bytes become U+FFFD).

    ``ValueError`` naming the file and line when a line is longer than ``max_line`` characters: no text has such
    a line, and reading it whole would hold the whole file in memory (as a one-line 100 MB file did)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines: list[str] = []
        for number, line in enumerate(iter(lambda: handle.readline(max_line + 1), ""), start=1):
            if len(line) > max_line:
                raise ValueError(
                    f"{path}: line {number:,} is longer than {max_line:,} characters: expected text (lines of words); "
                    "break the file into lines, or leave it out of --text"
                )
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


def describe_vocabulary(
    record: dict[str, Any] | None, provenance: dict[str, Any], *, top: int = 10
) -> dict[str, Any] | None:
    """What ``info`` shows of a text store's vocabulary (``None`` for a store without one).

    ``record`` is the stored vocabulary (:meth:`Vocabulary.to_json`), ``provenance`` the store's: its
    writers count the store's own tokens and out-of-vocabulary tokens (and each append's), while the
    vocabulary's counts are of the corpus it was counted on (the train store's, for a store written
    ``--like`` another). Returns ``size`` (K, the OOV id), ``tokens``, ``oov_count`` and ``oov_share`` of
    this store (``None`` when its writer did not count them), ``counted_on`` (tokens, documents and OOV
    share of the counting corpus) and ``top_tokens`` (the ``top`` most frequent: token, count, share).
    """
    if not record or record.get("format") != VOCABULARY_FORMAT:
        return None
    vocabulary = Vocabulary.from_json(record)
    # The first write and every append count their own tokens (a stream store's append records them as
    # ``tokens``); a piece without counts leaves the store's share unknown rather than wrong.
    pieces = [provenance, *(provenance.get("appends") or [])]
    token_counts = [p.get("tokens_count", p.get("tokens")) for p in pieces]
    oov_counts = [p.get("oov_count") for p in pieces]
    known = all(t is not None for t in token_counts) and all(o is not None for o in oov_counts)
    tokens = sum(int(t) for t in token_counts) if known else None
    oov = sum(int(o) for o in oov_counts) if known else None
    total = vocabulary.total_tokens
    return {
        "size": len(vocabulary.tokens),
        "oov_id": vocabulary.oov_id,
        "tokens": tokens,
        "oov_count": oov,
        "oov_share": oov / tokens if tokens and oov is not None else None,
        "counted_on": {
            "tokens": total,
            "documents": vocabulary.documents,
            "oov_share": vocabulary.oov_count / total if total else None,
        },
        "top_tokens": [
            {"token": token, "count": int(count), "share": count / total if total else None}
            for token, count in zip(vocabulary.tokens[:top], vocabulary.counts[:top], strict=True)
        ],
    }


def count_tokens(path: str) -> Counter[str]:
    """How often each token occurs in one file."""
    counts: Counter[str] = Counter()
    for piece in line_pieces(path):
        counts.update(piece)
    return counts


def vocabulary_from_counts(counts: Counter[str], size: int, documents: int) -> Vocabulary:
    """The ``size`` most frequent tokens of ``counts`` (ties alphabetical), ids by rank."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"vocabulary size = {size!r}: expected a positive integer")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept = ranked[:size]
    total = sum(counts.values())
    kept_total = sum(c for _, c in kept)
    return Vocabulary(tuple(t for t, _ in kept), tuple(c for _, c in kept), total - kept_total, total, documents)


def build_vocabulary(files: Sequence[str], size: int, progress: Callable[[int], None] | None = None) -> Vocabulary:
    """Pass one: count every token of ``files`` and keep the ``size`` most frequent."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"vocabulary size = {size!r}: expected a positive integer")
    counts: Counter[str] = Counter()
    for path in files:
        counts.update(count_tokens(path))
        if progress is not None:
            progress(1)
    return vocabulary_from_counts(counts, size, len(files))


def write_text_document(
    writer: StoreWriter,
    path: str,
    vocabulary: Vocabulary,
    lookup: dict[str, int],
    table: np.ndarray,
    attribute: int | None = None,
) -> tuple[int, int]:
    """Write the windows of one file (its own sequence), each with the file's ``attribute`` id when the store has
    attributes, and return its (tokens, out-of-vocabulary tokens)."""
    windows = WindowStream(writer.schema.context_length, vocabulary.num_symbols, table)
    tokens = oov = 0
    for piece in line_pieces(path):
        ids = vocabulary.encode(piece, lookup)
        tokens += int(ids.size)
        oov += int(np.count_nonzero(ids == vocabulary.oov_id))
        context, query, target = windows.feed(ids)
        if target.size:
            ids_of_rows = None if attribute is None else np.full(target.shape[0], attribute, dtype=np.int32)
            writer.write(context, query, target, attribute=ids_of_rows, source=path)
    return tokens, oov


def write_text(
    out: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    context_length: int | None,
    *,
    vocab_size: int | None = None,
    dim: int | None = None,
    seed: int | None = None,
    like: TripleStore | str | os.PathLike[str] | None = None,
    file_progress: Callable[[int], None] | None = None,
    options: WriteOptions | None = None,
    attribute_by: str | None = None,
) -> TripleStore:
    """Tokenize the files under ``paths`` and write the windows of each file (see the module docstring).

    Queries are the :func:`~dist_respattn.store.ingest.tokens.embedding_table` of the vocabulary
    (``vocab_size`` defaults to :data:`DEFAULT_VOCAB_SIZE`, ``seed`` to 0). Appending reuses the
    store's vocabulary and embeddings, so ids keep their meaning (``vocab_size`` is then unused, and
    a ``dim`` that would give another table is refused). ``like``: a text store (or its URL) whose
    vocabulary, N and table the new store takes; ``context_length`` may then be ``None``, and an
    option that conflicts with that store is refused. ``file_progress`` is called once per file in
    each pass (once in all with ``like``). Files that give no rows at all (each shorter than N + 1 tokens) are
    refused, and nothing is written.

    ``attribute_by`` (``"file"`` or ``"directory"``): every row carries its file's attribute, named by the file's
    key or the key's directory (:mod:`~dist_respattn.store.attributes`; merged with ``like``'s or the appended
    store's names).
    """
    options = options or WriteOptions()
    reference = open_like(like, options)
    found = iter_text_documents(paths) if attribute_by is not None else None
    files = [d.path for d in found] if found is not None else iter_text_files(paths)
    existing = TripleStore.open(out, storage_options=options.storage_options) if options.append else None
    attributes = text_attribute_ids(
        [d.key for d in found or ()], attribute_by, appending=options.append,
        reference=existing if existing is not None else None if reference is None else reference.store,
    )  # fmt: skip
    identity: dict[str, Any] = {}
    if reference is not None:
        context_length = reference.context_length(context_length)
        vocabulary = Vocabulary.from_json(reference.vocabulary(vocab_size))
        table, table_info = reference.table(dim=dim, seed=seed), reference.table_info()
        identity = reference.provenance()
    elif existing is not None:
        saved = existing.vocabulary()
        if saved is None:
            raise ValueError(
                f"{existing.location}: has no vocabulary: text can only be appended to a store made from text"
            )
        vocabulary = Vocabulary.from_json(saved)
        stored = existing.embeddings()
        assert stored is not None
        table, table_info = store_table_for_append(existing, stored, embeddings=None, dim=dim, seed=seed or 0)
    else:
        vocabulary = build_vocabulary(files, DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size, file_progress)
        table, table_info = embedding_table(vocabulary.num_symbols, dim=dim, seed=seed or 0)
        identity = identity_provenance(vocabulary.tokens, table)
    if isinstance(context_length, bool) or not isinstance(context_length, (int, np.integer)) or context_length < 1:
        raise ValueError(f"context_length = {context_length!r}: expected a positive integer")
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
        **identity,
    }
    if attributes is not None:
        provenance.update(attribute_provenance(attributes.by, attributes.merged))
    lookup = vocabulary.lookup()
    names = None if attributes is None else attributes.merged.names
    with open_writer(out, schema, options, provenance, names) as writer:
        if reference is not None:
            reference.copy_into(writer)
        elif existing is None:
            writer.write_embeddings(table)
            writer.write_vocabulary(vocabulary.to_json())
        tokens = oov = documents = 0
        for k, path in enumerate(files):
            attribute = None if attributes is None else int(attributes.file_ids[k])
            counted, unknown = write_text_document(writer, path, vocabulary, lookup, table, attribute)
            tokens, oov = tokens + counted, oov + unknown
            documents += counted > 0  # a file without tokens is no document, as in a stream store
            if file_progress is not None:
                file_progress(1)
        source = ", ".join(os.fspath(p) for p in paths)
        require_rows(
            writer.rows_written, source=source, tokens=tokens, documents=documents, context_length=int(context_length)
        )
        writer.add_provenance({"documents": documents, "tokens_count": tokens, "oov_count": oov})
        return writer.close()
