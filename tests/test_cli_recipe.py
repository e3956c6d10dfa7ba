"""``fit --head recipe``: the stages it makes of a window, where each starts from, and one real fit of them all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.cli import build_parser, main
from dist_respattn.cli.fit_commands import default_spec, settings_from
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.engine import FitSettings, open_store
from dist_respattn.engine.fit import FitError, stage_start
from dist_respattn.model.fitting.holdout import HoldoutRule
from dist_respattn.model.heads.base import PREVIOUS_STAGE, Stage, spec_from_json
from dist_respattn.model.heads.conj import ConjHead
from dist_respattn.model.heads.conj.kind import ConjSpec
from dist_respattn.model.heads.copy.kind import CopySpec
from dist_respattn.model.heads.recipe import RecipeSpec
from dist_respattn.model.heads.repeat import RepeatHead
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.stack import StackHead, StackSpec
from dist_respattn.store import TokenStreamStore, TripleStore, WriteOptions, write_synthetic
from dist_respattn.store.ingest.to_stream import write_stream_tokens


def parsed(*flags: str) -> object:
    return build_parser().parse_args(["fit", "train.zarr", "--model-dir", "model", *flags])


def test_the_recipe_fixes_its_buckets_and_short_window_from_the_rows_window() -> None:
    spec = spec_from_args(parsed("--head", "recipe"), SingleHopSpec(), None)
    assert spec == RecipeSpec(SingleHopSpec(), None, 8, "target")
    assert spec.window_dependent
    assert spec.for_window(512).buckets == 10  # 1, 1, 2, ..., 256: every geometric bucket of 512 positions
    assert spec.for_window(32).buckets == 6
    assert spec.for_window(4).short_context == 4  # never longer than the rows' window
    given = spec_from_args(parsed("--head", "recipe", "--position-buckets", "3"), SingleHopSpec(position_buckets=3),
                           None)  # fmt: skip
    assert given.for_window(512).buckets == 3
    concrete = spec.for_window(64)
    assert spec_from_json(json.loads(json.dumps(concrete.to_json()))) == concrete


def test_the_recipe_stages_start_where_each_part_needs() -> None:
    single, copy, conj, stack = RecipeSpec(SingleHopSpec(sigma2=0.5)).for_window(64).stages()
    assert single == Stage(SingleHopSpec(sigma2=0.5, position_buckets=7), "single", {"position_buckets": 7})
    assert isinstance(copy.spec, CopySpec) and copy.spec.single == single.spec
    assert (copy.directory, copy.start_from) == ("copy", PREVIOUS_STAGE)  # continues the long single head
    assert isinstance(conj.spec, ConjSpec) and conj.spec.single.position_buckets is None and conj.spec.order == 3
    old = RecipeSpec(SingleHopSpec(sigma2=0.5)).for_window(64).to_json()
    del old["conj_order"]  # a recipe recorded before the order: resumed as it was fitted
    assert spec_from_json(old).stages()[2].spec.order == 2  # type: ignore[attr-defined]
    assert (conj.directory, conj.start_from, conj.settings["context_length"]) == ("conj", None, 8)  # its own start
    assert stack.spec == StackSpec(
        ("conj", "copy", "single"), "target"
    )  # the stages' models, under the fit's directory
    assert (stack.directory, stack.start_from) == (".", None)


def test_the_recipe_puts_a_repeat_gate_over_its_stack_where_the_targets_are_few_enough() -> None:
    from dist_respattn.model.heads.recipe.kind import RECIPE_REPEAT_MAX_TARGETS
    from dist_respattn.model.heads.repeat import RepeatSpec

    spec = RecipeSpec(SingleHopSpec(sigma2=0.5))
    *parts, stack, gate = spec.for_window(64, num_targets=RECIPE_REPEAT_MAX_TARGETS).stages()
    assert [p.directory for p in parts] == ["single", "copy", "conj"]
    assert (stack.directory, stack.spec) == ("stack", StackSpec(("conj", "copy", "single"), "target"))
    assert (gate.directory, gate.spec, gate.start_from) == (".", RepeatSpec("stack"), None)
    assert gate.settings["context_length"] == 100_000 and gate.settings["max_iter"] == 1
    # More targets: no gate (its E-step sums the stack's (T,) distribution a row); the stack is the model itself.
    assert [s.directory for s in spec.for_window(64, num_targets=RECIPE_REPEAT_MAX_TARGETS + 1).stages()][-1] == "."
    assert len(spec.for_window(64, num_targets=RECIPE_REPEAT_MAX_TARGETS + 1).stages()) == 4
    # Said by hand, or recorded: a recipe recorded before it had the gate resumes without one.
    assert len(RecipeSpec(SingleHopSpec(), repeat=False).for_window(64, num_targets=10).stages()) == 4
    old = spec.for_window(64, num_targets=10).to_json()
    assert old["repeat"] is True
    del old["repeat"]
    assert spec_from_json(old).repeat is False  # type: ignore[attr-defined]
    resumed = spec_from_args(parsed("--head", "recipe"), SingleHopSpec(), old)
    assert isinstance(resumed, RecipeSpec) and resumed.repeat is False and resumed.conj_order == 3


def test_a_stage_starts_from_the_stage_it_names() -> None:
    stages = [Stage(SingleHopSpec(), "a"), Stage(SingleHopSpec(), "b", start_from=None),
              Stage(SingleHopSpec(), "c", start_from="a"), Stage(SingleHopSpec(), "d")]  # fmt: skip
    directories = ["m/a", "m/b", "m/c", "m/d"]
    assert [stage_start(stages, directories, i) for i in (1, 2, 3)] == [None, "m/a", "m/c"]
    with pytest.raises(FitError, match="stage 'b' starts from 'z', which is no earlier stage"):
        stage_start([stages[0], Stage(SingleHopSpec(), "b", start_from="z")], directories, 1)


def test_fit_picks_the_recipe_on_a_token_stream_store_when_nothing_picks_a_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``--head``, no kind's options, nothing to resume or start from: the recipe on a token stream, the single
    head on a store of fixed windows; any of those flags keeps what it asks for."""
    write_stream_tokens(tmp_path / "s.zarr", np.arange(200) % 7, 4, num_symbols=7, dim=2, seed=0)
    write_synthetic(tmp_path / "t.zarr", 50, num_symbols=7, context_length=4, query_dim=2, num_targets=7)
    stream, triples = TokenStreamStore.open(tmp_path / "s.zarr"), TripleStore.open(tmp_path / "t.zarr")

    def picked(store: object, *flags: str) -> object:
        args = parsed(*flags)
        settings = settings_from(args, FitSettings())
        return default_spec(args, settings, spec_from_args(args, settings.head_spec(), None), store)

    assert picked(stream) == RecipeSpec(SingleHopSpec(), None, 8, "target")
    assert "fitting --head recipe, the default on a token-stream store" in capsys.readouterr().err
    assert picked(stream, "--position-buckets", "3") == RecipeSpec(SingleHopSpec(position_buckets=3), 3, 8, "target")
    assert picked(triples) == SingleHopSpec()
    assert picked(stream, "--head", "single") == SingleHopSpec()
    assert picked(stream, "--mixture-components", "2").kind == "mixture"
    assert picked(stream, "--init-from", str(tmp_path / "old")) == SingleHopSpec()
    monkeypatch.chdir(tmp_path)  # parsed() fits into "model": nothing there to resume
    assert picked(stream, "--resume") == RecipeSpec(SingleHopSpec(), None, 8, "target")


