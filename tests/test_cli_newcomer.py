"""What a newcomer trips on at the command line: errors in the words of the command typed, counts that read as
numbers, one name for each baseline, and the fit page the demo's cluster serves. A command whose exit or
environment is the point is a subprocess; one whose output is the point runs as the command's ``main`` in this
process (no package import per command)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

from dist_respattn.baselines.ngram import MODEL_LABELS
from tests.test_cli import COMMAND, run, run_here

pytestmark = pytest.mark.slow  # every test here starts a command


def _table(stdout: str, names: list[str]) -> list[str]:
    """The labels of a perplexity table's rows (a label, then a perplexity) that are one of ``names``."""
    rows = (re.match(r"^\s*(\S.*?)\s{2,}-?\d", line) for line in stdout.splitlines())
    return [row.group(1) for row in rows if row and row.group(1) in names]


def test_a_bad_flag_prints_the_usage_of_the_command_typed(tmp_path):
    """argparse leaves a subcommand's unknown arguments to the top parser; the error is the command's own."""
    for argv, command in (
        (("demo", "--no-such-flag"), "demo"),
        (("fit", str(tmp_path / "s.zarr"), "--model-dir", str(tmp_path / "m"), "--no-such-flag"), "fit"),
        (("models", "list", str(tmp_path), "--no-such-flag"), "models list"),
    ):
        done = run(*argv)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"usage: dist-respattn {command} "), done.stderr
        assert f"dist-respattn {command}: error: unrecognized arguments: --no-such-flag" in done.stderr
        assert "started a local cluster" not in done.stderr and not (tmp_path / "m").exists()


def test_the_demo_names_its_fit_page_and_prints_the_baselines_as_evaluate_does(tmp_path):
    """The demo's cluster serves the fit page (beside its dashboard), and the demo says where, even with an HTTP
    proxy in the environment (here one that answers nothing: the page is on the cluster's own host); its table
    names the baselines as ``evaluate`` does on the same model and store."""
    argv = ["--dir", str(tmp_path), "--max-tokens", "60000", "--vocab-size", "200", "--max-iter", "1", "--workers", "1"]
    proxied = {**os.environ, "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "no_proxy": ""}
    done = subprocess.run([COMMAND, "demo", *argv], capture_output=True, text=True, timeout=120, env=proxied)
    assert done.returncode == 0, done.stderr
    dashboard = re.search(r"dashboard: (http://127\.0\.0\.1:\d+)/status$", done.stderr, re.MULTILINE)
    assert dashboard, done.stderr
    assert f"fit page: {dashboard.group(1)}/respattn/fits (" in done.stderr
    labels = ["head", *MODEL_LABELS.values()]
    assert _table(done.stdout, labels) == labels, done.stdout
    assert "head / Kneser-Ney perplexity: " in done.stdout
    # The demo's text output beside its JSON (tests/test_cli.py): one demo run checks both.
    # It names the tokens split, whole files past --max-tokens: those the three stores hold.
    from dist_respattn.store import open_store

    held = sum(open_store(tmp_path / f"{name}.zarr").num_tokens for name in ("train", "validation", "test"))
    assert held > 60_000
    assert f"split {held:,} tokens of the Python standard library's source" in done.stderr
    assert "Kneser-Ney 5-gram" in done.stdout and "head / Kneser-Ney 5-gram perplexity:" in done.stdout

    scored = run("evaluate", str(tmp_path / "model"), str(tmp_path / "test.zarr"), "--workers", "1")
    assert scored.returncode == 0, scored.stderr
    assert _table(scored.stdout, labels) == labels, scored.stdout
    assert "head / Kneser-Ney perplexity: " in scored.stdout


def test_a_directory_of_extensionless_files_is_refused_with_the_glob_that_reads_them(tmp_path, capsys):
    """A directory is searched by suffix; files of other names are read when a glob names them, and the error gives
    that glob, which then works."""
    text = (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text(encoding="utf-8")
    flat, nested = tmp_path / "flat", tmp_path / "nested"
    for folder in (flat, nested / "part"):
        folder.mkdir(parents=True)
        (folder / "CHAPTER1").write_text(text, encoding="utf-8")
        (folder / "CHAPTER2").write_text(text, encoding="utf-8")
    for corpus, pattern in ((flat, f"{flat}/*"), (nested, f"{nested}/**/*")):
        out = tmp_path / f"{corpus.name}.zarr"
        refused = run_here(capsys, "ingest", "--text", str(corpus), "--context", "3", str(out))
        assert refused.returncode == 2
        assert f"no text files under {corpus}" in refused.stderr
        assert "2 files of other names" in refused.stderr
        assert f"--text '{pattern}' (quoted" in refused.stderr, refused.stderr
        done = run_here(capsys, "ingest", "--text", pattern, "--context", "3", str(out))
        assert done.returncode == 0, done.stderr
        assert "the store now holds" in done.stdout


def test_validate_prints_counts_with_thousands_separators(tmp_path, capsys):
    """``validate`` names what it scanned, as a number a person reads: rows of a triple store, tokens of a stream; its
    ``--json`` names the unit beside the count."""
    corpus = Path(sysconfig.get_paths()["stdlib"]) / "json"
    for kind, unit in (("stream", "tokens"), ("triples", "rows")):
        out = tmp_path / f"{kind}.zarr"
        done = run_here(capsys, "ingest", "--text", str(corpus), "--context", "3", "--format", kind, str(out))
        assert done.returncode == 0, done.stderr
        checked = run_here(capsys, "validate", str(out))
        assert checked.returncode == 0, checked.stderr
        counted = re.search(rf": valid \(([\d,]+) {unit}, ", checked.stdout)
        assert counted, checked.stdout
        assert "," in counted.group(1) and int(counted.group(1).replace(",", "")) > 1000
        # --json says what it counted too: a stream store's tokens are more than its rows.
        report = json.loads(run_here(capsys, "validate", str(out), "--json").stdout)
        assert (report["rows_scanned"], report["unit"]) == (int(counted.group(1).replace(",", "")), unit)


def test_a_demo_too_small_to_split_names_the_demos_own_flags(tmp_path):
    """The split's advice (--fractions, --split-seed) names flags the demo does not take: the demo gives its own."""
    done = run("demo", "--dir", str(tmp_path / "demo"), "--max-tokens", "1000")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("dist-respattn demo: error: --max-tokens 1,000 takes "), done.stderr
    assert "--fractions" not in done.stderr and "--split-seed" not in done.stderr
    assert "started a local cluster" not in done.stderr


def test_info_on_a_small_store_reads_in_its_own_sizes(tmp_path, capsys):
    """A 22 KiB store is not "0.0 MiB on disk"; a partition size is a bound ("of up to"); long array names keep
    the table's columns aligned."""
    sources = sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))
    store = str(tmp_path / "s.zarr")
    made = run_here(capsys, "ingest", "--text", *map(str, sources), "--vocab-size", "150", "--context", "4", store)
    assert made.returncode == 0, made.stderr
    done = run_here(capsys, "info", store)
    assert done.returncode == 0, done.stderr
    assert "0.0 MiB" not in done.stdout and re.search(r"\d KiB on disk", done.stdout), done.stdout
    assert " partition of up to " in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("  ") and "uncompressed" in line]
    dtype_columns = {re.match(r"^  \S+ +", line).end() for line in rows}  # where each row's dtype starts
    assert len(rows) >= 2 and len(dtype_columns) == 1, done.stdout


