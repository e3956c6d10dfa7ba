"""Running the deploy files' commands as local processes: certificates, free ports, process groups."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil

from ..certificates import write_tls_files

#: The venv's executables (dist-respattn, dask, python), first on the PATH of every process started.
BIN = Path(sys.executable).parent


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA and one certificate/key it signed (SAN 127.0.0.1 and localhost), named as make-certs.sh names them.

    Returns ``{"ca": ca.crt, "cert": tls.crt, "key": tls.key}``.
    """
    files = write_tls_files(folder, "deploy", ("ca.crt", "tls.crt", "tls.key"))
    return {"ca": files.ca, "cert": files.cert, "key": files.key}


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Localizer:
    """Text replacements that turn a deploy file's command into one for this machine.

    ``(old, new)`` pairs are applied in order to a command's text; :meth:`check_all_used` fails when
    a pair matched no command, so a mapping that went stale with the deploy files fails loudly.
    """

    def __init__(self, replacements: Sequence[tuple[str, str]]) -> None:
        self.replacements = list(replacements)
        self.used: set[str] = set()

    def text(self, text: str) -> str:
        for old, new in self.replacements:
            if old in text:
                self.used.add(old)
                text = text.replace(old, new)
        return text

    def argv(self, argv: Sequence[str]) -> list[str]:
        """A command's words after the replacements, its program taken from the venv."""
        words = shlex.split(self.text(shlex.join(argv)))
        if (BIN / words[0]).exists():
            words[0] = str(BIN / words[0])
        return words

    def check_all_used(self) -> None:
        unused = [old for old, _ in self.replacements if old not in self.used]
        assert not unused, f"these substitutions matched no command of the deploy file: {unused}"


def environment(**extra: str) -> dict[str, str]:
    """This process's environment with the venv first on PATH and no inherited Dask/AWS settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "AWS_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


class Processes:
    """Long-running processes, each in its own process group, all ended by :meth:`stop`."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.logs.mkdir(parents=True, exist_ok=True)
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        self.started.append((name, process))
        return process

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self) -> None:
        """Fail naming a process that already exited, with the end of its log."""
        for name, process in self.started:
            if process.poll() is not None:
                raise AssertionError(f"{name} exited with {process.returncode}:\n{self.log(name)[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to every group (Dask closes cleanly on it), then SIGKILL to whatever is left."""
        end_groups([process.pid for _, process in self.started])
        for _, process in self.started:
            process.wait()


def end_groups(groups: Sequence[int], timeout: float = 10.0) -> None:
    """SIGTERM to each process group of ``groups``; after ``timeout``, SIGKILL to what is left of them but
    multiprocessing's resource trackers.

    A tracker left alive sees the processes it served end and unlinks the semaphores they left in ``/dev/shm``;
    killed with them, it left them there for good (seven a SLURM worker job, before)."""
    for group in groups:
        _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_members(group) for group in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    for group in groups:
        for member in _members(group):
            if not any("multiprocessing.resource_tracker" in part for part in member.info["cmdline"] or ()):
                with suppress(psutil.Error):
                    member.kill()


def _members(group: int) -> list[psutil.Process]:
    """The live processes of process group ``group`` (not its zombies, which wait for their parent)."""
    members = []
    for process in psutil.process_iter(["cmdline", "status"]):
        with suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
    return members


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def processes(logs: Path) -> Iterator[Processes]:
    group = Processes(logs)
    try:
        yield group
    finally:
        group.stop()


def run(
    argv: Sequence[str], *, env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """A one-shot job: its exit status and output."""
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False)


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET (an HTTP error status is returned, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def wait_for_http(url: str, group: Processes, timeout: float = 60) -> None:
    """Wait until ``url`` answers 200, failing early when a process of ``group`` died."""
    deadline = time.monotonic() + timeout
    while True:
        group.check_alive()
        try:
            if get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer within {timeout} s")
        time.sleep(0.2)


def wait_for_workers(dashboard: str, n: int, group: Processes, timeout: float = 90) -> None:
    """Wait until the scheduler behind ``dashboard`` counts ``n`` workers (read from /metrics, no client)."""
    deadline = time.monotonic() + timeout
    while True:
        group.check_alive()
        try:
            status, body = get(f"{dashboard}/metrics", timeout=2)
            if status == 200 and _worker_count(body) >= n:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the scheduler at {dashboard} did not get {n} workers within {timeout} s")
        time.sleep(0.2)


def _worker_count(metrics: str) -> int:
    """Workers in any state, from Dask's ``dask_scheduler_workers{state=...}`` gauges."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("dask_scheduler_workers{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
