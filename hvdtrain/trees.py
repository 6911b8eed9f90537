"""Walking nested containers (dicts, lists, tuples) such as a ``state_dict``, framework-free.

Adapters use these to list every tensor of an optimizer's state (for broadcasts,
replica checksums and checkpoint checks) with a readable path to each.

Example::

    from hvdtrain.trees import leaves, map_leaves

    leaves({"state": {0: [1, 2]}, "lr": 0.1})   # [('state.0.0', 1), ('state.0.1', 2), ('lr', 0.1)]
    map_leaves({"a": [1, 2]}, str)               # {'a': ['1', '2']}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def map_leaves(tree: Any, function: Callable[[Any], Any]) -> Any:
    """``tree`` rebuilt with ``function`` applied to every leaf (anything that is not a
    dict, list or tuple); containers keep their type and order."""
    if isinstance(tree, dict):
        return {key: map_leaves(value, function) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(map_leaves(value, function) for value in tree)
    return function(tree)


def leaves(tree: Any, path: str = "") -> list[tuple[str, Any]]:
    """``(path, leaf)`` of every leaf of ``tree``, in order; a path joins the keys and
    positions leading to the leaf with dots."""
    if isinstance(tree, dict):
        return [leaf for key in tree for leaf in leaves(tree[key], f"{path}.{key}")]
    if isinstance(tree, list | tuple):
        return [leaf for i, value in enumerate(tree) for leaf in leaves(value, f"{path}.{i}")]
    return [(path.lstrip("."), tree)]
