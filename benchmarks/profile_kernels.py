"""One call of each fused.post_pool kernel at the default size, and of the fused convolution (forward and its
backward) at the KernelBench size, for Nsight Compute to profile (`bash scripts/gpu.sh ncu` runs it under ncu).

    ncu --clock-control none -k regex:post_pool --section SpeedOfLight ... python benchmarks/profile_kernels.py

Each kernel runs once after a warm-up pass that ncu also sees; filter with --launch-skip or read the last rows.
"""
import torch

import torch_fused_ops  # noqa: F401

ops = torch.ops.fused


def main():
    torch.manual_seed(0)
    shape = (16, 32, 32, 64, 64)
    for dtype in (torch.float32, torch.bfloat16):
        for fmt in (torch.contiguous_format, torch.channels_last_3d):
            x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
            m = torch.randn(32, 1, 1, 1, device="cuda", dtype=dtype)
            torch.cuda.nvtx.range_push(f"{dtype} {fmt}")
            ops.post_pool(x, m, 0.2, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, None)
            out, sel, off = ops.post_pool_with_offsets(x, m, 0.2, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, None)
            g = torch.randn_like(out)
            ops.post_pool_backward(g, sel, off, m, 0.2, None, list(shape), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1],
                                   fmt == torch.channels_last_3d)
            torch.cuda.nvtx.range_pop()
    # The fused convolution kernel at the KernelBench size (TF32, inference and training forward).
    from torch_fused_ops import conv_transpose3d_post_pool

    x = torch.randn(16, 16, 16, 32, 32, device="cuda")
    w = torch.randn(16, 32, 3, 3, 3, device="cuda") * 0.1
    b, m = torch.randn(32, device="cuda"), torch.randn(32, 1, 1, 1, device="cuda")
    conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
    # The training forward, then its pooled-resolution backward (grad_conv, grad_weight, and grad_input for x).
    x.requires_grad_()
    w.requires_grad_()
    out = conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
