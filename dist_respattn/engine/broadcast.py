"""The current parameters on the cluster: scattered once per model to every worker, the previous ones released.

The same holds for the other per-iteration payload, the M-step's grid table the held-out pass reads. The tables
fixed for a fit that they hold (a sparse emission's support) go once a fit, apart (:class:`FitTables`), and each
worker keeps them to the fit's end (:mod:`~dist_respattn.engine.held_tables`): an iteration sends only what changed.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

import distributed

from dist_respattn.engine.cluster import ClusterError
from dist_respattn.engine.held_tables import SentTable, TableRef, table_digest
from dist_respattn.engine.payload import split_payload
from dist_respattn.model.fixed import FitConstant

__all__ = ["FitTables", "ParameterBroadcast", "payload_bytes", "scatter_to"]

logger = logging.getLogger(__name__)

#: A scatter's deadline: this many seconds, plus the emission's size at the rate below.
SCATTER_SECONDS = 20.0
SCATTER_BYTES_PER_SECOND = 20e6

#: Scatters tried before the fit fails.
SCATTER_ATTEMPTS = 3


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, or ``TimeoutError`` after ``seconds`` (the call is left to finish on its own)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="respattn-scatter", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise TimeoutError(f"no answer within {seconds:.0f} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def payload_bytes(payload: Any) -> int:
    """The bytes of a payload's arrays (a head's, or a grid's: their ``nbytes()``), which its transfer takes."""
    size = getattr(payload, "nbytes", None)
    return int(size()) if callable(size) else 0


def scatter_to(
    client: distributed.Client,
    key: str,
    value: Any,
    workers: Sequence[str] | None = None,
    *,
    keep: TableRef | None = None,
) -> distributed.Future:
    """Send ``value`` to ``workers`` (those of them alive; ``None``, or none of them alive: to every worker) under
    ``key``, again (under a new key) if a worker dies during the transfer. With ``keep`` (a table fixed for the fit,
    ``keep`` its reference under whatever key it goes as), each worker keeps it for the fit as it arrives (it goes as
    a :class:`~dist_respattn.engine.held_tables.SentTable`).

    A worker killed mid-transfer fails the send (its stream closed); a deadline guards the rest.
    """
    deadline = SCATTER_SECONDS + payload_bytes(value) / SCATTER_BYTES_PER_SECOND
    for attempt in range(SCATTER_ATTEMPTS):
        name = key if attempt == 0 else f"{key}.s{attempt}"

        def send(name: str = name) -> distributed.Future:
            # Straight from the client to each worker in turn. The scheduler's own broadcast waits
            # for good on a worker that died during its replication, and so would every later one.
            client.wait_for_workers(1, timeout=deadline)  # lost workers may still be restarting
            alive = list(client.ncores())
            chosen = [w for w in alive if workers is not None and w in workers] or alive
            future = None
            sent = value if keep is None else SentTable(dataclasses.replace(keep, key=name), value)
            for worker in chosen:
                future = client.scatter({name: sent}, workers=[worker], direct=True)[name]
            if future is None:
                raise TimeoutError("the cluster has no workers")
            return future

        try:
            return _within(deadline, send)
        except (OSError, TimeoutError) as exc:  # CommClosedError is an OSError
            if attempt + 1 == SCATTER_ATTEMPTS:
                raise ClusterError(f"could not send the parameters to the workers: {exc}") from exc
            logger.warning("sending the parameters failed (%s); sending them again to the workers alive now", exc)
    raise AssertionError("unreachable")


class FitTables:
    """The tables fixed for one fit (:class:`~dist_respattn.model.fixed.FitConstant`) on the workers, each sent once.

    A table is known by identity (the same object in every model and grid of the fit) under the key
    ``respattn-table-<n>-<tag>``. Its future lives until :meth:`release`; the tasks get a
    :class:`~dist_respattn.engine.held_tables.TableRef` to it. Each worker it is sent to keeps it to the fit's end from
    its arrival (a worker that lacks it, one outside the pass it was sent for or one that replaced a lost worker,
    fetches it on its first task, and keeps it from then on). :meth:`forget` drops
    them all after a pass lost work with every holder: the next payload sends them again, under new keys (and a worker
    that kept them finds them by their digest).
    """

    def __init__(self, client: distributed.Client, run_tag: str) -> None:
        self.client = client
        self.run_tag = run_tag
        self._keys: dict[int, tuple[FitConstant, str]] = {}
        self._futures: dict[str, distributed.Future] = {}
        self._refs: dict[str, TableRef] = {}
        #: Each table's digest and bytes, by identity (computed once a fit).
        self._digests: dict[int, tuple[FitConstant, tuple[str, int]]] = {}
        self._count = 0
        #: Tables sent so far (a table sent again after :meth:`forget` counts again).
        self.sent = 0

    def key_for(self, table: FitConstant) -> str:
        """``table``'s key (a new one for a table not met before)."""
        known = self._keys.get(id(table))
        if known is not None and known[0] is table:
            return known[1]
        key = f"respattn-table-{self._count}-{self.run_tag}"
        self._count += 1
        self._keys[id(table)] = (table, key)  # held: its id is never another table's while it is here
        return key

    def _digest(self, table: FitConstant) -> tuple[str, int]:
        known = self._digests.get(id(table))
        if known is None or known[0] is not table:
            known = (table, table_digest(table))
            self._digests[id(table)] = known
        return known[1]

    def futures(self, tables: dict[str, FitConstant], workers: Sequence[str] | None) -> dict[str, TableRef]:
        """The references of ``tables`` (by key) the tasks get, each table sent to ``workers`` the first time it is
        asked for (and again, under a new key, if it was lost with every worker holding it)."""
        if any(future.status in ("lost", "cancelled", "error") for future in self._futures.values()):
            self.forget()
            raise _Rekey()
        for key, table in tables.items():
            if key not in self._futures:
                digest, size = self._digest(table)
                ref = TableRef(key, self.run_tag, digest, size)
                future = scatter_to(self.client, key, table, workers, keep=ref)
                self._futures[key] = future
                # Sent again after a worker died mid-transfer, it went under a new key: the one a worker fetches.
                self._refs[key] = dataclasses.replace(ref, key=str(future.key))
                self.sent += 1
        return {key: self._refs[key] for key in tables}

    def forget(self) -> None:
        """Drop every table's future and key: the next payload sends its tables again (after lost work)."""
        self._futures.clear()
        self._refs.clear()
        self._keys.clear()

    def release(self) -> None:
        self.forget()
        self._digests.clear()


