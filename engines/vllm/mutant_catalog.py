"""TEST DEVICE ONLY: installs one generated mutant (conformance/adequacy/mutation.py) into the
imported release, so the worker serves the release with that one edit, as a candidate.

The mutated file is compiled whole (same filename, same line numbers) and only the code
object of the mutant's function is swapped in (`function.__code__`): every reference to the
function, subclasses included (the recorder's RecordingScheduler), sees the edit, and
nothing else of the module changes. Never used by an oracle run.
"""

from __future__ import annotations

import importlib
import inspect
import sys

from conformance.formats.mutant import Mutant

INSTALLED: str | None = None  # the id of the mutant installed in this process


def install(mutant: Mutant) -> None:
    module = importlib.import_module(module_name(mutant.file))
    path = inspect.getsourcefile(module)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    code = compile(mutant.apply(source), path, "exec")
    new = _find_code(code, mutant.function)
    if new is None:
        raise ValueError(f"mutant {mutant.id}: no function {mutant.function} in {mutant.file}")
    func = _function(module, mutant.function)
    func.__code__ = new
    global INSTALLED
    INSTALLED = mutant.id
    print(f"TEST DEVICE: vLLM with generated mutant {mutant.name}; not a real engine", file=sys.stderr)


def module_name(file: str) -> str:
    """The module a file (relative to site-packages) is imported as. A package's __init__.py
    is the package itself: importing "pkg.__init__" would load a second copy of it, and the
    edit would land in the copy nobody calls."""
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _find_code(code, qualname: str):
    for const in code.co_consts:
        if hasattr(const, "co_qualname"):
            if const.co_qualname == qualname:
                return const
            found = _find_code(const, qualname)
            if found is not None:
                return found
    return None


def _function(module, qualname: str):
    obj = module
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        obj = inspect.getattr_static(obj, part) if i else getattr(obj, part)
        if isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, (classmethod, staticmethod)):
            obj = obj.__func__
        elif hasattr(obj, "func") and type(obj).__name__ == "cached_property":
            obj = obj.func
    return inspect.unwrap(obj)
