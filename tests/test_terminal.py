"""Every command that runs a cluster, typed on a terminal: run under a real pseudo-terminal, it exits 0 and draws
its progress bars there.

With stderr a terminal the engine draws a tqdm bar per pass and counts finished partitions as they come in;
with stderr a pipe (every other test) it does neither, so only a pseudo-terminal reaches that path. The
pseudo-terminal gets a window size (120 columns) as a terminal emulator's has: tqdm sizes its bar to it.

The stores are tiny (4,000 rows in 4 partitions) and one module cluster serves every command given
``--scheduler``; ``demo`` starts its own embedded cluster, as the README's command does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.engine import ClusterOptions, FitSettings, fit
from dist_respattn.registry import Registry
from dist_respattn.store import WriteOptions, write_synthetic
from dist_respattn.store.ingest.to_stream import write_stream_tokens

pytestmark = pytest.mark.slow  # every test here starts a command (and the module a cluster)

COMMAND = str(Path(sys.executable).parent / "dist-respattn")

#: 4,000 rows in 1,024-row partitions: 4 partitions, so a pass's bar has something to count.
LAYOUT = WriteOptions(chunk_rows=512, partition_rows=1024)
ROWS = 4_000
#: A tqdm bar of one of the engine's passes: ``iteration 1:  25%|██▌       | 1/4 [00:00<00:00, 9.8partition/s]``.
PASS_BAR = re.compile(r"(\d+)%\|[^|\r\n]*\| *\d+/(\d+) \[[^\]\r\n]*partition")


@dataclass(frozen=True)
class Terminal:
    """What a command wrote on its terminal (stdout and stderr together, as a user sees them) and its exit status."""

    returncode: int
    output: str

    def bars(self) -> list[str]:
        """Each pass bar as tqdm drew it: the pieces of the output between carriage returns that hold one."""
        return [piece for piece in re.split(r"[\r\n]+", self.output) if PASS_BAR.search(piece)]


def run_on_terminal(*args: str, timeout: float = 120.0) -> Terminal:
    """``dist-respattn ARGS`` with a new pseudo-terminal as its stdin, stdout and stderr, read until it exits.

    Its own session, so a command past ``timeout`` is killed with everything it started (then the
    test fails with what it had written).
    """
    master, slave = pty.openpty()
    # rows, columns, and the pixel sizes nobody reads: a terminal emulator's window.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    # Our copy of the slave stays open until the command has exited and its output is read: were it closed, the
    # master could see EIO (every writer gone) before the kernel has moved a quick command's last bytes to it.
    process = subprocess.Popen(
        [COMMAND, *args], stdin=slave, stdout=slave, stderr=slave, start_new_session=True, close_fds=True
    )
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    exited_at: float | None = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise AssertionError(
                    f"dist-respattn {' '.join(args)} still ran after {timeout:.0f} s; its terminal:\n"
                    + b"".join(chunks).decode("utf-8", "replace")
                )
            ready, _, _ = select.select([master], [], [], min(left, 0.2))
            if ready:
                chunks.append(os.read(master, 65536))
                continue
            # Nothing new for 0.2 s: done once the command has exited and a further quiet moment has passed (the
            # workers of an embedded cluster may still write a line as they go).
            if exited_at is None:
                if process.poll() is not None:
                    exited_at = time.monotonic()
            elif time.monotonic() - exited_at >= 0.4:
                break
        returncode = process.wait()
    finally:
        os.close(slave)
        os.close(master)
    return Terminal(returncode, b"".join(chunks).decode("utf-8", "replace"))


def assert_ran_with_bars(result: Terminal, *descriptions: str) -> None:
    """Exit status 0, and a pass bar drawn for each description (``iteration 1``, ``predicting …``)."""
    assert result.returncode == 0, result.output
    assert ": error:" not in result.output, result.output
    bars = result.bars()
    for description in descriptions:
        assert any(bar.startswith(f"{description}:") for bar in bars), (description, result.output)


@dataclass(frozen=True)
class Stores:
    train: str
    validation: str
    model: str


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Stores:
    """A training and a validation store sampled from one small head, and a model fitted to them (read-only)."""
    folder = tmp_path_factory.mktemp("terminal")
    truth = random_distribution(12, 4, 3, 6, seed=0, sigma2=0.5)
    train, validation = str(folder / "train.zarr"), str(folder / "validation.zarr")
    write_synthetic(train, ROWS, model=truth, seed=1, options=LAYOUT)
    write_synthetic(validation, ROWS // 2, model=truth, seed=2, options=LAYOUT)
    return Stores(train, validation, str(folder / "model"))


@pytest.fixture(scope="module")
def address(stores, one_worker_address) -> str:
    """The scheduler address of the one-worker cluster the command-line tests share; the model is fitted on it."""
    fit(
        stores.train, model_dir=stores.model, settings=FitSettings(max_iter=2), validation=stores.validation,
        cluster=ClusterOptions(scheduler=one_worker_address), progress=False,
    )  # fmt: skip
    return one_worker_address


def test_demo_on_a_terminal(tmp_path):
    """The README's command, on its own embedded cluster."""
    result = run_on_terminal(
        "demo", "--synthetic", "--dir", str(tmp_path), "--rows", "3000", "--validation-rows", "1000",
        "--symbols", "10", "--targets", "5", "--max-iter", "2", "--workers", "1",
    )  # fmt: skip
    assert_ran_with_bars(result, "initializing", "iteration 1", "iteration 2")
    assert "recovery of the store's true head" in result.output


