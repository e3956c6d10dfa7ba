"""The store subcommands of ``dist-respattn`` (synth, ingest, info, validate, repair), run as real subprocesses.

Every command is checked through what a user sees (exit status, stdout, stderr) and through the store it
leaves on disk, opened with :class:`TripleStore`. Each command is a fresh interpreter (~0.6 s of imports),
so stores are shared between tests (copied before being changed) and independent commands run at once.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import dask.config
import numpy as np
import pytest
import zarr

from dist_respattn.cli import build_parser, main
from dist_respattn.engine.cluster import embedded_cluster_config
from dist_respattn.model import sequence_windows
from dist_respattn.store import TripleStore, write_text, write_tokens
from dist_respattn.store.rows import RowStore, open_store
from dist_respattn.store.streams.reader import TokenStreamStore
from tests.store.helpers import write_small
from tests.test_cli import COMMAND, run, run_here

SUBCOMMANDS = ("synth", "ingest", "split", "info", "validate", "repair", "demo", "fit", "evaluate")
# S, N, D, T of the synthetic stores: all different, so a field mixed up with another shows.
S, N, D, T = 7, 3, 4, 5
SHAPE_ARGS = ("--symbols", str(S), "--context", str(N), "--dim", str(D), "--targets", str(T))
# Small partitions, so a few thousand rows span several partitions and a partial last one.
LAYOUT_ARGS = ("--partition-rows", "1024", "--chunk-rows", "512")
ROW_NAMES = ("context", "query", "target")


# -- helpers ---------------------------------------------------------------------------------------


def run_many(*commands: tuple[str, ...], timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """Run several independent ``dist-respattn`` commands at once; results in the order given."""
    procs = [
        subprocess.Popen([COMMAND, *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    results = []
    for command, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess([COMMAND, *command], proc.returncode, out, err))
    return results


def parse_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """A successful ``--json`` run: exactly one JSON object on stdout (``json.loads`` refuses anything more)."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict), result.stdout
    return report


def run_json(*args: str) -> dict[str, Any]:
    return parse_json(run(*args, "--json"))


def assert_error(result: subprocess.CompletedProcess[str], command: str, *fragments: str) -> str:
    """Exit status 2, nothing on stdout, and one line ``dist-respattn COMMAND: error: ...`` holding ``fragments``."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"dist-respattn {command}: error: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def synth_args(out: Path, rows: int, *extra: str) -> tuple[str, ...]:
    return ("synth", str(out), "--rows", str(rows), *SHAPE_ARGS, *LAYOUT_ARGS, *extra)


def read_all(store: RowStore) -> dict[str, np.ndarray]:
    """Every row, read partition by partition (which also checks that the partitions tile the rows)."""
    parts = store.partitions()
    assert [p.index for p in parts] == list(range(store.num_partitions))
    assert parts[0].start == 0 and parts[-1].stop == store.num_rows
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
    if store.kind == "triples":  # a stream's partitions are shards of tokens, of any number of rows
        assert [p.start for p in parts] == list(range(0, store.num_rows, store.partition_rows))
    blocks = [store.read_partition(p) for p in parts]
    rows = {name: np.concatenate([getattr(b, name) for b in blocks]) for name in ROW_NAMES}
    if store.schema.has_weight:
        rows["weight"] = np.concatenate([b.weight for b in blocks])
    for name, values in rows.items():
        assert values.shape[0] == store.num_rows, name
    return rows


def assert_rows_equal(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(actual) == set(expected)
    for name in expected:
        assert actual[name].shape == expected[name].shape, name
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def file_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under a store, by relative path: equal snapshots mean nothing was touched."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_figures(report: dict[str, Any], *, rows: int, s: int, n: int, d: int, t: int, partitions: int) -> None:
    assert report["rows"] == rows
    assert (report["num_symbols"], report["context_length"], report["query_dim"], report["num_targets"]) == (s, n, d, t)
    assert report["partitions"] == partitions


def free_port() -> int:
    """A TCP port that was free a moment ago and that nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- shared inputs and stores ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def synth_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A synthetic store of 3000 rows in 3 partitions and synth's JSON report. Copy it before changing it."""
    out = tmp_path_factory.mktemp("synth") / "synth.zarr"
    return out, run_json(*synth_args(out, 3000, "--seed", "1"))


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """context (2500, 4) ids < 6, query (2500, 3), target (2500,) ids < 5 (int64 on disk), weight, as .npy files."""
    folder = tmp_path_factory.mktemp("arrays")
    rng = np.random.default_rng(7)
    n = 2500
    context = rng.integers(0, 6, (n, 4)).astype(np.int32)
    context[10, 1] = 5  # the largest symbol id: S defaults to 6
    target = rng.integers(0, 5, n)
    target[20] = 4  # the largest target id: T defaults to 5
    values = {
        "context": context,
        "query": rng.standard_normal((n, 3)).astype(np.float32),
        "target": target,
        "weight": rng.random(n).astype(np.float32),
    }
    paths = {name: folder / f"{name}.npy" for name in values}
    for name, value in values.items():
        np.save(paths[name], value)
    return paths


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A stream of 3000 token ids in [0, 9), as a .npy file and in memory."""
    stream = np.random.default_rng(3).integers(0, 9, 3000)
    stream[0] = 8  # S = T = 9
    path = tmp_path_factory.mktemp("tokens") / "tokens.npy"
    np.save(path, stream)
    return path, stream


@pytest.fixture(scope="module")
def tokens_store(tmp_path_factory: pytest.TempPathFactory, tokens) -> tuple[Path, dict[str, Any]]:
    """The windows of ``tokens`` (N = 3, D = 6 from seed 2) in 3 partitions, and ingest's JSON report."""
    out = tmp_path_factory.mktemp("tokens-store") / "tokens.zarr"
    path, _ = tokens
    args = ("--context", "3", "--dim", "6", "--seed", "2", "--partition-rows", "1024")
    return out, run_json("ingest", str(out), "--tokens", str(path), *args)


def copy_of(store: Path, tmp_path: Path) -> Path:
    copy = tmp_path / store.name
    shutil.copytree(store, copy)
    return copy


