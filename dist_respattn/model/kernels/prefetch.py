"""Software prefetches usable inside numba kernels (LLVM's ``llvm.prefetch``); they never change results."""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prefetch_element", "prefetch_item"]

_READ, _WRITE = 0, 1


def _prefetch_codegen(will_write: int):  # pragma: no cover - compiled
    """Code generator of a prefetch of ``array[index...]``; ``will_write`` hints a read-modify-write."""

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        index_args = zip(args[1:], signature.args[1:], strict=True)
        index = [context.cast(builder, arg, ty, types.intp) for arg, ty in index_args]
        ptr = cgutils.get_item_pointer(context, builder, array_type, ary, index, wraparound=False)
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # Arguments: address, read (0) or write (1), locality 3 (keep in all cache levels), data cache.
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), i32(will_write), i32(3), i32(1)])
        return context.get_dummy_value()

    return codegen


def _prefetch_item(typingctx, array, i, j):  # pragma: no cover - compiled
    """``prefetch_item(array, i, j)``: ``array[i, j]`` of a 2-D array will be read and written soon."""
    return types.void(array, i, j), _prefetch_codegen(_WRITE)


def _prefetch_element(typingctx, array, i):  # pragma: no cover - compiled
    """``prefetch_element(array, i)``: ``array[i]`` of a 1-D array will be read soon."""
    return types.void(array, i), _prefetch_codegen(_READ)


# Typed as Any: the intrinsics' call signatures exist only inside numba's typing, not for mypy.
prefetch_item: Any = intrinsic(_prefetch_item)
prefetch_element: Any = intrinsic(_prefetch_element)
