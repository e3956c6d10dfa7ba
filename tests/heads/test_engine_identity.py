"""Every kind's fit on the cluster is bit-identical on one and three workers and after its driver is SIGKILLed and
the fit resumed (one case of each kind of :data:`tests.heads.cases.CASES` the engine's own tests do not cover).

The engine fixes the order of every sum (per partition, then through the combine tree), whichever worker ran a
task and however often it ran; a kind keeps that only if its statistics, M-step and checkpoints hold nothing else
that depends on where or when they were made (a random draw, a dict's order, state kept between iterations). The
single-hop, mixture and gated kinds are tested in ``tests/engine`` (``test_fit.py``, ``test_mixture_kind.py``,
``test_gated_fit.py``, ``test_failures.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import distributed
import numpy as np
import pytest

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.engine import FitSettings, fit
from dist_respattn.store import WriteOptions, write_arrays
from tests.engine.clusters import local_cluster
from tests.heads.cases import CASES, KindCase, case_ids

#: The kinds tested elsewhere (see the module's docstring). The stack's E-step is a fixed-order sum of its
#: components' per-row terms with nothing kept between iterations; its distributed fit equals ``fit_em`` in the
#: engine contract, and a resumed stack's start is its checkpoint (``tests/model/test_stack.py``): its ~20 s here
#: are left to the suite's budget. The repeat gate's likewise (its per-row terms summed in a fixed order, its rates
#: counted before the first iteration, so EM does not move from a start of its own: ``tests/test_cli_repeat.py`` fits
#: it on a token stream on two workers and resumes it).
TESTED_IN_ENGINE = ("single_hop", "mixture", "gated", "stack", "repeat")
#: The first case of every other kind.
FIRST_OF_EACH_KIND = list(
    {case.name.split("-")[0]: case for case in reversed(CASES) if case.name.split("-")[0] not in TESTED_IN_ENGINE}
    .values()
)  # fmt: skip
#: EM iterations; the driver is killed once iteration ``KILLED_AT``'s line is said. Three: the resumed fit still
#: runs at least one iteration after the kill, from the checkpoint it resumed.
ITERATIONS, KILLED_AT = 3, 2
#: The contract suite's layout: 3 partitions, the last one partial.
OPTIONS = WriteOptions(chunk_rows=128, partition_rows=256)
ROOT = Path(__file__).resolve().parents[2]


def assert_bit_identical(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], fit_name: str) -> None:
    assert ours.keys() == theirs.keys(), fit_name
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), (fit_name, name)


@pytest.fixture(scope="module")
def one_worker() -> Iterator[tuple[distributed.LocalCluster, distributed.Client]]:
    """The module's cluster of one worker process, shared by every case (a fit leaves nothing on it: its tasks and
    scattered parameters are released when it ends, or when a killed driver's client goes)."""
    with local_cluster(1) as made:
        yield made


@pytest.fixture(scope="module")
def three_workers() -> Iterator[distributed.Client]:
    """The module's cluster of three worker processes, shared by every case."""
    with local_cluster(3) as (_, client):
        yield client


@pytest.mark.slow
@pytest.mark.parametrize("case", FIRST_OF_EACH_KIND, ids=case_ids)
def test_one_three_workers_and_a_killed_then_resumed_driver_give_bit_identical_heads(
    case: KindCase,
    tmp_path: Path,
    one_worker: tuple[distributed.LocalCluster, distributed.Client],
    three_workers: distributed.Client,
) -> None:
    spec, data, context = case.make()
    assert context.init is None, "a case that starts from a fitted head needs its start passed to the killed driver"
    s, _, _, t = context.shape
    store = tmp_path / "train.zarr"
    write_arrays(store, data.context, data.query, data.target, num_symbols=s, num_targets=t, options=OPTIONS,
                 attributes=data.attribute, attribute_names=data.attribute_names)  # fmt: skip
    settings = FitSettings(max_iter=ITERATIONS, tol=0.0, holdout_fraction=0.0)
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_json()))
    heads = {}
    cluster, client = one_worker
    assert len(client.scheduler_info()["workers"]) == 1
    heads["one worker"] = fit(store, model_dir=tmp_path / "one", settings=settings, head=spec, client=client)
    killed = subprocess.run(
        [sys.executable, "-m", "tests.heads.killed_fit", str(tmp_path / "spec.json"), str(store),
         str(tmp_path / "killed"), cluster.scheduler_address, str(ITERATIONS), str(KILLED_AT)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr  # SIGKILL, at iteration 2's line
    assert load_checkpoint(tmp_path / "killed", "latest").iteration <= KILLED_AT
    heads["resumed"] = fit(store, model_dir=tmp_path / "killed", settings=settings, head=spec, client=client,
                           resume=True)  # fmt: skip
    assert len(three_workers.scheduler_info()["workers"]) == 3
    heads["three workers"] = fit(store, model_dir=tmp_path / "three", settings=settings, head=spec,
                                 client=three_workers)  # fmt: skip
    reference = heads.pop("one worker")
    assert reference.state == "max_iter" and reference.model.kind == spec.kind
    expected, _ = reference.model.to_arrays()
    for name, result in heads.items():
        ours, _ = result.model.to_arrays()
        assert_bit_identical(ours, expected, name)
        assert [e["mean_log_likelihood"] for e in result.history] == [
            e["mean_log_likelihood"] for e in reference.history
        ], name
    # EM moved, so the equalities above are not those of an untouched start.
    assert reference.history[-1]["mean_log_likelihood"] > reference.history[0]["mean_log_likelihood"]
