"""One-line errors of ``dist-respattn``: bad input is refused in one line with exit status 2, naming the file and the
flag that fixes it, and checked before a cluster starts. Every command is a real subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.artifacts.checkpoints import LATEST, ModelDir, checkpoint_name
from dist_respattn.store import TripleStore, write_stream_tokens
from tests.test_cli import run
from tests.test_cli_store import LAYOUT_ARGS, SHAPE_ARGS, D, N, S, T, assert_error, copy_of, run_many

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic store of 2000 rows (S, N, D, T = 7, 3, 4, 5), its true head kept in it. Copy it to change it."""
    out = tmp_path_factory.mktemp("errors") / "synth.zarr"
    result = run("synth", str(out), "--rows", "2000", *SHAPE_ARGS, *LAYOUT_ARGS, "--seed", "4")
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Path:
    """A model directory holding one checkpoint (the store's true head), as a fit of ``store`` writes it."""
    opened = TripleStore.open(store)
    truth = opened.true_model()
    assert truth is not None
    folder = ModelDir(tmp_path_factory.mktemp("model") / "model")
    name = checkpoint_name(1, "0123abcd")
    meta = {
        "iteration": 1,
        "state": "running",
        "settings": {},
        "store": {"url": str(store), "fingerprint": opened.fingerprint()},
        "history": [],
    }
    folder.write(name, truth, meta)
    folder.point(LATEST, name, iteration=1, state="running")
    return folder.path


def assert_no_cluster(result: subprocess.CompletedProcess[str]) -> None:
    assert "started a local cluster" not in result.stderr, result.stderr


# -- the command itself ----------------------------------------------------------------------------


def test_a_missing_command_or_action_prints_help_and_exits_2():
    """Bare ``dist-respattn`` and ``dist-respattn models`` agree: the help of where they stopped, exit status 2."""
    bare, models = run_many((), ("models",))
    assert bare.returncode == 2 and models.returncode == 2, (bare.returncode, models.returncode)
    assert bare.stdout == "" and models.stdout == ""
    assert bare.stderr.startswith("usage: dist-respattn [-h]") and "retrain" in bare.stderr
    assert models.stderr.startswith("usage: dist-respattn models") and "check" in models.stderr


# -- checkpoints and model directories -------------------------------------------------------------


def test_a_truncated_checkpoint_is_named_by_evaluate_and_resume(tmp_path, store, model_dir):
    damaged = copy_of(model_dir, tmp_path)
    (params,) = damaged.glob("ckpt-*/params.npz")
    params.write_bytes(params.read_bytes()[:100])
    evaluated, resumed = run_many(
        ("evaluate", str(damaged), str(store), "--workers", "1"),
        ("fit", str(store), "--model-dir", str(damaged), "--resume", "--workers", "1"),
    )
    for command, result in (("evaluate", evaluated), ("fit", resumed)):
        line = assert_error(result, command, str(params), "BadZipFile", "damaged", "--overwrite")
        assert "overwrite=True" not in line
        assert_no_cluster(result)


@pytest.mark.parametrize(("array", "dtype"), [("emission", "U32"), ("key_means", "complex128")])
def test_a_checkpoint_array_of_text_or_complex_numbers_is_named_by_evaluate(tmp_path, store, model_dir, array, dtype):
    # Text that looks like numbers, or complex numbers, once became float64 in the heads' checks: the checkpoint
    # loaded and scored as if nothing were wrong.
    damaged = copy_of(model_dir, tmp_path)
    (params,) = damaged.glob("ckpt-*/params.npz")
    with np.load(params, allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    arrays[array] = arrays[array].astype(dtype)
    np.savez(params, **arrays)
    (evaluated,) = run_many(("evaluate", str(damaged), str(store), "--workers", "1"))
    assert_error(evaluated, "evaluate", str(params), f"array '{array}'", dtype, "damaged", "--overwrite")
    assert_no_cluster(evaluated)


def test_a_model_dir_that_is_a_file_is_refused_before_the_fit(tmp_path, store):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a model directory\n")
    under_a_file = a_file / "model"
    as_dir, under, repaired = run_many(
        ("fit", str(store), "--model-dir", str(a_file), "--workers", "1"),
        ("fit", str(store), "--model-dir", str(under_a_file), "--workers", "1"),
        ("repair", str(a_file)),
    )
    assert_error(as_dir, "fit", str(a_file), "a file, not a directory")
    assert_error(under, "fit", str(under_a_file), "is a file")
    assert_error(repaired, "repair", str(a_file))
    for result in (as_dir, under):
        assert_no_cluster(result)
    assert a_file.read_text() == "not a model directory\n"


def test_evaluate_a_registry_says_it_is_a_registry(tmp_path, store):
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "registry.json").write_text(json.dumps({"format": "dist_respattn.registry", "version": 1}))
    (registry / "latest.json").write_text(json.dumps({"version": 1}))
    result = run("evaluate", str(registry), str(store), "--workers", "1")
    line = assert_error(result, "evaluate", str(registry), "a model registry, not a model directory", "models list")
    assert "'checkpoint' must name" not in line
    assert_no_cluster(result)


