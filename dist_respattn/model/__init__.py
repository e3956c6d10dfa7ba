"""The responsibility-attention head, the math only (no dask, no zarr): head kinds in ``heads/``, compiled
kernels in ``kernels/``, the emission's layouts and prior in ``emission/``, in-process EM in ``fitting/``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Where each name of the package lives. They are imported on first use (PEP 562), so that importing one light
#: module of the package, such as :mod:`dist_respattn.model.rows` for the store package, does not import every
#: head, the in-process EM and numba with it (a store command line such as ``info`` starts ~0.1 CPU s sooner).
_EXPORTS = {
    "ImpossibleEvidenceError": "dist_respattn.model.arguments",
    "PositionBuckets": "dist_respattn.model.buckets",
    "DenseEmission": "dist_respattn.model.emission.layouts",
    "DenseEmissionCounts": "dist_respattn.model.emission.layouts",
    "Emission": "dist_respattn.model.emission.layouts",
    "EmissionCounts": "dist_respattn.model.emission.layouts",
    "PairSupport": "dist_respattn.model.emission.layouts",
    "SparseEmission": "dist_respattn.model.emission.layouts",
    "SparseEmissionCounts": "dist_respattn.model.emission.layouts",
    "ResponsibilityAttentionDataEncoder": "dist_respattn.model.encoder",
    "sequence_to_triples": "dist_respattn.model.encoder",
    "sequence_windows": "dist_respattn.model.encoder",
    "EMIteration": "dist_respattn.model.fitting.em",
    "EMResult": "dist_respattn.model.fitting.em",
    "START_KINDS": "dist_respattn.model.fitting.em",
    "fit_em": "dist_respattn.model.fitting.em",
    "run_em": "dist_respattn.model.fitting.em",
    "ResponsibilityAttentionAccumulator": "dist_respattn.model.heads.single_hop.accumulator",
    "ResponsibilityAttentionAccumulatorFactory": "dist_respattn.model.heads.single_hop.accumulator",
    "SufficientStatistics": "dist_respattn.model.heads.single_hop.accumulator",
    "recovery_report": "dist_respattn.model.heads.single_hop.diagnostics",
    "ResponsibilityAttentionDistribution": "dist_respattn.model.heads.single_hop.distribution",
    "ResponsibilityAttentionEstimator": "dist_respattn.model.heads.single_hop.estimator",
    "estimate_parameters": "dist_respattn.model.heads.single_hop.estimator",
    "SingleHopSpec": "dist_respattn.model.heads.single_hop.kind",
    "ResponsibilityAttentionSampler": "dist_respattn.model.heads.single_hop.sampler",
    "random_distribution": "dist_respattn.model.heads.single_hop.sampler",
    "WindowRows": "dist_respattn.model.rows",
    "Predictor": "dist_respattn.model.streaming",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, found without this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
