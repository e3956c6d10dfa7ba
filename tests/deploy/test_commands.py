"""Every command the deploy files run exists, with the flags they give it.

``dist-respattn ...`` lines go through the real parser (:func:`dist_respattn.cli.build_parser`),
``dask scheduler|worker ...`` lines through distributed's click commands, ``respattn_slurm.py ...``
lines through the script's own parser; the sbatch wrappers are run with a stand-in ``python`` that
records what they would start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest
from distributed.cli.dask_scheduler import main as dask_scheduler
from distributed.cli.dask_worker import main as dask_worker

from dist_respattn.cli import build_parser
from tests.deploy import deployfiles as files
from tests.deploy.deployfiles import SLURM, Command

COMMANDS = files.all_commands()
TLS_FLAGS = ("--tls-ca-file", "--tls-cert", "--tls-key")


def _ids(command: Command) -> str:
    return f"{command.where} {' '.join(command.argv[:2])}"


def _slurm_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("respattn_slurm", SLURM / "respattn_slurm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_with_argparse(parser, argv: list[str], command: object) -> None:
    """Parse ``argv``; fail naming the command, its file and argparse's message when it is refused."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code != 0:  # 0: a --help line
            pytest.fail(f"{command}\nis refused by its parser: {stderr.getvalue().strip()}")


def check_with_click(command: click.Command, argv: list[str], where: object) -> None:
    """Every option is one the click command declares, and nothing is left over for preload modules."""
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    unknown = [w.split("=")[0] for w in argv if w.startswith("-") and w.split("=")[0] not in known]
    assert not unknown, f"{where}\nuses options that `{command.name}` does not have: {unknown}"
    # resilient_parsing: no callbacks or path checks (the certificates exist only in a container).
    ctx = command.make_context(command.name or "dask", list(argv), resilient_parsing=True)
    leftover = ctx.params.get("preload_argv") or ()
    assert not leftover, f"{where}\nleaves {list(leftover)} unparsed"


def test_the_deploy_files_run_the_expected_programs():
    programs = {(c.program, c.argv[1]) for c in COMMANDS}
    expected = {
        ("dask", "scheduler"), ("dask", "worker"), ("dist-respattn", "synth"), ("dist-respattn", "fit"),
        ("dist-respattn", "retrain"), ("dist-respattn", "models"),
    }  # fmt: skip
    assert expected <= programs, f"missing: {expected - programs}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.program == "dist-respattn"], ids=_ids)
def test_dist_respattn_commands_parse(command):
    check_with_argparse(build_parser(), list(command.argv[1:]), command)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.program == "dask"], ids=_ids)
def test_dask_commands_parse(command):
    click_command = {"scheduler": dask_scheduler, "worker": dask_worker}[command.argv[1]]
    check_with_click(click_command, list(command.argv[2:]), command)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.program == "respattn_slurm.py"], ids=_ids)
def test_slurm_script_commands_parse(command):
    check_with_argparse(_slurm_script().build_parser(), list(command.argv[1:]), command)


@pytest.mark.parametrize(
    "command",
    [c for c in COMMANDS if c.program == "dask" or "--scheduler" in c.argv],
    ids=_ids,
)
def test_everything_that_talks_to_a_cluster_uses_tls(command):
    for flag in TLS_FLAGS:
        assert flag in command.argv, f"{command}\nlacks {flag}"
    addresses = [w for w in command.argv if "://" in w and not w.startswith("s3://")]
    assert all(a.startswith("tls://") for a in addresses), f"{command}\nnames a non-TLS address"


def test_a_refused_command_is_reported_with_its_file():
    command = Command(("dist-respattn", "fit", "s", "--model-dir", "m", "--no-such-flag"), "example.yaml: fit")
    with pytest.raises(
        pytest.fail.Exception, match=r"(?s)example\.yaml: fit.*\n.*unrecognized arguments: --no-such-flag"
    ):
        check_with_argparse(build_parser(), list(command.argv[1:]), command)
    with pytest.raises(AssertionError, match="--tls-certt"):
        check_with_click(dask_worker, ["tls://s:8786", "--tls-certt", "x"], "example.yaml: worker")


