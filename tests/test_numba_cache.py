"""numba's cache directory: the user's cache directory, a private temporary one when that cannot be written,
and whatever the user set left alone. (The install that used to break is run for real in ``test_install.py``.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time

import pytest

import dist_respattn
from dist_respattn.numba_cache import (
    CACHE_ENV,
    KERNEL_MODULES,
    UNUSED_DAYS,
    cache_dir_for,
    kernel_sources_stamp,
    use_user_cache_dir,
)


@pytest.fixture
def temporary(tmp_path, monkeypatch) -> str:
    """The system's temporary directory for this test: a fresh one (``tempfile`` reads it once per process)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return str(folder)


def owner() -> str:
    return str(os.getuid())


def test_the_users_cache_directory(tmp_path):
    chosen = cache_dir_for({"HOME": str(tmp_path)})
    assert chosen == str(tmp_path / ".cache" / "dist_respattn" / "numba")
    assert os.path.isdir(chosen)


def test_xdg_cache_home_when_absolute(tmp_path):
    xdg = tmp_path / "xdg"
    assert cache_dir_for({"HOME": str(tmp_path), "XDG_CACHE_HOME": str(xdg)}) == str(xdg / "dist_respattn" / "numba")
    # A relative value is not a place (the XDG spec says to ignore it): the home's .cache is used.
    relative = cache_dir_for({"HOME": str(tmp_path), "XDG_CACHE_HOME": "cache"})
    assert relative == str(tmp_path / ".cache" / "dist_respattn" / "numba")


def test_an_unwritable_home_falls_back_to_a_private_temporary_directory(tmp_path, temporary):
    not_a_directory = tmp_path / "home"
    not_a_directory.write_text("")  # no directory can be made under it, whoever runs the test (root too)
    chosen = cache_dir_for({"HOME": str(not_a_directory)})
    private = os.path.join(temporary, f"dist_respattn-{owner()}")
    assert chosen == os.path.join(private, "numba")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700


def test_a_relative_home_is_no_place(tmp_path, temporary, monkeypatch):
    """Without a home (or with a relative one) nothing is made under the working directory."""
    monkeypatch.chdir(tmp_path)
    chosen = cache_dir_for({"HOME": "relative"})
    assert chosen == os.path.join(temporary, f"dist_respattn-{owner()}", "numba")
    assert not (tmp_path / "relative").exists()


def test_a_temporary_directory_others_can_write_is_refused(tmp_path, temporary):
    """numba unpickles its cache files: a directory another user can write into could hand it code."""
    not_a_directory = tmp_path / "home"
    not_a_directory.write_text("")
    shared = os.path.join(temporary, f"dist_respattn-{owner()}")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    assert cache_dir_for({"HOME": str(not_a_directory)}) is None
    environ = {"HOME": str(not_a_directory)}
    assert use_user_cache_dir(environ) is None
    assert CACHE_ENV not in environ  # numba's own choice then, not a directory we could not vouch for


def test_a_directory_the_user_set_is_kept(tmp_path):
    environ = {"HOME": str(tmp_path), CACHE_ENV: "/somewhere/else"}
    assert use_user_cache_dir(environ) == "/somewhere/else"
    assert environ[CACHE_ENV] == "/somewhere/else"
    assert not (tmp_path / ".cache").exists()
    unset = {"HOME": str(tmp_path)}
    chosen = use_user_cache_dir(unset)
    assert chosen == str(tmp_path / ".cache" / "dist_respattn" / "numba" / f"kernels-{kernel_sources_stamp()}")
    assert unset[CACHE_ENV] == chosen and os.path.isdir(chosen)


#: Package modules that import numba and compile nothing: the forkserver's preload readies numba's CPU target.
NO_KERNELS = {"engine/worker_preload.py"}


def test_the_kernel_modules_are_the_package_modules_that_import_numba():
    """The cache's stamp covers every module with compiled functions: one left out could be loaded stale. A module
    of ``NO_KERNELS`` imports numba without decorating a function (a kernel, an intrinsic, an overload)."""
    package = os.path.dirname(dist_respattn.__file__)
    importing, decorating = set(), set()
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as source:
                    lines = [line.strip() for line in source]
                relative = os.path.relpath(path, package).replace(os.sep, "/")
                if any(line.startswith(("import numba", "from numba")) for line in lines):
                    importing.add(relative)
                if any(line.startswith("@") for line in lines):
                    decorating.add(relative)
    assert importing - NO_KERNELS == set(KERNEL_MODULES)
    assert NO_KERNELS <= importing and not NO_KERNELS & decorating


def fake_package(root) -> None:
    for name in KERNEL_MODULES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("# kernels\n")


def test_a_change_to_any_kernel_module_alone_starts_a_fresh_cache(tmp_path):
    """numba stamps a cached kernel by its own file only; a change to a module it calls (lanes.py) must not
    leave the old machine code in use."""
    root = tmp_path / "package"
    fake_package(root)
    environ = {"HOME": str(tmp_path)}
    before = use_user_cache_dir(environ, root=str(root))
    assert use_user_cache_dir({"HOME": str(tmp_path)}, root=str(root)) == before  # the same sources, the same cache
    for changed in ("model/kernels/lanes.py", "store/streams/windows.py"):
        (root / changed).write_text("# kernels, edited\n")
        after = use_user_cache_dir({"HOME": str(tmp_path)}, root=str(root))
        assert after is not None and after != before and os.path.dirname(after) == os.path.dirname(before)
        before = after
    stamp = kernel_sources_stamp(str(root))
    (root / "model/kernels/lanes.py").unlink()
    assert kernel_sources_stamp(str(root)) != stamp


def test_cache_folders_unused_for_two_weeks_are_removed_and_recent_ones_kept(tmp_path):
    base = tmp_path / ".cache" / "dist_respattn" / "numba"
    stale, recent, other = base / "kernels-0000000000000000", base / "kernels-1111111111111111", base / "mine"
    for folder in (stale, recent, other):
        folder.mkdir(parents=True)
        (folder / "entry.nbi").write_text("")
    long_ago = time.time() - (UNUSED_DAYS + 1) * 86400
    os.utime(stale, (long_ago, long_ago))
    os.utime(other, (long_ago, long_ago))
    chosen = use_user_cache_dir({"HOME": str(tmp_path)})
    assert not stale.exists()
    assert recent.exists() and other.exists()  # in use lately, or not a folder of this package's making
    assert chosen is not None and os.path.isdir(chosen)


@pytest.mark.slow
def test_numba_imported_before_the_package_still_caches_in_the_users_directory(tmp_path):
    """numba reads its environment when imported and picks a kernel's cache directory when the kernel is
    defined: the package sets numba's cache directory when numba came first (a fresh interpreter), and leaves
    the settings the user made in code alone (here THREADING_LAYER, which reloading the configuration from the
    environment would reset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") and k != "XDG_CACHE_HOME"}
    env["HOME"] = str(tmp_path)
    code = (
        "import numba, numpy as np\n"
        "numba.config.THREADING_LAYER = 'workqueue'\n"
        "from dist_respattn.store.streams.windows import target_positions\n"
        "assert numba.config.THREADING_LAYER == 'workqueue', numba.config.THREADING_LAYER\n"
        "print(numba.config.CACHE_DIR)\n"
        "assert target_positions(np.array([0]), np.array([0, 2]), 1, 0, 2).tolist() == [1, 2]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    directory = tmp_path / ".cache" / "dist_respattn" / "numba" / f"kernels-{kernel_sources_stamp()}"
    assert done.stdout.strip() == str(directory)
    assert [p.name for p in directory.rglob("*.nbi") if "target_positions" in p.name]
