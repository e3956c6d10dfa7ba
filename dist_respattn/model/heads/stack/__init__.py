"""A stack of fitted heads of different kinds and windows under a gate learned by EM on held-out rows, registered as
``"stack"``; ``fit --head stack --stack-from MODEL_A,MODEL_B`` picks it (see ``docs/guide/stack-head.md``)."""

from __future__ import annotations

from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, Option, register_kind
from dist_respattn.model.heads.stack.head import GATE_MODES, StackHead, StackPredictor
from dist_respattn.model.heads.stack.kind import STACK_FROM, StackSpec, resolved_sources

__all__ = ["DEFAULT_GATE", "KIND", "StackHead", "StackPredictor", "StackSpec", "spec_from_options"]

#: The gate mode a stack fit uses unless --stack-gate says otherwise.
DEFAULT_GATE = "target"


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> StackSpec | None:
    """The stack spec a ``fit --head stack`` asks for (``None`` otherwise): the components ``--stack-from`` names,
    in order, and the ``--stack-gate`` mode. Either option without ``--head stack`` is refused."""
    sources, gate = options.get("stack_from"), options.get("stack_gate")
    if options.get("head") != "stack":
        if sources is not None or gate is not None:
            flag = STACK_FROM if sources is not None else "--stack-gate"
            raise ValueError(f"{flag} is an option of --head stack: add --head stack, or leave it out")
        return None
    if gate is not None and gate not in GATE_MODES:
        raise ValueError(f"--stack-gate {gate}: expected one of {', '.join(GATE_MODES)}")
    paths = resolved_sources(sources) if sources is not None else ()
    if len(paths) < 2:
        raise ValueError(
            f"--head stack needs {STACK_FROM} MODEL_A,MODEL_B: the model directories of two or more fitted heads "
            "of this corpus (single, copy, conj or hops)"
        )
    twice = sorted({p for p in paths if paths.count(p) > 1})  # absolute and normalized
    if twice:
        # The gate would split one head's weight between its copies: the same stack, one more pass a row.
        raise ValueError(f"{STACK_FROM} names {', '.join(twice)} more than once: give each fitted head once")
    mode = gate if gate is not None else str((saved or {}).get("mode", DEFAULT_GATE))
    return StackSpec(paths, mode)


KIND = register_kind(
    HeadKind(
        "stack",
        StackHead,
        StackSpec,
        summary="fitted heads of different kinds and windows under a gate learned by EM on held-out rows",
        options=(
            Option(
                (STACK_FROM,),
                {
                    "metavar": "MODEL_A,MODEL_B",
                    "default": None,
                    "help": "--head stack: the model directories of the fitted heads it stacks (single, copy, conj "
                    "or hops, of this corpus; each reads the last N_k tokens of the rows' window), comma-separated",
                },
                ("fit",),
            ),
            Option(
                ("--stack-gate",),
                {
                    "metavar": "{joint,target}",
                    "default": None,
                    "help": "--head stack: target interpolates the components' predictive distributions with the "
                    "gate pi itself, fitted on p(target | window, query) (default); joint weighs each component by "
                    "pi_k p_k(query, target | window), so its prediction by pi_k p_k(query | window)",
                },
                ("fit",),
            ),
        ),
        spec_from_options=spec_from_options,
        head_name="stack",
    )
)
