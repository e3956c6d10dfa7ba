"""The docs are true: the site builds in strict mode, every Python example runs as a script, and every
``dist-respattn`` command line in them is accepted by the real parser.

Examples are the fenced blocks of ``README.md`` and ``docs/**/*.md``. A ```` ```python ```` block runs as
``python example.py`` in a fresh directory (as a user would run it, so an example that starts the embedded
cluster needs its ``if __name__ == "__main__":``). A block preceded by ``<!-- not-run: REASON -->`` is
skipped with that reason. In ```` ```bash ````, ```` ```console ```` and ```` ```sh ```` blocks, every command
of a line (after ``&&``, ``|``, ``;`` or a parenthesis) that starts with ``dist-respattn`` is parsed by
:func:`dist_respattn.cli.build_parser`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dist_respattn.cli import build_parser, subcommands

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.+?)\s*-->\s*$")
SHELL = {"bash", "console", "sh", "shell"}
#: Shell operators that end one command and start the next.
OPERATORS = {"&&", "||", "|", ";", "(", ")", "&"}
#: A Python example's time limit: each is sized to take seconds.
EXAMPLE_TIMEOUT = 240


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced block: its page, the line its fence opens on, its language, its text, and a not-run reason."""

    page: Path
    line: int
    lang: str
    body: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match["lang"], match["body"], marker["reason"] if marker else None))
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
PYTHON_BLOCKS = [block for block in ALL_BLOCKS if block.lang == "python"]


def command_lines(block: Block) -> list[str]:
    """The block's logical lines: a trailing backslash continues a line; a console prompt ``$ `` is dropped."""
    lines, current = [], ""
    for raw in block.body.splitlines():
        line = raw[2:] if block.lang == "console" and raw.startswith("$ ") else raw
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    if current:
        lines.append(current)
    return lines


def commands(line: str) -> list[list[str]]:
    """The words of every simple command of a shell line (comments dropped), split at the operators."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found: list[list[str]] = [[]]
    for word in lexer:
        if word in OPERATORS:
            found.append([])
        else:
            found[-1].append(word)
    return [words for words in found if words]


@dataclasses.dataclass(frozen=True)
class CommandLine:
    where: str
    line: str
    argv: tuple[str, ...]


COMMANDS = [
    CommandLine(block.where, line, tuple(words[1:]))
    for block in ALL_BLOCKS
    if block.lang in SHELL
    for line in command_lines(block)
    for words in commands(line)
    if words[0] == "dist-respattn"
]


def test_the_docs_hold_examples_of_every_kind():
    # The extraction itself must find what the pages hold, or the tests below would pass on nothing.
    assert len(PYTHON_BLOCKS) >= 7, [b.where for b in PYTHON_BLOCKS]
    assert len(COMMANDS) >= 55, len(COMMANDS)
    assert any(c.argv == ("demo",) and c.where.startswith("README.md") for c in COMMANDS), "the README's command 1"


def subcommand_names() -> list[str]:
    """The command's subcommands, as the CLI reference lists them."""
    return [name for name, _, _ in subcommands(build_parser())]


def test_every_subcommand_has_an_example():
    shown = {c.argv[0] for c in COMMANDS if c.argv}
    missing = sorted(set(subcommand_names()) - shown)
    assert not missing, f"no ```bash example in README.md or docs/ runs: {', '.join(missing)}"


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where}:{' '.join(c.argv[:2])}" for c in COMMANDS])
def test_a_documented_command_line_parses(command: CommandLine):
    parser = build_parser()
    try:
        args = parser.parse_args(list(command.argv))
    except SystemExit as exc:
        pytest.fail(f"{command.where}: `{command.line.strip()}` is refused by the parser (exit {exc.code})")
    assert getattr(args, "handler", None) is not None, f"{command.where}: `{command.line.strip()}` runs no command"


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.where for b in PYTHON_BLOCKS])
def test_a_python_example_runs_as_a_script(block: Block, tmp_path: Path):
    if block.not_run:
        pytest.skip(f"{block.where}: not run: {block.not_run}")
    script = tmp_path / "example.py"
    script.write_text(block.body)
    # Warnings are the user's business here: the example must run as a user runs it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT
    )
    assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stderr[-4000:]}"


def test_the_cli_reference_reads_as_markdown_with_the_parsers_commands():
    """``docs/reference/cli.md`` as GitHub shows it (without the site's hook): every command and action with its
    one-line help, as the parsers give them, and where its flags are; the hook adds each one's --help on the site."""
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "hooks" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert hook.with_table(page) == page, (
        "docs/reference/cli.md's table of commands is not the parsers': run `python docs/hooks/cli_reference.py`"
    )
    plain = page.split(hook.MARKER)[0]
    for name in subcommand_names():
        assert f"| [`{name}`](#dist-respattn-{name}) | " in plain, name
    assert "| [`models list`](#dist-respattn-models-list) | " in plain
    assert "`dist-respattn COMMAND --help`" in plain


@pytest.mark.slow
def test_the_site_builds_in_strict_mode_with_every_command_in_its_reference(tmp_path: Path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    reference = (site / "reference" / "cli" / "index.html").read_text()
    assert "cli-reference" not in reference, "the hook did not replace the marker"
    for name in subcommand_names():
        assert f"usage: dist-respattn {name}" in reference, f"the CLI reference lacks {name}'s help"
    api = (site / "reference" / "api" / "engine" / "index.html").read_text()
    for name in ("fit.fit", "evaluate.evaluate", "predict.predict", "FitSettings"):  # fit is also a submodule's name
        assert f'id="dist_respattn.engine.{name}"' in api, f"the API reference lacks dist_respattn.engine.{name}"


def test_the_library_recipe_chooses_on_held_out_rows():
    # The guide's library example, run in this process so its results can be checked, not only its exit.
    block = next(b for b in PYTHON_BLOCKS if b.page.name == "library.md" and "DEFAULT_SEARCH" in b.body)
    namespace: dict = {}
    exec(compile(block.body, block.where, "exec"), namespace)
    last = namespace["result"].history[-1]
    assert last.hyperparameters is not None and last.heldout["perplexity"] > 1.0
    assert namespace["model"].predict_proba(namespace["context"][:5], namespace["query"][:5]).shape == (5, 50)
