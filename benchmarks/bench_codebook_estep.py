"""The codebook head's E-step side by side with another revision's, and the N = 8 single head's, in one process.

On the rating histories of ``bench_long_context.py`` (the train users' items as one stream, full windows, the same
random heads as its kernel part): the N = 8 single head's per-position E-step over its rows, and the codebook head's
(N0 = 8, B x W cells) at N over the first R rows for each R of ``--rows``, this revision's ``codebook_statistics``
and, with ``--previous PATH`` (a copy of another revision's ``dist_respattn/model/heads/codebook/kernels.py``, e.g.
``git show main:dist_respattn/model/heads/codebook/kernels.py > /tmp/kernels_main.py``), that file's E-step, loaded
as a module of its own. The kernels take turns, each first in turn; each figure is the best of ``--repeats`` runs in
CPU time (``time.process_time``), one call per run. Prints rows/s, ns a row, and each over the N = 8 head's rows/s.
With ``--parts``, also this revision's pass over each block timed part by part (wall time, the least of
``--repeats`` passes a part), in ns a row.

    python benchmarks/bench_codebook_estep.py --cache CACHE --previous /tmp/kernels_main.py --rows 8192,65536
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_long_context as blc


def load_previous(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("previous_codebook_kernels", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--previous {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def previous_statistics(module: Any, head: Any, rows: Any) -> Callable[[], list[np.ndarray]]:
    """``codebook_statistics`` of one block as the previous revision made it, with its kernels (its statistics'
    arrays as its kernels fill them)."""
    params, tables = module.CodebookParameters.build(head), module.EstepTables.build(head)
    s, _, d, t = head.shape

    def run() -> list[np.ndarray]:
        arrays = module.CodebookArrays.zeros(s, d, t, head.near_window, head.num_codebooks, head.num_codewords)
        head.check_rows(rows)  # as this revision's codebook_statistics does
        module.codebook_estep(rows, params, tables, arrays)
        if hasattr(module, "far_masses"):
            module.far_masses(arrays)
        return [np.asarray(a) for a in arrays.fields()]  # the codeword counts target-major, (T, B, W), as here

    return run


def pass_parts(head: Any, rows: Any, repeats: int) -> dict[str, float]:
    """Seconds of each part of this revision's ``codebook_statistics`` over ``rows`` (one block), the least of
    ``repeats`` passes, the parts run as it runs them."""
    from dist_respattn.model.heads.codebook import kernels as k

    params, tables = head.parameters, head.estep_tables
    s, _, d, t = head.shape
    cells = head.num_codebooks * head.num_codewords
    size = rows.query_table.shape[0]
    best: dict[str, float] = {}
    for _ in range(repeats):
        with k.near_table(s, t) as table:
            at = time.perf_counter()

            def done_with(name: str) -> None:
                nonlocal at
                now = time.perf_counter()
                best[name] = min(best.get(name, float("inf")), now - at)
                at = now

            arrays = k.CodebookArrays.zeros(s, d, t, head.near_window, head.num_codebooks, head.num_codewords,
                                            table.counts)  # fmt: skip
            done_with("the statistics' new arrays")
            head.check_rows(rows)
            kernel_rows = rows.kernel_arrays()
            gates, shifts = tables.query_gates(rows.query_table, params.inv_two_sigma2)
            done_with("the rows checked, the kept gates' table compared")
            kept, k._SCRATCH.code_query = k._SCRATCH.code_query, None
            code_query = kept if kept is not None and kept.shape == (size, cells) else np.zeros((size, cells))
            done = np.zeros(size, dtype=np.bool_)
            touched = np.empty(rows.num_rows * (params.prior.shape[0] - 1), dtype=np.uint32)
            p = params
            n_touched = k._estep(
                *kernel_rows, p.key_means, p.inv_two_sigma2, p.gate_const, p.prior, p.log_prior, p.log_omega,
                p.log_emission_ts, p.log_code_ts, tables.flat_codes, tables.flat_means, tables.code_ts,
                arrays.key_sum, arrays.key_mass, arrays.emission_count, arrays.code_sum.reshape(cells, d),
                arrays.code_count.reshape(-1, cells), arrays.prior_mass, arrays.scalars, gates.reshape(-1, cells),
                shifts, done, code_query, touched,
            )  # fmt: skip
            arrays.touched.append(touched[:n_touched])
            done_with("the rows (the compiled E-step)")
            k._query_sums(code_query, done, rows.query_table, arrays.code_sum.reshape(cells, d))
            k._SCRATCH.code_query = code_query
            done_with(f"the query sums ({int(done.sum()):,} of {size:,} query-table rows used)")
            k.far_masses(arrays)
            done_with("the far masses")
            k.take_near_counts(arrays, table)
            done_with(f"the {n_touched:,} listed near cells sorted, read and cleared")
    return best


def cpu_best(run: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dist-respattn-corpus-cache"))
    parser.add_argument("--work", help="where the stores go (default: a temporary directory)")
    parser.add_argument("--previous", help="another revision's codebook kernels.py to time beside this one")
    parser.add_argument("--context", type=int, default=1024, help="the codebook head's window N")
    parser.add_argument("--rows", default="8192,65536", help="rows of the codebook head's timed blocks")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each kernel (the best is kept)")
    parser.add_argument("--near-window", type=int, default=8)
    parser.add_argument("--codebooks", type=int, default=8)
    parser.add_argument("--codewords", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", action="store_true", help="also time this revision's pass part by part")
    args = parser.parse_args(argv)
    from dist_respattn.model.heads.base import Block
    from dist_respattn.model.heads.codebook.kind import codebook_statistics
    from dist_respattn.store.streams.reader import TokenStreamStore

    corpus_args = blc.parse_args(["--cache", args.cache, "--no-stdlib"])
    with tempfile.TemporaryDirectory(prefix="bench-codebook-estep-") as temp:
        work = Path(args.work or temp)
        corpus = blc.write_stores(corpus_args, work / "stores")
        location = corpus["stores"]["train_stream"].location.with_min_context(None)
        short = TokenStreamStore.open(location, blc.REFERENCE_CONTEXT)
        encoded = short.read_rows(0, short.num_rows)
        single = blc.tied_head(short.schema.num_symbols, blc.REFERENCE_CONTEXT, seed=args.seed)
        factory = single.estimator().accumulator_factory(layout="dense")
        batch = (encoded.context, encoded.query, encoded.target)

        def single_run() -> None:
            factory.make(None).seq_update(batch, None, single, checked=True)

        single_run()
        store = TokenStreamStore.open(location, args.context)
        model = blc.tied_head(store.schema.num_symbols, args.context, seed=args.seed)
        corpus_args.near_window, corpus_args.codebooks, corpus_args.codewords = (
            args.near_window, args.codebooks, args.codewords,
        )  # fmt: skip
        head = blc.codebook_head_for(corpus_args, model, args.context)
        previous = load_previous(args.previous) if args.previous else None
        print(f"load average before: {os.getloadavg()}")
        for n in [int(v) for v in args.rows.split(",")]:
            n = min(n, store.num_rows)
            windows = store.read_windows(0, n)
            blocks = [Block(windows, None)]

            def new_run(blocks: list[Any] = blocks) -> Any:
                return codebook_statistics(head, blocks)

            runs: dict[str, Callable[[], Any]] = {"this revision": new_run}
            if previous is not None:
                old_run = previous_statistics(previous, head, windows)
                runs["previous"] = old_run
                st = new_run()
                mine = [np.asarray(getattr(st, f.name)) for f in dataclasses.fields(st)]
                worst = max(
                    float(np.max(np.abs(a - b), initial=0.0)) / max(float(np.max(np.abs(b), initial=0.0)), 1e-300)
                    for a, b in zip(mine, old_run(), strict=True)
                )
                print(
                    f"  {n:,} rows: largest difference from the previous revision over its field's largest {worst:.1e}"
                )
            runs["single"] = single_run
            best = {name: float("inf") for name in runs}
            names = list(runs)
            for i in range(args.repeats):  # the kernels take turns, each first in turn (what a call allocates
                # and frees moves the next call's cost)
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    best[name] = min(best[name], cpu_best(runs[name], 1))
            if args.parts:
                codebook_statistics(head, blocks)  # the thread's tables and the head's gates made
                parts = pass_parts(head, windows, args.repeats)
                print(f"  codebook N = {args.context}, {n:,} rows, this revision's pass part by part (wall time):")
                for part, seconds in parts.items():
                    print(f"    {1e9 * seconds / n:7.1f} ns a row  {part}")
                print(f"    {1e9 * sum(parts.values()) / n:7.1f} ns a row  in all")
            best_single = best.pop("single")
            single_rate = encoded.target.shape[0] / best_single
            print(
                f"N = {blc.REFERENCE_CONTEXT} single head, {encoded.target.shape[0]:,} rows: {single_rate:,.0f} rows/s "
                f"({1e9 / single_rate:.0f} ns a row)"
            )
            for name, seconds in best.items():
                rate = n / seconds
                print(
                    f"  codebook N = {args.context}, {n:,} rows, {name}: {rate:,.0f} rows/s "
                    f"({1e9 / rate:.0f} ns a row), {rate / single_rate:.3f}x the N = {blc.REFERENCE_CONTEXT} head"
                )
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
