"""Every writer, read back through the partition reader: exact rows, and what each writer keeps beside them."""

from __future__ import annotations

import hashlib
import pickle
import re
import uuid
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
import pytest

import dist_respattn.store.ingest.text as text_module
import dist_respattn.store.ingest.tokens as tokens_module
from dist_respattn.model.encoder import sequence_to_triples, sequence_windows
from dist_respattn.model.heads.single_hop.sampler import ResponsibilityAttentionSampler, random_distribution
from dist_respattn.store import (
    Partition,
    SchemaMismatchError,
    TripleStore,
    WriteOptions,
    iter_text_files,
    tokenize,
    validate,
    write_arrays,
    write_synthetic,
    write_text,
    write_tokens,
)
from tests.store.helpers import (
    CHUNK,
    PART,
    ROWS,
    SMALL,
    D,
    N,
    S,
    T,
    assert_rows,
    assert_same_rows,
    random_rows,
    read_all,
    read_blocks,
    write_small,
)

# -- arrays ------------------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True])
def test_write_arrays_in_memory_round_trips_exactly(tmp_path, weighted):
    rows = random_rows(weighted=weighted)
    store = write_small(tmp_path / "s.zarr", rows)

    assert store.num_rows == ROWS
    assert store.schema.num_symbols == S and store.schema.num_targets == T
    assert (store.schema.context_length, store.schema.query_dim) == (N, D)
    assert store.schema.has_weight is weighted
    expected = (rows["context"], rows["query"], rows["target"], rows.get("weight"))
    assert_rows(read_all(store), *expected)
    assert_rows(read_blocks(store), *expected)
    assert_rows(store.read_rows(0, ROWS), *expected)
    # A slice across a partition boundary.
    middle = store.read_rows(250, 530)
    assert middle.start == 250
    assert_rows(middle, *(None if a is None else a[250:530] for a in expected))
    assert validate(store.location).ok


def test_write_arrays_infers_s_and_t_from_the_largest_ids(tmp_path):
    rows = random_rows()
    rows["context"][17, 1] = 40
    rows["target"][3] = 20
    store = write_arrays(tmp_path / "s.zarr", rows["context"], rows["query"], rows["target"], options=SMALL)
    assert (store.schema.num_symbols, store.schema.num_targets) == (41, 21)
    assert_rows(read_all(store), rows["context"], rows["query"], rows["target"])


@pytest.mark.parametrize("weighted", [False, True])
def test_write_arrays_from_npy_files_round_trips_exactly(tmp_path, weighted):
    rows = random_rows(weighted=weighted)
    # Mixed on-disk dtypes: int16 ids and float64 queries are cast to the store's int32/float32.
    files = {}
    for name, values in rows.items():
        files[name] = tmp_path / f"{name}.npy"
        np.save(files[name], values.astype(np.int16) if name in ("context", "target") else values)
    store = write_arrays(
        tmp_path / "s.zarr",
        files["context"],
        str(files["query"]),
        files["target"],
        files.get("weight"),
        num_symbols=S,
        num_targets=T,
        options=SMALL,
    )
    assert_rows(read_all(store), rows["context"], rows["query"], rows["target"], rows.get("weight"))
    assert store.provenance["source"] == "arrays"
    assert store.provenance["files"] == {name: str(path) for name, path in files.items()}
    assert store.provenance["rows"] == ROWS


def test_write_arrays_npy_files_infer_s_and_t(tmp_path):
    rows = random_rows()
    for name in ("context", "query", "target"):
        np.save(tmp_path / f"{name}.npy", rows[name])
    store = write_arrays(
        tmp_path / "s.zarr", tmp_path / "context.npy", tmp_path / "query.npy", tmp_path / "target.npy", options=SMALL
    )
    assert store.schema.num_symbols == int(rows["context"].max()) + 1
    assert store.schema.num_targets == int(rows["target"].max()) + 1
    assert_rows(read_all(store), rows["context"], rows["query"], rows["target"])


def test_write_arrays_float64_queries_are_kept_exactly(tmp_path):
    rows = random_rows()
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, query_dtype="float64")
    store = write_small(tmp_path / "s.zarr", rows, options=options)
    assert store.schema.query_dtype == "float64"
    assert_rows(read_all(store), rows["context"], rows["query"], rows["target"], query_dtype=np.float64)
    assert validate(store.location).ok


