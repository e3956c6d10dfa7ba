"""Run dist-respattn on a SLURM cluster: one SLURM job per Dask worker, the scheduler in this process.

dask-jobqueue submits the workers (one core, one process each, the memory the engine's estimate asks
for) and this process runs the Dask scheduler (with the fit monitor) and the fit's driver.
dask-jobqueue is not a dependency of dist_respattn; install it beside it::

    pip install 'dask-jobqueue>=0.9'

Two subcommands::

    python respattn_slurm.py fit STORE --model-dir DIR [--validation STORE] [--resume] [--jobs 4] ...
    python respattn_slurm.py retrain --registry DIR_OR_URL --store STORE [--validation STORE] [--keep 10] ...

``fit`` runs :func:`dist_respattn.engine.fit` with a client of the SLURM cluster; ``retrain`` runs
``dist-respattn retrain`` against it (the scheduler's address and the TLS files added). The stores,
the model directory, the certificates and the Python environment must be on a filesystem that the
compute nodes share. See README.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: Where the dashboard listens by default: the loopback of the node running this script, so it is
#: not published beyond it (reach it with ``ssh -L 8787:127.0.0.1:8787 NODE``).
DEFAULT_DASHBOARD = "127.0.0.1:8787"


def build_parser() -> argparse.ArgumentParser:
    """The command line of this script (also read by the tests that check the documented commands)."""
    parser = argparse.ArgumentParser(
        prog="respattn_slurm.py", description="Run a dist-respattn fit or retrain on Dask workers submitted to SLURM."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fit = sub.add_parser("fit", help="fit a head to a store (dist_respattn.engine.fit)")
    fit.add_argument("store", help="the training store (path or URL)")
    fit.add_argument("--model-dir", required=True, help="directory for the checkpoints, on a shared filesystem")
    fit.add_argument("--validation", metavar="STORE", help="held-out store scored after every iteration")
    fit.add_argument("--resume", action="store_true", help="continue the fit in --model-dir (or start one there)")
    fit.add_argument("--init-from", metavar="MODEL", help="warm-start from this model directory")
    fit.add_argument("--max-iter", type=int, help="EM iterations at most (engine default 100)")
    fit.add_argument("--tol", type=float, help="relative log-likelihood change to stop (engine default 1e-6)")
    fit.add_argument("--seed", type=int, help="seed of the random start (engine default 0)")
    fit.add_argument("--patience", type=int, help="held-out iterations without improvement before stopping")
    _add_fan_in(fit)
    _add_cluster_options(fit)

    retrain = sub.add_parser(
        "retrain",
        help="run `dist-respattn retrain` on the SLURM workers",
        description="Run `dist-respattn retrain` against the SLURM cluster; arguments after -- go to it unchanged.",
    )
    retrain.add_argument("--registry", required=True, metavar="DIR_OR_URL", help="the model registry")
    retrain.add_argument("--store", required=True, help="the training store")
    retrain.add_argument("--validation", metavar="STORE", help="the held-out store")
    retrain.add_argument("--keep", type=int, help="model versions to keep in the registry")
    _add_fan_in(retrain)
    _add_cluster_options(retrain)
    retrain.add_argument("extra", nargs="*", metavar="-- RETRAIN_ARGS", help="more `dist-respattn retrain` options")
    return parser


def _add_fan_in(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fan-in", type=int, help="children per combine task (engine default 4); sizes the memory")


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SLURM and Dask")
    group.add_argument("--jobs", type=int, default=2, help="SLURM jobs, one Dask worker each (default 2)")
    group.add_argument(
        "--memory",
        help="memory of each worker job, e.g. 926MiB (default: the engine's estimate for the store over "
        "Dask's spill fraction, rounded up to a MiB)",
    )
    group.add_argument("--queue", help="SLURM partition (#SBATCH -p)")
    group.add_argument("--account", help="SLURM account (#SBATCH -A)")
    group.add_argument("--walltime", default="04:00:00", help="time limit of each worker job (default 04:00:00)")
    group.add_argument("--interface", help="network interface of the scheduler and workers, e.g. ib0")
    group.add_argument("--log-directory", help="where the worker jobs write their output (default: none kept)")
    group.add_argument(
        "--job-extra-directive",
        action="append",
        default=[],
        metavar="DIRECTIVE",
        help="extra #SBATCH line (repeatable)",
    )
    group.add_argument(
        "--dashboard-address", default=DEFAULT_DASHBOARD, help=f"scheduler dashboard (default {DEFAULT_DASHBOARD})"
    )
    group.add_argument(
        "--wait-for-workers",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long to wait for the first worker job to start (default 3600)",
    )
    group.add_argument("--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option (repeatable)")
    tls = parser.add_argument_group("TLS (required unless --no-tls)")
    tls.add_argument("--tls-ca-file", help="CA certificate (PEM) of the cluster")
    tls.add_argument("--tls-cert", help="certificate (PEM) for the scheduler, the workers and the client")
    tls.add_argument("--tls-key", help="its private key (PEM)")
    tls.add_argument(
        "--no-tls", action="store_true", help="plain TCP: anyone who reaches the nodes can use the cluster"
    )


def _storage_options(pairs: list[str] | None) -> dict[str, Any] | None:
    """``KEY=VALUE`` pairs as fsspec options; a value that parses as JSON is taken as such."""
    if not pairs:
        return None
    options: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


#: The smallest worker limit. A worker compiling the kernels on a cold numba cache holds LLVM besides its
#: ~210 MiB at rest; under a limit fitted to a tiny store it crosses Dask's pause threshold (80%) for good
#: and the fit waits on it forever (seen with a 305 MiB limit).
MIN_WORKER_MEMORY = 512 * 2**20


def worker_memory_limit(
    store: str, validation: str | None, *, fan_in: int | None, storage_options: dict[str, Any] | None
) -> int:
    """The memory limit (bytes) a worker needs for a fit on these stores with one thread.

    The engine's estimate (:func:`dist_respattn.engine.memory.estimate_memory`) over Dask's spill
    fraction, rounded up to a whole MiB: the limit at which ``fit``'s own memory check passes. The
    Kubernetes and Compose files apply the same rule to the reference shape. Never less than
    :data:`MIN_WORKER_MEMORY`.
    """
    from dist_respattn.engine import FitSettings, estimate_memory, open_store
    from dist_respattn.engine.memory import usable_fraction

    train = open_store(store, storage_options=storage_options)
    stores = [train] if validation is None else [train, open_store(validation, storage_options=storage_options)]
    # The largest block a task reads, as fit() computes it (dist_respattn/engine/fit.py).
    block_rows = max(min(s.chunk_rows, s.num_rows) for s in stores)
    estimate = estimate_memory(
        train.schema, block_rows=block_rows, threads_per_worker=1, fan_in=fan_in or FitSettings().fan_in
    )
    return max(MIN_WORKER_MEMORY, math.ceil(estimate.worker_bytes / usable_fraction() / 2**20) * 2**20)


def jobqueue_memory(limit: int) -> str:
    """A memory string for dask-jobqueue that gives each worker at least ``limit`` bytes.

    dask-jobqueue hands the worker ``format_bytes(memory)``, rounded to two decimals (926 MiB becomes
    "0.90 GiB", 4 MiB less), which the fit's memory check would then refuse. So step up a MiB at a
    time until the rounded figure is still at least ``limit``.
    """
    from dask.utils import format_bytes, parse_bytes

    candidate = limit
    while parse_bytes(format_bytes(candidate).replace(" ", "")) < limit:
        candidate += 2**20
    return format_bytes(candidate).replace(" ", "")


def _security(args: argparse.Namespace) -> Any:
    """One certificate for every role (Dask's TLS is mutual), or None with --no-tls."""
    from distributed.security import Security

    files = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if args.no_tls:
        return None
    if not all(files):
        raise SystemExit("respattn_slurm.py: give --tls-ca-file, --tls-cert and --tls-key (or --no-tls)")
    ca, cert, key = (os.path.abspath(f) for f in files)
    return Security(
        tls_ca_file=ca,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        tls_client_cert=cert,
        tls_client_key=key,
        require_encryption=True,
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _slurm_cluster(args: argparse.Namespace, memory: str, security: Any) -> Any:
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise SystemExit(
            "respattn_slurm.py: dask-jobqueue is not installed: pip install 'dask-jobqueue>=0.9'"
        ) from None
    return SLURMCluster(
        # One single-threaded worker process per job: the E-step kernel is single-threaded, and
        # the memory estimate is per thread.
        cores=1,
        processes=1,
        memory=memory,
        queue=args.queue,
        account=args.account,
        walltime=args.walltime,
        interface=args.interface,
        job_name="respattn-worker",
        log_directory=args.log_directory,
        job_extra_directives=args.job_extra_directive,
        security=security,
        scheduler_options={"preload": ["dist_respattn.monitor"], "dashboard_address": args.dashboard_address},
    )


def _fit(args: argparse.Namespace, client: Any, storage_options: dict[str, Any] | None) -> int:
    from dist_respattn.engine import FitSettings, fit

    given = {
        name: getattr(args, name)
        for name in ("max_iter", "tol", "seed", "patience", "fan_in")
        if getattr(args, name) is not None
    }
    result = fit(
        args.store,
        model_dir=args.model_dir,
        validation=args.validation,
        settings=FitSettings(**given),
        resume=args.resume,
        init_from=args.init_from,
        client=client,
        storage_options=storage_options,
        say=_say,
        progress=False,
    )
    print(f"EM {result.state} after {result.iterations} iterations in {result.seconds:.1f} s")
    if result.best_iteration is not None:
        print(f"best iteration (held-out): {result.best_iteration}")
    print(f"model: {result.model_dir}")
    return 0


def retrain_command(args: argparse.Namespace, address: str) -> list[str]:
    """``dist-respattn retrain`` as a user would type it, pointed at the scheduler at ``address``."""
    command = [shutil.which("dist-respattn") or "dist-respattn", "retrain", "--registry", args.registry]
    command += ["--store", args.store]
    if args.validation:
        command += ["--validation", args.validation]
    if args.keep is not None:
        command += ["--keep", str(args.keep)]
    if args.fan_in is not None:
        command += ["--fan-in", str(args.fan_in)]
    for pair in args.storage_option or ():
        command += ["--storage-option", pair]
    command += ["--scheduler", address]
    if not args.no_tls:
        command += ["--tls-ca-file", args.tls_ca_file, "--tls-cert", args.tls_cert, "--tls-key", args.tls_key]
    return [*command, *args.extra]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dask.utils import parse_bytes
    from distributed import Client

    storage_options = _storage_options(args.storage_option)
    security = _security(args)
    if args.memory:
        limit = parse_bytes(args.memory)
    else:
        limit = worker_memory_limit(args.store, args.validation, fan_in=args.fan_in, storage_options=storage_options)
    memory = jobqueue_memory(limit)
    with _slurm_cluster(args, memory, security) as cluster, Client(cluster, security=security) as client:
        cluster.scale(jobs=args.jobs)
        _say(f"submitted {args.jobs} worker jobs of {memory} each; scheduler {cluster.scheduler_address}")
        _say(f"dashboard: {client.dashboard_link} (fit monitor at /respattn/fits)")
        client.wait_for_workers(1, timeout=args.wait_for_workers)
        if args.command == "fit":
            return _fit(args, client, storage_options)
        # Its exit status is retrain's own: 0 published, 1 kept the current version, 3 registry busy.
        return subprocess.run(retrain_command(args, cluster.scheduler_address), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
