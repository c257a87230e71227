"""Triton kernel: ConvTranspose3d(k=3, s=2, p=1) -> LeakyReLU -> x multiplier -> LeakyReLU -> MaxPool3d(2, 2).

The chain of KernelBench level 2 problem 74. With stride 2 and padding 1, conv output o = 2*i - 1 + k, so the
pool window q (per dim) holds conv outputs 2q ("phase 0": tap k=1 of input q) and 2q+1 ("phase 1": tap k=2 of
input q plus tap k=0 of input q+1). Every pooled output therefore depends only on the 2x2x2 input neighbourhood
x[q..q+1] of each dim, and the 8 phases together use each of the 27 taps exactly once. One program computes
BM pooled positions x BN output channels: it forms each phase's conv output as a sum of [BM, Cin] @ [Cin, BN]
dots, applies the epilogue, and keeps max_pool3d's running selection, so the conv output never touches memory.

Used for the training forward (with offsets) and for strict float32; inference in TF32 and half precision runs
the packed-GEMM kernel of ``_conv_post_pool_gemm_triton`` (see ``_conv_triton_op._CONFIGS`` for the measurements).

This module needs only torch and triton (and its sibling kernel module), so that benchmarks can load it without
the package's compiled extension. Importing it does not need a GPU; under TRITON_INTERPRET=1 (set before the
import) the kernel runs on CPU tensors through the Triton interpreter.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from . import _geometry
# Shared device helpers (dot with the interpreter's bf16 workaround, rounding to the I/O dtype and to TF32).
from ._conv_post_pool_gemm_triton import _dot, _positions, _round_tf32, monotone_form, pooled_rows, round_tf32
# The per-phase epilogue with max_pool3d's running selection, and its stores, shared with the phase-split GEMM.
from ._conv_post_pool_phase_gemm_triton import _pool_init, _pool_result, _pool_step, _store_selection

__all__ = ["check_kernel_args", "conv_transpose3d_post_pool_triton", "fused_path_applies", "last_config"]

_HALF_DTYPES = (torch.float16, torch.bfloat16)
_SUPPORTED_DTYPES = (torch.float32, *_HALF_DTYPES)

# Largest K (input channel) and N (output channel) chunk one program works on. Register pressure, not
# correctness, sets them: each program keeps several [BM, BN] fp32 tiles (accumulator, running max, selection)
# plus the 8 held [BM, BK] neighbour tiles, and offline sm_90 compiles spilled with BN = 64 where BN = 32 did
# not. Beyond BK the kernel loops over Cin chunks; beyond BN the grid's second axis tiles Cout. Module-level so
# tests can shrink them to exercise the chunked paths on small channel counts.
_MAX_BK = 64
_MAX_BN = 32


# ----------------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def _pick2(a, b, i: tl.constexpr):
    # Compile-time selection: Triton code cannot index a list of tensors (tuple indexing is recent), so the 8
    # held neighbour tiles are chosen through nested constexpr branches, which cost nothing after compilation.
    if i == 0:
        r = a
    else:
        r = b
    return r


@triton.jit
def _pick8(x000, x001, x010, x011, x100, x101, x110, x111, ad: tl.constexpr, ah: tl.constexpr, aw: tl.constexpr):
    lo = _pick2(_pick2(x000, x001, aw), _pick2(x010, x011, aw), ah)
    hi = _pick2(_pick2(x100, x101, aw), _pick2(x110, x111, aw), ah)
    return _pick2(lo, hi, ad)


@triton.jit
def _x_tile(x_ptr, base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, k0, Cin,
            AD: tl.constexpr, AH: tl.constexpr, AW: tl.constexpr, BK: tl.constexpr):
    # Neighbour q+1 past the input edge is the conv's implicit zero (only phase 1 of the last window with
    # output_padding=1 reaches it), so it is masked to 0 rather than clamped.
    ok = row_ok & (qd + AD < D) & (qh + AH < H) & (qw + AW < W)
    ck = k0 + tl.arange(0, BK)
    ptrs = x_ptr + (base + AD * sxd + AH * sxh + AW * sxw)[:, None] + ck.to(tl.int64)[None, :] * sxc
    return tl.load(ptrs, mask=ok[:, None] & (ck < Cin)[None, :], other=0.0)


@triton.jit
def _w_tile(w_ptr, TAP: tl.constexpr, k0, cn, CIN_P: tl.constexpr, COUT_P: tl.constexpr, BK: tl.constexpr):
    # The packed weight is zero padded to [27, CIN_P, COUT_P], so no mask is needed: padded rows meet masked
    # (zero) x columns and padded columns are never stored.
    ck = k0 + tl.arange(0, BK)
    return tl.load(w_ptr + TAP * (CIN_P * COUT_P) + ck[:, None] * COUT_P + cn[None, :])


# Per dim, phase 0 has one tap (k=1, neighbour 0) and phase 1 two: t=0 -> (k=2, neighbour 0), t=1 -> (k=0,
# neighbour 1); hence k = 1 + phase - 2*t and neighbour = t. Tap index into the packed weight: kd*9 + kh*3 + kw.
@triton.jit
def _phase_acc_held(x000, x001, x010, x011, x100, x101, x110, x111, w_ptr, cn,
                    PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                    CIN_P: tl.constexpr, COUT_P: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    IS_FP32: tl.constexpr, PRECISION: tl.constexpr, SOFT_BF16: tl.constexpr):
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for td in tl.static_range(PD + 1):
        for th in tl.static_range(PH + 1):
            for tw in tl.static_range(PW + 1):
                xt = _pick8(x000, x001, x010, x011, x100, x101, x110, x111, td, th, tw)
                wt = _w_tile(w_ptr, (1 + PD - 2 * td) * 9 + (1 + PH - 2 * th) * 3 + (1 + PW - 2 * tw), 0, cn,
                             CIN_P, COUT_P, BK)
                acc = _dot(xt, wt, acc, IS_FP32, PRECISION, SOFT_BF16)
    return acc


@triton.jit
def _phase_acc_chunked(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, Cin, w_ptr, cn,
                       PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                       CIN_P: tl.constexpr, COUT_P: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, IS_FP32: tl.constexpr, PRECISION: tl.constexpr, SOFT_BF16: tl.constexpr,
                       ROUND_TF32: tl.constexpr, USE_ASM: tl.constexpr):
    # Cin larger than one chunk: holding 8 neighbour tiles of all of Cin would not fit in registers, so each tap
    # reloads its chunk; the repeated loads of a neighbour within a phase should be cache hits.
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, Cin, BK):
        for td in tl.static_range(PD + 1):
            for th in tl.static_range(PH + 1):
                for tw in tl.static_range(PW + 1):
                    xt = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, k0, Cin,
                                 td, th, tw, BK)
                    if ROUND_TF32:
                        xt = _round_tf32(xt, USE_ASM)
                    wt = _w_tile(w_ptr, (1 + PD - 2 * td) * 9 + (1 + PH - 2 * th) * 3 + (1 + PW - 2 * tw), k0, cn,
                                 CIN_P, COUT_P, BK)
                    acc = _dot(xt, wt, acc, IS_FP32, PRECISION, SOFT_BF16)
    return acc


@triton.jit
def _conv_t3d_post_pool_kernel(
    x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, sel_ptr, off_ptr,
    s1, s2,
    n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv,
    sxn, sxc, sxd, sxh, sxw,
    son, soc, sod, soh, sow,
    sb, sm,
    CIN_P: tl.constexpr, COUT_P: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
    HAS_BIAS: tl.constexpr, WITH_OFFSETS: tl.constexpr, IS_FP32: tl.constexpr, IS_HALF: tl.constexpr,
    PRECISION: tl.constexpr, SOFT_BF16: tl.constexpr, ROUND_TF32: tl.constexpr, USE_ASM: tl.constexpr,
    BM: tl.constexpr, MONO: tl.constexpr,
):
    # Inductor's wrapper passes Python floats as fp64 (Triton's own launcher as fp32). float32 is the slopes'
    # opmath type in eager PyTorch; fp64 epilogue math took the kernels to 236-255 registers with spills and made
    # them up to 1.45x slower on the H200 (benchmarks/compiled_kernel_check.py, 2026-11-29).
    s1 = tl.cast(s1, tl.float32)
    s2 = tl.cast(s2, tl.float32)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    io_dtype = out_ptr.dtype.element_ty

    row_ok, n, qd, qh, qw, x_base = _positions(pid_m, BM, n_pos, Dp, Hp, Wp, Wv, sxn, sxd, sxh, sxw)

    cn = pid_n * BN + tl.arange(0, BN)
    cn_ok = cn < Cout
    mult = tl.load(m_ptr + cn * sm, mask=cn_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cn * sb, mask=cn_ok, other=0.0).to(tl.float32)
    else:
        bias = mult  # unused

    SINGLE_K: tl.constexpr = BK == CIN_P
    if SINGLE_K:
        # All of Cin fits one chunk: load the 2x2x2 neighbourhood once and reuse it across the 27 taps.
        x000 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 0, 0, 0, BK)
        x001 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 0, 0, 1, BK)
        x010 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 0, 1, 0, BK)
        x011 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 0, 1, 1, BK)
        x100 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 1, 0, 0, BK)
        x101 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 1, 0, 1, BK)
        x110 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 1, 1, 0, BK)
        x111 = _x_tile(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, 0, Cin, 1, 1, 1, BK)

        if ROUND_TF32:
            # TF32 tensor cores drop the low 13 mantissa bits (truncation, biased); round to nearest once here
            # (the host rounds the packed weight), as cuDNN's TF32 convolution does.
            x000 = _round_tf32(x000, USE_ASM)
            x001 = _round_tf32(x001, USE_ASM)
            x010 = _round_tf32(x010, USE_ASM)
            x011 = _round_tf32(x011, USE_ASM)
            x100 = _round_tf32(x100, USE_ASM)
            x101 = _round_tf32(x101, USE_ASM)
            x110 = _round_tf32(x110, USE_ASM)
            x111 = _round_tf32(x111, USE_ASM)

    # MONO: the monotone form, as in the phase-split GEMM (_phase_tile there says why it is exact): one max per
    # phase; a channel block whose multiplier or bias breaks monotonicity also runs the exact selection.
    best, sel, off, bad, any_bad, sgn, ext = _pool_init(mult, bias, cn_ok, HAS_BIAS, BM, BN, MONO)
    # Phase p = pd*4 + ph*2 + pw is also max_pool3d's scan order within the window (d-major), which the
    # selection below relies on for ties and NaNs.
    for p in tl.static_range(8):
        if SINGLE_K:
            acc = _phase_acc_held(x000, x001, x010, x011, x100, x101, x110, x111, w_ptr, cn,
                                  p // 4, (p // 2) % 2, p % 2, CIN_P, COUT_P, BK, BM, BN, IS_FP32, PRECISION, SOFT_BF16)
        else:
            acc = _phase_acc_chunked(x_ptr, x_base, qd, qh, qw, row_ok, D, H, W, sxc, sxd, sxh, sxw, Cin, w_ptr, cn,
                                     p // 4, (p // 2) % 2, p % 2, CIN_P, COUT_P, BK, BM, BN, IS_FP32, PRECISION,
                                     SOFT_BF16, ROUND_TF32, USE_ASM)
        best, sel, off, ext = _pool_step(acc, p, best, sel, off, ext, sgn, any_bad, bias, mult, s1, s2, HAS_BIAS,
                                         IS_HALF, io_dtype, SOFT_BF16, MONO)
    best = _pool_result(best, ext, sgn, bad, bias, mult, s1, s2, HAS_BIAS, IS_HALF, io_dtype, SOFT_BF16, MONO)
    _store_selection(best, sel, off, n, qd, qh, qw, cn, row_ok, cn_ok, out_ptr, sel_ptr, off_ptr, son, soc, sod, soh,
                     sow, WITH_OFFSETS, SOFT_BF16)


def _interpreting() -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - layout of older/newer Triton
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
    return isinstance(_conv_t3d_post_pool_kernel, InterpretedFunction)


_INTERPRET = _interpreting()

if _INTERPRET:
    # Autotuning times candidates with the CUDA driver, which the interpreter does not have; one config
    # (and no benchmarking) keeps the same launch path. A small BM gives tests several programs and a tail.
    _CONFIGS = [triton.Config({"BM": 32}, num_warps=4)]
else:
    # num_stages=1: the only runtime loop is the Cin-chunk loop, and software-pipelining it multi-buffers every
    # tap's tiles of all 8 phases (an offline fp32 Cin=128 compile asked for 768 KiB of shared memory).
    _CONFIGS = [
        triton.Config({"BM": bm}, num_warps=nw, num_stages=1)
        for bm, nw in ((32, 4), (32, 8), (64, 4), (64, 8), (128, 8))
    ]

# Autotuning is opt-in (TORCH_FUSED_OPS_TRITON_AUTOTUNE=1): on the H200 at the KernelBench size it picked BM=64 with
# 4 warps for TF32, bf16 and TF32 with offsets (BM=32, 8 warps for strict fp32), which is the fixed choice below;
# the autotuner's per-call Python work and its tuning runs (which cannot happen inside a CUDA-graph capture) cost
# more than the few percent between configs.
_AUTOTUNE = os.environ.get("TORCH_FUSED_OPS_TRITON_AUTOTUNE", "0") == "1" and not _INTERPRET
if _AUTOTUNE:
    _kernel = triton.autotune(
        configs=_CONFIGS,
        key=["n_pos", "CIN_P", "COUT_P", "BK", "BN", "HAS_BIAS", "WITH_OFFSETS", "IS_FP32", "PRECISION", "MONO"],
    )(_conv_t3d_post_pool_kernel)
else:
    _kernel = _conv_t3d_post_pool_kernel


def _fixed_config(precision: str) -> triton.Config:
    if _INTERPRET:
        return _CONFIGS[0]
    return triton.Config({"BM": 32}, num_warps=8) if precision == "ieee" else triton.Config({"BM": 64}, num_warps=4)


_last_fixed = None


def last_config():
    """The config of the most recent launch: the autotuner's choice, or the fixed one (None before any launch)."""
    return getattr(_kernel, "best_config", None) if _AUTOTUNE else _last_fixed


