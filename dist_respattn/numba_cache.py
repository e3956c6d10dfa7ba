"""Where numba keeps the compiled kernels: a per-user cache directory, never inside the installed package.

Left to itself, numba caches a kernel next to its source (``dist_respattn/model/__pycache__``) whenever that
directory is writable, as site-packages is in a virtual environment. ``pip`` does not know those files:
installing the package again (``pip install -e .`` after ``pip install .``) removes the package's own files
and leaves a ``site-packages/dist_respattn`` of cache files only, which then shadows the new install as
an empty namespace package. So the package points ``NUMBA_CACHE_DIR`` at a directory of the user's own
before any of its modules imports numba (:mod:`dist_respattn` calls :func:`use_user_cache_dir` first).

Worker processes get the same directory: a nanny's workers inherit the environment, and a worker started
elsewhere imports this package (and so runs the same choice) before it runs any of its tasks. Numba keys
each cached kernel by its source file's directory and stamp, so installs in different places, or of
different versions, never share an entry.
"""

from __future__ import annotations

import getpass
import logging
import os
import stat
import sys
import tempfile
from collections.abc import Mapping, MutableMapping

__all__ = ["CACHE_ENV", "cache_dir_for", "use_user_cache_dir"]

logger = logging.getLogger(__name__)

#: The variable numba reads its cache directory from; a value the user set is always kept.
CACHE_ENV = "NUMBA_CACHE_DIR"


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


def use_user_cache_dir(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``NUMBA_CACHE_DIR`` to :func:`cache_dir_for` unless it is set already; returns the directory in use.

    When numba is already imported (by the user, before this package), its ``CACHE_DIR`` is set directly so the
    kernels this package is about to define see the directory; reloading numba's whole configuration from the
    environment would undo settings the user made in code (``numba.config.DISABLE_JIT = True``).

    The variable is process-wide, as numba's configuration is: other libraries' cached kernels in the same
    process (and its child processes) go to the same directory, each under its own source file's name.
    """
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_ENV):
        return environ[CACHE_ENV]
    chosen = cache_dir_for(environ)
    if chosen is None:
        return None
    environ[CACHE_ENV] = chosen
    config = sys.modules.get("numba.core.config")
    if config is not None and environ is os.environ:
        setattr(config, "CACHE_DIR", chosen)  # noqa: B010 (a module found at run time, unknown to mypy)
    return chosen


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
