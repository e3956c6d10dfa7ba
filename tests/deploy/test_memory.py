"""The workers' memory in every deploy file follows the engine's estimate, recomputed here.

Rule (README.md of docker/ and kubernetes/): for the reference shape S=2000, N=16, D=32, T=2000
with the store's default chunk rows, one thread a worker and fan-in 4, the worker limit is
``estimate_memory(...).worker_bytes`` over Dask's spill fraction (0.7), rounded up to a MiB.
"""

from __future__ import annotations

import importlib.util
import math
import re

import pytest
from dask.utils import parse_bytes

from dist_respattn.engine import FitSettings, InsufficientMemoryError, check_memory, estimate_memory
from dist_respattn.engine.memory import usable_fraction
from dist_respattn.store import StoreSchema
from dist_respattn.store.layout import choose_chunking
from tests.deploy import deployfiles as files
from tests.deploy.deployfiles import DOCKER, KUBERNETES, SLURM

REFERENCE = StoreSchema(num_symbols=2000, context_length=16, query_dim=32, num_targets=2000)
MIB = 2**20


def reference_estimate():
    chunk_rows = choose_chunking(REFERENCE.row_bytes).chunk_rows
    return estimate_memory(REFERENCE, block_rows=chunk_rows, threads_per_worker=1, fan_in=FitSettings().fan_in)


def worker_limit() -> int:
    return math.ceil(reference_estimate().worker_bytes / usable_fraction() / MIB) * MIB


def kubernetes_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (binary suffixes, or a plain number of bytes) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", quantity)
    assert match, f"unexpected memory quantity {quantity!r}"
    return int(match.group(1)) * {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[match.group(2)]


def docker_bytes(quantity: str) -> int:
    """A Compose byte value: b, k, m, g are powers of 1024."""
    match = re.fullmatch(r"(\d+)([bkmg])?", quantity.lower())
    assert match, f"unexpected byte value {quantity!r}"
    return int(match.group(1)) * {None: 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match.group(2)]


def _memory_limit_flag(argv) -> int:
    return parse_bytes(argv[list(argv).index("--memory-limit") + 1])


def test_the_rule_is_the_smallest_limit_the_fit_accepts():
    assert usable_fraction() == 0.7  # Dask's default spill threshold, which the files assume
    estimate = reference_estimate()
    assert choose_chunking(REFERENCE.row_bytes).chunk_rows == 131072
    check_memory(estimate, worker_limit=worker_limit(), shape="reference")
    with pytest.raises(InsufficientMemoryError):
        check_memory(estimate, worker_limit=worker_limit() - MIB, shape="reference")


def test_kubernetes_workers_get_the_estimated_memory():
    cluster = files.only(files.manifest("daskcluster.yaml"), "DaskCluster")["spec"]
    job = files.only(files.manifest("daskjob.yaml"), "DaskJob")["spec"]["cluster"]["spec"]
    for spec in (cluster, job):
        (worker,) = spec["worker"]["spec"]["containers"]
        resources = worker["resources"]
        assert kubernetes_bytes(resources["limits"]["memory"]) == worker_limit()
        assert kubernetes_bytes(resources["requests"]["memory"]) == worker_limit()
        assert _memory_limit_flag(worker["args"]) == worker_limit(), "--memory-limit must equal the container limit"
        assert worker["args"][worker["args"].index("--nthreads") + 1] == "1"


def test_compose_workers_get_the_estimated_memory():
    services = files.compose()["services"]
    for name in ("worker-1", "worker-2"):
        (argv,) = files.argv_of(services[name]["command"])
        assert _memory_limit_flag(argv) == worker_limit()
        assert docker_bytes(services[name]["mem_limit"]) == worker_limit()
        assert argv[argv.index("--nthreads") + 1] == "1"


def test_drivers_get_at_least_the_estimated_driver_memory():
    driver = reference_estimate().driver_bytes
    job = files.only(files.manifest("daskjob.yaml"), "DaskJob")["spec"]["job"]["spec"]
    cron = files.only(files.manifest("cronjob-retrain.yaml"), "CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    for pod in (job, cron["spec"]):
        (container,) = pod["containers"]
        assert kubernetes_bytes(container["resources"]["limits"]["memory"]) >= driver
    services = files.compose()["services"]
    for name in ("fit", "retrain"):
        assert docker_bytes(services[name]["mem_limit"]) >= driver


def test_the_readmes_and_manifests_state_the_figures():
    estimate = reference_estimate()
    figures = [f"{round(estimate.worker_bytes / MIB)} MiB", f"{worker_limit() // MIB} MiB"]
    documents = [DOCKER / "README.md", DOCKER / "compose.yaml", KUBERNETES / "README.md"]
    documents += [KUBERNETES / "daskcluster.yaml", SLURM / "README.md"]
    for path in documents:
        text = path.read_text().replace("\n#", "").replace("\n", " ")
        for figure in figures:
            assert figure in text, f"{path.name} does not state {figure}"


def _slurm_script():
    spec = importlib.util.spec_from_file_location("respattn_slurm", SLURM / "respattn_slurm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slurm_workers_get_at_least_the_estimated_memory_after_dask_jobqueue_rounds_it():
    script = _slurm_script()
    memory = script.jobqueue_memory(worker_limit())
    assert parse_bytes(memory) >= worker_limit()
    # What dask-jobqueue hands the worker: format_bytes of the job's memory, spaces dropped.
    from dask.utils import format_bytes

    handed = parse_bytes(format_bytes(parse_bytes(memory)).replace(" ", ""))
    assert worker_limit() <= handed < worker_limit() + 11 * MIB
    check_memory(reference_estimate(), worker_limit=handed, shape="reference")


def test_slurm_script_sizes_workers_by_the_rule_for_the_stores_it_is_given(tmp_path):
    from dist_respattn.store import WriteOptions, write_synthetic

    train = write_synthetic(
        tmp_path / "train.zarr", 5000, num_symbols=30, context_length=4, query_dim=3, num_targets=7,
        options=WriteOptions(chunk_rows=1024),
    )  # fmt: skip
    held_out = write_synthetic(
        tmp_path / "validation.zarr", 3000, num_symbols=30, context_length=4, query_dim=3, num_targets=7, seed=1
    )
    limit = _slurm_script().worker_memory_limit(
        str(train.location), str(held_out.location), fan_in=8, storage_options=None
    )
    # The largest block either store makes a task read is the whole 3,000-row held-out store.
    expected = estimate_memory(train.schema, block_rows=3000, threads_per_worker=1, fan_in=8)
    by_rule = math.ceil(expected.worker_bytes / usable_fraction() / MIB) * MIB
    assert by_rule < 512 * MIB  # a tiny store: the floor applies
    assert limit == max(by_rule, _slurm_script().MIN_WORKER_MEMORY) == 512 * MIB


@pytest.mark.slow  # SLURMCluster starts a Dask scheduler
def test_slurm_job_script_asks_for_that_memory():
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (not a dependency of the package)")
    from dask_jobqueue import SLURMCluster

    script = _slurm_script()
    memory = script.jobqueue_memory(worker_limit())
    with SLURMCluster(
        cores=1, processes=1, memory=memory, interface="lo", scheduler_options={"dashboard_address": "127.0.0.1:0"}
    ) as cluster:
        job = cluster.job_script()
    argv = job.split()
    assert _memory_limit_flag(argv) >= worker_limit()
    assert argv[argv.index("--nthreads") + 1] == "1"
    mem = re.search(r"#SBATCH --mem=(\d+)M", job)
    assert mem and int(mem.group(1)) * MIB >= worker_limit()
