"""The kinds of head the contract suites run over: per kind, a spec, a small dataset and an independent reference.

Every kind adds its cases to :data:`CASES` (one ``CASES.append(KindCase(...))`` block per case, each independent of
the others, so additions by different kinds merge without conflict). A case's reference ``predict_proba`` is written
with plain numpy from the head's parameters, never through the kind's kernels, so the suites compare two
implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.heads.base import Block, Columns, Head, HeadSpec, TrainerContext
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.heads.single_hop.kind import SingleHopSpec
from dist_respattn.model.heads.single_hop.sampler import random_distribution
from dist_respattn.model.rows import EncodedRows, WindowRows

__all__ = ["CASES", "KindCase", "KindData", "blocks_of", "case_ids", "single_hop_reference", "single_hop_tables"]


@dataclass(frozen=True)
class KindData:
    """A small dataset of a case: ``context`` (n, N) int32, ``query`` (n, D) float64, ``target`` (n,) int32 and,
    for a kind that reads them, ``attribute`` (n,) int64 with their ``attribute_names``."""

    context: np.ndarray
    query: np.ndarray
    target: np.ndarray
    attribute: np.ndarray | None = None
    attribute_names: tuple[str, ...] | None = None

    @property
    def num_rows(self) -> int:
        return int(self.target.shape[0])

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(context, query, target)``, as ``fit_em`` takes them."""
        return self.context, self.query, self.target


@dataclass(frozen=True)
class KindCase:
    """One kind of head under test.

    Attributes:
        name: the case's test id.
        make: ``() -> (spec, data, context)``: the spec of a fit with nothing to choose on held-out rows, the
            rows, and the :class:`TrainerContext` its trainer is made from (shape, attribute names, a start).
        ml_spec: ``spec -> spec``: the same fit with maximum-likelihood settings (no prior on any table, nothing
            chosen), whose EM never lowers the training likelihood.
        reference_predict_proba: ``(head, context, query, attribute or None) -> (n, T)``: ``p(target | row)``
            computed with plain numpy from the head's parameters.
        tables: ``head -> {name: (r, c) array}``: the head's probability tables, each row of which sums to one.
        batch_top_k: whether :meth:`Head.top_k` predicts blocks (else it refuses them with a ``ValueError``).
        predictor_options: ``(data, row) -> options`` for :meth:`Head.predictor` predicting that row (an attribute,
            say); ``None``: no options.
        scoring_spec: ``spec -> spec``: a fit whose E-step reads the rows as scoring does, for a kind whose E-step
            explains each training row by rows counted without it (the conjunction head's rows counted from the
            data); ``None``: the spec itself.
    """

    name: str
    make: Callable[[], tuple[HeadSpec, KindData, TrainerContext]]
    ml_spec: Callable[[HeadSpec], HeadSpec]
    reference_predict_proba: Callable[[Head, np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]
    tables: Callable[[Head], dict[str, np.ndarray]]
    batch_top_k: bool = True
    predictor_options: Callable[[KindData, int], dict[str, Any]] | None = field(default=None)
    scoring_spec: Callable[[HeadSpec], HeadSpec] | None = field(default=None)


def blocks_of(data: KindData, columns: Columns, start: int = 0, stop: int | None = None) -> Iterator[Block]:
    """Rows ``start:stop`` of ``data`` as one block carrying ``columns`` (as a store partition's reader gives it:
    token windows when asked for, the attributes when asked for, every row weighing 1)."""
    stop = data.num_rows if stop is None else stop
    context, query, target = (a[start:stop] for a in data.arrays)
    rows: Any
    if columns.windows:
        rows = WindowRows.from_encoded(context, query, target, None, start)
    else:
        rows = EncodedRows(context, query, target, None, start)
    attribute = None
    if columns.attributes:
        assert data.attribute is not None, "the kind reads attributes but the case's data has none"
        attribute = data.attribute[start:stop]
    yield Block(rows, None, attribute, partition=0, start=start)


#: Every kind's cases. A kind adds its own with one ``CASES.append(KindCase(...))`` block (see the ones below).
CASES: list[KindCase] = []


def case_ids(case: KindCase) -> str:
    return case.name


# ----------------------------------------------------------------------------------------------- single-hop


def single_hop_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) ``sum_i a_i B[c_i, :]`` with ``a ∝ pi_i exp(-||y - K[c_i]||^2 / (2 sigma2))``, in plain numpy."""
    assert isinstance(head, ResponsibilityAttentionDistribution)
    keys = head.key_means[context]  # (n, N, D)
    distance = ((query[:, None, :] - keys) ** 2).sum(axis=2)
    with np.errstate(divide="ignore"):
        log_a = np.log(head.position_prior)[None, :] - distance / (2.0 * head.sigma2)
    a = np.exp(log_a - log_a.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    emission = head.emission_table.to_dense()  # (S, T), a sparse layout's pairs and backoff made whole
    return np.einsum("ni,nit->nt", a, emission[context])


def single_hop_tables(head: Head) -> dict[str, np.ndarray]:
    """The emission's rows and the position prior."""
    assert isinstance(head, ResponsibilityAttentionDistribution)
    return {"emission": head.emission_table.to_dense(), "position_prior": head.position_prior[None, :]}


