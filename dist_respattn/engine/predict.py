"""``predict``: each row's K most probable targets, their probabilities and the attention, written by the workers.

One task per store partition reads its rows block by block, predicts them
(:func:`dist_respattn.model.heads.single_hop.top_k.predict_top_k`) and writes them into its own part of the output
(:mod:`dist_respattn.store.predictions`); only the tasks' small totals come back through the combine
tree, so neither the driver nor any worker holds more than a block of rows and their predictions. The
output must be a location every worker can write (a shared disk, or an fsspec URL such as ``s3://``).

An output named ``*.jsonl`` or ``*.csv`` is a local file of rows, with each target's word when the store has
a vocabulary: the tasks return their partition's predictions (no attention), and the driver writes them in
row order as they arrive, a few partitions in flight, so it holds one partition's predictions at a time.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import distributed

from dist_respattn.artifacts import load_checkpoint
from dist_respattn.engine import worker_tasks
from dist_respattn.engine.broadcast import ParameterBroadcast
from dist_respattn.engine.cluster import ClusterOptions, connect
from dist_respattn.engine.evaluate import scored_store
from dist_respattn.engine.fit import FitError, check_same_shape
from dist_respattn.engine.passes import PassRunner
from dist_respattn.engine.progress import FitReporter
from dist_respattn.engine.worker_tasks import attribute_map
from dist_respattn.model.heads.base import Head
from dist_respattn.model.scores import PredictionTotals
from dist_respattn.store import StoreLocation, check_model_corpus
from dist_respattn.store.predictions import (
    PredictionRowsWriter,
    PredictionsHeader,
    create_predictions,
    finish_predictions,
    output_format,
    target_words,
)
from dist_respattn.store.rows import RowStore
from dist_respattn.text_format import count_text

__all__ = ["DEFAULT_TOP_K", "PredictionRun", "predict"]

#: Targets kept per row unless asked otherwise.
DEFAULT_TOP_K = 5


@dataclass(frozen=True)
class PredictionRun:
    """What a ``predict`` run wrote.

    Attributes:
        out: the predictions' URL (a zarr group: read it with :class:`dist_respattn.store.predictions.Predictions`)
            or file (``format`` ``jsonl`` or ``csv``: see :mod:`dist_respattn.store.predictions` for its columns).
        store: the predicted store's URL; ``model``: where the model came from.
        rows: rows predicted; ``partitions``: parts written (one per store partition).
        top_k: targets kept per row (``--top``, at most T).
        top1_accuracy, top_k_accuracy: the weighted share of rows whose stored target is the first
            prediction, and among the K (the store's targets are known, so these come for free).
        seconds: wall time of the prediction pass.
        format: ``zarr``, ``jsonl`` or ``csv``; ``words``: whether the output names each target's word (a file
            of rows from a store with a vocabulary).
    """

    out: str
    store: str
    model: str
    rows: int
    partitions: int
    top_k: int
    top1_accuracy: float
    top_k_accuracy: float
    seconds: float
    format: str = "zarr"
    words: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"predicted the top {self.top_k} targets of {self.rows:,} rows of {self.store} with {self.model} "
            f"into {self.out} ({count_text(self.partitions, 'partition')}, {self.seconds:.1f} s); the stored target "
            "ranked first in "
            f"{self.top1_accuracy:.2%} of rows, among the {self.top_k} in {self.top_k_accuracy:.2%}"
        )


def predict(
    model: Head | str | os.PathLike[str],
    store: str | os.PathLike[str] | StoreLocation | RowStore,
    *,
    out: str | os.PathLike[str] | StoreLocation,
    top_k: int = DEFAULT_TOP_K,
    overwrite: bool = False,
    client: distributed.Client | None = None,
    cluster: ClusterOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    say: Callable[[str], Any] | None = None,
    progress: bool | None = None,
) -> PredictionRun:
    """Write the ``top_k`` most probable targets of every row of ``store`` under ``model`` to ``out``.

    ``model``: a head, a model directory (its ``best``, else ``latest``), or a registry's version
    (``REGISTRY@7``, ``REGISTRY@latest``). ``out`` is a new location (or, with ``overwrite``, earlier
    predictions); see :mod:`dist_respattn.store.predictions` for its layout: a name ending in ``.jsonl`` or
    ``.csv`` is a local file of rows (ids, words, probabilities), any other a zarr group. ``client``, or without one
    ``cluster``, is where it runs (see :func:`~dist_respattn.engine.connect`).
    """
    if int(top_k) < 1:
        raise FitError(f"top_k = {top_k}: expected a positive number of targets (--top)")
    meta: dict[str, Any] = {}
    if isinstance(model, Head):
        head, source = model, "a model in memory"
    else:
        checkpoint = load_checkpoint(model, storage_options=storage_options)
        head, meta, source = checkpoint.model, checkpoint.meta, os.fspath(model)
    try:
        head.check_top_k()
    except ValueError as exc:
        raise FitError(f"{source}: {exc}") from None
    # The rows evaluate scores: a head of token windows predicts the short histories its fit trained on too.
    scored = scored_store(head, meta, store, storage_options)
    names = getattr(scored, "attribute_names", None)
    mapping = attribute_map(tuple(names) if names else None, head.attribute_names())
    check_same_shape(head, "the model", scored)
    check_model_corpus(meta.get("store"), scored)
    if scored.num_rows == 0:  # before --out is opened: an empty group or file would be left behind
        raise FitError(f"the store {scored.location} has no rows to predict")
    kept = min(int(top_k), head.num_targets)
    fingerprint = scored.fingerprint()
    rows_file: PredictionRowsWriter | None = None
    if not isinstance(out, StoreLocation) and output_format(out) != "zarr":
        words = target_words(scored.vocabulary(), head.num_targets)
        rows_file = PredictionRowsWriter(out, top_k=kept, words=words, overwrite=overwrite)
    else:
        location = StoreLocation.of(out, storage_options)
        if location.url == StoreLocation.of(str(scored.location)).url:
            raise FitError(f"--out {location} is the store being predicted: give another location")
        header = PredictionsHeader(
            top_k=kept,
            context_length=head.attention_length,
            num_targets=head.num_targets,
            num_rows=scored.num_rows,
            partitions=tuple((p.start, p.stop) for p in scored.partitions()),
            model=source,
            store=str(scored.location),
            store_fingerprint=fingerprint,
        )
        create_predictions(location, header, overwrite=overwrite)
    started = time.perf_counter()
    try:
        with connect(cluster, client=client, say=say) as cl:
            reporter = FitReporter(cl, say=say, bar=progress)
            runner = PassRunner(
                cl, uuid.uuid4().hex[:8], make_bar=reporter.make_bar,
                after_loss="run predict again once the cluster is back",
            )  # fmt: skip
            params = ParameterBroadcast(cl, runner.run_tag)
            params.publish(head, "predict")
            try:
                if rows_file is not None:
                    totals = _write_rows(runner, params, scored, fingerprint, kept, rows_file, mapping)
                else:
                    totals = runner.run(
                        "predict", "0", scored.num_partitions, worker_tasks.predict_task,
                        lambda part: (scored.location, part, params.current, fingerprint, location, kept, mapping),
                        description=f"predicting {scored.location}",
                    )  # fmt: skip
            finally:
                params.release()
        if totals.rows != scored.num_rows:  # every part checks its own rows; this is the sum
            raise FitError(f"{out}: the parts hold {totals.rows} rows, the store {scored.num_rows}")
        if rows_file is not None:
            rows_file.close()
        else:
            finish_predictions(location)
    except BaseException:
        if rows_file is not None:
            rows_file.abort()
        raise
    weight = totals.weight if totals.weight > 0 else float("nan")
    return PredictionRun(
        out=str(rows_file.path) if rows_file is not None else str(location),
        store=str(scored.location),
        model=source,
        rows=totals.rows,
        partitions=scored.num_partitions,
        top_k=kept,
        top1_accuracy=totals.top1 / weight,
        top_k_accuracy=totals.top_k / weight,
        seconds=time.perf_counter() - started,
        format=rows_file.format if rows_file is not None else "zarr",
        words=rows_file is not None and rows_file.words is not None,
    )


def _write_rows(
    runner: PassRunner,
    params: ParameterBroadcast,
    scored: RowStore,
    fingerprint: str,
    top_k: int,
    writer: PredictionRowsWriter,
    mapping: Any = None,
) -> PredictionTotals:
    """Predict every partition and write its rows, in row order, through ``writer``; returns the totals.

    A few partitions more than the cluster's threads are in flight (:meth:`PassRunner.run_ordered`): the workers
    stay busy while the driver writes, and the driver holds one partition's predictions at a time (the others
    wait on the workers). Work lost with the workers (the model's copies among it) is resubmitted from the
    first partition not yet written, after the model is sent again.
    """
    totals = PredictionTotals()
    parts = runner.run_ordered(
        "predict", "0", scored.num_partitions, worker_tasks.predict_rows_task,
        lambda part: (scored.location, part, params.current, fingerprint, top_k, mapping),
        description=f"predicting {scored.location}", before_attempt=params.republish,
    )  # fmt: skip
    with contextlib.closing(parts):  # an error here (the writer's) ends the pass and cancels what is in flight
        for part in parts:
            writer.write(part.start, part.targets, part.probabilities, part.stored)
            totals = totals + part.totals
            del part
    return totals
