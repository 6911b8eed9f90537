"""Old names that keep working, with a ``DeprecationWarning`` naming the new one.

A module whose public name changed sets ``__getattr__ = renamed_attributes(__name__,
{"old": "new"})``; a function whose keyword changed calls :func:`renamed_keyword`.

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

import sys
import warnings
from collections.abc import Callable, Mapping
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
