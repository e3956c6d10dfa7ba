"""One corpus split into train, validation and test stores: one identity, disjoint documents, train-only counts."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dist_respattn.model.encoder import sequence_windows
from dist_respattn.store import (
    SPLIT_NAMES,
    StoreError,
    TextCorpus,
    TokenCorpus,
    TripleStore,
    WriteOptions,
    check_same_corpus,
    validate,
    write_split,
)
from tests.store.helpers import assert_rows, assert_same_rows, read_all

OPTIONS = WriteOptions(chunk_rows=64, partition_rows=128)
FRACTIONS = (0.5, 0.25, 0.25)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def documented_split(key: str, seed: int, fractions=FRACTIONS) -> str:
    """The split the module docstring promises: sha256 of "split\\n{seed}\\n{key}", first 8 bytes over 2**64."""
    u = int.from_bytes(hashlib.sha256(f"split\n{seed}\n{key}".encode()).digest()[:8], "big") / 2**64
    return "train" if u < fractions[0] else "validation" if u < fractions[0] + fractions[1] else "test"


def make_tree(root: Path, files: int = 16) -> dict[str, str]:
    """Small text files in two folders (texts keyed by their path relative to ``root``)."""
    rng = np.random.default_rng(4)
    texts = {}
    for i in range(files):
        key = f"{'docs' if i % 2 else 'notes/deep'}/file{i:02d}.txt"
        words = rng.choice(WORDS[: 4 + i % 8], size=12 + i)
        texts[key] = " ".join(words) + (" omega" * (i % 3)) + ".\n"
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(texts[key], encoding="utf-8")
    return texts


def assert_one_identity(stores: dict[str, TripleStore]) -> None:
    assert list(stores) == list(SPLIT_NAMES)
    train = stores["train"]
    for name, store in stores.items():
        assert store.location.url.endswith(f"/{name}.zarr")
        assert store.identity() == train.identity() and store.schema == train.schema
        assert store.vocabulary() == train.vocabulary()
        np.testing.assert_array_equal(store.embeddings(), train.embeddings())
        assert store.provenance["split"]["name"] == name and store.num_rows > 0
        check_same_corpus(train, store, reference_role="training store", other_role=f"{name} store")
        assert validate(store.location).ok


def test_a_text_split_shares_one_train_vocabulary_and_keeps_documents_apart(tmp_path):
    texts = make_tree(tmp_path / "corpus")
    k, n = 6, 2
    stores = write_split(
        tmp_path / "out",
        TextCorpus([tmp_path / "corpus"]),
        n,
        vocab_size=k,
        fractions=FRACTIONS,
        options=OPTIONS,
        store_format="triples",
    )
    assert_one_identity(stores)
    owner = {key: documented_split(key, 0) for key in texts}
    assert set(owner.values()) == set(SPLIT_NAMES)
    tokens = {key: re.findall(r"\w+|[^\w\s]", text.lower()) for key, text in texts.items()}
    train_counts = Counter(t for key in texts if owner[key] == "train" for t in tokens[key])
    ranked = sorted(train_counts.items(), key=lambda item: (-item[1], item[0]))[:k]
    vocabulary = stores["train"].vocabulary()
    assert vocabulary is not None
    assert vocabulary["tokens"] == [t for t, _ in ranked] and vocabulary["counts"] == [c for _, c in ranked]
    assert vocabulary["total_tokens"] == sum(train_counts.values())  # counted on the train documents only
    lookup = {t: i for i, (t, _) in enumerate(ranked)}
    table = stores["train"].embeddings()
    for name, store in stores.items():
        mine = sorted(key for key in texts if owner[key] == name)  # files in path order
        assert store.provenance["split"] == {
            "name": name,
            "fractions": list(FRACTIONS),
            "seed": 0,
            "documents": len(mine),
            "max_tokens": None,
        }
        assert store.provenance["tokens_count"] == sum(len(tokens[key]) for key in mine)
        parts = [sequence_windows([lookup.get(t, k) for t in tokens[key]], n, embeddings=table) for key in mine]
        assert_rows(read_all(store), *(np.concatenate([p[i] for p in parts]) for i in range(3)))


def test_a_text_split_is_the_same_under_another_root_and_differs_with_the_seed(tmp_path):
    texts = make_tree(tmp_path / "here" / "corpus")
    shutil.copytree(tmp_path / "here" / "corpus", tmp_path / "elsewhere" / "deeper" / "copy")
    here = write_split(
        tmp_path / "a",
        TextCorpus([tmp_path / "here" / "corpus"]),
        2,
        fractions=FRACTIONS,
        options=OPTIONS,
        store_format="triples",
    )
    there = write_split(
        tmp_path / "b",
        TextCorpus([tmp_path / "elsewhere/deeper/copy"]),
        2,
        fractions=FRACTIONS,
        options=OPTIONS,
        store_format="triples",
    )
    for name in SPLIT_NAMES:
        assert here[name].identity() == there[name].identity()
        assert_same_rows(read_all(here[name]), read_all(there[name]))
    reseeded = write_split(
        tmp_path / "c",
        TextCorpus([tmp_path / "here" / "corpus"]),
        2,
        fractions=FRACTIONS,
        split_seed=3,
        options=OPTIONS,
        store_format="triples",
    )
    assert {k: documented_split(k, 3) for k in texts} != {k: documented_split(k, 0) for k in texts}
    for name, store in reseeded.items():
        assert store.provenance["split"]["documents"] == sum(documented_split(k, 3) == name for k in texts)
        assert store.provenance["split"]["seed"] == 3


def test_a_text_split_with_max_tokens_takes_files_in_hashed_order_and_counts_only_train_ones(tmp_path):
    texts = make_tree(tmp_path / "corpus", files=24)
    tokens = {key: re.findall(r"\w+|[^\w\s]", text.lower()) for key, text in texts.items()}
    order = sorted(texts, key=lambda key: hashlib.sha256(f"order\n0\n{key}".encode()).digest()[:8])
    taken, total = [], 0
    for key in order:
        if total >= 150:
            break
        taken.append(key)
        total += len(tokens[key])
    source = TextCorpus([tmp_path / "corpus"])
    stores = write_split(
        tmp_path / "out", source, 2, fractions=FRACTIONS, max_tokens=150, options=OPTIONS, store_format="triples"
    )
    assert_one_identity(stores)
    for name, store in stores.items():
        mine = [key for key in taken if documented_split(key, 0) == name]
        assert store.provenance["split"]["documents"] == len(mine)
        assert store.provenance["tokens_count"] == sum(len(tokens[key]) for key in mine)
    vocabulary = stores["train"].vocabulary()
    assert vocabulary is not None
    train_tokens = sum(len(tokens[key]) for key in taken if documented_split(key, 0) == "train")
    assert vocabulary["total_tokens"] == train_tokens


@pytest.mark.slow
def test_a_token_split_cuts_the_stream_into_blocks_and_streams_each_to_its_split(tmp_path):
    n, block = 3, 50
    tokens = np.random.default_rng(2).integers(0, 20, 1025)
    np.save(tmp_path / "tokens.npy", tokens)
    source = TokenCorpus(tmp_path / "tokens.npy", block_tokens=block)
    stores = write_split(
        tmp_path / "out", source, n, dim=4, fractions=FRACTIONS, options=OPTIONS, store_format="triples"
    )
    assert_one_identity(stores)
    table = stores["train"].embeddings()
    starts = list(range(0, 1025, block))
    for name, store in stores.items():
        mine = [i for i in range(len(starts)) if documented_split(str(i), 0) == name]
        assert store.provenance["split"]["documents"] == len(mine)
        assert store.provenance["block_tokens"] == block
        parts = [sequence_windows(tokens[starts[i] : starts[i] + block], n, embeddings=table) for i in mine]
        assert_rows(read_all(store), *(np.concatenate([p[i] for p in parts]) for i in range(3)))
    again = write_split(
        tmp_path / "again", source, n, dim=4, fractions=FRACTIONS, options=OPTIONS, store_format="triples"
    )
    for name in SPLIT_NAMES:
        assert_same_rows(read_all(stores[name]), read_all(again[name]))


def test_a_token_split_with_documents_and_max_tokens_takes_whole_documents_in_hashed_order(tmp_path):
    tokens = np.random.default_rng(3).integers(0, 9, 2000)
    starts = np.arange(0, 2000, 40)  # 50 documents of 40 tokens
    source = TokenCorpus(tokens, documents=starts)
    stores = write_split(
        tmp_path / "out", source, 2, fractions=FRACTIONS, max_tokens=801, options=OPTIONS, store_format="triples"
    )
    assert_one_identity(stores)
    taken = sum(s.provenance["split"]["documents"] for s in stores.values())
    assert taken == 21  # 20 documents hold 800 tokens: one more reaches 801
    assert sum(s.provenance["tokens_count"] for s in stores.values()) == 21 * 40
    assert sum(s.num_rows for s in stores.values()) == 21 * (40 - 2)
    assert all(s.provenance["split"]["max_tokens"] == 801 for s in stores.values())


def test_bad_fractions_empty_splits_and_existing_stores_are_refused_leaving_nothing(tmp_path):
    tokens = np.random.default_rng(5).integers(0, 9, 400)
    for fractions in ((0.5, 0.5, 0.0), (0.5, 0.3, 0.3), (0.5, 0.5)):
        with pytest.raises(ValueError, match=r"\(--fractions\): expected three numbers > 0"):
            write_split(tmp_path / "out", TokenCorpus(tokens), 2, fractions=fractions)
    with pytest.raises(ValueError, match=r"the (validation|test) split gets none of the 1 document with.*--fractions"):
        write_split(
            tmp_path / "out", TokenCorpus(tokens), 2, options=OPTIONS, store_format="triples"
        )  # one 10,000-token block
    stray = tokens.copy()
    stray[77] = 2**40  # S would be sized by it: refused before any table is made
    with pytest.raises(ValueError, match=r"tokens\[77\] = 1,099,511,627,776: a token id .* --symbols S"):
        write_split(tmp_path / "out", TokenCorpus(stray, block_tokens=20), 2, options=OPTIONS)
    short = TokenCorpus(tokens, block_tokens=3)  # documents of 3 tokens: no window of N = 3 fits
    with pytest.raises(ValueError, match=r"block_tokens = 3 \(--block-tokens\): .* expected more than N tokens"):
        write_split(tmp_path / "out", short, 3, options=OPTIONS, store_format="triples")
    short = TokenCorpus(tokens, documents=np.arange(0, 400, 3))  # the same documents, given by their starts
    with pytest.raises(ValueError, match=r"train\.zarr: the train split has no rows: .* longer than N = 3"):
        write_split(tmp_path / "out", short, 3, options=OPTIONS, store_format="triples")
    assert not (tmp_path / "out").exists()
    write_split(tmp_path / "out", TokenCorpus(tokens, block_tokens=20), 2, options=OPTIONS, store_format="triples")
    with pytest.raises(StoreError, match=r"train\.zarr: already exists: .*--overwrite"):
        write_split(tmp_path / "out", TokenCorpus(tokens, block_tokens=20), 2, options=OPTIONS, store_format="triples")
    overwrite = WriteOptions(chunk_rows=64, partition_rows=128, overwrite=True)
    replaced = write_split(
        tmp_path / "out", TokenCorpus(tokens, block_tokens=20), 4, options=overwrite, store_format="triples"
    )
    assert all(store.schema.context_length == 4 for store in replaced.values())
    with pytest.raises(ValueError, match="append"):
        write_split(tmp_path / "out", TokenCorpus(tokens), 2, options=WriteOptions(append=True))
