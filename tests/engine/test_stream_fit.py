"""A fit on a token-stream store is the fit on the triple store of the same windows."""

from __future__ import annotations

import numpy as np
import pytest

from dist_respattn.engine import FitError, FitSettings, fit
from dist_respattn.store import WriteOptions, write_tokens
from dist_respattn.store.ingest.to_stream import write_stream_tokens

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command


def test_a_stream_fit_equals_the_triple_fit_of_its_windows(client, tmp_path):
    rng = np.random.default_rng(3)
    tokens = (rng.zipf(1.5, 30_000) % 60).astype(np.int64)
    documents = np.array([0, 7_000, 7_004, 19_000])
    stream = write_stream_tokens(tmp_path / "s.zarr", tokens, 6, num_symbols=60, documents=documents,
                                 options=WriteOptions(chunk_rows=4096, partition_rows=8192))  # fmt: skip
    triples = write_tokens(tmp_path / "t.zarr", tokens, 4, num_symbols=60, documents=documents)
    settings = FitSettings(max_iter=3, tol=0.0, context_length=4)
    a = fit(stream.location, model_dir=tmp_path / "a", client=client, settings=settings, progress=False)
    b = fit(triples.location, model_dir=tmp_path / "b", client=client, settings=FitSettings(max_iter=3, tol=0.0),
            progress=False)  # fmt: skip
    assert a.model.context_length == 4 and stream.num_partitions == 4
    for name in ("key_means", "emission", "position_prior"):
        np.testing.assert_allclose(getattr(a.model, name), getattr(b.model, name), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose([h["mean_log_likelihood"] for h in a.history],
                               [h["mean_log_likelihood"] for h in b.history], rtol=1e-12)  # fmt: skip
    with pytest.raises(FitError, match="the window is fixed"):
        fit(triples.location, model_dir=tmp_path / "c", client=client, settings=FitSettings(context_length=5))
