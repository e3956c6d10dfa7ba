"""The ``dist-respattn`` command. Nothing imports this package but its entry point and tests."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from dist_respattn.cli import demo, fit_commands, gated_commands, registry_commands, split_command, store_commands
from dist_respattn.cli.common import CommandError, in_flags

__all__ = ["build_parser", "main", "subcommands"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (also read by tests that check documented commands)."""
    from dist_respattn import __version__

    parser = argparse.ArgumentParser(
        prog="dist-respattn",
        description=(
            "Fit responsibility-attention heads by exact EM over chunked zarr stores (token streams or triples) "
            "on a Dask cluster."
        ),
    )
    parser.add_argument("--version", action="version", version=f"dist-respattn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # A command line without a command (or `models` without its action) prints the help of the parser it
    # stopped at; each subcommand with actions sets its own parser here.
    parser.set_defaults(help_parser=parser)
    demo.register(sub)
    store_commands.register(sub)
    split_command.register(sub)
    fit_commands.register(sub)
    gated_commands.register(sub)
    registry_commands.register(sub)
    # argparse leaves a subcommand's unknown arguments to the top parser, whose error shows the top-level usage;
    # each command's own parser reports them instead (see main), with the usage of the command typed.
    for command_parser in sub.choices.values():
        command_parser.set_defaults(error_parser=command_parser)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """``(name, parser, one-line help)`` of each subcommand of ``parser`` in the order they were registered (an
    alias once); empty for a parser without subcommands. Read by the docs' CLI reference and its tests."""
    for action in parser._actions:  # argparse keeps subparsers only among its actions
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found: list[tuple[str, argparse.ArgumentParser, str]] = []
            for name, sub in action.choices.items():
                if all(sub is not other for _, other, _ in found):
                    found.append((name, sub, helps.get(name, "")))
            return found
    return []


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a check failed, 2 an error)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "error_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if getattr(args, "handler", None) is None:
        # Nothing to run: as argparse does for a missing argument, the help goes to stderr with exit status 2,
        # so a script that forgot its command fails instead of passing.
        args.help_parser.print_help(sys.stderr)
        return 2
    from dist_respattn.engine.cluster import ClusterError
    from dist_respattn.store.errors import StoreError

    try:
        report = args.handler(args)
    except (CommandError, StoreError, ClusterError, MemoryError, ValueError, TypeError, OSError) as exc:
        message = in_flags(" ".join(str(exc).split()))  # one line, whatever the exception held, in flags
        print(f"dist-respattn {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dist-respattn {args.command}: interrupted", file=sys.stderr)
        return 130
    try:
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            args.printer(report)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader (e.g. `| head`) left; what it took was all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return int(report.get("exit_status", 0)) if isinstance(report, dict) else 0


if __name__ == "__main__":
    sys.exit(main())
