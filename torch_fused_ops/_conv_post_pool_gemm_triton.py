"""Triton kernel, packed-GEMM form: ConvTranspose3d(k=3, s=2, p=1) -> LeakyReLU -> x m -> LeakyReLU -> MaxPool3d(2).

Same computation as ``_conv_post_pool_triton`` (read its docstring for the phase argument), organised as one
implicit GEMM per tile instead of 27 small ones. Every pooled position q reads the 2x2x2 input neighbourhood
x[q..q+1] (K = 8 neighbours x Cin) and produces the 8 conv-output phases of its pool window for each output
channel (N = 8 phases x Cout). The packed weight holds zeros where a phase has no tap from a neighbour (37 of
64 neighbour/phase pairs), so the GEMM does 2.37x the math of the convolution; in exchange it is one K loop
with large tensor-core instructions that Triton pipelines, where the phase-exact kernel issued 27 dots of
K = 16, N = 32 and waited on each weight load.

Pooling happens on the accumulator. When both slopes are > 0 and a channel's multiplier is finite and
non-zero, the epilogue is monotone in the conv output (increasing for m > 0, decreasing for m < 0), so the
pool takes the max (or min) of the raw accumulators and the epilogue runs once per pooled output, as in
post_pool's inference kernels; the only possible difference from the exact order is the sign of a zero on
a +0/-0 tie. Channels whose multiplier is 0, +-inf or NaN, and negative slopes, take the exact path: the
epilogue on every phase and max_pool3d's selection (first maximum, any NaN wins).

float32 with TF32: the tensor cores ignore the low 13 mantissa bits of their operands (truncation, a bias of
about -2^-11 per operand); the kernel rounds the input tile to nearest (cvt.rna) and the host rounds the
packed weight the same way, which is what brings the error down to that of cuDNN's TF32 convolution. TF32
wants the weight K-major (``kmajor``): tensor-core TF32 instructions read B that way only.

Infinite inputs: a structural zero times inf is NaN where the convolution has no product at all. Each program
flags a tile with any non-finite result; a second launch (FIXUP) recomputes only flagged tiles with the
infinities counted instead of multiplied (see the kernel). ``launch`` issues both.

Self-contained (torch + triton only); under TRITON_INTERPRET=1 (set before import) it runs on CPU tensors.
"""
from __future__ import annotations

import contextlib
import math
import os
import struct

import torch
import triton
import triton.language as tl

