"""The eager wrappers call the ops through C entry points (csrc/python_module.cpp) instead of torch.ops: the same
operator, results and exceptions; arguments that are not plain make them return None (the wrapper's Python path
then validates them); torch.ops still takes the call wherever __torch_function__ applies (a mode, a tensor
subclass) and while Dynamo traces, so those see the operator as before."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

import torch_fused_ops
from torch_fused_ops import _C
from fused_testing import HAS_CUDA, conv_operands

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]
CONV_ARGS = ([2] * 3, [1] * 3, [1] * 3, 1, [1] * 3)




@pytest.mark.parametrize("device", DEVICES)
def test_entry_points_equal_torch_ops(device):
    x, w, b, m = conv_operands(device)
    want = torch.ops.fused.conv_transpose3d_post_pool.default(x, w, b, *CONV_ARGS, m, 0.2, [2] * 3, [], [0] * 3,
                                                             [1] * 3, False, None)
    # The wrapper's order and forms: ints or three of them, None for the pool stride.
    for plain in ((x, w, b, m, 0.2, 2, 1, 1, 1, 1, 2, None, 0, 1, False, None),
                  (x, w, b, m, 0.2, (2, 2, 2), [1, 1, 1], 1, 1, [1] * 3, (2, 2, 2), [2] * 3, 0, 1, False, 0.2)):
        got = _C.conv_transpose3d_post_pool(*plain)
        assert got is not None and got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(torch_fused_ops.conv_transpose3d_post_pool(*plain), want, rtol=0, atol=0)
    y = torch.randn(2, 6, 6, 8, 10, device=device)
    want = torch.ops.fused.post_pool.default(y, m, 0.2, [2] * 3, [], [0] * 3, [1] * 3, False, 0.3)
    torch.testing.assert_close(_C.post_pool(y, m, 0.2, 2, None, 0, 1, False, 0.3), want, rtol=0, atol=0)
    torch.testing.assert_close(_C.post_pool(y, m, 1 / 5, [2] * 3, (2, 2, 2), [0] * 3, 1, False, 0.3), want, rtol=0,
                               atol=0)


def test_entry_points_leave_what_is_not_plain_to_the_python_path():
    x, w, b, m = conv_operands("cpu")
    base = [x, w, b, m, 0.2, 2, 1, 1, 1, 1, 2, None, 0, 1, False, None]
    for i, value in ((0, None), (2, 1.0), (4, True), (5, [2, 2]), (5, [2]), (5, 2.0), (5, True), (6, 2**70),
                     (8, 1.0), (11, []), (14, 0), (15, "0.1")):
        args = list(base)
        args[i] = value
        assert _C.conv_transpose3d_post_pool(*args) is None, (i, value)
    assert _C.conv_transpose3d_post_pool(*base[:15]) is None  # not all 16
    y = torch.randn(2, 6, 6, 8, 10)
    assert _C.post_pool(y, m, 0.2, 2, [], 0, 1, False, None) is None
    # The wrapper then takes torch.ops' path: a one-element list expands, a bad one raises the wrapper's error.
    torch.testing.assert_close(torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, [2], 1, 1),
                               torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1), rtol=0, atol=0)
    with pytest.raises(ValueError, match="stride must be a single int or a list of three ints"):
        torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, [2, 2], 1, 1)
    with pytest.raises(TypeError, match="input must be a Tensor, got None"):
        torch_fused_ops.conv_transpose3d_post_pool(None, w, b, m, 0.2, 2, 1, 1)


def test_entry_points_raise_the_ops_exception_types():
    x, w, b, m = conv_operands("cpu")
    bad_m = torch.randn(5, 1, 1, 1)  # neither 1 nor Cout elements
    with pytest.raises(ValueError, match="multiplier"):
        _C.conv_transpose3d_post_pool(x, w, b, bad_m, 0.2, 2, 1, 1, 1, 1, 2, None, 0, 1, False, None)
    with pytest.raises(ValueError, match="multiplier"):
        torch.ops.fused.conv_transpose3d_post_pool.default(x, w, b, *CONV_ARGS, bad_m, 0.2, [2] * 3, [], [0] * 3,
                                                           [1] * 3, False, None)
    y = torch.randn(2, 6, 6, 8, 10)
    with pytest.raises(ValueError, match="kernel_size"):
        _C.post_pool(y, m, 0.2, [0, 2, 2], None, 0, 1, False, None)
    with pytest.raises(ValueError, match="kernel_size"):
        torch.ops.fused.post_pool.default(y, m, 0.2, [0, 2, 2], [], [0] * 3, [1] * 3, False, None)


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


class _Subclass(torch.Tensor):
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_torch_function_modes_and_subclasses_see_the_operator():
    x, w, b, m = conv_operands("cpu")
    with _Recorder() as mode:
        torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
        torch_fused_ops.post_pool(torch.randn(2, 6, 6, 8, 10), m, 0.2)
    assert torch.ops.fused.conv_transpose3d_post_pool.default in mode.funcs
    assert torch.ops.fused.post_pool.default in mode.funcs
    _Subclass.seen.clear()
    out = torch_fused_ops.conv_transpose3d_post_pool(x.as_subclass(_Subclass), w, b, m, 0.2, 2, 1, 1)
    assert torch.ops.fused.conv_transpose3d_post_pool.default in _Subclass.seen
    assert isinstance(out, _Subclass)


def test_dynamo_traces_the_wrappers_without_a_graph_break():
    x, w, b, m = conv_operands("cpu")

    def f(x):
        y = torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
        return torch_fused_ops.post_pool(y, m[:1], 0.1, kernel_size=1)

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(x)  # fullgraph: a graph break would raise
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
