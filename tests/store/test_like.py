"""Writing a store ``like`` another: the reference's vocabulary, S, T, N and table, and refusals of anything else."""

from __future__ import annotations

import re

import numpy as np
import pytest

import dist_respattn.store.ingest.tokens as tokens_module
from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store import (
    SchemaMismatchError,
    TripleStore,
    WriteOptions,
    check_same_corpus,
    validate,
    write_arrays,
    write_synthetic,
    write_text,
    write_tokens,
)
from tests.store.helpers import SMALL, assert_rows, read_all, write_small

ROLES = {"reference_role": "training store", "other_role": "validation store"}


@pytest.fixture
def text_reference(tmp_path) -> TripleStore:
    corpus = tmp_path / "train"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat . the cat ran to the mat .\n", encoding="utf-8")
    return write_text(tmp_path / "train.zarr", [corpus], 3, vocab_size=5, dim=4, seed=7, options=SMALL)


@pytest.fixture
def token_reference(tmp_path) -> TripleStore:
    stream = np.random.default_rng(0).integers(0, 12, 500)
    stream[0] = 11  # S = 12
    return write_tokens(tmp_path / "tokens.zarr", stream, 4, dim=3, seed=5, options=SMALL)


def assert_same_corpus(store: TripleStore, reference: TripleStore) -> None:
    assert store.identity() == reference.identity()
    assert store.vocabulary() == reference.vocabulary()
    reference_table, table = reference.embeddings(), store.embeddings()
    if reference_table is None:
        assert table is None
    else:
        np.testing.assert_array_equal(table, reference_table)
    assert store.provenance["like"] == str(reference.location)
    check_same_corpus(reference, store, **ROLES)
    assert validate(store.location).ok


def test_text_like_a_text_store_uses_its_vocabulary_and_unknown_words_become_oov(tmp_path, text_reference):
    (tmp_path / "held-out.txt").write_text("The zebra sat on the CAT!\n", encoding="utf-8")
    store = write_text(tmp_path / "validation.zarr", [tmp_path / "held-out.txt"], None, like=text_reference)

    assert_same_corpus(store, text_reference)
    assert store.schema == text_reference.schema  # N = 3 taken from the reference
    vocabulary = text_reference.vocabulary()
    assert vocabulary is not None
    assert vocabulary["tokens"] == ["the", ".", "cat", "mat", "on"]  # by count, ties alphabetical
    lookup = {token: i for i, token in enumerate(vocabulary["tokens"])}
    oov = vocabulary["oov_id"]
    words = re.findall(r"\w+|[^\w\s]", "the zebra sat on the cat!")
    ids = [lookup.get(w, oov) for w in words]
    assert ids == [0, oov, oov, 4, 0, 2, oov]  # "zebra", "sat" and "!" are not in the train vocabulary
    expected = sequence_windows(ids, 3, embeddings=text_reference.embeddings(), query_dtype=np.float32)
    assert_rows(read_all(store), *expected)
    assert store.provenance["tokens_count"] == len(words) and store.provenance["oov_count"] == 3


def test_tokens_like_a_token_store_and_like_a_text_store(tmp_path, token_reference, text_reference):
    short = np.array([1, 2, 3, 4, 5, 6, 1, 2])  # largest id 6: S still comes from the reference
    store = write_tokens(tmp_path / "v.zarr", short, None, like=str(token_reference.location))
    assert_same_corpus(store, token_reference)
    assert store.schema.num_symbols == store.schema.num_targets == 12 and store.schema.context_length == 4
    expected = sequence_windows(short, 4, num_symbols=12, embeddings=token_reference.embeddings(), query_dtype="f4")
    assert_rows(read_all(store), *expected)

    # Ids already encoded with a text store's vocabulary: the token store carries that vocabulary.
    encoded = write_tokens(tmp_path / "encoded.zarr", np.array([0, 1, 5, 2, 3, 0]), 3, like=text_reference)
    assert_same_corpus(encoded, text_reference)


def test_token_ids_outside_the_reference_are_named_by_file_and_position(tmp_path, token_reference, monkeypatch):
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)
    stream = np.zeros(300, dtype=np.int64)
    stream[250] = 12
    np.save(tmp_path / "held-out.npy", stream)
    out = tmp_path / "v.zarr"
    with pytest.raises(ValueError, match=r"held-out\.npy\[250\] = 12: expected a token id in \[0, 12\).*--like"):
        write_tokens(out, tmp_path / "held-out.npy", None, like=token_reference)
    assert not out.exists()


