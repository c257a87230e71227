"""The pass folding a convolution's bias into fused.post_pool_bias (PassConfig.fold_conv_bias)."""

import pytest
import torch
from torch import nn

from torch_fused_ops.compile import fusion_pass, pass_config
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from pass_testing import compile_run
from pass_testing import _isolated_inductor  # noqa: F401  (the autouse fixture of the pass tests)
from fused_testing import DEVICES

# The fused transposed convolution off, the conv-bias fold at the package's setting (conftest.py).
pytestmark = pytest.mark.pass_settings(fuse_conv_transpose="off")


@pytest.fixture
def fold():
    with pass_config.patch(fold_conv_bias="always"):
        yield


class Conv3dChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 6, 3, padding=1)
        self.register_buffer("m", torch.randn(6, 1, 1, 1))

    def forward(self, x):
        y = torch.nn.functional.leaky_relu(self.conv(x), 0.1)
        return torch.nn.functional.max_pool3d(torch.nn.functional.leaky_relu(y * self.m, 0.3), 2)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("device", DEVICES)
def test_fold_model_inference_and_training(device, fold):
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device)
    x = torch.randn(2, 16, 4, 8, 8, device=device)
    with torch.no_grad():
        out, code, matched = compile_run(model, x)
        ref = model(x)
    assert matched == 1 and "post_pool_bias" in code
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)

    xg = x.clone().requires_grad_()

    def step(inp):
        model.zero_grad()
        model(inp).sum().backward()
        return [inp.grad.clone()] + [p.grad.clone() for p in (model.multiplier, model.conv_transpose.weight,
                                                                model.conv_transpose.bias)]

    want = step(xg)
    xg.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(model)
    model.zero_grad()
    compiled(xg).sum().backward()
    got = [xg.grad] + [p.grad for p in (model.multiplier, model.conv_transpose.weight, model.conv_transpose.bias)]
    for name, a, b in zip(("input", "multiplier", "weight", "bias"), got, want):
        assert _rel(a, b) < 1e-5, f"{name} gradient differs from eager: rel {_rel(a, b):.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_fold_conv3d_with_buffer_multiplier(device, fold):
    torch.manual_seed(1)
    model = Conv3dChain().to(device)
    x = torch.randn(2, 4, 6, 8, 8, device=device)
    with torch.no_grad():
        out, code, matched = compile_run(model, x)
        ref = model(x)
    assert matched == 1 and "post_pool_bias" in code
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_no_fold_when_conv_output_is_used_elsewhere(device, fold):
    torch.manual_seed(2)
    conv = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1).to(device)
    m = torch.randn(6, 1, 1, 1, device=device)

    def f(x):
        y = conv(x)
        z = torch.nn.functional.leaky_relu(torch.nn.functional.leaky_relu(y, 0.2) * m, 0.2)
        return torch.nn.functional.max_pool3d(z, 2), y.mean()

    x = torch.randn(1, 4, 3, 4, 4, device=device)
    with torch.no_grad():
        (out, mean), code, matched = compile_run(f, x)
        ref, ref_mean = f(x)
    assert matched == 1 and "post_pool_bias" not in code and "post_pool" in code
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-5, atol=1e-6)


def test_fold_off_keeps_plain_op_and_changes_uuid():
    model = ConvTransposeLeakyMulLeakyPool()
    x = torch.randn(1, 16, 3, 4, 4)
    with pass_config.patch(fold_conv_bias="off"):
        uuid_off = fusion_pass.PostPoolFusionPass().uuid()
        with torch.no_grad():
            _, code, matched = compile_run(model, x)
    assert matched == 1 and "post_pool_bias" not in code and "fused.post_pool" in code
    with pass_config.patch(fold_conv_bias="always"):
        assert fusion_pass.PostPoolFusionPass().uuid() != uuid_off


def test_fold_cuda_mode_leaves_cpu_graphs_alone():
    with pass_config.patch(fold_conv_bias="cuda"):
        _fold_cuda_mode_leaves_cpu_graphs_alone()


def _fold_cuda_mode_leaves_cpu_graphs_alone():
    model = ConvTransposeLeakyMulLeakyPool()
    x = torch.randn(1, 16, 3, 4, 4)
    with torch.no_grad():
        _, code, matched = compile_run(model, x)
    assert matched == 1 and "post_pool_bias" not in code
