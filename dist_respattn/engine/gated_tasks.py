"""The worker functions of an attribute-gated head: one task reads one partition, block by block, with each row's
attribute, and returns a small additive value.

Like :mod:`dist_respattn.engine.tasks` (whose store checks and row selections these reuse): the support pass
collects the (symbol, target) pairs of the training rows, the E-step pass the gated statistics, the score pass
the log-likelihood per attribute, the classify pass every document's log-likelihood under every attribute,
and the per-attribute pairs pass the counts behind each attribute's own n-gram baseline.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.engine.tasks import RowSelection, _checked_store, _located
from dist_respattn.model.emission import SparseEmissionCounts
from dist_respattn.model.gated import GatedHead, GatedStatistics, gated_estep, gated_log_likelihood
from dist_respattn.model.pairs import PairCounts
from dist_respattn.store.errors import StoreError
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.problems import EncodedRows
from dist_respattn.store.rows import RowStore

__all__ = [
    "AttributePairs",
    "AttributeScores",
    "DocumentScores",
    "SupportValue",
    "attribute_pairs_task",
    "classify_task",
    "gated_estep_task",
    "gated_score_task",
    "support_task",
]


def attribute_names_of(store: RowStore) -> tuple[str, ...]:
    """The store's attribute names; a store without attributes raises naming the flags that write them."""
    names = getattr(store, "attribute_names", None)
    if not names:
        raise StoreError(
            f"{store.location}: the store has no attribute per row; an attribute-gated head needs one: ingest it "
            "with --attribute-by {file,directory} (text) or --attributes A.npy (tokens, arrays)"
        )
    return tuple(names)


def _blocks(store: RowStore, part: int, rows: RowSelection) -> Iterator[tuple[EncodedRows, np.ndarray, Any]]:
    """Partition ``part``'s blocks as ``(rows, attribute (n,) int64, weights (n,) or None)`` under ``rows``; of a
    hold-out's held-out side only the held-out rows are read (a block with none is skipped)."""
    for begin, end in store.block_ranges(part):
        if rows.rule is not None and rows.side == "heldout":
            held = rows.rule.held_out(begin, end)
            if not held.any():
                continue
            block = store.read_selected(begin, end, held)
            attribute = store.read_attributes(begin, end, held)
            yield block, attribute.astype(np.int64), block.weight
        else:
            block = store.read_rows(begin, end)
            yield block, store.read_attributes(begin, end).astype(np.int64), rows.weights(block)


# ------------------------------------------------------------------------------------------ support


@dataclass(frozen=True)
class SupportValue:
    """The (symbol, target) pairs the selected rows hold at any position, as counts carrying their support."""

    counts: SparseEmissionCounts

    def __add__(self, other: SupportValue) -> SupportValue:
        c = self.counts
        return SupportValue(SparseEmissionCounts.union([c, other.counts], c.num_symbols, c.num_targets))


def support_task(location: StoreLocation, part: int, fingerprint: str, rows: RowSelection) -> SupportValue:
    """The pairs ``(context[n, i], target[n])`` of partition ``part``'s selected rows (weight > 0)."""
    store = _checked_store(location, fingerprint)
    s, t = store.schema.num_symbols, store.schema.num_targets
    total = SupportValue(SparseEmissionCounts.empty(s, t))
    for block, _, weights in _blocks(store, part, rows):
        live = slice(None) if weights is None else np.asarray(weights) > 0
        context, target = block.context[live], block.target[live]
        keys = np.repeat(target.astype(np.int64), context.shape[1]) * s + context.reshape(-1)
        total = total + SupportValue(SparseEmissionCounts.from_cells(keys, None, s, t))  # type: ignore[arg-type]
    return total


# ------------------------------------------------------------------------------------------ E-step


def gated_estep_task(
    location: StoreLocation,
    part: int,
    head: GatedHead,
    fingerprint: str,
    rows: RowSelection,
    factor_counts: bool = True,
    attribute_map: np.ndarray | None = None,
) -> GatedStatistics:
    """Gated E-step statistics of partition ``part``'s selected rows.

    ``attribute_map`` (A_store,) int64 maps the store's attribute ids to the head's, ``-1`` for rows that do not
    count (folding in: only the new attributes' rows, as the probe head's ids); ``None`` is the identity.
    """
    store = _checked_store(location, fingerprint)
    stats = GatedStatistics.zeros(head, factor_counts=factor_counts)
    for block, attribute, weights in _blocks(store, part, rows):
        attribute, weights = _mapped(attribute, weights, attribute_map)
        try:
            gated_estep(
                head, block.encoded, attribute, weights, stats, factor_counts=factor_counts,
                values_checked=block.checked,
            )  # fmt: skip
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
    return stats


