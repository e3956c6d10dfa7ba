"""Argument types, errors and the progress bar shared by every subcommand."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dist_respattn.text_format import count_text

__all__ = [
    "CommandError",
    "check_row_order",
    "check_synthetic_size",
    "embedding_table",
    "fit_ended",
    "in_flags",
    "memory_limit",
    "mib",
    "parse_storage_options",
    "positive_float",
    "positive_int",
    "progress_bar",
    "say",
    "seed",
]


class CommandError(Exception):
    """An error the user can act on: printed as one line, exit status 2."""


#: Python arguments that the library's messages name, beside the flags that set them on the command line. A name
#: without an underscore (``tol``, ``seed``) is an ordinary word too, so only the settings' own errors map those.
ARGUMENT_FLAGS = {
    "overwrite=True": "--overwrite",
    "append=True": "--append",
    "resume=True": "--resume",
    "init_from": "--init-from",
    "scheduler=": "--scheduler ",
    "init_from=MODEL_DIR": "--init-from MODEL_DIR",
    "model_dir": "--model-dir",
    "min_sigma2": "--min-sigma2",
    "estimate_sigma2=True": "--learn-sigma2",
    "estimate_sigma2=False": "--fixed-sigma2",
    "holdout_fraction": "--holdout-fraction",
    "emission_strength": "--emission-strength",
    "type_strength": "--type-strength",
    "emission_smoothing": "--emission-smoothing",
    "emission_prior": "--emission-prior",
    "emission_layout": "--emission-layout",
    "pseudo_count": "--pseudo-count",
    "early_stop_metric": "--early-stop-metric",
    "min_improvement": "--min-improvement",
    "max_iter": "--max-iter",
    "fan_in": "--fan-in",
    "m_step_shards": "--m-step-shards",
    "context_length": "--context",
    "min_context": "--min-context",
    "position_buckets": "--position-buckets",
    "chunk_rows": "--chunk-rows",
    "partition_rows": "--partition-rows",
    "num_symbols": "--symbols",
    "num_targets": "--targets",
    "query_dtype": "--query-dtype",
    "row_order": "--row-order",
    "memory_limit": "--memory-limit",
    "attribute_factors": "--attribute-factors",
    "per_attribute": "--per-attribute",
}
# Longest first, so ``estimate_sigma2=True`` is replaced before a shorter name inside it could be. Left alone: a name
# inside a path (``runs/model_dir/``) or quoted (``'num_symbols'``; ``scheduler='x'`` is the argument with its
# value), and a store's own attribute (``attribute chunk_rows = 0``, ``bad schema attribute: num_symbols = 0``),
# which names what is on disk, not a flag.
_ARGUMENT_RE = re.compile(
    r"(?<![\w/.'-])(?<!attribute )(?<!attribute: )("
    + "|".join(re.escape(name) for name in sorted(ARGUMENT_FLAGS, key=len, reverse=True))
    + r")(?![\w=/.])"
)
#: ``overwrite=True (--overwrite)``, ``options=WriteOptions(overwrite=True) (--overwrite)``: a message that already
#: names both says the flag alone.
_BOTH_RE = re.compile(
    r"(?<![\w-])(?:options=WriteOptions\([a-z_0-9]+=(?:True|False)\)|[a-z_0-9]+=(?:True|False)) \((--[a-z0-9-]+)\)"
)


def in_flags(message: str) -> str:
    """A library message in the command line's words: ``pass overwrite=True`` becomes ``pass --overwrite``."""
    message = _BOTH_RE.sub(r"\1", message)
    return _ARGUMENT_RE.sub(lambda match: ARGUMENT_FLAGS[match.group(1)], message)


