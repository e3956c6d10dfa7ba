"""``dist-respattn fit``, ``evaluate`` and ``predict``: the engine on the command line."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from dist_respattn.cli.common import (
    CommandError,
    fit_ended,
    in_flags,
    memory_limit,
    parse_storage_options,
    positive_float,
    positive_int,
    seed,
)
from dist_respattn.cli.head_options import (
    add_head_options,
    given_head_options,
    head_options,
    kind_picked,
    refuse_other_kinds_options,
    spec_from_args,
)
from dist_respattn.cli.stream_predict import print_stream_summary, run_stream
from dist_respattn.events import Metric

__all__ = [
    "COMMANDS",
    "add_cluster_options",
    "add_em_options",
    "baseline_order",
    "cluster_options",
    "default_spec",
    "fit_report",
    "ranking_settings",
    "security",
    "settings_from",
]


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run on this Dask scheduler (default: $DASK_SCHEDULER_ADDRESS, else an embedded local cluster)",
    )
    group.add_argument(
        "--workers", type=positive_int, help="worker processes of the embedded cluster (default: one a core)"
    )
    group.add_argument(
        "--memory-limit",
        type=memory_limit,
        default="auto",
        help="memory limit of each embedded worker, e.g. 2GiB (default: an even share of the machine)",
    )
    group.add_argument(
        "--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option for store URLs (repeatable)"
    )
    tls = parser.add_argument_group(
        "TLS (for a tls:// scheduler; default: Dask's distributed.comm.tls config)",
    )
    tls.add_argument("--tls-ca-file", metavar="FILE", help="CA certificate(s) that signed the cluster's certificates")
    tls.add_argument("--tls-cert", metavar="FILE", help="this client's certificate (may also hold its key)")
    tls.add_argument("--tls-key", metavar="FILE", help="this client's private key")


def add_em_options(parser: argparse.ArgumentParser, title: str) -> None:
    """The EM settings options (``fit`` and ``retrain``), named like the :class:`FitSettings` fields."""
    em = parser.add_argument_group(title)
    em.add_argument("--max-iter", type=int, help="iterations at most, counted from the first (default 100)")
    em.add_argument("--tol", type=float, help="relative change of the mean log-likelihood to stop (default 1e-6)")
    em.add_argument(
        "--init",
        choices=("uniform", "random"),
        help="first model: the M-step of uniform attention (default) or of random responsibilities",
    )
    em.add_argument("--seed", type=seed, help="seed of a random start, per partition (default 0)")
    em.add_argument(
        "--sigma2",
        type=positive_float,
        help="fix the gate variance at this value (default: chosen on held-out rows); with --learn-sigma2, its start",
    )
    em.add_argument(
        "--fixed-sigma2", action="store_const", const=True, help="keep the gate variance fixed at --sigma2 (default 1)"
    )
    em.add_argument(
        "--learn-sigma2",
        action="store_const",
        const=True,
        help="learn the gate variance by maximum likelihood (it collapses when queries are token embeddings)",
    )
    em.add_argument("--min-sigma2", type=positive_float, help="floor of a learned variance (default 1e-6)")
    em.add_argument(
        "--emission-prior",
        choices=("continuation", "unigram", "uniform"),
        help="backoff distribution the emission rows shrink toward (default continuation, as Kneser-Ney's)",
    )
    em.add_argument(
        "--emission-strength",
        type=float,
        help="pseudo-counts of the emission prior per row (default: chosen on held-out rows)",
    )
    em.add_argument(
        "--type-strength",
        type=float,
        help="pseudo-counts of the emission prior per distinct successor of a symbol (default: chosen on held-out)",
    )
    em.add_argument(
        "--emission-smoothing",
        type=float,
        help="additive emission smoothing instead of the prior (the reference library's, e.g. 1e-6)",
    )
    em.add_argument("--pseudo-count", type=float, help="Dirichlet strength on the position prior (default none)")
    em.add_argument(
        "--holdout-fraction",
        type=float,
        help="without --validation: share of the training rows held out for the choices (default 0.05; 0: none)",
    )
    em.add_argument("--fan-in", type=positive_int, help="children per combine task (default 4)")
    em.add_argument(
        "--m-step-shards",
        type=int,
        metavar="K",
        help="run the M-step in K shards of the symbols on the workers that reduce them (default 0: on the driver; "
        "the same parameters either way; one symbol a shard at least, so a K above the S symbols runs S; the model "
        "directory must be writable by every worker)",
    )
    em.add_argument(
        "--context",
        dest="context_length",
        type=positive_int,
        help="the window N a token-stream store is read with (default: the store's; a triple store's is fixed)",
    )
    em.add_argument(
        "--position-buckets",
        type=positive_int,
        metavar="K",
        help="tie the position prior over K recency buckets of 1, 1, 2, 4, ... positions (the last takes the rest; "
        "K = N: the free prior) and fit by the histogram kernel: a row costs its distinct symbols, not N",
    )
    em.add_argument(
        "--min-context",
        type=positive_int,
        metavar="M",
        help="token-stream rows with at least M earlier tokens in their document (default: 1 with "
        "--position-buckets, the missing positions masked; else N)",
    )
    em.add_argument(
        "--emission-layout",
        choices=("auto", "dense", "sparse"),
        help="emission as an (S, T) table or over the (symbol, target) pairs the store holds "
        "(default auto: dense up to 2**23 cells)",
    )
    em.add_argument(
        "--early-stop-metric",
        choices=tuple(Metric),
        help="held-out metric for early stopping and the best checkpoint (default perplexity with held-out rows)",
    )
    em.add_argument("--patience", type=positive_int, help="iterations without improvement before stopping (3)")
    em.add_argument(
        "--min-improvement",
        type=float,
        help="relative improvement of the held-out metric that resets the patience (default 0.001)",
    )


def security(args: argparse.Namespace) -> Any:
    """A ``distributed.Security`` from the ``--tls-*`` options, or ``None`` (Dask's config then applies)."""
    paths = {"tls_ca_file": args.tls_ca_file, "tls_client_cert": args.tls_cert, "tls_client_key": args.tls_key}
    if not any(paths.values()):
        return None
    if not args.tls_ca_file or not args.tls_cert:
        raise CommandError("TLS needs --tls-ca-file and --tls-cert (and --tls-key unless the cert file holds the key)")
    for option, path in zip(("--tls-ca-file", "--tls-cert", "--tls-key"), paths.values(), strict=True):
        if path and not os.path.isfile(path):
            raise CommandError(f"{option} {path}: no such file")
    import distributed

    return distributed.Security(**{k: v for k, v in paths.items() if v}, require_encryption=True)


def cluster_options(args: argparse.Namespace) -> Any:
    """The engine's ``ClusterOptions`` from the cluster and ``--tls-*`` options (see :func:`add_cluster_options`)."""
    from dist_respattn.engine import ClusterOptions

    return ClusterOptions(
        scheduler=args.scheduler, n_workers=args.workers, memory_limit=args.memory_limit, security=security(args)
    )


def baseline_order(text: str) -> int:
    """A ``--baseline-order``: the longest n-gram baseline, 2 to 5 (checked before any cluster starts)."""
    from dist_respattn.baselines.kneser_ney import MAX_ORDER, MIN_ORDER

    try:
        value = int(text)
    except ValueError:
        value = 0
    if not MIN_ORDER <= value <= MAX_ORDER:
        raise argparse.ArgumentTypeError(
            f"{text}: expected an integer from {MIN_ORDER} to {MAX_ORDER} (2: the bigrams only)"
        )
    return value


def _add_fit(sub: Any) -> None:
    """Add the ``fit`` subcommand."""
    fit = sub.add_parser(
        "fit",
        help="fit a head to a store by exact EM on a Dask cluster, checkpointing into a model directory",
        description=(
            "Fit a responsibility-attention head to a store by exact EM on a Dask cluster: by default the recipe "
            "on a token-stream store (--head single: one head alone), one head on a triple store. Every "
            "iteration is checkpointed into --model-dir (arrays + JSON); --resume continues a killed fit."
        ),
    )
    fit.add_argument("store", help="the training store (path or URL)")
    fit.add_argument("--model-dir", required=True, help="directory for the checkpoints (latest, best)")
    fit.add_argument("--validation", metavar="STORE", help="held-out store scored after every iteration")
    start = fit.add_argument_group("start")
    start.add_argument("--init-from", metavar="MODEL", help="warm-start from this model directory")
    start.add_argument(
        "--resume", action="store_true", help="continue the fit in --model-dir (settings default to its own)"
    )
    start.add_argument("--overwrite", action="store_true", help="start over in a --model-dir that holds a fit")
    add_em_options(fit, "EM settings (with --resume, the checkpoint's unless given)")
    add_head_options(fit, "fit")
    add_cluster_options(fit)
    fit.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="iteration lines and the summary with the mean joint log-likelihoods per row too (of the query and "
        "the target: a density, which falls when a larger sigma2 is chosen even as the perplexity improves)",
    )
    fit.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    fit.set_defaults(handler=_run_fit, printer=_print_fit, interrupted=fit_interrupted)