def test_fit_on_a_terminal(tmp_path, stores, address):
    result = run_on_terminal(
        "fit", stores.train, "--model-dir", str(tmp_path / "model"), "--validation", stores.validation,
        "--max-iter", "2", "--scheduler", address,
    )  # fmt: skip
    assert_ran_with_bars(result, "initializing", "iteration 1", "iteration 2")
    assert (tmp_path / "model").is_dir()


def test_evaluate_on_a_terminal(stores, address):
    result = run_on_terminal("evaluate", stores.model, stores.validation, "--scheduler", address)
    assert_ran_with_bars(result, f"scoring {stores.validation}")
    assert "perplexity" in result.output


def test_predict_on_a_terminal(tmp_path, stores, address):
    out = tmp_path / "predictions.zarr"
    result = run_on_terminal("predict", stores.model, stores.validation, "--out", str(out), "--scheduler", address)
    assert_ran_with_bars(result, f"predicting {stores.validation}")
    assert out.is_dir()


def test_predict_into_a_rows_file_on_a_terminal(tmp_path, stores, address):
    """``--out FILE.jsonl`` takes another path (the driver writes the rows as the partitions come), with its bar."""
    out = tmp_path / "predictions.jsonl"
    result = run_on_terminal("predict", stores.model, stores.validation, "--out", str(out), "--scheduler", address)
    assert_ran_with_bars(result, f"predicting {stores.validation}")
    bars = [bar for bar in result.bars() if bar.startswith(f"predicting {stores.validation}:")]
    assert {PASS_BAR.search(bar).group(2) for bar in bars} == {"2"}, bars  # counting the validation store's 2 parts
    assert len(out.read_text().splitlines()) == ROWS // 2


def test_retrain_on_a_terminal(tmp_path, stores, address):
    registry = tmp_path / "registry"
    result = run_on_terminal(
        "retrain", "--registry", str(registry), "--store", stores.train, "--validation", stores.validation,
        "--max-iter", "2", "--scheduler", address,
    )  # fmt: skip
    assert_ran_with_bars(result, "iteration 1")
    assert Registry(str(registry)).numbers() == [1]


def test_validate_on_a_cluster_on_a_terminal(stores, address):
    result = run_on_terminal("validate", stores.train, "--scheduler", address)
    assert result.returncode == 0, result.output
    # Whole partitions out of a known total (4,000 rows in partitions of 1,024), not ``4.00partitions``.
    assert re.search(r"scanning: 100%\|[^|\r\n]*\| 4/4 \[[^\]\r\n]*partitions/s", result.output), result.output
    assert f"{stores.train}: valid (4,000 rows" in result.output


def test_validate_of_a_stream_store_on_a_terminal_counts_its_shards(tmp_path):
    store = tmp_path / "tokens.zarr"
    write_stream_tokens(store, np.arange(3000) % 7, 3, options=LAYOUT)
    result = run_on_terminal("validate", str(store))
    assert result.returncode == 0, result.output
    assert re.search(r"scanning: 100%\|[^|\r\n]*\| 3/3 \[", result.output), result.output


def test_split_of_tokens_on_a_terminal_counts_tokens_or_rows(tmp_path):
    """The stream writers count tokens, the triple writers rows: the bar names what it counts."""
    np.save(tmp_path / "tokens.npy", np.random.default_rng(0).integers(0, 9, 3000))
    common = ("--tokens", str(tmp_path / "tokens.npy"), "--block-tokens", "100", "--context", "3")
    streams = run_on_terminal("split", str(tmp_path / "streams"), *common)
    triples = run_on_terminal("split", str(tmp_path / "triples"), *common, "--format", "triples")
    assert streams.returncode == 0 and triples.returncode == 0, streams.output + triples.output
    assert re.search(r"splitting: 3\.00k ?tokens \[", streams.output), streams.output
    # 30 documents of 100 tokens give 30 * (100 - 3) = 2,910 rows at N = 3.
    assert re.search(r"splitting: 2\.91k ?rows \[", triples.output), triples.output
    # Text files are counted whole (the train files counted, then all written): ``45 files``, not ``45.0files``.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(24):
        (corpus / f"f{i:02d}.txt").write_text("alpha beta gamma delta " * (5 + i), encoding="utf-8")
    text = run_on_terminal("split", str(tmp_path / "text"), "--text", str(corpus), "--context", "3")
    assert text.returncode == 0, text.output
    assert re.search(r"splitting: \d+ ?files \[", text.output), text.output
    assert not re.search(r"splitting: \d+\.\d+ ?files \[", text.output), text.output
    # The validation split gets one of these files (by the seeded hash of its name): "1 document", not "1 documents".
    assert re.search(r"validation .*: [\d,]+ rows, 1 document, [\d,]+ tokens", text.output), text.output
