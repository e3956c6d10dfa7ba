"""Reading the files under deploy/ and finding the commands they run, for the deploy tests."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
KUBERNETES = DEPLOY / "kubernetes"
SLURM = DEPLOY / "slurm"
COMPOSE_FILE = DOCKER / "compose.yaml"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
READMES = sorted(DEPLOY.glob("*/README.md"))

#: The programs whose command lines the tests check: `dist-respattn ...`, `dask scheduler|worker ...`
#: and the SLURM script `respattn_slurm.py ...`.
PROGRAMS = ("dist-respattn", "dask", "respattn_slurm.py")

#: Shell words that may stand before a simple command and are not part of it.
_SHELL_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "time", "exec"}


@dataclass(frozen=True)
class Command:
    """One command line found in a deploy file: its words and where it was found."""

    argv: tuple[str, ...]
    where: str

    @property
    def program(self) -> str:
        return Path(self.argv[0]).name

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def load_yaml_documents(path: Path) -> list[Any]:
    """Every YAML document of ``path`` (a manifest may hold several), empty ones dropped."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def compose() -> dict[str, Any]:
    (doc,) = load_yaml_documents(COMPOSE_FILE)
    return doc


def manifest(name: str) -> list[dict[str, Any]]:
    return load_yaml_documents(KUBERNETES / name)


def only(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one document of ``kind`` among ``documents``."""
    (found,) = [d for d in documents if d.get("kind") == kind]
    return found


def shell_commands(script: str) -> Iterator[tuple[str, ...]]:
    """The simple commands of a shell script, each from its first tracked program on.

    Backslash-continued lines are joined; comments, redirections, keywords such as ``if``/``then``,
    and anything before the program (``docker compose run --rm fit``, ``kubectl exec ... --``) are
    dropped, so ``if ! dist-respattn info s >/dev/null 2>&1; then`` gives ``dist-respattn info s``.
    """
    text = re.sub(r"\\\n", " ", script)
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        redirect = False
        for token in [*lexer, ";"]:
            if redirect:  # the target of a redirection
                redirect = False
                continue
            if token and set(token) <= set("<>&"):
                redirect = token not in ("&", "&&")
                if redirect:
                    if words and words[-1].isdigit():  # the descriptor of `2>&1`
                        words.pop()
                    continue
            if token and set(token) <= set(";&|()"):
                found = _from_program(words)
                if found:
                    yield found
                words = []
                continue
            if not words and token in _SHELL_KEYWORDS:
                continue
            words.append(token)


def _from_program(words: list[str]) -> tuple[str, ...] | None:
    """``words`` from the first tracked program on: the first word, or a later one followed by a
    subcommand (``docker compose run --rm fit dist-respattn evaluate ...``, but not the image name
    of ``docker build -t dist-respattn .``)."""
    for i, word in enumerate(words):
        name = Path(word).name
        following = words[i + 1] if i + 1 < len(words) else ""
        if name == "dask" and following in ("scheduler", "worker"):
            return tuple(words[i:])
        if name in ("dist-respattn", "respattn_slurm.py") and (i == 0 or re.fullmatch(r"[a-z]+", following)):
            return tuple(words[i:])
    return None


def argv_of(command: Any) -> list[tuple[str, ...]]:
    """The commands of a compose ``command`` or a container's ``command`` + ``args``."""
    if isinstance(command, str):
        return [tuple(shlex.split(command))]
    words = [str(w) for w in command]
    if words and words[0] in ("sh", "bash") and len(words) >= 3 and words[1].startswith("-") and "c" in words[1]:
        return list(shell_commands(words[2]))
    return [tuple(words)]


def compose_commands() -> list[Command]:
    found = []
    for name, service in compose()["services"].items():
        if "command" in service:
            for argv in argv_of(service["command"]):
                found.append(Command(argv, f"{COMPOSE_FILE.name}: services.{name}.command"))
    return found


def containers(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container spec under ``node`` (a manifest), with the path that leads to it."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for container in value:
                    yield f"{path}.{key}[{container.get('name')}]", container
            else:
                yield from containers(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from containers(value, f"{path}[{i}]")


def manifest_commands() -> list[Command]:
    found = []
    for path in MANIFESTS:
        for doc in load_yaml_documents(path):
            for where, container in containers(doc, doc["kind"]):
                words = [*container.get("command", []), *container.get("args", [])]
                if words:
                    for argv in argv_of(words):
                        found.append(Command(argv, f"{path.name}: {where}"))
    return found


def code_blocks(markdown: str) -> Iterator[tuple[int, str, str]]:
    """``(line, language, text)`` of each fenced code block (indented fences included)."""
    opened: tuple[int, str] | None = None
    rows: list[str] = []
    for number, row in enumerate(markdown.splitlines(), start=1):
        fence = re.fullmatch(r"\s*```(\w*)\s*", row)
        if fence and opened is None:
            opened, rows = (number, fence.group(1)), []
        elif fence and opened is not None:
            yield opened[0], opened[1], "\n".join(rows)
            opened = None
        elif opened is not None:
            rows.append(row)


def readme_commands() -> list[Command]:
    """The tracked commands in the shell code blocks (bash, sh, console or none) of deploy/*/README.md."""
    found = []
    for path in READMES:
        for line, language, text in code_blocks(path.read_text()):
            if language not in ("", "bash", "sh", "shell", "console"):
                continue
            script = "\n".join(re.sub(r"^\s*\$ ", "", row) for row in text.splitlines())
            for argv in shell_commands(script):
                found.append(Command(argv, f"{path.relative_to(DEPLOY)} (code block at line {line})"))
    return found


def all_commands() -> list[Command]:
    return compose_commands() + manifest_commands() + readme_commands()
