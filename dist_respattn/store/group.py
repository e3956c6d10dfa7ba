"""A store's zarr group, shared by both formats: opening it, naming damaged metadata, its shard keys and partitions."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import zarr

from dist_respattn.store.errors import StoreCorruptError, StoreError
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.not_a_store import not_a_store

__all__ = [
    "Partition",
    "array_summary",
    "damaged_metadata",
    "delete_interrupted_writes",
    "delete_shards_from",
    "named_metadata_errors",
    "open_group_at",
    "read_failure",
    "read_whole",
    "shard_key",
    "unreadable_data_type",
]

logger = logging.getLogger(__name__)

#: zarr's local store writes each file to ``<file>.<32 hex digits>.partial`` and renames it into place;
#: a writer killed between the two leaves that file behind.
_INTERRUPTED_WRITE = re.compile(r"\.[0-9a-f]{32}\.partial$")

#: How zarr's ``crc32c`` codec says a chunk's bytes changed ("Stored and computed checksum do not match").
_CHECKSUM_MISMATCH = "checksum do not match"


@dataclasses.dataclass(frozen=True)
class Partition:
    """Rows ``[start, stop)`` of a store: one shard of every row array, one E-step task."""

    index: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


#: Where a store's zarr metadata lives: the group's, its arrays', and the arrays of its subgroups (truth/, vocabulary/).
_METADATA_PATTERNS = ("zarr.json", "*/zarr.json", "*/*/zarr.json")


def damaged_metadata(location: StoreLocation) -> str | None:
    """The first ``zarr.json`` of the store that is not valid JSON (read only once zarr has failed on one)."""
    fs, root = location.filesystem()
    for pattern in _METADATA_PATTERNS:
        for path in sorted(fs.glob(f"{root.rstrip('/')}/{pattern}")):
            try:
                json.loads(fs.cat_file(path))
            except (ValueError, UnicodeDecodeError):
                return str(path)
    return None


def unreadable_data_type(location: StoreLocation) -> str | None:
    """What is wrong with the first array ``zarr.json`` of the store whose data type zarr does not know (``PATH:
    array 'NAME' has data type 'int33', ...: expected int32 ...``), or ``None`` when there is none. Read only once
    zarr has failed: zarr's own error names the data type but no file or array."""
    from zarr.core.dtype import get_data_type_from_json  # what zarr 3.1+ reads an array's data type with

    fs, root = location.filesystem()
    for pattern in _METADATA_PATTERNS[1:]:  # the arrays' (the root is the group's)
        for path in sorted(fs.glob(f"{root.rstrip('/')}/{pattern}")):
            try:
                metadata = json.loads(fs.cat_file(path))
            except (ValueError, UnicodeDecodeError):
                continue  # not JSON: damaged_metadata names it
            if not isinstance(metadata, dict) or metadata.get("node_type") != "array":
                continue
            try:
                get_data_type_from_json(metadata.get("data_type"), zarr_format=3)
            except (ValueError, TypeError):
                name = str(path)[len(root.rstrip("/")) + 1 :].removesuffix("/zarr.json")
                expected = _expected_dtype(_store_attributes(fs, root), name)
                return (
                    f"{path}: array '{name}' has data type {metadata.get('data_type')!r}, which zarr cannot read: "
                    f"expected {expected or 'one of the data types zarr reads, as the store was written'}; the file "
                    "was changed after the store was written: write the store again with `dist-respattn ingest` or "
                    "`dist-respattn split` (--overwrite), or restore the file from a copy"
                )
    return None


def _store_attributes(fs: Any, root: str) -> dict[str, Any]:
    """The store's own attributes from its group's ``zarr.json`` (empty when they cannot be read)."""
    from dist_respattn.store.schema import ATTRIBUTE_KEY

    try:
        attributes = json.loads(fs.cat_file(f"{root.rstrip('/')}/zarr.json")).get("attributes") or {}
        return dict(attributes.get(ATTRIBUTE_KEY) or {})
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return {}


def _expected_dtype(attributes: dict[str, Any], name: str) -> str | None:
    """``int32 (each row's target id)``: the data type a store with ``attributes`` writes array ``name`` in, and
    what it holds; ``None`` for an array the store does not write (or attributes that do not say)."""
    from dist_respattn.store.schema import STREAM_SCHEMA_NAME

    kinds = {
        "embeddings": "float32 (the (S, D) table queries are looked up in)",
        "weight": "float32 (a weight per row or token)",
        "attribute": "int32 (an attribute id per row)",
        "token_attribute": "int32 (an attribute id per token)",
        "document_attribute": "int32 (an attribute id per document)",
    }
    if attributes.get("schema") == STREAM_SCHEMA_NAME:
        num_symbols = attributes.get("num_symbols")
        if isinstance(num_symbols, int) and num_symbols >= 1:
            bits = next((b for b in (8, 16, 32) if num_symbols - 1 < 2**b), 64)
            kinds["tokens"] = f"uint{bits} (the smallest unsigned type that holds S = {num_symbols:,} ids)"
        kinds["document_starts"] = "int64 (each document's first token)"
    else:
        query_dtype = attributes.get("query_dtype", "float32")
        kinds.update(
            {
                "context": "int32 (each row's context symbol ids)",
                "query": f"{query_dtype} (each row's query, the store's query_dtype)",
                "target": "int32 (each row's target id)",
            }
        )
    if name.startswith("truth/"):
        return "float64 (the true head's parameters)"
    return kinds.get(name)


