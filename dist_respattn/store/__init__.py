"""Zarr triple stores: the layout, writers, partition reads and validation.

A store is one zarr v3 group of row arrays (see :mod:`dist_respattn.store.schema`), read by
partitions that any worker opens on its own (:class:`TripleStore`), written in bounded memory by
the ``write_*`` functions, and fully checked by :func:`validate`. Stores of one corpus share its
vocabulary and embedding table, which their identity records (:meth:`TripleStore.identity`,
:func:`check_same_corpus`): write them with ``like=`` a store, or all at once with :func:`write_split`.
"""

from __future__ import annotations

from dist_respattn.model.rows import EncodedRows
from dist_respattn.store.checks import Problem
from dist_respattn.store.common import WriteOptions
from dist_respattn.store.errors import (
    CorpusMismatchError,
    IncompleteStoreError,
    SchemaMismatchError,
    StoreCorruptError,
    StoreError,
)
from dist_respattn.store.from_arrays import write_arrays
from dist_respattn.store.identity import StoreRef, check_recorded_corpus, check_same_corpus, corpus_identity
from dist_respattn.store.layout import COMPRESSION_CHOICES, Chunking, choose_chunking
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.schema import SCHEMA_NAME, SCHEMA_VERSION, StoreSchema
from dist_respattn.store.split import SPLIT_NAMES, TextCorpus, TokenCorpus, write_split
from dist_respattn.store.synthetic import write_synthetic
from dist_respattn.store.text import (
    TextDocument,
    Vocabulary,
    build_vocabulary,
    default_corpus,
    iter_text_documents,
    iter_text_files,
    tokenize,
    write_text,
)
from dist_respattn.store.tokens import WindowStream, embedding_table, write_tokens
from dist_respattn.store.triple_store import Partition, TripleStore
from dist_respattn.store.validate import ValidationReport, validate
from dist_respattn.store.writer import StoreWriter, rollback_append

__all__ = [
    "COMPRESSION_CHOICES",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "SPLIT_NAMES",
    "Chunking",
    "CorpusMismatchError",
    "EncodedRows",
    "IncompleteStoreError",
    "Partition",
    "Problem",
    "SchemaMismatchError",
    "StoreCorruptError",
    "StoreError",
    "StoreLocation",
    "StoreRef",
    "StoreSchema",
    "StoreWriter",
    "TextCorpus",
    "TextDocument",
    "TokenCorpus",
    "TripleStore",
    "ValidationReport",
    "Vocabulary",
    "WindowStream",
    "WriteOptions",
    "build_vocabulary",
    "check_recorded_corpus",
    "check_same_corpus",
    "choose_chunking",
    "corpus_identity",
    "default_corpus",
    "embedding_table",
    "iter_text_documents",
    "iter_text_files",
    "rollback_append",
    "tokenize",
    "validate",
    "write_arrays",
    "write_split",
    "write_synthetic",
    "write_text",
    "write_tokens",
]
