"""Triple-store throughput per core, side by side: writing, size on disk, and reading partitions against the E-step.

Measures, in one run on the same sampled triples (default shape S=2000, N=16, D=32, T=2000, 1,000,000 rows):

- for every compression choice of the store (``dist_respattn.store.COMPRESSION_CHOICES``: ``auto`` = ids
  lz4+bitshuffle and floats raw, ``lz4``, ``zstd``, ``none``) and both row orders (``input``, and ``target``:
  each partition's rows grouped by target): write rows/s and MB/s (uncompressed bytes a second, into the
  OS page cache: nothing is synced), bytes on disk and the compression ratio, and read rows/s and MB/s of
  reading every partition block by block through ``TripleStore.iter_blocks`` (what an E-step task does);
- the E-step kernel (numba ``seq_update``, a partition at a time, under a different random model than the
  one that generated the rows) on the same rows, read back from the store in input order and in target order;
- the key ratio, per compression choice and row order: (seconds to read and decode the partitions) /
  (kernel seconds on the same rows), with PASS/MISS against the target of 1/3 (measured, never asserted:
  machines are noisy); the default (``auto``, input order) is the headline;
- a whole E-step task, ``iter_blocks`` + ``seq_update`` a block at a time, on the ``auto`` stores;
- the memory a read pass adds, as RSS growth and as traced allocations: a few blocks, never a partition.

Reads labelled "warm" come from the OS page cache: the store was just written, so this is local disk with a
warm cache. "Cold" reads come after ``fsync`` + ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every store file,
and are only reported when ``mincore`` confirms the pages left the cache.

Every path runs on one core: the thread-count variables are set to 1 before NumPy is imported, blosc runs
one thread and zarr's codec thread pool one worker (zarr's event loop thread only waits on it). Each figure
is the best of ``--repeats`` runs; the numba JIT and zarr are warmed up before anything is timed.

Run::

    python benchmarks/bench_store.py                  # 1,000,000 rows, the reference shape
    python benchmarks/bench_store.py --rows 20000 --symbols 300 --targets 300 --chunk-rows 2048 \\
        --partition-rows 8192 --repeats 1 --json      # a smoke run
"""

from __future__ import annotations

import os

# One thread for every path (the kernel is single-threaded; this keeps NumPy on one core too).
# Must happen before NumPy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import ctypes  # noqa: E402
import ctypes.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numba  # noqa: E402
import numcodecs  # noqa: E402
import numcodecs.blosc  # noqa: E402
import numpy as np  # noqa: E402
import zarr  # noqa: E402
from measure import (  # noqa: E402
    best_of,
    current_rss_bytes,
    max_relative_difference,
    peak_rss_bytes,
    release_free_memory,
    reset_peak_rss,
    time_once,
)

from dist_respattn import ResponsibilityAttentionDistribution, random_distribution  # noqa: E402
from dist_respattn.store import (  # noqa: E402
    COMPRESSION_CHOICES,
    TripleStore,
    WriteOptions,
    choose_chunking,
    write_arrays,
)
from dist_respattn.store.problems import EncodedRows  # noqa: E402

MIB = 2**20
MB = 1e6

#: The target: reading and decoding a partition must take less than this share of the E-step on its rows.
TARGET_READ_OVER_KERNEL = 1.0 / 3.0

#: Rows order of the stores: as given, and each partition grouped by target (``WriteOptions.row_order``).
ROW_ORDERS = ("input", "target")

#: The default store, whose ratio is the headline.
HEADLINE = ("auto", "input")

#: Rows the numba JIT and zarr are warmed up on (compile and first-use time must not be timed).
WARMUP_ROWS = 256

#: A cold read counts only if at most this share of the store's pages is still cached after dropping them.
COLD_RESIDENT_MAX = 0.02


# ----------------------------------------------------------------------------------------- threads