__all__ = ["conv_transpose3d_post_pool_gemm", "pack_weight", "round_tf32"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


_INTERPRET = _interpreting()


# ----------------------------------------------------------------------------------------------------------
# Kernel pieces
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def _round_tf32(x, USE_ASM: tl.constexpr):
    # Round-to-nearest (ties away) onto TF32's 10-bit mantissa, kept as fp32 bits; inf and NaN unchanged.
    if USE_ASM:
        r = tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = ((bits + 0x1000) >> 13) << 13
        special = ((bits >> 23) & 0xFF) == 0xFF
        r = tl.where(special, x, rounded.to(tl.float32, bitcast=True))
    return r


@triton.jit
def _max_nan(a, b):
    # Any NaN wins, as in max_pool3d.
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _min_nan(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _leaky(v, s):
    return tl.where(v > 0, v, v * s)


@triton.jit
def _round_to_io(v, IO_DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr):
    # v rounded (nearest-even) to the I/O dtype, kept in fp32. The interpreter's fp32 -> bf16 cast truncates,
    # so there the rounding is done on the bits (NaN kept, overflow to inf as the hardware does).
    if SOFT_BF16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        r = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    else:
        r = v.to(IO_DTYPE).to(tl.float32)
    return r


@triton.jit
def _to_io(v, IO_DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr):
    if SOFT_BF16:
        # Already representable after the rounding, so the interpreter's truncating cast is exact.
        r = _round_to_io(v, IO_DTYPE, SOFT_BF16).to(IO_DTYPE)
    else:
        r = v.to(IO_DTYPE)
    return r


@triton.jit
def _pool_pick(va, ia, vb, ib):
    # max_pool3d's selection as a commutative combine over (value, phase): a NaN beats any number and the
    # later NaN beats an earlier one; otherwise the greater value wins and, on ties, the earlier phase.
    a_nan = va != va
    b_nan = vb != vb
    take_b = (b_nan & (~a_nan | (ib > ia))) | (~a_nan & ~b_nan & ((vb > va) | ((vb == va) & (ib < ia))))
    return tl.where(take_b, vb, va), tl.where(take_b, ib, ia)


@triton.jit
def _a_chunk(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, k0,
             CIN_P: tl.constexpr, BK: tl.constexpr):
    # Columns k of the implicit A matrix: neighbour nb = k // CIN_P (bits: dd, dh, dw), channel k % CIN_P.
    # Neighbour q+1 past the input edge is the convolution's zero (phase 1 of the last window, output_padding 1).
    k = k0 + tl.arange(0, BK)
    nb = k // CIN_P
    ci = k % CIN_P
    dd = nb // 4
    dh = (nb // 2) % 2
    dw = nb % 2
    col = dd.to(tl.int64) * sxd + dh.to(tl.int64) * sxh + dw.to(tl.int64) * sxw + ci.to(tl.int64) * sxc
    ok = (row_ok[:, None] & (ci < Cin)[None, :] & ((qd[:, None] + dd[None, :]) < D)
          & ((qh[:, None] + dh[None, :]) < H) & ((qw[:, None] + dw[None, :]) < W))
    return tl.load(x_ptr + x_base[:, None] + col[None, :], mask=ok, other=0.0)


@triton.jit
def _dot(a, b, acc, IS_FP32: tl.constexpr, PRECISION: tl.constexpr, SOFT_BF16: tl.constexpr):
    if IS_FP32:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    elif SOFT_BF16:
        # The interpreter multiplies bf16 tiles as raw uint16; bf16 products are exact in fp32.
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _phase_value(y, mult, bias, s1, s2, IO_DTYPE: tl.constexpr, IS_HALF: tl.constexpr, SOFT_BF16: tl.constexpr):
    # The epilogue of one phase's conv output (bias and multiplier broadcast along its last dim).
    y = y + bias[None, :]
    if IS_HALF:
        # A half-precision conv would have stored y in the I/O dtype; the epilogue sees that value.
        y = _round_to_io(y, IO_DTYPE, SOFT_BF16)
    return _leaky(_leaky(y, s1) * mult[None, :], s2)


@triton.jit
def _mono_epilogue(hi, lo, mult, bias, s1, s2, IO_DTYPE: tl.constexpr, IS_HALF: tl.constexpr,
                   SOFT_BF16: tl.constexpr):
    # Monotone epilogue: the pooled value is the epilogue of the largest conv output (smallest for m < 0).
    # Adding the bias and rounding are monotone too, so they commute with the max.
    r = tl.where((mult > 0)[None, :], hi, lo)
    return _phase_value(r, mult, bias, s1, s2, IO_DTYPE, IS_HALF, SOFT_BF16)


@triton.jit
def _positions(pid_m, BM: tl.constexpr, n_pos, Dp, Hp, Wp, Wv, sxn, sxd, sxh, sxw):
    # A program's rows: flattened pooled positions (n, qd, qh, qw), qw fastest, so neighbouring rows read
    # neighbouring input columns. int32 positions (the hosts check n_pos < 2**31), int64 addresses; x_base is
    # the offset of each row's neighbour (0, 0, 0).
    # Rows run over a padded width Wp (pooled_rows: the pooled width Wv rounded up to a multiple of 16);
    # n_pos counts padded positions and the padding rows are masked off. With Wp a multiple of 16, Triton's
    # specialisation tells the compiler that runs of 16 rows are 16 consecutive qw; without it, offline sm_90
    # compiles of the phase-split kernel had 4.6x the instructions and 3.4 KB of spills (Wv = 33, say).
    rows = pid_m * BM + tl.arange(0, BM)
    qw = rows % Wp
    t = rows // Wp
    qh = t % Hp
    t = t // Hp
    qd = t % Dp
    n = t // Dp
    x_base = n.to(tl.int64) * sxn + qd.to(tl.int64) * sxd + qh.to(tl.int64) * sxh + qw.to(tl.int64) * sxw
    return (rows < n_pos) & (qw < Wv), n, qd, qh, qw, x_base


def _as_float32(v: float) -> float:
    # The value the kernels compute with: they take the slopes as float32 (Triton's launcher passes Python floats
    # as fp32; under Inductor they arrive as fp64 and the kernels cast them). Out of float's range: +-inf.
    try:
        return struct.unpack("f", struct.pack("f", float(v)))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def monotone_form(s1, s2, with_offsets=False) -> bool:
    """Whether a launch may take the monotone form (pool the extreme conv output, the epilogue once): both slopes
    > 0 and finite as the float32 values the kernels compute with (a zero slope turns -inf into NaN per phase, an
    infinite one turns 0 into NaN, and 1e-50 is 0 in float32), and no selection outputs wanted. The kernels still
    check each channel block's multiplier and bias."""
    f1, f2 = _as_float32(s1), _as_float32(s2)
    return bool(0 < f1 < math.inf and 0 < f2 < math.inf and not with_offsets)


def pooled_rows(N, D, H, W, output_padding):
    """The kernels' position grid (see _positions): pooled (Dp, Hp), the row width Wp padded to a multiple of 16
    (of 4 under the interpreter, which has no compiler to inform: the same masking, fewer padding rows to
    simulate), the pooled width Wv, and n_pos = N * Dp * Hp * Wp, which must fit int32 (checked when static)."""
    Dp, Hp, Wv = (v - 1 + o for v, o in zip((D, H, W), output_padding))
    pad = 4 if _INTERPRET else 16
    Wp = (Wv + pad - 1) // pad * pad
    n_pos = N * Dp * Hp * Wp
    if isinstance(n_pos, int) and n_pos >= 2**31:
        raise ValueError(f"too many pooled positions for int32 indexing: {n_pos} (rows padded to {Wp})")
    return Dp, Hp, Wp, Wv, n_pos


# What _packed_gemm accumulates (see the kernel's non-finite correction).
_PRODUCT = tl.constexpr(0)  # x @ W
_FINITE = tl.constexpr(1)  # x with its infinities zeroed @ W
_POS_INF = tl.constexpr(2)  # per output, how many products are +inf (inf * w with matching signs)
_NEG_INF = tl.constexpr(3)  # ... -inf
_INF_TIMES_ZERO = tl.constexpr(4)  # ... inf * a zero weight of a real tap (NaN, as in cuDNN)


@triton.jit
def _packed_gemm(x_ptr, w_base, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw,
                 CIN_P: tl.constexpr, BNC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
                 IS_FP32: tl.constexpr, PRECISION: tl.constexpr, ROUND_A: tl.constexpr, USE_ASM: tl.constexpr,
                 SOFT_BF16: tl.constexpr, W_KMAJOR: tl.constexpr):
    KP: tl.constexpr = 8 * CIN_P
    NP: tl.constexpr = 8 * BNC
    wn = tl.arange(0, NP)
    acc = tl.zeros([BM, NP], dtype=tl.float32)
    for k0 in range(0, KP, BK):
        a = _a_chunk(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, k0, CIN_P, BK)
        kk = k0 + tl.arange(0, BK)
        if W_KMAJOR:
            # Weight stored [NP, KP] (K contiguous): the operand layout TF32 tensor-core instructions take.
            b = tl.load(w_base + wn[None, :] * KP + kk[:, None])
        else:
            b = tl.load(w_base + kk[:, None] * NP + wn[None, :])
        if MODE == 0:
            if ROUND_A:
                a = _round_tf32(a, USE_ASM)
            acc = _dot(a, b, acc, IS_FP32, PRECISION, SOFT_BF16)
        else:
            inf_a = tl.abs(a) == float("inf")
            if MODE == 1:
                a = tl.where(inf_a, tl.zeros(a.shape, a.dtype), a)
                if ROUND_A:
                    a = _round_tf32(a, USE_ASM)
                acc = _dot(a, b, acc, IS_FP32, PRECISION, SOFT_BF16)
            else:
                # 0/1 indicator matrices (built in fp32, exact in any dtype): the counts are small integers,
                # exact in any dot precision.
                pos_a = tl.where(inf_a & (a > 0), 1.0, 0.0).to(a.dtype)
                neg_a = tl.where(inf_a & (a < 0), 1.0, 0.0).to(a.dtype)
                if MODE == 4:
                    # A zero weight of a real tap (not a structural zero of the packing: neighbour bits within
                    # the phase bits) turns an infinite input into NaN.
                    nb = kk // CIN_P
                    ph = wn // BNC
                    real = (nb[:, None] & (7 - ph[None, :])) == 0
                    acc = _dot(pos_a + neg_a, tl.where(real & (b == 0), 1.0, 0.0).to(b.dtype), acc, IS_FP32,
                               PRECISION, SOFT_BF16)
                else:
                    b_pos = tl.where(b > 0, 1.0, 0.0).to(b.dtype)
                    b_neg = tl.where(b < 0, 1.0, 0.0).to(b.dtype)
                    if MODE == 2:
                        acc = _dot(pos_a, b_pos, acc, IS_FP32, PRECISION, SOFT_BF16)
                        acc = _dot(neg_a, b_neg, acc, IS_FP32, PRECISION, SOFT_BF16)
                    else:
                        acc = _dot(pos_a, b_neg, acc, IS_FP32, PRECISION, SOFT_BF16)
                        acc = _dot(neg_a, b_pos, acc, IS_FP32, PRECISION, SOFT_BF16)
    return acc


@triton.jit
def _channel_params(m_ptr, b_ptr, cn, cn_ok, BNC: tl.constexpr, HAS_BIAS: tl.constexpr):
    # Multipliers and biases (0 without a bias) in fp32 of output channels cn. The multiplier and bias are
    # contiguous [Cout] tensors here (the launchers make them so).
    #
    # The callers compute cn themselves: torch's mutation analysis of Triton kernels (triton_op, wrap_triton)
    # takes every result of a call as derived from all of the call's arguments. Store addresses built from a cn
    # returned by a call that also received m_ptr and b_ptr marked the multiplier and bias as written, so compiled
    # graphs cloned the multiplier and copied it back into the caller's parameter after the kernel: a mutated graph
    # input, which also keeps CUDA graphs from applying (tests/test_conv_mutation_analysis.py).
    mult = tl.load(m_ptr + cn, mask=cn_ok, other=1.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cn, mask=cn_ok, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BNC], dtype=tl.float32)
    return mult, bias


@triton.jit
def _breaks_monotone(mult, bias, cn_ok, HAS_BIAS: tl.constexpr):
    # Channels where the monotone form is not exact: a multiplier of 0, +-inf or NaN, or a bias of +-inf or NaN
    # (+inf bias plus a -inf conv output is NaN in that phase alone, which max_pool3d propagates, while the bias
    # added to the window's extreme output is not). Shared by the packed and phase-split kernels.
    bad = (mult == 0) | (tl.abs(mult) == float("inf")) | (mult != mult)
    if HAS_BIAS:
        bad = bad | (tl.abs(bias) == float("inf")) | (bias != bias)
    return bad & cn_ok


@triton.jit
def _pool_epilogue_store(acc, pid_n, row_ok, n, qd, qh, qw, b_ptr, m_ptr, out_ptr, s1, s2, Cout, son, soc, sod, soh,
                         sow, BM: tl.constexpr, BNC: tl.constexpr, HAS_BIAS: tl.constexpr, MONO: tl.constexpr,
                         IS_HALF: tl.constexpr, SOFT_BF16: tl.constexpr):
    # acc [BM, 8 * BNC]: the 8 conv-output phases of each pooled position (column phase * BNC + channel). Pools
    # them, applies bias and epilogue, and stores the pooled outputs of channels pid_n * BNC + [0, BNC).
    io_dtype = out_ptr.dtype.element_ty
    cn = pid_n * BNC + tl.arange(0, BNC)
    cn_ok = cn < Cout
    mult, bias = _channel_params(m_ptr, b_ptr, cn, cn_ok, BNC, HAS_BIAS)
    # Channels that break monotonicity take the exact per-phase selection.
    bad = _breaks_monotone(mult, bias, cn_ok, HAS_BIAS)
    ph = tl.reshape(acc, [BM, 8, BNC])
    if MONO:
        hi = tl.reduce(ph, 1, _max_nan)
        lo = tl.reduce(ph, 1, _min_nan)
        best = _mono_epilogue(hi, lo, mult, bias, s1, s2, io_dtype, IS_HALF, SOFT_BF16)
        exact_needed = tl.sum(bad.to(tl.int32), 0) > 0
    else:
        best = tl.zeros([BM, BNC], dtype=tl.float32)
        exact_needed = True
    if exact_needed:
        e = _phase_value(ph, mult[None, :], bias[None, :], s1, s2, io_dtype, IS_HALF, SOFT_BF16)
        idx = tl.broadcast_to(tl.arange(0, 8)[None, :, None], [BM, 8, BNC])
        ex, _ = tl.reduce((e, idx), 1, _pool_pick)
        best = tl.where(bad[None, :], ex, best) if MONO else ex

    o_row = n.to(tl.int64) * son + qd.to(tl.int64) * sod + qh.to(tl.int64) * soh + qw.to(tl.int64) * sow
    o_ptrs = out_ptr + o_row[:, None] + cn.to(tl.int64)[None, :] * soc
    tl.store(o_ptrs, _to_io(best, io_dtype, SOFT_BF16), mask=row_ok[:, None] & cn_ok[None, :])


@triton.jit
def _gemm_tile(pid_m, pid_n, flag_at, x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, flag_ptr, s1, s2,
               n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv, sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow,
               CIN_P: tl.constexpr, BNC: tl.constexpr, HAS_BIAS: tl.constexpr, MONO: tl.constexpr,
               IS_FP32: tl.constexpr, IS_HALF: tl.constexpr, PRECISION: tl.constexpr, ROUND_A: tl.constexpr,
               USE_ASM: tl.constexpr, SOFT_BF16: tl.constexpr, W_KMAJOR: tl.constexpr, BM: tl.constexpr,
               BK: tl.constexpr, FIXUP: tl.constexpr):
    # One tile: BM pooled positions x the BNC output channels of block pid_n; flag_at is its flag.
    KP: tl.constexpr = 8 * CIN_P
    NP: tl.constexpr = 8 * BNC
    row_ok, n, qd, qh, qw, x_base = _positions(pid_m, BM, n_pos, Dp, Hp, Wp, Wv, sxn, sxd, sxh, sxw)

    # Packed weight [n_blocks, KP, NP] ([n_blocks, NP, KP] if W_KMAJOR); column = phase * BNC + channel.
    w_base = w_ptr + pid_n * (KP * NP)
    if FIXUP:
        # Second launch, only for tiles the first one flagged: a non-finite result. The packing's structural
        # zeros may have met an infinite input (inf * 0 = NaN where the convolution has no such product), so the
        # tile is recomputed with the infinities taken out of the product and counted per output instead, as the
        # convolution sees them: any inf * 0 of a real tap, or +inf and -inf together, gives NaN; otherwise the
        # sign of the infinities. A NaN spread by a structural zero stays: a NaN input reaches every window it
        # touches through a real tap too, so max_pool3d returns NaN for those windows either way.
        # Kept out of the first launch's code: compiled there, these four extra K loops cost the common path
        # up to 2x (register allocation), although they never ran.
        code = tl.where(_packed_gemm(x_ptr, w_base, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw,
                                     CIN_P, BNC, BM, BK, _INF_TIMES_ZERO, IS_FP32, PRECISION, ROUND_A, USE_ASM,
                                     SOFT_BF16, W_KMAJOR) > 0, 3.0, 0.0)
        cnt = _packed_gemm(x_ptr, w_base, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, CIN_P, BNC,
                           BM, BK, _POS_INF, IS_FP32, PRECISION, ROUND_A, USE_ASM, SOFT_BF16, W_KMAJOR)
        code = tl.where((code == 0) & (cnt > 0), 1.0, code)
        cnt = _packed_gemm(x_ptr, w_base, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, CIN_P, BNC,
                           BM, BK, _NEG_INF, IS_FP32, PRECISION, ROUND_A, USE_ASM, SOFT_BF16, W_KMAJOR)
        code = tl.where(cnt > 0, tl.where(code == 0, 2.0, 3.0), code)
        acc = _packed_gemm(x_ptr, w_base, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, CIN_P, BNC,
                           BM, BK, _FINITE, IS_FP32, PRECISION, ROUND_A, USE_ASM, SOFT_BF16, W_KMAJOR)
        acc = tl.where(code == 3.0, float("nan"),
                       tl.where(code == 1.0, float("inf"), tl.where(code == 2.0, float("-inf"), acc)))
    else:
        acc = _packed_gemm(x_ptr, w_base, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, CIN_P, BNC,
                           BM, BK, _PRODUCT, IS_FP32, PRECISION, ROUND_A, USE_ASM, SOFT_BF16, W_KMAJOR)
        # Flag the tile for the fix-up launch when any result is non-finite (rare: infinite or NaN inputs,
        # overflow); every program writes its flag, so the buffer needs no initialisation.
        nonfinite = tl.sum(((acc != acc) | (tl.abs(acc) == float("inf"))).to(tl.int32))
        tl.store(flag_ptr + flag_at, (nonfinite > 0).to(tl.int32))

    _pool_epilogue_store(acc, pid_n, row_ok, n, qd, qh, qw, b_ptr, m_ptr, out_ptr, s1, s2, Cout, son, soc, sod,
                         soh, sow, BM, BNC, HAS_BIAS, MONO, IS_HALF, SOFT_BF16)


@triton.jit
def _conv_t3d_pool_gemm_kernel(
    x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, flag_ptr,
    s1, s2,
    n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv,
    sxn, sxc, sxd, sxh, sxw,
    son, soc, sod, soh, sow,
    CIN_P: tl.constexpr, BNC: tl.constexpr, HAS_BIAS: tl.constexpr, MONO: tl.constexpr,
    IS_FP32: tl.constexpr, IS_HALF: tl.constexpr, PRECISION: tl.constexpr, ROUND_A: tl.constexpr,
    USE_ASM: tl.constexpr, SOFT_BF16: tl.constexpr, W_KMAJOR: tl.constexpr, BM: tl.constexpr,
    BK: tl.constexpr, FIXUP: tl.constexpr, FIXUP_TILES: tl.constexpr,
):
    # Inductor's wrapper passes Python floats as fp64 (Triton's own launcher as fp32). float32 is the slopes'
    # opmath type in eager PyTorch; fp64 epilogue math took the kernels to 236-255 registers with spills and made
    # them up to 1.45x slower on the H200 (benchmarks/compiled_kernel_check.py, 2026-11-29).
    s1 = tl.cast(s1, tl.float32)
    s2 = tl.cast(s2, tl.float32)
    if FIXUP:
        # Second launch. Each program reads FIXUP_TILES flags in one load and recomputes the flagged tiles among
        # them; usually none is flagged. One program per tile, as the first launch has, cost 17.2 us of the
        # TF32 packed GEMM's 141.6 (Nsight Compute, H200, 2026-11-29): 4096 programs of a kernel that fits one
        # block per multiprocessor, each reading one flag.
        n_m = tl.cdiv(n_pos, BM)
        n_tiles = n_m * tl.cdiv(Cout, BNC)
        first = tl.program_id(0) * FIXUP_TILES
        at = first + tl.arange(0, FIXUP_TILES)
        if tl.max(tl.load(flag_ptr + at, mask=at < n_tiles, other=0), 0) != 0:
            for i in range(FIXUP_TILES):
                t = first + i
                if tl.load(flag_ptr + t, mask=t < n_tiles, other=0) != 0:
                    _gemm_tile(t % n_m, t // n_m, t, x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, flag_ptr, s1, s2,
                               n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv, sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh,
                               sow, CIN_P, BNC, HAS_BIAS, MONO, IS_FP32, IS_HALF, PRECISION, ROUND_A, USE_ASM,
                               SOFT_BF16, W_KMAJOR, BM, BK, True)
    else:
        _gemm_tile(tl.program_id(0), tl.program_id(1), tl.program_id(1) * tl.num_programs(0) + tl.program_id(0),
                   x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, flag_ptr, s1, s2, n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv,
                   sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow, CIN_P, BNC, HAS_BIAS, MONO, IS_FP32, IS_HALF,
                   PRECISION, ROUND_A, USE_ASM, SOFT_BF16, W_KMAJOR, BM, BK, False)


# ----------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------
def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 tensor rounded to nearest (ties away from zero) onto TF32's 10-bit mantissa; inf/NaN kept."""
    bits = t.view(torch.int32)
    rounded = torch.bitwise_and(bits + 0x1000, -0x2000)  # -0x2000 == 0xFFFFE000 as int32
    special = torch.bitwise_and(bits, 0x7F800000) == 0x7F800000
    return torch.where(special, bits, rounded).view(torch.float32)


def tap_index(device: torch.device) -> torch.Tensor:
    """[8 neighbours, 8 phases] -> tap kd*9 + kh*3 + kw, or 27 (a zero row) where the phase has no tap from that
    neighbour (27 of the 64 pairs have one). Per dim, with neighbour t (0: q, 1: q+1) and phase p (0: output 2q,
    1: output 2q+1): (t, p) = (0, 0) -> k=1, (0, 1) -> k=2, (1, 1) -> k=0, (1, 0) -> none.

    Built from aranges rather than written as a constant, so that under torch.compile it folds into the packing
    kernel (a tensor constant would have to be lifted into the graph)."""
    nb = torch.arange(8, device=device).view(8, 1)
    ph = torch.arange(8, device=device).view(1, 8)
    tap = torch.zeros(8, 8, dtype=torch.long, device=device)
    real = torch.ones(8, 8, dtype=torch.bool, device=device)
    for bit, scale in ((4, 9), (2, 3), (1, 1)):
        t, p = (nb & bit) != 0, (ph & bit) != 0
        tap = tap + torch.where(t, torch.zeros_like(tap), torch.where(p, 2, 1)) * scale
        real = real & (p | ~t)
    return torch.where(real, tap, 27)


_TAP_CACHE: dict = {}


def pack_weight(weight: torch.Tensor, cin_p: int, bnc: int, dtype: torch.dtype, tf32: bool,
                kmajor: bool = False) -> torch.Tensor:
    """[Cin, Cout, 3, 3, 3] -> [n_blocks, 8 * cin_p, 8 * bnc]: row nb * cin_p + ci, column phase * bnc + c
    (``kmajor``: the transpose of each block, [n_blocks, 8 * bnc, 8 * cin_p], contiguous); TF32: rounded to
    nearest, since the tensor cores would truncate (the kernel rounds the input tiles).

    One gather, which Inductor compiles into a single small kernel when the inference op is traced. In eager
    the tap index is cached per device; it depends on nothing else, unlike the packed weight itself."""
    cin, cout = weight.shape[0], weight.shape[1]
    nblk = -(-cout // bnc)
    if torch._subclasses.fake_tensor.is_fake(weight):
        idx = tap_index(weight.device)
    else:
        idx = _TAP_CACHE.get(weight.device)
        if idx is None:
            idx = _TAP_CACHE[weight.device] = tap_index(weight.device)
    taps = weight.detach().to(dtype).permute(2, 3, 4, 0, 1).reshape(27, cin, cout)
    taps = torch.nn.functional.pad(taps, (0, nblk * bnc - cout, 0, cin_p - cin, 0, 1))  # + the zero row 27
    g = taps[idx]  # [8 neighbours, 8 phases, cin_p, nblk * bnc]
    g = g.view(8, 8, cin_p, nblk, bnc).permute(3, 0, 2, 1, 4).reshape(nblk, 8 * cin_p, 8 * bnc)
    if kmajor:
        g = g.transpose(1, 2)
    return round_tf32(g.contiguous()) if tf32 else g.contiguous()


# Flags read by one program of the fix-up launch (4096 tiles at the KernelBench size: 128 programs).
_FIXUP_TILES = 32


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(max(n, 1)))


def launch(x, w_packed, bias, mult, s1, s2, out, output_padding, *, tf32, kmajor, bm, bk, num_warps, num_stages,
           round_a=None, use_asm=None, kernel_wrapper=None):
    """The one place that launches the kernel: the main launch, then the fix-up launch for flagged tiles.

    ``out`` is the preallocated pooled output (any strides), ``w_packed`` from ``pack_weight`` with the same
    ``kmajor`` and TF32 rounding, ``mult`` a contiguous [Cout] tensor. ``kernel_wrapper``
    (``torch.library.wrap_triton`` under tracing) wraps the kernel before launch.
    """
    N, Cin, D, H, W = x.shape
    Cout = out.shape[1]
    Dp, Hp, Wp, Wv, n_pos = pooled_rows(N, D, H, W, output_padding)
    cin_p = w_packed.shape[2 if kmajor else 1] // 8
    bnc = w_packed.shape[1 if kmajor else 2] // 8
    wrap = kernel_wrapper or (lambda k: k)
    grid = (triton.cdiv(n_pos, bm), w_packed.shape[0])
    # One flag per tile: the first launch marks tiles with a non-finite result, the second recomputes only those
    # (see the kernel).
    flags = torch.empty(grid[0] * grid[1], device=x.device, dtype=torch.int32)
    args = dict(CIN_P=cin_p, BNC=bnc, HAS_BIAS=bias is not None, MONO=monotone_form(s1, s2),
                IS_FP32=x.dtype == torch.float32, IS_HALF=x.dtype != torch.float32,
                PRECISION="tf32" if tf32 else "ieee", ROUND_A=bool(tf32 if round_a is None else round_a),
                USE_ASM=bool(not _INTERPRET if use_asm is None else use_asm),
                SOFT_BF16=_INTERPRET and x.dtype == torch.bfloat16, W_KMAJOR=bool(kmajor), BM=bm,
                num_warps=num_warps, num_stages=num_stages)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        for fixup in (False, True):
            # The fix-up launch: one program per _FIXUP_TILES flags (see the kernel).
            wrap(_conv_t3d_pool_gemm_kernel)[(triton.cdiv(grid[0] * grid[1], _FIXUP_TILES), 1) if fixup else grid](
                x, w_packed, bias if bias is not None else mult, mult, out, flags,
                float(s1), float(s2),
                n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv,
                *x.stride(), *out.stride(),
                BK=min(bk, 8 * cin_p), FIXUP=fixup, FIXUP_TILES=_FIXUP_TILES, **args,
            )
    return out


def conv_transpose3d_post_pool_gemm(x, weight, bias, mult, s1, s2, output_padding, allow_tf32, *, out=None,
                                    w_packed=None, bm=None, bk=None, num_warps=None, num_stages=None,
                                    round_a=None, use_asm=None, w_kmajor=False, bnc=None):
    """Inference forward with an explicit launch config (the config sweep and the kernel's tests). x [N, Cin, D,
    H, W] (any strides), weight [Cin, Cout, 3, 3, 3], mult a contiguous [Cout] tensor. Returns the pooled output
    in x's memory format (or ``out``). ``bnc``: output channels per program (default min(Cout, 32)); ignored
    when ``w_packed`` is given, whose blocks fix it."""
    N, Cin, D, H, W = x.shape
    Cout = weight.shape[1]
    op = list(output_padding)
    if out is None:
        fmt = torch.channels_last_3d if (x.stride(1) == 1 and Cin > 1) else torch.contiguous_format
        out = torch.empty((N, Cout, D - 1 + op[0], H - 1 + op[1], W - 1 + op[2]), device=x.device, dtype=x.dtype,
                          memory_format=fmt)
    if out.numel() == 0:
        return out
    tf32 = x.dtype == torch.float32 and allow_tf32
    if w_packed is None:
        cin_p = _pow2_at_least(Cin, 16)
        # Output channels per program (the packed weight's block width): fewer means a smaller accumulator.
        bnc = bnc or min(_pow2_at_least(Cout, 4), 32)
        w_packed = pack_weight(weight, cin_p, bnc, x.dtype, tf32 and round_a is not False, w_kmajor)
    return launch(x, w_packed, bias, mult, s1, s2, out, op, tf32=tf32, kmajor=w_kmajor,
                  bm=bm or (32 if _INTERPRET else 128), bk=bk or (32 if x.dtype == torch.float32 else 64),
                  num_warps=num_warps or (4 if _INTERPRET else 8), num_stages=num_stages or (1 if _INTERPRET else 3),
                  round_a=round_a, use_asm=use_asm)
