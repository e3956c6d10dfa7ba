"""A real text corpus for tests: copies of small standard-library packages, each file's directory its package."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

__all__ = ["PACKAGES", "package_corpus"]

#: Small packages of the standard library: real text, one attribute per directory (``--attribute-by directory``).
PACKAGES = ("json", "tomllib", "zoneinfo", "wsgiref")


def package_corpus(root: Path, packages: tuple[str, ...] = PACKAGES) -> str:
    """Copy ``packages``' sources (without their ``__pycache__``) into a new directory ``root``; return its path."""
    stdlib = sysconfig.get_paths()["stdlib"]
    root.mkdir()
    for name in packages:
        shutil.copytree(os.path.join(stdlib, name), root / name, ignore=shutil.ignore_patterns("__pycache__"))
    return str(root)
