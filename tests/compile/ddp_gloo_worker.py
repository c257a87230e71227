"""One rank of tests/compile/test_ddp_gloo.py: eager DDP and torch.compile(DDP) on CPU over gloo (loopback only).

    python ddp_gloo_worker.py RANK WORLD PORT OUT_JSON

The model is two conv_transpose3d -> chain stages. DDP's graph splitter (DDPOptimizer) cuts the compiled graph at
bucket boundaries; with buckets of a few bytes every boundary falls between a chain's first LeakyReLU and its
multiply, so each stage's chain is split into `conv -> leaky` and `mul -> leaky -> pool`. The worker records what
the pass saw and did in every graph, trains both models a few steps, and writes parameters and records to JSON.
"""
import datetime
import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn


class TwoStages(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, output_padding=1)
        self.m1 = nn.Parameter(torch.rand(4, 1, 1, 1) + 0.5)
        self.conv2 = nn.ConvTranspose3d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.m2 = nn.Parameter(torch.rand(3, 1, 1, 1) + 0.5)
        self.act = nn.LeakyReLU(0.2)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        x = self.pool(self.act(self.act(self.conv1(x)) * self.m1))
        return self.pool(self.act(self.act(self.conv2(x)) * self.m2))


def _train(model, inputs, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        opt.zero_grad()
        model(inputs[i]).square().mean().backward()
        opt.step()


def main(rank: int, world: int, port: int, out: str) -> None:
    import torch_fused_ops
    from torch_fused_ops.compile import fusion_pass
    from pass_testing import categories, node_counts

    records = []
    real_rewrite = fusion_pass.rewrite

    def recording_rewrite(graph, *args, **kwargs):
        before = categories(node_counts(graph))
        n = real_rewrite(graph, *args, **kwargs)
        records.append(dict(before=before, after=categories(node_counts(graph)), matched=n))
        return n

    fusion_pass.rewrite = recording_rewrite
    # Buckets of a few bytes: DDP's first bucket must not exceed the others (DDPOptimizer asserts it), so the
    # first-bucket constant is lowered with bucket_cap_mb, as DDP itself does for caps below it.
    cap_mb = 16 / 2**20
    dist._DEFAULT_FIRST_BUCKET_BYTES = 16
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
        steps = 3
        inputs = [torch.randn(2, 3, 3, 4, 4, generator=g, dtype=torch.float64) for _ in range(steps)]
        params = {}
        for name in ("eager", "compiled"):
            torch.manual_seed(0)
            model = TwoStages().double()
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
            _train(torch.compile(ddp) if name == "compiled" else ddp, inputs, steps)
            params[name] = {k: v.detach().flatten().tolist() for k, v in model.named_parameters()}
        result = dict(rank=rank, records=records, params=params, matched_total=torch_fused_ops.matched_count(),
                      ddp_optimizer=torch._dynamo.config.optimize_ddp)
    finally:
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)
    # The result is written: leave at once. With torch 2.13 a rank sometimes never finished returning from here
    # (its stack, dumped at the deadline: this call's line, no deeper Python frame), the destructors of the models'
    # DDP state blocking after destroy_process_group; and at interpreter exit, gloo's threads kept a rank alive.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# A stuck rank prints every thread's stack into its log and exits before the test's deadline (test_ddp_gloo.py's
# DEADLINE_S, 420 s), so the failure says where it hung.
STACK_DUMP_S = 360

if __name__ == "__main__":
    faulthandler.dump_traceback_later(STACK_DUMP_S, exit=True)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]  # pass_testing here, fused_testing (which it imports) in tests/
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])  # exits by itself once it has written
