"""The head protocol: all that the engine, the checkpoints and the commands know of a kind of head.

A kind of head is written in the model layer alone, as four parts (see ``docs/guide/head-kinds.md``):

- a :class:`Head`: the parameters. Arrays and JSON for checkpoints, picklable for the broadcast; it scores,
  ranks and streams blocks of rows;
- a :class:`HeadSpec`: the settings of a fit of that kind (JSON, checked on resume), which makes
- a :class:`Trainer`: one fit's fixed choices. The statistics of a partition (the E-step, the start), the
  M-step with its open choices (:class:`Candidates`), the passes before the first iteration;
- additive statistics: ``a + b`` (in a fixed order, so sums are reproducible), an empty identity, and
  ``log_lik`` / ``n_obs`` for the convergence rule.

and registered by name (:func:`register_kind`), so a checkpoint that records ``"kind": NAME`` loads with the
kind's own :meth:`Head.from_arrays`. The engine runs every pass, the combine tree, the loop, the held-out choice,
early stopping, checkpoints, evaluation and prediction for every kind the same way; nothing outside the model
layer branches on a kind.
"""

from __future__ import annotations

import abc
import functools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

__all__ = [
    "PREVIOUS_STAGE",
    "Block",
    "BlockPass",
    "Candidates",
    "Choice",
    "Columns",
    "Grid",
    "GridScores",
    "Head",
    "HeadKind",
    "HeadSpec",
    "Option",
    "Passes",
    "ShardedCandidates",
    "ShardedMStep",
    "ShardedStart",
    "Stage",
    "Statistics",
    "StreamingPredictor",
    "Trainer",
    "TrainerContext",
    "combine",
    "head_from_arrays",
    "head_kind",
    "head_names",
    "kind_names",
    "register_kind",
    "spec_from_json",
    "sum_into_copy",
    "token_stream_default",
]


# ----------------------------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Columns:
    """What the blocks a head reads must carry besides ``(context, query, target)``.

    Attributes:
        windows: the rows as token windows (:class:`~dist_respattn.model.rows.WindowRows`: a tied prior's
            histogram kernel) instead of encoded rows (:class:`~dist_respattn.model.rows.EncodedRows`).
        attributes: each row's attribute id (a store written with ``--attribute-by`` / ``--attributes``).
        documents: each row's document id.
    """

    windows: bool = False
    attributes: bool = False
    documents: bool = False

    def __or__(self, other: Columns) -> Columns:
        return Columns(
            self.windows or other.windows, self.attributes or other.attributes, self.documents or other.documents
        )


@dataclass(frozen=True)
class Block:
    """One block of a store's rows as a head reads it (made by the engine's tasks, one at a time).

    Attributes:
        rows: the rows: :class:`~dist_respattn.model.rows.EncodedRows` (``context`` (n, N) int32, ``query``
            (n, D) float64, ``target`` (n,) int32, ``weight`` (n,) or None) or, when the head asked for
            ``Columns(windows=True)``, :class:`~dist_respattn.model.rows.WindowRows`.
        weights: (n,) float64, the rows' weights once the fit's row selection is applied (0: the row does not
            count: the other side of a hold-out), or ``None``: every row weighs 1.
        attribute: (n,) int64 each row's attribute id as the head numbers them (``-1``: an attribute the head
            does not know; such rows weigh 0), or ``None`` when not asked for.
        documents: (n,) int64 each row's document id, or ``None`` when not asked for.
        partition: the store partition the block belongs to; ``start``: its first row's store row.
        checked: the store's readers already checked the values (ids in range, finite numbers), so kernels
            need not check them again.
    """

    rows: Any
    weights: np.ndarray | None
    attribute: np.ndarray | None = None
    documents: np.ndarray | None = None
    partition: int = 0
    start: int = 0
    checked: bool = False

    @property
    def num_rows(self) -> int:
        return int(self.rows.num_rows)

    def weights_or_ones(self) -> np.ndarray:
        """(n,) float64: the weights, 1 for every row when there are none."""
        if self.weights is None:
            return np.ones(self.num_rows)
        return np.asarray(self.weights, dtype=np.float64)


# ----------------------------------------------------------------------------------------------- statistics


class Statistics(Protocol):
    """Additive statistics of a kind: a partition's value, summed by the combine tree.

    ``a + b`` is a new value (neither operand changes); sums are taken in the tree's fixed order, so a fit is
    bit-identical on any number of workers. A kind whose values are large may also give ``sum_of(values)``, a
    class method adding a sequence left to right into one copy (what :func:`combine` uses when it is there).
    """

    @property
    def log_lik(self) -> float: ...

    @property
    def n_obs(self) -> float: ...

    def __add__(self, other: Any) -> Any: ...


class AddsInPlace(Protocol):
    """A value whose ``add(other)`` returns the sum in this value's own arrays (the caller owns them: a value from
    ``copy()``), so a long sum costs one copy, not one per addition."""

    def copy(self) -> Any: ...

    def add(self, other: Any) -> Any: ...


ValueT = TypeVar("ValueT", bound=AddsInPlace)


