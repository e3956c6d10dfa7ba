"""The chain's held-out choice of its single head's open hyperparameters: the gate variance and the emission's MAP
strengths, scored as the single head's grid scores them.

A candidate emission changes only what the last hop's token emits, so a row's last-hop attention ``a`` (the forward
pass without the target) and ``log p(query | window)`` are computed once per gate variance, and every strength pair
``(e, g)`` is then ``p(t | row) = sum_j a_j B_eg[c_j, t]`` with ``B_eg[s, t] = (c[s, t] + a_s u[t]) / (c[s] + a_s)``,
``a_s = e + g n_s`` (the MAP emission of the M-step's counts): O(N) a row and point. A gate variance changes every
hop's gate, so each one costs a forward pass over the held-out rows; the chain searches it a step at a time (the
grid value nearest the last choice and its two neighbours on the single head's grid of gate variances).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from dist_respattn.model.fitting.selection import (
    GridTable,
    GridTotals,
    Hyperparameters,
    HyperparameterSearch,
    as_hyperparameters,
    grid_count,
    grid_count_arrays,
    nearby,
)
from dist_respattn.model.heads.base import Block, Candidates, Columns, Grid
from dist_respattn.model.heads.hops.head import HopsHead
from dist_respattn.model.heads.hops.kernels import hop_score
from dist_respattn.model.heads.single_hop.kind import SingleHopCandidates

__all__ = ["HopsCandidates", "HopsGrid"]


@numba.njit(cache=True, nogil=True)
def _emission_grid(
    tokens, begin, end, target, weights, attention, per_row, emission_count_ts, indptr, symbols, pair_counts,
    direct_row, direct_slots, row_totals, base, types, emission_strengths, type_strengths, out_pred, out_joint,
):  # pragma: no cover - compiled  # fmt: skip
    """Add every strength pair's ``w log p(target | row)`` into ``out_pred`` (G2*G3,) and ``w log p(query, target |
    row)`` into ``out_joint``, from each row's last-hop ``attention`` (n, N) (column order, 0 on masked columns) and
    ``per_row[:, 0]`` (its ``log p(query | window)``); returns the weight."""
    n_pos = attention.shape[1]
    n_type = type_strengths.shape[0]
    n_emis = emission_strengths.shape[0] * n_type
    num = np.empty(n_emis)
    weight = 0.0
    for row in range(target.shape[0]):
        w = 1.0 if weights.shape[0] == 0 else weights[row]
        if w == 0.0:
            continue
        t = target[row]
        u = base[t]
        lo = begin[row]
        m = end[row] - lo
        for k in range(n_emis):
            num[k] = 0.0
        for j in range(m):
            a = attention[row, n_pos - m + j]
            if a == 0.0:
                continue
            c = tokens[lo + j]
            count = grid_count(t, c, emission_count_ts, indptr, symbols, pair_counts, direct_row, direct_slots)
            total = row_totals[c]
            typ = types[c]
            for h in range(emission_strengths.shape[0]):
                for b in range(n_type):
                    s = emission_strengths[h] + type_strengths[b] * typ
                    den = total + s
                    num[h * n_type + b] += a * ((count + s * u) / den if den > 0.0 else u)
        for k in range(n_emis):
            log_num = math.log(num[k]) if num[k] > 0.0 else -np.inf
            out_pred[k] += w * log_num
            out_joint[k] += w * (per_row[row, 0] + log_num)
        weight += w
    return weight


@dataclass(frozen=True)
class HopsGrid(Grid):
    """The held-out pass of a chain's M-step: ``head`` (the new chain at any emission) run once per gate variance of
    ``table``, every strength pair of ``table`` scored from its last hop's attention."""

    head: HopsHead
    table: GridTable

    @property
    def columns(self) -> Columns:
        return Columns(windows=True)

    def nbytes(self) -> int:
        return int(self.head.nbytes() + self.table.counts.nbytes)

    def score(self, blocks: Iterable[Block]) -> GridTotals:
        table, head = self.table, self.head
        dense_ts, indptr, symbols, pair_counts = grid_count_arrays(table)
        direct_row, direct_slots = table.direct_pair_rows
        g1, g2, g3 = table.shape
        pred, joint = np.zeros((g1, g2 * g3)), np.zeros((g1, g2 * g3))
        d = head.query_dim
        # The chain at each gate variance: the same tables, the gate's two scalars those of a head of that sigma2.
        params = [
            dataclasses.replace(head.parameters, inv_two_sigma2=0.5 / float(s2),
                                gate_const=-0.5 * d * float(np.log(2.0 * np.pi * float(s2))))
            for s2 in table.sigma2
        ]  # fmt: skip
        weight = 0.0
        for block in blocks:
            rows = block.rows if block.weights is block.rows.weight else block.rows._replace(weight=block.weights)
            head.check_rows(rows)
            arrays = rows.kernel_arrays()
            per_row = np.empty((rows.num_rows, 2))
            block_weight = 0.0
            for g, chain in enumerate(params):
                _, _, _, attention = hop_score(rows, chain, per_row)
                block_weight = _emission_grid(
                    arrays.tokens, arrays.begin, arrays.end, arrays.target, arrays.weight, attention, per_row,
                    dense_ts, indptr, symbols, pair_counts, direct_row, direct_slots, table.row_totals, table.base,
                    table.types, table.emission_strengths, table.type_strengths, pred[g], joint[g],
                )  # fmt: skip
            weight += block_weight
        return GridTotals(weight, pred.reshape(g1, g2, g3), joint.reshape(g1, g2, g3))


@dataclass(frozen=True)
class HopsCandidates(Candidates):
    """A chain's M-step: the single head's candidates (hop 1 and the emission) and the later hops' new tables; its
    choices are the single head's :class:`~dist_respattn.model.fitting.selection.Hyperparameters`.

    Each grid scores the gate variances :func:`nearby` the last choice's (or, before any, ``centre``'s) and, on the
    emission strengths, the single head's whole grid before any choice, the values nearby the last choice after.
    """

    single: SingleHopCandidates
    keys: np.ndarray
    priors: np.ndarray
    hop_queries: np.ndarray
    softmax: bool
    centre: Hyperparameters

    def default(self) -> Hyperparameters:
        return self.single.default()

    def grid(self, around: Any) -> HopsGrid:
        search = self.single.search or HyperparameterSearch(None, None, None)
        candidates = self.single.candidates
        defaults = candidates.defaults
        last = None if around is None else as_hyperparameters(around, defaults)
        centre = last or self.centre
        scales = nearby(search.sigma2_scales, centre.sigma2 / candidates.query_scale)
        strengths, types = search.emission_strengths, search.type_strengths
        if last is not None:
            strengths, types = nearby(strengths, last.emission_strength), nearby(types, last.type_strength)
        table = candidates.grid_table(HyperparameterSearch(scales, strengths, types))
        return HopsGrid(self.model(defaults), table)

    def choose(self, grid: Grid, scores: Any) -> tuple[Hyperparameters, dict[str, float] | None]:
        assert isinstance(grid, HopsGrid)
        selection = self.single.candidates.select(grid.table, scores)
        return selection.hyperparameters, selection.heldout

    def model(self, choice: Any) -> HopsHead:
        single = self.single.model(as_hyperparameters(choice, self.single.candidates.defaults))
        return HopsHead(single, self.keys, self.priors, self.hop_queries, softmax=self.softmax)

    def searches(self) -> bool:
        return self.single.searches()