def single_hop_ml(spec: HeadSpec) -> HeadSpec:
    """Maximum likelihood: no emission smoothing, no prior on the position prior, the gate variance fixed."""
    assert isinstance(spec, SingleHopSpec)
    return SingleHopSpec(
        init=spec.init, seed=spec.seed, sigma2=spec.sigma2 or 1.0, emission_smoothing=0.0,
        emission_layout=spec.emission_layout, position_buckets=spec.position_buckets,
    )  # fmt: skip


def single_hop_data(n: int, shape: tuple[int, int, int, int], seed: int) -> KindData:
    """``n`` rows sampled from a random single-hop head of ``shape``."""
    s, n_pos, d, t = shape
    truth = random_distribution(s, n_pos, d, t, seed=seed, sigma2=0.5)
    context, query, target = truth.sampler(seed + 1).sample_arrays(n)
    return KindData(
        # float32 values, which a store keeps exactly: a distributed fit reads the rows fit_em reads.
        np.ascontiguousarray(context, dtype=np.int32),
        np.asarray(query, dtype=np.float32).astype(np.float64),
        target.astype(np.int32),
    )


def _single_hop_free_dense() -> tuple[HeadSpec, KindData, TrainerContext]:
    shape = (12, 4, 3, 9)
    spec = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense")
    return spec, single_hop_data(600, shape, seed=3), TrainerContext(shape)


CASES.append(KindCase("single_hop-free-dense", _single_hop_free_dense, single_hop_ml, single_hop_reference,
                      single_hop_tables))  # fmt: skip


def _single_hop_free_sparse() -> tuple[HeadSpec, KindData, TrainerContext]:
    shape = (15, 4, 3, 11)
    spec = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="sparse")
    return spec, single_hop_data(600, shape, seed=5), TrainerContext(shape)


CASES.append(KindCase("single_hop-free-sparse", _single_hop_free_sparse, single_hop_ml, single_hop_reference,
                      single_hop_tables))  # fmt: skip


def _single_hop_tied() -> tuple[HeadSpec, KindData, TrainerContext]:
    shape = (12, 6, 3, 9)
    assert PositionBuckets.geometric(shape[1], 3).num_buckets == 3
    spec = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense",
                         position_buckets=3)  # fmt: skip
    return spec, single_hop_data(600, shape, seed=7), TrainerContext(shape)


# A tied prior predicts one history at a time (its top_k refuses blocks).
CASES.append(KindCase("single_hop-tied", _single_hop_tied, single_hop_ml, single_hop_reference, single_hop_tables,
                      batch_top_k=False))  # fmt: skip


# ----------------------------------------------------------------------------------------------- mixture


def mixture_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) ``sum_k w_k p_k(t | c, y)`` with ``w_k ∝ pi_k p_k(y | c)``: each component's gate density and
    prediction in plain numpy (:func:`single_hop_reference`)."""
    from dist_respattn.model.heads.mixture import MixtureHead

    assert isinstance(head, MixtureHead)
    log_post = np.empty((context.shape[0], head.num_components))
    for k, c in enumerate(head.components):
        distance = ((query[:, None, :] - c.key_means[context]) ** 2).sum(axis=2)
        with np.errstate(divide="ignore"):
            log_w = np.log(c.position_prior)[None, :] - distance / (2.0 * c.sigma2)
        best = log_w.max(axis=1)
        normalizer = -0.5 * c.query_dim * np.log(2.0 * np.pi * c.sigma2)
        log_q = best + np.log(np.exp(log_w - best[:, None]).sum(axis=1)) + normalizer
        log_post[:, k] = np.log(head.gate[k]) + log_q
    w = np.exp(log_post - log_post.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    out = np.zeros((context.shape[0], head.num_targets))
    for k, c in enumerate(head.components):
        out += w[:, k, None] * single_hop_reference(c, context, query)
    return out


def mixture_tables(head: Head) -> dict[str, np.ndarray]:
    """The gate, and every component's emission rows and position prior."""
    from dist_respattn.model.heads.mixture import MixtureHead

    assert isinstance(head, MixtureHead)
    tables: dict[str, np.ndarray] = {"gate": head.gate[None, :]}
    for k, c in enumerate(head.components):
        tables.update({f"component_{k}_{name}": table for name, table in single_hop_tables(c).items()})
    return tables


