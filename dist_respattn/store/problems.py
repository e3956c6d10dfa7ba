"""Checks shared by opening, reading and validating a store: its structure, the values of a block, its corpus
identity and whether its chunks carry checksums."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dist_respattn.model.rows import EncodedRows
from dist_respattn.store.attributes import names_problem
from dist_respattn.store.errors import StoreCorruptError
from dist_respattn.store.group import read_whole
from dist_respattn.store.identity import embedding_sha256, identity_changes, recorded_identity, vocabulary_sha256
from dist_respattn.store.layout import has_checksums
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.schema import ATTRIBUTE_KEY, SCHEMA_NAME, SCHEMA_VERSION, StoreSchema, StoreState
from dist_respattn.text_format import count_text

__all__ = ["Problem", "block_problems", "checksum_note", "identity_problems", "structural_problems"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a store: where (array, chunk, first row) and what was expected."""

    message: str
    array: str | None = None
    chunk: int | None = None
    row: int | None = None
    count: int = 1

    def __str__(self) -> str:
        where = [f"array '{self.array}'" if self.array else "group"]
        if self.chunk is not None:
            where.append(f"chunk {self.chunk}")
        if self.row is not None:
            where.append(f"row {self.row}")
        return f"{', '.join(where)}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def structural_problems(group: Any) -> tuple[StoreSchema | None, dict[str, Any], list[Problem]]:
    """Check a store's attributes and array metadata without reading any chunk.

    Returns the schema (``None`` when it cannot be read), the attribute dict and the problems found:
    an unknown schema name or version, an unfinished write, a missing array, a wrong dtype or row
    shape, row counts or chunkings that differ between arrays or from the attributes.
    """
    attrs = dict(group.attrs.get(ATTRIBUTE_KEY) or {})
    if not attrs:
        return None, attrs, [Problem(f"no '{ATTRIBUTE_KEY}' attribute: this zarr group is not a triple store")]
    problems: list[Problem] = []
    if attrs.get("schema") != SCHEMA_NAME:
        problems.append(Problem(f"schema {attrs.get('schema')!r}: expected {SCHEMA_NAME!r}"))
        return None, attrs, problems
    version = attrs.get("schema_version")
    if version != SCHEMA_VERSION:
        problems.append(Problem(f"schema version {version!r} is unknown: this release reads version {SCHEMA_VERSION}"))
        return None, attrs, problems
    try:
        schema = StoreSchema.from_json(attrs, "attributes")
    except ValueError as exc:
        return None, attrs, [Problem(str(exc))]
    state = attrs.get("state")
    if state == StoreState.WRITING:
        problems.append(
            Problem(
                "the writer stopped before finishing this store (state 'writing'): write it again, "
                "adding --overwrite to the same command (without it the existing path is refused)"
            )
        )
    elif state == StoreState.APPENDING:
        problems.append(
            Problem(
                f"an append was interrupted (state 'appending'); the {attrs.get('rows')} committed rows are intact: "
                "run `dist-respattn repair` to roll back to them"
            )
        )
    elif state != StoreState.COMPLETE:
        problems.append(Problem(f"state {state!r}: expected {StoreState.COMPLETE!r}"))
    rows, chunk_rows, partition_rows = attrs.get("rows"), attrs.get("chunk_rows"), attrs.get("partition_rows")
    for name, value in (("rows", rows), ("chunk_rows", chunk_rows), ("partition_rows", partition_rows)):
        if not isinstance(value, int) or value < (0 if name == "rows" else 1):
            sign = "non-negative" if name == "rows" else "positive"
            problems.append(Problem(f"attribute {name} = {value!r}: expected a {sign} integer"))
    if problems:
        return schema, attrs, problems
    members = set(group.array_keys())
    for name, (row_shape, dtype) in schema.array_specs().items():
        if name not in members:
            problems.append(Problem(f"missing: expected a {dtype} array of rows {row_shape}", array=name))
            continue
        array = group[name]
        if array.dtype != dtype:
            problems.append(Problem(f"dtype {array.dtype}: expected {dtype}", array=name))
        if tuple(array.shape[1:]) != row_shape:
            problems.append(Problem(f"rows of shape {tuple(array.shape[1:])}: expected {row_shape}", array=name))
        if state == StoreState.COMPLETE and array.shape[0] != rows:
            problems.append(Problem(f"{array.shape[0]} rows: expected {rows}, the store's row count", array=name))
        shards = array.shards or array.chunks
        if array.chunks[0] != chunk_rows or shards[0] != partition_rows:
            problems.append(
                Problem(
                    f"chunked {array.chunks[0]} rows per chunk and {shards[0]} per shard: expected {chunk_rows} and "
                    f"{partition_rows} like every row array",
                    array=name,
                )
            )
        if tuple(array.chunks[1:]) != row_shape:
            problems.append(
                Problem(f"chunked along columns {array.chunks}: expected chunks along rows only", array=name)
            )
    if "weight" in members and not schema.has_weight:
        problems.append(Problem("present but the attributes say the store is unweighted", array="weight"))
    problems.extend(_attribute_structure(group, attrs, members, state == StoreState.COMPLETE))
    return schema, attrs, problems


