"""Invalid arguments to fused.conv_transpose3d_post_pool raise clear Python exceptions: from the typed wrapper
(int[3] spellings, non-tensor arguments, shapes and dtypes), from the C++ op's own checks (both forms), and the same
exception type and message from the fake impl (what torch.compile users hit)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conv_testing import (CASES, CONFIGS, DEVICES, OPS, call_case, case_args, config_args, kb_call, make_case,
                          make_random, make_tensors)
from torch_fused_ops import conv_transpose3d_post_pool


def test_errors_are_clear():
    case = CASES["kb"]
    x, w, b, m = make_case(case, torch.float32, "cpu")
    with pytest.raises(ValueError, match="weight.shape\\[0\\]"):
        call_case(x, w[:3], b, m, 0.2, 0.2, case)
    with pytest.raises(TypeError, match="weight dtype"):
        call_case(x, w.double(), b, m, 0.2, 0.2, case)
    with pytest.raises(ValueError, match="bias must be 1-D"):
        call_case(x, w, b[:2], m, 0.2, 0.2, case)
    with pytest.raises(ValueError, match="multiplier"):
        call_case(x, w, b, m[:2], 0.2, 0.2, case)
    with pytest.raises(ValueError, match="5-D"):
        call_case(x[0], w, b, m, 0.2, 0.2, case)


def test_non_tensor_arguments_raise_type_error_naming_them():
    case = CASES["kb"]
    x, w, b, m = make_case(case, torch.float32, "cpu")
    for i, name in ((0, "input"), (1, "weight"), (3, "multiplier")):
        for bad in (None, 2.0, x.numpy()):
            args = [x, w, b, m]
            args[i] = bad
            with pytest.raises(TypeError, match=f"{name} must be a Tensor"):
                call_case(*args, 0.2, 0.2, case)
    with pytest.raises(TypeError, match="bias must be a Tensor or None"):
        call_case(x, w, 3, m, 0.2, 0.2, case)
    # The op itself (None reaches the kernel as an undefined tensor), for both forms.
    for op in (OPS.conv_transpose3d_post_pool, OPS.conv_transpose3d_post_pool_with_offsets):
        for i, name in ((0, "input"), (1, "weight"), (8, "multiplier")):
            args = list(case_args(x, w, b, m, case))
            args[i] = None
            with pytest.raises(TypeError, match=f"{name} must be a Tensor"):
                op(*args)


@pytest.mark.parametrize("kw, exc, msg", [
    (dict(stride=[2, 2]), ValueError, "stride must be a single int or a list of three ints, got [2, 2]"),
    (dict(pool_stride=[]), ValueError, "pool_stride must be a single int or a list of three ints, got []"),
    (dict(dilation=(1, 1, 1, 1)), ValueError, "dilation must be a single int or a list of three ints, got [1, 1, 1, 1]"),
    (dict(stride=2.0), TypeError, "'float' object is not iterable"),
], ids=["stride", "pool_stride", "dilation", "float"])
def test_wrapper_argument_errors(kw, exc, msg):
    x, w, b, m = make_tensors(torch.float32, "cpu")
    with pytest.raises(exc) as err:
        conv_transpose3d_post_pool(x, w, b, m, 0.2, **kw)
    assert str(err.value) == msg


def _bad_calls(x, w, b, m):
    kb = config_args(x, w, b, m, CONFIGS["kb"])

    def with_(**kw):
        names = ["input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation",
                 "multiplier", "negative_slope", "kernel_size", "pool_stride", "pool_padding", "pool_dilation",
                 "ceil_mode", "negative_slope2"]
        args = list(kb)
        for k, v in kw.items():
            args[names.index(k)] = v
        return args

    return {
        "input None": (TypeError, with_(input=None)),
        "weight None": (TypeError, with_(weight=None)),
        "multiplier None": (TypeError, with_(multiplier=None)),
        "4-D input": (ValueError, with_(input=x[0])),
        "4-D weight": (ValueError, with_(weight=w[0])),
        "integer input": (TypeError, with_(input=x.to(torch.int32), weight=w.to(torch.int32),
                                           bias=b.to(torch.int32), multiplier=m.to(torch.int32))),
        "weight dtype": (TypeError, with_(weight=w.double())),
        "bias dtype": (TypeError, with_(bias=b.double())),
        "stride length": (ValueError, with_(stride=[2, 2])),
        "groups 0": (ValueError, with_(groups=0)),
        "weight channels": (ValueError, with_(weight=w[:2])),
        "groups divide": (ValueError, with_(groups=2, weight=w[:, :2])),
        "bias size": (ValueError, with_(bias=b[:2])),
        "negative padding": (ValueError, with_(padding=[-1, 1, 1])),
        "output_padding": (ValueError, with_(output_padding=[2, 0, 0])),
        "conv output size": (ValueError, with_(padding=[9, 9, 9])),
        "multiplier shape": (ValueError, with_(multiplier=m[:2])),
        "multiplier dtype": (TypeError, with_(multiplier=m.double())),
        "pool kernel": (ValueError, with_(kernel_size=[0, 2, 2])),
        "pool too small": (ValueError, with_(kernel_size=[40, 2, 2], pool_stride=[40, 2, 2])),
    }


@pytest.mark.parametrize("with_offsets", [False, True], ids=["plain", "with_offsets"])
@pytest.mark.parametrize("case", list(_bad_calls(*make_tensors(torch.float32, "cpu"))))
def test_errors_match_between_kernel_and_fake(case, with_offsets):
    # The C++ checks and the fake impl raise the same exception type with the same message (up to dtype
    # spelling: C++ prints Float where Python prints torch.float32).
    op = OPS.conv_transpose3d_post_pool_with_offsets if with_offsets else OPS.conv_transpose3d_post_pool
    exc, args = _bad_calls(*make_tensors(torch.float32, "cpu"))[case]
    with pytest.raises(exc) as real:
        op(*args)
    name = "fused::conv_transpose3d_post_pool" + ("_with_offsets" if with_offsets else "")
    assert str(real.value).startswith(name + ":"), str(real.value)
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(exc) as fake:
            op(*fargs)
    if "dtype" not in case and "integer" not in case:
        assert str(real.value).split("\n")[0] == str(fake.value).split("\n")[0]


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
def test_too_small_output_raises(device):
    x, w, b, m = make_random(2, 4, 6, (1, 3, 3), torch.float32, device)
    with pytest.raises(ValueError, match="too small"):
        kb_call(x, w, b, m, 0.2, 0.2, (0, 1, 1))  # D = 1 with output_padding 0: a convolution output of 1 plane
