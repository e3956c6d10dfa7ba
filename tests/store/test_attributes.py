"""Row attributes (who wrote each row): an id in [0, A) per row, with A names, in both kinds of store.

A stream store keeps one per document (``document_attribute``) or per token (``token_attribute``), a triple
store one per row (``attribute``); ``read_attributes`` gives exactly the rows the row readers give, for any
window and short history, and checks every id it reads. Names merge under ``--like`` and ``--append`` (the
reference's ids kept, new names after them), and ``split`` gives its three stores the same names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

import dist_respattn.store.ingest.tokens as tokens_module
from dist_respattn.store import (
    StoreError,
    StoreWriter,
    TextCorpus,
    TokenCorpus,
    TripleStore,
    WriteOptions,
    rollback_append,
    validate,
    write_arrays,
    write_split,
    write_text,
    write_tokens,
)
from dist_respattn.store.attributes import merge_names
from dist_respattn.store.errors import SchemaMismatchError, StoreCorruptError
from dist_respattn.store.ingest.tables import embedding_table
from dist_respattn.store.ingest.to_stream import write_stream_text, write_stream_tokens
from dist_respattn.store.streams.reader import TokenStreamStore
from dist_respattn.store.streams.rollback import rollback_stream_append
from dist_respattn.store.streams.validation import validate_stream
from dist_respattn.store.streams.writer import StreamWriter
from tests.store.helpers import as_if_killed
from tests.test_cli_store import assert_error, parse_json, run_many

S = 23
LAYOUT = WriteOptions(chunk_rows=32, partition_rows=96)  # several shards, so reads cross their boundaries
NAMES = ("austen", "bronte", "carroll", "dickens")


def stream(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, S, length)


def targets(starts: np.ndarray, num_tokens: int, min_context: int) -> np.ndarray:
    """The target token of every row, in row order: each document's tokens after its first ``min_context``."""
    ends = np.append(starts[1:], num_tokens)
    return np.concatenate([np.arange(a + min_context, b) for a, b in zip(starts, ends, strict=True)])


def assert_reads_match(store: TokenStreamStore, tokens: np.ndarray, expected_by_position: np.ndarray) -> None:
    """``read_attributes`` equals the attribute of each row's target, for the ranges, selections and windows the
    row readers take, and lines up with the targets they return."""
    starts = store.document_starts()
    rng = np.random.default_rng(7)
    for n, min_context in ((store.schema.context_length, None), (2, None), (5, 1), (1, None)):
        view = store.with_context(n, min_context)
        pos = targets(starts, store.num_tokens, view.min_context)
        assert view.num_rows == pos.size
        expected = expected_by_position[pos]
        np.testing.assert_array_equal(view.read_attributes(0, view.num_rows), expected)
        ranges = [r for p in range(view.num_partitions) for r in view.block_ranges(p)] + [(5, 77), (40, 41), (9, 9)]
        for start, stop in ranges:
            got = view.read_attributes(start, stop)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, expected[start:stop])
            selected = rng.random(stop - start) < 0.4
            chosen = view.read_attributes(start, stop, selected)
            np.testing.assert_array_equal(chosen, expected[start:stop][selected])
            windows = view.read_windows(start, stop, selected)  # the same rows, in the same order
            np.testing.assert_array_equal(windows.target, tokens[pos[start:stop][selected]])
            if not view.short_histories:
                rows = view.read_selected(start, stop, selected)
                np.testing.assert_array_equal(rows.target, tokens[pos[start:stop][selected]])


# -- token-stream stores -----------------------------------------------------------------------------------


def write_per_document(path: Path, tokens: np.ndarray, starts: np.ndarray, ids: np.ndarray) -> TokenStreamStore:
    table, _ = embedding_table(S, dim=4, seed=0)
    with StreamWriter(path, num_symbols=S, table=table, context_length=3, chunk_tokens=32, partition_tokens=96,
                      attribute_names=NAMES, attribute_level="document") as writer:  # fmt: skip
        for k, (a, b) in enumerate(zip(starts, [*starts[1:], tokens.size], strict=True)):
            writer.start_document(attribute=int(ids[k]))
            for piece in np.array_split(tokens[a:b], 3):  # a document written in pieces is still one
                writer.write(piece)
        return writer.close()


