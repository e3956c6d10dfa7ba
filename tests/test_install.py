"""The two set-up commands in one checkout, in either order: ``pip install .``, a command that compiles
kernels, then ``pip install -e .``, and the CLI still starts.

Real ``pip`` in a new virtual environment (no pip of its own, no system site-packages). Only the package
is installed there, from a copy of this checkout; its dependencies are this test environment's, seen
through a ``.pth`` line (a directory a ``.pth`` file adds is not scanned for ``.pth`` files, so this
environment's own editable install of the package stays out of it). ``--no-build-isolation --no-index``
builds with this environment's setuptools: nothing is downloaded. ``HOME`` is a fresh directory and
``NUMBA_CACHE_DIR`` unset, as on a new user's machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # makes a virtual environment, runs pip and commands

ROOT = Path(__file__).resolve().parents[1]
#: What building the package reads from the checkout.
BUILD_INPUTS = ("pyproject.toml", "README.md", "dist_respattn")


def copy_checkout(to: Path) -> Path:
    """The files the build reads, without compiled leftovers (a checkout as a fresh clone has it)."""
    to.mkdir()
    for name in BUILD_INPUTS:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, to / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, to / name)
    return to


def make_venv(where: Path) -> tuple[Path, Path]:
    """A virtual environment whose only third-party packages are this one's; returns (bin, site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(purelib) / "test-dependencies.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))
    return where / "bin", Path(purelib)


def cache_files(under: Path) -> list[Path]:
    return sorted(p for pattern in ("*.nbi", "*.nbc") for p in under.rglob(pattern))


@pytest.fixture
def user_env(tmp_path) -> dict[str, str]:
    """This environment without numba or pip settings, with a fresh HOME (its cache directory starts empty)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PIP_", "VIRTUAL_ENV", "PYTHON"))}
    env.pop("XDG_CACHE_HOME", None)
    env.update(HOME=str(home), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def test_install_then_editable_install_in_one_checkout(tmp_path, user_env):
    checkout = copy_checkout(tmp_path / "checkout")
    bin_dir, site = make_venv(tmp_path / "venv")
    installed = site / "dist_respattn"
    user_cache = Path(user_env["HOME"]) / ".cache" / "dist_respattn" / "numba"

    def run(*argv: str | Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(a) for a in argv], cwd=tmp_path, env=user_env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done

    def pip_install(*target: str | Path) -> None:
        run(bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
            *target)  # fmt: skip

    # Command 1: a regular install, then a command that compiles kernels (the text tokenizer's).
    pip_install(checkout)
    assert (installed / "__init__.py").is_file()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(["the cat sat on the mat", "a dog ran to the cat"] * 50))
    run(bin_dir / "dist-respattn", "ingest", "--text", corpus, tmp_path / "text.zarr", "--context", "3")
    compiled = cache_files(user_cache)
    assert any("byte_tokenizer" in p.name for p in compiled), compiled
    assert cache_files(installed) == []

    # Its workers too (a cluster started before the package is imported, so they do not inherit the choice):
    # a kernel compiled on a worker lands in the user's cache directory as well.
    script = tmp_path / "on_a_worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import distributed
            import numpy as np

            if __name__ == "__main__":
                with distributed.LocalCluster(
                    n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
                ) as cluster, distributed.Client(cluster) as client:
                    from dist_respattn.store.streams.windows import target_positions

                    got = client.submit(target_positions, np.array([0]), np.array([0, 4]), 2, 0, 4).result()
                    assert got.tolist() == [2, 3, 4, 5], got
            """
        )
    )
    run(bin_dir / "python", script)
    assert any("target_positions" in p.name for p in cache_files(user_cache)), cache_files(user_cache)
    assert cache_files(installed) == []

    # Command 2: an editable install of the same checkout replaces it, and the command line starts.
    pip_install("--editable", checkout)
    assert not installed.exists(), sorted(str(p) for p in installed.rglob("*"))
    helped = run(bin_dir / "dist-respattn", "--help")
    assert "demo" in helped.stdout
    where = run(bin_dir / "python", "-c", "import dist_respattn; print(dist_respattn.__file__)").stdout.strip()
    assert Path(where) == checkout / "dist_respattn" / "__init__.py"

    # And back: the regular install over the editable one.
    pip_install(checkout)
    assert run(bin_dir / "dist-respattn", "--version").stdout.startswith("dist-respattn ")
