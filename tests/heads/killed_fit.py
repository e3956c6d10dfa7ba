"""A fit that SIGKILLs its own process once iteration K's line is said: a driver killed mid-fit at a known point.

Run as ``python -m tests.heads.killed_fit SPEC_JSON STORE MODEL_DIR SCHEDULER ITERATIONS K [SHARDS]``: the spec is
read from the JSON file ``SPEC_JSON`` (:meth:`HeadSpec.to_json`), the fit runs ``ITERATIONS`` iterations with nothing
held out on the cluster at ``SCHEDULER`` (its M-step in ``SHARDS`` shards on the workers, when given).
Iteration K's checkpoint is submitted to its background writer before the
line is said, so the kill lands while it is written or just after: either way ``--resume`` must finish as the
uninterrupted fit does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import distributed

from dist_respattn.engine import FitSettings, fit
from dist_respattn.model.heads.base import spec_from_json


def main(argv: list[str]) -> None:
    spec_file, store, model_dir, scheduler, iterations, kill_at, *shards = argv
    spec = spec_from_json(json.loads(Path(spec_file).read_text()))
    settings = FitSettings(
        max_iter=int(iterations), tol=0.0, holdout_fraction=0.0, m_step_shards=int(shards[0]) if shards else 0
    )

    def say(line: str) -> None:
        if line.startswith(f"iteration {kill_at}:"):
            os.kill(os.getpid(), signal.SIGKILL)

    with distributed.Client(scheduler, set_as_default=False) as client:
        fit(store, model_dir=model_dir, settings=settings, head=spec, client=client, say=say)


if __name__ == "__main__":
    main(sys.argv[1:])