def test_a_stream_store_with_an_attribute_per_document_reads_each_rows_documents(tmp_path):
    tokens = stream(0, 700)
    starts = np.array([0, 3, 90, 95, 300, 301, 520])  # short documents give no rows at N = 3
    ids = np.array([3, 0, 2, 2, 1, 0, 3])
    store = write_per_document(tmp_path / "doc.zarr", tokens, starts, ids)
    assert store.attribute_names == NAMES and store.attribute_level == "document"
    np.testing.assert_array_equal(store.document_attributes(), ids)
    by_position = np.repeat(ids, np.diff(np.append(starts, tokens.size)))
    assert_reads_match(TokenStreamStore.open(tmp_path / "doc.zarr"), tokens, by_position)
    # Each row's document, and the tokens themselves, for callers that work per document.
    pos = targets(starts, tokens.size, 3)
    document_of = np.repeat(np.arange(starts.size), np.diff(np.append(starts, tokens.size)))
    np.testing.assert_array_equal(store.read_documents(10, 300), document_of[pos[10:300]])
    np.testing.assert_array_equal(store.read_tokens(90, 200), tokens[90:200])
    with pytest.raises(StoreError, match="does not record each row's document"):
        write_arrays(tmp_path / "t.zarr", np.zeros((3, 2), int), np.zeros((3, 2)), np.zeros(3, int)).read_documents(
            0, 3
        )
    described = store.describe()
    assert described["attributes"] == 4 and described["attribute_names"] == list(NAMES)
    assert described["attribute_level"] == "document" and "document_attribute" in described["arrays"]
    assert validate(tmp_path / "doc.zarr").ok


def test_a_stream_store_with_an_attribute_per_token_reads_each_rows_target(tmp_path):
    tokens = stream(1, 650)
    ids = np.random.default_rng(2).integers(0, 4, 650)
    starts = np.array([0, 200, 204, 410])
    store = write_stream_tokens(tmp_path / "tok.zarr", tokens, 3, num_symbols=S, documents=starts, attributes=ids,
                                attribute_names=list(NAMES), options=LAYOUT)  # fmt: skip
    assert store.attribute_names == NAMES and store.attribute_level == "token"
    assert store.document_attributes() is None  # a document's tokens may differ: no one id is the document's
    assert_reads_match(store, tokens, ids)
    array = zarr.open_array(str(tmp_path / "tok.zarr" / "token_attribute"), mode="r")
    assert array.dtype == np.int32 and array.chunks == (32,) and array.shards == (96,)
    assert validate(tmp_path / "tok.zarr").ok


def test_a_store_without_attributes_is_unchanged_and_says_so(tmp_path):
    store = write_stream_tokens(tmp_path / "plain.zarr", stream(0, 100), 3, num_symbols=S)
    assert store.attribute_names is None and store.document_attributes() is None
    assert "attributes" not in store.describe()
    assert "attribute_names" not in zarr.open_group(str(tmp_path / "plain.zarr")).attrs["dist_respattn"]
    with pytest.raises(StoreError, match=r"plain\.zarr: has no attributes .*--attribute-by"):
        store.read_attributes(0, 5)
    triples = write_arrays(tmp_path / "t.zarr", np.zeros((5, 2), int), np.zeros((5, 2)), np.zeros(5, int))
    assert triples.attribute_names is None and "attribute" not in triples.describe()["arrays"]
    with pytest.raises(StoreError, match=r"t\.zarr: has no attributes"):
        triples.read_attributes(0, 5)


def test_the_writer_refuses_mixed_or_missing_attributes(tmp_path):
    table, _ = embedding_table(S, dim=4, seed=0)
    common = {"num_symbols": S, "table": table, "context_length": 2}
    with StreamWriter(tmp_path / "d.zarr", attribute_names=NAMES, **common) as writer:
        with pytest.raises(ValueError, match=r"attribute per document: begin .* start_document\(attribute=ID\)"):
            writer.write(np.arange(5))
        with pytest.raises(ValueError, match=r"start_document\(attribute=...\) = 4: expected an attribute id in"):
            writer.start_document(attribute=4)
        writer.start_document(attribute=1)
        with pytest.raises(ValueError, match="attribute per document: give it to start_document"):
            writer.write(np.arange(5), attribute=np.zeros(5, int))
        writer.abort()
    with StreamWriter(tmp_path / "t.zarr", attribute_names=NAMES, attribute_level="token", **common) as writer:
        with pytest.raises(ValueError, match="attribute per token: give them to write"):
            writer.start_document(attribute=0)
        with pytest.raises(ValueError, match=r"expected write\(tokens, attribute=IDS\)"):
            writer.write(np.arange(5))
        with pytest.raises(ValueError, match=r"write\(attribute=...\)\[2\] \(token 2\) = 7: expected an attribute id"):
            writer.write(np.arange(4), attribute=np.array([0, 1, 7, 0]))
        writer.abort()
    with StreamWriter(tmp_path / "n.zarr", **common) as writer:
        with pytest.raises(ValueError, match="has no attributes"):
            writer.start_document(attribute=0)
        writer.abort()
    with pytest.raises(ValueError, match="names 'a' twice"):
        StreamWriter(tmp_path / "x.zarr", attribute_names=["a", "b", "a"], **common)
    assert sorted(os.listdir(tmp_path)) == []  # aborted writers leave nothing


