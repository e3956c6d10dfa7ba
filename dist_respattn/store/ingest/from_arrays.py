"""Writing a store from arrays in memory or ``.npy`` files (read in blocks, so they may exceed RAM)."""

from __future__ import annotations

import os
from typing import Any

from dist_respattn.store.attributes import attribute_ids, attribute_provenance
from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.ingest.like import open_like
from dist_respattn.store.ingest.tables import MAX_INFERRED_SYMBOLS, first_id_past, id_bound_hint
from dist_respattn.store.npy import NpyRows, load_array, max_id, row_blocks
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.triples.reader import TripleStore

__all__ = ["NpyRows", "load_array", "max_id", "row_blocks", "write_arrays"]


def write_arrays(
    out: str | os.PathLike[str],
    context: Any,
    query: Any,
    target: Any,
    weight: Any = None,
    *,
    num_symbols: int | None = None,
    num_targets: int | None = None,
    like: TripleStore | str | os.PathLike[str] | None = None,
    options: WriteOptions | None = None,
    attributes: Any = None,
    attribute_names: Any = None,
) -> TripleStore:
    """Write ``context`` (n, N), ``query`` (n, D), ``target`` (n,) and optional ``weight`` (n,) to a store.

    Each may be an array or a ``.npy`` path. ``num_symbols`` and ``num_targets`` default to the
    largest id + 1 (or the existing store's when appending). Rows are copied one partition at a time.

    ``like``: a store (or its URL) whose S, T, N and D the rows must have; the new store takes its
    vocabulary and embedding table, so it counts as the same corpus (its ids and queries are declared
    to be that store's). A conflicting ``num_symbols``/``num_targets`` is refused.

    ``attributes``: an attribute id per row (an (n,) integer array or ``.npy`` path), named by
    ``attribute_names`` (a ``NAMES.txt`` path, line k naming id k, or a sequence; default ``"0"``..``"A-1"``);
    with ``like`` or an append, merged with that store's names (:mod:`~dist_respattn.store.attributes`).
    """
    options = options or WriteOptions()
    reference = open_like(like, options)
    given = {"S": num_symbols is not None, "T": num_targets is not None}
    arrays = {"context": context, "query": query, "target": target}
    if weight is not None:
        arrays["weight"] = weight
    loaded = {name: load_array(value, name) for name, value in arrays.items()}
    names = {name: source for name, (_, source) in loaded.items()}
    values = {name: array for name, (array, _) in loaded.items()}
    for name, ndim in (("context", 2), ("query", 2), ("target", 1), ("weight", 1)):
        if name in values and values[name].ndim != ndim:
            raise ValueError(f"{names[name]}: {name} has shape {values[name].shape}: expected {ndim} dimensions")
    n = values["context"].shape[0]
    for name, array in values.items():
        if array.shape[0] != n:
            raise ValueError(
                f"{names[name]}: {array.shape[0]} rows but {names['context']} has {n}: expected one row per triple"
            )
    if reference is not None:
        schema = reference.store.schema
        reference.check_dimension(
            names["context"], "context has", values["context"].shape[1], schema.context_length, "N"
        )
        reference.check_dimension(names["query"], "query has", values["query"].shape[1], schema.query_dim, "D")
        num_symbols, num_targets = reference.num_symbols(num_symbols), reference.num_targets(num_targets)
    appended_to = TripleStore.open(out, storage_options=options.storage_options) if options.append else None
    if appended_to is not None and (num_symbols is None or num_targets is None):
        num_symbols = num_symbols or appended_to.schema.num_symbols
        num_targets = num_targets or appended_to.schema.num_targets
    schema = StoreSchema(
        num_symbols=num_symbols if num_symbols is not None else _inferred(values["context"], names["context"], "S"),
        context_length=values["context"].shape[1],
        query_dim=values["query"].shape[1],
        num_targets=num_targets if num_targets is not None else _inferred(values["target"], names["target"], "T"),
        query_dtype=options.query_dtype,
        has_weight="weight" in values,
    )
    ids = attribute_ids(
        attributes, n, per="row", names=attribute_names, appending=options.append,
        reference=appended_to if appended_to is not None else None if reference is None else reference.store,
    )  # fmt: skip
    provenance = {"source": "arrays", "files": {k: v for k, v in names.items() if v != k}}
    if reference is not None:
        provenance.update(reference.provenance())
    if ids is not None:
        names["attribute"] = f"--attributes {ids.source}"
        provenance.update(attribute_provenance("ids", ids.merged, ids.source))
    taken_from = (
        f"--like {reference.url}" if reference is not None
        else f"--append to {appended_to.location}" if appended_to is not None else None
    )  # fmt: skip
    why = {
        array: id_bound_hint(count, bound, given=given[count], reference=taken_from)
        for array, count, bound in (("context", "S", schema.num_symbols), ("target", "T", schema.num_targets))
    }
    with open_writer(out, schema, options, provenance, None if ids is None else ids.merged.names) as writer:
        if reference is not None:
            reference.copy_into(writer)
        step = writer.chunking.partition_rows
        for start in range(0, n, step):
            block = {name: array[start : start + step] for name, array in values.items()}
            writer.write(block["context"], block["query"], block["target"], block.get("weight"), source=names,
                         attribute=None if ids is None else ids.block(start, start + step), why=why)  # fmt: skip
        return writer.close()


def _inferred(values: Any, source: str, count: str) -> int:
    """S (of ``context``) or T (of ``target``) given without it: the largest id + 1 (at least 1), scanned in
    blocks. An id of :data:`MAX_INFERRED_SYMBOLS` or more is refused at its row before anything is sized by it."""
    largest, past = first_id_past(values, MAX_INFERRED_SYMBOLS)
    if past is not None:
        row, value = past
        flag = "--symbols" if count == "S" else "--targets"
        raise ValueError(
            f"{source}: row {row} holds the id {value:,}, which would make {count} = {value + 1:,} (ids alone may "
            f"imply at most {MAX_INFERRED_SYMBOLS:,}); give {count} with {flag} {count} to allow it (ids are then "
            "checked against it), or fix the id"
        )
    return max(largest + 1, 1)
