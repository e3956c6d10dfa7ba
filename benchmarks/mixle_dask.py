"""Seconds per EM iteration of mixle 0.8.2's Dask backend fitting a responsibility-attention head.

What is measured
----------------
``mixle_dask_seconds_per_iteration`` starts a fresh ``distributed.LocalCluster`` (worker processes, on
127.0.0.1, no dashboard; or runs on one of ``mixle_cluster`` it is given), hands the rows to mixle's Dask
backend and fits ``mixle.stats.latent.responsibility_attention.ResponsibilityAttentionEstimator`` with
``mixle.inference.optimize(..., backend="dask", delta=None, max_its=iterations)`` from a fixed starting
model. ``seconds_per_iteration`` is the mean wall time between consecutive ``on_step`` callbacks of that
one ``optimize`` call, i.e. of iterations 2..k. Each of those iterations is exactly what mixle's loop does
per iteration on a Dask handle:

1. the E-step: the driver pickles the estimator and the current model (~31 MiB at S = T = 2000: the
   S×T emission table in float64) into one task per partition; each worker computes responsibilities
   on its encoded rows and returns its pickled sufficient statistics (~32 MiB, again dominated by S×T);
   the driver folds them and runs the closed-form M-step;
2. the scoring pass of mixle's monotone acceptance gate: the new model is pickled into one task per
   partition again and each worker returns its summed log-likelihood. On a Dask handle mixle cannot
   reuse the E-step normalizer ("fused EM" needs local encoded chunks), so this second pass is always paid.

Not in ``seconds_per_iteration`` (each is reported as its own figure): starting the cluster and importing
mixle on its workers (``cluster_start_seconds``), shipping and encoding the rows (``ingest_seconds``),
building the starting model (``init_seconds``), and the first iteration, which also carries optimize's
scoring pass of the starting model (``first_iteration_seconds``). With ``iterations=1`` there is no interval
between two callbacks, so ``seconds_per_iteration`` falls back to ``first_iteration_seconds`` and says so in
``what``. Converting the caller's arrays to mixle's row type (a list of triples) is not timed at all.

Because every pass moves the whole model per partition, an iteration has a large fixed cost that does not
depend on the rows, so ``rows_per_second`` grows with ``rows``: compare figures taken at the same row count.

How mixle 0.8.2's Dask backend works (``mixle/utils/parallel/planner.py``, ``DaskEncodedData``)
----------------------------------------------------------------------------------------------
- The client is the ``client=`` argument of ``optimize`` (an existing ``distributed.Client``); without it
  mixle uses ``distributed.get_client()`` or starts its own threaded ``Client(processes=False)``.
- Rows DO go through the driver: the in-memory list of ``(context, query, target)`` triples is cut on the
  driver into ``num_partitions`` contiguous slices, and each slice is pickled into a ``client.submit`` task
  (driver -> scheduler -> worker). The worker encodes its slice (``seq_encode``) and keeps the encoded
  arrays as a future held in distributed memory for the rest of the fit; they are not shipped again.
  (A dask collection with ``to_delayed`` would be encoded partition by partition instead; not used here.)
- ``num_partitions = num_chunks or num_workers``, and ``optimize``'s ``num_chunks`` defaults to 1, so an
  ``optimize(rows, backend="dask", client=client)`` call puts ALL rows in ONE partition on ONE worker,
  whatever the cluster size (checked: ``client.who_has()`` lists a single key). Workaround used here:
  pass the partition count explicitly (``num_chunks=partitions``, default one per worker).
- Initialization (``seq_initialize``) and every E-step / scoring pass are one task per partition plus a
  ``gather`` on the driver; estimator and model travel as pickled bytes inside each task, not as
  scattered data, so Dask warns "Sending large graph of size 31.01 MiB" on every pass. That warning (and
  only that one) is silenced here, so the helper also runs under ``python -W error``.
- ``optimize`` prints nothing with its defaults (``out=None``, ``print_iter=None``), so stdout is left alone.

Here the rows are encoded with ``mixle.utils.parallel.planner.encoded_data(..., backend="dask")`` -- the
very call ``optimize`` makes itself when given raw rows -- so that the ingest can be timed on its own, and
the handle is passed to ``optimize(enc_data=...)``. Without ``init`` the starting model is mixle's own
distributed initialization over all rows (``seq_initialize(..., p=1.0)``: the M-step of Dirichlet-random
responsibilities, the same start ``optimize(init_p=1.0)`` would make), passed as ``prev_estimate``.

Run::

    python benchmarks/mixle_dask.py --rows 20000 --iterations 3

Worker processes are spawned, so a script importing this helper must call it under
``if __name__ == "__main__":``. mixle and distributed are imported only when the function is called.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

#: Dask's warning about the ~31 MiB pickled model mixle embeds in every task (see the module docstring).
_LARGE_GRAPH_WARNING = r"Sending large graph of size"


def _triples(context: np.ndarray, query: np.ndarray, target: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Rows as the ``(context int64 (N,), query float64 (D,), target int)`` triples mixle's encoder takes."""
    ctx = np.ascontiguousarray(context, dtype=np.int64)
    qry = np.ascontiguousarray(query, dtype=np.float64)
    # Copies, so that pickling one row never drags a view of the whole (n, N) / (n, D) array along.
    return [(ctx[i].copy(), qry[i].copy(), int(t)) for i, t in enumerate(np.asarray(target).tolist())]


