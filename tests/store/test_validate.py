"""Validation of real stores damaged on disk: every problem names its array, chunk and row.

The store: 1,000 rows in 64-row chunks and 256-row partitions (chunk c holds rows 64c..64c+63;
partition p is the shard file of rows 256p..256p+255). Damage is done with zarr itself or by
editing the files, never by mocking.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr

from dist_respattn.store import (
    IncompleteStoreError,
    Problem,
    StoreCorruptError,
    StoreError,
    TripleStore,
    ValidationReport,
    WriteOptions,
    validate,
)
from tests.store.helpers import (
    CHUNK,
    PART,
    ROWS,
    D,
    N,
    S,
    T,
    assert_rows,
    edit_attributes,
    random_rows,
    shard_file,
    write_small,
)


@pytest.fixture
def rows():
    return random_rows(weighted=True)


@pytest.fixture
def store_path(tmp_path, rows) -> str:
    """A valid weighted store on disk."""
    path = str(tmp_path / "s.zarr")
    write_small(path, rows)
    assert validate(path).ok
    return path


def only_problem(report: ValidationReport) -> Problem:
    assert not report.ok
    assert len(report.problems) == 1, report.summary()
    return report.problems[0]


def test_a_valid_store_reports_everything_it_scanned(store_path):
    report = validate(store_path)
    assert report.ok and report.problems == []
    assert report.rows_scanned == ROWS and report.chunks_scanned == 16  # ceil(1000 / 64)
    assert report.to_json() == {
        "url": store_path,
        "ok": True,
        "rows_scanned": ROWS,
        "unit": "rows",
        "chunks_scanned": 16,
        "problems": [],
        "notes": [],
    }
    assert report.summary() == f"{store_path}: valid (1,000 rows, 16 chunks scanned)"
    steps = []
    totals: list[int] = []
    validate(store_path, progress=steps.append, total=totals.append)
    assert steps == [1, 1, 1, 1] and totals == [4]  # the total is told before the scan, for a bar to show it


def test_a_stream_stores_scan_tells_its_total_and_counts_its_shards(tmp_path):
    from dist_respattn.store.ingest.to_stream import write_stream_tokens

    tokens = np.random.default_rng(0).integers(0, S, 1000)
    path = tmp_path / "t.zarr"
    write_stream_tokens(path, tokens, N, options=WriteOptions(chunk_rows=CHUNK, partition_rows=PART))
    steps: list[int] = []
    totals: list[int] = []
    assert validate(path, progress=steps.append, total=totals.append).ok
    assert totals == [4] and steps == [1, 1, 1, 1]  # 1000 tokens in shards of 256


# -- value-level damage: the store opens (opening reads no chunk), validate finds it -----------


def test_a_deleted_chunk_file_is_reported_with_its_rows(store_path, rows):
    shard_file(store_path, "query", 2).unlink()
    problem = only_problem(validate(store_path))
    assert (problem.array, problem.chunk, problem.row, problem.count) == ("query", 8, 512, 256)
    assert "chunk file 'query/c/2/0' (rows 512..767) is missing" in problem.message
    # Opening is cheap and does not notice; reading that partition does.
    store = TripleStore.open(store_path)
    with pytest.raises(StoreCorruptError, match=r"array 'query' partition 2 \(rows 512\.\.767\).*query/c/2/0"):
        store.read_partition(2)
    with pytest.raises(StoreCorruptError, match="array 'query' partition 2"):
        next(store.iter_blocks(2))
    # The other partitions still read.
    assert_rows(store.read_partition(1), *(a[256:512] for a in rows.values()))


def test_read_rows_of_a_deleted_chunk_file_raises(store_path):
    shard_file(store_path, "query", 2).unlink()
    with pytest.raises(StoreCorruptError, match="array 'query'"):
        TripleStore.open(store_path).read_rows(512, 520)


def test_a_deleted_chunk_file_of_a_1d_array_is_reported(store_path):
    shard_file(store_path, "target", 3).unlink()
    problem = only_problem(validate(store_path))
    assert (problem.array, problem.chunk, problem.row, problem.count) == ("target", 12, 768, 232)
    assert "'target/c/3'" in problem.message
    with pytest.raises(StoreCorruptError, match=r"array 'target' partition 3 \(rows 768\.\.999\)"):
        list(TripleStore.open(store_path).iter_blocks(3, 10))


def test_a_nan_and_an_inf_in_query_chunks(store_path):
    query = zarr.open_array(store_path + "/query", mode="r+")
    query[300, 1] = np.nan
    query[700, 2] = np.inf
    TripleStore.open(store_path)  # value damage does not stop an open
    report = validate(store_path)
    assert [(p.array, p.chunk, p.row, p.count) for p in report.problems] == [
        ("query", 4, 300, 1),
        ("query", 10, 700, 1),
    ]
    assert "query[300, 1] = nan: expected a finite value (1 row of this chunk)" in report.problems[0].message
    assert "query[700, 2] = inf: expected a finite value" in report.problems[1].message
    assert "array 'query', chunk 4, row 300: query[300, 1] = nan" in report.summary()


def test_several_bad_rows_of_one_chunk_are_one_problem_naming_the_first(store_path):
    query = zarr.open_array(store_path + "/query", mode="r+")
    query[310, 0] = -np.inf
    query[300, 2] = np.nan
    query[305, 1] = np.nan
    problem = only_problem(validate(store_path))
    assert (problem.array, problem.chunk, problem.row, problem.count) == ("query", 4, 300, 3)
    assert "query[300, 2] = nan" in problem.message and "(3 rows of this chunk)" in problem.message


def test_ids_out_of_range_in_context_and_target(store_path):
    zarr.open_array(store_path + "/context", mode="r+")[700, 2] = S + 5
    zarr.open_array(store_path + "/target", mode="r+")[900] = -3
    TripleStore.open(store_path)
    report = validate(store_path)
    found = {p.array: p for p in report.problems}
    assert len(report.problems) == 2 and set(found) == {"context", "target"}
    context, target = found["context"], found["target"]
    assert (context.chunk, context.row, context.count) == (10, 700, 1)
    assert f"context[700, 2] = {S + 5}: expected a symbol id in [0, {S})" in context.message
    assert (target.chunk, target.row, target.count) == (14, 900, 1)
    assert f"target[900] = -3: expected a target id in [0, {T})" in target.message


def test_a_negative_and_a_nan_weight(store_path):
    weight = zarr.open_array(store_path + "/weight", mode="r+")
    weight[5] = -1.0
    weight[600] = np.nan
    report = validate(store_path)
    assert [(p.array, p.chunk, p.row, p.count) for p in report.problems] == [("weight", 0, 5, 1), ("weight", 9, 600, 1)]
    assert "weight[5] = -1.0: expected a finite weight >= 0" in report.problems[0].message
    assert "weight[600] = nan" in report.problems[1].message


def test_a_corrupt_chunk_file_cannot_be_decoded(store_path):
    shard_file(store_path, "query", 1).write_bytes(b"not a zarr shard at all " * 40)
    TripleStore.open(store_path)
    report = validate(store_path)
    # Every chunk of the shard (rows 256..511) is reported.
    assert [(p.array, p.chunk, p.row, p.count) for p in report.problems] == [
        ("query", c, 64 * c, CHUNK) for c in range(4, 8)
    ]
    assert all(p.message.startswith("cannot be decoded") for p in report.problems)
    with pytest.raises(StoreCorruptError, match=r"array 'query' chunk 4 \(rows 256\.\.511\) cannot be read"):
        TripleStore.open(store_path).read_partition(1)


def test_a_corrupt_chunk_file_of_an_unsharded_store(tmp_path):
    path = str(tmp_path / "s.zarr")
    write_small(path, options=WriteOptions(chunk_rows=PART, partition_rows=PART))
    shard_file(path, "context", 2).write_bytes(b"\x00garbage")
    problem = only_problem(validate(path))
    assert (problem.array, problem.chunk, problem.row, problem.count) == ("context", 2, 512, PART)
    assert problem.message.startswith("cannot be decoded")


def test_an_empty_shard_file_is_corrupt_for_every_reader(store_path):
    shard_file(store_path, "query", 1).write_bytes(b"")
    assert [p.row for p in validate(store_path).problems] == [256, 320, 384, 448]
    store = TripleStore.open(store_path)
    with pytest.raises(StoreCorruptError, match="array 'query'"):
        next(store.iter_blocks(1, 64))  # chunk-sized reads do raise
    with pytest.raises(StoreCorruptError, match="array 'query'"):
        store.read_partition(1)  # a whole-shard read does not: it returns NaN queries


# -- structural damage: open refuses, naming the array ------------------------------------------


def test_mismatched_row_counts(store_path):
    zarr.open_array(store_path + "/target", mode="r+").resize((900,))
    problem = only_problem(validate(store_path))
    assert problem.array == "target" and problem.chunk is None and problem.row is None
    assert "900 rows: expected 1000, the store's row count" in problem.message
    with pytest.raises(StoreError, match="array 'target': 900 rows: expected 1000") as info:
        TripleStore.open(store_path)
    assert not isinstance(info.value, IncompleteStoreError)


def test_mismatched_chunking(store_path, rows):
    group = zarr.open_group(store_path, mode="r+")
    group.create_array("query", shape=(ROWS, D), dtype="float32", chunks=(100, D), overwrite=True)
    group["query"][:] = rows["query"].astype(np.float32)
    problem = only_problem(validate(store_path))
    assert problem.array == "query"
    assert f"chunked 100 rows per chunk and 100 per shard: expected {CHUNK} and {PART}" in problem.message
    with pytest.raises(StoreError, match="array 'query': chunked 100 rows per chunk"):
        TripleStore.open(store_path)


def test_chunks_across_columns_and_a_wrong_dtype(store_path, rows):
    group = zarr.open_group(store_path, mode="r+")
    group.create_array("context", shape=(ROWS, N), dtype="int32", chunks=(CHUNK, 1), shards=(PART, N), overwrite=True)
    group["context"][:] = rows["context"]
    group.create_array("target", shape=(ROWS,), dtype="int64", chunks=(CHUNK,), shards=(PART,), overwrite=True)
    group["target"][:] = rows["target"]
    report = validate(store_path)
    messages = {(p.array, p.message) for p in report.problems}
    assert ("context", f"chunked along columns ({CHUNK}, 1): expected chunks along rows only") in messages
    assert ("target", "dtype int64: expected int32") in messages
    with pytest.raises(StoreError, match="array 'context'"):
        TripleStore.open(store_path)


def test_a_missing_array(store_path):
    shutil.rmtree(store_path + "/target")
    report = validate(store_path)
    problem = only_problem(report)
    assert problem.array == "target" and problem.message.startswith("missing: expected a int32 array")
    assert report.rows_scanned == 0  # values cannot be located: nothing is scanned
    with pytest.raises(StoreError, match="array 'target': missing"):
        TripleStore.open(store_path)


def test_a_weight_array_in_an_unweighted_store(tmp_path):
    path = str(tmp_path / "s.zarr")
    write_small(path)
    zarr.open_group(path, mode="r+").create_array("weight", shape=(ROWS,), dtype="float32", chunks=(CHUNK,))
    problem = only_problem(validate(path))
    assert problem.array == "weight" and "the attributes say the store is unweighted" in problem.message
    with pytest.raises(StoreError, match="array 'weight'"):
        TripleStore.open(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema_version": 99}, "schema version 99 is unknown: this release reads version 1"),
        ({"state": "bogus"}, "state 'bogus': expected 'complete'"),
        ({"rows": -5}, "attribute rows = -5: expected a non-negative integer"),
        ({"chunk_rows": 0}, "attribute chunk_rows = 0: expected a positive integer"),
        ({"num_symbols": 0}, "bad schema attribute: num_symbols = 0"),
    ],
)
def test_bad_group_attributes(store_path, changes, message):
    edit_attributes(store_path, **changes)
    report = validate(store_path)
    problem = only_problem(report)
    assert problem.array is None and message in problem.message
    assert report.rows_scanned == 0
    with pytest.raises(StoreError, match="group") as info:
        TripleStore.open(store_path)
    assert message in str(info.value) and not isinstance(info.value, IncompleteStoreError)


def test_a_group_that_is_no_store_and_a_path_with_no_group(tmp_path, store_path):
    # Nothing to scan is an error (the CLI exits 2), not a finding about a damaged store (exit 1); nor is a group of
    # a schema that no store of this release has.
    zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    edit_attributes(store_path, schema="other.triples")
    for opener in (validate, TripleStore.open):
        with pytest.raises(StoreError, match=r"g\.zarr: a zarr group but no store of dist_respattn: expected a store"):
            opener(tmp_path / "g.zarr")
        with pytest.raises(StoreError, match=r"a zarr group of schema 'other\.triples', not a store this release"):
            opener(store_path)
        with pytest.raises(StoreError, match=r"nothing\.zarr: no such file or directory"):
            opener(tmp_path / "nothing.zarr")


def test_an_unfinished_write_is_reported_and_refuses_to_open(store_path):
    edit_attributes(store_path, state="writing")
    problem = only_problem(validate(store_path))
    assert "the writer stopped before finishing" in problem.message
    with pytest.raises(IncompleteStoreError, match="state 'writing'"):
        TripleStore.open(store_path)


def test_many_problems_at_once_are_all_reported_in_row_order(store_path):
    zarr.open_array(store_path + "/query", mode="r+")[10, 0] = np.nan
    zarr.open_array(store_path + "/context", mode="r+")[950, 3] = -1
    shard_file(store_path, "weight", 2).unlink()
    shard_file(store_path, "target", 1).write_bytes(b"junk")
    report = validate(store_path)
    where = [(p.array, p.chunk, p.row) for p in report.problems]
    assert where == [
        ("query", 0, 10),
        ("target", 4, 256),
        ("target", 5, 320),
        ("target", 6, 384),
        ("target", 7, 448),
        ("weight", 8, 512),
        ("context", 14, 950),
    ]
    assert report.to_json()["problems"][0] == {
        "message": "query[10, 0] = nan: expected a finite value (1 row of this chunk)",
        "array": "query",
        "chunk": 0,
        "row": 10,
        "count": 1,
    }
    assert report.summary().startswith(f"{store_path}: 7 problem(s) (1,000 rows, 16 chunks scanned)")
