"""Tables fixed for a whole fit (a sparse emission's support): a distributed fit sends each to its workers once."""

from __future__ import annotations

__all__ = ["FitConstant"]


class FitConstant:
    """Marks a table that, once made, is the same object and the same values for the rest of a fit.

    Models, statistics and grid tables of every iteration hold it (a sparse emission's support is in each
    model and each M-step's counts). The engine sends such a table to the workers once a fit, apart, and the
    payloads that hold it by reference (see :mod:`dist_respattn.engine.payload`), so it must never change after
    it is made.
    """

    __slots__ = ()
