"""Appending rows to a store: after the committed rows, recorded, and refused for another schema."""

from __future__ import annotations

import numpy as np
import pytest

import dist_respattn.store.ingest.tokens as tokens_module
from dist_respattn.model.encoder import sequence_windows
from dist_respattn.model.heads.single_hop.sampler import ResponsibilityAttentionSampler, random_distribution
from dist_respattn.store import (
    SchemaMismatchError,
    StoreError,
    TripleStore,
    WriteOptions,
    validate,
    write_arrays,
    write_synthetic,
    write_text,
    write_tokens,
)
from tests.store.helpers import (
    CHUNK,
    PART,
    ROWS,
    SMALL,
    D,
    N,
    S,
    T,
    assert_rows,
    assert_same_rows,
    random_rows,
    read_all,
    read_blocks,
    write_small,
)

APPEND = WriteOptions(append=True)


def concat(*parts):
    return [None if parts[0][k] is None else np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]


def columns(rows: dict):
    return [rows["context"], rows["query"], rows["target"], rows.get("weight")]


def assert_untouched(path, before_rows, before_fingerprint):
    """The store opens, is complete and valid, and holds exactly the rows and attributes it had."""
    store = TripleStore.open(path)
    assert store.attributes["state"] == "complete"
    assert store.fingerprint() == before_fingerprint
    assert_same_rows(read_all(store), before_rows)
    assert validate(path).ok


# -- arrays ------------------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True])
def test_append_arrays_after_a_partial_last_partition(tmp_path, weighted):
    first, second = random_rows(weighted=weighted), random_rows(300, seed=1, weighted=weighted)
    store = write_small(tmp_path / "s.zarr", first)
    assert store.num_rows % PART != 0  # the store ends mid-partition
    fingerprint = store.fingerprint()

    appended = write_small(tmp_path / "s.zarr", second, options=APPEND)
    assert appended.num_rows == ROWS + 300
    assert appended.num_partitions == 6
    assert (appended.chunk_rows, appended.partition_rows) == (CHUNK, PART)
    expected = concat(columns(first), columns(second))
    assert_rows(read_all(appended), *expected)
    assert_rows(read_blocks(appended, 77), *expected)
    # The partition the store ended in now mixes old and new rows.
    assert_rows(appended.read_partition(3), *(None if a is None else a[768:1024] for a in expected))

    (record,) = appended.provenance["appends"]
    assert record["first_row"] == ROWS and record["rows"] == 300 and record["source"] == "arrays"
    assert appended.provenance["rows"] == ROWS  # the creating write's own record is kept
    assert appended.fingerprint() != fingerprint
    assert TripleStore.open(tmp_path / "s.zarr").fingerprint() == appended.fingerprint()
    assert validate(tmp_path / "s.zarr").ok


def test_append_twice_and_at_a_partition_boundary(tmp_path):
    parts = [random_rows(512), random_rows(256, seed=1), random_rows(5, seed=2)]
    write_small(tmp_path / "s.zarr", parts[0])
    fingerprints = {TripleStore.open(tmp_path / "s.zarr").fingerprint()}
    for rows in parts[1:]:
        store = write_small(tmp_path / "s.zarr", rows, options=APPEND)
        fingerprints.add(store.fingerprint())
    assert len(fingerprints) == 3
    assert store.num_rows == 773
    assert [a["first_row"] for a in store.provenance["appends"]] == [512, 768]
    assert [a["rows"] for a in store.provenance["appends"]] == [256, 5]
    assert_rows(read_all(store), *concat(*(columns(p)[:3] for p in parts)))


def test_append_arrays_from_npy_files_takes_s_and_t_from_the_store(tmp_path):
    write_small(tmp_path / "s.zarr", random_rows())
    rows = random_rows(100, seed=3, s=3, t=2)  # small ids: inferring S, T from them would mismatch
    for name in ("context", "query", "target"):
        np.save(tmp_path / f"{name}.npy", rows[name])
    store = write_arrays(
        tmp_path / "s.zarr",
        tmp_path / "context.npy",
        tmp_path / "query.npy",
        tmp_path / "target.npy",
        options=APPEND,
    )
    assert (store.schema.num_symbols, store.schema.num_targets) == (S, T)
    assert_rows(store.read_rows(ROWS, ROWS + 100), *columns(rows)[:3])
    assert store.provenance["appends"][0]["files"]["context"] == str(tmp_path / "context.npy")


