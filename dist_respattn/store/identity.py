"""Which corpus a store's ids and queries belong to, and the check that two stores share one.

A store's **identity** is ``{"vocabulary": hex | None, "embeddings": hex | None}``:

- ``vocabulary``: ``sha256(json.dumps(tokens))`` of a text store's vocabulary tokens (id = position,
  the out-of-vocabulary id after the last), with Python's ``json.dumps`` defaults (ASCII-escaped,
  ``", "`` separators); counts do not enter, so a store written ``--like`` another, whose own counts
  differ, has the same vocabulary identity;
- ``embeddings``: sha256 of the header ``b"float32 S D\\n"`` followed by the (S, D) table as
  little-endian float32 bytes in C order.

Writers record both in the provenance (``vocabulary_sha256``, ``embedding_sha256``), hashed from what
they wrote. :func:`corpus_identity` always computes them from the store's content (a recorded hash
is only what the writer saw: a table edited since would otherwise pass for the old corpus);
:func:`identity_changes` names a recorded hash the content no longer has (``validate`` reports it,
``info`` prints it). A store with neither (arrays, synthetic) has nothing to compare and never
mismatches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dist_respattn.store.errors import CorpusMismatchError

if TYPE_CHECKING:  # the store imports this module; at run time it is only duck-typed here
    from dist_respattn.store.rows import RowStore

__all__ = [
    "IDENTITY_KEYS",
    "StoreRef",
    "check_model_corpus",
    "check_recorded_corpus",
    "check_same_corpus",
    "corpus_identity",
    "embedding_sha256",
    "identity_changes",
    "identity_provenance",
    "recorded_identity",
    "short_hash",
    "vocabulary_sha256",
]

#: The identity's fields, and the provenance keys that record them.
IDENTITY_KEYS = {"vocabulary": "vocabulary_sha256", "embeddings": "embedding_sha256"}
_SHORT = 12


def vocabulary_sha256(tokens: Sequence[str]) -> str:
    """The sha256 hex of ``json.dumps(list(tokens))``: the id-to-token map of a text vocabulary."""
    return hashlib.sha256(json.dumps(list(tokens)).encode("ascii")).hexdigest()


def embedding_sha256(table: Any) -> str:
    """The sha256 hex of an (S, D) table: ``b"float32 S D\\n"`` then its little-endian float32 bytes."""
    values = np.ascontiguousarray(table, dtype="<f4")
    if values.ndim != 2:
        raise ValueError(f"embedding table of shape {values.shape}: expected (S, D)")
    digest = hashlib.sha256(f"float32 {values.shape[0]} {values.shape[1]}\n".encode("ascii"))
    digest.update(values.tobytes())
    return digest.hexdigest()


def identity_provenance(tokens: Sequence[str] | None, table: Any) -> dict[str, str]:
    """The provenance entries a writer records: ``vocabulary_sha256`` (text only) and ``embedding_sha256``."""
    recorded = {} if tokens is None else {"vocabulary_sha256": vocabulary_sha256(tokens)}
    if table is not None:
        recorded["embedding_sha256"] = embedding_sha256(table)
    return recorded


def corpus_identity(store: RowStore) -> dict[str, str | None]:
    """``{"vocabulary": ..., "embeddings": ...}`` of a store, computed from its content (never the recorded hashes).

    Reads the vocabulary JSON and the (S, D) table, never a row.
    """
    saved = store.vocabulary()
    table = store.embeddings()
    return {
        "vocabulary": None if saved is None else vocabulary_sha256(saved.get("tokens", [])),
        "embeddings": None if table is None else embedding_sha256(table),
    }


def recorded_identity(provenance: Mapping[str, Any]) -> dict[str, str | None]:
    """The identity a writer recorded in a store's provenance (``None`` for a hash it did not record)."""
    return {key: provenance.get(recorded) for key, recorded in IDENTITY_KEYS.items()}


def identity_changes(recorded: Mapping[str, str | None], computed: Mapping[str, str | None]) -> dict[str, str]:
    """``{field: message}`` for each recorded hash the content no longer has: the store was edited after it was
    written (or the recorded part is gone). A hash not recorded (an older store) is not compared."""
    where = {"vocabulary": "vocabulary/zarr.json", "embeddings": "embeddings"}
    changes = {}
    for key, provenance_key in IDENTITY_KEYS.items():
        expected, actual = recorded.get(key), computed.get(key)
        if expected is None or expected == actual:
            continue
        if actual is None:
            changes[key] = (
                f"the provenance records {provenance_key} {short_hash(expected)}, but {where[key]} is missing"
            )
        else:
            changes[key] = (
                f"{where[key]} hashes to {short_hash(actual)}, but the provenance records {provenance_key} "
                f"{short_hash(expected)}: it was changed after the store was written"
            )
    return changes


