"""The output of ``predict``: each row's top-K targets, their probabilities and the attention, as one zarr group.

Layout (a local directory or any fsspec URL, written by the workers, one partition each)::

    zarr.json                 attributes["dist_respattn"]: schema, state, K, N, T, rows, partitions,
                              the model and the store (URL and fingerprint) the predictions came from
    parts/00000/targets       int32 (n_0, K)    the K most probable targets, best first (lower id on ties)
    parts/00000/probabilities float64 (n_0, K)  their predictive probabilities
    parts/00000/attention     float64 (n_0, N)  the predictive attention over the N context positions
    parts/00001/...           the next partition's rows, and so on

Partition ``p`` holds the store's rows ``partitions[p] = [start, stop)``, in row order, so the parts
concatenated are the store's rows in order. A partition is one group because a token-stream store's
partitions do not cut its rows at a common chunk size: with one group each, no two tasks ever write the
same chunk. The state is ``writing`` until every part is written, then ``complete``.

A ``--out`` ending in ``.jsonl`` or ``.csv`` is a file of rows instead (:class:`PredictionRowsWriter`), written by
the driver from each partition's predictions in row order, with each target's word when the store has a
vocabulary (:func:`target_words`). JSON Lines, one object a row::

    {"row": 0, "target": 17, "target_word": "def", "ids": [17, 3], "words": ["def", "self"],
     "probabilities": [0.41, 0.12]}

CSV, one line a row, the K predictions in rank order::

    row,target,target_word,id_1,word_1,probability_1,...,id_K,word_K,probability_K

``target_word``, ``words`` and the ``word_k`` columns are left out for a store without a vocabulary.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import zarr

from dist_respattn.durable.files import place_file, temporary_path
from dist_respattn.model.scores import TopK
from dist_respattn.store.errors import StoreError
from dist_respattn.store.group import open_group_at
from dist_respattn.store.location import StoreLocation
from dist_respattn.store.schema import ATTRIBUTE_KEY

__all__ = [
    "OOV_WORD",
    "PREDICTIONS_SCHEMA",
    "ROW_FORMATS",
    "PredictionRowsWriter",
    "Predictions",
    "PredictionsHeader",
    "create_predictions",
    "finish_predictions",
    "output_format",
    "target_words",
    "write_prediction_part",
]

PREDICTIONS_SCHEMA = "dist_respattn.predictions"
PREDICTIONS_VERSION = 1
PARTS = "parts"

#: Rows per chunk of a part's arrays (at K = 5 and N = 8, 0.7 MiB of targets and probabilities, 4 MiB of attention).
CHUNK_ROWS = 1 << 16


@dataclasses.dataclass(frozen=True)
class PredictionsHeader:
    """What a predictions group records about itself.

    Attributes:
        top_k: K (at most T); ``context_length``: N; ``num_targets``: T; ``num_rows``: the store's rows.
        partitions: ``(start, stop)`` rows of each part, in order, covering ``[0, num_rows)``.
        model: where the model came from (a model directory or ``REGISTRY@VERSION``).
        store: the predicted store's URL; ``store_fingerprint``: its fingerprint when predicted.
    """

    top_k: int
    context_length: int
    num_targets: int
    num_rows: int
    partitions: tuple[tuple[int, int], ...]
    model: str
    store: str
    store_fingerprint: str

    def to_json(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["partitions"] = [list(p) for p in self.partitions]
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> PredictionsHeader:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in fields}
        values["partitions"] = tuple((int(a), int(b)) for a, b in values["partitions"])
        return cls(**values)


def _attributes(group: Any) -> dict[str, Any]:
    return dict(group.attrs.get(ATTRIBUTE_KEY) or {})


def _is_predictions(location: StoreLocation) -> bool:
    try:
        return _attributes(open_group_at(location)).get("schema") == PREDICTIONS_SCHEMA
    except StoreError:
        return False


def create_predictions(location: StoreLocation, header: PredictionsHeader, *, overwrite: bool = False) -> None:
    """Start a predictions group at ``location`` (state ``writing``), with an empty group per part to come.

    An existing predictions group is replaced only with ``overwrite``; anything else that is there (a
    store, a model, other files) is never deleted.
    """
    if location.exists() and not location.is_empty_dir():
        if not _is_predictions(location):
            raise StoreError(
                f"{location}: exists and is not the output of `dist-respattn predict`; choose another --out"
            )
        if not overwrite:
            raise StoreError(
                f"{location}: holds predictions already; pass overwrite=True (--overwrite) to replace them"
            )
        fs, root = location.filesystem()
        fs.rm(root, recursive=True)
    attributes = {"schema": PREDICTIONS_SCHEMA, "version": PREDICTIONS_VERSION, "state": "writing", **header.to_json()}
    group = zarr.create_group(location.zarr_store(), attributes={ATTRIBUTE_KEY: attributes}, overwrite=True)
    # The parts' parent is made here, once: workers creating it at the same time would race on its metadata.
    group.create_group(PARTS)


def _part_name(index: int) -> str:
    return f"{index:05d}"


def write_prediction_part(
    location: StoreLocation, index: int, start: int, stop: int, blocks: Iterable[tuple[int, TopK]], *, top_k: int,
    context_length: int,
) -> int:  # fmt: skip
    """Write part ``index`` (store rows ``[start, stop)``) from ``(first row, predictions)`` blocks in row order.

    Holds one block at a time; a part written again (a retried task) replaces the earlier one. Returns
    the rows written, which must be all of ``[start, stop)``.
    """
    parts = zarr.open_group(location.zarr_store(), mode="r+")[PARTS]
    if not isinstance(parts, zarr.Group):
        raise StoreError(f"{location}: '{PARTS}' is not a group (not the output of `dist-respattn predict`?)")
    part = parts.create_group(_part_name(index), overwrite=True)
    n_rows = stop - start
    chunk = (max(min(CHUNK_ROWS, n_rows), 1),)
    arrays = {
        "targets": part.create_array("targets", shape=(n_rows, top_k), dtype="int32", chunks=(*chunk, top_k)),
        "probabilities": part.create_array(
            "probabilities", shape=(n_rows, top_k), dtype="float64", chunks=(*chunk, top_k)
        ),
        "attention": part.create_array(
            "attention", shape=(n_rows, context_length), dtype="float64", chunks=(*chunk, context_length)
        ),
    }
    written = 0
    for first, block in blocks:
        if first != start + written:
            raise ValueError(f"part {index}: a block starts at row {first}, expected {start + written} (row order)")
        at = slice(written, written + block.num_rows)
        arrays["targets"][at] = block.targets
        arrays["probabilities"][at] = block.probabilities
        arrays["attention"][at] = block.attention
        written += block.num_rows
    if written != n_rows:
        raise ValueError(f"part {index}: wrote {written} rows of its {n_rows} (rows {start}..{stop - 1})")
    return written


def finish_predictions(location: StoreLocation) -> None:
    """Mark a predictions group complete, once every part is written."""
    group = open_group_at(location, mode="r+")
    attributes = _attributes(group)
    attributes["state"] = "complete"
    group.attrs[ATTRIBUTE_KEY] = attributes


class Predictions:
    """A complete predictions group, read part by part (each part fits in memory when a store partition does).

    Example::

        predictions = Predictions.open("predictions.zarr")
        for start, top in predictions.iter_parts():
            ...  # top.targets (n, K), top.probabilities (n, K), top.attention (n, N): store rows start..
    """

    def __init__(self, location: StoreLocation, group: Any, header: PredictionsHeader) -> None:
        self.location = location
        self._group = group
        self.header = header

    @classmethod
    def open(cls, url: str | StoreLocation, storage_options: dict[str, Any] | None = None) -> Predictions:
        location = StoreLocation.of(url, storage_options)
        group = open_group_at(location)
        attributes = _attributes(group)
        if attributes.get("schema") != PREDICTIONS_SCHEMA:
            raise StoreError(
                f"{location}: not the output of `dist-respattn predict` (schema {attributes.get('schema')!r})"
            )
        if attributes.get("state") != "complete":
            raise StoreError(
                f"{location}: incomplete (the predict run writing it did not finish); "
                "run predict again with --overwrite"
            )
        return cls(location, group, PredictionsHeader.from_json(attributes))

    @property
    def num_rows(self) -> int:
        return self.header.num_rows

    @property
    def num_parts(self) -> int:
        return len(self.header.partitions)

    def read_part(self, index: int) -> TopK:
        """Part ``index``'s predictions (store rows ``header.partitions[index]``)."""
        part = self._group[f"{PARTS}/{_part_name(index)}"]
        return TopK(part["targets"][...], part["probabilities"][...], part["attention"][...])

    def iter_parts(self) -> Iterator[tuple[int, TopK]]:
        """``(first store row, predictions)`` of every part, in row order."""
        for index, (start, _) in enumerate(self.header.partitions):
            yield start, self.read_part(index)

    def read_all(self) -> TopK:
        """Every row's predictions in one :class:`TopK` (for outputs that fit in memory)."""
        parts = [top for _, top in self.iter_parts()]
        return TopK(
            np.concatenate([p.targets for p in parts]),
            np.concatenate([p.probabilities for p in parts]),
            np.concatenate([p.attention for p in parts]),
        )


