"""A staged fit keeps one copy of each part in the driver: the stack's components are the heads its earlier stages
ended with (not loaded again), equal to their checkpoints, and what each stage's passes cached on its head is dropped
when the stage ends (built again on use, to the same scores)."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.engine import FitSettings, fit
from dist_respattn.engine.fit import _load_sources
from dist_respattn.model.caches import release_caches
from dist_respattn.model.heads.base import Block
from dist_respattn.model.heads.recipe import RecipeSpec
from dist_respattn.model.heads.repeat import RepeatHead
from dist_respattn.model.heads.stack import StackHead, StackSpec
from dist_respattn.store import TokenStreamStore, WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.model.test_copy import windows_of


def cached(obj: object) -> list[str]:
    names = {n for k in type(obj).__mro__ for n, a in vars(k).items() if isinstance(a, functools.cached_property)}
    return sorted(names & set(vars(obj)))


@pytest.mark.slow
def test_the_stack_stage_reads_the_earlier_stages_heads_and_their_caches_are_dropped(tmp_path: Path, client) -> None:
    tokens = np.random.default_rng(0).integers(0, 12, 3000)
    tokens[1::7] = tokens[::7][: tokens[1::7].size]
    options = WriteOptions(chunk_rows=512, partition_rows=1024)
    write_stream_tokens(tmp_path / "train.zarr", tokens, 16, num_symbols=12, dim=3, seed=0, options=options)
    model = tmp_path / "model"
    result = fit(tmp_path / "train.zarr", model_dir=model, settings=FitSettings(max_iter=1, context_length=16),
                 head=RecipeSpec(), client=client, progress=False)  # fmt: skip
    gated = result.model
    assert isinstance(gated, RepeatHead)  # 12 targets: the recipe's repeat gate goes over its stack
    stack = gated.base
    assert isinstance(stack, StackHead)
    by_kind = {stage.model.kind: stage.model for stage in result.stages}
    assert by_kind["stack"] is stack
    # One object per part in the driver: the stack's components are the stages' own heads...
    for component in stack.components:
        assert component is by_kind[component.kind]
    # ... which are what their checkpoints hold (loading them gives equal arrays), the stack's checkpoint too.
    for stage in result.stages:
        mine, _ = stage.model.to_arrays()
        theirs, _ = load_checkpoint(stage.model_dir).model.to_arrays()
        assert mine.keys() == theirs.keys()
        for name in mine:
            np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
    saved = load_checkpoint(model / "stack").model
    np.testing.assert_array_equal(saved.gate, stack.gate)
    # The stages' heads keep no cache of their fit's passes (kernel tables are built again when used).
    for head in by_kind.values():
        assert cached(head) == [] and cached(head.single if hasattr(head, "single") else head) == []
    # Built again on use, to the same scores as a fresh load's.
    rows = windows_of(tokens, [0], 16, TokenStreamStore.open(tmp_path / "train.zarr").embeddings())
    before = stack.score([Block(rows, None)])
    assert before == saved.score([Block(rows, None)])
    release_caches(stack)
    assert cached(stack) == [] and stack.score([Block(rows, None)]) == before


def test_a_stage_whose_best_is_not_its_latest_is_loaded_from_its_checkpoint(tmp_path: Path, client) -> None:
    """The head a stage ended with stands for its directory only when loading would give it (no other best)."""
    tokens = np.random.default_rng(1).integers(0, 6, 400)
    write_stream_tokens(tmp_path / "train.zarr", tokens, 4, num_symbols=6, dim=2, seed=0)
    train = TokenStreamStore.open(tmp_path / "train.zarr")
    settings = FitSettings(max_iter=1, context_length=4)
    result = fit(tmp_path / "train.zarr", model_dir=tmp_path / "a", settings=settings, client=client, progress=False)
    other = fit(tmp_path / "train.zarr", model_dir=tmp_path / "b", settings=FitSettings(max_iter=3, context_length=4),
                client=client, progress=False)  # fmt: skip
    spec = StackSpec((str(tmp_path / "a"),), "target")
    held = {os.path.normpath(str((tmp_path / "a").resolve())): result.model}
    assert _load_sources(spec, train, str(tmp_path), held)[0] is result.model
    # Another checkpoint named best: loading gives that one, so it is loaded.
    name = next(p.name for p in (tmp_path / "b").iterdir() if p.name.startswith("ckpt-"))
    shutil.copytree(tmp_path / "b" / name, tmp_path / "a" / name)
    (tmp_path / "a" / "best.json").write_text(json.dumps({"checkpoint": name, "iteration": 3}))
    loaded = _load_sources(spec, train, str(tmp_path), held)[0]
    assert loaded is not result.model
    np.testing.assert_array_equal(loaded.to_arrays()[0]["key_means"], other.model.to_arrays()[0]["key_means"])


def test_the_conj_and_copy_kernels_read_the_single_heads_own_log_tables() -> None:
    """One copy of ``log B`` a process: the conjunction and copy heads' kernel parameters are the single head's
    log tables themselves (the same logarithms, so the same scores)."""
    from dist_respattn.model.emission.layouts import PairSupport
    from dist_respattn.model.heads.copy import CopyHead
    from tests.model.test_conj import random_conj_head, stream_rows

    rows, _ = stream_rows(3, 4)
    conj = random_conj_head((6, 4, 2, 6), rows, 2, 4, sparse=True)
    single = conj.single
    copy = CopyHead(single, np.full(4, 0.1), np.full(4, 0.2))
    for params in (conj.parameters, copy.parameters):
        for name in ("log_values", "log_backoff", "log_base"):
            assert getattr(params, name) is getattr(single.kernel_parameters, name), name
    assert isinstance(single.emission_table.support, PairSupport)
    before = conj.score([Block(rows, None)])
    release_caches(conj)
    assert conj.score([Block(rows, None)]) == before
