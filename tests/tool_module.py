"""Importing a script of tools/ (not a package) in a test: `tool_module("bench_prefill")`."""

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def tool_module(name: str, register: bool = False):
    """The module tools/NAME.py, executed once per call; `register` also puts it in
    sys.modules under NAME (a module whose dataclasses look their module up there) and
    returns the registered one on later calls."""
    if register and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