# ----------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------
def _as3(value) -> list[int] | None:
    """An int or a 1-/3-sequence of ints as three ints; None when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value] * 3
    if isinstance(value, Sequence) and not isinstance(value, str):
        vals = list(value)
        if len(vals) in (1, 3) and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            return vals * 3 if len(vals) == 1 else vals
    return None


def fused_path_applies(x, weight, stride, padding, output_padding, groups, dilation, pool_kernel, pool_stride,
                       pool_padding, pool_dilation, ceil_mode) -> bool:
    """Whether conv_transpose3d(...) -> max_pool3d(...) with these arguments is the configuration this kernel
    computes. Never raises: an unexpected argument type only means "not this path"."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return False
    if x.dim() != 5 or x.dtype not in _SUPPORTED_DTYPES or weight.dtype != x.dtype:
        return False
    if not (x.is_cuda or _INTERPRET) or weight.device != x.device:
        return False
    if weight.dim() != 5 or tuple(weight.shape[2:]) != (3, 3, 3) or weight.shape[0] != x.shape[1]:
        return False
    if _as3(stride) != [2, 2, 2] or _as3(padding) != [1, 1, 1] or _as3(dilation) != [1, 1, 1]:
        return False
    op = _as3(output_padding)
    if op is None or any(v not in (0, 1) for v in op):
        return False
    if isinstance(groups, bool) or groups != 1:
        return False
    if _as3(pool_kernel) != [2, 2, 2]:
        return False
    # max_pool3d's stride defaults to the kernel size when omitted (None or an empty list).
    stride_omitted = pool_stride is None or (isinstance(pool_stride, Sequence) and len(pool_stride) == 0)
    if not stride_omitted and _as3(pool_stride) != [2, 2, 2]:
        return False
    if _as3(pool_padding) != [0, 0, 0] or _as3(pool_dilation) != [1, 1, 1]:
        return False
    return ceil_mode is False or (isinstance(ceil_mode, int | bool) and not ceil_mode)


