"""Where a store lives: a local path or any fsspec URL."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import fsspec

__all__ = ["StoreLocation"]


@dataclasses.dataclass(frozen=True)
class StoreLocation:
    """A store's address: ``url`` (a local path or e.g. ``s3://bucket/corpus.zarr``) and fsspec options.

    Small, hashable and picklable, so it can travel to workers, which open the store themselves.
    ``window``: the context length N a token-stream store is read with (``None``: the one it records);
    a triple store's N is fixed and ignores it. ``min_context``: the fewest earlier tokens a stream's row
    has (``None``: N, full windows only; fewer is a short history, read as token windows).
    """

    url: str
    storage_options: tuple[tuple[str, Any], ...] = ()
    window: int | None = None
    min_context: int | None = None

    def with_window(self, window: int | None) -> StoreLocation:
        """This location read with window ``window`` (``None``: the store's own, and full windows only)."""
        return dataclasses.replace(self, window=window, min_context=None if window is None else self.min_context)

    def with_min_context(self, min_context: int | None) -> StoreLocation:
        return dataclasses.replace(self, min_context=min_context)

    @classmethod
    def of(
        cls, url: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
    ) -> StoreLocation:
        """The location of ``url`` (a location is returned as it is; a relative path becomes absolute)."""
        if isinstance(url, StoreLocation):
            return url
        text = os.fspath(url)
        if text.startswith("file://"):  # a local path by another name: zarr's own local store serves it best
            text = text.removeprefix("file://")
        if "://" not in text:
            text = os.path.abspath(text)
        return cls(text.rstrip("/"), tuple(sorted((storage_options or {}).items())))

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.storage_options)

    def zarr_store(self) -> Any:
        """What ``zarr.open_group`` takes: the path itself, or an fsspec-backed store for a URL."""
        if "://" not in self.url:
            return self.url
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(self.url, storage_options=self.options or None)

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """The fsspec filesystem and the store's root path on it."""
        fs, path = fsspec.core.url_to_fs(self.url, **self.options)
        return fs, path.rstrip("/")

    def exists(self) -> bool:
        fs, root = self.filesystem()
        return bool(fs.exists(root))

    def is_empty_dir(self) -> bool:
        fs, root = self.filesystem()
        return bool(fs.isdir(root)) and not fs.ls(root)

    def sibling(self, suffix: str) -> StoreLocation:
        """The location ``<url><suffix>``, with the same options (e.g. a staging copy next to the store)."""
        return StoreLocation(self.url + suffix, self.storage_options)  # a sibling is another store: no window

    def replace(self, target: StoreLocation) -> None:
        """Move this store onto ``target``, deleting what ``target`` held (a rename on a local disk)."""
        fs, root = self.filesystem()
        _, target_root = target.filesystem()
        if fs.exists(target_root):
            fs.rm(target_root, recursive=True)
        fs.mv(root, target_root, recursive=True)

    def key_exists(self, key: str) -> bool:
        fs, root = self.filesystem()
        return bool(fs.exists(f"{root}/{key}"))

    def read_key(self, key: str) -> bytes | None:
        """The bytes of the store's file ``key`` (``'zarr.json'``), or ``None`` when it cannot be read."""
        try:
            if "://" not in self.url:
                with open(os.path.join(self.url, key), "rb") as file:
                    return file.read()
            fs, root = self.filesystem()
            return bytes(fs.cat_file(f"{root}/{key}"))
        except (OSError, ValueError):
            return None

    def list_keys(self, prefix: str) -> set[str]:
        """Every file key under ``prefix`` (``'query/c'``; ``''``: the whole store), relative to the store root."""
        fs, root = self.filesystem()
        base = f"{root}/{prefix}" if prefix else root
        if not fs.exists(base):
            return set()
        return {path[len(root) + 1 :] for path in fs.find(base)}

    def __str__(self) -> str:
        return self.url
