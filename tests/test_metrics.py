"""hvdtrain.metrics: the mean over ranks of each named number."""

import pytest

from hvdtrain.metrics import average_by_key, average_gathered


def test_average_by_key_is_the_mean_over_ranks_and_needs_the_same_keys():
    assert average_by_key([{"loss": 1.0, "acc": 0.5}, {"acc": 0.25, "loss": 3.0}]) == {
        "acc": 0.375, "loss": 2.0}
    with pytest.raises(ValueError, match=r"\['loss'\] on rank 0 but \['los'\] on rank 1"):
        average_by_key([{"loss": 1.0}, {"los": 1.0}])


def test_weighted_by_examples_it_is_the_mean_over_all_the_examples():
    """Rank 0's accuracy is over 11 examples (8 right), rank 1's over 10 (5 right): 13/21."""
    values = [{"acc": 8 / 11, "val_acc": 1.0}, {"acc": 5 / 10, "val_acc": 0.0}]
    weights = [{"acc": 11, "val_acc": 3}, {"acc": 10, "val_acc": 0}]  # rank 1: no val data
    assert average_by_key(values, weights) == pytest.approx({"acc": 13 / 21, "val_acc": 1.0},
                                                            rel=1e-15)
    with pytest.raises(ValueError, match="'acc' must be >= 0 with a positive sum"):
        average_by_key(values, [{"acc": -1, "val_acc": 1}, {"acc": 1, "val_acc": 1}])
    with pytest.raises(ValueError, match="'val_acc'"):
        average_by_key(values, [{"acc": 1, "val_acc": 0}, {"acc": 1, "val_acc": 0}])


def test_average_gathered_weights_only_when_the_ranks_sent_weights():
    plain = [({"loss": 1.0}, None), ({"loss": 3.0}, None)]
    weighted = [({"loss": 1.0}, {"loss": 3}), ({"loss": 3.0}, {"loss": 1})]
    assert average_gathered(plain) == {"loss": 2.0}
    assert average_gathered(weighted) == {"loss": 1.5}
