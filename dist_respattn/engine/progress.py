"""Reporting a fit as it runs: a bar per pass on a terminal, one line per iteration, one cluster event each.

The same per-iteration record goes to the log line and to ``Client.log_event`` under the topic
``dist_respattn.fit``, so anyone attached to the scheduler sees the fit's progress. A fit's events,
each with its ``run_id`` and an ``event`` field:

- ``start``: ``store``, ``validation``, ``heldout_rows`` (what the held-out rows are; ``None``: the fit has
  none), ``rows``, ``max_iter``, ``model_dir``, ``client`` (the driver's client id), ``first_iteration``;
- ``iteration``: the iteration's history record (``iteration``, ``mean_log_likelihood``, ``change``,
  ``seconds``, ``rows_per_second``, ``heldout``, ``state``, ``warnings``, ...);
- ``end``: the final ``state`` (``converged``, ``max_iter``, ``early_stopped`` or ``failed``) and, for a
  failure, ``error``.

:mod:`dist_respattn.monitor` folds them into the scheduler's fit page and metrics.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from typing import Any

import distributed

__all__ = ["EVENT_TOPIC", "FitReporter", "format_iteration"]

logger = logging.getLogger("dist_respattn.fit")

#: The topic of the per-iteration events on the scheduler.
EVENT_TOPIC = "dist_respattn.fit"


def format_iteration(record: dict[str, Any]) -> str:
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

    def started(self, run_id: str, **fields: Any) -> None:
        """Announce a fit to the scheduler (``fields``: see the module docstring)."""
        self.event({"event": "start", "run_id": run_id, "client": self.client.id, **fields})

    def iteration(self, record: dict[str, Any]) -> None:
        """Print the iteration's line and publish its record as a cluster event."""
        self.say(format_iteration(record))
        self.event({"event": "iteration", **record})

    def ended(self, run_id: str, state: str, error: str | None = None) -> None:
        """Tell the scheduler how the fit ended."""
        self.event({"event": "end", "run_id": run_id, "state": state, "error": error})

    def event(self, record: dict[str, Any]) -> None:
        try:
            self.client.log_event(EVENT_TOPIC, record)
        except Exception as exc:  # a monitoring hiccup must never fail a fit
            logger.debug("could not publish the fit event: %s", exc)