def mixture_ml(spec: HeadSpec) -> HeadSpec:
    """Maximum likelihood: every component's (:func:`single_hop_ml`), and no prior on the gate."""
    from dist_respattn.model.heads.mixture import MixtureSpec

    assert isinstance(spec, MixtureSpec)
    component = single_hop_ml(spec.component)
    assert isinstance(component, SingleHopSpec)
    return MixtureSpec(spec.components, component, seed=spec.seed, gate_pseudo_count=0.0)


def mixture_data(n: int, shape: tuple[int, int, int, int], seed: int) -> KindData:
    """``n`` rows sampled from a mixture of two random single-hop heads of ``shape``."""
    from dist_respattn.model.heads.mixture import MixtureHead

    truth = MixtureHead([0.6, 0.4], [random_distribution(*shape, seed=seed + k, sigma2=0.5) for k in (0, 1)])
    context, query, target = truth.sample_arrays(n, seed=seed + 2)
    # Queries a store keeps exactly (it holds float32): the distributed fit then reads the very rows fit_em reads.
    exact = np.asarray(query, dtype=np.float32).astype(np.float64)
    return KindData(np.ascontiguousarray(context, dtype=np.int32), exact, target.astype(np.int32))


def _mixture_dense() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.mixture import MixtureSpec

    shape = (12, 4, 3, 9)
    component = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense")
    spec = MixtureSpec(components=2, component=component, seed=1)
    return spec, mixture_data(600, shape, seed=11), TrainerContext(shape)


CASES.append(KindCase("mixture-dense", _mixture_dense, mixture_ml, mixture_reference, mixture_tables))


def _mixture_sparse() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.mixture import MixtureSpec

    shape = (15, 4, 3, 11)
    component = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="sparse")
    spec = MixtureSpec(components=3, component=component, seed=2)
    return spec, mixture_data(600, shape, seed=13), TrainerContext(shape)


CASES.append(KindCase("mixture-sparse", _mixture_sparse, mixture_ml, mixture_reference, mixture_tables))


# ----------------------------------------------------------------------------------------------- copy