def sum_into_copy(values: Sequence[ValueT]) -> ValueT:
    """The sum of ``values``, added left to right into one copy of the first: the ``sum_of`` of a kind's
    statistics whose ``add`` works in place (:class:`AddsInPlace`)."""
    total = values[0].copy()
    for value in values[1:]:
        total = total.add(value)
    return total


def combine(values: Sequence[Any]) -> Any:
    """The sum of additive values, added left to right in the order given (so the result is reproducible).

    Uses the values' own ``sum_of`` when their type has one (a single copy of the first, the others added into
    it), else ``+``.
    """
    if not values:
        raise ValueError("combine() of no values: a pass over no partitions has no value")
    summed = getattr(type(values[0]), "sum_of", None)
    if summed is not None:
        return summed(values)
    return functools.reduce(operator.add, values)


# ----------------------------------------------------------------------------------------------- heads


class StreamingPredictor(Protocol):
    """Next-token prediction over a growing history, in state bounded by the model (not the history)."""

    def push(self, token: int) -> None: ...

    def extend(self, tokens: Iterable[int]) -> None: ...

    def predict(self, query: Any = None) -> np.ndarray: ...

    def top_k(self, k: int, query: Any = None) -> tuple[np.ndarray, np.ndarray]: ...

    def top_words(self, k: int, query: Any = None) -> list[tuple[str, float]]: ...

    @property
    def state_size(self) -> int: ...


