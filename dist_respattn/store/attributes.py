"""Row attributes: an id in [0, A) per row saying who wrote it (the book, package, site), and the A names.

A store either carries them or not (a store written before them has none, and reads as it always did):

- a triple store: the array ``attribute`` int32 (n_rows,), chunked and sharded like ``target``;
- a token-stream store: ``document_attribute`` int32 (n_docs,) beside ``document_starts`` (every row whose
  target lies in document ``d`` has attribute ``document_attribute[d]``), or ``token_attribute`` int32 (L,)
  chunked and sharded like ``tokens`` (the attribute of the row whose target is that token); the group
  attribute ``dist_respattn`` records which as ``attribute_level`` (``"document"`` or ``"token"``);

and, in both, ``attribute_names`` in the group attribute ``dist_respattn``: a JSON list of A distinct strings,
id ``k`` named ``attribute_names[k]``. Ids are checked when they are read (and by ``validate``).

Names of a new store. Text (``--attribute-by``): each file's attribute is its key (its path relative to the
root it was found under) for ``file``, or the key's directory for ``directory`` (``"."`` for a file at the
root); the names of every file found are sorted and numbered 0..A-1. Ids from a file (``--attributes
A.npy``): ``--attribute-names NAMES.txt`` names them (line ``k`` names id ``k``), else they are named
``"0"``..``"A-1"`` with A the largest id + 1.

Written ``--like`` a store with attribute names, or ``--append``-ed to one, the names merge: a name the
store has keeps the store's id, and the names it lacks are appended after its own (in the order of the new
names: sorted, for text), so an id means the same author in both stores. A store without attributes can
be given none by an append (and an append to a store with attributes must give them).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Sequence
from typing import Any

import numpy as np

from dist_respattn.store.errors import SchemaMismatchError
from dist_respattn.store.npy import load_array, row_blocks

__all__ = [
    "ATTRIBUTE_BY",
    "ATTRIBUTE_LEVELS",
    "MAX_UNNAMED_ATTRIBUTES",
    "AttributeIds",
    "MergedNames",
    "TextAttributes",
    "appended_names",
    "attribute_ids",
    "attribute_of_key",
    "attribute_provenance",
    "checked_attribute_ids",
    "checked_writer_names",
    "describe_attributes",
    "given_names",
    "merge_names",
    "names_for_write",
    "names_problem",
    "read_names_file",
    "text_attribute_ids",
    "text_attributes",
]

#: How ``--attribute-by`` names a text file's attribute.
ATTRIBUTE_BY = ("file", "directory")
#: What one attribute id of a stream store belongs to.
ATTRIBUTE_LEVELS = ("document", "token")
_SCAN = 1 << 20
#: The most attributes ids without ``--attribute-names`` may imply (ids 0..A-1, each named by itself): every id
#: below the largest gets a name in the store's metadata and a row in a gated head's tables, so one stray id of
#: 10^7 would write 10^7 names. More need their names given (which states how many there are).
MAX_UNNAMED_ATTRIBUTES = 100_000
#: Attribute names ``describe`` lists (A is given in full).
NAMES_SHOWN = 50
_FLAGS = "--attribute-by (text) or --attributes A.npy (ids)"


def attribute_of_key(key: str, by: str) -> str:
    """The attribute name of a text file with ``key`` (its path relative to its root, ``/``-separated)."""
    if by == "file":
        return key
    if by == "directory":
        return posixpath.dirname(key) or "."
    raise ValueError(f"attribute_by = {by!r} (--attribute-by): expected one of {', '.join(ATTRIBUTE_BY)}")


def text_attributes(keys: Sequence[str], by: str) -> tuple[tuple[str, ...], np.ndarray]:
    """The sorted names of files with ``keys`` and each file's id among them: ((A,) names, (n_files,) int32)."""
    per_file = [attribute_of_key(key, by) for key in keys]
    names = tuple(sorted(set(per_file)))
    lookup = {name: i for i, name in enumerate(names)}
    return names, np.fromiter((lookup[n] for n in per_file), dtype=np.int32, count=len(per_file))


def names_problem(value: Any) -> str | None:
    """What is wrong with a stored ``attribute_names`` value (``None``: nothing): a non-empty list of distinct
    strings is expected."""
    if not isinstance(value, list) or not value or not all(isinstance(n, str) for n in value):
        shown = repr(value)[:80]
        return f"attribute attribute_names = {shown}: expected a non-empty JSON list of strings, one per attribute id"
    seen: set[str] = set()
    for name in value:
        if name in seen:
            return f"attribute attribute_names names {name!r} twice: expected distinct names, one per attribute id"
        seen.add(name)
    return None


