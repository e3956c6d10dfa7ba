"""Running one pass over a store on the cluster and bringing back its single reduced value.

A pass is a fresh graph (see :mod:`reduction`): nothing refers to an earlier pass, and every future
is released when the pass ends, so the scheduler holds no more state after 100 iterations than after
one. Work lost with a worker is recomputed by Dask; if a pass still fails because its inputs were
lost, it is resubmitted whole (under new keys), which gives the same value.

A pass may also bring back every partition's value, in partition order, for the driver to stream somewhere
(:meth:`PassRunner.run_ordered`): a few partitions in flight, and a resubmission after lost work covers only
the partitions not yet handed over.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

import distributed

from dist_respattn.engine.cluster import ClusterError
from dist_respattn.engine.held_tables import TableLostError
from dist_respattn.engine.placement import EVERY_PARTITION, PassPlan, plan_pass
from dist_respattn.engine.reduction import (
    DEFAULT_FAN_IN,
    fold_task,
    reduce_partitions,
    reduce_scatter_partitions,
    split_fold_task,
    split_task,
    subtree,
    subtree_partitions,
    tree_shape,
)

__all__ = ["LOST_WORK_ERRORS", "PassRunner", "finished"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Failures that mean work was lost with a worker, not that the work itself is wrong (a table of the fit lost with
#: every worker holding it among them).
LOST_WORK_ERRORS: tuple[type[BaseException], ...] = (
    distributed.KilledWorker,
    concurrent.futures.CancelledError,
    TableLostError,
)

#: How many times a pass is submitted before a lost-work failure is reported.
MAX_ATTEMPTS = 3

#: What a fit's user can do once the scheduler is lost (the tail of the error).
RESUME_FIT = "the fit can continue from its last checkpoint with --resume once the cluster is back"


def _placed(worker: str | None) -> dict[str, Any]:
    """``submit``'s arguments placing a task on ``worker`` when it can run there (else anywhere; ``None``: no
    preference)."""
    return {} if worker is None else {"workers": [worker], "allow_other_workers": True}


def finished(client: distributed.Client, futures: Sequence[distributed.Future]) -> None:
    """Wait until ``futures`` are computed, on the workers (nothing is gathered); raise the first one's error (or
    the lost work's)."""
    for future in distributed.as_completed(list(futures), loop=client.loop):
        if future.status != "finished":
            future.result()  # raises the task's error