# -- triple stores -----------------------------------------------------------------------------------------


def test_a_triple_store_keeps_an_attribute_per_row(tmp_path):
    rng = np.random.default_rng(3)
    n = 500
    context, query, target = rng.integers(0, 9, (n, 3)), rng.standard_normal((n, 2)), rng.integers(0, 9, n)
    ids = rng.integers(0, 4, n)
    (tmp_path / "names.txt").write_text("\n".join(NAMES) + "\n", encoding="utf-8")
    store = write_arrays(tmp_path / "t.zarr", context, query, target, attributes=ids,
                         attribute_names=tmp_path / "names.txt", options=LAYOUT)  # fmt: skip
    assert store.attribute_names == NAMES and store.describe()["attributes"] == 4
    array = zarr.open_array(str(tmp_path / "t.zarr" / "attribute"), mode="r")
    assert array.dtype == np.int32 and array.chunks == (32,) and array.shards == (96,)
    np.testing.assert_array_equal(store.read_attributes(0, n), ids)
    selected = rng.random(150) < 0.3
    np.testing.assert_array_equal(store.read_attributes(90, 240, selected), ids[90:240][selected])
    np.testing.assert_array_equal(store.read_selected(90, 240, selected).target, target[90:240][selected])
    assert store.read_attributes(7, 7).shape == (0,)
    assert validate(tmp_path / "t.zarr").ok


def test_windows_sorted_by_target_keep_their_target_tokens_attribute(tmp_path):
    tokens = stream(4, 900)
    store = write_tokens(tmp_path / "t.zarr", tokens, 3, num_symbols=S, documents=np.array([0, 300, 302, 610]),
                         attributes=tokens % 4, options=WriteOptions(chunk_rows=32, partition_rows=96,
                                                                     row_order="target"))  # fmt: skip
    rows = store.read_rows(0, store.num_rows)
    np.testing.assert_array_equal(store.read_attributes(0, store.num_rows), rows.target % 4)
    assert store.attribute_names == ("0", "1", "2", "3")


# -- text --------------------------------------------------------------------------------------------------


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for key, text in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(text, encoding="utf-8")
    return root


WORDS = "one two three four five six seven eight nine ten".split()


def tree_texts(keys: list[str], seed: int = 0) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    return {key: " ".join(rng.choice(WORDS, 30 + 3 * i)) + "\n" for i, key in enumerate(keys)}


def test_text_attributes_by_file_and_by_directory_in_both_formats(tmp_path):
    keys = ["top.txt", "email/a.txt", "email/mime/b.txt", "email/mime/c.txt", "json/d.txt", "empty/e.txt"]
    texts = tree_texts(keys)
    texts["empty/e.txt"] = ""  # no tokens: no document, but its directory still has a name
    root = make_tree(tmp_path / "corpus", texts)
    by_dir = write_stream_text(tmp_path / "d.zarr", [root], 2, attribute_by="directory", options=LAYOUT)
    assert by_dir.attribute_names == (".", "email", "email/mime", "empty", "json")
    # Documents in path order (the empty file has none): email/a, email/mime/b, email/mime/c, json/d, top.
    np.testing.assert_array_equal(by_dir.document_attributes(), [1, 2, 2, 4, 0])
    by_file = write_text(tmp_path / "f.zarr", [root], 2, attribute_by="file", options=LAYOUT)
    assert by_file.attribute_names == tuple(sorted(keys))
    rows_per_file = [len(texts[k].split()) - 2 for k in sorted(keys) if texts[k]]
    ids_per_file = [sorted(keys).index(k) for k in sorted(keys) if texts[k]]
    np.testing.assert_array_equal(by_file.read_attributes(0, by_file.num_rows), np.repeat(ids_per_file, rows_per_file))
    assert by_file.provenance["attributes"] == {"by": "file", "names": 6, "new": 6}
    assert validate(tmp_path / "d.zarr").ok and validate(tmp_path / "f.zarr").ok