def _number(kind: Any, text: str, expected: str) -> Any:
    """``kind(text)`` (``int`` or ``float``), refused in the flag's own words: argparse would name the function that
    read it (``invalid positive_int value: 'x'``)."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}") from None


def positive_int(text: str) -> int:
    value = _number(int, text, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a positive integer")
    return value


def seed(text: str) -> int:
    """A ``--seed``: an integer >= 0 (numpy's seeds are; a negative one failed deep inside without naming the flag)."""
    value = _number(int, text, "a seed, an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a seed, an integer >= 0")
    return value


def memory_limit(text: str) -> str:
    """A ``--memory-limit``: ``auto``, a size (``2GiB``, bytes) or a fraction of the machine, checked to be >= 0 (0:
    no limit, as Dask reads it); a negative one was read as a limit of minus so many MiB."""
    if text == "auto":
        return text
    from dask.utils import parse_bytes

    try:
        value = float(text)
    except ValueError:
        try:
            value = float(parse_bytes(text))
        except (ValueError, TypeError):
            raise argparse.ArgumentTypeError(
                f"{text}: expected a size such as 2GiB, a fraction of the machine such as 0.5, or auto"
            ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a positive size such as 2GiB (or auto, or 0: no limit)")
    return text


def positive_float(text: str) -> float:
    value = _number(float, text, "a number > 0")
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"{text}: expected a number > 0")
    return value


def parse_storage_options(pairs: list[str] | None) -> dict[str, Any] | None:
    """``["key=value", ...]`` to a dict; values are JSON when they parse as JSON (``anon=true``), else strings."""
    if not pairs:
        return None
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--storage-option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def check_row_order(args: argparse.Namespace) -> None:
    """Refuse ``--row-order target`` for a token-stream store (``--format stream``, ``ingest``'s and ``split``'s)."""
    if args.format == "stream" and args.row_order != "input":
        raise CommandError(
            f"--row-order {args.row_order}: a token-stream store keeps the tokens in order; "
            "pass --format triples to sort the windows"
        )


#: Copies of the (S, T) float64 emission table that drawing a random head holds at once (the Dirichlet draws, their
#: floor, the table).
_SYNTHETIC_TABLE_COPIES = 3


def check_synthetic_size(symbols: int | None, targets: int | None) -> None:
    """Refuse ``--symbols`` and ``--targets`` whose random head's (S, T) emission table cannot be drawn in this
    machine's free memory (``synth``, ``demo --synthetic``), before anything is written or started."""
    if symbols is None or targets is None:
        return
    import psutil

    table = int(symbols) * int(targets) * 8
    needed = _SYNTHETIC_TABLE_COPIES * table
    available = int(psutil.virtual_memory().available)
    if needed > available:
        raise CommandError(
            f"--symbols {symbols:,} and --targets {targets:,}: the random head's (S, T) emission table is "
            f"{mib(table)} and drawing it needs about {mib(needed)}, more than the {mib(available)} free here: lower "
            "--symbols or --targets"
        )


def mib(n_bytes: int) -> str:
    """``1,234 MiB``: a size as the memory plans print it."""
    return f"{n_bytes / 2**20:,.0f} MiB"


def say(args: argparse.Namespace, message: str) -> None:
    """A progress message on stderr, kept out of ``--json`` output."""
    if not getattr(args, "json", False):
        print(message, file=sys.stderr, flush=True)


@contextmanager
def progress_bar(total: int | None, unit: str, description: str, *, scale: bool = True) -> Iterator[Any]:
    """A tqdm bar on stderr when it is a terminal; silent otherwise (logs and pipes stay clean).

    ``scale``: counts shown with SI prefixes (``1.2M rows``); off for counts of a few things (files, partitions),
    which it would show as ``4.00``.
    """
    from tqdm import tqdm

    with tqdm(
        total=total, unit=unit, desc=description, disable=None, file=sys.stderr, unit_scale=scale, dynamic_ncols=True
    ) as bar:
        yield bar


#: How a fit ended, in the words of its report (checkpoints and JSON keep :class:`~dist_respattn.events.FitState`).
_FIT_ENDINGS = {"converged": "converged", "max_iter": "stopped at --max-iter", "early_stopped": "stopped early"}


def fit_ended(state: str, iterations: int) -> str:
    """``stopped early after 8 iterations``: a fit's final state (a ``FitState`` value) for a person to read."""
    return f"{_FIT_ENDINGS.get(str(state), str(state))} after {count_text(iterations, 'iteration')}"


def embedding_table(store: Any, model: Any, *, needed_by: str, fix: str) -> Any:
    """(S, D) the store's embedding table, which makes each token's query, checked against ``model``'s S and D.

    ``needed_by`` names the command in the refusal (``sample``, ``--stream``), ``fix`` what to give instead.
    """
    table = store.embeddings()
    if table is None:
        raise CommandError(
            f"{store.location} has no embedding table (a store written from text or tokens has one): {needed_by} "
            f"needs one to make each token's query ({fix})"
        )
    if table.shape != (model.num_symbols, model.query_dim):
        raise CommandError(
            f"{store.location}: an embedding table of shape {table.shape}: expected (S, D) = "
            f"{(model.num_symbols, model.query_dim)}, the model's ({fix})"
        )
    return table
