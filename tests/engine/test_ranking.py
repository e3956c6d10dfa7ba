"""``split --hold-out last`` then ``evaluate --ranking``, as a user runs them: the ranking the cluster returns equals
the one computed here from the model and the stores; bad ranking flags refused before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dist_respattn import random_distribution
from dist_respattn.artifacts import load_checkpoint
from dist_respattn.baselines.ngram import fit_baselines
from dist_respattn.baselines.ranking import ItemKNN, RankingBaselines, cooccurrence_of_blocks
from dist_respattn.cli import build_parser
from dist_respattn.cli.common import CommandError
from dist_respattn.cli.fit_commands import ranking_settings
from dist_respattn.engine.evaluate import check_rankable, ranking_lines
from dist_respattn.engine.worker_tasks import rank_task
from dist_respattn.model.buckets import PositionBuckets
from dist_respattn.model.emission.pairs import PairCounts
from dist_respattn.model.heads.base import Block, combine
from dist_respattn.model.heads.single_hop.distribution import ResponsibilityAttentionDistribution
from dist_respattn.model.ranking import RankingSettings, rank_rows
from dist_respattn.model.rows import WindowRows
from dist_respattn.store import open_store, write_arrays
from dist_respattn.store.streams.writer import write_stream
from tests.engine.clusters import local_cluster
from tests.test_cli import run


def parsed(*flags: str):
    return build_parser().parse_args(["evaluate", "model", "test.zarr", *flags])


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--ranking", "0"], "--ranking"), (["--ranking", "10", "--ranking-negatives", "0"], "--ranking-negatives")],
)
def test_a_bad_k_or_count_of_negatives_is_a_usage_error_naming_the_flag(flags, named, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        parsed(*flags)
    assert exit_.value.code == 2
    assert f"argument {named}: " in capsys.readouterr().err


def test_ranking_flags_without_ranking_are_refused_and_the_defaults_are_stated() -> None:
    with pytest.raises(CommandError, match="--ranking-negatives, --ranking-exclude-history: goes with --ranking K"):
        ranking_settings(parsed("--ranking-negatives", "5", "--ranking-exclude-history"))
    assert ranking_settings(parsed()) is None
    assert ranking_settings(parsed("--ranking", "10")) == RankingSettings(k=10, negatives=100, seed=0)


def test_a_triple_store_is_refused_before_any_cluster_starts(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "rows.zarr"
    write_arrays(path, rng.integers(0, 5, size=(6, 2)), rng.normal(size=(6, 3)), rng.integers(0, 4, size=6),
                 num_symbols=5, num_targets=4)  # fmt: skip
    head = random_distribution(5, 2, 3, 4, seed=0)
    with pytest.raises(ValueError, match="--ranking ranks the last row of each document of a token-stream store"):
        check_rankable(head, open_store(path))


def test_ranking_tasks_over_many_partitions_add_up_to_the_ranking_of_every_last_row(tmp_path: Path) -> None:
    """``rank_task`` on each partition of a store whose documents cross token chunks and shards (called here, as a
    worker runs it): the sums equal one ranking of every document's last row, under a tied head (token windows,
    short histories) and the three baselines; the exclusion of history items changes only the full protocol."""
    rng = np.random.default_rng(1)
    documents = [rng.integers(0, 9, size=n) for n in (1, 2, 5, 17, 3, 30, 8, 2, 12)]
    store = write_stream(
        tmp_path / "s.zarr", [(d, None) for d in documents], num_symbols=9, table=rng.normal(size=(9, 3)),
        context_length=4, chunk_tokens=8, partition_tokens=16,
    ).with_context(4, 1)  # fmt: skip
    assert store.num_partitions > 3
    base, buckets = random_distribution(9, 4, 3, 9, seed=2), PositionBuckets.geometric(4, 3)
    prior = buckets.spread(np.array([0.6, 0.3, 0.1]))
    head = ResponsibilityAttentionDistribution(base.key_means, base.emission, prior, 1.0, buckets=buckets)
    blocks = [Block(w, None) for p in range(store.num_partitions) for w in store.iter_windows(p)]
    counts = cooccurrence_of_blocks(9, 9, blocks)
    pairs = PairCounts.from_rows(np.array([0, 1, 2]), np.array([1, 2, 0]), None, num_symbols=9, num_targets=9)
    rankers = RankingBaselines(np.arange(9.0), fit_baselines(pairs), ItemKNN.of(counts))
    for exclude in (False, True):
        settings = RankingSettings(k=3, negatives=4, seed=5, exclude_history=exclude)
        parts = [
            rank_task(store.location, p, head, rankers, settings, store.fingerprint())
            for p in range(store.num_partitions)
        ]
        total = combine(parts)
        # Here: every document of at least 2 tokens (min_context 1) ranks its last token after the rest.
        kept = [(i, d) for i, d in enumerate(documents) if d.size >= 2]
        histories = [d[:-1].astype(np.int64) for _, d in kept]
        target = np.array([d[-1] for _, d in kept])
        tokens = np.concatenate([h for h in histories] + [target])
        begin = np.cumsum([0, *(h.size for h in histories[:-1])])
        end = begin + np.array([h.size for h in histories])
        windows = WindowRows(
            tokens, np.maximum(begin, end - 4), end, target, store.embeddings(), tokens[end - 1], None, 0
        )
        scores = {"model": head.block_proba(Block(windows, None)), **rankers.scores([h[-4:] for h in histories])}
        expected = rank_rows(scores, target, histories, np.array([i for i, _ in kept]), settings)
        assert total.totals.keys() == expected.totals.keys()
        for name, by in expected.totals.items():
            for protocol, totals in by.items():
                got = total.totals[name][protocol]
                assert (got.rows, got.hits, got.candidates) == (totals.rows, totals.hits, totals.candidates)
                assert got.ndcg == pytest.approx(totals.ndcg, rel=1e-12) and got.mrr == pytest.approx(
                    totals.mrr, rel=1e-12
                )


@pytest.mark.slow
def test_leave_one_out_then_evaluate_ranking_equals_the_ranking_computed_here(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    # Users whose next item tends to follow the previous one, and a few too short to keep (1 and 2 items).
    lengths = [1, 2, *rng.integers(3, 30, size=60).tolist()]
    documents = [np.cumsum(rng.integers(1, 3, size=n)) % 25 for n in lengths]
    np.save(tmp_path / "tokens.npy", np.concatenate(documents).astype(np.int64))
    np.save(tmp_path / "starts.npy", np.cumsum([0, *lengths[:-1]]))
    made = run("split", "--tokens", str(tmp_path / "tokens.npy"), "--documents", str(tmp_path / "starts.npy"),
               "--context", "2", "--dim", "4", "--hold-out", "last", "--json", str(tmp_path / "split"))  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["skipped_documents"] == 2
    stores = tmp_path / "split"
    # Both commands join one cluster: one started for each would add its start-up twice and check nothing more.
    with local_cluster(1) as (_, client):
        address = client.scheduler.address
        fitted = run("fit", str(stores / "train.zarr"), "--model-dir", str(tmp_path / "model"), "--validation",
                     str(stores / "validation.zarr"), "--head", "single", "--max-iter", "1", "--scheduler", address,
                     "--json")  # fmt: skip
        assert fitted.returncode == 0, fitted.stderr
        evaluated = run("evaluate", str(tmp_path / "model"), str(stores / "test.zarr"), "--ranking", "5",
                        "--ranking-negatives", "7", "--ranking-seed", "3", "--baseline-order", "2", "--scheduler",
                        address, "--json")  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    ranking = json.loads(evaluated.stdout)["ranking"]

    # Here: the last row of each test document, its history the document's tokens before it.
    head = load_checkpoint(str(tmp_path / "model")).model
    test = open_store(stores / "test.zarr", window=head.context_length)
    last = test.last_rows(0, test.num_rows)
    rows = test.read_selected(0, test.num_rows, last)
    docs = test.read_documents(0, test.num_rows, last)
    starts, ends = test.document_starts(), test.document_ends()
    histories = [test.read_tokens(int(starts[d]), int(ends[d]) - 1).astype(np.int64) for d in docs]
    assert rows.target.tolist() == [int(test.read_tokens(int(ends[d]) - 1, int(ends[d]))[0]) for d in docs]
    train = open_store(stores / "train.zarr", window=head.context_length)
    popularity = np.bincount(train.read_rows(0, train.num_rows).target, minlength=head.num_targets).astype(float)
    scores = {"model": head.block_proba(Block(rows, None)), "most_popular": np.tile(popularity, (len(docs), 1))}
    table = rank_rows(scores, rows.target, histories, docs, RankingSettings(k=5, negatives=7, seed=3)).metrics()
    assert ranking["rows"] == len(docs) == int(np.count_nonzero(np.array(lengths) - 1 >= 2))
    for protocol in ("full", "sampled"):
        assert ranking[protocol] == pytest.approx(table["model"][protocol], rel=1e-12)
        assert ranking["baselines"]["most_popular"][protocol] == pytest.approx(table["most_popular"][protocol])
    assert set(ranking["baselines"]) == {"most_popular", "markov", "item_knn"}
    assert (ranking["k"], ranking["negatives"], ranking["seed"], ranking["exclude_history"]) == (5, 7, 3, False)


def test_the_table_says_how_many_negatives_a_row_had_when_its_document_left_too_few_unseen(
    tmp_path: Path, one_worker_address: str
) -> None:
    """``--ranking-negatives M`` past the targets a document has not seen ranks its row against all it has not seen
    (fewer than M): the table's header then says how many a row had on average (``mean_candidates`` less the target),
    where it said M unseen negatives whatever a row had; with M to be had everywhere it says M alone."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "tokens.npy", rng.integers(0, 200, size=30 * 40).astype(np.int64))
    np.save(tmp_path / "starts.npy", np.arange(0, 30 * 40, 40))
    made = run("split", "--tokens", str(tmp_path / "tokens.npy"), "--documents", str(tmp_path / "starts.npy"),
               "--context", "4", "--dim", "4", "--hold-out", "last", str(tmp_path / "split"))  # fmt: skip
    assert made.returncode == 0, made.stderr
    stores, model, address = tmp_path / "split", str(tmp_path / "model"), one_worker_address
    fitted = run("fit", str(stores / "train.zarr"), "--model-dir", model, "--head", "single", "--max-iter", "1",
                 "--scheduler", address)  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    done = run("evaluate", model, str(stores / "test.zarr"), "--ranking", "5", "--ranking-negatives", "190",
               "--baseline-order", "2", "--scheduler", address, "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    ranking = json.loads(done.stdout)["ranking"]
    had = ranking["sampled"]["mean_candidates"] - 1
    assert had < 190  # 40 tokens of 200 targets leave each document about 164 unseen
    # The text's table is these lines of the same figures (the command prints ranking_lines of its report).
    header = ranking_lines(ranking)[0]
    assert f"sampled: 190 unseen negatives asked, {had:.1f} a row on average (too few unseen), seed 0;" in header
    enough = {**ranking, "negatives": 100, "sampled": {**ranking["sampled"], "mean_candidates": 101.0}}
    assert "sampled: 100 unseen negatives, seed 0;" in ranking_lines(enough)[0]
