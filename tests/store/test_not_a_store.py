"""A path given as a store that holds none is said to be what it is, with the fix, by every opener: a missing path
(with the names beside it it may have meant), split's folder of stores, a model directory or one of its
checkpoints, a registry, predict's output, a file, a zarr group or array of another program's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zarr

from dist_respattn import random_distribution
from dist_respattn.artifacts.checkpoints import LATEST, ModelDir, checkpoint_name
from dist_respattn.store import TripleStore, validate
from dist_respattn.store.errors import StoreError
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.predictions import PredictionsHeader, create_predictions
from dist_respattn.store.rows import open_store
from dist_respattn.store.streams.reader import TokenStreamStore
from tests.store.helpers import write_small

EXPECTED = "expected a store written by `dist-respattn ingest` or `split` (a token-stream or triple store)"


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One path of each kind that is not a store, named by the kind."""
    root = tmp_path_factory.mktemp("not-a-store")
    corpus = root / "corpus"
    for name in ("test", "train", "validation"):
        write_small(corpus / f"{name}.zarr")
    model = ModelDir(root / "model")
    name = checkpoint_name(1, "0123abcd")
    model.write(name, random_distribution(13, 4, 3, 7, seed=0), {"iteration": 1})
    model.point(LATEST, name, iteration=1, state="running")
    registry = root / "registry"
    registry.mkdir()
    (registry / "registry.json").write_text(json.dumps({"format": "dist_respattn.registry", "version": 1}))
    (registry / "latest.json").write_text(json.dumps({"version": 1}))
    header = PredictionsHeader(5, 4, 7, 1000, ((0, 1000),), str(model.path), str(corpus / "test.zarr"), "ab12")
    create_predictions(StoreLocation.of(root / "preds.zarr"), header)
    (root / "notes.txt").write_text("not a store\n")
    (root / "empty").mkdir()
    zarr.open_group(str(root / "group.zarr"), mode="w").attrs["something"] = "else"
    zarr.create_array(str(root / "array.zarr"), shape=(10,), dtype="int32")
    return {
        "typo": corpus / "trian.zarr",
        "missing": root / "nowhere" / "train.zarr",
        "corpus": corpus,
        "model": model.path,
        "checkpoint": model.path / name,
        "registry": registry,
        "predictions": root / "preds.zarr",
        "file": root / "notes.txt",
        "empty": root / "empty",
        "group": root / "group.zarr",
        "array": root / "array.zarr",
    }


CASES = {
    "typo": "no such file or directory (did you mean train.zarr?)",
    "missing": "no such file or directory",
    "corpus": "a folder of stores (train.zarr, validation.zarr, test.zarr): name one of them",
    "model": "a model directory, not a store: commands take it as MODEL",
    "checkpoint": (
        "a checkpoint of a model directory, not a store: commands take its model directory, {model}, as MODEL"
    ),
    "registry": "a model registry, not a store: commands take one of its versions as MODEL ({registry}@latest)",
    "predictions": "predictions written by `predict` of the store {corpus}/test.zarr, not a store",
    "file": f"a file, not a store: {EXPECTED}",
    "empty": f"an empty directory, not a store: {EXPECTED}",
    "group": f"a zarr group but no store of dist_respattn: {EXPECTED}",
    "array": f"a zarr array, not a store: {EXPECTED}",
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_opener_says_what_is_there_instead_of_a_store(paths, case):
    expected = f"{paths[case]}: " + CASES[case].format(**paths)
    for opener in (open_store, TripleStore.open, TokenStreamStore.open, validate):
        with pytest.raises(StoreError) as info:
            opener(paths[case])
        assert str(info.value) == expected, opener


def test_a_store_of_the_other_kind_is_still_named_by_its_schema(tmp_path):
    """Opening a triple store as a token stream is not "no store": the message names the store's schema."""
    write_small(tmp_path / "s.zarr")
    with pytest.raises(StoreError, match=r"not a token-stream store \(attribute schema 'dist_respattn\.triples'\)"):
        TokenStreamStore.open(tmp_path / "s.zarr")
