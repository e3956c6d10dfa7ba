"""A full scan of a store: its structure, then every chunk of every row array, partition by partition.

The partitions are scanned here one after another; :func:`dist_respattn.engine.validate.validate_on_cluster` runs
the same :func:`scan_partition` on a cluster's workers."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dist_respattn.model.rows import EncodedRows
from dist_respattn.store.errors import StoreError
from dist_respattn.store.group import damaged_metadata, open_group_at, read_failure, shard_key, unreadable_data_type
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.not_a_store import not_a_store
from dist_respattn.store.problems import (
    Problem,
    block_problems,
    checksum_note,
    identity_problems,
    structural_problems,
)
from dist_respattn.store.schema import ATTRIBUTE_KEY, SCHEMA_NAME, STREAM_SCHEMA_NAME, StoreSchema
from dist_respattn.store.streams.reader import is_stream_group
from dist_respattn.store.streams.validation import validate_stream
from dist_respattn.text_format import count_text

__all__ = [
    "PartitionScan",
    "ScanResult",
    "ValidationReport",
    "checksum_note",
    "identity_problems",
    "scan_partition",
    "scan_serially",
    "validate",
]

#: What :func:`scan_partition` finds in one partition: ``(problems, rows scanned, chunks scanned)``.
ScanResult = tuple[list[Problem], int, int]
#: A way to scan a triple store's partitions: ``(location, partitions, progress) -> results in partition order``,
#: calling ``progress(1)`` as each partition is done.
PartitionScan = Callable[[StoreLocation, Sequence[int], Callable[[int], None] | None], list[ScanResult]]


@dataclasses.dataclass
class ValidationReport:
    """What :func:`validate` found: every problem, and how much it looked at."""

    url: str
    problems: list[Problem]
    rows_scanned: int = 0
    chunks_scanned: int = 0
    #: What ``rows_scanned`` counts: rows of a triple store, tokens of a token-stream store.
    unit: str = "rows"
    #: What the scan could not check, e.g. a store written before chunks carried checksums.
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ok": self.ok,
            "rows_scanned": self.rows_scanned,
            # A stream store's count is of tokens, which are not its rows: the JSON says so as the text does.
            "unit": self.unit,
            "chunks_scanned": self.chunks_scanned,
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        head = f"{self.url}: {'valid' if self.ok else f'{len(self.problems)} problem(s)'}"
        chunks = count_text(self.chunks_scanned, "chunk")
        head += f" ({self.rows_scanned:,} {self.unit}, {chunks} scanned)"
        return "\n".join([head, *(f"  {p}" for p in self.problems), *(f"  note: {n}" for n in self.notes)])


def scan_partition(location: StoreLocation, partition: int) -> ScanResult:
    """Check every chunk of one partition: its files exist, decode, and hold valid values.

    Opens the store itself (this runs on a worker); the caller has checked its structure.
    Returns (problems, rows scanned, chunks scanned).
    """
    group = open_group_at(location)
    attributes = dict(group.attrs[ATTRIBUTE_KEY])
    schema = StoreSchema.from_json(attributes, str(location))
    rows, chunk_rows, partition_rows = attributes["rows"], attributes["chunk_rows"], attributes["partition_rows"]
    start, stop = partition * partition_rows, min((partition + 1) * partition_rows, rows)
    arrays = {name: group[name] for name in schema.array_specs()}
    names = attributes.get("attribute_names")
    if names is not None and "attribute" in group and group["attribute"].ndim == 1:  # else a structural problem
        arrays["attribute"] = group["attribute"]
    problems: list[Problem] = []
    missing = set()
    for name, array in arrays.items():
        key = shard_key(array, name, partition)
        if not location.key_exists(key):
            missing.add(name)
            problems.append(
                Problem(
                    f"chunk file '{key}' (rows {start}..{stop - 1}) is missing",
                    array=name,
                    chunk=start // chunk_rows,
                    row=start,
                    count=stop - start,
                )
            )
    scanned_rows = scanned_chunks = 0
    for lo in range(start, stop, chunk_rows):
        hi = min(lo + chunk_rows, stop)
        chunk = lo // chunk_rows
        values: dict[str, Any] = {}
        for name, array in arrays.items():
            if name in missing:
                continue
            try:
                values[name] = array[lo:hi]
            except Exception as exc:
                problems.append(
                    Problem(
                        f"cannot be decoded: {read_failure(exc)}",
                        array=name,
                        chunk=chunk,
                        row=lo,
                        count=hi - lo,
                    )
                )
        block = EncodedRows(values.get("context"), values.get("query"), values.get("target"), values.get("weight"), lo)  # type: ignore[arg-type]
        problems.extend(block_problems(block, schema, chunk))
        if "attribute" in values:
            problems.extend(_attribute_problems(values["attribute"], len(names or ()), chunk, lo))
        scanned_rows += hi - lo
        scanned_chunks += 1
    return problems, scanned_rows, scanned_chunks


def _attribute_problems(ids: Any, num_attributes: int, chunk: int, first: int) -> list[Problem]:
    """Attribute ids of rows ``first..`` outside [0, A), as one problem naming the first."""
    bad = np.flatnonzero((ids < 0) | (ids >= num_attributes))
    if not bad.size:
        return []
    i = int(bad[0])
    rows_text = count_text(int(bad.size), "row")
    return [Problem(f"attribute[{first + i}] = {int(ids[i])}: expected an attribute id in [0, {num_attributes}) "
                    f"({rows_text} of this chunk)", array="attribute", chunk=chunk, row=first + i,
                    count=int(bad.size))]  # fmt: skip


def scan_serially(
    location: StoreLocation, partitions: Sequence[int], progress: Callable[[int], None] | None = None
) -> list[ScanResult]:
    """Scan ``partitions`` one after another in this process (:func:`validate`'s way by default)."""
    ordered = []
    for p in partitions:
        ordered.append(scan_partition(location, p))
        if progress is not None:
            progress(1)
    return ordered


def validate(
    url: str | os.PathLike[str] | StoreLocation,
    *,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
    scan: PartitionScan = scan_serially,
) -> ValidationReport:
    """Scan a store and report every problem with its array, chunk and row.

    Raises :class:`StoreError` when ``url`` holds no store at all (no group, or a group without the store
    attribute); everything else is reported, not raised.

    Structure first (attributes, array dtypes and shapes, row counts, chunkings, unfinished writes);
    then, when the structure allows, every partition: missing chunk files, undecodable chunks, ids
    out of range, non-finite queries or weights, negative weights. A triple store's partitions are scanned by
    ``scan`` (default: here, one after another; :func:`dist_respattn.engine.validate.validate_on_cluster` scans
    them in parallel on a cluster's workers), a token-stream store's chunks here.
    ``progress`` is called with the number of partitions each step finishes; ``total``, once the structure allows a
    scan, with the number of partitions it will scan (a token-stream store's: its shards of tokens).
    """
    location = StoreLocation.of(url, storage_options)
    group = open_group_at(location)  # nothing there at all is an error, not a finding
    if dict(group.attrs.get(ATTRIBUTE_KEY) or {}).get("schema") not in (SCHEMA_NAME, STREAM_SCHEMA_NAME):
        raise not_a_store(location)  # nor is a group that is no store (predict's output, another program's)
    if is_stream_group(dict(group.attrs[ATTRIBUTE_KEY])):
        try:
            found, tokens, chunks = validate_stream(location, progress=progress, total=total)
        except StoreError:
            raise
        except ValueError:  # an array's zarr.json names a data type zarr does not know: a finding, named by its file
            problem = unreadable_data_type(location)
            if problem is None:
                raise
            return ValidationReport(str(location), [Problem(problem)])
        notes = [note] if (note := checksum_note(group, ("tokens", "weight", "token_attribute"))) else []
        return ValidationReport(
            str(location), found, rows_scanned=tokens, chunks_scanned=chunks, unit="tokens", notes=notes
        )
    try:
        schema, attributes, problems = structural_problems(group)
    except json.JSONDecodeError as exc:  # a member's zarr.json is damaged: a finding, named by its file
        damaged = damaged_metadata(location) or "a zarr.json"
        return ValidationReport(str(location), [Problem(f"{damaged}: not valid JSON ({exc}): its metadata is damaged")])
    except ValueError:  # one naming a data type zarr does not know: a finding too
        problem = unreadable_data_type(location)
        if problem is None:
            raise
        return ValidationReport(str(location), [Problem(problem)])
    report = ValidationReport(str(location), list(problems))
    if schema is None or any(p.array is None for p in problems) or not _shapes_agree(group, schema):
        return report  # values cannot be located reliably; the structural problems say why
    report.problems.extend(identity_problems(location, group, attributes))
    note = checksum_note(group, list(schema.array_specs()))
    report.notes.extend([note] if note else [])
    partitions = range(-(-attributes["rows"] // attributes["partition_rows"]))
    if total is not None:
        total(len(partitions))
    for found, rows, chunks in scan(location, list(partitions), progress):  # in partition order: the same report
        report.problems.extend(found)
        report.rows_scanned += rows
        report.chunks_scanned += chunks
    return report


def _shapes_agree(group: Any, schema: StoreSchema) -> bool:
    """Whether every row array exists with its row shape, so chunks can be read and checked."""
    members = set(group.array_keys())
    return all(
        name in members and tuple(group[name].shape[1:]) == shape for name, (shape, _) in schema.array_specs().items()
    )