def test_like_keeps_the_reference_names_ids_and_appends_new_ones(tmp_path):
    train = make_tree(tmp_path / "train", tree_texts(["a/1.txt", "c/2.txt", "b/3.txt"]))
    held = make_tree(tmp_path / "held", tree_texts(["c/4.txt", "d/5.txt", "a/6.txt", "0/7.txt"], seed=1))
    reference = write_stream_text(tmp_path / "train.zarr", [train], 2, attribute_by="directory")
    assert reference.attribute_names == ("a", "b", "c")
    store = write_stream_text(tmp_path / "held.zarr", [held], None, like=reference, attribute_by="directory")
    assert store.attribute_names == ("a", "b", "c", "0", "d")  # kept, then the new ones sorted
    np.testing.assert_array_equal(store.document_attributes(), [3, 0, 2, 4])  # 0/7, a/6, c/4, d/5
    assert store.provenance["attributes"]["new"] == 2
    plain = write_stream_text(tmp_path / "plain.zarr", [held], None, like=reference)  # none asked: none kept
    assert plain.attribute_names is None
    own = write_text(tmp_path / "own.zarr", [train], 2, like=write_text(tmp_path / "p.zarr", [train], 2),
                     attribute_by="directory")  # fmt: skip
    assert own.attribute_names == ("a", "b", "c")  # like a store without names: its own
    assert merge_names(("x",), ("y", "x")).remap.tolist() == [1, 0]


def test_an_append_merges_names_commits_them_with_the_rows_and_refuses_missing_ones(tmp_path, monkeypatch):
    first = make_tree(tmp_path / "first", tree_texts(["b/1.txt", "a/2.txt"]))
    more = make_tree(tmp_path / "more", tree_texts(["z/3.txt", "b/4.txt"], seed=2))
    path = tmp_path / "s.zarr"
    write_stream_text(path, [first], 2, attribute_by="directory", options=LAYOUT)
    before = TokenStreamStore.open(path)
    with pytest.raises(ValueError, match=r"s\.zarr: its rows carry an attribute .*--attribute-by"):
        write_stream_text(path, [more], None, options=WriteOptions(append=True))
    assert TokenStreamStore.open(path).fingerprint() == before.fingerprint()
    appended = write_stream_text(path, [more], None, attribute_by="directory", options=WriteOptions(append=True))
    assert appended.attribute_names == ("a", "b", "z")
    np.testing.assert_array_equal(appended.document_attributes(), [0, 1, 1, 2])  # a/2, b/1 | b/4, z/3
    assert validate_stream(path)[0] == []

    # A per-token store: a failed append (a bad id after its first shards were written) leaves it as it was.
    tokens_path = tmp_path / "t.zarr"
    write_stream_tokens(tokens_path, stream(0, 300), 3, num_symbols=S, attributes=np.zeros(300, int),
                        attribute_names=["x"], options=LAYOUT)  # fmt: skip
    kept = TokenStreamStore.open(tokens_path)
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)
    bad = stream(1, 400)
    bad[350] = S
    with pytest.raises(ValueError, match=r"\[350\] = 23: expected a token id"):
        write_stream_tokens(tokens_path, bad, None, attributes=np.ones(400, int), attribute_names=["x", "y"],
                            options=WriteOptions(append=True))  # fmt: skip
    after = TokenStreamStore.open(tokens_path)
    assert after.fingerprint() == kept.fingerprint() and after.attribute_names == ("x",)
    assert zarr.open_array(str(tokens_path / "token_attribute"), mode="r").shape == (300,)
    # Names merge per token too.
    good = write_stream_tokens(tokens_path, stream(2, 50), None, attributes=np.array([1, 0] * 25),
                               attribute_names=["y", "x"], options=WriteOptions(append=True))  # fmt: skip
    assert good.attribute_names == ("x", "y")
    pos = targets(good.document_starts(), good.num_tokens, 3)
    np.testing.assert_array_equal(good.read_attributes(0, good.num_rows), np.r_[np.zeros(300), [0, 1] * 25][pos])
    assert validate_stream(tokens_path)[0] == []
    # Text appended to a per-token store (of a text store's vocabulary) gives each token its file's id.
    words = tmp_path / "words.zarr"
    write_stream_tokens(words, stream(3, 20) % 5, None, like=path, attributes=np.zeros(20, int),
                        attribute_names=["z"])  # fmt: skip
    texts = write_stream_text(words, [more], None, attribute_by="directory", options=WriteOptions(append=True))
    assert texts.attribute_names == ("a", "b", "z") and texts.attribute_level == "token"  # like's names: z is 2
    starts = texts.document_starts()
    by_position = np.repeat([2, 1, 2], np.diff(np.append(starts, texts.num_tokens)))  # the tokens | b/4 | z/3
    np.testing.assert_array_equal(
        texts.read_attributes(0, texts.num_rows), by_position[targets(starts, texts.num_tokens, 2)]
    )
    assert validate_stream(words)[0] == []

    # A store without attributes takes none.
    plain = tmp_path / "plain.zarr"
    write_stream_tokens(plain, stream(0, 100), 3, num_symbols=S)
    with pytest.raises(ValueError, match=r"plain\.zarr: its rows carry no attributes.*drop --attribute-by"):
        write_stream_tokens(
            plain, stream(0, 100), None, attributes=np.zeros(100, int), options=WriteOptions(append=True)
        )
    # Triple stores merge and refuse alike.
    triples = tmp_path / "t3.zarr"
    write_text(triples, [first], 2, attribute_by="directory")
    merged = write_text(triples, [more], 2, attribute_by="directory", options=WriteOptions(append=True))
    assert merged.attribute_names == ("a", "b", "z") and validate(triples).ok
    with pytest.raises(ValueError, match="--attribute-by"):
        write_text(triples, [more], 2, options=WriteOptions(append=True))
    with pytest.raises(SchemaMismatchError, match="attribute per document, and --attributes"):
        write_stream_tokens(path, stream(0, 50), None, attributes=np.zeros(50, int), options=WriteOptions(append=True))


