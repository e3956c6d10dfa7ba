"""Writer errors name their source (the file, or the argument), the array, and the row across the whole input."""

from __future__ import annotations

import re

import numpy as np
import pytest

import dist_respattn.store.ingest.tokens as tokens_module
from dist_respattn.store import (
    SchemaMismatchError,
    StoreError,
    StoreSchema,
    StoreWriter,
    TokenCorpus,
    TripleStore,
    WriteOptions,
    write_arrays,
    write_split,
    write_synthetic,
    write_tokens,
)
from tests.store.helpers import SMALL, D, N, S, T, assert_rows, random_rows, write_small

BIG = 20_000  # rows of the .npy inputs, written in 4,096-row blocks: the bad row 12345 is in the fourth


def save_inputs(folder, rows: dict) -> dict:
    paths = {}
    for name, values in rows.items():
        paths[name] = folder / f"{name}.npy"
        np.save(paths[name], values)
    return paths


def write_files(out, paths, **kwargs):
    return write_arrays(
        out,
        paths["context"],
        paths["query"],
        paths["target"],
        paths.get("weight"),
        num_symbols=S,
        num_targets=T,
        options=kwargs.pop("options", WriteOptions(chunk_rows=1024, partition_rows=4096)),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("array", "index", "value", "expected"),
    [
        ("context", (12345, 2), S + 7, rf"context\[12345, 2\] = {S + 7}: expected a symbol id in \[0, {S}\)"),
        ("context", (12345, 0), -1, rf"context\[12345, 0\] = -1: expected a symbol id in \[0, {S}\)"),
        ("target", (12345,), T, rf"target\[12345\] = {T}: expected a target id in \[0, {T}\)"),
        ("query", (12345, 1), np.nan, r"query\[12345, 1\] = nan: expected a finite value"),
        ("query", (12345, 0), -np.inf, r"query\[12345, 0\] = -inf: expected a finite value"),
        ("weight", (12345,), -0.5, r"weight\[12345\] = -0.5: expected a finite weight >= 0"),
    ],
)
def test_a_bad_value_in_an_npy_file_names_the_file_and_the_global_row(tmp_path, array, index, value, expected):
    rows = random_rows(BIG, weighted=True)
    rows[array] = rows[array].astype(np.float64) if array in ("query", "weight") else rows[array]
    rows[array][index] = value
    paths = save_inputs(tmp_path, rows)
    # An id's refusal goes on to say what set its range: num_symbols (--symbols) or num_targets (--targets) here.
    why = {"context": f" (S = {S} from --symbols: give a larger --symbols S, or fix the id)",
           "target": f" (T = {T} from --targets: give a larger --targets T, or fix the id)"}.get(array, "")  # fmt: skip
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(paths[array]))}: {expected} \(1 row in this block\){re.escape(why)}$"
    ):
        write_files(tmp_path / "s.zarr", paths)
    assert not (tmp_path / "s.zarr").exists()


def test_mismatched_row_counts_name_both_files(tmp_path):
    rows = random_rows(BIG)
    rows["target"] = rows["target"][:-1]
    paths = save_inputs(tmp_path, rows)
    message = f"{paths['target']}: {BIG - 1} rows but {paths['context']} has {BIG}: expected one row per triple"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        write_files(tmp_path / "s.zarr", paths)
    assert not (tmp_path / "s.zarr").exists()


def test_mismatched_row_counts_of_in_memory_arrays_name_the_arrays(tmp_path):
    rows = random_rows(100)
    with pytest.raises(ValueError, match=r"^query: 99 rows but context has 100"):
        write_arrays(tmp_path / "s.zarr", rows["context"], rows["query"][:99], rows["target"])


def test_an_id_too_large_to_size_s_or_t_by_is_refused_at_its_row_before_anything_is_written(tmp_path):
    """Without --symbols/--targets, S and T come from the largest ids: one stray id of 5,000,000 would size the
    store's and every fit's tables by it. Refused at its row, naming the flag; given S, the id is allowed."""
    rows = random_rows(50)
    rows["context"][7, 1] = 5_000_000
    with pytest.raises(
        ValueError, match=r"^context: row 7 holds the id 5,000,000, which would make S = 5,000,001 .*--symbols S"
    ):
        write_arrays(tmp_path / "s.zarr", rows["context"], rows["query"], rows["target"])
    assert not (tmp_path / "s.zarr").exists()
    rows = random_rows(50)
    rows["target"][3] = 2**40
    with pytest.raises(ValueError, match=r"^target: row 3 holds the id 1,099,511,627,776, .*--targets T"):
        write_arrays(tmp_path / "s.zarr", rows["context"], rows["query"], rows["target"])
    rows = random_rows(50)
    rows["context"][0, 0] = 2_000_000
    write_arrays(tmp_path / "given.zarr", rows["context"], rows["query"], rows["target"], num_symbols=2_000_001)


