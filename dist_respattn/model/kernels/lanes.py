"""Loops over blocks of 8 float64 lanes (one 512-bit vector, two 256-bit ones) usable inside numba kernels.

Numba leaves LLVM's superword vectorizer off, and its loop vectorizer takes only innermost loops: a loop over 8
positions with an accumulator per position, or over D dimensions with a sum over a few sources inside, then runs
one number at a time or ends each pass in a horizontal sum. These intrinsics write the two loops of the
chain-of-hops E-step that are small matrix products as vector code: the squared distances of one query to a block
of 8 keys (stored dimension-major), and a weighted sum of table rows added into a row. Each lane adds its terms in
the same order every time (deterministic, whatever the caller's row order).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "LANES",
    "add_four_products",
    "add_weighted_rows",
    "add_window_rows_8",
    "sq_distances_8",
    "transition_dots_8",
    "transition_logs_8",
]

#: Lanes of a block: the keys of one :func:`sq_distances_8`, the dimensions of one step of :func:`add_weighted_rows`.
LANES = 8

_GROUP = 4  # vectors of a row :func:`add_weighted_rows` holds a pass over its sources
_DOUBLE = ir.DoubleType()
_VECTOR = ir.VectorType(_DOUBLE, LANES)


def _splat(builder: Any, value: Any) -> Any:  # pragma: no cover - compiled
    undefined = ir.Constant(_VECTOR, ir.Undefined)
    one = builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, undefined, ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


def _fma(builder: Any, a: Any, b: Any, c: Any) -> Any:  # pragma: no cover - compiled
    fnty = ir.FunctionType(_VECTOR, [_VECTOR, _VECTOR, _VECTOR])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.v8f64")
    return builder.call(fn, [a, b, c])


def _vector_at(builder: Any, ptr: Any) -> Any:  # pragma: no cover - compiled
    return builder.bitcast(ptr, _VECTOR.as_pointer())


def _shuffle_add(builder: Any, a: Any, b: Any, first: list[int], second: list[int]) -> Any:  # pragma: no cover
    """``shuffle(a, b, first) + shuffle(a, b, second)`` (indices into the 16 lanes of ``a`` then ``b``)."""
    i32s = ir.VectorType(ir.IntType(32), LANES)
    return builder.fadd(
        builder.shuffle_vector(a, b, ir.Constant(i32s, first)), builder.shuffle_vector(a, b, ir.Constant(i32s, second))
    )


def _sq_distances_8(typingctx, queries, row, keys, h, symbols, lo, n, out, at, scale):  # pragma: no cover
    """``sq_distances_8(queries, row, keys, h, symbols, lo, n, out, at, scale)``: ``out[at + k] = scale * sum_d
    (queries[row, d] - keys[h, symbols[lo + min(k, n - 1)], d]) ** 2`` for ``k < 8`` (``n >= 1``; lanes past ``n``
    repeat the last key); ``queries`` a C-order (S', D) float64 table, ``keys`` (H, S, D), ``D`` a multiple of 8 (the
    caller's check), ``out`` (>= at + 8,) float64. A step holds 8 dimensions of the query and of each key: each key's
    8 partial sums are then added by a transposing tree, so the 8 distances leave in one vector, no horizontal sum
    each. Deterministic: every distance's terms are added in the same order."""
    sig = types.void(queries, row, keys, h, symbols, lo, n, out, at, scale)

    def codegen(context, builder, signature, args):
        out_ty, at_ty = signature.args[7], signature.args[8]
        total = _distances_vector(context, builder, signature.args[:7], args[:7])
        res = context.make_array(out_ty)(context, builder, args[7])
        at_i = context.cast(builder, args[8], at_ty, types.intp)
        out_ptr = cgutils.get_item_pointer(context, builder, out_ty, res, [at_i], wraparound=False)
        builder.store(builder.fmul(total, _splat(builder, args[9])), _vector_at(builder, out_ptr), align=8)
        return context.get_dummy_value()

    return sig, codegen


def _distances_vector(context: Any, builder: Any, arg_types: Any, args: Any) -> Any:  # pragma: no cover - compiled
    """The vector of :func:`sq_distances_8`'s 8 sums (unscaled) from its first 7 arguments ``(queries, row, keys, h,
    symbols, lo, n)``."""
    q_ty, row_ty, k_ty, h_ty, s_ty, lo_ty, n_ty = arg_types
    intp = context.get_value_type(types.intp)

    def as_intp(value, ty):
        return context.cast(builder, value, ty, types.intp)

    q = context.make_array(q_ty)(context, builder, args[0])
    keys_a = context.make_array(k_ty)(context, builder, args[2])
    sym = context.make_array(s_ty)(context, builder, args[4])
    row_i, h_i, lo_i = as_intp(args[1], row_ty), as_intp(args[3], h_ty), as_intp(args[5], lo_ty)
    n_i = as_intp(args[6], n_ty)
    dim = cgutils.unpack_tuple(builder, q.shape, 2)[1]
    q_row = cgutils.get_item_pointer(context, builder, q_ty, q, [row_i, intp(0)], wraparound=False)
    rows = []
    last = builder.sub(n_i, intp(1))
    for k in range(LANES):
        kk = builder.select(builder.icmp_signed("<", intp(k), last), intp(k), last)
        s_ptr = cgutils.get_item_pointer(context, builder, s_ty, sym, [builder.add(lo_i, kk)], wraparound=False)
        s = context.cast(builder, builder.load(s_ptr), s_ty.dtype, types.intp)
        rows.append(cgutils.get_item_pointer(context, builder, k_ty, keys_a, [h_i, s, intp(0)], wraparound=False))
    zero = ir.Constant(_VECTOR, [0.0] * LANES)
    accs = [cgutils.alloca_once_value(builder, zero) for _ in range(LANES)]
    with cgutils.for_range(builder, builder.udiv(dim, intp(LANES))) as step:
        d0 = builder.mul(step.index, intp(LANES))
        qv = builder.load(_vector_at(builder, builder.gep(q_row, [d0])), align=8)
        for k in range(LANES):
            kv = builder.load(_vector_at(builder, builder.gep(rows[k], [d0])), align=8)
            v = builder.fsub(qv, kv)
            builder.store(_fma(builder, v, v, builder.load(accs[k])), accs[k])
    return _transposed_sum(builder, [builder.load(acc) for acc in accs])


def _transposed_sum(builder: Any, a: list[Any]) -> Any:  # pragma: no cover - compiled
    """The 8 vectors' lane sums in one vector (lane k: the sum of ``a[k]``'s lanes, in the order
    ``((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))``), by a transposing tree of shuffles and adds."""
    evens, odds = [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15]
    t = [_shuffle_add(builder, a[2 * k], a[2 * k + 1], evens, odds) for k in range(4)]
    u = [_shuffle_add(builder, t[2 * k], t[2 * k + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
         for k in range(2)]  # fmt: skip
    return _shuffle_add(builder, u[0], u[1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])


# exp_nonpositive_range's constants (dist_respattn.model.kernels.log_weights), its numbers lane by lane.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_EXP_MIN = -708.0
_TAYLOR = [1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
           1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0]  # fmt: skip


def _exp_nonpositive(builder: Any, x: Any, fused: bool = False) -> Any:  # pragma: no cover - compiled
    """``exp`` of 8 lanes as :func:`~dist_respattn.model.kernels.log_weights.exp_nonpositive_range` computes it
    (the same operations in the same order, no fused multiply-add: the same numbers), in registers; with ``fused``
    the polynomial's steps are fused multiply-adds (half the operations, not the same numbers: within an ulp or
    two)."""

    def splat(value: float) -> Any:
        return ir.Constant(_VECTOR, [value] * LANES)

    v = builder.select(builder.fcmp_ordered(">", x, splat(_EXP_MIN)), x, splat(_EXP_MIN))
    floor = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VECTOR, [_VECTOR]), "llvm.floor.v8f64")
    if fused:
        k = builder.call(floor, [_fma(builder, v, splat(_LOG2E), splat(0.5))])
        r = _fma(builder, k, splat(-_LN2_LO), _fma(builder, k, splat(-_LN2_HI), v))
    else:
        k = builder.call(floor, [builder.fadd(builder.fmul(v, splat(_LOG2E)), splat(0.5))])
        r = builder.fsub(builder.fsub(v, builder.fmul(k, splat(_LN2_HI))), builder.fmul(k, splat(_LN2_LO)))
    p = splat(1.0 / 6227020800.0)
    for c in _TAYLOR:
        p = _fma(builder, p, r, splat(c)) if fused else builder.fadd(builder.fmul(p, r), splat(c))
    i64s = ir.VectorType(ir.IntType(64), LANES)
    biased = builder.add(builder.fptosi(k, i64s), ir.Constant(i64s, [1023] * LANES))
    scale = builder.bitcast(builder.shl(biased, ir.Constant(i64s, [52] * LANES)), _VECTOR)
    return builder.select(builder.fcmp_ordered(">=", x, splat(_EXP_MIN)), builder.fmul(p, scale), splat(0.0))


def _transpose_8(builder: Any, rows: list[Any]) -> list[Any]:  # pragma: no cover - compiled
    """The 8 x 8 transpose of 8 vectors: ``out[d]`` holds lane ``d`` of ``rows[0], ..., rows[7]`` (3 rounds of 8
    shuffles)."""
    i32s = ir.VectorType(ir.IntType(32), LANES)

    def shuffle(a: Any, b: Any, pattern: list[int]) -> Any:
        return builder.shuffle_vector(a, b, ir.Constant(i32s, pattern))

    first = []
    for p in range(4):
        a, b = rows[2 * p], rows[2 * p + 1]
        first += [shuffle(a, b, [0, 8, 2, 10, 4, 12, 6, 14]), shuffle(a, b, [1, 9, 3, 11, 5, 13, 7, 15])]
    second = []
    for q in range(2):
        for e in range(2):
            a, b = first[4 * q + e], first[4 * q + 2 + e]
            second += [shuffle(a, b, [0, 1, 8, 9, 4, 5, 12, 13]), shuffle(a, b, [2, 3, 10, 11, 6, 7, 14, 15])]
    third = []
    for e in range(4):
        a, b = second[e], second[4 + e]
        third += [shuffle(a, b, [0, 1, 2, 3, 8, 9, 10, 11]), shuffle(a, b, [4, 5, 6, 7, 12, 13, 14, 15])]
    lane_of = [0, 4, 2, 6, 1, 5, 3, 7]  # third[k] holds lane lane_of[k] of the rows
    out = [None] * LANES
    for k, d in enumerate(lane_of):
        out[d] = third[k]
    return out


def _transition_logs_8(typingctx, queries, keys, h, symbols, lo, scale, bias, out, o0, shifts, s0):  # pragma: no cover
    """``transition_logs_8(queries, keys, h, symbols, lo, scale, bias, out, o0, shifts, s0)``: a later hop's
    transitions over a window of 8 positions ``symbols[lo : lo + 8]``, each source's row shifted by its largest. For
    source ``i``, with ``lv[k] = bias[k] + scale * d[k]`` and ``d[k]`` the squared distance of ``queries[symbols[lo +
    i]]`` to the key ``keys[h, symbols[lo + k]]`` (its terms added in the order of the dimensions):
    ``shifts[s0 + i] = max(lv)`` and ``out[o0 + 8 i + k] = exp(lv[k] - max(lv))`` (0 for all 8 when ``max(lv)`` is
    ``-inf``), the exponential :func:`~dist_respattn.model.kernels.log_weights.exp_nonpositive_range`'s numbers.
    Each step transposes 8 dimensions of the 8 keys (8 vectors of 8 keys' numbers) and adds every source's terms
    into its own vector, each query number broadcast: the 8 sources' distances leave in 8 vectors, no sum across
    lanes. ``D`` a multiple of 8 (the caller's check); ``bias`` (>= 8,), ``out`` (>= o0 + 64,) and ``shifts``
    (>= s0 + 8,) float64. The E-step now takes :func:`transition_dots_8`; this one (the distances taken directly,
    the exponentials bit for bit) stays for the kernels before it, which ``bench_hops.py --previous`` times."""
    sig = types.void(queries, keys, h, symbols, lo, scale, bias, out, o0, shifts, s0)

    def codegen(context, builder, signature, args):
        q_ty, k_ty, h_ty, s_ty, lo_ty, _, b_ty, out_ty, o0_ty, sh_ty, s0_ty = signature.args
        intp = context.get_value_type(types.intp)

        def as_intp(value, ty):
            return context.cast(builder, value, ty, types.intp)

        q = context.make_array(q_ty)(context, builder, args[0])
        keys_a = context.make_array(k_ty)(context, builder, args[1])
        sym = context.make_array(s_ty)(context, builder, args[3])
        b_arr = context.make_array(b_ty)(context, builder, args[6])
        res = context.make_array(out_ty)(context, builder, args[7])
        sh_arr = context.make_array(sh_ty)(context, builder, args[9])
        h_i, lo_i, s0_i = as_intp(args[2], h_ty), as_intp(args[4], lo_ty), as_intp(args[10], s0_ty)
        o0_i = as_intp(args[8], o0_ty)
        dim = cgutils.unpack_tuple(builder, q.shape, 2)[1]

        def symbol(k):
            ptr = cgutils.get_item_pointer(context, builder, s_ty, sym, [builder.add(lo_i, intp(k))], wraparound=False)
            return context.cast(builder, builder.load(ptr), s_ty.dtype, types.intp)

        key_rows, query_rows = [], []
        for k in range(LANES):
            c = symbol(k)
            key_rows.append(
                cgutils.get_item_pointer(context, builder, k_ty, keys_a, [h_i, c, intp(0)], wraparound=False)
            )
            query_rows.append(cgutils.get_item_pointer(context, builder, q_ty, q, [c, intp(0)], wraparound=False))
        zero = ir.Constant(_VECTOR, [0.0] * LANES)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(LANES)]
        with cgutils.for_range(builder, builder.udiv(dim, intp(LANES))) as step:
            d0 = builder.mul(step.index, intp(LANES))
            columns = _transpose_8(
                builder, [builder.load(_vector_at(builder, builder.gep(r, [d0])), align=8) for r in key_rows]
            )
            for d in range(LANES):
                at = builder.add(d0, intp(d))
                for i in range(LANES):
                    v = builder.fsub(columns[d], _splat(builder, builder.load(builder.gep(query_rows[i], [at]))))
                    builder.store(_fma(builder, v, v, builder.load(accs[i])), accs[i])
        b_ptr = cgutils.get_item_pointer(context, builder, b_ty, b_arr, [intp(0)], wraparound=False)
        bias_v = builder.load(_vector_at(builder, b_ptr), align=8)
        scale_v = _splat(builder, args[5])
        i32s = ir.VectorType(ir.IntType(32), LANES)
        minus_inf = ir.Constant(_DOUBLE, float("-inf"))
        for i in range(LANES):
            lv = builder.fadd(bias_v, builder.fmul(builder.load(accs[i]), scale_v))
            top = lv
            for pattern in ([4, 5, 6, 7, 0, 1, 2, 3], [2, 3, 0, 1, 6, 7, 4, 5], [1, 0, 3, 2, 5, 4, 7, 6]):
                other = builder.shuffle_vector(top, top, ir.Constant(i32s, pattern))
                top = builder.select(builder.fcmp_ordered(">", other, top), other, top)
            best = builder.extract_element(top, ir.Constant(ir.IntType(32), 0))
            reached = builder.fcmp_ordered(">", best, minus_inf)
            shifted = builder.select(reached, builder.fsub(lv, top), ir.Constant(_VECTOR, [float("-inf")] * LANES))
            out_at = builder.add(o0_i, intp(LANES * i))
            out_ptr = cgutils.get_item_pointer(context, builder, out_ty, res, [out_at], wraparound=False)
            builder.store(_exp_nonpositive(builder, shifted), _vector_at(builder, out_ptr), align=8)
            sh_ptr = cgutils.get_item_pointer(
                context, builder, sh_ty, sh_arr, [builder.add(s0_i, intp(i))], wraparound=False
            )
            builder.store(best, sh_ptr)
        return context.get_dummy_value()

    return sig, codegen