def _pow2_at_least(n: int, floor: int) -> int:
    # tl.dot needs every dim >= 16 and power-of-two block shapes.
    return max(floor, triton.next_power_of_2(max(n, 1)))


def _pack_weight(weight: torch.Tensor, cin_p: int, cout_p: int, dtype: torch.dtype, tf32: bool = False) -> torch.Tensor:
    """[Cin, Cout, 3, 3, 3] -> zero-padded contiguous [27, CIN_P, COUT_P], tap index kd*9 + kh*3 + kw.

    Repacked on every call: a cache keyed on the weight tensor would go stale on in-place edits that bypass the
    version counter (``w.data.copy_``) and would outlive CUDA-graph captures that reference it. Without padding
    (power-of-two channel counts >= 16, as in the KernelBench shape) it is one copy kernel.
    """
    cin, cout = weight.shape[0], weight.shape[1]
    # detach: the kernel is forward-only; packing must not record autograd history.
    taps = weight.detach().permute(2, 3, 4, 0, 1).reshape(27, cin, cout)
    if cin == cin_p and cout == cout_p:
        packed = taps.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
    else:
        packed = torch.zeros((27, cin_p, cout_p), device=weight.device, dtype=dtype)
        packed[:, :cin, :cout].copy_(taps)
    # TF32: round to nearest here, since the tensor cores would truncate (the kernel rounds the input tiles).
    return round_tf32(packed) if tf32 else packed


