"""What the Inductor pass (fusion_pass) folds and fuses: one immutable PassConfig, changed through `patch`.

    from torch_fused_ops import pass_config
    with pass_config.patch(fuse_conv_transpose="off"):
        compiled = torch.compile(model)   # compiled (on first call) without the fused-convolution route
        compiled(x)

The settings act on compilations that start while they hold (the pass reads them once per graph; a function
already compiled recompiles after ``torch._dynamo.reset()``). ``compute_hash()`` feeds the pass's ``uuid()``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from typing import Literal

Devices = Literal["off", "cuda", "always"]
_DEVICES = ("off", "cuda", "always")


@dataclasses.dataclass(frozen=True)
class PassConfig:
    """Settings of the fusion pass; every default is the package's tuned behaviour. The device settings: "cuda"
    (CUDA inputs only), "always" (every device) or "off"."""

    # Fold the bias of a convolution feeding the chain into fused.post_pool_bias. CUDA only by default: there
    # Inductor would peel the bias off into a separate full-resolution add; on CPU it keeps the bias inside the
    # mkldnn convolution, so folding would not help.
    fold_conv_bias: Devices = "cuda"
    # Route conv_transpose3d -> chain to fused.conv_transpose3d_post_pool, which on CUDA computes the convolution
    # at pooled resolution and never writes its full-resolution output. "cuda": CUDA tensors where the op's fused
    # kernel applies (no conv_transpose3d_post_pool_coverage.unsupported_reasons); "always": every device and
    # geometry (elsewhere the op runs its composite, the aten convolution then post_pool: for tests on CPU).
    fuse_conv_transpose: Devices = "cuda"
    # Whether graphs that will be differentiated also take that route (the op's autograd saves only pooled-size
    # tensors; its backward is post_pool_backward, then aten's convolution backward). False keeps training graphs
    # on aten's convolution + fused.post_pool(_bias).
    conv_in_training: bool = True
    # Also fuse the chain's partial forms ending in the pool (mul -> leaky -> pool, leaky -> pool, leaky -> mul ->
    # pool, mul -> pool, ...), the missing steps as exact identities.
    partial_chains: bool = True

    def __post_init__(self) -> None:
        for name in ("fold_conv_bias", "fuse_conv_transpose"):
            if getattr(self, name) not in _DEVICES:
                raise ValueError(f"PassConfig.{name} must be one of {_DEVICES}, got {getattr(self, name)!r}")
        for name in ("conv_in_training", "partial_chains"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"PassConfig.{name} must be a bool, got {getattr(self, name)!r}")

    def compute_hash(self) -> str:
        """A digest of every field: equal for equal configs, different for any change that changes the pass."""
        fields = dataclasses.asdict(self)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def replace(self, **changes) -> PassConfig:
        return dataclasses.replace(self, **changes)

    def folds_bias_on(self, device_type: str) -> bool:
        return self.fold_conv_bias == "always" or (self.fold_conv_bias == "cuda" and device_type == "cuda")


_current = PassConfig()


def current() -> PassConfig:
    """The settings compilations starting now use."""
    return _current


def set_current(config: PassConfig) -> PassConfig:
    """Replaces the settings (for compilations that start afterwards); returns the previous ones. Prefer
    `patch`, which restores them."""
    global _current
    if not isinstance(config, PassConfig):
        raise TypeError(f"expected a PassConfig, got {type(config).__name__}")
    previous, _current = _current, config
    return previous


@contextlib.contextmanager
def patch(config: PassConfig | None = None, **changes) -> Iterator[PassConfig]:
    """Context manager: use `config` (default: the current one) with `changes` applied, restoring the previous
    settings on exit, also when the block raises."""
    new = (current() if config is None else config).replace(**changes)
    previous = set_current(new)
    try:
        yield new
    finally:
        set_current(previous)