def test_an_interrupted_append_with_new_names_is_repaired_to_the_committed_names_and_ids(tmp_path):
    tokens_path, doc_path = tmp_path / "t.zarr", tmp_path / "d.zarr"
    write_stream_tokens(tokens_path, stream(0, 300), 3, num_symbols=S, attributes=np.zeros(300, int),
                        attribute_names=["x"], options=LAYOUT)  # fmt: skip
    write_per_document(doc_path, stream(1, 300), np.array([0, 150]), np.array([2, 1]))
    for path, write in (
        (tokens_path, lambda w: w.write(stream(2, 400), attribute=np.ones(400, int))),
        (doc_path, lambda w: (w.start_document(attribute=4), w.write(stream(2, 400)))),
    ):
        before = TokenStreamStore.open(path)
        writer = StreamWriter.append(path, weighted=False, attribute_names=(*before.attribute_names, "new"))
        write(writer)  # whole shards are written, the store still marked appending
        as_if_killed(writer._lock)  # never closed nor aborted: as if the process died here
        del writer
        assert rollback_stream_append(path) == 300
        after = TokenStreamStore.open(path)
        assert after.fingerprint() == before.fingerprint() and after.attribute_names == before.attribute_names
        np.testing.assert_array_equal(
            after.read_attributes(0, after.num_rows), before.read_attributes(0, before.num_rows)
        )
        assert validate_stream(path)[0] == []
    triples = tmp_path / "tr.zarr"
    zeros = np.zeros((100, 2), int), np.zeros((100, 2)), np.zeros(100, int)
    write_arrays(triples, *zeros, attributes=np.zeros(100, int), options=LAYOUT)
    schema = TripleStore.open(triples).schema
    writer = StoreWriter.append(triples, schema, attribute_names=("0", "1"))
    writer.write(np.zeros((200, 2), int), np.zeros((200, 2)), np.zeros(200, int), attribute=np.ones(200, int))
    as_if_killed(writer._lock)
    del writer
    assert rollback_append(triples) == 100
    store = TripleStore.open(triples)
    assert store.attribute_names == ("0",) and validate(triples).ok
    assert zarr.open_array(str(triples / "attribute"), mode="r").shape == (100,)


