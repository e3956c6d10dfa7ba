"""The single head's E-step kernel beside the kernel of another git revision, in one run, on one core each.

The rows are sampled once and written to a temporary folder; one worker process per revision loads them,
compiles its kernel and then runs it whenever asked, the two workers taking turns (``--rounds`` rounds, the
first of each round alternating), so both see the same machine at nearly the same moments. Each prints
rows/s; the report gives both and their ratio (of the best runs and of the medians), and whether the two
kernels' statistics are bit-identical (a SHA-256 over every statistics array).

``--against REV`` exports ``dist_respattn`` of that revision with ``git archive REV dist_respattn`` into the
temporary folder and puts it first on the worker's ``PYTHONPATH`` (its numba cache goes there too, and is
deleted with it); the other worker runs the package beside this script. Without ``--against`` only this
package's kernel is timed.

The kernel timed is ``per_position.accumulate_estep`` on values already checked (no scan of the input): dense
at the reference shape (S = T = 2000, N = 16, D = 32) by default, rows in sampled order, which the kernel
groups by target within each block; ``--layout sparse`` runs a sparse emission at S = T = ``--words`` (default
50,000) over the support of the rows' own pairs, as a fit's start pass finds it.

Run::

    python benchmarks/bench_kernel_speed.py --against main                 # 1,000,000 rows, dense
    python benchmarks/bench_kernel_speed.py --against main --layout sparse # 1,000,000 rows at 50,000 words
    python benchmarks/bench_kernel_speed.py --rows 20000 --symbols 300 --targets 300 --rounds 2 --json   # a smoke run
"""

from __future__ import annotations

import os

# One thread in this process and, through the environment, in the workers.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import IO, Any  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: Rows the worker warms its kernel up on before it says it is ready (compile time is never timed).
WARMUP_ROWS = 4096


# ------------------------------------------------------------------------------------------- inputs


def dense_inputs(args: argparse.Namespace) -> tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(model, (context, query, target))``: rows sampled from one random head, scored by another, as in
    ``bench_kernel.py`` (same seeds, so the same rows)."""
    from bench_kernel import sample_inputs

    from dist_respattn import random_distribution

    shape = (args.symbols, args.context, args.dim, args.targets)
    truth = random_distribution(*shape, seed=args.seed, sigma2=args.sigma2)
    model = random_distribution(*shape, seed=args.seed + 1, sigma2=args.sigma2)
    return model, sample_inputs(truth, args.rows, seed=args.seed + 2)


def sparse_inputs(args: argparse.Namespace) -> tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(model, rows)`` at S = T = ``--words``: contexts and targets drawn Zipf-like (frequent words first),
    random queries near the keys, and a sparse emission over exactly the pairs the rows hold."""
    from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
    from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution

    rng = np.random.default_rng(args.seed)
    words, n, n_pos, dim = args.words, args.rows, args.context, args.dim
    # Cubing a uniform draw puts most of the mass on low ids, as word frequencies do.
    context = np.minimum((words * rng.random((n, n_pos)) ** 3).astype(np.int32), words - 1)
    target = np.minimum((words * rng.random(n) ** 3).astype(np.int32), words - 1)
    key_means = 3.0 * rng.standard_normal((words, dim))
    query = (key_means[context[:, 0]] + rng.standard_normal((n, dim))).astype(np.float32)
    keys = np.unique(target.astype(np.int64)[:, None] * words + context)
    support = PairSupport.from_keys(keys, words, words)
    pair_symbols = support.symbols.astype(np.int64)
    counts = rng.integers(1, 5, size=keys.shape[0]).astype(np.float64)
    values = 0.8 * counts / np.bincount(pair_symbols, weights=counts, minlength=words)[pair_symbols]
    base = np.full(words, 1.0 / words)
    off_base = 1.0 - np.bincount(pair_symbols, weights=base[support.targets], minlength=words)
    backoff = 0.2 / np.maximum(off_base, 1e-300)
    emission = SparseEmission(support, values, backoff, base)
    model = ResponsibilityAttentionDistribution(key_means, emission, rng.dirichlet(np.ones(n_pos)), args.sigma2)
    return model, (context, query, target)


# ------------------------------------------------------------------------------------------- worker


