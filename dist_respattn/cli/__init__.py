"""The ``dist-respattn`` command. Nothing imports this package but its entry point and tests."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from dist_respattn.cli import demo, fit_commands, head_commands, registry_commands, split_command, store_commands
from dist_respattn.cli.common import CommandError, in_flags
from dist_respattn.cli.signals import exit_status, stop_signals_raise

__all__ = ["build_parser", "main", "subcommands"]

#: What argparse reads as a negative number, not an option (none of our parsers has an option like ``-1``).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class _CommandParser(argparse.ArgumentParser):
    """The parser of ``dist-respattn`` and (as argparse makes subparsers of their parent's class) of each command.

    A command's parser reports an option it does not know, with the option meant, before any other error of the
    same command line: argparse itself reports a missing required argument first (``--modeldir m2`` would read
    ``the following arguments are required: --model-dir``, never naming the typo).
    """

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # Kept for error(): argparse does not pass the arguments it was reading to it.
        self.arg_strings = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if not subcommands(self):  # a parser of subcommands reads its command's arguments as its own unknown ones
            typos = _unknown_options(self, getattr(self, "arg_strings", []))
            # Only an argument found missing can be the typo's doing; argparse's other messages name the flag at
            # fault themselves (``argument --tol: expected one argument`` for ``--tol -1e-3``).
            if typos and "required" in message:
                message = _unrecognized(self, typos)
        self.exit(2, f"{short_usage(self)}{self.prog}: error: {message}\n")


#: The most lines of a command's usage an error prints whole; a longer one (``fit``'s is some 40) is summed up.
_USAGE_LINES = 4


def short_usage(parser: argparse.ArgumentParser) -> str:
    """``parser``'s usage for an error: whole when it is short, else its required arguments only and where the rest
    are (``usage: dist-respattn fit [options] --model-dir MODEL_DIR store (every option: dist-respattn fit --help)``),
    so that the error line is not the last of a screenful."""
    usage = parser.format_usage()
    if usage.count("\n") <= _USAGE_LINES:
        return usage
    words = []
    for action in parser._actions:
        name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        if action.option_strings and action.required:
            words.append(f"{action.option_strings[-1]} {name}" if action.nargs != 0 else action.option_strings[-1])
        elif not action.option_strings:
            name = action.metavar if isinstance(action.metavar, str) else action.dest
            shapes = {"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]"}
            words.append(shapes.get(str(action.nargs), name))
    return f"usage: {parser.prog} [options] {' '.join(words)} (every option: {parser.prog} --help)\n"


def _unknown_options(parser: argparse.ArgumentParser, arg_strings: Sequence[str]) -> list[str]:
    """The arguments of ``arg_strings`` that argparse reads as options (``-x``, ``--name[=value]``) and that none of
    ``parser``'s options matches, as argparse matches them (a unique prefix of a long option, ``-kVALUE``)."""
    known = [option for action in parser._actions for option in action.option_strings]
    found = []
    for token in arg_strings:
        if token == "--":  # what follows is positional
            break
        if not token.startswith("-") or token == "-" or " " in token or _NEGATIVE_NUMBER.match(token):
            continue  # argparse reads these as values
        if token.startswith("--"):
            name = token.partition("=")[0]
            if any(option.startswith(name) for option in known if option.startswith("--")):
                continue
        elif token[:2] in known:
            continue
        found.append(token)
    return found


def _unrecognized(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """``unrecognized arguments: ...`` for ``parser``, each unknown option with the options of ``parser`` it is
    close to (``--modeldir (did you mean --model-dir?)``), and an existing path or URL given where the command takes
    none with the option that takes a store (``corpus/train.zarr (did you mean --store corpus/train.zarr?)``)."""
    # Compared without their dashes, which every long option shares (with them, ``--foo`` is close to ``--tol``).
    options = {
        option[2:]: option for action in parser._actions for option in action.option_strings if option[:2] == "--"
    }
    store_options = [
        action.option_strings[-1]
        for action in parser._actions
        if action.option_strings and (action.metavar or action.dest.upper()) == "STORE"
    ]
    words = []
    for token in unknown:
        meant: list[str] = []
        if token.startswith("-"):
            close = difflib.get_close_matches(token.partition("=")[0].lstrip("-"), list(options), n=3, cutoff=0.75)
            meant = [options[name] for name in close]
        elif store_options and ("://" in token or os.path.exists(token)):
            meant = [f"{option} {token}" for option in store_options]
        words.append(f"{token} (did you mean {' or '.join(meant)}?)" if meant else token)
    return f"unrecognized arguments: {' '.join(words)}"


#: The modules that add the subcommands, in the order ``--help`` lists them; each names its own in ``COMMANDS``.
_COMMAND_MODULES = (demo, store_commands, split_command, fit_commands, head_commands, registry_commands)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand (also read by tests that check documented commands), or of
    ``command`` alone when it is one (a name the top-level help lists; anything else: every subcommand's, so that
    argparse's error can name them).

    Adding a command's options is what a command line pays for before anything runs: every head kind's options
    load the kinds and numba, a store's layout options zarr, ~0.5 s of CPU together. A command line runs one
    command, so :func:`main` adds only the one typed, and the parsers of ``info``, ``validate`` or ``models`` load
    neither.
    """
    from dist_respattn import __version__

    parser = _CommandParser(
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
    commands = [module.COMMANDS for module in _COMMAND_MODULES]
    if any(command in added for added in commands):
        commands = [{command: added[command]} for added in commands if command in added]
    for added in commands:
        for add in added.values():
            add(sub)
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


def _cluster_errors() -> tuple[type[Exception], ...]:
    """The engine's cluster error class when a command imported the engine, else nothing: an error of that class
    can only be raised once its module is loaded, and importing it only to name it would load ``distributed``
    (a quarter of a second) into every command that never starts a cluster."""
    cluster = sys.modules.get("dist_respattn.engine.cluster")
    return () if cluster is None else (cluster.ClusterError,)


def _one_line_error(args: argparse.Namespace, exc: BaseException) -> int:
    """Print ``exc`` as the command's one-line error (whatever the exception held, in flags); exit status 2."""
    message = in_flags(" ".join(str(exc).split()))
    print(f"dist-respattn {args.command}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a check failed, 2 an error, 130 or 143 stopped by
    SIGINT or SIGTERM)."""
    ran: list[argparse.Namespace] = []  # the command's arguments, once parsed (a signal may come before)
    with stop_signals_raise():
        try:
            return _run(argv, ran)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (see signals.py): everything it stopped has unwound
            print(_interrupted(ran[0] if ran else None), file=sys.stderr)
            return exit_status(exc)


def _interrupted(args: argparse.Namespace | None) -> str:
    """The one line a command stopped by a signal ends with: its own words on what it kept, where it has them."""
    if args is None or getattr(args, "command", None) is None:
        return "dist-respattn: interrupted"
    kept = getattr(args, "interrupted", None)
    return f"dist-respattn {args.command}: interrupted{kept(args) if kept is not None else ''}"


def _typed_command(argv: Sequence[str]) -> str | None:
    """The command a command line names, its first argument; ``None`` when that is an option, the top-level
    parser's own (``--help``, ``--version``), whose help lists every command."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def _run(argv: Sequence[str] | None, ran: list[argparse.Namespace]) -> int:
    parser = build_parser(_typed_command(sys.argv[1:] if argv is None else argv))
    args, unknown = parser.parse_known_args(argv)
    ran.append(args)
    if unknown:
        error_parser = getattr(args, "error_parser", parser)
        error_parser.error(_unrecognized(error_parser, unknown))
    if getattr(args, "handler", None) is None:
        # Nothing to run: as argparse does for a missing argument, the help goes to stderr with exit status 2,
        # so a script that forgot its command fails instead of passing.
        args.help_parser.print_help(sys.stderr)
        return 2
    # A store's errors (StoreError) are ValueErrors: named here, they would load the store package (zarr and numba)
    # into every command that never opens a store.
    try:
        report = args.handler(args)
    except (CommandError, MemoryError, ValueError, TypeError, OSError) as exc:
        return _one_line_error(args, exc)
    except _cluster_errors() as exc:  # evaluated only once the handler raised: the engine is loaded if it raised this
        return _one_line_error(args, exc)
    try:
        if args.json:
            # Indented, unless the command's stdout is JSON lines (predict --stream), which its summary ends as one.
            print(json.dumps(report, indent=None if getattr(args, "json_line", False) else 2))
        else:
            args.printer(report)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader (e.g. `| head`) left; what it took was all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return int(report.get("exit_status", 0)) if isinstance(report, dict) else 0


if __name__ == "__main__":
    sys.exit(main())