def copy_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) ``sum_i a_i [(1 - k_b - r_b) B[c_i, :] + k_b 1(c_i) + r_b 1(c_{i+1})]`` with the single head's ``a``
    (:func:`single_hop_reference`'s gate), the most recent position having no successor, in plain numpy."""
    from dist_respattn.model.heads.copy import CopyHead

    assert isinstance(head, CopyHead)
    single = head.single
    distance = ((query[:, None, :] - single.key_means[context]) ** 2).sum(axis=2)
    with np.errstate(divide="ignore"):
        log_a = np.log(single.position_prior)[None, :] - distance / (2.0 * single.sigma2)
    a = np.exp(log_a - log_a.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    bucket = head.buckets.bucket_of_position  # (N,) the bucket of each column
    kappa, rho = head.kappa[bucket], head.rho[bucket]
    out = np.einsum("ni,nit->nt", a * (1.0 - kappa - rho), single.emission_table.to_dense()[context])
    n, n_pos = context.shape
    for row in range(n):
        for i in range(n_pos):
            out[row, context[row, i]] += a[row, i] * kappa[i]
            if i + 1 < n_pos:
                out[row, context[row, i + 1]] += a[row, i] * rho[i]
    return out


def copy_tables(head: Head) -> dict[str, np.ndarray]:
    """The single head's tables and, per bucket, the shares (own table, copy, induction)."""
    from dist_respattn.model.heads.copy import CopyHead

    assert isinstance(head, CopyHead)
    shares = np.stack([1.0 - head.kappa - head.rho, head.kappa, head.rho], axis=1)
    return {**single_hop_tables(head.single), "copy_shares": shares}


def copy_ml(spec: HeadSpec) -> HeadSpec:
    """Maximum likelihood: the single head's (:func:`single_hop_ml`); the copy weights have no prior."""
    from dist_respattn.model.heads.copy import CopySpec

    assert isinstance(spec, CopySpec)
    single = single_hop_ml(spec.single)
    assert isinstance(single, SingleHopSpec)
    return CopySpec(single, spec.init_copy)


def copy_data(n: int, shape: tuple[int, int, int, int], seed: int) -> KindData:
    """``n`` rows of a token stream of short phrases, one of them recurring (so tokens and their successors repeat
    within windows), with random float32 queries."""
    rng = np.random.default_rng(seed)
    s, n_pos, d, _ = shape
    phrase = rng.integers(0, s, size=5)
    stream = np.concatenate([phrase if rng.random() < 0.5 else rng.integers(0, s, size=5) for _ in range(n)])
    context = np.lib.stride_tricks.sliding_window_view(stream[:-1], n_pos)[:n]
    query = rng.normal(size=(n, d)).astype(np.float32).astype(np.float64)
    return KindData(np.ascontiguousarray(context, dtype=np.int32), query, stream[n_pos : n_pos + n].astype(np.int32))


def _copy_free_dense() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.copy import CopySpec

    shape = (10, 5, 2, 10)
    single = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense")
    return CopySpec(single), copy_data(600, shape, seed=17), TrainerContext(shape)


CASES.append(KindCase("copy-free-dense", _copy_free_dense, copy_ml, copy_reference, copy_tables))


def _copy_tied_sparse() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.copy import CopySpec

    shape = (12, 6, 2, 12)
    single = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="sparse",
                           position_buckets=3)  # fmt: skip
    return CopySpec(single), copy_data(600, shape, seed=19), TrainerContext(shape)


CASES.append(KindCase("copy-tied-sparse", _copy_tied_sparse, copy_ml, copy_reference, copy_tables))


# ----------------------------------------------------------------------------------------------- conjunctions


def conj_pair_rows(head: Head) -> np.ndarray:
    """(P, T) the pair rows ``(n[p, :] - d + (s_p + sum d) B[a, :]) / (n_p + s_p)``, ``d = min(n[p, :], D)``, in
    plain numpy (``B``'s row alone for an
    infinite strength or an empty pair)."""
    from dist_respattn.model.heads.conj import ConjHead

    assert isinstance(head, ConjHead)
    emission = head.single.emission_table.to_dense()
    rows = np.empty((head.num_pairs, head.num_targets))
    for p in range(head.num_pairs):
        a = int(head.pair_keys[p]) // head.num_symbols
        if head.backoff == "current":  # the row leans toward the current token's
            a = int(head.pair_keys[p]) % head.num_symbols
        n = np.zeros(head.num_targets)
        n[head.targets[head.indptr[p] : head.indptr[p + 1]]] = head.counts[head.indptr[p] : head.indptr[p + 1]]
        s = head.strength + head.type_strength * (head.indptr[p + 1] - head.indptr[p])
        taken = np.minimum(n, head.discount)  # the absolute discount's mass, moved to the prior row
        if np.isinf(head.strength) or n.sum() + s <= 0.0:
            rows[p] = emission[a]
        else:
            rows[p] = (n - taken + (s + taken.sum()) * emission[a]) / (n.sum() + s)
    return rows


def conj_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) ``sum_i a_i E_i`` with the single head's gate ``a`` and ``E_i`` the pair row of ``(c_i, c_N)`` within
    the depth when stored (:func:`conj_pair_rows`), else ``B[c_i]``, in plain numpy."""
    from dist_respattn.model.heads.conj import ConjHead

    assert isinstance(head, ConjHead)
    single = head.single
    distance = ((query[:, None, :] - single.key_means[context]) ** 2).sum(axis=2)
    with np.errstate(divide="ignore"):
        log_a = np.log(single.position_prior)[None, :] - distance / (2.0 * single.sigma2)
    a = np.exp(log_a - log_a.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    emission = single.emission_table.to_dense()
    pair_rows = conj_pair_rows(head)
    index = {int(key): p for p, key in enumerate(head.pair_keys)}
    n, n_pos = context.shape
    out = np.zeros((n, head.num_targets))
    for row in range(n):
        q = int(context[row, -1])
        for i in range(n_pos):
            c = int(context[row, i])
            p = index.get(c * head.num_symbols + q) if n_pos - 1 - i < head.depth else None
            out[row] += a[row, i] * (emission[c] if p is None else pair_rows[p])
    return out


def conj_tables(head: Head) -> dict[str, np.ndarray]:
    """The single head's tables and the pair rows."""
    from dist_respattn.model.heads.conj import ConjHead

    assert isinstance(head, ConjHead)
    return {**single_hop_tables(head.single), "pair_rows": conj_pair_rows(head)}