def test_the_shell_reader_finds_commands_behind_keywords_redirections_and_wrappers():
    script = (
        "if ! dist-respattn info /s.zarr >/dev/null 2>&1; then\n"
        "  docker compose run --rm fit dist-respattn models list /models/registry  # newest first\n"
        "fi\n"
        "kubectl exec deploy/x -- dask worker tls://a:1 \\\n  --nthreads 1 && echo done\n"
    )
    assert list(files.shell_commands(script)) == [
        ("dist-respattn", "info", "/s.zarr"),
        ("dist-respattn", "models", "list", "/models/registry"),
        ("dask", "worker", "tls://a:1", "--nthreads", "1"),
    ]


def test_the_slurm_script_hands_retrain_flags_that_dist_respattn_accepts():
    script = _slurm_script()
    args = script.build_parser().parse_args(
        ["retrain", "--registry", "/r", "--store", "/s.zarr", "--validation", "/v.zarr", "--keep", "10",
         "--fan-in", "8", "--storage-option", "anon=false", "--tls-ca-file", "ca", "--tls-cert", "c",
         "--tls-key", "k", "--", "--tolerance", "0.02"]
    )  # fmt: skip
    argv = script.retrain_command(args, "tls://10.0.0.1:8786")
    assert Path(argv[0]).name == "dist-respattn"
    check_with_argparse(build_parser(), argv[1:], argv)
    parsed = build_parser().parse_args(argv[1:])
    assert (parsed.scheduler, parsed.tolerance, parsed.keep) == ("tls://10.0.0.1:8786", 0.02, 10)


@pytest.mark.parametrize(
    ("wrapper", "positional"),
    [
        ("fit.sbatch", ["/shared/train.zarr", "/shared/models/run1", "/shared/validation.zarr"]),
        ("retrain.sbatch", ["/shared/registry", "/shared/train.zarr", "/shared/validation.zarr"]),
    ],
)
def test_sbatch_wrappers_start_the_slurm_script_with_flags_it_accepts(tmp_path, wrapper, positional):
    """Run the wrapper with a stand-in python (via RESPATTN_VENV) that records its arguments."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    record = tmp_path / "argv.json"
    fake = venv / "bin" / "python"
    fake.write_text(f'#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, "w"))\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (venv / "bin" / "activate").write_text(f'PATH="{venv / "bin"}:$PATH"\n')
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SLURM_SUBMIT_DIR": str(SLURM),
        "RESPATTN_VENV": str(venv),
        "RESPATTN_CERTS": "/shared/certs",
        "RESPATTN_ARGS": "--queue compute --interface ib0",
    }
    result = subprocess.run(
        ["bash", str(SLURM / wrapper), *positional], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    script, *argv = json.loads(record.read_text())
    assert Path(script) == SLURM / "respattn_slurm.py"
    check_with_argparse(_slurm_script().build_parser(), argv, f"{wrapper}: {argv}")
    parsed = _slurm_script().build_parser().parse_args(argv)
    assert (parsed.queue, parsed.interface, parsed.tls_key) == ("compute", "ib0", "/shared/certs/tls.key")
    assert parsed.validation == "/shared/validation.zarr"


def test_the_files_yield_the_commands_checked_above():
    """The extraction itself: a parser change that found no commands would leave the checks above empty."""
    programs = {c.program for c in COMMANDS}
    assert {"dist-respattn", "dask", "respattn_slurm.py"} <= programs
    sources = {c.where.split(":")[0].split(" ")[0] for c in COMMANDS}
    for name in ("compose.yaml", "daskjob.yaml", "daskcluster.yaml", "cronjob-retrain.yaml"):
        assert name in sources, f"no command found in {name}"
    verbs = {c.argv[1] for c in COMMANDS if c.program == "dist-respattn"}
    assert {"fit", "retrain", "synth"} <= verbs
