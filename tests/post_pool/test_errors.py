"""Invalid arguments must raise clear Python exceptions, from the real kernels
(CPU, CUDA) and from the fake impl (what torch.compile users hit)."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import DEFAULT_SHAPE, DEVICES, HAS_CUDA, composite, message_mentions_shape, op_args

ERRORS = (RuntimeError, ValueError, TypeError)
C = DEFAULT_SHAPE[1]


def _x(shape=DEFAULT_SHAPE, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=g).to(dtype)


def _m(shape=(C, 1, 1, 1), dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return (torch.rand(shape, generator=g) + 0.5).to(dtype)


# id -> (input, multiplier, pool kwargs, regex the message must match,
#        multiplier shape the message must name, whether eager also rejects it)
K3 = dict(kernel_size=3, stride=2, padding=1)
CASES = {
    "mult_varies_along_W": (_x(), _m((1, 1, 1, 1, 9)), K3, r"multiplier", (1, 1, 1, 1, 9), False),
    "mult_varies_along_batch": (_x(), _m((2, C, 1, 1, 1)), K3, r"multiplier", (2, C, 1, 1, 1), False),
    "mult_1d_C": (_x(), _m((C,)), K3, r"multiplier", (C,), True),
    "mult_6d": (_x(), _m((1, 1, C, 1, 1, 1)), K3, r"multiplier", (1, 1, C, 1, 1, 1), True),
    "mult_wrong_C": (_x(), _m((C + 1, 1, 1, 1)), K3, r"multiplier", (C + 1, 1, 1, 1), True),
    "mult_dtype_mismatch": (_x(), _m(dtype=torch.float64), K3, r"(?i)dtype", None, False),
    # A float32 multiplier of a float16/bfloat16 input is the mixed form (test_mixed_precision.py); these are not.
    "mult_float_input_half": (_x(), _m(dtype=torch.float16), K3, r"(?i)dtype", None, False),
    "mult_half_input_double": (_x(dtype=torch.bfloat16), _m(dtype=torch.float64), K3, r"(?i)dtype", None, False),
    "mult_half_input_0d_float": (_x(dtype=torch.float16), _m(()), K3, r"(?i)0-dim", None, False),
    "integer_tensors": (_x().mul(3).to(torch.int32), _m().to(torch.int32), K3,
                        r"(?i)dtype|floating|integer|'Int'", None, True),
    "integer_multiplier": (_x(), _m().mul(3).to(torch.int64), K3, r"(?i)dtype|floating|integer|'Long'", None, False),
    "input_4d": (_x((3, 5, 7, 9)), _m(), K3, r"(?i)5-?D|5 dim|five", None, False),
    "input_6d": (_x((1, 2, 3, 5, 7, 9)), _m(), K3, r"(?i)5-?D|5 dim|five", None, True),
    "kernel_0": (_x(), _m(), dict(kernel_size=0, stride=1), r"(?i)kernel", None, True),
    "kernel_negative": (_x(), _m(), dict(kernel_size=(2, -1, 2), stride=1), r"(?i)kernel", None, True),
    "stride_0": (_x(), _m(), dict(kernel_size=2, stride=0), r"(?i)stride", None, True),
    "stride_0_one_dim": (_x(), _m(), dict(kernel_size=2, stride=(2, 2, 0)), r"(?i)stride", None, True),
    "dilation_0": (_x(), _m(), dict(kernel_size=2, dilation=0), r"(?i)dilation", None, True),
    "padding_negative": (_x(), _m(), dict(kernel_size=3, padding=-1), r"(?i)pad", None, True),
    "padding_over_half_kernel": (_x(), _m(), dict(kernel_size=3, padding=2), r"(?i)pad", None, True),
    "padding_over_half_one_dim": (_x(), _m(), dict(kernel_size=(3, 3, 2), padding=(1, 1, 2)), r"(?i)pad", None, True),
    "kernel_bigger_than_input": (_x(), _m(), dict(kernel_size=(6, 2, 2)), r"(?i)too small", None, True),
    "dilated_kernel_too_big": (_x(), _m(), dict(kernel_size=3, dilation=3), r"(?i)too small", None, True),
    "kernel_size_len2": (_x(), _m(), dict(kernel_size=(2, 2)), r"(?i)kernel", None, True),
    "stride_len2": (_x(), _m(), dict(kernel_size=2, stride=(2, 2)), r"(?i)stride", None, True),
    "padding_len2": (_x(), _m(), dict(kernel_size=2, padding=(1, 1)), r"(?i)pad", None, True),
    "dilation_len2": (_x(), _m(), dict(kernel_size=2, dilation=(1, 1)), r"(?i)dilation", None, True),
}
CASE_IDS = list(CASES)


def _check_message(excinfo, pattern, shape):
    msg = str(excinfo.value)
    assert re.search(pattern, msg), f"message does not match {pattern!r}: {msg!r}"
    if shape is not None:
        assert message_mentions_shape(msg, shape), f"message does not name the multiplier shape {shape}: {msg!r}"


@pytest.mark.parametrize("case", CASE_IDS)
def test_case_is_invalid_for_eager_too(case):
    # Documents which cases eager itself rejects; the others are constraints
    # of the fused op (eager would broadcast or promote).
    x, m, cfg, _, _, eager_raises = CASES[case]
    if eager_raises:
        with pytest.raises(ERRORS):
            composite(x, m, 0.2, **cfg)
    else:
        composite(x, m, 0.2, **cfg)


@pytest.mark.parametrize("case", CASE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_errors(device, case):
    x, m, cfg, pattern, shape, _ = CASES[case]
    with pytest.raises(ERRORS) as excinfo:
        torch_fused_ops.post_pool(x.to(device), m.to(device), 0.2, **cfg)
    _check_message(excinfo, pattern, shape)


def _raw_call(op, x, m, cfg):
    k, s, p, d, ceil = op_args(cfg)
    return op(x, m, 0.2, k, s, p, d, ceil, None)


@pytest.mark.parametrize("op_name", ["post_pool", "post_pool_with_offsets"])
@pytest.mark.parametrize("case", CASE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_raw_op_errors(device, case, op_name):
    # Bypasses any checks the Python wrapper may do: the C++ kernels must
    # validate on their own.
    x, m, cfg, pattern, shape, _ = CASES[case]
    with pytest.raises(ERRORS) as excinfo:
        _raw_call(getattr(torch.ops.fused, op_name), x.to(device), m.to(device), cfg)
    _check_message(excinfo, pattern, shape)


@pytest.mark.parametrize("op_name", ["post_pool", "post_pool_with_offsets"])
@pytest.mark.parametrize("case", CASE_IDS)
@pytest.mark.parametrize("fake_device", ["cpu", "cuda"])
def test_fake_impl_errors(fake_device, case, op_name):
    # Fake CUDA tensors need no GPU, so the CUDA flavour runs everywhere.
    x, m, cfg, pattern, shape, _ = CASES[case]
    with FakeTensorMode():
        fx = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=fake_device)
        fm = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=fake_device)
        with pytest.raises(ERRORS) as excinfo:
            _raw_call(getattr(torch.ops.fused, op_name), fx, fm, cfg)
    _check_message(excinfo, pattern, shape)


@pytest.mark.parametrize("case", CASE_IDS)
def test_wrapper_errors_under_fake_mode(case):
    x, m, cfg, pattern, shape, _ = CASES[case]
    with FakeTensorMode() as mode:
        fx, fm = mode.from_tensor(x), mode.from_tensor(m)
        with pytest.raises(ERRORS) as excinfo:
            torch_fused_ops.post_pool(fx, fm, 0.2, **cfg)
    _check_message(excinfo, pattern, shape)


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("where", ["input_on_cuda", "multiplier_on_cuda"])
def test_device_mismatch_real(where):
    x, m = _x(), _m()
    if where == "input_on_cuda":
        x = x.cuda()
    else:
        m = m.cuda()
    with pytest.raises(ERRORS, match=r"(?i)device"):
        torch_fused_ops.post_pool(x, m, 0.2, 2)
    with pytest.raises(ERRORS, match=r"(?i)device"):
        torch.ops.fused.post_pool(x, m, 0.2, [2, 2, 2])


@pytest.mark.parametrize("where", ["input_on_cuda", "multiplier_on_cuda"])
def test_device_mismatch_fake(where):
    devs = ("cuda", "cpu") if where == "input_on_cuda" else ("cpu", "cuda")
    with FakeTensorMode():
        x = torch.empty(DEFAULT_SHAPE, device=devs[0])
        m = torch.empty((C, 1, 1, 1), device=devs[1])
        with pytest.raises(ERRORS, match=r"(?i)device"):
            torch.ops.fused.post_pool(x, m, 0.2, [2, 2, 2])


def test_device_mismatch_meta_multiplier():
    # A CPU input with a meta multiplier: whichever kernel the dispatcher picks
    # must refuse the mix instead of producing a result on either device.
    with pytest.raises(ERRORS, match=r"(?i)device"):
        torch.ops.fused.post_pool(_x(), _m().to("meta"), 0.2, [2, 2, 2])


@pytest.mark.parametrize("device", DEVICES)
def test_eager_rejects_c0_but_op_does_not(device):
    # Pins the documented deviation: the op accepts C=0, eager max_pool3d does not.
    x = torch.empty((2, 0, 5, 7, 9), device=device)
    m = torch.ones((), device=device)
    with pytest.raises(RuntimeError):
        F.max_pool3d(x, 2)
    assert torch_fused_ops.post_pool(x, m, 0.2, 2).shape == (2, 0, 2, 3, 4)


@pytest.mark.parametrize("which", ["input", "multiplier"])
@pytest.mark.parametrize("bad", [None, 2.0, [1.0]], ids=["None", "float", "list"])
def test_non_tensor_arguments_raise_type_error_naming_them(which, bad):
    x = torch.randn(1, 2, 4, 4, 4)
    m = torch.tensor(1.5)
    args = {"input": x, "multiplier": m, which: bad}
    with pytest.raises(TypeError, match=f"fused::post_pool: {which} must be a Tensor, got "
                                        f"{'None' if bad is None else type(bad).__name__}"):
        torch_fused_ops.post_pool(args["input"], args["multiplier"], 0.2, 2)
