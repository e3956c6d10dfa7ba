"""The conjunction head (an emission keyed by the attended and the current token), registered as ``"conj"``.

Written in the model layer alone, against :mod:`dist_respattn.model.heads.base` (see ``docs/guide/head-kinds.md``
and ``docs/guide/conjunction-head.md``); ``fit --head conj`` picks it.
"""

from __future__ import annotations

from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, Option, register_kind
from dist_respattn.model.heads.conj.head import ConjHead
from dist_respattn.model.heads.conj.kind import ConjSpec
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec

__all__ = ["KIND", "ConjHead", "ConjSpec", "spec_from_options"]

_FLAGS = {"conj_depth": "--conj-depth", "conj_min_count": "--conj-min-count", "conj_strength": "--conj-strength",
          "conj_type_strength": "--conj-type-strength", "conj_backoff": "--conj-backoff",
          "conj_discount": "--conj-discount", "conj_order": "--conj-order",
          "conj_choose_single": "--conj-choose-single", "conj_counts": "--conj-counts"}  # fmt: skip
#: The options that also set the recipe's conjunction part (``fit --head recipe``).
RECIPE_OPTIONS = ("conj_depth", "conj_order")


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> ConjSpec | None:
    """The conjunction spec a ``fit --head conj`` asks for (``None`` otherwise): the single-hop settings the other
    fit options describe (``base``; their open choices fixed unless ``--conj-choose-single``) and the ``--conj-*``
    options. A resumed conjunction
    fit keeps what it recorded for the options not given again."""
    given: dict[str, Any] = {name: options[name] for name in _FLAGS if options.get(name) is not None}
    if options.get("head") != "conj":
        recipe = options.get("head") == "recipe"
        if recipe:  # the recipe reads these itself
            given = {name: value for name, value in given.items() if name not in RECIPE_OPTIONS}
        if given:
            name = next(iter(given))
            if recipe:
                hint = " (the recipe's conjunction part takes --conj-depth and --conj-order only)"
            elif name in RECIPE_OPTIONS:
                hint = ", or --head recipe for the recipe's conjunction part"
            else:
                hint = ""
            raise ValueError(f"{_FLAGS[name]} sets a conjunction head: add --head conj{hint}")
        return None
    if not isinstance(base, SingleHopSpec):
        raise ValueError(f"--head conj extends the single-hop head: it does not combine with a {base.kind} fit")
    recorded = ConjSpec.from_json(saved) if saved is not None else ConjSpec(base)
    return ConjSpec(
        base,
        int(given.get("conj_depth", recorded.depth)),
        float(given.get("conj_min_count", recorded.min_count)),
        float(given["conj_strength"]) if "conj_strength" in given else recorded.strength,
        float(given["conj_type_strength"]) if "conj_type_strength" in given else recorded.type_strength,
        str(given.get("conj_backoff", recorded.backoff)),
        float(given["conj_discount"]) if "conj_discount" in given else recorded.discount,
        int(given.get("conj_order", recorded.order)),
        recorded.triple_strength,
        recorded.triple_type_strength,
        recorded.triple_discount,
        bool(given.get("conj_choose_single", recorded.choose_single)),
        str(given.get("conj_counts", recorded.row_counts)),
    )


KIND = register_kind(
    HeadKind(
        "conj",
        ConjHead,
        ConjSpec,
        summary="the single head whose emission is keyed by the attended and the current token (skip-trigrams, "
        "a trigram at the previous position)",
        options=(
            Option(
                ("--conj-depth",),
                {
                    "type": int,
                    "metavar": "K",
                    "default": None,
                    "help": "--head conj: how many of the most recent positions read the (attended, current token) "
                    "rows (default 2: the current token's own row and the trigram at the previous position; "
                    "at most N); --head recipe: its conjunction part's (default: all 8 on a store of at most 20M "
                    "rows, else 2)",
                },
            ),
            Option(
                ("--conj-min-count",),
                {
                    "type": float,
                    "metavar": "C",
                    "default": None,
                    "help": "--head conj: store a pair's row only when the pair occurs at least C times there in the "
                    "training rows (default 1: every pair; the others read the attended token's row)",
                },
            ),
            Option(
                ("--conj-strength",),
                {
                    "type": float,
                    "metavar": "BETA",
                    "default": None,
                    "help": "--head conj: the pair rows' prior strength toward the attended token's row (default: "
                    "chosen on held-out rows; inf: the single head)",
                },
            ),
            Option(
                ("--conj-type-strength",),
                {
                    "type": float,
                    "metavar": "GAMMA",
                    "default": None,
                    "help": "--head conj: the strength added per distinct target of the pair (default: chosen on "
                    "held-out rows)",
                },
            ),
            Option(
                ("--conj-backoff",),
                {
                    "choices": ("attended", "current"),
                    "default": None,
                    "help": "--head conj: the row the pair rows' prior leans toward: the attended token's (default; "
                    "an infinite strength is then the single head) or the current token's (Kneser-Ney's order)",
                },
            ),
            Option(
                ("--conj-discount",),
                {
                    "type": float,
                    "metavar": "D",
                    "default": None,
                    "help": "--head conj: the absolute discount each stored (pair, target) cell gives its pair's "
                    "prior row, Kneser-Ney's (default: chosen on held-out rows among 0, 0.5, 0.8)",
                },
            ),
            Option(
                ("--conj-order",),
                {
                    "type": int,
                    "metavar": "K",
                    "default": None,
                    "help": "--head conj: 2 (default): rows keyed by the attended and the current token; 3: rows "
                    "keyed by the token before the attended one too (a 4-gram at the previous position), leaning "
                    "toward the pair rows, their strengths and discount chosen on held-out rows; --head recipe: "
                    "its conjunction part's (default 3)",
                },
            ),
            Option(
                ("--conj-choose-single",),
                {
                    "action": "store_const",
                    "const": True,
                    "default": None,
                    "help": "--head conj: choose the single head's open values (sigma2, --emission-strength, "
                    "--type-strength not given) on held-out rows too, a step at a time beside the pair rows' "
                    "(default: fixed at the values given, 1 when not given)",
                },
            ),
            Option(
                ("--conj-counts",),
                {
                    "choices": ("data", "responsibilities"),
                    "default": None,
                    "help": "--head conj: where the pair and triple rows' counts come from: data (default): each "
                    "occurrence in the training rows, counted once, as an n-gram model counts them; "
                    "responsibilities: what each cell received in the last E-step (EM fits the rows too)",
                },
            ),
        ),
        spec_from_options=spec_from_options,
        head_name="conj",
    )
)
