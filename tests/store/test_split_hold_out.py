"""``write_split(..., hold_out="last")``: leave-one-out stores of item sequences, exact at document edges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dist_respattn.store import TextCorpus, TokenCorpus, WriteOptions, open_store, write_split

#: Small chunks and shards, so documents cross them (the stream is read piece by piece).
OPTIONS = WriteOptions(chunk_rows=8, partition_rows=16)


def corpus(lengths: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    documents = [rng.integers(0, 9, size=n) for n in lengths]
    starts = np.cumsum([0, *lengths[:-1]])
    return np.concatenate(documents), starts, documents


def contents(path: Path, window: int) -> list[tuple[list[int], list[float] | None]]:
    """Each document of a stream store: its tokens, and the weights of the rows whose targets they are."""
    store = open_store(path, window=window, min_context=1)
    starts, ends = store.document_starts(), store.document_ends()
    rows = store.read_windows(0, store.num_rows)
    out = []
    for d, (a, b) in enumerate(zip(starts, ends, strict=True)):
        weights = None
        if rows.weight is not None:
            # Rows of document d (min_context 1: one per token but its first), their weights in token order.
            mine = store.read_documents(0, store.num_rows) == d
            weights = [float(w) for w in rows.weight[mine]]
        out.append((store.read_tokens(int(a), int(b)).tolist(), weights))
    return out


def test_each_document_is_cut_at_its_end_and_documents_of_fewer_than_three_tokens_are_skipped(tmp_path) -> None:
    lengths = [1, 2, 3, 4, 11, 2, 6]
    tokens, starts, documents = corpus(lengths)
    stores = write_split(
        tmp_path, TokenCorpus(tokens, starts), 2, options=WriteOptions(**{**OPTIONS.__dict__, "overwrite": True}),
        hold_out="last",
    )  # fmt: skip
    kept = [d for d in documents if d.size >= 3]
    assert [d.size for d in kept] == [3, 4, 11, 6]
    train = contents(tmp_path / "train.zarr", 2)
    assert [t for t, w in train] == [d[:-2].tolist() for d in kept] and all(w is None for _, w in train)
    for name, cut in (("validation", 1), ("test", 0)):
        held = contents(tmp_path / f"{name}.zarr", 2)
        assert [t for t, _ in held] == [d[: d.size - cut].tolist() for d in kept]
        # Only the row whose target is the document's last token there weighs anything.
        assert [w for _, w in held] == [[0.0] * (d.size - cut - 2) + [1.0] for d in kept]
        split = stores[name].provenance["split"]
        assert (split["hold_out"], split["documents"], split["skipped_documents"]) == ("last", 4, 3)
    # At the window N = 2 the held-out rows that exist are those with 2 tokens before them: the 3-token document's
    # validation target has only one (a reader with --min-context 1 sees it).
    test = open_store(tmp_path / "test.zarr")
    assert float(test.read_rows(0, test.num_rows).weight.sum()) == 4.0
    validation = open_store(tmp_path / "validation.zarr")
    assert float(validation.read_rows(0, validation.num_rows).weight.sum()) == 3.0


def test_what_leave_one_out_cannot_take_is_refused_naming_it(tmp_path) -> None:
    tokens, starts, _ = corpus([3, 4, 5])
    with pytest.raises(ValueError, match=r"--documents STARTS\.npy"):
        write_split(tmp_path / "a", TokenCorpus(tokens), 1, hold_out="last")
    with pytest.raises(ValueError, match="drop --format triples"):
        write_split(tmp_path / "b", TokenCorpus(tokens, starts), 1, hold_out="last", store_format="triples")
    with pytest.raises(ValueError, match="token corpus"):
        write_split(tmp_path / "c", TextCorpus([str(tmp_path)]), 1, hold_out="last")
    with pytest.raises(ValueError, match="--hold-out"):
        write_split(tmp_path / "d", TokenCorpus(tokens, starts), 1, hold_out="first")
    # No document has 4 tokens before a training target (the 5-token one trains on 3): the empty split is named.
    with pytest.raises(ValueError, match=r"train split has no rows.*give a smaller --context"):
        write_split(tmp_path / "e", TokenCorpus(tokens, starts), 4, hold_out="last")
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())


def test_info_describes_a_leave_one_out_store(tmp_path, capsys) -> None:
    """``info`` on a store of ``split --hold-out last`` (whose split has no fractions) says what the split was."""
    from dist_respattn.cli import main

    tokens, starts, _ = corpus([1, 2, 3, 4, 11, 2, 6])
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "starts.npy", starts)
    argv = ["--tokens", str(tmp_path / "tokens.npy"), "--documents", str(tmp_path / "starts.npy"), "--context", "2"]
    assert main(["split", str(tmp_path / "out"), *argv, "--hold-out", "last"]) == 0
    for name in ("train", "validation", "test"):
        capsys.readouterr()
        assert main(["info", str(tmp_path / "out" / f"{name}.zarr")]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("split ")]
        assert lines == [
            f"split        {name}: leave-one-out (--hold-out last) of 4 documents, 3 documents of fewer than 3 tokens "
            "skipped"
        ]