class _Rekey(Exception):
    """The fit's tables were lost with their workers and forgotten: the payload is split again, under new keys."""


class ParameterBroadcast:
    """Holds the one future of the payload (a model, or a grid table) the workers use now.

    The model goes to every worker the pass uses (all, unless the pass's plan says fewer). Had it gone to
    one, the scheduler would place every E-step task on that worker, since moving tens of MB of parameters
    looks dearer than waiting for it (measured: 4 of 4 tasks on one worker, 1.06× the speed of one worker).
    A worker that dies takes only its own copy; if every holder dies, the pass fails as lost work and is
    resubmitted after :meth:`republish`.

    With ``tables``, the fit-constant tables the payload holds are sent apart, once a fit: the payload travels
    as a :class:`~dist_respattn.engine.payload.SharedPayload` and :attr:`current` is the pair (its future, the
    tables' references by key) that a task opens with :func:`~dist_respattn.engine.payload.opened`.
    """

    def __init__(
        self, client: distributed.Client, run_tag: str, *, prefix: str = "params", tables: FitTables | None = None
    ) -> None:
        self.client = client
        self.run_tag = run_tag
        self.prefix = prefix
        self.tables = tables
        self._model: Any = None
        self._future: distributed.Future | None = None
        self._table_futures: dict[str, TableRef] = {}
        self._label = ""
        self._workers: Sequence[str] | None = None

    def publish(self, model: Any, label: str, *, workers: Sequence[str] | None = None) -> Any:
        """:attr:`current` for ``model``, under key ``respattn-<prefix>-<label>-<tag>``; scatters only a new model,
        to ``workers`` (those of them alive; ``None``: every worker), where the pass reading it runs."""
        if model is not self._model or self._future is None:
            self.release()
            sent: Any = model
            if self.tables is not None:
                for _ in range(2):  # a second time under new keys if the tables were lost and forgotten
                    try:
                        shared, tables = split_payload(model, self.tables.key_for)
                    except (pickle.PicklingError, TypeError, AttributeError):
                        tables = {}  # a payload only Dask's own pickling (cloudpickle) handles goes as it is, whole
                    if not tables:  # the model goes as it is: nothing in it is fixed for the fit
                        break
                    try:
                        self._table_futures = self.tables.futures(tables, workers)
                    except _Rekey:
                        continue
                    sent = shared
                    break
            self._future = scatter_to(self.client, f"respattn-{self.prefix}-{label}-{self.run_tag}", sent, workers)
            self._model, self._label, self._workers = model, label, workers
        return self.current

    def republish(self, attempt: int) -> None:
        """Scatter the current model again, to every worker alive, under a new key after a pass lost it with its
        workers (attempt > 0)."""
        model, label = self._model, self._label
        if attempt > 0 and model is not None:
            self.release()
            if self.tables is not None:
                self.tables.forget()  # they may have gone with the workers too
            self.publish(model, f"{label}.{attempt}")

    @property
    def current_model(self) -> Any:
        """The payload :attr:`current` sends (``None``: none now)."""
        return self._model if self._future is not None else None

    @property
    def current(self) -> Any:
        """The payload's future, or with fit-constant tables sent apart the pair (its future, their references by
        key)."""
        if self._future is None:
            raise RuntimeError("no parameters have been published")
        if self._table_futures:
            return (self._future, self._table_futures)
        return self._future

    def release(self) -> None:
        """Drop the client's reference: the scheduler forgets the parameters once no task needs them."""
        self._future = None
        self._model = None
        self._table_futures = {}