def short_hash(value: str | None) -> str:
    """The first 12 hex digits of a hash, or ``none``."""
    return "none" if value is None else value[:_SHORT]


@dataclasses.dataclass(frozen=True)
class StoreRef:
    """A store as :func:`check_same_corpus` needs it: its URL and identity.

    Lets a caller check against a store it no longer has open, e.g. the training store a
    checkpoint's JSON records: ``StoreRef.from_json({"url": ..., "identity": {...}})``.
    """

    url: str
    identity: Mapping[str, str | None]

    @classmethod
    def of(cls, store: RowStore | StoreRef) -> StoreRef:
        if isinstance(store, StoreRef):
            return store
        return cls(str(store.location), store.identity())

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> StoreRef:
        """From ``{"url": ..., "identity": {...}}``; a record without an identity (older) checks nothing."""
        return cls(str(record["url"]), dict(record.get("identity") or {}))

    def get(self, key: str) -> str | None:
        return self.identity.get(key)

    @property
    def has_identity(self) -> bool:
        return any(self.get(key) is not None for key in IDENTITY_KEYS)


def _differences(reference: StoreRef, other: StoreRef, reference_role: str, other_role: str) -> list[str]:
    found = []
    # A vocabulary against none: the other store's ids are its own (a token store), not these words.
    vocab_ref, vocab_other = reference.get("vocabulary"), other.get("vocabulary")
    if vocab_ref != vocab_other:
        if vocab_ref is None or vocab_other is None:
            has, lacks = (reference_role, other_role) if vocab_other is None else (other_role, reference_role)
            found.append(f"the {has} has a vocabulary and the {lacks} has none (token ids of its own)")
        else:
            found.append(f"the vocabularies differ ({short_hash(vocab_ref)} vs {short_hash(vocab_other)})")
    table_ref, table_other = reference.get("embeddings"), other.get("embeddings")
    if table_ref is not None and table_other is not None and table_ref != table_other:
        found.append(f"the embedding tables differ ({short_hash(table_ref)} vs {short_hash(table_other)})")
    return found


def check_same_corpus(
    reference: RowStore | StoreRef,
    other: RowStore | StoreRef,
    *,
    reference_role: str,
    other_role: str,
    remedy: str | None = None,
) -> None:
    """Raise :class:`CorpusMismatchError` unless ``other``'s ids and queries mean what ``reference``'s do.

    A mismatch: both have a vocabulary and they differ; one has a vocabulary and the other only an
    embedding table (its ids are its own); both have an embedding table and they differ. A store with
    neither (arrays, synthetic; or a checkpoint record from before identities) is never a mismatch.
    ``reference_role``/``other_role`` name the stores in the message, e.g. ``"training store"`` (a
    leading ``"the "`` is dropped: the message adds its own). ``remedy`` is what the message says to do, when it is
    not to write ``other`` again like ``reference`` (a model of another corpus given to a fit: fit one of this one).
    """
    ref, oth = StoreRef.of(reference), StoreRef.of(other)
    if not ref.has_identity or not oth.has_identity:
        return
    # The message supplies the article: "training store" and "the training store" read the same.
    reference_role, other_role = reference_role.removeprefix("the "), other_role.removeprefix("the ")
    found = _differences(ref, oth, reference_role, other_role)
    if found:
        if remedy is None:
            remedy = (
                f"write it with `dist-respattn ingest {oth.url} ... --like {ref.url}`, or split one corpus into "
                "train, validation and test stores with `dist-respattn split OUT_DIR ...`"
            )
        raise CorpusMismatchError(
            f"the {other_role} {oth.url} is not of the corpus of the {reference_role} {ref.url}: "
            f"{' and '.join(found)}, so its ids or queries mean something else; {remedy}"
        )


def check_recorded_corpus(
    record: Mapping[str, Any] | None,
    other: RowStore | StoreRef,
    *,
    reference_role: str,
    other_role: str,
    remedy: str | None = None,
) -> None:
    """:func:`check_same_corpus` against a store known by its record (``{"url": ..., "identity": {...}}``, as a
    checkpoint or a registry version keeps it); no record, or one from before identities, checks nothing."""
    if record and record.get("url") is not None:
        check_same_corpus(
            StoreRef.from_json(record), other, reference_role=reference_role, other_role=other_role, remedy=remedy
        )


def check_model_corpus(record: Mapping[str, Any] | None, store: RowStore | StoreRef) -> None:
    """The check of every command that reads a model with a store (``evaluate``, ``predict``, ``predict --stream``,
    ``sample``, ``neighbours``, ``retrain``): ``store`` must be of the corpus of the training store ``record`` (a
    checkpoint's ``meta["store"]``) names; else :class:`CorpusMismatchError`, one line naming both stores."""
    check_recorded_corpus(record, store, reference_role="the model's training store", other_role="store")