# -- bad ids -----------------------------------------------------------------------------------------------


def test_bad_attribute_files_are_named_with_their_row_and_flag(tmp_path):
    tokens = stream(0, 60)
    np.save(tmp_path / "tokens.npy", tokens)
    cases = {
        "float.npy": (np.zeros(60), r"--attributes .*float\.npy: shape \(60,\), dtype float64: expected \(60,\) "
                                    r"integer attribute ids, one per token"),
        "short.npy": (np.zeros(59, int), r"--attributes .*short\.npy: shape \(59,\).*expected \(60,\)"),
        "negative.npy": (np.r_[np.zeros(40, int), -1, np.zeros(19, int)], r"--attributes .*negative\.npy\[40\] = -1"),
        "over.npy": (np.r_[np.zeros(12, int), 4, np.zeros(47, int)],
                     r"--attributes .*over\.npy\[12\] = 4: expected an attribute id in \[0, 4\) \(the 4 names of "
                     r"--attribute-names .*names\.txt\)"),
    }  # fmt: skip
    (tmp_path / "names.txt").write_text("\n".join(NAMES) + "\n", encoding="utf-8")
    for file, (values, message) in cases.items():
        np.save(tmp_path / file, values)
        with pytest.raises(ValueError, match=message):
            write_stream_tokens(tmp_path / "s.zarr", tmp_path / "tokens.npy", 2, attributes=tmp_path / file,
                                attribute_names=tmp_path / "names.txt")  # fmt: skip
    # Without names, A is the largest id + 1, bounded before any name is made: one stray id is no 10^7 names.
    stray = np.r_[np.zeros(30, int), 10**7, np.zeros(29, int)]
    with pytest.raises(
        ValueError,
        match=r"\[30\] = 10000000: expected an attribute id in \[0, 100000\) \(ids without "
        r"--attribute-names go up to 99,999; for more, name them all with --attribute-names",
    ):
        write_stream_tokens(tmp_path / "s.zarr", tokens, 2, attributes=stray)
    with pytest.raises(ValueError, match=r"\[2\] = 100000: expected an attribute id in \[0, 100000\)"):
        write_arrays(tmp_path / "a.zarr", np.zeros((3, 2), int), np.zeros((3, 2)), np.zeros(3, int),
                     attributes=np.array([0, 1, 100_000]))  # fmt: skip
    (tmp_path / "twice.txt").write_text("a\nb\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--attribute-names .*twice\.txt: line 3 \(id 2\) repeats 'a' of line 1"):
        write_arrays(tmp_path / "a.zarr", np.zeros((3, 2), int), np.zeros((3, 2)), np.zeros(3, int),
                     attributes=np.zeros(3, int), attribute_names=tmp_path / "twice.txt")  # fmt: skip
    assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "a.zarr").exists()


def test_a_corrupted_attribute_is_named_when_read_and_by_validate(tmp_path):
    tokens = stream(5, 400)
    write_stream_tokens(tmp_path / "tok.zarr", tokens, 3, num_symbols=S, attributes=tokens % 3, options=LAYOUT)
    zarr.open_array(str(tmp_path / "tok.zarr" / "token_attribute"), mode="r+")[200] = 7
    store = TokenStreamStore.open(tmp_path / "tok.zarr")
    with pytest.raises(StoreCorruptError, match=r"tok\.zarr: array 'token_attribute' chunk 6, position 200 \(row 197\) "
                                                r"= 7: expected an attribute id in \[0, 3\)"):  # fmt: skip
        store.read_attributes(150, 250)
    np.testing.assert_array_equal(store.read_attributes(0, 150), (tokens % 3)[3:153])  # the rest still reads
    found = validate(tmp_path / "tok.zarr").problems
    assert [(p.array, p.chunk, p.row) for p in found] == [("token_attribute", 6, 200)], found

    ids = np.array([0, 1, 2, 3])
    write_per_document(tmp_path / "doc.zarr", tokens, np.array([0, 100, 200, 300]), ids)
    zarr.open_array(str(tmp_path / "doc.zarr" / "document_attribute"), mode="r+")[2] = -3
    store = TokenStreamStore.open(tmp_path / "doc.zarr")
    with pytest.raises(StoreCorruptError, match=r"array 'document_attribute' chunk 0, document 2 \(row 194\) = -3"):
        store.read_attributes(0, store.num_rows)
    with pytest.raises(StoreCorruptError, match="document 2 = -3"):
        store.document_attributes()
    found = validate(tmp_path / "doc.zarr").problems
    assert [(p.array, p.row) for p in found] == [("document_attribute", 2)], found

    write_arrays(tmp_path / "t.zarr", np.zeros((300, 2), int), np.zeros((300, 2)), np.zeros(300, int),
                 attributes=np.zeros(300, int), options=LAYOUT)  # fmt: skip
    zarr.open_array(str(tmp_path / "t.zarr" / "attribute"), mode="r+")[130] = 1
    triples = TripleStore.open(tmp_path / "t.zarr")
    with pytest.raises(StoreCorruptError, match=r"t\.zarr: array 'attribute' chunk 4, row 130 = 1: expected an "
                                                r"attribute id in \[0, 1\)"):  # fmt: skip
        triples.read_attributes(100, 200)
    found = validate(tmp_path / "t.zarr").problems
    assert [(p.array, p.chunk, p.row) for p in found] == [("attribute", 4, 130)], found
    (tmp_path / "t.zarr" / "attribute" / "c" / "1").unlink()
    with pytest.raises(StoreCorruptError, match=r"array 'attribute' partition 1 .* is missing"):
        TripleStore.open(tmp_path / "t.zarr").read_attributes(0, 200)


