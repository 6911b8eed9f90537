"""hvdtrain.metrics: the mean over ranks of each named number."""

import pytest

from hvdtrain.metrics import average_by_key


def test_average_by_key_is_the_mean_over_ranks_and_needs_the_same_keys():
    assert average_by_key([{"loss": 1.0, "acc": 0.5}, {"acc": 0.25, "loss": 3.0}]) == {
        "acc": 0.375, "loss": 2.0}
    with pytest.raises(ValueError, match=r"\['loss'\] on rank 0 but \['los'\] on rank 1"):
        average_by_key([{"loss": 1.0}, {"los": 1.0}])
