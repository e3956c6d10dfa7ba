"""The token-stream format: the token ids, windowed by each reader (:mod:`.reader`), written by :mod:`.writer`, an
interrupted append undone by :mod:`.rollback`, every chunk checked by :mod:`.validation`."""

from __future__ import annotations

__all__: list[str] = []
