"""``dist-respattn retrain`` and ``dist-respattn models list/show/check/export/repair``: the model registry.

Exit status of ``retrain``: 0 a new version was published, 1 the gate kept the current version,
2 an error (nothing published), 3 another run holds the registry's lock.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from dist_respattn.cli.common import (
    CommandError,
    fit_ended,
    in_flags,
    parse_storage_options,
    positive_float,
    positive_int,
)
from dist_respattn.cli.fit_commands import add_cluster_options, add_em_options, cluster_options, settings_from
from dist_respattn.cli.head_options import add_head_options, default_kind_text, kind_picked, spec_from_args
from dist_respattn.events import Metric
from dist_respattn.text_format import count_text

__all__ = ["COMMANDS"]

#: ``retrain``'s exit status when another run holds the lock (cron and CI can tell it from a failure).
EXIT_LOCKED = 3


def _fraction(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"{text}: expected a fraction >= 0 (0.01 = 1% worse allowed)")
    return value


def _add_retrain(sub: Any) -> None:
    """Add the ``retrain`` subcommand."""
    retrain = sub.add_parser(
        "retrain",
        help="warm-start from a registry's latest model, fit, gate on held-out scores, publish a new version",
        description=(
            "Scheduled retraining: warm-start from the registry's latest version (its kind, unless --head or a "
            "kind's options pick another, fitted from the data), fit on --store, score the fitted model and the "
            "current version on the same validation store and the same rows, each as evaluate scores it (its own "
            "window), and publish a new numbered version only when the fitted one is not worse by more than "
            "--tolerance. Exit status: 0 published, 1 kept the current version (gate), 2 error, 3 another run holds "
            "the registry."
        ),
    )
    retrain.add_argument("--registry", required=True, help="the registry: a directory or an fsspec URL (s3://...)")
    retrain.add_argument("--store", required=True, help="the training store (path or URL)")
    retrain.add_argument(
        "--validation", metavar="STORE", help="held-out store for early stopping and the gate (else: in-sample)"
    )
    gate = retrain.add_argument_group("quality gate and registry")
    gate.add_argument(
        "--tolerance",
        type=_fraction,
        default=0.01,
        help="how much worse than the current version, relatively, the new one may be (default 0.01)",
    )
    gate.add_argument(
        "--gate-metric",
        choices=tuple(Metric),
        help="held-out perplexity (default) or log-likelihood; default: the fit's --early-stop-metric",
    )
    gate.add_argument(
        "--keep", type=positive_int, metavar="K", help="after publishing, keep only the K newest versions"
    )
    gate.add_argument(
        "--work-dir", metavar="DIR", help="keep the fit's checkpoints here (default: a temporary directory)"
    )
    gate.add_argument(
        "--lock-timeout",
        type=positive_float,
        default=300.0,
        metavar="SECONDS",
        help="another run's lock without a heartbeat for this long is abandoned and broken (default 300)",
    )
    add_em_options(retrain, "EM settings")
    add_head_options(
        retrain,
        "fit",
        head_default=f"the latest version's kind, warm-started from it; for an empty registry {default_kind_text()}",
    )
    add_cluster_options(retrain)
    retrain.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    retrain.set_defaults(handler=_run_retrain, printer=_print_retrain)


def _add_models(sub: Any) -> None:
    """Add the ``models`` subcommand."""
    models = sub.add_parser(
        "models",
        help="read a model registry: list versions, show one, check every file, export one",
        description="Read a model registry (a directory or an fsspec URL).",
    )
    actions = models.add_subparsers(dest="action", metavar="ACTION")
    models.set_defaults(help_parser=models)  # `models` alone prints this help (exit 2), as a bare command does
    listing = actions.add_parser(
        "list",
        help="the versions, newest first, with their metrics and provenance; a record that fails its check is "
        "marked (!)",
    )
    listing.add_argument("registry", help="the registry (directory or URL)")
    show = actions.add_parser("show", help="one version's record (default: latest)")
    show.add_argument("registry", help="the registry (directory or URL)")
    show.add_argument("version", nargs="?", default="latest", help="a version number or 'latest' (default)")
    check = actions.add_parser(
        "check", help="verify latest and every version's record and files against their SHA-256 (exit 1 on a problem)"
    )
    check.add_argument("registry", help="the registry (directory or URL)")
    export = actions.add_parser(
        "export",
        help="write one version as a model directory (for fit --init-from, or to keep beside a deployment)",
        description=(
            "Write a version's checkpoint, its files checked against the version's record, as a model directory "
            "DIR (new or empty) whose latest checkpoint it is. Every command that takes a model directory reads "
            "it; they also read the version in place as REGISTRY@VERSION."
        ),
    )
    export.add_argument("registry", help="the registry (directory or URL)")
    export.add_argument("version", help="a version number or 'latest'")
    export.add_argument("directory", metavar="DIR", help="the model directory to write (a new or empty directory)")
    repair = actions.add_parser(
        "repair",
        help="point an unusable latest at the newest version that checks out (under the registry's lock)",
        description=(
            "When latest.json is missing, unreadable, names no version, or names a version that does not check out "
            "although other versions exist, point it at the newest version whose record and files check out (or "
            "at --version N). A latest that names a version that checks out is left alone. Exit status: 0 latest "
            "names a version and nothing else is wrong, 1 problems remain (listed), 2 error, 3 another run holds the "
            "registry."
        ),
    )
    repair.add_argument("registry", help="the registry (directory or URL)")
    repair.add_argument("--version", type=positive_int, metavar="N", help="the version latest should name")
    repair.add_argument(
        "--lock-timeout",
        type=positive_float,
        default=300.0,
        metavar="SECONDS",
        help="another run's lock without a heartbeat for this long is abandoned and broken (default 300)",
    )
    for action, handler, printer in (
        (listing, _run_list, _print_list),
        (show, _run_show, _print_show),
        (check, _run_check, _print_check),
        (export, _run_export, _print_export),
        (repair, _run_repair, _print_repair),
    ):
        action.add_argument(
            "--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option for URLs (repeatable)"
        )
        action.add_argument("--json", action="store_true", help="print JSON instead of text")
        # Unknown arguments are reported with this action's usage (see dist_respattn.cli.main).
        action.set_defaults(handler=handler, printer=printer, error_parser=action)


#: Each subcommand this module adds, by name, with the function that adds it to a subparsers action
#: (``build_parser`` adds only the one a command line names).
COMMANDS: dict[str, Callable[[Any], None]] = {"retrain": _add_retrain, "models": _add_models}


def _say(args: argparse.Namespace) -> Any:
    if args.json:
        return lambda message: None
    return lambda message: print(in_flags(message), file=sys.stderr, flush=True)


def _run_retrain(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.engine import FitSettings
    from dist_respattn.registry import RegistryLocked, retrain

    settings = settings_from(args, FitSettings())
    chosen = spec_from_args(args, settings.head_spec(), None)
    # A kind the command line picks (--head single too) is fitted whatever the latest version is; else the version's
    # kind, and for an empty registry what fit picks on the store.
    picked = kind_picked(args)
    try:
        result = retrain(
            args.registry,
            args.store,
            validation=args.validation,
            settings=settings,
            head=chosen if picked else None,
            first_head=None if picked else _first_head(args, settings),
            tolerance=args.tolerance,
            gate_metric=args.gate_metric,
            keep=args.keep,
            work_dir=args.work_dir,
            stale_after=args.lock_timeout,
            cluster=cluster_options(args),
            storage_options=parse_storage_options(args.storage_option),
            say=_say(args),
            progress=None if not args.json else False,
        )
    except RegistryLocked as exc:
        return {"published": False, "locked": True, "error": " ".join(str(exc).split()), "exit_status": EXIT_LOCKED}
    return result.to_json()


def _first_head(args: argparse.Namespace, settings: Any) -> Any:
    """What a first version is fitted as when nothing picks a kind: what ``fit`` picks on the store (the recipe on
    a token-stream store, else the single head)."""
    from dist_respattn.model.heads.base import token_stream_default
    from dist_respattn.store import StoreError, TokenStreamStore, open_store

    name = token_stream_default()
    try:
        store = open_store(args.store, storage_options=parse_storage_options(args.storage_option))
    except (StoreError, OSError, ValueError):
        return None  # retrain reports a store it cannot open in its own words
    if name is None or not isinstance(store, TokenStreamStore):
        return None
    return spec_from_args(argparse.Namespace(head=name), settings.head_spec(), None)


def _print_retrain(report: dict[str, Any]) -> None:
    if report.get("locked"):
        print(f"not run: {report['error']}")
        return
    if report["published"]:
        print(f"published version {report['version']} to {report['registry']}")
    else:
        print(f"not published: the gate kept version {report['previous']} as latest in {report['registry']}")
    gate = report["gate"]
    current = "none (first version)" if gate["current"] is None else f"{gate['current']:.6g}"
    print(
        f"gate ({gate['metric']}, tolerance {gate['tolerance']:g}, on {gate['store']}"
        f"{', in-sample' if gate['in_sample'] else ''}): new {gate['candidate']:.6g}, current {current}"
    )
    fit = report["fit"]
    print(f"fit: {fit_ended(fit['state'], fit['iterations'])} in {fit['seconds']:.1f} s")
    if report["pruned"]:
        print(f"pruned versions: {', '.join(map(str, report['pruned']))}")


def _registry(args: argparse.Namespace) -> Any:
    from dist_respattn.artifacts import Registry

    registry = Registry(args.registry, parse_storage_options(args.storage_option))
    if not registry.check_format():
        raise CommandError(f"{args.registry}: no model registry here (retrain publishes the first version)")
    return registry


def _summary(version: Any, latest: int | None, problem: str | None) -> dict[str, Any]:
    """What ``models list`` shows of a version; ``problem``: why its record is not to be trusted (``None``: it
    checks out), said beside its metrics so an edited record is never shown as genuine."""
    record = version.record
    # A record that fails its check may hold anything: what is not of the published shape is shown as unknown.
    provenance = record.get("provenance")
    provenance = provenance if isinstance(provenance, dict) else {}
    store = provenance.get("store")
    store = store if isinstance(store, dict) else {}
    return {
        "version": version.number,
        "latest": version.number == latest,
        "created": record.get("created"),
        "metrics": record.get("metrics"),
        "gate": record.get("gate"),
        "store": store.get("url"),
        "fingerprint": store.get("fingerprint"),
        "rows": store.get("rows"),
        "iterations": provenance.get("iterations"),
        "warm_start_from": provenance.get("warm_start_from"),
        "package_version": provenance.get("package_version"),
        "verified": problem is None,
        "problem": problem,
    }


def _run_list(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.artifacts import RegistryError, Version

    registry = _registry(args)
    latest = registry.latest_number()
    versions = []
    for number in reversed(registry.numbers()):
        # The records' own checks only (their checksum and the paths they name): `models check` reads every file.
        try:
            version = registry.version(number)
        except RegistryError as exc:  # not even JSON: listed as a version whose record tells nothing
            versions.append(_summary(Version(number, {}), latest, str(exc)))
            continue
        versions.append(_summary(version, latest, registry.record_problem(version)))
    return {"registry": args.registry, "latest": latest, "versions": versions}


def _print_list(report: dict[str, Any]) -> None:
    print(f"{report['registry']}: {count_text(len(report['versions']), 'version')}, latest {report['latest']}")
    print(f"  {'version':>7}  {'created':<20} {'rows':>12} {'iter':>5} {'perplexity':>11} {'loglik':>11}  store")
    for v in report["versions"]:
        metrics = v["metrics"] if isinstance(v["metrics"], dict) else {}
        perplexity, loglik = _number(metrics.get("perplexity")), _number(metrics.get("mean_log_likelihood"))
        marker = "*" if v["latest"] else " "
        print(
            f"{marker} {v['version']:>7}  {_created(v['created']):<20} {_count(v['rows']):>12,} "
            f"{_count(v['iterations']):>5} {perplexity:>11.5g} {loglik:>11.6g}  {v['store']}"
            f"{'  (!)' if v.get('problem') else ''}"
        )
    print("(* = latest)")
    failed = [v for v in report["versions"] if v.get("problem")]
    for v in failed:
        print(f"! version {v['version']}: {v['problem']}")
    if failed:
        print(
            f"(!) the record fails its check: its metrics and provenance are not to be trusted, and commands refuse "
            f"{'it' if len(failed) == 1 else 'them'} (models check lists every problem)"
        )


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _created(value: Any) -> str:
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return "?"


def _run_show(args: argparse.Namespace) -> dict[str, Any]:
    registry = _registry(args)
    version = registry.resolve(args.version)
    problem = registry.record_problem(version)  # shown, not refused: the record is what one inspects to find out
    return {
        **version.to_json(),
        "latest": version.number == registry.latest_number(),
        "verified": problem is None,
        "problem": problem,
    }


def _print_show(report: dict[str, Any]) -> None:
    import json

    print(json.dumps(report, indent=2))
    if report["problem"] is not None:
        print(f"! {report['problem']}: its metrics and provenance are not to be trusted", file=sys.stderr)


def _run_export(args: argparse.Namespace) -> dict[str, Any]:
    registry = _registry(args)
    version, checkpoint = registry.export(args.version, args.directory)
    return {
        "registry": args.registry,
        "version": version.number,
        "model_dir": args.directory,
        "checkpoint": str(checkpoint),
    }


def _print_export(report: dict[str, Any]) -> None:
    print(f"exported version {report['version']} of {report['registry']} to the model directory {report['model_dir']}")


def _run_check(args: argparse.Namespace) -> dict[str, Any]:
    registry = _registry(args)
    problems = registry.problems()
    return {
        "registry": args.registry,
        "versions": len(registry.numbers()),
        "latest": registry.latest_number() if not problems else None,
        "problems": problems,
        "exit_status": 1 if problems else 0,
    }


def _print_check(report: dict[str, Any]) -> None:
    if not report["problems"]:
        print(
            f"{report['registry']}: {count_text(report['versions'], 'version')}, latest {report['latest']}: "
            "every file checks out"
        )
        return
    for problem in report["problems"]:
        print(f"problem: {problem}")


def _run_repair(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.artifacts import RegistryLocked

    registry = _registry(args)
    try:
        with registry.lock(stale_after=args.lock_timeout) as lock:
            before = registry.missing_latest()
            latest = registry.repair_latest(lock, args.version)
    except RegistryLocked as exc:
        return {"registry": args.registry, "locked": True, "error": " ".join(str(exc).split()), "exit_status": 3}
    problems = registry.problems()
    return {
        "registry": args.registry,
        "latest": latest,
        "repaired": before is not None and latest is not None,
        "problems": problems,
        "exit_status": 0 if latest is not None and not problems else 1,
    }


def _print_repair(report: dict[str, Any]) -> None:
    if report.get("locked"):
        print(f"not run: {report['error']}")
        return
    if report["latest"] is None:
        print(f"{report['registry']}: no version checks out: latest left as it was")
    elif report["repaired"]:
        print(f"{report['registry']}: latest now names version {report['latest']}")
    else:
        print(f"{report['registry']}: latest names version {report['latest']}: nothing to repair")
    for problem in report["problems"]:
        print(f"problem: {problem}")
