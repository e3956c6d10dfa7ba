"""Writers stream: the peak memory of an ingest does not grow with the size of its input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak from /proc/self/status")

MIB = 2**20

# Runs in a fresh interpreter so its peak resident set is the ingest's own.
CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from dist_respattn.store import write_arrays, write_tokens
    kind, folder, out = sys.argv[1:4]
    if kind == "tokens":
        store = write_tokens(out, f"{folder}/tokens.npy", 8, num_symbols=3000, dim=16)
    else:
        store = write_arrays(out, f"{folder}/context.npy", f"{folder}/query.npy", f"{folder}/target.npy")
    # VmHWM is this process image's own peak; ru_maxrss would carry over the forking parent's peak.
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    print(json.dumps({"rows": store.num_rows, "peak_bytes": peak}))
    """
)


def start_ingest(kind: str, folder, rows: int) -> subprocess.Popen[str]:
    """The ingest of ``rows`` random rows in ``folder``, started in a fresh interpreter (its peak is its own)."""
    rng = np.random.default_rng(0)
    if kind == "tokens":
        np.save(folder / "tokens.npy", rng.integers(0, 3000, rows + 8, dtype=np.int32))
    else:
        np.save(folder / "context.npy", rng.integers(0, 3000, (rows, 8), dtype=np.int32))
        np.save(folder / "query.npy", rng.standard_normal((rows, 16), dtype=np.float32))
        np.save(folder / "target.npy", rng.integers(0, 3000, rows, dtype=np.int32))
    out = folder / "store.zarr"
    argv = [sys.executable, "-c", CHILD, kind, str(folder), str(out)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ingest_peak(ingest: subprocess.Popen[str]) -> dict:
    out, err = ingest.communicate(timeout=240)
    assert ingest.returncode == 0, err
    return json.loads(out)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tokens", "arrays"])
def test_ingest_peak_memory_is_flat_in_the_input_size(kind, tmp_path):
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    # The two ingests run at once: each peak is its own process's (VmHWM), whatever runs beside it.
    started = [start_ingest(kind, tmp_path / "small", 1_200_000), start_ingest(kind, tmp_path / "large", 3_600_000)]
    try:
        small, large = (ingest_peak(ingest) for ingest in started)
    finally:
        for ingest in started:
            if ingest.poll() is None:  # the other one failed first
                ingest.kill()
                ingest.communicate()
    assert (small["rows"], large["rows"]) == (1_200_000, 3_600_000)
    # Both inputs span several partitions (524,288 rows here), so both reach the steady working set;
    # 2.4 M more rows are ~240 MB more input (100 bytes a row), which an ingest holding its input would show;
    # measured: +27 MiB from 1.2M to 3.6M rows and +5 MiB more to 7.2M (allocator and cache warm-up).
    growth = large["peak_bytes"] - small["peak_bytes"]
    assert growth < 60 * MIB, (
        f"{kind}: peak RSS grew by {growth / MIB:.0f} MiB from 1.2M to 3.6M rows "
        f"({small['peak_bytes'] / MIB:.0f} -> {large['peak_bytes'] / MIB:.0f} MiB)"
    )
