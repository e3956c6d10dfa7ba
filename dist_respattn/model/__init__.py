"""The responsibility-attention head, the math only (no dask, no zarr): head kinds in ``heads/``, compiled
kernels in ``kernels/``, the emission's layouts and prior in ``emission/``, in-process EM in ``fitting/``."""

from __future__ import annotations

from dist_respattn.model.arguments import ImpossibleEvidenceError
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.layouts import (
    DenseEmission,
    DenseEmissionCounts,
    Emission,
    EmissionCounts,
    PairSupport,
    SparseEmission,
    SparseEmissionCounts,
)
from dist_respattn.model.encoder import ResponsibilityAttentionDataEncoder, sequence_to_triples, sequence_windows
from dist_respattn.model.fitting.em import START_KINDS, EMIteration, EMResult, fit_em, run_em
from dist_respattn.model.heads.single_hop.accumulator import (
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionAccumulatorFactory,
    SufficientStatistics,
)
from dist_respattn.model.heads.single_hop.diagnostics import recovery_report
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.estimator import ResponsibilityAttentionEstimator, estimate_parameters
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.single_hop.sampler import ResponsibilityAttentionSampler, random_distribution
from dist_respattn.model.rows import WindowRows
from dist_respattn.model.streaming import Predictor

__all__ = [
    "START_KINDS",
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
    "SingleHopSpec",
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