def test_progress_is_called_with_every_row(tmp_path):
    seen = []
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, progress=seen.append)
    write_small(tmp_path / "s.zarr", options=options)
    assert sum(seen) == ROWS and all(k > 0 for k in seen)


def test_an_empty_input_makes_an_empty_valid_store(tmp_path):
    store = write_small(tmp_path / "s.zarr", random_rows(0))
    assert store.num_rows == 0 and store.partitions() == [] and store.num_partitions == 0
    assert store.read_rows(0, 0).num_rows == 0
    assert validate(store.location).ok


# -- synthetic ---------------------------------------------------------------------------------


def expected_synthetic(model, rows: int, seed: int, partition_rows: int) -> tuple[np.ndarray, ...]:
    """What the sampler draws for a fresh store: partition p from the seed (seed, p, 0)."""
    parts = []
    for p, start in enumerate(range(0, rows, partition_rows)):
        rng = np.random.default_rng([seed, p, 0])
        take = min(partition_rows, rows - start)
        parts.append(ResponsibilityAttentionSampler(model, rng).sample_arrays(take, query_dtype=np.float32))
    return tuple(np.concatenate([part[i] for part in parts]) for i in range(3))


def test_write_synthetic_keeps_the_given_model_and_follows_the_sampler(tmp_path):
    model = random_distribution(S, N, D, T, seed=5, sigma2=0.7)
    store = write_synthetic(tmp_path / "s.zarr", ROWS, model=model, seed=3, options=SMALL)

    truth = store.true_model()
    assert truth is not None
    np.testing.assert_array_equal(truth.key_means, model.key_means)
    np.testing.assert_array_equal(truth.emission, model.emission)
    np.testing.assert_array_equal(truth.position_prior, model.position_prior)
    assert truth.sigma2 == model.sigma2 == 0.7
    assert store.provenance["model"] == "given" and store.provenance["seed"] == 3

    rows = read_all(store)
    assert rows.num_rows == ROWS
    assert rows.context.min() >= 0 and rows.context.max() < S
    assert rows.target.min() >= 0 and rows.target.max() < T
    assert np.isfinite(rows.query).all()
    # S >= N: every context holds N distinct symbols.
    assert all(len(set(c)) == N for c in rows.context.tolist())
    assert_rows(rows, *expected_synthetic(model, ROWS, 3, PART))
    assert validate(store.location).ok


def test_write_synthetic_is_reproducible_and_seeded(tmp_path):
    model = random_distribution(S, N, D, T, seed=5)
    a = read_all(write_synthetic(tmp_path / "a.zarr", ROWS, model=model, seed=1, options=SMALL))
    b = read_all(write_synthetic(tmp_path / "b.zarr", ROWS, model=model, seed=1, options=SMALL))
    c = read_all(write_synthetic(tmp_path / "c.zarr", ROWS, model=model, seed=2, options=SMALL))
    assert_same_rows(a, b)
    assert not np.array_equal(a.query, c.query)


def test_write_synthetic_without_a_model_samples_a_random_head_of_that_seed(tmp_path):
    store = write_synthetic(
        tmp_path / "s.zarr",
        300,
        num_symbols=S,
        context_length=N,
        query_dim=D,
        num_targets=T,
        sigma2=0.5,
        seed=9,
        options=SMALL,
    )
    model = random_distribution(S, N, D, T, seed=9, sigma2=0.5)
    truth = store.true_model()
    assert truth is not None
    np.testing.assert_array_equal(truth.key_means, model.key_means)
    np.testing.assert_array_equal(truth.emission, model.emission)
    assert store.provenance["model"] == "random"
    assert_rows(read_all(store), *expected_synthetic(model, 300, 9, PART))


def test_write_synthetic_refuses_a_shape_the_model_does_not_have(tmp_path):
    model = random_distribution(S, N, D, T, seed=5)
    with pytest.raises(SchemaMismatchError, match=r"context_length 6 \(the model has 4\)"):
        write_synthetic(tmp_path / "s.zarr", 10, model=model, context_length=6, options=SMALL)
    assert not (tmp_path / "s.zarr").exists()


