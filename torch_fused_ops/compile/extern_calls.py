"""Inductor's generated code calls our operators through a typed C entry point instead of torch.ops.

Inductor writes a call to an operator it does not lower as ``torch.ops.fused.<op>.default(...)``, whose
overload call matches every Python argument against the schema each time: for the fused convolution's 16
arguments about as long as the rest of its host path (docs/performance.md). Torch's Python wrapper consults a
registry of custom code generation per operator (``CUSTOM_EXTERN_KERNEL_CODEGEN``, keyed by the name it would
write); we register each of our operators there, so that the line becomes ``bufN =
_fused_calls.<op>_<overload>(...)`` with every schema argument positional, a function of this module
(``_make_call``): the arguments go to ``torch_fused_ops._C._call_compiled_op`` (csrc/compiled_calls.cpp), which
reads them by the kinds it took from the schema once and calls the operator boxed through the dispatcher (autograd,
autocast and Python modes apply as before). Where it cannot read an argument, under a ``__torch_function__`` mode,
or when the wrapper is not the plain Python one (C++ wrapper, FX wrapper, profiling wrappers, intermediate hooks),
the call is torch.ops' as before.

``TORCH_FUSED_OPS_COMPILED_CALLS=0`` (read once, at import) leaves Inductor's code generation as it is. Code
Inductor has cached keeps the calls it was generated with (either form computes the same).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from .. import _C, envs

log = logging.getLogger(__name__)

# The name under which the generated module imports this one.
MODULE_ALIAS = "_fused_calls"
_IMPORT_LINE = f"from torch_fused_ops.compile import extern_calls as {MODULE_ALIAS}"

_tf_mode_enabled = torch._C._is_torch_function_mode_enabled
_call_compiled_op = _C._call_compiled_op


def _make_call(op: torch._ops.OpOverload, op_id: int):
    """One operator's call from generated code, every schema argument positional: the C entry point, or torch.ops'
    path where that returns None or a ``__torch_function__`` mode is active."""

    def call(*args):
        if not _tf_mode_enabled():
            out = _call_compiled_op(op_id, *args)
            if out is not None:
                return out
        return op(*args)

    call.__name__ = call.__qualname__ = _attribute(op)
    call.op = op
    call.op_id = op_id
    return call


def _attribute(op: torch._ops.OpOverload) -> str:
    """The call's name in this module: the operator's name with its overload (post_pool_default)."""
    return op.__name__.replace(".", "_")


# Every registered call, by that name; each is also a global of this module, where the generated code finds it.
_calls: dict[str, Callable] = {}


def _positional_args(node, wrapper) -> list[str] | None:
    """The node's arguments rendered in schema order, the ones Inductor keeps as keywords (or leaves to their
    defaults) included; None where a keyword is not the schema's."""
    schema_args = node.op_overload._schema.arguments
    positional = node.codegen_args()
    kwargs = dict(node.kwargs)
    rest = []
    for a in schema_args[len(positional):]:
        if a.name in kwargs:
            rest.append(wrapper.val_to_arg_str(kwargs.pop(a.name)))
        elif a.has_default_value():
            rest.append(wrapper.val_to_arg_str(a.default_value))
        else:
            return None
    return None if kwargs else [*positional, *rest]


def _generate(node, writeline) -> None:
    """The Python wrapper's line for one of our operators' FallbackKernel nodes."""
    from torch._inductor import config
    from torch._inductor.codegen.wrapper import ExternKernelAllocLine
    from torch._inductor.virtualized import V

    wrapper = V.graph.wrapper_code
    op = node.op_overload
    name = None if op is None else _attribute(op)
    plain = (
        name in _calls
        and not V.graph.cpp_wrapper
        and not getattr(V.graph, "fx_wrapper", False)
        and not getattr(config.trace, "provenance_tracking_to_timeline", False)
        and not getattr(config, "generate_intermediate_hooks", False)
        and not getattr(config, "memory_planning", False)
        and hasattr(wrapper, "add_import_once")
    )
    if not plain:
        writeline(ExternKernelAllocLine(wrapper, node))
        return
    args = _positional_args(node, wrapper)
    if args is None:
        writeline(ExternKernelAllocLine(wrapper, node))
        return
    # A subgraph's wrapper (torch.cond's branches, invoke_subgraph) may leave its own imports out of the module:
    # the import goes into the outermost wrapper's too.
    root = wrapper
    while getattr(root, "parent_wrapper", None) is not None:
        root = root.parent_wrapper
    for w in {id(wrapper): wrapper, id(root): root}.values():
        w.add_import_once(_IMPORT_LINE)
    writeline(f"{wrapper.declare}{node.get_name()} = {MODULE_ALIAS}.{name}({', '.join(args)}){wrapper.ending}")


def _fused_operators():
    """(name, overload, OpOverload) of every operator registered in the fused namespace ('' for the default
    overload)."""
    for qualified in torch._C._dispatch_get_all_op_names():
        if qualified.startswith("fused::"):
            name, _, overload = qualified[len("fused::"):].partition(".")
            yield name, overload, getattr(getattr(torch.ops.fused, name), overload or "default")


def _register_calls() -> None:
    """A call for every operator of the fused namespace whose arguments the C entry point reads, as a global of
    this module. Always, also where the code generation is off: code Inductor cached with these calls still runs."""
    for name, overload, op in _fused_operators():
        op_id = _C._register_compiled_op(f"fused::{name}", overload)
        if op_id is not None:
            call = _calls[_attribute(op)] = _make_call(op, op_id)
            globals()[call.__name__] = call


def __getattr__(name: str):
    """Cached generated code naming an operator this build does not register a call for: torch.ops' overload."""
    for _, _, op in _fused_operators():
        if _attribute(op) == name:
            return op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_register_calls()


def install() -> bool:
    """Route the Python wrapper's code for each of our operators through its call here (registered in torch's
    custom code generation registry under the name Inductor would write); False where the environment turns it
    off or this torch has no such registry (the generated code then calls torch.ops as before)."""
    if not envs.TORCH_FUSED_OPS_COMPILED_CALLS:
        return False
    try:
        from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN, CustomCodegen
    except ImportError:
        log.debug("torch %s has no CUSTOM_EXTERN_KERNEL_CODEGEN: generated code calls torch.ops", torch.__version__)
        return False
    for call in _calls.values():
        op = call.op
        # The name Inductor's FallbackKernel writes for the operator (ir.FallbackKernel.set_python_kernel_name).
        key = f"{op.__module__.replace('._ops.', '.ops.')}.{op.__name__}"
        CUSTOM_EXTERN_KERNEL_CODEGEN[key] = CustomCodegen(python=_generate)
    return True
