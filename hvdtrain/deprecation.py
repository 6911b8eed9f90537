"""Old names that keep working, with a ``DeprecationWarning`` naming the new one.

A module whose public name changed sets ``__getattr__ = renamed_attributes(__name__,
{"old": "new"})``; a function whose keyword changed calls :func:`renamed_keyword`.

>>> import warnings
>>> namespace = {"new_name": 42}
>>> getattr_ = renamed_attributes("example", {"old_name": "new_name"}, namespace)
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     getattr_("old_name"), str(caught[0].message)
(42, 'example.old_name is now example.new_name; the old name will be removed')
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def renamed_attributes(module: str, renames: Mapping[str, str],
                       namespace: Mapping[str, Any] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` that answers each old name of ``renames`` with the new
    name's value, warning; ``namespace``: where the new names live (default: the
    module's own globals)."""

    def __getattr__(name: str) -> Any:
        if name not in renames:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renames[name]
        warnings.warn(f"{module}.{name} is now {module}.{new}; the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        found = namespace if namespace is not None else vars(sys.modules[module])
        return found[new]

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