def test_a_store_of_other_rows_has_no_true_model_embeddings_or_vocabulary(tmp_path):
    store = write_small(tmp_path / "s.zarr")
    assert store.true_model() is None and store.embeddings() is None and store.vocabulary() is None


# -- tokens ------------------------------------------------------------------------------------


@pytest.fixture
def small_token_blocks(monkeypatch):
    """Cut token streams into blocks of 97 tokens, so the carry between blocks is exercised."""
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)


def token_stream(length: int, s: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, s, length)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 5])
def test_write_tokens_rows_are_the_windows_of_the_whole_stream(tmp_path, small_token_blocks, n):
    tokens = token_stream(2001, 11)
    options = WriteOptions(chunk_rows=64, partition_rows=256)
    store = write_tokens(tmp_path / "t.zarr", tokens, n, num_symbols=11, options=options)

    # L - N rows: no window lost or repeated at the 97-token block or the chunk/partition boundaries.
    assert store.num_rows == 2001 - n
    assert store.num_partitions == 8
    table = store.embeddings()
    context, query, target = sequence_windows(tokens, n, num_symbols=11, embeddings=table, query_dtype=np.float32)
    assert_rows(read_all(store), context, query, target)
    assert_rows(read_blocks(store, 50), context, query, target)
    triples = sequence_to_triples(tokens, n, num_symbols=11, embeddings=table)
    rows = read_all(store)
    assert len(triples) == rows.num_rows
    for i in (0, 96, 97, 255, 256, 1000, len(triples) - 1):
        np.testing.assert_array_equal(rows.context[i], triples[i][0])
        np.testing.assert_array_equal(rows.query[i], triples[i][1].astype(np.float32))
        assert rows.target[i] == triples[i][2]
    assert store.provenance["tokens_count"] == 2001 and store.provenance["tokens"] == "array"


def test_write_tokens_with_blocks_shorter_than_the_window(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 3)
    tokens = token_stream(400, 7, seed=1)
    store = write_tokens(tmp_path / "t.zarr", tokens, 8, options=SMALL)
    assert store.num_rows == 392
    windows = sequence_windows(tokens, 8, num_symbols=7, embeddings=store.embeddings(), query_dtype=np.float32)
    assert_rows(read_all(store), *windows)


def test_write_tokens_from_an_npy_file(tmp_path, small_token_blocks):
    tokens = token_stream(700, 20).astype(np.uint16)
    np.save(tmp_path / "tokens.npy", tokens)
    store = write_tokens(tmp_path / "t.zarr", tmp_path / "tokens.npy", 3, options=SMALL)
    assert store.schema.num_symbols == store.schema.num_targets == int(tokens.max()) + 1
    assert store.provenance["tokens"] == str(tmp_path / "tokens.npy")
    windows = sequence_windows(
        tokens, 3, num_symbols=store.schema.num_symbols, embeddings=store.embeddings(), query_dtype=np.float32
    )
    assert_rows(read_all(store), *windows)


def test_write_tokens_refuses_a_stream_no_longer_than_the_window(tmp_path):
    """It would give a store of no rows, which only a fit would then refuse: nothing is written."""
    with pytest.raises(ValueError, match=r"3 tokens in 1 document give no rows .* N \+ 1 = 4"):
        write_tokens(tmp_path / "t.zarr", np.array([1, 2, 0]), 3, options=SMALL)
    assert not (tmp_path / "t.zarr").exists()


def test_write_tokens_with_a_given_embedding_array(tmp_path, small_token_blocks):
    tokens = token_stream(600, 9)
    table = np.random.default_rng(4).standard_normal((12, 5))  # more rows than S = 9: only the first 9 are used
    store = write_tokens(tmp_path / "t.zarr", tokens, 4, num_symbols=9, embeddings=table, options=SMALL)
    np.testing.assert_array_equal(store.embeddings(), table[:9].astype(np.float32))
    assert store.schema.query_dim == 5
    assert store.provenance["embedding"] == {"kind": "file", "dim": 5}
    windows = sequence_windows(tokens, 4, num_symbols=9, embeddings=table[:9], query_dtype=np.float32)
    assert_rows(read_all(store), *windows)


