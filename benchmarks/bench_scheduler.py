"""The Dask scheduler's CPU a task: the figure a fit's task count costs, apart from the work the tasks do.

A scheduler and ``--workers`` workers of one thread, each a process of its own (``python -m distributed.cli.…``),
and a client in this process. Per ``--tasks`` N: N trivial leaf tasks, then a fan-in-4 tree of combines over them
(as a fit's pass and its combine tree), submitted one by one; the scheduler process's user + system CPU seconds
(``/proc/<pid>/stat``) from the first submission to the root's result, a second after it (the releases included),
divided by the tasks.

Run::

    python benchmarks/bench_scheduler.py                      # 2,000, 10,000 and 20,000 leaves on 2 workers
    python benchmarks/bench_scheduler.py --tasks 500 --json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

FAN_IN = 4


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def leaf(i: int) -> int:
    return i


def combine(*values: int) -> int:
    return sum(values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_tree(client: Any, leaves: int, tag: str) -> int:
    """Submit ``leaves`` leaf tasks and their fan-in-4 combine tree; wait for the root. Returns the tasks."""
    level = [client.submit(leaf, i, key=f"leaf-{tag}-{i}") for i in range(leaves)]
    tasks, depth = leaves, 0
    while len(level) > 1:
        level = [
            client.submit(combine, *level[j : j + FAN_IN], key=f"combine-{tag}-{depth}-{j}")
            for j in range(0, len(level), FAN_IN)
        ]
        tasks += len(level)
        depth += 1
    assert level[0].result() == leaves * (leaves - 1) // 2
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="2000,10000,20000", help="leaf tasks a run, comma-separated")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import distributed

    address = f"tcp://127.0.0.1:{free_port()}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
         address.rsplit(":", 1)[1], "--no-dashboard"], **quiet,
    )  # fmt: skip
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--no-dashboard"],
            **quiet,
        )
        for _ in range(args.workers)
    ]
    rows = []
    try:
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(args.workers, timeout=60)
            run_tree(client, 8, "warm")
            for n in (int(t) for t in args.tasks.split(",")):
                cpu, start = process_cpu_seconds(scheduler.pid), time.perf_counter()
                tasks = run_tree(client, n, str(n))
                wall = time.perf_counter() - start
                time.sleep(1.0)  # the releases of the tasks' keys, which the scheduler does too
                seconds = process_cpu_seconds(scheduler.pid) - cpu
                rows.append({"leaves": n, "tasks": tasks, "scheduler_cpu_seconds": seconds,
                             "ms_a_task": 1e3 * seconds / tasks, "wall_seconds": wall,
                             "load": os.getloadavg()[0]})  # fmt: skip
    finally:
        # The workers first, while their scheduler still answers: a worker whose scheduler went away at the same
        # time took about 8 s to exit in one stop of two.
        for group in (workers, [scheduler]):
            for process in group:
                process.terminate()
            for process in group:
                process.wait(timeout=60)
    if args.json:
        print(json.dumps({"workers": args.workers, "runs": rows}))
        return
    for row in rows:
        print(f"{row['tasks']:,} tasks ({row['leaves']:,} leaves and their tree) on {args.workers} workers: "
              f"scheduler CPU {row['scheduler_cpu_seconds']:.2f} s, {row['ms_a_task']:.3f} ms a task; "
              f"wall {row['wall_seconds']:.1f} s; load {row['load']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
