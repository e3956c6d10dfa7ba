"""What every kind of store must do, run once per kind (as zarr runs its ``StoreTests`` per store).

:class:`StoreTests` holds the contract; each subclass writes one small real store on disk, of the same token
corpus (three documents, so windows never span two), and says how it is opened. The rows it must hold are made
independently, by :func:`~dist_respattn.model.encoder.sequence_windows` on each document.
"""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import zarr

from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store import (
    CorpusMismatchError,
    StoreCorruptError,
    StoreError,
    StoreLocation,
    TokenStreamStore,
    TripleStore,
    WriteOptions,
    check_same_corpus,
    open_store,
    validate,
    write_stream_tokens,
    write_tokens,
)
from dist_respattn.store.group import shard_key

#: The corpus: 3,000 token ids in [0, S), three documents.
S = 23
TOKENS = np.random.default_rng(7).integers(0, S, 3_000)
STARTS = np.array([0, 1_100, 1_900])
#: What the stores are written with: N = 4, 256-row (or token) chunks, 1,024-row (or token) shards.
WRITTEN_N = 4
LAYOUT = WriteOptions(chunk_rows=256, partition_rows=1024)


def reference_rows(n: int, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of the corpus at window ``n``: ``sequence_windows`` of each document, concatenated."""
    ends = [*STARTS[1:], TOKENS.size]
    parts = [
        sequence_windows(TOKENS[a:b], n, num_symbols=S, embeddings=table, query_dtype=table.dtype)
        for a, b in zip(STARTS, ends, strict=True)
    ]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def assert_same_rows(a: Any, b: Any) -> None:
    for name in ("context", "query", "target", "weight"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        else:
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)


def concatenated(blocks: list[Any]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([getattr(b, name) for b in blocks]) for name in ("context", "query", "target")}


class StoreTests:
    """The contract. A subclass sets ``store_class``, ``row_array`` (the array every row reads from) and ``window``
    (the N it is read with), and writes its store in :meth:`write`."""

    store_class: ClassVar[type]
    row_array: ClassVar[str]
    window: ClassVar[int]

    def write(self, path: Path) -> None:
        raise NotImplementedError

    def open(self, where: Any, **kwargs: Any) -> Any:
        """The store through the one opener, read with the kind's window."""
        return open_store(where, window=self.window, **kwargs)

    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        path = tmp_path / "store.zarr"
        self.write(path)
        return path

    @pytest.fixture
    def store(self, path: Path) -> Any:
        return self.open(path)

    # -- opening ------------------------------------------------------------------------------------

    def test_the_opener_picks_the_kind(self, store: Any) -> None:
        assert type(store) is self.store_class
        assert store.kind == self.store_class.kind

    def test_opens_by_path_url_location_and_open_store_alike(self, path: Path, store: Any) -> None:
        location = StoreLocation.of(path).with_window(self.window)
        ways = [str(path), path, f"file://{path}", location, store]
        opened = [self.open(way) for way in ways]
        assert {s.fingerprint() for s in opened} == {store.fingerprint()}
        assert {s.num_rows for s in opened} == {store.num_rows}
        assert all(type(s) is self.store_class for s in opened)

    def test_a_path_with_no_store_is_a_store_error_naming_it(self, tmp_path: Path) -> None:
        (tmp_path / "empty").mkdir()
        with pytest.raises(StoreError, match="empty"):
            self.open(tmp_path / "empty")

    # -- what it holds ------------------------------------------------------------------------------

    def test_schema_and_rows_are_the_corpus_windows(self, store: Any) -> None:
        table = store.embeddings()
        context, query, target = reference_rows(self.window, table)
        assert store.schema.context_length == self.window
        assert (store.schema.num_symbols, store.schema.num_targets, store.schema.query_dim) == (S, S, table.shape[1])
        assert store.num_rows == target.size
        rows = store.read_rows(0, store.num_rows)
        np.testing.assert_array_equal(rows.context, context)
        np.testing.assert_array_equal(rows.query, query)
        np.testing.assert_array_equal(rows.target, target)
        assert rows.weight is None

    def test_partitions_cover_the_rows_once_in_order(self, store: Any) -> None:
        parts = store.partitions()
        assert len(parts) == store.num_partitions > 1
        assert [p.index for p in parts] == list(range(len(parts)))
        assert parts[0].start == 0 and parts[-1].stop == store.num_rows
        assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
        assert all(p.num_rows > 0 for p in parts)
        assert [store.partition(p.index) for p in parts] == parts

    def test_the_readers_agree(self, store: Any) -> None:
        everything = store.read_rows(0, store.num_rows)
        blocks = [b for p in store.partitions() for b in store.iter_blocks(p)]
        assert [b.start for b in blocks] == sorted(b.start for b in blocks)
        assert sum(b.num_rows for b in blocks) == store.num_rows
        by_blocks = concatenated(blocks)
        by_partitions = concatenated([store.read_partition(p) for p in store.partitions()])
        for name in ("context", "query", "target"):
            np.testing.assert_array_equal(by_blocks[name], getattr(everything, name), err_msg=name)
            np.testing.assert_array_equal(by_partitions[name], getattr(everything, name), err_msg=name)
        for block in blocks[:3]:
            assert_same_rows(block, store.read_rows(block.start, block.start + block.num_rows))
        start, stop = 100, 900  # across a chunk boundary
        selected = np.random.default_rng(1).random(stop - start) < 0.3
        chosen = store.read_selected(start, stop, selected)
        whole = store.read_rows(start, stop)
        for name in ("context", "query", "target"):
            np.testing.assert_array_equal(getattr(chosen, name), getattr(whole, name)[selected], err_msg=name)

    # -- identity -----------------------------------------------------------------------------------

    def test_fingerprint_and_identity_are_stable_across_reopening(self, path: Path, store: Any) -> None:
        again = self.open(path)
        assert again.fingerprint() == store.fingerprint()
        assert again.identity() == store.identity()
        assert store.identity()["embeddings"] is not None

    def test_the_same_corpus_check(self, tmp_path: Path, store: Any) -> None:
        again = self.open(store.location)
        check_same_corpus(store, again, reference_role="training store", other_role="validation store")
        other = write_tokens(tmp_path / "other.zarr", TOKENS, WRITTEN_N, num_symbols=S, dim=5, seed=5, options=LAYOUT)
        with pytest.raises(CorpusMismatchError, match="embedding table"):
            check_same_corpus(store, other, reference_role="training store", other_role="validation store")

    def test_pickles_as_its_location(self, store: Any) -> None:
        data = pickle.dumps(store)
        assert len(data) < 2_000  # its location and window, never its arrays
        back = pickle.loads(data)
        assert type(back) is self.store_class and back.location == store.location
        assert back.fingerprint() == store.fingerprint()
        assert_same_rows(back.read_partition(1), store.read_partition(1))

    # -- damage -------------------------------------------------------------------------------------

    def shard_path(self, path: Path, shard: int) -> Path:
        array = zarr.open_group(str(path), mode="r")[self.row_array]
        return path / shard_key(array, self.row_array, shard)

    def test_a_missing_shard_is_a_store_error_naming_the_array(self, path: Path) -> None:
        self.shard_path(path, 1).unlink()
        store = self.open(path)  # opening reads no chunk
        assert_same_rows(store.read_partition(0), self.open(path).read_partition(0))
        with pytest.raises(StoreCorruptError, match=f"'{self.row_array}'.*missing"):
            store.read_partition(1)

    def test_a_damaged_shard_is_a_store_error_naming_the_array(self, path: Path) -> None:
        self.shard_path(path, 1).write_bytes(b"not a zarr shard")
        with pytest.raises(StoreCorruptError, match=f"'{self.row_array}'"):
            self.open(path).read_partition(1)

    def test_a_missing_array_is_a_store_error_naming_it(self, path: Path) -> None:
        for member in (path / self.row_array).iterdir():
            if member.is_dir():
                for f in sorted(member.rglob("*"), reverse=True):
                    f.unlink() if f.is_file() else f.rmdir()
                member.rmdir()
            else:
                member.unlink()
        (path / self.row_array).rmdir()
        with pytest.raises(StoreError, match=f"'{self.row_array}'.*missing"):
            self.open(path).read_partition(0)
        assert [p.array for p in validate(path).problems] == [self.row_array]


class TestTripleStore(StoreTests):
    store_class = TripleStore
    row_array = "context"
    window = WRITTEN_N

    def write(self, path: Path) -> None:
        write_tokens(path, TOKENS, WRITTEN_N, num_symbols=S, documents=STARTS, options=LAYOUT)

    def test_another_window_is_refused(self, path: Path) -> None:
        with pytest.raises(ValueError, match="the window is fixed"):
            open_store(path, window=WRITTEN_N + 1)


class TestTokenStreamStore(StoreTests):
    store_class = TokenStreamStore
    row_array = "tokens"
    window = 3  # read with a window other than the one it records

    def write(self, path: Path) -> None:
        write_stream_tokens(path, TOKENS, WRITTEN_N, num_symbols=S, documents=STARTS, options=LAYOUT)

    def test_each_window_reads_its_own_rows(self, path: Path, store: Any) -> None:
        recorded = open_store(path)
        assert recorded.schema.context_length == WRITTEN_N
        assert recorded.num_rows == reference_rows(WRITTEN_N, recorded.embeddings())[2].size != store.num_rows
        assert recorded.fingerprint() != store.fingerprint()