def conj_ml(spec: HeadSpec, n_pos: int) -> HeadSpec:
    """Maximum likelihood: the single head's (:func:`single_hop_ml`), pair rows without a prior, at every one of the
    ``n_pos`` positions (so ``B``, fitted on every position's responsibility, is the prior of no row the likelihood
    reads), their counts EM's (rows counted from the data leave each training row out, and without a prior a target
    a pair held once has no probability left)."""
    from dist_respattn.model.heads.conj import ConjSpec

    assert isinstance(spec, ConjSpec)
    single = single_hop_ml(spec.single)
    assert isinstance(single, SingleHopSpec)
    return ConjSpec(single, depth=n_pos, min_count=1.0, strength=0.0, type_strength=0.0, backoff=spec.backoff,
                    discount=0.0, row_counts="responsibilities")  # fmt: skip


def _conj_free_dense() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.conj import ConjSpec

    shape = (8, 4, 2, 8)
    single = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense")
    spec = ConjSpec(single, depth=2, strength=1.0, type_strength=0.5, discount=0.5)
    return spec, copy_data(600, shape, 23), TrainerContext(shape)


def conj_scoring(spec: HeadSpec) -> HeadSpec:
    """The same fit with EM's row counts, whose E-step reads every row as scoring does (no row left out)."""
    from dist_respattn.model.heads.conj import ConjSpec

    assert isinstance(spec, ConjSpec)
    return replace(spec, row_counts="responsibilities")


CASES.append(
    KindCase(
        "conj-free-dense",
        _conj_free_dense,
        partial(conj_ml, n_pos=4),
        conj_reference,
        conj_tables,
        scoring_spec=conj_scoring,
    )
)


def _conj_tied_sparse() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.conj import ConjSpec

    shape = (10, 6, 2, 10)
    single = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="sparse",
                           position_buckets=3)  # fmt: skip
    spec = ConjSpec(single, depth=3, min_count=2.0, strength=2.0, type_strength=0.0, backoff="current", discount=0.0)
    return spec, copy_data(600, shape, 29), TrainerContext(shape)


CASES.append(
    KindCase(
        "conj-tied-sparse",
        _conj_tied_sparse,
        partial(conj_ml, n_pos=6),
        conj_reference,
        conj_tables,
        scoring_spec=conj_scoring,
    )
)
# ----------------------------------------------------------------------------------------------- chain of hops


def hops_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) ``sum_j a_j B[c_j, :]`` with ``a`` the last hop's marginal: hop 1 the single head's joint gate, each
    later hop ``pi^h_j N(Q[c_i]; K^h[c_j], sigma2)`` (normalized over j for a softmax chain), in plain numpy."""
    from dist_respattn.model.heads.hops import HopsHead

    assert isinstance(head, HopsHead)
    single, sigma2 = head.single, head.single.sigma2
    distance = ((query[:, None, :] - single.key_means[context]) ** 2).sum(axis=2)
    with np.errstate(divide="ignore"):
        log_a = np.log(single.position_prior)[None, :] - distance / (2.0 * sigma2)
    alpha = np.exp(log_a - log_a.max(axis=1, keepdims=True))  # (n, N), up to a factor per row
    for keys, prior in zip(head.keys, head.priors, strict=True):
        q = head.hop_queries[context]  # (n, N, D): the query each position asks
        d2 = ((q[:, :, None, :] - keys[context][:, None, :, :]) ** 2).sum(axis=3)  # (n, i, j)
        trans = prior[None, None, :] * np.exp(-d2 / (2.0 * sigma2))
        if head.softmax:
            trans /= trans.sum(axis=2, keepdims=True)
        alpha = np.einsum("ni,nij->nj", alpha, trans)
        alpha /= alpha.max(axis=1, keepdims=True)
    a = alpha / alpha.sum(axis=1, keepdims=True)
    return np.einsum("ni,nit->nt", a, single.emission_table.to_dense()[context])


def hops_tables(head: Head) -> dict[str, np.ndarray]:
    """The single head's tables and the later hops' position priors."""
    from dist_respattn.model.heads.hops import HopsHead

    assert isinstance(head, HopsHead)
    return {**single_hop_tables(head.single), "hop_priors": head.priors}


def hops_ml(spec: HeadSpec) -> HeadSpec:
    """Maximum likelihood: the single head's (:func:`single_hop_ml`); the later hops have no prior."""
    from dist_respattn.model.heads.hops import HopsSpec

    assert isinstance(spec, HopsSpec)
    single = single_hop_ml(spec.single)
    assert isinstance(single, SingleHopSpec)
    return HopsSpec(single, spec.hops, spec.softmax)