def test_resume_says_when_there_is_nothing_to_resume(tmp_path, store):
    """``--resume`` into an empty or new directory starts a fit there (deployments rerun the same command), and says
    so before anything runs; into a directory holding other files, it is refused as the wrong directory."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.csv").write_text("a,b\n")
    # The bad address stops the fit right after its start is decided: no cluster is needed to see the decision.
    fresh, foreign = run_many(
        ("fit", str(store), "--model-dir", str(tmp_path / "new"), "--resume", "--scheduler", "notaurl"),
        ("fit", str(store), "--model-dir", str(other), "--resume", "--workers", "1"),
    )
    lines = fresh.stderr.splitlines()
    assert fresh.returncode == 2 and len(lines) == 2, fresh.stderr
    assert lines[0] == f"{tmp_path / 'new'}: no fit to resume there yet (no latest.json): starting a new fit"
    assert_error(foreign, "fit", str(other), "no fit to resume", "results.csv", "is this the model directory?")
    assert_no_cluster(foreign)


def test_evaluate_refuses_a_gated_heads_options_for_another_kind_before_a_cluster_starts(store, model_dir):
    """``--classify-attributes`` and ``--fold-in-iterations`` are read only by a gated head's report: given for a
    single-hop head's model, they are refused naming the option, its kind and the model's, not silently ignored."""
    classify, fold_in = run_many(
        ("evaluate", str(model_dir), str(store), "--classify-attributes", "--workers", "1"),
        ("evaluate", str(model_dir), str(store), "--fold-in", "--fold-in-iterations", "3", "--workers", "1"),
    )
    assert_error(
        classify, "evaluate", "--classify-attributes: an option of gated heads", f"{model_dir} holds a single-hop head"
    )
    assert_error(fold_in, "evaluate", "--fold-in: an option of gated heads", f"{model_dir} holds a single-hop head")
    for result in (classify, fold_in):
        assert_no_cluster(result)


def test_messages_name_flags_not_python_arguments(tmp_path, store, model_dir):
    held = copy_of(model_dir, tmp_path)
    again, existing = run_many(
        ("fit", str(store), "--model-dir", str(held), "--workers", "1"),
        ("synth", str(store), "--rows", "10", *SHAPE_ARGS),
    )
    fit_line = assert_error(again, "fit", "resume it (--resume) or start over (--overwrite)")
    synth_line = assert_error(existing, "synth", "already exists: pass --overwrite")
    for line in (fit_line, synth_line):
        assert "=True" not in line and "init_from" not in line, line


def test_layout_shape_and_window_errors_name_their_flags(tmp_path, store):
    """A message about an option names its flag (``--min-context``, ``--partition-rows``, ``--symbols``), not the
    Python argument it sets; a store's own attribute (what is on disk) keeps its name."""
    stream = write_stream_tokens(tmp_path / "stream.zarr", np.arange(200) % 7, 4, num_symbols=7, dim=2, seed=0)
    np.save(tmp_path / "tokens.npy", np.arange(200) % 7)
    rows = 20
    np.save(tmp_path / "c.npy", np.zeros((rows, N), dtype=np.int64))
    np.save(tmp_path / "q.npy", np.zeros((rows, D), dtype=np.float32))
    np.save(tmp_path / "t.npy", np.zeros(rows, dtype=np.int64))
    arrays = [str(tmp_path / f"{name}.npy") for name in ("c", "q", "t")]
    damaged = copy_of(store, tmp_path / "damaged")
    metadata = json.loads((damaged / "zarr.json").read_text())
    metadata["attributes"]["dist_respattn"]["context_length"] = 0
    (damaged / "zarr.json").write_text(json.dumps(metadata))
    layout = ("--chunk-rows", "30", "--partition-rows", "50")
    window, synth_layout, stream_layout, synth_shape, ingest_shape, on_disk = run_many(
        ("fit", str(stream.location), "--model-dir", str(tmp_path / "m"), "--head", "single", "--min-context", "9"),
        ("synth", str(tmp_path / "new.zarr"), "--rows", "10", *SHAPE_ARGS, *layout),
        ("ingest", str(tmp_path / "s.zarr"), "--tokens", str(tmp_path / "tokens.npy"), "--context", "2", *layout),
        ("synth", str(store), "--rows", "10", "--append", "--symbols", "8", "--dim", "5", "--targets", "6"),
        ("ingest", str(store), "--arrays", *arrays, "--append", "--symbols", "9", "--targets", "6"),
        ("info", str(damaged)),
    )
    shape = (f"--symbols 8 (the store has {S})", f"--dim 5 (the store has {D})", f"--targets 6 (the store has {T})")
    lines = [
        assert_error(window, "fit", "--min-context = 9: expected at most the window N = 4"),
        assert_error(synth_layout, "synth", "--partition-rows = 50: expected a positive multiple of --chunk-rows = 30"),
        assert_error(stream_layout, "ingest", "50 tokens (--partition-rows)", "30 tokens (--chunk-rows)"),
        assert_error(synth_shape, "synth", *shape),
        assert_error(ingest_shape, "ingest", f"--symbols 9 (store has {S})", f"--targets 6 (store has {T})"),
    ]
    for line in lines:
        for name in ("min_context", "partition_rows", "chunk_rows", "num_symbols", "num_targets", "query_dim"):
            assert name not in line, line
    assert_error(on_disk, "info", str(damaged), "bad schema attribute: context_length = 0")
    assert not (tmp_path / "m").exists() and not (tmp_path / "new.zarr").exists()
    assert not (tmp_path / "s.zarr").exists()
    assert TripleStore.open(store).num_rows == 2000


