"""The package as a whole: its environment settings (torch_fused_ops/envs.py) and its import graph: no library
module imports the package back (a cycle through __init__), none imports Triton, and none imports the tooling
(torch_fused_ops/tools/ ships with the package, but the library never loads it)."""

import ast
import glob
import os
import subprocess
import sys

import pytest

import torch_fused_ops
from torch_fused_ops import envs

PKG = os.path.dirname(torch_fused_ops.__file__)
TOOLS = "torch_fused_ops.tools"
# Entry points that use the public package (python -m torch_fused_ops.tools.<name>): not library modules.
ENTRY_POINTS = {"tools/bench.py", "tools/bench_conv.py", "tools/bench_train.py", "tools/bench_loop.py", "tools/demo.py"}


def _modules():
    """(path relative to the package, the dotted package its relative imports start from, AST) of every module of
    the package, subpackages included."""
    for path in sorted(glob.glob(os.path.join(PKG, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, PKG).replace(os.sep, "/")
        package = ["torch_fused_ops"] + rel[:-3].split("/")[:-1]
        with open(path) as f:
            yield rel, package, ast.parse(f.read())


def _absolute(package, level, module):
    """The module an ImportFrom names, made absolute (`from ..ops import x` in compile/ -> torch_fused_ops.ops)."""
    base = package[:len(package) - (level - 1)] if level else []
    return ".".join(base + ([module] if module else []))


def _literal_import(node):
    """The module name an importlib.import_module("...") or __import__("...") call spells out, else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
    name = node.args[0].value
    return name if func in ("import_module", "__import__") and isinstance(name, str) else None


@pytest.mark.parametrize("name,values", [
    ("TORCH_FUSED_OPS_DISABLE", {None: False, "": False, "0": False, "1": True, "yes": True}),
    ("TORCH_FUSED_OPS_CPU_HUGE_PAGES", {None: True, "0": False, "1": True, "": True}),
    ("TORCH_FUSED_OPS_COMPILED_CALLS", {None: True, "0": False, "1": True, "": True}),
])
def test_envs_parse_each_variable_as_documented(monkeypatch, name, values):
    assert name in envs.environment_variables and f"``{name}``" in envs.__doc__
    for raw, want in values.items():
        if raw is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, raw)
        assert getattr(envs, name) is want, (name, raw)


def test_envs_lists_build_time_variables_and_rejects_unknown_names():
    for name in envs.BUILD_TIME_VARIABLES:
        assert name in envs.__doc__
    with open(os.path.join(os.path.dirname(PKG), "setup.py")) as f:
        setup_src = f.read()
    for name in ("TORCH_CUDA_ARCH_LIST", "TORCH_FUSED_OPS_NO_CUDA", "TORCH_FUSED_OPS_NO_OPENMP", "CUDA_HOME"):
        assert name in setup_src and name in envs.BUILD_TIME_VARIABLES
    with pytest.raises(AttributeError):
        envs.TORCH_FUSED_OPS_NOT_A_SETTING  # noqa: B018
    assert set(envs.environment_variables) <= set(dir(envs))


def test_library_modules_do_not_import_the_package_back():
    # __init__ imports them; importing __init__ (or a name defined there) back would be a cycle. The benches and
    # the demo (tools/) are entry points that use the public package, so they are not checked.
    submodules = ({os.path.basename(p)[:-3] for p in glob.glob(os.path.join(PKG, "*.py"))}
                  | {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(PKG, "*", "__init__.py"))}
                  | {"_C"})
    offenders = []
    for rel, package, tree in _modules():
        if rel == "__init__.py" or rel in ENTRY_POINTS:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.ImportFrom) and node.level and node.module is None
                    and _absolute(package, node.level, None) == "torch_fused_ops"):
                offenders += [f"{rel}: from {'.' * node.level} import {a.name}" for a in node.names
                              if a.name not in submodules]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "torch_fused_ops":
                offenders.append(f"{rel}: from torch_fused_ops import ...")
            elif isinstance(node, ast.Import) and any(a.name == "torch_fused_ops" for a in node.names):
                offenders.append(f"{rel}: import torch_fused_ops")
    assert not offenders, offenders


def test_package_does_not_import_triton():
    # The fused convolution is C++/CUDA: no module of the package imports Triton (Inductor's own Triton kernels
    # are Inductor's business).
    offenders = []
    for rel, _, tree in _modules():
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{rel}: {n}" for n in names if n.split(".")[0] == "triton"]
    assert not offenders, offenders


def test_importing_the_package_loads_no_tooling():
    # A fresh process: `import torch_fused_ops` (the library, its fake impls and the installed pass) leaves no
    # torch_fused_ops.tools module in sys.modules.
    code = ("import sys, torch_fused_ops; "
            f"print(sorted(m for m in sys.modules if m == {TOOLS!r} or m.startswith({TOOLS + '.'!r})))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(PKG), os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCH_FUSED_OPS_DISABLE", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(PKG), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.splitlines()[-1] == "[]", r.stdout


def test_library_modules_do_not_import_the_tools():
    # Every module outside tools/, the package's __init__ included: no import statement (absolute or relative) and
    # no importlib.import_module / __import__ of a literal name reaches torch_fused_ops.tools.
    offenders = []
    for rel, package, tree in _modules():
        if rel.startswith("tools/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(package, node.level, node.module)
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            elif _literal_import(node):
                names = [_literal_import(node)]
            else:
                continue
            offenders += [f"{rel}:{node.lineno}: {n}" for n in names if n == TOOLS or n.startswith(TOOLS + ".")]
    assert not offenders, offenders
