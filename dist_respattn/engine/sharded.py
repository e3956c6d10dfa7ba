"""The sharded M-step on the cluster: the statistics reduce-scattered onto the workers that own their shards, each
owner running its shard's M-step, the driver holding scalars and choices only.

For a kind whose trainer opts in (:meth:`~dist_respattn.model.heads.base.Trainer.sharded_m_step`), an iteration is:

1. the E-step as a reduce-scatter (:meth:`~dist_respattn.engine.passes.PassRunner.run_scattered`): every partition's
   statistics split into a common part and the shards, each part reduced by the combine tree's own shape and order
   onto its owner;
2. the common part's M-step on its owner, whose summary (scalars: ``log_lik``, ``n_obs``, the choice's scale) alone
   comes to the driver; each shard's M-step on its owner;
3. the held-out grid made on the workers that score it, from the parts (Dask moves them worker to worker);
4. the chosen head's parts made by the owners, who write them into the iteration's checkpoint; the driver writes
   the manifest (``meta.json``) last and moves the pointers;
5. the next passes read the head from those files (a task per part, on its owner): nothing is chained across
   iterations, and a part lost with its worker is read again from the checkpoint by another.

A fit from the data starts the same way when the trainer gives a :class:`~dist_respattn.model.heads.base.
ShardedStart` (:meth:`ShardedRun.start`): its start pass reduce-scattered by the same shards, the driver told only
what the trainer needs to finish preparing (the single head's emission prior, each shard's count of pairs), the
tables made on a worker from the shards, then the start's M-step, choice and head as an iteration's; the start's
head is written beside the checkpoints and read from there. The driver never holds the support.

The same fit with and without it, on any number of workers, gives the same bits. Nothing here knows a kind.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import distributed

from dist_respattn.artifacts.checkpoints import ModelDir
from dist_respattn.durable.files import temporary_path
from dist_respattn.engine import worker_tasks
from dist_respattn.engine.broadcast import payload_bytes, scatter_to
from dist_respattn.engine.held_tables import TableRef, held, table_digest
from dist_respattn.engine.passes import LOST_WORK_ERRORS, MAX_ATTEMPTS, finished
from dist_respattn.engine.worker_tasks import BUILD
from dist_respattn.model.heads.base import (
    Candidates,
    Choice,
    Columns,
    Grid,
    Head,
    Passes,
    ShardedMStep,
    ShardedStart,
    Trainer,
)
from dist_respattn.text_format import count_text

if TYPE_CHECKING:
    from dist_respattn.engine.loop import ClusterPasses

__all__ = ["RemoteGrid", "RemoteHead", "ShardedRun", "ShardedStatistics", "ShardedTrainer"]

logger = logging.getLogger(__name__)


class ShardedStatistics:
    """An E-step's statistics left on the workers: its M-step's parts (futures) and the summary the driver holds."""

    def __init__(self, summary: Any, common: distributed.Future, shards: list[distributed.Future]) -> None:
        self.summary, self.common, self.shards = summary, common, shards

    def release(self) -> None:
        """Let the workers drop the parts (once the head made from them is in its checkpoint)."""
        self.common, self.shards = None, []  # type: ignore[assignment]

    @property
    def log_lik(self) -> float:
        return float(self.summary.log_lik)

    @property
    def n_obs(self) -> float:
        return float(self.summary.n_obs)


class RemoteHead:
    """A head that lives on the workers in parts (futures of its arrays), made by a sharded M-step: the driver holds
    its JSON, its choice and what its iteration's record says of it, never its arrays.

    Once its checkpoint is committed, its parts are that checkpoint's files, read by a task each
    (:meth:`ShardedRun.reroot`); :attr:`checkpoint` names it.
    """

    def __init__(
        self,
        meta: dict[str, Any],
        choice: Choice,
        common: distributed.Future,
        shards: list[distributed.Future],
        warnings: list[str],
        record: dict[str, Any],
    ) -> None:
        self.meta, self.choice, self.common, self.shards = meta, choice, common, shards
        self.warnings, self._record = warnings, record
        self.checkpoint: str | None = None
        #: The statistics' parts it was made from, released once it is read from its checkpoint.
        self.made_from: ShardedStatistics | None = None

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])

    def record(self) -> dict[str, Any]:
        return dict(self._record)

    def nbytes(self) -> int:
        """Nothing is sent from the driver: the passes read the parts where they are."""
        return 0

    def release(self) -> None:
        self.common, self.shards = None, []  # type: ignore[assignment]


class RemoteGrid(Grid):
    """A held-out grid made on the workers that score it (:func:`~dist_respattn.engine.worker_tasks.built`)."""

    def __init__(self, points: Any, argument: tuple[Any, ...]) -> None:
        self.points, self.argument = points, argument

    @property
    def columns(self) -> Columns:
        return Columns()

    def score(self, blocks: Any) -> Any:
        raise TypeError("a sharded M-step's grid is scored on the workers")


class RemoteCandidates(Candidates):
    """A sharded M-step's candidates: the kind's driver side (:class:`~dist_respattn.model.heads.base.
    ShardedCandidates`), its grid and its heads made on the workers."""

    def __init__(self, run: ShardedRun, stats: ShardedStatistics) -> None:
        assert run.sharding is not None
        self.run, self.stats = run, stats
        self.inner = run.sharding.candidates(stats.summary)

    def default(self) -> Choice:
        return self.inner.default()

    def grid(self, around: Choice | None) -> RemoteGrid:
        return self.run.grid(self.inner.grid(around), self.stats)

    def choose(self, grid: Grid, scores: Any) -> tuple[Choice, dict[str, float] | None]:
        assert isinstance(grid, RemoteGrid)
        return self.inner.choose(grid.points, scores)

    def model(self, choice: Choice) -> Head:
        return self.run.head(choice, self.stats)  # type: ignore[return-value]


class ShardedTrainer(Trainer):
    """A fit's trainer whose M-steps run in shards on the workers once it has prepared (when its kind opts in; else
    exactly the trainer it wraps)."""

    def __init__(self, inner: Trainer, run: ShardedRun) -> None:
        self.inner, self.run = inner, run

    @property
    def columns(self) -> Columns:
        return self.inner.columns

    def attribute_names(self) -> tuple[str, ...] | None:
        return self.inner.attribute_names()

    def searches(self) -> bool:
        return self.inner.searches()

    def fits_heldout_rows(self) -> bool:
        return self.inner.fits_heldout_rows()

    def check_start(self, head: Head, *, resumed: bool) -> None:
        self.inner.check_start(head, resumed=resumed)

    def prepare(self, start: Head | None, *, resumed: bool, passes: Any) -> Head:
        if start is None:
            head = self.run.start(self.inner, passes)
            if head is not None:
                return head
        return self.inner.prepare(start, resumed=resumed, passes=passes)

    def statistics(self, head: Head, blocks: Any) -> Any:
        return self.inner.statistics(head, blocks)

    def m_step(self, statistics: Any, previous: Head) -> Candidates:
        if isinstance(statistics, ShardedStatistics):
            return RemoteCandidates(self.run, statistics)
        return self.inner.m_step(statistics, previous)

    def choice_from_json(self, data: dict[str, Any]) -> Choice | None:
        return self.inner.choice_from_json(data)

    def checkpoint_extras(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.inner.checkpoint_extras()

    def warnings(self, head: Any, statistics: Any = None) -> list[str]:
        if isinstance(head, RemoteHead):
            return list(head.warnings)
        return self.inner.warnings(head, statistics)

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> Any:
        return self.inner.memory(
            block_rows=block_rows, row_bytes=row_bytes, threads_per_worker=threads_per_worker, fan_in=fan_in
        )


class ShardedRun:
    """The sharded M-step of one fit on the cluster: its shards' owners, the tables sent once, the parts' tasks.

    Args:
        client: the cluster's client; ``run_id``: the fit's run tag (in every key).
        n_shards: the shards asked for (``FitSettings.m_step_shards``).
        say: where the fit's lines go.
    """

    def __init__(
        self,
        client: distributed.Client,
        run_id: str,
        n_shards: int,
        say: Callable[[str], Any],
        *,
        folder: ModelDir | None = None,
        bounds: list[int] | None = None,
    ) -> None:
        self.client, self.run_id, self.n_wanted, self.say = client, run_id, n_shards, say
        #: The shards' bounds the resumed checkpoint recorded (kept when their count is the one asked for).
        self.recorded = bounds
        #: Where a sharded start keeps the first head's parts (beside the checkpoints, as a temporary directory
        #: the first checkpoint's commit prunes); ``None``: the start runs on the driver.
        self.folder = folder
        self.sharding: ShardedMStep | None = None
        self.decided = False
        self.tables: distributed.Future | None = None
        #: The digest and bytes of :attr:`tables` (a future of them while they are made on a worker), and the
        #: reference the tasks get (:meth:`table_ref`).
        self._digest: distributed.Future | tuple[str, int] | None = None
        self._ref: TableRef | None = None
        #: The whole tables' digest, computed once a fit (the driver's tables are the same object all along).
        self._whole_digest: tuple[Any, tuple[str, int]] | None = None
        #: Whether the driver holds the whole tables (else their driver's part is :attr:`tables_part` and the rest
        #: comes from the common file of :attr:`source`, the checkpoint the last head was read from).
        self.whole_tables = True
        self.tables_part: distributed.Future | None = None
        self.source: str | None = None
        #: Whether the tables were made again from :attr:`source` (else they are the start's), and from which.
        self.tables_rebuilt = False
        self.tables_source: str | None = None
        #: The parts: the common part and the shards.
        self.n_parts = 0
        #: The fit's passes on the cluster (:meth:`attach`).
        self.cluster: ClusterPasses | None = None
        self._count = itertools.count()

    def attach(self, cluster: ClusterPasses) -> None:
        self.cluster = cluster

    # -- set-up -------------------------------------------------------------------------------------------------

    def ready(self, trainer: Trainer) -> bool:
        """Whether the M-steps run in shards: asked of the trainer once, after it prepared."""
        if not self.decided:
            kept = self.recorded if self.recorded is not None and len(self.recorded) == self.n_wanted + 1 else None
            self._use(trainer.sharded_m_step(self.n_wanted, bounds=kept))
            if self.sharding is not None:
                self._send_tables()
        return self.sharding is not None

    def _use(self, sharding: ShardedMStep | None) -> None:
        self.decided = True
        self.sharding = sharding
        if sharding is None:
            self.say("this kind's M-step runs on the driver (it has no sharded M-step)")
            return
        self.n_parts = sharding.n_shards + 1
        n_workers = min(len(self.client.ncores()), self.n_parts)
        self.say(
            f"sharded M-step: {count_text(sharding.n_shards, 'shard')} of the symbols on "
            f"{count_text(n_workers, 'worker')}{_fewer_shards(sharding, self.n_wanted)}"
            f"{_many_shards(sharding.n_shards, n_workers)}"
        )

    def _send_tables(self) -> None:
        """The tables to the workers: sent whole by the driver, or (after a sharded start) their driver's part sent
        and the rest read from the common part of the last head read from files, on a worker."""
        assert self.sharding is not None
        attempt = next(self._count)
        key = f"respattn-shard-tables-{attempt}-{self.run_id}"
        if self.whole_tables:
            tables = self.sharding.tables()
            if self._whole_digest is None or self._whole_digest[0] is not tables:
                self._whole_digest = (tables, table_digest(tables))
            self._digest = self._whole_digest[1]
            digest, size = self._digest
            self.tables = scatter_to(self.client, key, tables, keep=TableRef(key, self.run_id, digest, size))
            return
        self.tables_part = scatter_to(self.client, f"respattn-shard-table-part-{attempt}-{self.run_id}",
                                      self.sharding.tables())  # fmt: skip
        if self.source is not None:
            self._tables_from_source(key)

    def _tables_from_source(self, key: str) -> None:
        """The tables made whole from the common file of :attr:`source` (its fixed arrays read again, on a worker):
        after lost work, and again when the checkpoint they were read from is pruned (so that Dask can make them
        again for a replacement worker). A worker that kept them finds them by their digest: they are the same
        bytes, and are not fetched again."""
        assert self.sharding is not None and self.source is not None
        common = self.client.submit(worker_tasks.load_part_task, self.source, key=f"{key}-read", pure=False)
        self._made(self.client.submit(self.sharding.tables_from, self.tables_part, common, key=key, pure=False))
        self.tables_rebuilt, self.tables_source = True, self.source

    def _made(self, tables: distributed.Future) -> None:
        """:attr:`tables` made on a worker: their digest computed there too (the driver never holds them)."""
        self.tables = tables
        self._digest = self.client.submit(table_digest, tables, key=f"{tables.key}-digest", pure=False)

    def table_ref(self) -> TableRef:
        """The reference to the fit's tables the tasks get (:mod:`~dist_respattn.engine.held_tables`): each worker
        resolves it once, and keeps the tables to the fit's end. Tables lost with every worker holding them (sent,
        not made) are sent again first."""
        if self.tables is None or self.tables.status in ("lost", "cancelled", "error"):
            self._send_tables()
        assert self.tables is not None and self._digest is not None
        if self._ref is None or self._ref.key != self.tables.key:
            if isinstance(self._digest, distributed.Future):
                self._digest = cast("tuple[str, int]", self._digest.result())
            digest, size = self._digest
            self._ref = TableRef(str(self.tables.key), self.run_id, digest, size)
        return self._ref

    def owners(self) -> list[str]:
        """The owner of each part (the common part's first, then each shard's): the workers alive, in address
        order from a place fixed by the run (a lost owner's parts go to the next)."""
        assert self.n_parts > 0
        alive = sorted(self.client.ncores())
        if not alive:
            self.client.wait_for_workers(1, timeout=60)
            alive = sorted(self.client.ncores())
        first = int(self.run_id.split(".")[0], 16) % len(alive)
        return [alive[(first + j) % len(alive)] for j in range(self.n_parts)]

    def _key(self, what: str, label: str) -> str:
        return f"respattn-{what}-{label}-{next(self._count)}-{self.run_id}"

    def _on(self, owner: str) -> dict[str, Any]:
        return {"workers": [owner], "allow_other_workers": True, "pure": False}

    def _again(self, what: str, attempt: int, exc: BaseException) -> None:
        """After lost work: give up on the last attempt, else send the tables again (they may be lost too)."""
        if attempt + 1 == MAX_ATTEMPTS:
            raise exc
        logger.warning("%s lost work with a worker (%s); submitting it again", what, exc)
        self._send_tables()

    # -- the start ---------------------------------------------------------------------------------------------

    def start(self, trainer: Trainer, preparing: Passes) -> Head | None:
        """The fit's start in shards, when the trainer opts in (:meth:`~dist_respattn.model.heads.base.Trainer.
        sharded_start`; ``None``: it runs on the driver): the start pass reduce-scattered onto the owners, the
        trainer's preparation finished from what the owners tell (a prior's tables, the pairs' count), the tables
        made on a worker, the start's M-step on the owners, its held-out choice made as an iteration's, and the
        first head's parts written beside the checkpoints and read from there. The driver holds nothing that
        grows with the data. Lost work makes the whole start again."""
        if self.folder is None or self.cluster is None:
            return None
        begin = trainer.sharded_start(self.n_wanted)
        if begin is None:
            return None
        cluster = self.cluster
        cluster.in_span("respattn-init")
        begin.cut(preparing)
        request, train = begin.request(), cluster.train
        self.n_parts = begin.n_shards + 1
        for attempt in range(MAX_ATTEMPTS):
            try:
                roots = cluster.runner.run_scattered(
                    request.name, "0", train.num_partitions, worker_tasks.pass_task,
                    lambda part: (
                        train.location, part, request.map_partition, request.columns, cluster.fingerprint,
                        cluster.train_rows, cluster.train_map,
                    ),
                    sharding=begin, tables=None, owners=self.owners, description=request.description,
                )  # fmt: skip
                owners = self.owners()
                info = self.client.submit(
                    begin.common_info, roots[0], key=self._key("start-info", "0"), **self._on(owners[0])
                )
                sizes = [
                    self.client.submit(
                        begin.shard_info,
                        k,
                        roots[k + 1],
                        key=self._key(f"start-info{k}", "0"),
                        **self._on(owners[k + 1]),
                    )
                    for k in range(begin.n_shards)
                ]
                sharding = begin.prepared(info.result(), self.client.gather(sizes), preparing)
                del info, sizes
                self._use(sharding)
                self.whole_tables = False
                self._send_tables()
                self._made(self.client.submit(
                    begin.tables, sharding, self.tables_part, roots[1:], key=self._key("shard-tables", "0"),
                    **self._on(owners[0]),
                ))  # fmt: skip
                common = self.client.submit(
                    start_common_m_step, begin, sharding, roots[0], key=self._key("mstep-common", "0"),
                    **self._on(owners[0]),
                )  # fmt: skip
                shards = [
                    self.client.submit(
                        start_shard_m_step,
                        begin,
                        sharding,
                        k,
                        roots[k + 1],
                        self.table_ref(),
                        key=self._key(f"mstep-shard{k}", "0"),
                        **self._on(owners[k + 1]),
                    )
                    for k in range(sharding.n_shards)
                ]
                del roots
                summary = self.client.submit(sharding.summary, common, key=self._key("summary", "0")).result()
                finished(self.client, shards)
                stats = ShardedStatistics(summary, common, shards)
                del common, shards
                head = preparing.choose(RemoteCandidates(self, stats))
                assert isinstance(head, RemoteHead)
                self.keep(head)
                return head
            except LOST_WORK_ERRORS as exc:
                if attempt + 1 == MAX_ATTEMPTS:
                    raise
                logger.warning("the sharded start lost work with a worker (%s); making it again", exc)
        raise AssertionError("unreachable")

    def keep(self, head: RemoteHead) -> None:
        """The start's head written by its owners into a temporary directory beside the checkpoints (the first
        checkpoint's commit prunes it) and read from there (:meth:`reroot`), as a checkpoint's head is."""
        assert self.folder is not None
        self.folder.path.mkdir(parents=True, exist_ok=True)
        directory = Path(temporary_path(self.folder.path / f"start-{self.run_id}"))
        directory.mkdir()
        self._write_parts(directory, head, "start")
        self.reroot(head, directory, "start")
        head.checkpoint = None

    # -- an iteration -------------------------------------------------------------------------------------------

    def statistics(self, passes: ClusterPasses, trainer: Trainer, head: Any, iteration: int) -> ShardedStatistics:
        """The E-step reduce-scattered onto the owners and the M-step of every part there; the summary to the driver."""
        sharding = self.sharding
        assert sharding is not None
        label = str(iteration)
        before_attempt: Callable[[int], None] | None = None
        if isinstance(head, RemoteHead):
            remote = self.head_argument(head)
            plan = passes.runner.plan(passes.train_sizes, 0)

            def argument() -> Any:
                return remote

            def previous() -> tuple[Any, dict[str, Any] | None]:
                return head.common, head.meta
        else:  # the start (or a resumed head): sent once, as a driver's M-step head is
            plan = passes.runner.plan(passes.train_sizes, payload_bytes(head))
            passes.params.publish(head, label, workers=plan.workers)
            before_attempt = passes.params.republish

            def argument() -> Any:
                return passes.params.current  # a new key once republished

            def previous() -> tuple[Any, dict[str, Any] | None]:
                return passes.params.current, None

        train = passes.train
        for attempt in range(MAX_ATTEMPTS):
            try:
                roots = passes.runner.run_scattered(
                    "estep", label, train.num_partitions, worker_tasks.statistics_task,
                    lambda part: (
                        train.location, part, trainer, argument(), passes.fingerprint, passes.train_rows,
                        passes.train_map,
                    ),
                    sharding=sharding, tables=self.table_ref(), owners=self.owners,
                    description=f"iteration {iteration}", before_attempt=before_attempt, plan=plan,
                )  # fmt: skip
                owners = self.owners()
                previous_head, previous_meta = previous()
                common = self.client.submit(
                    worker_tasks.common_m_step_task, sharding, roots[0], previous_head, previous_meta,
                    key=self._key("mstep-common", label), **self._on(owners[0]),
                )  # fmt: skip
                shards = [
                    self.client.submit(
                        worker_tasks.shard_m_step_task,
                        sharding,
                        k,
                        roots[k + 1],
                        self.table_ref(),
                        key=self._key(f"mstep-shard{k}", label),
                        **self._on(owners[k + 1]),
                    )
                    for k in range(sharding.n_shards)
                ]
                del roots
                summary = self.client.submit(sharding.summary, common, key=self._key("summary", label)).result()
                finished(self.client, shards)
                return ShardedStatistics(summary, common, shards)
            except LOST_WORK_ERRORS as exc:
                self._again(f"the M-step of iteration {label}", attempt, exc)
        raise AssertionError("unreachable")

    def head_argument(self, head: RemoteHead) -> tuple[Any, ...]:
        """The task argument a pass reads ``head`` by: made from its parts on each worker, once."""
        assert self.sharding is not None
        parts = (head.meta, head.common, head.shards, self.table_ref())
        return (BUILD, f"head-{head.common.key}", self.sharding.head, parts)

    def grid(self, points: Any, stats: ShardedStatistics) -> RemoteGrid:
        """The held-out grid at ``points``, made from the M-step's parts where it is scored."""
        assert self.sharding is not None
        key = f"grid-{stats.common.key}-{next(self._count)}"
        parts = (points, stats.common, stats.shards, self.table_ref())
        return RemoteGrid(points, (BUILD, key, self.sharding.grid, parts))

    def head(self, choice: Choice, stats: ShardedStatistics) -> RemoteHead:
        """The head under ``choice``: its parts made by the owners (its shards' rows of the emission...)."""
        sharding = self.sharding
        assert sharding is not None
        for attempt in range(MAX_ATTEMPTS):
            try:
                owners = self.owners()
                common = self.client.submit(
                    worker_tasks.common_arrays_task, sharding, choice, stats.common, self.table_ref(),
                    key=self._key("head-common", "m"), **self._on(owners[0]),
                )  # fmt: skip
                shards = [
                    self.client.submit(
                        worker_tasks.shard_arrays_task,
                        sharding,
                        k,
                        choice,
                        stats.shards[k],
                        self.table_ref(),
                        key=self._key(f"head-shard{k}", "m"),
                        **self._on(owners[k + 1]),
                    )
                    for k in range(sharding.n_shards)
                ]
                warnings = self.client.submit(
                    sharding.warnings, choice, stats.common, key=self._key("warnings", "m"), pure=False
                ).result()
                finished(self.client, [common, *shards])
                made = RemoteHead(sharding.head_meta(choice), choice, common, shards, warnings, sharding.record(choice))
                made.made_from = stats
                return made
            except LOST_WORK_ERRORS as exc:
                self._again("the sharded M-step's head", attempt, exc)
        raise AssertionError("unreachable")

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def commit(
        self, folder: ModelDir, name: str, head: RemoteHead, meta: dict[str, Any], *, final: bool, **pointers: Any
    ) -> None:
        """Checkpoint ``name``: each part written by the worker holding it, then the manifest and the pointers by
        the driver (:meth:`~dist_respattn.artifacts.checkpoints.ModelDir.commit_parts`); the head's parts are then
        that checkpoint's files (:meth:`reroot`). ``final``: the fit's last checkpoint, whose head the driver reads
        from its files: no pass reads its parts again, so no task reads them (a read a shard, left running as the
        fit's client closed, made the scheduler log a traceback for each result it could no longer report)."""
        folder.commit_parts(name, lambda directory: self._write_parts(directory, head, name), head.meta, meta,
                            **pointers)  # fmt: skip
        if not final:
            self.reroot(head, folder.path / name, name)
            return
        head.checkpoint = name
        if head.made_from is not None:
            head.made_from.release()
            head.made_from = None

    def _write_parts(self, directory: Path, head: RemoteHead, name: str) -> dict[str, Any]:
        """``head``'s parts written into ``directory``, each by the worker holding it: the record of them."""
        files = _part_files(len(head.shards))
        for attempt in range(MAX_ATTEMPTS):
            try:
                owners = self.owners()
                writes = [
                    self.client.submit(
                        worker_tasks.write_part_task,
                        str(directory / file),
                        part,
                        key=self._key(f"write{j}", name),
                        **self._on(owners[j]),
                    )
                    for j, (file, part) in enumerate(zip(files, [head.common, *head.shards], strict=True))
                ]
                sizes = self.client.gather(writes)
                record: dict[str, Any] = {"common": files[0], "shards": files[1:], "bytes": int(sum(sizes))}
                if self.sharding is not None and self.sharding.bounds:
                    record["bounds"] = [int(b) for b in self.sharding.bounds]
                return record
            except LOST_WORK_ERRORS as exc:
                self._again(f"writing checkpoint {name}", attempt, exc)
        raise AssertionError("unreachable")

    def reroot(self, head: RemoteHead, directory: Path, name: str) -> None:
        """Make ``head``'s parts the files in ``directory`` (its checkpoint ``name``'s): a task reads each (on its
        owner while it lives), so the next passes depend on no earlier task, and a part lost with its worker is
        read again."""
        assert self.sharding is not None
        owners = self.owners()
        files = _part_files(len(head.shards))
        # The common part without the arrays fixed for the fit (the support): the tables hold them, on every worker
        # that ran a pass, so they are not read or sent again each iteration.
        fixed = self.sharding.fixed_names
        loads = [
            self.client.submit(
                worker_tasks.load_part_task,
                str(directory / file),
                fixed if j == 0 else (),
                key=self._key(f"load{j}", name),
                **self._on(owner),
            )
            for j, (file, owner) in enumerate(zip(files, owners, strict=True))
        ]
        head.common, head.shards = loads[0], loads[1:]
        head.checkpoint = name
        previous, self.source = self.tables_source, str(directory / files[0])
        if self.tables_rebuilt and previous is not None and not Path(previous).is_file():
            # The checkpoint the tables were read again from is pruned: read them from this one, for a replacement.
            self._tables_from_source(self._key("shard-tables", name))
        if head.made_from is not None:
            head.made_from.release()
            head.made_from = None

    def release(self) -> None:
        self.tables = self.tables_part = self.source = None
        self._digest = self._ref = self._whole_digest = None


def _fewer_shards(sharding: ShardedMStep, wanted: int) -> str:
    """Why ``sharding`` has fewer shards than the ``wanted`` ones, for the line that announces them (``""``: it has
    as many): a shard holds one symbol at least, so a kind cuts its symbol range into that many shards at most."""
    if sharding.n_shards >= wanted:
        return ""
    if sharding.bounds:
        return (
            f" (m_step_shards {wanted} asks for more shards than the {sharding.bounds[-1]:,} symbols; each shard "
            "holds one at least)"
        )
    return f" (m_step_shards {wanted} asks for more shards than this head's symbols can be cut into)"


#: Shards a worker past which the line announcing them says what they cost: each shard is a combine tree, an owner's
#: task and a checkpoint file every pass (a fit of 241k rows, 3 iterations on 2 workers, took 5.6 s with 2 shards,
#: 8.4 s with 64 and 22.4 s with 501), while a worker's part of the model is no smaller past one shard a worker.
MANY_SHARDS_A_WORKER = 16


def _many_shards(n_shards: int, n_workers: int) -> str:
    """What ``n_shards`` cost, for the line that announces them, when they are more than :data:`MANY_SHARDS_A_WORKER`
    a worker (``""`` otherwise)."""
    if n_workers < 1 or n_shards <= MANY_SHARDS_A_WORKER * n_workers:
        return ""
    return (
        f"; {n_shards / n_workers:,.0f} shards a worker: each shard is a combine tree, a task and a file every pass, "
        f"and more than one a worker makes no worker's part smaller (m_step_shards {n_workers} to {4 * n_workers} "
        f"suits {count_text(n_workers, 'worker')})"
    )


def _part_files(n_shards: int) -> list[str]:
    """The files of a head's parts: the common part's, then each shard's."""
    return ["part-common.npz"] + [f"part-{k:05d}.npz" for k in range(n_shards)]


def start_common_m_step(begin: ShardedStart, sharding: ShardedMStep, common: Any) -> Any:
    """The start's M-step of the reduced common part (on its owner)."""
    return sharding.common_m_step(begin.common_statistics(common), None, None)


def start_shard_m_step(begin: ShardedStart, sharding: ShardedMStep, index: int, shard: Any, tables: Any) -> Any:
    """The start's M-step of reduced shard ``index`` (on its owner); ``tables``: the fit's, by reference."""
    return sharding.shard_m_step(index, begin.shard_statistics(index, shard), held(tables))