def _hops_free_dense() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.hops import HopsSpec

    shape = (10, 5, 2, 10)
    single = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense")
    return HopsSpec(single, hops=2), copy_data(600, shape, seed=23), TrainerContext(shape)


CASES.append(KindCase("hops-free-dense", _hops_free_dense, hops_ml, hops_reference, hops_tables))


def _hops_tied_sparse() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.hops import HopsSpec

    shape = (12, 6, 2, 12)
    single = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="sparse",
                           position_buckets=3)  # fmt: skip
    return HopsSpec(single, hops=3), copy_data(600, shape, seed=29), TrainerContext(shape)


CASES.append(KindCase("hops-tied-sparse", _hops_tied_sparse, hops_ml, hops_reference, hops_tables))


# ----------------------------------------------------------------------------------------------- a stack of heads


def _log_query_density(head: Head, context: np.ndarray, query: np.ndarray) -> np.ndarray:
    """(n,) ``log sum_i pi_i N(y; K[c_i], sigma2 I)`` of a single-hop gate (a copy or conjunction head's own), in plain
    numpy."""
    single: Any = getattr(head, "single", head)
    distance = ((query[:, None, :] - single.key_means[context]) ** 2).sum(axis=2)
    with np.errstate(divide="ignore"):
        part = np.log(single.position_prior)[None, :] - distance / (2.0 * single.sigma2)
    best = part.max(axis=1, keepdims=True)
    d = query.shape[1]
    return (best + np.log(np.exp(part - best).sum(axis=1, keepdims=True)))[:, 0] - 0.5 * d * np.log(
        2.0 * np.pi * single.sigma2
    )


