"""The copy head (cache and induction over the single head's attention), registered as ``"copy"``.

Written in the model layer alone, against :mod:`dist_respattn.model.heads.base` (see ``docs/guide/head-kinds.md``);
``fit --head copy`` picks it.
"""

from __future__ import annotations

from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, register_kind
from dist_respattn.model.heads.copy.head import CopyHead
from dist_respattn.model.heads.copy.kind import CopySpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec

__all__ = ["KIND", "CopyHead", "CopySpec", "spec_from_options"]


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> CopySpec | None:
    """The copy spec a ``fit --head copy`` asks for (``None`` otherwise): the single-hop settings the other fit
    options describe (``base``), their open choices fixed. A resumed copy fit keeps the start it recorded."""
    if options.get("head") != "copy":
        return None
    if not isinstance(base, SingleHopSpec):
        raise ValueError(f"--head copy extends the single-hop head: it does not combine with a {base.kind} fit")
    init = 0.1 if saved is None else float(saved.get("init_copy", 0.1))
    return CopySpec(base, init)


KIND = register_kind(
    HeadKind(
        "copy",
        CopyHead,
        CopySpec,
        summary="the single head whose attended token may also be copied, or the token that followed it (induction)",
        spec_from_options=spec_from_options,
        head_name="copy",
    )
)