def _add_evaluate(sub: Any) -> None:
    """Add the ``evaluate`` subcommand."""
    evaluate = sub.add_parser(
        "evaluate",
        help="score a store with a model, beside unigram, bigram and n-gram baselines",
        description=(
            "Score a store with a fitted model on a Dask cluster: mean log-likelihood per row, and the accuracy "
            "and perplexity of predict_proba on the targets, beside baselines from the training store's "
            "counts: a unigram, and add-k, Jelinek-Mercer and interpolated Kneser-Ney bigrams (their k, lambda "
            "and discount tuned on the model's held-out rows when it has any); for a store made from a token "
            "stream also interpolated modified Kneser-Ney n-grams of orders 3 to --baseline-order (JSON keys "
            "kneser_ney_3 ... kneser_ney_5)."
        ),
    )
    evaluate.add_argument("model", help=MODEL_HELP)
    evaluate.add_argument("store", help="the store to score (path or URL)")
    evaluate.add_argument(
        "--baseline-k",
        type=positive_float,
        default=0.1,
        help="k of the add-k unigram, and of the add-k bigram when nothing tunes it (0.1)",
    )
    evaluate.add_argument(
        "--baseline-order",
        type=baseline_order,
        default=5,
        metavar="N",
        help="for a store made from a token stream, interpolated modified Kneser-Ney n-grams of orders 3 to N "
        "beside the bigrams (2 to 5; 2: the bigrams only; default 5)",
    )
    ranking = evaluate.add_argument_group("next-item ranking (token-stream stores; see the guide's ranking page)")
    ranking.add_argument(
        "--ranking",
        type=positive_int,
        metavar="K",
        help="also rank the last target of each document (the rest of it its history) under the head and three "
        "baselines (most popular, the Kneser-Ney bigram as a Markov chain, item-KNN over the window): hit rate, "
        "NDCG and MRR at K, against every target (full) and against sampled unseen negatives (sampled); JSON key "
        "ranking",
    )
    ranking.add_argument(
        "--ranking-negatives",
        type=positive_int,
        metavar="M",
        help="with --ranking: negatives of the sampled protocol, targets the document has not seen (default 100)",
    )
    ranking.add_argument(
        "--ranking-seed", type=seed, metavar="SEED", help="with --ranking: seed of the sampled negatives (default 0)"
    )
    ranking.add_argument(
        "--ranking-exclude-history",
        action="store_true",
        help="with --ranking: in the full protocol, targets already in the document's history are no candidates "
        "(the held-out target always is)",
    )
    add_head_options(evaluate, "evaluate")
    add_cluster_options(evaluate)
    evaluate.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    evaluate.set_defaults(handler=_run_evaluate, printer=_print_evaluate)


