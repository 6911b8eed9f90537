"""hvdtrain.trees: every leaf of a nested state, with its path."""

from hvdtrain.trees import leaves, map_leaves

STATE = {"state": {0: {"momentum": [1.0, 2.0]}}, "param_groups": [{"lr": 0.1}], "none": None}


def test_leaves_lists_every_leaf_with_its_dotted_path_in_order():
    assert leaves(STATE) == [("state.0.momentum.0", 1.0), ("state.0.momentum.1", 2.0),
                             ("param_groups.0.lr", 0.1), ("none", None)]
    assert leaves(5) == [("", 5)]


def test_map_leaves_keeps_the_containers_and_their_types():
    mapped = map_leaves({"a": (1, [2]), "b": 3}, lambda leaf: leaf * 10)
    assert mapped == {"a": (10, [20]), "b": 30}
    assert isinstance(mapped["a"], tuple) and isinstance(mapped["a"][1], list)
