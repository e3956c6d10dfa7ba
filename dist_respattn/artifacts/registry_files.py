"""The registry's files: :class:`~dist_respattn.durable.files.AtomicFiles` under the registry's root.

Publishing needs only their three whole-file writes (replace, exclusive create, delete), so a registry
stays readable whatever moment its writer dies at, on a local disk or an object store.
"""

from __future__ import annotations

from dist_respattn.durable.files import AtomicFiles

__all__ = ["RegistryError", "RegistryFiles"]


class RegistryError(ValueError):
    """The registry cannot be read or written as asked (names the file and what was expected)."""


class RegistryFiles(AtomicFiles):
    """Files under a registry root: ``url`` is a local directory or an fsspec URL (``s3://bucket/models``)."""

    error = RegistryError