def test_split_counts_the_documents_its_stores_hold_as_info_does(tmp_path, capsys):
    """An empty file is assigned to a split but becomes no document: split's summary counts what the store holds,
    as ``info`` does, and ``info`` calls what the split assigned files."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for package in ("json", "http", "email"):
        for path in sorted(Path(sysconfig.get_paths()["stdlib"], package).glob("*.py")):
            (corpus / f"{package}_{path.name}").write_text(path.read_text())
    for k in range(6):
        (corpus / f"empty{k}.py").write_text("")
    done = run_here(
        capsys, "split", str(tmp_path / "out"), "--text", str(corpus), "--context", "4", "--vocab-size", "100", "--json"
    )
    assert done.returncode == 0, done.stderr
    stores = json.loads(done.stdout)["stores"]
    assigned = 0
    for name, store in stores.items():
        info = json.loads(run_here(capsys, "info", store["url"], "--json").stdout)
        assert store["documents"] == info["documents"], name
        assigned += info["provenance"]["split"]["documents"]
        assert "files assigned by a " in run_here(capsys, "info", store["url"]).stdout
    assert sum(store["documents"] for store in stores.values()) == assigned - 6  # the empty files


def test_a_value_that_looks_like_a_flag_is_reported_by_the_flag_that_takes_it(tmp_path):
    """``--tol -1e-3`` is argparse's own "expected one argument" for --tol, not an unknown option ``-1e-3``."""
    done = run("fit", str(tmp_path / "s.zarr"), "--model-dir", str(tmp_path / "m"), "--tol", "-1e-3")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == "dist-respattn fit: error: argument --tol: expected one argument"