def token_windows(stream: np.ndarray, store: RowStore, n: int = 3) -> dict[str, np.ndarray]:
    table = store.embeddings()
    assert table is not None
    windows = sequence_windows(stream, n, num_symbols=9, embeddings=table, query_dtype=np.float32)
    return dict(zip(ROW_NAMES, windows, strict=True))


# -- the parser and --help -------------------------------------------------------------------------


def test_build_parser_knows_every_subcommand():
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    assert set(SUBCOMMANDS) <= set(actions[0].choices)
    for command, argv in (
        ("synth", ["OUT", "--rows", "1", *SHAPE_ARGS]),
        ("ingest", ["OUT", "--tokens", "t.npy", "--context", "2"]),
        ("split", ["OUT_DIR", "--tokens", "t.npy", "--context", "2"]),
        ("info", ["STORE"]),
        ("validate", ["STORE"]),
        ("repair", ["STORE"]),
        ("fit", ["STORE", "--model-dir", "M"]),
        ("evaluate", ["MODEL", "STORE"]),
    ):
        args = parser.parse_args([command, *argv])
        assert args.command == command
        assert callable(args.handler)
        assert args.json is False


@pytest.mark.slow
def test_every_subcommand_has_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help to the terminal's width
    helps = {}
    for command in SUBCOMMANDS:  # in this process: each is only argparse, and a subprocess costs ~0.6 s
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([command, "--help"])
        assert exited.value.code == 0, command
        printed = capsys.readouterr()
        assert printed.err == ""
        assert printed.out.startswith(f"usage: dist-respattn {command} "), printed.out
        assert "--json" in printed.out
        helps[command] = printed.out
    for flag in ("--rows", "--symbols", "--context", "--dim", "--targets", "--seed", "--append", "--overwrite"):
        assert flag in helps["synth"], flag
    for flag in ("--arrays", "--tokens", "--text", "--weights", "--embeddings", "--vocab-size", "--append"):
        assert flag in helps["ingest"], flag
    for flag in ("--like", "--documents"):
        assert flag in helps["ingest"], flag
    for flag in ("--text", "--tokens", "--documents", "--fractions", "--split-seed", "--max-tokens", "--overwrite"):
        assert flag in helps["split"], flag
    assert "--append" not in helps["split"]
    assert "--scheduler" in helps["validate"]
    for flag in ("--model-dir", "--validation", "--init-from", "--resume", "--early-stop-metric", "--patience"):
        assert flag in helps["fit"], flag
    for command in ("fit", "evaluate", "demo"):
        assert "--scheduler" in helps[command], command
    # The console script prints the same help.
    console = subprocess.run(
        [COMMAND, "ingest", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert console.returncode == 0, console.stderr
    assert console.stdout == helps["ingest"]


# -- synth and info --------------------------------------------------------------------------------


@pytest.mark.slow
def test_synth_json_figures_and_store(synth_store):
    out, report = synth_store
    assert_figures(report, rows=3000, s=S, n=N, d=D, t=T, partitions=3)
    assert report["rows_added"] == 3000
    assert report["url"] == str(out)
    assert (report["partition_rows"], report["chunk_rows"]) == (1024, 512)
    assert report["has_weight"] is False
    assert report["has_true_model"] is True
    assert report["provenance"]["source"] == "synthetic"
    assert report["provenance"]["seed"] == 1
    assert report["provenance"]["appends"] == []

    store = TripleStore.open(out)
    assert store.num_rows == 3000
    assert (store.schema.num_symbols, store.schema.context_length) == (S, N)
    assert (store.schema.query_dim, store.schema.num_targets) == (D, T)
    assert store.num_partitions == 3
    assert store.fingerprint() == report["fingerprint"]
    rows = read_all(store)
    assert rows["context"].shape == (3000, N) and rows["context"].dtype == np.int32
    assert rows["query"].shape == (3000, D) and rows["query"].dtype == np.float32
    assert rows["target"].shape == (3000,) and rows["target"].dtype == np.int32
    assert rows["context"].min() >= 0 and rows["context"].max() < S
    assert rows["target"].min() >= 0 and rows["target"].max() < T
    assert np.isfinite(rows["query"]).all()
    assert len(np.unique(rows["context"])) == S  # every symbol shows up in 3000 rows
    assert len(np.unique(rows["target"])) > 1
    # synth's default row order is 'target': each partition's rows sorted by target.
    for part in store.partitions():
        assert np.all(np.diff(rows["target"][part.start : part.stop]) >= 0), part
    truth = store.true_model()
    assert truth is not None
    assert (truth.num_symbols, truth.context_length, truth.query_dim, truth.num_targets) == (S, N, D, T)


@pytest.mark.slow
def test_info_json_and_human_output(synth_store):
    out, written = synth_store
    as_json, human = run_many(("info", str(out), "--json"), ("info", str(out)))
    described = parse_json(as_json)
    assert described == {k: v for k, v in written.items() if k not in ("rows_added", "seconds", "rows_per_second")}
    assert described == TripleStore.open(out).describe()
    assert human.returncode == 0, human.stderr
    assert str(out) in human.stdout
    assert "3,000" in human.stdout
    assert f"S={S} symbols, N={N} positions, D={D} (float32), T={T} targets" in human.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(human.stdout)


@pytest.mark.slow
def test_synth_append_adds_rows_and_keeps_the_old_ones(synth_store, tmp_path):
    out = copy_of(synth_store[0], tmp_path)
    before = read_all(TripleStore.open(out))
    result = run(*synth_args(out, 1500, "--append"))  # the human output this time
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout
    assert "wrote 1,500 rows" in result.stdout and "holds 4,500 rows" in result.stdout
    store = TripleStore.open(out)
    assert store.num_rows == 4500 and store.num_partitions == 5
    appends = store.provenance["appends"]
    assert len(appends) == 1 and appends[0]["rows"] == 1500 and appends[0]["first_row"] == 3000
    after = read_all(store)
    assert_rows_equal({k: v[:3000] for k, v in after.items()}, before)
    assert after["context"][3000:].max() < S and after["target"][3000:].max() < T
    assert np.isfinite(after["query"][3000:]).all()
    assert not np.array_equal(after["query"][3000:4500], before["query"][:1500])  # new draws, not a copy


@pytest.mark.slow
def test_synth_mismatched_append_fails_and_leaves_the_store_alone(synth_store):
    out, _ = synth_store
    snapshot = file_snapshot(out)
    shape = ("--symbols", str(S), "--context", str(N + 1), "--dim", str(D), "--targets", str(T))
    result = run("synth", str(out), "--rows", "100", *shape, "--append")
    line = assert_error(result, "synth", str(out))
    assert "context_length" in line or "--context" in line, line
    assert file_snapshot(out) == snapshot
    assert TripleStore.open(out).num_rows == 3000


@pytest.mark.slow
def test_synth_to_an_existing_store_needs_overwrite_and_overwrite_replaces(synth_store, tmp_path):
    out = copy_of(synth_store[0], tmp_path)
    snapshot = file_snapshot(out)
    refused = run(*synth_args(out, 100))
    assert_error(refused, "synth", str(out), "already exists", "--overwrite")
    assert file_snapshot(out) == snapshot

    shape = ("--symbols", "9", "--context", "2", "--dim", "3", "--targets", "6")
    report = run_json("synth", str(out), "--rows", "700", *shape, "--overwrite")
    assert_figures(report, rows=700, s=9, n=2, d=3, t=6, partitions=1)
    assert report["rows_added"] == 700
    assert report["provenance"]["appends"] == []
    store = TripleStore.open(out)
    assert store.num_rows == 700
    assert store.partition_rows != 1024  # the old layout went with the old store
    rows = read_all(store)
    assert rows["context"].shape == (700, 2) and rows["query"].shape == (700, 3)
    truth = store.true_model()
    assert truth is not None and truth.num_symbols == 9


# -- ingest --arrays -------------------------------------------------------------------------------


@pytest.mark.slow
def test_ingest_arrays_json_and_human_output(tmp_path, arrays):
    a = arrays
    files = (str(a["context"]), str(a["query"]), str(a["target"]))
    weighted, sized = tmp_path / "weighted.zarr", tmp_path / "sized.zarr"
    as_json, human = run_many(
        (
            "ingest",
            str(weighted),
            "--arrays",
            *files,
            "--weights",
            str(a["weight"]),
            "--partition-rows",
            "1024",
            "--json",
        ),
        ("ingest", str(sized), "--arrays", *files, "--symbols", "10", "--targets", "8"),
    )
    expected = {name: np.load(path) for name, path in a.items()}

    report = parse_json(as_json)
    assert_figures(report, rows=2500, s=6, n=4, d=3, t=5, partitions=3)  # S, T: the largest ids + 1
    assert report["rows_added"] == 2500
    assert report["has_weight"] is True
    assert report["provenance"]["source"] == "arrays"
    store = TripleStore.open(weighted)
    assert store.num_rows == 2500 and store.schema.has_weight
    assert_rows_equal(read_all(store), expected)

    assert human.returncode == 0, human.stderr
    assert str(sized) in human.stdout
    assert "wrote 2,500 rows" in human.stdout
    store = TripleStore.open(sized)
    assert (store.schema.num_symbols, store.schema.num_targets, store.num_rows) == (10, 8, 2500)
    assert not store.schema.has_weight
    assert_rows_equal(read_all(store), {name: expected[name] for name in ROW_NAMES})


# -- ingest --tokens -------------------------------------------------------------------------------


@pytest.mark.slow
def test_ingest_tokens_with_a_seeded_projection(tokens, tokens_store):
    _, stream = tokens
    out, report = tokens_store
    assert_figures(report, rows=2997, s=9, n=3, d=6, t=9, partitions=3)
    assert report["rows_added"] == 2997
    assert report["provenance"]["source"] == "tokens"
    store = open_store(out)
    table = store.embeddings()
    assert table is not None and table.shape == (9, 6)
    assert np.isfinite(table).all() and not np.array_equal(table, np.zeros_like(table))
    assert_rows_equal(read_all(store), token_windows(stream, store))


@pytest.mark.slow
def test_ingest_tokens_with_a_table_file_and_one_hot(tmp_path, tokens):
    path, stream = tokens
    embeddings = np.random.default_rng(5).standard_normal((9, 5)).astype(np.float32)
    np.save(tmp_path / "E.npy", embeddings)
    from_file, one_hot = tmp_path / "file.zarr", tmp_path / "one-hot.zarr"
    results = run_many(
        (
            "ingest",
            str(from_file),
            "--tokens",
            str(path),
            "--context",
            "3",
            "--embeddings",
            str(tmp_path / "E.npy"),
            "--json",
        ),
        ("ingest", str(one_hot), "--tokens", str(path), "--context", "3", "--json"),
    )
    for out, result, dim in ((from_file, results[0], 5), (one_hot, results[1], 9)):
        report = parse_json(result)
        assert_figures(report, rows=2997, s=9, n=3, d=dim, t=9, partitions=1)
        store = open_store(out)
        assert_rows_equal(read_all(store), token_windows(stream, store))
    np.testing.assert_array_equal(open_store(from_file).embeddings(), embeddings)
    np.testing.assert_array_equal(open_store(one_hot).embeddings(), np.eye(9, dtype=np.float32))


@pytest.mark.slow
def test_ingest_tokens_append_and_mismatched_append(tmp_path, tokens, tokens_store):
    path, stream = tokens
    out = copy_of(tokens_store[0], tmp_path)
    report = run_json("ingest", str(out), "--tokens", str(path), "--context", "3", "--append")
    assert_figures(report, rows=2 * 2997, s=9, n=3, d=6, t=9, partitions=6)
    assert report["rows_added"] == 2997
    assert len(report["provenance"]["appends"]) == 1
    store = open_store(out)
    once = token_windows(stream, store)  # the appended stream is embedded with the store's own table
    assert_rows_equal(read_all(store), {name: np.concatenate([w, w]) for name, w in once.items()})

    snapshot = file_snapshot(out)
    mismatched = run("ingest", str(out), "--tokens", str(path), "--context", "4", "--append")
    line = assert_error(mismatched, "ingest", str(out))
    assert "context_length" in line or "--context" in line, line
    assert file_snapshot(out) == snapshot
    assert open_store(out).num_rows == 2 * 2997


@pytest.mark.slow
def test_ingest_to_an_existing_store_needs_overwrite_and_overwrite_replaces(tmp_path, arrays, tokens_store):
    out = copy_of(tokens_store[0], tmp_path)
    snapshot = file_snapshot(out)
    files = (str(arrays["context"]), str(arrays["query"]), str(arrays["target"]))
    refused = run("ingest", str(out), "--arrays", *files)
    assert_error(refused, "ingest", str(out), "already exists")
    assert file_snapshot(out) == snapshot
    report = run_json("ingest", str(out), "--arrays", *files, "--overwrite")
    assert_figures(report, rows=2500, s=6, n=4, d=3, t=5, partitions=1)
    store = open_store(out)
    assert store.embeddings() is None  # nothing of the token store is left
    assert store.provenance["source"] == "arrays"
    assert_rows_equal(read_all(store), {name: np.load(arrays[name]) for name in ROW_NAMES})


# -- ingest --text ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_ingest_text_directory(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    texts = {
        corpus / "a.txt": "The cat sat on the mat. The dog sat on the log!\n",
        corpus / "sub" / "b.txt": "A cat and a dog; the end.\n",
    }
    for file, text in texts.items():
        file.write_text(text)
    (corpus / "ignored.bin").write_text("zebra zebra zebra zebra zebra zebra\n")  # not a text suffix
    k, n = 5, 2
    out = tmp_path / "text.zarr"
    args = ("--context", str(n), "--vocab-size", str(k), "--dim", "3", "--partition-rows", "8")
    report = run_json("ingest", str(out), "--text", str(corpus), *args)

    # The documented tokenizer and vocabulary, computed here: lowercased \w+|[^\w\s], top K by count then name.
    tokenized = {file: re.findall(r"\w+|[^\w\s]", text.lower()) for file, text in texts.items()}
    counts = Counter(t for toks in tokenized.values() for t in toks)
    vocabulary = [t for t, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]]
    assert vocabulary == ["the", ".", "a", "cat", "dog"]
    rows = sum(len(toks) - n for toks in tokenized.values())  # no window spans two files
    assert rows == 19

    assert_figures(report, rows=rows, s=k + 1, n=n, d=3, t=k + 1, partitions=3)
    assert report["rows_added"] == rows
    assert report["provenance"]["files"] == 2
    store = open_store(out)
    vocab = store.vocabulary()
    assert vocab is not None
    assert vocab["size"] == k
    assert vocab["oov_id"] == k
    assert vocab["tokens"] == vocabulary
    assert vocab["counts"] == [counts[t] for t in vocabulary]
    table = store.embeddings()
    assert table is not None and table.shape == (k + 1, 3)
    lookup = {t: i for i, t in enumerate(vocabulary)}
    pieces = [
        sequence_windows(
            [lookup.get(t, k) for t in tokenized[file]], n, num_symbols=k + 1, embeddings=table, query_dtype=np.float32
        )
        for file in sorted(texts)
    ]
    expected = {name: np.concatenate([p[i] for p in pieces]) for i, name in enumerate(ROW_NAMES)}
    assert_rows_equal(read_all(store), expected)


