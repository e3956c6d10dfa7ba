"""``fit --head stack``: its options read back, and every refusal one line naming its flag, exit status 2, before any
cluster starts or the model directory is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts.checkpoints import ModelDir
from dist_respattn.cli import build_parser, main
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.head_options import spec_from_args
from dist_respattn.engine.loop import store_record
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.stack import StackSpec
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.heads.cases import copy_data, stack_components
from tests.test_cli import run

SHAPE = (10, 5, 2, 10)


def parsed(*flags: str) -> object:
    return build_parser().parse_args(["fit", "train.zarr", "--model-dir", "model", *flags])


def test_the_stack_options_read_back_and_are_refused_alone_or_bad(tmp_path: Path) -> None:
    spec = spec_from_args(parsed("--head", "stack", "--stack-from", "a, b"), SingleHopSpec(), None)
    assert spec == StackSpec((str(Path("a").absolute()), str(Path("b").absolute())), "target")
    joint = spec_from_args(parsed("--head", "stack", "--stack-from", "a,b", "--stack-gate", "joint"), SingleHopSpec(),
                           None)  # fmt: skip
    assert isinstance(joint, StackSpec) and joint.mode == "joint"
    refusals = {
        ("--head", "stack"): "--head stack needs --stack-from MODEL_A,MODEL_B",
        ("--head", "stack", "--stack-from", "a"): "--head stack needs --stack-from MODEL_A,MODEL_B",
        ("--head", "stack", "--stack-from", "a,b", "--stack-gate", "both"): "--stack-gate both: expected one of joint",
        ("--stack-from", "a,b"): "--stack-from is an option of --head stack",
        ("--head", "copy", "--stack-gate", "joint"): "--stack-gate is an option of --head stack",
        # One head twice (here as two spellings of its directory): the gate would split its weight between copies.
        ("--head", "stack", "--stack-from", "a,b,./a"): r"--stack-from names \S+/a more than once: give each fitted "
        "head once",
    }
    for flags, message in refusals.items():
        with pytest.raises(CommandError, match=message):
            spec_from_args(parsed(*flags), SingleHopSpec(), None)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A stream store of N = 5 and one of another corpus (other embeddings), and components fitted on rows of that
    shape: ``ok`` (recording the first store), ``foreign`` (recording the other), ``long`` (a copy head of N = 4)."""
    root = tmp_path_factory.mktemp("stack-cli")
    tokens = np.random.default_rng(0).integers(0, 10, 600)
    options = WriteOptions(chunk_rows=128, partition_rows=256)
    train = write_stream_tokens(root / "train.zarr", tokens, 5, num_symbols=10, dim=2, seed=0, options=options)
    other = write_stream_tokens(root / "other.zarr", tokens, 5, num_symbols=10, dim=2, seed=1, options=options)
    conj, copy, _ = stack_components(copy_data(300, SHAPE, seed=3), SHAPE)
    paths = {"train": root / "train.zarr"}
    for name, head, record in (("ok", conj, train), ("foreign", conj, other), ("long", copy, train)):
        ModelDir(root / name).commit("ckpt-000000-test", head, {"iteration": 0, "store": store_record(record)},
                                     latest={"iteration": 0}, best=None, keep_best=None)  # fmt: skip
        paths[name] = root / name
    return paths


@pytest.mark.parametrize(
    ("components", "extra", "message"),
    [
        (("ok", "missing"), (), "--stack-from {missing}: {missing}: no such model directory"),
        (("ok", "foreign"), (), "--stack-from {foreign}: the store {train} is not of the corpus of the training store "
                                "of --stack-from {foreign}"),
        (("ok", "long"), ("--context", "3"), "--stack-from {long}: its window N = 4 is longer than the training "
                                             "rows' N = 3: read the store with --context 4 or more"),
    ],
    ids=["missing", "another-corpus", "window-too-long"],
)  # fmt: skip
def test_a_component_the_fit_cannot_use_is_refused_before_any_cluster(
    stores: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], components: tuple[str, ...],
    extra: tuple[str, ...], message: str,
) -> None:  # fmt: skip
    paths = {name: str(stores.get(name, tmp_path / name)) for name in ("ok", "missing", "foreign", "long", "train")}
    model = tmp_path / "model"
    status = main(["fit", paths["train"], "--model-dir", str(model), "--head", "stack", "--stack-from",
                   ",".join(paths[c] for c in components), *extra])  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("dist-respattn fit: error: " + message.format(**paths)), lines
    if "foreign" in components:
        # The fix is another component, not writing the training store again like the component's.
        assert lines[0].endswith("; give --stack-from a model fitted on a store of this corpus (fit one on it first)")
        assert "--like" not in lines[0]
    assert "started a local cluster" not in " ".join(lines)
    assert not model.exists()


@pytest.mark.slow
def test_a_bad_gate_is_one_line_of_the_real_command(tmp_path: Path) -> None:
    result = run("fit", str(tmp_path / "train.zarr"), "--model-dir", str(tmp_path / "model"), "--head", "stack",
                 "--stack-from", "a,b", "--stack-gate", "both")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["dist-respattn fit: error: --stack-gate both: expected one of joint, target"]
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_neighbours_names_each_part_of_a_stack_by_its_kind_and_window(stores: dict[str, Path], tmp_path: Path) -> None:
    """A stack's emission rows are its parts': each list is named by the part's kind and window beside the name the
    kind gives its table ("own table", "emission"), which alone does not say which part it is; and the rows are the
    head's ``B[s, :]`` (``B_a`` is an attribute's, of a gated head)."""
    from dist_respattn.model.heads.stack import StackHead
    from dist_respattn.store import open_store

    conj, copy, single = stack_components(copy_data(300, SHAPE, seed=3), SHAPE)
    stack = StackHead([0.5, 0.3, 0.2], (conj, copy, single))
    model = tmp_path / "stack"
    record = {"iteration": 0, "store": store_record(open_store(stores["train"]))}
    ModelDir(model).commit("ckpt-000000-test", stack, record, latest={"iteration": 0}, best=None, keep_best=None)
    result = run("neighbours", str(model), "3", "--top", "2")
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header == "nearest to '3' by the Hellinger distance between emission rows B[s, :]:"
    names = [line.split(":")[0].strip() for line in lines]
    assert names == [
        "component 0, conj N = 2 (attended token's table B)",
        "component 1, copy N = 4 (own table)",
        f"component 2, single_hop N = {SHAPE[1]} (emission)",
    ], result.stdout
