"""A chain of hops fitted on a cluster: bit-identical on one and two workers, and equal to the in-process fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dist_respattn.engine import FitSettings, fit
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.store import WriteOptions, write_arrays
from tests.engine.clusters import local_cluster
from tests.heads.cases import CASES


@pytest.mark.slow
def test_a_chain_fits_alike_on_one_and_two_workers_and_in_process(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "hops-tied-sparse")
    spec, data, context = case.make()
    s, _, _, t = context.shape
    store = tmp_path / "train.zarr"
    write_arrays(store, *data.arrays, num_symbols=s, num_targets=t,
                 options=WriteOptions(chunk_rows=128, partition_rows=256))  # fmt: skip
    # Two iterations: the second E-step runs on the first distributed M-step's parameters.
    settings = FitSettings(max_iter=2, tol=0.0, holdout_fraction=0.0)
    arrays = []
    with local_cluster(2) as (_, client):
        for n_workers in (2, 1):
            if n_workers == 1:
                client.retire_workers(workers=[next(iter(client.scheduler_info()["workers"]))])
            assert len(client.scheduler_info()["workers"]) == n_workers
            result = fit(store, model_dir=tmp_path / f"model-{n_workers}", settings=settings, head=spec, client=client)
            arrays.append(result.model.to_arrays()[0])
    two, one = arrays
    assert two.keys() == one.keys()
    for name in two:
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
    reference = fit_em(data.arrays, spec, shape=context.shape, holdout=HoldoutRule(0.0), max_iter=2, tol=0.0)
    theirs, _ = reference.distribution.to_arrays()
    for name in two:
        np.testing.assert_allclose(two[name], theirs[name], rtol=1e-12, atol=1e-14, err_msg=name)
