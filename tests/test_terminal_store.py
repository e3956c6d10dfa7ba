"""The store commands' bars, typed on a terminal: files and partitions count in whole numbers, rows scaled."""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path

import pytest

from tests.test_terminal import run_on_terminal

pytestmark = pytest.mark.slow  # every test here starts a command


def test_ingest_counts_its_files_in_whole_numbers_on_a_terminal(tmp_path):
    """A bar of 7 files counted twice reads ``14/14 files``, not ``14.0/14.0`` (tqdm's scaled units)."""
    sources = sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))
    assert len(sources) >= 3
    done = run_on_terminal(
        "ingest", "--text", *map(str, sources), "--vocab-size", "200", "--context", "4", str(tmp_path / "s.zarr")
    )
    assert done.returncode == 0, done.output
    total = 2 * len(sources)  # counted, then written
    assert re.search(rf"\b{total}/{total} \[[^\]]*files?/s\]", done.output), done.output
    assert not re.search(r"\d\.\d/\d+\.\d", done.output), done.output
