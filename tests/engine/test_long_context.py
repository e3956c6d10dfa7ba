"""Fits with a position prior tied over recency buckets: token windows with short histories, distributed equal to
in-process EM, bit-identical on 1, 2 and 3 workers, through the command line, and the streaming predictor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import distributed
import numpy as np
import pytest

from dist_respattn.engine import FitError, FitSettings, evaluate, fit, load_model, predict
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.store import WriteOptions
from dist_respattn.store.ingest.to_stream import write_stream_tokens
from dist_respattn.store.rows import open_store
from tests.engine.clusters import local_cluster

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command

N, K = 24, 5


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """Sequences where a symbol predicts the one 6 places later, in documents of 5 to 120 tokens (short histories
    at every start), over 4 partitions."""
    rng = np.random.default_rng(8)
    tokens = rng.integers(0, 40, size=12_000)
    tokens[6:] = np.where(rng.random(tokens.size - 6) < 0.5, (tokens[:-6] * 7 + 3) % 40, tokens[6:])
    lengths = rng.integers(5, 120, size=400)
    documents = np.concatenate([[0], np.cumsum(lengths)])
    documents = documents[documents < tokens.size]
    path = tmp_path_factory.mktemp("long") / "s.zarr"
    options = WriteOptions(chunk_rows=1536, partition_rows=3072)
    return write_stream_tokens(path, tokens, N, num_symbols=40, documents=documents, options=options)


def test_short_histories_are_read_as_windows_cut_at_their_document_start(stream):
    full = open_store(stream.location)
    short = open_store(stream.location, min_context=1)
    assert short.num_rows > full.num_rows
    rows = short.read_windows(0, short.num_rows)
    lengths = rows.end - rows.begin
    assert lengths.min() == 1 and lengths.max() == N and (lengths < N).sum() == short.num_rows - full.num_rows
    starts = full.document_starts()
    doc_of_begin = np.searchsorted(starts, rows.begin, side="right")
    doc_of_target = np.searchsorted(starts, rows.end, side="right")
    assert np.array_equal(doc_of_begin, doc_of_target)  # no window crosses a document boundary
    assert np.array_equal(rows.target, rows.tokens[rows.end]) and np.array_equal(
        rows.query_index, rows.tokens[rows.end - 1]
    )
    # The full windows among them are exactly the (n, N) rows of the store read without short histories.
    encoded = full.read_rows(0, full.num_rows)
    keep = lengths == N
    windows = np.stack([rows.tokens[b:e] for b, e in zip(rows.begin[keep], rows.end[keep], strict=True)])
    assert np.array_equal(windows, encoded.context)
    with pytest.raises(Exception, match="--min-context 1 < N = 24: rows with fewer than N earlier tokens"):
        short.read_rows(0, 10)


#: Two iterations: the second starts from a distributed M-step's parameters, which is what bit-identity is about.
SETTINGS = FitSettings(
    max_iter=2, tol=0.0, position_buckets=K, sigma2=4.0, emission_smoothing=0.01, holdout_fraction=0.0
)


def in_process_fit(store, settings, iterations):
    """The same EM in one process: every partition's windows in one accumulator, in row order."""
    buckets = settings.buckets(store.schema.context_length)
    estimator = settings.estimator(store.schema)
    accumulator = estimator.accumulator_factory().make()
    for part in range(store.num_partitions):
        for rows in store.iter_windows(part):
            accumulator.seq_initialize_windows(rows, buckets)
    model = estimator.estimate(None, accumulator.value())
    for _ in range(iterations):
        accumulator = estimator.accumulator_factory().make()
        for part in range(store.num_partitions):
            for rows in store.iter_windows(part):
                accumulator.seq_update_windows(rows, model)
        model = estimator.estimate(None, accumulator.value(), previous=model)
    return model


