"""A store's corpus identity: recorded at ingest, computed for older stores, and the check that two stores share one."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import zarr

from dist_respattn.store import (
    CorpusMismatchError,
    StoreError,
    StoreRef,
    TokenStreamStore,
    TripleStore,
    check_same_corpus,
    corpus_identity,
    open_store,
    validate,
    write_stream_text,
    write_synthetic,
    write_text,
    write_tokens,
)
from tests.store.helpers import SMALL, edit_attributes, write_small


def documented_vocabulary_hash(tokens: list[str]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


def documented_table_hash(table: np.ndarray) -> str:
    s, d = table.shape
    return hashlib.sha256(f"float32 {s} {d}\n".encode() + table.astype("<f4").tobytes()).hexdigest()


def write_corpus(folder, texts: dict[str, str]):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def text_store(tmp_path) -> TripleStore:
    corpus = write_corpus(tmp_path / "a", {"one.txt": "The cat sat on the mat. The cat ran.\n"})
    return write_text(tmp_path / "a.zarr", [corpus], 2, vocab_size=4, dim=3, options=SMALL)


def forget_recorded_identity(store: TripleStore) -> TripleStore:
    """The store as a writer from before identities left it: no ``*_sha256`` in the provenance."""
    provenance = {k: v for k, v in store.provenance.items() if not k.endswith("_sha256")}
    edit_attributes(store.location.url, provenance=provenance)
    return TripleStore.open(store.location)


def test_text_and_token_stores_record_their_identity_as_documented(tmp_path, text_store):
    vocabulary, table = text_store.vocabulary(), text_store.embeddings()
    assert vocabulary is not None and table is not None
    expected = {
        "vocabulary": documented_vocabulary_hash(vocabulary["tokens"]),
        "embeddings": documented_table_hash(table),
    }
    assert text_store.provenance["vocabulary_sha256"] == expected["vocabulary"]
    assert text_store.provenance["embedding_sha256"] == expected["embeddings"]
    assert text_store.identity() == corpus_identity(text_store) == expected
    assert text_store.describe()["identity"] == expected

    tokens = write_tokens(tmp_path / "t.zarr", np.arange(40) % 9, 3, dim=4, options=SMALL)
    table = tokens.embeddings()
    assert table is not None
    assert "vocabulary_sha256" not in tokens.provenance
    assert tokens.identity() == {"vocabulary": None, "embeddings": documented_table_hash(table)}


def test_stores_without_a_vocabulary_or_table_have_no_identity(tmp_path):
    arrays = write_small(tmp_path / "arrays.zarr")
    synthetic = write_synthetic(
        tmp_path / "synth.zarr", 50, num_symbols=5, context_length=2, query_dim=3, num_targets=4, options=SMALL
    )
    for store in (arrays, synthetic):
        assert store.identity() == {"vocabulary": None, "embeddings": None}
        assert store.describe()["identity"] == {"vocabulary": None, "embeddings": None}


def test_an_older_store_gets_the_same_identity_computed_from_its_content(tmp_path, text_store):
    recorded = text_store.identity()
    old = forget_recorded_identity(text_store)
    assert "vocabulary_sha256" not in old.provenance and "embedding_sha256" not in old.provenance
    assert old.identity() == recorded


def test_a_table_changed_after_writing_fails_validation(text_store):
    assert validate(text_store.location).ok
    zarr.open_array(f"{text_store.location.url}/embeddings", mode="r+")[0, 0] = 42.0
    report = validate(text_store.location)
    assert [p.array for p in report.problems] == ["embeddings"]
    assert "changed after the store was written" in report.problems[0].message


# -- check_same_corpus -------------------------------------------------------------------------------


def one_line_mismatch(reference, other, **roles) -> str:
    with pytest.raises(CorpusMismatchError) as raised:
        check_same_corpus(reference, other, **roles)
    assert isinstance(raised.value, StoreError)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_text_store_ingested_separately_is_refused_naming_both_stores_and_the_fix(tmp_path, text_store):
    corpus = write_corpus(tmp_path / "b", {"two.txt": "A dog and a log; the dog sat.\n"})
    other = write_text(tmp_path / "b.zarr", [corpus], 2, vocab_size=4, dim=3, options=SMALL)
    assert other.schema == text_store.schema  # the same S: nothing but the identity tells them apart
    roles = {"reference_role": "training store", "other_role": "validation store"}
    message = one_line_mismatch(text_store, other, **roles)
    ref_hash, other_hash = text_store.identity()["vocabulary"], other.identity()["vocabulary"]
    assert ref_hash and other_hash
    for fragment in (
        f"validation store {other.location}",
        f"training store {text_store.location}",
        f"vocabularies differ ({ref_hash[:12]} vs {other_hash[:12]})",
        f"dist-respattn ingest {other.location} ... --like {text_store.location}",
        "dist-respattn split",
    ):
        assert fragment in message, (fragment, message)
    # The same check against what a checkpoint's JSON keeps of the training store.
    record = {"url": str(text_store.location), "identity": text_store.identity()}
    assert one_line_mismatch(StoreRef.from_json(record), other, **roles) == message


def test_the_same_vocabulary_with_another_table_is_a_mismatch(tmp_path, text_store):
    corpus = tmp_path / "a"
    other = write_text(tmp_path / "dim4.zarr", [corpus], 2, vocab_size=4, dim=4, options=SMALL)
    assert other.identity()["vocabulary"] == text_store.identity()["vocabulary"]
    message = one_line_mismatch(text_store, other, reference_role="the model's training store", other_role="test store")
    assert "embedding tables differ" in message and "vocabularies" not in message
    assert f"the test store {other.location} is not of the corpus of the model's training store" in message


def test_a_vocabulary_against_token_ids_of_their_own_is_a_mismatch(tmp_path, text_store):
    tokens = write_tokens(tmp_path / "t.zarr", np.arange(40) % 5, 2, dim=3, options=SMALL)
    message = one_line_mismatch(text_store, tokens, reference_role="training store", other_role="validation store")
    assert "the training store has a vocabulary and the validation store has none" in message


def test_stores_without_an_identity_and_equal_identities_pass(tmp_path, text_store):
    arrays = write_small(tmp_path / "arrays.zarr")
    roles = {"reference_role": "training store", "other_role": "validation store"}
    check_same_corpus(text_store, arrays, **roles)
    check_same_corpus(arrays, text_store, **roles)
    check_same_corpus(StoreRef.from_json({"url": "old-checkpoint"}), text_store, **roles)  # recorded before identities
    check_same_corpus(text_store, forget_recorded_identity(text_store), **roles)
    check_same_corpus(StoreRef("elsewhere.zarr", text_store.identity()), text_store, **roles)


# -- the identity is the content's ---------------------------------------------------------------------


@pytest.fixture
def stream_text_store(tmp_path) -> TokenStreamStore:
    corpus = write_corpus(tmp_path / "s", {"one.txt": "The cat sat on the mat. The cat ran.\n"})
    return write_stream_text(tmp_path / "s.zarr", [corpus], 2, vocab_size=4, dim=3, options=SMALL)


def reverse_embeddings(url: str) -> None:
    array = zarr.open_array(f"{url}/embeddings", mode="r+")
    array[...] = array[...][::-1]


def swap_two_words(url: str) -> None:
    vocabulary = zarr.open_group(f"{url}/vocabulary", mode="r+")
    tokens = list(vocabulary.attrs["tokens"])
    tokens[0], tokens[1] = tokens[1], tokens[0]
    vocabulary.attrs["tokens"] = tokens


@pytest.mark.parametrize("kind", ["triples", "stream"])
@pytest.mark.parametrize(("edit", "key"), [(reverse_embeddings, "embeddings"), (swap_two_words, "vocabulary")])
def test_an_edited_table_or_vocabulary_fails_validation_and_changes_the_identity(
    kind, edit, key, text_store, stream_text_store
):
    store = text_store if kind == "triples" else stream_text_store
    url, written = store.location.url, store.identity()
    assert validate(url).ok and store.describe()["identity_changes"] == []
    edit(url)
    edited = open_store(url)
    saved, table = edited.vocabulary(), edited.embeddings()
    assert edited.identity() == {
        "vocabulary": documented_vocabulary_hash(saved["tokens"]),
        "embeddings": documented_table_hash(table),
    }
    assert edited.identity()[key] != written[key]
    report = validate(url)
    assert [p.array for p in report.problems] == [key], report.summary()
    assert "changed after the store was written" in report.problems[0].message
    described = edited.describe()
    assert described["identity"] == edited.identity()
    assert described["identity_changes"] == [report.problems[0].message]
    # What a checkpoint recorded of the store before the edit no longer matches it: every command refuses it.
    message = one_line_mismatch(StoreRef("before.zarr", written), edited, reference_role="the model's training store",
                                other_role="store")  # fmt: skip
    assert ("vocabularies differ" if key == "vocabulary" else "embedding tables differ") in message


def test_a_store_written_like_an_edited_reference_records_what_it_copied(tmp_path, text_store):
    reverse_embeddings(text_store.location.url)
    like = write_text(tmp_path / "like.zarr", [tmp_path / "a"], None, like=text_store.location.url, options=SMALL)
    assert like.provenance["embedding_sha256"] == documented_table_hash(like.embeddings())
    assert like.identity() == open_store(text_store.location.url).identity()
    assert validate(like.location).ok