def statistics_digest(stats: Any) -> str:
    """SHA-256 over every statistics array of a ``StatisticArrays`` (bit-identical statistics, same digest)."""
    digest = hashlib.sha256()
    for name in ("key_sum", "key_mass", "emission_count_ts", "position_count", "scalars", "pair_counts"):
        array = getattr(stats, name, None)
        if array is not None:
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def serve(folder: Path) -> None:
    """The worker: load the rows and the model, warm up, then answer each ``run`` line with
    ``wall_seconds cpu_seconds digest`` until stdin closes."""
    import dist_respattn
    from dist_respattn.model.kernels import per_position

    data = tuple(np.load(folder / f"{name}.npy") for name in ("context", "query", "target"))
    with open(folder / "model.pkl", "rb") as f:
        model = pickle.load(f)
    params = model.kernel_parameters
    support = getattr(model.emission_table, "support", None)
    shape = (model.num_symbols, model.context_length, model.query_dim, model.num_targets)

    def run(rows: tuple[np.ndarray, ...]) -> Any:
        stats = per_position.StatisticArrays.zeros(*shape, support=support)
        per_position.accumulate_estep(*rows, None, params, stats, checked=True)
        return stats

    run(tuple(a[:WARMUP_ROWS] for a in data))
    print(f"ready {Path(dist_respattn.__file__).parent}", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        wall, cpu = time.perf_counter(), time.process_time()
        stats = run(data)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{wall!r} {cpu!r} {statistics_digest(stats)}", flush=True)


class Worker:
    """One worker process running the package found at ``source`` (first on its ``PYTHONPATH``)."""

    def __init__(self, label: str, source: Path, folder: Path, env: dict[str, str]) -> None:
        self.label = label
        self.seconds: list[float] = []  # wall-clock
        self.cpu_seconds: list[float] = []  # the worker's CPU time: what a run cost it when others share the core
        self.digests: set[str] = set()
        env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(source), str(HERE)])}
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve", str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.package = self._read().removeprefix("ready ")

    def _read(self) -> str:
        stdout: IO[str] | None = self.process.stdout
        line = stdout.readline() if stdout is not None else ""
        if not line:
            raise SystemExit(f"bench_kernel_speed: error: the {self.label} worker exited ({self.process.wait()})")
        return line.strip()

    def run(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        seconds, cpu_seconds, digest = self._read().split()
        self.seconds.append(float(seconds))
        self.cpu_seconds.append(float(cpu_seconds))
        self.digests.add(digest)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def export_revision(revision: str, into: Path) -> Path:
    """``dist_respattn`` of git revision ``revision`` extracted under ``into``; returns the folder to import from."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "dist_respattn"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        message = archive.stderr.decode(errors="replace").strip()
        raise SystemExit(f"bench_kernel_speed: error: --against {revision}: {message}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


# ------------------------------------------------------------------------------------------- report


def figures(worker: Worker, rows: int) -> dict[str, Any]:
    """Rows/s of a worker's best and median runs, by wall clock and by its CPU time."""
    return {
        "package": worker.package,
        "seconds": worker.seconds,
        "cpu_seconds": worker.cpu_seconds,
        "best_rows_per_s": rows / min(worker.seconds),
        "median_rows_per_s": rows / statistics.median(worker.seconds),
        "best_rows_per_cpu_s": rows / min(worker.cpu_seconds),
        "median_rows_per_cpu_s": rows / statistics.median(worker.cpu_seconds),
        "ns_per_row_best_cpu": 1e9 * min(worker.cpu_seconds) / rows,
        "digest": sorted(worker.digests),
    }


def ratios(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """How many times faster ours ran than theirs: best against best, median against median, round by round."""
    return {
        "best": min(theirs) / min(ours),
        "median": statistics.median(theirs) / statistics.median(ours),
        "per_round": [b / a for a, b in zip(ours, theirs, strict=True)],
    }


def format_report(report: dict[str, Any]) -> str:
    cfg = report["config"]
    if cfg["layout"] == "sparse":
        shape = f"sparse, S = T = {cfg['words']:,}, {report['pairs']:,} pairs"
    else:
        shape = f"dense, S = {cfg['symbols']}, T = {cfg['targets']}"
    lines = [
        "single-head E-step kernel, one core a worker, workers taking turns",
        f"  {shape}, N = {cfg['context']}, D = {cfg['dim']}; {cfg['rows']:,} rows in sampled order, "
        f"{cfg['rounds']} rounds",
        "",
        "rows/s by wall clock and by the worker's CPU time (best and median of the rounds); ns/row: best, CPU",
        f"{'kernel':<28}{'best wall':>12}{'median wall':>13}{'best CPU':>12}{'median CPU':>12}{'ns/row':>8}",
    ]
    for key, label in (("ours", "this tree"), ("against", f"--against {cfg['against']}")):
        fig = report.get(key)
        if fig is not None:
            lines.append(
                f"{label:<28}{fig['best_rows_per_s']:>12,.0f}{fig['median_rows_per_s']:>13,.0f}"
                f"{fig['best_rows_per_cpu_s']:>12,.0f}{fig['median_rows_per_cpu_s']:>12,.0f}"
                f"{fig['ns_per_row_best_cpu']:>8.0f}"
            )
    if report.get("against") is not None:
        lines.append("")
        for key, clock in (("ratios_cpu", "CPU time"), ("ratios", "wall clock")):
            r = report[key]
            lines.append(
                f"this tree / {cfg['against']} by {clock}: {r['best']:.2f}x (best runs), {r['median']:.2f}x (medians); "
                f"per round {', '.join(f'{x:.2f}' for x in r['per_round'])}"
            )
        lines.append(f"statistics bit-identical: {'yes' if report['identical'] else 'NO'}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--against", metavar="REV", help="a git revision whose kernel runs beside this tree's")
    parser.add_argument("--layout", choices=("dense", "sparse"), default="dense", help="the emission's layout")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows each kernel runs on")
    parser.add_argument("--symbols", type=int, default=2000, help="S of a dense emission")
    parser.add_argument("--targets", type=int, default=2000, help="T of a dense emission")
    parser.add_argument("--words", type=int, default=50_000, help="S = T of a sparse emission")
    parser.add_argument("--context", type=int, default=16, help="N, the context length")
    parser.add_argument("--dim", type=int, default=32, help="D, the query dimension")
    parser.add_argument("--sigma2", type=float, default=1.0, help="gate variance")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models and the rows")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each kernel, taking turns")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--serve", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rows", "symbols", "targets", "words", "context", "dim", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.serve:
        serve(Path(args.serve))
        return None
    sys.path.insert(0, str(REPO))
    model, data = sparse_inputs(args) if args.layout == "sparse" else dense_inputs(args)
    with tempfile.TemporaryDirectory(prefix="bench-kernel-speed-") as tmp:
        folder = Path(tmp)
        for name, array in zip(("context", "query", "target"), data, strict=True):
            np.save(folder / f"{name}.npy", array)
        with open(folder / "model.pkl", "wb") as f:
            pickle.dump(model, f)
        del data
        workers = [Worker("this tree's", REPO, folder, {})]
        if args.against:
            source = export_revision(args.against, folder / "against")
            cache = {"NUMBA_CACHE_DIR": str(folder / "against-numba-cache")}
            workers.append(Worker(f"--against {args.against}", source, folder, cache))
        try:
            for round_index in range(args.rounds):
                # Alternate who goes first, so neither always runs right after the other.
                for worker in workers if round_index % 2 == 0 else workers[::-1]:
                    worker.run()
        finally:
            for worker in workers:
                worker.close()
    report: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("serve", "json")},
        "pairs": int(getattr(model.emission_table, "support", None).num_pairs) if args.layout == "sparse" else None,
        "ours": figures(workers[0], args.rows),
        "against": None,
    }
    if args.against:
        ours, theirs = workers
        report["against"] = figures(theirs, args.rows)
        report["ratios"] = ratios(ours.seconds, theirs.seconds)
        report["ratios_cpu"] = ratios(ours.cpu_seconds, theirs.cpu_seconds)
        report["identical"] = len(ours.digests | theirs.digests) == 1
    print(json.dumps(report) if args.json else format_report(report))
    return report


if __name__ == "__main__":
    main()
