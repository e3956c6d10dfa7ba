"""The predictions group on disk, without a cluster: parts written in any order, read back in row order, and
what an unfinished or foreign group is."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn.model.scores import TopK
from dist_respattn.store import StoreError, StoreLocation
from dist_respattn.store.predictions import (
    Predictions,
    PredictionsHeader,
    create_predictions,
    finish_predictions,
    write_prediction_part,
)

K, N = 2, 3
PARTS = ((0, 5), (5, 5), (5, 12))  # the middle part holds no rows (a stream shard of document heads)


def block(first: int, rows: int) -> TopK:
    ids = np.arange(first, first + rows)
    return TopK(
        np.stack([ids, ids + 1], axis=1).astype(np.int32),
        np.full((rows, K), 0.5) / (1 + ids[:, None]),
        np.full((rows, N), 1.0 / N),
    )


def header() -> PredictionsHeader:
    return PredictionsHeader(K, N, 20, 12, PARTS, "model", "/store.zarr", "0123456789abcdef")


def test_parts_written_in_any_order_read_back_as_the_rows_in_order(tmp_path):
    out = StoreLocation.of(tmp_path / "p.zarr")
    create_predictions(out, header())
    for index in (2, 0, 1):  # tasks finish in any order
        start, stop = PARTS[index]
        pieces = [(first, block(first, min(first + 4, stop) - first)) for first in range(start, stop, 4)]
        assert write_prediction_part(out, index, start, stop, pieces, top_k=K, context_length=N) == stop - start
    with pytest.raises(StoreError, match=r"incomplete .*run predict again with --overwrite"):
        Predictions.open(out)
    finish_predictions(out)
    predictions = Predictions.open(out)
    assert predictions.header == header()
    whole = predictions.read_all()
    expected = block(0, 12)
    for name in ("targets", "probabilities", "attention"):
        np.testing.assert_array_equal(getattr(whole, name), getattr(expected, name))
    assert [start for start, _ in predictions.iter_parts()] == [0, 5, 5]


def test_a_part_must_be_written_whole_and_in_row_order(tmp_path):
    out = StoreLocation.of(tmp_path / "p.zarr")
    create_predictions(out, header())
    with pytest.raises(ValueError, match="a block starts at row 2, expected 0"):
        write_prediction_part(out, 0, 0, 5, [(2, block(2, 3))], top_k=K, context_length=N)
    with pytest.raises(ValueError, match=r"wrote 3 rows of its 5 \(rows 0\.\.4\)"):
        write_prediction_part(out, 0, 0, 5, [(0, block(0, 3))], top_k=K, context_length=N)


def test_only_predictions_are_replaced_and_only_when_asked(tmp_path):
    out = StoreLocation.of(tmp_path / "p.zarr")
    create_predictions(out, header())
    with pytest.raises(StoreError, match=r"holds predictions already; pass overwrite=True \(--overwrite\)"):
        create_predictions(out, header())
    create_predictions(out, header(), overwrite=True)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(StoreError, match="is not the output of `dist-respattn predict`; choose another --out"):
        create_predictions(StoreLocation.of(tmp_path / "notes"), header(), overwrite=True)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
