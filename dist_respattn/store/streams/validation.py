"""Validating a token-stream store: its arrays' dtypes and shapes against its record, its document starts, its corpus
identity, its attribute arrays and every chunk of token values."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dist_respattn.store.attributes import ATTRIBUTE_LEVELS, names_problem
from dist_respattn.store.errors import StoreCorruptError
from dist_respattn.store.group import open_group_at, read_failure, read_whole
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.problems import Problem, identity_problems
from dist_respattn.store.schema import ATTRIBUTE_KEY, StoreState
from dist_respattn.store.streams.reader import (
    ATTRIBUTE_ARRAYS,
    STARTS_CHUNK,
    TokenStreamStore,
    array_problems,
    missing_arrays,
    starts_problem,
)

__all__ = ["validate_stream"]


def validate_stream(
    store_url: str | os.PathLike[str] | StoreLocation,
    storage_options: dict[str, Any] | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> tuple[list[Problem], int, int]:
    """Every problem of a stream store, named by array and position: ``(problems, tokens scanned, chunks scanned)``.

    ``total`` is called once with the number of partitions (shards of tokens) the scan reads, ``progress`` with 1
    as each is done.
    """
    location = StoreLocation.of(store_url, storage_options)
    group = open_group_at(location)
    attributes = dict(group.attrs.get(ATTRIBUTE_KEY) or {})
    problems: list[Problem] = []
    if attributes.get("state") == StoreState.APPENDING:
        problems.append(Problem("state 'appending': an append did not finish; `dist-respattn repair` rolls it back"))
        return problems, 0, 0
    if attributes.get("state") != StoreState.COMPLETE:
        state = attributes.get("state")
        problems.append(Problem(f"state {state!r}: the writer did not finish; write it again with --overwrite"))
        return problems, 0, 0
    missing = missing_arrays(group, attributes)
    if missing:  # nothing can be located without them
        return [Problem(f"missing: expected {expected}", array=name) for name, expected in missing], 0, 0
    mismatched = array_problems(group, attributes)
    if mismatched:  # chunks read past an array's end or decoded as another dtype: every one would fail, or lie
        return mismatched, 0, 0
    num_tokens = int(attributes["tokens"])
    try:
        starts = np.asarray(read_whole(location, group, "document_starts"), dtype=np.int64)
    except StoreCorruptError as exc:  # nothing can be located without them
        return (
            [Problem(str(exc).split(": ", 1)[1].removeprefix("array 'document_starts' "), array="document_starts")],
            0,
            0,
        )
    problem = starts_problem(starts, num_tokens)
    if problem is not None:
        problems.append(Problem(problem, array="document_starts"))
    identity = identity_problems(location, group, attributes)
    problems.extend(identity)
    # Opening a store reads its table: one that cannot be read leaves the chunks to be read raw.
    table_unreadable = any(p.array == "embeddings" and "cannot be read" in p.message for p in identity)
    num_attributes, attribute_problems = _attribute_problems(group, attributes, num_tokens, int(starts.size))
    problems.extend(attribute_problems)
    if num_attributes is None:  # names that cannot be read: the tokens are still checked
        attributes = {k: v for k, v in attributes.items() if k not in ("attribute_names", "attribute_level")}
    store = (
        TokenStreamStore(location, group, attributes, int(attributes["context_length"]))
        if problem is None and not table_unreadable
        else None
    )
    chunk = int(attributes["chunk_tokens"])
    num_symbols = int(attributes["num_symbols"])
    scanned = ["tokens", "weight"] + (["token_attribute"] if num_attributes and "token_attribute" in group else [])
    shard = int(attributes.get("partition_tokens") or chunk)
    if total is not None:
        total(-(-num_tokens // shard))
    chunks = 0
    for begin in range(0, num_tokens, chunk):
        end = min(begin + chunk, num_tokens)
        chunks += 1
        for name in scanned:
            if name not in group:
                continue
            try:
                values = (
                    store.read_array(name, group[name], begin, end) if store is not None else group[name][begin:end]
                )
            except StoreCorruptError as exc:
                problems.append(Problem(str(exc).split(": ", 1)[1], array=name, chunk=begin // chunk, row=begin))
                continue
            except Exception as exc:  # read raw (no store could be opened): zarr's error, named here
                problems.append(Problem(f"array '{name}' chunk {begin // chunk} (tokens {begin}..{end - 1}) cannot "
                                        f"be read: {read_failure(exc)}", array=name, chunk=begin // chunk,
                                        row=begin))  # fmt: skip
                continue
            if name == "tokens":
                bad = np.flatnonzero(values >= num_symbols)
                what = f"expected token ids in [0, {num_symbols})"
            elif name == "weight":
                bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
                what = "expected finite, non-negative weights"
            else:
                bad = np.flatnonzero((values < 0) | (values >= num_attributes))
                what = f"expected attribute ids in [0, {num_attributes})"
            if bad.size:
                i = int(bad[0])
                problems.append(Problem(f"position {begin + i} = {values[i]}: {what}", array=name,
                                        chunk=begin // chunk, row=begin + i, count=int(bad.size)))  # fmt: skip
        # A shard is done when its last chunk is (the shard is a multiple of the chunk).
        if progress is not None and (end % shard == 0 or end == num_tokens):
            progress(1)
    return problems, num_tokens, chunks


def _attribute_problems(
    group: Any, attributes: dict[str, Any], num_tokens: int, num_documents: int
) -> tuple[int | None, list[Problem]]:
    """The attribute arrays' structure, and a per-document array's values: ``(A, problems)``.

    A is ``None`` when the store has no attributes or its names cannot be read; the per-token array's
    values are left to the chunk scan.
    """
    problems: list[Problem] = []
    names = attributes.get("attribute_names")
    if names is None:
        for name in ATTRIBUTE_ARRAYS.values():
            if name in group:
                problems.append(Problem("present but the attributes record no attribute_names", array=name))
        return None, problems
    problem = names_problem(names)
    level = attributes.get("attribute_level")
    if problem is None and level not in ATTRIBUTE_LEVELS:
        problem = f"attribute attribute_level = {level!r}: expected one of {', '.join(ATTRIBUTE_LEVELS)}"
    if problem is not None:
        return None, [Problem(problem)]
    a = len(names)
    expected = ATTRIBUTE_ARRAYS[str(level)]
    for name in ATTRIBUTE_ARRAYS.values():
        if name != expected and name in group:
            problems.append(Problem(f"present but the attributes say there is an attribute per {level}", array=name))
    length = num_documents if level == "document" else num_tokens
    if expected not in group:
        problems.append(Problem(f"missing: expected int32 ({length},), an attribute id per {level}", array=expected))
        return a, problems
    array = group[expected]
    if array.dtype != np.int32 or tuple(array.shape) != (length,):
        problems.append(Problem(f"{array.dtype} {tuple(array.shape)}: expected int32 ({length},), an attribute id "
                                f"per {level}", array=expected))  # fmt: skip
        return None, problems
    if level == "token":
        tokens = group["tokens"]
        if tuple(array.chunks) != tuple(tokens.chunks) or (array.shards or array.chunks) != (
            tokens.shards or tokens.chunks
        ):
            problems.append(Problem(f"chunks {array.chunks}, shards {array.shards}: expected those of 'tokens' "
                                    f"({tokens.chunks}, {tokens.shards})", array=expected))  # fmt: skip
            return None, problems
        return a, problems
    ids = np.asarray(array[...])
    bad = np.flatnonzero((ids < 0) | (ids >= a))
    if bad.size:
        d = int(bad[0])
        problems.append(Problem(f"document {d} = {int(ids[d])}: expected attribute ids in [0, {a})", array=expected,
                                chunk=d // STARTS_CHUNK, row=d, count=int(bad.size)))  # fmt: skip
    return a, problems
