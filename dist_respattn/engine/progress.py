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
from collections.abc import Callable, Mapping
from typing import Any

import distributed

from dist_respattn.events import EVENT_TOPIC, FitState, IterationRecord, end_event, iteration_event, start_event

__all__ = ["EVENT_TOPIC", "FitReporter", "format_iteration"]

logger = logging.getLogger("dist_respattn.fit")


def format_iteration(record: IterationRecord) -> str:
    """One line for an iteration record, e.g. ``iteration 3: log-likelihood -27.6473 (change 1.2e-04), …``."""
    change = record["change"]
    change_text = "first" if change is None or math.isinf(change) else f"change {change:.3g}"
    parts = [
        f"iteration {record['iteration']}: log-likelihood {record['mean_log_likelihood']:.6f} ({change_text})",
        f"{record['seconds']:.2f} s",
        f"{record['rows_per_second']:,.0f} rows/s",
    ]
    heldout = record.get("heldout")
    if heldout:
        text = f"held-out log-likelihood {heldout['mean_log_likelihood']:.4f}, perplexity {heldout['perplexity']:.4g}"
        if heldout.get("accuracy") is not None:
            text += f", accuracy {heldout['accuracy']:.2%}"
        parts.append(text)
    chosen = record.get("hyperparameters")
    if chosen:
        parts.append(
            f"sigma2 {chosen['sigma2']:.3g}, emission prior strength "
            f"{chosen['emission_strength']:.3g} + {chosen['type_strength']:.3g} per successor type"
        )
    line = ", ".join(parts)
    for warning in record.get("warnings", []):
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

    def iteration(self, record: IterationRecord) -> None:
        """Print the iteration's line and publish its record as a cluster event."""
        self.say(format_iteration(record))
        self.event(iteration_event(record))

    def ended(self, run_id: str, state: FitState, error: str | None = None) -> None:
        """Tell the scheduler how the fit ended."""
        self.event(end_event(run_id, state, error))

    def event(self, record: Mapping[str, Any]) -> None:
        try:
            self.client.log_event(EVENT_TOPIC, record)
        except Exception as exc:  # a monitoring hiccup must never fail a fit
            logger.debug("could not publish the fit event: %s", exc)