# -- the cluster -----------------------------------------------------------------------------------


def test_a_memory_limit_too_small_is_refused_before_a_cluster_starts(store, tmp_path):
    result = run("fit", str(store), "--model-dir", str(tmp_path / "model"), "--workers", "1", "--memory-limit", "1MB")
    assert_error(result, "fit", "needs about", "the smallest worker memory limit is 1 MiB", "--memory-limit")
    assert_no_cluster(result)
    assert not (tmp_path / "model").exists()


def test_a_scheduler_address_without_a_port_is_one_line_and_quick(store, tmp_path):
    fitted, validated = run_many(
        ("fit", str(store), "--model-dir", str(tmp_path / "model"), "--scheduler", "notaurl"),
        ("validate", str(store), "--scheduler", "notaurl"),
    )
    for command, result in (("fit", fitted), ("validate", validated)):
        assert_error(result, command, "--scheduler 'notaurl' is not a scheduler address", "tcp://HOST:PORT")
        assert "Exception ignored" not in result.stderr  # a Client made for it lingered, stalling the exit 20 s


@pytest.mark.slow
def test_the_summary_shows_the_best_iteration_and_no_dashboard_of_a_closed_cluster(tmp_path, store):
    """The ``held-out:`` line gives the scores of the iteration it names; an embedded cluster's dashboard, shut
    with the fit, is not offered at the end; ``--min-sigma2`` above the data's variance is not called a collapse."""
    model = tmp_path / "model"
    result = run(
        "fit", str(store), "--model-dir", str(model), "--validation", str(store), "--workers", "1",
        "--max-iter", "4", "--tol", "0", "--learn-sigma2", "--sigma2", "1", "--min-sigma2", "10",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads(next(model.glob("ckpt-*/meta.json")).read_text())
    best_iteration = meta["early_stopping"]["best_iteration"]
    best = next(h for h in meta["history"] if h["iteration"] == best_iteration)["heldout"]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("held-out")]
    assert f"perplexity {best['perplexity']:.4f}" in line, (line, best)
    assert line.endswith(f"(best iteration {best_iteration})")
    assert "dashboard: http" in result.stderr  # said at the start, while the cluster ran
    assert "dashboard" not in result.stdout
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: sigma2")]
    assert warnings == [
        "warning: sigma2 = 10 sits on --min-sigma2 = 10, its floor: the maximum-likelihood variance is smaller, "
        "so the floor sets it (lower --min-sigma2 to learn it)"
    ]
    assert "collapsed" not in result.stdout + result.stderr


