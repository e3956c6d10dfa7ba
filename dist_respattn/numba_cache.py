"""Where numba keeps the compiled kernels: a per-user cache directory, never inside the installed package.

Left to itself, numba caches a kernel next to its source (``dist_respattn/model/__pycache__``) whenever that
directory is writable, as site-packages is in a virtual environment. ``pip`` does not know those files:
installing the package again (``pip install -e .`` after ``pip install .``) removes the package's own files
and leaves a ``site-packages/dist_respattn`` of cache files only, which then shadows the new install as
an empty namespace package. So the package points ``NUMBA_CACHE_DIR`` at a directory of the user's own
before any of its modules imports numba (:mod:`dist_respattn` calls :func:`use_user_cache_dir` first).

Numba keys each cached kernel by its own source file's stamp only, not by the modules whose compiled
functions it calls: a kernel in ``model/heads/hops/kernels.py`` has ``model/kernels/lanes.py``'s intrinsics
compiled into it, and after a change to ``lanes.py`` alone (an edit, a ``git pull``) numba would load the old
machine code. So the directory is one of ``kernels-<stamp>`` folders, the stamp taken over every module
that defines compiled functions (:data:`KERNEL_MODULES`): a change to any of them starts a fresh cache.
Folders of stamps unused for :data:`UNUSED_DAYS` days are removed.

Worker processes get the same directory: a nanny's workers inherit the environment, and a worker started
elsewhere imports this package (and so runs the same choice) before it runs any of its tasks. Numba keys
each cached kernel by its source file's directory and stamp, so installs in different places, or of
different versions, never share an entry.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Mapping, MutableMapping

__all__ = ["CACHE_ENV", "KERNEL_MODULES", "cache_dir_for", "kernel_sources_stamp", "use_user_cache_dir"]

logger = logging.getLogger(__name__)

#: The variable numba reads its cache directory from; a value the user set is always kept.
CACHE_ENV = "NUMBA_CACHE_DIR"

#: The package's modules that define compiled functions (each imports numba), relative to the package's folder.
#: A test checks this list against the modules that import numba, so a new kernel module cannot be left out.
KERNEL_MODULES = (
    "model/arguments.py",
    "model/emission/mixture.py",
    "model/fitting/selection.py",
    "model/heads/codebook/kernels.py",
    "model/heads/conj/kernels.py",
    "model/heads/copy/grid.py",
    "model/heads/copy/histogram.py",
    "model/heads/copy/kernels.py",
    "model/heads/gated/head.py",
    "model/heads/hops/grid.py",
    "model/heads/hops/kernels.py",
    "model/heads/mixture/kernels.py",
    "model/heads/repeat/kernels.py",
    "model/heads/repeat/masses.py",
    "model/heads/single_hop/scoring.py",
    "model/heads/single_hop/top_k.py",
    "model/heads/sparse_top.py",
    "model/kernels/emission_rows.py",
    "model/kernels/histogram.py",
    "model/kernels/lanes.py",
    "model/kernels/log_weights.py",
    "model/kernels/pair_keys.py",
    "model/kernels/per_position.py",
    "model/kernels/prefetch.py",
    "model/kernels/row_order.py",
    "model/kernels/specialize.py",
    "model/streaming.py",
    "store/ingest/byte_tokenizer.py",
    "store/streams/windows.py",
)

#: A ``kernels-<stamp>`` folder no process has used for this many days is removed (a stamp of sources since changed).
UNUSED_DAYS = 14

_PACKAGE_ROOT = os.path.dirname(os.path.abspath(__file__))


def cache_dir_for(environ: Mapping[str, str]) -> str | None:
    """The directory numba should cache this package's kernels in, for an environment without ``NUMBA_CACHE_DIR``.

    ``$XDG_CACHE_HOME/dist_respattn/numba`` (``~/.cache/dist_respattn/numba`` without it), created if need
    be. When that cannot be written (a read-only or missing home, as for a service account), a directory
    of this user's own under the system's temporary directory, made private (mode 0700) and used only if
    it is: numba loads its cache files with pickle, so a directory someone else can write is no place for
    them. ``None`` when neither can be had (numba then falls back to its own choices).
    """
    home = environ.get("HOME") or os.path.expanduser("~")  # "~" itself when there is no home at all
    xdg = environ.get("XDG_CACHE_HOME", "")
    # Relative values name no place (the XDG spec ignores them): never a directory under the working one.
    if os.path.isabs(xdg):
        preferred: str | None = os.path.join(xdg, "dist_respattn", "numba")
    elif os.path.isabs(home):
        preferred = os.path.join(home, ".cache", "dist_respattn", "numba")
    else:
        preferred = None
    if preferred is not None and _writable(preferred):
        return preferred
    try:
        owner = str(os.getuid()) if hasattr(os, "getuid") else getpass.getuser()
    except (OSError, KeyError):  # no user name to be had (getuser's own failures)
        return None
    private = os.path.join(tempfile.gettempdir(), f"dist_respattn-{owner}")
    fallback = os.path.join(private, "numba")
    if _private(private) and _writable(fallback):
        logger.debug("%s is not writable; numba caches under %s", preferred, fallback)
        return fallback
    return None


def kernel_sources_stamp(root: str = _PACKAGE_ROOT) -> str:
    """A 16-hex-digit stamp of :data:`KERNEL_MODULES` under ``root``: their sizes and modification times, as numba
    stamps a single source file (a module missing counts as such)."""
    digest = hashlib.sha1()
    for name in KERNEL_MODULES:
        try:
            info = os.stat(os.path.join(root, name))
            size, mtime = info.st_size, info.st_mtime_ns
        except OSError:
            size, mtime = -1, -1
        digest.update(f"{name}\0{size}\0{mtime}\n".encode())
    return digest.hexdigest()[:16]


def use_user_cache_dir(environ: MutableMapping[str, str] | None = None, root: str = _PACKAGE_ROOT) -> str | None:
    """Set ``NUMBA_CACHE_DIR`` to the ``kernels-<stamp>`` folder of :func:`cache_dir_for` (the stamp of the kernel
    modules under ``root``, :func:`kernel_sources_stamp`) unless it is set already; returns the directory in use.

    When numba is already imported (by the user, before this package), its ``CACHE_DIR`` is set directly so the
    kernels this package is about to define see the directory; reloading numba's whole configuration from the
    environment would undo settings the user made in code (``numba.config.DISABLE_JIT = True``).

    The variable is process-wide, as numba's configuration is: other libraries' cached kernels in the same
    process (and its child processes) go to the same directory, each under its own source file's name.
    """
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_ENV):
        return environ[CACHE_ENV]
    base = cache_dir_for(environ)
    if base is None:
        return None
    chosen = os.path.join(base, f"kernels-{kernel_sources_stamp(root)}")
    if not _writable(chosen):
        return None
    _mark_used(chosen)
    _remove_unused_siblings(base, keep=chosen)
    environ[CACHE_ENV] = chosen
    config = sys.modules.get("numba.core.config")
    if config is not None and environ is os.environ:
        setattr(config, "CACHE_DIR", chosen)  # noqa: B010 (a module found at run time, unknown to mypy)
    return chosen


def _mark_used(path: str) -> None:
    """Set ``path``'s modification time to now: the folder's last use, which :func:`_remove_unused_siblings` reads."""
    try:
        os.utime(path)
    except OSError:
        pass


def _remove_unused_siblings(base: str, keep: str) -> None:
    """Remove the ``kernels-*`` folders under ``base`` other than ``keep`` unused for :data:`UNUSED_DAYS` days.

    Best effort: a folder another process is removing, or one this user cannot remove, is left alone.
    """
    oldest = time.time() - UNUSED_DAYS * 86400
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith("kernels-") or entry.path == keep:
            continue
        try:
            unused = entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < oldest
        except OSError:
            continue
        if unused:
            shutil.rmtree(entry.path, ignore_errors=True)


def _writable(path: str) -> bool:
    """Whether ``path`` is (or can be made) a directory this process can create files in (numba's own test)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _private(path: str) -> bool:
    """Whether ``path`` is (or is made) a real directory of this user's that nobody else can write."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return False
    mine = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    return stat.S_ISDIR(info.st_mode) and mine and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