def read_names_file(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The names of ``--attribute-names NAMES.txt``: one a line, line ``k`` (from 0) naming id ``k``."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"--attribute-names {name}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"--attribute-names {name}: not UTF-8 text ({exc}): expected one name a line") from None
    if not lines:
        raise ValueError(f"--attribute-names {name}: empty: expected one name a line, line k naming attribute id k")
    seen: dict[str, int] = {}
    for k, line in enumerate(lines):
        if not line.strip():
            raise ValueError(f"--attribute-names {name}: line {k + 1} (id {k}) is blank: expected a name on every line")
        if line in seen:
            raise ValueError(
                f"--attribute-names {name}: line {k + 1} (id {k}) repeats {line!r} of line {seen[line] + 1}: "
                "expected distinct names"
            )
        seen[line] = k
    return tuple(lines)


def checked_attribute_ids(
    values: Any, count: int, *, per: str, names: Sequence[str] | None = None, names_file: str | None = None
) -> tuple[Any, str, tuple[str, ...]]:
    """Check ``--attributes`` ids (an array or ``.npy`` path) in blocks: (``count``,) integers in [0, A).

    ``per`` says what one id is of (``"token of TOKENS.npy"``, ``"row"``), for messages. A is ``len(names)``
    when names are given (``names_file``: where they came from), else the largest id + 1 and the names are
    ``"0"``..``"A-1"``. Returns the ids (array, or a reader of the file), the name errors use, and the names.
    Raises a ``ValueError`` naming the file, the position and the flag.
    """
    ids, source = load_array(values, "attributes")
    flag = f"--attributes {source}"
    if ids.ndim != 1 or ids.shape[0] != count or ids.dtype.kind not in "iu":
        raise ValueError(
            f"{flag}: shape {ids.shape}, dtype {ids.dtype}: expected ({count},) integer attribute ids, one per {per}"
        )
    # Checked against A before anything is sized by it: the given names' count, else the most unnamed ids.
    limit = len(names) if names is not None else MAX_UNNAMED_ATTRIBUTES
    largest, offset = -1, 0
    for block in row_blocks(ids, _SCAN):
        bad = np.flatnonzero((block < 0) | (block >= limit))
        if bad.size:
            i = int(bad[0])
            where = (
                f" (the {limit} names of --attribute-names {names_file or '...'})"
                if names is not None
                else f" (ids without --attribute-names go up to {limit - 1:,}; for more, name them all with "
                "--attribute-names NAMES.txt, one line an id)"
            )
            raise ValueError(
                f"{flag}[{offset + i}] = {int(block[i])}: expected an attribute id in "
                f"[0, {limit}){where} ({bad.size} bad ids in this block)"
            )
        if block.size:
            largest = max(largest, int(block.max()))
        offset += block.shape[0]
    if names is None:
        if largest < 0:
            raise ValueError(f"{flag}: no ids: expected one attribute id per {per}")
        names = tuple(str(k) for k in range(largest + 1))
    return ids, source, tuple(names)


@dataclasses.dataclass(frozen=True)
class MergedNames:
    """The names a store is written with, and how the writer's own ids map to them.

    ``names`` (A,) the store's names; ``remap`` (A_own,) int32 each own id's id in ``names``; ``added`` how
    many of the own names the reference lacked (all of them without a reference).
    """

    names: tuple[str, ...]
    remap: np.ndarray
    added: int


def merge_names(reference: Sequence[str] | None, own: Sequence[str]) -> MergedNames:
    """``own`` names merged into ``reference``'s: the reference's ids are kept, new names appended in order."""
    names = list(reference or ())
    lookup = {name: i for i, name in enumerate(names)}
    remap = np.empty(len(own), dtype=np.int32)
    for k, name in enumerate(own):
        if name not in lookup:
            lookup[name] = len(names)
            names.append(name)
        remap[k] = lookup[name]
    return MergedNames(tuple(names), remap, len(names) - len(reference or ()))


def names_for_write(own: Sequence[str] | None, reference: Any, *, appending: bool) -> MergedNames | None:
    """The names of a store written with attributes named ``own`` (``None``: without attributes).

    ``reference``: the store appended to (``appending``) or written ``--like`` (or ``None``). An append to a
    store with attributes must give its rows theirs, and an append to one without may not; ``--like`` a store
    merges with its names when it has them (and a store written like one with attributes may have none).
    """
    theirs = None if reference is None else reference.attribute_names
    if appending and reference is not None:
        if theirs is not None and own is None:
            raise ValueError(
                f"{reference.location}: its rows carry an attribute ({len(theirs)} names): the appended rows must "
                f"carry theirs: pass {_FLAGS}"
            )
        if theirs is None and own is not None:
            raise ValueError(
                f"{reference.location}: its rows carry no attributes: an append cannot add them to some rows only; "
                "drop --attribute-by/--attributes, or write a new store with them"
            )
    if own is None:
        return None
    return merge_names(theirs, own)


def describe_attributes(names: Sequence[str] | None, level: str | None = None) -> dict[str, Any]:
    """What a store's ``describe`` adds when it has attributes: ``attributes`` (A), the first :data:`NAMES_SHOWN`
    ``attribute_names`` and, for a stream store, ``attribute_level``. Nothing for a store without."""
    if names is None:
        return {}
    described: dict[str, Any] = {"attributes": len(names), "attribute_names": list(names[:NAMES_SHOWN])}
    if level is not None:
        described["attribute_level"] = level
    return described