# -- stores and inputs -----------------------------------------------------------------------------


def test_invalid_json_in_a_store_names_the_file(tmp_path, store):
    root = copy_of(store, tmp_path / "root")
    (root / "zarr.json").write_text('{"zarr_format": 3, ')
    member = copy_of(store, tmp_path / "member")
    (member / "context" / "zarr.json").write_text('{"zarr_format": 3, ')
    root_info, member_info, member_fit, member_validate = run_many(
        ("info", str(root)),
        ("info", str(member)),
        ("fit", str(member), "--model-dir", str(tmp_path / "model"), "--workers", "1"),
        ("validate", str(member)),
    )
    assert_error(root_info, "info", str(root / "zarr.json"), "not valid JSON", "--overwrite")
    for command, result in (("info", member_info), ("fit", member_fit)):
        assert_error(result, command, str(member / "context" / "zarr.json"), "not valid JSON")
    assert member_validate.returncode == 1, member_validate.stderr
    assert str(member / "context" / "zarr.json") in member_validate.stdout


def test_an_unknown_data_type_in_a_store_names_the_file_the_array_and_the_fix(tmp_path, store):
    """A ``zarr.json`` naming a data type zarr does not know: zarr's own error names neither file nor array; the
    commands that open the store name both, what was expected and how to write it again, and leave it as it is."""
    triples = copy_of(store, tmp_path / "triples")
    stream = write_stream_tokens(tmp_path / "stream.zarr", np.arange(200) % 7, 4, num_symbols=7, dim=2, seed=0)
    damaged = {triples / "target" / "zarr.json": "int33", tmp_path / "stream.zarr" / "tokens" / "zarr.json": "u8"}
    for path, data_type in damaged.items():
        metadata = json.loads(path.read_text())
        metadata["data_type"] = data_type
        path.write_text(json.dumps(metadata))
    before = {path: path.read_bytes() for path in damaged}
    info, fitted, validated, stream_info, stream_validated = run_many(
        ("info", str(triples)),
        ("fit", str(triples), "--model-dir", str(tmp_path / "model"), "--workers", "1"),
        ("validate", str(triples)),
        ("info", str(stream.location)),
        ("validate", str(stream.location)),
    )
    fix = "write the store again with `dist-respattn ingest` or `dist-respattn split` (--overwrite)"
    target = (f"{triples / 'target' / 'zarr.json'}: array 'target' has data type 'int33', which zarr cannot read: "
              "expected int32 (each row's target id)")  # fmt: skip
    tokens = (f"{tmp_path / 'stream.zarr' / 'tokens' / 'zarr.json'}: array 'tokens' has data type 'u8', which zarr "
              "cannot read: expected uint8 (the smallest unsigned type that holds S = 7 ids)")  # fmt: skip
    for command, result in (("info", info), ("fit", fitted)):
        line = assert_error(result, command, target, fix)
        assert "No Zarr data type" not in line
    assert_error(stream_info, "info", tokens, fix)
    assert_no_cluster(fitted)
    for result, expected in ((validated, target), (stream_validated, tokens)):
        assert result.returncode == 1, result.stderr
        assert expected in result.stdout and fix in result.stdout and "Traceback" not in result.stderr
    assert {path: path.read_bytes() for path in damaged} == before
    assert not (tmp_path / "model").exists()


