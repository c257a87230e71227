"""conv_transpose3d_post_pool_coverage.unsupported_reasons: every reason the fused CUDA kernel does not compute a
call, each a sentence naming the argument and its value, in the order of the C++ fused_kernel_unsupported_reason
(whose static texts are the `Unsupported` values: compared with the C++ source here); fake and symbolic sizes
without raising or guarding; fused_kernel_applies is "no reason"."""
import collections.abc
import pathlib
import pickle
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fused_ops  # noqa: F401  (registers torch.ops.fused)
from conv_testing import COVERAGE_DEFAULTS, coverage_tensors, symbolic_sizes
from fused_testing import skip_without_cuda_build
from torch_fused_ops.ops.conv_transpose3d_post_pool_coverage import (PYTHON_ONLY, Reason, Unsupported,
                                                                     fused_kernel_applies, unsupported_reasons)

CHECKS_CPP = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "conv_transpose3d_post_pool" / "checks.cpp"
U = Unsupported


def reasons(x, w, **changes):
    return unsupported_reasons(x, w, **{**COVERAGE_DEFAULTS, **changes})


def kinds(rs):
    return [r.kind for r in rs]


class _Unreadable(collections.abc.Sequence):
    """A parameter whose length raises when read."""

    def __len__(self):
        raise RuntimeError("unreadable")

    def __getitem__(self, i):
        raise RuntimeError("unreadable")


def test_cpp_texts_and_order_are_the_python_kinds():
    # The C++ function returns the first reason as a static text; its texts, in order, are the shared kinds'.
    src = CHECKS_CPP.read_text()
    body = src[src.index("const char* fused_kernel_unsupported_reason("):]
    body = body[:body.index("return nullptr;")]
    cpp = re.findall(r'return\s+"([^"]+)";', body)
    assert cpp == [k.value for k in Unsupported if k not in PYTHON_ONLY]


def test_the_kernels_geometry_has_no_reason():
    x, w = coverage_tensors()
    assert reasons(x, w) == [] and fused_kernel_applies(x, w, **COVERAGE_DEFAULTS)
    for change in [dict(output_padding=0), dict(pool_stride=None), dict(pool_stride=[]), dict(ceil_mode=True),
                   dict(stride=[2, 2, 2], padding=(1,), kernel_size=(2, 2, 2), pool_dilation=[1, 1, 1])]:
        assert reasons(x, w, **change) == [], change
    for dtype in (torch.bfloat16, torch.float16):
        assert reasons(*coverage_tensors(dtype=dtype)) == []


