"""The codebook far field: a single head over the near window and codeword histograms beyond it, registered as
``"codebook"``; ``fit --head codebook --codebook-from SINGLE_MODEL`` picks it (see ``docs/guide/codebook-head.md``)."""

from __future__ import annotations

import os
from typing import Any

from dist_respattn.model.heads.base import HeadKind, HeadSpec, Option, register_kind
from dist_respattn.model.heads.codebook.head import CodebookHead, CodebookPredictor
from dist_respattn.model.heads.codebook.kind import CODEBOOK_FROM, CodebookSpec

__all__ = ["KIND", "CodebookHead", "CodebookPredictor", "CodebookSpec", "spec_from_options"]

#: The codebook options and their defaults (the spec's).
_OPTIONS = {"near_window": ("--near-window", 8), "codebooks": ("--codebooks", 8), "codewords": ("--codewords", 16)}


def spec_from_options(options: dict[str, Any], base: HeadSpec, saved: dict[str, Any] | None) -> CodebookSpec | None:
    """The codebook spec a ``fit --head codebook`` asks for (``None`` otherwise). Its options without
    ``--head codebook`` are refused, and so are values that are not positive whole numbers (the flag named)."""
    given = {dest: options.get(dest) for dest in ("codebook_from", *_OPTIONS)}
    if options.get("head") != "codebook":
        for dest, value in given.items():
            if value is not None:
                flag = CODEBOOK_FROM if dest == "codebook_from" else _OPTIONS[dest][0]
                raise ValueError(f"{flag} is an option of --head codebook: add --head codebook, or leave it out")
        return None
    saved = saved or {}
    source = given["codebook_from"]
    if source is None and not saved.get("source"):
        raise ValueError(f"--head codebook needs {CODEBOOK_FROM} MODEL_DIR: the fitted single head it starts from")
    values: dict[str, Any] = {}
    for dest, (flag, default) in _OPTIONS.items():
        value = given[dest]
        if value is None:
            values[dest] = int(saved.get(dest, default))
            continue
        if int(value) < (2 if dest == "codewords" else 1):
            least = "at least 2" if dest == "codewords" else "a positive whole number"
            raise ValueError(f"{flag} {value}: expected {least}")
        values[dest] = int(value)
    path = os.path.abspath(str(source)) if source is not None else str(saved["source"])
    return CodebookSpec(path, **values)


KIND = register_kind(
    HeadKind(
        "codebook",
        CodebookHead,
        CodebookSpec,
        summary="a single head over the last --near-window positions and, beyond them, codeword histograms of B "
        "codebooks x W codewords (a far field whose cost a row does not grow with the window)",
        options=(
            Option(
                (CODEBOOK_FROM,),
                {
                    "metavar": "MODEL_DIR",
                    "default": None,
                    "help": "--head codebook: the model directory of the fitted single head (of this corpus, any "
                    "window) it starts from: its keys, σ², near prior and emission; the codebooks are a "
                    "k-means of its keys",
                },
                ("fit",),
            ),
            Option(
                ("--near-window",),
                {
                    "type": int,
                    "metavar": "N0",
                    "default": None,
                    "help": "--head codebook: the most recent positions that keep their token's identity (default 8); "
                    "the window's older positions are the far field",
                },
                ("fit",),
            ),
            Option(
                ("--codebooks",),
                {
                    "type": int,
                    "metavar": "B",
                    "default": None,
                    "help": "--head codebook: codebooks of the far field (default 8)",
                },
                ("fit",),
            ),
            Option(
                ("--codewords",),
                {
                    "type": int,
                    "metavar": "W",
                    "default": None,
                    "help": "--head codebook: codewords of each codebook (default 16, at most S)",
                },
                ("fit",),
            ),
        ),
        spec_from_options=spec_from_options,
        head_name="codebook",
    )
)