def test_a_string_array_is_named_by_its_file(tmp_path):
    n = 20
    np.save(tmp_path / "context.npy", np.array([["a", "b", "c"]] * n))
    np.save(tmp_path / "query.npy", np.zeros((n, 2), dtype=np.float32))
    np.save(tmp_path / "target.npy", np.zeros(n, dtype=np.int64))
    np.save(tmp_path / "words.npy", np.array(["the", "cat"] * n))
    arrays = [str(tmp_path / f"{name}.npy") for name in ("context", "query", "target")]
    as_arrays, as_tokens = run_many(
        ("ingest", str(tmp_path / "a.zarr"), "--arrays", *arrays),
        ("ingest", str(tmp_path / "t.zarr"), "--tokens", str(tmp_path / "words.npy"), "--context", "2"),
    )
    assert_error(as_arrays, "ingest", arrays[0], "the context array holds <U1 values (strings)", "--text")
    assert_error(as_tokens, "ingest", str(tmp_path / "words.npy"), "the tokens array holds <U3 values (strings)")
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "t.zarr").exists()


def test_an_id_past_the_vocabulary_names_its_file_position_range_and_flag(tmp_path):
    """A token id of S or more under ``--symbols S`` (stream or triples) and a target of T or more under ``--targets
    T`` (``--arrays``) are refused naming the file, the position, the value, the range and the flag that sets it; a
    negative id with no ``--symbols`` says S is the largest id + 1. Nothing is written."""
    np.save(tmp_path / "tokens.npy", np.array([0, 1, 2, 3, 9, 1, 2]))
    np.save(tmp_path / "negative.npy", np.array([0, 1, -2, 3]))
    np.save(tmp_path / "context.npy", np.array([[0, 1], [1, 2]]))
    np.save(tmp_path / "query.npy", np.zeros((2, 3), dtype=np.float32))
    np.save(tmp_path / "target.npy", np.array([1, 2]))
    tokens, negative = str(tmp_path / "tokens.npy"), str(tmp_path / "negative.npy")
    arrays = [str(tmp_path / f"{name}.npy") for name in ("context", "query", "target")]
    stream, triples, inferred, targets = run_many(
        ("ingest", str(tmp_path / "s.zarr"), "--tokens", tokens, "--symbols", "5", "--context", "2"),
        ("ingest", str(tmp_path / "t.zarr"), "--tokens", tokens, "--symbols", "5", "--context", "2", "--format",
         "triples"),
        ("ingest", str(tmp_path / "n.zarr"), "--tokens", negative, "--context", "2"),
        ("ingest", str(tmp_path / "a.zarr"), "--arrays", *arrays, "--targets", "2"),
    )  # fmt: skip
    for result in (stream, triples):
        assert_error(
            result, "ingest", f"{tokens}[4] = 9: expected a token id in [0, 5)", "S = 5 from --symbols",
            "give a larger --symbols S",
        )  # fmt: skip
    assert_error(
        inferred, "ingest", f"{negative}[2] = -2: expected a token id in [0, 4)",
        "S = 4, the largest id + 1, as --symbols was not given",
    )  # fmt: skip
    assert_error(
        targets, "ingest", f"{arrays[2]}: target[1] = 2: expected a target id in [0, 2)", "T = 2 from --targets",
        "give a larger --targets T",
    )  # fmt: skip
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".npy"] * 5


def test_split_names_the_flag_that_set_the_range_an_id_is_out_of(tmp_path):
    """``split --tokens`` refuses an id of S or more under ``--symbols S`` as ``ingest`` does: naming the flag (it
    named only the range), whichever store format and hold-out. Nothing is written."""
    tokens = np.arange(1000) % 5
    tokens[4] = 9
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "starts.npy", np.arange(0, 1000, 100))
    source = ("--tokens", str(tmp_path / "tokens.npy"), "--symbols", "5", "--context", "2")
    results = run_many(
        ("split", str(tmp_path / "stream"), *source, "--block-tokens", "50"),
        ("split", str(tmp_path / "triples"), *source, "--block-tokens", "50", "--format", "triples"),
        ("split", str(tmp_path / "last"), *source, "--documents", str(tmp_path / "starts.npy"), "--hold-out", "last"),
    )
    for result in results:
        assert_error(
            result, "split", "tokens.npy[4] = 9: expected a token id in [0, 5)", "S = 5 from --symbols",
            "give a larger --symbols S",
        )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["starts.npy", "tokens.npy"]


