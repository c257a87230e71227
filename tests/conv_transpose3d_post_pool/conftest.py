"""Fixtures of the fused convolution's tests. Helpers are in conv_testing.py and conv_backward_testing.py."""
import pytest
import torch


# Not autouse: the tests written for float32 math ask for it (@pytest.mark.usefixtures("strict_float32")), whatever
# file they are in; the others run with the TF32 setting as it is.
@pytest.fixture
def strict_float32():
    # float32 without TF32 unless a test asks for it: the elementwise float32 tolerances assume float32 math.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield
