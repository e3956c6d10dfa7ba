"""Attribute-gated heads on real multi-author text: the Python standard library's packages as attributes.

Corpus: the ``.py`` files of ``--packages`` (19 packages of the library this Python runs,
``sysconfig.get_paths()["stdlib"]``, from sqlite3's 9 KB to asyncio's 0.5 MB), no ``test*`` directories, no
``__pycache__``; nothing is downloaded. Each package is one attribute ("who wrote it"): asyncio's futures and
loops, email's headers, tkinter's widgets.

- **Top-level packages, flattened.** A package's files are copied (text, never links: the text walker does
  not follow them) into ``corpus/<split>/<package>/``, a sub-package's path folded into the file name
  (``email/mime/text.py`` -> ``email/mime.text.NNN.py``), so ``ingest --attribute-by directory`` names
  each row by its top-level package. Kept as directories, sub-packages such as ``xml/parsers`` or
  ``ctypes/macholib`` would be attributes of one or two tiny files with no test document at all; the
  top-level package is the unit maintained (and written) together.
- **Documents are pieces of files.** A file is cut into pieces of about ``--piece-lines`` lines (120), each
  cut at a blank line followed by a top-level statement or a method (indent <= 4: ``def``, ``class``, ``@``,
  ...); a short tail joins the piece before it. Whole files would not do: ``logging`` is three files,
  ``collections`` two, and asyncio's ``base_events.py`` alone is 2,000 lines, so half the packages would
  have no test document and classification would score a handful of huge files.
- **Split per package, by a hash.** Each package's pieces are ordered by ``sha256("bench-attributes\\n"
  "<package>/<piece>")``; the first ``round(0.2 n)`` (at least one when n >= 2) go to test, the rest to
  train, so every package has test documents (``dist-respattn split --attribute-by`` keeps the
  attributes, but its hash split of whole files leaves 9 of these 19 packages without a test file, and it writes triple
  stores, which carry no documents to classify).
- **Held-out packages** (``--held-out``: wsgiref and ctypes) are not trained on at all: all their pieces
  go to a fold-in store.

The derived corpus is kept in ``--cache`` (keyed by the Python version, the packages and the piece rule).
Stores: ``dist-respattn ingest --text corpus/train --attribute-by directory --vocab-size V --context N`` (a
token-stream store, one piece a document), then the test and fold-in pieces ``--like`` it (its vocabulary,
embedding table and attribute ids; the held-out packages' names are appended).

What is measured, in one run (one ``--workers``-worker LocalCluster, which the commands join with ``--scheduler``):

1. **Fits.** The smallest gated fit runs on the command line, ``dist-respattn fit TRAIN --attribute-factors
   F0 --max-iter K --scheduler ADDRESS --json`` (F0 = the smallest of ``--factors``): the shared head (the default
   recipe: a 5% hold-out of the training rows, MAP smoothing) into ``MODEL/shared``, then the gated head.
   Every other gated head reuses that shared head (a copy of it as the fit's ended shared stage), fitted by
   ``fit(TRAIN, head=GatedSpec(F, ...), resume=True)`` on one cluster: F in ``--factors``, F = 0 (one
   emission per package, the untied baseline), the best F (by the fits' held-out perplexity) again with
   ``per_attribute=("position_prior",)``, and F = 4 with each package's own table beside the shared factors
   (``per_attribute=("emission",)``). Each gated fit starts from the shared head and stops early on the same
   held-out rows (``--max-iter``).
2. **Test perplexity** (``evaluate --classify-attributes``; ``evaluate(..., options={"classify_attributes":
   True})`` for the API fits): gated against the shared head on the same rows and against the corpus-wide
   interpolated Kneser-Ney bigram
   (tuned on the hold-out), per package against each package's own Kneser-Ney bigram; the parameters each
   head stores (``num_parameters()``) and its training rows/s (the median over the fit's iterations).
3. **Package classification** of every test document, by the gated head's posterior (uniform prior)
   against a **naive Bayes** baseline on the same documents: a unigram of the targets per package, counted on
   all the training store's rows, add-k smoothed with the stated k = ``--nb-k`` (0.1; nothing is tuned on
   test), uniform prior, each document scored by the sum of ``log P(target | package)`` over the same
   rows the head scores (windows of N). NB at k = 0.01 and 1 is printed beside, informational.
4. **Fold-in** of the held-out packages (``evaluate --fold-in`` on the fold-in store): EM on the new
   package's weights over half of its rows, the other half scored, against uniform weights and the shared
   head.
5. **E-step speed**, in this process on one thread, warm, best of ``--repeats``, on the same first
   ``--estep-rows`` training rows: ``gated_estep`` of every fitted gated head against the shared head's
   ``ResponsibilityAttentionAccumulator.seq_update`` in the layout its fit chose (and, informational,
   sparse on the gated heads' support, and ``gated_estep`` of the shared head as a one-factor gated head,
   whose statistics must equal the accumulator's).
6. **Samples and neighbours** of the best gated head on the command line: ``dist-respattn sample MODEL
   --attribute NAME --tokens 40 --seed S`` (two seeds; from a document's opening, else from ``--prompt``
   with the opening lines of one of its test pieces when that fails) for the three packages with the most
   training rows, one ``--mix`` of two of them, and ``dist-respattn neighbours MODEL WORD --top 5`` for
   "self", "return" and "(".

Targets (printed with MET/MISSED, measured, never asserted): the best gated head (by held-out
perplexity) at least 5% below the shared head on test (ratio <= 0.95), below the untied baseline,
classifying at least as well as naive Bayes, and its E-step at F = 4 at least half the shared head's rows/s.

Run::

    python benchmarks/bench_attributes.py --cache /work/qcache/attributes --json   # a few minutes on 2 cores
    python benchmarks/bench_attributes.py --smoke --json                          # 3 small packages, < 1 min

``--smoke`` makes its small sizes the defaults; a flag given beside it wins (``--smoke --max-iter 1``). Worker
processes are spawned, so everything runs under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os

# One thread for every in-process path (the kernels are single-threaded; this keeps NumPy on one core too).
# Must happen before NumPy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import max_relative_difference, time_once  # noqa: E402

#: Trained packages: a range of sizes (sqlite3 9 KB ... asyncio 490 KB of source).
PACKAGES = (
    "asyncio", "email", "tkinter", "xml", "multiprocessing", "unittest", "importlib", "http", "logging", "urllib",
    "re", "concurrent", "collections", "json", "zoneinfo", "tomllib", "curses", "dbm", "sqlite3",
)  # fmt: skip
#: Never trained on: folded in at evaluation.
HELD_OUT = ("wsgiref", "ctypes")
FACTORS = (2, 4, 8, 16)
TEST_SHARE = 0.2
PIECE_LINES = 120
#: The words whose neighbours are listed.
WORDS = ("self", "return", "(")
#: Naive Bayes add-k values printed beside the stated one (informational, all on test).
NB_K_SENSITIVITY = (0.01, 0.1, 1.0)
#: Bump when the corpus rule changes (part of the cache key).
CORPUS_VERSION = 1

TARGET_GATED_OVER_SHARED = 0.95
TARGET_ESTEP_FACTORS = 4
TARGET_ESTEP_RATIO = 0.5

SMOKE = {
    "packages": "json,tomllib,zoneinfo",
    "held_out": "wsgiref",
    "vocab_size": 300,
    "factors": "2",
    "max_iter": 2,
    "per_attribute": False,
    "estep_rows": 20_000,
    "repeats": 1,
    "min_seconds": 0.0,
    "samples": 1,
    "partition_rows": 8192,
    "fold_in_iterations": 2,
}

BIN = Path(sys.executable).parent
CLI = [str(BIN / "dist-respattn")] if (BIN / "dist-respattn").exists() else [
    sys.executable, "-c", "import sys; from dist_respattn.cli import main; sys.exit(main())"
]  # fmt: skip


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ corpus


def package_files(root: Path, package: str) -> list[Path]:
    """The package's ``.py`` files, sorted: no ``test*`` directory, no ``__pycache__``, no links."""
    base = root / package
    if not base.is_dir():
        raise SystemExit(f"{base}: no such package in this Python's standard library")
    files = []
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).parts
        if any(p == "__pycache__" or p.startswith("test") or p == "idle_test" for p in parts[:-1]):
            continue
        if path.is_symlink() or not path.is_file():
            continue
        files.append(path)
    return files