def stack_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) ``sum_k w_k p_k(t | c_k, q)``, each component reading its last ``N_k`` columns through its own case's
    reference, ``w_k ∝ pi_k p_k(q | c_k)`` (joint gate) or ``pi_k`` (target gate), in plain numpy."""
    from dist_respattn.model.heads.conj import ConjHead
    from dist_respattn.model.heads.copy import CopyHead
    from dist_respattn.model.heads.stack import StackHead

    assert isinstance(head, StackHead)
    parts, log_q = [], []
    for component in head.components:
        ctx = context[:, context.shape[1] - component.context_length :]
        reference = (
            copy_reference if isinstance(component, CopyHead)
            else conj_reference if isinstance(component, ConjHead)
            else single_hop_reference
        )  # fmt: skip
        parts.append(reference(component, ctx, query))
        log_q.append(_log_query_density(component, ctx, query))
    if head.mode == "joint":
        part = np.log(head.gate)[None, :] + np.stack(log_q, axis=1)
        w = np.exp(part - part.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
    else:
        w = np.broadcast_to(head.gate, (context.shape[0], len(parts)))
    return np.einsum("nk,knt->nt", w, np.stack(parts))


def stack_tables(head: Head) -> dict[str, np.ndarray]:
    """The gate."""
    from dist_respattn.model.heads.stack import StackHead

    assert isinstance(head, StackHead)
    return {"gate": head.gate[None, :]}


def stack_components(data: KindData, shape: tuple[int, int, int, int]) -> tuple[Head, ...]:
    """Three small heads fitted on ``data``'s last columns: a conjunction head of N = 2, a copy head of N = 4 and a
    single head of the whole window."""
    from dist_respattn.model.fitting.em import fit_em
    from dist_respattn.model.heads.conj import ConjSpec
    from dist_respattn.model.heads.copy import CopySpec

    s, n_pos, d, t = shape
    single = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout="dense")
    specs = ((ConjSpec(single, depth=2, strength=1.0, type_strength=0.5, discount=0.5), 2), (CopySpec(single), 4),
             (single, n_pos))  # fmt: skip
    heads = []
    for spec, n in specs:
        rows = (np.ascontiguousarray(data.context[:, n_pos - n :]), data.query, data.target)
        heads.append(fit_em(rows, spec, shape=(s, n, d, t), max_iter=3, tol=0.0).distribution)
    return tuple(heads)


def _stack_joint() -> tuple[HeadSpec, KindData, TrainerContext]:
    import atexit
    import shutil
    import tempfile

    from dist_respattn.artifacts.checkpoints import ModelDir
    from dist_respattn.model.heads.stack import StackSpec

    shape = (10, 5, 2, 10)
    data = copy_data(600, shape, seed=31)
    components = stack_components(data, shape)
    # The engine's fit loads the components from model directories, as --stack-from names them.
    root = tempfile.mkdtemp(prefix="stack-case-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    paths = []
    for k, head in enumerate(components):
        folder = ModelDir(f"{root}/component-{k}")
        folder.commit("ckpt-000000-case", head, {"iteration": 0}, latest={"iteration": 0}, best=None, keep_best=None)
        paths.append(str(folder.path))
    spec = StackSpec(tuple(paths), "joint", components)
    return spec, data, TrainerContext(shape)


CASES.append(KindCase("stack-joint", _stack_joint, lambda spec: spec, stack_reference, stack_tables))


# ----------------------------------------------------------------------------------------------- codebook


def codebook_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) the near positions' single-head terms and the far positions' codeword terms, one term per (far
    position, codebook), weighed by ``pi_far omega_b / n_far``, in plain numpy (full windows)."""
    from dist_respattn.model.heads.codebook import CodebookHead

    assert isinstance(head, CodebookHead)
    n, n_pos = context.shape
    n0 = head.near_window
    near = context[:, n_pos - n0 :][:, ::-1]  # (n, N0) by recency
    far = context[:, : n_pos - n0]  # (n, N - N0)
    two_s2 = 2.0 * head.sigma2
    near_log = np.log(head.prior[:n0])[None, :] - ((query[:, None, :] - head.key_means[near]) ** 2).sum(2) / two_s2
    books = np.arange(head.num_codebooks)
    cells = head.codes[far][:, :, books]  # (n, N - N0, B) each far position's codeword per codebook
    means = head.code_means[books[None, None, :], cells]  # (n, N - N0, B, D)
    far_log = (
        np.log(head.prior[-1] * head.omega / far.shape[1])[None, None, :]
        - ((query[:, None, None, :] - means) ** 2).sum(3) / two_s2
    )
    logs = np.concatenate([near_log, far_log.reshape(n, -1)], axis=1)
    a = np.exp(logs - logs.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    rows = np.concatenate(
        [head.emission[near], head.code_emission[books[None, None, :], cells].reshape(n, -1, head.num_targets)], axis=1
    )
    return np.einsum("nk,nkt->nt", a, rows)


def codebook_tables(head: Head) -> dict[str, np.ndarray]:
    """The near table, the codeword tables, the prior (near recencies and the far field) and the codebook weights."""
    from dist_respattn.model.heads.codebook import CodebookHead

    assert isinstance(head, CodebookHead)
    return {
        "emission": head.emission,
        "code_emission": head.code_emission.reshape(-1, head.num_targets),
        "prior": head.prior[None, :],
        "omega": head.omega[None, :],
    }


def codebook_ml(spec: HeadSpec) -> HeadSpec:
    """Maximum likelihood: no pseudo-counts on either table."""
    import dataclasses

    from dist_respattn.model.heads.codebook import CodebookSpec

    assert isinstance(spec, CodebookSpec)
    return dataclasses.replace(spec, emission_strength=0.0, code_strength=0.0)


def short_single_source(
    data: KindData, shape: tuple[int, int, int, int], prefix: str, layout: str = "dense"
) -> tuple[Head, str]:
    """A single head of N = 3 (its emission ``layout``) fitted on ``data``'s last columns, and the model directory it
    is written to (the engine's fit loads a source from there, as ``--codebook-from`` or ``--repeat-from`` names
    it)."""
    import atexit
    import shutil
    import tempfile

    from dist_respattn.artifacts.checkpoints import ModelDir
    from dist_respattn.model.fitting.em import fit_em

    s, n_pos, d, t = shape
    single_spec = SingleHopSpec(sigma2=0.7, emission_strength=0.5, type_strength=0.5, emission_layout=layout)
    rows = (np.ascontiguousarray(data.context[:, n_pos - 3 :]), data.query, data.target)
    single = fit_em(rows, single_spec, shape=(s, 3, d, t), max_iter=3, tol=0.0).distribution
    root = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    folder = ModelDir(f"{root}/single")
    folder.commit("ckpt-000000-case", single, {"iteration": 0}, latest={"iteration": 0}, best=None, keep_best=None)
    return single, str(folder.path)


def _codebook() -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.codebook import CodebookSpec

    shape = (10, 8, 2, 10)
    data = copy_data(600, shape, seed=37)
    single, path = short_single_source(data, shape, "codebook-case-")
    spec = CodebookSpec(path, near_window=3, codebooks=2, codewords=3, emission_strength=1.0,
                        code_strength=1.0, start=single)  # fmt: skip
    return spec, data, TrainerContext(shape)


CASES.append(KindCase("codebook", _codebook, codebook_ml, codebook_reference, codebook_tables))


# ----------------------------------------------------------------------------------------------- a repeat gate


def repeat_reference(head: Head, context: np.ndarray, query: np.ndarray, attribute: Any = None) -> np.ndarray:
    """(n, T) the wrapped single head's distribution (over its last ``N_w`` columns) gated by each row's whole window,
    in plain numpy: ``r p / p(H)`` on the window's distinct tokens, ``(1 - r) p / (1 - p(H))`` off them, mixed with
    ``p`` itself (``m p + (1 - m) gate(p)``)."""
    from dist_respattn.model.heads.repeat import RepeatHead

    assert isinstance(head, RepeatHead)
    n, n_pos = context.shape
    probs = single_hop_reference(head.base, context[:, n_pos - head.base.context_length :], query)
    out = probs.copy()
    t = head.num_targets
    for i in range(n):
        seen = np.zeros(t, dtype=bool)
        seen[np.unique(context[i])] = True
        distinct = int(seen.sum())
        if distinct in (0, t):
            continue
        r = head.rates[min(int(np.floor(np.log2(n_pos))), head.rates.shape[0] - 1)]
        p_seen, p_new = probs[i, seen].sum(), probs[i, ~seen].sum()
        out[i, seen] = r * probs[i, seen] / p_seen if p_seen > 0 else r / distinct
        out[i, ~seen] = (1.0 - r) * probs[i, ~seen] / p_new if p_new > 0 else (1.0 - r) / (t - distinct)
        out[i] = head.mix * probs[i] + (1.0 - head.mix) * out[i]
    return out


def repeat_tables(head: Head) -> dict[str, np.ndarray]:
    """Each bucket's repeat / new split, and the mix of the wrapped head and the gate."""
    from dist_respattn.model.heads.repeat import RepeatHead

    assert isinstance(head, RepeatHead)
    return {"rates": np.stack([head.rates, 1.0 - head.rates], axis=1), "mix": np.array([[head.mix, 1.0 - head.mix]])}


def repeat_ml(spec: HeadSpec) -> HeadSpec:
    """Maximum likelihood: no pseudo-rows in the rates."""
    import dataclasses

    from dist_respattn.model.heads.repeat import RepeatSpec

    assert isinstance(spec, RepeatSpec)
    return dataclasses.replace(spec, prior=0.0)


def _repeat(layout: str = "dense") -> tuple[HeadSpec, KindData, TrainerContext]:
    from dist_respattn.model.heads.repeat import RepeatHead, RepeatSpec
    from dist_respattn.model.heads.repeat.head import history_buckets

    shape = (12, 8, 2, 12)
    data = copy_data(600, shape, seed=41)
    n_pos = shape[1]
    single, path = short_single_source(data, shape, "repeat-case-", layout)
    # Started from even rates (a fit of its own starts from the rates counted on its rows, where EM ends); a fixed
    # share of the wrapped head (chosen on held-out rows otherwise), so the fit chooses nothing.
    start = RepeatHead(single, np.full(history_buckets(n_pos), 0.5), context_length=n_pos, mix=0.25)
    return RepeatSpec(path, prior=1.0, mix=0.25, base=single), data, TrainerContext(shape, init=start)


def _repeat_sparse() -> tuple[HeadSpec, KindData, TrainerContext]:
    """The gate over a sparse head: its passes read the head's masses on the histories, not its (T,) rows."""
    return _repeat("sparse")


CASES.append(KindCase("repeat", _repeat, repeat_ml, repeat_reference, repeat_tables))
CASES.append(KindCase("repeat-sparse", _repeat_sparse, repeat_ml, repeat_reference, repeat_tables))