class PassRunner:
    """Submits passes for one fit: keys carry the fit's run tag, progress goes to an optional bar.

    Args:
        client: the cluster's client.
        run_tag: 8 hex digits naming this fit, appended to every key so concurrent fits never share one.
        fan_in: the combine tree's fan-in (part of the fit's settings: it fixes the summation order).
        make_bar: ``make_bar(total, description)`` returns a progress bar (``update``/``close``) or ``None``.
        after_loss: what the user can do when the scheduler is lost, for the error (a fit's: ``--resume``).
    """

    def __init__(
        self,
        client: distributed.Client,
        run_tag: str,
        *,
        fan_in: int = DEFAULT_FAN_IN,
        make_bar: Callable[[int, str], Any] | None = None,
        after_loss: str = RESUME_FIT,
    ) -> None:
        self.client = client
        self.run_tag = run_tag
        self.fan_in = fan_in
        self.make_bar = make_bar
        self.after_loss = after_loss

    def run(
        self,
        name: str,
        label: str,
        n_partitions: int,
        task: Callable[..., Any],
        args_for: Callable[[int], tuple[Any, ...]],
        *,
        description: str = "",
        before_attempt: Callable[[int], None] | None = None,
        plan: PassPlan = EVERY_PARTITION,
        prefer: Callable[[], Mapping[int, str]] | None = None,
    ) -> Any:
        """Run ``task(*args_for(part))`` on every partition and return the combined value.

        Keys: ``respattn-<name>-<label>-<part>-<tag>`` for the partition tasks and
        ``respattn-<name>-combine-<label>-<level>-<i>-<tag>`` for the combines (the E-step's ``name``
        is ``estep`` with combines ``respattn-combine-…``). ``before_attempt(attempt)`` runs before every
        submission (it may re-scatter inputs a lost worker took with it). ``plan`` (see :meth:`plan`): with a
        level above 0, a task folds a whole subtree of the partitions (its key: its first partition's), with
        the same value. ``prefer()`` (asked at each submission): the worker a partition's task should run on when it
        can (one that holds what the task would otherwise read again; Dask may still run it elsewhere).
        """
        return self._with_retries(
            name, label, before_attempt,
            lambda key_prefix, combine_prefix, tag: self._run_once(
                key_prefix, combine_prefix, tag, n_partitions, task, args_for, description, plan.level,
                {} if prefer is None or plan.level > 0 else prefer(),
            ),
        )  # fmt: skip

    def _with_retries(
        self,
        name: str,
        label: str,
        before_attempt: Callable[[int], None] | None,
        once: Callable[[str, str, str], T],
    ) -> T:
        """``once(key_prefix, combine_prefix, tag)``, submitted again under a new tag (up to ``MAX_ATTEMPTS`` times)
        when a worker took its work with it; a lost scheduler is an error that says so."""
        combine_name = "combine" if name == "estep" else f"{name}-combine"
        for attempt in range(MAX_ATTEMPTS):
            if before_attempt is not None:
                before_attempt(attempt)
            tag = self.run_tag if attempt == 0 else f"{self.run_tag}.{attempt}"
            try:
                return once(f"respattn-{name}-{label}", f"respattn-{combine_name}-{label}", tag)
            except LOST_WORK_ERRORS as exc:
                self._check_scheduler(name, label, exc)
                if attempt + 1 == MAX_ATTEMPTS:
                    raise
                logger.warning("%s %s lost work with a worker (%s); resubmitting it", name, label, exc)
            except distributed.client.ClosedClientError as exc:
                raise self._scheduler_lost(name, label, "") from exc
        raise AssertionError("unreachable")

    def run_scattered(
        self,
        name: str,
        label: str,
        n_partitions: int,
        task: Callable[..., Any],
        args_for: Callable[[int], tuple[Any, ...]],
        *,
        sharding: Any,
        tables: Any,
        owners: Callable[[], list[str]],
        description: str = "",
        before_attempt: Callable[[int], None] | None = None,
        plan: PassPlan = EVERY_PARTITION,
    ) -> list[distributed.Future]:
        """:meth:`run` as a reduce-scatter (:func:`~dist_respattn.engine.reduction.reduce_scatter_partitions`): each
        value split by ``sharding`` (with ``tables``, a future) into its common part and ``sharding.n_shards`` shards,
        each part reduced by the tree onto ``owners()[j]``. Returns the parts' roots, computed and left on the
        workers; lost work is resubmitted as :meth:`run` does."""
        return self._with_retries(
            name, label, before_attempt,
            lambda key_prefix, combine_prefix, tag: self._run_scattered_once(
                key_prefix, combine_prefix, tag, n_partitions, task, args_for, description, plan.level, sharding,
                tables, owners(),
            ),
        )  # fmt: skip

    def _run_scattered_once(
        self,
        key_prefix: str,
        combine_prefix: str,
        tag: str,
        n_partitions: int,
        task: Callable[..., Any],
        args_for: Callable[[int], tuple[Any, ...]],
        description: str,
        level: int,
        sharding: Any,
        tables: Any,
        owners: list[str],
    ) -> list[distributed.Future]:
        def reduce(submit_leaf: Callable[[int, str], distributed.Future], on_leaf: Any) -> list[distributed.Future]:
            return reduce_scatter_partitions(
                self.client, n_partitions, submit_leaf, sharding.n_shards, owners, key_prefix=key_prefix,
                combine_prefix=combine_prefix, tag=tag, fan_in=self.fan_in, on_leaf=on_leaf, level=level,
            )  # fmt: skip

        def finish(roots: list[distributed.Future]) -> list[distributed.Future]:
            finished(self.client, roots)
            return roots

        return self._tree_once(
            n_partitions, args_for, description, level,
            lambda node, args, key: self.client.submit(
                split_task, sharding, tables, task, *args, key=key, pure=False
            ),
            lambda tree, args, key: self.client.submit(
                split_fold_task, sharding, tables, task, tree, args, key=key, pure=False
            ),
            reduce, finish,
        )  # fmt: skip

    def plan(self, sizes: Sequence[int], payload_bytes: int) -> PassPlan:
        """How a pass over partitions of ``sizes`` rows, whose tasks read a payload of ``payload_bytes``, runs on
        the workers alive now (see :mod:`~dist_respattn.engine.placement`): the same plan for the same cluster,
        and the same workers for every pass of this runner's run."""
        return plan_pass(
            sizes, self.fan_in, list(self.client.ncores()), payload_bytes=payload_bytes, run_tag=self.run_tag
        )

    def run_ordered(
        self,
        name: str,
        label: str,
        n_partitions: int,
        task: Callable[..., Any],
        args_for: Callable[[int], tuple[Any, ...]],
        *,
        window: int | None = None,
        description: str = "",
        before_attempt: Callable[[int], None] | None = None,
    ) -> Generator[Any, None, None]:
        """Yield ``task(*args_for(part))`` for ``part = 0, 1, ..., n_partitions - 1``, in that order.

        At most ``window`` tasks are in flight (default: twice the cluster's threads, so the workers stay busy
        while the caller handles a value), and the driver holds only the values the caller has not taken yet.
        Keys: ``respattn-<name>-<label>-<part>-<tag>``. Lost work is resubmitted as :meth:`run` does (under new
        keys, after ``before_attempt(attempt)``), but only from the first partition not yet yielded: a value
        handed over is never handed over again. Tasks still pending when the generator ends (an error, or a
        caller that stops early: close it, e.g. with :func:`contextlib.closing`) are cancelled.
        """
        bar = self.make_bar(n_partitions, description) if self.make_bar is not None else None
        done = 0  # partitions yielded
        try:
            for attempt in range(MAX_ATTEMPTS):
                if before_attempt is not None:
                    before_attempt(attempt)
                tag = self.run_tag if attempt == 0 else f"{self.run_tag}.{attempt}"
                pending: deque[distributed.Future] = deque()
                try:
                    width = window if window is not None else 2 * sum(self.client.nthreads().values())
                    submitted = done
                    while done < n_partitions:
                        while submitted < n_partitions and len(pending) < max(int(width), 1):
                            key = f"respattn-{name}-{label}-{submitted}-{tag}"
                            pending.append(self.client.submit(task, *args_for(submitted), key=key, pure=False))
                            submitted += 1
                        value = pending[0].result()  # a failed one stays in pending, to be cancelled below
                        pending.popleft().release()  # the scheduler forgets it: the driver holds the value alone
                        done += 1
                        if bar is not None:
                            bar.update(1)
                        yield value
                        del value
                    return
                except LOST_WORK_ERRORS as exc:
                    self._check_scheduler(name, label, exc)
                    if attempt + 1 == MAX_ATTEMPTS:
                        raise
                    logger.warning(
                        "%s %s lost work with a worker (%s); resubmitting partitions %d to %d",
                        name, label, exc, done, n_partitions - 1,
                    )  # fmt: skip
                except distributed.client.ClosedClientError as exc:
                    raise self._scheduler_lost(name, label, "") from exc
                finally:
                    self._cancel(pending)
        finally:
            if bar is not None:
                bar.close()
        raise AssertionError("unreachable")

    def _cancel(self, futures: deque[distributed.Future]) -> None:
        """Cancel tasks nobody will read (a failed pass, or one its caller left): they stop using the workers."""
        if futures and self.client.status == "running":
            # Best effort: a scheduler going away at this moment is reported by the error already under way.
            with contextlib.suppress(Exception):
                self.client.cancel(list(futures))
        futures.clear()

    def _check_scheduler(self, name: str, label: str, exc: BaseException) -> None:
        """Raise :class:`ClusterError` when lost work means the scheduler went away: nothing to resubmit to."""
        if self.client.status != "running":
            raise self._scheduler_lost(name, label, f" ({self.client.status})") from exc

    def _scheduler_lost(self, name: str, label: str, status: str) -> ClusterError:
        return ClusterError(
            f"lost the connection to the Dask scheduler during {name} {label}{status}; {self.after_loss}"
        )

    def _run_once(
        self,
        key_prefix: str,
        combine_prefix: str,
        tag: str,
        n_partitions: int,
        task: Callable[..., Any],
        args_for: Callable[[int], tuple[Any, ...]],
        description: str,
        level: int = 0,
        preferred: Mapping[int, str] | None = None,
    ) -> Any:
        def reduce(submit_leaf: Callable[[int, str], distributed.Future], on_leaf: Any) -> distributed.Future:
            return reduce_partitions(
                self.client, n_partitions, submit_leaf, key_prefix=key_prefix, combine_prefix=combine_prefix,
                tag=tag, fan_in=self.fan_in, on_leaf=on_leaf, level=level,
            )  # fmt: skip

        return self._tree_once(
            n_partitions, args_for, description, level,
            lambda node, args, key: self.client.submit(
                task, *args, key=key, pure=False, **_placed((preferred or {}).get(node)),
            ),
            lambda tree, args, key: self.client.submit(fold_task, task, tree, args, key=key, pure=False),
            reduce, self._gathered,
        )  # fmt: skip

    def _gathered(self, root: distributed.Future) -> Any:
        """The pass's value, straight from the worker holding it (the driver reaches the workers: the parameters go
        to them the same way); through the scheduler when that worker cannot give it (Dask's fallback). Through
        the scheduler alone, the 109M-token fit's E-step value (~121 MiB) reached the driver 0.78-1.04 s after the
        pass's last task, straight from the worker 0.07-0.08 s after it."""
        return self.client.gather(root, direct=True)

    def _tree_once(
        self,
        n_partitions: int,
        args_for: Callable[[int], tuple[Any, ...]],
        description: str,
        level: int,
        submit_one: Callable[[int, tuple[Any, ...], str], distributed.Future],
        submit_fold: Callable[[Any, dict[int, tuple[Any, ...]], str], distributed.Future],
        reduce: Callable[[Callable[[int, str], distributed.Future], Any], R],
        finish: Callable[[R], T],
    ) -> T:
        """One submission of a tree pass: its leaves (``submit_one(part, args, key)`` a partition at level 0, else
        ``submit_fold(subtree, args by partition, key)`` a whole subtree), ``reduce(submit_leaf, on_leaf)`` the
        tree above them, the progress bar fed as leaves finish, and ``finish(roots)`` the pass's value."""
        levels = tree_shape(n_partitions, self.fan_in)
        #: Partitions under each leaf task, by key (for the progress bar).
        weights: dict[str, int] = {}

        def submit_leaf(node: int, key: str) -> distributed.Future:
            if level == 0:
                weights[key] = 1
                return submit_one(node, args_for(node), key)
            tree = subtree(levels, level, node)
            parts = subtree_partitions(tree)
            weights[key] = len(parts)
            return submit_fold(tree, {part: args_for(part) for part in parts}, key)

        bar = self.make_bar(n_partitions, description) if self.make_bar is not None else None
        # Progress holds each leaf only until it has finished and been counted. Bound to this pass's client's
        # loop: without one, as_completed looks for a default client, and ours are never the default.
        completed = distributed.as_completed(loop=self.client.loop) if bar is not None else None
        roots = reduce(submit_leaf, completed.add if completed is not None else None)
        try:
            if bar is not None and completed is not None:
                for leaf in completed:
                    bar.update(weights.get(str(leaf.key), 1))
            return finish(roots)
        finally:
            if bar is not None:
                bar.close()
            # Forget the pass: the scheduler drops its tasks and results once no client holds them.
            del roots, completed
