"""Exact, distributed EM for responsibility-attention heads over chunked zarr stores.

The public names are loaded on first use: importing a submodule that needs none of them (the scheduler's
fit monitor, :mod:`dist_respattn.events`) then loads neither numba nor the model.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from dist_respattn.numba_cache import use_user_cache_dir

# Before any module of the package imports numba: its cache goes to the user's cache directory, never
# into the installed package (where a reinstall leaves it behind, shadowing the new install).
use_user_cache_dir()

if TYPE_CHECKING:
    from dist_respattn.model import (
        EMIteration,
        EMResult,
        ImpossibleEvidenceError,
        PositionBuckets,
        Predictor,
        ResponsibilityAttentionAccumulator,
        ResponsibilityAttentionAccumulatorFactory,
        ResponsibilityAttentionDataEncoder,
        ResponsibilityAttentionDistribution,
        ResponsibilityAttentionEstimator,
        ResponsibilityAttentionSampler,
        SufficientStatistics,
        estimate_parameters,
        fit_em,
        random_distribution,
        recovery_report,
        run_em,
        sequence_to_triples,
        sequence_windows,
    )

try:
    __version__ = version("dist_respattn")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "EMIteration",
    "EMResult",
    "ImpossibleEvidenceError",
    "PositionBuckets",
    "Predictor",
    "ResponsibilityAttentionAccumulator",
    "ResponsibilityAttentionAccumulatorFactory",
    "ResponsibilityAttentionDataEncoder",
    "ResponsibilityAttentionDistribution",
    "ResponsibilityAttentionEstimator",
    "ResponsibilityAttentionSampler",
    "SufficientStatistics",
    "__version__",
    "estimate_parameters",
    "fit_em",
    "random_distribution",
    "recovery_report",
    "run_em",
    "sequence_to_triples",
    "sequence_windows",
]

#: Every public name but the version comes from the model package.
_MODEL_NAMES = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in _MODEL_NAMES:
        value = getattr(importlib.import_module("dist_respattn.model"), name)
        globals()[name] = value  # once loaded, found without this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _MODEL_NAMES)
