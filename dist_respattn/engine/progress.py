"""Reporting a fit as it runs: a bar per pass on a terminal, one line per iteration, one cluster event each.

The same per-iteration record (:class:`~dist_respattn.events.IterationRecord`) goes to the log line and
to ``Client.log_event`` under the topic ``dist_respattn.fit``, so anyone attached to the scheduler sees
the fit's progress. The events are defined in :mod:`dist_respattn.events`; :mod:`dist_respattn.monitor`
folds them into the scheduler's fit page and metrics.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

import distributed

from dist_respattn.events import EVENT_TOPIC, FitState, IterationRecord, end_event, iteration_event, start_event

__all__ = ["EVENT_TOPIC", "FitReporter", "format_iteration"]

logger = logging.getLogger("dist_respattn.fit")


def format_iteration(
    record: IterationRecord,
    *,
    best: bool | None = None,
    best_iteration: int | None = None,
    metric: str | None = None,
    verbose: bool = False,
    said: Collection[str] = (),
) -> str:
    """One line for an iteration record, led by what a person judges a fit by: the held-out perplexity.

    E.g. ``iteration 3: held-out perplexity 23.600 (best so far), sigma2 7.93, emission prior strength 0.1 + 1 per
    successor type, 0.09 s, 463,626 rows/s``. ``best``: whether this iteration's model is the best so far (the one
    the ``best`` checkpoint now holds); when it is not, ``best_iteration`` names the one that is. ``metric``: what
    "best" is judged by (``--early-stop-metric``); named in the mark when it is not the perplexity the line leads
    with, e.g. ``(best so far by loglik)``. Without held-out
    rows the line gives the relative change of the training log-likelihood instead (what ``--tol`` compares).

    ``verbose`` adds the mean joint log-likelihoods per row (of the query and the target: a density, which
    falls when a larger sigma2 is chosen even as the perplexity improves), training and held-out.

    Each of the record's warnings follows on a line of its own, but those in ``said`` (the previous line's: a fit
    whose few unused symbols stay unused would repeat the same warning every iteration).
    """
    change = record["change"]
    first = change is None or math.isinf(change)
    heldout = record.get("heldout")
    parts = [f"iteration {record['iteration']}:"]
    if heldout:
        text = f"held-out perplexity {heldout['perplexity']:.3f}"
        if heldout.get("accuracy") is not None:
            text += f", accuracy {heldout['accuracy']:.2%}"
        by = "" if metric in (None, "perplexity") else f" by {metric}"
        if best:
            text += f" (best so far{by})"
        elif best is not None and best_iteration is not None:
            text += f" (best so far{by}: iteration {best_iteration})"
        parts.append(text + ",")
    elif not first:
        parts.append(f"training log-likelihood change {change:.3g},")
    described, chosen = record.get("choice"), record.get("hyperparameters")
    if described:
        parts.append(f"{described},")
    elif chosen and "emission_strength" in chosen:  # a record older than choices said in words
        parts.append(
            f"sigma2 {chosen['sigma2']:.3g}, emission prior strength {chosen['emission_strength']:.3g} "
            f"+ {chosen['type_strength']:.3g} per successor type,"
        )
    elif record.get("sigma2") is not None:
        parts.append(f"sigma2 {record['sigma2']:.3g},")
    parts.append(f"{record['seconds']:.2f} s, {record['rows_per_second']:,.0f} rows/s")
    line = " ".join(parts)
    if verbose:
        change_text = "first" if first else f"change {change:.3g}"
        line += f"; joint log-likelihood per row: training {record['mean_log_likelihood']:.6f} ({change_text})"
        if heldout:
            line += f", held-out {heldout['mean_log_likelihood']:.4f}"
    for warning in record.get("warnings", []):
        if warning not in said:
            line += f"\n  warning: {warning}"
    return line


class FitReporter:
    """Where a fit's progress goes.

    Args:
        client: the cluster's client (for ``log_event``).
        say: receives each line (default: the ``dist_respattn.fit`` logger at INFO).
        bar: show a progress bar per pass; ``None``: only when stderr is a terminal.
    """

    def __init__(
        self, client: distributed.Client, *, say: Callable[[str], Any] | None = None, bar: bool | None = None
    ) -> None:
        self.client = client
        self.say = say if say is not None else logger.info
        self.bar = sys.stderr.isatty() if bar is None else bar
        self.warned: tuple[str, ...] = ()  # the last iteration line's warnings (the next says only new ones)

    def make_bar(self, total: int, description: str) -> Any:
        if not self.bar:
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=description, unit="partition", leave=False, file=sys.stderr)

    def line(self, text: str) -> None:
        self.say(text)

    def started(
        self,
        run_id: str,
        *,
        store: str,
        validation: str | None,
        heldout_rows: str | None,
        rows: int,
        max_iter: int,
        model_dir: str,
        first_iteration: int,
    ) -> None:
        """Announce a fit to the scheduler (see :class:`~dist_respattn.events.StartEvent`)."""
        self.event(
            start_event(
                run_id, client=self.client.id, store=store, validation=validation, heldout_rows=heldout_rows,
                rows=rows, max_iter=max_iter, model_dir=model_dir, first_iteration=first_iteration,
            )
        )  # fmt: skip

    def iteration(
        self,
        record: IterationRecord,
        *,
        best: bool | None = None,
        best_iteration: int | None = None,
        metric: str | None = None,
        verbose: bool = False,
    ) -> None:
        """Print the iteration's line and publish its record as a cluster event (``best``, ``best_iteration``,
        ``metric``, ``verbose``: see :func:`format_iteration`; the event carries the record alone, every warning
        in it). The line leaves out the warnings the previous one gave."""
        self.say(
            format_iteration(
                record, best=best, best_iteration=best_iteration, metric=metric, verbose=verbose, said=self.warned
            )
        )
        self.warned = tuple(record.get("warnings", []))
        self.event(iteration_event(record))

    def ended(self, run_id: str, state: FitState, error: str | None = None) -> None:
        """Tell the scheduler how the fit ended."""
        self.event(end_event(run_id, state, error))

    def event(self, record: Mapping[str, Any]) -> None:
        try:
            self.client.log_event(EVENT_TOPIC, record)
        except Exception as exc:  # a monitoring hiccup must never fail a fit
            logger.debug("could not publish the fit event: %s", exc)
