"""fused::conv_transpose3d_post_pool_infer: the fused convolution's inference kernels as a ``triton_op``.

Why a second op next to fused.conv_transpose3d_post_pool: torch.compile traces *into* a
``torch.library.triton_op`` (AOTAutograd decomposes it), so Inductor sees the weight packing as ordinary aten
ops, fuses them into its own kernels, and launches our Triton kernel from its generated wrapper. The public op
is opaque to Inductor: its Python kernel re-checks every argument, repacks the weight with several eager ops and
goes through Triton's Python launcher on each call. On the H200 host that measured 416 us of host time per call
of the compiled Model's forward, against a 161 us kernel: the forward was host-bound.

Kernels: the packed-GEMM kernel (``_conv_post_pool_gemm_triton``) for TF32, the phase-split GEMM
(``_conv_post_pool_phase_gemm_triton``) for half precision and for strict float32 (three TF32 products);
``_CONFIGS`` says why. The training forward keeps the phase-exact kernel (``_conv_post_pool_triton``).

The pass routes *inference* graphs here when the fused path applies (CUDA, kernel 3 / stride 2 / padding 1, a
2x2x2 pool: ``_conv_post_pool_triton.fused_path_applies``, checked at compile time). The op has no autograd:
called with inputs that require grad it raises, and the pass never does that. Eager inference calls of the
public op run the same ``launch`` below, so both paths use one kernel choice.

float32 follows ``allow_tf32`` (the pass passes ``torch.backends.cudnn.allow_tf32`` as it reads at compile time).
"""
from __future__ import annotations

import torch
import triton
from torch import Tensor

from . import _conv_post_pool_gemm_triton as gemm
from . import _conv_post_pool_phase_gemm_triton as phase
from . import _conv_post_pool_triton as exact
from . import _geometry

_OP = "fused::conv_transpose3d_post_pool_infer"

# Kernel and launch config per precision, from benchmarks/conv_t3d_variants.py on the H200 at the KernelBench size
# (kernel times; the same config moved by up to 1.3x between runs, so only same-run comparisons count):
# - bf16/fp16: the phase-split GEMM, BM=64, 16 channels per K chunk, 4 warps, 32 output channels per program,
#   weight K-major: 108.6 / 109.1 us against 152.7 / 118.0 us for the packed GEMM in the same runs (2026-11-29
#   evening; the packed GEMM measured 95.6-115 us in other runs). Batch 1: 39.6 us against 101.8-163.7 us.
# - TF32: the packed GEMM with the weight stored K-major, BM=64/BK=32/4 warps/3 stages: 141.2 / 145.4 us, against
#   185.0 / 180.0 us for the phase-split GEMM in the same runs. TF32 tensor-core instructions read B K-major
#   only; with the [K, N] weight the same GEMM took 323-583 us.
# - strict float32: the phase-split GEMM with float32 from three TF32 products ("3xtf32", our own split, which
#   keeps infinities exact): 302.8 us and 2.28e-7 relative L2 error against float64. Triton's tf32x3 dot plus a
#   TF32 dot for non-finite inputs: 301.5 us, 2.26e-7 (same run; removed as redundant). The phase-exact kernel
#   in plain fp32: 637 us, 1.48e-7; cuDNN fp32: 7.95e-8; the bound: 1e-5. Batch 1: 42.8 us against
#   100.8 us for the packed GEMM.
_SMALL_POSITIONS = 65536
_CONFIGS = {
    # TF32 with few positions (batch 1 of the KernelBench size: 16384 pooled positions, 256 tiles on 132
    # multiprocessors): the phase-split GEMM, 67.8 us against 95.3 us for the packed GEMM (same run). Chosen when
    # the position count is a static int below _SMALL_POSITIONS; the threshold lies between the two measured sizes
    # (16384: phase-split faster, 262144: packed faster), not at a measured crossover.
    #
    # mono: the phase-split kernel's monotone form (one max per phase, the epilogue once; exact, see
    # _phase_tile), same-run sweep 2026-11-29 (late), batch 16: bf16 105.3 against 109.3 us, TF32 170.3 against
    # 181.3 us (so presumably also a gain at batch 1, where it was not measured); three-TF32 355.0 against 298.0
    # us (offline it spills 528 bytes against 120), so strict float32 keeps the exact form.
    "tf32_small": dict(kernel="phase", bm=64, ck=16, num_warps=4, num_stages=1, kmajor=True, bnc=32, mono=True),
    "half": dict(kernel="phase", bm=64, ck=16, num_warps=4, num_stages=1, kmajor=True, bnc=32, mono=True),
    "tf32": dict(kernel="packed", bm=64, bk=32, num_warps=4, num_stages=3, kmajor=True, bnc=32),
    "fp32": dict(kernel="phase", bm=64, ck=16, num_warps=4, num_stages=1, kmajor=True, bnc=32, precision="3xtf32",
                 mono=False),
}


