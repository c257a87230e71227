"""Triton kernel, phase-split GEMM: ConvTranspose3d(k=3, s=2, p=1) -> LeakyReLU -> x m -> LeakyReLU -> MaxPool3d(2).

Same computation as ``_conv_post_pool_triton`` (its docstring has the phase argument). Each of the 8 conv-output
phases p = pd*4 + ph*2 + pw of a pool window is one GEMM whose K holds only the neighbours that phase really
uses: the neighbours d with d's bits inside p's bits, 2^popcount(p) of them, so K_p = Cin * 2^popcount(p) and
the 8 GEMMs together hold each of the 27 taps once. Against the packed GEMM (one [BM, 8 Cin] x [8 Cin, 8 Cout]
product with structural zeros) this does 2.37x less math, keeps a [BM, BNC] accumulator instead of
[BM, 8 BNC] (the packed kernel's accumulator alone filled the register file: one program per multiprocessor),
and has no structural zeros, so an infinite input meets only real taps and needs no correction launch.
Against the phase-exact kernel (27 dots of K = Cin) it issues 8 larger dots.

The epilogue runs on every phase and keeps max_pool3d's running selection (first maximum, any NaN wins), as the
phase-exact kernel does, so it is exact for any slopes and multipliers and can also return the selected conv
output and its window offset for the backward.

Packed weight (``pack_weight``): [n_blocks, 27 * cin_p * bnc] per block of ``bnc`` output channels, phase p's
[K_p, bnc] matrix ([bnc, K_p] when ``kmajor``, which TF32 needs) at offset cin_p * bnc * sum_{p' < p}
2^popcount(p'), rows ordered (neighbour index within the phase, channel). The neighbour index's bit i is the
i-th set bit of p counted from w up (w, h, d).

Self-contained (torch + triton); under TRITON_INTERPRET=1 (set before import) it runs on CPU tensors.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ._conv_post_pool_gemm_triton import (_INTERPRET, _breaks_monotone, _channel_params, _dot, _positions,
                                          _round_tf32, _round_to_io, _to_io, monotone_form, pooled_rows, round_tf32)

__all__ = ["launch", "pack_weight", "phase_taps"]


@triton.jit
def _phase_columns(P: tl.constexpr, CK: tl.constexpr, NB: tl.constexpr):
    # Columns of phase P's A chunk: neighbour index within the phase (sub), channel within the chunk (cc), and
    # the neighbour's offsets (dd, dh, dw), sub's bits deposited into P's set bits from w up.
    j = tl.arange(0, CK << NB)
    sub = j // CK
    cc = j % CK
    s = sub
    if (P & 1) != 0:
        dw = s & 1
        s = s >> 1
    else:
        dw = s * 0
    if (P & 2) != 0:
        dh = s & 1
        s = s >> 1
    else:
        dh = s * 0
    if (P & 4) != 0:
        dd = s & 1
    else:
        dd = s * 0
    return sub, cc, dd, dh, dw


@triton.jit
def _phase_product(x_ptr, wp, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, wn, P: tl.constexpr,
                   CIN_P: tl.constexpr, CK: tl.constexpr, BNC: tl.constexpr, BM: tl.constexpr, IS_FP32: tl.constexpr,
                   PRECISION: tl.constexpr, ROUND_A: tl.constexpr, USE_ASM: tl.constexpr, SOFT_BF16: tl.constexpr,
                   W_KMAJOR: tl.constexpr, SPLIT3: tl.constexpr, W_SMALL: tl.constexpr):
    # Phase P's conv output before bias, [BM, BNC]: [BM, K_P] x [K_P, BNC] in chunks of CK channels.
    NB: tl.constexpr = (P & 1) + ((P >> 1) & 1) + ((P >> 2) & 1)
    KP: tl.constexpr = CIN_P << NB
    sub, cc, dd, dh, dw = _phase_columns(P, CK, NB)
    col = dd.to(tl.int64) * sxd + dh.to(tl.int64) * sxh + dw.to(tl.int64) * sxw
    # Neighbour q+1 past the input edge is the convolution's zero (phase 1 of the last window with
    # output_padding 1): masked, and it meets a real weight, so the product is 0 as the conv's missing term.
    ok = (row_ok[:, None] & ((qd[:, None] + dd[None, :]) < D) & ((qh[:, None] + dh[None, :]) < H)
          & ((qw[:, None] + dw[None, :]) < W))
    acc = tl.zeros([BM, BNC], dtype=tl.float32)
    for c0 in range(0, CIN_P, CK):
        ci = c0 + cc
        a = tl.load(x_ptr + x_base[:, None] + (col + ci.to(tl.int64) * sxc)[None, :],
                    mask=ok & (ci < Cin)[None, :], other=0.0)
        if ROUND_A:
            a = _round_tf32(a, USE_ASM)
        r = sub * CIN_P + ci
        if W_KMAJOR:
            w_at = wn[None, :] * KP + r[:, None]
        else:
            w_at = r[:, None] * BNC + wn[None, :]
        b = tl.load(wp + w_at)
        if SPLIT3:
            # float32 from three TF32 products: x = big + small with big = TF32(x) and small = x - big (exact),
            # the same for the weight (split on the host; small at W_SMALL), small x small dropped (~2^-22).
            # Triton's own "tf32x3" gives NaN for an infinite input (small = inf - inf); here the small parts of
            # non-finite inputs are 0 and only big x big sees them, so inf * w is what the convolution computes.
            big = _round_tf32(a, USE_ASM)
            fin = tl.abs(a) < float("inf")
            small = _round_tf32(tl.where(fin, a - big, 0.0), USE_ASM)
            acc = _dot(small, b, acc, IS_FP32, "tf32", SOFT_BF16)
            acc = _dot(tl.where(fin, big, 0.0), tl.load(wp + W_SMALL + w_at), acc, IS_FP32, "tf32", SOFT_BF16)
            acc = _dot(big, b, acc, IS_FP32, "tf32", SOFT_BF16)
        else:
            acc = _dot(a, b, acc, IS_FP32, PRECISION, SOFT_BF16)
    return acc


@triton.jit
def _select_phase(acc, p: tl.constexpr, best, sel, off, bias, mult, s1, s2, HAS_BIAS: tl.constexpr,
                  IS_HALF: tl.constexpr, IO_DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr):
    # Phase p's epilogue, folded into max_pool3d's running selection over the window. Phase p = pd*4 + ph*2 + pw
    # is also max_pool3d's scan order within the window (d-major), which the tie and NaN rules rely on. Shared by
    # this kernel and the phase-exact one.
    y = acc
    if HAS_BIAS:
        y = y + bias[None, :]
    if IS_HALF:
        # A half-precision conv would have stored y in the I/O dtype; the epilogue sees that value.
        y = _round_to_io(y, IO_DTYPE, SOFT_BF16)
    v = tl.where(y > 0, y, y * s1) * mult[None, :]
    e = tl.where(v > 0, v, v * s2)
    if p == 0:
        # max_pool3d starts from -inf with the index at the window's first element, so phase 0 is the selection
        # whatever its value (it would only be "not taken" when equal to -inf: the same state).
        best = e
        sel = y
    else:
        # max_pool3d: strictly greater replaces (ties keep the first), any NaN replaces (the last NaN wins).
        take = (e > best) | (e != e)
        best = tl.where(take, e, best)
        sel = tl.where(take, y, sel)
        off = tl.where(take, p, off)
    return best, sel, off


@triton.jit
def _store_selection(best, sel, off, n, qd, qh, qw, cn, row_ok, cn_ok, out_ptr, sel_ptr, off_ptr, son, soc, sod, soh,
                     sow, WITH_OFFSETS: tl.constexpr, SOFT_BF16: tl.constexpr):
    # The pooled outputs of a [BM, BN] tile and, for the training forward, the selected conv output and offset.
    io_dtype = out_ptr.dtype.element_ty
    o_row = n.to(tl.int64) * son + qd.to(tl.int64) * sod + qh.to(tl.int64) * soh + qw.to(tl.int64) * sow
    o_ptrs = o_row[:, None] + cn.to(tl.int64)[None, :] * soc
    o_mask = row_ok[:, None] & cn_ok[None, :]
    tl.store(out_ptr + o_ptrs, _to_io(best, io_dtype, SOFT_BF16), mask=o_mask)
    if WITH_OFFSETS:
        tl.store(sel_ptr + o_ptrs, _to_io(sel, io_dtype, SOFT_BF16), mask=o_mask)
        tl.store(off_ptr + o_ptrs, off.to(tl.uint8), mask=o_mask)


@triton.jit
def _pool_init(mult, bias, cn_ok, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, MONO: tl.constexpr):
    # The pooling state of a [BM, BN] tile: max_pool3d's running selection (best, sel, off) and, for the monotone
    # form (see _phase_tile), the channels that break monotonicity (a multiplier of 0, +-inf or NaN, or a
    # non-finite bias), whether this block holds one, the per-channel sign flip and the running extreme.
    best = tl.full([BM, BN], float("-inf"), tl.float32)
    sel = tl.zeros([BM, BN], dtype=tl.float32)
    off = tl.zeros([BM, BN], dtype=tl.int32)
    if MONO:
        bad = _breaks_monotone(mult, bias, cn_ok, HAS_BIAS)
        any_bad = tl.sum(bad.to(tl.int32), 0) > 0
        sgn = tl.where(mult > 0, 1.0, -1.0)[None, :]
        ext = tl.full([BM, BN], float("-inf"), tl.float32)
    else:
        bad, any_bad, sgn, ext = cn_ok, False, mult, best  # unused without MONO
    return best, sel, off, bad, any_bad, sgn, ext


@triton.jit
def _pool_step(acc, p: tl.constexpr, best, sel, off, ext, sgn, any_bad, bias, mult, s1, s2, HAS_BIAS: tl.constexpr,
               IS_HALF: tl.constexpr, IO_DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr, MONO: tl.constexpr):
    # Phase p into the pooling state: one NaN-propagating max of the sign-flipped accumulator (monotone form;
    # blocks with a breaking channel also keep the exact selection), or the exact selection.
    if MONO:
        ext = tl.maximum(ext, acc * sgn, propagate_nan=tl.PropagateNan.ALL)
        if any_bad:
            # (the selection outputs are not wanted here: new names keep them out of the branch's results)
            best, _sel, _off = _select_phase(acc, p, best, sel, off, bias, mult, s1, s2, HAS_BIAS, IS_HALF, IO_DTYPE,
                                             SOFT_BF16)
    else:
        best, sel, off = _select_phase(acc, p, best, sel, off, bias, mult, s1, s2, HAS_BIAS, IS_HALF, IO_DTYPE,
                                       SOFT_BF16)
    return best, sel, off, ext


@triton.jit
def _pool_result(best, ext, sgn, bad, bias, mult, s1, s2, HAS_BIAS: tl.constexpr, IS_HALF: tl.constexpr,
                 IO_DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr, MONO: tl.constexpr):
    # The pooled values: monotone form, the epilogue of the extreme conv output once (channels that broke
    # monotonicity take the exact selection); exact form, the selection itself.
    if MONO:
        y = ext * sgn
        if HAS_BIAS:
            y = y + bias[None, :]
        if IS_HALF:
            y = _round_to_io(y, IO_DTYPE, SOFT_BF16)
        v = tl.where(y > 0, y, y * s1) * mult[None, :]
        best = tl.where(bad[None, :], best, tl.where(v > 0, v, v * s2))
    return best


@triton.jit
def _phase_tile(tile, pid_n, x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, sel_ptr, off_ptr, s1, s2,
                n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv, sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow,
                CIN_P: tl.constexpr, CK: tl.constexpr, BNC: tl.constexpr, HAS_BIAS: tl.constexpr,
                WITH_OFFSETS: tl.constexpr, IS_FP32: tl.constexpr, IS_HALF: tl.constexpr, PRECISION: tl.constexpr,
                ROUND_A: tl.constexpr, USE_ASM: tl.constexpr, SOFT_BF16: tl.constexpr, W_KMAJOR: tl.constexpr,
                SPLIT3: tl.constexpr, BM: tl.constexpr, MONO: tl.constexpr):
    # One tile: BM pooled positions x the BNC output channels of block pid_n, computed and stored.
    #
    # MONO (the host checked: both slopes > 0, no selection outputs wanted): with a finite nonzero multiplier,
    # leaky(m * leaky(y, s1), s2) is monotone in y (increasing for m > 0, decreasing for m < 0), and so are the
    # bias add and the rounding to the I/O dtype. So the pooled value is the epilogue of the largest conv output
    # (the smallest for m < 0): each phase costs one NaN-propagating max of the sign-flipped accumulator (exact)
    # instead of a whole epilogue and selection. Nsight Compute showed the exact form issue-bound, the tensor pipe
    # 7% active (bf16, H200). Channels whose multiplier is 0, +-inf or NaN, or whose bias is not finite, break
    # monotonicity; a block holding one also runs the exact selection (a branch per phase on a block-uniform
    # flag, so the products are not duplicated) and those channels take its result.
    io_dtype = out_ptr.dtype.element_ty
    row_ok, n, qd, qh, qw, x_base = _positions(tile, BM, n_pos, Dp, Hp, Wp, Wv, sxn, sxd, sxh, sxw)

    cn = pid_n * BNC + tl.arange(0, BNC)
    cn_ok = cn < Cout
    mult, bias = _channel_params(m_ptr, b_ptr, cn, cn_ok, BNC, HAS_BIAS)
    wn = tl.arange(0, BNC)
    # Per block of output channels: the packed weight, then (SPLIT3) its TF32 remainder.
    W_SMALL: tl.constexpr = 27 * CIN_P * BNC
    wp = w_ptr + pid_n * (W_SMALL * (2 if SPLIT3 else 1))

    best, sel, off, bad, any_bad, sgn, ext = _pool_init(mult, bias, cn_ok, HAS_BIAS, BM, BNC, MONO)
    for p in tl.static_range(8):
        acc = _phase_product(x_ptr, wp, x_base, qd, qh, qw, row_ok, D, H, W, Cin, sxc, sxd, sxh, sxw, wn, p, CIN_P,
                             CK, BNC, BM, IS_FP32, PRECISION, ROUND_A, USE_ASM, SOFT_BF16, W_KMAJOR, SPLIT3, W_SMALL)
        wp += (CIN_P << ((p & 1) + ((p >> 1) & 1) + ((p >> 2) & 1))) * BNC
        best, sel, off, ext = _pool_step(acc, p, best, sel, off, ext, sgn, any_bad, bias, mult, s1, s2, HAS_BIAS,
                                         IS_HALF, io_dtype, SOFT_BF16, MONO)
    best = _pool_result(best, ext, sgn, bad, bias, mult, s1, s2, HAS_BIAS, IS_HALF, io_dtype, SOFT_BF16, MONO)
    _store_selection(best, sel, off, n, qd, qh, qw, cn, row_ok, cn_ok, out_ptr, sel_ptr, off_ptr, son, soc, sod, soh,
                     sow, WITH_OFFSETS, SOFT_BF16)


@triton.jit
def _conv_t3d_pool_phase_gemm_kernel(
    x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, sel_ptr, off_ptr,
    s1, s2,
    n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv,
    sxn, sxc, sxd, sxh, sxw,
    son, soc, sod, soh, sow,
    CIN_P: tl.constexpr, CK: tl.constexpr, BNC: tl.constexpr, HAS_BIAS: tl.constexpr, WITH_OFFSETS: tl.constexpr,
    IS_FP32: tl.constexpr, IS_HALF: tl.constexpr, PRECISION: tl.constexpr, ROUND_A: tl.constexpr,
    USE_ASM: tl.constexpr, SOFT_BF16: tl.constexpr, W_KMAJOR: tl.constexpr, SPLIT3: tl.constexpr, BM: tl.constexpr,
    MONO: tl.constexpr,
):
    # Inductor's wrapper passes Python floats as fp64 (Triton's own launcher as fp32). float32 is the slopes'
    # opmath type in eager PyTorch; fp64 epilogue math took the kernels to 236-255 registers with spills and made
    # them up to 1.45x slower on the H200 (benchmarks/compiled_kernel_check.py, 2026-11-29).
    s1 = tl.cast(s1, tl.float32)
    s2 = tl.cast(s2, tl.float32)
    _phase_tile(tl.program_id(0), tl.program_id(1), x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, sel_ptr, off_ptr, s1, s2,
                n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv, sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow, CIN_P, CK,
                BNC, HAS_BIAS, WITH_OFFSETS, IS_FP32, IS_HALF, PRECISION, ROUND_A, USE_ASM, SOFT_BF16, W_KMAJOR,
                SPLIT3, BM, MONO)


# ----------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------
def phase_taps() -> list[list[int]]:
    """Per phase p, the taps kd*9 + kh*3 + kw of its neighbours in the kernel's order (neighbour index bit i is
    the i-th set bit of p from w up). Per dim: phase 0 uses tap 1 of neighbour 0; phase 1 uses tap 2 of neighbour
    0 and tap 0 of neighbour 1. The 8 lists together hold each of the 27 taps once."""
    out = []
    for p in range(8):
        bits = [b for b in (1, 2, 4) if p & b]
        taps = []
        for sub in range(1 << len(bits)):
            k = {1: 1, 2: 1, 4: 1}
            for i, b in enumerate(bits):
                k[b] = 0 if (sub >> i) & 1 else 2
            taps.append(k[4] * 9 + k[2] * 3 + k[1])
        out.append(taps)
    return out


_PHASE_TAPS = phase_taps()


def pack_weight(weight: torch.Tensor, cin_p: int, bnc: int, dtype: torch.dtype, tf32: bool,
                kmajor: bool = False, split3: bool = False) -> torch.Tensor:
    """[Cin, Cout, 3, 3, 3] -> [n_blocks, 27 * cin_p * bnc] (layout in the module docstring); TF32: rounded to
    nearest, since the tensor cores would truncate (the kernel rounds the input tiles). ``split3`` (float32
    from three TF32 products): [n_blocks, 2 * 27 * cin_p * bnc], each block's TF32-rounded weight, then the
    rounded remainder.

    Slices and one cat (no index tensor), so that under torch.compile it folds into Inductor's kernels without a
    lifted constant."""
    cin, cout = weight.shape[0], weight.shape[1]
    nblk = -(-cout // bnc)
    taps = weight.detach().to(dtype).permute(2, 3, 4, 0, 1).reshape(27, cin, cout)
    taps = torch.nn.functional.pad(taps, (0, nblk * bnc - cout, 0, cin_p - cin))
    taps = taps.view(27, cin_p, nblk, bnc).permute(2, 0, 1, 3)  # [nblk, 27, cin_p, bnc]
    parts = []
    for p_taps in _PHASE_TAPS:
        blk = torch.cat([taps[:, t:t + 1] for t in p_taps], dim=1).reshape(nblk, len(p_taps) * cin_p, bnc)
        if kmajor:
            blk = blk.transpose(1, 2)
        parts.append(blk.reshape(nblk, -1))
    g = torch.cat(parts, dim=1).contiguous()
    if split3:
        big = round_tf32(g)
        return torch.cat([big, round_tf32(g - big)], dim=1)
    return round_tf32(g) if tf32 else g


def launch(x, w_packed, bias, mult, s1, s2, out, output_padding, *, tf32, kmajor, cin_p, bnc, bm, ck, num_warps,
           num_stages, selected=None, offsets=None, precision=None, kernel_wrapper=None, mono=True):
    """One launch. ``out`` (and ``selected``/``offsets`` for the training forward) preallocated with the same
    strides; ``w_packed`` from ``pack_weight`` with the same cin_p, bnc, ``kmajor`` and TF32 rounding; ``mult``
    a contiguous [Cout] tensor. ``precision`` overrides the float32 dot precision ("tf32" when ``tf32``, else
    "ieee"; "3xtf32": float32 from three TF32 products, with a ``split3`` packed weight). ``kernel_wrapper``
    (``torch.library.wrap_triton`` under tracing) wraps the kernel. ``mono``: take the monotone form (one max per
    phase, the epilogue once) where it is exact: slopes > 0 and no offsets wanted; the kernel still checks each
    channel block's multipliers and bias."""
    N, Cin, D, H, W = x.shape
    Cout = out.shape[1]
    Dp, Hp, Wp, Wv, n_pos = pooled_rows(N, D, H, W, output_padding)
    with_offsets = selected is not None
    split3 = precision == "3xtf32"
    if w_packed.numel() >= 2**31:  # weight offsets are int32 in the kernel
        raise ValueError(f"packed weight too large for int32 indexing: {w_packed.numel()} elements")
    wrap = kernel_wrapper or (lambda k: k)
    grid = (triton.cdiv(n_pos, bm), w_packed.shape[0])
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        wrap(_conv_t3d_pool_phase_gemm_kernel)[grid](
            x, w_packed, bias if bias is not None else mult, mult, out,
            selected if with_offsets else out, offsets if with_offsets else out,
            float(s1), float(s2),
            n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv,
            *x.stride(), *out.stride(),
            CIN_P=cin_p, CK=min(ck, cin_p), BNC=bnc, HAS_BIAS=bias is not None, WITH_OFFSETS=with_offsets,
            IS_FP32=x.dtype == torch.float32, IS_HALF=x.dtype != torch.float32,
            PRECISION="tf32" if split3 else (precision or ("tf32" if tf32 else "ieee")), ROUND_A=bool(tf32),
            USE_ASM=not _INTERPRET, SOFT_BF16=_INTERPRET and x.dtype == torch.bfloat16, W_KMAJOR=bool(kmajor),
            SPLIT3=split3, BM=bm, MONO=mono and monotone_form(s1, s2, with_offsets),
            num_warps=num_warps, num_stages=num_stages,
        )
    return out
