"""The head kinds on the command line: the options each registered kind adds to a command, and the spec they ask for.

The command line knows no kind by name: every kind registered in the model layer
(:func:`~dist_respattn.model.heads.base.kind_names`) brings its own options
(:class:`~dist_respattn.model.heads.base.Option`), in a group of its own, and reads them back itself
(``HeadKind.spec_from_options``; a head's ``report`` and ``predictor`` take them by their ``dest`` names).
"""

from __future__ import annotations

import argparse
from typing import Any

from dist_respattn.cli.common import CommandError

__all__ = [
    "add_head_options",
    "default_kind_text",
    "given_head_options",
    "head_options",
    "kind_picked",
    "refuse_other_kinds_options",
    "spec_from_args",
]


def _kinds() -> list[Any]:
    from dist_respattn.model.heads.base import head_kind, kind_names

    return [head_kind(name) for name in kind_names()]


def _dest(option: Any) -> str:
    if "dest" in option.settings:
        return str(option.settings["dest"])
    long = next((f for f in option.flags if f.startswith("--")), option.flags[0])
    return long.lstrip("-").replace("-", "_")


def default_kind_text() -> str:
    """The kind ``fit`` picks when nothing picks one, in words for a help text."""
    from dist_respattn.model.heads.base import token_stream_default

    name = token_stream_default()
    return "single" if name is None else f"{name} on a token-stream store, else single"


def add_head_options(parser: argparse.ArgumentParser, command: str, *, head_default: str | None = None) -> None:
    """Add every kind's options that ``command`` takes, each kind's in a group titled by its summary; ``fit`` also
    takes ``--head NAME``, a kind picked by the name it registered (``HeadKind.head_name``). ``head_default``: what
    ``--head``'s help says is fitted without it (default: what ``fit`` picks)."""
    if command == "fit":
        named = sorted((kind for kind in _kinds() if kind.head_name is not None), key=lambda kind: kind.head_name)
        default = head_default or default_kind_text()
        # Checked in spec_from_args, so that a bad name is one line (argparse's choices would print the usage too).
        parser.add_argument(
            "--head",
            metavar="{" + ",".join(str(kind.head_name) for kind in named) + "}",
            default=None,
            help="the kind of head: "
            + "; ".join(f"{kind.head_name}, {kind.summary}" for kind in named)
            + f" (default: {default}; the other kinds are picked by their own options below)",
        )
    for kind in _kinds():
        options = [option for option in kind.options if command in option.commands]
        if not options:
            continue
        group = parser.add_argument_group(f"{kind.name.replace('_', '-')} heads", kind.summary or None)
        for option in options:
            group.add_argument(*option.flags, **option.settings)


def head_options(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The kinds' options of ``command`` as parsed, by ``dest`` name (``None`` for those not given)."""
    return {
        _dest(option): getattr(args, _dest(option), None)
        for kind in _kinds()
        for option in kind.options
        if command in option.commands
    }


def given_head_options(args: argparse.Namespace, command: str) -> list[tuple[str, str]]:
    """The kinds' options of ``command`` given on the command line, each as ``(its words, its kind's label)``:
    ``("--attribute asyncio", "gated")``; an option left at its default is not given."""
    given = []
    for kind in _kinds():
        for option in kind.options:
            if command not in option.commands:
                continue
            value = getattr(args, _dest(option), None)
            if value is None or value is False or value == option.settings.get("default"):
                continue
            flag = next((f for f in option.flags if f.startswith("--")), option.flags[0])
            given.append((flag if value is True else f"{flag} {value}", kind.name.replace("_", "-")))
    return given


def refuse_other_kinds_options(args: argparse.Namespace, command: str, model: Any, where: str) -> None:
    """Refuse an option of ``command`` that a kind other than ``model``'s added (an attribute-gated head's
    ``--attribute`` given for a single head's model): only its own kind reads it, and ``model`` would ignore it.
    ``where`` names the model (its directory or registry version)."""
    own = str(model.kind).replace("_", "-")
    for words, kind in given_head_options(args, command):
        if kind != own:
            raise CommandError(
                f"{words}: an option of {kind} heads, and {where} holds a {own} head, which takes none: leave it out"
            )


def kind_picked(args: argparse.Namespace) -> bool:
    """Whether the command line picks a kind of head: ``--head NAME`` (``single`` too) or one of a kind's options.

    ``fit`` and ``retrain`` then fit that kind instead of one they would pick themselves (a warm start's, a registry
    version's, the recipe on a token-stream store). Asked here, not of the spec: :func:`spec_from_args` gives
    ``--head single`` as the very spec it gives when nothing picks a kind.
    """
    if getattr(args, "head", None) is not None:
        return True
    return any(value is not None for value in head_options(args, "fit").values())


def _picked_by_options(head: str) -> str:
    """For a ``--head`` that names a kind picked by its options instead (``hops``: ``--hops H``), what to give; for
    any other name, which kinds those are and their options."""
    picked = {
        kind.name: f"{kind.options[0].flags[0]} {kind.options[0].settings.get('metavar', 'N')}"
        for kind in _kinds()
        if kind.options and kind.name not in _head_names()
    }
    if head in picked:
        return f"; the {head} kind is picked by its option, not by --head: {picked[head]}"
    return f" (other kinds by their options: {', '.join(f'{name} {flag}' for name, flag in picked.items())})"


def _head_names() -> list[str]:
    from dist_respattn.model.heads.base import head_names

    return list(head_names())


def spec_from_args(args: argparse.Namespace, base: Any, saved: dict[str, Any] | None) -> Any:
    """The head spec ``fit`` asks for: the kind whose options were given (its ``spec_from_options``), else ``base``
    (the single-hop head the other fit options describe). ``saved``: the spec JSON of a fit being resumed."""
    options = {**vars(args), **head_options(args, "fit")}
    head = options.get("head")
    if head is not None and head not in _head_names():
        raise CommandError(f"--head {head}: expected one of {', '.join(_head_names())}{_picked_by_options(head)}")
    chosen = []
    for kind in _kinds():
        if kind.spec_from_options is None:
            continue
        try:
            spec = kind.spec_from_options(options, base, saved if (saved or {}).get("kind") == kind.name else None)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if spec is not None:
            chosen.append((kind.name, spec))
    if len(chosen) > 1:
        names = " and ".join(name for name, _ in chosen)
        raise CommandError(f"the options of the {names} heads were given together: a fit is of one kind of head")
    if chosen:
        return chosen[0][1]
    if head is None and saved and saved.get("kind") != getattr(base, "kind", None):
        # A resumed fit of another kind, its options not given again: it continues as it was. A --head given (single
        # too) asks for its own kind, which the resume then refuses rather than ignores.
        from dist_respattn.model.heads.base import spec_from_json

        return spec_from_json(saved)
    return base