def launch(x: Tensor, weight: Tensor, bias: Tensor | None, mult: Tensor, s1: float, s2: float,
           output_padding: list[int], allow_tf32: bool, kernel_wrapper=None) -> Tensor:
    """Inference forward on the fused path (``exact.check_kernel_args`` raises outside it); ``mult`` is a
    contiguous [Cout] tensor. ``kernel_wrapper`` (``wrap_triton`` under tracing) wraps each kernel before launch."""
    wrap = kernel_wrapper or (lambda k: k)
    exact.check_kernel_args(x, weight, bias, mult, output_padding)
    _geometry.check_slopes(_OP, x.dtype, s1, s2)
    tf32 = x.dtype == torch.float32 and allow_tf32
    N, Cin, D, H, W = x.shape
    Cout = weight.shape[1]
    Dp, Hp, Wp = (v - 1 + o for v, o in zip((D, H, W), output_padding))
    out = torch.empty((N, Cout, Dp, Hp, Wp), device=x.device, dtype=x.dtype,
                      memory_format=_geometry.output_memory_format(x))
    if out.numel() == 0:
        return out
    # int(): channel counts size the tiles (specialised under dynamic-shape tracing, as the weight fixes them).
    cin_p = max(16, triton.next_power_of_2(int(Cin)))
    precision = "tf32" if tf32 else "half" if x.dtype != torch.float32 else "fp32"
    n_pos = N * Dp * Hp * Wp
    if tf32 and isinstance(n_pos, int) and n_pos < _SMALL_POSITIONS:
        # A symbolic size (dynamic-shape graphs) keeps the large-size choice rather than guarding on the batch.
        precision = "tf32_small"
    cfg = dict(_CONFIGS[precision])
    kernel = cfg.pop("kernel")
    # Output channels per program: the config's block width, or fewer when Cout is small.
    bnc = min(max(4 if kernel == "packed" else 16, triton.next_power_of_2(int(Cout))), cfg.pop("bnc"))
    if gemm._INTERPRET:
        cfg.update(bm=16 if kernel == "phase" else 32, num_warps=4, num_stages=1)
    if kernel == "phase":
        dot = cfg.pop("precision", None)
        w_packed = phase.pack_weight(weight, cin_p, bnc, x.dtype, tf32, cfg["kmajor"], split3=dot == "3xtf32")
        phase.launch(x, w_packed, bias, mult, s1, s2, out, output_padding, tf32=tf32, cin_p=cin_p, bnc=bnc,
                     precision=dot, kernel_wrapper=wrap, **cfg)
    else:
        w_packed = gemm.pack_weight(weight, cin_p, bnc, x.dtype, tf32, cfg["kmajor"])
        gemm.launch(x, w_packed, bias, mult, s1, s2, out, output_padding, tf32=tf32, kernel_wrapper=wrap, **cfg)
    return out


class _NoLaunch:
    """Stands in for a kernel under the Triton interpreter when the op runs as its own fake impl: wrap_triton
    cannot wrap an interpreted kernel (pytorch/pytorch#152868), and fake tensors hold no data to compute on."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _kernel_wrapper(t: Tensor):
    if gemm._INTERPRET and isinstance(t, torch._subclasses.fake_tensor.FakeTensor):
        return lambda kernel: _NoLaunch()
    return torch.library.wrap_triton


@torch.library.triton_op(_OP, mutates_args=())
def conv_transpose3d_post_pool_infer(input: Tensor, weight: Tensor, bias: Tensor | None, multiplier: Tensor,
                                     negative_slope: float, negative_slope2: float, output_padding: list[int],
                                     allow_tf32: bool) -> Tensor:
    """``max_pool3d(leaky(leaky(conv_transpose3d(input, weight, bias, 2, 1, output_padding), s1) * m, s2), 2)``
    on the fused path, inference only. Called by compiled graphs that the pass rewrote."""
    cout = weight.shape[1]
    torch._check(multiplier.numel() == cout or multiplier.numel() == 1,
                 lambda: f"{_OP}: expected 1 or {cout} multiplier elements, got {multiplier.numel()}")
    mult = multiplier.reshape(-1).expand(cout).contiguous()
    return launch(input, weight, bias, mult, negative_slope, negative_slope2, list(output_padding), allow_tf32,
                  kernel_wrapper=_kernel_wrapper(input))
