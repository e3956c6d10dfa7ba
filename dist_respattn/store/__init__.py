"""Stores of rows, in two formats: token-stream stores (the default) and triple stores; one opener for both.

A store is one zarr v3 group. A token-stream store (:class:`TokenStreamStore`, :mod:`~dist_respattn.store.streams`)
holds the token ids and makes each row's window as it reads; a triple store (:class:`TripleStore`,
:mod:`~dist_respattn.store.triples`) holds a row per (context, query, target) (see
:mod:`dist_respattn.store.schema`). :func:`open_store` opens either from a path, URL or location; both are read by
partitions that any worker opens on its own, written in bounded memory (:class:`StreamWriter`,
:class:`StoreWriter`, and the ``write_*`` functions of the ingestion sources, :mod:`~dist_respattn.store.ingest`),
and fully checked by :func:`validate`. Stores of one corpus share its vocabulary and embedding table, which their
identity records (:meth:`TripleStore.identity`, :func:`check_same_corpus`): write them with ``like=`` a store, or
all at once with :func:`write_split`.
"""

from __future__ import annotations

from dist_respattn.model.rows import EncodedRows
from dist_respattn.store.common import WriteOptions
from dist_respattn.store.errors import (
    CorpusMismatchError,
    IncompleteStoreError,
    SchemaMismatchError,
    StoreCorruptError,
    StoreError,
)
from dist_respattn.store.group import Partition
from dist_respattn.store.identity import (
    StoreRef,
    check_model_corpus,
    check_recorded_corpus,
    check_same_corpus,
    corpus_identity,
)
from dist_respattn.store.ingest.from_arrays import write_arrays
from dist_respattn.store.ingest.split import SPLIT_NAMES, TextCorpus, TokenCorpus, write_split
from dist_respattn.store.ingest.synthetic import write_synthetic
from dist_respattn.store.ingest.text import (
    TextDocument,
    Vocabulary,
    build_vocabulary,
    default_corpus,
    iter_text_documents,
    iter_text_files,
    tokenize,
    write_text,
)
from dist_respattn.store.ingest.to_stream import write_stream_text, write_stream_tokens
from dist_respattn.store.ingest.tokens import WindowStream, embedding_table, write_tokens
from dist_respattn.store.layout import COMPRESSION_CHOICES, Chunking, choose_chunking
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.problems import Problem
from dist_respattn.store.rows import RowStore, open_store
from dist_respattn.store.schema import SCHEMA_NAME, SCHEMA_VERSION, StoreSchema
from dist_respattn.store.streams.reader import TokenStreamStore
from dist_respattn.store.streams.rollback import rollback_stream_append
from dist_respattn.store.streams.validation import validate_stream
from dist_respattn.store.streams.writer import StreamWriter, write_stream
from dist_respattn.store.triples.reader import TripleStore
from dist_respattn.store.triples.rollback import rollback_append
from dist_respattn.store.triples.writer import StoreWriter
from dist_respattn.store.validate import ValidationReport, validate

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
    "RowStore",
    "SchemaMismatchError",
    "StoreCorruptError",
    "StoreError",
    "StoreLocation",
    "StoreRef",
    "StoreSchema",
    "StoreWriter",
    "StreamWriter",
    "TextCorpus",
    "TextDocument",
    "TokenCorpus",
    "TokenStreamStore",
    "TripleStore",
    "ValidationReport",
    "Vocabulary",
    "WindowStream",
    "WriteOptions",
    "build_vocabulary",
    "check_model_corpus",
    "check_recorded_corpus",
    "check_same_corpus",
    "choose_chunking",
    "corpus_identity",
    "default_corpus",
    "embedding_table",
    "iter_text_documents",
    "iter_text_files",
    "open_store",
    "rollback_append",
    "rollback_stream_append",
    "tokenize",
    "validate",
    "validate_stream",
    "write_arrays",
    "write_split",
    "write_stream",
    "write_stream_text",
    "write_stream_tokens",
    "write_synthetic",
    "write_text",
    "write_tokens",
]