def _as_mixle_model(init: Any, sigma2: float) -> Any:
    """``init`` as a mixle distribution (anything with key_means / emission / position_prior [/ sigma2])."""
    from mixle.stats.latent.responsibility_attention import ResponsibilityAttentionDistribution

    if isinstance(init, ResponsibilityAttentionDistribution):
        return init
    return ResponsibilityAttentionDistribution(
        np.asarray(init.key_means, dtype=np.float64),
        np.asarray(init.emission, dtype=np.float64),
        position_prior=np.asarray(init.position_prior, dtype=np.float64),
        sigma2=float(getattr(init, "sigma2", sigma2)),
    )


@contextlib.contextmanager
def mixle_cluster(workers: int = 2, threads_per_worker: int = 1) -> Iterator[Any]:
    """A client of a fresh ``LocalCluster`` (worker processes, on 127.0.0.1, no dashboard) with mixle imported on
    every worker up front, so that the ingest figure is not a module-import figure; closed on exit."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(workers)
        client.run(importlib.import_module, "mixle.stats.latent.responsibility_attention")
        yield client


def mixle_dask_seconds_per_iteration(
    context: np.ndarray,
    query: np.ndarray,
    target: np.ndarray,
    *,
    num_symbols: int,
    num_targets: int,
    sigma2: float,
    iterations: int,
    workers: int = 2,
    threads_per_worker: int = 1,
    partitions: int | None = None,
    init: Any | None = None,
    seed: int = 0,
    client: Any | None = None,
) -> dict[str, Any]:
    """Time mixle 0.8.2's ``optimize(..., backend="dask")`` on these rows; see the module docstring.

    Args:
        context: ``(n, N)`` int context symbols.
        query: ``(n, D)`` float queries.
        target: ``(n,)`` int targets.
        num_symbols: ``S``.
        num_targets: ``T``.
        sigma2: the fixed gate variance (``estimate_sigma2=False``).
        iterations: EM iterations to run (``max_its``, with ``delta=None``: no convergence stop).
        workers: worker processes in the ``LocalCluster``.
        threads_per_worker: threads per worker process.
        partitions: encoded partitions (mixle's ``num_chunks``); ``None`` means one per worker.
        init: optional starting model (a mixle or dist_respattn ``ResponsibilityAttentionDistribution``);
            ``None`` uses mixle's distributed random initialization, timed as ``init_seconds``.
        seed: seed of that random initialization.
        client: the client of a ``mixle_cluster(workers, threads_per_worker)`` to run on instead of a fresh
            cluster, so that several runs share one cluster start (``cluster_start_seconds`` is then 0).

    Returns:
        ``rows``, ``iterations`` (run; mixle's monotone gate can end a ``delta=None`` run early),
        ``seconds_per_iteration``, ``rows_per_second`` (``rows / seconds_per_iteration``), ``what``, and the
        other figures listed in the module docstring (per-iteration seconds, log-likelihoods, setup times).
    """
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations = {iterations!r}: expected a positive int")
    context = np.asarray(context)
    query = np.asarray(query)
    target = np.asarray(target)
    if context.ndim != 2 or query.ndim != 2 or target.ndim != 1:
        raise ValueError("expected context (n, N), query (n, D) and target (n,) arrays")
    n, context_length = context.shape
    query_dim = query.shape[1]
    if n == 0 or query.shape[0] != n or target.shape[0] != n:
        raise ValueError("context, query and target must have the same, non-zero number of rows")
    num_partitions = workers if partitions is None else int(partitions)

    import mixle
    from mixle.inference.estimation import optimize
    from mixle.stats.compute.sequence import seq_initialize
    from mixle.stats.latent.responsibility_attention import ResponsibilityAttentionEstimator
    from mixle.utils.parallel.planner import encoded_data

    rows = _triples(context, query, target)  # outside every timing: the caller's arrays -> mixle's row type
    estimator = ResponsibilityAttentionEstimator(
        num_symbols, context_length, query_dim, num_targets, sigma2=float(sigma2), estimate_sigma2=False
    )
    stamps: list[float] = []
    log_likelihoods: list[float] = []

    def on_step(step: Any) -> None:
        stamps.append(time.perf_counter())
        log_likelihoods.append(float(step.log_density))

    wall_start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LARGE_GRAPH_WARNING, category=UserWarning)
        with contextlib.ExitStack() as stack:
            own_cluster = client is None
            if own_cluster:
                client = stack.enter_context(mixle_cluster(workers, threads_per_worker))
            cluster_ready = time.perf_counter() if own_cluster else wall_start
            # The call optimize() itself makes for raw rows and backend="dask", plus the partition-count workaround.
            handle = encoded_data(rows, estimator=estimator, backend="dask", client=client, num_chunks=num_partitions)
            try:
                ingested = time.perf_counter()
                if init is None:
                    start = seq_initialize(handle, estimator, np.random.RandomState(seed), p=1.0)
                else:
                    start = _as_mixle_model(init, sigma2)
                initialized = time.perf_counter()
                model = optimize(
                    None,
                    estimator,
                    max_its=iterations,
                    delta=None,
                    prev_estimate=start,
                    enc_data=handle,
                    backend="dask",
                    client=client,
                    on_step=on_step,
                )
                fitted = time.perf_counter()
            finally:
                handle.close()
    wall_end = time.perf_counter()

    if not stamps:
        raise RuntimeError("mixle's optimize ran no iteration")
    intervals = np.diff(np.asarray(stamps)).tolist()
    first = stamps[0] - initialized
    if intervals:
        seconds = float(np.mean(intervals))
        what = (
            f"mean wall time of mixle optimize(backend='dask') iterations 2..{len(stamps)} (between on_step "
            f"callbacks): E-step + driver M-step + scoring pass over {num_partitions} partition(s) on {workers} "
            f"worker process(es) x {threads_per_worker} thread(s); excludes cluster start, row shipping/encoding "
            "and initialization"
        )
    else:
        seconds = first
        what = (
            "wall time of mixle optimize(backend='dask') call -> first on_step callback: the initial scoring pass "
            f"+ iteration 1 (E-step + driver M-step + scoring pass) over {num_partitions} partition(s) on "
            f"{workers} worker process(es) x {threads_per_worker} thread(s)"
        )
    provenance = model.fit_provenance() if callable(getattr(model, "fit_provenance", None)) else None
    return {
        "rows": n,
        "iterations": len(stamps),
        "seconds_per_iteration": seconds,
        "rows_per_second": n / seconds,
        "what": what,
        "iterations_requested": iterations,
        "iteration_seconds": [first, *intervals],
        "first_iteration_seconds": first,
        "log_likelihoods": log_likelihoods,
        "converged": None if provenance is None else bool(provenance.converged),
        "workers": workers,
        "threads_per_worker": threads_per_worker,
        "partitions": num_partitions,
        "init": "mixle seq_initialize(p=1.0)" if init is None else "given",
        "cluster_start_seconds": cluster_ready - wall_start,
        "ingest_seconds": ingested - cluster_ready,
        "init_seconds": initialized - ingested,
        "optimize_seconds": fitted - initialized,
        "shutdown_seconds": wall_end - fitted,
        "total_seconds": wall_end - wall_start,
        "mixle": getattr(mixle, "__version__", "unknown"),
    }


def main(argv: list[str] | None = None) -> None:
    """Sample triples at S=2000, N=16, D=32, T=2000 with our sampler and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="triples to fit (default 20000)")
    parser.add_argument("--iterations", type=int, default=3, help="EM iterations (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes (default 2)")
    parser.add_argument("--threads-per-worker", type=int, default=1, help="threads per worker (default 1)")
    args = parser.parse_args(argv)

    from dist_respattn import random_distribution

    truth = random_distribution(2000, 16, 32, 2000, seed=0)
    context, query, target = truth.sampler(0).sample_arrays(args.rows)
    result = mixle_dask_seconds_per_iteration(
        context,
        query,
        target,
        num_symbols=truth.num_symbols,
        num_targets=truth.num_targets,
        sigma2=truth.sigma2,
        iterations=args.iterations,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
