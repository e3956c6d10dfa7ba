"""The current parameters on the cluster: scattered once per model to every worker, the previous ones released.

The same holds for the other per-iteration payload, the M-step's grid table the held-out pass reads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import distributed

from dist_respattn.engine.cluster import ClusterError

__all__ = ["ParameterBroadcast", "payload_bytes"]

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


class ParameterBroadcast:
    """Holds the one future of the payload (a model, or a grid table) the workers use now.

    The model goes to every worker (``broadcast=True``). Had it gone to one, the scheduler would
    place every E-step task on that worker, since moving tens of MB of parameters looks dearer than
    waiting for it (measured: 4 of 4 tasks on one worker, 1.06× the speed of one worker). A worker
    that dies takes only its own copy; if every holder dies, the pass fails as lost work and is
    resubmitted after :meth:`republish`.
    """

    def __init__(self, client: distributed.Client, run_tag: str, *, prefix: str = "params") -> None:
        self.client = client
        self.run_tag = run_tag
        self.prefix = prefix
        self._model: Any = None
        self._future: distributed.Future | None = None
        self._label = ""

    def publish(self, model: Any, label: str, *, workers: Sequence[str] | None = None) -> distributed.Future:
        """The future of ``model`` under key ``respattn-<prefix>-<label>-<tag>``; scatters only a new one, to
        ``workers`` (those of them alive; ``None``: every worker), where the pass reading it runs."""
        if model is not self._model or self._future is None:
            self.release()
            self._future = self._scatter(f"respattn-{self.prefix}-{label}-{self.run_tag}", model, workers)
            self._model, self._label = model, label
        return self._future

    def _scatter(self, key: str, model: Any, workers: Sequence[str] | None = None) -> distributed.Future:
        """Send ``model`` to ``workers`` (``None``, or none of them alive: to every worker), again (under a new
        key) if a worker dies during the transfer.

        A worker killed mid-transfer fails the send (its stream closed); a deadline guards the rest.
        """
        deadline = SCATTER_SECONDS + payload_bytes(model) / SCATTER_BYTES_PER_SECOND
        for attempt in range(SCATTER_ATTEMPTS):
            name = key if attempt == 0 else f"{key}.s{attempt}"

            def send(name: str = name) -> distributed.Future:
                # Straight from the client to each worker in turn. The scheduler's own broadcast waits
                # for good on a worker that died during its replication, and so would every later one.
                self.client.wait_for_workers(1, timeout=deadline)  # lost workers may still be restarting
                alive = list(self.client.ncores())
                chosen = [w for w in alive if workers is not None and w in workers] or alive
                future = None
                for worker in chosen:
                    future = self.client.scatter({name: model}, workers=[worker], direct=True)[name]
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

    def republish(self, attempt: int) -> None:
        """Scatter the current model again, to every worker alive, under a new key after a pass lost it with its
        workers (attempt > 0)."""
        model, label = self._model, self._label
        if attempt > 0 and model is not None:
            self.release()
            self.publish(model, f"{label}.{attempt}")

    @property
    def current(self) -> distributed.Future:
        if self._future is None:
            raise RuntimeError("no parameters have been published")
        return self._future

    def release(self) -> None:
        """Drop the client's reference: the scheduler forgets the parameters once no task needs them."""
        self._future = None
        self._model = None