@contextlib.contextmanager
def named_metadata_errors(location: StoreLocation) -> Iterator[None]:
    """Turn zarr's errors on damaged metadata, which name no file, into a :class:`StoreCorruptError` naming the file
    and the array: a ``zarr.json`` that is not JSON (``JSONDecodeError``), or one naming a data type zarr does not
    know (a bare ``ValueError``).

    zarr reads a member's ``zarr.json`` lazily; the file is found afterwards.
    """
    try:
        yield
    except json.JSONDecodeError as exc:
        _settle_zarr_reads()
        damaged = damaged_metadata(location) or f"a zarr.json under {location}"
        raise StoreCorruptError(
            f"{damaged}: not valid JSON ({exc}): the store's metadata is damaged; write the store again "
            "(overwrite=True), or restore the file from a copy"
        ) from None
    except StoreError:
        raise
    except ValueError:
        _settle_zarr_reads()
        problem = unreadable_data_type(location)
        if problem is None:
            raise
        raise StoreCorruptError(problem) from None


def _settle_zarr_reads() -> None:
    """Wait for the metadata reads zarr still has in flight after one of them failed.

    zarr gathers its members' reads on its own event loop, and a failed gather leaves the others
    running; a command that exits at once destroys them and asyncio prints "Task was destroyed but it
    is pending!" after the command's one-line error.
    """
    from zarr.core import sync

    zarr_loop = getattr(sync, "loop", [None])[0]
    if zarr_loop is None or zarr_loop.is_closed():
        return

    async def settle() -> None:
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        await asyncio.gather(*others, return_exceptions=True)

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(settle(), zarr_loop).result(timeout=30)


def open_group_at(location: StoreLocation, mode: str = "r") -> Any:
    """The zarr group at ``location``, or a :class:`StoreError` saying what is there instead (see
    :func:`~dist_respattn.store.not_a_store.not_a_store`)."""
    try:
        with named_metadata_errors(location):
            return zarr.open_group(location.zarr_store(), mode=mode)  # type: ignore[arg-type]
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError, zarr.errors.ContainsArrayError) as exc:
        raise not_a_store(location) from exc


def array_summary(array: Any) -> dict[str, Any]:
    """What ``info`` shows of one zarr array: dtype, shape, chunks, shards, codecs and uncompressed bytes."""
    return {
        "dtype": str(array.dtype),
        "shape": list(array.shape),
        "chunks": list(array.chunks),
        "shards": list(array.shards or array.chunks),
        "compressors": [type(c).__name__ for c in array.compressors],
        "bytes": int(array.nbytes),
    }


def shard_key(array: Any, name: str, partition: int) -> str:
    """The store key of array ``name``'s file for ``partition`` (its shard), e.g. ``'query/c/3/0'``."""
    return f"{name}/{array.metadata.encode_chunk_key((partition,) + (0,) * (array.ndim - 1))}"


def delete_shards_from(location: StoreLocation, name: str, first: int) -> None:
    """Delete array ``name``'s shard files of partition ``first`` on (shrinking a zarr array keeps them)."""
    fs, root = location.filesystem()
    for key in location.list_keys(f"{name}/c"):
        parts = key.split("/")  # <name>/c/<partition>[/0]
        if len(parts) >= 3 and parts[2].isdigit() and int(parts[2]) >= first:
            fs.rm(f"{root}/{key}")


def delete_interrupted_writes(location: StoreLocation) -> list[str]:
    """Delete the half-written files (``<file>.<hex>.partial``) a killed writer left in the store; return their keys.

    Call only under the store's writer lock: a live writer's files in flight look the same.
    """
    fs, root = location.filesystem()
    removed = sorted(key for key in location.list_keys("") if _INTERRUPTED_WRITE.search(key))
    for key in removed:
        fs.rm(f"{root}/{key}")
    if removed:
        logger.warning("%s: removed the files a killed writer left half-written: %s", location, ", ".join(removed))
    return removed


def read_failure(exc: BaseException) -> str:
    """Why a chunk could not be read, for a one-line error: a checksum that does not match is named as changed bytes
    (the chunk's stored CRC-32C no longer describes them), anything else as zarr's own error."""
    if _CHECKSUM_MISMATCH in str(exc):
        return (
            "its checksum does not match its bytes: the chunk file was changed after it was written; "
            "restore the file or write the store again"
        )
    return f"{type(exc).__name__}: {exc}"


def read_whole(location: StoreLocation, group: Any, name: str) -> Any:
    """All of a store's side array ``name`` (an embedding table, document starts), a chunk that cannot be read
    (changed bytes, a damaged file) raised as :class:`StoreCorruptError` naming the array."""
    try:
        return group[name][...]
    except Exception as exc:
        raise StoreCorruptError(f"{location}: array '{name}' cannot be read: {read_failure(exc)}") from exc