def cut_pieces(text: str, piece_lines: int) -> list[str]:
    """``text`` in pieces of at least ``piece_lines`` lines, each cut before a top-level statement or a method
    (a line with indent <= 4 after a blank line); a tail under a third of that joins the piece before it."""
    lines = text.splitlines(keepends=True)
    cuts = [0]
    for i in range(1, len(lines)):
        if i - cuts[-1] < piece_lines or lines[i - 1].strip():
            continue
        stripped = lines[i].lstrip(" ")
        indent = len(lines[i]) - len(stripped)
        opens = stripped[:1].isalpha() or stripped[:1] in ("_", "@")
        if opens and (indent == 0 or (indent <= 4 and stripped.startswith(("def ", "async def ", "class ", "@")))):
            cuts.append(i)
    if len(cuts) > 1 and len(lines) - cuts[-1] < piece_lines // 3:
        cuts.pop()
    cuts.append(len(lines))
    pieces = ["".join(lines[a:b]) for a, b in itertools.pairwise(cuts)]
    return [piece for piece in pieces if piece.strip()]


def piece_hash(package: str, name: str) -> str:
    return hashlib.sha256(f"bench-attributes\n{package}/{name}".encode()).hexdigest()


def build_corpus(args: argparse.Namespace) -> dict[str, Any]:
    """The pieces of the packages in ``--cache`` (``corpus/{train,test,foldin}/<package>/``), built once."""
    root = Path(sysconfig.get_paths()["stdlib"])
    key = json.dumps([
        CORPUS_VERSION, platform.python_version(), str(root), args.packages, args.held_out, args.piece_lines,
        TEST_SHARE,
    ])  # fmt: skip
    folder = Path(args.cache) / f"stdlib-pieces-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        say(f"corpus: {folder} (cached)")
        manifest = json.loads(manifest_path.read_text())
        manifest["cached"] = True
        return manifest
    say(f"corpus: cutting {len(args.packages) + len(args.held_out)} packages of {root} into {folder}")
    if folder.exists():
        shutil.rmtree(folder)
    packages: dict[str, dict[str, Any]] = {}
    for package in [*args.packages, *args.held_out]:
        held = package in args.held_out
        files = package_files(root, package)
        pieces = []
        for path in files:
            flat = ".".join(path.relative_to(root / package).with_suffix("").parts)
            text = path.read_text(encoding="utf-8", errors="replace")
            for k, piece in enumerate(cut_pieces(text, args.piece_lines)):
                pieces.append((f"{flat}.{k:03d}.py", piece))
        pieces.sort(key=lambda p: piece_hash(package, p[0]))
        n = len(pieces)
        n_test = 0 if held or n < 2 else min(n - 1, max(1, round(TEST_SHARE * n)))
        sides: dict[str, list[int]] = {"train": [], "test": [], "foldin": []}
        for i, (name, piece) in enumerate(pieces):
            side = "foldin" if held else ("test" if i < n_test else "train")
            out = folder / "corpus" / side / package
            out.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(piece, encoding="utf-8")
            sides[side].append(len(piece.encode()))
        packages[package] = {
            "held_out": held,
            "files": len(files),
            "bytes": int(sum(p.stat().st_size for p in files)),
            **{f"{side}_pieces": len(v) for side, v in sides.items()},
            **{f"{side}_bytes": int(sum(v)) for side, v in sides.items()},
        }
    manifest = {
        "root": str(root),
        "python": platform.python_version(),
        "folder": str(folder),
        "corpus": str(folder / "corpus"),
        "piece_lines": args.piece_lines,
        "test_share": TEST_SHARE,
        "packages": packages,
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")  # last: the mark of a complete corpus
    manifest["cached"] = False
    return manifest


# ------------------------------------------------------------------------------------------ command line


def run_cli(*argv: str, what: str, check: bool = True) -> dict[str, Any]:
    """``dist-respattn ARGV... --json``: ``{"report": its JSON or None, "seconds", "returncode", "error"}``."""
    started = time.perf_counter()
    completed = subprocess.run([*CLI, *argv, "--json"], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    error = None
    if completed.returncode != 0:
        lines = [line for line in completed.stderr.strip().splitlines() if line.strip()]
        error = lines[-1] if lines else f"exit status {completed.returncode}"
        if check:
            raise RuntimeError(
                f"{what}: dist-respattn {' '.join(argv)} failed (exit {completed.returncode}):\n"
                f"{completed.stderr[-4000:]}"
            )
    report = json.loads(completed.stdout) if completed.returncode == 0 else None
    return {"report": report, "seconds": seconds, "returncode": completed.returncode, "error": error}


def write_stores(args: argparse.Namespace, corpus: dict[str, Any], work: Path) -> dict[str, Any]:
    """The train, test and fold-in token-stream stores (``ingest --text --attribute-by directory``)."""
    text = Path(corpus["corpus"])
    layout = ("--chunk-rows", str(max(1, args.partition_rows // 2)), "--partition-rows", str(args.partition_rows))
    stores: dict[str, Any] = {}
    train = work / "stores" / "train.zarr"
    made = run_cli(
        "ingest", "--text", str(text / "train"), "--attribute-by", "directory", "--vocab-size", str(args.vocab_size),
        "--context", str(args.context), *layout, "--overwrite", str(train), what="ingest train",
    )  # fmt: skip
    stores["train"] = {"path": str(train), "seconds": made["seconds"], **ingest_figures(made["report"])}
    for side in ("test", "foldin"):
        if not (text / side).is_dir():
            continue
        out = work / "stores" / f"{side}.zarr"
        made = run_cli(
            "ingest", "--text", str(text / side), "--attribute-by", "directory", "--like", str(train), *layout,
            "--overwrite", str(out), what=f"ingest {side}",
        )  # fmt: skip
        stores[side] = {"path": str(out), "seconds": made["seconds"], **ingest_figures(made["report"])}
    from dist_respattn.store.rows import open_store

    for side, record in stores.items():
        store = open_store(record["path"], window=args.context)
        record["attribute_names"] = list(store.attribute_names or ())
        record["rows"] = int(store.num_rows)
        record["partitions"] = int(store.num_partitions)
        say(
            f"store {side}: {record['tokens']:,} tokens, {record['documents']:,} documents, {record['rows']:,} rows "
            f"in {record['partitions']} partitions, {len(record['attribute_names'])} attribute names "
            f"({record['seconds']:.1f} s)"
        )
    return stores


def ingest_figures(report: dict[str, Any]) -> dict[str, Any]:
    return {k: report.get(k) for k in ("tokens", "documents", "num_symbols", "context_length", "query_dim")}


# ------------------------------------------------------------------------------------------ fits


def median_rate(history: list[dict[str, Any]]) -> float | None:
    rates = [h["rows_per_second"] for h in history if h.get("rows_per_second")]
    return float(np.median(rates)) if rates else None


def fit_record(
    label: str, factors: int, per_attribute: tuple[str, ...], via: str, model_dir: Path, history: list[dict],
    best_iteration: int | None, state: Any, parameters: int, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    best = next((h for h in history if h["iteration"] == best_iteration), None)
    return {
        "label": label,
        "factors": factors,
        "untied": factors == 0,
        "per_attribute": list(per_attribute),
        "via": via,
        "model_dir": str(model_dir),
        "parameters": int(parameters),
        "iterations": len(history),
        "best_iteration": best_iteration,
        "state": str(getattr(state, "value", state)),
        "heldout_perplexity": None if best is None else best["heldout"]["perplexity"],
        "first_heldout_perplexity": history[0]["heldout"]["perplexity"] if history else None,
        "prior_scale": None if best is None else (best.get("hyperparameters") or {}).get("prior_scale"),
        "rows_per_second": median_rate(history),
        "fit_seconds": float(seconds),
        "history": history,
    }


def label_of(factors: int, per_attribute: tuple[str, ...] = ()) -> str:
    base = "untied (F = 0)" if factors == 0 else f"gated F = {factors}"
    if "emission" in per_attribute:
        base += " + own tables"
    return base + (" + per-package prior" if "position_prior" in per_attribute else "")


def cli_fit(
    args: argparse.Namespace, stores: dict[str, Any], work: Path, address: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The smallest gated fit (and the shared head) on the command line, on the run's cluster at ``address``."""
    factors = min(args.factors)
    model_dir = work / "models" / f"f{factors}"
    say(f"fit on the command line: --attribute-factors {factors} (the shared head first, into {model_dir}/shared)")
    made = run_cli(
        "fit", stores["train"]["path"], "--model-dir", str(model_dir), "--attribute-factors", str(factors),
        "--max-iter", str(args.max_iter), "--scheduler", address, "--overwrite", what="fit",
    )  # fmt: skip
    report = made["report"]
    record = fit_record(
        label_of(factors), factors, (), "cli", model_dir, report["history"], report["best_iteration"],
        report["state"], report["parameters"], report["seconds"],
    )  # fmt: skip
    record["command_seconds"] = made["seconds"]
    shared = dict(report["shared"])
    say(
        f"  shared head: {shared['state']} after {shared['iterations']} iterations, held-out perplexity "
        f"{shared['heldout_perplexity']:.3f}; gated F = {factors}: {record['state']} after {record['iterations']}, "
        f"held-out {record['heldout_perplexity']:.3f} ({made['seconds']:.1f} s)"
    )
    return record, shared


def api_fit(
    client: Any, args: argparse.Namespace, stores: dict[str, Any], work: Path, shared_dir: str, factors: int,
    per_attribute: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    from dist_respattn.engine import FitSettings, fit
    from dist_respattn.model.heads.gated.kind import GatedSpec

    suffix = "".join(f"-{name}" for name in per_attribute)
    model_dir = work / "models" / f"f{factors}{suffix}"
    label = label_of(factors, per_attribute)
    say(f"fit: {label}")
    # The command line's settings: the shared stage's loop and head, and the gated stage's --max-iter.
    settings = FitSettings(max_iter=args.max_iter)
    spec = GatedSpec(
        factors, per_attribute=per_attribute, shared=settings.head_spec(), stage_settings={"max_iter": args.max_iter}
    )
    # Every gated head starts from the command line's shared head: a copy of it as this fit's shared stage, which
    # the resumed fit finds ended and does not continue.
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.copytree(shared_dir, model_dir / "shared")
    result = fit(
        stores["train"]["path"], model_dir=model_dir, settings=settings, head=spec, resume=True, client=client,
        progress=False, say=lambda m: say(f"    {m}"),
    )  # fmt: skip
    record = fit_record(
        label, factors, per_attribute, "api", model_dir, result.history, result.best_iteration, result.state,
        result.model.num_parameters(), result.seconds,
    )  # fmt: skip
    say(
        f"  {label}: {record['state']} after {record['iterations']} iterations, held-out perplexity "
        f"{record['heldout_perplexity']:.3f} (first {record['first_heldout_perplexity']:.3f}), "
        f"{record['fit_seconds']:.1f} s"
    )
    return record


def evaluation_figures(tested: dict[str, Any], folded: dict[str, Any] | None) -> dict[str, Any]:
    """What the tables need of ``evaluate``'s reports on the test store and on the fold-in store."""
    model, shared = tested["model"], tested["shared"]
    documents = tested.get("documents") or []
    return {
        "test_rows": model["rows"],
        "test_perplexity": model["perplexity"],
        "shared_same_rows": model["perplexity_shared_same_rows"],
        "over_shared": model["perplexity"] / model["perplexity_shared_same_rows"],
        "attribute_accuracy": tested.get("attribute_accuracy"),
        "classified_documents": tested.get("classified_documents"),
        "by_attribute": tested["by_attribute"],
        "documents": [
            {k: d[k] for k in ("document", "rows", "attribute", "predicted", "posterior_top")} for d in documents
        ],
        "shared": {
            "perplexity": shared["model"]["perplexity"],
            "rows": shared["rows"],
            "baselines": {k: v["perplexity"] for k, v in shared["baselines"].items()},
            "baseline_parameters": {k: v.get("parameters") for k, v in shared["baselines"].items()},
        },
        "fold_in": (folded or {}).get("fold_in") or {},
    }


def evaluate_api(client: Any, args: argparse.Namespace, stores: dict[str, Any], model_dir: str) -> dict[str, Any]:
    from dist_respattn.engine import evaluate

    def quiet(message: str) -> None:
        pass

    tested = evaluate(
        model_dir,
        stores["test"]["path"],
        options={"classify_attributes": True},
        client=client,
        progress=False,
        say=quiet,
    ).to_json()
    folded = None
    if "foldin" in stores:
        options = {"fold_in": True, "fold_in_iterations": args.fold_in_iterations}
        folded = evaluate(
            model_dir, stores["foldin"]["path"], options=options, client=client, progress=False, say=quiet
        ).to_json()
    return evaluation_figures(tested, folded)


def evaluate_cli(args: argparse.Namespace, stores: dict[str, Any], model_dir: str, address: str) -> dict[str, Any]:
    cluster = ("--scheduler", address)
    tested = run_cli(
        "evaluate", model_dir, stores["test"]["path"], "--classify-attributes", *cluster, what="evaluate test"
    )
    folded = None
    if "foldin" in stores:
        folded = run_cli(
            "evaluate", model_dir, stores["foldin"]["path"], "--fold-in", "--fold-in-iterations",
            str(args.fold_in_iterations), *cluster, what="evaluate fold-in",
        )["report"]  # fmt: skip
    figures = evaluation_figures(tested["report"], folded)
    figures["command_seconds"] = tested["seconds"]
    return figures


def fits_part(args: argparse.Namespace, stores: dict[str, Any], work: Path) -> dict[str, Any]:
    from dist_respattn.engine import ClusterOptions, connect

    # One cluster for the whole run: the commands join it (--scheduler) rather than each starting its own.
    with connect(ClusterOptions(n_workers=args.workers), say=lambda m: say(f"  {m}")) as client:
        address = client.scheduler.address
        first, shared = cli_fit(args, stores, work, address)
        shared_dir = shared["model_dir"]
        say("evaluate on the command line (test: --classify-attributes; fold-in store: --fold-in)")
        first.update(evaluate_cli(args, stores, first["model_dir"], address))
        models = [first]
        for factors in [*sorted(set(args.factors) - {first["factors"]}), *([0] if args.untied else [])]:
            models.append(api_fit(client, args, stores, work, shared_dir, factors))
            models[-1].update(evaluate_api(client, args, stores, models[-1]["model_dir"]))
        gated = [m for m in models if not m["untied"]]
        best_factors = min(gated, key=lambda m: m["heldout_perplexity"])["factors"]
        if args.per_attribute:
            models.append(api_fit(client, args, stores, work, shared_dir, best_factors, ("position_prior",)))
            models[-1].update(evaluate_api(client, args, stores, models[-1]["model_dir"]))
        if args.own_tables:
            # Each package's own table beside the smallest F's shared factors (--per-attribute emission).
            own_factors = TARGET_ESTEP_FACTORS if TARGET_ESTEP_FACTORS in args.factors else min(args.factors)
            models.append(api_fit(client, args, stores, work, shared_dir, own_factors, ("emission",)))
            models[-1].update(evaluate_api(client, args, stores, models[-1]["model_dir"]))
    models.sort(key=lambda m: (m["untied"], m["factors"], len(m["per_attribute"])))
    gated = [m for m in models if not m["untied"]]
    best = min(gated, key=lambda m: m["heldout_perplexity"])
    for m in models:
        m["best"] = m is best
    from dist_respattn.engine import load_checkpoint

    shared_model = load_checkpoint(shared_dir).model
    shared["parameters"] = shared_parameters(shared_model)
    shared["emission_layout"] = emission_layout(shared_model)
    shared["test"] = first["shared"]
    return {"shared": shared, "models": models, "best": best["label"]}


def emission_layout(model: Any) -> str:
    from dist_respattn.model.emission.layouts import SparseEmission

    return "sparse" if isinstance(model.emission_table, SparseEmission) else "dense"


def shared_parameters(model: Any) -> int:
    """Parameters the shared head stores: keys, position prior, and its emission (S x T dense; values and
    backoffs on its support when sparse)."""
    table = model.emission_table
    sparse = emission_layout(model) == "sparse"
    emission = table.values.size + table.backoff.size if sparse else model.num_symbols * model.num_targets
    return int(model.key_means.size + np.asarray(model.position_prior).size + emission)


# ------------------------------------------------------------------------------------------ naive Bayes


def read_targets(path: str, window: int, block: int = 1 << 16) -> dict[str, np.ndarray]:
    """Every row's target, attribute and document of the store read with windows of N (min_context N), as the
    engine's passes read it."""
    from dist_respattn.store.rows import open_store

    store = open_store(path, window=window)
    targets, attributes, documents = [], [], []
    for begin in range(0, store.num_rows, block):
        end = min(begin + block, store.num_rows)
        targets.append(np.asarray(store.read_rows(begin, end).target, dtype=np.int64))
        attributes.append(store.read_attributes(begin, end).astype(np.int64))
        documents.append(store.read_documents(begin, end))
    return {
        "target": np.concatenate(targets),
        "attribute": np.concatenate(attributes),
        "document": np.concatenate(documents),
        "num_targets": np.int64(store.schema.num_targets),
    }


def naive_bayes_part(args: argparse.Namespace, stores: dict[str, Any], fits: dict[str, Any]) -> dict[str, Any]:
    """Each test document's package by a unigram per package (add-k, uniform prior), on the documents the gated
    heads classified."""
    train = read_targets(stores["train"]["path"], args.context)
    test = read_targets(stores["test"]["path"], args.context)
    names = stores["train"]["attribute_names"]
    a, t = len(names), int(train["num_targets"])
    counts = np.zeros((a, t))
    np.add.at(counts, (train["attribute"], train["target"]), 1.0)
    documents, inverse = np.unique(test["document"], return_inverse=True)
    per_document = np.zeros((documents.size, t))
    np.add.at(per_document, (inverse, test["target"]), 1.0)
    truth = np.zeros(documents.size, dtype=np.int64)
    truth[inverse] = test["attribute"]
    rows = per_document.sum(axis=1)
    # The documents the gated heads classified (the first model's list; every model scores the same store).
    classified = fits["models"][0]["documents"]
    listed = {d["document"]: d for d in classified}
    index = {int(d): i for i, d in enumerate(documents)}
    same = set(listed) == set(index) and all(int(rows[index[d]]) == listed[d]["rows"] for d in listed)
    keep = np.array([index[d] for d in sorted(listed) if d in index and listed[d]["attribute"] in names], np.int64)

    def accuracy(k: float) -> tuple[float, np.ndarray]:
        log_p = np.log(counts + k) - np.log(counts.sum(axis=1, keepdims=True) + k * t)
        predicted = np.argmax(per_document[keep] @ log_p.T, axis=1)
        return float(np.mean(predicted == truth[keep])), predicted

    stated, predicted = accuracy(args.nb_k)
    sensitivity = {str(k): accuracy(k)[0] for k in NB_K_SENSITIVITY}
    confusions = [
        {"document": int(documents[i]), "attribute": names[int(truth[i])], "predicted": names[int(p)]}
        for i, p in zip(keep, predicted, strict=True)
        if p != truth[i]
    ]
    say(f"naive Bayes (k = {args.nb_k}): {stated:.1%} of {keep.size} test documents")
    return {
        "k": args.nb_k,
        "accuracy": stated,
        "documents": int(keep.size),
        "same_documents_as_gated": bool(same),
        "train_rows_per_attribute": {n: int(c) for n, c in zip(names, counts.sum(axis=1), strict=True)},
        "accuracy_by_k_informational": sensitivity,
        "errors": confusions,
    }


# ------------------------------------------------------------------------------------------ E-step speed


def best_rate(run: Callable[[], Any], rows: int, repeats: int, min_seconds: float) -> dict[str, Any]:
    """Rows/s of ``run`` (warm): each timed run loops until it lasts ``min_seconds``; the best of ``repeats``."""
    first, _ = time_once(run)
    loops = max(1, math.ceil(min_seconds / max(first, 1e-9))) if min_seconds > 0 else 1
    best = first if loops == 1 else math.inf
    for _ in range(repeats if loops > 1 else repeats - 1):
        started = time.perf_counter()
        for _ in range(loops):
            run()
        best = min(best, (time.perf_counter() - started) / loops)
    return {"rows": rows, "seconds": best, "loops": loops, "rows_per_s": rows / best}


def estep_part(args: argparse.Namespace, stores: dict[str, Any], fits: dict[str, Any]) -> dict[str, Any]:
    from dist_respattn.engine import load_checkpoint
    from dist_respattn.model.emission.layouts import PairSupport, SparseEmission
    from dist_respattn.model.heads.gated.head import GatedHead, gated_estep
    from dist_respattn.store import open_store

    store = open_store(stores["train"]["path"], window=args.context)
    n = min(args.estep_rows, store.num_rows)
    rows = store.read_rows(0, n)
    attribute = store.read_attributes(0, n).astype(np.int64)
    batch = (rows.context, rows.query, rows.target)
    shared = load_checkpoint(fits["shared"]["model_dir"]).model
    layout = emission_layout(shared)
    say(f"E-step speed: {n:,} training rows, one thread, best of {args.repeats}")

    def shared_run(model: Any = shared, layout: str = layout) -> Any:
        accumulator = model.estimator().accumulator_factory(layout=layout).make_for(model)
        accumulator.seq_update(batch, None, model, checked=rows.checked)
        return accumulator

    def gated_run(head: Any) -> Callable[[], Any]:
        return lambda: gated_estep(head, batch, attribute, None, values_checked=rows.checked)

    one_factor = GatedHead.from_shared(shared, len(stores["train"]["attribute_names"]))
    # Warm up (compile, or load numba's cache) before anything is timed; the one-factor gated E-step of the
    # shared head must give the accumulator's statistics.
    value = shared_run().value()
    stats = gated_run(one_factor)()
    agreement = max_relative_difference(
        [value.key_sum, value.key_mass, np.ravel(value.position_count), [value.log_lik]],
        [stats.key_sum, stats.key_mass, np.ravel(stats.position_count), [stats.log_lik]],
    )
    gc.collect()
    reference = best_rate(shared_run, n, args.repeats, args.min_seconds)
    out: dict[str, Any] = {
        "rows": n,
        "shared_layout": layout,
        "shared": reference,
        "shared_as_one_factor_gated": best_rate(gated_run(one_factor), n, args.repeats, args.min_seconds),
        "one_factor_agreement": agreement,
        "gated": [],
    }
    one = out["shared_as_one_factor_gated"]["rows_per_s"]
    say(
        f"  shared ({layout}): {reference['rows_per_s']:,.0f} rows/s; as a one-factor gated head: {one:,.0f} rows/s "
        f"(statistics agree to {agreement:.1e})"
    )
    support = None
    for m in fits["models"]:
        if "position_prior" in m["per_attribute"]:  # the same factors as its F's fit
            continue
        head = load_checkpoint(m["model_dir"]).model
        support = head.factors.support
        rate = best_rate(gated_run(head), n, args.repeats, args.min_seconds)
        out["gated"].append({
            "label": m["label"], "factors": m["factors"], "num_factors": head.num_factors, **rate,
            "over_shared": rate["rows_per_s"] / reference["rows_per_s"],
        })  # fmt: skip
        say(f"  {m['label']}: {rate['rows_per_s']:,.0f} rows/s ({out['gated'][-1]['over_shared']:.2f}x shared)")
    if layout == "dense" and support is not None:
        # The gated support holds the pairs of the training side of the hold-out; the sparse accumulator needs
        # every pair of the timed rows (the hold-out's included), so theirs are added.
        s = shared.num_symbols
        cells = [support.keys()]
        for start in range(0, n, 1 << 16):
            block = rows.context[start : start + (1 << 16)]
            cells.append(np.unique(rows.target[start : start + (1 << 16), None].astype(np.int64) * s + block))
        union = PairSupport.from_keys(np.unique(np.concatenate(cells)), s, shared.num_targets)
        sparse = shared.with_emission(SparseEmission.from_dense(shared.emission, union))
        shared_run(sparse, "sparse")  # warm
        out["shared_sparse_on_gated_support"] = {
            **best_rate(lambda: shared_run(sparse, "sparse"), n, args.repeats, args.min_seconds),
            "pairs": int(union.num_pairs),
        }
    # The target is the F-factor gated head's (no own tables: those cost as many factors as they hold per row).
    measured = [g for g in out["gated"] if 0 < g["factors"] == g["num_factors"]]
    chosen = min(measured, key=lambda g: (abs(g["factors"] - TARGET_ESTEP_FACTORS), g["factors"]), default=None)
    out["target_factors"] = None if chosen is None else chosen["factors"]
    out["target_ratio"] = None if chosen is None else chosen["over_shared"]
    return out


# ------------------------------------------------------------------------------------------ samples


def prompt_text(corpus: dict[str, Any], package: str, context: int) -> str:
    """The opening lines of the package's first test piece (or training piece) with at least N tokens."""
    from dist_respattn.store.ingest.text import tokenize

    for side in ("test", "train"):
        folder = Path(corpus["corpus"]) / side / package
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
            lines = path.read_text(encoding="utf-8").splitlines()
            for stop in range(4, len(lines) + 4, 4):
                text = "\n".join(lines[:stop])
                if len(tokenize(text)) >= 2 * context:
                    return text
    raise RuntimeError(f"{package}: no piece with {context} tokens to prompt with")


def samples_part(
    args: argparse.Namespace, corpus: dict[str, Any], fits: dict[str, Any], naive_bayes: dict[str, Any]
) -> dict[str, Any]:
    best = next(m for m in fits["models"] if m["best"])
    model_dir = best["model_dir"]
    by_rows = naive_bayes["train_rows_per_attribute"]
    chosen = sorted(by_rows, key=lambda n: (-by_rows[n], n))[:3]
    say(f"samples and neighbours of {best['label']} on the command line: {', '.join(chosen)}")
    samples, prompt_error = [], None
    for name in chosen:
        for seed in range(args.samples):
            base = ("sample", model_dir, "--attribute", name, "--tokens", str(args.sample_tokens), "--seed", str(seed))
            mode = "document opening"
            if prompt_error is None:
                made = run_cli(*base, what="sample", check=False)
                if made["returncode"] != 0:
                    prompt_error = made["error"]
                    say(f"  sample without --prompt failed ({made['error']}); prompting with a piece's opening")
            if prompt_error is not None:
                made = run_cli(*base, "--prompt", prompt_text(corpus, name, args.context), what="sample --prompt")
                mode = "--prompt"
            report = made["report"]
            samples.append({
                "attribute": name, "seed": seed, "prompt_from": mode, "prompt": report["prompt"],
                "text": report["text"], "tokens": len(report["tokens"]),
            })  # fmt: skip
    mix = f"{chosen[0]}=0.5,{chosen[-1]}=0.5"
    base = ("sample", model_dir, "--mix", mix, "--tokens", str(args.sample_tokens), "--seed", "0")
    if prompt_error is None:
        made = run_cli(*base, what="sample --mix")
    else:
        made = run_cli(*base, "--prompt", prompt_text(corpus, chosen[0], args.context), what="sample --mix")
    mixed = {"mix": mix, "text": made["report"]["text"], "prompt": made["report"]["prompt"]}
    neighbours: dict[str, Any] = {}
    for word in WORDS:
        made = run_cli("neighbours", model_dir, word, "--top", "5", what="neighbours", check=False)
        if made["report"] is None:
            neighbours[word] = {"error": made["error"]}
            continue
        found = made["report"]["neighbours"]
        neighbours[word] = {name: found[name] for name in chosen if name in found}
    return {
        "model": best["label"],
        "attributes": chosen,
        "samples": samples,
        "mix": mixed,
        "sample_without_prompt_error": prompt_error,
        "neighbours": neighbours,
    }


# ------------------------------------------------------------------------------------------ report


def targets_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    models = report["fits"]["models"]
    best = next(m for m in models if m["best"])
    untied = next((m for m in models if m["untied"]), None)
    nb = report["naive_bayes"]
    estep = report["estep"]
    ratio = best["over_shared"]
    over_untied = None if untied is None else best["test_perplexity"] / untied["test_perplexity"]
    accuracy = best["attribute_accuracy"]
    speed = estep["target_ratio"]
    return [
        {
            "name": f"best gated ({best['label']}) / shared, test perplexity",
            "target": f"<= {TARGET_GATED_OVER_SHARED}",
            "measured": ratio,
            "pass": bool(ratio <= TARGET_GATED_OVER_SHARED),
        },
        {
            "name": "best gated / untied (F = 0), test perplexity",
            "target": "< 1",
            "measured": over_untied,
            "pass": None if over_untied is None else bool(over_untied < 1.0),
        },
        {
            "name": f"best gated classification accuracy vs naive Bayes (k = {nb['k']:g}, {nb['accuracy']:.3f})",
            "target": f">= {nb['accuracy']:.3f}",
            "measured": accuracy,
            "pass": None if accuracy is None else bool(accuracy >= nb["accuracy"]),
        },
        {
            "name": f"gated E-step rows/s at F = {estep['target_factors']} / shared ({estep['shared_layout']})",
            "target": f">= {TARGET_ESTEP_RATIO}",
            "measured": speed,
            "pass": None if speed is None else bool(speed >= TARGET_ESTEP_RATIO),
        },
    ]


def cell(value: Any, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def format_report(report: dict[str, Any]) -> str:
    corpus, stores, host = report["corpus"], report["stores"], report["host"]
    fits, cfg = report["fits"], report["config"]
    shared = fits["shared"]
    kn = shared["test"]["baselines"]["kneser_ney"]
    trained = [p for p, v in corpus["packages"].items() if not v["held_out"]]
    held = [p for p, v in corpus["packages"].items() if v["held_out"]]
    lines = [
        f"dist_respattn attribute-gated heads on the Python {corpus['python']} standard library's source, "
        "one package an attribute",
        f"  corpus     {len(trained)} packages trained on, {len(held)} held out ({', '.join(held) or '-'}); files cut "
        f"into pieces of ~{corpus['piece_lines']} lines (one piece a document), {corpus['test_share']:.0%} of each "
        "package's pieces to test",
        f"  stores     vocabulary {cfg['vocab_size']} + OOV, N = {cfg['context']}; "
        + "; ".join(
            f"{side} {s['tokens']:,} tokens / {s['documents']:,} docs / {s['rows']:,} rows"
            for side, s in stores.items()
        ),
        f"  host       {host['cpu_count']} cores, {cfg['workers']} workers; load average before "
        f"{host['load_before']:.2f}, after {host['load_after']:.2f}; python {host['python']}, numpy {host['numpy']}, "
        f"numba {host['numba']}",
        "",
        f"{'package':<16}{'files':>6}{'KB':>6}{'pieces':>8}{'train':>7}{'test':>6}{'train rows':>12}",
    ]
    rows = report["naive_bayes"]["train_rows_per_attribute"]
    for name, p in corpus["packages"].items():
        pieces = p["train_pieces"] + p["test_pieces"] + p["foldin_pieces"]
        split = f"{'held out (fold-in)':>25}" if p["held_out"] else (
            f"{p['train_pieces']:>7}{p['test_pieces']:>6}{rows.get(name, 0):>12,}"
        )  # fmt: skip
        lines.append(f"{name:<16}{p['files']:>6}{p['bytes'] // 1000:>6}{pieces:>8}{split}")

    # Fits and test perplexity.
    lines += [
        "",
        f"fits (max_iter {cfg['max_iter']}, early stopping on the shared fit's hold-out) and test perplexity "
        f"({fits['models'][0]['test_rows']:,.0f} rows); shared head: {shared['state']} after {shared['iterations']} "
        f"iterations, {shared['emission_layout']} emission",
    ]
    header = (
        f"{'model':<34}{'via':>4}{'params':>11}{'iters':>6}{'best':>5}{'kappa':>7}{'rows/s':>10}{'fit s':>7}"
        f"{'held-out':>10}{'test':>9}{'/shared':>9}{'/KN':>7}{'accuracy':>10}"
    )
    lines += [header, "-" * len(header)]
    lines.append(
        f"{'shared head':<34}{'cli':>4}{shared['parameters']:>11,}{shared['iterations']:>6}{'':>29}"
        f"{shared['heldout_perplexity']:>10.3f}{shared['test']['perplexity']:>9.3f}{1.0:>9.3f}"
        f"{shared['test']['perplexity'] / kn:>7.3f}{'':>10}"
    )
    for m in fits["models"]:
        mark = "  <- best (held-out)" if m["best"] else ""
        lines.append(
            f"{m['label']:<34}{m['via']:>4}{m['parameters']:>11,}{m['iterations']:>6}"
            f"{cell(m['best_iteration'], 'd', 5)}{cell(m['prior_scale'], 'g', 7)}"
            f"{cell(m['rows_per_second'], ',.0f', 10)}{m['fit_seconds']:>7.1f}{m['heldout_perplexity']:>10.3f}"
            f"{m['test_perplexity']:>9.3f}{m['over_shared']:>9.3f}{m['test_perplexity'] / kn:>7.3f}"
            f"{cell(m['attribute_accuracy'], '.3f', 10)}{mark}"
        )
    base = shared["test"]["baselines"]
    lines.append(
        "  baselines on the same test rows: "
        + ", ".join(f"{k.replace('_', '-')} {v:.3f}" for k, v in base.items())
        + " (corpus-wide, tuned on the hold-out)"
    )
    lines.append(
        "  held-out: the fit's best perplexity on the shared fit's hold-out (first gated iteration: "
        + ", ".join(f"F={m['factors']} {m['first_heldout_perplexity']:.2f}" for m in fits["models"] if m["history"])
        + "); kappa: the factors' prior scale at the best iteration; rows/s: median over the fit's iterations "
        "(E-step, M-step and scoring)"
    )

    # Per attribute, best model.
    best = next(m for m in fits["models"] if m["best"])
    untied = next((m for m in fits["models"] if m["untied"]), None)
    lines += [
        "",
        f"test perplexity per package: {best['label']} (best) against the shared head, the untied heads and each "
        "package's own Kneser-Ney bigram (trained on its rows)",
    ]
    header = (
        f"{'package':<16}{'rows':>8}{'gated':>9}{'shared':>9}{'untied':>9}{'own KN':>9}{'g/shared':>10}{'g/own KN':>10}"
    )
    lines += [header, "-" * len(header)]
    for name, a in best["by_attribute"].items():
        u = untied["by_attribute"].get(name, {}).get("perplexity") if untied else None
        own = a["perplexity_kneser_ney"]
        lines.append(
            f"{name:<16}{a['rows']:>8,.0f}{cell(a['perplexity'], '.2f', 9)}{cell(a['perplexity_shared'], '.2f', 9)}"
            f"{cell(u, '.2f', 9)}{cell(own, '.2f', 9)}{a['perplexity'] / a['perplexity_shared']:>10.3f}"
            + (f"{a['perplexity'] / own:>10.3f}" if own else f"{'-':>10}")
        )
    lines.append(
        f"  corpus-wide Kneser-Ney on all test rows: {kn:.3f}; shared head: {shared['test']['perplexity']:.3f}"
    )

    # Classification.
    nb = report["naive_bayes"]
    lines += [
        "",
        f"package classification of {nb['documents']} test documents (uniform prior; same documents as the heads': "
        f"{'yes' if nb['same_documents_as_gated'] else 'NO'})",
    ]
    for m in fits["models"]:
        lines.append(f"  {m['label']:<34}{cell(m['attribute_accuracy'], '.3f', 8)}")
    lines.append(f"  {'naive Bayes unigram, k = ' + format(nb['k'], 'g'):<34}{nb['accuracy']:>8.3f}")
    lines.append(
        "  informational, naive Bayes at other k (on test, not a tuned figure): "
        + ", ".join(f"k={k}: {v:.3f}" for k, v in nb["accuracy_by_k_informational"].items())
    )

    # Fold-in.
    if any(m["fold_in"] for m in fits["models"]):
        lines += [
            "",
            f"fold-in of the held-out packages ({cfg['fold_in_iterations']} EM iterations on half of their rows, the "
            "other half scored)",
        ]
        header = f"{'model':<34}{'package':<10}{'rows':>7}{'folded':>9}{'uniform':>9}{'shared':>9}{'f/shared':>10}"
        lines += [header, "-" * len(header)]
        for m in fits["models"]:
            for name, f in m["fold_in"].items():
                lines.append(
                    f"{m['label']:<34}{name:<10}{f['rows_scored']:>7,.0f}{f['perplexity']:>9.3f}"
                    f"{f['perplexity_uniform_weights']:>9.3f}{f['perplexity_shared']:>9.3f}"
                    f"{f['perplexity'] / f['perplexity_shared']:>10.3f}"
                )
        folded = best["fold_in"]
        for name, f in folded.items():
            weights = ", ".join(f"{w:.2f}" for w in f["weights"])
            lines.append(f"  {best['label']}, {name}'s folded weights: [{weights}]")

    # E-step.
    estep = report["estep"]
    lines += [
        "",
        f"E-step rows/s, one thread, in-process, on the first {estep['rows']:,} training rows (best of "
        f"{cfg['repeats']})",
        f"  shared head, accumulator seq_update ({estep['shared_layout']}): {estep['shared']['rows_per_s']:>12,.0f}",
        f"  shared head as a one-factor gated head:        {estep['shared_as_one_factor_gated']['rows_per_s']:>12,.0f}"
        f"   (statistics agree to {estep['one_factor_agreement']:.1e})",
    ]
    sparse = estep.get("shared_sparse_on_gated_support")
    if sparse:
        lines.append(
            f"  shared head, sparse on the gated support:      {sparse['rows_per_s']:>12,.0f}   "
            f"({sparse['pairs']:,} pairs; informational)"
        )
    for g in estep["gated"]:
        lines.append(f"  gated_estep, {g['label']:<33}{g['rows_per_s']:>12,.0f}   {g['over_shared']:.2f}x shared")

    # Samples and neighbours.
    samples = report["samples"]
    lines += ["", f"samples of {samples['model']} ({cfg['sample_tokens']} tokens after the prompt)"]
    if samples["sample_without_prompt_error"]:
        lines.append(f"  (sample without --prompt failed: {samples['sample_without_prompt_error']}; prompted instead)")
    for s in samples["samples"]:
        lines.append(f"  [{s['attribute']}, seed {s['seed']}] {' '.join(s['prompt'])} ||| {s['text']}")
    lines.append(f"  [mix {samples['mix']['mix']}] {' '.join(samples['mix']['prompt'])} ||| {samples['mix']['text']}")
    lines.append("neighbours (Hellinger distance between emission rows), 5 nearest")
    for word, found in samples["neighbours"].items():
        if "error" in found:
            lines.append(f"  {word!r}: {found['error']}")
            continue
        for name, items in found.items():
            lines.append(f"  {word!r} under {name}: " + ", ".join(f"{w} ({d:.3f})" for w, d in items))

    lines += ["", "targets (measured, not asserted)"]
    for t in report["targets"]:
        shown = "-" if t["measured"] is None else f"{t['measured']:.3f}"
        verdict = "not measured" if t["pass"] is None else ("MET" if t["pass"] else "MISSED")
        lines.append(f"  {t['name']:<78}{t['target']:<9}{shown:>8}  {verdict}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dist-respattn-corpus-cache"))
    parser.add_argument("--work", help="where the stores and models go (default: a temporary directory)")
    parser.add_argument("--packages", default=",".join(PACKAGES), help="standard-library packages trained on")
    parser.add_argument("--held-out", default=",".join(HELD_OUT), help="packages never trained on (folded in)")
    parser.add_argument("--piece-lines", type=int, default=PIECE_LINES, help="lines of a document (a file's piece)")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--context", type=int, default=8, help="window N")
    parser.add_argument("--partition-rows", type=int, default=1 << 16, help="rows a partition of every store")
    parser.add_argument("--factors", default=",".join(map(str, FACTORS)), help="attribute factors F of the fits")
    parser.add_argument("--no-untied", dest="untied", action="store_false", help="skip the F = 0 fit")
    parser.add_argument(
        "--no-own-tables",
        dest="own_tables",
        action="store_false",
        help="skip the fit with each package's own table beside the smallest F's shared factors",
    )
    parser.add_argument(
        "--no-per-attribute", dest="per_attribute", action="store_false", help="skip the per-package prior fit"
    )
    parser.add_argument("--max-iter", type=int, default=15, help="iterations at most of every fit (early stopping)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fold-in-iterations", type=int, default=20)
    parser.add_argument("--nb-k", type=float, default=0.1, help="add-k of the naive Bayes unigrams (stated)")
    parser.add_argument("--estep-rows", type=int, default=200_000, help="training rows the E-steps are timed on")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each E-step (the best is kept)")
    parser.add_argument("--min-seconds", type=float, default=0.2, help="a timed run loops until it lasts this long")
    parser.add_argument("--samples", type=int, default=2, help="samples per package")
    parser.add_argument("--sample-tokens", type=int, default=40)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="small sizes, under a minute (flags given beside it win): " + json.dumps(SMOKE),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object after the table")
    args = parser.parse_args(argv)
    if args.smoke:  # the smoke sizes become the defaults: a flag given beside --smoke still wins
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    args.packages = [p.strip() for p in str(args.packages).split(",") if p.strip()]
    args.held_out = [p.strip() for p in str(args.held_out).split(",") if p.strip()]
    args.factors = sorted({int(v) for v in str(args.factors).split(",") if v.strip()})
    if not args.factors or min(args.factors) < 1:
        parser.error("--factors: one or more F >= 1 (the untied F = 0 fit is always added unless --no-untied)")
    if set(args.packages) & set(args.held_out):
        parser.error("a package is both trained on and held out")
    for name in ("vocab_size", "context", "partition_rows", "max_iter", "workers", "estep_rows", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.nb_k > 0:
        parser.error("--nb-k must be positive")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import numba

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-attributes-") as temp:
        work = Path(args.work or temp)
        corpus = build_corpus(args)
        report["corpus"] = {k: v for k, v in corpus.items() if k not in ("corpus", "folder")}
        stores = write_stores(args, corpus, work)
        report["stores"] = {side: {k: v for k, v in s.items() if k != "path"} for side, s in stores.items()}
        report["fits"] = fits_part(args, stores, work)
        report["naive_bayes"] = naive_bayes_part(args, stores, report["fits"])
        # In-process, one thread, after the cluster is gone.
        report["estep"] = estep_part(args, stores, report["fits"])
        report["samples"] = samples_part(args, corpus, report["fits"], report["naive_bayes"])
    for m in report["fits"]["models"]:
        m.pop("model_dir")
    report["fits"]["shared"].pop("model_dir", None)
    report["config"] = {
        "packages": args.packages,
        "held_out": args.held_out,
        "piece_lines": args.piece_lines,
        "vocab_size": args.vocab_size,
        "context": args.context,
        "partition_rows": args.partition_rows,
        "factors": args.factors,
        "untied": args.untied,
        "per_attribute": args.per_attribute,
        "max_iter": args.max_iter,
        "workers": args.workers,
        "fold_in_iterations": args.fold_in_iterations,
        "nb_k": args.nb_k,
        "estep_rows": args.estep_rows,
        "repeats": args.repeats,
        "min_seconds": args.min_seconds,
        "samples": args.samples,
        "sample_tokens": args.sample_tokens,
        "smoke": args.smoke,
    }
    report["host"] = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "wall_seconds": time.perf_counter() - started,
    }
    report["targets"] = targets_of(report)
    print(format_report(report))
    print(f"\nwall time {report['host']['wall_seconds']:.0f} s")
    if args.json:
        print(json.dumps(report, indent=2, default=float))
    return report


if __name__ == "__main__":
    main()
