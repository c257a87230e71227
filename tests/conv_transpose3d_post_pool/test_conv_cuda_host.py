"""The fused convolution's CUDA host path, through the op: CUDA-graph capture and replay, no device
synchronisation in either form, and a loose bound on the host time of an eager call (the figure itself:
benchmarks/conv_transpose3d_post_pool/host_time.py)."""
import pytest
import torch

from conv_testing import CONFIGS, OPS, config_args, make_tensors, requires_cuda
from torch_fused_ops import conv_transpose3d_post_pool


@requires_cuda
@pytest.mark.parametrize("with_offsets", [False, True])
def test_cuda_graph_capture_and_replay(with_offsets):
    x, w, b, m = make_tensors(torch.float32, "cuda", cin=16, cout=32, spatial=(4, 6, 6))
    args = config_args(x, w, b, m, CONFIGS["kb"])
    op = OPS.conv_transpose3d_post_pool_with_offsets if with_offsets else OPS.conv_transpose3d_post_pool
    eager = op(*args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op(*args)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(*args)
    x.copy_(torch.randn_like(x))  # replay reads the new input in place
    graph.replay()
    torch.cuda.synchronize()
    expected = op(*args)
    for c, e in zip(captured if with_offsets else [captured], expected if with_offsets else [expected]):
        assert torch.equal(c, e)
    assert not torch.equal((captured[0] if with_offsets else captured), (eager[0] if with_offsets else eager))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["kb", "pool3"])
def test_no_device_synchronisation(dtype, name):
    x, w, b, m = make_tensors(dtype, "cuda", cin=16, cout=32)
    args = config_args(x, w, b, m, CONFIGS[name])
    OPS.conv_transpose3d_post_pool(*args)  # first-call set-up (cuDNN handles) outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        OPS.conv_transpose3d_post_pool(*args)
        OPS.conv_transpose3d_post_pool_with_offsets(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_time_sanity_bound(dtype):
    # A loose bound only (machines vary); benchmarks/conv_transpose3d_post_pool/host_time.py measures the figure the
    # issue targets.
    from torch_fused_ops.tools.timing import host_us

    x, w, b, m = make_tensors(dtype, "cuda", n=1, cin=16, cout=32, spatial=(16, 32, 32))
    for _ in range(5):
        conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
    t = min(host_us(lambda: conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1), torch.device("cuda"), n=50)
            for _ in range(3))
    assert t < 100.0, f"{t:.1f} us of host time per eager call"


def test_forward_kernel_switch():
    """The kernel switch the tests and benchmarks use: returns the previous choice, None only reads it, anything but
    0, 1 or 2 raises and changes nothing; every build answers whether it holds the sm_90a kernel."""
    from torch_fused_ops import _C

    assert isinstance(_C._conv_wgmma_built(), bool)
    start = _C._conv_forward_kernel(None)
    try:
        assert _C._conv_forward_kernel(1) == start
        assert _C._conv_forward_kernel(None) == 1
        assert _C._conv_forward_kernel(2) == 1
        for bad in (-1, 3):
            with pytest.raises(ValueError, match="mma.sync"):
                _C._conv_forward_kernel(bad)
        assert _C._conv_forward_kernel(None) == 2
        with pytest.raises(TypeError):
            _C._conv_forward_kernel("1")
    finally:
        _C._conv_forward_kernel(start)
    assert _C._conv_forward_kernel(None) == start


def test_hopper_split_switch():
    """The benchmarks' switch for how the sm_90a kernel hands out work: auto (0) unless a benchmark sets it, returns
    the previous choice, None only reads it, anything but 0, 1 or 2 raises and changes nothing."""
    from torch_fused_ops import _C

    start = _C._conv_hopper_split(None)
    assert start == 0
    try:
        assert _C._conv_hopper_split(2) == 0
        assert _C._conv_hopper_split(1) == 2
        for bad in (-1, 3):
            with pytest.raises(ValueError, match="halves"):
                _C._conv_hopper_split(bad)
        assert _C._conv_hopper_split(None) == 1
    finally:
        _C._conv_hopper_split(start)
    assert _C._conv_hopper_split(None) == 0


def test_hopper_ablation_switch():
    """The measurement switch that leaves parts of the sm_90a kernel out: off (0) unless a benchmark sets it, anything
    outside 0..7 raises ValueError and changes nothing; a product build (no TORCH_FUSED_OPS_HOPPER_ABLATION) refuses
    any part, saying how to make a measurement build; a measurement build returns the previous bits, None only
    reads them."""
    from torch_fused_ops import _C

    assert _C._conv_hopper_ablation(None) == 0
    for bad in (-1, 8):
        with pytest.raises(ValueError, match="epilogue"):
            _C._conv_hopper_ablation(bad)
    assert _C._conv_hopper_ablation(0) == 0
    try:
        previous = _C._conv_hopper_ablation(5)
    except RuntimeError as e:  # a product build
        assert "TORCH_FUSED_OPS_HOPPER_ABLATION=1" in str(e)
    else:
        assert previous == 0 and _C._conv_hopper_ablation(None) == 5
    finally:
        _C._conv_hopper_ablation(0)
    assert _C._conv_hopper_ablation(None) == 0


def test_hopper_trace_switch():
    """The measurement trace buffer of the sm_90a kernel: none (0) unless a benchmark sets one; a product build
    refuses an address, saying how to make a measurement build; a measurement build returns the previous address.
    A negative address raises OverflowError and changes nothing."""
    from torch_fused_ops import _C

    assert _C._conv_hopper_trace(0) == 0
    with pytest.raises(OverflowError):
        _C._conv_hopper_trace(-1)
    try:
        previous = _C._conv_hopper_trace(4096)
    except RuntimeError as e:  # a product build
        assert "TORCH_FUSED_OPS_HOPPER_ABLATION=1" in str(e)
    else:
        assert previous == 0 and _C._conv_hopper_trace(0) == 4096
    assert _C._conv_hopper_trace(0) == 0
