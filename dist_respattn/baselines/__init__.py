"""Baselines apart from the head: the n-gram models printed beside it (unigram, add-k, Jelinek-Mercer, Kneser-Ney
bigrams, and interpolated modified Kneser-Ney n-grams up to order 5)."""

from __future__ import annotations

from dist_respattn.baselines.kneser_ney import KneserNey, NGramCounts, fit_kneser_ney
from dist_respattn.baselines.ngram import (
    MODEL_LABELS,
    MODEL_NAMES,
    BaselineParameters,
    Baselines,
    BaselineScore,
    fit_baselines,
)

__all__ = [
    "MODEL_LABELS",
    "MODEL_NAMES",
    "BaselineParameters",
    "BaselineScore",
    "Baselines",
    "KneserNey",
    "NGramCounts",
    "fit_baselines",
    "fit_kneser_ney",
]
