"""Installing the fusion pass on Inductor's pre-grad hook, and switching it on and off.

`import torch_fused_ops` calls install() unless TORCH_FUSED_OPS_DISABLE=1 is set. The hook holds one pass at
a time on torch 2.11, so a pass the user already set is kept and run after ours (PostPoolFusionPass.previous).
Enabling and disabling swap what the hook holds, which changes Inductor's cache key, so cached code compiled
with the pass is never served without it, or the reverse.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch._inductor import config as inductor_config

from .. import envs
from .fusion_pass import PostPoolFusionPass

ENV_DISABLE = "TORCH_FUSED_OPS_DISABLE"  # declared in envs.py
_pass: PostPoolFusionPass | None = None


def _ours(p) -> bool:
    return isinstance(p, PostPoolFusionPass)


def install() -> None:
    """Install at import time, unless the environment says not to."""
    if envs.TORCH_FUSED_OPS_DISABLE:
        return
    enable()


def enable() -> PostPoolFusionPass:
    """Route torch.compile graphs to fused.post_pool from now on (for compilations that start after this)."""
    global _pass
    current = inductor_config.pre_grad_custom_pass
    if _ours(current):
        _pass = current
        return current
    if _pass is None or _pass.previous is not current:
        _pass = PostPoolFusionPass(previous=current)
    inductor_config.pre_grad_custom_pass = _pass
    return _pass


def disable() -> None:
    """Stop rewriting graphs; a pass the user had set before stays in place."""
    current = inductor_config.pre_grad_custom_pass
    if _ours(current):
        inductor_config.pre_grad_custom_pass = current.previous


def is_enabled() -> bool:
    return _ours(inductor_config.pre_grad_custom_pass)


@contextlib.contextmanager
def fusion_enabled(enabled: bool = True) -> Iterator[None]:
    """Context manager: compile with the pass on (default) or off, restoring the previous state after."""
    was = is_enabled()
    (enable if enabled else disable)()
    try:
        yield
    finally:
        (enable if was else disable)()


def matched_count() -> int:
    """Chains rewritten to fused.post_pool since import (all graphs, all compilations, every pass object).

    Compilations served from Inductor's cache do not run the pass, so they do not count.
    """
    return PostPoolFusionPass.total_matched


def the_pass() -> PostPoolFusionPass | None:
    return _pass