# (kind, how to make it: changes to DEFAULT or a tensor change, the sentence it gives)
CASES = [
    (U.NOT_TENSORS, "not_tensors", "input and weight are NoneType and str; the op needs two tensors"),
    (U.NOT_CUDA, "cpu", "input is on cpu; the fused kernel needs CUDA"),
    (U.DTYPE, "float64", "input dtype is float64; the fused kernel needs float32, bfloat16 or float16"),
    (U.RANK, "x_4d", "input is 4-D and weight 5-D; the op needs 5-D tensors"),
    (U.WEIGHT_LIKE, "weight_dtype", "weight is float16 on cuda:0, input float32 on cuda:0; the op needs them alike"),
    (U.WEIGHT_CIN, "weight_cin", "weight.shape[0] is 3 and the input has 4 channels; the op needs them equal"),
    (U.GROUPS, dict(groups=2), "groups is 2; the fused kernel needs 1"),
    (U.GROUPS, dict(groups=True), "groups is True; the fused kernel needs 1"),
    (U.NO_CHANNELS, "cin0", "the input has 0 channels; the fused kernel needs at least 1"),
    (U.KERNEL, "kernel_2x3x3", "the weight's kernel is [2, 3, 3]; the fused kernel needs 3x3x3"),
    (U.STRIDE, dict(stride=1), "stride is [1, 1, 1]; the fused kernel needs 2"),
    (U.STRIDE, dict(stride="2"), "stride is '2' (not an int or 1 or 3 ints); the fused kernel needs 2"),
    (U.PADDING, dict(padding=(1, 1, 2)), "padding is [1, 1, 2]; the fused kernel needs 1"),
    (U.DILATION, dict(dilation=2), "dilation is [2, 2, 2]; the fused kernel needs 1"),
    (U.OUTPUT_PADDING, dict(output_padding=(0, 2, 0)), "output_padding is [0, 2, 0]; the fused kernel needs 0 or 1"),
    (U.POOL_KERNEL, dict(kernel_size=3), "kernel_size is [3, 3, 3]; the fused kernel needs 2"),
    (U.POOL_STRIDE, dict(pool_stride=(2, 1, 2)), "pool_stride is [2, 1, 2]; the fused kernel needs 2 (or omitted)"),
    (U.POOL_PADDING, dict(pool_padding=1), "pool_padding is [1, 1, 1]; the fused kernel needs 0"),
    (U.POOL_DILATION, dict(pool_dilation=2), "pool_dilation is [2, 2, 2]; the fused kernel needs 1"),
    (U.CEIL_MODE_TYPE, dict(ceil_mode=None), "ceil_mode is None; the op needs a bool"),
    (U.CEIL_MODE, dict(ceil_mode=True, output_padding=(1, 0, 1)), "ceil_mode is True with output_padding [1, 0, 1], "
     "which pools one plane more than the fused kernel writes; it needs output_padding 1 there"),
    (U.UNREADABLE, dict(stride=_Unreadable()), "an argument cannot be read (RuntimeError: unreadable)"),
]


def _case_tensors(change):
    if change == "x_4d":
        skip_without_cuda_build("indexing a fake CUDA tensor")
    x, w = coverage_tensors()
    special = {"not_tensors": lambda: (None, "weight"), "cpu": lambda: coverage_tensors(device="cpu"),
               "float64": lambda: coverage_tensors(dtype=torch.float64), "x_4d": lambda: (x[0], w),
               "weight_dtype": lambda: (x, coverage_tensors(dtype=torch.float16)[1]),
               "weight_cin": lambda: (x, coverage_tensors(cin=3)[1]), "cin0": lambda: coverage_tensors(cin=0),
               "kernel_2x3x3": lambda: (x, coverage_tensors(k=(2, 3, 3))[1])}
    return special[change]() if isinstance(change, str) else (x, w)


@pytest.mark.parametrize("kind,change,text", CASES, ids=[f"{c[0].name}-{i}" for i, c in enumerate(CASES)])
def test_each_reason_alone_names_the_argument_and_its_value(kind, change, text):
    x, w = _case_tensors(change)
    rs = reasons(x, w, **(change if isinstance(change, dict) else {}))
    assert kinds(rs) == [kind]
    assert rs[0].startswith(text), rs[0]
    assert isinstance(rs[0], str) and not fused_kernel_applies(x, w, **{**COVERAGE_DEFAULTS, **(change if isinstance(
        change, dict) else {})})


def test_every_kind_is_covered_by_a_case():
    assert {c[0] for c in CASES} | {U.LAYOUT} == set(Unsupported)


def test_sparse_layout_is_a_reason():
    x = torch.zeros(1, 4, 2, 3, 2).to_sparse()
    w = torch.zeros(4, 6, 3, 3, 3)
    assert kinds(reasons(x, w)) == [U.NOT_CUDA, U.LAYOUT]
    assert "torch.sparse_coo" in reasons(x, w)[1]


