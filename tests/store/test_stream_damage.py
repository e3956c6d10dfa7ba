"""A token-stream store changed on disk after it was written is refused in one line naming the array (and the chunk
and its file), what was found and what was expected, by every reader: opening it, ``validate``, ``fit`` and
``evaluate``. Nothing is written: the damaged store is left byte for byte as it was damaged.

The stores are written by the project's own writer, then damaged as a person or a disk would: an array's ``zarr.json``
rewritten with another shape, dtype or shard size (a store so edited used to pass ``validate``, crash a fit's workers
until it hung, or read queries past the end of the table), or 4 bytes inside one chunk of a shard file flipped
(named by the chunk the bytes are in, not by the chunk before it whose last tokens a partition's first windows read).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.artifacts.checkpoints import LATEST, ModelDir, checkpoint_name
from dist_respattn.store import StoreCorruptError, TokenStreamStore, WriteOptions, open_store, validate
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from tests.engine.test_bad_input import Launched, Scene, tree_state

#: S (uint16 ids), the window N, D; 4,000 tokens in two documents, chunks of 256 tokens, shards of 4 chunks.
S, N, D = 300, 4, 3
TOKENS, CHUNK, SHARD = 4000, 256, 1024
#: What every refusal of an edited ``zarr.json`` ends with, after the array's name.
FIX = (
    "no longer matches the store's record: restore the store from a copy, or write it again (the same command with "
    "--overwrite)"
)
#: What a read says of a chunk whose bytes changed, after the chunk and its file.
CHANGED = (
    "cannot be read: its checksum does not match its bytes: the chunk file was changed after it was written; "
    "restore the file or write the store again"
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weighted stream store, written once for the module; each test damages a copy of its own."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("pristine") / "s.zarr"
    write_stream_tokens(
        path, rng.integers(0, S, TOKENS), N, num_symbols=S, dim=D, documents=np.array([0, 1500]),
        weights=rng.uniform(0.5, 1.5, TOKENS), options=WriteOptions(chunk_rows=CHUNK, partition_rows=SHARD),
    )  # fmt: skip
    assert validate(path).ok
    return path


@pytest.fixture
def store_path(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "s.zarr"
    shutil.copytree(pristine, path)
    return path


def edit_metadata(store: Path, array: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite ``array``'s ``zarr.json`` in place with ``change`` applied to its metadata."""
    path = store / array / "zarr.json"
    metadata = json.loads(path.read_text())
    change(metadata)
    path.write_text(json.dumps(metadata, indent=2))