def test_write_tokens_with_an_embedding_file_records_its_path_and_digest(tmp_path, small_token_blocks):
    tokens = token_stream(600, 9)
    table = np.random.default_rng(4).standard_normal((9, 6)).astype(np.float32)
    np.save(tmp_path / "E.npy", table)
    store = write_tokens(tmp_path / "t.zarr", tokens, 4, embeddings=tmp_path / "E.npy", options=SMALL)
    np.testing.assert_array_equal(store.embeddings(), table)
    info = store.provenance["embedding"]
    assert info["kind"] == "file" and info["dim"] == 6
    assert info["path"] == str(tmp_path / "E.npy")
    assert info["sha256"] == hashlib.sha256(table.tobytes()).hexdigest()
    assert_rows(read_all(store), *sequence_windows(tokens, 4, embeddings=table, query_dtype=np.float32))


def test_write_tokens_random_projection_is_seeded(tmp_path):
    tokens = token_stream(500, 30)
    a = write_tokens(tmp_path / "a.zarr", tokens, 4, dim=6, seed=7, options=SMALL)
    b = write_tokens(tmp_path / "b.zarr", tokens, 4, dim=6, seed=7, options=SMALL)
    c = write_tokens(tmp_path / "c.zarr", tokens, 4, dim=6, seed=8, options=SMALL)
    expected = (np.random.default_rng(7).standard_normal((30, 6)) / np.sqrt(6)).astype(np.float32)
    np.testing.assert_array_equal(a.embeddings(), expected)
    np.testing.assert_array_equal(b.embeddings(), expected)
    assert not np.array_equal(c.embeddings(), expected)
    assert a.provenance["embedding"] == {"kind": "random", "dim": 6, "seed": 7}
    assert_same_rows(read_all(a), read_all(b))
    assert_rows(read_all(a), *sequence_windows(tokens, 4, embeddings=expected, query_dtype=np.float32))


def test_write_tokens_small_vocabularies_get_one_hot_queries(tmp_path):
    tokens = token_stream(300, 10)
    store = write_tokens(tmp_path / "t.zarr", tokens, 2, options=SMALL)
    np.testing.assert_array_equal(store.embeddings(), np.eye(10, dtype=np.float32))
    assert store.schema.query_dim == 10
    assert store.provenance["embedding"] == {"kind": "one-hot", "dim": 10}
    rows = read_all(store)
    np.testing.assert_array_equal(rows.query, np.eye(10, dtype=np.float32)[tokens[1:-1]])
    assert_rows(rows, *sequence_windows(tokens, 2, num_symbols=10, query_dtype=np.float32))


def test_write_tokens_large_vocabularies_get_a_32_dim_projection(tmp_path):
    tokens = token_stream(400, 300)
    store = write_tokens(tmp_path / "t.zarr", tokens, 2, num_symbols=300, options=SMALL)
    assert store.embeddings().shape == (300, 32)
    assert store.provenance["embedding"] == {"kind": "random", "dim": 32, "seed": 0}


# -- text --------------------------------------------------------------------------------------

TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def make_corpus(root):
    """Three text files the writer takes from a directory (plus files and folders it must skip)."""
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "a.txt").write_text("The cat sat on the mat.\nThe dog, the cat!\n" * 3 + "A bird.\n", encoding="utf-8")
    (root / "sub" / "b.md").write_text("Hello world; hello CAT.\nThe end\n", encoding="utf-8")
    (root / "c.py").write_text("x = 1\n", encoding="utf-8")  # 3 tokens: no window of 3 fits
    (root / "skip.dat").write_text("never read\n", encoding="utf-8")
    (root / ".hidden" / "d.txt").write_text("never read\n", encoding="utf-8")
    return [str(root / "a.txt"), str(root / "c.py"), str(root / "sub" / "b.md")]


def expected_text_rows(files, n, vocab_size, table):
    """The vocabulary and rows the documented tokenizer gives, each file windowed on its own, in file order."""
    docs = [TOKEN_RE.findall(Path(f).read_text(encoding="utf-8").lower()) for f in files]
    counts = Counter(t for doc in docs for t in doc)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:vocab_size]
    lookup = {token: i for i, (token, _) in enumerate(ranked)}
    parts = [
        sequence_windows([lookup.get(t, vocab_size) for t in doc], n, embeddings=table, query_dtype=np.float32)
        for doc in docs
    ]
    rows = tuple(np.concatenate([p[i] for p in parts]) for i in range(3))
    return ranked, counts, docs, rows


