"""The functions that run on the workers: one task reads one partition of a store, block by block.

Every task opens the store itself (a ``TripleStore`` pickles as its location), checks that it is
still the store the fit planned on, and returns a small additive value: E-step statistics, held-out
score totals or target counts. Nothing here talks to the client.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dist_respattn.model._checks import ImpossibleEvidenceError
from dist_respattn.model.accumulator import ResponsibilityAttentionAccumulatorFactory, SufficientStatistics
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.scoring import ScoreTotals, score_rows
from dist_respattn.store import EncodedRows, StoreError, StoreLocation, TripleStore
from dist_respattn.store.checks import block_problems

__all__ = [
    "TargetCounts",
    "combine_values",
    "count_targets_task",
    "estep_task",
    "init_task",
    "score_task",
]


@functools.cache
def _configure_worker_process() -> None:
    """Decode on this worker's own threads: blosc and zarr would otherwise each start a pool per core.

    With one worker process per core, extra decoding threads only fight the other workers' kernels.
    """
    import numcodecs.blosc
    import zarr

    threads = 1
    try:
        from distributed import get_worker

        threads = max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):  # not inside a worker (tests call tasks directly)
        pass
    if hasattr(numcodecs.blosc, "set_nthreads"):
        numcodecs.blosc.set_nthreads(threads)
    zarr.config.set({"threading.max_workers": threads})


def _checked_store(location: StoreLocation, fingerprint: str) -> TripleStore:
    """Open the store on the worker and check it is the one the fit started on.

    Tasks carry the store's location, not an opened store: the scheduler unpickles every task, and
    must neither read the store (it may have no access to it) nor pay for opening it once per task.
    """
    _configure_worker_process()
    store = TripleStore.open(location)
    if store.fingerprint() != fingerprint:
        raise StoreError(
            f"{store.location}: the store changed while the fit ran (fingerprint {store.fingerprint()}, "
            f"expected {fingerprint}); restart the fit on the store as it is now"
        )
    return store


def _located(store: TripleStore, part: int, block: EncodedRows, exc: ValueError) -> ValueError:
    """The kernel counts rows from the block's start; name the store, its array and the store row instead.

    A bad value (an id out of range, a non-finite number) is found again by the store's own checks,
    which give the global row and chunk; rows the model finds impossible keep the kernel's message,
    with the block's position in the store.
    """
    if not isinstance(exc, ImpossibleEvidenceError):
        problems = block_problems(block, store.schema, block.start // store.chunk_rows)
        if problems:
            more = f" (and {len(problems) - 1} more kinds of bad value)" if len(problems) > 1 else ""
            return StoreError(
                f"{store.location}: partition {part}: {problems[0]}{more}; `dist-respattn validate` lists them all"
            )
    kind = type(exc) if isinstance(exc, ImpossibleEvidenceError) else ValueError
    return kind(
        f"{store.location}: partition {part}, block starting at store row {block.start} (row numbers below "
        f"count from there): {exc}"
    )


def init_task(
    location: StoreLocation,
    part: int,
    factory: ResponsibilityAttentionAccumulatorFactory,
    seed: int,
    fingerprint: str,
) -> SufficientStatistics:
    """Statistics of partition ``part`` under random responsibilities drawn from ``(seed, part)``.

    The draws depend on the seed and the partition only, so the first model is the same on any cluster.
    """
    store = _checked_store(location, fingerprint)
    accumulator = factory.make()
    rng = np.random.default_rng([int(seed), int(part)])
    for block in store.iter_blocks(part):
        try:
            accumulator.seq_initialize(block.encoded, block.weight, rng)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
    return accumulator.value()


def estep_task(
    location: StoreLocation,
    part: int,
    model: ResponsibilityAttentionDistribution,
    factory: ResponsibilityAttentionAccumulatorFactory,
    fingerprint: str,
) -> SufficientStatistics:
    """E-step statistics of partition ``part`` under ``model``, its blocks visited in row order.

    Holds one block of rows (one chunk, plus zarr's decode buffers) and one accumulator at a time.
    """
    store = _checked_store(location, fingerprint)
    accumulator = factory.make()
    for block in store.iter_blocks(part):
        try:
            accumulator.seq_update(block.encoded, block.weight, model)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
    return accumulator.value()


def score_task(
    location: StoreLocation, part: int, model: ResponsibilityAttentionDistribution, fingerprint: str
) -> ScoreTotals:
    """Held-out totals of partition ``part``: joint log-likelihood and predictive scores of the targets."""
    store = _checked_store(location, fingerprint)
    totals = ScoreTotals()
    for block in store.iter_blocks(part):
        try:
            totals = totals + score_rows(model, block.encoded, block.weight)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
    return totals


class TargetCounts:
    """Weighted target counts: ``unigram`` (T,) and, for token stores, ``bigram`` (S, T) by previous token.

    The previous token of a window's target is the last id of its context (``context[:, -1]``).
    """

    def __init__(self, unigram: np.ndarray, bigram: np.ndarray | None) -> None:
        self.unigram = unigram
        self.bigram = bigram

    def __add__(self, other: TargetCounts) -> TargetCounts:
        bigram = None if self.bigram is None or other.bigram is None else self.bigram + other.bigram
        return TargetCounts(self.unigram + other.unigram, bigram)


def count_targets_task(location: StoreLocation, part: int, fingerprint: str, bigram: bool) -> TargetCounts:
    """Target counts of partition ``part`` (and by previous token when ``bigram``), in float64."""
    store = _checked_store(location, fingerprint)
    schema = store.schema
    unigram = np.zeros(schema.num_targets)
    pairs = np.zeros((schema.num_symbols, schema.num_targets)) if bigram else None
    for block in store.iter_blocks(part):
        weight = None if block.weight is None else block.weight.astype(np.float64)
        unigram += np.bincount(block.target, weights=weight, minlength=schema.num_targets)
        if pairs is not None:
            cell = block.context[:, -1].astype(np.int64) * schema.num_targets + block.target
            pairs += np.bincount(cell, weights=weight, minlength=pairs.size).reshape(pairs.shape)
    return TargetCounts(unigram, pairs)


def combine_values(*values: Any) -> Any:
    """The sum of additive values, added left to right in the order given (so the result is reproducible).

    Takes E-step statistics (``SufficientStatistics``), ``ScoreTotals`` or ``TargetCounts``.
    """
    first, rest = values[0], values[1:]
    if isinstance(first, SufficientStatistics):
        arrays = [np.array(a, copy=True, order="K") for a in first[:4]]
        query_sq, n_obs, log_lik = first.query_sq, first.n_obs, first.log_lik
        for value in rest:
            for out, add in zip(arrays, value[:4], strict=True):
                out += add
            query_sq += value.query_sq
            n_obs += value.n_obs
            log_lik += value.log_lik
        key_sum, key_mass, emission_count, position_count = arrays
        return SufficientStatistics(key_sum, key_mass, emission_count, position_count, query_sq, n_obs, log_lik)
    total = first
    for value in rest:
        total = total + value
    return total
