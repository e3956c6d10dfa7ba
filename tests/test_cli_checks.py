"""Bad values, mismatched stores and occupied directories are refused in one line, naming the flag or file and the
fix, before any cluster starts or anything is written; and the commands that used to fail with a traceback on an
odd but valid input (the out-of-vocabulary id as a neighbour) answer."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.artifacts.checkpoints import LATEST, ModelDir, checkpoint_name
from dist_respattn.artifacts.registry import Registry
from dist_respattn.model.heads.gated.head import GatedHead
from dist_respattn.model.heads.gated.report import report_lines
from dist_respattn.store import open_store
from dist_respattn.store.ingest.to_stream import write_stream_text
from dist_respattn.store.predictions import OOV_WORD
from tests.test_cli import run
from tests.test_cli_errors import assert_no_cluster
from tests.test_cli_store import assert_error, run_many

#: Two documents in which "the", "." and "cat" are the most frequent words.
DOCUMENTS = ("the cat sat on the mat . the cat saw the dog . a cat and a dog .", "the dog sat . a cat sat on the log .")


def text_store(folder: Path, vocab_size: int) -> Path:
    """A token-stream store of two small text files, context N = 2, a vocabulary of ``vocab_size`` words."""
    text = folder / f"text{vocab_size}"
    text.mkdir()
    for name, words in zip(("a.txt", "b.txt"), DOCUMENTS, strict=True):
        (text / name).write_text(words + "\n")
    out = folder / f"words{vocab_size}.zarr"
    write_stream_text(out, [str(text)], 2, vocab_size=vocab_size, dim=3, seed=0)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A store of a 6-word vocabulary (S = 7) and one of a 3-word vocabulary (S = 4)."""
    folder = tmp_path_factory.mktemp("checks")
    return text_store(folder, 6), text_store(folder, 3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, stores: tuple[Path, Path]) -> Path:
    """A model directory of a random head of the large store's shape (T = S), recorded as fitted on it."""
    store = open_store(stores[0])
    schema = store.schema
    head = random_distribution(schema.num_symbols, 2, schema.query_dim, schema.num_targets, seed=3)
    folder = ModelDir(tmp_path_factory.mktemp("model") / "model")
    name = checkpoint_name(1, "0123abcd")
    meta = {
        "iteration": 1,
        "state": "running",
        "settings": {},
        "store": {"url": str(stores[0]), "fingerprint": store.fingerprint()},
        "history": [],
    }
    folder.write(name, head, meta)
    folder.point(LATEST, name, iteration=1, state="running")
    return folder.path