def test_tokenize_lowercases_words_and_splits_punctuation():
    assert tokenize("Hello, World! it's 3.14 foo_bar\tCafé\n") == [
        "hello",
        ",",
        "world",
        "!",
        "it",
        "'",
        "s",
        "3",
        ".",
        "14",
        "foo_bar",
        "café",
    ]
    assert tokenize("  \n\t ") == []


def test_write_text_vocabulary_and_rows(tmp_path):
    files = make_corpus(tmp_path / "corpus")
    assert iter_text_files([tmp_path / "corpus"]) == files
    k, n = 6, 3
    store = write_text(tmp_path / "t.zarr", [tmp_path / "corpus"], n, vocab_size=k, options=SMALL)
    ranked, counts, docs, rows = expected_text_rows(files, n, k, store.embeddings())

    vocabulary = store.vocabulary()
    assert vocabulary is not None
    assert vocabulary["tokens"] == [t for t, _ in ranked] == ["the", "cat", ".", "!", ",", "dog"]
    assert vocabulary["counts"] == [c for _, c in ranked]
    assert vocabulary["size"] == k and vocabulary["oov_id"] == k
    assert vocabulary["total_tokens"] == sum(counts.values())
    assert vocabulary["oov_count"] == sum(counts.values()) - sum(c for _, c in ranked)
    assert vocabulary["documents"] == 3
    assert vocabulary["tokenizer"] == {"name": "words-and-punctuation", "pattern": r"\w+|[^\w\s]", "lowercase": True}

    assert store.schema.num_symbols == store.schema.num_targets == k + 1
    np.testing.assert_array_equal(store.embeddings(), np.eye(k + 1, dtype=np.float32))  # one-hot: S <= 256
    assert store.num_rows == sum(max(len(doc) - n, 0) for doc in docs)
    stored = read_all(store)
    assert_rows(stored, *rows)
    assert (stored.target == k).any() and (stored.context == k).any()  # the OOV id K is used
    assert store.provenance["files"] == 3 and store.provenance["vocab_size"] == k
    assert validate(store.location).ok


def test_write_text_feeds_a_file_in_pieces_without_changing_the_rows(tmp_path, monkeypatch):
    files = make_corpus(tmp_path / "corpus")
    whole = read_all(write_text(tmp_path / "whole.zarr", files, 4, vocab_size=5, dim=3, seed=2, options=SMALL))
    monkeypatch.setattr(text_module, "_LINES_PER_PIECE", 2)  # a.txt (7 lines) comes in 4 pieces
    store = write_text(tmp_path / "pieces.zarr", files, 4, vocab_size=5, dim=3, seed=2, options=SMALL)
    assert_same_rows(read_all(store), whole)
    expected = (np.random.default_rng(2).standard_normal((6, 3)) / np.sqrt(3)).astype(np.float32)
    np.testing.assert_array_equal(store.embeddings(), expected)
    assert_rows(read_all(store), *expected_text_rows(files, 4, 5, expected)[3])


def test_write_text_from_a_directory_a_glob_and_files_gives_the_same_store(tmp_path):
    files = make_corpus(tmp_path / "corpus")
    by_dir = write_text(tmp_path / "dir.zarr", [tmp_path / "corpus"], 2, vocab_size=8, options=SMALL)
    by_glob = write_text(
        tmp_path / "glob.zarr",
        [str(tmp_path / "corpus" / "**" / "*.md"), str(tmp_path / "corpus" / "*.txt"), files[1], files[0]],
        2,
        vocab_size=8,
        options=SMALL,
    )
    assert by_glob.provenance["files"] == 3  # a.txt named twice, taken once
    assert by_dir.vocabulary()["tokens"] == by_glob.vocabulary()["tokens"]
    assert_same_rows(read_all(by_dir), read_all(by_glob))


def test_iter_text_files_names_a_path_that_matches_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        iter_text_files([tmp_path / "nothing-here"])


# -- row order ---------------------------------------------------------------------------------