def test_arrays_like_a_store_take_its_s_t_and_identity_and_must_have_its_n_and_d(tmp_path, text_reference):
    s, n, d = 6, 3, 4
    rng = np.random.default_rng(1)
    context, query, target = rng.integers(0, 3, (20, n)), rng.standard_normal((20, d)), rng.integers(0, 3, 20)
    store = write_arrays(tmp_path / "a.zarr", context, query, target, like=text_reference)
    assert (store.schema.num_symbols, store.schema.num_targets) == (s, s)  # not the largest ids + 1
    assert_same_corpus(store, text_reference)
    np.save(tmp_path / "wide.npy", rng.standard_normal((20, d + 1)))
    with pytest.raises(SchemaMismatchError, match=r"wide\.npy: query has D = 5, but --like .* has D = 4"):
        write_arrays(tmp_path / "b.zarr", context, tmp_path / "wide.npy", target, like=text_reference)
    with pytest.raises(SchemaMismatchError, match=r"context: context has N = 2, but --like .* has N = 3"):
        write_arrays(tmp_path / "c.zarr", context[:, :2], query, target, like=text_reference)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"context_length": 5}, "--context 5"),
        ({"vocab_size": 9}, "--vocab-size 9"),
        ({"dim": 5}, "--dim 5"),
        ({"seed": 8}, "--seed 8"),
    ],
)
def test_text_options_that_conflict_with_the_reference_are_refused(tmp_path, text_reference, kwargs, flag):
    (tmp_path / "v.txt").write_text("the cat\n", encoding="utf-8")
    arguments = {"context_length": None, **kwargs}
    out = tmp_path / "v.zarr"
    with pytest.raises(ValueError, match=f"^--like {re.escape(str(text_reference.location))}: {flag} .*omit"):
        write_text(out, [tmp_path / "v.txt"], arguments.pop("context_length"), like=text_reference, **arguments)
    assert not out.exists()


def test_token_and_array_options_that_conflict_are_refused_and_equal_ones_accepted(tmp_path, token_reference):
    stream = np.arange(30) % 12
    other_table = np.ones((12, 3), dtype=np.float32)
    for kwargs, flag in (
        ({"num_symbols": 13}, "--symbols 13"),
        ({"embeddings": other_table}, "--embeddings array"),
        ({"seed": 6}, "--seed 6"),
        ({"dim": 2}, "--dim 2"),
    ):
        with pytest.raises(ValueError, match=f": {flag} "):
            write_tokens(tmp_path / "x.zarr", stream, None, like=token_reference, **kwargs)
    same = {"num_symbols": 12, "dim": 3, "seed": 5}  # what the reference was made with
    store = write_tokens(tmp_path / "same.zarr", stream, 4, like=token_reference, **same)
    assert store.identity() == token_reference.identity()
    table = token_reference.embeddings()
    store = write_tokens(tmp_path / "file.zarr", stream, 4, like=token_reference, embeddings=table)
    assert store.identity() == token_reference.identity()
    rows = np.zeros((5, 4), dtype=np.int64), np.zeros((5, 3)), np.zeros(5, dtype=np.int64)
    with pytest.raises(ValueError, match=": --targets 3 "):
        write_arrays(tmp_path / "x.zarr", *rows, num_targets=3, like=token_reference)


def test_like_is_refused_with_append_and_for_a_reference_without_what_it_needs(tmp_path, token_reference):
    (tmp_path / "v.txt").write_text("the cat\n", encoding="utf-8")
    appending = WriteOptions(append=True)
    with pytest.raises(ValueError, match=r"like= \(--like\) and append=True \(--append\) exclude each other"):
        write_tokens(token_reference.location.url, np.arange(12), None, like=token_reference, options=appending)
    with pytest.raises(ValueError, match="has no vocabulary"):
        write_text(tmp_path / "v.zarr", [tmp_path / "v.txt"], None, like=token_reference)
    synthetic = write_synthetic(
        tmp_path / "s.zarr", 20, num_symbols=5, context_length=2, query_dim=3, num_targets=5, options=SMALL
    )
    with pytest.raises(ValueError, match="has no embedding table"):
        write_tokens(tmp_path / "t.zarr", np.arange(5), None, like=synthetic)
    arrays = write_small(tmp_path / "arrays.zarr")
    store = write_small(tmp_path / "like-arrays.zarr", like=arrays)  # nothing to copy, and nothing differs
    assert store.identity() == {"vocabulary": None, "embeddings": None}
    assert store.provenance["like"] == str(arrays.location)
