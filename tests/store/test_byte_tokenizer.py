"""The compiled byte tokenizer and the one-pass text ingest give exactly what the Python tokenizer gives.

The reference is the regex tokenizer of :mod:`dist_respattn.store.ingest.text` (``line_pieces`` of a file,
counted by ``build_vocabulary``): the store's ids, its vocabulary and its document starts must be
those of that two-pass writer, on text chosen to be awkward (non-ASCII letters and spaces, case
mappings that turn non-ASCII into ASCII, undecodable bytes, CRLF, control characters, empty files).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_respattn.store.ingest import text_pass
from dist_respattn.store.ingest.byte_tokenizer import TokenDictionary, tokenize_bytes
from dist_respattn.store.ingest.text import build_vocabulary, iter_text_files, line_pieces, tokenize
from dist_respattn.store.ingest.text_pass import file_blocks, tokenize_files
from dist_respattn.store.ingest.to_stream import write_stream_text
from dist_respattn.store.streams.reader import TokenStreamStore
from tests.engine.test_bad_input import run_cli

TRICKY = [
    b"",
    b"   \t\n",
    b"int main(void) { return 0; }\r\n",
    b"Foo_Bar = BAZ42 + 3.14e-2; // x++ --y\r\n\r\n",
    b"a\x1cb\x1dc\x1ed\x1fe\x0bf\x0cg\x00h\x7f",
    "naïve café Ünïcödé STRASSE Straße".encode(),
    "ΣΑΣ ΟΔΟΣ. σΣ ABCΣ".encode(),  # final sigma depends on its neighbours
    "KELVIN\u212a \u212a \u0130stanbul \u0130".encode(),  # case mappings into ASCII and into two code points
    "a\u00a0b c\u2028d e\u3000f".encode(),  # non-ASCII spaces
    "日本語のテキスト、句読点。 ١٢٣ ½ x²".encode(),  # letters, digits and numbers of other scripts
    "\ufeffbom first".encode(),
    "tab\u0301bed e\u0301 \u0301".encode(),  # combining marks
    b"abc\xff\xfedef \xe2\x82 ghi\xe2\x82\xac \xc3",  # undecodable and truncated sequences
    b"x" * 5000 + b" " + b"y" * 3,
    "emoji 😀👍🏽 end".encode(),
]


def reference_tokens(data: bytes) -> list[str]:
    return tokenize(data.decode("utf-8", errors="replace"))


def scanned(data: bytes, dictionary: TokenDictionary | None = None) -> list[str]:
    dictionary = TokenDictionary() if dictionary is None else dictionary
    return dictionary.tokens(tokenize_bytes(data, dictionary, tokenize))


@pytest.mark.parametrize("data", TRICKY, ids=range(len(TRICKY)))
def test_tricky_text_tokenizes_as_the_regex_does(data):
    assert scanned(data) == reference_tokens(data)


def test_one_dictionary_across_texts_gives_one_id_per_token():
    dictionary = TokenDictionary()
    ids = [tokenize_bytes(data, dictionary, tokenize) for data in TRICKY]
    tokens = [t for data in TRICKY for t in reference_tokens(data)]
    flat = np.concatenate(ids)
    assert dictionary.tokens(flat) == tokens
    assert len(dictionary) >= len(set(tokens))  # runs handed to Python may leave a token seen only there
    assert len({dictionary.token(i) for i in np.unique(flat)}) == np.unique(flat).size


def test_dictionary_grows_in_the_middle_of_a_scan():
    # 300k distinct words in one text: the slots, offsets and arena all fill and grow mid-scan.
    words = " ".join(f"w{i:x}Q" for i in range(300_000)).encode()
    dictionary = TokenDictionary()
    assert scanned(words, dictionary) == reference_tokens(words)
    assert len(dictionary) == 300_000


ALPHABET = st.sampled_from(
    ["a", "Z", "_", "7", " ", "\t", "\r\n", "\n", ".", "(", "é", "Σ", "\u212a", "\u0130", "\u00a0", "\u3000", "日",
     "\u0301", "😀", "\x00", "\x1c", "½"]
)  # fmt: skip


@settings(deadline=None, max_examples=150)
@given(st.lists(ALPHABET, max_size=60).map("".join), st.binary(max_size=8))
def test_random_text_and_bytes_tokenize_as_the_regex_does(text, junk):
    data = text.encode() + junk + text[::-1].encode()
    assert scanned(data) == reference_tokens(data)


def test_file_blocks_cut_only_at_spaces(tmp_path):
    path = tmp_path / "f.txt"
    data = b"alpha beta\r\n" * 300 + b"z" * 700 + "é Σσ gamma".encode() * 50
    path.write_bytes(data)
    blocks = list(file_blocks(str(path), block=256))
    assert b"".join(b.tobytes() for b in blocks) == data
    assert len(blocks) > 5
    dictionary = TokenDictionary()
    found = [t for b in blocks for t in dictionary.tokens(tokenize_bytes(b, dictionary, tokenize))]
    assert found == [t for piece in line_pieces(str(path)) for t in piece]


def write_corpus(root: Path) -> Path:
    """Text files of every awkward kind, empty ones first, in the middle and last in path order."""
    corpus = root / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "0_empty.txt").write_bytes(b"")
    for i, data in enumerate(TRICKY):
        (corpus / f"{i + 1:02d}.txt").write_bytes(data * (1 + i % 3))
    (corpus / "sub" / "crlf.py").write_bytes(b"def f(x):\r\n    return x  # \xe2\x80\x94 dash\r\n")
    (corpus / "zz_blank.md").write_bytes(b" \r\n\t")  # last in path order, and no tokens
    return corpus


def reference_store_tokens(files, vocabulary):
    lookup = vocabulary.lookup()
    per_file = [np.concatenate([vocabulary.encode(p, lookup) for p in line_pieces(f)] or [[]]) for f in files]
    lengths = np.array([p.size for p in per_file])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[lengths > 0]
    return np.concatenate(per_file).astype(np.int64), starts


@pytest.mark.parametrize("vocab_size", [1, 7, 10_000])
def test_stream_text_store_is_the_two_pass_writers(tmp_path, vocab_size):
    corpus = write_corpus(tmp_path)
    files = iter_text_files([corpus])
    expected_vocabulary = build_vocabulary(files, vocab_size)
    store = write_stream_text(tmp_path / "s.zarr", [corpus], 3, vocab_size=vocab_size)
    assert store.vocabulary() == expected_vocabulary.to_json()
    tokens, starts = reference_store_tokens(files, expected_vocabulary)
    assert np.array_equal(store._tokens[...].astype(np.int64), tokens)
    # A file without tokens starts no document, also when it comes last.
    assert np.array_equal(store.document_starts(), starts)
    assert store.provenance["oov_count"] == expected_vocabulary.oov_count
    assert store.provenance["files"] == len(files)

    test = write_stream_text(tmp_path / "t.zarr", [corpus / "sub", corpus / "09.txt"], None, like=store.location)
    again, _ = reference_store_tokens(iter_text_files([corpus / "sub", corpus / "09.txt"]), expected_vocabulary)
    assert np.array_equal(test._tokens[...].astype(np.int64), again)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_store_is_the_same_for_any_number_of_workers(tmp_path, monkeypatch, workers):
    # Batches of a few files each, so the threads each tokenize several with dictionaries of their own.
    monkeypatch.setattr(text_pass, "_BATCH_BYTES", 64)
    corpus = write_corpus(tmp_path)
    one = write_stream_text(tmp_path / "one.zarr", [corpus], 3, vocab_size=12, workers=1)
    many = write_stream_text(tmp_path / "many.zarr", [corpus], 3, vocab_size=12, workers=workers)
    assert len(text_pass._batches(iter_text_files([corpus]), 64)) > 5
    assert np.array_equal(one._tokens[...], many._tokens[...])
    assert np.array_equal(one.document_starts(), many.document_starts())
    assert one.vocabulary() == many.vocabulary()
    files = iter_text_files([corpus])
    tokens, _ = reference_store_tokens(files, build_vocabulary(files, 12))
    assert np.array_equal(many._tokens[...].astype(np.int64), tokens)


def test_ranking_breaks_ties_by_the_token(tmp_path):
    # Every token once: the kept ones are the alphabetically first, by code point (uppercase lowered).
    path = tmp_path / "t.txt"
    path.write_text("b a é B z aa A ab É \x00 _ 9 ~", encoding="utf-8")
    corpus = tokenize_files([str(path)], os.fspath(tmp_path))
    for size in (1, 3, 5, 100):
        vocabulary, remap = corpus.vocabulary(size)
        assert vocabulary == build_vocabulary([str(path)], size)
        ids = np.concatenate(list(corpus.blocks(remap, np.dtype(np.int64), 4)))
        assert [vocabulary.tokens[i] if i < len(vocabulary.tokens) else None for i in ids] == [
            t if t in vocabulary.tokens else None for t in reference_tokens(path.read_bytes())
        ]


@pytest.mark.slow
def test_the_cli_ingests_text_as_a_stream_and_validates_it(tmp_path):
    corpus = write_corpus(tmp_path)
    files = iter_text_files([corpus])
    done = run_cli("ingest", "s.zarr", "--text", str(corpus), "--format", "stream", "--vocab-size", "9",
                   "--context", "2", cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert run_cli("validate", "s.zarr", cwd=tmp_path).returncode == 0
    like = run_cli("ingest", "t.zarr", "--text", str(corpus / "sub"), "--format", "stream", "--like", "s.zarr",
                   cwd=tmp_path, timeout=300)  # fmt: skip
    assert like.returncode == 0, like.stderr
    vocabulary = build_vocabulary(files, 9)
    store = TokenStreamStore.open(tmp_path / "s.zarr")
    assert store.vocabulary() == vocabulary.to_json()
    assert np.array_equal(store._tokens[...].astype(np.int64), reference_store_tokens(files, vocabulary)[0])
    again = TokenStreamStore.open(tmp_path / "t.zarr")
    expected, _ = reference_store_tokens(iter_text_files([corpus / "sub"]), vocabulary)
    assert np.array_equal(again._tokens[...].astype(np.int64), expected)