def test_row_order_target_sorts_each_partition_by_target(tmp_path):
    rows = random_rows()
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, row_order="target")
    store = write_small(tmp_path / "s.zarr", rows, options=options)
    assert store.attributes["row_order"] == "target"
    for part in store.partitions():
        got = store.read_partition(part)
        assert np.all(np.diff(got.target) >= 0), part
        # A stable permutation of the input partition's rows.
        order = np.argsort(rows["target"][part.start : part.stop], kind="stable")
        expected = (rows[k][part.start : part.stop][order] for k in ("context", "query", "target"))
        assert_rows(got, *expected)
    assert validate(store.location).ok


def test_row_order_target_for_a_synthetic_store(tmp_path):
    model = random_distribution(S, N, D, T, seed=5)
    plain = read_all(write_synthetic(tmp_path / "a.zarr", ROWS, model=model, options=SMALL))
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, row_order="target")
    store = write_synthetic(tmp_path / "b.zarr", ROWS, model=model, options=options)
    for part in store.partitions():
        got = store.read_partition(part)
        order = np.argsort(plain.target[part.start : part.stop], kind="stable")
        assert_rows(got, *(a[part.start : part.stop][order] for a in (plain.context, plain.query, plain.target)))


def test_an_unknown_row_order_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="row_order = 'random'"):
        write_small(tmp_path / "s.zarr", options=WriteOptions(row_order="random"))
    assert not (tmp_path / "s.zarr").exists()


# -- locations ---------------------------------------------------------------------------------


def test_a_memory_url_store_writes_and_reads_back():
    url = f"memory://respattn-{uuid.uuid4().hex}/s.zarr"
    fs = fsspec.filesystem("memory")
    try:
        rows = random_rows(weighted=True)
        store = write_small(url, rows)
        assert str(store.location) == url
        reopened = TripleStore.open(url)
        assert_rows(read_all(reopened), rows["context"], rows["query"], rows["target"], rows["weight"])
        assert_rows(read_blocks(reopened, 100), rows["context"], rows["query"], rows["target"], rows["weight"])
        assert validate(url).ok
        # And it pickles as its URL (same process, so the same in-memory filesystem).
        assert_same_rows(read_all(pickle.loads(pickle.dumps(reopened))), read_all(reopened))
    finally:
        fs.rm(url.removeprefix("memory://").split("/")[0], recursive=True)


def test_a_file_url_reads_a_store_written_at_a_path(tmp_path):
    rows = random_rows()
    write_small(tmp_path / "s.zarr", rows)
    url = (tmp_path / "s.zarr").as_uri()
    store = TripleStore.open(url)
    # A file:// URL is a local path by another name.
    assert str(store.location) == str(tmp_path / "s.zarr")
    assert_rows(read_all(store), rows["context"], rows["query"], rows["target"])
    assert validate(url).ok


def test_a_file_url_store_writes_and_reads_back(tmp_path):
    rows = random_rows()
    url = (tmp_path / "s.zarr").as_uri()
    store = write_small(url, rows)
    assert_rows(read_all(TripleStore.open(url)), rows["context"], rows["query"], rows["target"])
    assert validate(url).ok
    assert store.num_rows == ROWS


def test_a_file_url_store_writes_with_auto_mkdir(tmp_path):
    """The workaround for the bug above: pass fsspec's auto_mkdir=True."""
    rows = random_rows()
    url = (tmp_path / "s.zarr").as_uri()
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, storage_options={"auto_mkdir": True})
    write_small(url, rows, options=options)
    assert_rows(read_all(TripleStore.open(url)), rows["context"], rows["query"], rows["target"])


def test_a_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = write_small("rel.zarr")
    assert str(store.location) == str(tmp_path / "rel.zarr")


def test_a_store_pickles_as_its_location_and_reopens(tmp_path):
    rows = random_rows(weighted=True)
    store = write_small(tmp_path / "s.zarr", rows)
    clone = pickle.loads(pickle.dumps(store))
    assert isinstance(clone, TripleStore) and clone is not store
    assert clone.location == store.location
    assert clone.schema == store.schema and clone.num_rows == ROWS
    assert clone.fingerprint() == store.fingerprint()
    part = pickle.loads(pickle.dumps(store.partition(2)))
    assert part == Partition(2, 512, 768)
    assert_same_rows(clone.read_partition(part), store.read_partition(2))
