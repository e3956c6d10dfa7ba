"""The rows writer of ``predict --out FILE.jsonl|.csv``: columns, row order, words, and never a half-written file."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from dist_respattn.durable import TEMP_PREFIX, AtomicFiles
from dist_respattn.store import StoreError
from dist_respattn.store.predictions import OOV_WORD, PredictionRowsWriter, output_format, target_words

WORDS = target_words({"tokens": ["the", "cat", "sat"], "oov_id": 3}, 4)


def block(first: int, n: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(first)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(n)]).astype(np.int32)
    probs = np.sort(rng.dirichlet(np.ones(4), size=n), axis=1)[:, ::-1][:, :2]
    return first, ids, probs, rng.integers(0, 4, size=n).astype(np.int32)


def test_target_words_are_the_vocabulary_then_the_out_of_vocabulary_word():
    assert WORDS == ("the", "cat", "sat", OOV_WORD)
    assert target_words(None, 4) is None
    assert target_words({"tokens": ["a", "b", "c"]}, 2) == ("a", "b")


@pytest.mark.parametrize(
    ("name", "kind"), [("x.jsonl", "jsonl"), ("X.CSV", "csv"), ("p.zarr", "zarr"), ("out", "zarr"), ("d/", "zarr")]
)
def test_the_output_format_is_chosen_by_the_name(name, kind):
    assert output_format(name) == kind


def test_parquet_is_refused_by_name():
    with pytest.raises(StoreError, match=r"Parquet is not written .* name a \.jsonl or \.csv file"):
        output_format("x.parquet")


def test_json_lines_hold_one_object_a_row_in_order(tmp_path):
    writer = PredictionRowsWriter(tmp_path / "p.jsonl", top_k=2, words=WORDS)
    blocks = [block(0, 3), block(3, 2)]
    for b in blocks:
        writer.write(*b)
    assert not (tmp_path / "p.jsonl").exists()  # only under its temporary name until closed
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [line["row"] for line in lines] == [0, 1, 2, 3, 4]
    ids = np.concatenate([b[1] for b in blocks])
    probs = np.concatenate([b[2] for b in blocks])
    target = np.concatenate([b[3] for b in blocks])
    assert [line["ids"] for line in lines] == ids.tolist()
    assert [line["probabilities"] for line in lines] == probs.tolist()  # every double round-trips exactly
    assert [line["words"] for line in lines] == [[WORDS[i] for i in row] for row in ids.tolist()]
    assert [(line["target"], line["target_word"]) for line in lines] == [(int(t), WORDS[t]) for t in target]
    assert list(lines[0]) == ["row", "target", "target_word", "ids", "words", "probabilities"]


def test_csv_has_the_ranked_columns_and_round_trips_the_probabilities(tmp_path):
    writer = PredictionRowsWriter(tmp_path / "p.csv", top_k=2, words=WORDS)
    first, ids, probs, target = block(0, 4)
    writer.write(first, ids, probs, target)
    writer.close()
    with open(tmp_path / "p.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["row", "target", "target_word", "id_1", "word_1", "probability_1", "id_2", "word_2",
                             "probability_2"]  # fmt: skip
    assert [float(r["probability_2"]) for r in rows] == probs[:, 1].tolist()
    assert [r["word_1"] for r in rows] == [WORDS[i] for i in ids[:, 0]]


def test_rows_out_of_order_an_existing_file_and_an_aborted_run_are_refused_or_leave_nothing(tmp_path):
    writer = PredictionRowsWriter(tmp_path / "p.csv", top_k=2, words=None)
    with pytest.raises(ValueError, match="expected row 0 next"):
        writer.write(*block(3, 2))
    writer.write(*block(0, 2))
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "p.csv").write_text("mine\n")
    with pytest.raises(StoreError, match=r"exists already; pass overwrite=True \(--overwrite\)"):
        PredictionRowsWriter(tmp_path / "p.csv", top_k=2, words=None)
    writer = PredictionRowsWriter(tmp_path / "p.csv", top_k=2, words=None, overwrite=True)
    assert (tmp_path / "p.csv").read_text() == "mine\n"  # replaced only when the new file is complete
    writer.close()
    assert (tmp_path / "p.csv").read_text() == "row,target,id_1,probability_1,id_2,probability_2\n"
    with pytest.raises(StoreError, match="no such directory"):
        PredictionRowsWriter(tmp_path / "nowhere" / "p.jsonl", top_k=1, words=None)


@pytest.mark.parametrize(("name", "bad"), [("p.jsonl", float("nan")), ("p.csv", float("inf"))])
def test_a_non_finite_probability_is_refused_and_nothing_is_written(tmp_path, name, bad):
    """JSON has no NaN: a model that gives one is broken, and its rows are refused rather than written as ``NaN``."""
    writer = PredictionRowsWriter(tmp_path / name, top_k=2, words=WORDS)
    writer.write(*block(0, 3))
    first, ids, probs, target = block(3, 2)
    probs[1, 1] = bad
    with pytest.raises(ValueError, match=rf"--out .*{name}: row 4: a probability is {bad}; .* is broken"):
        writer.write(first, ids, probs, target)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_a_file_url_is_a_local_path(tmp_path):
    writer = PredictionRowsWriter(f"file://{tmp_path}/p.jsonl", top_k=2, words=None)
    assert writer.path == tmp_path / "p.jsonl"
    writer.write(*block(0, 2))
    writer.close()
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2
    with pytest.raises(StoreError, match=r"--out s3://b/p\.jsonl: .* give a local path"):
        PredictionRowsWriter("s3://b/p.jsonl", top_k=2, words=None)
    # The host may be named (localhost), and the path is percent-decoded as a URL's is.
    spaced = tmp_path / "a b"
    spaced.mkdir()
    named = PredictionRowsWriter(f"file://localhost{spaced}/q.jsonl".replace(" ", "%20"), top_k=2, words=None)
    assert named.path == spaced / "q.jsonl"
    named.abort()


def test_the_temporary_file_is_one_the_durable_clean_up_recognises(tmp_path):
    """A run killed before its rename leaves a ``.tmp-`` file, which ``remove_temporaries`` removes."""
    writer = PredictionRowsWriter(tmp_path / "p.jsonl", top_k=2, words=None)
    writer.write(*block(0, 2))
    (temporary,) = [p.name for p in tmp_path.iterdir()]
    assert temporary.startswith(TEMP_PREFIX + "p.jsonl."), temporary
    assert AtomicFiles(str(tmp_path)).remove_temporaries("") == [temporary]
    assert list(tmp_path.iterdir()) == []
    writer.abort()


def test_a_file_created_by_another_run_meanwhile_is_not_replaced_without_overwrite(tmp_path):
    writer = PredictionRowsWriter(tmp_path / "p.csv", top_k=2, words=None)
    writer.write(*block(0, 2))
    (tmp_path / "p.csv").write_text("theirs\n")  # another run finished first
    with pytest.raises(
        StoreError, match=r"by someone else while predicting; the rows are kept in .*p\.[0-9a-f]{8}\.csv"
    ):
        writer.close()
    assert (tmp_path / "p.csv").read_text() == "theirs\n"
    # The finished rows are kept under a visible name of their own, and no temporary is left behind.
    (kept,) = [p for p in tmp_path.iterdir() if p.name != "p.csv"]
    assert len(kept.read_text().splitlines()) == 1 + 2, kept.read_text()  # the header and the two rows written


def test_a_filesystem_without_hard_links_still_places_the_file_once(tmp_path, monkeypatch):
    """On vfat, exFAT or SMB ``os.link`` fails with EPERM: the name is claimed with O_EXCL instead, so the file
    is placed (and a taken name is still refused)."""
    import errno

    def no_links(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted", src)

    monkeypatch.setattr(os, "link", no_links)
    writer = PredictionRowsWriter(tmp_path / "p.jsonl", top_k=2, words=None)
    writer.write(*block(0, 2))
    writer.close()
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["p.jsonl"]
    again = PredictionRowsWriter(tmp_path / "q.jsonl", top_k=2, words=None)
    again.write(*block(0, 2))
    (tmp_path / "q.jsonl").write_text("theirs\n")
    with pytest.raises(StoreError, match="by someone else while predicting"):
        again.close()
    assert (tmp_path / "q.jsonl").read_text() == "theirs\n"