def test_sample_without_a_prompt_opens_with_the_start_of_a_document_not_its_whole_window(tmp_path, capsys):
    """A head of a long window (a repeat gate's N is 100,000) printed a whole file as its opening: the opening is the
    first few tokens of a document of the store, whatever N, and the help says how many."""
    from dist_respattn import random_distribution
    from dist_respattn.artifacts.checkpoints import LATEST, ModelDir
    from dist_respattn.cli.head_commands import OPENING_TOKENS
    from dist_respattn.store import open_store, write_stream_text
    from dist_respattn.store.predictions import target_words

    sources = sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))
    store = write_stream_text(tmp_path / "s.zarr", sources, 4, vocab_size=100)
    schema = store.schema
    model = ModelDir(tmp_path / "model")
    head = random_distribution(schema.num_symbols, 200, schema.query_dim, schema.num_targets, seed=0)
    model.write("ckpt-000001-0123abcd", head, {"iteration": 1, "store": {"url": str(store.location)}})
    model.point(LATEST, "ckpt-000001-0123abcd", iteration=1, state="running")
    done = run_here(capsys, "sample", str(model.path), "--tokens", "5", "--seed", "3", "--json")
    assert done.returncode == 0, done.stderr
    prompt = json.loads(done.stdout)["prompt"]
    opened = open_store(store.location)
    words = target_words(opened.vocabulary(), schema.num_targets)
    assert words is not None
    starts = opened.document_starts()
    openings = [[words[t] for t in opened.read_tokens(int(s), int(s) + OPENING_TOKENS)] for s in starts]
    assert len(prompt) == OPENING_TOKENS < head.context_length and prompt in openings
    text = run_here(capsys, "sample", str(model.path), "--tokens", "5", "--seed", "3")
    assert text.stdout.splitlines()[0] == " ".join(prompt) + " ..."
    helped = run("sample", "--help")
    assert f"the first {OPENING_TOKENS} tokens, at most N," in " ".join(helped.stdout.split())


def test_split_counts_the_same_documents_in_either_format_and_for_the_same_tokens_and_names_empty_files(
    tmp_path, capsys
):
    """A text file with no token becomes no document: the text split counts the documents its stores hold whether
    it writes streams or triples, as many as a token split of the same documents, and says how many files it
    skipped (in its summary, its --json and info)."""
    import numpy as np

    from dist_respattn.store import write_stream_text

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    rng = np.random.default_rng(0)
    for k in range(30):
        (corpus / f"doc{k:02d}.txt").write_text(" ".join(rng.choice(words, 60)) + "\n")
    for k in range(6):
        (corpus / f"empty{k}.txt").write_text("" if k % 2 else "\n  \n")
    whole = write_stream_text(tmp_path / "whole.zarr", [corpus], 4)
    np.save(tmp_path / "tokens.npy", whole.read_tokens(0, whole.num_tokens))
    np.save(tmp_path / "starts.npy", whole.document_starts())
    given = {
        "stream": ("--text", str(corpus)),
        "triples": ("--text", str(corpus), "--format", "triples"),
        "tokens": ("--tokens", str(tmp_path / "tokens.npy"), "--documents", str(tmp_path / "starts.npy")),
    }
    reports, texts = {}, {}
    for kind, source in given.items():
        done = run_here(capsys, "split", str(tmp_path / kind), *source, "--context", "4", "--json")
        assert done.returncode == 0, done.stderr
        reports[kind] = json.loads(done.stdout)["stores"]
        texts[kind] = run_here(capsys, "split", str(tmp_path / f"{kind}-text"), *source, "--context", "4").stdout
    assert {kind: sum(store["documents"] for store in stores.values()) for kind, stores in reports.items()} == {
        "stream": 30, "triples": 30, "tokens": 30,
    }  # fmt: skip
    for kind, stores in reports.items():
        assert sum(store["empty_files"] for store in stores.values()) == (0 if kind == "tokens" else 6), kind

    def counts(kind: str) -> list[tuple[int, int]]:
        return [(store["documents"], store["empty_files"]) for store in reports[kind].values()]

    assert counts("stream") == counts("triples")  # a text file goes to the same split in either format
    for kind in ("stream", "triples"):
        skipped = [(name, s["empty_files"]) for name, s in reports[kind].items() if s["empty_files"]]
        lines = texts[kind].splitlines()
        for name, count in skipped:
            (line,) = [line for line in lines if line.startswith(name)]
            assert line.endswith(f"({count} empty file{'s' if count > 1 else ''} skipped)"), line
        name, count = skipped[0]
        info = run_here(capsys, "info", reports[kind][name]["url"]).stdout
        assert f"; {count} empty file{'s' if count > 1 else ''} skipped (no token: no document)" in info
    assert "skipped" not in texts["tokens"]
