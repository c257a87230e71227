"""The benchmarks' timers (torch_fused_ops/tools/timing.py): the CUDA block timer's queued form measures the
device, not the host."""
import pytest
import torch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA timer's queued form")
def test_median_us_hide_host_measures_the_device_cuda():
    # A host-heavy call (a hundred tiny launches, ~1-2 us of device work each, several us of host work each): the
    # plain block timer measures the host, the queued form (hide_host) the device. The sleep it queues must cover
    # the host's enqueueing, or the two would agree. (Blocks stay well under the driver's queue of pending
    # launches, past which the host would wait for the device.) A device-heavy call gives the same figure both
    # ways.
    from torch_fused_ops.tools.timing import median_us

    dev = torch.device("cuda")
    t = torch.ones(16, device=dev)

    def host_heavy():
        for _ in range(100):
            t.add_(0)

    # The suite's shards share the GPU, so another process's kernels can land inside one measurement: each figure
    # is the best of three (contention only ever adds time).
    def best(fn, **kw):
        return min(median_us(fn, dev, **kw) for _ in range(3))

    plain = best(host_heavy, reps=5, block=3)
    queued = best(host_heavy, reps=5, block=3, hide_host=True)
    assert queued < 0.8 * plain, (queued, plain)
    big = torch.empty(1 << 27, device=dev)
    plain_big = best(lambda: big.fill_(1.0), reps=10)
    queued_big = best(lambda: big.fill_(1.0), reps=10, hide_host=True)
    assert abs(queued_big - plain_big) < 0.1 * plain_big, (queued_big, plain_big)
