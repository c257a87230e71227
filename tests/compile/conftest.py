"""The pass settings a compile test runs under, stated by the test itself rather than read from its file's name.

A file (``pytestmark``) or a single test marks itself ``@pytest.mark.pass_settings(**changes)``: those
``pass_config`` changes are patched in around the test and restored afterwards; a test's own mark replaces its
file's. Tests without the mark run under the package's settings as they are.

Today's marks: the files that check how the pass rewrites chains into fused.post_pool switch off the two CUDA-default
routes that replace more than the chain (``fuse_conv_transpose="off", fold_conv_bias="off"``), each of which has
its own file: the conv-bias fold (test_pass_bias_fold.py, which switches off only the fused convolution) and the
fused transposed convolution (test_pass_conv_route.py; test_pass_conv_route_model.py runs the Model under the
package's settings).
"""
import pytest


@pytest.fixture(autouse=True)
def _pass_settings(request):
    marker = request.node.get_closest_marker("pass_settings")
    if marker is None or not marker.kwargs:
        yield
        return
    from torch_fused_ops import pass_config

    with pass_config.patch(**marker.kwargs):
        yield
