"""One kernel's Python body compiled once per setting of a module-level constant.

Numba freezes a global's value into the machine code it compiles, so a branch on a global that is false is removed
from it, with the registers and the code size the branch took. An argument's value is known only at run time: its
branches stay in every copy, and in a kernel as large as the chain of hops' E-step they slow the rows that never
take them (see :func:`~dist_respattn.model.heads.hops.kernels.hop_estep`).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

import numba

__all__ = ["njit_with_constants"]


def njit_with_constants(py_func: Callable[..., Any], name: str, constants: Mapping[str, object], **options: Any) -> Any:
    """``py_func`` compiled by ``numba.njit(**options)`` as ``name``, reading ``constants`` ({global name: value}) as
    its module's globals, in this copy only.

    The copy sees the module's globals as they are when this is called (define it below every function the body
    calls). It has its own ``__qualname__``: numba's on-disk cache names its entries by it, so each copy keeps its
    own entry (copies of one name would load each other's machine code).
    """
    copy = types.FunctionType(
        py_func.__code__, {**py_func.__globals__, **constants}, name, py_func.__defaults__, py_func.__closure__
    )
    copy.__qualname__ = name
    copy.__doc__ = py_func.__doc__
    copy.__module__ = py_func.__module__
    return numba.njit(**options)(copy)
