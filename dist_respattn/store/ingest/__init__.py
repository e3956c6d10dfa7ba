"""Ingestion sources: text, token ids, arrays and synthetic rows into either format, one corpus's splits, ``--like``."""

from __future__ import annotations

__all__: list[str] = []
