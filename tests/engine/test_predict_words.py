"""Answers in words: ``predict --out FILE.jsonl|.csv``, ``predict --stream`` and ``sample`` on a real text store.

The store is ingested from the standard library's ``json`` package by ``dist-respattn ingest --text``, a head is
fitted on it by ``dist-respattn fit``, and every command runs as a subprocess on this module's cluster. The files
are checked against ``predict_proba`` computed in this process and against the store's vocabulary.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.engine import load_model, predict
from dist_respattn.model.streaming import Predictor
from dist_respattn.store.predictions import OOV_WORD, target_words
from dist_respattn.store.rows import open_store

from .conftest import ROWS, small_truth
from .test_predict import all_rows

pytestmark = pytest.mark.slow  # every test here starts commands or uses the module's cluster

COMMAND = str(Path(sys.executable).parent / "dist-respattn")
TOP = 3


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([COMMAND, *args], input=stdin, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory, client):
    """``(store, model directory)``: a token-stream store of the ``json`` package's sources (vocabulary of 150
    words, N = 3) and a head fitted on it for two iterations."""
    base = tmp_path_factory.mktemp("words")
    corpus = base / "corpus"
    shutil.copytree(
        os.path.join(sysconfig.get_paths()["stdlib"], "json"), corpus, ignore=shutil.ignore_patterns("__pycache__")
    )
    store, model = str(base / "text.zarr"), str(base / "model")
    done = cli("ingest", "--text", str(corpus), "--vocab-size", "150", "--dim", "4", "--context", "3", store, "--json")
    assert done.returncode == 0, done.stderr
    done = cli("fit", store, "--model-dir", model, "--head", "single", "--max-iter", "2", "--scheduler",
               client.scheduler.address, "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return store, model


def expected_top(model_dir, store, k):
    """``(ids (n, k), probabilities (n, k), targets (n,))``: the stable top ``k`` of predict_proba over every row."""
    context, query, target = all_rows(store)
    proba = load_model(model_dir).predict_proba(context, query)
    order = np.argsort(-proba, kind="stable")[:, :k]
    return order, np.take_along_axis(proba, order, axis=1), target


def test_predict_out_jsonl_gives_each_rows_top_k_in_ids_words_and_probabilities(text_model, client, tmp_path):
    store, model = text_model
    out = tmp_path / "answers.jsonl"
    done = cli("predict", model, store, "--top", str(TOP), "--out", str(out), "--scheduler", client.scheduler.address,
               "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["format"], report["words"], report["out"]) == ("jsonl", True, str(out))
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    ids, probs, target = expected_top(model, store, TOP)
    assert len(lines) == report["rows"] == ids.shape[0] > 1000
    vocabulary = open_store(store).vocabulary()
    assert vocabulary is not None
    tokens = vocabulary["tokens"]
    assert [line["row"] for line in lines] == list(range(len(lines)))
    assert set(lines[0]) == {"row", "target", "target_word", "ids", "words", "probabilities"}
    np.testing.assert_array_equal(np.array([line["ids"] for line in lines]), ids)
    np.testing.assert_allclose(np.array([line["probabilities"] for line in lines]), probs, rtol=1e-12, atol=1e-300)
    np.testing.assert_array_equal([line["target"] for line in lines], target)
    for line in lines:
        # The words are the vocabulary's entries for the ids (the out-of-vocabulary id is "<oov>").
        assert line["words"] == [tokens[i] if i < len(tokens) else OOV_WORD for i in line["ids"]]
        assert line["target_word"] == (tokens[line["target"]] if line["target"] < len(tokens) else OOV_WORD)
    predicted = {w for line in lines for w in line["words"]}
    assert OOV_WORD in predicted and len(predicted) > 10  # real words, not only the out-of-vocabulary one
    # Written once: the same file again is refused in one line, before any cluster, unless --overwrite.
    again = cli("predict", model, store, "--out", str(out), "--workers", "1")
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "pass --overwrite" in again.stderr
    assert "cluster" not in again.stderr.lower()


def test_predict_out_csv_has_one_line_a_row_with_the_ranked_ids_words_and_probabilities(text_model, client, tmp_path):
    store, model = text_model
    out = tmp_path / "answers.csv"
    done = cli("predict", model, store, "--top", str(TOP), "--out", str(out), "--scheduler", client.scheduler.address)
    assert done.returncode == 0, done.stderr
    assert f"into {out} (1 partition, " in done.stdout
    with open(out, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    assert header == ["row", "target", "target_word", "id_1", "word_1", "probability_1", "id_2", "word_2",
                      "probability_2", "id_3", "word_3", "probability_3"]  # fmt: skip
    ids, probs, target = expected_top(model, store, TOP)
    words = target_words(open_store(store).vocabulary(), load_model(model).num_targets)
    assert words is not None and len(rows) == ids.shape[0]
    got_ids = np.array([[int(r[f"id_{k}"]) for k in range(1, TOP + 1)] for r in rows])
    got_probs = np.array([[float(r[f"probability_{k}"]) for k in range(1, TOP + 1)] for r in rows])
    np.testing.assert_array_equal(got_ids, ids)
    # CSV keeps every float's shortest round-trip text: the same doubles as the JSON Lines file.
    np.testing.assert_allclose(got_probs, probs, rtol=1e-12, atol=1e-300)
    np.testing.assert_array_equal([int(r["row"]) for r in rows], np.arange(len(rows)))
    np.testing.assert_array_equal([int(r["target"]) for r in rows], target)
    for r in rows:
        assert [r[f"word_{k}"] for k in range(1, TOP + 1)] == [words[int(r[f"id_{k}"])] for k in range(1, TOP + 1)]
        assert r["target_word"] == words[int(r["target"])]


def test_a_file_of_rows_follows_the_partitions_in_order_and_a_store_without_vocabulary_has_no_words(
    small_store, client, tmp_path
):
    """Five partitions written as they are predicted, in row order; no word columns without a vocabulary."""
    model = small_truth(seed=3)
    run = predict(model, small_store, out=tmp_path / "p.csv", top_k=2, client=client, progress=False)
    assert (run.format, run.words, run.partitions, run.rows) == ("csv", False, 5, ROWS)
    context, query, target = all_rows(small_store)
    proba = model.predict_proba(context, query)
    order = np.argsort(-proba, kind="stable")[:, :2]
    with open(tmp_path / "p.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["row", "target", "id_1", "probability_1", "id_2", "probability_2"]
    table = np.array(rows[1:], dtype=np.float64)
    np.testing.assert_array_equal(table[:, 0], np.arange(ROWS))
    np.testing.assert_array_equal(table[:, 1], target)
    np.testing.assert_array_equal(table[:, [2, 4]], order)
    np.testing.assert_allclose(table[:, [3, 5]], np.take_along_axis(proba, order, axis=1), rtol=1e-12, atol=1e-300)
    run = predict(model, small_store, out=tmp_path / "p.jsonl", top_k=1, client=client, progress=False)
    first = json.loads((tmp_path / "p.jsonl").read_text().splitlines()[0])
    assert set(first) == {"row", "target", "ids", "probabilities"} and run.format == "jsonl"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "p.jsonl"]  # no temporary left beside them


def test_predict_refuses_a_parquet_or_a_remote_file_in_one_line_before_any_cluster(text_model, tmp_path):
    store, model = text_model
    done = cli("predict", model, store, "--out", str(tmp_path / "x.parquet"), "--workers", "1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "Parquet is not written" in done.stderr and ".jsonl" in done.stderr
    done = cli("predict", model, store, "--out", "s3://bucket/x.jsonl", "--workers", "1")
    assert done.returncode == 2 and "give a local path" in done.stderr
    assert not list(tmp_path.iterdir())


def test_predict_stream_gives_words_and_ids_and_reports_the_start_up_apart(text_model):
    store, model = text_model
    text = "def encode(self, o):\n    return json.dumps(o, indent=4)\n"
    done = cli("predict", model, store, "--stream", "--top", str(TOP), stdin=text)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    head = load_model(model)
    opened = open_store(store)
    words = target_words(opened.vocabulary(), head.num_targets)
    assert words is not None
    lookup = {w: i for i, w in enumerate(words[:-1])}
    predictor = Predictor(head, opened.embeddings(), words=words)
    assert len(lines) > 10
    for line in lines:
        predictor.push(lookup.get(line["token"], len(words) - 1))
        ids, probs = predictor.top_k(TOP)
        assert line["ids"] == ids.tolist()
        assert [w for w, _ in line["top"]] == [words[i] for i in line["ids"]]
        np.testing.assert_allclose([p for _, p in line["top"]], probs, rtol=0, atol=1e-8)  # printed to 8 places
    assert "ready in " in done.stderr and f"predicted after {len(lines)} tokens" in done.stderr
    report = cli("predict", model, store, "--stream", "--top", str(TOP), "--json", stdin=text).stdout
    # stdout stays JSON lines: the token lines as without --json, then the summary as one line more.
    *token_lines, summary = (json.loads(line) for line in report.splitlines())
    assert token_lines == lines
    assert summary["startup_seconds"] > 0 and summary["tokens"] == len(lines)
    # The state is bounded by the model's window (a repeat gate's: the history's last N tokens), not the history.
    assert summary["window"] == head.context_length and 0 < summary["state_counts"]
    assert f"within the model's window of {head.context_length:,} tokens, whatever its length" in done.stderr
    # Both figures are rounded (the seconds to the microsecond, the rate to 0.01 µs): they agree to those roundings,
    # which at tens of microseconds a token over ~20 tokens exceed a relative 1e-3.
    rounding = 0.5 / len(lines) + 0.005 + 1e-9
    assert summary["microseconds_per_token"] == pytest.approx(1e6 * summary["seconds"] / len(lines), abs=rounding)


def test_predict_stream_reads_bytes_that_are_not_utf8_as_ingest_does(text_model):
    """A byte that is not UTF-8 on stdin is read as U+FFFD, as ``ingest --text`` reads it: no traceback, and no lone
    surrogate in the JSON lines (which a strict UTF-8 reader refuses)."""
    store, model = text_model
    done = subprocess.run(
        [COMMAND, "predict", model, store, "--stream", "--top", "1"],
        input=b"def caf\xe9(self):\n    return \xff\n", capture_output=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    tokens = [json.loads(line)["token"] for line in done.stdout.decode("utf-8").splitlines()]
    assert any("\ufffd" in token for token in tokens), tokens
    for token in tokens:
        token.encode("utf-8")  # a lone surrogate raises here


def test_predict_stream_ends_quietly_when_its_reader_leaves(text_model, tmp_path):
    """``predict --stream | head -1``: once the reader has closed the pipe, the command stops reading and ends with
    its summary, exit 0, as the other commands do when their output's reader leaves. Before, the closed pipe was a
    one-line error ``[Errno 32] Broken pipe`` with exit status 2."""
    store, model = text_model
    history = tmp_path / "history.txt"
    history.write_text("def encode(self, o):\n" * 20_000)
    with history.open() as stdin:
        process = subprocess.Popen(
            [COMMAND, "predict", model, store, "--stream", "--top", str(TOP)],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert process.stdout is not None and process.stderr is not None
        first = json.loads(process.stdout.readline())
        process.stdout.close()
        said = process.stderr.read()
        process.stderr.close()
        assert process.wait(timeout=120) == 0, said
    assert first["position"] == 1 and first["token"] == "def"
    lines = said.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ready in ") and "predicted after" in lines[0], said


def test_sample_generates_from_a_plain_head_reproducibly_from_a_short_prompt(text_model):
    store, model = text_model
    runs = [cli("sample", model, "--tokens", "25", "--seed", s, "--prompt", "def", "--json") for s in "445"]
    for done in runs:
        assert done.returncode == 0, done.stderr
    first, again, other = (json.loads(done.stdout) for done in runs)
    assert first["tokens"] == again["tokens"] and first["tokens"] != other["tokens"] and len(first["ids"]) == 25
    assert first["prompt"] == ["def"] and first["mix"] is None
    words = target_words(open_store(store).vocabulary(), load_model(model).num_targets)
    assert words is not None
    assert all(0 <= i < len(words) for i in first["ids"]) and first["tokens"] == [words[i] for i in first["ids"]]
    # Without a prompt, it opens with a document of the store; in text, the prompt then the tokens.
    done = cli("sample", model, "--tokens", "5", "--seed", "1")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2
    refused = cli("sample", model, "--attribute", "json", "--tokens", "5")
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        f"dist-respattn sample: error: --attribute json: an option of gated heads, and {model} holds a single-hop "
        "head, which takes none: leave it out"
    ]


def test_sample_refuses_an_empty_prompt_as_a_blank_one(text_model):
    """``--prompt ""`` (e.g. ``--prompt "$TEXT"`` with TEXT unset) holds no token, as ``--prompt " "`` does: one
    line naming the flag, exit 2. Before, the empty prompt was taken for none given, and the text opened with a
    document of the store."""
    _, model = text_model
    for prompt in ("", " "):
        done = cli("sample", model, "--tokens", "5", "--prompt", prompt)
        assert (done.returncode, done.stdout) == (2, ""), (prompt, done.stdout, done.stderr)
        assert done.stderr.splitlines() == [
            f"dist-respattn sample: error: --prompt {prompt!r} holds no token: give some text to start from"
        ]


def test_a_single_heads_predict_refuses_a_gated_heads_options_with_stream_or_without(text_model, tmp_path):
    """``--attribute`` and ``--mix`` are a gated head's: on a single head's model ``predict`` ignored them without
    ``--stream`` (and a kind other than the single head's ignored them with it). Each is refused in one line naming
    the flag, with ``--stream`` the model's kind, before a cluster starts or a file is written."""
    store, model = text_model
    out = tmp_path / "top.jsonl"
    for flag, value in (("--attribute", "json"), ("--mix", "json=0.5,email=0.5")):
        done = cli("predict", model, store, "--out", str(out), flag, value, "--workers", "1")
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr.splitlines() == [
            f"dist-respattn predict: error: {flag} {value}: an option of gated heads for --stream (one history read "
            "from stdin); predicting a store, each row is predicted as the store holds it: give --stream, or leave "
            "it out"
        ]
        done = cli("predict", model, store, "--stream", flag, value, stdin="def encode(self, o):\n")
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr.splitlines() == [
            f"dist-respattn predict: error: {flag} {value}: an option of gated heads, and {model} holds a single-hop "
            "head, which takes none: leave it out"
        ]
    assert not out.exists()


def test_predict_stream_typed_on_a_terminal_says_what_it_waits_for(text_model):
    """With stdin a terminal (a person typing, not a pipe) the command says what to type and how to end before it
    waits; each line typed gets its predictions, and Ctrl-D ends it with the summary."""
    import pty
    import select

    store, model = text_model
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [COMMAND, "predict", model, store, "--stream", "--top", str(TOP)],
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, seconds: float = 60.0) -> None:
        nonlocal seen
        deadline = time.monotonic() + seconds
        while marker not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:  # EIO: the command exited and closed the terminal
                    break

    try:
        read_until(b"Ctrl-D ends")
        assert b"ready: type words" in seen, seen
        os.write(master, b"def encode\n")
        read_until(b'"ids"')
        os.write(master, b"\x04")  # Ctrl-D at the start of a line: end of input
        read_until(b"predicted after")
        assert process.wait(timeout=60) == 0, seen
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    text = seen.decode()
    assert text.count('"ids"') == 2 and "predicted after 2 tokens" in text, text