def test_every_reason_is_given_in_the_cpp_order():
    x, w = coverage_tensors(device="cpu", dtype=torch.float64, k=(3, 2, 3))
    rs = reasons(x, w, stride=1, padding=0, dilation=2, output_padding=3, groups=2, kernel_size=3, pool_stride=1,
                 pool_padding=1, pool_dilation=2, ceil_mode=True)
    # The ceil_mode rule is stated for the kernel's geometry (the C++ asks it last): not asked here.
    assert kinds(rs) == [U.NOT_CUDA, U.DTYPE, U.GROUPS, U.KERNEL, U.STRIDE, U.PADDING, U.DILATION, U.OUTPUT_PADDING,
                         U.POOL_KERNEL, U.POOL_STRIDE, U.POOL_PADDING, U.POOL_DILATION]
    order = list(Unsupported)
    assert [order.index(k) for k in kinds(rs)] == sorted(order.index(k) for k in kinds(rs))
    x, w = coverage_tensors(device="cpu", dtype=torch.float64, cin=0)
    assert kinds(reasons(x, w, groups=2, ceil_mode=True, output_padding=0)) == [U.NOT_CUDA, U.DTYPE, U.GROUPS,
                                                                                U.NO_CHANNELS, U.CEIL_MODE]


def test_non_tensor_arguments_still_report_the_geometry():
    assert kinds(reasons(None, None, stride=1, groups=3)) == [U.NOT_TENSORS, U.GROUPS, U.STRIDE]


def test_reasons_pickle_with_their_kind():
    r = reasons(*coverage_tensors(device="cpu"))[0]
    back = pickle.loads(pickle.dumps(r))
    assert back == r and back.kind is U.NOT_CUDA and isinstance(back, Reason)



def test_symbolic_sizes_give_reasons_without_guards():
    env, (n, d, h, w_) = symbolic_sizes(2, 3, 4, 5)
    with FakeTensorMode(shape_env=env):
        x = torch.empty(n, 4, d, h, w_, device="cuda")
        w = torch.empty(4, 6, 3, 3, 3, device="cuda")
    before = len(env.guards)
    assert reasons(x, w) == [] and reasons(x, w, output_padding=0) == []
    assert kinds(reasons(x, w, ceil_mode=True, output_padding=0)) == [U.CEIL_MODE]
    assert kinds(reasons(x, w, stride=1)) == [U.STRIDE]
    assert len(env.guards) == before


def test_sizes_it_cannot_prove_are_reasons_worded_as_such():
    env, (cin, k) = symbolic_sizes(4, 3, unbacked=(0, 1))
    with FakeTensorMode(shape_env=env):
        x = torch.empty(1, cin, 2, 3, 2, device="cuda")
        w_cin = torch.empty(cin, 6, 3, 3, 3, device="cuda")
        w_k = torch.empty(4, 6, k, 3, 3, device="cuda")
        x4 = torch.empty(1, 4, 2, 3, 2, device="cuda")
        w4 = torch.empty(4, 6, 3, 3, 3, device="cuda")
    before = len(env.guards)
    # The same unbacked channel count on both: equal, but not provably nonzero.
    rs = reasons(x, w_cin)
    assert kinds(rs) == [U.NO_CHANNELS] and "cannot be proven without a guard" in rs[0]
    rs = reasons(x4, w_k)
    assert kinds(rs) == [U.KERNEL] and "cannot be proven without a guard" in rs[0]
    rs = reasons(x, w4)  # channels u0 against 4: not provably equal
    assert kinds(rs) == [U.WEIGHT_CIN, U.NO_CHANNELS] and "cannot be proven without a guard" in rs[0]
    assert "cannot be proven" not in reasons(*coverage_tensors(k=(2, 3, 3)))[0]  # a certain refusal says so plainly
    assert len(env.guards) == before


def test_fused_kernel_applies_is_no_reason():
    x, w = coverage_tensors()
    for change in [{}, dict(stride=1), dict(ceil_mode=True, output_padding=0), dict(groups=2)]:
        a = {**COVERAGE_DEFAULTS, **change}
        assert fused_kernel_applies(x, w, **a) == (not unsupported_reasons(x, w, **a))