def _add_predict(sub: Any) -> None:
    """Add the ``predict`` subcommand."""
    predict = sub.add_parser(
        "predict",
        help="write each row's K most probable targets, their probabilities and the attention",
        description=(
            "Predict every row of a store with a fitted model on a Dask cluster: the K most probable targets "
            "(best first, the lower id first on ties), their probabilities p(target | context, query) and the "
            "attention over the N context positions. Each store partition is predicted and written by one task, "
            "block by block, so memory is bounded by a block, never by the store. The output is a zarr group "
            "(a directory, or an fsspec URL every worker can write): parts/00000/targets int32 (n, K), "
            "parts/00000/probabilities float64 (n, K), parts/00000/attention float64 (n, N), one part per store "
            "partition, in row order; its attributes name the model, the store and each part's rows. Read it "
            "with dist_respattn.store.predictions.Predictions. An --out ending in .jsonl or .csv is a local file of "
            "rows instead, written in row order by this process: each row's K ids, their words (when the store "
            "has a vocabulary) and probabilities, and its stored target. JSON Lines: one object a row, keys row, "
            "target, target_word, ids, words, probabilities. CSV columns: row, target, target_word, then id_k, "
            "word_k, probability_k for k = 1..K (the word keys and columns only with a vocabulary)."
        ),
    )
    predict.add_argument("model", help=MODEL_HELP)
    predict.add_argument("store", help="the store to predict (path or URL)")
    predict.add_argument("--top", type=positive_int, default=5, metavar="K", help="targets kept per row (5)")
    predict.add_argument(
        "--out",
        metavar="OUT",
        help="where the predictions go: FILE.jsonl or FILE.csv (rows with ids, words and probabilities), else a new "
        "zarr group",
    )
    predict.add_argument(
        "--stream",
        action="store_true",
        help="predict one history read from stdin instead (words, or ids without a vocabulary): a JSON line of "
        "the --top next tokens after every token (keys position, token, top: [word or id, probability] pairs, ids), "
        "from the bucket histograms in constant time a token; STORE gives the embeddings and vocabulary, no "
        "cluster is started; the summary gives the start-up apart from the time a token",
    )
    predict.add_argument(
        "--overwrite", action="store_true", help="replace the predictions (group or file) already at --out"
    )
    add_head_options(predict, "predict")
    add_cluster_options(predict)
    predict.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    predict.set_defaults(handler=_run_predict, printer=_print_predict)


