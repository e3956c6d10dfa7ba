"""The recipe: the combination of kinds that predicts text best here, fitted in stages, as one spec.

A long-window copy head (cache and induction over recency buckets, started from a single head of that window), that
single head itself, and a short-window conjunction head of order 3 (a 4-gram at the previous position, skip-grams
further back) under a stack's gate learned on held-out rows: the way a Kneser-Ney n-gram is interpolated with a
document cache. Each part makes its own choices on the fit's held-out rows; the stack's gate is fitted on them too.
Over the stack, a repeat gate reads each row's whole document (its rates counted on the held-out rows) where the
targets are few enough for its (T,) sum a row (see ``docs/guide/recipe.md``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dist_respattn.model.buckets import max_geometric_buckets
from dist_respattn.model.heads.base import HeadSpec, Stage, Trainer, TrainerContext
from dist_respattn.model.heads.conj.kind import ConjSpec
from dist_respattn.model.heads.copy.kind import CopySpec
from dist_respattn.model.heads.repeat.kind import RepeatSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.stack.head import GATE_MODES
from dist_respattn.model.heads.stack.kind import StackSpec

__all__ = [
    "RECIPE_BUCKETS",
    "RECIPE_CONJ_DEPTH",
    "RECIPE_CONJ_ORDER",
    "RECIPE_DEEP_CONJ_MAX_ROWS",
    "RECIPE_HISTORY",
    "RECIPE_REPEAT_MAX_TARGETS",
    "RECIPE_SHORT_CONTEXT",
    "STAGE_DIRECTORIES",
    "RecipeSpec",
]

#: The window of the conjunction head (its rows are the long window's last tokens).
RECIPE_SHORT_CONTEXT = 8
#: Recency buckets of the long heads at most (a window of N has at most log2(N) + 1 geometric buckets).
RECIPE_BUCKETS = 10
#: The conjunction head's order (3: triple rows under the pair rows; a recipe recorded before it had one was 2).
RECIPE_CONJ_ORDER = 3
#: The conjunction head reads its pair and triple rows at every position of its window on stores of at most this many
#: rows, else at the :data:`RECIPE_CONJ_DEPTH` most recent. Every position's rows took 5% off the stack's test
#: perplexity on the Wikipedia summaries (0.74M training tokens) once each training row was left out of the rows that
#: explain it; they also hold about four times the cells, and at 109M tokens and 50,000 words the conjunction stage
#: of depth 2 already took 5.8 GiB of a worker (docs/guide/recipe.md).
RECIPE_DEEP_CONJ_MAX_ROWS = 20_000_000
#: The conjunction head's depth on larger stores (and in a recipe recorded before the depth was chosen).
RECIPE_CONJ_DEPTH = 2
#: Where each part goes under the fit's model directory (the last stage's model is the directory's own: the repeat gate,
#: or the stack of a recipe without one).
STAGE_DIRECTORIES = {"single": "single", "copy": "copy", "conj": "conj", "stack": "stack"}
#: The repeat gate's history: longer than most documents, so each row's reaches its document's start.
RECIPE_HISTORY = 100_000
#: The recipe adds the repeat gate up to this many targets: under dense emissions its passes make and sum the stack's
#: distribution of each held-out row, (T,) a row (0.19 ms a row a pass on one core at T = 2,000, 0.40 ms at 5,000; it
#: grows with T). Under sparse ones they read the stack's masses on the histories instead
#: (:mod:`~dist_respattn.model.heads.repeat.masses`), which do not grow with T.
RECIPE_REPEAT_MAX_TARGETS = 20_000


@dataclass(frozen=True)
class RecipeSpec(HeadSpec):
    """The recipe's settings.

    Attributes:
        single: the single-hop settings the fit options describe (each part's start and its open choices, chosen on
            held-out rows as a single-hop fit chooses them).
        buckets: the long heads' recency buckets (``None``: the window's geometric buckets, at most
            :data:`RECIPE_BUCKETS`; fixed by :meth:`for_window`).
        short_context: the conjunction head's window (at most the long one).
        gate: the stack's gate mode (``"target"``: the predictive distributions interpolated).
        conj_order: the conjunction head's order (:data:`RECIPE_CONJ_ORDER`; a recipe recorded without one, and so
            resumed, keeps order 2).
        repeat: whether a repeat gate over the whole document goes over the stack (``None``: when the corpus has at
            most :data:`RECIPE_REPEAT_MAX_TARGETS` targets, fixed by :meth:`for_window`; a recipe recorded without
            one, and so resumed, has none).
        conj_depth: how many of the most recent positions read the conjunction head's rows (``None``: its whole
            window on a store of at most :data:`RECIPE_DEEP_CONJ_MAX_ROWS` rows, else :data:`RECIPE_CONJ_DEPTH`,
            fixed by :meth:`for_window`; a recipe recorded without one, and so resumed, reads 2).
    """

    kind: ClassVar[str] = "recipe"
    window_dependent: ClassVar[bool] = True

    single: SingleHopSpec = field(default_factory=SingleHopSpec)
    buckets: int | None = None
    short_context: int = RECIPE_SHORT_CONTEXT
    gate: str = "target"
    conj_order: int = RECIPE_CONJ_ORDER
    repeat: bool | None = None
    conj_depth: int | None = None

    def __post_init__(self) -> None:
        if self.short_context < 1:
            raise ValueError(f"short_context = {self.short_context}: expected a positive window")
        if self.gate not in GATE_MODES:
            raise ValueError(f"--stack-gate {self.gate}: expected one of {', '.join(GATE_MODES)}")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "single": self.single.to_json(),
            "buckets": self.buckets,
            "short_context": self.short_context,
            "gate": self.gate,
            "conj_order": self.conj_order,
            "repeat": self.repeat,
            "conj_depth": self.conj_depth,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecipeSpec:
        single = dict(data.get("single") or {})
        single.pop("kind", None)
        buckets = data.get("buckets")
        depth = data.get("conj_depth", RECIPE_CONJ_DEPTH)  # a recipe recorded before the choice read 2
        return cls(
            SingleHopSpec(**single),
            None if buckets is None else int(buckets),
            int(data.get("short_context", RECIPE_SHORT_CONTEXT)),
            str(data.get("gate", "target")),
            int(data.get("conj_order", 2)),
            None if data.get("repeat", False) is None else bool(data.get("repeat", False)),
            None if depth is None else int(depth),
        )

    def for_window(
        self, context_length: int, *, num_targets: int | None = None, num_rows: int | None = None
    ) -> RecipeSpec:
        """The recipe on rows of window N: the long heads get the window's geometric buckets (at most
        :data:`RECIPE_BUCKETS`) unless given, the conjunction head a window no longer than N (its rows at each of its
        positions on a store of at most :data:`RECIPE_DEEP_CONJ_MAX_ROWS` ``num_rows``, else at the
        :data:`RECIPE_CONJ_DEPTH` most recent, unless given), and the repeat gate goes over the stack unless said
        otherwise when the store's ``num_targets`` are at most :data:`RECIPE_REPEAT_MAX_TARGETS`."""
        n = int(context_length)
        buckets = self.buckets if self.buckets is not None else min(RECIPE_BUCKETS, max_geometric_buckets(n))
        repeat = self.repeat
        if repeat is None:
            repeat = num_targets is not None and int(num_targets) <= RECIPE_REPEAT_MAX_TARGETS
        short = min(self.short_context, n)
        depth = self.conj_depth
        if depth is None:
            depth = short if num_rows is not None and int(num_rows) <= RECIPE_DEEP_CONJ_MAX_ROWS else RECIPE_CONJ_DEPTH
        return dataclasses.replace(
            self, buckets=buckets, short_context=short, repeat=repeat, conj_depth=min(int(depth), short)
        )

    def stages(self) -> list[Stage]:
        """The single head of the long window into ``single/``, the copy head started from it into ``copy/``, the
        conjunction head of the short window into ``conj/`` (its own start), then the stack of the three (the
        conjunction, copy and single heads) and, with :attr:`repeat`, the repeat gate over it: the stack into
        ``stack/`` and the gate into the model directory itself (without, the stack into the model directory)."""
        # A fit fixes the buckets first (for_window); only the stages' directories are read without.
        buckets = self.buckets if self.buckets is not None else RECIPE_BUCKETS
        long = dataclasses.replace(self.single, position_buckets=buckets)
        short = dataclasses.replace(self.single, position_buckets=None)
        directories = STAGE_DIRECTORIES
        stages = [
            Stage(long, directories["single"], settings={"position_buckets": buckets}),
            Stage(CopySpec(long), directories["copy"], settings={"position_buckets": buckets}),
            Stage(
                ConjSpec(short, depth=self.conj_depth or RECIPE_CONJ_DEPTH, order=self.conj_order),
                directories["conj"],
                settings={"context_length": self.short_context, "position_buckets": None, "min_context": None},
                start_from=None,
            ),
            Stage(
                # The long single head too: on item sequences, where the copy head has little to copy, it is the
                # part the gate weighs most (0.55 on users' ratings at N = 128); on text the gate gives it little.
                StackSpec((directories["conj"], directories["copy"], directories["single"]), self.gate),
                directories["stack"] if self.repeat else ".",
                settings={"position_buckets": None, "min_context": None},
                start_from=None,
            ),
        ]
        if self.repeat:
            # One iteration: the start counts the rates, the first M-step finds the same ones (they are counts).
            stages.append(
                Stage(
                    RepeatSpec(directories["stack"]),
                    ".",
                    settings={
                        "context_length": RECIPE_HISTORY,
                        "position_buckets": None,
                        "min_context": None,
                        "max_iter": 1,
                    },
                    start_from=None,
                )
            )
        return stages

    def trainer(self, context: TrainerContext) -> Trainer:
        raise ValueError("a recipe is fitted by its stages (RecipeSpec.stages), each by its own kind's trainer")