class Head(abc.ABC):
    """The parameters of a head of some kind: what a checkpoint holds and the broadcast sends.

    Subclasses set :attr:`kind` (the name checkpoints record) and are registered with :func:`register_kind`.
    Heads are immutable and picklable (the engine scatters them once per iteration).
    """

    #: The kind's registered name, recorded in every checkpoint.
    kind: ClassVar[str]

    # -- shape: S context symbols, N context positions, D the query's dimension, T targets ------------------------

    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(S, N, D, T)``: the stores this head fits."""
        return (self.num_symbols, self.context_length, self.query_dim, self.num_targets)

    @property
    def attention_length(self) -> int:
        """The columns of the attention :meth:`top_k` reports (``predict``'s output): its last positions of the
        window, N by default (a kind whose window is a long history, not attended, reports fewer)."""
        return int(self.context_length)

    # -- persistence -----------------------------------------------------------------------------------------

    @abc.abstractmethod
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The head as named arrays and JSON-able metadata (never pickles); :meth:`from_arrays` inverts it."""

    @classmethod
    @abc.abstractmethod
    def from_arrays(cls, arrays: Any, meta: dict[str, Any]) -> Head:
        """The head :meth:`to_arrays` wrote (``arrays``: a mapping of name to array)."""

    @classmethod
    def from_shards(cls, common: Any, shards: Sequence[Any], meta: dict[str, Any]) -> Head:
        """The head whose parts a sharded M-step wrote (:meth:`ShardedMStep.common_arrays` and
        :meth:`ShardedMStep.shard_arrays`, mappings of name to array). A kind without a sharded M-step has none."""
        raise ValueError(f"a {cls.kind} head is not written in shards")

    def completed(self, directory: str, meta: dict[str, Any], load: Callable[[str], Head]) -> Head:
        """The head as its checkpoint in model directory ``directory`` (with ``meta.json`` ``meta``) describes it,
        when the arrays alone do not: an older format may name another fit the head needs, which ``load(path)``
        reads. Itself by default."""
        return self

    def stage_heads(self) -> dict[str, Head]:
        """A staged kind's earlier stages, by their directories (a gated head's ``"shared"`` head): a fit of the same
        spec warm-started from this head starts each of those stages from them. None by default."""
        return {}

    @abc.abstractmethod
    def num_parameters(self) -> int:
        """The free parameters this head holds (for reports and the memory plan)."""

    def describe(self) -> str:
        """A few words on the head, for the lines a fit prints (the kind's name by default)."""
        return self.kind

    def nbytes(self) -> int:
        """The bytes of its arrays (what sending it to the workers moves): those of :meth:`to_arrays` by default."""
        arrays, _ = self.to_arrays()
        return int(sum(np.asarray(a).nbytes for a in arrays.values()))

    # -- reading rows ----------------------------------------------------------------------------------------

    @property
    def columns(self) -> Columns:
        """What its blocks must carry to be scored or predicted (plain encoded rows by default)."""
        return Columns()

    def attribute_names(self) -> tuple[str, ...] | None:
        """The names of the attributes the head knows (its ids are their positions), or ``None`` when it reads
        no attributes. The engine maps a store's attribute ids onto these by name."""
        return None

    @abc.abstractmethod
    def score(self, blocks: Iterable[Block]) -> Any:
        """Held-out totals of these blocks' rows (a :class:`~dist_respattn.model.scores.ScoreTotals`: joint and
        predictive log-likelihoods, ranks), added block by block in order."""

    def check_top_k(self) -> None:  # noqa: B027 - every kind ranks rows unless it says otherwise
        """Raise ``ValueError`` (saying what to use instead) when this head cannot rank blocks of rows, before any
        pass starts; nothing by default."""

    @abc.abstractmethod
    def top_k(self, block: Block, k: int) -> Any:
        """The ``k`` most probable targets of each row of ``block`` (a :class:`~dist_respattn.model.scores.TopK`),
        without an (n, T) matrix."""

    def block_proba(self, block: Block) -> np.ndarray:
        """(n, T) ``p(target | row)`` of every target for each row of ``block`` (what ``evaluate --ranking`` ranks;
        small blocks: the array is dense). A kind that cannot give it raises ``ValueError`` (the default)."""
        raise ValueError(f"a {self.kind} head gives no p(target | row) of a block of rows: it cannot be ranked")

    @abc.abstractmethod
    def predictor(self, *, words: Sequence[str] | None = None, query_table: np.ndarray | None = None,
                  options: dict[str, Any] | None = None) -> StreamingPredictor:  # fmt: skip
        """A streaming predictor over one history. ``words`` names the targets for ``top_words``; ``query_table``
        (S, D) looks up a token's query; ``options`` are the kind's own command-line options (an attribute to
        predict as, say), by ``dest`` name."""

    def emissions(self, options: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
        """The emission tables whose rows ``neighbours`` compares, each named (one per attribute, say; ``options``
        may pick some), as :class:`~dist_respattn.model.emission.layouts.Emission`; none by default."""
        return []

    def report(self, passes: Passes, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """What ``evaluate`` says of this kind beyond the overall scores: JSON keys and lines (nothing by default).

        ``passes`` runs passes over the scored store (``over="train"``) or the store the head was fitted on
        (``over="training_store"``); ``options`` are the kind's own command-line options by ``dest`` name.
        """
        return {}, []

    def warnings(self, fit_settings: dict[str, Any] | None = None) -> list[str]:
        """Signs of a degenerate head seen from its parameters alone (``fit_settings``: the JSON settings of the fit
        that made it, when known), for ``evaluate`` of a head its checkpoint said nothing about."""
        return []

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        """What a fit's report says of the head: JSON figures (beside the kind-free ones) and lines."""
        return {}, []

    def recovery(self, truth: Head) -> tuple[dict[str, Any], list[str]] | None:
        """How close this fitted head is to ``truth`` (the head a synthetic store was sampled from): JSON figures and
        lines, or ``None`` when it cannot say (another kind, another shape; the default)."""
        return None

    def record(self) -> dict[str, Any]:
        """Numbers of the head an iteration's record carries besides the kind-free ones (JSON-able)."""
        return {}


# ----------------------------------------------------------------------------------------------- choices


class Choice(Protocol):
    """An M-step's open choices (a hyperparameter point): JSON-able, so a resumed fit centres its next search
    on it, and said in words on every iteration's line."""

    def to_json(self) -> dict[str, Any]: ...

    def describe(self) -> str: ...


class GridScores(Protocol):
    """Held-out totals at every point of a :class:`Grid` (additive, like statistics)."""

    @property
    def weight(self) -> float: ...

    def __add__(self, other: Any) -> Any: ...


class Grid(abc.ABC):
    """The points an M-step's held-out pass scores, with what scoring them needs (picklable: sent to workers)."""

    @property
    def columns(self) -> Columns:
        """What the held-out blocks must carry."""
        return Columns()

    @abc.abstractmethod
    def score(self, blocks: Iterable[Block]) -> GridScores:
        """The held-out totals of these blocks at every point."""

    def nbytes(self) -> int:
        """The bytes of its arrays (what sending it to the workers moves); 0 when unknown."""
        return 0

    def score_keeping(self, blocks: Iterable[Block], budget: int) -> tuple[GridScores, Any]:
        """:meth:`score`, and what the fit's later grids may score these rows from (:meth:`score_kept`) without
        reading them again, when it holds at most ``budget`` bytes (else ``None``). A kind that keeps nothing
        returns ``None``."""
        return self.score(blocks), None

    def score_kept(self, kept: Any) -> GridScores | None:
        """The held-out totals of the rows ``kept`` (what :meth:`score_keeping` returned for a grid of the same
        fit) at this grid's points, the same bits as :meth:`score` on the rows; ``None`` when ``kept`` cannot serve
        this grid (another kind, support or shape): the rows are read again."""
        return None

    @property
    def makes_heads(self) -> bool:
        """Whether :meth:`model` makes heads: where the grid was scored, the chosen head is then made from it
        instead of being sent there."""
        return False

    def model(self, choice: Choice) -> Head:
        """The head under ``choice``, made from what the grid holds: the same bits as its candidates'
        :meth:`Candidates.model` (only when :attr:`makes_heads`)."""
        raise NotImplementedError(f"{type(self).__name__} does not make heads")


class Candidates(abc.ABC):
    """An M-step with its open choices left open: every head it can give, one per :class:`Choice`."""

    @abc.abstractmethod
    def default(self) -> Choice:
        """The choice made when nothing is chosen on held-out rows."""

    @abc.abstractmethod
    def grid(self, around: Choice | None) -> Grid:
        """The points to score: the whole search when ``around`` is ``None`` (the first M-step), else the
        neighbourhood of the last choice."""

    @abc.abstractmethod
    def choose(self, grid: Grid, scores: GridScores) -> tuple[Choice, dict[str, float] | None]:
        """The best point of ``grid`` by its held-out ``scores``, and that point's held-out metrics
        (``mean_log_likelihood``, ``target_log_prob``, ``perplexity``); without held-out weight, the default
        and ``None``."""

    @abc.abstractmethod
    def model(self, choice: Choice) -> Head:
        """The head under ``choice``."""

    def searches(self) -> bool:
        """Whether there is anything to choose (a fit without held-out rows then keeps the defaults)."""
        return True


# ----------------------------------------------------------------------------------------------- sharded M-step


class ShardedCandidates(abc.ABC):
    """A sharded M-step's open choices as the driver holds them: scalars and the grid's points, never an array of
    the statistics (the grid's tables and every head are made on the workers, from the shards)."""

    @abc.abstractmethod
    def default(self) -> Choice:
        """The choice made when nothing is chosen on held-out rows."""

    @abc.abstractmethod
    def grid(self, around: Choice | None) -> Any:
        """The points to score (small and picklable: they go with the held-out tasks), as :meth:`Candidates.grid`."""

    @abc.abstractmethod
    def choose(self, points: Any, scores: GridScores) -> tuple[Choice, dict[str, float] | None]:
        """The best of ``points`` by their held-out ``scores``, as :meth:`Candidates.choose`."""


class ShardedMStep(abc.ABC):
    """A kind's M-step cut into shards of its symbol range, run on the workers that own them (see
    ``docs/guide/fitting.md``, "The sharded M-step"): what a trainer gives when it opts in
    (:meth:`Trainer.sharded_m_step`). Picklable: it travels with the tasks. Every method but :meth:`candidates`,
    :meth:`head_meta` and :meth:`record` runs on a worker.

    An E-step's statistics are split (:meth:`split`) into a common part and ``n_shards`` shards, each reduced by
    the combine tree's own shape and order (so the sums are those of the whole statistics, to the bit); the common
    part's M-step gives the driver only a summary (``log_lik``, ``n_obs`` and the scalars of the choice); each shard's
    M-step runs on its owner. The held-out grid and the chosen head are made on the workers from the parts, and a
    head's parts are its checkpoint's files: :meth:`common_arrays` and :meth:`shard_arrays`, which
    :meth:`Head.from_shards` joins.
    """

    #: The number of shards.
    n_shards: int
    #: The shards' symbol bounds, recorded in a checkpoint's manifest for a resumed fit to keep (``()``: none).
    bounds: tuple[int, ...] = ()
    #: The arrays of a head's common part (:meth:`common_arrays`) that are fixed for the fit and held in the tables
    #: (a support): written into every checkpoint, but left out when the next passes read the head from it, so the
    #: workers get them once a fit, with the tables (:meth:`head` puts them back).
    fixed_names: tuple[str, ...] = ()

    @abc.abstractmethod
    def tables(self) -> Any:
        """The tables fixed for the fit that the workers' parts of the M-step read (an emission prior, a support):
        sent to the workers once a fit. After a sharded start (:class:`ShardedStart`) the driver holds only their
        part of a fixed size, the rest made on the workers (:meth:`ShardedStart.tables`, :meth:`tables_from`)."""

    def tables_from(self, tables: Any, common: Any) -> Any:
        """On a worker: the whole tables from the driver's part of them (:meth:`tables`) and a head's common arrays
        (:meth:`common_arrays`, a checkpoint's common file), for a fit whose driver does not hold them whole
        (after a sharded start); by default the driver's are whole."""
        return tables

    @abc.abstractmethod
    def split(self, statistics: Statistics, tables: Any) -> tuple[Any, tuple[Any, ...]]:
        """A partition's statistics as ``(common, shards)``; each part is additive (``sum_of`` or ``+``), and the sum
        of the parts of many values is the part of their sum, element by element."""

    @abc.abstractmethod
    def common_m_step(self, common: Any, previous: Any, previous_meta: dict[str, Any] | None) -> Any:
        """The M-step of the reduced common part; ``previous``: the E-step's head (a :class:`Head`, or its common
        arrays with ``previous_meta``)."""

    @abc.abstractmethod
    def shard_m_step(self, index: int, shard: Any, tables: Any) -> Any:
        """The M-step of reduced shard ``index`` up to the open choices."""

    @abc.abstractmethod
    def summary(self, common_part: Any) -> Any:
        """What the driver receives of an M-step: ``log_lik``, ``n_obs`` and the scalars its choice needs."""

    @abc.abstractmethod
    def candidates(self, summary: Any) -> ShardedCandidates:
        """The open choices on the driver, from :meth:`summary`."""

    @abc.abstractmethod
    def grid(self, points: Any, common_part: Any, shard_parts: list[Any], tables: Any) -> Grid:
        """The held-out grid at ``points``, made where it is scored."""

    @abc.abstractmethod
    def head_meta(self, choice: Choice) -> dict[str, Any]:
        """The head's JSON under ``choice`` (``to_arrays``' metadata, with ``"kind"``)."""

    @abc.abstractmethod
    def common_arrays(self, choice: Choice, common_part: Any, tables: Any) -> dict[str, np.ndarray]:
        """The head's arrays under ``choice`` that are not a shard's (its checkpoint's common file)."""

    @abc.abstractmethod
    def shard_arrays(self, index: int, choice: Choice, shard_part: Any, tables: Any) -> dict[str, np.ndarray]:
        """Shard ``index``'s arrays of the head under ``choice`` (its checkpoint's file of that shard)."""

    def head(self, meta: dict[str, Any], common: Any, shards: Sequence[Any], tables: Any) -> Head:
        """The head from its parts (:meth:`common_arrays`, :meth:`shard_arrays`), where a pass reads it: by default
        its kind's :meth:`Head.from_shards`."""
        return head_kind(str(meta["kind"])).head.from_shards(common, shards, meta)

    def warnings(self, choice: Choice, common_part: Any) -> list[str]:
        """Signs of a degenerate fit, as :meth:`Trainer.warnings` (none by default)."""
        return []

    def record(self, choice: Choice) -> dict[str, Any]:
        """The numbers an iteration's record carries of the head, as :meth:`Head.record` (none by default)."""
        return {}


class ShardedStart(abc.ABC):
    """A kind's start in the shards of its sharded M-step (what a trainer gives when it opts in:
    :meth:`Trainer.sharded_start`): the start pass's value reduce-scattered by the M-step's shards as an E-step's
    statistics are, so the driver never holds what grows with the data (a sparse emission's support, the first
    counts). Picklable: it travels with the tasks (its driver's side stays behind). Every method but
    :meth:`request` and :meth:`prepared` runs on a worker.

    The engine runs :meth:`request`'s pass as a reduce-scatter by :meth:`split`; asks the common part's owner for
    :meth:`common_info` and each shard's owner for :meth:`shard_info` (small, of a size fixed for the fit); gives
    them to :meth:`prepared`, where the trainer finishes its preparation and returns its :class:`ShardedMStep`;
    then makes the M-step's tables on a worker (:meth:`tables`) and runs the start's M-step on the owners, from
    :meth:`common_statistics` and :meth:`shard_statistics`, exactly as an iteration's. The first head is the
    driver's M-step's, to the bit.
    """

    #: The number of shards (the M-step's).
    n_shards: int

    @abc.abstractmethod
    def request(self) -> BlockPass:
        """The start pass (the one :meth:`Trainer.prepare` runs without a starting head)."""

    def cut(self, passes: Passes) -> None:
        """Settle the shards' bounds before the start pass, from passes of its own if it needs any (the default:
        none). They must be the same on any number of workers."""
        return None

    @abc.abstractmethod
    def split(self, value: Any, tables: Any) -> tuple[Any, tuple[Any, ...]]:
        """A partition's start value as ``(common, shards)``, each part additive, as :meth:`ShardedMStep.split`."""

    @abc.abstractmethod
    def common_info(self, common: Any) -> Any:
        """What the driver needs of the reduced common part to finish preparing (a prior's tables, say)."""

    @abc.abstractmethod
    def shard_info(self, index: int, shard: Any) -> Any:
        """What the driver needs of reduced shard ``index`` (a scalar: its pairs' count, say)."""

    @abc.abstractmethod
    def prepared(self, common: Any, shards: list[Any], passes: Passes) -> ShardedMStep:
        """On the driver: the trainer's preparation finished from :meth:`common_info` and each :meth:`shard_info`
        (what it says, its memory plan checked again), and its sharded M-step."""

    @abc.abstractmethod
    def tables(self, sharding: ShardedMStep, tables: Any, shards: Sequence[Any]) -> Any:
        """On a worker: the M-step's whole tables from the driver's part of them (``sharding.tables()``) and the
        reduced shards."""

    @abc.abstractmethod
    def common_statistics(self, common: Any) -> Any:
        """The reduced common part as the common part of :meth:`ShardedMStep.split` of the start's statistics."""

    @abc.abstractmethod
    def shard_statistics(self, index: int, shard: Any) -> Any:
        """Reduced shard ``index`` as shard ``index`` of :meth:`ShardedMStep.split` of the start's statistics."""


# ----------------------------------------------------------------------------------------------- training


@dataclass(frozen=True)
class BlockPass:
    """A pass a trainer asks the engine for before the first iteration: ``map_partition(blocks)`` over the
    training rows' partitions, summed by the combine tree; the value is sent back into the preparation.

    ``map_partition`` travels to the workers: a bound method of the (picklable) trainer, or a module-level
    function (a ``functools.partial`` of one). ``name`` labels its task keys; ``description`` its progress bar.
    """

    name: str
    description: str
    map_partition: Callable[[Iterator[Block]], Any]
    columns: Columns = Columns()


class Passes(Protocol):
    """What a kind asks of the engine while it prepares a fit or writes a report: passes over the cluster.

    The engine gives one to :meth:`Trainer.prepare` and :meth:`Head.report`; the model layer never sees a client.
    """

    def run(self, request: BlockPass, *, over: str = "train") -> Any:
        """The combined value of ``request.map_partition`` over every partition of ``over``: ``"train"`` (the
        training rows of a fit, or the scored store of a report), ``"heldout"`` (a fit's held-out rows) or, in a
        report, ``"training_store"`` (the store the head was fitted on, its training rows)."""

    def choose(self, candidates: Candidates) -> Head:
        """The head of ``candidates`` chosen on the fit's held-out rows (the defaults without any), as the engine
        chooses after every M-step; the choice is recorded as the start's."""

    def say(self, line: str) -> None:
        """Tell the user (a fit's or a command's lines)."""

    def plan_memory(self) -> None:
        """Check the trainer's memory plan again (:meth:`Trainer.memory`), now that a pass told it more; raises
        the engine's ``InsufficientMemoryError`` before a plan the workers cannot hold runs."""


@dataclass(frozen=True)
class TrainerContext:
    """What a trainer is made from besides its spec: the training rows' shape and names, and where it starts.

    Attributes:
        shape: ``(S, N, D, T)`` of the training rows.
        attribute_names: the store's attribute names (``None``: it has none).
        init: the head the fit starts from when it is another fit's (a warm start, or the earlier stage's), or
            ``None``; ``init_meta`` and ``init_arrays``: the JSON and the extra arrays of that fit's checkpoint.
        saved_meta, saved_arrays: the JSON and extra arrays (:meth:`Trainer.checkpoint_extras`) of this fit's own
            checkpoint when it is resumed (``{}`` otherwise).
        sources: the heads of the fitted models the spec is made of (:meth:`HeadSpec.sources`), loaded in that
            order, each checked to be of the training store's corpus (``()``: none, or a resumed fit, whose
            checkpoint holds them).
    """

    shape: tuple[int, int, int, int]
    attribute_names: tuple[str, ...] | None = None
    init: Head | None = None
    init_meta: dict[str, Any] = field(default_factory=dict)
    init_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    saved_meta: dict[str, Any] = field(default_factory=dict)
    saved_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    sources: tuple[Head, ...] = ()


class Trainer(abc.ABC):
    """One fit of one kind: its settings made concrete for a store. Picklable: the tasks carry it to the workers.

    The engine's loop is: ``head = prepare(...)``, then every iteration
    ``stats = combine(statistics(head, partition) for each partition)``, ``candidates = m_step(stats, head)``,
    a held-out pass over ``candidates.grid(last choice)``, ``head = candidates.model(choice)``; it stops when the
    mean log-likelihood per row ``stats.log_lik / stats.n_obs`` changes by less than ``tol`` (relative), at
    ``max_iter``, or when the held-out metric stops improving.
    """

    @property
    def columns(self) -> Columns:
        """What the training blocks must carry."""
        return Columns()

    def attribute_names(self) -> tuple[str, ...] | None:
        """The attribute names the trainer's ids follow (the engine maps every store's ids onto them by name), or
        ``None`` when it reads no attributes."""
        return None

    def searches(self) -> bool:
        """Whether its M-steps have open choices to make on held-out rows (else a fit holds out no rows for them)."""
        return True

    def fits_heldout_rows(self) -> bool:
        """Whether its E-steps read the fit's held-out rows instead of its training rows (a stack of fitted heads,
        whose gate is learned on rows its components did not see); a fit then holds out rows for it. A fit without
        any held-out rows runs its E-steps on the training rows. False by default."""
        return False

    def check_start(self, head: Head, *, resumed: bool) -> None:  # noqa: B027 - any start is fine unless refused
        """Refuse (``ValueError``, naming the option that fixes it) a starting head this fit cannot start from;
        called before any cluster starts. ``resumed``: the head is the fit's own checkpoint."""

    @abc.abstractmethod
    def prepare(self, start: Head | None, *, resumed: bool, passes: Passes) -> Head:
        """The head the first iteration starts from, after the passes it needs (run through ``passes``).

        ``start`` is the given starting head (a warm start, or a resumed checkpoint's when ``resumed``), or
        ``None``: the trainer's own start (the M-step of uniform or random responsibilities, usually).
        """

    @abc.abstractmethod
    def statistics(self, head: Head, blocks: Iterator[Block]) -> Statistics:
        """The E-step: the additive statistics of one partition's blocks (in order) under ``head``."""

    @abc.abstractmethod
    def m_step(self, statistics: Statistics, previous: Head) -> Candidates:
        """The M-step of these (reduced) statistics, its open choices left to :class:`Candidates`."""

    def sharded_m_step(self, n_shards: int, *, bounds: Sequence[int] | None = None) -> ShardedMStep | None:
        """The M-step in ``n_shards`` shards on the workers (:class:`ShardedMStep`), once :meth:`prepare` ran, or
        ``None``: this kind's M-step runs on the driver (the default). ``bounds``: the shards' bounds a resumed fit's
        checkpoint recorded (``n_shards + 1`` of them), to keep."""
        return None

    def sharded_start(self, n_shards: int) -> ShardedStart | None:
        """The start in ``n_shards`` shards on the workers (:class:`ShardedStart`), which then prepares the fit in
        place of :meth:`prepare` without a starting head, or ``None``: the start runs on the driver (the default)."""
        return None

    def choice_from_json(self, data: dict[str, Any]) -> Choice | None:
        """A choice a checkpoint recorded (``Choice.to_json``), for a resumed fit's next search."""
        return None

    def checkpoint_extras(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and JSON a checkpoint keeps besides the head, so a resumed fit needs no pass (an emission prior
        made from the training rows, say); :class:`TrainerContext` gives them back to a resumed fit as
        ``saved_arrays`` and ``saved_meta``."""
        return {}, {}

    def warnings(self, head: Head, statistics: Any = None) -> list[str]:
        """Signs of a degenerate fit (a collapsed gate, unused keys...) of ``head`` after the M-step of
        ``statistics`` (``None``: a fit of no iterations), for the fit's lines and checkpoints."""
        return []

    def memory(self, *, block_rows: int, row_bytes: int, threads_per_worker: int, fan_in: int) -> Any:
        """The memory plan of this fit as far as it is known (a :class:`~dist_respattn.model.memory.MemoryEstimate`;
        a sparse emission's pairs, say, are known once the start pass has found them), or ``None``: nothing to
        check. ``block_rows`` rows of ``row_bytes`` each are read at once."""
        return None


#: :attr:`Stage.start_from`: the stage starts from the model of the stage before it.
PREVIOUS_STAGE = "<previous>"


@dataclass(frozen=True)
class Stage:
    """One fit of a staged spec: its kind's spec, the model directory under the fit's, relative (``"."``: the
    fit's own), and the loop settings it runs with instead of the fit's (``max_iter``, ``tol``, ``context_length``...,
    by their ``FitSettings`` names).

    A stage after the first starts from the model of ``start_from``: :data:`PREVIOUS_STAGE` (the stage before it),
    the directory of an earlier stage, or ``None``: its own start. A stage that continues from its start
    (:attr:`HeadSpec.continues_from_init`) keeps that stage's held-out rows; any other is validated as the first.
    """

    spec: HeadSpec
    directory: str = "."
    settings: dict[str, Any] = field(default_factory=dict)
    start_from: str | None = PREVIOUS_STAGE


class HeadSpec(abc.ABC):
    """The settings of a fit of some kind: JSON-able (saved with every checkpoint, compared on resume), and the
    factory of its :class:`Trainer`."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The settings as JSON (with ``"kind"``)."""

    @classmethod
    @abc.abstractmethod
    def from_json(cls, data: dict[str, Any]) -> HeadSpec:
        """The spec :meth:`to_json` wrote."""

    @abc.abstractmethod
    def trainer(self, context: TrainerContext) -> Trainer:
        """The trainer of a fit on rows of this shape, from this start."""

    def notes(self, attribute_names: tuple[str, ...] | None) -> list[str]:
        """What to tell the user before a fit of this spec on a store with these attributes starts (advice on a
        setting that is rarely what was meant, say); nothing by default."""
        return []

    @property
    def columns(self) -> Columns:
        """What the training store's rows must carry for a fit of this spec (attributes, say), checked before any of
        its stages runs (nothing beyond the rows by default)."""
        return Columns()

    def check_attributes(self, attribute_names: tuple[str, ...] | None) -> None:  # noqa: B027 - any store's fine
        """Raise ``ValueError`` when a fit of this spec cannot run on a store with these attributes (a setting the
        store's attributes make meaningless, say), checked with :attr:`columns` before any of its stages runs."""

    def stages(self) -> list[Stage]:
        """The fits this spec is made of, in order (one, itself, by default)."""
        return [Stage(self)]

    #: Whether the spec's settings depend on the window its rows are read with (then :meth:`for_window` fixes them
    #: before the fit starts, and the fit records the result).
    window_dependent: ClassVar[bool] = False

    def for_window(
        self, context_length: int, *, num_targets: int | None = None, num_rows: int | None = None
    ) -> HeadSpec:
        """This spec as it runs on rows of window N = ``context_length`` of a store of ``num_targets`` targets and
        ``num_rows`` rows (itself unless :attr:`window_dependent`)."""
        return self

    def sources(self) -> tuple[tuple[str, str], ...]:
        """The fitted models a fit of this spec is made of, as ``(option, model directory)`` pairs (the option names
        the flag that gave it, for errors): a new fit loads them (:attr:`TrainerContext.sources`) and refuses one of
        another corpus before any cluster starts. None by default."""
        return ()

    @property
    def short_histories(self) -> bool | None:
        """Whether a fit of this spec reads a token stream's rows shorter than its window (so ``min_context``
        defaults to 1 and may be below N), whatever the position buckets; ``None``: as the buckets say."""
        return None

    @property
    def continues_from_init(self) -> bool:
        """Whether a fit of this spec starts from another fit (then given as ``init_from``) and keeps that fit's
        held-out rows and training rows."""
        return False

    def differences(self, other: HeadSpec, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """``name: saved -> given`` for every setting that differs (what a resume refuses)."""
        mine, theirs = self.to_json(), other.to_json()
        return [
            f"{name}: {mine.get(name)!r} -> {theirs.get(name)!r}"
            for name in sorted(set(mine) | set(theirs))
            if name not in ignore and mine.get(name) != theirs.get(name)
        ]


# ----------------------------------------------------------------------------------------------- the kinds


@dataclass(frozen=True)
class Option:
    """A command-line option a kind adds to some commands: ``argparse``'s ``add_argument(*flags, **settings)``.

    ``commands`` names the subcommands that take it (``"fit"``, ``"evaluate"``, ``"predict"``, ``"sample"``...).
    The parsed values reach the kind by their ``dest`` names (:attr:`HeadKind.spec_from_options`, the
    ``options`` of :meth:`Head.report` and :meth:`Head.predictor`).
    """

    flags: tuple[str, ...]
    settings: dict[str, Any]
    commands: tuple[str, ...] = ("fit",)


@dataclass(frozen=True)
class HeadKind:
    """A registered kind: its name, its classes, and what it adds to the command line.

    Attributes:
        name: what checkpoints record.
        head: its :class:`Head` class; ``spec``: its :class:`HeadSpec` class, read back by ``spec.from_json``.
        summary: one line on the kind (the option group's description on the command line).
        options: the command-line options it adds.
        spec_from_options: ``(options, base, saved) -> spec or None``: the spec a ``fit`` asks for when this
            kind's options were given (``None`` otherwise): ``options`` maps ``dest`` names to parsed values,
            ``base`` is the single-hop spec the other fit options describe, ``saved`` the JSON of the spec a
            resumed fit recorded (or ``None``). A ``ValueError`` names the flag at fault.
        head_name: the name ``fit --head NAME`` picks this kind by (``None``: the kind is picked by its own
            options only); ``spec_from_options`` then sees ``options["head"] == NAME``.
        token_stream_default: ``fit`` picks this kind (by its ``head_name``) on a token-stream store when no option
            picks one; at most one kind says so (without one, the single-hop head the fit options describe).
    """

    name: str
    head: type[Head]
    spec: type[HeadSpec] | None = None
    summary: str = ""
    options: tuple[Option, ...] = ()
    spec_from_options: Callable[[dict[str, Any], HeadSpec, dict[str, Any] | None], HeadSpec | None] | None = None
    head_name: str | None = None
    token_stream_default: bool = False

    def spec_from_json(self, data: dict[str, Any]) -> HeadSpec:
        """The spec :meth:`HeadSpec.to_json` wrote."""
        if self.spec is None:
            raise ValueError(f"head kind {self.name!r} has no spec: it is not fitted on its own")
        return self.spec.from_json(data)


_KINDS: dict[str, HeadKind] = {}

#: The modules that register the built-in kinds, imported on first lookup (so importing this module stays light).
_BUILT_IN = (
    "dist_respattn.model.heads.single_hop",
    "dist_respattn.model.heads.gated",
    "dist_respattn.model.heads.mixture",
    "dist_respattn.model.heads.copy",
    "dist_respattn.model.heads.conj",
    "dist_respattn.model.heads.hops",
    "dist_respattn.model.heads.stack",
    "dist_respattn.model.heads.repeat",
    "dist_respattn.model.heads.recipe",
    "dist_respattn.model.heads.codebook",
)

T = TypeVar("T", bound=Head)


def register_kind(kind: HeadKind) -> HeadKind:
    """Make ``kind`` known by its name (a second kind of the same name is refused)."""
    known = _KINDS.get(kind.name)
    if known is not None and known.head is not kind.head:
        raise ValueError(f"a head kind named {kind.name!r} is registered already ({known.head.__qualname__})")
    _KINDS[kind.name] = kind
    return kind


def _load_built_in() -> None:
    import importlib

    for module in _BUILT_IN:
        importlib.import_module(module)


def head_kind(name: str) -> HeadKind:
    """The kind registered as ``name``; an unknown name raises naming the known ones."""
    if name not in _KINDS:
        _load_built_in()
    try:
        return _KINDS[name]
    except KeyError:
        raise ValueError(
            f"unknown head kind {name!r}: this version knows {', '.join(kind_names())} (a newer version wrote it?)"
        ) from None


def kind_names() -> list[str]:
    """The names of every registered kind, sorted."""
    _load_built_in()
    return sorted(_KINDS)


def head_names() -> list[str]:
    """The names ``fit --head`` takes, sorted: those the registered kinds give (:attr:`HeadKind.head_name`)."""
    _load_built_in()
    return sorted(kind.head_name for kind in _KINDS.values() if kind.head_name is not None)


def token_stream_default() -> str | None:
    """The ``--head`` name of the kind ``fit`` picks on a token-stream store when no option picks one (``None``:
    the single-hop head); see :attr:`HeadKind.token_stream_default`."""
    _load_built_in()
    names = [kind.head_name for kind in _KINDS.values() if kind.token_stream_default and kind.head_name]
    if len(names) > 1:
        raise ValueError(f"head kinds {' and '.join(sorted(names))} are both the default on token streams")
    return names[0] if names else None


def spec_from_json(data: dict[str, Any]) -> HeadSpec:
    """The spec whose JSON (with its ``"kind"``) a checkpoint recorded."""
    return head_kind(str(data["kind"])).spec_from_json(data)


def head_from_arrays(kind: str, arrays: Any, meta: dict[str, Any]) -> Head:
    """The head of kind ``kind`` that :meth:`Head.to_arrays` wrote."""
    return head_kind(kind).head.from_arrays(arrays, meta)