def test_append_ignores_the_layout_options_and_keeps_the_stores(tmp_path):
    write_small(tmp_path / "s.zarr")
    options = WriteOptions(append=True, chunk_rows=10, partition_rows=20, row_order="target")
    store = write_small(tmp_path / "s.zarr", random_rows(50, seed=1), options=options)
    assert (store.chunk_rows, store.partition_rows) == (CHUNK, PART)
    assert store.attributes["row_order"] == "input"
    assert validate(store.location).ok


def test_append_into_a_target_ordered_store_sorts_each_flushed_run(tmp_path):
    """As writer.ROW_ORDERS documents: each *flushed run* of rows is sorted by target (so the partition an
    append continues holds two sorted runs), and the committed rows stay where they were."""
    first, second = random_rows(), random_rows(100, seed=1)
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, row_order="target")
    before = read_all(write_small(tmp_path / "s.zarr", first, options=options))
    store = write_small(tmp_path / "s.zarr", second, options=APPEND)
    assert_same_rows(store.read_rows(0, ROWS), before)
    # The append is flushed in two runs: 24 rows finishing partition 3, then 76 rows of partition 4.
    for lo, hi in ((0, 24), (24, 100)):
        order = np.argsort(second["target"][lo:hi], kind="stable")
        got = store.read_rows(ROWS + lo, ROWS + hi)
        assert np.all(np.diff(got.target) >= 0)
        assert_rows(got, *(a[lo:hi][order] for a in columns(second)[:3]))


# -- schema mismatches -------------------------------------------------------------------------


def mismatched_input(field: str) -> tuple[dict, dict]:
    """Rows and write_arrays keywords that differ from the base store in exactly ``field``."""
    rows = random_rows(50, seed=4)
    kwargs = {}
    if field == "context_length":
        rows["context"] = np.concatenate([rows["context"], rows["context"][:, :1]], axis=1)
    elif field == "query_dim":
        rows["query"] = np.concatenate([rows["query"], rows["query"][:, :1]], axis=1)
    elif field == "num_symbols":
        kwargs["num_symbols"] = S + 1
    elif field == "num_targets":
        kwargs["num_targets"] = T + 1
    elif field == "has_weight":
        rows["weight"] = np.ones(50)
    return rows, kwargs


@pytest.mark.parametrize("field", ["context_length", "query_dim", "num_symbols", "num_targets", "has_weight"])
def test_append_with_another_schema_is_refused_naming_the_field(tmp_path, field):
    before = read_all(write_small(tmp_path / "s.zarr"))
    fingerprint = TripleStore.open(tmp_path / "s.zarr").fingerprint()
    rows, kwargs = mismatched_input(field)
    with pytest.raises(SchemaMismatchError, match=rf"cannot append: .*\b{field}\b") as info:
        write_small(tmp_path / "s.zarr", rows, options=APPEND, **kwargs)
    assert str(tmp_path / "s.zarr") in str(info.value)
    # Only that field is named.
    others = {"context_length", "query_dim", "num_symbols", "num_targets", "has_weight", "query_dtype"} - {field}
    assert not any(f"{other} " in str(info.value) for other in others)
    assert_untouched(tmp_path / "s.zarr", before, fingerprint)


def test_an_unweighted_append_to_a_weighted_store_is_refused(tmp_path):
    before = read_all(write_small(tmp_path / "s.zarr", random_rows(weighted=True)))
    fingerprint = TripleStore.open(tmp_path / "s.zarr").fingerprint()
    with pytest.raises(SchemaMismatchError, match="has_weight False"):
        write_small(tmp_path / "s.zarr", random_rows(20), options=APPEND)
    assert_untouched(tmp_path / "s.zarr", before, fingerprint)


def test_an_append_of_another_query_dtype_is_refused(tmp_path):
    before = read_all(write_small(tmp_path / "s.zarr"))
    fingerprint = TripleStore.open(tmp_path / "s.zarr").fingerprint()
    with pytest.raises(SchemaMismatchError, match="query_dtype 'float64'"):
        write_small(tmp_path / "s.zarr", random_rows(20), options=WriteOptions(append=True, query_dtype="float64"))
    assert_untouched(tmp_path / "s.zarr", before, fingerprint)