def damage_chunk(store: Path, array: str, chunk: int) -> None:
    """Flip 4 bytes in the middle of chunk ``chunk``'s stored bytes, inside its shard file (located by the
    shard's index: an (offset, length) uint64 pair per chunk, then a 4-byte checksum, at the file's end)."""
    path = store / array / "c" / str(chunk // (SHARD // CHUNK))
    data = bytearray(path.read_bytes())
    index = np.frombuffer(bytes(data[-(16 * (SHARD // CHUNK) + 4) : -4]), dtype="<u8").reshape(-1, 2)
    offset, length = (int(v) for v in index[chunk % (SHARD // CHUNK)])
    at = offset + length // 2
    data[at : at + 4] = bytes(b ^ 0xFF for b in data[at : at + 4])
    path.write_bytes(bytes(data))


def set_shape(shape: list[int]) -> Callable[[dict[str, Any]], None]:
    return lambda metadata: metadata.update(shape=shape)


def set_dtype(dtype: str) -> Callable[[dict[str, Any]], None]:
    return lambda metadata: metadata.update(data_type=dtype)


def set_shard(tokens: int) -> Callable[[dict[str, Any]], None]:
    return lambda metadata: metadata["chunk_grid"]["configuration"].update(chunk_shape=[tokens])


#: Edits of one array's ``zarr.json``, and what the refusal says of the array: (array, edit, found and expected).
EDITS = {
    "tokens-shrunk": ("tokens", set_shape([3000]), "shape (3000,): expected (4000,), the store's 4,000 tokens"),
    "tokens-grown": ("tokens", set_shape([5000]), "shape (5000,): expected (4000,), the store's 4,000 tokens"),
    "tokens-dtype": (
        "tokens", set_dtype("uint32"),
        "dtype uint32: expected uint16, the smallest unsigned type that holds S = 300 ids",
    ),
    "tokens-shards": (
        "tokens", set_shard(2048), "chunked 256 tokens per chunk and 2048 per shard: expected 256 and 1024, the "
        "store's chunk_tokens and partition_tokens",
    ),
    "weight-shrunk": ("weight", set_shape([3000]), "shape (3000,): expected (4000,), the store's 4,000 tokens"),
    "embeddings-shrunk": (
        "embeddings", set_shape([200, 3]), "shape (200, 3): expected (300, 3), S = 300 symbols by D = 3"
    ),
    "embeddings-dtype": (
        "embeddings", set_dtype("float64"), "dtype float64: expected float32, the table queries are looked up in"
    ),
    "starts-shrunk": (
        "document_starts", set_shape([1]), "shape (1,): expected (2,), the 2 documents its provenance records"
    ),
    "starts-dtype": ("document_starts", set_dtype("int32"), "dtype int32: expected int64, document starts"),
}  # fmt: skip


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_array_whose_zarr_json_was_edited_is_refused_by_open_and_reported_by_validate(store_path, edit):
    array, change, found = EDITS[edit]
    edit_metadata(store_path, array, change)
    before = tree_state(store_path)
    expected = f"{found}; '{array}/zarr.json' {FIX}"
    for opener in (open_store, TokenStreamStore.open):
        with pytest.raises(StoreCorruptError) as raised:
            opener(store_path)
        assert str(raised.value) == f"{store_path}: array '{array}': {expected}"
    report = validate(store_path)
    assert [(p.array, p.chunk, p.message) for p in report.problems] == [(array, None, expected)], report.summary()
    assert report.summary().splitlines()[1] == f"  array '{array}': {expected}"
    assert tree_state(store_path) == before


def test_two_edited_arrays_are_one_line_that_sends_to_validate_for_the_rest(store_path):
    edit_metadata(store_path, "tokens", set_shape([3000]))
    edit_metadata(store_path, "embeddings", set_dtype("float64"))
    with pytest.raises(StoreCorruptError) as raised:
        open_store(store_path)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{store_path}: array 'tokens': shape (3000,)"), message
    assert message.endswith(f" (and 1 more: `dist-respattn validate {store_path}` lists them)"), message
    assert [p.array for p in validate(store_path).problems] == ["tokens", "embeddings"]


def test_a_store_appended_to_keeps_its_recorded_documents(store_path):
    """The documents a store records are those it was written with and those of each append."""
    from dist_respattn.store.streams.writer import StreamWriter

    with StreamWriter.append(store_path, weighted=True) as writer:
        for length in (40, 50):
            writer.start_document()
            writer.write(np.arange(length) % S, np.ones(length))
        writer.close()
    store = open_store(store_path)
    assert store.document_starts().tolist() == [0, 1500, 4000, 4040] and store.num_tokens == 4090
    assert validate(store_path).ok
    edit_metadata(store_path, "document_starts", set_shape([3]))
    with pytest.raises(StoreCorruptError, match=r"shape \(3,\): expected \(4,\), the 4 documents its provenance"):
        open_store(store_path)


#: Damaged chunks: (array, chunk). Chunk 3 is the last of shard 0, whose last N tokens partition 1's first windows
#: read; chunk 4 the first of shard 1.
DAMAGED = [("tokens", 4), ("tokens", 3), ("weight", 4)]


@pytest.mark.parametrize(("array", "chunk"), DAMAGED, ids=[f"{a}-{c}" for a, c in DAMAGED])
def test_changed_bytes_are_named_by_their_chunk_and_its_file_whatever_read_finds_them(store_path, array, chunk):
    damage_chunk(store_path, array, chunk)
    before = tree_state(store_path)
    first = chunk * CHUNK
    named = (
        f"{store_path}: array '{array}' chunk {chunk} (tokens {first}..{first + CHUNK - 1}, in file "
        f"'{array}/c/{chunk // (SHARD // CHUNK)}') {CHANGED}"
    )
    store = open_store(store_path)
    part = store.partition(1)
    reads = {
        "blocks": lambda: list(store.iter_blocks(1)),
        "windows": lambda: list(store.iter_windows(1)),
        "rows": lambda: store.read_rows(part.start, part.stop),
        "selected": lambda: store.read_selected(part.start, part.stop, np.arange(part.num_rows) % 16 == 0),
    }
    for name, read in reads.items():
        with pytest.raises(StoreCorruptError) as raised:
            read()
        assert str(raised.value) == named, name
    if chunk == 4:  # partition 0 reads no token of shard 1
        assert store.read_partition(0).num_rows == store.partition(0).num_rows
    report = validate(store_path)
    assert [(p.array, p.chunk, p.row) for p in report.problems] == [(array, chunk, first)], report.summary()
    assert report.problems[0].message == named.split(": ", 1)[1]
    assert tree_state(store_path) == before


# -- the commands ---------------------------------------------------------------------------------------------------


def write_model(folder: Path, store: Path) -> Path:
    """A model directory of a random head of the stores' shape (T = S), recorded as fitted on ``store``."""
    model = ModelDir(folder / "model")
    name = checkpoint_name(1, "0123abcd")
    recorded = {"url": str(store), "fingerprint": open_store(store).fingerprint()}
    meta = {"iteration": 1, "state": "running", "settings": {}, "store": recorded, "history": []}
    model.write(name, random_distribution(S, N, D, S, seed=3), meta)
    model.point(LATEST, name, iteration=1, state="running")
    return model.path


def assert_one_error_line(launched: Launched, command: str, message: str) -> None:
    """The command ended by itself (no hang to its deadline): exit 2, nothing on stdout, ``message`` the one line."""
    result = launched.wait()
    assert not launched.timed_out, (command, launched.deadline, result.stderr[-2000:])
    assert (result.returncode, result.stdout) == (2, ""), (command, result.returncode, result.stdout, result.stderr)
    assert result.stderr.splitlines() == [f"dist-respattn {command}: error: {message}"], result.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fit_evaluate_and_validate_refuse_a_shrunk_token_array_at_once(store_path, tmp_path):
    """``fit --workers 1`` on a store whose ``tokens`` shape was shrunk used to crash its worker on every try, then
    hang or end in the cluster's own error; it, ``evaluate`` and ``validate`` now name the array before any cluster
    starts."""
    model = write_model(tmp_path, store_path)
    edit_metadata(store_path, "tokens", set_shape([3000]))
    (tmp_path / "fit").mkdir()
    scene = Scene.make(tmp_path / "fit", str(store_path), str(model))
    found = "shape (3000,): expected (4000,), the store's 4,000 tokens"
    message = f"{store_path}: array 'tokens': {found}; 'tokens/zarr.json' {FIX}"
    fit = scene.fit("--workers", "1", "--head", "single", "--max-iter", "1", "--json", deadline=60)
    evaluate = Launched(
        ("evaluate", str(model), str(store_path), "--workers", "1", "--json"), cwd=scene.cwd, deadline=60
    )
    validated = Launched(("validate", str(store_path)), cwd=scene.cwd, deadline=60)
    assert_one_error_line(fit, "fit", message)
    assert_one_error_line(evaluate, "evaluate", message)
    result = validated.wait()
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.splitlines()[1:] == [f"  {message.split(': ', 1)[1]}"], result.stdout
    scene.assert_nothing_written()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fit_and_evaluate_name_the_changed_chunk_and_its_file(store_path, tmp_path, one_worker_address):
    """The workers' reads of partition 1 (its first windows read the last tokens of chunk 3) name chunk 4 and its
    shard file, not chunk 3."""
    model = write_model(tmp_path, store_path)
    damage_chunk(store_path, "tokens", 4)
    (tmp_path / "fit").mkdir()
    scene = Scene.make(tmp_path / "fit", str(store_path), str(model))
    message = f"{store_path}: array 'tokens' chunk 4 (tokens 1024..1279, in file 'tokens/c/1') {CHANGED}"
    at = ("--scheduler", one_worker_address, "--json")
    fit = scene.fit("--head", "single", "--max-iter", "1", *at, deadline=90)
    evaluate = Launched(("evaluate", str(model), str(store_path), *at), cwd=scene.cwd, deadline=90)
    assert_one_error_line(fit, "fit", message)
    assert_one_error_line(evaluate, "evaluate", message)
    scene.assert_nothing_written()
