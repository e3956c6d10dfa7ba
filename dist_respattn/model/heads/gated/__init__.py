"""The attribute-gated head: its parameters, E- and M-steps (``head``), the words it mixes and generates (``use``),
its kind of the head protocol (``kind``: spec, trainer, candidates) and its ``evaluate`` report (``report``),
registered here as ``"gated"``."""

from __future__ import annotations

from dist_respattn.model.heads.base import HeadKind, register_kind
from dist_respattn.model.heads.gated.head import GatedHead
from dist_respattn.model.heads.gated.kind import OPTIONS, SUMMARY, GatedSpec, spec_from_options

__all__ = ["KIND"]

KIND = register_kind(
    HeadKind("gated", GatedHead, GatedSpec, summary=SUMMARY, options=OPTIONS, spec_from_options=spec_from_options)
)
