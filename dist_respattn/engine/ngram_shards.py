"""The Kneser-Ney n-gram baselines of ``evaluate`` counted, fitted and scored on the workers, in shards.

The n-gram counts of a 100M-token store are gigabytes (every distinct 5-gram, 4-gram...): none of them comes to the
driver. Each pass counting a store's n-grams is a reduce-scatter
(:meth:`~dist_respattn.engine.passes.PassRunner.run_scattered`): a partition's counts are split by the most recent
token of each n-gram's history into :data:`~dist_respattn.baselines.kneser_ney.SHARDS` shards, plus the counts of
the rows without a history (:func:`~dist_respattn.baselines.kneser_ney.split_counts`), and each part is reduced onto
its owner. Every suffix of a history keeps its most recent token, so a shard's n-grams are fitted and scored from
that shard's counts alone and the unigram level (``T`` numbers, made on one worker from each shard's distinct
bigrams by target). Then, on the workers, for each order:

1. each shard's model is built on its owner; the driver receives each order's counts of counts (four integers)
   and sums them into the closed-form discounts;
2. with held-out rows, each shard sums their log-likelihood at each candidate scale of the discounts (a float a
   candidate) and the driver picks the scale;
3. each shard scores the evaluated rows it owns: three sums.

The driver holds the discounts and these scalars (:attr:`ShardedNGrams.received` lists what it was sent); the
figures are those of :func:`~dist_respattn.baselines.kneser_ney.fit_kneser_ney` in one process, to the bit (its
sums are taken in the same parts and order).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import distributed
import numpy as np

from dist_respattn.baselines.kneser_ney import (
    SCALE_GRID,
    SHARDS,
    KneserNey,
    NGramCounts,
    PartScore,
    Unigrams,
    counts_of_counts,
    discounts_of_counts,
    distinct_bigram_targets,
    kneser_ney_parameters,
    ngrams_of_blocks,
    scaled_discounts,
    split_counts,
    unigram_level,
)
from dist_respattn.engine import worker_tasks
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.worker_tasks import RowSelection
from dist_respattn.model.heads.base import Columns
from dist_respattn.store.rows import RowStore

__all__ = ["NGramSharding", "ShardedNGrams"]


class NGramSharding:
    """How a partition's n-gram counts are split for the reduce-scatter (picklable: it travels with the tasks)."""

    def __init__(self, n_shards: int = SHARDS) -> None:
        self.n_shards = int(n_shards)

    def split(self, counts: NGramCounts, tables: Any) -> tuple[NGramCounts, tuple[NGramCounts, ...]]:
        return split_counts(counts, self.n_shards)


# -- on the workers -------------------------------------------------------------------------------------------


def _unigram_summary(unigrams: Unigrams) -> dict[str, Any]:
    return {"counts": counts_of_counts(unigrams.adjusted), "ngrams": int(unigrams.adjusted.size)}


def _shard_model(part: NGramCounts, order: int, unigrams: Unigrams) -> KneserNey:
    return KneserNey(part.truncated(order), np.zeros((order + 1, 3)), {}, unigrams)


def _model_summary(model: KneserNey) -> dict[str, Any]:
    """A shard model's counts of counts and n-grams of orders 2 and up (the unigram level is everyone's)."""
    counts = model.counts_of_counts()
    del counts["1"]
    return {"counts": counts, "ngrams": int(sum(model.levels[k].keys.size for k in range(2, model.order + 1)))}


def _objective(model: KneserNey, part: NGramCounts, candidates: list[np.ndarray]) -> tuple[float, list[float]]:
    """A part's held-out weight and its log-likelihood at each candidate's discounts."""
    part = part.truncated(model.order)
    return math.fsum([math.fsum(c) for c in part.counts]), model.part_sum_log_prob(part, candidates)


def _score(model: KneserNey, part: NGramCounts, discounts: np.ndarray) -> PartScore:
    return model.with_discounts(discounts).part_score(part.truncated(model.order))


# -- on the driver --------------------------------------------------------------------------------------------


