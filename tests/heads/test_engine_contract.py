"""The distributed fit equals ``fit_em``, for every kind of head (every case of :data:`tests.heads.cases.CASES`).

Each case's rows are written as a real store on disk, in several partitions, and fitted on a LocalCluster of two
worker processes; the in-process EM on the same rows, with the same (empty) hold-out, must take the same steps.
"""

from __future__ import annotations

from pathlib import Path

import distributed
import numpy as np
import pytest

from dist_respattn.engine import FitSettings, fit
from dist_respattn.model.fitting.em import fit_em
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.store import WriteOptions, write_arrays
from tests.engine.clusters import local_cluster
from tests.heads.cases import CASES, KindCase, case_ids

#: EM iterations of both fits.
ITERATIONS = 4
#: 600-row cases in 128-row chunks and 256-row partitions: 3 partitions, the last one partial.
OPTIONS = WriteOptions(chunk_rows=128, partition_rows=256)


@pytest.fixture(scope="module")
def client():
    """A client of a LocalCluster of two single-threaded worker processes (one per module)."""
    with local_cluster(2) as (_, c):
        yield c


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.linalg.norm(b)), 1e-300)
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) / scale)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_the_distributed_fit_equals_fit_em(case: KindCase, client: distributed.Client, tmp_path: Path) -> None:
    """The same head, arrays and per-iteration mean log-likelihoods to 1e-12 relative: only the order of the sums
    differs (per partition, then through the combine tree). The cases' queries are float32 values, which a store
    keeps exactly."""
    spec, data, context = case.make()
    s, _, _, t = context.shape
    store = tmp_path / "train.zarr"
    write_arrays(store, data.context, data.query, data.target, num_symbols=s, num_targets=t, options=OPTIONS,
                 attributes=data.attribute, attribute_names=data.attribute_names)  # fmt: skip
    settings = FitSettings(max_iter=ITERATIONS, tol=0.0, holdout_fraction=0.0)
    result = fit(store, model_dir=tmp_path / "model", settings=settings, head=spec, init=context.init, client=client)
    reference = fit_em(
        data.arrays, spec, attributes=data.attribute, attribute_names=context.attribute_names, init=context.init,
        init_meta=context.init_meta, shape=context.shape, holdout=HoldoutRule(0.0), max_iter=ITERATIONS, tol=0.0,
    )  # fmt: skip

    assert result.state == "max_iter"
    assert result.model.kind == reference.distribution.kind == spec.kind
    ours, meta = result.model.to_arrays()
    theirs, reference_meta = reference.distribution.to_arrays()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert relative_error(ours[name], theirs[name]) < 1e-12, name
    assert meta.keys() == reference_meta.keys()
    history = [entry["mean_log_likelihood"] for entry in result.history]
    np.testing.assert_allclose(history, reference.log_likelihoods, rtol=1e-12, atol=0)
    assert len(history) == ITERATIONS
    # Every row trained: nothing was held out.
    assert [entry["n_obs"] for entry in result.history] == [float(data.num_rows)] * ITERATIONS
    # EM moved: the two fits are not two copies of the start.
    assert history[-1] > history[0]