# -- split -------------------------------------------------------------------------------------------------


def test_split_gives_every_store_the_same_names_and_each_row_its_own(tmp_path):
    # Each directory writes its own words, so a row's target word tells its attribute.
    rng = np.random.default_rng(6)
    vocab = {"left": WORDS[:5], "right": WORDS[5:], ".": ["eleven", "twelve"]}
    files = {}
    for i in range(18):
        folder = list(vocab)[i % 3]
        key = f"{folder}/f{i:02d}.txt" if folder != "." else f"f{i:02d}.txt"
        files[key] = " ".join(rng.choice(vocab[folder], 25)) + "\n"
    root = make_tree(tmp_path / "corpus", files)
    options = WriteOptions(chunk_rows=64, partition_rows=128)
    stores = write_split(tmp_path / "out", TextCorpus([root], attribute_by="directory"), 2, fractions=(0.5, 0.25, 0.25),
                         vocab_size=20, options=options, store_format="triples")  # fmt: skip
    for store in stores.values():
        assert store.attribute_names == (".", "left", "right")
        words = store.vocabulary()["tokens"]
        rows = store.read_rows(0, store.num_rows)
        owner = {w: k for k, folder in enumerate((".", "left", "right")) for w in vocab[folder]}
        np.testing.assert_array_equal(store.read_attributes(0, store.num_rows), [owner[words[t]] for t in rows.target])
        assert validate(store.location).ok

    tokens = stream(7, 3000)
    stores = write_split(tmp_path / "tok", TokenCorpus(tokens, block_tokens=100, attributes=tokens % 4,
                                                       attribute_names=list(NAMES)), 3, options=options,
                         store_format="triples")  # fmt: skip
    for store in stores.values():
        assert store.attribute_names == NAMES
        target = store.read_rows(0, store.num_rows).target
        np.testing.assert_array_equal(store.read_attributes(0, store.num_rows), target % 4)