def test_wrong_dimensions_and_dtypes_name_the_file(tmp_path):
    rows = random_rows(50)
    rows["context"] = rows["context"][:, 0]
    paths = save_inputs(tmp_path, rows)
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(paths['context']))}: context has shape \(50,\): expected 2"
    ):
        write_files(tmp_path / "s.zarr", paths)
    rows = random_rows(50)
    rows["target"] = rows["target"].astype(np.float32)
    paths = save_inputs(tmp_path, rows)
    with pytest.raises(TypeError, match=rf"^{re.escape(str(paths['target']))}: target has dtype float32"):
        write_files(tmp_path / "s2.zarr", paths)
    assert not (tmp_path / "s2.zarr").exists()


def test_missing_and_unreadable_npy_files_are_named(tmp_path):
    rows = random_rows(50)
    paths = save_inputs(tmp_path, rows)
    paths["query"] = tmp_path / "absent.npy"
    with pytest.raises(FileNotFoundError, match=r"absent\.npy: no such file \(the query array\)"):
        write_files(tmp_path / "s.zarr", paths)
    (tmp_path / "text.npy").write_text("not numpy", encoding="utf-8")
    paths["query"] = tmp_path / "text.npy"
    with pytest.raises(ValueError, match=r"text\.npy: not a readable \.npy array"):
        write_files(tmp_path / "s.zarr", paths)
    assert not (tmp_path / "s.zarr").exists()


def test_a_negative_token_names_its_position_in_the_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)
    tokens = np.random.default_rng(0).integers(0, 10, 1000)
    tokens[[250, 800]] = -4
    with pytest.raises(ValueError, match=r"^tokens\[250\] = -4: expected a token id in \[0, 10\)"):
        write_tokens(tmp_path / "a.zarr", tokens, 3, options=SMALL)
    np.save(tmp_path / "tokens.npy", tokens)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'tokens.npy'))}\[250\] = -4"):
        write_tokens(tmp_path / "b.zarr", tmp_path / "tokens.npy", 3, num_symbols=10, options=SMALL)
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()


def test_bad_token_streams_and_tables_are_refused(tmp_path):
    with pytest.raises(ValueError, match="expected a 1-d array of integer token ids"):
        write_tokens(tmp_path / "a.zarr", np.zeros((4, 4), dtype=int), 2)
    with pytest.raises(ValueError, match="expected a 1-d array of integer token ids"):
        write_tokens(tmp_path / "a.zarr", np.zeros(10), 2)
    with pytest.raises(ValueError, match="context_length = 0"):
        write_tokens(tmp_path / "a.zarr", np.arange(10), 0)
    with pytest.raises(ValueError, match=r"embeddings: shape \(5, 3\): expected \(10 or more, D\) rows"):
        write_tokens(tmp_path / "a.zarr", np.arange(10), 2, embeddings=np.ones((5, 3)))
    table = np.ones((10, 3))
    table[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"embeddings: entry \[7, 2\] is not finite"):
        write_tokens(tmp_path / "a.zarr", np.arange(10), 2, embeddings=table)
    with pytest.raises(ValueError, match="not both"):
        write_tokens(tmp_path / "a.zarr", np.arange(10), 2, embeddings=np.ones((10, 3)), dim=3)
    assert not (tmp_path / "a.zarr").exists()