def _transition_dots_8(
    typingctx, queries, query_norms, keys, key_norms, h, symbols, lo, scale, bias, common, out, o0, shifts, s0
):  # pragma: no cover - compiled
    """``transition_dots_8(queries, query_norms, keys, key_norms, h, symbols, lo, scale, bias, common, out, o0,
    shifts, s0)``: :func:`transition_logs_8`'s transitions with each squared distance taken as ``max(|q|^2 + |k|^2 -
    2 q.k, 0)`` from the norms ``query_norms[s] = |queries[s]|^2`` (S,) and ``key_norms[h, s] = |keys[h, s]|^2``
    (H, S), read once a symbol: one product a pair (a fused multiply-add a dimension) instead of a difference and its
    square. The distances then differ from the direct ones by rounding of the order of ``2^-52 (|q|^2 + |k|^2)``
    (the clamp keeps a near-zero one from going negative), and the exponentials are :func:`_exp_nonpositive`'s
    with fused multiply-adds. With ``common`` true every source's row is shifted by the largest of all 64
    log-values instead of its own (``shifts[s0 + i]`` that one number for every ``i``): the transitions are then the
    unshifted ones times one factor, and a forward pass needs no exponential of the row shifts."""
    sig = types.void(queries, query_norms, keys, key_norms, h, symbols, lo, scale, bias, common, out, o0, shifts, s0)

    def codegen(context, builder, signature, args):
        q_ty, qn_ty, k_ty, kn_ty, h_ty, s_ty, lo_ty, _, b_ty, c_ty, out_ty, o0_ty, sh_ty, s0_ty = signature.args
        intp = context.get_value_type(types.intp)

        def as_intp(value, ty):
            return context.cast(builder, value, ty, types.intp)

        q = context.make_array(q_ty)(context, builder, args[0])
        qn = context.make_array(qn_ty)(context, builder, args[1])
        keys_a = context.make_array(k_ty)(context, builder, args[2])
        kn = context.make_array(kn_ty)(context, builder, args[3])
        sym = context.make_array(s_ty)(context, builder, args[5])
        b_arr = context.make_array(b_ty)(context, builder, args[8])
        common = context.cast(builder, args[9], c_ty, types.boolean)
        res = context.make_array(out_ty)(context, builder, args[10])
        sh_arr = context.make_array(sh_ty)(context, builder, args[12])
        h_i, lo_i, s0_i = as_intp(args[4], h_ty), as_intp(args[6], lo_ty), as_intp(args[13], s0_ty)
        o0_i = as_intp(args[11], o0_ty)
        dim = cgutils.unpack_tuple(builder, q.shape, 2)[1]

        def symbol(k):
            ptr = cgutils.get_item_pointer(context, builder, s_ty, sym, [builder.add(lo_i, intp(k))], wraparound=False)
            return context.cast(builder, builder.load(ptr), s_ty.dtype, types.intp)

        key_rows, query_rows, query_sq = [], [], []
        key_sq = ir.Constant(_VECTOR, ir.Undefined)
        for k in range(LANES):
            c = symbol(k)
            key_rows.append(
                cgutils.get_item_pointer(context, builder, k_ty, keys_a, [h_i, c, intp(0)], wraparound=False)
            )
            query_rows.append(cgutils.get_item_pointer(context, builder, q_ty, q, [c, intp(0)], wraparound=False))
            query_sq.append(builder.load(cgutils.get_item_pointer(context, builder, qn_ty, qn, [c], wraparound=False)))
            kn_ptr = cgutils.get_item_pointer(context, builder, kn_ty, kn, [h_i, c], wraparound=False)
            key_sq = builder.insert_element(key_sq, builder.load(kn_ptr), ir.Constant(ir.IntType(32), k))
        zero = ir.Constant(_VECTOR, [0.0] * LANES)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(LANES)]
        with cgutils.for_range(builder, builder.udiv(dim, intp(LANES))) as step:
            d0 = builder.mul(step.index, intp(LANES))
            columns = _transpose_8(
                builder, [builder.load(_vector_at(builder, builder.gep(r, [d0])), align=8) for r in key_rows]
            )
            for d in range(LANES):
                at = builder.add(d0, intp(d))
                for i in range(LANES):
                    qv = _splat(builder, builder.load(builder.gep(query_rows[i], [at])))
                    builder.store(_fma(builder, columns[d], qv, builder.load(accs[i])), accs[i])
        b_ptr = cgutils.get_item_pointer(context, builder, b_ty, b_arr, [intp(0)], wraparound=False)
        bias_v = builder.load(_vector_at(builder, b_ptr), align=8)
        scale_v = _splat(builder, args[7])
        minus_two = ir.Constant(_VECTOR, [-2.0] * LANES)
        lvs, tops = [], []
        for i in range(LANES):
            norms = builder.fadd(key_sq, _splat(builder, query_sq[i]))
            dist = _fma(builder, builder.load(accs[i]), minus_two, norms)
            dist = builder.select(builder.fcmp_ordered(">", dist, zero), dist, zero)
            lvs.append(builder.fadd(bias_v, builder.fmul(dist, scale_v)))
            tops.append(_lane_max(builder, lvs[-1]))
        largest = tops[0]
        for top in tops[1:]:
            largest = builder.select(builder.fcmp_ordered(">", top, largest), top, largest)
        for i in range(LANES):
            top = builder.select(common, largest, tops[i])
            _shifted_exps(context, builder, lvs[i], top, res, out_ty, o0_i, i, sh_arr, sh_ty, s0_i, True)
        return context.get_dummy_value()

    return sig, codegen


