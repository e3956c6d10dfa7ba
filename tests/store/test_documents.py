"""Token streams with document starts: rows are the windows of each document, whatever the block boundaries."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dist_respattn.store.documents as documents_module
import dist_respattn.store.ingest.tokens as tokens_module
from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store import validate, write_tokens
from dist_respattn.store.documents import DocumentWindows, document_runs
from tests.store.helpers import SMALL, assert_rows, read_all

S = 11


def per_document_windows(tokens: np.ndarray, starts: list[int], n: int, table: np.ndarray) -> tuple[np.ndarray, ...]:
    """``sequence_windows`` of each document on its own, concatenated in order."""
    bounds = [*starts, len(tokens)]
    parts = [
        sequence_windows(tokens[a:b], n, num_symbols=S, embeddings=table, query_dtype=np.float32)
        for a, b in pairwise(bounds)
    ]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


@pytest.fixture
def small_blocks(monkeypatch):
    """Token blocks of 97 and starts blocks of 3, so both readers cross their block boundaries."""
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)
    monkeypatch.setattr(documents_module, "_STARTS_BLOCK", 3)


def test_windows_never_cross_a_document_boundary_even_at_a_block_boundary(tmp_path, small_blocks):
    n = 4
    tokens = np.random.default_rng(0).integers(0, S, 700)
    # 97 and 194 are block boundaries; 300..301 is a 1-token document, 400..404 one of N tokens (no rows),
    # 404..409 one of N + 1 tokens (one row); 600 starts a document 2 tokens into the 7th block.
    starts = [0, 97, 194, 250, 300, 301, 400, 404, 409, 582]
    np.save(tmp_path / "starts.npy", np.array(starts, dtype=np.uint32))
    store = write_tokens(
        tmp_path / "t.zarr", tokens, n, num_symbols=S, documents=tmp_path / "starts.npy", dim=3, options=SMALL
    )
    expected = per_document_windows(tokens, starts, n, store.embeddings())
    assert store.num_rows == sum(max(b - a - n, 0) for a, b in pairwise([*starts, 700]))
    assert_rows(read_all(store), *expected)
    assert store.provenance["documents"] == len(starts)
    assert store.provenance["documents_file"] == str(tmp_path / "starts.npy")
    assert validate(store.location).ok
    one = write_tokens(tmp_path / "one.zarr", tokens, n, num_symbols=S, documents=[0], dim=3, options=SMALL)
    assert one.num_rows == 700 - n and one.provenance["documents"] == 1  # one document: the whole stream


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    pieces=st.lists(st.integers(1, 25), min_size=1, max_size=40),
    n=st.integers(1, 5),
)
def test_document_windows_equal_the_windows_of_each_document_for_any_pieces(lengths, pieces, n):
    tokens = np.random.default_rng(len(lengths)).integers(0, S, sum(lengths))
    starts = np.cumsum([0, *lengths[:-1]])
    table = np.eye(S, dtype=np.float32)
    windows = DocumentWindows(n, S, table, [starts[:2], starts[2:]])  # starts arrive in two blocks
    rows, position, k = [], 0, 0
    while position < len(tokens):
        step = pieces[k % len(pieces)]
        rows.append(windows.feed(tokens[position : position + step]))
        position, k = position + step, k + 1
    context, query, target, document = (np.concatenate([r[i] for r in rows]) for i in range(4))
    expected = per_document_windows(tokens, list(starts), n, table)
    np.testing.assert_array_equal(context, expected[0])
    np.testing.assert_array_equal(query, expected[1])
    np.testing.assert_array_equal(target, expected[2])
    owner = np.repeat(np.arange(len(lengths)), [max(length - n, 0) for length in lengths])
    np.testing.assert_array_equal(document, owner)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    pieces=st.lists(st.integers(1, 25), min_size=1, max_size=40),
    begun=st.booleans(),
)
def test_document_runs_cut_any_pieces_where_documents_start(lengths, pieces, begun):
    """The runs tile each piece, every token gets its document, and a run begins a document exactly at its start
    (the first one only when the caller has not begun it)."""
    starts = np.cumsum([0, *lengths[:-1]])
    total = sum(lengths)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    document, position, k = (0 if begun else -1), 0, 0
    seen = np.full(total, -1)
    begins = []
    while position < total:
        size = min(pieces[k % len(pieces)], total - position)
        runs = document_runs(starts, position, size, document)
        assert [r.start for r in runs] == [0, *(r.stop for r in runs[:-1])] and runs[-1].stop == size
        for run in runs:
            assert run.stop > run.start
            seen[position + run.start : position + run.stop] = run.document
            if run.begins:
                begins.append(position + run.start)
        document, position, k = runs[-1].document, position + size, k + 1
    np.testing.assert_array_equal(seen, owner)
    assert begins == starts.tolist()[1 if begun else 0 :]


@pytest.mark.parametrize(
    ("starts", "message"),
    [
        (np.array([[0, 5]]), r"starts\.npy: shape \(1, 2\), dtype int64: expected a 1-d array of integer"),
        (np.array([0.0, 5.0]), r"starts\.npy: shape \(2,\), dtype float64: expected a 1-d array of integer"),
        (np.array([], dtype=np.int64), r"starts\.npy: empty: expected the first token index of each document"),
        (np.array([3, 5]), r"starts\.npy\[0\] = 3: expected 0: the first document starts at the first token"),
        (np.array([0, 5, 9, 9, 12]), r"starts\.npy\[3\] = 9: expected strictly increasing .*starts\.npy\[2\] = 9"),
        (np.array([0, 5, 7, 6]), r"starts\.npy\[3\] = 6: expected strictly increasing .*starts\.npy\[2\] = 7"),
        (np.array([0, 5, 50]), r"starts\.npy\[2\] = 50: expected a token index in \[0, 50\) \(.*tokens\.npy has 50"),
        (np.array([0, -5]), r"starts\.npy\[1\] = -5: expected a token index in \[0, 50\)"),
    ],
)
def test_bad_document_starts_are_named_by_file_and_first_bad_position(tmp_path, small_blocks, starts, message):
    np.save(tmp_path / "tokens.npy", np.arange(50) % S)
    np.save(tmp_path / "starts.npy", starts)
    out = tmp_path / "t.zarr"
    with pytest.raises(ValueError, match=message):
        write_tokens(out, tmp_path / "tokens.npy", 2, documents=tmp_path / "starts.npy", options=SMALL)
    assert not out.exists()