def test_fit_help_says_what_it_fits_on_either_kind_of_store() -> None:
    """``fit --help`` said it fits "a triple store": it fits either kind, the recipe by default on a token stream."""
    import subprocess

    from tests.test_cli import COMMAND

    helped = subprocess.run([COMMAND, "fit", "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert helped.returncode == 0, helped.stderr
    text = " ".join(helped.stdout.split())
    assert "to a triple store" not in text
    assert "by default the recipe on a token-stream store (--head single: one head alone), one head on a triple " in (
        text
    )


@pytest.mark.slow
def test_one_fit_of_the_recipe_leaves_each_part_and_a_stack_of_them(tmp_path: Path, one_worker_address: str) -> None:
    """Every stage on one cluster (one iteration each): the parts in their directories, the stack in ``stack/`` (its
    gate learned on the validation store) and the repeat gate over it in the model directory (evaluate reads it
    alone)."""
    tokens = np.random.default_rng(0).integers(0, 12, 3000)
    tokens[1::7] = tokens[::7][: tokens[1::7].size]  # some repetition for the copy head to find
    options = WriteOptions(chunk_rows=512, partition_rows=1024)
    for name, part in (("train", tokens[:2400]), ("validation", tokens[2400:])):
        write_stream_tokens(tmp_path / f"{name}.zarr", part, 16, num_symbols=12, dim=3, seed=0, options=options)
    model = tmp_path / "model"
    # The shared cluster serves the three commands (with --workers each would start its own, a few seconds apiece).
    address = one_worker_address
    # No --head: the recipe is what fit picks on a token-stream store.
    status = main(["fit", str(tmp_path / "train.zarr"), "--validation", str(tmp_path / "validation.zarr"),
                   "--model-dir", str(model), "--max-iter", "1", "--scheduler", address])  # fmt: skip
    assert status == 0
    for part, kind in (("single", "single_hop"), ("copy", "copy"), ("conj", "conj")):
        assert load_checkpoint(model / part).model.kind == kind, part
    # 12 targets: over the stack (in stack/) a repeat gate over each row's whole document, in the model directory.
    gated = load_checkpoint(model).model
    assert isinstance(gated, RepeatHead) and gated.context_length == 100_000
    head = load_checkpoint(model / "stack").model
    assert isinstance(head, StackHead) and [c.kind for c in head.components] == ["conj", "copy", "single_hop"]
    assert head.windows == (8, 16, 16) and head.gate.sum() == pytest.approx(1.0)
    np.testing.assert_array_equal(gated.base.gate, head.gate)
    record = json.loads((model / "fit.json").read_text())
    assert record["head"]["kind"] == "recipe" and record["head"]["buckets"] == 5 and record["head"]["repeat"]
    # predict ranks the rows evaluate scores: the short histories too (the long parts were fitted on them).
    out = tmp_path / "p.jsonl"
    assert main(["predict", str(model), str(tmp_path / "validation.zarr"), "--out", str(out), "--top", "2",
                 "--scheduler", address]) == 0  # fmt: skip
    rows = open_store(tmp_path / "validation.zarr", window=16, min_context=1).num_rows
    assert len(out.read_text().splitlines()) == rows > open_store(tmp_path / "validation.zarr", window=16).num_rows

    # A warm start from it (retraining) fits a recipe again, its first part from the first part's model.
    again = tmp_path / "again"
    status = main(["fit", str(tmp_path / "train.zarr"), "--validation", str(tmp_path / "validation.zarr"),
                   "--model-dir", str(again), "--init-from", str(model), "--max-iter", "1",
                   "--scheduler", address])  # fmt: skip
    assert status == 0
    assert json.loads((again / "fit.json").read_text())["head"]["kind"] == "recipe"
    assert load_checkpoint(again / "single").meta["init"]["source"] == str(model / "single")
    assert load_checkpoint(again).meta["fit_head"]["kind"] == "recipe"  # what a registry version of it keeps


@pytest.mark.slow
def test_without_a_validation_store_every_stage_holds_out_the_same_tokens(
    tmp_path: Path, one_worker_address: str
) -> None:
    """The recipe's parts read the stream at two windows (the conjunction head at N = 8, full windows only; the long
    heads at N with short histories), so a row number is another token in each. Their hold-out numbers rows as the
    stream's: the stack's gate is fitted on held-out rows that no part was fitted on. The conjunction head counts its
    rows from the data, so its counts are exactly the tally of the rows it was fitted on: none held out by the stack."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(150, 400, 14)  # many documents: each shifts the two windows' row numbers apart
    tokens = rng.integers(0, 12, int(lengths.sum()))
    tokens[1::5] = tokens[::5][: tokens[1::5].size]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    write_stream_tokens(tmp_path / "train.zarr", tokens, 16, num_symbols=12, dim=3, seed=0, documents=starts)
    model = tmp_path / "model"
    status = main(["fit", str(tmp_path / "train.zarr"), "--model-dir", str(model), "--max-iter", "1",
                   "--scheduler", one_worker_address])  # fmt: skip
    assert status == 0
    rules = {part: load_checkpoint(model / part).meta["holdout"] for part in ("single", "copy", "conj", "stack")}
    assert all(rule == rules["stack"] and rule["numbering"] == "stream" for rule in rules.values()), rules
    held = HoldoutRule.from_json(rules["stack"])
    conj = load_checkpoint(model / "conj").model
    assert isinstance(conj, ConjHead) and conj.context_length == 8
    expected: dict[tuple[int, int, int], float] = {}
    for document, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        for target in range(int(start) + 8, int(start + length)):
            if held.held_out_at(np.array([target - document - 1]))[0]:
                continue  # held out by the stack (every token but each document's first is a stream row)
            for r in range(conj.depth):
                cell = (int(tokens[target - 1 - r]), int(tokens[target - 1]), int(tokens[target]))
                expected[cell] = expected.get(cell, 0.0) + 1.0
    counted: dict[tuple[int, int, int], float] = {}
    for p, key in enumerate(conj.pair_keys):
        a, q = divmod(int(key), 12)
        for cell in range(int(conj.indptr[p]), int(conj.indptr[p + 1])):
            counted[(a, q, int(conj.targets[cell]))] = float(conj.counts[cell])
    assert held.count(int(tokens.size - lengths.size)) > 0 and counted == expected
    # A rule recorded before the choice numbered the rows as read: a fit resumed from it keeps doing so.
    assert HoldoutRule.from_json({"fraction": 0.05, "stripe_rows": 16}).numbering == "rows"


@pytest.mark.slow
def test_retrain_publishes_a_recipe_on_a_token_stream_and_retrains_it_as_one(
    tmp_path: Path, one_worker_address: str
) -> None:
    """A registry's first version on a token-stream store is what ``fit`` picks there; the next retrain fits the
    version's whole recipe again (not its stack stage alone, whose parts a registry does not hold)."""
    tokens = np.random.default_rng(1).integers(0, 10, 1600)
    for name, part in (("train", tokens[:1300]), ("validation", tokens[1300:])):
        write_stream_tokens(tmp_path / f"{name}.zarr", part, 8, num_symbols=10, dim=2, seed=0)
    registry = tmp_path / "registry"
    for _ in range(2):  # both on the shared cluster (--workers would start one for each)
        status = main(["retrain", "--registry", str(registry), "--store", str(tmp_path / "train.zarr"),
                       "--validation", str(tmp_path / "validation.zarr"), "--tolerance", "1", "--max-iter", "1",
                       "--scheduler", one_worker_address, "--json"])  # fmt: skip
        assert status == 0
    from dist_respattn.registry import Registry

    versions = [Registry(registry).load(number) for number in (1, 2)]
    assert [v.meta["fit_head"]["kind"] for v in versions] == ["recipe", "recipe"]
    assert all(isinstance(v.model, RepeatHead) and isinstance(v.model.base, StackHead) for v in versions)


def test_the_recipe_reads_conjunctions_at_every_short_position_on_stores_of_at_most_so_many_rows() -> None:
    from dist_respattn.model.heads.recipe.kind import RECIPE_CONJ_DEPTH, RECIPE_DEEP_CONJ_MAX_ROWS

    spec = RecipeSpec(SingleHopSpec(sigma2=0.5))

    def depth_of(recipe: RecipeSpec) -> int:
        conj = recipe.stages()[2].spec
        assert isinstance(conj, ConjSpec)
        return conj.depth

    assert depth_of(spec.for_window(64, num_rows=RECIPE_DEEP_CONJ_MAX_ROWS)) == 8  # the whole short window
    assert depth_of(spec.for_window(4, num_rows=1000)) == 4  # never deeper than the rows' window
    assert depth_of(spec.for_window(64, num_rows=RECIPE_DEEP_CONJ_MAX_ROWS + 1)) == RECIPE_CONJ_DEPTH == 2
    assert depth_of(spec.for_window(64)) == 2  # the rows unknown: the smaller support
    assert depth_of(RecipeSpec(SingleHopSpec(), conj_depth=3).for_window(64, num_rows=1000)) == 3  # given
    concrete = spec.for_window(64, num_rows=1000)
    assert concrete.conj_depth == 8 and spec_from_json(json.loads(json.dumps(concrete.to_json()))) == concrete
    old = concrete.to_json()
    del old["conj_depth"]  # a recipe recorded before the depth was chosen: resumed as it was fitted
    assert depth_of(spec_from_json(old)) == 2  # type: ignore[arg-type]
    resumed = spec_from_args(parsed("--head", "recipe"), SingleHopSpec(), concrete.to_json())
    assert resumed.conj_depth == 8  # type: ignore[union-attr]


def test_the_recipes_conjunction_part_takes_its_depth_and_order_from_the_command_line() -> None:
    from dist_respattn.cli.common import CommandError

    given = spec_from_args(parsed("--head", "recipe", "--conj-depth", "4", "--conj-order", "2"), SingleHopSpec(), None)
    assert isinstance(given, RecipeSpec) and (given.conj_depth, given.conj_order) == (4, 2)
    conj = given.for_window(64, num_rows=10**9).stages()[2].spec  # given: not the depth the store's rows would pick
    assert isinstance(conj, ConjSpec) and (conj.depth, conj.order) == (4, 2)
    for flags, words in (
        (("--head", "recipe", "--conj-depth", "9"), ("--conj-depth 9", "1 to 8")),
        (("--head", "recipe", "--conj-depth", "0"), ("--conj-depth 0", "1 to 8")),
        (("--head", "recipe", "--conj-order", "4"), ("--conj-order 4", "2, 3")),
        (("--head", "recipe", "--conj-strength", "1"), ("--conj-strength", "--conj-depth and --conj-order only")),
        (("--conj-depth", "4"), ("--conj-depth", "add --head conj, or --head recipe")),
    ):
        with pytest.raises(CommandError) as caught:
            spec_from_args(parsed(*flags), SingleHopSpec(), None)
        assert all(word in str(caught.value) for word in words), (flags, str(caught.value))
    # A resumed recipe keeps what its stages were fitted with: the same value again is fine, another is refused.
    fitted = RecipeSpec(SingleHopSpec()).for_window(64, num_rows=1000).to_json()
    again = spec_from_args(parsed("--head", "recipe", "--conj-depth", "8"), SingleHopSpec(), fitted)
    assert again.conj_depth == 8  # type: ignore[union-attr]
    with pytest.raises(CommandError, match="fitted with --conj-depth 8; resume without the option"):
        spec_from_args(parsed("--head", "recipe", "--conj-depth", "2"), SingleHopSpec(), fitted)


def test_the_recipe_on_a_triple_store_is_refused_before_its_first_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A triple store's window is fixed; the recipe's repeat stage reads the whole document (N = 100,000). Refused
    in one line before any stage ran or any directory was made (it failed at stage 5, after four fits, blaming a
    ``--context`` nobody gave), naming the stage and both ways out."""
    write_synthetic(tmp_path / "t.zarr", 50, num_symbols=7, context_length=8, query_dim=2, num_targets=7)
    model = tmp_path / "model"
    status = main(["fit", str(tmp_path / "t.zarr"), "--model-dir", str(model), "--head", "recipe"])
    lines = capsys.readouterr().err.splitlines()
    assert status == 2 and len(lines) == 1, lines
    assert lines[0] == (
        f"dist-respattn fit: error: {tmp_path / 't.zarr'}: a recipe fit reads its store at N = 100,000 (its repeat "
        "stage) too, but a triple store's window is fixed (N = 8): write the corpus as a token-stream store (split "
        "or ingest with --format stream), or fit one kind on this one (--head single, copy or conj)"
    )
    assert not model.exists()
