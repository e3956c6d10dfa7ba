"""Smoke runs of benchmarks/bench_kernel.py as a real subprocess: its figures exist, and its memory stays flat."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernel.py"
MIB = 2**20


def run_benchmark(*args: str) -> dict:
    """Run the script with ``--json`` and return its one JSON object."""
    completed = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", str(SCRIPT), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=SCRIPT.parents[1],
        check=False,
    )
    assert completed.returncode == 0, f"benchmark failed:\n{completed.stdout}\n{completed.stderr}"
    return json.loads(completed.stdout)


def assert_positive_finite(value, label: str) -> None:
    assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{label} = {value!r}: not a number"
    assert math.isfinite(value) and value > 0, f"{label} = {value!r}: expected a positive, finite figure"


@pytest.mark.slow
def test_smoke_run_reports_every_figure():
    report = run_benchmark(
        *("--rows", "20000", "--numpy-rows", "5000", "--mixle-rows", "2000", "--repeats", "1"),
        *("--symbols", "300", "--targets", "300"),
    )
    has_mixle = importlib.util.find_spec("mixle") is not None
    assert report["config"]["rows"] == 20000
    assert (report["config"]["symbols"], report["config"]["targets"]) == (300, 300)
    expected_rows = {
        "ours_sampled": 20000,
        "ours_grouped": 20000,
        "ours_symbol_major": 20000,
        "ours_ungrouped": 20000,
        "numpy": 5000,
        "mixle": 2000,
    }
    for path, rows in expected_rows.items():
        figures = report["results"][path]
        if path == "mixle" and not has_mixle:
            assert figures is None
            continue
        assert figures["rows"] == rows, path
        for name in ("seconds", "triples_per_s"):
            assert_positive_finite(figures[name], f"{path}.{name}")
    for name, value in report["ratios"].items():
        if "mixle" in name and not has_mixle:
            assert value is None
        else:
            assert_positive_finite(value, name)
    for target in report["targets"]:
        if "mixle" in target["name"] and not has_mixle:
            assert target["pass"] is None
        else:
            assert_positive_finite(target["measured"], target["name"])
            assert isinstance(target["pass"], bool), target
    # The paths compute the same statistics, so the throughput figures compare like with like.
    for path, difference in report["agreement"].items():
        if path == "mixle" and not has_mixle:
            continue
        assert 0.0 <= difference < 1e-9, f"ours and {path} disagree by {difference:.3g}"
    memory = report["memory"]
    assert_positive_finite(memory["input_bytes"], "input_bytes")
    assert memory["input_bytes"] == 20000 * (16 * 4 + 32 * 4 + 4)
    assert memory["kernel_peak_growth_bytes"] >= 0
    for name in ("cpu_count", "numpy", "numba", "python"):
        assert report["host"][name]


@pytest.mark.slow
def test_kernel_peak_memory_does_not_grow_with_rows():
    shape = ("--symbols", "500", "--targets", "500", "--repeats", "1", "--numpy-rows", "0", "--mixle-rows", "0")
    small = run_benchmark("--rows", "50000", *shape)["memory"]
    large = run_benchmark("--rows", "400000", *shape)["memory"]
    assert large["input_bytes"] == 8 * small["input_bytes"]
    # The inputs grew by ~70 MiB; an O(rows) temporary in the kernel would show up here.
    growth_small, growth_large = small["kernel_peak_growth_bytes"], large["kernel_peak_growth_bytes"]
    assert growth_large <= growth_small + 16 * MIB, (
        f"kernel peak above inputs grew from {growth_small / MIB:.1f} MiB at 50,000 rows "
        f"to {growth_large / MIB:.1f} MiB at 400,000 rows"
    )