class ShardedNGrams:
    """The sharded n-gram passes and fits of one ``evaluate`` (see the module).

    Attributes:
        received: every value the driver was sent, in order (counts of counts, sums: no table).
    """

    def __init__(self, runner: PassRunner, n_shards: int = SHARDS) -> None:
        self.runner, self.client = runner, runner.client
        self.sharding = NGramSharding(n_shards)
        self.received: list[Any] = []
        self._owners: list[str] | None = None
        self._next = 0

    def owners(self) -> list[str]:
        """The owner of each part (the 1-grams' first, then each shard's): the workers, in address order from a
        place fixed by the run, fixed for this evaluate once chosen."""
        if self._owners is None:
            alive = sorted(self.client.ncores())
            if not alive:
                self.client.wait_for_workers(1, timeout=60)
                alive = sorted(self.client.ncores())
            first = int(self.runner.run_tag.split(".")[0], 16) % len(alive)
            self._owners = [alive[(first + j) % len(alive)] for j in range(self.sharding.n_shards + 1)]
        return self._owners

    def count(
        self, order: int, store: RowStore, rows: RowSelection, label: str, description: str
    ) -> list[distributed.Future]:
        """The top n-grams (up to ``order``) of ``store``'s selected rows, reduce-scattered: ``[the 1-grams, shard 0,
        shard 1, ...]``, each on its owner."""
        fingerprint = store.fingerprint()
        schema = store.schema
        count = functools.partial(ngrams_of_blocks, order, schema.num_symbols, schema.num_targets)
        columns = Columns(windows=bool(getattr(store, "short_histories", False)))
        return self.runner.run_scattered(
            "ngrams", label, store.num_partitions, worker_tasks.pass_task,
            lambda part: (store.location, part, count, columns, fingerprint, rows),
            sharding=self.sharding, tables=None, owners=self.owners, description=description,
        )  # fmt: skip

    def _submit(self, owner: int, function: Any, *args: Any) -> distributed.Future:
        """``function(*args)`` on part ``owner``'s worker (0: the 1-grams', j + 1: shard j's)."""
        self._next += 1
        name = getattr(function, "__name__", "task").strip("_").replace("_", "-")
        return self.client.submit(
            function, *args, key=f"respattn-kn-{name}-{self._next}-{self.runner.run_tag}",
            workers=[self.owners()[owner]], allow_other_workers=True, pure=False,
        )  # fmt: skip

    def _fetch(self, futures: list[distributed.Future]) -> list[Any]:
        values = self.client.gather(futures)
        self.received.extend(values)
        return list(values)

    def _rows(self, parts: list[distributed.Future]) -> list[distributed.Future]:
        """The parts the sums are taken in: shard 0 with the 1-grams, then the other shards."""
        return [self._submit(1, operator.add, parts[0], parts[1]), *parts[2:]]

    def figures(
        self,
        order: int,
        scored: list[distributed.Future],
        train: list[distributed.Future],
        held: list[distributed.Future] | None,
    ) -> dict[int, dict[str, Any]]:
        """The Kneser-Ney n-grams of orders 3 to ``order`` fitted on the ``train`` parts (tuned on the ``held`` ones)
        and scored on the ``scored`` ones (all of :meth:`count`): ``{k: BaselineScore.to_json()}``."""
        shards = range(self.sharding.n_shards)
        bigrams = [self._submit(j + 1, distinct_bigram_targets, train[j + 1]) for j in shards]
        unigrams = self._submit(0, unigram_level, train[0], *bigrams)
        del bigrams
        (first,) = self._fetch([self._submit(0, _unigram_summary, unigrams)])
        scored_rows = self._rows(scored)
        held_rows = self._rows(held) if held is not None else None
        figures = {}
        for k in range(3, order + 1):
            models = [self._submit(j + 1, _shard_model, train[j + 1], k, unigrams) for j in shards]
            summaries = self._fetch([self._submit(j + 1, _model_summary, m) for j, m in enumerate(models)])
            counts = {"1": first["counts"]}
            for level in range(2, k + 1):
                counts[str(level)] = {
                    name: sum(s["counts"][str(level)][name] for s in summaries) for name in first["counts"]
                }
            closed = np.zeros((k + 1, 3))
            for level in range(1, k + 1):
                closed[level] = discounts_of_counts(counts[str(level)])
            objective, weight = None, 0.0
            if held_rows is not None:
                candidates = [scaled_discounts(closed, x) for x in SCALE_GRID]
                held_sums = self._fetch(
                    [self._submit(j + 1, _objective, models[j], held_rows[j], candidates) for j in shards]
                )
                weight = _added([w for w, _ in held_sums])
                if weight > 0.0:
                    objective = {x: _added([s[i] for _, s in held_sums]) for i, x in enumerate(SCALE_GRID)}
            num_grams = first["ngrams"] + sum(s["ngrams"] for s in summaries)
            discounts, parameters = kneser_ney_parameters(k, closed, counts, num_grams, objective, weight)
            parts = self._fetch([self._submit(j + 1, _score, models[j], scored_rows[j], discounts) for j in shards])
            figures[k] = PartScore.total(parts, parameters).to_json()
            del models
        return figures


def _added(values: list[float]) -> float:
    """Parts' sums added in order, as :mod:`~dist_respattn.baselines.kneser_ney` adds them."""
    total = 0.0
    for value in values:
        total += value
    return total