# ------------------------------------------------------------------------------------------ rows in words

#: The word of the out-of-vocabulary id (and of any id past the vocabulary's tokens).
OOV_WORD = "<oov>"

#: The file formats ``--out`` may name by its suffix (anything else is a zarr group).
ROW_FORMATS = {".jsonl": "jsonl", ".csv": "csv"}


def target_words(vocabulary: dict[str, Any] | None, num_targets: int) -> tuple[str, ...] | None:
    """(T,) the word of each target id, from a store's vocabulary (``store.vocabulary()``); ``None`` without one.

    Ids below the vocabulary's size are its tokens (id = rank); the out-of-vocabulary id (and any id past the
    tokens) is :data:`OOV_WORD`.
    """
    if vocabulary is None:
        return None
    tokens = [str(t) for t in vocabulary.get("tokens", [])][: int(num_targets)]
    return (*tokens, *([OOV_WORD] * (int(num_targets) - len(tokens))))


def output_format(out: str | os.PathLike[str]) -> str:
    """``"jsonl"``, ``"csv"`` or ``"zarr"``: what ``predict --out`` writes, by the name's suffix.

    ``.parquet`` is refused by name (writing it would need pyarrow, which is not a dependency).
    """
    suffix = Path(os.fspath(out).rstrip("/")).suffix.lower()
    if suffix == ".parquet":
        raise StoreError(
            f"--out {os.fspath(out)}: Parquet is not written (it needs pyarrow, not a dependency): name a .jsonl or "
            ".csv file, or a zarr group (any other name)"
        )
    return ROW_FORMATS.get(suffix, "zarr")


