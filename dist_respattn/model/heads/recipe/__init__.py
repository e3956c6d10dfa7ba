"""The recipe (``fit --head recipe``): a long-window copy head and a short-window conjunction head under a stack's
gate, fitted in stages, each part's choices on held-out rows; registered as ``"recipe"``."""

from __future__ import annotations

import dataclasses
from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, register_kind
from dist_respattn.model.heads.conj.head import ORDERS
from dist_respattn.model.heads.recipe.kind import RECIPE_BUCKETS, RECIPE_SHORT_CONTEXT, RecipeSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.stack import StackHead

__all__ = ["KIND", "RecipeSpec", "spec_from_options"]


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> RecipeSpec | None:
    """The recipe a ``fit --head recipe`` asks for (``None`` otherwise): the single-hop settings the other fit
    options describe, ``--position-buckets`` for the long heads (default: the window's, at most
    :data:`~dist_respattn.model.heads.recipe.kind.RECIPE_BUCKETS`), ``--conj-depth`` and ``--conj-order`` for its
    conjunction part (default: chosen from the store's rows, and 3); the stack's gate interpolates the parts'
    predictive distributions (``--stack-gate target``, the better on every corpus measured)."""
    if options.get("head") != "recipe":
        return None
    if not isinstance(base, SingleHopSpec):
        raise ValueError(f"--head recipe starts from single-hop heads: it does not combine with a {base.kind} fit")
    depth, order = options.get("conj_depth"), options.get("conj_order")
    if depth is not None and not 1 <= int(depth) <= RECIPE_SHORT_CONTEXT:
        raise ValueError(f"--conj-depth {depth}: the recipe's conjunction part reads a window of "
                         f"{RECIPE_SHORT_CONTEXT}: expected 1 to {RECIPE_SHORT_CONTEXT} recent positions")  # fmt: skip
    if order is not None and int(order) not in ORDERS:
        raise ValueError(f"--conj-order {order}: expected one of {', '.join(map(str, ORDERS))}")
    spec = RecipeSpec(base, base.position_buckets, RECIPE_SHORT_CONTEXT, "target")
    if saved:
        # A resumed recipe keeps its conjunction head's order and depth and its repeat gate (none, for one recorded
        # before it had): its stages were fitted with them.
        recorded = RecipeSpec.from_json(saved)
        for flag, value, fitted in (("--conj-depth", depth, recorded.conj_depth),
                                    ("--conj-order", order, recorded.conj_order)):  # fmt: skip
            if value is not None and int(value) != fitted:
                raise ValueError(f"{flag} {value}: this recipe was fitted with {flag} {fitted}; resume without "
                                 "the option, or fit into a new --model-dir")  # fmt: skip
        return dataclasses.replace(
            spec, conj_order=recorded.conj_order, repeat=recorded.repeat, conj_depth=recorded.conj_depth
        )
    if order is not None:
        spec = dataclasses.replace(spec, conj_order=int(order))
    return spec if depth is None else dataclasses.replace(spec, conj_depth=int(depth))


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
