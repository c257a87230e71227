"""The arithmetic fact the sm_90a kernel's 16-bit training selection rests on (hopper/epilogue.cuh, select_pair).

The kernel picks max_pool3d's selected phase as the first phase holding the largest convolution value y (as the I/O
dtype rounded it), without activating every phase, and checks only that |y| of that maximum lies in [kPairMinY,
kPairMaxY] with every |multiplier| and slope within [kPairMinScale, kPairMaxScale]. That is exact only if the
activation f(y) = leaky(leaky(y, s1) * m, s2), computed in float32 as the kernel computes it, never gives the same
float for a y in that range and the dtype's next value on the side f decreases toward (below for m > 0, above for
m < 0): any earlier phase whose activation ties the maximum would have to reach that neighbour. Checked here over
every finite bfloat16 and float16 value, for multipliers spread over the allowed range (and its ends) and several
slopes; and the check itself is shown to find such ties once the range is widened.
"""
from __future__ import annotations

import pathlib
import re

import pytest
import torch

HEADER = pathlib.Path(__file__).resolve().parents[2] / "csrc/conv_transpose3d_post_pool/hopper/epilogue.cuh"


def header_constants() -> dict[str, float]:
    text = HEADER.read_text()
    found = {name: float.fromhex(value.rstrip("f")) for name, value in
             re.findall(r"(kPair\w+) = (0x1p-?\d+f)", text)}
    assert set(found) == {"kPairMinY", "kPairMaxY", "kPairMinScale", "kPairMaxScale"}, found
    return found


def activation(y: torch.Tensor, m: float, s1: float, s2: float) -> torch.Tensor:
    # Unit slopes: leaky(v, s) = max(v, v * s), each product rounded to float32 (the kernel's leaky_unit_slope).
    f32 = torch.float32
    u = torch.maximum(y, y * torch.tensor(s1, dtype=f32)) * torch.tensor(m, dtype=f32)
    return torch.maximum(u, u * torch.tensor(s2, dtype=f32))


def finite_grid(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of the dtype, increasing, as float32 (one zero)."""
    inf_bits = 0x7F80 if dtype == torch.bfloat16 else 0x7C00
    pos = torch.arange(0, inf_bits, dtype=torch.int32).to(torch.int16).view(dtype).float()
    return torch.cat([-pos.flip(0)[:-1], pos])


def ties_next_to_maximum(dtype, multipliers, slopes, y_lo, y_hi) -> int:
    ys = finite_grid(dtype)
    inside = (ys.abs() >= y_lo) & (ys.abs() <= y_hi)
    ties = 0
    for s1, s2 in slopes:
        for m in multipliers:
            e = activation(ys, m, s1, s2)
            if m > 0:  # f increases with y: the neighbour below
                strict, where = e[1:] > e[:-1], inside[1:]
            else:  # f decreases with y: the neighbour above
                strict, where = e[:-1] > e[1:], inside[:-1]
            ties += int((~strict & where).sum())
    return ties


def multipliers_in_range(dtype, lo, hi, count, seed=0):
    pos = finite_grid(dtype)
    allowed = pos[(pos >= lo) & (pos <= hi)]
    g = torch.Generator().manual_seed(seed)
    picked = allowed[torch.randint(0, allowed.numel(), (count,), generator=g)].tolist()
    picked += [allowed.min().item(), allowed.max().item()]
    return picked + [-v for v in picked]


SLOPES = [(0.2, 0.2), (1.0, 1.0), (0.01, 0.3)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_no_tie_next_to_a_maximum_in_range(dtype):
    c = header_constants()
    slopes = SLOPES + [(c["kPairMinScale"], c["kPairMinScale"])]
    ms = multipliers_in_range(dtype, c["kPairMinScale"], c["kPairMaxScale"], 200)
    assert ties_next_to_maximum(dtype, ms, slopes, c["kPairMinY"], c["kPairMaxY"]) == 0


def test_the_check_finds_ties_outside_the_range():
    c = header_constants()
    ms = multipliers_in_range(torch.bfloat16, c["kPairMinScale"], c["kPairMaxScale"], 20)
    # Down to bfloat16's subnormals and up to its largest values, f's float32 steps underflow and overflow.
    assert ties_next_to_maximum(torch.bfloat16, ms, SLOPES, 0.0, float("inf")) > 0
