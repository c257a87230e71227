"""What torch's mutation analysis believes each fused-convolution Triton launch writes.

Compiled graphs (``triton_op`` / ``wrap_triton``) clone every kernel argument that the analysis marks as written
and, when that argument is a view of a graph input (the multiplier is), copy it back into the input after the
kernel. A false "written" therefore makes the compiled Model mutate the user's parameter, adds three small kernels
per call, and keeps CUDA graphs (mode="reduce-overhead") from applying. The analysis reads the kernels' TTIR,
which Triton generates offline for an sm_90 target, so the first test runs on CPU as well.
"""
from __future__ import annotations

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

import torch_fused_ops
from torch_fused_ops import _conv_post_pool_triton as exact
from torch_fused_ops import _conv_triton_op as top

try:
    from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors as _identify
except ImportError:  # older torch: the same analysis under its earlier name
    from torch._higher_order_ops.triton_kernel_wrap import identify_mutated_tensors as _identify


class _Sm90Target:
    """Stands in for Triton's active driver so that TTIR generates without a GPU."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, *args):
        return 0


def _written(kernel, kwargs):
    result = _identify(kernel, kwargs, {})
    if isinstance(result, list):  # identify_mutated_tensors: names
        return sorted(result)
    return sorted(d.name for d in result.read_writes.writes if isinstance(kwargs.get(d.name), torch.Tensor))


def _recorder(calls):
    def wrap(kernel):
        class Grid:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    kw = dict(zip(kernel.arg_names, args))
                    kw.update(kwargs)
                    calls.append((kernel, kw))
                return launch
        return Grid()
    return wrap


# (label, dtype, batch, allow_tf32): each inference route of _conv_triton_op._CONFIGS.
ROUTES = [("tf32 packed GEMM", torch.float32, 16, True), ("tf32 small, phase-split", torch.float32, 1, True),
          ("bf16 phase-split", torch.bfloat16, 16, False), ("strict fp32 phase-split", torch.float32, 16, False)]


@pytest.fixture
def offline_sm90(monkeypatch):
    if not hasattr(driver, "_active"):
        pytest.skip(f"Triton {triton.__version__}: no DriverConfig._active to stand in for a GPU driver")
    monkeypatch.setattr(exact, "check_kernel_args", lambda *a, **k: None)  # CPU tensors stand in for CUDA ones
    # Restored afterwards to what it was (None until first use on a CPU-only machine, where reset_active() would
    # fail to create a driver).
    monkeypatch.setattr(driver, "_active", _Sm90Target())
    yield


@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
def test_inference_kernels_write_only_their_outputs(offline_sm90, route):
    _, dtype, batch, tf32 = route
    x = torch.randn(batch, 16, 16, 32, 32, dtype=dtype)
    w = torch.randn(16, 32, 3, 3, 3, dtype=dtype)
    b, m = torch.randn(32, dtype=dtype), torch.randn(32, dtype=dtype)
    calls = []
    top.launch(x, w, b, m, 0.2, 0.2, [1, 1, 1], tf32, kernel_wrapper=_recorder(calls))
    assert calls, "no kernel launched"
    for i, (kernel, kw) in enumerate(calls):
        # The packed GEMM's first launch also writes one flag per tile for its fix-up launch.
        expected = ["flag_ptr", "out_ptr"] if "flag_ptr" in kw and i == 0 and len(calls) == 2 else ["out_ptr"]
        assert _written(kernel, kw) == expected, kernel.fn.__name__


@pytest.mark.parametrize("with_offsets", [False, True])
def test_training_kernel_writes_only_its_outputs(offline_sm90, with_offsets):
    x = torch.randn(2, 16, 8, 8, 8)
    w = torch.randn(16, 32, 3, 3, 3)
    b, m = torch.randn(32), torch.randn(32)
    calls = []
    exact.conv_transpose3d_post_pool_triton(x, w, b, m, 0.2, 0.2, [1, 1, 1], True, with_offsets,
                                            kernel_wrapper=_recorder(calls))
    (kernel, kw), = calls
    expected = ["off_ptr", "out_ptr", "sel_ptr"] if with_offsets else ["out_ptr"]
    assert _written(kernel, kw) == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_compiled_model_takes_cuda_graphs_with_the_pass():
    # Batch 1 is bound by the host's launch work; CUDA graphs replay it. Before the analysis fix the rewritten
    # graph mutated the multiplier, and Inductor skipped CUDA graphs for it.
    from torch._dynamo.utils import counters

    from torch_fused_ops.models import DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool

    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    x = torch.randn(1, 16, *DEFAULT_INPUT, device="cuda")
    m_before = model.multiplier.detach().clone()
    with torch.no_grad():
        expected = model(x)
    torch._dynamo.reset()
    skips = counters["inductor"]["cudagraph_skips"]
    with torch_fused_ops.fusion_enabled(True), torch.no_grad():
        fn = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            out = fn(x).clone()
    torch._dynamo.reset()
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert torch.equal(model.multiplier.detach(), m_before)
    torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)
