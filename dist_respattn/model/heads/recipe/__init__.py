"""The recipe (``fit --head recipe``): a long-window copy head and a short-window conjunction head under a stack's
gate, fitted in stages, each part's choices on held-out rows; registered as ``"recipe"``."""

from __future__ import annotations

import dataclasses
from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, register_kind
from dist_respattn.model.heads.recipe.kind import RECIPE_BUCKETS, RECIPE_SHORT_CONTEXT, RecipeSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.stack import StackHead

__all__ = ["KIND", "RecipeSpec", "spec_from_options"]


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> RecipeSpec | None:
    """The recipe a ``fit --head recipe`` asks for (``None`` otherwise): the single-hop settings the other fit
    options describe, ``--position-buckets`` for the long heads (default: the window's, at most
    :data:`~dist_respattn.model.heads.recipe.kind.RECIPE_BUCKETS`); the stack's gate interpolates the parts'
    predictive distributions (``--stack-gate target``, the better on every corpus measured)."""
    if options.get("head") != "recipe":
        return None
    if not isinstance(base, SingleHopSpec):
        raise ValueError(f"--head recipe starts from single-hop heads: it does not combine with a {base.kind} fit")
    # A resumed recipe keeps its conjunction head's order and depth and its repeat gate (none, for one recorded before
    # it had).
    spec = RecipeSpec(base, base.position_buckets, RECIPE_SHORT_CONTEXT, "target")
    if saved:
        recorded = RecipeSpec.from_json(saved)
        spec = dataclasses.replace(
            spec, conj_order=recorded.conj_order, repeat=recorded.repeat, conj_depth=recorded.conj_depth
        )
    return spec


KIND = register_kind(
    HeadKind(
        "recipe",
        StackHead,
        RecipeSpec,
        summary=f"a copy head and a single head over the whole window ({RECIPE_BUCKETS} recency buckets at most) and "
        f"a conjunction head over the last {RECIPE_SHORT_CONTEXT} tokens under a gate learned on held-out rows, fitted "
        "in stages",
        spec_from_options=spec_from_options,
        head_name="recipe",
        token_stream_default=True,  # the best on every token corpus measured (docs/guide/recipe.md)
    )
)
