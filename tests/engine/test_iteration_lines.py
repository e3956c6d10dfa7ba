"""The iteration lines of a fit, as functions of their records: which model the mark names, and by what."""

from __future__ import annotations

from typing import Any

from dist_respattn.engine.progress import format_iteration
from dist_respattn.model.heads.gated.kind import PriorScale


def _record(iteration: int) -> Any:
    return {
        "iteration": iteration, "mean_log_likelihood": -3.2, "change": 0.01, "seconds": 0.5,
        "rows_per_second": 1000.0, "n_obs": 500.0, "sigma2": 2.0, "hyperparameters": None,
        "heldout": {"perplexity": 23.6, "mean_log_likelihood": -40.0, "accuracy": None}, "state": "running",
        "warnings": [], "run_id": "0123abcd",
    }  # fmt: skip


def test_the_mark_names_the_early_stopping_metric_when_it_is_not_the_perplexity_the_line_leads_with():
    record = _record(3)
    assert "held-out perplexity 23.600 (best so far)," in format_iteration(record, best=True, metric="perplexity")
    assert "(best so far)," in format_iteration(record, best=True)  # no metric given: the perplexity, as before
    assert "held-out perplexity 23.600 (best so far by loglik)," in format_iteration(record, best=True, metric="loglik")
    line = format_iteration(record, best=False, best_iteration=2, metric="loglik")
    assert "(best so far by loglik: iteration 2)," in line
    assert "(best so far: iteration 2)," in format_iteration(record, best=False, best_iteration=2, metric="perplexity")


def _gated_record(iteration: int, scale: PriorScale) -> Any:
    """An iteration record as a gated fit's loop writes it: its choice is the prior scale, and the head adds no
    numbers of its own (no gate variance on the line)."""
    record = dict(_record(iteration), hyperparameters=scale.to_json(), choice=scale.describe())
    del record["sigma2"]
    record["heldout"] = {"perplexity": 19.25, "mean_log_likelihood": -9.5, "target_log_prob": -2.96}
    return record


def test_a_gated_line_is_the_iteration_line_with_its_prior_scale():
    """A gated fit's line reads as any fit's: the held-out perplexity, its mark, then the chosen prior scale; a
    checkpoint written before the best iteration was recorded gives ``best_iteration=None``: no ``None``."""
    record = _gated_record(4, PriorScale(0.25))
    unknown = format_iteration(record, best=False, best_iteration=None)
    assert "None" not in unknown
    assert unknown == "iteration 4: held-out perplexity 19.250, prior scale 0.25, 0.50 s, 1,000 rows/s"
    known = format_iteration(record, best=False, best_iteration=2)
    assert known.startswith("iteration 4: held-out perplexity 19.250 (best so far: iteration 2), prior scale 0.25, ")
    assert "held-out perplexity 19.250 (best so far), prior scale 0.25, " in format_iteration(record, best=True)
    given = format_iteration(_gated_record(1, PriorScale(0.5, given=True)), best=True)
    assert "(best so far), prior scale 0.5 (given), 0.50 s" in given
    assert "sigma2" not in unknown + known + given