#: Each subcommand this module adds, by name, with the function that adds it to a subparsers action
#: (``build_parser`` adds only the one a command line names).
COMMANDS: dict[str, Callable[[Any], None]] = {"fit": _add_fit, "evaluate": _add_evaluate, "predict": _add_predict}


#: What ``evaluate`` and ``predict`` take as a model.
MODEL_HELP = (
    "a model directory (its best checkpoint, else its latest), or a registry's version: REGISTRY@7, REGISTRY@latest"
)

#: The options named like the FitSettings fields they set (``--fixed-sigma2``/``--learn-sigma2`` are handled apart).
_SETTING_OPTIONS = (
    "max_iter",
    "tol",
    "init",
    "seed",
    "sigma2",
    "min_sigma2",
    "emission_prior",
    "emission_strength",
    "type_strength",
    "emission_smoothing",
    "pseudo_count",
    "holdout_fraction",
    "position_buckets",
    "min_context",
    "fan_in",
    "m_step_shards",
    "emission_layout",
    "context_length",
    "early_stop_metric",
    "patience",
    "min_improvement",
)


def _settings(args: argparse.Namespace) -> tuple[Any, Any]:
    """The fit's settings and head spec: a resumed fit's own (what its ``fit.json`` records; in a directory older
    than that record, its latest checkpoint's head and its first stage's settings), else the defaults, then the
    options given."""
    from dist_respattn.artifacts import CheckpointError, load_checkpoint
    from dist_respattn.engine import FitSettings, ModelDir

    if args.resume:
        try:
            recorded = ModelDir(args.model_dir).fit_record()
        except CheckpointError as exc:
            raise CommandError(str(exc)) from exc
        if recorded is not None:
            settings = settings_from(args, FitSettings.from_json(recorded["settings"]))
            return settings, spec_from_args(args, settings.head_spec(), recorded.get("head"))
    saved_head = None
    if args.resume and ModelDir(args.model_dir).has_checkpoint():
        saved_head = load_checkpoint(args.model_dir, "latest").meta.get("head")
    spec = spec_from_args(args, settings_from(args, FitSettings()).head_spec(), saved_head)
    base = FitSettings()
    first = os.path.join(args.model_dir, spec.stages()[0].directory)
    if args.resume and ModelDir(first).has_checkpoint():
        base = FitSettings.from_json(load_checkpoint(first, "latest").meta.get("settings", {}))
    settings = settings_from(args, base)
    # The single-hop part of the spec follows the settings (a resumed fit's own, then the options given).
    return settings, spec_from_args(args, settings.head_spec(), saved_head)