def use_one_thread() -> dict[str, Any]:
    """Make blosc decode on one thread and zarr run codecs on a one-worker pool; return what was set.

    Must run before zarr's first read or write (zarr creates its thread pool on first use).
    """
    if not hasattr(numcodecs.blosc, "set_nthreads"):
        raise RuntimeError(f"numcodecs {numcodecs.__version__} has no blosc.set_nthreads: cannot pin blosc")
    numcodecs.blosc.set_nthreads(1)
    try:
        zarr.config.get("threading.max_workers")
    except KeyError as exc:
        raise RuntimeError(f"zarr {zarr.__version__} has no 'threading.max_workers' setting") from exc
    zarr.config.set({"threading.max_workers": 1})
    get_nthreads = getattr(numcodecs.blosc, "get_nthreads", None)
    return {
        "blosc_threads": get_nthreads() if get_nthreads is not None else 1,
        "zarr_max_workers": zarr.config.get("threading.max_workers"),
    }


# ---------------------------------------------------------------------------------- files and cache


def store_files(path: str) -> list[str]:
    return [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]


def disk_bytes(path: str) -> int:
    return sum(os.path.getsize(f) for f in store_files(path))


def filesystem_of(path: str) -> str | None:
    """The type of the file system ``path`` lives on (``/proc/mounts``), or ``None``."""
    real = os.path.realpath(path)
    best, fstype = "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3:
                    mount = fields[1]
                    inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                    if inside and len(mount) > len(best):
                        best, fstype = mount, fields[2]
    except OSError:
        return None
    return fstype