def check_kernel_args(x, weight, bias, multiplier_1d, output_padding) -> None:
    """The fused-convolution kernels' own preconditions, for both of them (this module's and the packed GEMM).
    The ops check every argument first, with the messages users see; these stay because a kernel would read out
    of bounds without them."""
    if not fused_path_applies(x, weight, 2, 1, output_padding, 1, 1, 2, 2, 0, 1, False):
        raise ValueError(
            "arguments outside the fused path: expected a 5-D float16/bfloat16/float32 input on CUDA and a weight "
            f"[{x.shape[1] if x.dim() == 5 else 'Cin'}, Cout, 3, 3, 3] of its dtype and device, output_padding 0 or "
            f"1 per dim; got input {list(x.shape)} {x.dtype}, weight {list(weight.shape)} {weight.dtype}, "
            f"output_padding {output_padding}")
    N, Cin, D, H, W = x.shape
    Cout = weight.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("multiplier", multiplier_1d)):
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise TypeError(f"{name} dtype {t.dtype} must equal the input dtype {x.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, the input on {x.device}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != Cout):
        raise ValueError(f"expected bias of shape [{Cout}], got {list(bias.shape)}")
    if multiplier_1d.numel() != Cout:
        raise ValueError(f"expected {Cout} multiplier elements (one per output channel), got {multiplier_1d.numel()}")
    if N > 0 and Cin > 0 and min(D, H, W) == 0:
        raise ValueError(f"input spatial dims must be non-empty, got shape {list(x.shape)}")
    op = _as3(output_padding)
    pooled_rows(N, D, H, W, op)  # positions are int32 in the kernels (addresses int64): raises past that


def conv_transpose3d_post_pool_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                      multiplier_1d: torch.Tensor, negative_slope: float, negative_slope2: float,
                                      output_padding, allow_tf32: bool, with_offsets: bool, kernel_wrapper=None,
                                      mono: bool = False, w_packed: torch.Tensor | None = None):
    """max_pool3d(leaky(leaky(conv_transpose3d(x, weight, bias, stride=2, padding=1, output_padding), s1) * m, s2),
    kernel 2, stride 2).

    Returns ``out`` or, with ``with_offsets``, ``(out, selected, offsets)``: ``selected`` is the conv output
    (rounded to x's dtype) at the window element max_pool3d picked and ``offsets`` (uint8) that element's
    offset ``pd*4 + ph*2 + pw`` in the 2x2x2 window. fp32 inputs use TF32 tensor cores iff ``allow_tf32``.
    ``kernel_wrapper`` (``torch.library.wrap_triton`` when traced by torch.compile) wraps the kernel before launch.
    ``mono``: the monotone form (one max per phase, the epilogue once) where it is exact: both slopes > 0 and no
    offsets wanted; a sweep candidate, not routed. ``w_packed``: the weight packed beforehand (the sweep times the
    kernel alone).
    """
    check_kernel_args(x, weight, bias, multiplier_1d, output_padding)
    _geometry.check_slopes("conv_transpose3d_post_pool", x.dtype, negative_slope, negative_slope2)
    N, Cin, D, H, W = x.shape
    Cout = weight.shape[1]
    mult = multiplier_1d.reshape(Cout)
    op = _as3(output_padding)

    Dp, Hp, Wp, Wv, n_pos = pooled_rows(N, D, H, W, op)
    shape = (N, Cout, max(Dp, 0), max(Hp, 0), max(Wv, 0))
    fmt = _geometry.output_memory_format(x)  # the layout the op's fake impl reports
    out = torch.empty(shape, device=x.device, dtype=x.dtype, memory_format=fmt)
    if with_offsets:
        selected = torch.empty(shape, device=x.device, dtype=x.dtype, memory_format=fmt)
        offsets = torch.empty(shape, device=x.device, dtype=torch.uint8, memory_format=fmt)
    result = (out, selected, offsets) if with_offsets else out
    if out.numel() == 0:
        return result

    # Channel counts size the program's tiles: under dynamic-shape tracing int() specialises them (the weight's
    # shape fixes them anyway), while the batch and spatial sizes stay symbolic.
    cin_p = _pow2_at_least(int(Cin), 16)
    cout_p = _pow2_at_least(int(Cout), 16)
    bk = min(cin_p, _pow2_at_least(_MAX_BK, 16))
    bn = min(cout_p, _pow2_at_least(_MAX_BN, 16))
    is_fp32 = x.dtype == torch.float32
    tf32 = is_fp32 and allow_tf32
    if w_packed is None:
        w_packed = _pack_weight(weight, cin_p, cout_p, x.dtype, tf32)
    soft_bf16 = _INTERPRET and x.dtype == torch.bfloat16

    def grid(meta):
        return (triton.cdiv(n_pos, meta["BM"]), cout_p // bn)

    # The selected/offsets buffers share out's strides (same shape and layout), so one set is passed; without
    # offsets, out stands in for the unused pointers (never written: WITH_OFFSETS is a constexpr).
    sel_arg, off_arg = (selected, offsets) if with_offsets else (out, out)
    b_arg, sb = (bias, bias.stride(0)) if bias is not None else (mult, 0)
    precision = "tf32" if (is_fp32 and allow_tf32) else "ieee"
    launch = {}
    if not _AUTOTUNE:
        global _last_fixed
        _last_fixed = cfg = _fixed_config(precision)
        launch = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=1)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        (kernel_wrapper or (lambda k: k))(_kernel)[grid](
            x, w_packed, b_arg, mult, out, sel_arg, off_arg,
            float(negative_slope), float(negative_slope2),
            n_pos, Cin, Cout, D, H, W, Dp, Hp, Wp, Wv,
            *x.stride(),
            *out.stride(),
            sb, mult.stride(0),
            CIN_P=cin_p, COUT_P=cout_p, BK=bk, BN=bn,
            HAS_BIAS=bias is not None, WITH_OFFSETS=bool(with_offsets), IS_FP32=is_fp32,
            IS_HALF=not is_fp32, PRECISION=precision, SOFT_BF16=soft_bf16, ROUND_TF32=tf32, USE_ASM=not _INTERPRET,
            MONO=bool(mono) and monotone_form(negative_slope, negative_slope2, with_offsets), **launch,
        )
    return result

