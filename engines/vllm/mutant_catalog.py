"""TEST DEVICE ONLY: installs one generated mutant (conformance/adequacy/mutation.py) into the
imported release, so the worker serves the release with that one edit, as a candidate.

The mutated file is compiled whole (same filename, same line numbers) and only the code
object of the mutant's function is swapped in (`function.__code__`): every reference to the
function, subclasses included (the recorder's RecordingScheduler), sees the edit, and
nothing else of the module changes. An edit that changes the function's free variables (the
only `super()` call removed drops the `__class__` cell) cannot be swapped in: a new method
with the cells it still uses replaces the old one on its class. Never used by an oracle run.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types

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
    if new.co_freevars == func.__code__.co_freevars:
        func.__code__ = new
    else:  # e.g. the only super() call removed: the code no longer uses the __class__ cell
        _replace(module, mutant.function, func, new)
    global INSTALLED
    INSTALLED = mutant.id
    print(f"TEST DEVICE: vLLM with generated mutant {mutant.name}; not a real engine", file=sys.stderr)


def module_name(file: str) -> str:
    """The module a file (relative to site-packages) is imported as. A package's __init__.py
    is the package itself: importing "pkg.__init__" would load a second copy of it, and the
    edit would land in the copy nobody calls."""
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _replace(module, qualname: str, func, code) -> None:
    """A code object whose free variables differ from the function's cannot be swapped in:
    a new function with the cells it still uses takes the old one's place on its owner (a
    class or the module). Only a plain function or method is replaced this way."""
    cells = dict(zip(func.__code__.co_freevars, func.__closure__ or ()))
    if any(name not in cells for name in code.co_freevars):
        raise ValueError(f"{qualname}: the mutated code needs free variables the function has not")
    new = types.FunctionType(code, func.__globals__, func.__name__, func.__defaults__,
                             tuple(cells[name] for name in code.co_freevars))
    new.__kwdefaults__, new.__qualname__, new.__module__ = func.__kwdefaults__, func.__qualname__, func.__module__
    new.__dict__.update(func.__dict__)
    owner = module
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    if inspect.getattr_static(owner, name) is not func:
        raise ValueError(f"{qualname}: not a plain function or method; its code cannot be replaced")
    setattr(owner, name, new)


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