class PageCache:
    """Drops a store's files from the OS page cache and checks they left it (Linux: fadvise + mincore)."""

    PROT_READ, MAP_SHARED = 0x1, 0x01

    def __init__(self) -> None:
        self._libc: Any = None
        if hasattr(os, "posix_fadvise") and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                libc.mmap.restype = ctypes.c_void_p
                libc.mmap.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_size_t,
                    ctypes.c_int,
                    ctypes.c_int,
                    ctypes.c_int,
                    ctypes.c_long,
                ]
                libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
                self._libc = libc
            except (OSError, AttributeError):
                self._libc = None

    @property
    def supported(self) -> bool:
        return self._libc is not None

    def resident_fraction(self, files: list[str]) -> float | None:
        """Share of the files' pages in the page cache (``mincore``), or ``None`` when it cannot be read."""
        if self._libc is None:
            return None
        page = os.sysconf("SC_PAGE_SIZE")
        resident = total = 0
        for name in files:
            size = os.path.getsize(name)
            if size == 0:
                continue
            pages = -(-size // page)
            fd = os.open(name, os.O_RDONLY)
            try:
                address = self._libc.mmap(None, size, self.PROT_READ, self.MAP_SHARED, fd, 0)
                if address in (None, ctypes.c_void_p(-1).value):
                    return None
                try:
                    vector = (ctypes.c_ubyte * pages)()
                    if self._libc.mincore(address, size, vector) != 0:
                        return None
                    resident += sum(v & 1 for v in vector)
                finally:
                    self._libc.munmap(address, size)
            finally:
                os.close(fd)
            total += pages
        return resident / total if total else 0.0

    def drop(self, files: list[str]) -> float:
        """Sync the files and ask the OS to drop their cached pages; return the seconds the syncs took."""
        start = time.perf_counter()
        for name in files:
            fd = os.open(name, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return time.perf_counter() - start


def throughput(rows: int, seconds: float, row_bytes: int) -> dict[str, float]:
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "mb_per_s": rows * row_bytes / seconds / MB}


# ------------------------------------------------------------------------------------------- stores


def expected_rows(data: tuple[np.ndarray, ...], start: int, stop: int, row_order: str) -> tuple[np.ndarray, ...]:
    """The rows a store holds in ``[start, stop)`` (one partition): as given, or stably sorted by target."""
    rows = tuple(a[start:stop] for a in data)
    if row_order == "target":
        order = np.argsort(rows[2], kind="stable")
        rows = tuple(a[order] for a in rows)
    return rows


def round_trips(store: TripleStore, data: tuple[np.ndarray, ...], row_order: str) -> bool:
    """Whether every partition reads back as the rows written (in the store's row order)."""
    for part in store.partitions():
        got = store.read_partition(part)
        want = expected_rows(data, part.start, part.stop, row_order)
        if not all(np.array_equal(a, b) for a, b in zip(got.encoded, want, strict=True)):
            return False
    return True


def read_pass(store: TripleStore) -> tuple[int, int]:
    """Read every partition block by block, as E-step tasks do; return (rows, blocks) read."""
    rows = blocks = 0
    for part in store.partitions():
        for block in store.iter_blocks(part):
            rows += block.num_rows
            blocks += 1
    return rows, blocks


def timed_read(store: TripleStore, row_bytes: int, repeats: int, before: Callable[[], Any] | None = None) -> dict:
    """Best of ``repeats`` read passes (``before`` runs untimed ahead of each), with its CPU / wall share."""
    best: dict[str, Any] | None = None
    for _ in range(repeats):
        if before is not None:
            before()
        cpu = time.process_time()
        seconds, (rows, blocks) = time_once(lambda: read_pass(store))
        cpu = time.process_time() - cpu
        if best is None or seconds < best["seconds"]:
            best = {**throughput(rows, seconds, row_bytes), "blocks": blocks, "cpu_over_wall": cpu / seconds}
    assert best is not None
    return best


def read_memory(store: TripleStore) -> dict[str, Any]:
    """Memory a read pass adds: RSS growth above the process before it (after freeing what earlier work left
    resident), and the peak of the allocations tracemalloc traces (NumPy's included) during a second pass."""
    trimmed = release_free_memory()
    peak_reset = reset_peak_rss()
    # After a reset the high-water mark starts at the current RSS; without one, only growth past the old peak shows.
    before = current_rss_bytes() if peak_reset else None
    before = peak_rss_bytes() if before is None else before
    read_pass(store)
    growth = max(0, peak_rss_bytes() - before)
    # RSS misses what the allocator serves from memory it already holds; tracemalloc sees every NumPy and Python
    # allocation (not those inside C libraries), whoever serves it.
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        read_pass(store)
        traced = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return {
        "rss_growth_bytes": growth,
        "traced_peak_bytes": traced,
        "free_memory_released": trimmed,
        "peak_reset": peak_reset,
    }


def bench_store(
    path: str,
    data: tuple[np.ndarray, ...],
    shape: tuple[int, int, int, int],
    compression: str,
    row_order: str,
    args: argparse.Namespace,
    cache: PageCache,
) -> dict[str, Any]:
    """Write a store of ``data`` ``--repeats`` times (the best kept), then time and measure its reads."""
    num_symbols, _, _, num_targets = shape
    options = WriteOptions(
        compression=compression, row_order=row_order, chunk_rows=args.chunk_rows, partition_rows=args.partition_rows
    )

    def write() -> TripleStore:
        return write_arrays(path, *data, num_symbols=num_symbols, num_targets=num_targets, options=options)

    best_write = None
    store: TripleStore | None = None
    for _ in range(args.repeats):
        shutil.rmtree(path, ignore_errors=True)  # not timed
        seconds, store = time_once(write)
        best_write = seconds if best_write is None else min(best_write, seconds)
    assert store is not None and best_write is not None
    rows, row_bytes = store.num_rows, store.schema.row_bytes
    open_seconds, store = best_of(lambda: TripleStore.open(path), args.repeats)
    on_disk = disk_bytes(path)
    arrays_on_disk = {name: disk_bytes(os.path.join(path, name)) for name in store.schema.array_specs()}
    block_bytes = store.chunk_rows * row_bytes

    figures: dict[str, Any] = {
        "compression": compression,
        "row_order": row_order,
        "rows": rows,
        "partitions": store.num_partitions,
        "chunk_rows": store.chunk_rows,
        "partition_rows": store.partition_rows,
        "round_trip": round_trips(store, data, row_order),
        "write": throughput(rows, best_write, row_bytes),
        "open_seconds": open_seconds,
        "disk_bytes": on_disk,
        "array_disk_bytes": arrays_on_disk,
        "compression_ratio": rows * row_bytes / on_disk,
        "read_warm": timed_read(store, row_bytes, args.repeats),
    }
    memory = read_memory(store)
    memory["block_bytes"] = block_bytes
    memory["rss_growth_blocks"] = memory["rss_growth_bytes"] / block_bytes
    memory["traced_peak_blocks"] = memory["traced_peak_bytes"] / block_bytes
    figures["memory"] = memory

    figures["read_cold"] = None
    figures["cold_resident_fraction"] = None
    figures["sync_seconds"] = None
    if args.cold and cache.supported:
        files = store_files(path)
        resident: list[float | None] = []
        syncs: list[float] = []

        def drop() -> None:
            syncs.append(cache.drop(files))
            resident.append(cache.resident_fraction(files))

        cold = timed_read(store, row_bytes, args.repeats, before=drop)
        worst = None if any(r is None for r in resident) else max(r for r in resident if r is not None)
        figures["cold_resident_fraction"] = worst
        figures["sync_seconds"] = syncs[0]
        if worst is not None and worst <= COLD_RESIDENT_MAX:
            figures["read_cold"] = cold
    return figures


# ------------------------------------------------------------------------------------------- kernel


def kernel_pass(
    model: ResponsibilityAttentionDistribution, parts: list[EncodedRows]
) -> Callable[[], tuple[float, Any]]:
    """A call running ``seq_update`` on each partition into a fresh accumulator (made untimed, as a task makes
    its own); returns the summed ``seq_update`` seconds and the statistics summed over the partitions."""
    factory = model.estimator().accumulator_factory()

    def run() -> tuple[float, Any]:
        total = 0.0
        accumulators = [factory.make() for _ in parts]
        for accumulator, part in zip(accumulators, parts, strict=True):
            start = time.perf_counter()
            accumulator.seq_update(part.encoded, None, model)
            total += time.perf_counter() - start
        return total, summed(accumulators)

    return run


def task_pass(model: ResponsibilityAttentionDistribution, store: TripleStore) -> Callable[[], Any]:
    """A call running whole E-step tasks: per partition, ``iter_blocks`` + ``seq_update`` a block at a time."""
    factory = model.estimator().accumulator_factory()

    def run() -> Any:
        accumulators = [factory.make() for _ in range(store.num_partitions)]
        start = time.perf_counter()
        for accumulator, part in zip(accumulators, store.partitions(), strict=True):
            for block in store.iter_blocks(part):
                accumulator.seq_update(block.encoded, None, model)
        return time.perf_counter() - start, summed(accumulators)

    return run


def summed(accumulators: list[Any]) -> Any:
    total = accumulators[0]
    for other in accumulators[1:]:
        total = total.combine(other.value())
    return total.value()


def best_inner(run: Callable[[], tuple[float, Any]], repeats: int) -> tuple[float, Any]:
    """The shortest of ``repeats`` runs that time themselves."""
    best, out = run()
    for _ in range(repeats - 1):
        seconds, result = run()
        if seconds < best:
            best, out = seconds, result
    return best, out


# ------------------------------------------------------------------------------------------- report


def target_line(compression: str, row_order: str, measured: float) -> dict[str, Any]:
    """The read / kernel target for one store: PASS (``True``) when ``measured < 1/3``."""
    passed = bool(measured < TARGET_READ_OVER_KERNEL)
    return {
        "name": f"{compression}, {row_order} order",
        "compression": compression,
        "row_order": row_order,
        "target": "< 1/3",
        "threshold": TARGET_READ_OVER_KERNEL,
        "measured": measured,
        "pass": passed,
        # How far from the line: headroom below it on a PASS, excess over it on a MISS (always >= 1).
        "margin": TARGET_READ_OVER_KERNEL / measured if passed else measured / TARGET_READ_OVER_KERNEL,
        "headline": (compression, row_order) == HEADLINE,
    }


def format_report(report: dict[str, Any]) -> str:
    """The human-readable tables."""
    cfg, host, cache = report["config"], report["host"], report["page_cache"]
    lines = [
        "dist_respattn triple-store benchmark: write, size, and partition reads vs the E-step kernel (one core)",
        f"  shape      S={cfg['symbols']} N={cfg['context']} D={cfg['dim']} T={cfg['targets']}; {cfg['rows']:,} rows "
        f"of {cfg['row_bytes']} B ({cfg['uncompressed_bytes'] / MB:.1f} MB uncompressed), seed {cfg['seed']}, "
        f"best of {cfg['repeats']}",
        f"  layout     {cfg['chunk_rows']:,} rows a chunk (one block read), {cfg['partition_rows']:,} a partition "
        f"({cfg['partitions']} partitions: one E-step task each)",
        f"  host       os.cpu_count()={host['cpu_count']}; blosc threads {host['blosc_threads']}, zarr max_workers "
        f"{host['zarr_max_workers']}; python {host['python']}, numpy {host['numpy']}, numba {host['numba']}, "
        f"zarr {host['zarr']}, numcodecs {host['numcodecs']}",
        f"  disk       {cfg['dir']} ({cache['filesystem'] or 'file system unknown'})",
        "  page cache warm = local disk, warm cache: each store was just written, so its reads come from the OS",
        "             page cache; write figures are into the page cache too (nothing synced).",
    ]
    if cache["cold"] == "measured":
        lines.append(
            "             cold = after fsync + posix_fadvise(DONTNEED) on every store file, checked with mincore "
            f"(at most {cache['max_resident_fraction']:.1%} of the pages still cached)"
        )
    else:
        lines.append(f"             cold reads not reported: {cache['cold']}")
    lines.append("")

    def fig(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    head1 = (
        f"{'':<18}{'write':>22}{'on disk':>16}{'read, warm cache':>32}{'read, cold':>20}"
        f"{'read / kernel':>16}{'read, MiB':>16}"
    )
    head2 = (
        f"{'store':<18}{'rows/s':>12}{'MB/s':>10}{'MB':>9}{'ratio':>7}{'rows/s':>12}{'MB/s':>10}{'cpu/wall':>10}"
        f"{'rows/s':>12}{'MB/s':>8}{'warm':>8}{'cold':>8}{'RSS+':>8}{'traced':>8}"
    )
    lines += [head1, head2, "-" * len(head2)]
    for s in report["stores"]:
        cold = s["read_cold"]
        mark = " *" if (s["compression"], s["row_order"]) == HEADLINE else ""
        label = f"{s['compression']}, {s['row_order']}{mark}"
        lines.append(
            f"{label:<18}{s['write']['rows_per_s']:>12,.0f}{s['write']['mb_per_s']:>10,.0f}"
            f"{s['disk_bytes'] / MB:>9,.1f}{s['compression_ratio']:>7.2f}"
            f"{s['read_warm']['rows_per_s']:>12,.0f}{s['read_warm']['mb_per_s']:>10,.0f}"
            f"{s['read_warm']['cpu_over_wall']:>10.2f}"
            f"{fig(cold and cold['rows_per_s'], ',.0f'):>12}{fig(cold and cold['mb_per_s'], ',.0f'):>8}"
            f"{s['ratio_warm']:>8.3f}{fig(s['ratio_cold'], '.3f'):>8}"
            f"{s['memory']['rss_growth_bytes'] / MIB:>8.1f}{s['memory']['traced_peak_bytes'] / MIB:>8.1f}"
        )
    lines += [
        "  * the default store (the headline). MB = 10^6 bytes of uncompressed rows; ratio = uncompressed / on disk",
        "    (the last chunk is stored whole, padding included). read / kernel: read seconds of all partitions over",
        "    the kernel seconds on the same rows, in the store's row order. cpu/wall ~1 means one busy core.",
        "",
        "E-step kernel: numba seq_update a partition at a time (a fresh accumulator each), under another random model",
    ]
    head = f"{'row order':<12}{'rows':>12}{'seconds':>10}{'rows/s':>12}   whole task: iter_blocks + seq_update a block"
    lines += [head, "-" * len(head)]
    for order in ROW_ORDERS:
        k, t = report["kernel"][order], report["task"][order]
        lines.append(
            f"{order:<12}{k['rows']:>12,}{k['seconds']:>10.3f}{k['rows_per_s']:>12,.0f}   "
            f"{t['seconds']:.3f} s, {t['rows_per_s']:,.0f} rows/s, {t['over_read_plus_kernel']:.2f}x "
            "(auto read + kernel)"
        )
    lines += [
        f"  agreement (max relative difference of the statistics): target vs input order "
        f"{report['agreement']['target_vs_input']:.1e}, task vs kernel {report['agreement']['task_vs_kernel']:.1e}",
        "",
        "targets: read + decode a partition / E-step kernel on its rows < 1/3 (measured, not asserted; warm cache)",
    ]
    for t in report["targets"]:
        verdict = f"PASS, {t['margin']:.2f}x headroom" if t["pass"] else f"MISS by {t['margin']:.2f}x"
        headline = "   <- headline (the default)" if t["headline"] else ""
        lines.append(f"  {t['name']:<24}{t['measured']:>7.3f}  {verdict}{headline}")
    block = report["stores"][0]["memory"]
    rss = [s["memory"]["rss_growth_blocks"] for s in report["stores"]]
    traced = [s["memory"]["traced_peak_blocks"] for s in report["stores"]]
    lines += [
        "",
        f"memory while reading: a block is {block['block_bytes'] / MIB:.1f} MiB ({cfg['chunk_rows']:,} rows), "
        f"a partition {cfg['partition_rows'] * cfg['row_bytes'] / MIB:.1f} MiB",
        f"  RSS+   = RSS growth of a read pass: {min(rss):.1f} to {max(rss):.1f} blocks (a lower bound: what the",
        "           allocator serves from memory the process already holds resident does not raise RSS)",
        f"  traced = peak of NumPy and Python allocations (tracemalloc) during a pass: {min(traced):.1f} to "
        f"{max(traced):.1f} blocks:",
        "           the previous block (the loop still holds it), the one being read, and zarr's buffers for a chunk",
    ]
    if not (block["free_memory_released"] and block["peak_reset"]):
        lines.append("  (free heap pages or the peak could not be reset: growth the allocator absorbs does not show)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="triples written and read")
    parser.add_argument("--symbols", type=int, default=2000, help="S, the number of symbols")
    parser.add_argument("--context", type=int, default=16, help="N, the context length")
    parser.add_argument("--dim", type=int, default=32, help="D, the query dimension")
    parser.add_argument("--targets", type=int, default=2000, help="T, the number of targets")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models and the rows")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of everything (the best is kept)")
    parser.add_argument("--chunk-rows", type=int, default=None, help="rows a chunk (default: the store's choice)")
    parser.add_argument(
        "--partition-rows", type=int, default=None, help="rows a partition (default: the store's choice)"
    )
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the stores (they are removed by default)")
    parser.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold-cache reads")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure instead")
    args = parser.parse_args(argv)
    for name in ("rows", "symbols", "context", "dim", "targets", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    row_bytes = 4 * args.context + 4 * args.dim + 4
    try:
        choose_chunking(row_bytes, args.chunk_rows, args.partition_rows)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    threads = use_one_thread()
    shape = (args.symbols, args.context, args.dim, args.targets)
    truth = random_distribution(*shape, seed=args.seed)
    # A different model than the generating one, as an EM iteration scores the data.
    model = random_distribution(*shape, seed=args.seed + 1)
    cache = PageCache()

    parent = args.dir
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="bench_store-", dir=parent)
    try:
        # Compile (or load from numba's cache) and exercise every codec before anything is timed.
        warm = truth.sampler(args.seed + 3).sample_arrays(min(WARMUP_ROWS, args.rows), query_dtype=np.float32)
        model.estimator().accumulator_factory().make().seq_update(warm, None, model)
        for compression in COMPRESSION_CHOICES:
            warm_path = os.path.join(workdir, f"warmup-{compression}.zarr")
            options = WriteOptions(compression=compression)
            warm_store = write_arrays(
                warm_path, *warm, num_symbols=args.symbols, num_targets=args.targets, options=options
            )
            read_pass(warm_store)
            shutil.rmtree(warm_path)
        del warm

        data = truth.sampler(args.seed + 2).sample_arrays(args.rows, query_dtype=np.float32)
        stores: list[dict[str, Any]] = []
        for row_order in ROW_ORDERS:
            for compression in COMPRESSION_CHOICES:
                path = os.path.join(workdir, f"{row_order}-{compression}.zarr")
                stores.append(bench_store(path, data, shape, compression, row_order, args, cache))
                if compression != "auto" and not args.keep:
                    shutil.rmtree(path)
        del data

        # The kernel on the rows of the default stores, read back untimed a partition at a time.
        kernel: dict[str, Any] = {}
        task: dict[str, Any] = {}
        statistics: dict[str, Any] = {}
        for row_order in ROW_ORDERS:
            store = TripleStore.open(os.path.join(workdir, f"{row_order}-auto.zarr"))
            parts = [store.read_partition(part) for part in store.partitions()]
            seconds, statistics[row_order] = best_inner(kernel_pass(model, parts), args.repeats)
            kernel[row_order] = {"rows": store.num_rows, "seconds": seconds, "rows_per_s": store.num_rows / seconds}
            del parts
            seconds, statistics[f"task_{row_order}"] = best_inner(task_pass(model, store), args.repeats)
            read = next(s for s in stores if (s["compression"], s["row_order"]) == ("auto", row_order))
            task[row_order] = {
                "rows": store.num_rows,
                "seconds": seconds,
                "rows_per_s": store.num_rows / seconds,
                "over_read_plus_kernel": seconds / (read["read_warm"]["seconds"] + kernel[row_order]["seconds"]),
            }
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    for s in stores:
        k = kernel[s["row_order"]]["seconds"]
        s["ratio_warm"] = s["read_warm"]["seconds"] / k
        s["ratio_cold"] = None if s["read_cold"] is None else s["read_cold"]["seconds"] / k
    targets = [target_line(s["compression"], s["row_order"], s["ratio_warm"]) for s in stores]
    targets.sort(key=lambda t: (not t["headline"], COMPRESSION_CHOICES.index(t["compression"]), t["row_order"]))

    resident = [s["cold_resident_fraction"] for s in stores]
    if not args.cold:
        cold_status = "skipped (--no-cold)"
    elif not cache.supported:
        cold_status = "this platform offers no posix_fadvise / mincore"
    elif all(s["read_cold"] is not None for s in stores):
        cold_status = "measured"
    else:
        cold_status = (
            "the page cache kept the files after fsync + posix_fadvise(DONTNEED) "
            f"(up to {max((r for r in resident if r is not None), default=float('nan')):.0%} of pages still cached)"
        )
        for s in stores:
            s["read_cold"] = s["ratio_cold"] = None

    first = stores[0]
    report = {
        "config": {
            "rows": args.rows,
            "symbols": args.symbols,
            "context": args.context,
            "dim": args.dim,
            "targets": args.targets,
            "seed": args.seed,
            "repeats": args.repeats,
            "chunk_rows": first["chunk_rows"],
            "partition_rows": first["partition_rows"],
            "partitions": first["partitions"],
            "row_bytes": 4 * args.context + 4 * args.dim + 4,
            "uncompressed_bytes": args.rows * (4 * args.context + 4 * args.dim + 4),
            "dir": workdir,
            "kept": args.keep,
            "compression_choices": list(COMPRESSION_CHOICES),
        },
        "host": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
            "zarr": zarr.__version__,
            "numcodecs": numcodecs.__version__,
            **threads,
        },
        "page_cache": {
            "warm": "local disk, warm cache: the store was just written, so reads come from the OS page cache",
            "cold": cold_status,
            "filesystem": filesystem_of(workdir),
            "max_resident_fraction": max((r for r in resident if r is not None), default=None),
        },
        "stores": stores,
        "kernel": kernel,
        "task": task,
        "ratios": {
            c: {s["row_order"]: s["ratio_warm"] for s in stores if s["compression"] == c} for c in COMPRESSION_CHOICES
        },
        "targets": targets,
        "headline": next(t for t in targets if t["headline"]),
        "agreement": {
            "target_vs_input": max_relative_difference(statistics["target"], statistics["input"]),
            "task_vs_kernel": max(max_relative_difference(statistics[f"task_{o}"], statistics[o]) for o in ROW_ORDERS),
        },
    }
    print(json.dumps(report) if args.json else format_report(report))
    return report


if __name__ == "__main__":
    main()