def test_a_bucketed_fit_equals_in_process_em_and_is_bit_identical_on_one_two_and_three_workers(
    stream, client, tmp_path
):
    # Two workers: the module's cluster; one, then three: another cluster grown between the fits (cheaper than a
    # cluster each; a cluster only grows, as distributed's close can fail after a scale-down).
    results = {2: fit(stream.location, model_dir=tmp_path / "w2", client=client, settings=SETTINGS, progress=False)}
    with local_cluster(1) as (cluster, other):
        results[1] = fit(stream.location, model_dir=tmp_path / "w1", client=other, settings=SETTINGS, progress=False)
        cluster.scale(3)
        other.wait_for_workers(3, timeout=60)
        with distributed.get_task_stream(client=other) as tasks:
            results[3] = fit(
                stream.location, model_dir=tmp_path / "w3", client=other, settings=SETTINGS, progress=False
            )
        assert len({record["worker"] for record in tasks.data}) >= 2
    models = []
    for workers in (1, 2, 3):
        models.append(results[workers].model)
        assert results[workers].model.buckets == PositionBuckets.geometric(N, K)
    for other in models[1:]:
        for name in ("key_means", "position_prior", "emission"):
            assert np.array_equal(getattr(models[0], name), getattr(other, name)), name
    expected = in_process_fit(open_store(stream.location, min_context=1), SETTINGS, SETTINGS.max_iter)
    for name in ("key_means", "position_prior", "emission"):
        np.testing.assert_allclose(getattr(models[0], name), getattr(expected, name), rtol=1e-11, atol=1e-14)
    # The checkpoint records the buckets, and the history's likelihood never decreases.
    loaded = load_model(tmp_path / "w1")
    assert loaded.buckets == models[0].buckets and np.array_equal(loaded.position_prior, models[0].position_prior)


def test_a_bucketed_fit_is_scored_on_the_rows_it_trained_on_and_beats_the_bigram(stream, client, tmp_path):
    settings = FitSettings(max_iter=6, position_buckets=K)
    result = fit(stream.location, model_dir=tmp_path / "m", client=client, settings=settings, progress=False)
    likelihoods = [h["mean_log_likelihood"] for h in result.history]
    assert result.history and all(np.isfinite(likelihoods))
    scored = evaluate(tmp_path / "m", stream.location, client=client, progress=False).to_json()
    assert scored["rows"] == open_store(stream.location, min_context=1).num_rows
    # The signal is 6 tokens back: beyond a bigram's reach, inside the buckets'.
    assert scored["model"]["perplexity"] < scored["baselines"]["kneser_ney"]["perplexity"]
    with pytest.raises(FitError, match="--position-buckets 7 with a window of N = 24"):
        fit(stream.location, model_dir=tmp_path / "bad", client=client, settings=FitSettings(position_buckets=7))
    with pytest.raises(FitError, match="short histories are fitted by the histogram kernel"):
        fit(stream.location, model_dir=tmp_path / "bad", client=client, settings=FitSettings(min_context=3))
    with pytest.raises(FitError, match="such a head predicts one history at a time"):
        predict(tmp_path / "m", stream.location, out=tmp_path / "p", client=client)
    with pytest.raises(ValueError, match="a tied prior starts uniform"):
        FitSettings(position_buckets=3, init="random")


def test_fit_with_buckets_and_predict_stream_through_the_command_line(stream, client, tmp_path):
    command = [str(Path(sys.executable).parent / "dist-respattn")]
    # On the module's cluster: the command's flags are what is tested here, not a cluster of its own.
    fitted = subprocess.run(
        [*command, "fit", str(stream.location), "--model-dir", str(tmp_path / "m"), "--head", "single",
         "--position-buckets", str(K), "--max-iter", "2", "--scheduler", client.scheduler.address, "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    history = " ".join(str(t) for t in np.random.default_rng(0).integers(0, 40, size=300))
    streamed = subprocess.run(
        [*command, "predict", str(tmp_path / "m"), str(stream.location), "--stream", "--top", "3"],
        input=history, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [line["position"] for line in lines] == list(range(1, 301))
    assert all(len(line["top"]) == 3 and line["top"][0][1] >= line["top"][1][1] for line in lines)
    assert "predicted after 300 tokens" in streamed.stderr
    bad = subprocess.run(
        [*command, "predict", str(tmp_path / "m"), str(stream.location), "--stream"],
        input="3 7 x", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 2 and "stdin line 1: 'x' is not a token id" in bad.stderr
    refused = subprocess.run(
        [*command, "fit", str(stream.location), "--model-dir", str(tmp_path / "n"), "--head", "single",
         "--position-buckets", "9"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2 and "--position-buckets 9 with a window of N = 24" in refused.stderr


def test_a_long_window_fit_is_planned_by_what_the_histogram_kernel_holds(stream, tmp_path):
    """N = 5000 over buckets: the (n, N) blocks of encoded rows would need ~330 MiB a worker, over the 280 MiB
    Dask lets a 400 MiB worker plan for; token windows need about the worker's own footprint."""
    command = [str(Path(sys.executable).parent / "dist-respattn")]
    fitted = subprocess.run(
        [*command, "fit", str(stream.location), "--model-dir", str(tmp_path / "m"), "--head", "single",
         "--context", "5000", "--position-buckets", "10", "--max-iter", "1", "--workers", "1", "--memory-limit",
         "400MiB", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    assert load_model(tmp_path / "m").context_length == 5000
