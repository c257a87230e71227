"""Tooling that ships with the package but is never imported by it: the demo, the benchmarks and their timers.

    python -m torch_fused_ops.tools.demo          the KernelBench Model eagerly and compiled, without and with the pass
    python -m torch_fused_ops.tools.bench         fused.post_pool and the Model against eager and torch.compile
    python -m torch_fused_ops.tools.bench_conv    the fused convolution alone against cuDNN
    python -m torch_fused_ops.tools.bench_train   the Model's training step
"""
