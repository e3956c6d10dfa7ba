"""Zarr triple stores: the layout, writers, partition reads and validation.

A store is one zarr v3 group of row arrays (see :mod:`dist_respattn.store.schema`), read by
partitions that any worker opens on its own (:class:`TripleStore`), written in bounded memory by
the ``write_*`` functions, and fully checked by :func:`validate`.
"""

from __future__ import annotations

from dist_respattn.store.checks import EncodedRows, Problem
from dist_respattn.store.common import WriteOptions
from dist_respattn.store.errors import IncompleteStoreError, SchemaMismatchError, StoreCorruptError, StoreError
from dist_respattn.store.from_arrays import write_arrays
from dist_respattn.store.layout import COMPRESSION_CHOICES, Chunking, choose_chunking
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.schema import SCHEMA_NAME, SCHEMA_VERSION, StoreSchema
from dist_respattn.store.synthetic import write_synthetic
from dist_respattn.store.text import Vocabulary, build_vocabulary, default_corpus, iter_text_files, tokenize, write_text
from dist_respattn.store.tokens import WindowStream, embedding_table, write_tokens
from dist_respattn.store.triple_store import Partition, TripleStore
from dist_respattn.store.validate import ValidationReport, validate
from dist_respattn.store.writer import StoreWriter, rollback_append

__all__ = [
    "COMPRESSION_CHOICES",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "Chunking",
    "EncodedRows",
    "IncompleteStoreError",
    "Partition",
    "Problem",
    "SchemaMismatchError",
    "StoreCorruptError",
    "StoreError",
    "StoreLocation",
    "StoreSchema",
    "StoreWriter",
    "TripleStore",
    "ValidationReport",
    "Vocabulary",
    "WindowStream",
    "WriteOptions",
    "build_vocabulary",
    "choose_chunking",
    "default_corpus",
    "embedding_table",
    "iter_text_files",
    "rollback_append",
    "tokenize",
    "validate",
    "write_arrays",
    "write_synthetic",
    "write_text",
    "write_tokens",
]
