"""The models this package targets, as users write them (no reference to our ops)."""
from __future__ import annotations

import torch
from torch import nn


class ConvTransposeLeakyMulLeakyPool(nn.Module):
    """KernelBench level 2, problem 74: ConvTranspose3d -> LeakyReLU -> x multiplier -> LeakyReLU -> MaxPool3d."""

    def __init__(self, in_channels=16, out_channels=32, kernel_size=3, stride=2, padding=1, output_padding=1,
                 multiplier_shape=(32, 1, 1, 1)):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.multiplier = nn.Parameter(torch.randn(multiplier_shape))
        self.leaky_relu = nn.LeakyReLU(negative_slope=0.2)
        self.max_pool = nn.MaxPool3d(kernel_size=2)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.leaky_relu(x)
        x = x * self.multiplier
        x = self.leaky_relu(x)
        return self.max_pool(x)


def fused_forward(model: ConvTransposeLeakyMulLeakyPool, x: torch.Tensor) -> torch.Tensor:
    """The same forward with the epilogue as one fused.post_pool call (what the Inductor pass will produce)."""
    from .ops.post_pool import post_pool

    y = model.conv_transpose(x)
    pool = model.max_pool
    return post_pool(y, model.multiplier, model.leaky_relu.negative_slope, pool.kernel_size, pool.stride,
                     pool.padding, pool.dilation, pool.ceil_mode)


# KernelBench's default problem: batch 16, 16 -> 32 channels, input 16x32x32 (conv output 32x64x64).
DEFAULT_BATCH = 16
DEFAULT_INPUT = (16, 32, 32)
