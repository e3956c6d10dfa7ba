"""The iteration lines of a fit, as functions of their records: which model the mark names, and by what."""

from __future__ import annotations

from typing import Any

from dist_respattn.engine.gated_fit import gated_iteration_line

from dist_respattn.engine.progress import format_iteration


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


def test_a_gated_line_names_no_iteration_it_does_not_know():
    """A checkpoint written before the best iteration was recorded gives ``best_iteration=None``: no ``None``."""
    entry = {"iteration": 4, "heldout_perplexity": 19.25, "prior_scale": 0.5, "seconds": 1.0, "rows_per_second": 10.0}
    unknown = gated_iteration_line(entry, best=False, best_iteration=None, chosen=True)
    assert "None" not in unknown
    assert unknown.startswith("gated iteration 4: held-out perplexity 19.250, prior scale 0.5, ")
    known = gated_iteration_line(entry, best=False, best_iteration=2, chosen=True)
    assert "held-out perplexity 19.250 (best so far: iteration 2), " in known
    assert "held-out perplexity 19.250 (best so far), " in gated_iteration_line(
        entry, best=True, best_iteration=4, chosen=True
    )