def _lane_max(builder: Any, v: Any) -> Any:  # pragma: no cover - compiled
    """The largest of ``v``'s 8 lanes in every lane (3 shuffles and compares)."""
    i32s = ir.VectorType(ir.IntType(32), LANES)
    top = v
    for pattern in ([4, 5, 6, 7, 0, 1, 2, 3], [2, 3, 0, 1, 6, 7, 4, 5], [1, 0, 3, 2, 5, 4, 7, 6]):
        other = builder.shuffle_vector(top, top, ir.Constant(i32s, pattern))
        top = builder.select(builder.fcmp_ordered(">", other, top), other, top)
    return top


def _shifted_exps(context, builder, lv, top, res, out_ty, o0_i, i, sh_arr, sh_ty, s0_i, fused):  # pragma: no cover
    """Source ``i``'s log-values ``lv`` (8 lanes) shifted by ``top`` (a vector of one number): it into ``shifts[s0 +
    i]`` and ``exp(lv - top)`` into ``out[o0 + 8 i : o0 + 8 i + 8]`` (0 for all 8 when it is ``-inf``)."""
    intp = context.get_value_type(types.intp)
    minus_inf = ir.Constant(_DOUBLE, float("-inf"))
    best = builder.extract_element(top, ir.Constant(ir.IntType(32), 0))
    reached = builder.fcmp_ordered(">", best, minus_inf)
    shifted = builder.select(reached, builder.fsub(lv, top), ir.Constant(_VECTOR, [float("-inf")] * LANES))
    out_at = builder.add(o0_i, intp(LANES * i))
    out_ptr = cgutils.get_item_pointer(context, builder, out_ty, res, [out_at], wraparound=False)
    builder.store(_exp_nonpositive(builder, shifted, fused), _vector_at(builder, out_ptr), align=8)
    sh_ptr = cgutils.get_item_pointer(context, builder, sh_ty, sh_arr, [builder.add(s0_i, intp(i))], wraparound=False)
    builder.store(best, sh_ptr)