@pytest.mark.slow
def test_ingest_text_counts_an_empty_file_as_no_document_in_either_format(tmp_path, capsys):
    """An empty or blank file is one of the ``files`` found but none of the ``documents``, with ``--format triples``
    as with ``--format stream``; a corpus too short for a row says the same count of documents in either (the
    refusals run in this process)."""
    corpus, short = tmp_path / "corpus", tmp_path / "short"
    corpus.mkdir()
    short.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat\n")
    (corpus / "b.txt").write_text("a dog ran to the log\n")
    (corpus / "empty.txt").write_text("")
    (corpus / "blank.txt").write_text("\n\n")
    (short / "a.txt").write_text("two words\n")
    (short / "empty.txt").write_text("")
    results = run_many(
        *[("ingest", str(tmp_path / f"{kind}.zarr"), "--text", str(corpus), "--context", "2", "--format", kind,
           "--json") for kind in ("stream", "triples")],
    )  # fmt: skip
    for result in results:
        provenance = parse_json(result)["provenance"]
        assert (provenance["files"], provenance["documents"], provenance["tokens_count"]) == (4, 2, 12), provenance
    for kind in ("stream", "triples"):
        refused = run_here(capsys, "ingest", str(tmp_path / f"short-{kind}.zarr"), "--text", str(short), "--context",
                           "3", "--format", kind)  # fmt: skip
        assert_error(refused, "ingest", "2 tokens in 1 document give no rows with a window of N = 3")


