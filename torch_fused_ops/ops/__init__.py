"""The fused operators' Python faces: typed wrappers and fake impls, one module per op (schemas: csrc/ops.cpp).

``post_pool`` holds the post_pool family (post_pool, its bias and training forms, their backward);
``conv_transpose3d_post_pool`` the fused convolution; ``conv_transpose3d_post_pool_coverage`` where that op's fused
CUDA kernel applies; ``common`` the argument checks both mirror for fake tensors.
"""
from .conv_transpose3d_post_pool import conv_transpose3d_post_pool
from .post_pool import post_pool, reference_post_pool

__all__ = ["post_pool", "reference_post_pool", "conv_transpose3d_post_pool"]