def _add_weighted_rows(typingctx, dst, h, row, table, symbols, lo, n, weights, w0, stride):  # pragma: no cover
    """``add_weighted_rows(dst, h, row, table, symbols, lo, n, weights, w0, stride)``: ``dst[h, row, d] += sum_k
    weights[w0 + k * stride] * table[symbols[lo + k], d]`` for ``k < n``, ``d < D``; ``dst`` a C-order (H, S, D)
    float64 array, ``table`` (S', D), ``D`` a multiple of 8 (the caller's check). A pass holds 32 dimensions of the
    row in 4 vectors (then any 8 left, one vector a pass) and adds the ``n`` sources into them in order of ``k``,
    each source's weight loaded once a pass, each term by one fused multiply-add."""
    sig = types.void(dst, h, row, table, symbols, lo, n, weights, w0, stride)

    def codegen(context, builder, signature, args):
        dst_ty, h_ty, row_ty, t_ty, s_ty, lo_ty, n_ty, w_ty, w0_ty, st_ty = signature.args
        intp = context.get_value_type(types.intp)

        def as_intp(value, ty):
            return context.cast(builder, value, ty, types.intp)

        out = context.make_array(dst_ty)(context, builder, args[0])
        tab = context.make_array(t_ty)(context, builder, args[3])
        sym = context.make_array(s_ty)(context, builder, args[4])
        wts = context.make_array(w_ty)(context, builder, args[7])
        h_i, row_i, lo_i = as_intp(args[1], h_ty), as_intp(args[2], row_ty), as_intp(args[5], lo_ty)
        n_i, w0_i, st_i = as_intp(args[6], n_ty), as_intp(args[8], w0_ty), as_intp(args[9], st_ty)
        dim = cgutils.unpack_tuple(builder, tab.shape, 2)[1]
        out_row = cgutils.get_item_pointer(context, builder, dst_ty, out, [h_i, row_i, intp(0)], wraparound=False)
        accs = [cgutils.alloca_once(builder, _VECTOR) for _ in range(_GROUP)]

        def add_sources(d0, width):
            """Dimensions d0 .. d0 + 8 width of the row: ``width`` vectors held while the n sources are added."""
            ptrs = [_vector_at(builder, builder.gep(out_row, [builder.add(d0, intp(LANES * g))])) for g in range(width)]
            for g in range(width):
                builder.store(builder.load(ptrs[g], align=8), accs[g])
            with cgutils.for_range(builder, n_i) as source:
                k = source.index
                s_ptr = cgutils.get_item_pointer(context, builder, s_ty, sym, [builder.add(lo_i, k)], wraparound=False)
                s = context.cast(builder, builder.load(s_ptr), s_ty.dtype, types.intp)
                w_at = builder.add(w0_i, builder.mul(k, st_i))
                w_ptr = cgutils.get_item_pointer(context, builder, w_ty, wts, [w_at], wraparound=False)
                wv = _splat(builder, builder.load(w_ptr))
                t_ptr = cgutils.get_item_pointer(context, builder, t_ty, tab, [s, d0], wraparound=False)
                for g in range(width):
                    tv = builder.load(_vector_at(builder, builder.gep(t_ptr, [intp(LANES * g)])), align=8)
                    builder.store(_fma(builder, wv, tv, builder.load(accs[g])), accs[g])
            for g in range(width):
                builder.store(builder.load(accs[g]), ptrs[g], align=8)

        # Groups of 4 vectors (32 dimensions) a pass over the sources, then the rest one vector a pass.
        groups = builder.udiv(dim, intp(LANES * _GROUP))
        with cgutils.for_range(builder, groups) as group:
            add_sources(builder.mul(group.index, intp(LANES * _GROUP)), _GROUP)
        rest = builder.udiv(builder.urem(dim, intp(LANES * _GROUP)), intp(LANES))
        with cgutils.for_range(builder, rest) as step:
            add_sources(builder.add(builder.mul(groups, intp(LANES * _GROUP)), builder.mul(step.index, intp(LANES))), 1)
        return context.get_dummy_value()

    return sig, codegen


