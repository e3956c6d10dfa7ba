"""Exact, distributed EM for a responsibility-attention head over chunked triple stores."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from dist_respattn.model import (
    EMIteration,
    EMResult,
    ImpossibleEvidenceError,
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
