"""Baselines apart from the head: the n-gram models printed beside it (unigram, add-k, Jelinek-Mercer, Kneser-Ney)."""

from __future__ import annotations

from dist_respattn.baselines.ngram import (
    MODEL_LABELS,
    MODEL_NAMES,
    BaselineParameters,
    Baselines,
    BaselineScore,
    fit_baselines,
)

__all__ = ["MODEL_LABELS", "MODEL_NAMES", "BaselineParameters", "BaselineScore", "Baselines", "fit_baselines"]
