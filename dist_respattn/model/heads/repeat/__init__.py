"""A repeat gate over each row's whole history on a fitted head, its rates counted on held-out rows, registered as
``"repeat"``; ``fit --head repeat --repeat-from MODEL --context N`` picks it (see ``docs/guide/repeat-gate.md``)."""

from __future__ import annotations

import os
from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, Option, register_kind
from dist_respattn.model.heads.repeat.head import RepeatHead, RepeatPredictor
from dist_respattn.model.heads.repeat.kind import REPEAT_FROM, RepeatSpec

__all__ = ["KIND", "RepeatHead", "RepeatPredictor", "RepeatSpec", "spec_from_options"]


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> RepeatSpec | None:
    """The repeat spec a ``fit --head repeat`` asks for (``None`` otherwise): the model ``--repeat-from`` names and
    the ``--repeat-prior``. Either option without ``--head repeat`` is refused."""
    source, prior, mix = options.get("repeat_from"), options.get("repeat_prior"), options.get("repeat_mix")
    if options.get("head") != "repeat":
        given = [flag for flag, value in ((REPEAT_FROM, source), ("--repeat-prior", prior), ("--repeat-mix", mix))
                 if value is not None]  # fmt: skip
        if given:
            raise ValueError(f"{given[0]} is an option of --head repeat: add --head repeat, or leave it out")
        return None
    if source is None or not str(source).strip() or "," in str(source):
        raise ValueError(
            f"--head repeat needs {REPEAT_FROM} MODEL: the model directory of one fitted head of this corpus (single, "
            "copy, conj, hops or stack; a recipe's is a repeat gate, its stack/ a stack)"
        )
    if prior is None:
        prior = float((saved or {}).get("prior", 1.0))
    if mix is None and saved is not None and saved.get("mix") is not None:
        mix = float(saved["mix"])
    return RepeatSpec(os.path.abspath(str(source).strip()), float(prior), mix)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r}: expected the wrapped head's share of the prediction, in [0, 1]")
    return value


def _prior(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0.0 and value < float("inf")):
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0 (pseudo-rows)")
    return value


KIND = register_kind(
    HeadKind(
        "repeat",
        RepeatHead,
        RepeatSpec,
        summary="a fitted head under a repeat gate over each row's whole history (its window of N tokens)",
        options=(
            Option(
                (REPEAT_FROM,),
                {
                    "metavar": "MODEL",
                    "default": None,
                    "help": "--head repeat: the model directory of the fitted head it gates (single, copy, conj, hops "
                    "or stack, of this corpus); the fit's --context N is how far back the history reaches",
                },
                ("fit",),
            ),
            Option(
                ("--repeat-prior",),
                {
                    "metavar": "A",
                    "type": _prior,
                    "default": None,
                    "help": "--head repeat: pseudo-rows pulling each history-length bucket's repeat rate toward the "
                    "rate of the bucket of shorter histories (default 1; 0: maximum likelihood)",
                },
                ("fit",),
            ),
            Option(
                ("--repeat-mix",),
                {
                    "metavar": "M",
                    "type": _share,
                    "default": None,
                    "help": "--head repeat: the wrapped head's own share of the prediction, m p + (1 - m) gate(p), "
                    "fixed (default: chosen on the held-out rows among 0, 0.1, ..., 1; 1 is the wrapped head alone)",
                },
                ("fit",),
            ),
        ),
        spec_from_options=spec_from_options,
        head_name="repeat",
    )
)