def test_empty_files_are_counted_as_no_documents_in_the_refusals_of_a_text_corpus(tmp_path):
    """A folder of empty files was "2 documents" that the validation split got none of (advice: a larger fraction),
    and ``ingest`` said "0 tokens in 1 document". Nothing is written."""
    empty, mixed = tmp_path / "empty", tmp_path / "mixed"
    for folder in (empty, mixed):
        folder.mkdir()
        (folder / "a.py").write_text("")
        (folder / "b.txt").write_text("")
    (mixed / "c.py").write_text("x = 1\n")
    only_empty, some_empty, ingested = run_many(
        ("split", str(tmp_path / "s1"), "--text", str(empty), "--context", "4"),
        ("split", str(tmp_path / "s2"), "--text", str(mixed), "--context", "4"),
        ("ingest", str(tmp_path / "i.zarr"), "--text", str(empty), "--context", "4"),
    )
    assert_error(only_empty, "split", "2 files found", "every one empty: no text to split", "--text PATH")
    assert_error(some_empty, "split", "none of the 3 documents", "(2 of the 3 files are empty: no document of any")
    assert_error(ingested, "ingest", "0 tokens in 0 documents give no rows")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "mixed"]


def test_a_corpus_too_short_for_one_window_writes_no_store(tmp_path):
    """Tokens or text, triples or stream: fewer than N + 1 tokens a document is refused, and nothing is written."""
    np.save(tmp_path / "short.npy", np.arange(3))
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("two words\n")
    (text / "b.txt").write_text("three words here\n")
    outs = [tmp_path / f"out{i}.zarr" for i in range(4)]
    sources = [("--tokens", str(tmp_path / "short.npy")), ("--text", str(text))]
    commands = [
        ("ingest", str(out), *source, "--context", "3", "--format", kind)
        for out, (source, kind) in zip(outs, [(s, k) for s in sources for k in ("triples", "stream")], strict=True)
    ]
    results = run_many(*commands)
    for result, out in zip(results[:2], outs[:2], strict=True):
        assert_error(result, "ingest", "short.npy", "3 tokens in 1 document give no rows", "N + 1 = 4", "--context")
        assert not out.exists()
    for result, out in zip(results[2:], outs[2:], strict=True):
        assert_error(result, "ingest", str(text), "give no rows with a window of N = 3", "--context")
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.npy", "text"]


def test_text_globs_may_match_directories_and_out_may_follow_text(tmp_path):
    corpus = tmp_path / "corpus"
    for name, words in (("one", "a b c d e f g"), ("two", "h i j k l m n")):
        (corpus / name).mkdir(parents=True)
        (corpus / name / "doc.txt").write_text(words + "\n")
    (corpus / "two" / "skipped.bin").write_bytes(b"\x00\x01")
    globbed, trailing, missing = run_many(
        ("ingest", str(tmp_path / "globbed.zarr"), "--text", str(corpus / "*"), "--context", "2", "--json"),
        ("ingest", "--text", str(corpus), str(tmp_path / "trailing.zarr"), "--context", "2", "--json"),
        ("ingest", "--text", str(corpus), "--context", "2"),
    )
    reports = [json.loads(result.stdout) for result in (globbed, trailing)]
    for result, report in zip((globbed, trailing), reports, strict=True):
        assert result.returncode == 0, result.stderr
        assert report["rows"] == 2 * (7 - 2)  # two documents of 7 tokens, windows of 2
        assert report["provenance"]["files"] == 2
    assert reports[1]["url"] == str(tmp_path / "trailing.zarr")
    assert_error(missing, "ingest", "OUT is missing", f"--text took {corpus} as text", "ingest OUT --text PATH")
