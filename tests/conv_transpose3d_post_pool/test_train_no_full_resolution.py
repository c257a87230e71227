"""A compiled training step of the unmodified Model never allocates a tensor at the convolution's full resolution.

With the pass (default settings) the forward is the fused convolution at pooled resolution, and its backward
works from the pooled-resolution gradient (csrc/conv_transpose3d_post_pool/backward_contract.h): no tensor of the full-resolution
conv output's size (or larger) should exist during the step, in either direction. The allocator's memory history
sees every block handed out during the step, Inductor's buffers and the kernels' own outputs alike (a kernel
can only touch a fresh full-resolution tensor that was allocated); tensors that existed before the step are
the parameters, x and the output gradient, all smaller.

Size: batch 2, x [2, 16, 8, 16, 16], conv output [2, 32, 16, 32, 32] (1,048,576 elements; pooled: 131,072).
The threshold is the full-resolution conv output in the step's dtype (4 MiB float32, 2 MiB bfloat16): the
gradient today's backward rebuilds, and any tensor at least that large; pooled tensors are an eighth of it. (A
workspace of the backward kernels that large would trip it too: the figure to keep below is the same.)
"""
import contextlib

import pytest
import torch

import torch_fused_ops
from torch_fused_ops.tools.memory_trace import allocations_during, describe
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="CUDA is not available (torch.cuda.is_available() is False): the fused convolution "
                              "and its backward run on CUDA only"),
    pytest.mark.skipif(not torch_fused_ops.has_cuda_kernels(),
                       reason="this build of torch_fused_ops has no CUDA kernels"),
]

BATCH, SPATIAL = 2, (8, 16, 16)
CASES = [  # dtype, allow_tf32, x requires grad, torch.autocast dtype around the forward (None: no autocast)
    pytest.param(torch.float32, True, False, None, id="tf32"),
    pytest.param(torch.float32, True, True, None, id="tf32-xgrad"),
    pytest.param(torch.bfloat16, True, False, None, id="bf16"),
    pytest.param(torch.bfloat16, True, True, None, id="bf16-xgrad"),
    pytest.param(torch.float32, False, False, None, id="strict"),
    # The float32 model under autocast: its convolution runs in the 16-bit dtype, whose full-resolution output is
    # the threshold (the pooled output and its gradient are float32).
    pytest.param(torch.float32, True, True, torch.bfloat16, id="autocast-bf16-xgrad"),
    pytest.param(torch.float32, True, False, torch.float16, id="autocast-fp16"),
]


@contextlib.contextmanager
def _fresh_inductor():
    # No on-disk caches: a cache hit skips the pre-grad pass (torch >= 2.12), and then nothing would be fused.
    stack = contextlib.ExitStack()
    with stack:
        stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
        if hasattr(torch._functorch.config, "enable_autograd_cache"):
            stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
        torch._dynamo.reset()
        try:
            yield
        finally:
            torch._dynamo.reset()


@pytest.mark.parametrize("dtype, tf32, x_grad, amp", CASES)
def test_compiled_training_step_stays_at_pooled_resolution_cuda(dtype, tf32, x_grad, amp):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device=dev, dtype=dtype)
    x = torch.randn(BATCH, 16, *SPATIAL, device=dev, dtype=dtype).requires_grad_(x_grad)
    full_shape = (BATCH, 32) + tuple(2 * s for s in SPATIAL)
    full_numel = torch.Size(full_shape).numel()
    g = torch.randn(BATCH, 32, *SPATIAL, device=dev, dtype=dtype)
    params = list(model.parameters())

    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=tf32), _fresh_inductor():
        before = torch_fused_ops.matched_count()
        compiled = torch.compile(model)

        def zero_grad():
            for p in params:
                p.grad = None
            x.grad = None

        def fwd_bwd():
            with torch.autocast("cuda", dtype=amp or torch.bfloat16, enabled=amp is not None):
                out = compiled(x)
            out.backward(g)

        def step():
            zero_grad()
            fwd_bwd()

        # Compilation, and the one-time workspaces of libraries, happen here, outside what is checked.
        step()
        step()
        assert torch_fused_ops.matched_count() > before, "the pass did not rewrite the chain"
        assert all(p.grad is not None for p in params) and (x.grad is not None) == x_grad

        full_bytes = full_numel * (x.element_size() if amp is None else torch.finfo(amp).bits // 8)
        allocs = allocations_during(step, dev)
        assert allocs, "the memory history recorded no allocation during the step"
        big = [a for a in allocs if int(a["size"]) >= full_bytes]
        assert not big, (f"{len(big)} allocation(s) of at least a full-resolution conv output ({full_bytes} bytes, "
                         f"{list(full_shape)} {dtype}) during the step:\n" + "\n".join(describe(a) for a in big[:5]))

        zero_grad()
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fwd_bwd()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
        # Under autocast the pooled output and its gradient are float32 (half a 16-bit full-resolution tensor
        # each), so the step's peak is held below the float32 full-resolution tensor that eager autocast's
        # promoting multiply writes; no single allocation may reach the 16-bit one (above).
        peak_limit = full_bytes if amp is None else full_numel * 4
        assert peak < peak_limit, (f"the step's peak memory rose {peak} bytes, at least the {peak_limit} bytes of "
                                   f"one full-resolution tensor {list(full_shape)}")
