"""The emission's Dirichlet prior and its MAP rows: every emission row shrinks toward one backoff distribution.

Row ``s`` of the emission has the prior ``Dirichlet(a_s u + 1)``, so the M-step's row is the posterior
mode, in closed form (MacKay & Peto 1995, "A hierarchical Dirichlet language model")::

    B[s, t] = (c[s, t] + a_s u[t]) / (c[s] + a_s),     a_s = emission_strength + type_strength * n_s

``c`` are the E-step's responsibility-weighted counts, ``u`` (T,) is the backoff distribution and
``n_s`` how many distinct targets directly follow symbol ``s`` in the data (at least 1). A pair never
seen scores ``a_s u[t] / (c[s] + a_s)``. With ``type_strength = 1`` and ``emission_strength -> 0`` the
strength is Witten-Bell's (a row with many distinct successors backs off more); with the
continuation base, ``u[t] ∝ N1+(• t)``, the backoff is Kneser-Ney's lower order (Kneser & Ney 1995;
Teh 2006 derives both from a hierarchical Pitman-Yor prior). Both counts come from the training
rows' (symbol, target) pairs (:class:`~dist_respattn.model.emission.pairs.PairCounts`), found once per fit.

The additive smoothing of the reference library, ``(c + a) / (c[s] + T a)``, is the special case of a
uniform base with strength ``T a``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_respattn.model.emission.pairs import PairCounts

__all__ = ["BACKOFF_KINDS", "BASE_PSEUDO_COUNT", "EmissionPrior"]

#: How the backoff distribution ``u`` is made from the training pairs.
BACKOFF_KINDS = ("continuation", "unigram", "uniform")

#: Added to every target's count in the backoff, so a target the training never saw still has mass.
BASE_PSEUDO_COUNT = 0.5


@dataclass(frozen=True)
class EmissionPrior:
    """The backoff distribution and the per-symbol type counts of the emission's Dirichlet prior.

    Attributes:
        kind: ``"continuation"`` (``u[t] ∝ N1+(• t) + 0.5``), ``"unigram"`` (``u[t] ∝ c(t) + 0.5``) or
            ``"uniform"`` (``u = 1/T``, no type counts: the reference library's additive smoothing).
        base: (T,) float64 ``u``, positive, summing to 1.
        types: (S,) float64 ``n_s``, the distinct targets that directly follow symbol ``s``, at least 1
            (zeros for ``uniform``).
    """

    kind: str
    base: np.ndarray
    types: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in BACKOFF_KINDS:
            raise ValueError(f"emission prior kind = {self.kind!r}: expected one of {', '.join(BACKOFF_KINDS)}")
        base = np.asarray(self.base, dtype=np.float64)
        types = np.asarray(self.types, dtype=np.float64)
        if base.ndim != 1 or types.ndim != 1:
            raise ValueError(f"emission prior: base {base.shape} and types {types.shape}: expected (T,) and (S,)")
        if not (np.all(np.isfinite(base)) and np.all(base > 0.0)) or abs(float(base.sum()) - 1.0) > 1e-9:
            raise ValueError("emission prior: the base must be positive and sum to 1")
        if not (np.all(np.isfinite(types)) and np.all(types >= 0.0)):
            raise ValueError("emission prior: the type counts must be finite and non-negative")
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "types", types)

    @property
    def num_symbols(self) -> int:
        return int(self.types.shape[0])

    @property
    def num_targets(self) -> int:
        return int(self.base.shape[0])

    @classmethod
    def uniform(cls, num_symbols: int, num_targets: int) -> EmissionPrior:
        """The flat base with no type counts."""
        return cls("uniform", np.full(num_targets, 1.0 / num_targets), np.zeros(num_symbols))

    @classmethod
    def from_pairs(cls, pairs: PairCounts, kind: str = "continuation") -> EmissionPrior:
        """The prior of a kind from the training rows' (symbol, target) pairs."""
        if kind == "uniform":
            return cls.uniform(pairs.num_symbols, pairs.num_targets)
        if kind == "continuation":
            mass = pairs.continuation_types()
        elif kind == "unigram":
            mass = pairs.target_totals()
        else:
            raise ValueError(f"emission prior kind = {kind!r}: expected one of {', '.join(BACKOFF_KINDS)}")
        mass = mass + BASE_PSEUDO_COUNT
        # At least one type: a symbol with counts that never directly precedes a target (seen only deeper in
        # the windows, e.g. among a document's first tokens) would otherwise get a_s = 0 with no
        # emission_strength, and an unsmoothed row with zeros in it.
        return cls(kind, mass / mass.sum(), np.maximum(pairs.successor_types(), 1.0))

    def strengths(self, emission_strength: float, type_strength: float) -> np.ndarray:
        """(S,) ``a_s = emission_strength + type_strength * n_s``."""
        return emission_strength + type_strength * self.types

    def to_arrays(self) -> dict[str, np.ndarray]:
        """``emission_base`` (T,) and ``emission_types`` (S,), for a checkpoint's npz."""
        return {"emission_base": self.base, "emission_types": self.types}

    @classmethod
    def from_arrays(cls, arrays: Any, kind: str) -> EmissionPrior:
        return cls(kind, np.asarray(arrays["emission_base"]), np.asarray(arrays["emission_types"]))
