"""Writing a store of triples sampled from a head, with the head kept in the store for comparison."""

from __future__ import annotations

import os

import numpy as np

from dist_respattn.model import ResponsibilityAttentionDistribution, ResponsibilityAttentionSampler, random_distribution
from dist_respattn.store.common import WriteOptions, open_writer
from dist_respattn.store.errors import SchemaMismatchError
from dist_respattn.store.schema import StoreSchema
from dist_respattn.store.triples.reader import TripleStore

__all__ = ["write_synthetic"]


def write_synthetic(
    out: str | os.PathLike[str],
    rows: int,
    *,
    model: ResponsibilityAttentionDistribution | None = None,
    num_symbols: int | None = None,
    context_length: int | None = None,
    query_dim: int | None = None,
    num_targets: int | None = None,
    sigma2: float = 1.0,
    seed: int = 0,
    options: WriteOptions | None = None,
) -> TripleStore:
    """Sample ``rows`` triples from ``model`` (or a random head of shape S, N, D, T drawn from ``seed``).

    The rows at offset ``o`` of partition ``p`` onward are drawn from the seed ``(seed, p, o)`` (``o`` is
    0 except where an append continues a partial partition), so the same seed and layout give the
    same store; the head is saved in the store's ``truth`` group
    (:meth:`TripleStore.true_model`). Appending samples the store's own true model unless ``model`` is
    given, continuing the seeds with the next rows' partitions.
    """
    options = options or WriteOptions()
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"rows = {rows!r}: expected a non-negative number of rows")
    shape = {
        "num_symbols": num_symbols,
        "context_length": context_length,
        "query_dim": query_dim,
        "num_targets": num_targets,
    }
    # An append samples the store's own head, and a head given for an append must be that head.
    truth = TripleStore.open(out, storage_options=options.storage_options).true_model() if options.append else None
    if truth is not None and not isinstance(truth, ResponsibilityAttentionDistribution):
        raise ValueError(f"{out}: its true model is a {truth.kind} head; rows are sampled from a single-hop head")
    stored = truth
    if model is None and options.append:
        if stored is None:
            raise ValueError(
                f"{out}: has no true model (truth/): sampled rows can only be appended to a synthetic store"
            )
        model, model_source = stored, "store"
    elif model is None:
        missing = [k for k, v in shape.items() if v is None]
        if missing:
            raise ValueError(f"without a model, give {', '.join(missing)}")
        assert num_symbols and context_length and query_dim and num_targets
        model = random_distribution(num_symbols, context_length, query_dim, num_targets, seed=seed, sigma2=sigma2)
        model_source = "random"
    else:
        model_source = "given"
        # A shape mismatch is reported by the writer, naming the field; here only equal shapes are compared.
        if stored is not None and _same_shape(stored, model) and not _same_head(stored, model):
            raise SchemaMismatchError(f"{out}: cannot append: the given model is not the store's true model (truth/)")
    owner = "store" if model_source == "store" else "model"
    differ = [
        f"{k} {v} (the {owner} has {getattr(model, k)})" for k, v in shape.items() if v not in (None, getattr(model, k))
    ]
    if differ:
        raise SchemaMismatchError(f"{out}: the requested shape does not match the {owner}: {'; '.join(differ)}")
    schema = StoreSchema(
        model.num_symbols, model.context_length, model.query_dim, model.num_targets, options.query_dtype
    )
    provenance = {"source": "synthetic", "seed": int(seed), "model": model_source, "sigma2": float(model.sigma2)}
    with open_writer(out, schema, options, provenance) as writer:
        if not options.append:
            writer.write_true_model(model)
        step = writer.chunking.partition_rows
        first = writer.committed_rows
        done = 0
        while done < rows:
            # Draws are keyed by the store partition the rows land in, so an append continues the stream.
            position = first + done
            partition = position // step
            take = min(step - position % step, rows - done)
            rng = np.random.default_rng([int(seed), partition, position % step])
            context, query, target = ResponsibilityAttentionSampler(model, rng).sample_arrays(
                take, query_dtype=options.query_dtype
            )
            writer.write(context, query, target, source="sampler")
            done += take
        return writer.close()


def _same_shape(a: ResponsibilityAttentionDistribution, b: ResponsibilityAttentionDistribution) -> bool:
    return (
        a.key_means.shape == b.key_means.shape
        and (a.num_symbols, a.num_targets) == (b.num_symbols, b.num_targets)
        and (a.position_prior.shape == b.position_prior.shape)
    )


def _same_head(a: ResponsibilityAttentionDistribution, b: ResponsibilityAttentionDistribution) -> bool:
    return (
        a.sigma2 == b.sigma2
        and np.array_equal(a.key_means, b.key_means)
        and _same_arrays(a.emission_table.to_arrays(), b.emission_table.to_arrays())
        and np.array_equal(a.position_prior, b.position_prior)
    )


def _same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """The same emission, compared through its defining arrays (whatever its layout)."""
    return a.keys() == b.keys() and all(np.array_equal(a[name], b[name]) for name in a)
