"""Connecting to a Dask cluster: an embedded ``LocalCluster`` by default, or an existing scheduler.

The engine closes only what it started: a client it made for an address is closed, the cluster
behind it never is.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dask.config
import distributed

from dist_respattn.text_format import count_text

__all__ = [
    "FORKED_WORKERS",
    "QUIET_CLUSTER",
    "WHOLE_VALUES",
    "WORKER_MODULES",
    "ClusterError",
    "ClusterInfo",
    "ClusterOptions",
    "check_address",
    "cluster_info",
    "connect",
    "embedded_cluster_config",
    "embedded_cluster_settings",
    "embedded_worker_memory",
    "machine_cores",
    "starts_embedded_cluster",
]

logger = logging.getLogger(__name__)

#: Environment variable naming the scheduler when no address is given (the one Dask itself reads).
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"

#: How long to try reaching a scheduler before giving up.
CONNECT_TIMEOUT_SECONDS = 10.0

#: How long an embedded cluster's workers may take to come up before the banner counts those that did.
WORKERS_UP_SECONDS = 30.0

#: How long to wait for the dashboard's status page when checking that it is served.
DASHBOARD_CHECK_SECONDS = 5.0


#: Dask settings of an embedded cluster, quieter than Dask's defaults: what an idle worker process does when it is
#: not running a task (the profiler sampling every 10 ms, the event loop's 20 ms health tick, the system monitor
#: every 0.5 s, the memory monitor every 0.1 s) costs a core's CPU that a 2-core machine's fit shares. Measured on
#: a 2-core host: an idle worker 3.7% of a core with Dask's defaults, 0.3% with these; the driver (the scheduler,
#: the client and the nannies) 5.0% and 0.9%. What they give up: the dashboard's profile pages, an event loop
#: blocked for under 3 s going unreported, system plots at 2 s and a worker over its memory limit caught within
#: 0.25 s rather than 0.1 s. A setting the user has changed from Dask's default is left as the user set it.
QUIET_CLUSTER: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "250ms",
}


#: Dask splits a message's buffers larger than ``distributed.comm.shard`` (64 MiB by default) into frames of that
#: size, and the receiver copies the frames back into one buffer: a sparse fit's E-step value (8 bytes a support pair,
#: 121 MiB at 14.2M pairs) and its head cost a fresh allocation and a copy each time they reach a worker (40-84 ms of
#: CPU to take in a 113 MB value, against 2 ms whole). An embedded cluster's workers send them whole, in frames of up
#: to 1 GiB (below the 2 GiB a single TLS write can take). Dask reads the setting when its comm module is imported,
#: before a worker process applies the nanny's config, so it goes as an environment variable set before the worker
#: starts (the nanny's ``pre-spawn-environ``), which a worker the nanny restarts gets too.
WHOLE_VALUES: dict[str, Any] = {"distributed.nanny.pre-spawn-environ.DASK_DISTRIBUTED__COMM__SHARD": "1GiB"}


#: Dask starts each worker process as a fresh interpreter (multiprocessing's ``spawn``), which imports distributed,
#: numpy, zarr, numba and this package again before its first task, every embedded cluster of a process anew. An
#: embedded cluster's workers are forked instead from one server process that imported them once (``forkserver``,
#: :data:`WORKER_MODULES`): measured on 2 idle cores, 10 clusters of 2 workers that each ran one task took 23-28 s of
#: CPU with spawned workers and 5-6 s with forked ones (12-15 s and 3-4 s of wall time). Where Python has no
#: forkserver (Windows), workers are spawned.
FORKED_WORKERS: dict[str, Any] = {"distributed.worker.multiprocessing-method": "forkserver"}

#: What the forkserver imports before it forks a worker: what a worker's tasks run (the head kinds, their kernels'
#: modules, the store readers). The server is a process's own, started by its first embedded cluster and kept while
#: the process lives, its modules as they were imported then, with what they read from the environment then (the
#: nannies set ``pre-spawn-environ``, such as :data:`WHOLE_VALUES` and one thread for BLAS, before it starts).
WORKER_MODULES = ("distributed", "dist_respattn.engine.worker_preload")


def embedded_cluster_config() -> dict[str, Any]:
    """The settings of :data:`QUIET_CLUSTER`, :data:`WHOLE_VALUES` and :data:`FORKED_WORKERS` (where Python has a
    forkserver) that the user has not set: what an embedded cluster starts under (:func:`embedded_cluster_settings`).
    A value the user set is kept: one named in a Dask config file or a ``DASK_*`` variable (even Dask's default
    value, such as ``DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD=spawn``), or one ``dask.config.set`` changed
    from the default; a shard size the user set keeps :data:`WHOLE_VALUES` out.

    Set while the cluster starts, they reach its scheduler and, through their nannies, its worker processes
    (and a worker a nanny restarts)."""
    shipped = dask.config.merge(*dask.config.defaults)
    # What the user's config files and environment name, read now: dask.config.config has merged them into the
    # defaults, where a value equal to the default no longer shows that the user chose it. A nanny sets its
    # pre-spawn variables in the process that runs it, so after an embedded cluster this process's environment
    # holds WHOLE_VALUES' variable, which the user did not set.
    ours = {key.rsplit(".", 1)[1]: value for key, value in WHOLE_VALUES.items()}
    named = dask.config.collect(env={name: value for name, value in os.environ.items() if ours.get(name) != value})

    def unchanged(key: str) -> bool:
        named_by_user = dask.config.get(key, None, config=named) is not None
        return not named_by_user and bool(dask.config.get(key, None) == dask.config.get(key, None, config=shipped))

    settings = {key: value for key, value in QUIET_CLUSTER.items() if unchanged(key)}
    if unchanged("distributed.comm.shard"):
        settings.update({key: value for key, value in WHOLE_VALUES.items() if unchanged(key)})
    if "forkserver" in multiprocessing.get_all_start_methods():
        settings.update({key: value for key, value in FORKED_WORKERS.items() if unchanged(key)})
    return settings


@contextlib.contextmanager
def embedded_cluster_settings() -> Iterator[None]:
    """The block under :func:`embedded_cluster_config`, in which an embedded cluster starts; with forked workers,
    the forkserver (when this starts it) imports :data:`WORKER_MODULES` first.

    A forked worker starts with the forkserver's environment, this process's when the server started; its nanny
    then sets this process's environment as it is when the cluster starts, as a spawned worker inherits it
    (credentials set since, say). The settings hold while the cluster starts: a worker its nanny restarts later is
    started under the process's own settings (spawned, by Dask's default)."""
    with dask.config.set(embedded_cluster_config()):
        if dask.config.get("distributed.worker.multiprocessing-method") != "forkserver":
            yield
            return
        import distributed.utils

        # distributed gives the forkserver its own list of modules the first time it starts a worker by it; asked
        # first, it has done so, and this list replaces it.
        distributed.utils.get_mp_context().set_forkserver_preload(list(WORKER_MODULES))
        environ = {**os.environ, **dask.config.get("distributed.nanny.environ")}  # a variable set for Dask wins
        with dask.config.set({"distributed.nanny.environ": environ}):
            yield


class ClusterError(RuntimeError):
    """The cluster cannot be reached, or has no workers to run on."""


@dataclass(frozen=True)
class ClusterOptions:
    """How a call that is given no client gets a cluster: a scheduler's address, else an embedded LocalCluster.

    ``fit``, ``evaluate``, ``predict`` and ``retrain`` take one of these (beside an optional ``client``, which
    wins).

    Attributes:
        scheduler: the address of a running scheduler (default: ``$DASK_SCHEDULER_ADDRESS``, else an
            embedded cluster).
        n_workers: worker processes of an embedded cluster (default: one a core).
        threads_per_worker: threads of each embedded worker.
        memory_limit: each embedded worker's memory limit (``"2GiB"``, bytes, or ``"auto"``: an even share
            of the machine).
        security: the TLS certificates for a ``tls://`` scheduler (default: Dask's ``distributed.comm.tls``
            config).
    """

    scheduler: str | None = None
    n_workers: int | None = None
    threads_per_worker: int = 1
    memory_limit: str | int = "auto"
    security: distributed.Security | None = None


@dataclass(frozen=True)
class ClusterInfo:
    """What a fit needs to know about the workers it runs on.

    Attributes:
        workers: number of workers.
        threads: total worker threads.
        memory_limits: each worker's memory limit in bytes (0 = no limit), in address order.
        dashboard: the dashboard URL, or ``None`` when the scheduler serves none.
        address: the scheduler address.
    """

    workers: int
    threads: int
    memory_limits: tuple[int, ...]
    dashboard: str | None
    address: str

    @property
    def smallest_memory_limit(self) -> int:
        """The tightest worker memory limit in bytes, or 0 when no worker has one."""
        limits = [m for m in self.memory_limits if m]
        return min(limits) if limits else 0


def machine_cores() -> int:
    """Cores this process may run on (the affinity mask, not the host's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def refuse_a_worker_reimport(options: ClusterOptions | None = None, client: distributed.Client | None = None) -> None:
    """Raise :class:`ClusterError` in a worker process of an embedded cluster that is importing the main script
    again (a script without a ``__main__`` guard), when these arguments of :func:`connect` would start a cluster of
    its own. A call that starts one checks this first, before it takes any lock its parent holds."""
    if starts_embedded_cluster(options, client) and _importing_main_in_a_worker():
        raise ClusterError(
            "this script is being imported again by a worker process of the cluster it starts (each worker "
            "process imports the main script), so it would start one of its own: put the calls under "
            '`if __name__ == "__main__":` (see the docs\' quickstart)'
        )


def starts_embedded_cluster(options: ClusterOptions | None, client: distributed.Client | None) -> bool:
    """Whether :func:`connect` with these arguments starts (and at the end closes) a LocalCluster of its own."""
    scheduler = options.scheduler if options is not None else None
    return client is None and not (scheduler or os.environ.get(SCHEDULER_ENV))


def embedded_worker_memory(options: ClusterOptions | None) -> int:
    """The memory limit in bytes each worker of an embedded cluster gets (0: none), as its worker computes it.

    Known before the cluster starts, so a plan that cannot fit is refused without starting one (a worker
    given too little memory is killed as it starts, and the cluster then never has workers).
    """
    from distributed.worker_memory import parse_memory_limit

    options = options or ClusterOptions()
    try:
        limit = parse_memory_limit(options.memory_limit, options.threads_per_worker, logger=logger)
    except (ValueError, TypeError) as exc:
        raise ClusterError(
            f"memory_limit = {options.memory_limit!r}: expected a size such as 2GiB, a fraction of the machine, "
            "or 'auto'"
        ) from exc
    return int(limit or 0)


def cluster_info(client: distributed.Client) -> ClusterInfo:
    """Workers, threads, memory limits and dashboard of the cluster ``client`` talks to."""
    info = client.scheduler_info(n_workers=-1)
    workers = [info["workers"][address] for address in sorted(info["workers"])]
    return ClusterInfo(
        workers=len(workers),
        threads=sum(int(w.get("nthreads", 1)) for w in workers),
        memory_limits=tuple(int(w.get("memory_limit") or 0) for w in workers),
        dashboard=_dashboard_link(client, info),
        address=str(info.get("address", client.scheduler.address if client.scheduler else "")),
    )


def _dashboard_link(client: distributed.Client, info: dict[str, Any]) -> str | None:
    """The dashboard's URL when the scheduler serves one.

    The scheduler always runs an HTTP server under the service name "dashboard"; the pages exist
    only when the dashboard is on (and bokeh installed), so ask whether the status page is there: a
    404 means there is none. A URL this process cannot reach is reported as it is.
    """
    if "dashboard" not in info.get("services", {}):
        return None
    try:
        link = client.dashboard_link
    except (KeyError, AttributeError, ValueError):
        return None
    return link if _serves_dashboard(link) else None


@functools.lru_cache(maxsize=32)
def _serves_dashboard(link: str) -> bool:
    """Whether ``link`` names a page (asked once per link: it names one scheduler's port).

    Asked with ``HEAD``: a ``GET`` of the status page makes the scheduler build the page's Bokeh document
    (0.25 s of its CPU) and keep it updating until the unused session expires (another 0.25 s over the
    next 30 s), for a page nobody opens. Bokeh's page handler answers ``HEAD`` with 405; a path with no
    page behind it answers 404. Connecting and fitting both describe the cluster; an unreachable link
    would otherwise cost its timeout twice. A link this process cannot reach counts as served (it may be,
    for others).
    """
    request = urllib.request.Request(link, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=DASHBOARD_CHECK_SECONDS):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code != 404
    except (urllib.error.URLError, OSError):
        return True


def _local_cluster(n_workers: int | None, threads_per_worker: int, memory_limit: str | int) -> distributed.LocalCluster:
    """A LocalCluster of worker processes on 127.0.0.1, one worker a core by default, dashboard on a free port.

    One thread a worker: the E-step kernel is single-threaded and each task holds its own statistics,
    so processes (not threads) are what scale, and each gets an even share of the machine's memory.
    """
    refuse_a_worker_reimport()
    try:
        # The quieter settings reach the scheduler and, through their nannies, the worker processes.
        with embedded_cluster_settings(), _started_deaf_to_stop_signals():
            return distributed.LocalCluster(
                n_workers=n_workers or machine_cores(),
                threads_per_worker=threads_per_worker,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
                memory_limit=memory_limit,
                # A task's error reaches the caller as its exception; the workers' own log lines of it
                # (a traceback per failed task) would only bury that one-line message.
                silence_logs=logging.CRITICAL,
            )
    except RuntimeError as exc:  # distributed's "Nanny failed to start": a worker process died while starting
        raise ClusterError(
            f"the local cluster did not start ({exc})"
            + ("; a worker process that failed printed its own error above" if "Nanny failed" in str(exc) else "")
        ) from exc


#: The signals that stop a run: Ctrl-C's, and ``kill``'s or a service manager's.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM, where Python code handles them (Ctrl-C's ``KeyboardInterrupt``, the command
    line's handlers), until the block ends, then give the first to its handler.

    For what must not stop half-way: a local cluster stopped in the middle of its start or its close leaves
    worker processes behind, and distributed's exit hook then fails on them (``AssertionError: Status.init``).
    A second signal while one is held is given at once, so a start that hangs can still be stopped. Only the
    main thread can set handlers; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Only handlers of Python code: the default action of a signal (SIGTERM's: the end of the process) is as it was.
    handlers: dict[int, Callable[[int, Any], Any]] = {}
    for stop in _STOP_SIGNALS:
        handler = signal.getsignal(stop)
        if callable(handler):
            handlers[int(stop)] = handler
    received: list[int] = []

    def restore() -> None:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)

    def hold(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) > 1:  # asked again: stop now
            restore()
            handlers[signum](signum, frame)

    for signum in handlers:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        restore()
        if len(received) == 1:
            handlers[received[0]](received[0], None)


@contextlib.contextmanager
def _started_deaf_to_stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread for the block, so that the threads started in it (a cluster's event
    loop, and the threads it starts worker processes from) block them too, and so do the processes they start (a
    signal mask is kept through fork and exec). The command's main thread still takes them, and stops the workers
    itself: it closes the cluster (a worker that does not close is killed, by SIGKILL), and a worker whose command
    died ends with it (distributed's parent-alive pipe).

    Ctrl-C at a terminal signals the whole foreground process group, and a service manager (or ``kill -- -PGID``)
    sends SIGTERM to all of it: a worker process that took Ctrl-C died printing asyncio's traceback, and its nanny
    started another, while the command closed the cluster; one that took SIGTERM died in the middle of its task, and
    multiprocessing's resource tracker printed a leaked-semaphore warning after the command's last line."""
    if not hasattr(signal, "pthread_sigmask"):  # not on POSIX
        yield
        return
    from multiprocessing import resource_tracker

    # Started before, once a process: the thread that starts multiprocessing's resource tracker (the first worker
    # process's does) unblocks SIGINT and SIGTERM after it, whatever was blocked before.
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOP_SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _close_whole(resource: distributed.Client | distributed.LocalCluster) -> None:
    """Close ``resource`` with the stop signals held (see :func:`_stop_signals_held`)."""
    with _stop_signals_held():
        resource.close()


def _drop_abandoned_gathers(client: distributed.Client) -> None:
    """Keep the asyncio loop of ``client`` (one the engine made) from logging the ``AllExit`` of a gather that was
    given up: a call stopped by Ctrl-C cancels its gather, whose waits on each result distributed leaves running,
    and when the client closes they end in ``AllExit``, distributed's own signal to stop waiting, which asyncio
    printed with a traceback as "Task exception was never retrieved". Other errors reach the handler there was."""
    from distributed.client import AllExit

    if client.loop is None:  # a client being closed
        return
    loop = client.loop.asyncio_loop  # type: ignore[attr-defined]
    previous = loop.get_exception_handler()

    def handle(loop: Any, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), AllExit):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


def _importing_main_in_a_worker() -> bool:
    """Whether this process is a child that multiprocessing is still starting, running the parent's main script
    again (as ``__mp_main__``, the name ``runpy`` gives it while it runs) before the child's own work: a script
    that starts a cluster outside an ``if __name__ == "__main__":`` guard does, in every worker process."""
    import multiprocessing
    import sys

    # multiprocessing marks a child it is still preparing with ``_inheriting`` (its own check for this case reads
    # it); a child that runs a fit in its own function, once started, is not refused.
    bootstrapping = bool(getattr(multiprocessing.current_process(), "_inheriting", False))
    return bootstrapping and "__mp_main__" in sys.modules


@contextlib.contextmanager
def connect(
    options: ClusterOptions | None = None,
    *,
    client: distributed.Client | None = None,
    say: Callable[[str], Any] | None = None,
) -> Iterator[distributed.Client]:
    """A client for the fit: the given ``client``, a scheduler address, or an embedded LocalCluster.

    Order: ``client`` (used as is, never closed); ``options.scheduler`` or ``$DASK_SCHEDULER_ADDRESS`` (a
    new client, closed on exit, the cluster left running); otherwise a LocalCluster of
    ``options.n_workers`` processes (default: one a core) that is closed on exit. ``say`` receives one
    line naming the cluster and its dashboard. Every cluster gets the fit monitor (:mod:`dist_respattn.monitor`).
    """
    if client is not None:
        install_monitor(client)
        yield client
        return
    options = options or ClusterOptions()
    address = options.scheduler or os.environ.get(SCHEDULER_ENV) or None
    if address:
        own_client = _client_for(address, options.security)
        with own_client:
            _drop_abandoned_gathers(own_client)
            install_monitor(own_client)
            _announce(own_client, f"connected to the scheduler at {address}", say)
            yield own_client
        return
    with contextlib.ExitStack() as closing:
        # Started whole and closed whole, a signal held meanwhile: a cluster stopped half-way leaves worker processes
        # behind (a client half-made lingers), and a signal held through the start is given only once both are
        # sure to be closed.
        with _stop_signals_held():
            cluster = _local_cluster(options.n_workers, options.threads_per_worker, options.memory_limit)
            closing.callback(_close_whole, cluster)
            own_client = distributed.Client(cluster, set_as_default=False)
            closing.callback(_close_whole, own_client)
        _drop_abandoned_gathers(own_client)
        install_monitor(own_client)
        requested = len(cluster.worker_spec)
        with contextlib.suppress(TimeoutError):  # the fit itself waits for a first worker, and says so
            own_client.wait_for_workers(requested, timeout=WORKERS_UP_SECONDS)
        _announce(
            own_client, f"started a local cluster of {count_text(requested, 'worker process', 'worker processes')}", say
        )
        yield own_client


def fit_page_url(client: distributed.Client, *, timeout: float = 2.0) -> str | None:
    """The fit page's URL (:mod:`dist_respattn.monitor`) when the cluster's web server serves it, else ``None``.

    The monitor is installed best effort and the page needs the dashboard, so the page is named only when it
    answers. The probe goes to the cluster's host directly: a proxy from ``$http_proxy`` would make it slow or
    wrong, and the page silently unnamed.
    """
    import urllib.error
    import urllib.request

    from dist_respattn.monitor.web import page_url

    dashboard = cluster_info(client).dashboard
    if dashboard is None:
        return None
    url = page_url(dashboard)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return url if response.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def install_monitor(client: distributed.Client) -> None:
    """Add the fit monitor to the client's scheduler unless it has one (preloaded, or by an earlier fit).

    Best effort: a scheduler that cannot import this package still runs the fit, without the page.
    """
    from dist_respattn.monitor import FitMonitor

    try:
        client.register_plugin(FitMonitor(), name=FitMonitor.name)
    except Exception as exc:
        logger.warning("the scheduler did not take the fit monitor (%s); fits run without its page", exc)


def _client_for(address: str, security: distributed.Security | None = None) -> distributed.Client:
    """A client of the scheduler at ``address``, or a :class:`ClusterError` within the connect timeout.

    The client is made on a daemon thread with a deadline of our own: ``Client(timeout=...)`` gives up
    on a closed port, but waits forever on a port that accepts connections and never speaks Dask
    (dask/distributed#8071), such as a dashboard port given by mistake.
    """
    check_address(address)
    if address.startswith("tls://") and not _has_certificates(security):
        # Checked before a Client exists: a Client that failed on TLS lingers and stalls the exit by 20 s.
        raise ClusterError(
            f"the scheduler at {address} speaks TLS and this client has no certificates: give --tls-ca-file, "
            "--tls-cert and --tls-key (or set distributed.comm.tls.ca-file and distributed.comm.tls.client.cert/key "
            "in Dask's config)"
        )
    outcome: list[Any] = []

    def make() -> None:
        try:
            outcome.append(
                distributed.Client(address, timeout=CONNECT_TIMEOUT_SECONDS, set_as_default=False, security=security)
            )
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=make, name="respattn-connect", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT_SECONDS + 1.0)
    if not outcome:
        raise ClusterError(
            f"the Dask scheduler at {address} did not answer within {CONNECT_TIMEOUT_SECONDS + 1.0:.0f} s: "
            "something listens there but does not speak Dask; is this the scheduler's address (not its dashboard)?"
        )
    result = outcome[0]
    if isinstance(result, distributed.Client):
        return result
    if isinstance(result, TimeoutError):
        raise ClusterError(
            f"cannot reach the Dask scheduler at {address} within {CONNECT_TIMEOUT_SECONDS:.0f} s; "
            "is it running, and is the address right?"
        ) from result
    if isinstance(result, OSError):
        question = (
            "was the scheduler's certificate signed by the CA given (--tls-ca-file), and this client's by one the "
            "cluster trusts?"
            if address.startswith("tls://")
            else "is it running, and is the address right?"
        )
        raise ClusterError(
            f"cannot reach the Dask scheduler at {address} ({type(result).__name__}: {result}); {question}"
        ) from result
    raise result


def check_address(address: str) -> None:
    """Raise :class:`ClusterError` when ``address`` cannot name a scheduler (no port, an unknown protocol).

    Checked before a ``Client`` exists: one made for a bad address fails, then lingers and stalls the
    interpreter's exit by 20 s with an ignored traceback from its ``__del__``.
    """
    from distributed.comm import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        scheme, where = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(where)
    except ValueError as exc:
        raise ClusterError(
            f"scheduler={address!r} is not a scheduler address ({' '.join(str(exc).split())}): expected "
            "tcp://HOST:PORT or tls://HOST:PORT (the scheduler's port, 8786 by default), or set $DASK_SCHEDULER_ADDRESS"
        ) from None


def _has_certificates(security: distributed.Security | None) -> bool:
    """Whether ``security`` (or, without one, Dask's ``distributed.comm.tls`` config) names a CA file."""
    return bool(getattr(security or distributed.Security(), "tls_ca_file", None))


def _announce(client: distributed.Client, what: str, say: Callable[[str], Any] | None) -> None:
    if say is None:
        return
    info = cluster_info(client)
    dashboard = f"; dashboard: {info.dashboard}" if info.dashboard else "; no dashboard (is bokeh installed?)"
    say(f"{what} ({count_text(info.workers, 'worker')}, {count_text(info.threads, 'thread')}){dashboard}")