class PredictionRowsWriter:
    """Writes predictions a row at a time into a JSON Lines or CSV file (see the module's docstring for columns).

    The file is written under a temporary name beside it (:func:`dist_respattn.durable.files.temporary_path`:
    ``.tmp-NAME.xxxxxxxx``) and moved into place by :meth:`close` with
    :func:`~dist_respattn.durable.files.place_file`: replaced whole with ``overwrite``, else created only if the
    name is still free (two runs never both write it; a run that finds it taken keeps its rows under
    ``NAME-STEM.xxxxxxxx.SUFFIX`` and says so). A run that fails leaves no half-written file under the name asked
    for; :meth:`abort` removes the temporary. A killed process leaves its hidden temporary behind, to be removed
    by hand.

    Args:
        path: a local ``.jsonl`` or ``.csv`` file, or a ``file://`` URL of one.
        top_k: K, the predictions a row (a block may hold fewer only when T < K, never here).
        words: (T,) the word of each target id (:func:`target_words`), or ``None``.
        overwrite: replace an existing file at ``path`` (else it is refused before anything runs).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, top_k: int, words: Sequence[str] | None, overwrite: bool = False
    ) -> None:
        text = os.fspath(path)
        if text.startswith("file://"):  # a local file named as a URL: file:///data/p.jsonl, file://localhost/...
            parts = urllib.parse.urlparse(text)
            if parts.netloc in ("", "localhost"):
                text = urllib.request.url2pathname(parts.path)
        if "://" in text:
            raise StoreError(
                f"--out {text}: a .jsonl or .csv output is written by this process to a local file: give a local "
                "path (or a zarr group URL, which the workers write)"
            )
        self.path = Path(text)
        self.overwrite = bool(overwrite)
        self.format = output_format(self.path)
        if self.format == "zarr":
            raise StoreError(f"--out {text}: expected a name ending in {' or '.join(ROW_FORMATS)}")
        if self.path.is_dir():
            raise StoreError(f"--out {text}: is a directory; name a file ending in {self.path.suffix}")
        if self.path.exists() and not overwrite:
            raise StoreError(f"--out {text}: exists already; pass overwrite=True (--overwrite) to replace it")
        if not self.path.parent.is_dir():
            raise StoreError(f"--out {text}: no such directory {self.path.parent}")
        self.top_k = int(top_k)
        self.words = None if words is None else tuple(words)
        self.rows = 0
        self._temporary = Path(temporary_path(self.path))
        self._file: IO[str] | None = open(self._temporary, "w", encoding="utf-8", newline="")
        self._csv: Any = None
        if self.format == "csv":
            self._csv = csv.writer(self._file, lineterminator="\n")
            self._csv.writerow(self.columns())

    def columns(self) -> list[str]:
        """The CSV header (the JSON Lines keys are ``row``, ``target``, ``target_word``, ``ids``, ``words``,
        ``probabilities``)."""
        head = ["row", "target", *(["target_word"] if self.words is not None else [])]
        for k in range(1, self.top_k + 1):
            head += [f"id_{k}", *([f"word_{k}"] if self.words is not None else []), f"probability_{k}"]
        return head

    def write(self, first: int, targets: np.ndarray, probabilities: np.ndarray, stored: np.ndarray) -> None:
        """Rows ``first, first + 1, ...``: ``targets`` (n, K) ids best first, their ``probabilities`` (n, K), and
        each row's ``stored`` (n,) target. Rows must come in order, each once."""
        if first != self.rows:
            raise ValueError(f"rows from {first}: expected row {self.rows} next (rows are written in order)")
        assert self._file is not None, "the writer is closed"
        words = self.words
        probabilities = np.asarray(probabilities, dtype=np.float64)
        if not np.isfinite(probabilities).all():
            # JSON has no NaN (nor a probability that is not a number): such a model is broken, not its output.
            row, rank = (int(i) for i in np.argwhere(~np.isfinite(probabilities))[0])
            raise ValueError(
                f"--out {self.path}: row {first + row}: a probability is {probabilities[row, rank]}; a model that "
                "gives non-finite probabilities is broken (check it with `dist-respattn evaluate`)"
            )
        ids = np.asarray(targets).tolist()
        probs = probabilities.tolist()
        true = np.asarray(stored).tolist()
        for i, (row_ids, row_probs, target) in enumerate(zip(ids, probs, true, strict=True)):
            row = first + i
            if self._csv is not None:
                line: list[Any] = [row, target, *([words[target]] if words is not None else [])]
                for t, p in zip(row_ids, row_probs, strict=True):
                    line += [t, *([words[t]] if words is not None else []), p]
                self._csv.writerow(line)
                continue
            record: dict[str, Any] = {"row": row, "target": target}
            if words is not None:
                record["target_word"] = words[target]
            record["ids"] = row_ids
            if words is not None:
                record["words"] = [words[t] for t in row_ids]
            record["probabilities"] = row_probs
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.rows += len(ids)

    def close(self) -> None:
        """Flush the file and move it into place under its name (refused if another run created it meanwhile)."""
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        if not place_file(self._temporary, self.path, replace=self.overwrite, keep_if_taken=True):
            # The rows are complete: keep them under a visible name of their own rather than drop a finished run.
            kept = self.path.with_name(f"{self.path.stem}.{uuid.uuid4().hex[:8]}{self.path.suffix}")
            os.replace(self._temporary, kept)
            raise StoreError(
                f"--out {self.path}: was created by someone else while predicting; the rows are kept in {kept}; "
                "pass overwrite=True (--overwrite) to replace it"
            )

    def abort(self) -> None:
        """Drop what was written (a failed run leaves nothing under the name asked for)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._temporary.unlink(missing_ok=True)
