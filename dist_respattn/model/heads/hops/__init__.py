"""The chain of attention hops (exact forward–backward over the hops), registered as ``"hops"``.

Written in the model layer alone, against :mod:`dist_respattn.model.heads.base` (see ``docs/guide/head-kinds.md``);
``fit --hops H`` picks it (``--hops 1`` is the single head).
"""

from __future__ import annotations

from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, Option, register_kind
from dist_respattn.model.heads.hops.head import HopsHead
from dist_respattn.model.heads.hops.kind import HopsSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec

__all__ = ["KIND", "HopsHead", "HopsSpec", "spec_from_options"]


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> HopsSpec | None:
    """The chain a ``fit --hops H`` asks for (``None`` without it, and for H = 1: the single head itself): H hops
    over the single-hop settings the other fit options describe (``base``), their open choices made on held-out
    rows."""
    hops = options.get("hops")
    if hops is None:
        return None
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
        raise ValueError(f"--hops {hops}: expected a whole number of hops >= 1 (1 is the single head)")
    if hops == 1:
        return None
    if options.get("head") is not None:
        raise ValueError(f"--hops {hops} makes a chain of hops: it does not combine with --head {options['head']}")
    if not isinstance(base, SingleHopSpec):
        raise ValueError(f"--hops chains single-hop gates: it does not combine with a {base.kind} fit")
    if base.estimate_sigma2:
        raise ValueError("--hops chooses the gate variance or keeps it fixed: it does not combine with --learn-sigma2")
    softmax = bool((saved or {}).get("softmax", False))
    return HopsSpec(base, hops, softmax)


KIND = register_kind(
    HeadKind(
        "hops",
        HopsHead,
        HopsSpec,
        summary="a chain of H attention hops, each querying with the token the last one found (forward-backward)",
        options=(
            Option(
                ("--hops",),
                {
                    "type": int,
                    "metavar": "H",
                    "default": None,
                    "help": "fit a chain of H attention hops: hop 1 attends from the row's query, each later hop "
                    "from the embedding of the token the one before found; the target is emitted from the last "
                    "(1: the single head; the gate variance and emission strengths not given are chosen on "
                    "held-out rows)",
                },
                ("fit",),
            ),
        ),
        spec_from_options=spec_from_options,
    )
)
