"""A chain of hops and a conjunction head with their single head's values open, fitted on a cluster: the held-out
choice is made (and recorded in the checkpoint and the fit's lines) the same way, bit for bit, on one and two workers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import pytest

from dist_respattn.engine import FitSettings, fit
from dist_respattn.model.heads.conj import ConjSpec
from dist_respattn.model.heads.hops import HopsSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.store import WriteOptions, write_arrays
from tests.engine.clusters import local_cluster
from tests.heads.cases import copy_data

SPECS: dict[str, Any] = {
    "hops": HopsSpec(SingleHopSpec(emission_layout="sparse", position_buckets=3), hops=2),
    "conj": ConjSpec(SingleHopSpec(emission_layout="dense"), depth=2, order=3, choose_single=True),
}


@pytest.fixture(scope="module")
def one_worker() -> Iterator[distributed.Client]:
    """A client of this module's cluster of one worker process; the two-worker fits run on the engine tests' shared
    cluster (``client``). Neither is changed: a fit leaves nothing on its workers."""
    with local_cluster(1) as (_, client):
        yield client


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_the_inner_choices_are_made_alike_on_one_and_two_workers(
    kind: str, tmp_path: Path, client: distributed.Client, one_worker: distributed.Client
) -> None:
    spec = SPECS[kind]
    shape = (12, 6, 2, 12)
    data = copy_data(900, shape, seed=41)
    store = tmp_path / "train.zarr"
    write_arrays(store, *data.arrays, num_symbols=shape[0], num_targets=shape[3],
                 options=WriteOptions(chunk_rows=128, partition_rows=256))  # fmt: skip
    settings = FitSettings(max_iter=3, tol=0.0, holdout_fraction=0.25)
    fitted, histories = [], []
    for n_workers, on in ((2, client), (1, one_worker)):
        assert len(on.scheduler_info()["workers"]) == n_workers
        result = fit(store, model_dir=tmp_path / f"model-{n_workers}", settings=settings, head=spec, client=on)
        fitted.append(result.model.to_arrays()[0])
        histories.append(result.history)
    two, one = fitted
    assert two.keys() == one.keys()
    for name in two:
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
    chosen = [[entry["hyperparameters"] for entry in history] for history in histories]
    assert chosen[0] == chosen[1]
    for entry in histories[0]:
        assert entry["heldout"] is not None
        assert {"sigma2", "emission_strength", "type_strength"} <= entry["hyperparameters"].keys()
        assert "emission prior strength" in entry["choice"]
    # The checkpoint's choice names the values the last M-step chose.
    meta = json.loads(sorted((tmp_path / "model-1").glob("ckpt-000003-*/meta.json"))[-1].read_text())
    assert meta["hyperparameters"] == chosen[1][-1]
