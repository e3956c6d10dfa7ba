"""What ``fit`` prints while it runs and at the end, read by a person: each iteration's held-out perplexity, its
chosen settings and which iteration is best so far; the joint log-likelihood only with ``-v``; which checkpoint the
model directory serves. Every fit here is the real command on a real store (its ``main`` in this process: what it
prints is the subject, not its process; a fit as a subprocess is tested in tests/test_cli.py), run on the cluster the
command-line tests share (``--scheduler``): the lines read the same whoever's workers run the tasks, and a fit's own
cluster is tested apart."""

from __future__ import annotations

import json
import re

import pytest

from dist_respattn.artifacts import load_checkpoint
from tests.stdlib_packages import package_corpus
from tests.test_cli import run, run_here

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command

#: A plain fit's line, e.g. ``iteration 3: held-out perplexity 23.597 (best so far), sigma2 7.93, emission prior
#: strength 0.1 + 1 per successor type, 0.09 s, 445,986 rows/s``.
LINE = re.compile(
    r"^iteration (?P<iteration>\d+): held-out perplexity (?P<perplexity>\d+\.\d{3}) "
    r"\((?P<best>best so far|best so far: iteration \d+)\), sigma2 (?P<sigma2>\S+), emission prior strength "
    r"(?P<strength>\S+) \+ (?P<type>\S+) per successor type, \d+\.\d\d s, [\d,]+ rows/s(?P<rest>.*)$",
    re.MULTILINE,
)
#: A gated stage's line: the iteration line of any fit, its choice the factors' prior scale.
GATED_LINE = re.compile(
    r"^iteration (?P<iteration>\d+): held-out perplexity (?P<perplexity>\d+\.\d{3}) "
    r"\((?P<best>best so far|best so far: iteration \d+)\), prior scale (?P<scale>\S+), \d+\.\d\d s, [\d,]+ rows/s"
    r"(?P<rest>.*)$",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A token-stream store of four stdlib packages' source, the package as each file's attribute (A = 4)."""
    base = tmp_path_factory.mktemp("lines")
    out = str(base / "train.zarr")
    done = run(
        "ingest", "--text", package_corpus(base / "corpus"), "--attribute-by", "directory", "--vocab-size", "300",
        "--dim", "6", "--context", "4", out, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def address(one_worker_address: str) -> str:
    """The scheduler of the one-worker cluster the command-line tests share (tests/conftest.py), which every fit
    joins."""
    return one_worker_address


def _marks(perplexities: list[float]) -> list[str]:
    """The mark each iteration's line must carry: best so far when it beats every earlier one."""
    marks, best, best_at = [], float("inf"), 0
    for i, value in enumerate(perplexities, start=1):
        if value < best:
            best, best_at = value, i
            marks.append("best so far")
        else:
            marks.append(f"best so far: iteration {best_at}")
    return marks


def test_iteration_lines_lead_with_the_heldout_perplexity_and_mark_the_best(store, address, tmp_path, capsys):
    """Each line gives the iteration's held-out perplexity and chosen settings as the checkpoint saved them, marks
    the best iteration so far, and names no joint log-likelihood; the summary names the checkpoint kept."""
    model = tmp_path / "model"
    done = run_here(capsys, "fit", store, "--model-dir", str(model), "--head", "single", "--max-iter", "6", "--tol",
                    "0", "--scheduler", address)  # fmt: skip
    assert done.returncode == 0, done.stderr
    history = load_checkpoint(model, "latest").meta["history"]
    lines = list(LINE.finditer(done.stderr))
    assert [int(m["iteration"]) for m in lines] == [h["iteration"] for h in history], done.stderr
    saved = [h["heldout"]["perplexity"] for h in history]
    assert [float(m["perplexity"]) for m in lines] == [round(p, 3) for p in saved]
    assert [m["best"] for m in lines] == _marks(saved)
    for m, h in zip(lines, history, strict=True):
        chosen = h["hyperparameters"]
        assert (m["sigma2"], m["strength"], m["type"]) == (
            f"{chosen['sigma2']:.3g}",
            f"{chosen['emission_strength']:.3g}",
            f"{chosen['type_strength']:.3g}",
        )
        assert m["rest"] == ""
    assert "log-likelihood" not in done.stderr and "log-likelihood" not in done.stdout

    best = load_checkpoint(model, "best")
    (kept,) = [line for line in done.stdout.splitlines() if line.startswith("model: ")]
    assert kept.startswith(f"model: {model}, the best iteration's: iteration {best.iteration}, held-out perplexity")
    assert f"({best.name}, best.json)" in kept
    last = history[-1]["iteration"]
    if best.iteration != last:
        assert f"the last iteration's ({last}, held-out perplexity" in done.stdout
        assert "latest.json): --resume continues from it" in done.stdout
    else:
        assert "  it is also the last iteration's" in done.stdout


def test_early_stopping_by_loglik_says_so_in_the_mark(store, address, tmp_path, capsys):
    """With ``--early-stop-metric loglik`` the best iteration is judged by the held-out joint log-likelihood, not the
    perplexity the line leads with: the mark names the metric, and follows the log-likelihood the checkpoint saved."""
    model = tmp_path / "model"
    done = run_here(
        capsys,
        "fit", store, "--model-dir", str(model), "--head", "single", "--max-iter", "3", "--tol", "0", "--scheduler",
        address, "--early-stop-metric", "loglik",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    history = load_checkpoint(model, "latest").meta["history"]
    marks = re.findall(r"^iteration \d+: held-out perplexity \d+\.\d{3} \(([^)]*)\),", done.stderr, re.MULTILINE)
    # Higher is better: the marks of the negated log-likelihoods, as those of perplexities (lower is better).
    expected = _marks([-h["heldout"]["mean_log_likelihood"] for h in history])
    assert marks == [m.replace("best so far", "best so far by loglik") for m in expected], done.stderr


def test_verbose_and_json_keep_the_joint_log_likelihood(store, address, tmp_path, capsys):
    """``-v`` appends the training and held-out joint log-likelihoods the checkpoint saved; ``--json`` keeps its
    keys (``mean_log_likelihood``, ``heldout``) and adds the checkpoints the directory's pointers name."""
    model = tmp_path / "model"
    done = run_here(capsys, "fit", store, "--model-dir", str(model), "--head", "single", "--max-iter", "3", "--tol",
                    "0", "--scheduler", address, "-v")  # fmt: skip
    assert done.returncode == 0, done.stderr
    history = load_checkpoint(model, "latest").meta["history"]
    rests = [m["rest"] for m in LINE.finditer(done.stderr)]
    assert len(rests) == len(history) == 3
    for rest, h in zip(rests, history, strict=True):
        change = "first" if h["change"] is None else f"change {h['change']:.3g}"
        assert rest == (
            f"; joint log-likelihood per row: training {h['mean_log_likelihood']:.6f} ({change}), "
            f"held-out {h['heldout']['mean_log_likelihood']:.4f}"
        )
    assert (
        f"mean joint log-likelihood per row (training, last iteration): {history[-1]['mean_log_likelihood']:.4f}"
        in (done.stdout)
    )

    again = run_here(
        capsys,
        "fit", store, "--model-dir", str(model), "--head", "single", "--max-iter", "3", "--tol", "0", "--scheduler",
        address, "--overwrite", "--json",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    history = load_checkpoint(model, "latest").meta["history"]
    assert report["mean_log_likelihood"] == history[-1]["mean_log_likelihood"]
    assert (
        report["heldout"]["mean_log_likelihood"]
        == next(h for h in history if h["iteration"] == report["best_iteration"])["heldout"]["mean_log_likelihood"]
    )
    assert report["best_checkpoint"] == load_checkpoint(model, "best").name
    assert report["latest_checkpoint"] == load_checkpoint(model, "latest").name
    assert report["last_iteration"] == 3


def test_a_gated_fit_with_fewer_factors_than_attributes_says_so_and_its_lines_read_alike(
    store, address, tmp_path, capsys
):
    """``--attribute-factors 2`` on 4 attributes warns, before the shared fit, that the attributes will be clustered
    and names ``--per-attribute emission``; with that flag (or F >= A) nothing is said. The gated lines lead with
    the held-out perplexity as the checkpoint saved it and mark the best so far."""
    model = tmp_path / "model"
    done = run_here(capsys, "fit", store, "--model-dir", str(model), "--attribute-factors", "2", "--max-iter", "2",
                    "--scheduler", address)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (note,) = [line for line in done.stderr.splitlines() if line.startswith("note: --attribute-factors 2")]
    assert "4 attributes" in note and "clustered into 2 groups" in note and "--per-attribute emission" in note
    assert done.stderr.index(note) < done.stderr.index("iteration 1: held-out perplexity")  # before the shared fit
    # The gated stage's lines follow the line that says what it starts from.
    started = done.stderr.index("gated head: F = 2 shared factors over ")
    history = load_checkpoint(model, "latest").meta["history"]
    lines = list(GATED_LINE.finditer(done.stderr[started:]))
    saved = [h["heldout"]["perplexity"] for h in history]
    assert [int(m["iteration"]) for m in lines] == [h["iteration"] for h in history] == [1, 2], done.stderr
    assert [float(m["perplexity"]) for m in lines] == [round(p, 3) for p in saved], done.stderr
    assert [m["best"] for m in lines] == _marks(saved)
    assert [m["scale"] for m in lines] == [f"{h['hyperparameters']['prior_scale']:.3g}" for h in history]
    assert all(m["rest"] == "" for m in lines)
    # How each stage ended, in words (the checkpoints' state names, such as max_iter, stay in --json).
    assert "shared stage: stopped at --max-iter after 2 iterations, held-out perplexity " in done.stdout, done.stdout
    assert "_" not in done.stdout.split("shared stage: ")[1].split(", held-out")[0]
    assert re.search(r"^gated head: 2 tables, 4 attributes, [\d,]+ parameters$", done.stdout, re.MULTILINE), done.stdout

    for extra in (("--attribute-factors", "2", "--per-attribute", "emission"), ("--attribute-factors", "4")):
        done = run_here(
            capsys,
            "fit",
            store,
            "--model-dir",
            str(tmp_path / "-".join(extra)),
            *extra,
            "--max-iter",
            "1",
            "--scheduler",
            address,
        )
        assert done.returncode == 0, done.stderr
        assert "note: --attribute-factors" not in done.stderr


def test_a_resume_of_an_ended_fit_names_the_heldout_rows_as_the_fit_did(store, address, tmp_path, capsys):
    """A ``--resume`` of a fit that already ended runs nothing and prints its summary again: its held-out line names
    the rows the figures are of as the fit's own summary did (a hold-out of the training store here), not a
    validation store the fit never had."""
    model = tmp_path / "model"
    first = run_here(capsys, "fit", store, "--model-dir", str(model), "--head", "single", "--max-iter", "1",
                     "--scheduler", address)  # fmt: skip
    assert first.returncode == 0, first.stderr
    (held,) = [line for line in first.stdout.splitlines() if line.startswith("held-out (")]
    assert "of the training store's rows" in held, first.stdout
    again = run_here(capsys, "fit", store, "--model-dir", str(model), "--resume", "--scheduler", address)
    assert again.returncode == 0, again.stderr
    assert "the fit already ended at iteration 1" in again.stderr, again.stderr
    assert [line for line in again.stdout.splitlines() if line.startswith("held-out (")] == [held], again.stdout
