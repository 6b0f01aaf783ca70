"""Inline-PTX wrappers and fragment-coordinate helpers of the sm_90a forward kernels.

Each wrapper is one ``llvm.inline_asm`` statement. Side-effecting statements stay where they
are written (LLVM neither sinks nor hoists them); pure ones may be moved and merged."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# State spaces of :func:`ld_v4`: (PTX space, address type, address constraint).
SHARED = ("shared", Int32, "r")
GLOBAL_NC = ("global.nc", Int64, "l")


def acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """View a wgmma accumulator fragment ((2,2,V),M,N) as (rows, cols) of this thread."""
    s, d = t.layout.shape, t.layout.stride
    layout = cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])),
    )
    return cute.make_tensor(t.iterator, layout)


def acc_as_a_layout(acc_layout: cute.Layout) -> cute.Layout:
    """Register layout of a 16-bit wgmma A fragment covering the same values as a fp32
    accumulator fragment ((2,2,V),1,1): k16 blocks of (2,2,2) values, V/2 of them."""
    v = acc_layout.shape[0][2]
    return cute.make_layout(((2, 2, 2), 1, v // 2), stride=((1, 2, 4), 0, 8))


@dsl_user_op
def cvt_pair_pinned(lo: Float32, hi: Float32, ptx_type: str, *, loc=None, ip=None) -> Uint32:
    """(lo, hi) fp32 -> one 32-bit word of two 16-bit values, as a side-effecting asm statement.

    Why not ``.to()``: LLVM sinks a plain conversion down to its use, the O += P V wgmma of the
    next loop iteration, so the 64 fp32 values of P stay live across the back edge next to the
    new S; at head_dim 128 ptxas then runs out of registers and serialises every wgmma (C7512).
    A side-effecting statement stays where it is written (after the wait for the previous PV)."""
    return Uint32(llvm.inline_asm(
        T.i32(),
        [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
        f"cvt.rn.{ptx_type}x2.f32 $0, $1, $2;",
        "=r,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def asm_pure(args, code: str, cons: str, result=Uint32, *, loc=None, ip=None):
    """One pure asm statement over 32-bit integer registers (``Uint32(a)`` converts a float's
    value: pass bits, see :func:`f32_bits`); the result is ``result`` (Uint32 or Float32)."""
    ty = T.f32() if result is Float32 else T.i32()
    return result(llvm.inline_asm(
        ty, [Uint32(a).ir_value(loc=loc, ip=ip) for a in args], code, cons,
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def f32_bits(x, *, loc=None, ip=None) -> Uint32:
    """The bits of a float (a bitcast: Uint32(x) would convert the value)."""
    return Uint32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def bits_f32(x, *, loc=None, ip=None) -> Float32:
    """The float whose bits are ``x``."""
    return Float32(llvm.bitcast(T.f32(), Uint32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def hmax2(a, b):
    """Per-half max of two packed bf16x2 words."""
    return asm_pure([a, b], "max.bf16x2 $0, $1, $2;", "=r,r,r")


def bf16_lo(w):
    """The low bf16 of a packed word, as a float (exact)."""
    return asm_pure([w], "shl.b32 $0, $1, 16;", "=f,r", Float32)


def bf16_hi(w):
    """The high bf16 of a packed word, as a float (exact)."""
    return asm_pure([w], "and.b32 $0, $1, 0xffff0000;", "=f,r", Float32)


@dsl_user_op
def tanh_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """tanh.approx.f32: one MUFU.TANH (the softcap kernels' only extra cost per score)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "tanh.approx.f32 $0, $1;", "=f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def st_shared_u32(addr: Int32, v: Uint32, *, loc=None, ip=None) -> None:
    """One 32-bit word to shared memory (st.shared.b32)."""
    llvm.inline_asm(
        None, [Int32(addr).ir_value(loc=loc, ip=ip), Uint32(v).ir_value(loc=loc, ip=ip)],
        "st.shared.b32 [$0], $1;", "r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def ld_v4(addr, space=SHARED, *, loc=None, ip=None):
    """16 bytes (one ld.<space>.v4.b32) as four 32-bit words; ``space`` is :data:`SHARED`
    (32-bit shared address) or :data:`GLOBAL_NC` (64-bit global address, read-only path)."""
    name, addr_type, addr_cons = space
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [addr_type(addr).ir_value(loc=loc, ip=ip)],
        f"ld.{name}.v4.b32 {{$0, $1, $2, $3}}, [$4];",
        f"=r,=r,=r,=r,{addr_cons}",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [llvm.extractvalue(T.i32(), res, [i]) for i in range(4)]


@dsl_user_op
def st_global_v4(addr: Int64, words, *, loc=None, ip=None) -> None:
    """16 bytes to global memory (one st.global.v4.b32); ``addr`` 16-byte aligned."""
    llvm.inline_asm(
        None,
        [Int64(addr).ir_value(loc=loc, ip=ip)] + list(words),
        "st.global.v4.b32 [$0], {$1, $2, $3, $4};",
        "l,r,r,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def opaque_u32(x: Int32, *, loc=None, ip=None) -> Int32:
    """``x`` through a side-effecting move: computed where it is written (the compiler can
    neither hoist it into the kernel's prologue nor share it with another warp role's code)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def ld_global_u32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """4 bytes from global memory (ld.global.nc.b32)."""
    return Uint32(llvm.inline_asm(
        T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)], "ld.global.nc.b32 $0, [$1];", "=r,l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def swizzled_offset(row, chunk, slab, rows: int, row_bytes: int):
    """Byte offset of 16-byte chunk ``chunk`` of column slab ``slab`` of row ``row`` in a
    K-major swizzled 16-bit buffer of ``rows`` rows whose swizzle atom rows are ``row_bytes``
    long (128: Swizzle<3,4,3>, head_dim a multiple of 64; 64: Swizzle<2,4,3>, head_dim 96): the
    layout ``sm90_utils.make_smem_layout_a`` gives Q (8-row atoms stacked along the rows, then
    the slabs; the swizzle on the byte address, bits 7.. into bits 4..)."""
    k = row_bytes // 16  # chunks per atom row
    return slab * (rows * row_bytes) + row * row_bytes + ((chunk ^ ((row * k // 8) % k)) * 16)


def in_order(a, b):
    return a, b


def swapped(a, b):
    return b, a


def frag_row(tidx, r):
    """Row (inside the m tile) of row ``r`` (0 or 1) of a wgmma m64 accumulator held by
    consumer thread ``tidx``: warpgroup * 64 + warp * 16 + lane / 4 + 8 * r."""
    return (tidx // 128) * 64 + ((tidx % 128) // 32) * 16 + (tidx % 32) // 4 + 8 * r


def frag_col_static(c: int) -> int:
    """Static part of the column of value ``c`` in an accumulator row (the thread adds
    2 * (lane % 4)): values come in pairs of adjacent columns, pairs 8 columns apart."""
    return (c // 2) * 8 + c % 2


@dsl_user_op
def pack_e4m3x4(a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None) -> Uint32:
    """Four fp32 -> one 32-bit word of four e4m3 (a in the low byte, d in the high byte),
    rounded to nearest, saturated to +-448. A side-effecting statement, like
    :func:`~.ptx.cvt_pair_pinned`: it stays after the wait for the previous PV wgmma."""
    args = [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)]
    return Uint32(llvm.inline_asm(
        T.i32(), args,
        "{ .reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
        "mov.b32 $0, {lo, hi}; }",
        "=r,f,f,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))
