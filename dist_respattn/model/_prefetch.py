"""A software prefetch usable inside numba kernels (LLVM's ``llvm.prefetch``)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prefetch_element", "prefetch_item"]


@intrinsic
def prefetch_item(typingctx, array, i, j):  # pragma: no cover - compiled
    """Hint that ``array[i, j]`` (a 2-D array) will be read or written soon; no effect on results."""
    sig = types.void(array, i, j)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        index = [context.cast(builder, args[k], signature.args[k], types.intp) for k in (1, 2)]
        ptr = cgutils.get_item_pointer(context, builder, array_type, ary, index, wraparound=False)
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # rw = 1 (the line will be written: counts are read-modify-written), locality = 3, data cache.
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch_element(typingctx, array, i):  # pragma: no cover - compiled
    """Hint that ``array[i]`` (a 1-D array) will be read soon; no effect on results."""
    sig = types.void(array, i)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        index = [context.cast(builder, args[1], signature.args[1], types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, array_type, ary, index, wraparound=False)
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