def test_append_needs_an_existing_store_and_excludes_overwrite(tmp_path):
    with pytest.raises(StoreError, match=r"none\.zarr: no such file or directory"):
        write_small(tmp_path / "none.zarr", options=APPEND)
    assert not (tmp_path / "none.zarr").exists()
    write_small(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match="append and overwrite exclude each other"):
        write_small(tmp_path / "s.zarr", options=WriteOptions(append=True, overwrite=True))
    assert TripleStore.open(tmp_path / "s.zarr").num_rows == ROWS


def test_create_refuses_an_existing_store_unless_overwrite(tmp_path):
    write_small(tmp_path / "s.zarr")
    with pytest.raises(StoreError, match="already exists"):
        write_small(tmp_path / "s.zarr", random_rows(10))
    assert TripleStore.open(tmp_path / "s.zarr").num_rows == ROWS
    rows = random_rows(10, seed=5)
    options = WriteOptions(chunk_rows=CHUNK, partition_rows=PART, overwrite=True)
    store = write_small(tmp_path / "s.zarr", rows, options=options)
    assert store.num_rows == 10 and store.provenance["appends"] == []
    assert_rows(read_all(store), *columns(rows)[:3])


# -- synthetic ---------------------------------------------------------------------------------


def test_append_synthetic_samples_the_stores_model_and_continues_the_seeds(tmp_path):
    model = random_distribution(S, N, D, T, seed=5)
    store = write_synthetic(tmp_path / "s.zarr", ROWS, model=model, seed=4, options=SMALL)
    before = read_all(store)
    appended = write_synthetic(tmp_path / "s.zarr", 300, seed=4, options=APPEND)
    assert appended.num_rows == 1300
    assert_same_rows(appended.read_rows(0, ROWS), before)
    # Store rows 1000..1299: 24 rows finishing partition 3 (seed (4, 3, 232)), 256 of partition 4, 20 of partition 5.
    draws = [(3, 232, 24), (4, 0, 256), (5, 0, 20)]
    sampled = [
        ResponsibilityAttentionSampler(model, np.random.default_rng([4, p, offset])).sample_arrays(
            take, query_dtype=np.float32
        )
        for p, offset, take in draws
    ]
    assert_rows(appended.read_rows(ROWS, 1300), *(np.concatenate([s[i] for s in sampled]) for i in range(3)))
    (record,) = appended.provenance["appends"]
    assert record["model"] == "store" and record["first_row"] == ROWS and record["rows"] == 300
    np.testing.assert_array_equal(appended.true_model().key_means, model.key_means)
    assert validate(appended.location).ok


def test_append_synthetic_of_another_shape_is_refused(tmp_path):
    store = write_synthetic(tmp_path / "s.zarr", 100, model=random_distribution(S, N, D, T, seed=5), options=SMALL)
    before, fingerprint = read_all(store), store.fingerprint()
    other = random_distribution(S, N, D, T + 2, seed=5)
    with pytest.raises(SchemaMismatchError, match=r"num_targets 9 \(store has 7\)"):
        write_synthetic(tmp_path / "s.zarr", 100, model=other, options=APPEND)
    assert_untouched(tmp_path / "s.zarr", before, fingerprint)


def test_append_synthetic_to_a_store_without_a_model_is_refused(tmp_path):
    write_small(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match="has no true model"):
        write_synthetic(tmp_path / "s.zarr", 10, options=APPEND)


# -- tokens ------------------------------------------------------------------------------------


def test_append_tokens_embeds_new_rows_with_the_stores_table(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens_module, "_TOKEN_BLOCK", 97)
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, 40, 700), rng.integers(0, 40, 450)
    store = write_tokens(tmp_path / "t.zarr", first, 5, num_symbols=40, dim=4, seed=3, options=SMALL)
    table = store.embeddings()
    appended = write_tokens(tmp_path / "t.zarr", second, 5, options=APPEND)
    assert appended.num_rows == 695 + 445  # each stream is windowed on its own
    np.testing.assert_array_equal(appended.embeddings(), table)
    expected = concat(
        sequence_windows(first, 5, embeddings=table, query_dtype=np.float32),
        sequence_windows(second, 5, embeddings=table, query_dtype=np.float32),
    )
    assert_rows(read_all(appended), *expected)
    (record,) = appended.provenance["appends"]
    assert record["embedding"] == {"kind": "store", "dim": 4} and record["tokens_count"] == 450
    assert validate(appended.location).ok