def _window_rows(n_rows: int, group: int) -> Any:  # pragma: no cover - compiled
    """The typing function of an intrinsic ``f(dst, h, table, symbols, lo, n, weights, j0, stride)`` adding into
    ``n_rows`` rows at once what :func:`add_weighted_rows` adds into one: row ``r`` is ``dst[h, symbols[lo + j0 + r]]``
    with the weights ``weights[j0 + r + k * stride]`` (a window's destinations ``j0 .. j0 + n_rows - 1``, which must
    hold distinct symbols: each row is read before any is written). Each table row is loaded once for all of them
    and each row's terms are added in the order :func:`add_weighted_rows` adds them (the same numbers); a pass holds
    ``8 group`` dimensions of every row, then any 8 left one vector a pass."""

    def typer(typingctx, dst, h, table, symbols, lo, n, weights, j0, stride):
        sig = types.void(dst, h, table, symbols, lo, n, weights, j0, stride)

        def codegen(context, builder, signature, args):
            dst_ty, h_ty, t_ty, s_ty, lo_ty, n_ty, w_ty, j0_ty, st_ty = signature.args
            intp = context.get_value_type(types.intp)

            def as_intp(value, ty):
                return context.cast(builder, value, ty, types.intp)

            out = context.make_array(dst_ty)(context, builder, args[0])
            tab = context.make_array(t_ty)(context, builder, args[2])
            sym = context.make_array(s_ty)(context, builder, args[3])
            wts = context.make_array(w_ty)(context, builder, args[6])
            h_i, lo_i, n_i = as_intp(args[1], h_ty), as_intp(args[4], lo_ty), as_intp(args[5], n_ty)
            j0_i, st_i = as_intp(args[7], j0_ty), as_intp(args[8], st_ty)
            dim = cgutils.unpack_tuple(builder, tab.shape, 2)[1]

            def symbol(at):
                ptr = cgutils.get_item_pointer(context, builder, s_ty, sym, [builder.add(lo_i, at)], wraparound=False)
                return context.cast(builder, builder.load(ptr), s_ty.dtype, types.intp)

            out_rows = [
                cgutils.get_item_pointer(
                    context, builder, dst_ty, out, [h_i, symbol(builder.add(j0_i, intp(r))), intp(0)], wraparound=False
                )
                for r in range(n_rows)
            ]
            accs = [[cgutils.alloca_once(builder, _VECTOR) for _ in range(group)] for _ in range(n_rows)]

            def add_sources(d0, width):
                """Dimensions d0 .. d0 + 8 width of every row, held while the n sources are added."""
                ptrs = [
                    [_vector_at(builder, builder.gep(o, [builder.add(d0, intp(LANES * g))])) for g in range(width)]
                    for o in out_rows
                ]
                for r in range(n_rows):
                    for g in range(width):
                        builder.store(builder.load(ptrs[r][g], align=8), accs[r][g])
                with cgutils.for_range(builder, n_i) as source:
                    k = source.index
                    base = builder.add(j0_i, builder.mul(k, st_i))
                    wvs = []
                    for r in range(n_rows):
                        w_at = builder.add(base, intp(r))
                        w_ptr = cgutils.get_item_pointer(context, builder, w_ty, wts, [w_at], wraparound=False)
                        wvs.append(_splat(builder, builder.load(w_ptr)))
                    t_ptr = cgutils.get_item_pointer(context, builder, t_ty, tab, [symbol(k), d0], wraparound=False)
                    for g in range(width):
                        tv = builder.load(_vector_at(builder, builder.gep(t_ptr, [intp(LANES * g)])), align=8)
                        for r in range(n_rows):
                            builder.store(_fma(builder, wvs[r], tv, builder.load(accs[r][g])), accs[r][g])
                for r in range(n_rows):
                    for g in range(width):
                        builder.store(builder.load(accs[r][g]), ptrs[r][g], align=8)

            groups = builder.udiv(dim, intp(LANES * group))
            with cgutils.for_range(builder, groups) as step:
                add_sources(builder.mul(step.index, intp(LANES * group)), group)
            rest = builder.udiv(builder.urem(dim, intp(LANES * group)), intp(LANES))
            with cgutils.for_range(builder, rest) as step:
                add_sources(
                    builder.add(builder.mul(groups, intp(LANES * group)), builder.mul(step.index, intp(LANES))), 1
                )
            return context.get_dummy_value()

        return sig, codegen

    return typer


