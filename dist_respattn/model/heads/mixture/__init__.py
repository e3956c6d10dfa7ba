"""A mixture of single-hop heads (a gate over K component heads, fitted by exact EM), registered as ``"mixture"``.

Written in the model layer alone, against :mod:`dist_respattn.model.heads.base`: the engine fits, checkpoints,
evaluates, predicts and streams it as it does every kind (see ``docs/guide/head-kinds.md``).
"""

from __future__ import annotations

from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, Option, register_kind
from dist_respattn.model.heads.mixture.head import MixtureHead
from dist_respattn.model.heads.mixture.kind import MixtureSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec

__all__ = ["KIND", "MixtureHead", "MixtureSpec", "spec_from_options"]


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> MixtureSpec | None:
    """The mixture spec a ``fit`` asks for with ``--mixture-components K`` (``None`` without it): K components
    fitted with the single-hop settings the other fit options describe (``base``), seeded by its seed. A resumed
    mixture fit keeps the gate prior it recorded."""
    components = options.get("mixture_components")
    if components is None:
        return None
    if not isinstance(base, SingleHopSpec):
        raise ValueError(f"--mixture-components mixes single-hop heads: it does not combine with a {base.kind} fit")
    pseudo = 1.0
    if saved is not None and saved.get("kind") == MixtureSpec.kind:
        pseudo = float(saved.get("gate_pseudo_count", pseudo))
    return MixtureSpec(components=int(components), component=base, seed=base.seed, gate_pseudo_count=pseudo)


KIND = register_kind(
    HeadKind(
        "mixture",
        MixtureHead,
        MixtureSpec,
        summary="a mixture of K single-hop heads under a learned gate (exact EM, nested responsibilities)",
        options=(
            Option(
                ("--mixture-components",),
                {
                    "type": int,
                    "metavar": "K",
                    "default": None,
                    "help": "fit a mixture of K >= 2 single-hop heads, each with the head options given "
                    "(free position prior; hyperparameters fixed at their values, not searched)",
                },
                ("fit",),
            ),
        ),
        spec_from_options=spec_from_options,
    )
)