# -- the command line --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ingest_and_split_on_the_command_line(tmp_path):
    root = make_tree(tmp_path / "corpus", tree_texts(["top.txt", "email/a.txt", "email/mime/b.txt", "json/c.txt"]))
    more = make_tree(tmp_path / "more", tree_texts(["json/d.txt", "xml/e.txt"], seed=3))
    tokens = stream(0, 200)
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "ids.npy", tokens % 3)
    np.save(tmp_path / "bad.npy", np.r_[tokens[:150] % 3, -2, tokens[151:] % 3])
    (tmp_path / "names.txt").write_text("red\ngreen\nblue\n", encoding="utf-8")
    out = {name: str(tmp_path / f"{name}.zarr") for name in ("dir", "file", "tok", "arr", "bad", "misplaced")}
    np.save(tmp_path / "c.npy", np.zeros((10, 2), int))
    np.save(tmp_path / "q.npy", np.zeros((10, 2)))
    np.save(tmp_path / "t.npy", np.zeros(10, int))
    np.save(tmp_path / "a.npy", np.arange(10) % 2)
    np.save(tmp_path / "stray.npy", np.r_[tokens[:99] % 3, 10**9, tokens[100:] % 3])
    ran = run_many(
        ("ingest", out["dir"], "--text", str(root), "--context", "2", "--attribute-by", "directory", "--json"),
        ("ingest", out["file"], "--text", str(root), "--context", "2", "--attribute-by", "file", "--format",
         "triples", "--json"),
        ("ingest", out["tok"], "--tokens", str(tmp_path / "tokens.npy"), "--context", "2", "--attributes",
         str(tmp_path / "ids.npy"), "--attribute-names", str(tmp_path / "names.txt"), "--json"),
        ("ingest", out["arr"], "--arrays", *(str(tmp_path / f) for f in ("c.npy", "q.npy", "t.npy")),
         "--attributes", str(tmp_path / "a.npy"), "--json"),
        ("ingest", out["bad"], "--tokens", str(tmp_path / "tokens.npy"), "--context", "2", "--attributes",
         str(tmp_path / "bad.npy")),
        ("ingest", out["misplaced"], "--text", str(root), "--context", "2", "--attributes", str(tmp_path / "a.npy")),
        ("split", str(tmp_path / "split"), "--text", str(root), str(more), "--context", "2", "--attribute-by",
         "directory", "--fractions", "0.5", "0.25", "0.25", "--json"),
        ("ingest", str(tmp_path / "stray.zarr"), "--tokens", str(tmp_path / "tokens.npy"), "--context", "2",
         "--attributes", str(tmp_path / "stray.npy")),
    )  # fmt: skip
    by_dir, by_file, tok, arr = (parse_json(r) for r in ran[:4])
    assert (by_dir["attributes"], by_dir["attribute_level"]) == (4, "document")
    assert by_dir["attribute_names"] == [".", "email", "email/mime", "json"] and "attributes_added" not in by_dir
    assert by_file["attributes"] == 4 and by_file["attribute_names"][0] == "email/a.txt"
    assert (tok["attributes"], tok["attribute_names"], tok["attribute_level"]) == (3, ["red", "green", "blue"], "token")
    assert arr["attribute_names"] == ["0", "1"]
    assert TripleStore.open(out["arr"]).read_attributes(0, 10).tolist() == [0, 1] * 5
    assert_error(ran[4], "ingest", "--attributes", "bad.npy[150] = -2", "expected an attribute id")
    assert_error(ran[5], "ingest", "--attributes: not for this source")
    assert_error(ran[7], "ingest", "--attributes", "stray.npy[99] = 1000000000", "--attribute-names NAMES.txt")
    assert not (tmp_path / "stray.zarr").exists()
    split = parse_json(ran[6])
    names = {tuple(store["attribute_names"]) for store in split["stores"].values()}
    assert names == {(".", "email", "email/mime", "json", "xml")}

    # --like keeps the names' ids and adds the new ones; --append merges alike, and refuses rows without them. The
    # store --like reads is appended to after it is read (an append's writer lock would make the reader wait or
    # refuse: "not complete yet"), and the refused append's store is read by info after it.
    liked, refused = run_many(
        ("ingest", str(tmp_path / "like.zarr"), "--text", str(more), "--like", out["dir"], "--attribute-by",
         "directory", "--json"),
        ("ingest", out["tok"], "--tokens", str(tmp_path / "tokens.npy"), "--append"),
    )  # fmt: skip
    merged, info = run_many(
        ("ingest", out["dir"], "--text", str(more), "--append", "--attribute-by", "directory", "--json"),
        ("info", out["tok"]),
    )  # fmt: skip
    like, appended = parse_json(liked), parse_json(merged)
    assert like["attribute_names"] == [".", "email", "email/mime", "json", "xml"] and like["attributes_added"] == 1
    assert appended["attribute_names"] == like["attribute_names"] and appended["attributes_added"] == 1
    np.testing.assert_array_equal(TokenStreamStore.open(out["dir"]).document_attributes(), [1, 2, 3, 0, 3, 4])
    assert_error(refused, "ingest", "its rows carry an attribute (3 names)", "--attribute-by", "--attributes A.npy")
    assert info.returncode == 0 and "attributes   3 (per token): red, green, blue" in info.stdout
    record = json.loads((Path(out["dir"]) / "zarr.json").read_text())["attributes"]["dist_respattn"]
    assert record["state"] == "complete" and record["attribute_names"][-1] == "xml"
