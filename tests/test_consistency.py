"""hvdtrain.consistency: which field differs, on which rank, with both values."""

import pytest

from hvdtrain.consistency import (
    RankDisagreementError,
    average_by_key,
    first_disagreement,
    raise_on_disagreement,
    software_versions,
)


def test_agreeing_ranks_pass():
    facts = {"batch": 32, "optimizer": "SGD"}
    assert first_disagreement([facts, dict(facts), dict(facts)]) is None
    raise_on_disagreement([facts, facts], "here")


def test_the_first_differing_field_is_named_with_rank_and_both_values():
    ranks = [{"batch": 32, "optimizer": "SGD"}, {"batch": 32, "optimizer": "SGD"},
             {"batch": 16, "optimizer": "Adam"}]
    assert first_disagreement(ranks) == "batch is 32 on rank 0 but 16 on rank 2"
    with pytest.raises(RankDisagreementError, match=r"^Where: the ranks disagree: batch"):
        raise_on_disagreement(ranks, "Where")


def test_a_field_missing_on_one_rank_counts():
    assert first_disagreement([{"a": 1}, {"a": 1, "b": 2}]) == "b is None on rank 0 but 2 on rank 1"


def test_versions_name_python_hvdtrain_and_absent_packages():
    versions = software_versions("numpy", "no-such-distribution")
    assert set(versions) == {"python", "hvdtrain", "numpy", "no-such-distribution"}
    assert versions["no-such-distribution"] == "absent"


def test_average_by_key_is_the_mean_over_ranks_and_needs_the_same_keys():
    assert average_by_key([{"loss": 1.0, "acc": 0.5}, {"acc": 0.25, "loss": 3.0}]) == {
        "acc": 0.375, "loss": 2.0}
    with pytest.raises(ValueError, match=r"\['loss'\] on rank 0 but \['los'\] on rank 1"):
        average_by_key([{"loss": 1.0}, {"los": 1.0}])