def checked_writer_names(location: Any, names: Sequence[str] | None) -> tuple[str, ...] | None:
    """A writer's ``attribute_names``: ``None``, or a non-empty sequence of distinct strings (``location`` names
    the store in the error)."""
    if names is None:
        return None
    problem = "a string, not a list of names" if isinstance(names, str) else names_problem(list(names))
    if problem is not None:
        raise ValueError(f"{location}: attribute_names: {problem}")
    return tuple(names)


def appended_names(
    location: Any, theirs: tuple[str, ...] | None, given: Sequence[str] | None, *, per: str
) -> tuple[str, ...] | None:
    """The names an append to a store with names ``theirs`` (an attribute per ``per``) commits: ``given``, which
    must begin with the store's own (see :func:`merge_names`). An append to a store with attributes must give
    names, and one to a store without may not (:class:`SchemaMismatchError` naming the flags)."""
    if theirs is None and given is not None:
        raise SchemaMismatchError(
            f"{location}: cannot append: the store has no attributes, so appended rows cannot carry them; drop "
            "--attribute-by/--attributes"
        )
    if theirs is not None and given is None:
        raise SchemaMismatchError(
            f"{location}: cannot append: the store has an attribute per {per} ({len(theirs)} names), so the "
            f"appended rows must carry theirs: pass {_FLAGS}"
        )
    names = checked_writer_names(location, given)
    if theirs is not None and (names is None or names[: len(theirs)] != theirs):
        raise ValueError(
            f"{location}: cannot append: attribute_names must begin with the store's {len(theirs)} names, in order "
            "(its ids are kept; merge_names appends new names after them)"
        )
    return names


def given_names(value: Any) -> tuple[tuple[str, ...] | None, str | None]:
    """``attribute_names`` as a writer takes it: a path of ``NAMES.txt`` (read), a sequence of names, or ``None``;
    and the file they came from (``None`` for a sequence)."""
    if value is None:
        return None, None
    if isinstance(value, (str, os.PathLike)):
        return read_names_file(value), os.fspath(value)
    return checked_writer_names("attribute_names", value), None


@dataclasses.dataclass(frozen=True)
class AttributeIds:
    """Attribute ids given with the rows or tokens (``--attributes``): ``ids`` an array or a reader of the
    ``.npy`` file, ``source`` its name, ``merged`` the store's names and the map of the given ids to them."""

    ids: Any
    source: str
    merged: MergedNames

    def block(self, start: int, stop: int) -> np.ndarray:
        """The store's ids of entries ``[start, stop)``: (stop - start,) int32."""
        return self.merged.remap[np.asarray(self.ids[start:stop])]


def attribute_ids(
    values: Any, count: int, *, per: str, names: Any = None, reference: Any = None, appending: bool = False
) -> AttributeIds | None:
    """Check ``--attributes`` ids (``count`` of them, one per ``per``) and name them: ``names`` (a ``NAMES.txt``
    path or a sequence; default ``"0"``..``"A-1"``), merged with those of ``reference`` (the store appended to or
    written like; see :func:`names_for_write`). ``None`` without ids (refused for an append to a store with
    attributes)."""
    if values is None:
        if names is not None:
            raise ValueError("attribute_names (--attribute-names) names the ids of --attributes A.npy: give those too")
        names_for_write(None, reference, appending=appending)
        return None
    own, names_file = given_names(names)
    ids, source, own = checked_attribute_ids(values, count, per=per, names=own, names_file=names_file)
    merged = names_for_write(own, reference, appending=appending)
    assert merged is not None
    return AttributeIds(ids, source, merged)


@dataclasses.dataclass(frozen=True)
class TextAttributes:
    """Each text file's attribute (``--attribute-by``): ``file_ids`` (n_files,) int32 the store's id of each file,
    ``merged`` the store's names (and how many are new)."""

    by: str
    file_ids: np.ndarray
    merged: MergedNames


def text_attribute_ids(
    keys: Sequence[str], by: str | None, *, reference: Any = None, appending: bool = False
) -> TextAttributes | None:
    """The attributes of text files with ``keys`` by ``by`` (``file`` or ``directory``), their sorted names merged
    with ``reference``'s (see :func:`names_for_write`); ``None`` when ``by`` is (refused for an append to a store
    with attributes)."""
    if by is None:
        names_for_write(None, reference, appending=appending)
        return None
    own, local = text_attributes(keys, by)
    merged = names_for_write(own, reference, appending=appending)
    assert merged is not None
    return TextAttributes(by, merged.remap[local], merged)


def attribute_provenance(by: str, merged: MergedNames, source: str | None = None) -> dict[str, Any]:
    """What a writer records of the attributes it wrote: ``{"attributes": {by, names, new[, file]}}``."""
    record: dict[str, Any] = {"by": by, "names": len(merged.names), "new": merged.added}
    if source is not None:
        record["file"] = os.path.abspath(source) if os.path.exists(source) else source
    return {"attributes": record}