def settings_from(args: argparse.Namespace, base: Any) -> Any:
    """``base`` settings with the EM options given on the command line (see :func:`add_em_options`)."""
    import dataclasses

    given = {name: getattr(args, name) for name in _SETTING_OPTIONS if getattr(args, name) is not None}
    if args.fixed_sigma2 and args.learn_sigma2:
        raise CommandError("--fixed-sigma2 and --learn-sigma2 contradict each other: give one")
    if args.fixed_sigma2:
        given["estimate_sigma2"] = False
        given.setdefault("sigma2", base.sigma2 if base.sigma2 is not None else 1.0)
    if args.learn_sigma2:
        given["estimate_sigma2"] = True
    elif "sigma2" in given:
        given.setdefault("estimate_sigma2", False)
    try:
        return dataclasses.replace(base, **given)
    except (TypeError, ValueError) as exc:
        raise CommandError(_as_flags(str(exc))) from exc


def _as_flags(message: str) -> str:
    """A FitSettings message in the command line's words: ``holdout_fraction`` becomes ``--holdout-fraction``."""
    for name in _SETTING_OPTIONS:
        flag = "--context" if name == "context_length" else "--" + name.replace("_", "-")
        message = re.sub(rf"(?<![\w-]){name}(?!\w)", flag, message)
    return message


def _say(args: argparse.Namespace) -> Any:
    """The engine's progress lines on stderr, in the command line's words (its warnings name flags)."""
    if args.json:
        return lambda message: None
    return lambda message: print(in_flags(message), file=sys.stderr, flush=True)


def _stage_summary(result: Any) -> dict[str, Any]:
    """An earlier stage's fit in a staged fit's report: where it is, how it ended, its best held-out perplexity."""
    best: dict[str, Any] = next((h for h in result.history if h["iteration"] == result.best_iteration), {})
    return {
        "model_dir": result.model_dir,
        "state": str(result.state),
        "iterations": result.iterations,
        "best_iteration": result.best_iteration,
        "heldout_perplexity": (best.get("heldout") or {}).get("perplexity"),
    }


def fit_report(result: Any, store: Any, *, cluster_closed: bool = False) -> dict[str, Any]:
    """What ``fit`` prints: the outcome, what was learned (and how close to the truth), where things are.

    ``cluster_closed``: the fit's cluster has shut down (an embedded one), so it has no dashboard to show. The
    head's own figures (a single-hop head's gate variance and most attended positions...) are its kind's
    (``Head.summary``); a staged kind's earlier fits are named by their directories (``"shared"``).
    """
    from dist_respattn.artifacts.checkpoints import BEST, LATEST, ModelDir

    model = result.model
    folder = ModelDir(result.model_dir)
    last = result.history[-1] if result.history else {}
    # The held-out figures and choices of the model the directory serves: the best one, when validated.
    best = next((h for h in result.history if h["iteration"] == result.best_iteration), last)
    figures, lines = model.summary()
    report: dict[str, Any] = {
        "model_dir": result.model_dir,
        "kind": model.kind,
        # The head's settings as its checkpoints record them (a resumed fit's are its own, not those given again).
        "settings": _recorded_head(folder),
        "state": result.state,
        "iterations": result.iterations,
        "mean_log_likelihood": last.get("mean_log_likelihood"),
        "heldout": best.get("heldout"),
        "heldout_perplexity": (best.get("heldout") or {}).get("perplexity"),
        "heldout_rows": result.heldout_rows,
        "hyperparameters": best.get("hyperparameters"),
        "choice": best.get("choice"),
        "best_iteration": result.best_iteration,
        # Which checkpoints the directory's pointers name: what evaluate/predict read (best, else latest).
        "best_checkpoint": folder.pointed(BEST),
        "latest_checkpoint": folder.pointed(LATEST),
        "last_iteration": last.get("iteration"),
        "last_heldout": last.get("heldout"),
        "parameters": model.num_parameters(),
        **figures,
        "head_lines": lines,
        "warnings": [in_flags(warning) for warning in result.warnings],
        "dashboard": None if cluster_closed else result.dashboard,
        "seconds": round(result.seconds, 3),
        "first_iteration_seconds": None
        if result.first_iteration_seconds is None
        else round(result.first_iteration_seconds, 3),
        "rows_per_second": last.get("rows_per_second"),
        "history": result.history,
    }
    for stage in result.stages:
        report[os.path.basename(os.path.normpath(stage.model_dir))] = _stage_summary(stage)
    truth = store.true_model()
    recovered = model.recovery(truth) if truth is not None else None
    if recovered is not None:
        report["recovery"], report["recovery_lines"] = recovered
    return report


