"""Old names that keep working, with a ``DeprecationWarning`` naming the new one.

A module whose public name changed sets ``__getattr__ = renamed_attributes(__name__,
{"old": "new"})``; a function whose keyword changed calls :func:`renamed_keyword`; a
module that moved is imported by its old path through :func:`moved_modules`.

>>> import warnings
>>> from hvdtrain import consistency
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     consistency.first_disagreement is consistency.first_fact_difference
True
>>> str(caught[0].message).startswith("hvdtrain.consistency.first_disagreement is now "
...                                    "hvdtrain.consistency.first_fact_difference;")
True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from types import ModuleType
from typing import Any


def renamed_attributes(module: str, renames: Mapping[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for the module named ``module`` that answers each old name of
    ``renames`` with the new name's value, warning."""

    def __getattr__(name: str) -> Any:
        if name not in renames:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renames[name]
        warnings.warn(f"{module}.{name} is now {module}.{new}; the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        return getattr(sys.modules[module], new)

    return __getattr__


def renamed_keyword(where: str, old: str, new: str, old_value: Any, new_value: Any) -> Any:
    """The value of keyword ``new`` of ``where``, given either it or the old ``old``
    (warning then); both at once is an error."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{where} got both {old}= and {new}=; {old}= is the old name of "
                        f"{new}=: pass {new}= alone")
    warnings.warn(f"{where}({old}=...) is now {where}({new}=...); the old name will be "
                  "removed", DeprecationWarning, stacklevel=3)
    return old_value


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each old module path of ``moves`` as its new module (the same object, so
    both names share one state), warning unless the old path stays public."""

    def __init__(self, moves: Mapping[str, str], public: Collection[str]) -> None:
        self.moves = dict(moves)
        self.public = frozenset(public)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moves:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        old, new = module.__name__, self.moves[module.__name__]
        if old not in self.public:
            warnings.warn(f"{old} is now {new}; the old path will be removed",
                          DeprecationWarning, stacklevel=2)
        # The import system hands back whatever sys.modules holds under the old name.
        sys.modules[old] = importlib.import_module(new)


def moved_modules(moves: Mapping[str, str], public: Collection[str] = ()) -> None:
    """Let each old module path of ``moves`` (``{"old.path": "new.path"}``) import the
    module at its new path, with a DeprecationWarning naming it, except for the paths in
    ``public``, which stay without one."""
    if not any(isinstance(finder, _MovedModules) and finder.moves == dict(moves)
               for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules(moves, public))
