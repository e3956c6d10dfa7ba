"""A large value taken in by a worker, in Dask's 64 MiB frames and whole: the CPU to turn what a TCP read leaves
(each frame its own buffer) back into the value, side by side.

Dask splits a message's buffers larger than ``distributed.comm.shard`` (64 MiB by default) into frames of that size;
the receiver joins them in a fresh buffer. A sparse fit's E-step value is 8 bytes a support pair (121 MiB at 14.2M
pairs), so each one a worker receives is copied once more. An embedded cluster's workers send values up to 1 GiB whole
(``dist_respattn.engine.cluster.WHOLE_VALUES``). Dask reads the shard size when its comm module is imported, so each
setting is measured in a child process started with ``DASK_DISTRIBUTED__COMM__SHARD``.

Run::

    python benchmarks/bench_frames.py                  # 14.2M pairs (113.6 MB), best and worst of 8
    python benchmarks/bench_frames.py --pairs 9000000 --repeats 2 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

#: The shard sizes compared: Dask's default and what an embedded cluster's workers use.
SHARDS = ("64MiB", "1GiB")


def child(pairs: int, repeats: int) -> dict[str, Any]:
    """In this process (its shard size from the environment): the CPU seconds of each of ``repeats`` receipts of a
    sparse E-step value of ``pairs`` counts, and the frames it travels in."""
    import dask
    import numpy as np
    from distributed.comm.utils import from_frames
    from distributed.protocol import to_serialize
    from distributed.protocol.core import dumps
    from distributed.protocol.utils import host_array

    from dist_respattn.model.emission.layouts import SparseEmissionCounts

    counts = np.random.default_rng(0).random(pairs)
    value = SparseEmissionCounts(counts, None, num_symbols=50_000, num_targets=50_000)
    shard = dask.utils.parse_bytes(dask.config.get("distributed.comm.shard"))
    frames = dumps({"data": to_serialize(value)}, frame_split_size=shard)
    seconds = []
    for _ in range(repeats):
        received = []
        for frame in frames:  # as a TCP read leaves them: each frame its own buffer
            view = memoryview(frame).cast("B")
            buffer = host_array(view.nbytes)
            buffer[:] = view
            received.append(buffer)
        start = time.process_time()
        message = asyncio.run(from_frames(received, deserialize=True, allow_offload=False))
        seconds.append(time.process_time() - start)
        if not np.array_equal(message["data"].counts, counts):
            raise AssertionError("the value taken in differs from the value sent")
    return {"shard": dask.config.get("distributed.comm.shard"), "frames": len(frames), "seconds": seconds}


def measure(shard: str, pairs: int, repeats: int) -> dict[str, Any]:
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__SHARD": shard}
    command = [sys.executable, __file__, "--child", "--pairs", str(pairs), "--repeats", str(repeats)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=14_200_000, help="the value's counts (8 bytes each)")
    parser.add_argument("--repeats", type=int, default=8, help="receipts timed for each shard size")
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.repeats < 1:
        parser.error("--pairs and --repeats take a positive number")
    if args.child:
        print(json.dumps(child(args.pairs, args.repeats)))
        return {}
    results = {shard: measure(shard, args.pairs, args.repeats) for shard in SHARDS}
    print(f"a sparse E-step value of {args.pairs:,} pairs ({8 * args.pairs / 1e6:.1f} MB) taken in, CPU ms "
          f"(best, worst of {args.repeats}):")  # fmt: skip
    for shard, result in results.items():
        best, worst = min(result["seconds"]), max(result["seconds"])
        print(f"  shard {shard:>6}: {result['frames']} frames, {1000 * best:7.1f}, {1000 * worst:7.1f}")
    ratio = min(results["64MiB"]["seconds"]) / min(results["1GiB"]["seconds"])
    print(f"  64 MiB frames / whole: {ratio:.1f}x (best against best)")
    report = {"pairs": args.pairs, "repeats": args.repeats, "results": results, "ratio": ratio}
    if args.json:
        print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