def assert_usage_error(result: subprocess.CompletedProcess[str], command: str, *fragments: str) -> None:
    """Exit status 2 and argparse's refusal: the usage, then one ``dist-respattn COMMAND: error: ...`` line."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith(f"dist-respattn {command}: error: "), result.stderr
    for fragment in fragments:
        assert fragment in line, (fragment, line)


@pytest.mark.slow
def test_bad_values_are_refused_naming_their_flag(tmp_path, stores, model_dir):
    """Values argparse can tell bad by themselves: refused by the parser, naming the flag."""
    store = str(stores[0])
    cases = {
        ("fit", "argument --memory-limit: -1: expected a positive size"): (
            "fit", store, "--model-dir", str(tmp_path / "m1"), "--memory-limit", "-1",
        ),
        ("fit", "argument --seed: -1: expected a seed, an integer >= 0"): (
            "fit", store, "--model-dir", str(tmp_path / "m2"), "--seed", "-1",
        ),
        ("synth", "argument --seed: -3: expected a seed"): (
            "synth", str(tmp_path / "s.zarr"), "--rows", "5", "--symbols", "3", "--context", "2", "--dim", "2",
            "--targets", "3", "--seed", "-3",
        ),
        ("evaluate", "argument --baseline-k: 0: expected a number > 0"): (
            "evaluate", str(model_dir), store, "--baseline-k", "0",
        ),
        ("evaluate", "argument --baseline-order: 6: expected an integer from 2 to 5"): (
            "evaluate", str(model_dir), store, "--baseline-order", "6",
        ),
    }  # fmt: skip
    results = run_many(*cases.values())
    for (command, fragment), result in zip(cases, results, strict=True):
        assert_usage_error(result, command, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_impossible_requests_are_refused_before_anything_runs(tmp_path, stores, model_dir):
    """Each refused in one line naming the flag or file and the fix; no cluster started, nothing written."""
    large, small = (str(s) for s in stores)
    demo_dir = tmp_path / "demo"
    (demo_dir / "train.zarr").mkdir(parents=True)
    (demo_dir / "model").mkdir()
    (demo_dir / "model" / "latest.json").write_text("{}")
    cases = {
        ("synth", "--symbols 1,000,000 and --targets 1,000,000", "MiB", "lower --symbols or --targets"): (
            "synth", str(tmp_path / "big.zarr"), "--rows", "5", "--symbols", "1000000", "--context", "2", "--dim",
            "2", "--targets", "1000000",
        ),
        ("demo", f"--dir {demo_dir} holds train.zarr, model", "pass --overwrite"): (
            "demo", "--synthetic", "--dir", str(demo_dir), "--workers", "1",
        ),
        ("evaluate", "no model registry at", str(tmp_path / "nothere")): (
            "evaluate", f"{tmp_path / 'nothere'}@latest", large, "--workers", "1",
        ),
        ("fit", "no document is long enough", "the longest document has", "give --context"): (
            # One head reads only full windows (the recipe's buckets would take the short histories instead).
            "fit", large, "--model-dir", str(tmp_path / "m1"), "--head", "single", "--context", "100000",
            "--workers", "1",
        ),
        ("fit", "--attribute-factors with --position-buckets"): (
            "fit", large, "--model-dir", str(tmp_path / "m2"), "--attribute-factors", "2", "--position-buckets",
            "2", "--workers", "1",
        ),
        ("neighbours", f"--store {small}: S = 4 symbols, the model's is S = 7", "give --store"): (
            "neighbours", str(model_dir), "cat", "--store", small,
        ),
        ("sample", f"--store {small}: S = 4 symbols"): ("sample", str(model_dir), "--store", small),
    }  # fmt: skip
    results = run_many(*cases.values())
    for (command, *fragments), result in zip(cases, results, strict=True):
        assert_error(result, command, *fragments)
        assert_no_cluster(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    assert sorted(p.name for p in demo_dir.iterdir()) == ["model", "train.zarr"]
    assert (demo_dir / "model" / "latest.json").read_text() == "{}"


@pytest.mark.slow
def test_neighbours_lists_the_out_of_vocabulary_id_and_any_top(stores, model_dir):
    """The out-of-vocabulary id is a symbol like any other: listed by its name; ``--top`` past S - 1 lists them all."""
    result = run("neighbours", str(model_dir), "cat", "--top", "50", "--json")
    assert result.returncode == 0, result.stderr
    (listed,) = json.loads(result.stdout)["neighbours"].values()
    vocabulary = open_store(stores[0]).vocabulary() or {}
    assert len(listed) == len(vocabulary["tokens"])  # S - 1: every symbol but "cat" itself
    assert OOV_WORD in [word for word, _ in listed]
    assert "cat" not in [word for word, _ in listed]


def test_a_mix_and_an_attribute_together_are_refused():
    base = random_distribution(4, 2, 2, 4, seed=1)
    factors = np.random.default_rng(1).dirichlet(np.ones(4), size=(2, 4))
    head = GatedHead.from_dense(base.key_means, base.position_prior, 1.0, factors, np.full((2, 2), 0.5))
    head = head.with_parameters(names=("a", "b"))
    with pytest.raises(ValueError, match=r"--mix 'a=1' and --attribute 'b': give one"):
        head.mix_of({"mix": "a=1", "attribute": "b"})
    assert head.mix_of({"mix": "a=1"}) == {0: 1.0}


def test_a_fold_in_with_nothing_to_fold_in_says_so():
    report = {
        "shared": {"store": "s.zarr", "baselines": {}},
        "model": {"rows": 10.0, "perplexity": 3.0, "perplexity_shared_same_rows": 3.5},
        "by_attribute": {},
    }
    assert not any("fold" in line for line in report_lines(report))
    lines = report_lines({**report, "fold_in": {}})
    assert lines[-1].startswith("note: --fold-in: every attribute of s.zarr is one the model knows"), lines


def test_an_export_killed_midway_does_not_block_the_next(tmp_path):
    """A killed export leaves its staging copy beside DIR, not a half-written DIR; the next export removes it."""
    folder = ModelDir(tmp_path / "model")
    name = checkpoint_name(1, "0123abcd")
    folder.write(name, random_distribution(3, 2, 2, 3, seed=2), {"iteration": 1})
    folder.point(LATEST, name, iteration=1)
    files = folder.read_files(name)
    registry = Registry(str(tmp_path / "registry"))
    with registry.lock() as lock:
        registry.publish(lock, files.params, files.meta, {"metrics": {}})
    stale = tmp_path / ".out.partial-export"
    (stale / "ckpt-000001-v000001").mkdir(parents=True)  # what a kill during the copy leaves
    version, checkpoint = registry.export("latest", tmp_path / "out")
    assert version.number == 1 and checkpoint.parent == tmp_path / "out"
    assert not stale.exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ckpt-000001-v000001", "latest.json"]


def test_a_summary_with_a_figure_its_checkpoint_lacks_prints(capsys):
    """A checkpoint whose meta.json lacks a held-out figure (edited, or older) is summarized, the figure as n/a."""
    from dist_respattn.cli.fit_commands import print_fit_summary

    report = {
        "state": "max_iter", "iterations": 2, "seconds": 1.0, "mean_log_likelihood": None, "best_iteration": 2,
        "heldout": {"perplexity": None, "mean_log_likelihood": None}, "heldout_rows": "the held-out rows",
        "warnings": [], "model_dir": "m", "best_checkpoint": "ckpt-2", "latest_checkpoint": "ckpt-2",
        "last_iteration": 2,
    }  # fmt: skip
    print_fit_summary(report, verbose=True)
    out = capsys.readouterr().out
    assert "held-out (the held-out rows): perplexity n/a, joint log-likelihood n/a (best iteration 2)" in out


def test_a_file_of_one_huge_word_is_refused_once_past_the_bound(tmp_path):
    """Bytes without a space are carried up to a bound, then refused naming the file (not carried whole)."""
    from dist_respattn.store.ingest.text_pass import file_blocks

    word = tmp_path / "word.txt"
    word.write_bytes(b"a few words first " + b"x" * 5000)
    with pytest.raises(ValueError, match=f"{word}: more than 3,0[0-9][0-9] bytes without a space from byte 18: "):
        list(file_blocks(str(word), block=1024, max_word=2048))
    text = tmp_path / "text.txt"
    text.write_bytes(b"word " * 1000)
    assert b"".join(block.tobytes() for block in file_blocks(str(text), block=1024, max_word=2048)) == text.read_bytes()


def test_the_parser_of_a_named_command_holds_that_command_and_the_full_parser_every_one(capsys):
    """``build_parser(command)`` adds only ``command`` (what ``main`` builds for a command line); without one, or
    with a name that is no command, it adds every command, each named by exactly one module's ``COMMANDS``; the
    top-level help lists every command whatever follows it."""
    from dist_respattn.cli import _COMMAND_MODULES, build_parser, main, subcommands

    every = [name for name, _, _ in subcommands(build_parser())]
    named = [name for module in _COMMAND_MODULES for name in module.COMMANDS]
    assert every == named and len(set(named)) == len(named) > 10
    assert [name for name, _, _ in subcommands(build_parser("nonsense"))] == every
    for command in every:
        assert [name for name, _, _ in subcommands(build_parser(command))] == [command]
    with pytest.raises(SystemExit) as stopped:
        main(["--help", "fit"])
    assert stopped.value.code == 0
    listed = capsys.readouterr().out
    assert all(re.search(rf"^    {command}\b", listed, re.MULTILINE) for command in every), listed