def _attribute_structure(group: Any, attrs: dict[str, Any], members: set[str], complete: bool) -> list[Problem]:
    """The optional ``attribute`` array and its ``attribute_names``: both or neither, int32 (rows,), chunked and
    sharded like the row arrays."""
    names = attrs.get("attribute_names")
    if names is None:
        if "attribute" in members:
            return [Problem("present but the attributes record no attribute_names", array="attribute")]
        return []
    problem = names_problem(names)
    if problem is not None:
        return [Problem(problem)]
    if "attribute" not in members:
        return [Problem(f"missing: expected int32 (rows,) ids in [0, {len(names)}), one per row", array="attribute")]
    array = group["attribute"]
    problems = []
    if array.dtype != np.int32 or array.ndim != 1:
        problems.append(Problem(f"{array.dtype} of shape {array.shape}: expected int32 (rows,)", array="attribute"))
    if complete and array.shape[0] != attrs["rows"]:
        problems.append(Problem(f"{array.shape[0]} rows: expected {attrs['rows']}, the store's row count",
                                array="attribute"))  # fmt: skip
    shards = array.shards or array.chunks
    if array.chunks[0] != attrs["chunk_rows"] or shards[0] != attrs["partition_rows"]:
        problems.append(
            Problem(
                f"chunked {array.chunks[0]} rows per chunk and {shards[0]} per shard: expected "
                f"{attrs['chunk_rows']} and {attrs['partition_rows']} like every row array",
                array="attribute",
            )
        )
    return problems


def _first_bad(mask: np.ndarray) -> tuple[int, tuple[int, ...], int] | None:
    """(row index within the block, full index, number of bad rows) of a boolean mask, or None."""
    if mask.ndim > 1:
        row_mask = mask.any(axis=tuple(range(1, mask.ndim)))
    else:
        row_mask = mask
    count = int(np.count_nonzero(row_mask))
    if not count:
        return None
    first = int(np.argmax(row_mask))
    if mask.ndim > 1:
        col = int(np.argmax(mask[first]))
        return first, (first, col), count
    return first, (first,), count


def block_problems(block: EncodedRows, schema: StoreSchema, chunk: int | None) -> list[Problem]:
    """Every kind of bad value in a block (ids out of range, non-finite or negative numbers), one problem each."""
    problems = []
    checks: list[tuple[str, np.ndarray | None, Any, str]] = [
        (
            "context",
            block.context,
            lambda a: (a < 0) | (a >= schema.num_symbols),
            f"a symbol id in [0, {schema.num_symbols})",
        ),
        (
            "target",
            block.target,
            lambda a: (a < 0) | (a >= schema.num_targets),
            f"a target id in [0, {schema.num_targets})",
        ),
        ("query", block.query, lambda a: ~np.isfinite(a), "a finite value"),
        ("weight", block.weight, lambda a: ~(np.isfinite(a) & (a >= 0)), "a finite weight >= 0"),
    ]
    for name, values, is_bad, expected in checks:
        if values is None:
            continue
        found = _first_bad(is_bad(values))
        if found is None:
            continue
        first, index, count = found
        row = block.start + first
        cell = ", ".join(str(i) for i in (row, *index[1:]))
        rows_text = count_text(count, "row")
        problems.append(
            Problem(
                f"{name}[{cell}] = {values[index].item()!r}: expected {expected} ({rows_text} of this chunk)",
                array=name,
                chunk=chunk,
                row=row,
                count=count,
            )
        )
    return problems


def identity_problems(location: StoreLocation, group: Any, attributes: dict[str, Any]) -> list[Problem]:
    """The recorded corpus identity must still describe the vocabulary and table the store holds.

    Otherwise a store edited after it was written would pass for another corpus (or its own). The identity is
    computed from the content here, whatever was recorded; a table that cannot be read is a problem of its own.
    """
    vocabulary = dict(group["vocabulary"].attrs) if "vocabulary" in group else None
    table = None
    if "embeddings" in group:
        try:
            table = read_whole(location, group, "embeddings")
        except StoreCorruptError as exc:
            return [Problem(str(exc).split(": ", 1)[1].removeprefix("array 'embeddings' "), array="embeddings")]
    computed = {
        "vocabulary": None if vocabulary is None else vocabulary_sha256(vocabulary.get("tokens", [])),
        "embeddings": None if table is None else embedding_sha256(table),
    }
    recorded = recorded_identity(attributes.get("provenance") or {})
    return [Problem(message, array=key) for key, message in identity_changes(recorded, computed).items()]


def checksum_note(group: Any, names: Sequence[str]) -> str | None:
    """What ``validate`` says of a store whose row arrays carry no chunk checksums (written before they were kept):
    changed bytes inside a chunk cannot be found, only the checks of values and files apply."""
    if all(has_checksums(group[name]) for name in names if name in group):
        return None
    return (
        "its chunks carry no checksums (written before they were kept), so changed bytes inside a chunk are found "
        "only when they make a value invalid; write the store again (dist-respattn ingest) to add them"
    )