def _add_four_products(typingctx, dst, table, rows, ys):  # pragma: no cover - compiled
    """``add_four_products(dst, table, rows, ys)``: ``dst[k, d] += ((table[rows[0], k] ys[0, d] + table[rows[1], k]
    ys[1, d]) + table[rows[2], k] ys[2, d]) + table[rows[3], k] ys[3, d]`` for every k < K and d < D, each sum in
    that order (the scalar loop's numbers, 8 lanes at a time, no fused multiply-add); ``dst`` a C-order (K, D)
    float64 array, ``table`` (V, K) float64, ``rows`` 4 int64 row indices, ``ys`` (4, D) float64 C-order, ``D`` a
    multiple of 8 (the caller's check). A pass holds 32 dimensions of the four ``ys`` rows in 16 vectors (then any 8
    left, 4 vectors a pass) and goes over the K rows of ``dst``, each row's 4 weights loaded once a pass."""
    sig = types.void(dst, table, rows, ys)

    def codegen(context, builder, signature, args):
        dst_ty, t_ty, r_ty, y_ty = signature.args
        intp = context.get_value_type(types.intp)
        out = context.make_array(dst_ty)(context, builder, args[0])
        tab = context.make_array(t_ty)(context, builder, args[1])
        idx = context.make_array(r_ty)(context, builder, args[2])
        yarr = context.make_array(y_ty)(context, builder, args[3])
        n_rows_out, dim = cgutils.unpack_tuple(builder, out.shape, 2)
        rows = []
        for i in range(4):
            ptr = cgutils.get_item_pointer(context, builder, r_ty, idx, [intp(i)], wraparound=False)
            rows.append(context.cast(builder, builder.load(ptr), r_ty.dtype, types.intp))

        def add_rows(d0, width):
            """Dimensions d0 .. d0 + 8 width: the ``ys`` vectors held while every row of ``dst`` gets its terms."""
            yv = []
            for i in range(4):
                y_ptr = cgutils.get_item_pointer(context, builder, y_ty, yarr, [intp(i), d0], wraparound=False)
                yv.append([builder.load(_vector_at(builder, builder.gep(y_ptr, [intp(LANES * g)])), align=8)
                           for g in range(width)])  # fmt: skip
            with cgutils.for_range(builder, n_rows_out) as cell:
                k = cell.index
                weights = []
                for i in range(4):
                    w_ptr = cgutils.get_item_pointer(context, builder, t_ty, tab, [rows[i], k], wraparound=False)
                    weights.append(_splat(builder, builder.load(w_ptr)))
                o_ptr = cgutils.get_item_pointer(context, builder, dst_ty, out, [k, d0], wraparound=False)
                for g in range(width):
                    at = _vector_at(builder, builder.gep(o_ptr, [intp(LANES * g)]))
                    term = builder.fadd(builder.fmul(weights[0], yv[0][g]), builder.fmul(weights[1], yv[1][g]))
                    term = builder.fadd(term, builder.fmul(weights[2], yv[2][g]))
                    term = builder.fadd(term, builder.fmul(weights[3], yv[3][g]))
                    builder.store(builder.fadd(builder.load(at, align=8), term), at, align=8)

        groups = builder.udiv(dim, intp(LANES * _GROUP))
        with cgutils.for_range(builder, groups) as group:
            add_rows(builder.mul(group.index, intp(LANES * _GROUP)), _GROUP)
        rest = builder.udiv(builder.urem(dim, intp(LANES * _GROUP)), intp(LANES))
        with cgutils.for_range(builder, rest) as step:
            add_rows(builder.add(builder.mul(groups, intp(LANES * _GROUP)), builder.mul(step.index, intp(LANES))), 1)
        return context.get_dummy_value()

    return sig, codegen


# Typed as Any: the intrinsics' call signatures exist only inside numba's typing, not for mypy.
sq_distances_8: Any = intrinsic(_sq_distances_8)
add_weighted_rows: Any = intrinsic(_add_weighted_rows)
add_window_rows_8: Any = intrinsic(_window_rows(8, 2))
transition_logs_8: Any = intrinsic(_transition_logs_8)
add_four_products: Any = intrinsic(_add_four_products)
transition_dots_8: Any = intrinsic(_transition_dots_8)