def _mapped(
    attribute: np.ndarray, weights: np.ndarray | None, attribute_map: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    if attribute_map is None:
        return attribute, weights
    mapped = attribute_map[attribute]
    keep = mapped >= 0
    w = np.where(keep, 1.0 if weights is None else np.asarray(weights, dtype=np.float64), 0.0)
    return np.where(keep, mapped, 0), w


# ------------------------------------------------------------------------------------------ scores


@dataclass(frozen=True)
class AttributeScores:
    """Held-out totals per store attribute: ``log_lik`` (A,) the summed row log-likelihoods, ``weight`` (A,)."""

    log_lik: np.ndarray
    weight: np.ndarray

    def __add__(self, other: AttributeScores) -> AttributeScores:
        return AttributeScores(self.log_lik + other.log_lik, self.weight + other.weight)

    def perplexity(self) -> np.ndarray:
        """(A,) ``exp(-log_lik / weight)``, NaN where an attribute has no rows."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.exp(-self.log_lik / self.weight)


def gated_score_task(
    location: StoreLocation,
    part: int,
    head: GatedHead,
    fingerprint: str,
    rows: RowSelection,
    num_attributes: int,
    attribute_map: np.ndarray | None = None,
) -> AttributeScores:
    """Each selected row's ``log p(target | context, query, a)`` summed per store attribute (its ``num_attributes``).

    ``attribute_map`` gives the head's id of each store attribute, ``-1`` for rows not scored; the shared head
    is scored as a gated head of one factor (:meth:`GatedHead.from_shared`).
    """
    store = _checked_store(location, fingerprint)
    log_lik, weight = np.zeros(num_attributes), np.zeros(num_attributes)
    for block, attribute, weights in _blocks(store, part, rows):
        own, w = _mapped(attribute, np.ones(block.num_rows) if weights is None else weights, attribute_map)
        try:
            lines = gated_log_likelihood(head, block.encoded, own, given_query=True, values_checked=block.checked)
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
        assert w is not None
        live = w > 0
        log_lik += np.bincount(attribute[live], weights=w[live] * lines[live], minlength=num_attributes)
        weight += np.bincount(attribute[live], weights=w[live], minlength=num_attributes)
    return AttributeScores(log_lik, weight)


@dataclass(frozen=True)
class DocumentScores:
    """Per document: ``documents`` (k,) ids, ``log_lik`` (k, A) the summed row log-likelihood under every
    attribute, ``attribute`` (k,) its own store attribute, ``rows`` (k,)."""

    documents: np.ndarray
    log_lik: np.ndarray
    attribute: np.ndarray
    rows: np.ndarray

    @classmethod
    def empty(cls, num_attributes: int) -> DocumentScores:
        return cls(np.zeros(0, np.int64), np.zeros((0, num_attributes)), np.zeros(0, np.int64), np.zeros(0))

    def __add__(self, other: DocumentScores) -> DocumentScores:
        """Documents of both, a document cut by a partition boundary summed (in this order, then ``other``'s)."""
        docs = np.concatenate([self.documents, other.documents])
        order = np.argsort(docs, kind="stable")
        unique, first = np.unique(docs[order], return_index=True)
        group = np.repeat(np.arange(unique.shape[0]), np.diff(np.append(first, docs.shape[0])))
        log_lik = np.zeros((unique.shape[0], self.log_lik.shape[1]))
        np.add.at(log_lik, group, np.concatenate([self.log_lik, other.log_lik])[order])
        rows = np.bincount(group, weights=np.concatenate([self.rows, other.rows])[order], minlength=unique.shape[0])
        attribute = np.concatenate([self.attribute, other.attribute])[order][first]
        return DocumentScores(unique, log_lik, attribute, rows)


def classify_task(
    location: StoreLocation, part: int, head: GatedHead, fingerprint: str, candidates: np.ndarray
) -> DocumentScores:
    """Every document's (its rows in partition ``part``) log-likelihood under each candidate attribute (K,)."""
    store = _checked_store(location, fingerprint)
    total = DocumentScores.empty(candidates.shape[0])
    for begin, end in store.block_ranges(part):
        block = store.read_rows(begin, end)
        attribute = store.read_attributes(begin, end).astype(np.int64)
        documents = store.read_documents(begin, end)
        try:
            table = gated_log_likelihood(
                head, block.encoded, candidates=candidates, given_query=True, values_checked=block.checked
            )
        except ValueError as exc:
            raise _located(store, part, block, exc) from None
        weight = np.ones(block.num_rows) if block.weight is None else np.asarray(block.weight, dtype=np.float64)
        # A row of weight 0 does not count (its log-likelihood may be -inf: 0 * -inf would be NaN).
        table = np.where(weight[:, None] > 0.0, table * weight[:, None], 0.0)
        unique, first, group = np.unique(documents, return_index=True, return_inverse=True)
        log_lik = np.zeros((unique.shape[0], candidates.shape[0]))
        np.add.at(log_lik, group, table)
        rows = np.bincount(group, weights=(weight > 0.0).astype(float), minlength=unique.shape[0])
        total = total + DocumentScores(unique, log_lik, attribute[first], rows)
    return total


# ------------------------------------------------------------------------------------------ n-gram baselines


@dataclass(frozen=True)
class AttributePairs:
    """The previous-symbol pairs of the selected rows, one :class:`PairCounts` per store attribute."""

    pairs: tuple[PairCounts, ...]

    def __add__(self, other: AttributePairs) -> AttributePairs:
        return AttributePairs(tuple(a + b for a, b in zip(self.pairs, other.pairs, strict=True)))


def attribute_pairs_task(
    location: StoreLocation, part: int, fingerprint: str, rows: RowSelection, num_attributes: int
) -> AttributePairs:
    """Per attribute, the (last context symbol, target) pairs of partition ``part``'s selected rows."""
    store = _checked_store(location, fingerprint)
    s, t = store.schema.num_symbols, store.schema.num_targets
    pairs = [PairCounts.empty(s, t) for _ in range(num_attributes)]
    for block, attribute, weights in _blocks(store, part, rows):
        for a in np.unique(attribute):
            mine = attribute == a
            w = None if weights is None else np.asarray(weights)[mine]
            pairs[int(a)] = pairs[int(a)] + PairCounts.from_rows(
                block.context[mine, -1], block.target[mine], w, num_symbols=s, num_targets=t
            )
    return AttributePairs(tuple(pairs))