def test_a_writer_names_the_source_and_counts_rows_across_writes(tmp_path):
    writer = StoreWriter.create(tmp_path / "s.zarr", StoreSchema(S, N, D, T), chunk_rows=64, partition_rows=256)
    with writer:
        rows = random_rows(300)
        writer.write(rows["context"], rows["query"], rows["target"], source="part-1.bin")
        rows["context"][17, 3] = S
        with pytest.raises(ValueError, match=rf"^part-2\.bin: context\[317, 3\] = {S}"):
            writer.write(rows["context"], rows["query"], rows["target"], source="part-2.bin")
        with pytest.raises(SchemaMismatchError, match="the store is unweighted: weights were given"):
            writer.write(rows["context"], rows["query"], rows["target"], np.ones(300))
        with pytest.raises(ValueError, match=r"query has shape \(300, 2\): expected \(300, 3\)"):
            writer.write(rows["context"], rows["query"][:, :2], rows["target"])
    # The refused blocks added nothing; leaving the block closed the writer.
    store = TripleStore.open(tmp_path / "s.zarr")
    assert store.num_rows == 300
    assert_rows(store.read_rows(0, 300), *(random_rows(300)[k] for k in ("context", "query", "target")))


def test_a_fortran_ordered_npy_file_is_refused_naming_it(tmp_path):
    rows = random_rows(50)
    paths = save_inputs(tmp_path, rows)
    np.save(paths["query"], np.asfortranarray(rows["query"]))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(paths['query']))}: is stored in Fortran order"):
        write_files(tmp_path / "s.zarr", paths)
    assert not (tmp_path / "s.zarr").exists()


def test_a_truncated_npy_file_is_named(tmp_path):
    rows = random_rows(5000)
    paths = save_inputs(tmp_path, rows)
    with open(paths["query"], "r+b") as handle:
        handle.truncate(paths["query"].stat().st_size - 1000)
    with pytest.raises(ValueError, match=re.escape(str(paths["query"]))):
        write_files(tmp_path / "s.zarr", paths)
    assert not (tmp_path / "s.zarr").exists()


def test_an_existing_store_is_refused_naming_a_keyword_the_writer_called_takes(tmp_path):
    """Every public writer takes ``options=WriteOptions(...)`` (none takes ``overwrite=``): the refusal names that,
    and no bare keyword the writer lacks, and passing what it names replaces the store."""
    tokens = np.random.default_rng(0).integers(0, S, 400)
    writers = {
        "synthetic": lambda out, **kw: write_synthetic(
            out, 50, num_symbols=S, context_length=N, query_dim=D, num_targets=T, **kw
        ),
        "arrays": lambda out, **kw: write_small(out, random_rows(50), **kw),
        "tokens": lambda out, **kw: write_tokens(out, tokens, N, num_symbols=S, dim=D, **kw),
        "split": lambda out, **kw: write_split(out, TokenCorpus(tokens, block_tokens=20), N, **kw),
    }
    for name, write in writers.items():
        out = tmp_path / name
        write(out)
        with pytest.raises(StoreError, match="already exists") as info:
            write(out)
        message = str(info.value)
        assert "options=WriteOptions(overwrite=True)" in message, message
        assert "=True" not in re.sub(r"WriteOptions\(\w+=True\)", "", message), message
        write(out, options=WriteOptions(overwrite=True))


def test_a_random_query_table_larger_than_free_memory_is_refused_before_it_is_drawn(tmp_path):
    """An explicit --symbols is not bounded by the ids: 10^12 symbols used to fail in numpy ("Unable to allocate
    233 TiB"); the table's cost is now checked against free memory first, naming the flags, and nothing is written."""
    tokens = np.arange(100) % 7
    with pytest.raises(MemoryError, match=r"^--symbols 1,000,000,000,000 with --dim 32: .* lower --symbols or --dim"):
        write_tokens(tmp_path / "s.zarr", tokens, context_length=2, num_symbols=10**12, dim=32)
    assert not (tmp_path / "s.zarr").exists()


def test_a_line_longer_than_any_text_has_is_refused_naming_the_file_and_line(tmp_path):
    """Line-by-line readers (split, triples from text) held a whole line in memory: a one-line 100 MB file peaked
    at 1.2 GB. A line past the bound is refused at its number instead; lines up to it read as before."""
    from dist_respattn.store.ingest.text import line_pieces

    path = tmp_path / "one.txt"
    path.write_text("a b\n" + "x" * 5000 + "\nc d\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: line 2 is longer than 4,096 characters"):
        list(line_pieces(str(path), max_line=4096))
    tokens = [token for piece in line_pieces(str(path), max_line=5001) for token in piece]
    assert tokens == ["a", "b", "x" * 5000, "c", "d"]
