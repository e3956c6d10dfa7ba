"""The emission ``B[s, t]`` behind one interface, in two layouts: dense (S, T), or sparse over a fixed support.

A head's emission is read (log-probabilities of (symbol, target) pairs, the predictive mixture of a
batch, sampling, arrays for a checkpoint) and written (additive counts per pair, combined across
partitions, then normalized by the M-step). :class:`Emission` is the read side and
:class:`EmissionCounts` the write side; each has a dense and a sparse implementation.

The sparse layout stores the pairs that occur in the training rows (its :class:`PairSupport`, found
once per fit: every pair an E-step touches is one of them, so the E-step is exact) and gives every
other pair the factored backoff of the MAP emission::

    B[s, t] = values[p]                   where p is the pair (s, t) in the support
    B[s, t] = backoff[s] * base[t]        for a pair outside it

which is ``a_s u[t] / (c[s] + a_s)`` (see :mod:`dist_respattn.model.emission.prior`). Memory follows the
number of pairs P, never S×T. Both layouts give the same probabilities to the last bit of the
formula, so a sparse fit equals a dense one up to the order float64 sums are added in.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from dist_respattn.model.fixed import FitConstant
from dist_respattn.model.kernels.emission_rows import add_stored_rows, column_totals, map_pair_values, pair_row_totals
from dist_respattn.model.kernels.pair_keys import merge_supports, tally_keys

__all__ = [
    "DENSE_CELL_LIMIT",
    "EMISSION_LAYOUTS",
    "DenseEmission",
    "DenseEmissionCounts",
    "Emission",
    "EmissionCounts",
    "PairSupport",
    "SparseEmission",
    "SparseEmissionCounts",
    "choose_layout",
    "emission_from_arrays",
    "map_values",
]

Layout = Literal["dense", "sparse"]

#: ``--emission-layout`` choices: ``auto`` picks by size (:func:`choose_layout`).
EMISSION_LAYOUTS = ("auto", "dense", "sparse")

#: ``auto`` keeps an emission of at most this many cells (S×T) dense: 2**23 cells is 64 MiB of float64,
#: where the dense kernel is still faster than a lookup (S = T = 2000 is 4M cells).
DENSE_CELL_LIMIT = 2**23


def choose_layout(num_symbols: int, num_targets: int, layout: str = "auto") -> Layout:
    """The layout a fit of S symbols and T targets uses: ``layout`` itself, or by size when ``"auto"``."""
    if layout not in EMISSION_LAYOUTS:
        raise ValueError(f"emission layout = {layout!r}: expected one of {', '.join(EMISSION_LAYOUTS)}")
    if layout == "auto":
        return "dense" if int(num_symbols) * int(num_targets) <= DENSE_CELL_LIMIT else "sparse"
    return layout  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------ support


@dataclass(frozen=True, eq=False)
class PairSupport(FitConstant):
    """A fixed set of (symbol, target) pairs, target-major (CSR by target); fixed for a fit (a :class:`FitConstant`:
    never changed once made).

    Attributes:
        num_symbols, num_targets: S and T.
        indptr: (T + 1,) int64; the pairs of target ``t`` are ``indptr[t]:indptr[t + 1]``.
        symbols: (P,) int32, the symbols of target ``t``'s pairs, strictly increasing within a target.

    A pair's index ``p`` (its position in ``symbols``) indexes every per-pair array (values, counts).
    """

    num_symbols: int
    num_targets: int
    indptr: np.ndarray
    symbols: np.ndarray

    def __post_init__(self) -> None:
        indptr = np.ascontiguousarray(self.indptr, dtype=np.int64)
        symbols = np.ascontiguousarray(self.symbols, dtype=np.int32)
        if indptr.shape != (self.num_targets + 1,) or indptr[0] != 0 or indptr[-1] != symbols.shape[0]:
            raise ValueError(
                f"pair support: indptr has shape {indptr.shape} and ends at "
                f"{int(indptr[-1]) if indptr.size else None}: "
                f"expected ({self.num_targets + 1},) from 0 to the {symbols.shape[0]} pairs"
            )
        if np.any(np.diff(indptr) < 0):
            raise ValueError("pair support: indptr must be non-decreasing")
        if symbols.size and (symbols.min() < 0 or symbols.max() >= self.num_symbols):
            raise ValueError(f"pair support: symbols must lie in [0, {self.num_symbols})")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "symbols", symbols)

    @classmethod
    def from_keys(cls, keys: np.ndarray, num_symbols: int, num_targets: int) -> PairSupport:
        """From strictly increasing target-major cells ``t * S + s`` (int64)."""
        keys = np.asarray(keys, dtype=np.int64)
        targets = keys // num_symbols
        indptr = np.zeros(num_targets + 1, dtype=np.int64)
        np.cumsum(np.bincount(targets, minlength=num_targets), out=indptr[1:])
        return cls(int(num_symbols), int(num_targets), indptr, (keys - targets * num_symbols).astype(np.int32))

    @classmethod
    def full(cls, num_symbols: int, num_targets: int) -> PairSupport:
        """Every pair (for tests and tiny heads)."""
        indptr = np.arange(num_targets + 1, dtype=np.int64) * num_symbols
        return cls(
            int(num_symbols), int(num_targets), indptr, np.tile(np.arange(num_symbols, dtype=np.int32), num_targets)
        )

    @property
    def num_pairs(self) -> int:
        """P."""
        return int(self.symbols.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.symbols.nbytes)

    @functools.cached_property
    def targets(self) -> np.ndarray:
        """(P,) int32 target of each pair (made once, on first use)."""
        return np.repeat(np.arange(self.num_targets, dtype=np.int32), np.diff(self.indptr))

    def keys(self) -> np.ndarray:
        """(P,) int64 target-major cells ``t * S + s``, strictly increasing."""
        return self.targets.astype(np.int64) * self.num_symbols + self.symbols

    def locate(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """The pair index of each ``(symbols[m], targets[m])``: (m,) int64, -1 for a pair outside the support."""
        cells = np.asarray(targets, dtype=np.int64) * self.num_symbols + np.asarray(symbols, dtype=np.int64)
        if self.num_pairs == 0:
            return np.full(cells.shape, -1, dtype=np.int64)
        keys = self._sorted_keys
        at = np.minimum(np.searchsorted(keys, cells), keys.size - 1)
        return np.where(keys[at] == cells, at, -1)

    @functools.cached_property
    def _sorted_keys(self) -> np.ndarray:
        return self.keys()

    @functools.cached_property
    def symbol_major(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr (S + 1,), targets (P,), pair (P,))``: the same pairs by symbol, with each one's pair index."""
        order = np.argsort(self.symbols, kind="stable")  # stable: targets stay increasing within a symbol
        indptr = np.zeros(self.num_symbols + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.symbols, minlength=self.num_symbols), out=indptr[1:])
        return indptr, self.targets[order], order.astype(np.int64)

    def same_as(self, other: PairSupport) -> bool:
        return self is other or (
            (self.num_symbols, self.num_targets) == (other.num_symbols, other.num_targets)
            and np.array_equal(self.indptr, other.indptr)
            and np.array_equal(self.symbols, other.symbols)
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"support_indptr": self.indptr, "support_symbols": self.symbols}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any], num_symbols: int) -> PairSupport:
        indptr = np.asarray(arrays["support_indptr"])
        return cls(int(num_symbols), int(indptr.shape[0] - 1), indptr, np.asarray(arrays["support_symbols"]))

    def __getstate__(self) -> dict[str, Any]:
        # The derived arrays are rebuilt where needed, not shipped.
        return {k: v for k, v in self.__dict__.items() if k in ("num_symbols", "num_targets", "indptr", "symbols")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


# --------------------------------------------------------------------------------------- read side


class Emission(abc.ABC):
    """The read side of an emission ``B`` (S, T): every row a probability vector over the T targets."""

    layout: ClassVar[Layout]
    num_symbols: int
    num_targets: int

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes held (the probabilities; a kernel's log tables are counted by the caller)."""

    @abc.abstractmethod
    def prob(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``B[symbols[m], targets[m]]``: (m,) float64."""

    def log_prob(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``log B`` of pairs: (m,) float64, ``-inf`` where the probability is 0."""
        with np.errstate(divide="ignore"):
            return np.log(self.prob(symbols, targets))

    @abc.abstractmethod
    def predictive(self, context: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """``sum_i attention[:, i] B[context[:, i], :]``: (b, T) for a block (b, N) of contexts."""

    def rows(self, symbols: np.ndarray) -> np.ndarray:
        """``B[symbols, :]``: (b, T) float64 for a block of symbols (the caller bounds b·T)."""
        symbols = np.asarray(symbols, dtype=np.int64)
        return self.predictive(symbols[:, None], np.ones((symbols.size, 1)))

    @abc.abstractmethod
    def sample(self, symbols: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One target drawn from ``B[s, :]`` for each symbol: (m,) int64."""

    @abc.abstractmethod
    def to_dense(self) -> np.ndarray:
        """The (S, T) probabilities (materialized for a sparse emission: small heads and tests only)."""

    @abc.abstractmethod
    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays that define it (float64, int64 and int32), for a checkpoint's npz."""

    @abc.abstractmethod
    def restricted(self, support: PairSupport) -> Emission:
        """The same probabilities in the layout of a fit over ``support`` (a warm start on other rows)."""


class DenseEmission(Emission):
    """An (S, T) array of probabilities, rows summing to one (validated by the caller)."""

    layout: ClassVar[Layout] = "dense"

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = np.ascontiguousarray(probs, dtype=np.float64)
        self.num_symbols, self.num_targets = self.probs.shape

    @property
    def nbytes(self) -> int:
        return int(self.probs.nbytes)

    def prob(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        return self.probs[np.asarray(symbols), np.asarray(targets)]

    def predictive(self, context: np.ndarray, attention: np.ndarray) -> np.ndarray:
        out = np.zeros((context.shape[0], self.num_targets))
        for i in range(context.shape[1]):
            out += attention[:, i : i + 1] * self.probs[context[:, i]]
        return out

    def rows(self, symbols: np.ndarray) -> np.ndarray:
        return self.probs[np.asarray(symbols, dtype=np.int64)]

    @functools.cached_property
    def column_max(self) -> np.ndarray:
        """(T,) each target's largest probability over the symbols: what bounds the rows a mixture leaves unread."""
        return np.ascontiguousarray(self.probs.max(axis=0))

    @functools.cached_property
    def _offset_cdf(self) -> np.ndarray:
        # Symbol s owns the interval [s, s + 1) of one flattened CDF: one searchsorted draws every row.
        cdf = np.cumsum(self.probs, axis=1)
        cdf /= cdf[:, -1:]
        return (cdf + np.arange(self.num_symbols)[:, None]).reshape(-1)

    def sample(self, symbols: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        sym = np.asarray(symbols, dtype=np.int64)
        flat = np.searchsorted(self._offset_cdf, sym + rng.random(sym.shape[0]), side="right")
        return np.minimum(flat - sym * self.num_targets, self.num_targets - 1)

    def to_dense(self) -> np.ndarray:
        return self.probs

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"emission": self.probs}

    def restricted(self, support: PairSupport) -> Emission:
        return SparseEmission.from_dense(self.probs, support)

    def __getstate__(self) -> dict[str, Any]:
        return {"probs": self.probs, "num_symbols": self.num_symbols, "num_targets": self.num_targets}


class SparseEmission(Emission):
    """Probabilities on a support of pairs, and the factored backoff ``backoff[s] * base[t]`` off it.

    Args:
        support: the pairs stored.
        values: (P,) float64, ``B`` at each pair of the support.
        backoff: (S,) float64 >= 0, the per-symbol scale of the pairs outside the support.
        base: (T,) float64 >= 0, the per-target factor of the pairs outside the support.

    Rows sum to one when ``values`` of a symbol's pairs plus ``backoff[s]`` times the base mass of its
    other targets do: the M-step's normalization guarantees it.
    """

    layout: ClassVar[Layout] = "sparse"

    def __init__(self, support: PairSupport, values: np.ndarray, backoff: np.ndarray, base: np.ndarray) -> None:
        self.support = support
        self.values = np.ascontiguousarray(values, dtype=np.float64)
        self.backoff = np.ascontiguousarray(backoff, dtype=np.float64)
        self.base = np.ascontiguousarray(base, dtype=np.float64)
        self.num_symbols, self.num_targets = support.num_symbols, support.num_targets
        if self.values.shape != (support.num_pairs,):
            raise ValueError(f"sparse emission: values have shape {self.values.shape}: expected ({support.num_pairs},)")
        if self.backoff.shape != (self.num_symbols,) or self.base.shape != (self.num_targets,):
            raise ValueError(
                f"sparse emission: backoff {self.backoff.shape} and base {self.base.shape}: "
                f"expected ({self.num_symbols},) and ({self.num_targets},)"
            )

    @classmethod
    def from_dense(cls, probs: np.ndarray, support: PairSupport) -> SparseEmission:
        """The dense probabilities on ``support``, with an exact backoff only where a row is constant off it.

        Used to move a dense head onto a fit's support (tests, warm starts from a dense checkpoint): the
        stored pairs keep their values and every other pair of row ``s`` gets the row's remaining mass
        spread by the uniform base.
        """
        probs = np.asarray(probs, dtype=np.float64)
        values = probs[support.symbols, support.targets]
        on_support = np.bincount(support.symbols, weights=values, minlength=support.num_symbols)
        off_count = support.num_targets - np.bincount(support.symbols, minlength=support.num_symbols)
        base = np.full(support.num_targets, 1.0 / support.num_targets)
        with np.errstate(invalid="ignore", divide="ignore"):
            backoff = np.where(
                off_count > 0, np.maximum(1.0 - on_support, 0.0) / (off_count / support.num_targets), 0.0
            )
        return cls(support, values, backoff, base)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.backoff.nbytes + self.base.nbytes + self.support.nbytes)

    def prob(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        sym = np.asarray(symbols, dtype=np.int64)
        tgt = np.asarray(targets, dtype=np.int64)
        at = self.support.locate(sym, tgt)
        return np.where(at >= 0, self.values[np.maximum(at, 0)], self.backoff[sym] * self.base[tgt])

    @functools.cached_property
    def symbol_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr (S + 1,), targets (P,), excess (P,))``: each symbol's stored targets and
        ``values - backoff[s] * base[t]``, what they add to the row's backoff part."""
        indptr, targets, pair = self.support.symbol_major
        sym = self.support.symbols[pair]
        return indptr, targets, self.values[pair] - self.backoff[sym] * self.base[targets]

    @functools.cached_property
    def ranked_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr (S + 1,), targets (P,), probabilities (P,))``: each symbol's stored targets by decreasing
        probability (lowest id first among equals), for an exact arg-max that stops early."""
        indptr, targets, pair = self.support.symbol_major
        probs = self.values[pair]
        order = np.lexsort((targets, -probs, self.support.symbols[pair]))
        return indptr, targets[order], probs[order]

    @functools.cached_property
    def base_order(self) -> np.ndarray:
        """(T,) int64 the targets by decreasing base, lowest id first among equals (the arg-max's tie rule)."""
        return np.argsort(-self.base, kind="stable").astype(np.int64)

    def predictive(self, context: np.ndarray, attention: np.ndarray) -> np.ndarray:
        # The backoff part is rank one per row, then each position adds its symbol's stored pairs.
        out = np.multiply.outer((attention * self.backoff[context]).sum(axis=1), self.base)
        indptr, targets, excess = self.symbol_rows
        add_stored_rows(
            np.ascontiguousarray(context, dtype=np.int64), np.ascontiguousarray(attention, dtype=np.float64),
            indptr, targets, excess, out,
        )  # fmt: skip
        return out

    def sample(self, symbols: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        # Stored pairs with their probabilities; the rest of a row's mass draws from the base, rejecting
        # the row's stored targets (they already had their own probability).
        sym = np.asarray(symbols, dtype=np.int64)
        indptr, targets, _ = self.symbol_rows
        _, _, pair = self.support.symbol_major
        out = np.empty(sym.shape[0], dtype=np.int64)
        base_cdf = np.cumsum(self.base)
        base_cdf /= base_cdf[-1]
        u: np.ndarray = rng.random(int(sym.shape[0]))
        for m in range(sym.shape[0]):
            s = sym[m]
            lo, hi = indptr[s], indptr[s + 1]
            probs = self.values[pair[lo:hi]]
            cdf = np.cumsum(probs)
            k = int(np.searchsorted(cdf, float(u[m]), side="right"))
            if k < hi - lo:
                out[m] = targets[lo + k]
                continue
            stored = targets[lo:hi]
            while True:
                t = min(int(np.searchsorted(base_cdf, rng.random(), side="right")), self.num_targets - 1)
                if stored.size == 0 or stored[min(int(np.searchsorted(stored, t)), stored.size - 1)] != t:
                    out[m] = t
                    break
        return out

    def to_dense(self) -> np.ndarray:
        out = np.multiply.outer(self.backoff, self.base)
        out[self.support.symbols, self.support.targets] = self.values
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "emission_values": self.values,
            "emission_backoff_symbol": self.backoff,
            "emission_backoff_target": self.base,
            **self.support.to_arrays(),
        }

    def restricted(self, support: PairSupport) -> Emission:
        if support.same_as(self.support):
            return self
        values = self.prob(support.symbols, support.targets)
        return SparseEmission(support, values, self.backoff, self.base)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("symbol_rows", None)
        state.pop("ranked_rows", None)
        state.pop("base_order", None)
        return state


def emission_from_arrays(arrays: Mapping[str, Any], num_symbols: int | None = None) -> Emission:
    """The emission of :meth:`Emission.to_arrays` (either layout); ``num_symbols`` is needed for a sparse one."""
    if "emission" in arrays:
        return DenseEmission(np.asarray(arrays["emission"]))
    if "emission_values" in arrays:
        backoff = np.asarray(arrays["emission_backoff_symbol"])
        support = PairSupport.from_arrays(arrays, backoff.shape[0] if num_symbols is None else num_symbols)
        return SparseEmission(
            support, np.asarray(arrays["emission_values"]), backoff, np.asarray(arrays["emission_backoff_target"])
        )
    raise ValueError("no emission arrays: expected 'emission' (dense) or 'emission_values' and its support (sparse)")


# -------------------------------------------------------------------------------------- write side


def map_values(
    count: np.ndarray,
    row_total: np.ndarray,
    strength: np.ndarray,
    base: np.ndarray,
    symbols: np.ndarray,
    targets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, backoff)`` of the MAP rows ``(c + a_s u_t) / (c_s + a_s)`` at pairs; an empty row is the base.

    The (P,) values in one compiled pass over the pairs (:func:`~dist_respattn.model.kernels.emission_rows.
    map_pair_values`): no temporary the size of the support, on the driver's or an owner's M-step every
    iteration."""
    den = row_total + strength
    empty = den <= 0.0
    backoff = np.where(empty, 1.0, strength / np.where(empty, 1.0, den))
    values = map_pair_values(
        np.asarray(count, dtype=np.float64),
        np.asarray(row_total, dtype=np.float64),
        np.asarray(strength, dtype=np.float64),
        np.asarray(base, dtype=np.float64),
        np.asarray(symbols),
        np.asarray(targets),
    )
    return values, backoff


class EmissionCounts(abc.ABC):
    """The write side: responsibility-weighted counts per (symbol, target), additive over rows."""

    layout: ClassVar[Layout]
    num_symbols: int
    num_targets: int

    @property
    @abc.abstractmethod
    def nbytes(self) -> int: ...

    @abc.abstractmethod
    def copy(self) -> EmissionCounts: ...

    @abc.abstractmethod
    def add(self, other: EmissionCounts) -> None:
        """Add ``other`` into these counts in place (the same layout and support)."""

    @abc.abstractmethod
    def row_totals(self) -> np.ndarray:
        """(S,) ``c[s] = sum_t c[s, t]``."""

    @abc.abstractmethod
    def lookup(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``c[s, t]`` of pairs: (m,) float64 (0 for a pair outside a sparse support)."""

    @abc.abstractmethod
    def map_emission(self, strength: np.ndarray, base: np.ndarray, row_totals: np.ndarray | None = None) -> Emission:
        """The MAP emission ``(c[s, t] + a_s u[t]) / (c[s] + a_s)`` for strengths (S,) and base (T,);
        a row with neither counts nor strength is the base itself. ``row_totals``: these counts' own
        (:meth:`row_totals`), when the caller already has them (``None``: computed here)."""

    def additive_emission(self, smoothing: float) -> Emission:
        """The reference library's ``(c + a) / (c[s] + T a)``: the uniform base with strength ``T a``.

        A row with no mass and ``a = 0`` is uniform.
        """
        t = self.num_targets
        return self.map_emission(np.full(self.num_symbols, t * smoothing), np.full(t, 1.0 / t))

    @abc.abstractmethod
    def to_dense(self) -> np.ndarray:
        """(S, T) counts (materialized for a sparse layout)."""

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # ``np.asarray(value.emission_count)`` gives the (S, T) counts, as the reference library's value does.
        dense = self.to_dense()
        return dense if dtype is None else dense.astype(dtype)

    @abc.abstractmethod
    def values_array(self) -> np.ndarray:
        """The stored counts as one float64 array ((T, S) dense, (P,) sparse), for checks and sums."""


class DenseEmissionCounts(EmissionCounts):
    """Counts as a (T, S) target-major array (the layout the kernel scatters into)."""

    layout: ClassVar[Layout] = "dense"

    def __init__(self, count_ts: np.ndarray) -> None:
        self.count_ts = count_ts
        self.num_targets, self.num_symbols = count_ts.shape

    @classmethod
    def zeros(cls, num_symbols: int, num_targets: int) -> DenseEmissionCounts:
        return cls(np.zeros((num_targets, num_symbols)))

    @classmethod
    def from_symbol_major(cls, counts: np.ndarray) -> DenseEmissionCounts:
        """From (S, T) counts (the reference library's ``emission_count``); always a copy."""
        return cls(np.array(np.asarray(counts, dtype=np.float64).T, order="C"))

    @property
    def nbytes(self) -> int:
        return int(self.count_ts.nbytes)

    def copy(self) -> DenseEmissionCounts:
        return DenseEmissionCounts(self.count_ts.copy())

    def add(self, other: EmissionCounts) -> None:
        if not isinstance(other, DenseEmissionCounts) or other.count_ts.shape != self.count_ts.shape:
            raise ValueError(f"cannot add {describe_counts(other)} to {describe_counts(self)}")
        self.count_ts += other.count_ts

    def row_totals(self) -> np.ndarray:
        return column_totals(np.asarray(self.count_ts, dtype=np.float64))

    def lookup(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        return self.count_ts[np.asarray(targets), np.asarray(symbols)]

    def map_emission(self, strength: np.ndarray, base: np.ndarray, row_totals: np.ndarray | None = None) -> Emission:
        row_total = (self.row_totals() if row_totals is None else row_totals) + strength
        empty = row_total <= 0.0
        probs = np.multiply.outer(strength, base)  # the only (S, T) array made: the rest is in place
        probs += self.count_ts.T
        probs /= np.where(empty, 1.0, row_total)[:, None]
        if empty.any():
            probs[empty] = base
        return DenseEmission(probs)

    def to_dense(self) -> np.ndarray:
        return self.count_ts.T

    def values_array(self) -> np.ndarray:
        return self.count_ts


class SparseEmissionCounts(EmissionCounts):
    """Counts (P,) over a support of pairs.

    ``support`` is ``None`` for the counts an E-step returns: they lie on the fit's support, which the
    model already carries to every worker, so values crossing the network do not carry it again (the
    M-step takes it back from the model, :meth:`on`). The start pass's counts carry their own support,
    the pairs their rows hold, and adding two of those makes the union.
    """

    layout: ClassVar[Layout] = "sparse"

    def __init__(self, counts: np.ndarray, support: PairSupport | None, *, num_symbols: int, num_targets: int) -> None:
        self.counts = counts
        self.support = support
        self.num_symbols, self.num_targets = int(num_symbols), int(num_targets)
        if support is not None and counts.shape != (support.num_pairs,):
            raise ValueError(f"sparse counts: {counts.shape[0]} counts for a support of {support.num_pairs} pairs")

    @classmethod
    def zeros(cls, support: PairSupport) -> SparseEmissionCounts:
        return cls(
            np.zeros(support.num_pairs), support, num_symbols=support.num_symbols, num_targets=support.num_targets
        )

    @classmethod
    def from_cells(
        cls, keys: np.ndarray, weights: np.ndarray, num_symbols: int, num_targets: int
    ) -> SparseEmissionCounts:
        """Counts of target-major cells ``t * S + s`` (any order, repeats added in input order from 0).

        A compiled radix sort (:func:`~dist_respattn.model.kernels.pair_keys.tally_keys`): linear in the cells.
        """
        flat = np.asarray(keys, dtype=np.int64).reshape(-1)
        if weights is None:
            weights = np.ones(flat.shape[0])
        cells, counts = tally_keys(flat, np.asarray(weights, dtype=np.float64).reshape(-1))
        return cls.from_tally(cells, counts, num_symbols, num_targets)

    @classmethod
    def from_tally(
        cls, cells: np.ndarray, counts: np.ndarray, num_symbols: int, num_targets: int
    ) -> SparseEmissionCounts:
        """Counts (P,) of strictly increasing target-major cells (P,) int64 (a tally of :mod:`.pair_keys`)."""
        return cls(
            counts,
            PairSupport.from_keys(cells, num_symbols, num_targets),
            num_symbols=num_symbols,
            num_targets=num_targets,
        )

    @classmethod
    def union(cls, parts: list[SparseEmissionCounts], num_symbols: int, num_targets: int) -> SparseEmissionCounts:
        """The sum of counts that carry their supports, over the union of their pairs.

        Each pair's sum adds the parts' counts in list order (from 0), so it does not depend on how they were
        grouped: the parts are merged in one pass over their pairs, target by target
        (:func:`~dist_respattn.model.kernels.pair_keys.merge_supports`).
        """
        if not parts:
            return cls.empty(num_symbols, num_targets)
        if len(parts) == 1:
            return parts[0]
        indptr, symbols, counts = merge_supports(
            [(part._require_support().indptr, part._require_support().symbols, part.counts) for part in parts]
        )
        return cls(
            counts, PairSupport(num_symbols, num_targets, indptr, symbols), num_symbols=num_symbols,
            num_targets=num_targets,
        )  # fmt: skip

    @classmethod
    def empty(cls, num_symbols: int, num_targets: int) -> SparseEmissionCounts:
        return cls.from_cells(np.zeros(0, dtype=np.int64), np.zeros(0), num_symbols, num_targets)

    def on(self, support: PairSupport) -> SparseEmissionCounts:
        """These counts with the fit's support attached (checked against it)."""
        if self.support is not None:
            if not self.support.same_as(support):
                raise ValueError("sparse counts lie on another support than the fit's")
            return self
        return SparseEmissionCounts(self.counts, support, num_symbols=self.num_symbols, num_targets=self.num_targets)

    def detached(self) -> SparseEmissionCounts:
        """The counts without their support (what an E-step value carries)."""
        return SparseEmissionCounts(self.counts, None, num_symbols=self.num_symbols, num_targets=self.num_targets)

    @property
    def nbytes(self) -> int:
        return int(self.counts.nbytes + (0 if self.support is None else self.support.nbytes))

    def copy(self) -> SparseEmissionCounts:
        return SparseEmissionCounts(
            self.counts.copy(), self.support, num_symbols=self.num_symbols, num_targets=self.num_targets
        )

    def _require_support(self) -> PairSupport:
        if self.support is None:
            raise ValueError("these sparse counts have no support attached: attach the fit's with .on(support)")
        return self.support

    def add(self, other: EmissionCounts) -> None:
        if not isinstance(other, SparseEmissionCounts):
            raise ValueError(f"cannot add {describe_counts(other)} to {describe_counts(self)}")
        mine, theirs = self.support, other.support
        if mine is not None and theirs is not None and not mine.same_as(theirs):
            # Counts of two start partitions: the union of their pairs, each sum in a fixed order (mine, theirs).
            merged = SparseEmissionCounts.union([self, other], self.num_symbols, self.num_targets)
            self.counts, self.support = merged.counts, merged.support
            return
        if other.counts.shape != self.counts.shape:
            raise ValueError(f"cannot add {describe_counts(other)} to {describe_counts(self)}")
        self.counts += other.counts
        if mine is None:
            self.support = theirs

    def row_totals(self) -> np.ndarray:
        counts = np.ascontiguousarray(self.counts, dtype=np.float64)
        return pair_row_totals(self._require_support().symbols, counts, self.num_symbols)

    def lookup(self, symbols: np.ndarray, targets: np.ndarray) -> np.ndarray:
        at = self._require_support().locate(symbols, targets)
        return np.where(at >= 0, self.counts[np.maximum(at, 0)] if self.counts.size else 0.0, 0.0)

    def map_emission(self, strength: np.ndarray, base: np.ndarray, row_totals: np.ndarray | None = None) -> Emission:
        support = self._require_support()
        totals = self.row_totals() if row_totals is None else row_totals
        values, backoff = map_values(self.counts, totals, strength, base, support.symbols, support.targets)
        return SparseEmission(support, values, backoff, base)

    def to_dense(self) -> np.ndarray:
        support = self._require_support()
        out = np.zeros((self.num_symbols, self.num_targets))
        out[support.symbols, support.targets] = self.counts
        return out

    def values_array(self) -> np.ndarray:
        return self.counts

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()


def describe_counts(counts: Any) -> str:
    if isinstance(counts, SparseEmissionCounts):
        return f"sparse counts over {counts.counts.shape[0]} pairs"
    if isinstance(counts, DenseEmissionCounts):
        return f"dense counts of (S, T) = {(counts.num_symbols, counts.num_targets)}"
    return type(counts).__name__