@pytest.mark.parametrize(
    ("n", "kwargs", "named"),
    [(6, {}, "context_length 6"), (5, {"dim": 5}, "query_dim 5"), (5, {"num_symbols": 41}, "num_symbols 41")],
)
def test_append_tokens_of_another_schema_is_refused(tmp_path, n, kwargs, named):
    tokens = np.random.default_rng(0).integers(0, 40, 300)
    store = write_tokens(tmp_path / "t.zarr", tokens, 5, num_symbols=40, dim=4, options=SMALL)
    before, fingerprint = read_all(store), store.fingerprint()
    with pytest.raises(SchemaMismatchError, match=named):
        write_tokens(tmp_path / "t.zarr", tokens, n, options=APPEND, **kwargs)
    assert_untouched(tmp_path / "t.zarr", before, fingerprint)


def test_append_tokens_with_another_table_of_the_same_dim_is_refused_or_uses_the_stores(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 40, 300)
    store = write_tokens(tmp_path / "t.zarr", tokens, 5, num_symbols=40, dim=4, seed=1, options=SMALL)
    try:
        appended = write_tokens(tmp_path / "t.zarr", tokens, 5, dim=4, seed=2, options=APPEND)
    except (SchemaMismatchError, ValueError):
        return  # refusing is fine
    rows = appended.read_rows(store.num_rows, appended.num_rows)
    np.testing.assert_array_equal(rows.query, appended.embeddings()[tokens[4:-1]])


# -- text --------------------------------------------------------------------------------------


def test_append_text_reuses_the_vocabulary_and_embeddings(tmp_path):
    (tmp_path / "a.txt").write_text("the cat sat on the mat . the dog sat on the cat .\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("a zebra sat on the dog ; the end\n", encoding="utf-8")
    store = write_text(tmp_path / "t.zarr", [tmp_path / "a.txt"], 2, vocab_size=5, options=SMALL)
    vocabulary, table, before = store.vocabulary(), store.embeddings(), read_all(store)
    appended = write_text(tmp_path / "t.zarr", [tmp_path / "b.txt"], 2, vocab_size=99, options=APPEND)
    assert appended.vocabulary() == vocabulary
    np.testing.assert_array_equal(appended.embeddings(), table)
    lookup = {t: i for i, t in enumerate(vocabulary["tokens"])}
    ids = [lookup.get(t, 5) for t in "a zebra sat on the dog ; the end".split()]
    assert ids.count(5) >= 4  # unseen words take the OOV id K = 5
    assert appended.num_rows == before.num_rows + len(ids) - 2
    assert_same_rows(appended.read_rows(0, before.num_rows), before)
    assert_rows(
        appended.read_rows(before.num_rows, appended.num_rows),
        *sequence_windows(ids, 2, embeddings=table, query_dtype=np.float32),
    )
    assert appended.provenance["appends"][0]["source"] == "text"


def test_append_text_of_another_context_length_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("one two three four five six seven\n", encoding="utf-8")
    store = write_text(tmp_path / "t.zarr", [tmp_path / "a.txt"], 2, vocab_size=5, options=SMALL)
    before, fingerprint = read_all(store), store.fingerprint()
    with pytest.raises(SchemaMismatchError, match="context_length 3"):
        write_text(tmp_path / "t.zarr", [tmp_path / "a.txt"], 3, vocab_size=5, options=APPEND)
    assert_untouched(tmp_path / "t.zarr", before, fingerprint)


def test_append_text_to_a_store_not_made_from_text_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("one two three\n", encoding="utf-8")
    write_small(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match="has no vocabulary"):
        write_text(tmp_path / "s.zarr", [tmp_path / "a.txt"], 2, vocab_size=5, options=APPEND)
    assert TripleStore.open(tmp_path / "s.zarr").num_rows == ROWS
