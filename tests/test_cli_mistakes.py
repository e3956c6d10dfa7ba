"""A newcomer's first mistakes at the command line, answered in one line with the fix: a mistyped flag named with
the flag meant, a store given where the command takes none named with the flag that takes it, a path that is not a
store said to be what it is, and a store or head that cannot serve a command said to lack what it needs. Every
command is a real subprocess."""

from __future__ import annotations

import subprocess

import pytest

from dist_respattn import random_distribution
from dist_respattn.artifacts import load_checkpoint
from dist_respattn.artifacts.checkpoints import LATEST, ModelDir
from tests.store.helpers import random_rows, write_small
from tests.test_cli import run
from tests.test_cli_store import run_many

pytestmark = pytest.mark.slow  # every test here starts a command


def error_line(result: subprocess.CompletedProcess[str], command: str) -> str:
    """Exit status 2, no traceback, and the last line of stderr: ``dist-respattn COMMAND: error: ...``."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith(f"dist-respattn {command}: error: "), result.stderr
    return line.removeprefix(f"dist-respattn {command}: error: ")


def test_a_mistyped_flag_is_named_with_the_flag_meant_before_a_missing_one(tmp_path):
    """``--modeldir`` leaves ``--model-dir`` missing; the error names the typo and the flag, with the command's
    usage, whatever the command (a nested ``models`` action too) and whether or not a required flag is missing."""
    store = tmp_path / "train.zarr"
    typed, nested, missing_and_typed, abbreviated = run_many(
        ("fit", str(store), "--modeldir", str(tmp_path / "m2")),
        ("models", "list", str(tmp_path), "--jsn"),
        ("models", "export", str(tmp_path), "--modeldir", "x"),  # version and DIR missing as well
        ("fit", str(store), "--model", str(tmp_path / "m"), "--max-iters", "3"),  # --model: a prefix, as argparse
    )
    assert error_line(typed, "fit") == "unrecognized arguments: --modeldir (did you mean --model-dir?)"
    assert typed.stderr.startswith("usage: dist-respattn fit ")
    assert error_line(nested, "models list") == "unrecognized arguments: --jsn (did you mean --json?)"
    assert nested.stderr.startswith("usage: dist-respattn models list ")
    assert error_line(missing_and_typed, "models export") == "unrecognized arguments: --modeldir"
    assert error_line(abbreviated, "fit") == "unrecognized arguments: --max-iters (did you mean --max-iter?) 3"
    assert not (tmp_path / "m2").exists() and not (tmp_path / "m").exists()


def test_a_store_given_as_an_extra_argument_is_named_with_the_flag_that_takes_it(tmp_path):
    """``sample MODEL STORE``: the store goes after ``--store``; a word that is no path gets no such hint."""
    store = tmp_path / "train.zarr"
    store.mkdir()
    given, word = run_many(("sample", str(tmp_path / "model"), str(store)), ("sample", str(tmp_path), "hello"))
    assert error_line(given, "sample") == f"unrecognized arguments: {store} (did you mean --store {store}?)"
    assert error_line(word, "sample") == "unrecognized arguments: hello"


def test_a_path_that_is_not_a_store_is_said_to_be_what_it_is(tmp_path):
    """A misspelt store, split's folder and a model directory, each given where a store goes: one line saying what
    the path is and what to give instead, before any cluster starts."""
    corpus = tmp_path / "corpus"
    for name in ("train", "validation", "test"):
        write_small(corpus / f"{name}.zarr")
    model = ModelDir(tmp_path / "model")
    model.write("ckpt-000001-0123abcd", random_distribution(13, 4, 3, 7, seed=0), {"iteration": 1})
    model.point(LATEST, "ckpt-000001-0123abcd", iteration=1, state="running")
    typo, folder, model_dir = run_many(
        ("fit", str(corpus / "trian.zarr"), "--model-dir", str(tmp_path / "m2"), "--workers", "1"),
        ("info", str(corpus)),
        ("validate", str(model.path)),
    )
    assert error_line(typo, "fit") == f"{corpus}/trian.zarr: no such file or directory (did you mean train.zarr?)"
    assert "started a local cluster" not in typo.stderr and not (tmp_path / "m2").exists()
    assert error_line(folder, "info") == (
        f"{corpus}: a folder of stores (train.zarr, validation.zarr, test.zarr): name one of them"
    )
    line = error_line(model_dir, "validate")
    assert line == f"{model.path}: a model directory, not a store: commands take it as MODEL"


def test_a_store_without_an_embedding_table_and_a_head_that_cannot_generate_are_named(tmp_path):
    """``predict --stream`` and ``sample`` with a store of triples (no embedding table) say what they need it for;
    ``sample`` with a head of T != S says which head it takes, before it looks at the store."""
    store = tmp_path / "triples.zarr"
    write_small(store)  # S = 13, T = 7: no table
    square = tmp_path / "square.zarr"
    write_small(square, random_rows(t=13), num_targets=13)
    model, generator = ModelDir(tmp_path / "model"), ModelDir(tmp_path / "generator")
    for folder, head in ((model, random_distribution(13, 4, 3, 7)), (generator, random_distribution(13, 4, 3, 13))):
        folder.write("ckpt-000001-0123abcd", head, {"iteration": 1})
        folder.point(LATEST, "ckpt-000001-0123abcd", iteration=1, state="running")
    streamed, sampled, tableless = run_many(
        ("predict", str(model.path), str(store), "--stream"),
        ("sample", str(model.path), "--store", str(store)),
        ("sample", str(generator.path), "--store", str(square)),
    )
    assert error_line(streamed, "predict") == (
        f"{store} has no embedding table (a store written from text or tokens has one): --stream needs one to make "
        "each token's query (give the store the model was fitted on, or one made --like it)"
    )
    assert error_line(sampled, "sample") == (
        f"{model.path}: sample needs a head fitted on a token stream (T = S); this head has S = 13, T = 7"
    )
    assert error_line(tableless, "sample") == (
        f"{square} has no embedding table (a store written from text or tokens has one): sample needs one to make "
        "each token's query (give --store the store the head was fitted on)"
    )


def test_a_resume_with_another_head_is_refused_naming_both_kinds(tmp_path, one_worker_address):
    """``fit --resume --head KIND`` on a model directory whose fit is of another kind names the kind it holds and the
    kind asked for, in one line: ``--head single`` (which also names the kind fitted when no option picks one) is not
    dropped to resume the copy fit as it was, and another kind's head is not refused with a list of every setting in
    which the two kinds differ."""
    import numpy as np

    from dist_respattn.store import write_stream_tokens

    tokens = (np.arange(3_000) * 7 + np.random.default_rng(0).integers(0, 3, size=3_000)) % 40
    store = str(write_stream_tokens(tmp_path / "train.zarr", tokens, 8, num_symbols=40, dim=4, seed=0).location)
    model = str(tmp_path / "model")
    cluster = ("--scheduler", one_worker_address)
    done = run("fit", store, "--model-dir", model, "--head", "copy", "--max-iter", "1", *cluster)
    assert done.returncode == 0, done.stderr
    # (Another kind than single is refused alike: tests/engine/test_failures.py resumes a single fit as conj.)
    result = run("fit", store, "--model-dir", model, "--resume", "--head", "single", "--max-iter", "2", *cluster)
    assert error_line(result, "fit") == (
        f"{model}: holds a fit of a copy head, which cannot be resumed as a single_hop head; resume it as its own "
        "kind, or start over with --overwrite"
    )
    assert ModelDir(model).fit_record()["head"]["kind"] == "copy"
    assert load_checkpoint(model, LATEST).iteration == 1  # nothing ran


def test_a_value_argparse_refuses_is_one_error_line_after_a_short_usage(tmp_path):
    """A value of the wrong type (``--hops two``): the command's required arguments and where the rest are, then the
    error, not the whole usage of a command of many options (``fit``'s is some 40 lines, the error below them); a
    flag read by one of our parsers says what it expected, not the parser's name (``invalid positive_int value``)."""
    store, model = str(tmp_path / "train.zarr"), str(tmp_path / "model")
    hops, top, short = run_many(
        ("fit", store, "--model-dir", model, "--hops", "two"),
        ("predict", model, store, "--top", "x"),
        ("models", "list", str(tmp_path), "--jsn"),
    )
    assert hops.stderr.splitlines() == [
        "usage: dist-respattn fit [options] store --model-dir MODEL_DIR (every option: dist-respattn fit --help)",
        "dist-respattn fit: error: argument --hops: invalid int value: 'two'",
    ]
    assert error_line(top, "predict") == "argument --top: 'x': expected a positive integer"
    assert top.stderr.startswith("usage: dist-respattn predict [options] model store (every option:")
    # A short usage is printed whole, as argparse prints it.
    assert short.stderr.startswith("usage: dist-respattn models list [-h]")
    assert not (tmp_path / "model").exists()