@pytest.mark.slow
def test_ingest_text_without_a_path_reads_the_standard_library(tmp_path):
    out = tmp_path / "stdlib.zarr"
    report = run_json("ingest", str(out), "--text", "--vocab-size", "50", "--context", "2")
    assert report["rows"] > 1_000_000
    assert report["rows_added"] == report["rows"]
    assert (report["num_symbols"], report["num_targets"], report["context_length"]) == (51, 51, 2)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    assert any(os.path.realpath(p) == stdlib for p in report["provenance"]["paths"]), report["provenance"]
    store = open_store(out)
    assert store.num_rows == report["rows"]
    vocab = store.vocabulary()
    assert vocab is not None and vocab["size"] == 50 and vocab["oov_id"] == 50


# -- one corpus: ingest --like, --documents, split -------------------------------------------------


@pytest.fixture(scope="module")
def corpus_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A text store (K = 5, N = 3, D = 4) and a token store (S = 9, N = 3, D = 6), written in-process, and inputs."""
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "train.txt").write_text("the cat sat on the mat . the cat ran to the mat .\n", encoding="utf-8")
    (folder / "held-out.txt").write_text("The zebra sat on the CAT!\n", encoding="utf-8")
    write_text(folder / "text.zarr", [folder / "train.txt"], 3, vocab_size=5, dim=4, seed=7)
    stream = np.random.default_rng(3).integers(0, 9, 400)
    stream[0] = 8
    write_tokens(folder / "tokens.zarr", stream, 3, dim=6, seed=2)
    np.save(folder / "stream.npy", stream[:200])
    np.save(folder / "starts.npy", np.array([0, 50, 51, 120]))
    bad = np.array(stream[:200])
    bad[150] = 9
    np.save(folder / "bad-ids.npy", bad)
    np.save(folder / "bad-starts.npy", np.array([0, 50, 40]))
    np.save(folder / "other-table.npy", np.ones((9, 6), dtype=np.float32))
    rng = np.random.default_rng(0)
    np.save(folder / "context.npy", rng.integers(0, 6, (30, 3)))
    np.save(folder / "query.npy", rng.standard_normal((30, 4)))
    np.save(folder / "target.npy", rng.integers(0, 6, 30))
    return {name: folder / name for name in os.listdir(folder)}


@pytest.mark.slow
def test_ingest_like_takes_the_vocabulary_and_table_and_info_shows_the_identity(tmp_path, corpus_stores, capsys):
    c = corpus_stores
    text_out, tokens_out = tmp_path / "validation.zarr", tmp_path / "tokens-validation.zarr"
    text_human, tokens_json = run_many(
        ("ingest", str(text_out), "--text", str(c["held-out.txt"]), "--like", str(c["text.zarr"])),
        (
            "ingest",
            str(tokens_out),
            "--tokens",
            str(c["stream.npy"]),
            "--documents",
            str(c["starts.npy"]),
            "--like",
            str(c["tokens.zarr"]),
            "--json",
        ),
    )
    assert text_human.returncode == 0, text_human.stderr
    report = parse_json(tokens_json)
    for out, reference in ((text_out, "text.zarr"), (tokens_out, "tokens.zarr")):
        ref, store = open_store(c[reference]), open_store(out)
        assert ref.identity() == store.identity()
        assert store.provenance["like"] == str(c[reference])
        assert store.schema == ref.schema  # N from the reference: no --context given
        assert store.vocabulary() == ref.vocabulary()
        np.testing.assert_array_equal(store.embeddings(), ref.embeddings())
    assert report["identity"] == open_store(c["tokens.zarr"]).identity()
    assert report["provenance"]["documents"] == 4
    assert open_store(text_out).provenance["oov_count"] == 3  # zebra, sat (not in the top 5), !
    windows = token_windows(np.load(c["stream.npy"]), open_store(c["tokens.zarr"]))
    pieces = [(0, 50), (51, 120), (120, 200)]  # the 1-token document 50..51 has no rows
    keep = np.concatenate([np.arange(a, b - 3) for a, b in pieces])
    assert_rows_equal(read_all(open_store(tokens_out)), {k: v[keep] for k, v in windows.items()})

    identity = open_store(c["text.zarr"]).identity()
    line = f"identity     vocabulary {identity['vocabulary'][:12]}, embedding table {identity['embeddings'][:12]}"
    assert line in text_human.stdout  # what ingest prints of the store it wrote
    assert f"made like    {c['text.zarr']}" in text_human.stdout
    assert main(["info", str(c["text.zarr"])]) == 0  # info prints the same lines (in-process: one more start saved)
    assert line in capsys.readouterr().out


def ingest_refusals(c: dict[str, Path]) -> list[tuple[tuple[str, ...], list[str]]]:
    """(arguments after ``ingest OUT``, what the one-line error must hold) for every flag ``--like`` refuses."""
    text_like = ("--text", str(c["held-out.txt"]), "--like", str(c["text.zarr"]))
    tokens_like = ("--tokens", str(c["stream.npy"]), "--like", str(c["tokens.zarr"]))
    arrays = ("--arrays", str(c["context.npy"]), str(c["query.npy"]), str(c["target.npy"]))
    return [
        ((*text_like, "--context", "5"), ["--context 5", "window N = 3", str(c["text.zarr"])]),
        ((*tokens_like, "--append"), ["--like", "--append", "exclude each other"]),
        (
            ("--tokens", str(c["stream.npy"]), "--context", "3", "--documents", str(c["bad-starts.npy"])),
            ["bad-starts.npy[2] = 40", "strictly increasing"],
        ),
        # The rest run in-process (the same main(); a fresh interpreter costs ~2.5 s on this machine).
        ((*tokens_like, "--embeddings", str(c["other-table.npy"])), ["--embeddings", "other-table.npy"]),
        ((*text_like, "--vocab-size", "9"), ["--vocab-size 9", "vocabulary of 5 tokens"]),
        ((*text_like, "--dim", "5"), ["--dim 5"]),
        ((*text_like, "--seed", "8"), ["--seed 8"]),
        ((*tokens_like, "--symbols", "12"), ["--symbols 12", "S = 9"]),
        ((*tokens_like, "--context", "4"), ["--context 4"]),
        ((*arrays, "--like", str(c["text.zarr"]), "--targets", "7"), ["--targets 7", "T = 6"]),
        ((*arrays, "--like", str(c["tokens.zarr"])), ["query.npy", "D = 4", "D = 6"]),
        (("--tokens", str(c["bad-ids.npy"]), "--like", str(c["tokens.zarr"])), ["bad-ids.npy[150] = 9", "--like"]),
        (("--text", str(c["held-out.txt"]), "--context", "3", "--documents", str(c["starts.npy"])), ["--documents"]),
    ]


IN_A_SUBPROCESS = 3


@pytest.mark.slow
def test_ingest_like_refuses_conflicting_flags_and_bad_documents_in_one_line(tmp_path, corpus_stores):
    cases = ingest_refusals(corpus_stores)[:IN_A_SUBPROCESS]
    outs = [tmp_path / f"out{i}.zarr" for i in range(len(cases))]
    results = run_many(*(("ingest", str(out), *argv) for out, (argv, _) in zip(outs, cases, strict=True)))
    for out, (_, fragments), result in zip(outs, cases, results, strict=True):
        assert_error(result, "ingest", *fragments)
        assert not out.exists(), f"{out} was left behind"


def test_every_refusal_of_ingest_like_names_its_flag(tmp_path, corpus_stores, capsys):
    for i, (argv, fragments) in enumerate(ingest_refusals(corpus_stores)):
        out = tmp_path / f"out{i}.zarr"
        status = main(["ingest", str(out), *argv])
        printed = capsys.readouterr()
        assert_error(subprocess.CompletedProcess(argv, status, printed.out, printed.err), "ingest", *fragments)
        assert not out.exists(), f"{out} was left behind"


@pytest.mark.slow
def test_split_text_and_tokens(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "alpha beta gamma delta epsilon zeta".split()
    for i in range(12):
        (corpus / f"f{i:02d}.txt").write_text(" ".join(words[: 3 + i % 4] * 3) + ".\n", encoding="utf-8")
    np.save(tmp_path / "long.npy", np.random.default_rng(1).integers(0, 9, 3000))
    fractions = ("--fractions", "0.5", "0.25", "0.25")
    text_args = ("--text", str(corpus), "--context", "2", "--vocab-size", "4", *fractions, "--json")
    # The text split is written as token-stream stores (the default), the token split as triples (--format).
    tokens_args = (
        "--tokens", str(tmp_path / "long.npy"), "--block-tokens", "50", "--context", "3", "--dim", "4",
        "--format", "triples",
    )  # fmt: skip
    text_json, tokens_human = run_many(
        ("split", str(tmp_path / "text"), *text_args), ("split", str(tmp_path / "tokens"), *tokens_args, *fractions)
    )
    report = parse_json(text_json)
    assert list(report["stores"]) == ["train", "validation", "test"]
    assert sum(s["documents"] for s in report["stores"].values()) == 12
    assert (report["fractions"], report["split_seed"]) == ([0.5, 0.25, 0.25], 0)
    for name, described in report["stores"].items():
        store = TokenStreamStore.open(tmp_path / "text" / f"{name}.zarr")
        assert described["format"] == "stream"
        assert described["identity"] == report["identity"] == store.identity()
        assert described["rows"] == store.num_rows > 0
        assert store.provenance["split"]["name"] == name
    assert tokens_human.returncode == 0, tokens_human.stderr
    lines = tokens_human.stdout.splitlines()
    for name in ("train", "validation", "test"):
        store = TripleStore.open(tmp_path / "tokens" / f"{name}.zarr")
        documents = store.provenance["split"]["documents"]
        line = next(line for line in lines if line.startswith(name))
        assert f"{store.num_rows:,} rows, {documents:,} documents, {documents * 50:,} tokens" in line, line
    identity = TripleStore.open(tmp_path / "tokens" / "train.zarr").identity()
    assert any(f"identity embedding table {identity['embeddings'][:12]}" in line for line in lines), lines


def test_split_refusals_are_one_line_errors(tmp_path, corpus_stores, capsys):
    np.save(tmp_path / "long.npy", np.random.default_rng(1).integers(0, 9, 1000))
    long = str(tmp_path / "long.npy")
    cases = [
        (("--tokens", long, "--context", "3", "--fractions", "0.5", "0.4", "0.2"), ["--fractions 0.5 0.4 0.2", "sum"]),
        (("--tokens", long, "--context", "3"), ["split gets none of the 1 document with", "--fractions"]),
        (("--text", long, "--context", "2", "--documents", str(corpus_stores["starts.npy"])), ["--documents"]),
        (("--tokens", long, "--context", "3", "--fractions", "0.5", "1", "0.2"), ["--fractions", "(0, 1)"]),
    ]
    for i, (argv, fragments) in enumerate(cases):
        try:
            status = main(["split", str(tmp_path / f"out{i}"), *argv])
        except SystemExit as exited:  # argparse refuses a fraction outside (0, 1) itself, with its usage line
            printed = capsys.readouterr()
            assert exited.code == 2 and all(f in printed.err for f in fragments), printed.err
            continue
        printed = capsys.readouterr()
        assert_error(subprocess.CompletedProcess(argv, status, printed.out, printed.err), "split", *fragments)


def test_a_failed_split_leaves_no_output_folder(tmp_path, capsys):
    """``--block-tokens`` no longer than N is refused before a store is begun; a text split whose documents give no
    rows (known once they are written) removes what it made. No OUT_DIR is left, and one that was there is kept."""
    np.save(tmp_path / "tokens.npy", np.arange(400) % 9)
    text = tmp_path / "text"
    text.mkdir()
    for k in range(30):
        (text / f"f{k}.txt").write_text("a few words on one line\n")
    (tmp_path / "kept").mkdir()
    cases = [
        ("out0", ("--tokens", str(tmp_path / "tokens.npy"), "--context", "8", "--block-tokens", "5"),
         ["block_tokens = 5 (--block-tokens)", "N = 8", "expected more than N tokens a block"]),
        ("out1", ("--text", str(text), "--context", "50"), ["the train split has no rows", "--context"]),
        ("out2", ("--text", str(text), "--context", "50", "--format", "triples"), ["the train split has no rows"]),
        ("kept", ("--text", str(text), "--context", "50"), ["the train split has no rows"]),
    ]  # fmt: skip
    for out, argv, fragments in cases:
        status = main(["split", str(tmp_path / out), *argv])
        printed = capsys.readouterr()
        assert_error(subprocess.CompletedProcess(argv, status, printed.out, printed.err), "split", *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "text", "tokens.npy"]
    assert not any((tmp_path / "kept").iterdir())


def test_split_and_ingest_refuse_a_sorted_stream_store_in_the_same_words(tmp_path, capsys):
    """``--row-order target`` needs ``--format triples`` for ``split`` as for ``ingest``: one line, the same one."""
    np.save(tmp_path / "long.npy", np.random.default_rng(1).integers(0, 9, 1000))
    long = str(tmp_path / "long.npy")
    lines = {}
    for command, argv in {
        "split": ["split", str(tmp_path / "out"), "--tokens", long, "--context", "3", "--row-order", "target"],
        "ingest": ["ingest", "--tokens", long, "--context", "3", "--row-order", "target", str(tmp_path / "s.zarr")],
    }.items():
        status = main(argv)
        printed = capsys.readouterr()
        line = assert_error(subprocess.CompletedProcess(argv, status, printed.out, printed.err), command)
        lines[command] = line.split(": error: ", 1)[1]
    assert lines["split"] == lines["ingest"]
    assert lines["split"].startswith("--row-order target:") and "--format triples" in lines["split"]
    assert not list(tmp_path.glob("*.zarr")) and not (tmp_path / "out").exists()


# -- validate --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_validate_a_sound_and_a_damaged_store(synth_store, tmp_path):
    sound = synth_store[0]
    damaged = copy_of(sound, tmp_path)
    zarr.open_array(str(damaged / "query"), mode="r+")[5, 0] = np.nan
    sound_json, sound_text, damaged_json, damaged_text = run_many(
        ("validate", str(sound), "--json"),
        ("validate", str(sound)),
        ("validate", str(damaged), "--json"),
        ("validate", str(damaged)),
    )

    report = parse_json(sound_json)
    assert report["ok"] is True
    assert report["problems"] == []
    assert report["rows_scanned"] == 3000
    assert report["chunks_scanned"] == 6  # 3000 rows in chunks of 512
    assert sound_text.returncode == 0, sound_text.stderr
    assert str(sound) in sound_text.stdout and "valid" in sound_text.stdout and "3,000 rows" in sound_text.stdout

    assert damaged_json.returncode == 1, damaged_json.stderr
    report = json.loads(damaged_json.stdout)
    assert report["ok"] is False
    assert [(p["array"], p["row"], p["count"]) for p in report["problems"]] == [("query", 5, 1)]
    assert damaged_text.returncode == 1, damaged_text.stderr
    assert str(damaged) in damaged_text.stdout
    assert "array 'query'" in damaged_text.stdout and "row 5" in damaged_text.stdout


@pytest.mark.slow
def test_validate_on_a_scheduler_and_with_an_unreachable_one(synth_store, tmp_path):
    distributed = pytest.importorskip("distributed")
    damaged = copy_of(synth_store[0], tmp_path)
    zarr.open_array(str(damaged / "query"), mode="r+")[5, 0] = np.nan
    # An unreachable scheduler costs the CLI's whole connect timeout (10 s): start that first, use a real one meanwhile.
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    waiting = subprocess.Popen(
        [COMMAND, "validate", str(damaged), "--scheduler", nowhere, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Its worker's threads run in this test process, so under the embedded cluster's settings: with Dask's profiler on
    # (sys._current_frames every 10 ms), Python 3.11 before 3.11.9 can deadlock the process between its GIL and its
    # thread-state lock (CPython gh-106883), and this test hung the suite with its command waiting on the tasks.
    with (
        dask.config.set(embedded_cluster_config()),
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            protocol="tcp",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
    ):
        result = run("validate", str(damaged), "--scheduler", cluster.scheduler_address, "--json")
        keys = {str(entry[0]) for entry in cluster.scheduler.transition_log}
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert [(p["array"], p["row"]) for p in report["problems"]] == [("query", 5)]
    assert (report["rows_scanned"], report["chunks_scanned"]) == (3000, 6)
    assert sum(key.startswith("respattn-validate-") for key in keys) == 3  # one task per partition, on the cluster

    out, err = waiting.communicate(timeout=120)
    assert_error(subprocess.CompletedProcess(waiting.args, waiting.returncode, out, err), "validate", nowhere)


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_inputs_are_one_line_errors(tmp_path, arrays, tokens):
    tokens_path, _ = tokens
    bad_context = np.load(arrays["context"])
    bad_context[17, 2] = 9
    np.save(tmp_path / "bad_context.npy", bad_context)
    missing = tmp_path / "missing.npy"
    query, target = str(arrays["query"]), str(arrays["target"])
    ingest_cases = [
        # (arguments after OUT, what the one-line message must hold)
        (("--arrays", str(arrays["context"]), query, str(missing)), [str(missing), "no such file"]),
        (
            ("--arrays", str(tmp_path / "bad_context.npy"), query, target, "--symbols", "6"),
            ["bad_context.npy", "context[17, 2] = 9", "[0, 6)"],
        ),
        (("--tokens", str(tokens_path)), ["--context"]),
        (
            ("--tokens", str(tokens_path), "--context", "3", "--format", "triples", "--weights", str(arrays["weight"])),
            ["--weights", "not for this source"],
        ),
        (
            ("--tokens", str(tokens_path), "--context", "3", "--weights", str(arrays["weight"])),
            ["--weights", "weight.npy", "(2500,)", "expected one number per token", "(3000,)"],
        ),
    ]
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    zarr.open_group(str(tmp_path / "group.zarr"), mode="w")
    info_cases = [(str(plain_dir), "an empty directory, not a store"), (str(tmp_path / "group.zarr"), "no store")]
    outs = [tmp_path / f"out{i}.zarr" for i in range(len(ingest_cases))]
    results = run_many(
        *(("ingest", str(out), *argv) for out, (argv, _) in zip(outs, ingest_cases, strict=True)),
        *(("info", path) for path, _ in info_cases),
    )
    for out, (_, fragments), result in zip(outs, ingest_cases, results[: len(outs)], strict=True):
        assert_error(result, "ingest", *fragments)
        assert not out.exists(), f"{out} was left behind"
    for (path, fragment), result in zip(info_cases, results[len(outs) :], strict=True):
        assert_error(result, "info", path, fragment)


# -- repair ----------------------------------------------------------------------------------------

INTERRUPTED_APPEND = textwrap.dedent(
    """
    import os
    import sys

    import numpy as np

    from dist_respattn.store import StoreWriter, TripleStore

    path = sys.argv[1]
    store = TripleStore.open(path)
    writer = StoreWriter.append(path, store.schema)
    m = store.partition_rows + 500  # more than a partition: at least one flush reaches the disk
    rng = np.random.default_rng(1)
    context = rng.integers(0, store.schema.num_symbols, (m, store.schema.context_length))
    query = rng.standard_normal((m, store.schema.query_dim)).astype(np.float32)
    target = rng.integers(0, store.schema.num_targets, m)
    writer.write(context, query, target)
    os._exit(1)  # killed: no close, no abort
    """
)


@pytest.mark.slow
def test_repair_rolls_back_an_interrupted_append(synth_store, tmp_path):
    out = copy_of(synth_store[0], tmp_path)
    before = read_all(TripleStore.open(out))
    killed = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_APPEND, str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert killed.returncode == 1, killed.stderr
    assert zarr.open_array(str(out / "query"), mode="r").shape[0] > 3000  # uncommitted rows reached the disk

    assert_error(run("info", str(out)), "info", str(out), "interrupted", "repair")

    repaired = run("repair", str(out), "--json")
    assert parse_json(repaired) == {"url": str(out), "kind": "triples", "rows": 3000, "tokens": None, "removed": []}
    store = TripleStore.open(out)
    assert store.num_rows == 3000
    assert_rows_equal(read_all(store), before)
    for name in ROW_NAMES:
        assert zarr.open_array(str(out / name), mode="r").shape[0] == 3000, name

    valid, again = run_many(("validate", str(out), "--json"), ("repair", str(out)))
    assert parse_json(valid)["ok"] is True
    assert again.returncode == 0, again.stderr  # a complete store is left as it is
    assert str(out) in again.stdout and "3,000 rows" in again.stdout


@pytest.mark.slow
def test_repair_refuses_a_store_whose_array_has_the_wrong_dtype(tmp_path):
    """A complete store whose ``target`` array was rewritten as int64 is not called complete: ``repair`` names the
    array, its dtype and the one expected, says it cannot mend it, exits 2 and leaves the array as it was."""
    out = tmp_path / "s.zarr"
    write_small(out)
    group = zarr.open_group(str(out), mode="r+")
    target = group["target"]
    values = target[:]
    wrong = group.create_array(
        "target", shape=target.shape, dtype="int64", chunks=target.chunks, shards=target.shards, overwrite=True
    )
    wrong[:] = values
    refused = run("repair", str(out))
    assert_error(
        refused, "repair", str(out), "array 'target': dtype int64: expected int32", "cannot mend this", "--overwrite"
    )
    kept = zarr.open_array(str(out / "target"), mode="r")
    assert kept.dtype == np.int64
    np.testing.assert_array_equal(kept[:], values)


# -- behaviour that loses or mixes data (bugs; see the reasons) ------------------------------------


@pytest.mark.slow
def test_a_failed_overwrite_keeps_the_old_store(synth_store, tmp_path, arrays):
    out = copy_of(synth_store[0], tmp_path)
    bad_context = np.load(arrays["context"])
    bad_context[0, 0] = -1
    np.save(tmp_path / "bad_context.npy", bad_context)
    files = (str(tmp_path / "bad_context.npy"), str(arrays["query"]), str(arrays["target"]))
    result = run("ingest", str(out), "--arrays", *files, "--overwrite")
    assert_error(result, "ingest", "context[0, 0] = -1")
    assert TripleStore.open(out).num_rows == 3000


@pytest.mark.slow
def test_overwrite_refuses_a_directory_that_is_not_a_store(tmp_path):
    out = tmp_path / "documents"
    out.mkdir()
    (out / "thesis.txt").write_text("years of work\n")
    result = run(*synth_args(out, 10, "--overwrite"))
    assert_error(result, "synth", str(out))
    assert (out / "thesis.txt").read_text() == "years of work\n"


@pytest.mark.slow
def test_append_tokens_with_another_table_is_refused_or_uses_the_store_table(tmp_path, tokens, tokens_store):
    path, _ = tokens
    np.save(tmp_path / "other.npy", np.random.default_rng(11).standard_normal((9, 6)).astype(np.float32))
    other_tables = {"seed": ("--dim", "6", "--seed", "3"), "embeddings": ("--embeddings", str(tmp_path / "other.npy"))}
    outs = {name: copy_of(tokens_store[0], tmp_path / name) for name in other_tables}
    snapshots = {name: file_snapshot(out) for name, out in outs.items()}
    results = run_many(
        *(
            ("ingest", str(outs[name]), "--tokens", str(path), "--context", "3", "--append", *extra)
            for name, extra in other_tables.items()
        )
    )
    for name, result in zip(other_tables, results, strict=True):
        out = outs[name]
        if result.returncode == 0:
            store = TripleStore.open(out)
            rows = read_all(store)
            table = store.embeddings()
            assert table is not None
            # Every query, old row or new, is the store's embedding of the row's last context token.
            np.testing.assert_array_equal(rows["query"], table[rows["context"][:, -1]], err_msg=name)
        else:
            assert_error(result, "ingest", str(out))
            assert file_snapshot(out) == snapshots[name], name


def test_info_on_text_stores_shows_the_vocabulary_the_oov_share_and_the_top_tokens(tmp_path, corpus_stores, capsys):
    """The train store's vocabulary (K = 5 of 14 tokens: 'ran', 'sat', 'to' are out of it), and a held-out
    stream store written with it, whose own out-of-vocabulary share is its own: 'zebra', 'sat', '!' of 7,
    then 'zebra' of 4 more appended (an append must give rows too). (In-process: the commands' starts would
    cost more than the test.)"""
    c = corpus_stores
    held_out = tmp_path / "held-out.zarr"
    like = ["--text", str(c["held-out.txt"]), "--like", str(c["text.zarr"]), "--format", "stream"]
    assert main(["ingest", str(held_out), *like, "--json"]) == 0

    def info(*args: str) -> str:
        capsys.readouterr()
        assert main(["info", *args]) == 0
        return capsys.readouterr().out

    top = [("the", 4), (".", 2), ("cat", 2), ("mat", 2), ("on", 1)]
    expected = {
        "size": 5,
        "oov_id": 5,
        "tokens": 14,
        "oov_count": 3,
        "oov_share": 3 / 14,
        "counted_on": {"tokens": 14, "documents": 1, "oov_share": 3 / 14},
        "top_tokens": [{"token": t, "count": n, "share": n / 14} for t, n in top],
    }
    assert json.loads(info(str(c["text.zarr"]), "--json"))["vocabulary"] == expected
    assert json.loads(info(str(held_out), "--json"))["vocabulary"] == {**expected, "tokens": 7, "oov_share": 3 / 7}
    text = info(str(held_out))
    assert (
        "vocabulary   5 words + 1 out-of-vocabulary id (5); 42.86% of this store's 7 tokens are out of it; "
        "21.43% of the 14 tokens it was counted on\n" in text
    )
    assert "top tokens   'the' 28.6%, '.' 14.3%, 'cat' 14.3%, 'mat' 14.3%, 'on' 7.1%\n" in text
    assert "vocabulary" not in json.loads(info(str(c["tokens.zarr"]), "--json"))
    more = tmp_path / "more.txt"
    more.write_text("zebra the cat on\n", encoding="utf-8")
    assert main(["ingest", str(held_out), "--text", str(more), "--append", "--json"]) == 0
    appended = json.loads(info(str(held_out), "--json"))["vocabulary"]
    assert (appended["tokens"], appended["oov_count"]) == (11, 4)  # each append counts its own
