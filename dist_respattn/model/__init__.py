"""The responsibility-attention head: distribution, sampler, accumulator, estimator, encoder and EM."""

from __future__ import annotations

from dist_respattn.model._checks import ImpossibleEvidenceError
from dist_respattn.model.accumulator import (
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionAccumulatorFactory,
    SufficientStatistics,
)
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.diagnostics import recovery_report
from dist_respattn.model.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.em import EMIteration, EMResult, fit_em, run_em
from dist_respattn.model.emission import (
    DenseEmission,
    DenseEmissionCounts,
    Emission,
    EmissionCounts,
    PairSupport,
    SparseEmission,
    SparseEmissionCounts,
)
from dist_respattn.model.encoder import ResponsibilityAttentionDataEncoder, sequence_to_triples, sequence_windows
from dist_respattn.model.estimator import ResponsibilityAttentionEstimator, estimate_parameters
from dist_respattn.model.histogram import WindowRows
from dist_respattn.model.predictor import Predictor
from dist_respattn.model.sampler import ResponsibilityAttentionSampler, random_distribution

__all__ = [
    "DenseEmission",
    "DenseEmissionCounts",
    "EMIteration",
    "EMResult",
    "Emission",
    "EmissionCounts",
    "ImpossibleEvidenceError",
    "PairSupport",
    "PositionBuckets",
    "Predictor",
    "ResponsibilityAttentionAccumulator",
    "ResponsibilityAttentionAccumulatorFactory",
    "ResponsibilityAttentionDataEncoder",
    "ResponsibilityAttentionDistribution",
    "ResponsibilityAttentionEstimator",
    "ResponsibilityAttentionSampler",
    "SparseEmission",
    "SparseEmissionCounts",
    "SufficientStatistics",
    "WindowRows",
    "estimate_parameters",
    "fit_em",
    "random_distribution",
    "recovery_report",
    "run_em",
    "sequence_to_triples",
    "sequence_windows",
]
