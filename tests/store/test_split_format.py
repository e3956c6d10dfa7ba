"""A split written as token-stream stores holds the same rows, queries, targets and attributes as one written as
triple stores, and ``dist-respattn split`` writes streams unless ``--format triples`` is given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.store import SPLIT_NAMES, TextCorpus, TokenCorpus, TripleStore, WriteOptions, validate, write_split
from dist_respattn.store.streams.reader import TokenStreamStore
from tests.store.helpers import assert_same_rows
from tests.store.test_split import FRACTIONS, WORDS, make_tree

OPTIONS = WriteOptions(chunk_rows=64, partition_rows=128)


def _rows(store):
    return store.read_rows(0, store.num_rows)


@pytest.mark.parametrize("source", ["text", "tokens"])
def test_a_stream_split_holds_the_rows_of_a_triple_split(tmp_path, source):
    """Row for row the same windows, queries (the table's), targets and attribute ids, documents in the same splits."""
    if source == "text":
        root = tmp_path / "corpus"
        make_tree(root)
        corpus = TextCorpus([root], attribute_by="directory")
    else:
        tokens = np.random.default_rng(7).integers(0, 11, 3000)
        corpus = TokenCorpus(tokens, block_tokens=97, attributes=tokens % 3)
    triples = write_split(tmp_path / "triples", corpus, 3, fractions=FRACTIONS, options=OPTIONS, store_format="triples")
    streams = write_split(tmp_path / "streams", corpus, 3, fractions=FRACTIONS, options=OPTIONS)  # the default
    for name in SPLIT_NAMES:
        triple, stream = triples[name], streams[name]
        assert isinstance(triple, TripleStore) and isinstance(stream, TokenStreamStore)
        assert stream.num_rows == triple.num_rows > 0
        assert stream.schema == triple.schema and stream.identity() == triple.identity()
        assert stream.vocabulary() == triple.vocabulary()
        assert_same_rows(_rows(stream), _rows(triple))
        np.testing.assert_array_equal(
            stream.read_attributes(0, stream.num_rows), triple.read_attributes(0, triple.num_rows)
        )
        assert stream.attribute_names == triple.attribute_names is not None
        assert stream.provenance["split"] == triple.provenance["split"]
        assert stream.provenance["tokens_count"] == triple.provenance["tokens_count"]
        assert validate(stream.location).ok


def test_an_unknown_store_format_is_refused():
    with pytest.raises(ValueError, match=r"store_format = 'csv' \(--format\): expected one of stream, triples"):
        write_split("unused", TokenCorpus(np.arange(10)), 2, store_format="csv")


def test_a_stream_split_of_no_rows_names_the_split(tmp_path):
    tokens = np.random.default_rng(5).integers(0, 9, 400)
    short = TokenCorpus(tokens, documents=np.arange(0, 400, 3))  # documents of 3 tokens: no window of N = 3 fits
    with pytest.raises(ValueError, match=r"train\.zarr: the train split has no rows: .* longer than N = 3"):
        write_split(tmp_path / "out", short, 3, options=OPTIONS, store_format="stream")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_split_command_writes_streams_that_fit_and_evaluate_take_and_triples_on_request(
    tmp_path, one_worker_address
):
    """``split`` writes token-stream stores by default; ``fit`` and ``evaluate`` take them, and give the figures
    of the same split written with ``--format triples``; a bad ``--format`` is refused in split's own words."""
    from tests.test_cli_store import run_many

    root = tmp_path / "corpus"
    make_tree(root, files=40)
    kinds = {"stream": (), "triples": ("--format", "triples")}
    # The commands of each step are independent of each other, so they run at once (as run_many does elsewhere).
    *splits, bad = run_many(
        *(("split", str(tmp_path / kind), "--text", str(root), "--context", "3", *extra, "--json")
          for kind, extra in kinds.items()),
        ("split", str(tmp_path / "bad"), "--text", str(root), "--context", "3", "--format", "csv"),
    )  # fmt: skip
    for kind, done in zip(kinds, splits, strict=True):
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["format"] == kind
        opened = (TokenStreamStore if kind == "stream" else TripleStore).open(tmp_path / kind / "train.zarr")
        assert opened.num_rows > 0
    # fit and evaluate join one cluster (--scheduler; the one the command-line tests share) rather than each starting
    # its own: what is tested is that they take either format and agree, whoever's workers run them.
    address = one_worker_address
    fits = run_many(
        *(("fit", str(tmp_path / kind / "train.zarr"), "--validation", str(tmp_path / kind / "validation.zarr"),
           "--model-dir", str(tmp_path / f"model-{kind}"), "--head", "single", "--max-iter", "3", "--scheduler",
           address, "--json") for kind in kinds),
    )  # fmt: skip
    for done in fits:
        assert done.returncode == 0, done.stderr
    evaluations = run_many(
        *(("evaluate", str(tmp_path / f"model-{kind}"), str(tmp_path / kind / "test.zarr"), "--scheduler",
           address, "--json") for kind in kinds),
    )  # fmt: skip
    reports = {}
    for kind, fitted, done in zip(kinds, fits, evaluations, strict=True):
        assert done.returncode == 0, done.stderr
        reports[kind] = (json.loads(fitted.stdout)["heldout"], json.loads(done.stdout)["model"])
    for a, b in zip(reports["stream"], reports["triples"], strict=True):
        assert a["perplexity"] == pytest.approx(b["perplexity"], rel=1e-12)

    assert bad.returncode == 2
    assert "dist-respattn split: error: argument --format: invalid choice: 'csv'" in bad.stderr
    assert bad.stderr.startswith("usage: dist-respattn split")
    assert not Path(tmp_path / "bad").exists()


@pytest.mark.slow  # tokenizes half a million lines (about 6 s)
def test_a_stream_split_writes_a_large_file_a_piece_at_a_time(tmp_path, monkeypatch):
    """A file of half a million tokens (100 pieces of 5,000 lines) is written without holding its ids: the peak of
    traced memory (about 1.2 MB, a piece's tokenizing and the writer's buffers) stays below the 2 MB its int32 ids
    alone would take (the file read as one piece peaks at 68 MB), and its document holds every token.

    The pieces are a quarter of the reader's 20,000 lines (its ``_LINES_PER_PIECE``) and the file a quarter of two
    million lines: the same hundred pieces at a quarter of the time."""
    import tracemalloc

    from dist_respattn.store.ingest import text

    monkeypatch.setattr(text, "_LINES_PER_PIECE", 5_000)
    root = tmp_path / "corpus"
    make_tree(root)
    lines = 500_000
    words = np.array(WORDS)[np.random.default_rng(3).integers(0, len(WORDS), lines)]
    (root / "docs" / "large.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    options = WriteOptions(chunk_rows=1 << 14, partition_rows=1 << 14)
    tracemalloc.start()
    try:
        stores = write_split(
            tmp_path / "out", TextCorpus([root]), 3, fractions=FRACTIONS, options=options, store_format="stream"
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * lines, f"peak {peak:,} bytes"
    holder = next(s for s in stores.values() if s.num_tokens > lines)
    starts = holder.document_starts()
    lengths = np.diff(np.append(starts, holder.num_tokens))
    assert lines in lengths.tolist()  # one document of every token of the file
    vocabulary = holder.vocabulary()["tokens"]
    d = int(np.flatnonzero(lengths == lines)[0])
    ids = holder.read_tokens(int(starts[d]), int(starts[d]) + lines)
    np.testing.assert_array_equal(np.array(vocabulary)[ids], words)