def _recorded_head(folder: Any) -> dict[str, Any] | None:
    """The head spec JSON the model directory's latest checkpoint records (``None`` before any was written)."""
    from dist_respattn.artifacts import load_checkpoint
    from dist_respattn.artifacts.checkpoints import LATEST

    if not folder.has_checkpoint():
        return None
    recorded = load_checkpoint(folder.path, LATEST).meta.get("head")
    return dict(recorded) if recorded else None


def _run_fit(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.engine import fit, open_store

    options = parse_storage_options(args.storage_option)
    settings, spec = _settings(args)  # a bad option is reported before any store is opened
    store = open_store(args.store, storage_options=options, window=settings.context_length)
    spec = default_spec(args, settings, spec, store)
    names = getattr(store, "attribute_names", None)
    for note in spec.notes(tuple(names) if names else None):
        if not args.resume:  # said before the fit, so it can be stopped and run again
            _say(args)(note)
    result = fit(
        store,
        model_dir=args.model_dir,
        settings=settings,
        head=spec,
        validation=args.validation,
        init_from=args.init_from,
        resume=args.resume,
        overwrite=args.overwrite,
        cluster=cluster_options(args),
        storage_options=options,
        say=_say(args),
        progress=None if not args.json else False,
        verbose=args.verbose,
    )
    if args.verbose:
        args.printer = lambda report: print_fit_summary(report, verbose=True)
    return fit_report(result, store)


def fit_interrupted(args: argparse.Namespace) -> str:
    """What a fit stopped by a signal kept, for the line ``dist-respattn fit: interrupted...``: the last good checkpoint
    in its model directory (a staged fit's, in the directory of the stage it was in), which ``--resume`` continues."""
    found = _last_checkpoint(args.model_dir)
    if found is None:
        return f" before the first checkpoint: {args.model_dir} holds none (run the fit again)"
    directory, iteration = found
    stage = os.path.relpath(directory, args.model_dir)
    of_stage = f" of its {stage} stage" if stage != "." else ""
    return (
        f"; the last good checkpoint in {args.model_dir} (iteration {iteration}{of_stage}) is kept: resume with "
        "--resume"
    )


def _last_checkpoint(model_dir: str) -> tuple[str, Any] | None:
    """``(directory, iteration)`` of the checkpoint last committed in ``model_dir`` or a stage's directory in it (the
    ``latest.json`` written last), or ``None`` when there is none."""
    from dist_respattn.artifacts.checkpoints import LATEST, ModelDir, read_json_file

    found: list[tuple[float, str, Any]] = []
    for directory, subdirectories, _ in os.walk(model_dir):
        # A checkpoint's own directory (and a write's leftover) holds no stage.
        subdirectories[:] = [name for name in subdirectories if not name.startswith(("ckpt-", "."))]
        pointer = ModelDir(directory).pointer_path(LATEST)
        try:
            found.append((pointer.stat().st_mtime, directory, read_json_file(pointer).get("iteration")))
        except (OSError, ValueError):  # none here, or one a person damaged: the others still say where the fit is
            continue
    if not found:
        return None
    _, directory, iteration = max(found)
    return directory, iteration


def default_spec(args: argparse.Namespace, settings: Any, spec: Any, store: Any) -> Any:
    """``spec``, or, when no ``--head`` or kind's option picked a kind and no fit is resumed, the kind ``fit`` picks
    itself: with ``--init-from``, the kind of the fit it starts from (a recipe is retrained as a recipe, each part
    from its own); else, on a token-stream store, the kind the model layer fits there by default (the recipe)."""
    from dist_respattn.engine import ModelDir
    from dist_respattn.model.heads.base import head_kind, token_stream_default
    from dist_respattn.store import TokenStreamStore

    if kind_picked(args):
        return spec
    if args.resume and (ModelDir(args.model_dir).fit_record() is not None or ModelDir(args.model_dir).has_checkpoint()):
        return spec
    if args.init_from:
        recorded = (ModelDir(args.init_from).fit_record() or {}).get("head") or {}
        try:
            name = head_kind(str(recorded.get("kind"))).head_name if recorded else None
        except ValueError:
            return spec
        if name is None or recorded.get("kind") == spec.kind:
            return spec
        _say(args)(f"fitting --head {name}, the kind of the fit in {args.init_from}")
    else:
        name = token_stream_default()
        if name is None or not isinstance(store, TokenStreamStore):
            return spec
        _say(args)(f"fitting --head {name}, the default on a token-stream store (--head single: one head alone)")
    args.head = name
    return spec_from_args(args, settings.head_spec(), None)


def print_fit_summary(report: dict[str, Any], *, verbose: bool = False) -> None:
    """The human-readable ``fit`` report (also the end of ``demo``); ``verbose`` adds the joint log-likelihoods."""
    print(f"EM {fit_ended(report['state'], report['iterations'])} in {report['seconds']:.1f} s")
    if verbose and report["mean_log_likelihood"] is not None:
        print(f"mean joint log-likelihood per row (training, last iteration): {report['mean_log_likelihood']:.4f}")
    best_iteration = report.get("best_iteration")
    if report.get("heldout"):
        h = report["heldout"]
        # A figure a checkpoint's meta.json lacks (an older or an edited one) is shown as missing, not a traceback.
        accuracy = f", accuracy {h['accuracy']:.2%}" if h.get("accuracy") is not None else ""
        joint = f", joint log-likelihood {_figure(h.get('mean_log_likelihood'))}" if verbose else ""
        print(
            f"held-out ({report.get('heldout_rows') or 'validation'}): perplexity {_figure(h.get('perplexity'))}"
            f"{accuracy}{joint} (best iteration {best_iteration})"
        )
    for name in report:
        stage = report[name]
        if isinstance(stage, dict) and {"model_dir", "state", "iterations", "heldout_perplexity"} <= set(stage):
            ratio = ""
            if stage["heldout_perplexity"] and report.get("heldout_perplexity"):
                ratio = f", this head / it: {report['heldout_perplexity'] / stage['heldout_perplexity']:.3f}"
            perplexity = stage["heldout_perplexity"]
            shown = f", held-out perplexity {perplexity:.3f}" if perplexity is not None else ""
            print(
                f"{name} stage: {fit_ended(stage['state'], stage['iterations'])}{shown} ({stage['model_dir']}){ratio}"
            )
    if report.get("choice"):
        # Without held-out rows nothing is chosen: the settings are the fixed ones.
        print(f"{'chosen on held-out rows' if report.get('heldout') else 'settings'}: {report['choice']}")
    for line in report.get("head_lines") or []:
        print(line)
    if report.get("recovery"):
        print("recovery of the store's true head:")
        for line in report.get("recovery_lines") or []:
            print(f"  {line}")
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    for line in kept_lines(report):
        print(line)
    if report.get("dashboard"):
        from dist_respattn.monitor.web import page_url

        print(f"dashboard: {report['dashboard']}, fit page: {page_url(report['dashboard'])} (while its cluster runs)")


def _figure(value: Any) -> str:
    """``11.0551``, or ``n/a`` for a figure the checkpoint does not hold."""
    return "n/a" if value is None else f"{value:.4f}"


def kept_lines(report: dict[str, Any]) -> list[str]:
    """Which model the directory serves (the best iteration's with held-out rows, else the last) and where."""
    folder = report["model_dir"]
    best, latest = report.get("best_iteration"), report.get("latest_checkpoint")
    use = "evaluate, predict and load_model read it"
    if best is None or not report.get("best_checkpoint"):
        where = f"{latest}, latest.json" if latest else "latest.json"
        return [f"model: {folder}, the last iteration's ({where}); {use}"]
    perplexity = (report.get("heldout") or {}).get("perplexity")
    score = f", held-out perplexity {perplexity:.4f}" if perplexity is not None else ""
    where = f"{report['best_checkpoint']}, best.json"
    lines = [f"model: {folder}, the best iteration's: iteration {best}{score} ({where}); {use}"]
    last_iteration = report.get("last_iteration")
    if last_iteration is not None and last_iteration != best:
        after = (report.get("last_heldout") or {}).get("perplexity")
        after_text = f", held-out perplexity {after:.4f}" if after is not None else ""
        lines.append(
            f"  the last iteration's ({last_iteration}{after_text}) is kept beside it ({latest}, latest.json): "
            "--resume continues from it"
        )
    elif last_iteration is not None:
        lines.append("  it is also the last iteration's")
    return lines


def _print_fit(report: dict[str, Any]) -> None:
    print_fit_summary(report)


def ranking_settings(args: argparse.Namespace) -> Any:
    """The ``--ranking`` flags as settings (``None`` without ``--ranking``); a flag that needs it, refused."""
    from dist_respattn.model.ranking import DEFAULT_NEGATIVES, DEFAULT_RANKING_SEED, RankingSettings

    if args.ranking is None:
        given = [
            flag
            for flag, value in (
                ("--ranking-negatives", args.ranking_negatives),
                ("--ranking-seed", args.ranking_seed),
                ("--ranking-exclude-history", args.ranking_exclude_history or None),
            )
            if value is not None
        ]
        if given:
            raise CommandError(f"{', '.join(given)}: goes with --ranking K (e.g. --ranking 10)")
        return None
    return RankingSettings(
        k=args.ranking,
        negatives=DEFAULT_NEGATIVES if args.ranking_negatives is None else args.ranking_negatives,
        seed=DEFAULT_RANKING_SEED if args.ranking_seed is None else args.ranking_seed,
        exclude_history=bool(args.ranking_exclude_history),
    )


def _run_evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.engine import evaluate

    ranking = ranking_settings(args)
    model: Any = args.model
    if given_head_options(args, "evaluate"):
        # Only the kind that added an option reads it (a gated head's --classify-attributes): another kind's report
        # ignored it, and said nothing. Checked on the loaded head, before a cluster starts, and handed on loaded.
        from dist_respattn.artifacts import load_checkpoint

        model = load_checkpoint(args.model, storage_options=parse_storage_options(args.storage_option))
        refuse_other_kinds_options(args, "evaluate", model.model, args.model)
    evaluation = evaluate(
        model,
        args.store,
        baseline_k=args.baseline_k,
        baseline_order=args.baseline_order,
        options=head_options(args, "evaluate"),
        cluster=cluster_options(args),
        storage_options=parse_storage_options(args.storage_option),
        say=_say(args),
        progress=None if not args.json else False,
        ranking=ranking,
    )
    return evaluation.to_json()


def _print_evaluate(report: dict[str, Any]) -> None:
    from dist_respattn.engine import Evaluation

    print(Evaluation.from_json(report).summary())


def _run_predict(args: argparse.Namespace) -> dict[str, Any]:
    from dist_respattn.engine import predict

    given = given_head_options(args, "predict")
    if given and not args.stream:
        # Predicting a store, a head predicts each row as the store holds it (a gated head, under the row's own
        # attribute): the kinds' options of predict say how to predict one history, and were ignored here.
        named = ", ".join(words for words, _ in given)
        kinds = " and ".join(dict.fromkeys(kind for _, kind in given))
        what, it = ("options", "them") if len(given) > 1 else ("an option", "it")
        raise CommandError(
            f"{named}: {what} of {kinds} heads for --stream (one history read from stdin); predicting a store, each "
            f"row is predicted as the store holds it: give --stream, or leave {it} out"
        )
    if args.stream:
        if args.out:
            raise CommandError("--stream writes JSON lines to stdout: give it or --out, not both")
        args.printer = print_stream_summary
        args.json_line = True  # the --json summary follows the token lines as one more line: stdout stays JSON lines
        return run_stream(args)
    if not args.out:
        raise CommandError(
            "predict needs --out FILE.jsonl, FILE.csv or DIR (a new zarr group for the predictions), or --stream"
        )
    run = predict(
        args.model,
        args.store,
        out=args.out,
        top_k=args.top,
        overwrite=args.overwrite,
        cluster=cluster_options(args),
        storage_options=parse_storage_options(args.storage_option),
        say=_say(args),
        progress=None if not args.json else False,
    )
    return run.to_json()


def _print_predict(report: dict[str, Any]) -> None:
    from dist_respattn.engine import PredictionRun

    print(PredictionRun(**report).summary())
